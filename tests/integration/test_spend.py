"""Spend under control: one rate limit shared by every environment (the governor), cost caps and daily budgets, and
every model call in the total. Through the real handlers, separate processes as separate Lambda environments, moto,
PostgreSQL and the fake provider."""

from __future__ import annotations

import itertools
import json
import re
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from pagescribe.domain import NewDocument, PageOutcome, RateBucket, RateGrant
from pagescribe.handlers import api as api_app
from pagescribe.migrate import alembic_config
from pagescribe.runtime import shutdown_runtime
from pagescribe.settings import get_settings
from pagescribe.store.postgres import Database, create_database_engine
from sqlalchemy import text

from tests.fakes.chat_server import FakeChatServer, Gate, Ok, Status
from tests.integration.test_api import upload_through_presigned_url
from tests.support.aws_events import LambdaContext, api_event, sqs_event
from tests.support.database import claim_one, fresh_empty_database
from tests.support.pipeline import Pipeline

pytestmark = pytest.mark.integration

PRICE = 0.0001  # what the fake provider reports per call in these tests
# What a call is held at before it starts, with MAX_OUTPUT_TOKENS=4 (see configure_worst_case): the history's calls
# cost PRICE for 1,000 prompt tokens and 4 completion tokens (the fake's default answer has 4 words), so a prompt
# token costs at most PRICE / 1,000 and a completion token at most PRICE / 4.
WORST = 1000 * PRICE / 1000 + 4 * PRICE / 4


def configure(monkeypatch: pytest.MonkeyPatch, **env: str) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    shutdown_runtime()
    get_settings.cache_clear()


def rows(db: Database, sql: str, **params: Any) -> list[Any]:
    with db.engine.connect() as conn:
        return list(conn.execute(text(sql), params).mappings())


def deliver(
    pipeline: Pipeline, *, until: Callable[[], bool], environments: int = 1, max_rounds: int = 120
) -> list[dict[str, Any]]:
    """Play the event source until ``until()``: each visible batch goes to ``environments`` environments at once
    (more than one: each its own process, all with the same batch, i.e. duplicate deliveries), then its handled
    messages are deleted. Waits for delayed messages by long polling (no sleeps)."""
    responses: list[dict[str, Any]] = []
    for _ in range(max_rounds):
        if until():
            return responses
        messages = pipeline.sqs.receive_message(
            QueueUrl=pipeline.queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=1, AttributeNames=["All"]
        ).get("Messages", [])
        if not messages:
            continue
        event = sqs_event(messages, pipeline.queue_arn)
        if environments == 1:
            answered = [pipeline.invoke_transcribe(event)]
        else:
            answered = pipeline.invoke_in_new_environments("transcribe", event, environments)
        responses.extend(answered)
        failed = {f["itemIdentifier"] for response in answered for f in response["batchItemFailures"]}
        for message in messages:
            if message["MessageId"] not in failed:
                pipeline.sqs.delete_message(QueueUrl=pipeline.queue_url, ReceiptHandle=message["ReceiptHandle"])
    raise AssertionError(f"not done after {max_rounds} rounds")


def finished(db: Database, document_id: str) -> Callable[[], bool]:
    def check() -> bool:
        document = db.get_document(document_id)
        return document is not None and document.finished_at is not None

    return check


def configure_worst_case(monkeypatch: pytest.MonkeyPatch, **env: str) -> None:
    """The output limit at 4 tokens, so that a call's worst case is WORST (2 x PRICE) once the price is known."""
    configure(monkeypatch, MAX_OUTPUT_TOKENS="4", **env)


def seed_price(pipeline: Pipeline, db: Database, corpus: Path) -> None:
    """One page transcribed earlier, so the model's price (PRICE) is known."""
    [seed] = pipeline.upload("uploads/seed.png", corpus / "smile.png")["documents"]
    deliver(pipeline, until=finished(db, seed["document_id"]))


def test_a_429_pauses_every_environment_including_processes_that_never_saw_it(
    pipeline: Pipeline, db: Database, fake_provider: FakeChatServer, corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given the governor on, two one-page documents queued, and a provider whose next answer is a 429 for 120 s
    configure(monkeypatch, RATE_LIMIT_RPM="600")
    pipeline.upload("uploads/a.png", corpus / "smile.png")
    pipeline.upload("uploads/b.jpg", corpus / "smile.jpg")
    first, second = pipeline.receive_all()
    fake_provider.script(Status(429, "slow down", retry_after="120"))

    # When one environment (its own process) gets the 429 ...
    started = time.monotonic()
    [answer] = pipeline.invoke_in_new_environments("transcribe", sqs_event([first], pipeline.queue_arn), 1)
    assert answer["batchItemFailures"] == [] and fake_provider.calls == 1

    # ... and another process, which never saw it, is given the other page
    [answer] = pipeline.invoke_in_new_environments("transcribe", sqs_event([second], pipeline.queue_arn), 1)

    # Then the second one makes no call: its page waits out the pause in the queue, its attempt given back
    assert answer["batchItemFailures"] == [] and fake_provider.calls == 1
    # (the pause left is 120 s less the time the two processes took to start and run, however loaded the machine)
    earliest = 120 - (time.monotonic() - started) - 1
    jobs = rows(db, "SELECT status, attempts, error, extract(epoch FROM available_at - now()) AS due_in FROM jobs")
    [bucket] = rows(db, "SELECT extract(epoch FROM paused_until - now()) AS pause FROM rate_buckets")
    assert earliest < bucket["pause"] <= 120
    assert [(j["status"], j["attempts"]) for j in jobs] == [("QUEUED", 0), ("QUEUED", 0)]
    held = [re.match(r"held back (\d+) s before its model call", j["error"]) for j in jobs]
    assert all(match and earliest <= int(match[1]) <= 120 for match in held), jobs
    assert any("paused" in j["error"] for j in jobs), jobs  # the one that never saw the 429
    # And both pages are due when the pause ends, not before
    assert all(abs(float(j["due_in"]) - float(bucket["pause"])) < 1.5 for j in jobs), (jobs, bucket)
    # And the 429 is recorded as a call, with its status
    [attempt] = rows(db, "SELECT outcome, status_code, cost FROM attempts")
    assert dict(attempt) == {"outcome": "RATE_LIMITED", "status_code": 429, "cost": None}


def test_pages_beyond_the_rate_wait_for_their_reserved_slot_in_the_queue_then_call_without_another_token(
    pipeline: Pipeline, db: Database, fake_provider: FakeChatServer, corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given the governor at 60 calls a minute (one a second) and a 4-page document's pages in one batch
    configure(monkeypatch, RATE_LIMIT_RPM="60")
    [document] = pipeline.upload("uploads/report.pdf", corpus / "pdflatex-4-pages.pdf")["documents"]
    messages = pipeline.receive_all()

    # When the batch is handled
    answer = pipeline.invoke_transcribe(sqs_event(messages, pipeline.queue_arn))

    # Then one page calls; the others reserve the next slots and go back to the queue, each due at its slot
    assert answer["batchItemFailures"] == [] and fake_provider.calls == 1
    waiting = rows(
        db,
        "SELECT attempts, extract(epoch FROM rate_slot_at) AS slot,"
        " extract(epoch FROM available_at - rate_slot_at) AS after_slot FROM jobs WHERE status = 'QUEUED'"
        " ORDER BY rate_slot_at",
    )
    assert len(waiting) == 3 and all(j["attempts"] == 0 for j in waiting)
    slots = [float(j["slot"]) for j in waiting]
    assert [round(later - earlier, 3) for earlier, later in itertools.pairwise(slots)] == [1.0, 1.0]
    assert all(0 <= j["after_slot"] < 2 for j in waiting)  # due at its slot, rounded up to whole seconds (SQS)
    [bucket] = rows(db, "SELECT requests FROM rate_buckets")
    assert bucket["requests"] < -1.5  # three slots reserved ahead

    # When the deferred pages come back at their slots
    deliver(pipeline, until=finished(db, document["document_id"]))

    # Then each calls once, taking nothing more from the bucket, and the document completes
    assert fake_provider.calls == 4
    assert [(j["status"], j["attempts"]) for j in rows(db, "SELECT status, attempts FROM jobs")] == [
        ("COMPLETED", 1)
    ] * 4
    assert rows(db, "SELECT count(*) AS n FROM attempts")[0]["n"] == 4


def _take(db: Database, bucket: RateBucket, model: str, *, prepaid: bool, max_wait: float) -> RateGrant:
    [grant] = db.take_rate_slots(bucket, model, prepaid=[prepaid], max_wait=max_wait)
    return grant


def test_the_bucket_reserves_slots_one_interval_apart_and_a_pause_reserves_none(db: Database) -> None:
    # Given a bucket of 0.6 calls a minute (a slot every 100 s), burst 1
    bucket = RateBucket("fake", requests_per_minute=0.6, tokens_per_minute=0, burst=1)

    # When four calls ask in a row
    grants = [_take(db, bucket, "m", prepaid=False, max_wait=899) for _ in range(3)]
    prepaid = _take(db, bucket, "m", prepaid=True, max_wait=899)

    # Then the first starts now, the next two reserve slots 100 s and 200 s ahead, and a page back for its slot
    # takes nothing
    assert grants[0].wait == 0
    assert 90 < grants[1].wait <= 100 and grants[1].reserved
    assert 190 < grants[2].wait <= 200 and grants[2].reserved
    assert prepaid.wait == 0 and not prepaid.reserved
    # And a slot further away than SQS can delay is not reserved
    far = [_take(db, bucket, "m", prepaid=False, max_wait=899) for _ in range(8)]
    assert not far[-1].reserved and far[-1].wait > 899

    # When a 429 opens a 30 s pause on another model's bucket
    _take(db, bucket, "other", prepaid=False, max_wait=899)
    db.pause_rate_bucket(bucket, "other", 30)
    paused = _take(db, bucket, "other", prepaid=True, max_wait=899)

    # Then even a page holding a slot waits for the pause, and nothing is reserved meanwhile
    assert paused.paused and not paused.reserved and 20 < paused.wait <= 30


def test_the_buckets_commits_do_not_wait_for_the_wal_flush_and_nothing_else_does_so(db: Database) -> None:
    # Given a bucket
    bucket = RateBucket("fake", requests_per_minute=60, tokens_per_minute=6000, burst=2)
    params = {**bucket.params("m"), "prepaid": [False], "max_wait": 899.0}
    params |= {"owed": 10, "kept": 0.9, "learned": 1.0, "first_mean": 10}  # SETTLE_RATE_USAGE: one call of 10 tokens
    _take(db, bucket, "m", prepaid=False, max_wait=899)
    pooled = db.engine.raw_connection()
    try:
        connection = pooled.driver_connection
        assert connection is not None
        for statement in (db.TAKE_RATE_SLOTS, db.SETTLE_RATE_USAGE):
            # When its statement runs in a transaction, the transaction commits without waiting for the flush
            with connection.transaction():
                connection.execute(statement, params)
                assert connection.execute("SHOW synchronous_commit").fetchone() == ("off",)
            # And the next transaction on the connection waits for it again
            with connection.transaction():
                assert connection.execute("SHOW synchronous_commit").fetchone() == ("on",)
    finally:
        pooled.close()


def create(body: dict[str, Any]) -> dict[str, Any]:
    response = api_app.handler(api_event("POST", "/documents", body=json.dumps(body)), LambdaContext(29))
    assert response["statusCode"] == 201, response["body"]
    created: dict[str, Any] = json.loads(response["body"])
    return created


def status(document_id: str) -> dict[str, Any]:
    response = api_app.handler(api_event("GET", f"/documents/{document_id}"), LambdaContext(29))
    described: dict[str, Any] = json.loads(response["body"])
    return described


def test_a_capped_document_spends_exactly_what_the_provider_reported_and_no_call_starts_after_its_cap(
    pipeline: Pipeline, db: Database, fake_provider: FakeChatServer, corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a provider reporting PRICE per call, no history yet: the estimate is unknown
    fake_provider.set_default(Ok(cost=PRICE))
    configure_worst_case(monkeypatch)
    unknown = create({"filename": "a.pdf", "content_type": "application/pdf", "pages": "1-4"})["estimate"]
    assert (unknown["cost_per_page_usd"], unknown["cost_usd"]) == (None, None) and "unknown" in unknown["basis"]
    seed_price(pipeline, db, corpus)

    # When a 4-page document is created (its estimate now known) with a cap that holds the first call's worst case,
    # then the second's once the first settled at PRICE, but not a third's, and uploaded
    cap = WORST + 1.5 * PRICE
    created = create({"filename": "report.pdf", "content_type": "application/pdf", "pages": "1-4", "max_cost_usd": cap})
    assert created["estimate"]["cost_usd"] == pytest.approx(4 * PRICE)
    upload_through_presigned_url(pipeline, created, (corpus / "pdflatex-4-pages.pdf").read_bytes())
    calls_before = fake_provider.calls

    # ... and every batch is delivered three times at once, to three environments
    deliver(pipeline, until=finished(db, created["document_id"]), environments=3)

    # Then two pages were paid for, exactly what the provider reported, and no call started after the cap
    assert fake_provider.calls - calls_before == 2
    described = status(created["document_id"])
    assert described["model_calls"] == 2 and described["cost"] == pytest.approx(2 * PRICE)
    assert described["pages"]["COMPLETED"] == 2 and described["pages"]["SKIPPED"] == 2
    # And the document ends PARTIAL, saying why, and each skipped page says it too
    assert described["status"] == "PARTIAL" and described["max_cost_usd"] == pytest.approx(cap)
    assert "2 of 4 pages skipped" in described["error"] and "max_cost_usd" in described["error"]
    skipped = [e for e in described["page_errors"] if e["status"] == "SKIPPED"]
    assert len(skipped) == 2 and all(e["error"].startswith("budget: ") for e in skipped)
    markdown, transcript = pipeline.transcript(created["document_id"])
    assert transcript["cost"] == pytest.approx(2 * PRICE) and markdown.count("SKIPPED") == 2


@pytest.mark.parametrize("whose", ["stack", "tenant"])
def test_a_tenants_daily_budget_skips_the_pages_beyond_it(
    pipeline: Pipeline,
    db: Database,
    fake_provider: FakeChatServer,
    corpus: Path,
    monkeypatch: pytest.MonkeyPatch,
    whose: str,
) -> None:
    # Given a daily budget (the stack's DAILY_BUDGET_USD, or the tenant's own, over a larger stack-wide one) that
    # holds, after one page spent today, two more calls at PRICE each held at its worst case before it starts
    fake_provider.set_default(Ok(cost=PRICE))
    budget = 2 * PRICE + WORST + 0.5 * PRICE
    if whose == "stack":
        configure_worst_case(monkeypatch, DAILY_BUDGET_USD=str(budget))
    else:
        configure_worst_case(monkeypatch, DAILY_BUDGET_USD="100")
        assert db.set_daily_budget("default", budget)
    seed_price(pipeline, db, corpus)

    # When a 4-page document is transcribed
    [document] = pipeline.upload("uploads/report.pdf", corpus / "pdflatex-4-pages.pdf")["documents"]
    deliver(pipeline, until=finished(db, document["document_id"]))

    # Then the calls stop where the day's spend could pass the budget, and the rest are skipped, saying why
    assert fake_provider.calls == 3
    [day] = rows(
        db, "SELECT sum(spent_usd) AS spent_usd, sum(calls) AS calls FROM tenant_days WHERE tenant_id = 'default'"
    )
    assert float(day["spent_usd"]) == pytest.approx(3 * PRICE) and day["calls"] == 3
    document_row = db.get_document(document["document_id"])
    assert document_row is not None and document_row.status == "PARTIAL"
    assert document_row.error is not None and "daily budget" in document_row.error
    jobs = rows(db, "SELECT status FROM jobs WHERE document_id = :d", d=document["document_id"])
    assert sorted(j["status"] for j in jobs) == ["COMPLETED", "COMPLETED", "SKIPPED", "SKIPPED"]


def _paid_page(db: Database, tenant_id: str, *, cost: float, prompt_tokens: int, completion_tokens: int) -> None:
    """One page of ``tenant_id`` answered by test/model at ``cost``, with the tokens the provider reported."""
    new = NewDocument("bucket", f"uploads/{uuid.uuid4()}.png", "etag", "", 10, "test/model", tenant_id=tenant_id)
    [job_id] = db.create_document(new, kind="image", pages=[1]).job_ids
    job = claim_one(db, job_id, lease_seconds=300, max_attempts=3)
    assert job is not None
    answer = PageOutcome("text", "stop", prompt_tokens, completion_tokens, cost, "test/model", "fake", "gen-1", 100)
    assert db.complete_job(job, answer) is not None


def _capped_call(db: Database, *, max_cost_usd: float, prompt: str | None = None) -> Any:
    """The cost gate's verdict on the first call of a new default-tenant page capped at ``max_cost_usd``."""
    new = NewDocument("bucket", f"uploads/{uuid.uuid4()}.png", "etag", "", 10, "test/model", prompt=prompt)
    [job_id] = db.create_document(new, kind="image", pages=[1]).job_ids
    with db.engine.begin() as conn:
        conn.execute(
            text("UPDATE documents SET max_cost_usd = :usd WHERE id = (SELECT document_id FROM jobs WHERE id = :j)"),
            {"usd": max_cost_usd, "j": job_id},
        )
    job = claim_one(db, job_id, lease_seconds=300, max_attempts=3)
    assert job is not None
    return db.admit_spends([job], "test/model", daily_budget_usd=None, max_output_tokens=100)[0]


def test_a_call_is_held_at_its_worst_case_on_its_own_tenants_prices_only(db: Database) -> None:
    # Given the default tenant's calls of the model: 10 prompt and 5 completion tokens for $0.001, 10 and 50 for
    # $0.002, so that a prompt token costs at most $0.0001 and a completion token at most $0.00004
    _paid_page(db, "default", cost=0.001, prompt_tokens=10, completion_tokens=5)
    _paid_page(db, "default", cost=0.002, prompt_tokens=10, completion_tokens=50)
    # ... and another tenant's calls of the same model, a thousand times dearer
    db.ensure_tenant("other")
    for _ in range(5):
        _paid_page(db, "other", cost=2.0, prompt_tokens=10, completion_tokens=5)

    # When a page of a document capped at $0.01 meets the gate, with an output limit of 100 tokens
    verdict = _capped_call(db, max_cost_usd=0.01)

    # Then it is held at its worst case on the tenant's own prices: the largest prompt seen at the dearest a prompt
    # token can be, the output limit at the dearest a completion token can be; the other tenant's calls count for
    # nothing, neither there nor in the mean
    assert verdict.verdict == "GO"
    assert verdict.reserve == pytest.approx(10 * 0.0001 + 100 * 0.00004)
    assert verdict.price == pytest.approx(0.0015)
    # And a document's own prompt counts at a token per byte on top of the largest prompt seen
    prompted = _capped_call(db, max_cost_usd=0.01, prompt="x" * 20)
    assert prompted.reserve == pytest.approx((10 + 20) * 0.0001 + 100 * 0.00004)
    # And a cap that cannot hold the worst case skips the page before its call, though the mean would fit
    assert _capped_call(db, max_cost_usd=0.004).verdict == "CAP"


def test_a_recorded_call_carries_its_documents_tenant_and_the_migration_gives_the_earlier_calls_theirs() -> None:
    # Given a database at revision 0022 (calls recorded without their tenant) with a priced call of tenant "acme"
    with fresh_empty_database() as url:
        config = alembic_config(url)
        command.upgrade(config, "0022")
        engine = create_database_engine(url, pool_size=2)
        db = Database(engine)
        try:
            with engine.begin() as conn:
                conn.execute(text("INSERT INTO tenants (id) VALUES ('acme')"))
            new = NewDocument("bucket", "uploads/a.png", "etag", "", 10, "test/model", tenant_id="acme")
            [job_id] = db.create_document(new, kind="image", pages=[1]).job_ids
            with engine.begin() as conn:
                conn.execute(
                    text(
                        "INSERT INTO attempts (job_id, document_id, claim, outcome, model, cost, cost_estimated) "
                        "SELECT id, document_id, 1, 'KEPT', 'test/model', 0.003, false FROM jobs WHERE id = :j"
                    ),
                    {"j": job_id},
                )

            # When the database is brought to head
            command.upgrade(config, "head")

            # Then the earlier call has its document's tenant, and the tenant's price is read from it
            assert rows_of(engine, "SELECT tenant_id FROM attempts") == [("acme",)]
            price, calls = db.model_price("test/model", "acme")
            assert (price, calls) == (0.003, 1)
            assert db.model_price("test/model", "default") == (None, 0)
            # And a call recorded now carries its tenant too
            _paid_page(db, "acme", cost=0.001, prompt_tokens=10, completion_tokens=5)
            assert rows_of(engine, "SELECT tenant_id FROM attempts ORDER BY id") == [("acme",), ("acme",)]
        finally:
            engine.dispose()


def rows_of(engine: Any, sql: str) -> list[tuple[Any, ...]]:
    with engine.connect() as conn:
        return [tuple(row) for row in conn.execute(text(sql))]


DOCUMENTS = Path(__file__).resolve().parents[1] / "data" / "documents"


def test_twenty_pages_at_once_answered_at_fifty_times_the_mean_never_pass_the_tenants_budget(
    pipeline: Pipeline, db: Database, fake_provider: FakeChatServer, corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a tenant whose calls so far cost PRICE each (1,000 prompt tokens, 4 completion tokens), an output limit of
    # 300 tokens, and a daily budget of 500 x PRICE
    fake_provider.set_default(Ok(cost=PRICE))
    configure(monkeypatch, MAX_OUTPUT_TOKENS="300")
    seed_price(pipeline, db, corpus)
    budget = 500 * PRICE
    assert db.set_daily_budget("default", budget)
    # ... so that a call is held at PRICE / 1,000 per prompt token and PRICE / 4 per completion token at most
    reserve = 1000 * PRICE / 1000 + 300 * PRICE / 4
    # ... and a provider whose answers now cost 50 x that mean (200 completion tokens at the same prices), each
    # held until every page has met the cost gate
    fake_provider.set_default(Ok(text=" ".join(f"word{i}" for i in range(200)), cost=50 * PRICE))
    gate = Gate()
    fake_provider.route(gate)

    # When the tenant's 20 pages (two documents) are delivered at once, ten to each of two environments
    slides = create({"filename": "slides.pdf", "content_type": "application/pdf", "pages": "1-12"})
    upload_through_presigned_url(pipeline, slides, (DOCUMENTS / "sommerakademie-2016-slides.pdf").read_bytes())
    [paper] = pipeline.upload("uploads/paper.pdf", DOCUMENTS / "hasyv2-paper.pdf")["documents"]
    document_ids = [slides["document_id"], paper["document_id"]]
    messages = pipeline.receive_all()
    assert len(messages) == 20
    environments = [
        pipeline.start_in_new_environment("transcribe", sqs_event(messages[i : i + 10], pipeline.queue_arn))
        for i in (0, 10)
    ]

    # ... and every page is at the provider, held back or skipped before the gate opens
    def at_the_gate() -> bool:
        [row] = rows(
            db,
            "SELECT count(*) FILTER (WHERE status = 'QUEUED' AND error LIKE 'held back%') AS deferred,"
            " count(*) FILTER (WHERE status = 'SKIPPED') AS skipped FROM jobs WHERE document_id = ANY(:ids)",
            ids=document_ids,
        )
        return bool(gate.held + row["deferred"] + row["skipped"] == 20)

    wait_for(at_the_gate)
    in_flight_together = gate.held
    gate.open()
    outputs = [environment.communicate(timeout=pipeline.function_timeout)[0] for environment in environments]
    assert all(json.loads(out.strip().splitlines()[-1])["batchItemFailures"] == [] for out in outputs), outputs
    for message in messages:
        pipeline.sqs.delete_message(QueueUrl=pipeline.queue_url, ReceiptHandle=message["ReceiptHandle"])
    deliver(pipeline, until=lambda: all(finished(db, document_id)() for document_id in document_ids))

    # Then the day ends within the budget, no further from it than one call's worst case, every call counted
    [day] = rows(
        db, "SELECT sum(spent_usd) AS spent_usd, sum(calls) AS calls FROM tenant_days WHERE tenant_id = 'default'"
    )
    assert budget - reserve < float(day["spent_usd"]) <= budget
    assert day["calls"] == fake_provider.calls
    # And calls were in flight together, as many as the budget held at their worst case
    assert in_flight_together == int((budget - PRICE) // reserve) > 1
    # And the pages that did not fit were skipped, saying so
    jobs = rows(db, "SELECT status, error FROM jobs WHERE document_id = ANY(:ids)", ids=document_ids)
    skipped = [job for job in jobs if job["status"] == "SKIPPED"]
    assert skipped and all("daily budget" in job["error"] and "worst case" in job["error"] for job in skipped)
    assert len(jobs) - len(skipped) == fake_provider.calls - 1


def wait_for(condition: Callable[[], bool], *, seconds: float = 120.0) -> None:
    """Poll ``condition`` until it holds; fail after ``seconds`` (a bound on a hung test, not a timing)."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the condition did not come to hold"
        time.sleep(0.05)


def test_every_call_counts_in_the_totals_whatever_became_of_it(
    pipeline: Pipeline, db: Database, fake_provider: FakeChatServer, corpus: Path
) -> None:
    # Given a provider that refuses a request, fails one for a moment (retried within the call), answers one page,
    # apologises instead of reading another, then refuses every request
    fake_provider.script(
        Status(400, "bad image"),
        Status(503, "overloaded", retry_after="0"),
        Ok(cost=3 * PRICE),
        Ok(text="I'm sorry, I can't help with that.", cost=2 * PRICE),
    )
    fake_provider.set_default(Status(400, "bad image"))

    # When a 4-page document is transcribed
    [document] = pipeline.upload("uploads/report.pdf", corpus / "pdflatex-4-pages.pdf")["documents"]
    deliver(pipeline, until=finished(db, document["document_id"]))

    # Then every request is recorded as a call, the failed ones too (the one retried within its call as well), and
    # the document's and the tenant's totals are their sum
    outcomes = sorted((r["outcome"], r["status_code"]) for r in rows(db, "SELECT outcome, status_code FROM attempts"))
    assert outcomes == [("ERROR", 400), ("ERROR", 400), ("ERROR", 503), ("KEPT", None), ("REJECTED", None)]
    assert fake_provider.calls == 5
    described = db.spend(document["document_id"])
    assert described.calls == 5 and described.cost == pytest.approx(5 * PRICE)
    [day] = rows(db, "SELECT sum(spent_usd) AS spent_usd, sum(calls) AS calls FROM tenant_days")
    assert float(day["spent_usd"]) == pytest.approx(5 * PRICE) and day["calls"] == 5
    _, transcript = pipeline.transcript(document["document_id"])
    errors = [a for page in transcript["pages"] for a in page["attempts"] if a["outcome"] == "ERROR"]
    assert sorted(a["status_code"] for a in errors) == [400, 400, 503]
    assert all("bad image" in a["error"] or "overloaded" in a["error"] for a in errors)
    assert transcript["cost"] == pytest.approx(5 * PRICE)
