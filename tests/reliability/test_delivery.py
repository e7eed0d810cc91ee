"""At-least-once delivery end to end: duplicates, dead workers, zombie workers, lost messages, a database restart.

Every test drives the real handlers with real event shapes against PostgreSQL, moto and the fake
chat-completions server; concurrent and dying invocations are separate processes (execution environments).
What "once" means is checked on real evidence: the provider's request log (model calls), the jobs' ``attempts``
and ``completed_at``, the documents' ``pages_completed`` count (its shards' moved only by a fenced completion) and
``finished_at``, and the number of versions of each transcript object in a versioned bucket (PUTs).
"""

from __future__ import annotations

import json
import os
import signal
import threading
from collections import Counter
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from pagescribe.handlers import upload as upload_app
from pagescribe.runtime import shutdown_runtime
from pagescribe.settings import get_settings
from pagescribe.store.postgres import Database
from psycopg import OperationalError
from sqlalchemy import make_url, text

from tests.fakes.chat_server import Behaviour, FakeChatServer, Hang, Ok
from tests.reliability.support import (
    EmbeddedServer,
    SqsFaultFront,
    SqsFaults,
    TcpRelay,
    WarmEnvironment,
    documents,
    job_id_of,
    jobs,
    settle,
    start_environment,
    transcript_versions,
    wait_for_leases_to_expire,
    wait_until,
)
from tests.support.aws_events import LambdaContext, sqs_event
from tests.support.pipeline import Pipeline

pytestmark = pytest.mark.integration

SOURCE = "pdflatex-4-pages.pdf"
PAGES = 4  # per document
ONE_TRANSCRIPT = {"md": 1, "json": 1}


@pytest.fixture
def database_url(request: pytest.FixtureRequest, database_url: str) -> str:
    """The machine's PostgreSQL; the embedded server (which a test may stop and start) for a test
    parametrized indirectly with "embedded"."""
    if getattr(request, "param", "system") == "embedded":
        return str(request.getfixturevalue("embedded_database_url"))
    return database_url


@pytest.fixture
def deployed(pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch) -> Pipeline:
    """The pipeline with the stack's queue visibility timeout (6 x the 60 s function timeout: a message an
    invocation received stays invisible for the rest of the test unless a test redelivers it) and a versioned
    bucket, so that every PUT of a transcript object leaves a version to count.

    Page images are not kept here (test_page_images.py covers them): with a few hundred of them in a versioned
    bucket, the in-process moto server grew this test process by gigabytes over these tests (seen with a /proc
    watcher: 9 GB), and every child started afterwards inherited that size in its peak RSS."""
    monkeypatch.setenv("KEEP_PAGE_IMAGES", "false")  # read by the environments this test starts, too
    _reconfigure(monkeypatch)
    pipeline.sqs.set_queue_attributes(QueueUrl=pipeline.queue_url, Attributes={"VisibilityTimeout": "360"})
    pipeline.s3.put_bucket_versioning(Bucket=pipeline.bucket, VersioningConfiguration={"Status": "Enabled"})
    return pipeline


def _reconfigure(monkeypatch: pytest.MonkeyPatch, **env: str) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    shutdown_runtime()
    get_settings.cache_clear()


def _upload(pipeline: Pipeline, corpus: Path, count: int, name: str) -> list[dict[str, Any]]:
    results = []
    for i in range(count):
        [result] = pipeline.upload(f"uploads/{name}-{i:03d}.pdf", corpus / SOURCE)["documents"]
        results.append(result)
    return results


def _batches(messages: list[dict[str, Any]], size: int = 10) -> list[list[dict[str, Any]]]:
    return [messages[i : i + size] for i in range(0, len(messages), size)]


def _statuses(db: Database, job_ids: list[str]) -> Counter[str]:
    return Counter(str(r["status"]) for r in jobs(db, job_ids))


def _versions(pipeline: Pipeline, document_id: str) -> dict[str, int]:
    return {key.rsplit(".", 1)[1]: n for key, n in transcript_versions(pipeline, document_id).items()}


def _assert_every_page_completed_once(pipeline: Pipeline, db: Database, *, retried: Collection[str] = ()) -> None:
    """Every job COMPLETED with one attempt (two for ``retried``); every document COMPLETED, its counter equal
    to its page count (a page completed twice would push it past), finished, its transcript written once."""
    rows = jobs(db)
    assert rows and Counter(r["status"] for r in rows) == {"COMPLETED": len(rows)}
    attempts = {str(r["id"]): r["attempts"] for r in rows}
    assert attempts == {job_id: 2 if job_id in retried else 1 for job_id in attempts}
    assert all(r["result_text"] and r["lease_expires_at"] is None for r in rows)
    for doc in documents(db):
        assert (doc["status"], doc["pages_completed"], doc["pages_failed"]) == ("COMPLETED", doc["page_count"], 0)
        assert doc["finished_at"] is not None and doc["transcript_key"] == f"transcripts/{doc['id']}.md"
        _, js = pipeline.transcript(str(doc["id"]))
        assert js["status"] == "COMPLETED" and [p["status"] for p in js["pages"]] == ["COMPLETED"] * doc["page_count"]
        assert _versions(pipeline, str(doc["id"])) == ONE_TRANSCRIPT


def _assert_nothing_left_to_sweep(pipeline: Pipeline) -> None:
    report = pipeline.sweep()
    assert report and set(report.values()) == {0}, report


# --- 1. duplicates -------------------------------------------------------------------------------------------


def test_every_message_delivered_three_times_at_once_and_again_late_is_transcribed_once(
    deployed: Pipeline, db: Database, fake_provider: FakeChatServer, corpus: Path
) -> None:
    pipeline = deployed
    # Given 50 four-page documents: 200 page jobs, one message each on the queue
    uploaded = _upload(pipeline, corpus, 50, "dup")
    messages = pipeline.receive_all()
    assert len(messages) == 200 and len({job_id_of(m) for m in messages}) == 200
    fake_provider.default_delay = 0.3  # the three environments' invocations overlap while pages are in flight
    # When every batch of ten is delivered three times at once, to three warm execution environments (processes)
    environments = [WarmEnvironment("transcribe", timeout=pipeline.function_timeout) for _ in range(3)]
    try:
        for n, batch in enumerate(_batches(messages)):
            event = sqs_event(batch, pipeline.queue_arn)
            # a batch is claimed in one statement, so the environment handed it last nearly always finds it
            # taken: each batch is handed to them in a rotated order, so that each is first for some batches
            for environment in environments[n % 3 :] + environments[: n % 3]:
                environment.deliver(event)
            # Then each environment acknowledges every message (a duplicate is a success, not a retry)
            assert [e.response()["batchItemFailures"] for e in environments] == [[], [], []]
    finally:
        for environment in environments:
            environment.close()
    # And the environments really raced: more than one won batches, and each page any of them lost was a duplicate.
    # (Which one wins is up to the scheduler: on a loaded machine one process may lag behind for the whole run.)
    completed = [e.metrics["PagesCompleted"] for e in environments]
    duplicates = [e.metrics["DuplicateDeliveries"] for e in environments]
    assert sum(completed) == 200 and sum(map(bool, completed)) >= 2 and sum(duplicates) == 400
    assert [c + d for c, d in zip(completed, duplicates, strict=True)] == [200, 200, 200]
    # And each page cost exactly one model call and completed once, in its first attempt
    assert fake_provider.calls == 200
    _assert_every_page_completed_once(pipeline, db)
    assert {str(d["id"]) for d in documents(db)} == {u["document_id"] for u in uploaded}
    before = {r["id"]: (r["completed_at"], r["updated_at"], r["result_text"]) for r in jobs(db)}
    finished = {d["id"]: d["finished_at"] for d in documents(db)}

    # When every message is delivered once more, late, after its page completed
    fake_provider.default_delay = 0
    for batch in _batches(messages):
        response = pipeline.invoke_transcribe(sqs_event(batch, pipeline.queue_arn))
        assert response["batchItemFailures"] == []
    # Then nothing happened: no model call, no row touched, no document finished again, no transcript rewritten
    assert fake_provider.calls == 200
    assert {r["id"]: (r["completed_at"], r["updated_at"], r["result_text"]) for r in jobs(db)} == before
    assert {d["id"]: d["finished_at"] for d in documents(db)} == finished
    assert all(_versions(pipeline, str(doc_id)) == ONE_TRANSCRIPT for doc_id in finished)
    _assert_nothing_left_to_sweep(pipeline)


@contextmanager
def _row_held(db: Database, job_id: str) -> Iterator[int]:
    """The job's row locked by another transaction, as the upload holds it while it stamps the job as sent just
    after sending its message (MARK_ENQUEUED), until the block ends and that transaction commits; its backend pid."""
    with db.engine.connect().execution_options(isolation_level="READ COMMITTED") as conn, conn.begin():
        pid = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
        conn.execute(text("UPDATE jobs SET enqueued_at = now(), updated_at = now() WHERE id = :id"), {"id": job_id})
        yield int(pid)


def _waiting_on(db: Database, pid: int) -> bool:
    """Is any session waiting for a lock the backend ``pid`` holds?"""
    with db.engine.connect() as conn:
        query = "SELECT count(*) FROM pg_stat_activity WHERE :pid = ANY(pg_blocking_pids(pid))"
        return bool(conn.execute(text(query), {"pid": pid}).scalar_one())


def test_a_message_delivered_while_its_job_is_being_stamped_as_sent_is_transcribed_not_dropped(
    pipeline: Pipeline, db: Database, fake_provider: FakeChatServer, corpus: Path
) -> None:
    # Given a page's message, delivered while the transaction that stamps its job as sent still holds the job's row
    # (a worker can receive a message within milliseconds of its send, before the sender's stamp has committed)
    [doc] = pipeline.upload("uploads/stamped.png", corpus / "smile.png")["documents"]
    [message] = pipeline.receive_all()
    answered: list[dict[str, Any]] = []
    with _row_held(db, job_id_of(message)) as holder:
        invocation = threading.Thread(
            target=lambda: answered.append(pipeline.invoke_transcribe(sqs_event([message], pipeline.queue_arn)))
        )
        invocation.start()
        # When the invocation meets the held row
        wait_until(
            lambda: _waiting_on(db, holder) or not invocation.is_alive(), timeout=60, what="the claim to meet the row"
        )
        # Then it waits for the row instead of taking the message for a duplicate
        assert invocation.is_alive() and _waiting_on(db, holder), answered
    # And once the stamp commits, it claims the job and transcribes the page, and the message is acknowledged
    invocation.join(timeout=60)
    assert [response["batchItemFailures"] for response in answered] == [[]]
    [page] = jobs(db)
    assert (page["status"], page["attempts"], str(page["document_id"])) == ("COMPLETED", 1, doc["document_id"])
    assert fake_provider.calls == 1


def test_a_message_whose_job_stays_held_past_the_claims_wait_comes_back_and_then_completes(
    pipeline: Pipeline, db: Database, fake_provider: FakeChatServer, corpus: Path
) -> None:
    # Given a page's message, delivered while another transaction holds the job's row and keeps holding it
    pipeline.upload("uploads/held.png", corpus / "smile.png")
    [message] = pipeline.receive_all()
    with _row_held(db, job_id_of(message)):
        # When it is delivered
        response = pipeline.invoke_transcribe(sqs_event([message], pipeline.queue_arn))
        # Then, once the claim's wait is over, the message is reported failed, to come back, and the page is untouched
        assert response["batchItemFailures"] == [{"itemIdentifier": message["MessageId"]}]
        [page] = jobs(db)
        assert (page["status"], page["attempts"], page["lease_token"]) == ("QUEUED", 0, None)
        assert fake_provider.calls == 0
    # When it comes back after the row is free
    response = pipeline.invoke_transcribe(sqs_event([message], pipeline.queue_arn))
    # Then the page is transcribed once
    assert response["batchItemFailures"] == []
    [page] = jobs(db)
    assert (page["status"], page["attempts"]) == ("COMPLETED", 1)
    assert fake_provider.calls == 1


# --- 2. worker death -----------------------------------------------------------------------------------------


def test_workers_killed_between_claim_and_result_lose_no_page(
    deployed: Pipeline,
    db: Database,
    fake_provider: FakeChatServer,
    corpus: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pipeline = deployed
    # Given 200 page jobs, leases that end with the invocation (no margin), and 40 s invocations (long enough for
    # four processes to claim and call on a loaded machine: the hanging calls end with the invocation)
    _reconfigure(monkeypatch, LEASE_MARGIN_SECONDS="0")
    _upload(pipeline, corpus, 50, "death")
    messages = pipeline.receive_all()
    assert len(messages) == 200
    doomed, healthy = messages[:40], messages[40:]
    doomed_jobs = [job_id_of(m) for m in doomed]
    # And a provider that answers half of the first 40 calls and never answers the other half (which pages
    # hang depends on the order the calls arrive in)
    answer_or_hang: list[Behaviour] = [Ok(), Hang(120)]
    fake_provider.script(*answer_or_hang * 20)
    # When four workers, each in its own process, take a batch of ten each
    workers = [
        start_environment("transcribe", sqs_event(batch, pipeline.queue_arn), timeout=40) for batch in _batches(doomed)
    ]
    # And once every claim is committed and every call reached the provider (20 answered and written, 20
    # hanging), and no finished document is half-written, the workers are SIGKILLed
    try:
        wait_until(
            lambda: (
                fake_provider.calls == 40
                and _statuses(db, doomed_jobs) == {"COMPLETED": 20, "PROCESSING": 20}
                and all(d["finished_at"] for d in documents(db) if d["pages_completed"] == d["page_count"])
            ),
            timeout=120,
            what="the workers to claim 40 pages, write 20 and hang on 20",
        )
    finally:
        for worker in workers:
            worker.kill()
    victims = [str(r["id"]) for r in jobs(db, doomed_jobs) if r["status"] == "PROCESSING"]
    assert len(victims) == 20 == len(messages) // 10
    assert all(r["attempts"] == 1 and r["result_text"] is None for r in jobs(db, victims))
    # And the other 160 messages are delivered normally meanwhile
    for batch in _batches(healthy):
        response = pipeline.invoke_transcribe(sqs_event(batch, pipeline.queue_arn))
        assert response["batchItemFailures"] == []
        settle(pipeline, batch, response)
    # And the dead workers' leases run out, and the sweeper runs
    wait_for_leases_to_expire(db, victims)
    report = pipeline.sweep()
    # Then exactly the victims go back to the queue and are sent again
    assert (report["leases_requeued"], report["leases_failed"], report["jobs_sent"]) == (20, 0, 20)
    pipeline.run_until_idle()
    # And when the dead invocations' own messages come back (their visibility timeout ran out), they are
    # acknowledged as duplicates without a call
    for m in doomed:
        pipeline.sqs.change_message_visibility(
            QueueUrl=pipeline.queue_url, ReceiptHandle=m["ReceiptHandle"], VisibilityTimeout=0
        )
    pipeline.run_until_idle()
    # Then every page is COMPLETED; the victims in their second attempt, every other page in its first
    assert fake_provider.calls == 40 + 160 + 20
    _assert_every_page_completed_once(pipeline, db, retried=set(victims))
    _assert_nothing_left_to_sweep(pipeline)


def test_a_redelivered_batch_spanning_many_documents_completes_every_page(
    deployed: Pipeline, db: Database, fake_provider: FakeChatServer, corpus: Path
) -> None:
    """What the sweeper's re-sends look like: one batch of ten pages from ten different documents (the first
    deliveries of a document's pages usually share a batch). Found by the test above: pages failed as
    unreadable PDFs because the environment's source cache deleted a file another page was rendering from."""
    pipeline = deployed
    # Given ten four-page documents, and one batch holding a page of each
    _upload(pipeline, corpus, 10, "spread")
    messages = pipeline.receive_all()
    by_document: dict[str, dict[str, Any]] = {}
    for m in messages:
        by_document.setdefault(json.loads(m["Body"])["document_id"], m)
    spread = list(by_document.values())
    assert len(spread) == 10
    # When that batch is delivered, then the rest of the queue
    response = pipeline.invoke_transcribe(sqs_event(spread, pipeline.queue_arn))
    assert response["batchItemFailures"] == []
    for m in messages:
        if m not in spread:
            pipeline.sqs.change_message_visibility(
                QueueUrl=pipeline.queue_url, ReceiptHandle=m["ReceiptHandle"], VisibilityTimeout=0
            )
    pipeline.run_until_idle()
    # Then every page of the batch was rendered from its document and completed
    assert [r["error"] for r in jobs(db, [job_id_of(m) for m in spread])] == [None] * 10
    assert fake_provider.calls == 40
    _assert_every_page_completed_once(pipeline, db)


# --- 3. zombie workers ---------------------------------------------------------------------------------------


def test_a_worker_paused_past_its_lease_cannot_overwrite_the_page_that_was_taken_over(
    deployed: Pipeline,
    db: Database,
    fake_provider: FakeChatServer,
    corpus: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pipeline = deployed
    # Given a one-page document, leases that end with the invocation, and two distinguishable answers
    _reconfigure(monkeypatch, LEASE_MARGIN_SECONDS="0")
    [doc] = pipeline.upload("uploads/paused.png", corpus / "smile.png")["documents"]
    [message] = pipeline.receive_all()
    fake_provider.script(Ok(text="the paused worker's answer", delay=1), Ok(text="the newer worker's answer"))
    # When a worker (its own process, a 20 s invocation) claims the page and calls the model. The invocation is long
    # enough that, after the result reserve (5 s) and a process start that takes seconds on a loaded 2-core machine,
    # the call still gets its minimum budget: with 8 s it often got none and put the page back before calling.
    zombie = start_environment("transcribe", sqs_event([message], pipeline.queue_arn), timeout=20)
    job_id = job_id_of(message)
    wait_until(
        lambda: fake_provider.calls == 1 and _statuses(db, [job_id]) == {"PROCESSING": 1},
        timeout=20,
        what="the worker to claim the page and call the model",
    )
    # And the worker is frozen (SIGSTOP: a paused VM, a stalled host) while its answer arrives
    os.kill(zombie.pid, signal.SIGSTOP)
    try:
        # And its lease runs out, the sweeper sends the page again and another invocation completes it
        wait_for_leases_to_expire(db, [job_id])
        report = pipeline.sweep()
        assert (report["leases_requeued"], report["jobs_sent"]) == (1, 1)
        pipeline.run_until_idle()
        [row] = jobs(db, [job_id])
        assert (row["status"], row["attempts"], row["result_text"]) == ("COMPLETED", 2, "the newer worker's answer")
    finally:
        # And then the frozen worker wakes up and goes on with its late answer
        os.kill(zombie.pid, signal.SIGCONT)
    response, logs = zombie.finish()
    # Then its write is refused (its lease token no longer matches: whether it goes on to complete the page with
    # its answer or to put it back because its call deadline passed) and it says so; its message is done
    assert response["batchItemFailures"] == []
    assert "lease lost" in logs and '"LeaseLost":[1.0]' in logs
    # And the newer result stands, counted once, in the one transcript written
    [row] = jobs(db, [job_id])
    assert (row["status"], row["attempts"], row["result_text"]) == ("COMPLETED", 2, "the newer worker's answer")
    markdown, js = pipeline.transcript(doc["document_id"])
    assert "the newer worker's answer" in markdown and "paused" not in js["pages"][0]["text"]
    # And the zombie sent nothing: no message on the queue, nothing for the sweeper to do
    assert pipeline.receive_all() == []
    assert fake_provider.calls == 2
    _assert_every_page_completed_once(pipeline, db, retried={job_id})
    _assert_nothing_left_to_sweep(pipeline)


def test_a_result_write_delayed_past_the_lease_matches_no_row_and_the_newer_result_stands(
    deployed: Pipeline,
    db: Database,
    fake_provider: FakeChatServer,
    corpus: Path,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pipeline = deployed
    # Given a one-page document, leases that end with the invocation, and two distinguishable answers
    _reconfigure(monkeypatch, LEASE_MARGIN_SECONDS="0")
    [doc] = pipeline.upload("uploads/late-write.png", corpus / "smile.png")["documents"]
    [message] = pipeline.receive_all()
    job_id = job_id_of(message)
    fake_provider.script(Ok(text="the late answer", delay=2), Ok(text="the newer answer"))
    url = make_url(database_url)
    with TcpRelay((url.host or "127.0.0.1", url.port or 5432)) as relay:
        # When a worker (its own process, a 12 s invocation: its call gets about 5 s) whose database traffic
        # crosses a network that will stall claims the page
        relayed = url.set(host="127.0.0.1", port=relay.port).render_as_string(hide_password=False)
        zombie = start_environment(
            "transcribe", sqs_event([message], pipeline.queue_arn), timeout=12, env={"DATABASE_URL": relayed}
        )
        wait_until(
            lambda: fake_provider.calls == 1 and _statuses(db, [job_id]) == {"PROCESSING": 1},
            timeout=20,
            what="the worker to claim the page and call the model",
        )
        # And the network holds everything the worker sends from now on; the answer comes 2 s after the call,
        # well within the call's time, and the worker's next database traffic is its result write
        relay.hold()
        wait_until(lambda: relay.held_bytes > 0, timeout=10, what="the worker's result write to be sent")
        # And meanwhile its lease runs out, the sweeper sends the page again and another invocation completes it
        wait_for_leases_to_expire(db, [job_id])
        report = pipeline.sweep()
        assert (report["leases_requeued"], report["jobs_sent"]) == (1, 1)
        pipeline.run_until_idle()
        # And then the network delivers the late write
        relay.release()
        response, logs = zombie.finish()
    # Then the late COMPLETE matched no row (fenced by the lease token): the worker logged the lost lease
    assert response["batchItemFailures"] == []
    assert "lease lost" in logs and '"LeaseLost":[1.0]' in logs
    # And the newer result stands, counted once, in the one transcript written
    [row] = jobs(db, [job_id])
    assert (row["status"], row["attempts"], row["result_text"]) == ("COMPLETED", 2, "the newer answer")
    markdown, _ = pipeline.transcript(doc["document_id"])
    assert "the newer answer" in markdown and "the late answer" not in markdown
    assert fake_provider.calls == 2
    _assert_every_page_completed_once(pipeline, db, retried={job_id})
    _assert_nothing_left_to_sweep(pipeline)


# --- 4. lost messages ----------------------------------------------------------------------------------------


def test_jobs_whose_whole_send_failed_after_commit_are_sent_by_the_sweeper(
    deployed: Pipeline, db: Database, fake_provider: FakeChatServer, corpus: Path
) -> None:
    pipeline = deployed
    # Given ten four-page documents recorded while SQS refused every send (the queue was gone)
    name = pipeline.queue_url.rsplit("/", 1)[1]
    pipeline.sqs.delete_queue(QueueUrl=pipeline.queue_url)
    uploaded = _upload(pipeline, corpus, 10, "unsent")
    pipeline.sqs.create_queue(QueueName=name, Attributes={"VisibilityTimeout": "360"})
    # Then the jobs are committed, QUEUED and unstamped, with no message anywhere
    assert [u["messages_sent"] for u in uploaded] == [0] * 10
    rows = jobs(db)
    assert len(rows) == 40 and all(r["status"] == "QUEUED" and r["enqueued_at"] is None for r in rows)
    assert pipeline.receive_all() == []
    # When the sweeper runs
    report = pipeline.sweep()
    # Then it sends every job once and stamps it
    assert (report["jobs_sent"], report["jobs_unsent"]) == (40, 0)
    assert all(r["enqueued_at"] is not None for r in jobs(db))
    # And draining the queue completes every page exactly once
    pipeline.run_until_idle()
    assert fake_provider.calls == 40
    _assert_every_page_completed_once(pipeline, db)
    _assert_nothing_left_to_sweep(pipeline)


def test_entries_sqs_refuses_in_a_batch_are_sent_by_the_sweeper_and_no_page_is_done_twice(
    deployed: Pipeline,
    db: Database,
    fake_provider: FakeChatServer,
    corpus: Path,
    aws_env: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pipeline = deployed
    with SqsFaultFront(aws_env) as sqs:
        # Given an SQS endpoint that, in every SendMessageBatch, refuses the second entry and accepts the fourth
        # but reports it failed (its answer was lost), and the functions configured to use it
        sqs.faults = SqsFaults(refused={"1"}, unacknowledged={"3"})
        _reconfigure(monkeypatch, AWS_ENDPOINT_URL_SQS=sqs.url)
        # When ten four-page documents are uploaded
        uploaded = _upload(pipeline, corpus, 10, "partial")
        # Then each upload committed four jobs and reports the two entries SQS accepted
        assert [u["messages_sent"] for u in uploaded] == [2] * 10
        assert len(sqs.faults.bodies_refused) == len(sqs.faults.bodies_unacknowledged) == 10
        # And only the accepted jobs are stamped as sent (pages 1 and 3); pages 2 and 4 wait for the sweeper
        rows = jobs(db)
        stamped = Counter((r["page_number"], r["enqueued_at"] is not None) for r in rows)
        assert stamped == {(1, True): 10, (2, False): 10, (3, True): 10, (4, False): 10}
        assert all(r["status"] == "QUEUED" for r in rows)

        # When the sweeper runs while SQS still fails entries: 20 due jobs, two batches of ten
        report = pipeline.sweep()
        # Then it counts what SQS reported, and unstamps the jobs it could not send, for the next sweep
        assert (report["jobs_sent"], report["jobs_unsent"]) == (16, 4)
        assert sum(r["enqueued_at"] is None for r in jobs(db)) == 4
        # When SQS is healthy again and the sweeper runs again
        sqs.faults = SqsFaults()
        report = pipeline.sweep()
        assert (report["jobs_sent"], report["jobs_unsent"]) == (4, 0)
        assert all(r["enqueued_at"] is not None for r in jobs(db))
        # Then the queue holds a message for every job, and more for the entries whose answer was lost (a job whose
        # answer was lost twice has three)
        queued = pipeline.receive_all()
        per_job = Counter(job_id_of(m) for m in queued)
        assert set(per_job) == {str(r["id"]) for r in rows}
        assert len(queued) == 30 + 18 + 4  # upload: 3 of 4 per batch; sweep 1: 18 of 20 enqueued; sweep 2: 4
        for m in queued:
            pipeline.sqs.change_message_visibility(
                QueueUrl=pipeline.queue_url, ReceiptHandle=m["ReceiptHandle"], VisibilityTimeout=0
            )
        # When the queue is drained
        pipeline.run_until_idle()
    # Then every page is completed exactly once, with one model call each, the duplicates acknowledged
    assert fake_provider.calls == 40
    _assert_every_page_completed_once(pipeline, db)
    _assert_nothing_left_to_sweep(pipeline)


# --- 5. database restart -------------------------------------------------------------------------------------


@pytest.mark.parametrize("database_url", ["embedded"], indirect=True)
def test_a_database_restart_in_the_middle_of_a_run_loses_and_doubles_nothing(
    deployed: Pipeline,
    db: Database,
    fake_provider: FakeChatServer,
    corpus: Path,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pipeline = deployed
    # Given the embedded PostgreSQL server, leases that end with the invocation, and ten four-page documents
    _reconfigure(monkeypatch, LEASE_MARGIN_SECONDS="0")
    server = EmbeddedServer(database_url)
    _upload(pipeline, corpus, 10, "restart")
    warm = WarmEnvironment("transcribe", timeout=pipeline.function_timeout)
    try:
        # And a run under way: one batch done by a warm execution environment, which keeps its connection
        done = pipeline.receive()
        warm.deliver(sqs_event(done, pipeline.queue_arn))
        response = warm.response()
        assert response["batchItemFailures"] == []
        settle(pipeline, done, response)
        # And a batch in flight in another environment, its claims committed and its model calls under way
        in_flight = pipeline.receive()
        assert len(in_flight) == 10
        in_flight_jobs = [job_id_of(m) for m in in_flight]
        refused = pipeline.receive()
        # (another 4-page file: the same bytes as the others would reuse their finished transcript)
        outage_upload = pipeline.put("uploads/during-the-outage.pdf", corpus / "pdflatex-outline.pdf")
        socket_dir = server.socket_dir
        fake_provider.default_delay = 5  # the answers come once the server is down (a fast stop takes < 1 s)
        worker = start_environment("transcribe", sqs_event(in_flight, pipeline.queue_arn), timeout=40)
        wait_until(
            lambda: fake_provider.calls == 20 and _statuses(db, in_flight_jobs) == {"PROCESSING": 10},
            timeout=20,
            what="the in-flight batch to be claimed and its calls to reach the provider",
        )
        # When the database server stops (pg_ctl stop, fast mode: every session is terminated)
        with server.down():
            # Then the in-flight answers arrive but cannot be written: the worker reports every message failed
            worker_response, _ = worker.finish()
            assert {f["itemIdentifier"] for f in worker_response["batchItemFailures"]} == {
                m["MessageId"] for m in in_flight
            }
            settle(pipeline, in_flight, worker_response)
            # And a delivery meanwhile fails as a whole: every message is reported failed, back to the queue
            response = pipeline.invoke_transcribe(sqs_event(refused, pipeline.queue_arn))
            assert {f["itemIdentifier"] for f in response["batchItemFailures"]} == {m["MessageId"] for m in refused}
            settle(pipeline, refused, response)
            # And an upload notification meanwhile raises (S3 retries it), and so does the sweeper
            with pytest.raises(OperationalError):
                upload_app.handler(outage_upload, LambdaContext(120))
            with pytest.raises(OperationalError):
                pipeline.sweep()
        # When the server is back (same socket, so the same URL)
        assert server.socket_dir == socket_dir
        fake_provider.default_delay = 0
        db.engine.dispose()  # the test's own inspection queries below go through this pool, unpinged
        # Then nothing was marked done wrongly: the in-flight pages are still leased, without a result, and
        # the refused ones untouched
        assert all(r["result_text"] is None for r in jobs(db, in_flight_jobs))
        assert _statuses(db, in_flight_jobs) == {"PROCESSING": 10}
        assert all((r["status"], r["attempts"]) == ("QUEUED", 0) for r in jobs(db, [job_id_of(m) for m in refused]))
        # And the warm environment's pooled connection, killed by the restart, is found dead and replaced on its
        # next invocation, which succeeds
        after = pipeline.receive()
        warm.deliver(sqs_event(after, pipeline.queue_arn))
        response = warm.response()
        assert response["batchItemFailures"] == []
        settle(pipeline, after, response)
    finally:
        warm.close()
    # And the S3 retry of the upload notification records the document and sends its pages
    [late] = upload_app.handler(outage_upload, LambdaContext(120))["documents"]
    assert (late["status"], late["messages_sent"]) == ("PROCESSING", PAGES)
    # And draining the queue completes everything but the in-flight pages, whose redelivered messages find them
    # still leased (acknowledged as duplicates)
    pipeline.run_until_idle()
    assert _statuses(db, in_flight_jobs) == {"PROCESSING": 10}
    # And once their leases run out the sweeper puts them back, and they complete
    wait_for_leases_to_expire(db, in_flight_jobs)
    report = pipeline.sweep()
    assert (report["leases_requeued"], report["jobs_sent"]) == (10, 10)
    pipeline.run_until_idle()
    # Then every page is COMPLETED exactly once: the interrupted ones in their second attempt, the answers
    # lost in the outage the only calls made twice
    assert fake_provider.calls == 10 + 10 + 10 + 10 + PAGES + 10
    assert len(jobs(db)) == 11 * PAGES
    _assert_every_page_completed_once(pipeline, db, retried=set(in_flight_jobs))
    _assert_nothing_left_to_sweep(pipeline)
