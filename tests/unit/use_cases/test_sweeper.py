"""The sweeper on the in-memory store: dead workers' pages, lost messages, orphaned documents, missing uploads."""

from __future__ import annotations

from pagescribe.callbacks import CallbackNotifier
from pagescribe.domain import DocumentStatus, JobStatus, NewDocument, PendingDocument
from pagescribe.ingestion import Ingestor
from pagescribe.settings import Settings
from pagescribe.sweeping import Sweeper

from tests.support.memory_store import MemoryStore
from tests.unit.use_cases.conftest import QueueSpy

SETTINGS = Settings(max_attempts=2, upload_url_expiry_seconds=900, upload_grace_seconds=60)


class Finisher:
    """The transcript writer as the sweeper calls it: the documents it was asked to finish."""

    def __init__(self, store: MemoryStore) -> None:
        self.store, self.finished = store, list[str]()

    def __call__(self, document_id: str) -> DocumentStatus | None:
        self.finished.append(document_id)
        done = self.store.finish_document(document_id, status=DocumentStatus.PARTIAL, error=None, transcript_key="t")
        return DocumentStatus.PARTIAL if done else None


def _no_ingestor() -> Ingestor:
    raise AssertionError("no failed upload was queued: the ingestion is not loaded")


def _sweeper(store: MemoryStore, queue: QueueSpy, finish: Finisher) -> Sweeper:
    notifier = CallbackNotifier(SETTINGS, store, None)
    return Sweeper(SETTINGS, store, queue, finish, notifier, _no_ingestor, None)


def _document(store: MemoryStore, pages: int) -> tuple[str, list[str]]:
    new = NewDocument("bucket", "uploads/a.pdf", "etag", "", 10, "test/model")
    created = store.create_document(new, kind="pdf", pages=range(1, pages + 1))
    store.mark_enqueued(created.job_ids)
    return created.document_id, list(created.job_ids)


def test_a_dead_workers_page_goes_back_and_is_sent_again_in_the_same_sweep(store: MemoryStore) -> None:
    # Given a page whose worker died on its first attempt, its lease past
    document_id, [job_id] = _document(store, 1)
    store.claim_jobs([job_id], lease_seconds=60, max_attempts=2)
    store.state.clock.advance(61)
    queue, finish = QueueSpy(), Finisher(store)
    # When the sweeper runs
    report = _sweeper(store, queue, finish).sweep()
    # Then the page is queued again and its message sent once
    assert (report.leases_requeued, report.jobs_sent) == (1, 1)
    assert [(m.job_id, m.document_id, m.page_number) for m in queue.sent] == [(job_id, document_id, 1)]
    assert finish.finished == []


def test_a_page_out_of_attempts_fails_and_its_document_finishes_once(store: MemoryStore) -> None:
    # Given the only page of a document, its last attempt's worker dead
    document_id, [job_id] = _document(store, 1)
    store.claim_jobs([job_id], lease_seconds=60, max_attempts=2)
    store.state.clock.advance(61)
    _sweeper(store, QueueSpy(), Finisher(store)).sweep()
    store.claim_jobs([job_id], lease_seconds=60, max_attempts=2)
    store.state.clock.advance(61)
    finish = Finisher(store)
    # When the sweeper runs twice
    first = _sweeper(store, QueueSpy(), finish).sweep()
    second = _sweeper(store, QueueSpy(), finish).sweep()
    # Then the page failed naming why, and the document was finished by the first sweep only
    assert (first.leases_failed, first.documents_finished, second.documents_finished) == (1, 1, 0)
    [page] = store.load_pages(document_id)
    assert page.status is JobStatus.FAILED and page.error is not None and "attempts exhausted (2 of 2)" in page.error
    assert finish.finished == [document_id]


def test_a_lost_message_is_sent_again_and_a_refused_send_waits_for_the_next_sweep(store: MemoryStore) -> None:
    # Given a page recorded but never sent (the upload died between commit and send)
    new = NewDocument("bucket", "uploads/b.pdf", "etag", "", 10, "test/model")
    [job_id] = store.create_document(new, kind="pdf", pages=[1]).job_ids
    # When the queue refuses the first sweep's send
    refused = _sweeper(store, QueueSpy(refusing=True), Finisher(store)).sweep()
    # Then it is not taken for sent: the next sweep sends it
    queue = QueueSpy()
    sent = _sweeper(store, queue, Finisher(store)).sweep()
    assert (refused.jobs_sent, refused.jobs_unsent, sent.jobs_sent) == (0, 1, 1)
    assert [m.job_id for m in queue.sent] == [job_id]


def test_a_document_whose_finishing_invocation_died_is_finished_after_its_grace(store: MemoryStore) -> None:
    document_id, [job_id] = _document(store, 1)
    [job] = store.claim_jobs([job_id], lease_seconds=60, max_attempts=2).claimed.values()
    store.fail_job(job, "broken page")  # and the worker died before finishing the document
    finish = Finisher(store)
    assert _sweeper(store, QueueSpy(), finish).sweep().documents_finished == 0  # within the grace
    store.state.clock.advance(SETTINGS.finish_grace_seconds + 1)
    assert _sweeper(store, QueueSpy(), finish).sweep().documents_finished == 1
    assert finish.finished == [document_id]


def test_an_upload_that_never_came_fails_once_its_url_has_long_expired(store: MemoryStore) -> None:
    pending = PendingDocument("f3c0a2de-0000-4000-8000-000000000001", "b", "uploads/x", "x.pdf", "m", None, None, None)
    store.create_pending_document(pending)
    assert _sweeper(store, QueueSpy(), Finisher(store)).sweep().uploads_expired == 0
    store.state.clock.advance(900 + 60 + 1)
    assert _sweeper(store, QueueSpy(), Finisher(store)).sweep().uploads_expired == 1
    record = store.get_document(pending.document_id)
    assert record is not None and record.status is DocumentStatus.FAILED
    assert record.error is not None and "UPLOAD_URL_EXPIRY_SECONDS=900" in record.error
