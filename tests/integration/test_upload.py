"""The upload function on real S3 event shapes, against moto and PostgreSQL."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pagescribe.handlers import upload as upload_app
from pagescribe.runtime import shutdown_runtime
from pagescribe.settings import get_settings
from pagescribe.store.postgres import Database
from sqlalchemy import text

from tests.support.aws_events import LambdaContext
from tests.support.database import page_rows
from tests.support.pipeline import Pipeline
from tests.support.sqs_watch import SqsSendWatch

pytestmark = pytest.mark.integration


def _jobs(db: Database, document_id: str) -> list[tuple[int, str, bool]]:
    with db.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT page_number, status, enqueued_at IS NOT NULL AS sent FROM jobs "
                "WHERE document_id = :id ORDER BY page_number"
            ),
            {"id": document_id},
        ).all()
    return [(r.page_number, r.status, r.sent) for r in rows]


def _document(db: Database, document_id: str) -> tuple[str, str | None, int]:
    with db.engine.connect() as conn:
        row = conn.execute(
            text("SELECT status, error, page_count FROM documents WHERE id = :id"), {"id": document_id}
        ).one()
    return row.status, row.error, row.page_count


def test_a_pdf_becomes_one_job_and_one_message_per_page(pipeline: Pipeline, db: Database, corpus: Path) -> None:
    # Given a 4-page PDF uploaded under a key with spaces, unicode and '+' (S3 URL-encodes it in the event)
    key = "uploads/Quarterly report + notes ü.pdf"
    # When the upload function receives the notification
    response = pipeline.upload(key, corpus / "pdflatex-4-pages.pdf")
    # Then one document with four queued, sent jobs exists, under the decoded key
    [doc] = response["documents"]
    assert (doc["status"], doc["pages"], doc["messages_sent"], doc["key"]) == ("PROCESSING", 4, 4, key)
    assert _jobs(db, doc["document_id"]) == [(p, "QUEUED", True) for p in range(1, 5)]
    # And exactly one message per job is on the queue, each naming its job
    bodies = [json.loads(m["Body"]) for m in pipeline.receive_all()]
    assert sorted(b["page"] for b in bodies) == [1, 2, 3, 4]
    assert {b["document_id"] for b in bodies} == {doc["document_id"]}
    assert len({b["job_id"] for b in bodies}) == 4


def test_a_tiff_counts_frames_as_pages(pipeline: Pipeline, db: Database, corpus: Path) -> None:
    [doc] = pipeline.upload("uploads/smile.tiff", corpus / "smile.tiff")["documents"]
    assert doc["status"] == "PROCESSING" and doc["pages"] >= 1
    assert len(_jobs(db, doc["document_id"])) == doc["pages"]


def test_the_same_object_delivered_twice_yields_one_document(pipeline: Pipeline, db: Database, corpus: Path) -> None:
    # Given one S3 notification
    event = pipeline.put("uploads/twice.pdf", corpus / "minimal-document.pdf")
    # When S3 delivers it twice (at-least-once)
    first = upload_app.handler(event, LambdaContext(60))["documents"][0]
    second = upload_app.handler(event, LambdaContext(60))["documents"][0]
    # Then the second delivery is recognised and adds nothing
    assert second["status"] == "DUPLICATE" and second["document_id"] == first["document_id"]
    with db.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM documents")).scalar_one() == 1
    assert len(pipeline.receive_all()) == first["pages"]


def test_a_batch_of_records_is_handled_record_by_record(pipeline: Pipeline, corpus: Path) -> None:
    good = pipeline.put("uploads/good.png", corpus / "smile.png")
    bad = pipeline.put("uploads/bad.pdf", b"this is plain text, renamed .pdf")
    event = {"Records": good["Records"] + bad["Records"]}
    docs = upload_app.handler(event, LambdaContext(60))["documents"]
    assert [d["status"] for d in docs] == ["PROCESSING", "FAILED"]


@pytest.mark.parametrize(
    ("name", "content", "reason"),
    [
        ("empty.pdf", b"", "empty"),
        ("text.pdf", b"Just some text pretending to be a PDF\n" * 10, "unsupported file type"),
        ("truncated.pdf", None, "could not be read"),
        ("locked.pdf", "libreoffice-writer-password.pdf", "password"),
    ],
)
def test_hopeless_inputs_end_as_failed_documents_with_a_reason(
    pipeline: Pipeline, db: Database, corpus: Path, name: str, content: bytes | str | None, reason: str
) -> None:
    if content is None:  # a real PDF cut off halfway
        whole = (corpus / "pdflatex-4-pages.pdf").read_bytes()
        data = whole[: len(whole) // 2]
    elif isinstance(content, str):
        data = (corpus / content).read_bytes()
    else:
        data = content
    # When the upload function sees the object, it does not raise (S3 would retry a hopeless input)
    [doc] = pipeline.upload(f"uploads/{name}", data)["documents"]
    # Then the document is FAILED with a reason that says what is wrong, and nothing was queued
    status, error, pages = _document(db, doc["document_id"])
    assert status == "FAILED" and error is not None and reason in error.lower()
    assert pages == 0 and _jobs(db, doc["document_id"]) == []
    assert pipeline.receive_all() == []


def test_limits_name_the_setting_and_the_value(
    pipeline: Pipeline, db: Database, corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MAX_PAGES", "2")
    monkeypatch.setenv("MAX_UPLOAD_BYTES", "50000")
    shutdown_runtime()
    get_settings.cache_clear()
    [pages] = pipeline.upload("uploads/long.pdf", corpus / "pdflatex-4-pages.pdf")["documents"]
    big = corpus / "pdflatex-image.pdf"
    assert big.stat().st_size > 50000
    [size] = pipeline.upload("uploads/big.pdf", big)["documents"]
    assert "4 pages" in (pages["error"] or "") and "MAX_PAGES=2" in (pages["error"] or "")
    assert "MAX_UPLOAD_BYTES=50000" in (size["error"] or "")
    assert pipeline.receive_all() == []


def test_objects_outside_uploads_are_ignored(pipeline: Pipeline, db: Database, corpus: Path) -> None:
    [doc] = pipeline.upload("transcripts/something.md", b"# not an upload")["documents"]
    assert doc["status"] == "IGNORED"
    with db.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM documents")).scalar_one() == 0


def test_a_failed_send_leaves_the_jobs_queued_and_unsent(
    pipeline: Pipeline, db: Database, corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a queue URL that SQS rejects (the queue is gone), so SendMessageBatch fails after the commit
    pipeline.sqs.delete_queue(QueueUrl=pipeline.queue_url)
    # When a document arrives
    [doc] = pipeline.upload("uploads/lost.pdf", corpus / "pdflatex-4-pages.pdf")["documents"]
    # Then its jobs are recorded, QUEUED with no enqueued_at, for the sweeper to send
    assert doc["status"] == "PROCESSING" and doc["messages_sent"] == 0
    assert _jobs(db, doc["document_id"]) == [(p, "QUEUED", False) for p in range(1, 5)]


def test_page_messages_are_sent_only_after_their_jobs_are_committed(
    pipeline: Pipeline,
    db: Database,
    corpus: Path,
    moto_endpoint: str,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given the functions' AWS calls going through a relay that, as each page message is sent, asks PostgreSQL over
    # its own connection whether the job the message names is committed
    with SqsSendWatch(moto_endpoint, database_url.replace("postgresql+psycopg://", "postgresql://")) as watch:
        monkeypatch.setenv("AWS_ENDPOINT_URL", watch.url)
        shutdown_runtime()
        get_settings.cache_clear()

        # When a 4-page document is uploaded, and the sweeper sends again a job whose message was lost
        [doc] = pipeline.upload("uploads/committed.pdf", corpus / "pdflatex-4-pages.pdf")["documents"]
        [first] = [row["id"] for row in page_rows(db, doc["document_id"]) if row["page_number"] == 1]
        with db.engine.begin() as conn:
            conn.execute(
                text("UPDATE jobs SET enqueued_at = NULL WHERE id = :id"),
                {"id": first},
            )
        assert pipeline.sweep()["jobs_sent"] == 1

    # Then every message named a job that another connection could already see
    assert [len(send.job_ids) for send in watch.sends] == [4, 1]
    assert all(send.visible == frozenset(send.job_ids) for send in watch.sends), watch.sends
