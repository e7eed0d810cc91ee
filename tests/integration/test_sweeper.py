"""The sweeper: dead workers, lost messages, orphaned documents; overlapping sweepers never double-send."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pagescribe.domain import PageOutcome
from pagescribe.handlers import api as api_app
from pagescribe.handlers import upload as upload_app
from pagescribe.runtime import shutdown_runtime
from pagescribe.settings import get_settings
from pagescribe.store.postgres import Database
from pagescribe_local.stack import SCHEDULED_EVENT, UPLOAD_INVOCATIONS, LambdaService, LocalResources
from sqlalchemy import text

from tests.conftest import both_servers
from tests.fakes.chat_server import FakeChatServer, Hang, Ok
from tests.support.aws_events import LambdaContext, api_event, sqs_event
from tests.support.database import claim_one, page_rows
from tests.support.pipeline import Pipeline

pytestmark = pytest.mark.integration


@pytest.fixture(params=["system", "embedded"])
def database_url(request: pytest.FixtureRequest) -> str:
    """Every test here runs on the system PostgreSQL and on the embedded server of the local commands."""
    return both_servers(request)


@pytest.fixture(params=["direct", "dataapi"])
def pipeline(request: pytest.FixtureRequest, pipeline: Pipeline) -> Pipeline:
    """The functions reach the database directly, and through the RDS Data API (the data-api profile)."""
    if request.param == "dataapi":
        request.getfixturevalue("through_data_api")
    return pipeline


def _reconfigure(monkeypatch: pytest.MonkeyPatch, **env: str) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    shutdown_runtime()
    get_settings.cache_clear()


def test_a_worker_killed_mid_call_is_recovered_and_the_page_completed(
    pipeline: Pipeline,
    db: Database,
    fake_provider: FakeChatServer,
    corpus: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given short leases (a 15 s invocation, no margin) and a provider that hangs
    _reconfigure(monkeypatch, LEASE_MARGIN_SECONDS="0")
    [doc] = pipeline.upload("uploads/killed.png", corpus / "smile.png")["documents"]
    [message] = pipeline.receive_all()
    fake_provider.set_default(Hang(60))
    # When the worker process is SIGKILLed after its claim, in the middle of the model call
    worker = pipeline.start_in_new_environment("transcribe", sqs_event([message], pipeline.queue_arn), timeout=15)
    deadline = time.monotonic() + 60  # a busy machine starts a Python process slowly
    while not fake_provider.calls and worker.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert fake_provider.calls == 1, "the worker never reached the model"
    worker.send_signal(signal.SIGKILL)
    worker.wait()
    [page] = page_rows(db, doc["document_id"])
    assert page["status"] == "PROCESSING"
    # And the lease runs out, and the sweeper runs
    time.sleep(max(0.0, (page["lease_expires_at"].timestamp() - time.time())) + 0.5)
    fake_provider.set_default(Ok())
    report = pipeline.sweep()
    # Then the page went back to the queue and was sent again, and the next delivery completes it
    assert report["leases_requeued"] == 1 and report["jobs_sent"] == 1
    pipeline.run_until_idle()
    [page] = page_rows(db, doc["document_id"])
    assert page["status"] == "COMPLETED" and page["attempts"] == 2
    _, js = pipeline.transcript(doc["document_id"])
    assert js["status"] == "COMPLETED"


def test_jobs_whose_send_failed_are_sent_by_the_sweeper(
    pipeline: Pipeline, db: Database, fake_provider: FakeChatServer, corpus: Path
) -> None:
    # Given a document recorded while SQS refused every send (the queue was gone)
    attributes = pipeline.sqs.get_queue_attributes(QueueUrl=pipeline.queue_url, AttributeNames=["All"])
    name = pipeline.queue_url.rsplit("/", 1)[1]
    pipeline.sqs.delete_queue(QueueUrl=pipeline.queue_url)
    [doc] = pipeline.upload("uploads/unsent.pdf", corpus / "pdflatex-4-pages.pdf")["documents"]
    assert doc["messages_sent"] == 0
    assert attributes["Attributes"]["QueueArn"].endswith(name)
    pipeline.sqs.create_queue(QueueName=name)
    # When the sweeper runs
    report = pipeline.sweep()
    # Then every job is sent once and stamped, and the pipeline completes the document
    assert report["jobs_sent"] == 4
    assert all(p["enqueued_at"] is not None for p in page_rows(db, doc["document_id"]))
    pipeline.run_until_idle()
    assert [p["status"] for p in page_rows(db, doc["document_id"])] == ["COMPLETED"] * 4
    assert fake_provider.calls == 4


def test_two_concurrent_sweepers_never_send_a_job_twice(pipeline: Pipeline, db: Database, corpus: Path) -> None:
    # Given 200 jobs whose messages were lost
    name = pipeline.queue_url.rsplit("/", 1)[1]
    pipeline.sqs.delete_queue(QueueUrl=pipeline.queue_url)
    for i in range(50):
        pipeline.upload(f"uploads/lost-{i}.pdf", corpus / "pdflatex-4-pages.pdf")
    pipeline.sqs.create_queue(QueueName=name)
    # When two sweepers run at the same moment, in two execution environments
    reports = pipeline.invoke_in_new_environments("sweeper", SCHEDULED_EVENT, 2)
    # Then between them they sent each job exactly once
    assert sum(r["jobs_sent"] for r in reports) == 200
    sent = Counter(json.loads(m["Body"])["job_id"] for m in pipeline.receive_all())
    assert len(sent) == 200 and set(sent.values()) == {1}
    # And a sweep right after sends nothing (the jobs are stamped as sent)
    assert pipeline.sweep()["jobs_sent"] == 0


def test_a_lease_expired_on_the_last_attempt_fails_the_page_and_finishes_the_document(
    pipeline: Pipeline, db: Database, corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _reconfigure(monkeypatch, MAX_ATTEMPTS="1")
    [doc] = pipeline.upload("uploads/last.png", corpus / "smile.png")["documents"]
    [page] = page_rows(db, doc["document_id"])
    job = claim_one(db, str(page["id"]), lease_seconds=0.2, max_attempts=1)
    assert job is not None
    time.sleep(0.5)
    report = pipeline.sweep()
    [page] = page_rows(db, doc["document_id"])
    assert report["leases_failed"] == 1 and page["status"] == "FAILED"
    assert "attempts exhausted (1 of 1)" in page["error"]
    _, js = pipeline.transcript(doc["document_id"])
    assert js["status"] == "FAILED"


def test_a_document_whose_finisher_died_is_finished(
    pipeline: Pipeline, db: Database, corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a document whose every page completed, but whose finishing invocation died before writing
    _reconfigure(monkeypatch, FINISH_GRACE_SECONDS="0")
    [doc] = pipeline.upload("uploads/orphan.png", corpus / "smile.png")["documents"]
    [page] = page_rows(db, doc["document_id"])
    job = claim_one(db, str(page["id"]), lease_seconds=60, max_attempts=3)
    assert job is not None
    outcome = PageOutcome("hello", "stop", 1, 1, 0.0, "m", "fake", "gen-9")
    progress = db.complete_job(job, outcome)
    assert progress is not None and progress.all_pages_done
    # When the sweeper runs
    report = pipeline.sweep()
    # Then it writes the transcript and finishes the document, once
    assert report["documents_finished"] == 1
    markdown, js = pipeline.transcript(doc["document_id"])
    assert js["status"] == "COMPLETED" and "hello" in markdown
    assert pipeline.sweep()["documents_finished"] == 0


def test_an_upload_the_function_gave_up_on_becomes_a_failed_document_not_a_lost_one(
    pipeline: Pipeline, db: Database, database_url: str, corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an S3 notification for an upload, delivered as Lambda delivers asynchronous events (three tries, then
    # the on-failure destination), while the upload function cannot reach its database
    event = pipeline.put("uploads/during the outage.pdf", corpus / "pdflatex-4-pages.pdf")
    notifications = pipeline.sqs.create_queue(QueueName="notifications", Attributes={"VisibilityTimeout": "0"})
    pipeline.sqs.send_message(QueueUrl=notifications["QueueUrl"], MessageBody=json.dumps(event))
    resources = LocalResources(
        os.environ["AWS_ENDPOINT_URL"],
        pipeline.bucket,
        pipeline.queue_url,
        pipeline.queue_arn,
        notifications["QueueUrl"],
        pipeline.upload_failures_url,
    )
    service = LambdaService(
        resources, upload=upload_app.handler, transcribe=_unused, sweeper=_unused, transcribe_timeout=60
    )
    with socket.socket() as unused_port:
        unused_port.bind(("127.0.0.1", 0))
        port = unused_port.getsockname()[1]
    # (in the data-api profile, the Data API's endpoint is what cannot be reached)
    if os.environ.get("DATABASE_ACCESS") == "data-api":
        endpoint = "AWS_ENDPOINT_URL_RDS_DATA"
        outage, back = {endpoint: f"http://127.0.0.1:{port}"}, {endpoint: os.environ[endpoint]}
    else:
        outage = {"DATABASE_URL": f"postgresql://postgres@127.0.0.1:{port}/none?connect_timeout=2"}
        back = {"DATABASE_URL": database_url}
    _reconfigure(monkeypatch, **outage)

    # When the function fails on it every time, until Lambda gives up
    for _ in range(UPLOAD_INVOCATIONS):
        assert service.deliver_uploads() == 1
    assert service.deliver_uploads() == 0  # given up: nothing is delivered again

    # And the database is back and the sweeper runs
    _reconfigure(monkeypatch, **back)
    report = pipeline.sweep()

    # Then the upload is a FAILED document that says the function gave up and why, and the record is gone
    assert report["uploads_failed"] == 1
    with db.engine.connect() as conn:
        row = conn.execute(text("SELECT status, error, object_key FROM documents")).mappings().one()
    assert (row["status"], row["object_key"]) == ("FAILED", "uploads/during the outage.pdf")
    reason = "EndpointConnectionError" if "AWS_ENDPOINT_URL_RDS_DATA" in outage else "OperationalError"
    assert f"the upload function failed on this file and gave up (RetriesExhausted: {reason}" in row["error"]
    assert pipeline.sqs.receive_message(QueueUrl=pipeline.upload_failures_url).get("Messages", []) == []
    # And sweeping again records nothing twice
    assert pipeline.sweep()["uploads_failed"] == 0


def test_a_document_whose_file_never_arrives_ends_failed_and_a_late_file_is_refused(
    pipeline: Pipeline, db: Database, corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a document created through the API whose upload URL has expired, and the grace after it gone by
    _reconfigure(monkeypatch, UPLOAD_URL_EXPIRY_SECONDS="60", UPLOAD_GRACE_SECONDS="30")
    created = api_app.handler(
        api_event("POST", "/documents", body=json.dumps({"filename": "late.pdf", "content_type": "application/pdf"})),
        LambdaContext(29),
    )
    document_id = json.loads(created["body"])["document_id"]
    with db.engine.begin() as conn:  # the clock moves on: the document was created 91 s ago
        conn.execute(
            text("UPDATE documents SET created_at = now() - interval '91 seconds' WHERE id = :id"), {"id": document_id}
        )

    # When the sweeper runs
    report = pipeline.sweep()

    # Then the document is FAILED, saying that the upload never arrived
    assert report["uploads_expired"] == 1
    document = db.get_document(document_id)
    assert document is not None and document.status.value == "FAILED"
    assert "the upload never arrived" in (document.error or "")

    # And a file PUT under its key afterwards is refused: no second, hidden document is made of it
    [late] = pipeline.upload(f"uploads/{document_id}/late.pdf", corpus / "pdflatex-4-pages.pdf")["documents"]
    assert late["status"] == "REFUSED" and late["document_id"] == document_id
    with db.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM documents")).scalar_one() == 1
    assert pipeline.receive_all() == []


def _unused(event: dict[str, Any], context: Any) -> dict[str, Any]:
    raise AssertionError("only the upload function is invoked here")
