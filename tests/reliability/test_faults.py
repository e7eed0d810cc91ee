"""Provider faults end to end: the real upload and transcribe handlers, moto SQS/S3, PostgreSQL and the local
fake chat-completions server misbehaving on purpose.

Every fault must end in the documented state with its reason recorded (README, "How it works"):

* retryable (429, 408, 5xx, resets, hangs and trickles past the call's time, empty or malformed answers, an error
  body with a 5xx or no code) -> the page goes back to QUEUED with a new message, and after MAX_ATTEMPTS it
  is FAILED "attempts exhausted (n of N): <reason>";
* other 4xx (and 501) -> FAILED at once with the provider's own message;
* a truncated answer (finish_reason=length) -> FAILED, keeping the partial text;
* a transient fault that clears -> COMPLETED.

Throughout: every invocation returns before its Lambda deadline, the provider is never hammered, no page is
ever COMPLETED with empty text, and no message keeps coming back.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import pytest
from pagescribe.handlers import transcribe as transcribe_app
from pagescribe.runtime import shutdown_runtime
from pagescribe.settings import get_settings
from pagescribe.store.postgres import Database
from sqlalchemy import text

from tests.fakes.chat_server import (
    Behaviour,
    BodyError,
    Empty,
    FakeChatServer,
    Hang,
    Malformed,
    Ok,
    Reset,
    Status,
    Trickle,
    Truncated,
    expected_text,
)
from tests.support.aws_events import LambdaContext, sqs_event, sqs_record_for_body
from tests.support.database import page_rows
from tests.support.pipeline import Pipeline

pytestmark = pytest.mark.integration

# The transcribe function's configured timeout, and the model call's time every hang and trickle runs into, in seconds:
# long enough that a loaded machine answers at once within it (a first request slower than the call's time would end
# as "no answer" instead of the fault under test, as a 1 s call did on CI), short enough for hangs to play out quickly.
FUNCTION_TIMEOUT = 10.0
PROVIDER_TIMEOUT = 4.0
MAX_ATTEMPTS = 3


def max_http_attempts(call_seconds: float) -> int:
    """The most HTTP requests one call may make in its time: backoff inside a call waits at least 0.25 s, then
    0.5 s, 1 s, ..., and no request starts after a wait that would end past the call's time (4 s: 5 requests)."""
    requests, waited, wait = 1, 0.0, 0.25
    while waited + wait < call_seconds:
        requests, waited, wait = requests + 1, waited + wait, wait * 2
    return requests


@pytest.fixture
def faults(pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch) -> Iterator[Pipeline]:
    """The pipeline with a short function timeout and model-call budget, so that faults play out quickly."""
    settings = {
        "FUNCTION_TIMEOUT_SECONDS": str(FUNCTION_TIMEOUT),
        "PROVIDER_TIMEOUT_SECONDS": str(PROVIDER_TIMEOUT),
        "RESULT_RESERVE_SECONDS": "3",
        "MIN_CALL_BUDGET_SECONDS": "0.5",
        "RETRY_BASE_SECONDS": "0",
        "MAX_ATTEMPTS": str(MAX_ATTEMPTS),
    }
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    get_settings.cache_clear()
    shutdown_runtime()
    get_settings().check_model_call_time()  # the transcribe function's cold-start check holds
    yield pipeline
    shutdown_runtime()


@dataclass
class Run:
    """What draining the queue through the transcribe function looked like."""

    responses: list[dict[str, Any]] = field(default_factory=list)
    remaining_ms: list[int] = field(default_factory=list)  # the Lambda context's time left when each returned
    message_ids: list[str] = field(default_factory=list)  # every message delivered

    @property
    def batch_item_failures(self) -> list[dict[str, str]]:
        return [f for r in self.responses for f in r["batchItemFailures"]]


def _unfinished(db: Database) -> int:
    with db.engine.connect() as conn:
        return int(
            conn.execute(text("SELECT count(*) FROM jobs WHERE status IN ('QUEUED', 'PROCESSING')")).scalar_one()
        )


def invoke(pipeline: Pipeline, messages: list[dict[str, Any]], run: Run) -> dict[str, Any]:
    """One transcribe invocation of these received messages with a real deadline of FUNCTION_TIMEOUT; like the
    event source mapping, deletes those it succeeded with and makes the failed ones visible again at once."""
    response = invoke_event(sqs_event(messages, pipeline.queue_arn), run)
    failed = {f["itemIdentifier"] for f in response["batchItemFailures"]}
    for m in messages:
        if m["MessageId"] in failed:
            pipeline.sqs.change_message_visibility(
                QueueUrl=pipeline.queue_url, ReceiptHandle=m["ReceiptHandle"], VisibilityTimeout=0
            )
        else:
            pipeline.sqs.delete_message(QueueUrl=pipeline.queue_url, ReceiptHandle=m["ReceiptHandle"])
    return response


def invoke_event(event: dict[str, Any], run: Run) -> dict[str, Any]:
    """One transcribe invocation with a real deadline of the configured function timeout (FUNCTION_TIMEOUT unless a
    test sets another); records the time it had left."""
    context = LambdaContext(get_settings().function_timeout_seconds)
    response = dict(transcribe_app.handler(event, context))
    run.remaining_ms.append(context.get_remaining_time_in_millis())
    run.responses.append(response)
    run.message_ids.extend(r["messageId"] for r in event["Records"])
    return response


def drain(pipeline: Pipeline, db: Database, *, max_rounds: int = 40) -> Run:
    """Play the event source mapping until every page is finished and the queue is empty: receive (long
    polling 1 s, so delayed retries arrive) and invoke."""
    run = Run()
    for _ in range(max_rounds):
        wait = 0 if _unfinished(db) == 0 else 1  # all done: only confirm that nothing is left
        messages = pipeline.sqs.receive_message(
            QueueUrl=pipeline.queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=wait, AttributeNames=["All"]
        ).get("Messages", [])
        if not messages:
            if _unfinished(db) == 0:
                return run
            continue
        invoke(pipeline, messages, run)
    raise AssertionError(f"the pages did not finish in {max_rounds} rounds: {run}")


def assert_no_silent_pages(db: Database) -> None:
    """No page anywhere is COMPLETED with no text: a page is either transcribed or says why it is not."""
    with db.engine.connect() as conn:
        silent = conn.execute(
            text(
                "SELECT id, result_text FROM jobs WHERE status = 'COMPLETED' "
                "AND (result_text IS NULL OR btrim(result_text, E' \\t\\r\\n') = '')"
            )
        ).all()
        unexplained = conn.execute(
            text("SELECT id FROM jobs WHERE status = 'FAILED' AND (error IS NULL OR btrim(error) = '')")
        ).all()
    assert silent == [] and unexplained == []


def assert_queue_empty(pipeline: Pipeline) -> None:
    """Nothing left to deliver, in flight or delayed: no message keeps coming back."""
    attributes = pipeline.sqs.get_queue_attributes(
        QueueUrl=pipeline.queue_url,
        AttributeNames=[
            "ApproximateNumberOfMessages",
            "ApproximateNumberOfMessagesNotVisible",
            "ApproximateNumberOfMessagesDelayed",
        ],
    )["Attributes"]
    assert {k: int(v) for k, v in attributes.items()} == dict.fromkeys(attributes, 0)


def assert_within_deadlines(run: Run) -> None:
    assert run.remaining_ms and all(ms > 0 for ms in run.remaining_ms), run.remaining_ms


def _in_one_second() -> str:
    return format_datetime(datetime.now(UTC) + timedelta(seconds=1), usegmt=True)


# Faults that never clear: each page is retried MAX_ATTEMPTS times, then FAILED with the last reason.
PERSISTENT_RETRYABLE: list[Any] = [
    pytest.param(
        lambda: Status(429, "Rate limit exceeded", retry_after="1"),
        "HTTP 429: Rate limit exceeded",
        id="429-retry-after-seconds",
    ),
    pytest.param(
        lambda: Status(429, "Rate limit exceeded", retry_after=_in_one_second()),
        "HTTP 429: Rate limit exceeded",
        id="429-retry-after-http-date",
    ),
    pytest.param(
        lambda: Status(429, "Rate limit exceeded", retry_after="0"),
        "HTTP 429: Rate limit exceeded",
        id="429-retry-after-zero",
    ),
    pytest.param(lambda: Status(500, "Internal Server Error"), "HTTP 500: Internal Server Error", id="500"),
    pytest.param(lambda: Status(502, "Bad Gateway"), "HTTP 502: Bad Gateway", id="502"),
    pytest.param(
        lambda: Status(503, "Service Unavailable", retry_after="1"), "HTTP 503: Service Unavailable", id="503"
    ),
    pytest.param(Reset, "could not reach the provider", id="connection-reset"),
    pytest.param(
        lambda: Hang(60), f"no answer from the provider within the call's {PROVIDER_TIMEOUT:.1f} s", id="hang"
    ),
    pytest.param(lambda: Trickle(60, chunks=120), f"within the call's {PROVIDER_TIMEOUT:.1f} s", id="trickle"),
    pytest.param(Empty, "provider returned an empty answer", id="empty-answer"),
    pytest.param(Malformed, "provider returned a malformed response: body is not JSON", id="malformed-json"),
    pytest.param(
        lambda: BodyError(502, "upstream model overloaded"),
        "provider reported error 502: upstream model overloaded",
        id="200-with-error-body",
    ),
]


@pytest.mark.parametrize(("fault", "reason"), PERSISTENT_RETRYABLE)
def test_a_fault_that_never_clears_fails_the_page_after_max_attempts(
    faults: Pipeline,
    db: Database,
    fake_provider: FakeChatServer,
    corpus: Path,
    fault: Callable[[], Behaviour],
    reason: str,
) -> None:
    # Given a one-page document and a provider that keeps failing the same way
    [doc] = faults.upload("uploads/fault.png", corpus / "smile.png")["documents"]
    [original] = faults.receive_all()
    fake_provider.set_default(fault())
    run = Run()
    # When the first delivery is handled
    invoke(faults, [original], run)
    # Then the page is back in the queue: QUEUED, one attempt used, the reason recorded, a new message sent
    [page] = page_rows(db, doc["document_id"])
    assert (page["status"], page["attempts"]) == ("QUEUED", 1)
    assert reason in page["error"] and page["enqueued_at"] is not None
    # When the queue is drained through the transcribe function
    rest = drain(faults, db)
    # Then the page is FAILED after MAX_ATTEMPTS attempts, saying so and why, each attempt on a new message
    [page] = page_rows(db, doc["document_id"])
    assert (page["status"], page["attempts"]) == ("FAILED", MAX_ATTEMPTS)
    assert page["error"].startswith(f"attempts exhausted ({MAX_ATTEMPTS} of {MAX_ATTEMPTS}): ")
    assert reason in page["error"]
    assert len(set(run.message_ids + rest.message_ids)) == MAX_ATTEMPTS
    # And the document is finished FAILED, its transcript naming the reason
    markdown, js = faults.transcript(doc["document_id"])
    assert js["status"] == "FAILED" and reason in markdown
    # And no invocation outlived its deadline, none asked for a redelivery, the provider was not hammered
    assert_within_deadlines(run)
    assert_within_deadlines(rest)
    assert run.batch_item_failures == [] and rest.batch_item_failures == []
    assert 1 <= fake_provider.calls <= MAX_ATTEMPTS * max_http_attempts(PROVIDER_TIMEOUT)
    assert_queue_empty(faults)
    assert_no_silent_pages(db)


# More shapes of a retryable answer, each checked on its first attempt: requeued with the reason on a new message.
RETRYABLE_SHAPES: list[Any] = [
    pytest.param(Status(408, "Request Timeout"), "HTTP 408: Request Timeout", id="408"),
    pytest.param(Status(504, "Gateway Timeout"), "HTTP 504: Gateway Timeout", id="504"),
    pytest.param(Status(429, "slow down", retry_after="soon"), "HTTP 429: slow down", id="429-unparseable-retry-after"),
    pytest.param(
        Status(502, body="<html><body>502 Bad Gateway</body></html>"),
        "HTTP 502: <html><body>502 Bad Gateway",
        id="502-html-from-a-proxy",
    ),
    pytest.param(Ok(text=" \n\t \n"), "empty answer", id="whitespace-answer"),
    pytest.param(Ok(text="", as_parts=True), "empty answer", id="empty-content-parts"),
    pytest.param(
        Status(200, body='{"choices": [{"message": {"content": null}, "finish_reason": "stop"}]}'),
        "empty answer",
        id="null-content",
    ),
    pytest.param(Status(200, body='{"choices": []}'), "malformed response: no choices", id="no-choices"),
    pytest.param(
        Status(200, body='{"choices": [{"message": {"content": 42}}]}'),
        "neither text nor a list of parts",
        id="content-not-text",
    ),
    pytest.param(Status(200, body="[1, 2, 3]"), "malformed response: body is not a JSON object", id="json-array"),
    pytest.param(
        Status(200, body="<html>upstream error</html>"), "malformed response: body is not JSON", id="200-html"
    ),
    pytest.param(Ok(text="half an answer", finish_reason="error"), "finish_reason=error", id="finish-reason-error"),
    pytest.param(
        BodyError("server_error", "the model crashed"),
        "provider reported error server_error: the model crashed",
        id="200-error-body-string-code",
    ),
]


@pytest.mark.parametrize(("fault", "reason"), RETRYABLE_SHAPES)
def test_every_shape_of_a_retryable_answer_requeues_the_page_with_its_reason(
    faults: Pipeline, db: Database, fake_provider: FakeChatServer, corpus: Path, fault: Behaviour, reason: str
) -> None:
    # Given a one-page document and a provider answering with this fault every time
    [doc] = faults.upload("uploads/shape.png", corpus / "smile.png")["documents"]
    [original] = faults.receive_all()
    fake_provider.set_default(fault)
    run = Run()
    # When the transcribe function handles the delivery
    response = invoke(faults, [original], run)
    # Then it returned in time and acknowledged the message
    assert_within_deadlines(run)
    assert response["batchItemFailures"] == []
    # And the page is QUEUED again with the reason, and exactly one new message carries it
    [page] = page_rows(db, doc["document_id"])
    assert (page["status"], page["attempts"], page["result_text"]) == ("QUEUED", 1, None)
    assert reason in page["error"]
    [again] = faults.receive_all()
    assert again["MessageId"] != original["MessageId"] and json.loads(again["Body"])["job_id"] == str(page["id"])
    assert 1 <= fake_provider.calls <= max_http_attempts(PROVIDER_TIMEOUT)
    assert_no_silent_pages(db)


CLIENT_ERRORS: list[Any] = [
    pytest.param(
        Status(400, "image_url: unsupported image format"), "HTTP 400: image_url: unsupported image format", id="400"
    ),
    pytest.param(Status(401, "No auth credentials found"), "HTTP 401: No auth credentials found", id="401"),
    pytest.param(Status(402, "Insufficient credits"), "HTTP 402: Insufficient credits", id="402"),
    pytest.param(
        Status(403, "Your key is not allowed to use this model"), "HTTP 403: Your key is not allowed", id="403"
    ),
    pytest.param(Status(404, "No endpoints found for test/vision-model"), "HTTP 404: No endpoints found", id="404"),
    pytest.param(Status(413, "Request Entity Too Large"), "HTTP 413: Request Entity Too Large", id="413"),
    pytest.param(Status(422, "max_tokens is too large"), "HTTP 422: max_tokens is too large", id="422"),
    pytest.param(Status(501, "Not Implemented"), "HTTP 501: Not Implemented", id="501"),
    pytest.param(Status(302, "Found"), "HTTP 302: Found", id="302-redirect-not-followed"),
    pytest.param(
        BodyError(400, "the image is too small"),
        "provider reported error 400: the image is too small",
        id="200-with-a-4xx-error-body",
    ),
]


@pytest.mark.parametrize(("fault", "reason"), CLIENT_ERRORS)
def test_a_client_error_fails_the_page_at_once_with_the_providers_message(
    faults: Pipeline, db: Database, fake_provider: FakeChatServer, corpus: Path, fault: Behaviour, reason: str
) -> None:
    # Given a provider that refuses the page at once
    [doc] = faults.upload("uploads/refused.png", corpus / "smile.png")["documents"]
    fake_provider.set_default(fault)
    # When the queue is drained
    run = drain(faults, db)
    # Then the page FAILED on its first attempt with the provider's own words, after a single call
    [page] = page_rows(db, doc["document_id"])
    assert (page["status"], page["attempts"]) == ("FAILED", 1)
    assert reason in page["error"] and "attempts exhausted" not in page["error"]
    assert fake_provider.calls == 1
    _, js = faults.transcript(doc["document_id"])
    assert js["status"] == "FAILED"
    assert_within_deadlines(run)
    assert run.batch_item_failures == []
    assert_queue_empty(faults)
    assert_no_silent_pages(db)


def test_an_unreachable_provider_fails_the_page_after_max_attempts(
    faults: Pipeline, db: Database, corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a provider endpoint where nothing listens (connections are refused at once)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("PROVIDER_BASE_URL", f"http://127.0.0.1:{port}/v1")
    get_settings.cache_clear()
    shutdown_runtime()
    [doc] = faults.upload("uploads/nobody.png", corpus / "smile.png")["documents"]
    # When the queue is drained
    run = drain(faults, db)
    # Then the page is FAILED after MAX_ATTEMPTS attempts, saying the provider could not be reached
    [page] = page_rows(db, doc["document_id"])
    assert (page["status"], page["attempts"]) == ("FAILED", MAX_ATTEMPTS)
    assert page["error"].startswith(
        f"attempts exhausted ({MAX_ATTEMPTS} of {MAX_ATTEMPTS}): could not reach the provider"
    )
    assert len(set(run.message_ids)) == MAX_ATTEMPTS
    assert_within_deadlines(run)
    assert run.batch_item_failures == []
    assert_queue_empty(faults)
    assert_no_silent_pages(db)


@pytest.mark.parametrize("partial", ["the first half of the pa", ""], ids=["partial-text", "nothing-before-the-limit"])
def test_a_truncated_answer_fails_the_page_and_keeps_the_partial_text(
    faults: Pipeline, db: Database, fake_provider: FakeChatServer, corpus: Path, partial: str
) -> None:
    # Given a model that stops at the output token limit
    [doc] = faults.upload("uploads/long.png", corpus / "smile.png")["documents"]
    fake_provider.set_default(Truncated(partial))
    # When the queue is drained
    run = drain(faults, db)
    # Then the page is FAILED (never a silent success), keeping what the model did say
    [page] = page_rows(db, doc["document_id"])
    assert (page["status"], page["attempts"], page["finish_reason"]) == ("FAILED", 1, "length")
    assert page["result_text"] == partial and "truncated" in page["error"] and "MAX_OUTPUT_TOKENS" in page["error"]
    assert fake_provider.calls == 4  # the whole page, then read in three tiles (once: truncated too, no more)
    assert_within_deadlines(run)
    assert_queue_empty(faults)
    assert_no_silent_pages(db)


# Faults that clear: within one call's time (one attempt), or on the next delivery (the page was requeued).
TRANSIENT: list[Any] = [
    pytest.param([Status(500, "hiccup"), Ok()], 1, id="500-then-ok"),
    pytest.param([Status(503, "hiccup"), Ok()], 1, id="503-then-ok"),
    pytest.param([Reset(), Ok()], 1, id="reset-then-ok"),
    pytest.param([Empty(), Ok()], 1, id="empty-then-ok"),
    pytest.param([Malformed(), Ok()], 1, id="malformed-then-ok"),
    pytest.param([BodyError(503, "busy"), Ok()], 1, id="error-body-then-ok"),
    pytest.param([Status(429, "slow down", retry_after="0"), Ok()], 1, id="429-retry-after-zero-then-ok"),
    pytest.param([Status(429, "slow down", retry_after="5"), Ok()], 2, id="429-longer-than-the-budget-then-ok"),
    pytest.param([Hang(60), Ok()], 2, id="hang-then-ok"),
    pytest.param([Trickle(60, chunks=120), Ok()], 2, id="trickle-then-ok"),
    pytest.param([Hang(60), Hang(60), Ok()], 3, id="two-hangs-then-ok-on-the-last-attempt"),
]


@pytest.mark.parametrize(("script", "attempts"), TRANSIENT)
def test_a_transient_fault_that_clears_completes_the_page(
    faults: Pipeline,
    db: Database,
    fake_provider: FakeChatServer,
    corpus: Path,
    script: list[Behaviour],
    attempts: int,
) -> None:
    # Given a provider that misbehaves for a while, then answers
    source = corpus / "smile.png"
    [doc] = faults.upload("uploads/transient.png", source)["documents"]
    fake_provider.script(*script)
    # When the queue is drained
    run = drain(faults, db)
    # Then the page is COMPLETED with the model's answer for that page, after the expected number of attempts
    [page] = page_rows(db, doc["document_id"])
    assert (page["status"], page["attempts"], page["error"]) == ("COMPLETED", attempts, None)
    [request] = fake_provider.requests[-1:]
    assert page["result_text"] == expected_text(_image_of(request))
    _, js = faults.transcript(doc["document_id"])
    assert js["status"] == "COMPLETED"
    assert fake_provider.calls == len(script)
    # And every request the provider answered is in the ledger, the retried ones within a call included: each failed
    # one as an error or a rate limit, and the answer kept
    with db.engine.connect() as conn:
        ledger = conn.execute(
            text("SELECT outcome FROM attempts WHERE document_id = :id ORDER BY id"), {"id": doc["document_id"]}
        ).scalars()
        outcomes = list(ledger)
    assert len(outcomes) == len(script) and outcomes[-1] == "KEPT", outcomes
    assert set(outcomes[:-1]) <= {"ERROR", "RATE_LIMITED"}, outcomes
    assert_within_deadlines(run)
    assert run.batch_item_failures == []
    assert_queue_empty(faults)
    assert_no_silent_pages(db)


def _image_of(request: dict[str, Any]) -> bytes:
    import base64

    url = request["messages"][0]["content"][1]["image_url"]["url"]
    return base64.b64decode(url.partition(",")[2])


def test_requeues_back_off_exponentially_and_honour_a_longer_retry_after(
    faults: Pipeline, db: Database, fake_provider: FakeChatServer, corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a 20 s base retry delay and a provider that is down
    monkeypatch.setenv("RETRY_BASE_SECONDS", "20")
    get_settings.cache_clear()
    shutdown_runtime()
    [doc] = faults.upload("uploads/backoff.png", corpus / "smile.png")["documents"]
    [original] = faults.receive_all()
    fake_provider.set_default(Status(503, "overloaded"))
    run = Run()

    def delay_of_requeue() -> float:
        with db.engine.connect() as conn:
            return float(
                conn.execute(
                    text("SELECT EXTRACT(EPOCH FROM available_at - now()) FROM jobs WHERE document_id = :id"),
                    {"id": doc["document_id"]},
                ).scalar_one()
            )

    def attributes() -> dict[str, int]:
        names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesDelayed"]
        got = faults.sqs.get_queue_attributes(QueueUrl=faults.queue_url, AttributeNames=names)["Attributes"]
        return {k: int(v) for k, v in got.items()}

    # When the first attempt fails
    invoke(faults, [original], run)
    # Then the page is due again in about 20 s, and its new message is delayed, not visible
    assert 15 <= delay_of_requeue() <= 20
    assert attributes() == {"ApproximateNumberOfMessages": 0, "ApproximateNumberOfMessagesDelayed": 1}
    # When the second attempt fails (the delayed message arrives; here a copy of its body, delivered now)
    body = json.dumps({"job_id": str(page_rows(db, doc["document_id"])[0]["id"])})
    invoke_event({"Records": [sqs_record_for_body(body, faults.queue_arn)]}, run)
    # Then the wait doubles
    assert 35 <= delay_of_requeue() <= 40
    # When the third attempt is asked to wait longer than the backoff (Retry-After: 120)
    fake_provider.set_default(Status(429, "quota", retry_after="120"))
    monkeypatch.setenv("MAX_ATTEMPTS", "4")
    get_settings.cache_clear()
    shutdown_runtime()
    invoke_event({"Records": [sqs_record_for_body(body, faults.queue_arn)]}, run)
    # Then the page waits as long as the provider asked, without the invocation sitting out the wait
    assert 115 <= delay_of_requeue() <= 120
    [page] = page_rows(db, doc["document_id"])
    assert (page["status"], page["attempts"]) == ("QUEUED", 3) and "HTTP 429: quota" in page["error"]
    assert_within_deadlines(run)
    assert run.batch_item_failures == []
    assert_no_silent_pages(db)


def test_a_retry_after_beyond_sqs_limits_is_capped_at_the_longest_delay(
    faults: Pipeline, db: Database, fake_provider: FakeChatServer, corpus: Path
) -> None:
    # Given a provider that asks for an hour's pause
    [doc] = faults.upload("uploads/hour.png", corpus / "smile.png")["documents"]
    [original] = faults.receive_all()
    fake_provider.set_default(Status(429, "come back in an hour", retry_after="3600"))
    run = Run()
    # When the page is attempted
    invoke(faults, [original], run)
    # Then the invocation did not wait: one call, back in the queue, due in SQS's longest delay (900 s)
    assert_within_deadlines(run)
    assert fake_provider.calls == 1
    with db.engine.connect() as conn:
        delay = conn.execute(
            text("SELECT EXTRACT(EPOCH FROM available_at - now()) FROM jobs WHERE document_id = :id"),
            {"id": doc["document_id"]},
        ).scalar_one()
    assert 890 <= float(delay) <= 900
    [page] = page_rows(db, doc["document_id"])
    assert page["status"] == "QUEUED" and "come back in an hour" in page["error"]


def test_concurrent_pages_each_end_in_their_own_documented_state(
    faults: Pipeline, db: Database, fake_provider: FakeChatServer, corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TILES", "off")  # the truncated page fails (read in tiles, it would complete)
    get_settings.cache_clear()
    shutdown_runtime()
    # Given a 4-page PDF whose pages, transcribed concurrently in one batch, meet four different answers
    [doc] = faults.upload("uploads/mixed.pdf", corpus / "pdflatex-4-pages.pdf")["documents"]
    fake_provider.script(Ok(), Status(400, "content policy"), Truncated("cut sho"), Hang(60))
    fake_provider.set_default(Ok())
    # When the queue is drained
    run = drain(faults, db)
    # Then two pages are COMPLETED (one after its hang was retried), one refused, one truncated
    pages = page_rows(db, doc["document_id"])
    assert sorted((p["status"], p["attempts"]) for p in pages) == [
        ("COMPLETED", 1),
        ("COMPLETED", 2),
        ("FAILED", 1),
        ("FAILED", 1),
    ]
    [refused] = [p for p in pages if "HTTP 400: content policy" in (p["error"] or "")]
    [truncated] = [p for p in pages if p["finish_reason"] == "length"]
    assert refused["result_text"] is None and truncated["result_text"] == "cut sho"
    assert truncated["status"] == "FAILED" and "truncated" in truncated["error"]
    # And the document is PARTIAL, its transcript in page order with the failures marked
    markdown, js = faults.transcript(doc["document_id"])
    assert js["status"] == "PARTIAL" and [p["page"] for p in js["pages"]] == [1, 2, 3, 4]
    assert "content policy" in markdown and "truncated" in markdown
    assert_within_deadlines(run)
    assert run.batch_item_failures == []
    assert_queue_empty(faults)
    assert_no_silent_pages(db)


def test_a_provider_down_for_a_whole_batch_fails_every_page_in_time(
    faults: Pipeline, db: Database, fake_provider: FakeChatServer, corpus: Path
) -> None:
    # Given a 4-page PDF and a provider that hangs on every request
    [doc] = faults.upload("uploads/down.pdf", corpus / "pdflatex-4-pages.pdf")["documents"]
    fake_provider.set_default(Hang(60))
    # When the queue is drained (each batch carries all four pages, transcribed concurrently)
    run = drain(faults, db)
    # Then every page is FAILED after MAX_ATTEMPTS, each invocation having returned before its deadline
    pages = page_rows(db, doc["document_id"])
    assert [(p["status"], p["attempts"]) for p in pages] == [("FAILED", MAX_ATTEMPTS)] * 4
    assert all("no answer from the provider within" in p["error"] for p in pages)
    assert fake_provider.calls == 4 * MAX_ATTEMPTS  # a hang takes the call's whole time: one HTTP request per attempt
    _, js = faults.transcript(doc["document_id"])
    assert js["status"] == "FAILED"
    assert_within_deadlines(run)
    assert_queue_empty(faults)
    assert_no_silent_pages(db)


@pytest.mark.parametrize(
    ("fault", "status", "stored"),
    [
        pytest.param(Ok(text="line one\x00line two"), "COMPLETED", "line oneline two", id="nul-in-the-answer"),
        pytest.param(Ok(text="\x00\x00\x00"), "FAILED", None, id="only-nul-bytes"),
        pytest.param(Status(400, "bad\x00request"), "FAILED", None, id="nul-in-an-error-message"),
        pytest.param(Ok(text="caf\ud800e"), "COMPLETED", "caf?e", id="lone-surrogate-in-the-answer"),
    ],
)
def test_text_the_database_cannot_hold_never_wedges_a_page(
    faults: Pipeline,
    db: Database,
    fake_provider: FakeChatServer,
    corpus: Path,
    fault: Behaviour,
    status: str,
    stored: str | None,
) -> None:
    # Given a provider whose text carries NUL characters or a lone surrogate (PostgreSQL text cannot hold them)
    [doc] = faults.upload("uploads/nul.png", corpus / "smile.png")["documents"]
    fake_provider.set_default(fault)
    # When the queue is drained
    run = drain(faults, db)
    # Then the page reached a final state (not stuck PROCESSING behind a failed write), with no NUL stored
    [page] = page_rows(db, doc["document_id"])
    assert page["status"] == status
    assert "\x00" not in (page["result_text"] or "") + (page["error"] or "")
    if stored is not None:
        assert page["result_text"] == stored
    else:
        assert page["error"]
    assert_within_deadlines(run)
    assert run.batch_item_failures == []
    assert_queue_empty(faults)
    assert_no_silent_pages(db)
