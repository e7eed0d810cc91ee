"""PROVIDER=bedrock through the real handlers: moto S3/SQS, PostgreSQL, and boto3's bedrock-runtime client talking to a
real local server that speaks Converse (tests/fakes/bedrock_server.py), beside the fake chat-completions server."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pagescribe.providers.bedrock_prices import DEFAULT_PRICES
from pagescribe.runtime import shutdown_runtime
from pagescribe.settings import get_settings
from pagescribe.store.postgres import Database
from sqlalchemy import text

from tests.fakes.bedrock_server import Answer, Fail, FakeBedrockServer, Throttle
from tests.fakes.chat_server import PROMPT_TOKENS, FakeChatServer, Status, Truncated, expected_text
from tests.support.aws_events import REGION, sqs_event
from tests.support.commands import command_environment, pagescribe
from tests.support.database import page_rows
from tests.support.pipeline import Pipeline

pytestmark = pytest.mark.integration

NOVA = "amazon.nova-lite-v1:0"
CLAUDE = "anthropic.claude-3-5-sonnet-20241022-v2:0"
STRONG = "test/strong-model"  # on the fake chat-completions server
BEDROCK = f"bedrock:{REGION}"


def configure(monkeypatch: pytest.MonkeyPatch, **env: str) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    shutdown_runtime()
    get_settings.cache_clear()


def priced(model: str, output_tokens: int) -> float:
    price = DEFAULT_PRICES[model]
    return (PROMPT_TOKENS * price.input_per_mtok + output_tokens * price.output_per_mtok) / 1_000_000


def attempts(db: Database) -> list[dict[str, Any]]:
    with db.engine.connect() as conn:
        sql = "SELECT model, provider, outcome, status_code, cost, prompt_tokens FROM attempts ORDER BY created_at, id"
        return [dict(row) for row in conn.execute(text(sql)).mappings()]


@pytest.fixture
def bedrock(pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeBedrockServer]:
    """The pipeline on PROVIDER=bedrock, MODEL Nova Lite, its bedrock-runtime client pointed at the fake (the other
    clients stay on moto)."""
    with FakeBedrockServer() as fake:
        configure(monkeypatch, PROVIDER="bedrock", MODEL=NOVA, AWS_ENDPOINT_URL_BEDROCK_RUNTIME=fake.endpoint_url)
        yield fake


@pytest.mark.parametrize("stream", ["auto", "off"])
def test_pages_are_transcribed_on_bedrock_and_priced_from_the_table(
    pipeline: Pipeline,
    db: Database,
    bedrock: FakeBedrockServer,
    fake_provider: FakeChatServer,
    corpus: Path,
    monkeypatch: pytest.MonkeyPatch,
    stream: str,
) -> None:
    # Given a four-page document, and answers streamed (ConverseStream) or not (Converse) as PROVIDER_STREAM says
    configure(monkeypatch, PROVIDER_STREAM=stream)
    [doc] = pipeline.upload("uploads/two.pdf", corpus / "pdflatex-4-pages.pdf")["documents"]
    # When the queue is drained
    pipeline.run_until_idle()
    # Then every page was one Converse call to the model, answered with that page's text
    assert bedrock.calls == {NOVA: 4} and fake_provider.calls == 0
    assert bedrock.streamed == [stream != "off"] * 4
    jobs = page_rows(db, doc["document_id"])
    assert [j["status"] for j in jobs] == ["COMPLETED"] * 4
    sent = [base64.b64decode(body["messages"][0]["content"][1]["image"]["source"]["bytes"]) for body in bedrock.bodies]
    assert sorted(j["result_text"] for j in jobs) == sorted(expected_text(image) for image in sent)
    assert len({j["result_text"] for j in jobs}) == 4
    # And each call's cost is its tokens at the table's price, the provider recorded as Bedrock
    rows = attempts(db)
    assert [(r["model"], r["provider"], r["outcome"]) for r in rows] == [(NOVA, BEDROCK, "KEPT")] * 4
    assert all(float(r["cost"]) == pytest.approx(priced(NOVA, 4), abs=1e-8) for r in rows)
    _, js = pipeline.transcript(doc["document_id"])
    assert js["cost"] == pytest.approx(4 * priced(NOVA, 4), abs=1e-7)


def test_duplicate_deliveries_to_three_environments_pay_each_page_once(
    pipeline: Pipeline, db: Database, bedrock: FakeBedrockServer, corpus: Path
) -> None:
    # Given a 4-page document whose batch is delivered to three environments (processes) at once, answers slow enough
    # for them to overlap
    [doc] = pipeline.upload("uploads/dups.pdf", corpus / "pdflatex-4-pages.pdf")["documents"]
    bedrock.default = Answer(delay=1.5)
    event = sqs_event(pipeline.receive_all(), pipeline.queue_arn)
    responses = pipeline.invoke_in_new_environments("transcribe", event, 3)
    # Then each page was asked and paid exactly once
    assert all(r["batchItemFailures"] == [] for r in responses)
    assert bedrock.calls == {NOVA: 4} and len({digest for _, digest in bedrock.answered}) == 4
    assert [j["status"] for j in page_rows(db, doc["document_id"])] == ["COMPLETED"] * 4
    assert len(attempts(db)) == 4


def test_a_throttle_pauses_every_environment_through_the_governor(
    pipeline: Pipeline, db: Database, bedrock: FakeBedrockServer, corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given the governor on and two one-page documents queued, and Bedrock throttling the next call for 900 s (far
    # longer than the test takes on a busy machine, so that the pause is still on when it is checked)
    configure(monkeypatch, RATE_LIMIT_RPM="600")
    pipeline.upload("uploads/a.png", corpus / "smile.png")
    pipeline.upload("uploads/b.jpg", corpus / "smile.jpg")
    first, second = pipeline.receive_all()
    bedrock.script(Throttle(retry_after="900"))
    # When one environment gets the throttle, and another process, which never saw it, the other page
    [answer] = pipeline.invoke_in_new_environments("transcribe", sqs_event([first], pipeline.queue_arn), 1)
    assert answer["batchItemFailures"] == [] and bedrock.calls == {NOVA: 1}
    [answer] = pipeline.invoke_in_new_environments("transcribe", sqs_event([second], pipeline.queue_arn), 1)
    # Then the second makes no call: the model is paused on Bedrock's bucket, both pages wait in the queue
    assert answer["batchItemFailures"] == [] and bedrock.calls == {NOVA: 1}
    with db.engine.connect() as conn:
        buckets = conn.execute(
            text("SELECT provider, model, paused_until > now() + interval '60 seconds' AS paused FROM rate_buckets")
        ).all()
        jobs = conn.execute(text("SELECT status, attempts FROM jobs")).all()
    assert [tuple(b) for b in buckets] == [(BEDROCK, NOVA, True)]
    assert sorted(tuple(j) for j in jobs) == [("QUEUED", 0), ("QUEUED", 0)]
    assert [(r["provider"], r["outcome"], r["status_code"], r["cost"]) for r in attempts(db)] == [
        (BEDROCK, "RATE_LIMITED", 429, None)
    ]


@pytest.mark.parametrize("direction", ["bedrock to chat", "chat to bedrock"])
def test_a_hard_flagged_page_escalates_to_a_model_on_the_other_provider(
    pipeline: Pipeline,
    db: Database,
    bedrock: FakeBedrockServer,
    fake_provider: FakeChatServer,
    corpus: Path,
    monkeypatch: pytest.MonkeyPatch,
    direction: str,
) -> None:
    chat = f"openai-compatible:{fake_provider.base_url.split('://')[1].split('/')[0]}"
    if direction == "bedrock to chat":  # Nova truncates the page; the strong model is on the chat endpoint
        configure(monkeypatch, ESCALATION_MODEL=STRONG, ESCALATION_PROVIDER="openai-compatible", TILES="off")
        bedrock.script(Answer(text="partial", stop_reason="max_tokens", output_tokens=50))
        fake_provider.script(Status(503))  # the strong model's first request fails, and is retried within the call
        first, then = (NOVA, BEDROCK, priced(NOVA, 50)), (STRONG, chat, 0.00012)
    else:  # the chat model truncates the page; Claude on Bedrock is the escalation model
        configure(
            monkeypatch,
            PROVIDER="auto",
            ESCALATION_MODEL=CLAUDE,
            ESCALATION_PROVIDER="bedrock",
            MODEL="test/weak",
            TILES="off",  # a truncated answer escalates instead of being read again in tiles
        )
        fake_provider.script(Truncated())
        bedrock.script(Fail(503, "ServiceUnavailableException"))  # Claude's first request fails, and is retried
        first, then = ("test/weak", chat, 0.00012), (CLAUDE, BEDROCK, priced(CLAUDE, 4))
    # When a one-page document is transcribed
    [doc] = pipeline.upload("uploads/page.png", corpus / "smile.png")["documents"]
    pipeline.run_until_idle()
    # Then its truncated answer was escalated once, to the other provider, whose answer the page keeps (its failed
    # request recorded as that provider's)
    [job] = page_rows(db, doc["document_id"])
    assert (job["status"], job["model"]) == ("COMPLETED", then[0])
    assert job["result_text"].startswith("Transcribed page image ")
    rows = attempts(db)
    assert [(r["model"], r["provider"], r["outcome"], r["status_code"]) for r in rows] == [
        (first[0], first[1], "ESCALATED", None),
        (then[0], then[1], "ERROR", 503),
        (then[0], then[1], "KEPT", None),
    ]
    paid = [float(r["cost"]) for r in rows if r["cost"] is not None]
    assert paid == [pytest.approx(first[2], abs=1e-8), pytest.approx(then[2], abs=1e-8)]
    assert fake_provider.calls + sum(bedrock.calls.values()) == 3


def test_the_local_command_calls_bedrock_with_the_users_own_aws_account(
    database_url: str, fake_provider: FakeChatServer, corpus: Path, tmp_path: Path
) -> None:
    # Given the user's AWS credentials and PROVIDER=bedrock (the local stack points its own AWS clients at moto)
    with FakeBedrockServer() as bedrock:
        env = command_environment(database_url, fake_provider) | {
            "PROVIDER": "bedrock",
            "MODEL": NOVA,
            "AWS_ACCESS_KEY_ID": "AKIDTHEUSERSOWN",
            "AWS_SECRET_ACCESS_KEY": "the-users-secret",
            "AWS_DEFAULT_REGION": "eu-west-1",
            "AWS_ENDPOINT_URL_BEDROCK_RUNTIME": bedrock.endpoint_url,
        }
        # When pagescribe transcribe runs on an image
        result = pagescribe(
            "transcribe", str(corpus / "smile.png"), "--out", "out", "--no-reuse", env=env, cwd=tmp_path
        )
    # Then the page was one Converse call signed with the user's key for their region, and the transcript has its text
    assert result.returncode == 0, result.stderr
    assert bedrock.signers == ["AKIDTHEUSERSOWN/eu-west-1/bedrock"] and fake_provider.calls == 0
    image = base64.b64decode(bedrock.bodies[0]["messages"][0]["content"][1]["image"]["source"]["bytes"])
    assert expected_text(image) in (tmp_path / "out" / "smile.md").read_text()
