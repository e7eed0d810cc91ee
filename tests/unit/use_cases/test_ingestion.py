"""The upload's ingestion on the in-memory store: one document and its pages per object, queued only after they are
recorded; bad files end FAILED with their reason; S3's own calls go to moto in this process."""

from __future__ import annotations

from pathlib import Path

from pagescribe.aws import ObjectStore
from pagescribe.domain import DocumentStatus, JobStatus
from pagescribe.ingestion import Ingestor, UploadedObject
from pagescribe.settings import Settings
from pagescribe.sources.documents import DocumentInfo, inspect_document

from tests.support import CORPUS
from tests.support.memory_store import MemoryStore
from tests.unit.use_cases.conftest import BUCKET, QueueSpy

SETTINGS = Settings(bucket_name=BUCKET)


class InThisProcess:
    """The inspector without the render pool's process limits: the same reading of the file."""

    def inspect(self, path: Path, *, max_pages: int, max_image_pixels: int) -> DocumentInfo:
        return inspect_document(path, max_pages=max_pages, max_image_pixels=max_image_pixels)


def _upload(objects: ObjectStore, key: str, body: bytes) -> UploadedObject:
    objects.put_bytes(BUCKET, key, body, content_type="application/octet-stream")
    head = objects._client.head_object(Bucket=BUCKET, Key=key)
    return UploadedObject(BUCKET, key, len(body), head["ETag"].strip('"'), None)


def _ingestor(store: MemoryStore, objects: ObjectStore, queue: QueueSpy) -> Ingestor:
    return Ingestor(SETTINGS, store, objects, queue, InThisProcess(), lambda _: None)


def test_a_pdf_becomes_one_document_with_a_queued_page_each_sent_after_it_is_recorded(
    store: MemoryStore, objects: ObjectStore
) -> None:
    # Given a four-page PDF uploaded
    uploaded = _upload(objects, "uploads/four pages.pdf", (CORPUS / "pdflatex-4-pages.pdf").read_bytes())
    queue = QueueSpy()
    # When its event is ingested, twice (S3 delivers at least once)
    first = _ingestor(store, objects, queue).ingest(uploaded)
    again = _ingestor(store, objects, queue).ingest(uploaded)
    # Then one document has four QUEUED pages, each sent once, and the second event changed nothing
    assert (first.status, first.pages, first.messages_sent) == (DocumentStatus.PROCESSING, 4, 4)
    assert (again.status, again.document_id) == ("DUPLICATE", first.document_id)
    assert first.document_id is not None
    assert [p.status for p in store.load_pages(first.document_id)] == [JobStatus.QUEUED] * 4
    assert [(m.document_id, m.page_number) for m in queue.sent] == [(first.document_id, n) for n in (1, 2, 3, 4)]
    assert all(job.enqueued_at is not None for job in store.state.jobs.values())


def test_a_file_that_is_no_document_ends_failed_with_why_and_nothing_queued(
    store: MemoryStore, objects: ObjectStore
) -> None:
    uploaded = _upload(objects, "uploads/notes.pdf", b"just some text, not a PDF")
    queue = QueueSpy()
    result = _ingestor(store, objects, queue).ingest(uploaded)
    assert result.status == DocumentStatus.FAILED and result.error is not None and queue.sent == []
    record = store.get_document(result.document_id or "")
    assert record is not None and record.status is DocumentStatus.FAILED and record.error == result.error


def test_a_password_protected_pdf_ends_failed_saying_so(store: MemoryStore, objects: ObjectStore) -> None:
    body = (CORPUS / "libreoffice-writer-password.pdf").read_bytes()
    result = _ingestor(store, objects, QueueSpy()).ingest(_upload(objects, "uploads/locked.pdf", body))
    assert result.status == DocumentStatus.FAILED and "password" in (result.error or "")


def test_pages_the_queue_refused_stay_recorded_unsent_for_the_sweeper(store: MemoryStore, objects: ObjectStore) -> None:
    uploaded = _upload(objects, "uploads/one.pdf", (CORPUS / "minimal-document.pdf").read_bytes())
    result = _ingestor(store, objects, QueueSpy(refusing=True)).ingest(uploaded)
    assert (result.status, result.pages, result.messages_sent) == (DocumentStatus.PROCESSING, 1, 0)
    assert store.take_unsent_jobs(resend_after_seconds=60, limit=10) != []


def test_an_object_outside_the_upload_prefix_is_ignored(store: MemoryStore, objects: ObjectStore) -> None:
    uploaded = _upload(objects, "transcripts/a.md", b"# a transcript")
    assert _ingestor(store, objects, QueueSpy()).ingest(uploaded).status == "IGNORED"
    assert store.state.documents == {}
