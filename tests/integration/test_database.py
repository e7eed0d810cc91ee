"""Claims, fencing and the statements behind them, against a real PostgreSQL."""

from __future__ import annotations

import tempfile
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import psycopg
import pytest
from pagescribe.domain import (
    ClaimedJob,
    DocumentProgress,
    DocumentStatus,
    JobStatus,
    NewDocument,
    PageEnd,
    PageOutcome,
)
from pagescribe.store.postgres import Database, create_database_engine
from psycopg import pq
from sqlalchemy import text

from tests.conftest import both_servers
from tests.support.database import claim_one

pytestmark = pytest.mark.integration


@pytest.fixture(params=["system", "embedded"])
def database_url(request: pytest.FixtureRequest) -> str:
    """Every test here runs on the system PostgreSQL and on the embedded server of the local commands."""
    return both_servers(request)


LEASE = 300.0


@pytest.fixture(params=["direct", "dataapi"])
def store(request: pytest.FixtureRequest, db: Database) -> Database:
    """The database the claims and fences are tested on: over psycopg, and over the RDS Data API (``db`` itself
    still inspects and arranges rows directly)."""
    if request.param == "direct":
        return db
    through_data_api: Database = request.getfixturevalue("data_api_db")
    return through_data_api


def _new(key: str) -> NewDocument:
    return NewDocument(bucket="bucket", object_key=key, etag="etag", version_id="", size_bytes=10, model="test/model")


def _outcome(text_: str) -> PageOutcome:
    return PageOutcome(text_, "stop", 10, 5, 0.001, "test/model", "fake", "gen-1")


def _status(db: Database, job_id: str) -> tuple[str, int]:
    with db.engine.connect() as conn:
        row = conn.execute(text("SELECT status, attempts FROM jobs WHERE id = :id"), {"id": job_id}).one()
    return row.status, row.attempts


def _expire_lease(db: Database, job_id: str) -> None:
    with db.engine.begin() as conn:
        conn.execute(
            text("UPDATE jobs SET lease_expires_at = now() - interval '1 second' WHERE id = :id"), {"id": job_id}
        )


@dataclass
class _Wire:
    """What a Database with a pool of one sent its server: per exchange (libpq protocol trace)."""

    queries: list[str] = field(default_factory=list)  # the text of each statement sent
    round_trips: int = 0  # exchanges completed (ReadyForQuery messages)


@contextmanager
def _on_the_wire(db: Database) -> Iterator[tuple[Database, _Wire]]:
    engine = create_database_engine(db.engine.url.render_as_string(hide_password=False))
    traced = Database(engine)
    traced.page_summary(str(uuid.uuid4()))  # connect before tracing
    pooled = engine.raw_connection()
    connection = pooled.driver_connection
    pooled.close()
    assert isinstance(connection, psycopg.Connection)
    wire = _Wire()
    with tempfile.TemporaryFile() as trace:
        connection.pgconn.trace(trace.fileno())
        connection.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
        try:
            yield traced, wire
        finally:
            connection.pgconn.untrace()  # flushes libpq's buffered trace
            trace.seek(0)
            messages: list[str] = []
            for line in trace.read().decode(errors="replace").splitlines():
                if line.startswith(("F\t", "B\t")) or not messages:
                    messages.append(line)
                else:  # a statement's text goes on over the lines it has
                    messages[-1] += "\n" + line
            engine.dispose()
    wire.queries = [m for m in messages if m.startswith(("F\t", "B\t")) and m.split("\t")[2] in {"Parse", "Query"}]
    wire.round_trips = sum(m.startswith("B\t") and m.split("\t")[2] == "ReadyForQuery" for m in messages)


def test_a_document_and_its_jobs_are_recorded_once(db: Database) -> None:
    # Given an object recorded as a three-page document
    first = db.create_document(_new("uploads/a.pdf"), kind="pdf", pages=[1, 2, 3])
    # When the same object (bucket, key, etag, version) is recorded again
    again = db.create_document(_new("uploads/a.pdf"), kind="pdf", pages=[1, 2, 3])
    # Then the second call finds the first document and adds no jobs
    assert not first.duplicate and len(first.job_ids) == 3
    assert again.duplicate and again.document_id == first.document_id and again.job_ids == ()
    with db.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM jobs")).scalar_one() == 3
        assert conn.execute(text("SELECT count(*) FROM documents")).scalar_one() == 1


def test_claim_by_id_hands_a_job_out_once(db: Database, store: Database) -> None:
    created = store.create_document(_new("uploads/x.pdf"), kind="pdf", pages=[1])
    [job_id] = created.job_ids
    # When the same job is claimed twice (a duplicate delivery)
    first = claim_one(store, job_id, lease_seconds=LEASE, max_attempts=3)
    second = claim_one(store, job_id, lease_seconds=LEASE, max_attempts=3)
    # Then only the first claim gets it
    assert first is not None and first.job_id == job_id
    assert second is None
    # And once completed, it is never handed out again
    assert store.complete_job(first, _outcome("done")) is not None
    assert claim_one(store, job_id, lease_seconds=LEASE, max_attempts=3) is None


def test_an_expired_lease_is_taken_over_and_the_zombie_write_is_refused(db: Database, store: Database) -> None:
    # Given a job claimed by a worker whose lease then expired (the worker died or stalled)
    [job_id] = store.create_document(_new("uploads/z.pdf"), kind="pdf", pages=[1]).job_ids
    zombie = claim_one(store, job_id, lease_seconds=LEASE, max_attempts=3)
    assert zombie is not None
    _expire_lease(db, job_id)
    # When a redelivery claims it again and completes it
    newer = claim_one(store, job_id, lease_seconds=LEASE, max_attempts=3)
    assert newer is not None and newer.attempts == 2 and newer.lease_token != zombie.lease_token
    assert store.complete_job(newer, _outcome("newer result")) is not None
    # Then the zombie's late result and late failure are both refused, and the newer result stands
    assert store.complete_job(zombie, _outcome("zombie result")) is None
    assert store.fail_job(zombie, "late failure") is None
    assert not store.requeue_job(zombie, "late retry", delay_seconds=0)
    [page] = store.load_pages(newer.document_id)
    assert (page.status, page.text, page.attempts) == (JobStatus.COMPLETED, "newer result", 2)


def test_claims_stop_at_max_attempts(db: Database, store: Database) -> None:
    [job_id] = store.create_document(_new("uploads/m.pdf"), kind="pdf", pages=[1]).job_ids
    job = claim_one(store, job_id, lease_seconds=LEASE, max_attempts=1)
    assert job is not None
    _expire_lease(db, job_id)
    assert claim_one(store, job_id, lease_seconds=LEASE, max_attempts=1) is None


def test_requeue_makes_the_job_claimable_again_with_backoff_for_the_sweeper(db: Database, store: Database) -> None:
    [job_id] = store.create_document(_new("uploads/r.pdf"), kind="pdf", pages=[1]).job_ids
    job = claim_one(store, job_id, lease_seconds=LEASE, max_attempts=3)
    assert job is not None
    assert store.requeue_job(job, "HTTP 503", delay_seconds=3600)
    # The sweeper does not send it again before its backoff; a message naming the job (sent with that delay) may
    # claim it
    assert store.take_unsent_jobs(resend_after_seconds=0, limit=10) == []
    again = claim_one(store, job_id, lease_seconds=LEASE, max_attempts=3)
    assert again is not None and again.attempts == 2


def test_the_last_page_is_seen_by_exactly_one_completion(db: Database, store: Database) -> None:
    created = store.create_document(_new("uploads/d.pdf"), kind="pdf", pages=[1, 2, 3])
    jobs = [claim_one(store, j, lease_seconds=LEASE, max_attempts=3) for j in created.job_ids]
    assert all(jobs)
    claimed = [j for j in jobs if j is not None]
    progress = [
        store.complete_job(claimed[0], _outcome("one")),
        store.fail_job(claimed[1], "broken page"),
        store.complete_job(claimed[2], _outcome("three")),
    ]
    assert [p.all_pages_done for p in progress if p] == [False, False, True]
    assert store.finish_document(
        created.document_id, status=DocumentStatus.PARTIAL, error="1 of 3 pages failed", transcript_key="t.md"
    )
    assert not store.finish_document(
        created.document_id, status=DocumentStatus.PARTIAL, error=None, transcript_key="t.md"
    )


def test_sixteen_threads_claiming_overlapping_batches_of_two_thousand_jobs_claim_each_once(db: Database) -> None:
    # Given 2,000 queued jobs, each delivered twice: in sixteen shares, each thread taking its own share and the next
    # thread's, ten ids to a batch as SQS hands them out
    job_ids = [
        job_id
        for i in range(20)
        for job_id in db.create_document(_new(f"uploads/race-{i}.pdf"), kind="pdf", pages=range(1, 101)).job_ids
    ]
    shares = [job_ids[i::16] for i in range(16)]
    claims: list[ClaimedJob] = []
    lock = threading.Lock()
    start = threading.Barrier(16)

    def worker(mine: list[str]) -> None:
        start.wait()
        for at in range(0, len(mine), 10):
            batch = db.claim_jobs(mine[at : at + 10], lease_seconds=LEASE, max_attempts=3).claimed.values()
            for job in batch:
                assert db.complete_job(job, _outcome(job.job_id)) is not None
            with lock:
                claims.extend(batch)

    # When 16 threads claim their batches and complete what they claimed, all at once
    threads = [threading.Thread(target=worker, args=(shares[i] + shares[(i + 1) % 16],)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Then every job was handed out exactly once and completed
    counts = Counter(j.job_id for j in claims)
    assert len(counts) == 2000 and max(counts.values()) == 1
    with db.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM jobs WHERE status = 'COMPLETED'")).scalar_one() == 2000
        assert conn.execute(text("SELECT max(attempts) FROM jobs")).scalar_one() == 1


def test_sixteen_threads_claiming_the_same_ids_hand_each_out_once(db: Database, store: Database) -> None:
    # Given 200 jobs, and three deliveries of each job's message racing across 16 threads
    job_ids = list(store.create_document(_new("uploads/dups.pdf"), kind="pdf", pages=range(1, 201)).job_ids)
    deliveries = job_ids * 3
    won: list[str] = []
    lock = threading.Lock()

    def worker(share: list[str]) -> None:
        for job_id in share:
            if claim_one(store, job_id, lease_seconds=LEASE, max_attempts=3) is not None:
                with lock:
                    won.append(job_id)

    threads = [threading.Thread(target=worker, args=(deliveries[i::16],)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Then each job was claimed by exactly one delivery
    assert sorted(won) == sorted(job_ids)


def test_a_batch_claim_is_one_limited_statement_that_locks_the_jobs_alone_and_reads_their_document(
    db: Database,
) -> None:
    # Given three queued jobs
    created = db.create_document(_new("uploads/s.pdf"), kind="pdf", pages=[1, 2, 3])
    job_ids = created.job_ids
    # When a batch's two jobs are claimed by id
    with _on_the_wire(db) as (traced, wire):
        claims = traced.claim_jobs(job_ids[:2], lease_seconds=LEASE, max_attempts=3)
    # Then both were claimed together, with their document's record, in one statement sent and answered in one round
    # trip (no ping, no BEGIN/COMMIT, no read of the documents after it)
    assert sorted(claims.claimed) == sorted(job_ids[:2])
    assert list(claims.documents) == [created.document_id]
    assert (len(wire.queries), wire.round_trips) == (1, 1), wire
    # And the rows it locks are the jobs' alone: the document is joined after the lock, not locked with them
    locking, _, after = wire.queries[0].upper().partition("FOR UPDATE SKIP LOCKED")
    assert "LIMIT" in locking and "JOIN" not in locking and "JOIN DOCUMENTS" in after and "FOR " not in after


def test_the_cost_gate_is_one_transaction_sent_in_one_round_trip(db: Database) -> None:
    # Given a claimed page of a tenant with a daily budget
    db.set_daily_budget("default", 5.0)
    [job_id] = db.create_document(_new("uploads/gate.pdf"), kind="pdf", pages=[1]).job_ids
    job = claim_one(db, job_id, lease_seconds=LEASE, max_attempts=3)
    assert job is not None
    # When its call passes the cost gate
    with _on_the_wire(db) as (traced, wire):
        verdict = traced.admit_spends([job], "test/model", daily_budget_usd=None, max_output_tokens=100)[0]
    # Then BEGIN, the lock, the verdict and COMMIT went as one query, answered in one round trip
    assert verdict.verdict == "GO" and verdict.daily_budget_usd == 5.0
    assert (len(wire.queries), wire.round_trips) == (1, 1), wire
    assert wire.queries[0].count("FOR NO KEY UPDATE OF d, t") == 1 and "COMMIT" in wire.queries[0]


def test_a_failed_statement_of_a_transaction_in_one_round_trip_rolls_it_back(db: Database) -> None:
    # Given a job, a Database of one connection, and a transaction that moves the job and then fails
    [job_id] = db.create_document(_new("uploads/failing.pdf"), kind="pdf", pages=[1]).job_ids
    engine = create_database_engine(db.engine.url.render_as_string(hide_password=False), pool_size=1)
    single = Database(engine)
    moved = "UPDATE jobs SET status = 'FAILED' WHERE id = %(job_id)s"
    with pytest.raises(psycopg.errors.DivisionByZero):
        single._in_one_transaction((moved, "SELECT 1 / 0"), {"job_id": job_id})
    # Then nothing it did stays, and its one connection, out of the failed transaction, serves the next statement
    assert _status(db, job_id) == ("QUEUED", 0)
    assert claim_one(single, job_id, lease_seconds=LEASE, max_attempts=3) is not None
    engine.dispose()


def test_completions_written_together_go_in_one_round_trip_and_one_that_fails_takes_the_others_back(
    store: Database, db: Database
) -> None:
    # Given four claimed pages of a document
    created = db.create_document(_new("uploads/together.pdf"), kind="pdf", pages=[1, 2, 3, 4])
    jobs = [claim_one(db, job_id, lease_seconds=LEASE, max_attempts=3) for job_id in created.job_ids]
    assert all(jobs)
    one, two, three, four = (job for job in jobs if job is not None)
    # When two are completed together
    written = store.complete_jobs([PageEnd(one, _outcome("one")), PageEnd(two, _outcome("two"))])
    # Then each has its progress, and both are written
    assert [p.pages_completed if p else None for p in written] == [1, 2]
    # When two more go together, and the database refuses the second (a latency beyond its column's range)
    refused = _outcome("four")._replace(latency_ms=2**40)
    with pytest.raises((psycopg.errors.NumericValueOutOfRange, RuntimeError), match="out of range"):
        store.complete_jobs([PageEnd(three, _outcome("three")), PageEnd(four, refused)])
    # Then the first of them is not written either: both pages are still their claims'
    assert [_status(db, job.job_id)[0] for job in (one, two, three, four)] == ["COMPLETED"] * 2 + ["PROCESSING"] * 2
    assert [p.pages_completed for p in store.complete_jobs([PageEnd(three, _outcome("three"))]) if p] == [3]


def test_completions_written_together_over_psycopg_are_one_query_and_one_round_trip(db: Database) -> None:
    created = db.create_document(_new("uploads/one-trip.pdf"), kind="pdf", pages=[1, 2, 3])
    jobs = [claim_one(db, job_id, lease_seconds=LEASE, max_attempts=3) for job_id in created.job_ids]
    ends = [PageEnd(job, _outcome(f"page {job.page_number}")) for job in jobs if job is not None]
    with _on_the_wire(db) as (traced, wire):
        written = traced.complete_jobs(ends)
    assert [p.pages_completed if p else None for p in written] == [1, 2, 3]
    assert (len(wire.queries), wire.round_trips) == (1, 1), wire
    assert wire.queries[0].count("BEGIN;") == 1 and wire.queries[0].count("INSERT INTO attempts") == 3


def test_a_connection_the_server_closed_is_replaced_and_the_statement_runs_once_more(db: Database) -> None:
    # Given a Database whose pooled connection has been used, and a queued job
    [job_id] = db.create_document(_new("uploads/killed.pdf"), kind="pdf", pages=[1]).job_ids
    engine = create_database_engine(db.engine.url.render_as_string(hide_password=False))
    survivor = Database(engine)
    survivor.page_summary(job_id)  # connects
    pooled = engine.raw_connection()
    connection = pooled.driver_connection
    pooled.close()
    assert isinstance(connection, psycopg.Connection)
    # When the server ends that connection's session while it sits in the pool (as a restart or RDS Proxy's
    # idle timeout would)
    with db.engine.connect() as admin:
        admin.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": connection.info.backend_pid})
    # Then the next call finds it dead, replaces it and succeeds, and the job is claimed exactly once
    claimed = claim_one(survivor, job_id, lease_seconds=LEASE, max_attempts=3)
    assert claimed is not None and connection.closed
    assert _status(db, job_id) == ("PROCESSING", 1)
    assert claim_one(survivor, job_id, lease_seconds=LEASE, max_attempts=3) is None
    engine.dispose()


def test_the_poll_is_served_by_the_partial_index(db: Database) -> None:
    for i in range(30):
        db.create_document(_new(f"uploads/ix-{i}.pdf"), kind="pdf", pages=range(1, 101))
    with db.engine.begin() as conn:
        conn.execute(text("UPDATE jobs SET status = 'COMPLETED' WHERE page_number > 2"))
        conn.execute(text("ANALYZE jobs"))
        plan = "\n".join(
            conn.execute(
                text(
                    "EXPLAIN SELECT id FROM jobs WHERE status = 'QUEUED' AND available_at <= now() "
                    "AND attempts < 3 ORDER BY created_at, page_number LIMIT 1 FOR UPDATE SKIP LOCKED"
                )
            ).scalars()
        )
    assert "ix_jobs_queued" in plan, plan


# --- checked pages: escalation and every paid call ------------------------------------------------------------------

REPETITION = {"flag": "repetition", "value": 40.0, "threshold": 8.0}


def _flagged(text_: str, *flags: dict[str, object], cost: float = 0.001) -> PageOutcome:
    return PageOutcome(text_, "stop", 10, 5, cost, "test/model", "fake", "gen-1", 100, flags=flags)


def test_the_zombies_paid_call_is_recorded_and_counted_although_its_write_is_refused(db: Database) -> None:
    # Given a page taken over from a worker whose lease expired, and completed by the newer claim
    [job_id] = db.create_document(_new("uploads/paid.pdf"), kind="pdf", pages=[1]).job_ids
    zombie = claim_one(db, job_id, lease_seconds=LEASE, max_attempts=3)
    assert zombie is not None
    _expire_lease(db, job_id)
    newer = claim_one(db, job_id, lease_seconds=LEASE, max_attempts=3)
    assert newer is not None and db.complete_job(newer, _flagged("newer", cost=0.002)) is not None
    # When the zombie's answer, paid for, arrives late
    assert db.complete_job(zombie, _flagged("zombie", cost=0.003)) is None
    # Then its write is refused but its call is recorded, and the document's spend is both calls
    attempts = db.load_attempts(newer.document_id)
    assert [(a.outcome, a.cost, a.claim) for a in attempts] == [("KEPT", 0.002, 2), ("LEASE_LOST", 0.003, 1)]
    spend = db.spend(newer.document_id)
    assert (spend.calls, spend.prompt_tokens) == (2, 20) and spend.cost == pytest.approx(0.005)
    [page] = db.load_pages(newer.document_id)
    assert page.text == "newer"


def test_a_page_escalates_once_and_its_failure_without_an_answer_keeps_the_answer_it_escalated_from(
    db: Database,
) -> None:
    # Given a claimed page whose answer is hard-flagged
    [job_id] = db.create_document(_new("uploads/esc.pdf"), kind="pdf", pages=[1]).job_ids
    job = claim_one(db, job_id, lease_seconds=LEASE, max_attempts=3)
    assert job is not None
    # When it escalates, and the same claim (or a stale one) tries to escalate it again
    assert db.escalate_job(job, _flagged("loop loop loop", REPETITION))
    assert not db.escalate_job(job, _flagged("loop again", REPETITION))
    # Then it escalated once: PENDING, the flagged answer kept as its text, both calls recorded
    [page] = db.load_pages(job.document_id)
    assert (page.status, page.escalation, page.text, page.flags) == (
        JobStatus.PROCESSING,
        "PENDING",
        "loop loop loop",
        [REPETITION],
    )
    assert [a.outcome for a in db.load_attempts(job.document_id)] == ["ESCALATED", "LEASE_LOST"]
    # And when the escalation call fails with no answer, the page fails keeping that text and those flags
    assert db.fail_job(job, "escalated to test/strong, which failed: HTTP 404") is not None
    [page] = db.load_pages(job.document_id)
    assert (page.status, page.escalation, page.text, page.flags) == (
        JobStatus.FAILED,
        "DONE",
        "loop loop loop",
        [REPETITION],
    )


def test_a_pending_escalation_survives_a_requeue_and_is_claimed_with_its_flags(db: Database) -> None:
    # Given a page that escalated but had no time left for the second call
    [job_id] = db.create_document(_new("uploads/later.pdf"), kind="pdf", pages=[1]).job_ids
    job = claim_one(db, job_id, lease_seconds=LEASE, max_attempts=3)
    assert job is not None and db.escalate_job(job, _flagged("loop", REPETITION))
    assert db.requeue_job(job, "escalated; only 1.0 s left for its call", delay_seconds=0)
    # When it is claimed again
    again = claim_one(db, job_id, lease_seconds=LEASE, max_attempts=3)
    # Then the claim says it waits for the escalation model, with the flags it escalated on
    assert again is not None and again.escalation_pending and again.flags == (REPETITION,)
    # And a user's retry of a failed page starts its answer afresh but never its escalation
    assert db.fail_job(again, "still looping", _flagged("loop", REPETITION)) is not None
    assert db.retry_failed_pages(job.document_id, max_retries=3) == [(job_id, 1)]
    [page] = db.load_pages(job.document_id)
    assert (page.status, page.escalation, page.text, page.flags) == (JobStatus.QUEUED, "DONE", None, [])


def test_concurrent_retries_of_a_document_requeue_its_pages_once_and_count_once(db: Database) -> None:
    # Given a document with three failed pages
    created = db.create_document(_new("uploads/retry.pdf"), kind="pdf", pages=[1, 2, 3])
    for job_id in created.job_ids:
        job = claim_one(db, job_id, lease_seconds=LEASE, max_attempts=3)
        assert job is not None and db.fail_job(job, "refused") is not None

    # When eight callers retry it at once
    start = threading.Barrier(8)
    results: list[list[tuple[str, int]]] = []

    def retry() -> None:
        start.wait()
        results.append(db.retry_failed_pages(created.document_id, max_retries=5))

    threads = [threading.Thread(target=retry) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    # Then exactly one requeued the three pages, the count of retries went up once, and the page counts add up
    assert sorted(len(result) for result in results) == [0] * 7 + [3]
    document = db.get_document(created.document_id)
    assert document is not None and (document.retries, document.pages_failed) == (1, 0)


def test_a_document_that_used_its_retries_is_not_requeued(db: Database) -> None:
    # Given a document with a failed page, retried once already under a limit of one
    created = db.create_document(_new("uploads/limit.pdf"), kind="pdf", pages=[1])
    [job_id] = created.job_ids
    for _ in range(2):
        job = claim_one(db, job_id, lease_seconds=LEASE, max_attempts=9)
        assert job is not None and db.fail_job(job, "refused") is not None
        retried = db.retry_failed_pages(created.document_id, max_retries=1)

    # Then the second retry requeued nothing, and the page stays FAILED
    assert retried == []
    [page] = db.load_pages(created.document_id)
    assert page.status is JobStatus.FAILED


def test_a_stale_write_is_refused_by_its_lease_token_while_the_newer_claim_is_still_in_flight(
    db: Database,
) -> None:
    # Given a job whose first claim's lease expired, and a newer claim of it still in flight (PROCESSING): the row's
    # status is what the stale worker last saw, so only the lease token tells the two claims apart
    [job_id] = db.create_document(_new("uploads/fence.pdf"), kind="pdf", pages=[1]).job_ids
    stale = claim_one(db, job_id, lease_seconds=LEASE, max_attempts=3)
    assert stale is not None
    _expire_lease(db, job_id)
    newer = claim_one(db, job_id, lease_seconds=LEASE, max_attempts=3)
    assert newer is not None and newer.lease_token != stale.lease_token

    # When the stale worker writes before the newer one has answered
    completed = db.complete_job(stale, _outcome("stale result"))
    failed = db.fail_job(stale, "stale failure")
    requeued = db.requeue_job(stale, "stale retry", delay_seconds=0)
    escalated = db.escalate_job(stale, _flagged("stale loop", REPETITION))

    # Then every write is refused, and the page is still the newer claim's, untouched
    assert (completed, failed, requeued, escalated) == (None, None, False, False)
    with db.engine.connect() as conn:
        row = conn.execute(
            text("SELECT status, lease_token, result_text, error, attempts FROM jobs WHERE id = :id"), {"id": job_id}
        ).one()
    assert (row.status, str(row.lease_token), row.result_text, row.error, row.attempts) == (
        "PROCESSING",
        newer.lease_token,
        None,
        None,
        2,
    )
    # And the newer claim completes the page; the stale worker's two answered calls are recorded as LEASE_LOST
    assert db.complete_job(newer, _outcome("newer result")) is not None
    [page] = db.load_pages(newer.document_id)
    assert (page.status, page.text) == (JobStatus.COMPLETED, "newer result")
    assert [a.outcome for a in db.load_attempts(newer.document_id)] == ["LEASE_LOST", "LEASE_LOST", "KEPT"]


def _held_on_a_lock(db: Database) -> bool:
    """Whether a statement of another connection waits for a row lock."""
    with db.engine.connect() as conn:
        waiting = conn.execute(
            text(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
            )
        )
        return bool(waiting.scalar_one())


def test_the_last_two_pages_of_a_sharded_document_ending_together_finish_it_once(db: Database, store: Database) -> None:
    # Given a document large enough to be counted in shards, every page ended but pages 1 and 2 (two shards)
    created = store.create_document(_new("uploads/large.pdf"), kind="pdf", pages=list(range(1, 257)))
    jobs = [claim_one(store, j, lease_seconds=LEASE, max_attempts=3) for j in created.job_ids]
    claimed = [j for j in jobs if j is not None]
    for job in claimed[2:]:
        store.complete_job(job, _outcome("page"))
    ended: dict[int, DocumentProgress | None] = {}
    pooled = db.engine.raw_connection()
    try:
        holder = pooled.driver_connection
        assert isinstance(holder, psycopg.Connection)
        # When page 2's end waits for its shard's row (held by another transaction) after its statement began, and
        # page 1 ends meanwhile: neither statement sees the other's count
        with holder.transaction():
            holder.execute(
                "SELECT 1 FROM document_counts WHERE document_id = %s AND shard = 2 FOR UPDATE", (created.document_id,)
            )
            second = threading.Thread(target=lambda: ended.update({2: store.complete_job(claimed[1], _outcome("2"))}))
            second.start()
            while not _held_on_a_lock(db):
                second.join(0.01)
            ended[1] = store.complete_job(claimed[0], _outcome("1"))
        second.join()
    finally:
        pooled.close()
    # Then page 1's end, committed first, sees one page left, and page 2's end, committed last, reads the count
    # again and sees the document done
    first_end, second_end = ended[1], ended[2]
    assert first_end is not None and second_end is not None
    assert (first_end.pages_completed, second_end.pages_completed) == (255, 256)
    # And it is finished once
    finish = {"status": DocumentStatus.COMPLETED, "error": None, "transcript_key": "t.md"}
    assert store.finish_document(created.document_id, **finish)  # type: ignore[arg-type]
    assert not store.finish_document(created.document_id, **finish)  # type: ignore[arg-type]
