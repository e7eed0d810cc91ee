"""The transcribe function end to end: moto SQS/S3, PostgreSQL and a real local chat-completions server."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest
from pagescribe.settings import get_settings
from pagescribe.sources.documents import DocumentKind
from pagescribe.sources.pages import render_page
from pagescribe.store.postgres import Database
from sqlalchemy import text

from tests.fakes.chat_server import FakeChatServer, Hang, Ok, Status, Truncated, expected_text
from tests.support.aws_events import LambdaContext, sqs_event, sqs_record_for_body
from tests.support.database import page_rows
from tests.support.pipeline import Pipeline

pytestmark = pytest.mark.integration


def _expected_texts(path: Path, kind: DocumentKind, pages: int) -> list[str]:
    settings = get_settings()
    return [
        expected_text(
            render_page(
                path,
                kind,
                n,
                dpi=settings.render_dpi,
                max_long_edge=settings.render_max_long_edge,
                image_format=settings.render_format,
            ).data
        )
        for n in range(1, pages + 1)
    ]


def test_a_multi_page_pdf_goes_end_to_end(
    pipeline: Pipeline, db: Database, fake_provider: FakeChatServer, corpus: Path
) -> None:
    # Given a 4-page PDF dropped into uploads/
    source = corpus / "pdflatex-4-pages.pdf"
    [doc] = pipeline.upload("uploads/four pages.pdf", source)["documents"]
    # When the queue is drained through the transcribe function
    pipeline.run_until_idle()
    # Then every page is COMPLETED with what the model said for that very page, in order
    pages = page_rows(db, doc["document_id"])
    expected = _expected_texts(source, DocumentKind.PDF, 4)
    assert [p["status"] for p in pages] == ["COMPLETED"] * 4
    assert [p["result_text"] for p in pages] == expected
    assert all(p["prompt_tokens"] and p["provider_request_id"] and p["cost"] is not None for p in pages)
    assert fake_provider.calls == 4
    # And the transcript files are in S3, pages in order, each marked
    markdown, js = pipeline.transcript(doc["document_id"])
    positions = [markdown.index(f"<!-- page {n} of 4 (") for n in range(1, 5)]
    assert "test/vision-model" in markdown  # each page says which provider and model produced it
    assert positions == sorted(positions)
    for n, text_ in enumerate(expected, start=1):
        assert markdown.index(text_) > positions[n - 1]
    assert [p["page"] for p in js["pages"]] == [1, 2, 3, 4]
    assert [p["text"] for p in js["pages"]] == expected
    assert js["status"] == "COMPLETED" and js["cost"] > 0
    with db.engine.connect() as conn:
        row = conn.execute(
            text("SELECT status, transcript_key FROM documents WHERE id = :id"), {"id": doc["document_id"]}
        ).one()
    assert (row.status, row.transcript_key) == ("COMPLETED", f"transcripts/{doc['document_id']}.md")


def test_three_concurrent_deliveries_of_each_message_make_one_model_call_per_page(
    pipeline: Pipeline, db: Database, fake_provider: FakeChatServer, corpus: Path
) -> None:
    # Given a 4-page document whose messages are each delivered three times, to three invocations at once
    [doc] = pipeline.upload("uploads/dups.pdf", corpus / "pdflatex-4-pages.pdf")["documents"]
    messages = pipeline.receive_all()
    fake_provider.default_delay = 1.5  # long enough for the three environments to overlap
    event = sqs_event(messages, pipeline.queue_arn)
    # When three execution environments (separate processes) receive the same batch at once
    responses = pipeline.invoke_in_new_environments("transcribe", event, 3)
    assert all(r["batchItemFailures"] == [] for r in responses)
    # Then each page was transcribed by exactly one model call and completed once
    assert fake_provider.calls == 4
    assert [p["status"] for p in page_rows(db, doc["document_id"])] == ["COMPLETED"] * 4
    assert all(p["attempts"] == 1 for p in page_rows(db, doc["document_id"]))
    # And late duplicates, after completion, are acknowledged without a call
    late = pipeline.invoke_transcribe(
        {"Records": [sqs_record_for_body(m["Body"], pipeline.queue_arn) for m in messages]}
    )
    assert late["batchItemFailures"] == [] and fake_provider.calls == 4


def test_warm_invocations_reuse_one_provider_connection(
    pipeline: Pipeline, db: Database, fake_provider: FakeChatServer, corpus: Path
) -> None:
    # Given four pages, delivered one message per invocation
    pipeline.upload("uploads/warm.pdf", corpus / "pdflatex-4-pages.pdf")
    messages = pipeline.receive_all()
    # When four consecutive warm invocations each transcribe one page
    for m in messages:
        response = pipeline.invoke_transcribe(sqs_event([m], pipeline.queue_arn))
        assert response["batchItemFailures"] == []
    # Then the provider saw four calls over a single TCP connection
    assert fake_provider.calls == 4
    assert fake_provider.connections_opened == 1


def test_a_hanging_provider_is_cut_off_at_the_calls_time_and_the_page_goes_back(
    pipeline: Pipeline, db: Database, fake_provider: FakeChatServer, corpus: Path
) -> None:
    # Given a provider that never answers and an invocation with 12 s left (reserve 5 s → a call of 7 s)
    [doc] = pipeline.upload("uploads/hang.png", corpus / "smile.png")["documents"]
    [message] = pipeline.receive_all()
    fake_provider.set_default(Hang(120))
    context = LambdaContext(12)
    # When the transcribe function runs
    from pagescribe.handlers import transcribe as transcribe_app

    response = transcribe_app.handler(sqs_event([message], pipeline.queue_arn), context)
    # Then it returned before the Lambda's time ran out, with the reserve still in hand
    assert context.get_remaining_time_in_millis() > 1000
    assert response["batchItemFailures"] == []
    # And the page is back in the queue: QUEUED, one attempt used, the reason recorded, a message sent
    [page] = page_rows(db, doc["document_id"])
    assert page["status"] == "QUEUED" and page["attempts"] == 1
    assert "within the call's" in page["error"] and page["enqueued_at"] is not None
    [again] = pipeline.receive_all()
    assert json.loads(again["Body"])["job_id"] == str(page["id"])


def test_a_page_that_cannot_get_a_useful_call_is_not_claimed(
    pipeline: Pipeline, db: Database, fake_provider: FakeChatServer, corpus: Path
) -> None:
    [doc] = pipeline.upload("uploads/late.png", corpus / "smile.png")["documents"]
    [message] = pipeline.receive_all()
    # With 6 s left, less the 5 s reserve, only 1 s would remain for the call (minimum 2 s)
    response = pipeline.invoke_transcribe(sqs_event([message], pipeline.queue_arn), timeout=6)
    assert response["batchItemFailures"] == [{"itemIdentifier": message["MessageId"]}]
    [page] = page_rows(db, doc["document_id"])
    assert (page["status"], page["attempts"]) == ("QUEUED", 0)
    assert fake_provider.calls == 0


def test_rate_limits_are_retried_within_the_calls_time(
    pipeline: Pipeline, db: Database, fake_provider: FakeChatServer, corpus: Path
) -> None:
    [doc] = pipeline.upload("uploads/429.png", corpus / "smile.png")["documents"]
    fake_provider.script(Status(429, "slow down", retry_after="1"), Status(503, "overloaded"), Ok())
    pipeline.run_until_idle()
    [page] = page_rows(db, doc["document_id"])
    assert page["status"] == "COMPLETED" and page["attempts"] == 1
    assert fake_provider.calls == 3


def test_a_client_error_fails_the_page_with_the_providers_message(
    pipeline: Pipeline, db: Database, fake_provider: FakeChatServer, corpus: Path
) -> None:
    [doc] = pipeline.upload("uploads/400.png", corpus / "smile.png")["documents"]
    fake_provider.script(Status(400, "image too small for this model"))
    pipeline.run_until_idle()
    [page] = page_rows(db, doc["document_id"])
    assert page["status"] == "FAILED" and "image too small for this model" in page["error"]
    assert fake_provider.calls == 1
    markdown, js = pipeline.transcript(doc["document_id"])
    assert js["status"] == "FAILED" and "image too small for this model" in markdown


def test_a_truncated_answer_is_a_failed_page_that_keeps_its_text(
    pipeline: Pipeline, db: Database, fake_provider: FakeChatServer, corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TILES", "off")  # read in tiles instead, it completes (tests/integration/test_tiles.py)
    get_settings.cache_clear()
    from pagescribe.runtime import shutdown_runtime

    shutdown_runtime()
    [doc] = pipeline.upload("uploads/long.png", corpus / "smile.png")["documents"]
    fake_provider.script(Truncated("the first half of the pa"))
    pipeline.run_until_idle()
    [page] = page_rows(db, doc["document_id"])
    assert page["status"] == "FAILED" and "truncated" in page["error"]
    assert page["result_text"] == "the first half of the pa" and page["finish_reason"] == "length"


def test_server_errors_past_max_attempts_fail_the_page(
    pipeline: Pipeline, db: Database, fake_provider: FakeChatServer, corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a provider that is down for good and a call too short to retry inside it
    monkeypatch.setenv("PROVIDER_TIMEOUT_SECONDS", "2")
    get_settings.cache_clear()
    from pagescribe.runtime import shutdown_runtime

    shutdown_runtime()
    [doc] = pipeline.upload("uploads/down.png", corpus / "smile.png")["documents"]
    fake_provider.set_default(Status(502, "bad gateway"))
    # When the queue is drained (each failed attempt re-sends the page)
    pipeline.run_until_idle()
    # Then the page ends FAILED after three attempts, saying so, and the document is finished
    [page] = page_rows(db, doc["document_id"])
    assert page["status"] == "FAILED" and page["attempts"] == 3
    assert "attempts exhausted (3 of 3)" in page["error"] and "bad gateway" in page["error"]
    _, js = pipeline.transcript(doc["document_id"])
    assert js["status"] == "FAILED"


def test_malformed_messages_are_rejected_without_looping(pipeline: Pipeline, fake_provider: FakeChatServer) -> None:
    records = [sqs_record_for_body(body, pipeline.queue_arn) for body in ("not json", '{"job_id": "1 OR 1=1"}')]
    response = pipeline.invoke_transcribe({"Records": records})
    assert response["batchItemFailures"] == [] and fake_provider.calls == 0


def test_sigterm_closes_the_warm_environment_cleanly(
    pipeline: Pipeline, db: Database, fake_provider: FakeChatServer, corpus: Path
) -> None:
    # Given a warm environment that has transcribed a page (its provider connection and pool are open)
    pipeline.upload("uploads/warm.png", corpus / "smile.png")
    [message] = pipeline.receive_all()
    environment = pipeline.start_in_new_environment("transcribe", sqs_event([message], pipeline.queue_arn), linger=True)
    assert environment.stdout is not None
    response: dict[str, Any] = {}
    while "batchItemFailures" not in response:  # metrics and logs (JSON too) come first on stdout
        response = json.loads(environment.stdout.readline())
    assert response["batchItemFailures"] == []
    assert fake_provider.connections_opened == 1
    # When the Lambda service shuts the environment down
    environment.send_signal(signal.SIGTERM)
    # Then its SIGTERM handler closes the clients and exits cleanly (killed by the signal, it would return -15)
    assert environment.wait(timeout=30) == 0
