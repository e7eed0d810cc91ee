"""One contract, two stores: what each port of ``pagescribe.store.ports`` promises, held on PostgreSQL and in memory.

PostgreSQL-only behaviour (row locks, SKIP LOCKED between connections, a lost connection) is tested in
tests/integration/test_database.py; this suite is what the use cases rely on, so that their unit tests on the
in-memory store mean what they say.
"""

from __future__ import annotations

import hashlib
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from pagescribe.domain import (
    LOOP_CUT,
    AttemptOutcome,
    ClaimedJob,
    DocumentStatus,
    FailedCall,
    JobStatus,
    NewDocument,
    PageEnd,
    PageOutcome,
    PendingDocument,
    PricedCall,
    RateBucket,
    RateGrant,
)
from pagescribe.store.ports import Store

LEASE = 300.0
FLAG = {"check": "repetition", "severity": "hard"}


def _new(tenant_id: str = "default", *, prompt: str | None = None, sha: bytes | None = None) -> NewDocument:
    key = f"uploads/{uuid.uuid4()}.pdf"
    return NewDocument("bucket", key, "etag", "", 10, "test/model", prompt=prompt, tenant_id=tenant_id, sha256=sha)


def _answer(text: str = "text", *, cost: float = 0.01, flags: tuple[dict[str, str], ...] = ()) -> PageOutcome:
    return PageOutcome(text, "stop", 1000, 100, cost, "test/model", "fake", "gen-1", 50, flags=flags)


def _claim(store: Store, job_id: str, *, lease: float = LEASE, max_attempts: int = 3) -> ClaimedJob:
    job = store.claim_jobs([job_id], lease_seconds=lease, max_attempts=max_attempts).claimed.get(job_id)
    assert job is not None
    return job


def _document(store: Store, pages: int = 1, **kwargs: object) -> tuple[str, list[str]]:
    created = store.create_document(_new(**kwargs), kind="pdf", pages=range(1, pages + 1))  # type: ignore[arg-type]
    return created.document_id, list(created.job_ids)


pytestmark = pytest.mark.integration


# --- documents ------------------------------------------------------------------------------------------------


def test_a_document_of_an_unknown_tenant_is_refused(store: Store) -> None:
    with pytest.raises(Exception, match="tenant"):
        store.create_document(_new("nobody"), kind="pdf", pages=[1])


def test_an_object_is_recorded_once_with_one_queued_job_per_page(store: Store) -> None:
    # Given an object recorded with three pages
    new = _new()
    first = store.create_document(new, kind="pdf", pages=[1, 2, 3])
    # When the same object is recorded again (a duplicate S3 event)
    again = store.create_document(new, kind="pdf", pages=[1, 2, 3])
    # Then the second is the first, with nothing queued, and the first has its three QUEUED pages in order
    assert (again.document_id, again.job_ids, again.duplicate) == (first.document_id, (), True)
    pages = store.load_pages(first.document_id)
    assert [(p.page_number, p.status) for p in pages] == [(n, JobStatus.QUEUED) for n in (1, 2, 3)]
    assert store.find_document(new) == first.document_id


def test_a_document_recorded_with_an_error_is_failed_and_finished_with_no_pages(store: Store) -> None:
    created = store.create_document(_new(), kind=None, pages=[1], error="not a PDF")
    record = store.get_document(created.document_id)
    assert record is not None and created.job_ids == ()
    assert (record.status, record.error, record.page_count, record.finished_at is not None) == (
        DocumentStatus.FAILED, "not a PDF", 0, True,
    )  # fmt: skip


def test_a_pending_document_is_activated_by_its_upload_once(store: Store) -> None:
    # Given a document the API created, awaiting its upload
    pending_id = str(uuid.uuid4())
    pending = PendingDocument(pending_id, "bucket", f"uploads/{pending_id}", "a.pdf", "test/model", None, (1,), None)
    store.create_pending_document(pending)
    assert store.get_document(pending_id).status is DocumentStatus.AWAITING_UPLOAD  # type: ignore[union-attr]
    # When its upload arrives, twice
    new = _new()
    first = store.create_document(new, kind="pdf", pages=[1], pending_id=pending_id)
    second = store.create_document(new, kind="pdf", pages=[1], pending_id=pending_id)
    # Then it became PROCESSING with one page once; the second arrival is a duplicate
    assert (first.document_id, len(first.job_ids), first.duplicate) == (pending_id, 1, False)
    assert (second.job_ids, second.duplicate) == ((), True)
    record = store.get_document(pending_id)
    assert record is not None and (record.status, record.filename, record.page_count) == (
        DocumentStatus.PROCESSING, "a.pdf", 1,
    )  # fmt: skip


def test_documents_are_listed_newest_first_a_page_at_a_time_per_tenant(store: Store) -> None:
    store.ensure_tenant("acme")
    ids = [_document(store, tenant_id="acme")[0] for _ in range(3)]
    _document(store)  # another tenant's
    first = store.list_documents("acme", limit=2)
    rest = store.list_documents("acme", limit=2, before=(first[-1].created_at, first[-1].document_id))
    assert [d.document_id for d in first + rest] == list(reversed(ids))


def test_a_document_finishes_once_and_only_when_every_page_ended(store: Store) -> None:
    document_id, [one, two] = _document(store, pages=2)
    store.complete_job(_claim(store, one), _answer())
    assert not store.finish_document(document_id, status=DocumentStatus.COMPLETED, error=None, transcript_key="t")
    progress = store.fail_job(_claim(store, two), "broken")
    assert progress is not None and progress.all_pages_done
    assert store.finish_document(document_id, status=DocumentStatus.PARTIAL, error="1 failed", transcript_key="t")
    assert not store.finish_document(document_id, status=DocumentStatus.PARTIAL, error=None, transcript_key="t")
    state = store.transcript_state(document_id)
    assert state is not None and state.document.status is DocumentStatus.PARTIAL
    assert [p.status for p in state.pages] == [JobStatus.COMPLETED, JobStatus.FAILED]
    assert [a.outcome for a in state.attempts] == ["KEPT"]


def test_a_finished_document_of_the_same_bytes_and_request_is_reused_without_calls(store: Store) -> None:
    # Given a finished document of some bytes
    sha = hashlib.sha256(b"same bytes").digest()
    donor_id, [job_id] = _document(store, sha=sha)
    store.complete_job(_claim(store, job_id), _answer("the donor's answer"))
    store.finish_document(donor_id, status=DocumentStatus.COMPLETED, error=None, transcript_key="t")
    # When the same bytes come again with the same request
    new = _new(sha=sha)
    donor = store.find_reusable_document(new, [1])
    created = store.create_document(new, kind="pdf", pages=[1], donor_id=donor)
    # Then the donor's answers stand, completed, with nothing spent
    assert donor == donor_id and created.reused
    [page] = store.load_pages(created.document_id)
    assert (page.status, page.text, page.cost) == (JobStatus.COMPLETED, "the donor's answer", 0)
    assert store.find_reusable_document(_new(sha=sha, prompt="another prompt"), [1]) is None


# --- claims and leases ----------------------------------------------------------------------------------------


def test_a_job_is_claimed_once_and_a_job_named_twice_is_claimed_once(store: Store) -> None:
    _, [job_id] = _document(store)
    claims = store.claim_jobs([job_id, job_id], lease_seconds=LEASE, max_attempts=3)
    again = store.claim_jobs([job_id], lease_seconds=LEASE, max_attempts=3)
    assert list(claims.claimed) == [job_id] and claims.claimed[job_id].attempts == 1
    assert (again.claimed, again.busy) == ({}, frozenset())


def test_a_claim_reads_the_records_of_the_claimed_jobs_documents(store: Store) -> None:
    # Given jobs of two documents in one batch, one of a tenant with a daily budget and a prompt of its own
    store.ensure_tenant("capped")
    store.set_daily_budget("capped", 5.0)
    first, [first_job] = _document(store)
    second, [second_job] = _document(store, tenant_id="capped", prompt="a prompt")
    # When the batch is claimed
    claims = store.claim_jobs([first_job, second_job], lease_seconds=LEASE, max_attempts=3)
    # Then the claim carries both documents' records, as get_documents reads them
    assert set(claims.claimed) == {first_job, second_job}
    assert claims.documents == store.get_documents([first, second])
    assert (claims.documents[second].tenant_daily_budget_usd, claims.documents[second].prompt) == (5.0, "a prompt")


def test_a_claim_reads_no_record_for_a_job_it_did_not_claim(store: Store) -> None:
    _, [job_id] = _document(store)
    _claim(store, job_id)
    assert store.claim_jobs([job_id], lease_seconds=LEASE, max_attempts=3).documents == {}


def test_unknown_and_exhausted_jobs_are_not_claimed(store: Store) -> None:
    _, [job_id] = _document(store)
    store.requeue_job(_claim(store, job_id, max_attempts=1), "HTTP 503", delay_seconds=0)
    assert store.claim_jobs([job_id, str(uuid.uuid4())], lease_seconds=LEASE, max_attempts=1).claimed == {}


def test_a_lost_lease_fences_every_write_of_its_holder(store: Store) -> None:
    # Given a claim whose lease expired, and the page claimed again
    _, [job_id] = _document(store)
    zombie = _claim(store, job_id, lease=0.001)
    _wait_past(store, 0.01)
    newer = _claim(store, job_id)
    # Then the old holder's writes are refused, and its call is still recorded as LEASE_LOST
    assert store.complete_job(zombie, _answer("late")) is None
    assert store.fail_job(zombie, "late") is None
    assert not store.escalate_job(zombie, _answer("late"))
    assert not store.requeue_job(zombie, "late", delay_seconds=0)
    assert not store.defer_job(zombie, "late", delay_seconds=0, slot_at=None, keep_slot=False)
    assert store.skip_job(zombie, "late") is None
    assert store.complete_job(newer, _answer("newer")) is not None
    [page] = store.load_pages(newer.document_id)
    assert (page.text, page.attempts) == ("newer", 2)
    assert sorted(a.outcome for a in store.load_attempts(newer.document_id)) == ["KEPT", "LEASE_LOST", "LEASE_LOST"]


def test_pages_of_a_document_completed_together_are_written_each_under_its_own_lease(store: Store) -> None:
    # Given three claimed pages of a document, the second's lease lost to a newer claim
    document_id, [one, two, three] = _document(store, pages=3)
    first = _claim(store, one)
    zombie = _claim(store, two, lease=0.001)
    _wait_past(store, 0.01)
    newer = _claim(store, two)
    third = _claim(store, three)
    # When the three pages' completions are written together
    written = store.complete_jobs(
        [PageEnd(first, _answer("one")), PageEnd(zombie, _answer("late")), PageEnd(third, _answer("three"), "k3")]
    )
    # Then each page's lease decides for it alone, and a later page's progress counts the pages before it
    assert [p.pages_completed if p else None for p in written] == [1, None, 2]
    assert store.complete_jobs([PageEnd(newer, _answer("two"))])[0] == (document_id, 3, 3, 0)
    pages = store.load_pages(document_id)
    assert [(p.status, p.text) for p in pages] == [(JobStatus.COMPLETED, t) for t in ("one", "two", "three")]
    assert store.page_image(document_id, 3) == ("k3", JobStatus.COMPLETED)
    assert sorted(a.outcome for a in store.load_attempts(document_id)) == ["KEPT", "KEPT", "KEPT", "LEASE_LOST"]
    spend = store.tenant_day("default")
    assert spend is not None and spend.calls == 4


def test_pages_of_two_documents_are_not_completed_together(store: Store) -> None:
    first, [one] = _document(store)
    second, [other] = _document(store)
    with pytest.raises(ValueError, match="one document, not of 2"):
        store.complete_jobs([PageEnd(_claim(store, one), _answer()), PageEnd(_claim(store, other), _answer())])
    assert [p.status for d in (first, second) for p in store.load_pages(d)] == [JobStatus.PROCESSING] * 2


def _wait_past(store: Store, seconds: float) -> None:
    """Let ``seconds`` pass for the store: the in-memory clock moves on; PostgreSQL's is the real one."""
    clock = getattr(getattr(store, "state", None), "clock", None)
    if clock is not None:
        clock.advance(seconds)
    else:
        import time

        time.sleep(seconds)


def test_a_deferred_page_gives_back_its_attempt_and_a_requeued_one_does_not(store: Store) -> None:
    _, [deferred, requeued] = _document(store, pages=2)
    assert store.defer_job(_claim(store, deferred), "rate", delay_seconds=0, slot_at=None, keep_slot=False)
    assert store.requeue_job(_claim(store, requeued), "HTTP 503", delay_seconds=0)
    assert _claim(store, deferred).attempts == 1
    assert _claim(store, requeued).attempts == 2


def test_the_sweeper_requeues_expired_leases_and_fails_those_out_of_attempts(store: Store) -> None:
    # Given two pages whose holders died: one on its first attempt, one on its second and last
    document_id, [spare, last] = _document(store, pages=2)
    _claim(store, spare, lease=0.001)
    store.requeue_job(_claim(store, last), "HTTP 503", delay_seconds=0)
    _claim(store, last, lease=0.001)
    _wait_past(store, 0.01)
    # When the sweeper runs
    requeued = store.requeue_expired_leases(max_attempts=2, limit=10)
    failed, progress = store.fail_expired_leases(max_attempts=2, limit=10)
    # Then the first goes back to the queue and the second fails, counted on its document
    assert (requeued, failed) == (1, 1)
    assert [(p.document_id, p.pages_failed) for p in progress] == [(document_id, 1)]
    first, second = store.load_pages(document_id)
    assert first.status is JobStatus.QUEUED and first.error == (
        "the lease of attempt 1 expired: the worker stopped before finishing"
    )
    assert second.status is JobStatus.FAILED and second.error == (
        "attempts exhausted (2 of 2): the lease expired; the worker stopped before finishing"
    )


def test_an_expired_lease_with_attempts_left_goes_back_to_the_queue_to_be_sent_again(store: Store) -> None:
    document_id, [job_id] = _document(store)
    store.mark_enqueued([job_id])
    _claim(store, job_id, lease=0.001)
    _wait_past(store, 0.01)
    assert store.requeue_expired_leases(max_attempts=3, limit=10) == 1
    assert store.fail_expired_leases(max_attempts=3, limit=10) == (0, [])
    assert store.take_unsent_jobs(resend_after_seconds=60, limit=10) == [(job_id, document_id, 1)]
    assert store.take_unsent_jobs(resend_after_seconds=60, limit=10) == []
    store.release_unsent_jobs([job_id])
    assert store.take_unsent_jobs(resend_after_seconds=60, limit=10) == [(job_id, document_id, 1)]


def test_a_page_sent_recently_or_held_back_is_not_sent_again(store: Store) -> None:
    _, [sent, held] = _document(store, pages=2)
    store.mark_enqueued([sent])
    store.requeue_job(_claim(store, held), "HTTP 503", delay_seconds=3600)
    assert store.take_unsent_jobs(resend_after_seconds=60, limit=10) == []


# --- the ledger -----------------------------------------------------------------------------------------------


def test_an_escalated_page_keeps_its_answer_and_ends_once(store: Store) -> None:
    document_id, [job_id] = _document(store)
    job = _claim(store, job_id)
    assert store.escalate_job(job, _answer("looping", flags=(FLAG,)))
    assert not store.escalate_job(job, _answer("again"))  # a page escalates once
    progress = store.fail_job(job, "still looping", _answer("worse", flags=(FLAG,)))
    assert progress is not None and progress.pages_failed == 1
    [page] = store.load_pages(document_id)
    assert (page.status, page.text, page.escalation) == (JobStatus.FAILED, "worse", "DONE")
    calls = store.load_attempts(document_id)
    assert [a.outcome for a in calls] == ["ESCALATED", "LEASE_LOST", "REJECTED"]


def test_a_failure_without_an_answer_keeps_the_answer_it_escalated_from(store: Store) -> None:
    document_id, [job_id] = _document(store)
    job = _claim(store, job_id)
    store.escalate_job(job, _answer("kept text", flags=(FLAG,)))
    store.fail_job(job, "the escalation model did not answer")
    [page] = store.load_pages(document_id)
    assert (page.text, list(page.flags)) == ("kept text", [FLAG])


def test_every_call_counts_in_the_documents_spend_and_its_tenants_day(store: Store) -> None:
    store.ensure_tenant("acme")
    document_id, [job_id] = _document(store, tenant_id="acme")
    job = _claim(store, job_id)
    store.record_failed_call(job, FailedCall("test/model", "fake", 429, "slow down", 10))
    store.complete_job(job, _answer(cost=0.25))
    spend = store.spend(document_id)
    assert (spend.calls, spend.prompt_tokens, spend.completion_tokens, spend.cost) == (2, 1000, 100, 0.25)
    day = store.tenant_day("acme")
    assert day is not None and (day.spent_usd, day.calls) == (0.25, 2)
    assert [a.outcome for a in store.load_attempts(document_id)] == ["RATE_LIMITED", "KEPT"]


def test_a_tenants_day_sums_the_calls_of_all_its_pages_and_the_cost_gate_reads_that_sum(store: Store) -> None:
    # Given a tenant's twenty pages, each with a call that failed and a call that answered at $0.25
    store.ensure_tenant("acme")
    _, job_ids = _document(store, pages=20, tenant_id="acme")
    for job_id in job_ids:
        job = _claim(store, job_id)
        store.record_failed_call(job, FailedCall("test/model", "fake", 503, "busy", 10))
        store.complete_job(job, _answer(cost=0.25))
    # Then its day holds all forty calls and their $5
    day = store.tenant_day("acme")
    assert day is not None and day.spent_usd == pytest.approx(5.0) and day.calls == 40
    # And the cost gate reads the same day against the tenant's budget
    _, [next_page] = _document(store, tenant_id="acme")
    store.set_daily_budget("acme", 100.0)
    verdict = store.admit_spends(
        [_claim(store, next_page)], "test/model", daily_budget_usd=None, max_output_tokens=100
    )[0]
    assert verdict.verdict == "GO" and verdict.spent_today == pytest.approx(5.0)


def test_a_large_documents_count_and_spend_are_the_sums_of_every_page_ended(store: Store) -> None:
    # Given a tenant's document of 300 pages (a large one is counted in shards), every page but the last ended, one
    # in ten failed, each after a call of $0.5
    store.ensure_tenant("acme")
    document_id, job_ids = _document(store, pages=300, tenant_id="acme")
    *firsts, last = job_ids
    progress = []
    for n, job_id in enumerate(firsts):
        job, answer = _claim(store, job_id), _answer(cost=0.5)
        ended = store.fail_job(job, "broken", answer) if n % 10 == 0 else store.complete_job(job, answer)
        assert ended is not None
        progress.append((ended.pages_completed, ended.pages_failed, ended.all_pages_done))
    # Then each end counted every page ended before it, and none but the last saw the document done
    assert progress == [(n - (n + 9) // 10, (n + 9) // 10, False) for n in range(1, 300)]
    record = store.get_document(document_id)
    assert record is not None and (record.pages_completed, record.pages_failed) == (269, 30)
    # And the cost gate reads what the document spent
    store.set_daily_budget("acme", 1000.0)
    job = _claim(store, last)
    verdict = store.admit_spends([job], "test/model", daily_budget_usd=None, max_output_tokens=100)[0]
    assert verdict.spent == pytest.approx(149.5) and verdict.spent_today == pytest.approx(149.5)
    # When the last page ends, it sees the document done, and the document is finished once
    final = store.complete_job(job, _answer(cost=0.5))
    assert final is not None and (final.pages_completed, final.pages_failed, final.all_pages_done) == (270, 30, True)
    finish = {"status": DocumentStatus.PARTIAL, "error": "30 pages failed", "transcript_key": "t.md"}
    assert store.finish_document(document_id, **finish)  # type: ignore[arg-type]
    assert not store.finish_document(document_id, **finish)  # type: ignore[arg-type]
    [listed] = store.list_documents("acme", limit=1)
    assert (listed.pages_completed, listed.pages_failed) == (270, 30) and listed.cost == pytest.approx(150.0)


def test_a_page_read_in_tiles_records_each_call_as_it_answers_and_its_end_none_of_its_own(store: Store) -> None:
    store.ensure_tenant("acme")
    document_id, [job_id] = _document(store, tenant_id="acme")
    job = _claim(store, job_id)
    store.record_call(job, _answer("cut sho", cost=0.25)._replace(finish_reason="length"), AttemptOutcome.TILED)
    for tile in ("1/2", "2/2"):
        store.record_call(job, _answer(f"tile {tile}", cost=0.5), AttemptOutcome.TILE, tile=tile)
    store.complete_job(job, _answer("tile 1/2\ntile 2/2", cost=1.25)._replace(called=False))
    attempts = store.load_attempts(document_id)
    assert [(a.outcome, a.tile, a.finish_reason, a.cost) for a in attempts] == [
        ("TILED", None, "length", 0.25),
        ("TILE", "1/2", "stop", 0.5),
        ("TILE", "2/2", "stop", 0.5),
    ]
    spend = store.spend(document_id)
    assert (spend.calls, spend.cost, spend.tile_calls, spend.pages_tiled) == (3, 1.25, 2, 1)
    day = store.tenant_day("acme")
    assert day is not None and (day.spent_usd, day.calls) == (1.25, 3)
    [page] = store.load_pages(document_id)
    assert (page.status, page.text, page.cost) == (JobStatus.COMPLETED, "tile 1/2\ntile 2/2", 1.25)


def test_a_skipped_page_counts_with_those_that_ended_without_an_answer(store: Store) -> None:
    document_id, [job_id] = _document(store)
    progress = store.skip_job(_claim(store, job_id), "the daily budget is spent")
    assert progress is not None and (progress.pages_completed, progress.pages_failed) == (0, 1)
    assert store.page_issues(document_id)[0].status is JobStatus.SKIPPED


# --- pages ----------------------------------------------------------------------------------------------------


def test_failed_pages_are_retried_within_the_documents_retries(store: Store) -> None:
    document_id, [ok, bad] = _document(store, pages=2)
    store.complete_job(_claim(store, ok), _answer())
    store.fail_job(_claim(store, bad), "broken", _answer("half", flags=(FLAG,)))
    store.finish_document(document_id, status=DocumentStatus.PARTIAL, error="1 failed", transcript_key="t")
    assert store.retry_failed_pages(document_id, max_retries=1) == [(bad, 2)]
    assert store.retry_failed_pages(document_id, max_retries=1) == []
    record = store.get_document(document_id)
    assert record is not None and (record.status, record.pages_failed, record.retries) == (
        DocumentStatus.PROCESSING, 0, 1,
    )  # fmt: skip
    page = store.load_pages(document_id)[1]
    assert (page.status, page.text, list(page.flags), page.attempts) == (JobStatus.QUEUED, None, [], 0)


def test_a_finished_page_is_rerun_on_another_model_within_its_limits(store: Store) -> None:
    document_id, [job_id] = _document(store)
    store.complete_job(_claim(store, job_id), _answer())
    store.finish_document(document_id, status=DocumentStatus.COMPLETED, error=None, transcript_key="t")
    assert store.rerun_page(document_id, 1, model="big/model", max_retries=5, max_page_reruns=1) == job_id
    assert store.rerun_page(document_id, 1, model=None, max_retries=5, max_page_reruns=1) is None  # not finished
    assert _claim(store, job_id).requested_model == "big/model"
    state = store.page_rerun_state(document_id, 1)
    assert state is not None and (state.status, state.reruns) == (JobStatus.PROCESSING, 1)
    assert store.page_rerun_state(document_id, 2) is None


def test_the_write_that_ends_a_page_notes_its_image_and_one_without_keeps_the_image_noted(store: Store) -> None:
    # Given three pages: one whose image was noted on its own (an attempt that did not end it), two whose were not
    document_id, [one, two, three] = _document(store, pages=3)
    first = _claim(store, one)
    store.keep_page_image(first, "images/1.png")
    # When each page ends, the last two noting their image in the write that ends them
    store.complete_job(first, _answer())
    store.complete_job(_claim(store, two), _answer(), image_key="images/2.png")
    store.fail_job(_claim(store, three), "rejected", image_key="images/3.png")
    # Then every page has its image
    images = [store.page_image(document_id, page) for page in (1, 2, 3)]
    assert [(i.image_key, i.status) if i else None for i in images] == [
        ("images/1.png", JobStatus.COMPLETED),
        ("images/2.png", JobStatus.COMPLETED),
        ("images/3.png", JobStatus.FAILED),
    ]


def test_a_pages_image_figures_summary_and_issues(store: Store) -> None:
    document_id, [one, _] = _document(store, pages=2)
    job = _claim(store, one)
    store.keep_page_image(job, "images/1.png")
    store.keep_figures(job, [{"key": "f/1.png", "bbox": [0, 0, 1, 1]}])
    store.complete_job(job, _answer(flags=(FLAG,)))
    image = store.page_image(document_id, 1)
    assert image is not None and (image.image_key, image.status) == ("images/1.png", JobStatus.COMPLETED)
    assert store.page_figures(document_id, 1) == [{"key": "f/1.png", "bbox": [0, 0, 1, 1]}]
    assert store.page_figures(document_id, 2) == [] and store.page_image(document_id, 3) is None
    summary = {s.status: (s.pages, s.flagged, s.corrected) for s in store.page_summary(document_id)}
    assert summary == {JobStatus.COMPLETED: (1, 1, 0), JobStatus.QUEUED: (1, 0, 0)}
    assert [i.page_number for i in store.page_issues(document_id)] == [1]


# --- corrections ----------------------------------------------------------------------------------------------


def test_corrections_are_numbered_revisions_of_a_finished_document_up_to_a_limit(store: Store) -> None:
    document_id, [job_id] = _document(store)
    assert store.save_correction(document_id, 1, "early", max_revisions=2).saved is None  # not finished
    store.complete_job(_claim(store, job_id), _answer())
    store.finish_document(document_id, status=DocumentStatus.COMPLETED, error=None, transcript_key="t")
    first = store.save_correction(document_id, 1, "one", max_revisions=2)
    second = store.save_correction(document_id, 1, "two", max_revisions=2)
    third = store.save_correction(document_id, 1, "three", max_revisions=2)
    assert [s.saved.revision if s.saved else None for s in (first, second, third)] == [1, 2, None]
    assert third.revisions == 2 and store.save_correction(str(uuid.uuid4()), 1, "x", max_revisions=2).status is None
    [page] = store.load_pages(document_id)
    assert page.current_text == "two"
    version = store.transcript_version(document_id)
    assert version is not None and version.corrections == 2
    [summary] = store.page_summary(document_id)
    assert summary.corrected == 1


# --- spend and rate buckets -----------------------------------------------------------------------------------


def test_the_cost_gate_lets_uncapped_calls_go_and_stops_a_spent_budget(store: Store) -> None:
    store.ensure_tenant("acme")
    _, [paid, next_page] = _document(store, pages=2, tenant_id="acme")
    assert (
        store.admit_spends([_claim(store, paid)], "test/model", daily_budget_usd=None, max_output_tokens=100)[0].verdict
        == "GO"
    )
    store.complete_job(_claim(store, paid, max_attempts=9), _answer(cost=0.5)) if False else None
    store.set_daily_budget("acme", 0.0)
    verdict = store.admit_spends(
        [_claim(store, next_page)], "test/model", daily_budget_usd=None, max_output_tokens=100
    )[0]
    assert (verdict.verdict, verdict.daily_budget_usd) == ("DAILY_BUDGET", 0.0)


def test_pages_of_one_document_pass_the_gate_together_each_behind_the_reserves_of_those_before_it(
    store: Store,
) -> None:
    # Given a tenant whose one paid call makes a call's worst case $0.11 (output limit 1000), with $1 left today, and
    # a new document of four pages of it, claimed together
    store.ensure_tenant("acme")
    _, [paid] = _document(store, tenant_id="acme")
    store.complete_job(_claim(store, paid), _answer(cost=0.01))
    store.set_daily_budget("acme", 1.01)
    _, job_ids = _document(store, pages=4, tenant_id="acme")
    claims = store.claim_jobs(job_ids, lease_seconds=LEASE, max_attempts=3).claimed
    jobs = [claims[job_id] for job_id in job_ids]
    # And the tenant's other pages already in flight, holding $0.77 of the day between them
    _, others = _document(store, pages=7, tenant_id="acme")
    for other in others:
        assert store.admit_spends([_claim(store, other)], "test/model", daily_budget_usd=None, max_output_tokens=1000)[
            0
        ]
    # When the four pages pass the gate at once
    verdicts = store.admit_spends(jobs, "test/model", daily_budget_usd=None, max_output_tokens=1000)
    # Then each page's verdict is the one a gate of its own would give it after the pages before it: two fit in what
    # is left ($0.01 spent + $0.77 + $0.11 + $0.11 = $1.00), the next two wait for calls in flight to settle
    assert [v.verdict for v in verdicts] == ["GO", "GO", "DEFER", "DEFER"]
    assert all(v.reserve == pytest.approx(0.11) for v in verdicts)
    # And a page that went holds its reserve: one more page of the tenant waits behind it
    _, [late] = _document(store, tenant_id="acme")
    late_verdict = store.admit_spends(
        [_claim(store, late)], "test/model", daily_budget_usd=None, max_output_tokens=1000
    )[0]
    assert late_verdict.verdict == "DEFER"
    # And pages of two documents are refused, naming both
    _, [elsewhere] = _document(store, tenant_id="acme")
    with pytest.raises(ValueError, match="one document, not of 2"):
        store.admit_spends([jobs[0], _claim(store, elsewhere)], "test/model", daily_budget_usd=None,
                           max_output_tokens=1000)  # fmt: skip


def test_a_call_is_held_at_its_worst_case_on_the_tenants_own_prices(store: Store) -> None:
    # Given a tenant's one paid call of 1000 prompt and 100 completion tokens for $0.01
    store.ensure_tenant("acme")
    _, [first] = _document(store, tenant_id="acme")
    store.complete_job(_claim(store, first), _answer(cost=0.01))
    # When a page of the tenant, with a daily budget of $1, asks to call, with an output limit of 1000 tokens
    _, [second] = _document(store, tenant_id="acme")
    store.set_daily_budget("acme", 1.0)
    verdict = store.admit_spends([_claim(store, second)], "test/model", daily_budget_usd=None, max_output_tokens=1000)[
        0
    ]
    # Then it goes, held at 1000 prompt tokens at $0.00001 plus 1000 completion tokens at $0.0001: $0.11
    assert verdict.verdict == "GO" and verdict.price == pytest.approx(0.01)
    assert verdict.reserve == pytest.approx(0.11)
    price, calls = store.model_price("test/model", "acme")
    assert price == pytest.approx(0.01) and calls == 1
    assert store.model_price("test/model", "default") == (None, 0)


def test_a_call_cut_at_a_loop_is_recorded_as_cut_and_its_estimated_cost_is_no_price(store: Store) -> None:
    # Given a tenant's call answered whole, at a cost its provider reported
    store.ensure_tenant("acme")
    document_id, [first, second] = _document(store, pages=2, tenant_id="acme")
    store.complete_job(_claim(store, first), _answer(cost=0.01))
    # When a call cut at a loop is written as its page escalates, with a cost pagescribe estimated
    cut = _answer(cost=0.004)._replace(finish_reason=LOOP_CUT, completion_tokens=40, cost_estimated=True)
    assert store.escalate_job(_claim(store, second), cut)
    # Then it is recorded as cut, its cost marked estimated and counted in the document's spend
    attempts = store.load_attempts(document_id)
    assert [(a.outcome, a.cost_estimated) for a in attempts] == [("KEPT", False), ("LOOP_CUT", True)]
    assert [a.cost for a in attempts] == pytest.approx([0.01, 0.004])
    assert store.spend(document_id).cost == pytest.approx(0.014)
    # And the prices calls are estimated and held at are the reported ones only
    assert store.price_history("test/model", "acme") == [PricedCall(1000, 100, 0.01)]
    assert store.price_history("test/model", "default") == []
    assert store.model_price("test/model", "acme") == (0.01, 1)


def test_the_rate_bucket_grants_its_burst_then_reserves_slots_ahead(store: Store) -> None:
    bucket = RateBucket("fake", requests_per_minute=60, tokens_per_minute=0, burst=2)
    grants = [_take(store, bucket, "m", prepaid=False, max_wait=10) for _ in range(3)]
    assert [g.wait == 0 for g in grants] == [True, True, False]
    assert grants[2].reserved and 0.5 < grants[2].wait <= 1.0
    store.pause_rate_bucket(bucket, "m", 30)
    paused = _take(store, bucket, "m", prepaid=True, max_wait=10)
    assert paused.paused and not paused.reserved and paused.wait > 29
    store.settle_rate_tokens(bucket, "m", calls=[(0, 500)])
    assert _take(store, bucket, "m", prepaid=True, max_wait=10).mean_tokens == 500


def _take(store: Store, bucket: RateBucket, model: str, *, prepaid: bool, max_wait: float) -> RateGrant:
    [grant] = store.take_rate_slots(bucket, model, prepaid=[prepaid], max_wait=max_wait)
    return grant


def test_calls_settled_together_leave_the_bucket_as_settled_one_after_another(store: Store) -> None:
    # Given a bucket of 10 tokens a second (a burst of 10), which has seen no call yet
    bucket = RateBucket("fake", requests_per_minute=600, tokens_per_minute=600, burst=10)
    _take(store, bucket, "m", prepaid=True, max_wait=899)
    # When three calls are settled together (each took its estimate, then used its tokens), then one more
    store.settle_rate_tokens(bucket, "m", calls=[(0, 1000), (1000, 2000), (1000, 500)])
    store.settle_rate_tokens(bucket, "m", calls=[(1040, 1040)])
    # Then the bucket learned their mean in order (1000, then 1100, 1040, 1040) and owes the 1,500 tokens they used
    # beyond their estimates: the next call waits for them to come back, about 150 s
    after = _take(store, bucket, "m", prepaid=False, max_wait=899)
    assert after.mean_tokens == pytest.approx(1040) and after.reserved and 140 < after.wait <= 150


def test_pages_that_take_slots_together_get_what_they_would_one_after_another(store: Store) -> None:
    # Given a slot a second, a burst of two, and a slot reserved no further than 1.5 s ahead
    bucket = RateBucket("fake", requests_per_minute=60, tokens_per_minute=0, burst=2)
    # When five pages take together, the second back for the slot it holds
    grants = store.take_rate_slots(bucket, "m", prepaid=[False, True, False, False, False], max_wait=1.5)
    # Then the burst goes, the prepaid page takes nothing, the next reserves the slot a second away, and the last finds
    # none within 1.5 s (the next free one is two seconds away)
    assert [(g.wait == 0, g.reserved) for g in grants[:3]] == [(True, True), (True, False), (True, True)]
    assert grants[3].reserved and 0.9 < grants[3].wait <= 1.0
    assert [(g.reserved, round(g.wait)) for g in grants[4:]] == [(False, 2)]
    # And a page asking after them sees the bucket as they left it: three slots taken of the two a burst holds, the
    # next free slot the same (by the database's clock: how long the page waits for it is less the time since)
    later = _take(store, bucket, "m", prepaid=False, max_wait=1.5)
    assert not later.reserved and later.slot_at == grants[4].slot_at and 0 < later.wait <= 2.0


# --- tenants, keys, callbacks ---------------------------------------------------------------------------------


def test_keys_are_found_by_hash_listed_and_revoked_by_label(store: Store) -> None:
    key_hash = hashlib.sha256(b"ps_secret").digest()
    assert not store.tenant_exists("acme") and not store.any_tenant_key()
    key_id = store.add_api_key("acme", key_hash, "ps_sec")
    assert store.tenant_exists("acme") and store.any_tenant_key()
    assert store.find_api_key(key_hash) == ("acme", False)
    assert [k.key_id for k in store.list_api_keys("acme")] == [key_id] and store.list_api_keys("other") == []
    assert [k.key_id for k in store.revoke_api_key("ps_sec", "other")] == []
    assert [k.key_id for k in store.revoke_api_key("ps_sec", "acme")] == [key_id]
    assert store.find_api_key(key_hash) == ("acme", True) and not store.any_tenant_key()
    assert store.find_api_key(b"unknown") is None


def test_the_first_answer_of_an_idempotency_key_stands(store: Store) -> None:
    document_id, _ = _document(store)
    assert store.idempotent_answer("default", "k") is None
    assert store.remember_answer("default", "k", b"digest", document_id, {"document_id": document_id})
    assert not store.remember_answer("default", "k", b"other", document_id, {"document_id": "other"})
    assert store.idempotent_answer("default", "k") == (b"digest", {"document_id": document_id})


def test_callback_secrets_belong_to_known_tenants(store: Store) -> None:
    assert not store.set_callback_secret("nobody", "s")
    assert store.set_callback_secret("default", "s") and store.callback_secret("default") == "s"


def test_a_finished_documents_callback_is_taken_recorded_and_given_up_after_its_attempts(store: Store) -> None:
    # Given a finished document with a callback URL
    pending_id = str(uuid.uuid4())
    url = "https://example.com/hook"
    pending = PendingDocument(pending_id, "b", f"uploads/{pending_id}", "a.pdf", "test/model", None, None, url)
    store.create_pending_document(pending)
    _, [job_id] = store.create_document(_new(), kind="pdf", pages=[1], pending_id=pending_id)[:2]
    store.complete_job(_claim(store, job_id), _answer())
    store.finish_document(pending_id, status=DocumentStatus.COMPLETED, error=None, transcript_key="t")
    # When it is taken, it is nobody else's for a while; given back, it is due again
    [due] = store.take_due_callbacks(limit=10, max_attempts=2, per_tenant=5)
    assert (due.document_id, due.url, due.attempts) == (pending_id, url, 1)
    assert store.take_due_callbacks(limit=10, max_attempts=2, per_tenant=5) == []
    store.release_callback(pending_id)
    [again] = store.take_due_callbacks(limit=10, max_attempts=2, per_tenant=5)
    assert again.attempts == 1
    # And a failed delivery due again at once, taken once more, then never recorded: given up with its last error
    store.record_callback(pending_id, status="PENDING", error="HTTP 500", retry_in_seconds=0)
    [last] = store.take_due_callbacks(limit=10, max_attempts=2, per_tenant=5)
    assert last.attempts == 2
    store.record_callback(pending_id, status="PENDING", error="HTTP 502", retry_in_seconds=0)
    store.abandon_callbacks(max_attempts=2)
    record = store.get_document(pending_id)
    assert record is not None and record.callback_status == "FAILED"
    assert record.callback_error == "no delivery recorded after 2 attempts; last error: HTTP 502"


def test_a_tenants_stalled_callbacks_fill_no_more_than_their_share_of_a_round(store: Store) -> None:
    for tenant in ("slow", "fast"):
        store.ensure_tenant(tenant)
        for _ in range(3 if tenant == "slow" else 1):
            pending_id = str(uuid.uuid4())
            key = f"uploads/{pending_id}"
            pending = PendingDocument(pending_id, "b", key, "a.pdf", "m", None, None, "https://x", tenant_id=tenant)
            store.create_pending_document(pending)
            store.expire_awaiting_uploads(after_seconds=-1, error="never uploaded", limit=10)
    taken = store.take_due_callbacks(limit=10, max_attempts=3, per_tenant=2)
    tenants = [store.get_document(t.document_id).tenant_id for t in taken]  # type: ignore[union-attr]
    assert sorted(tenants) == ["fast", "slow", "slow"]


# --- the batch lane -------------------------------------------------------------------------------------------


def _parked(store: Store, job_id: str, model: str = "test/model") -> ClaimedJob:
    job = _claim(store, job_id)
    assert store.park_for_batch(job, model=model, image_key=f"k/{job_id}", evidence={"ink": 0.2}, wait_seconds=3600)
    return job


def _batch_document(store: Store, pages: int, *, deadline: datetime | None = None) -> list[str]:
    pending_id = str(uuid.uuid4())
    pending = PendingDocument(
        pending_id, "b", f"uploads/{pending_id}", "a.pdf", "test/model", None, None, None, lane="batch",
        deadline=deadline,
    )  # fmt: skip
    store.create_pending_document(pending)
    return list(store.create_document(_new(), kind="pdf", pages=range(1, pages + 1), pending_id=pending_id).job_ids)


def test_parked_pages_are_sent_in_a_batch_of_their_model_and_answered_under_the_lease_they_were_parked_with(
    store: Store,
) -> None:
    # Given three pages parked for a batch of one model and one of another
    jobs = _batch_document(store, 4)
    parked = [_parked(store, job_id) for job_id in jobs[:3]] + [_parked(store, jobs[3], "other/model")]
    assert store.get_documents([parked[0].document_id])[parked[0].document_id].lane == "batch"
    assert store.batch_pages_waiting() == 4 and sorted(store.waiting_models(limit=10)) == ["other/model", "test/model"]
    # When a batch of at most two is opened for the model, then another
    opened = store.open_batch(dialect="openai", model="test/model", limit=2, window_seconds=86400, lease_seconds=LEASE)
    again = store.open_batch(dialect="openai", model="test/model", limit=2, window_seconds=86400, lease_seconds=LEASE)
    assert opened is not None and again is not None
    assert (
        store.open_batch(dialect="openai", model="test/model", limit=2, window_seconds=86400, lease_seconds=LEASE)
        is None
    )
    # Then the two batches hold the model's three pages once each, with what they were parked with
    batch_id, pages = opened
    sent = [page.job.job_id for page in pages + again[1]]
    assert sorted(sent) == sorted(jobs[:3])
    assert all(page.parked and page.model == "test/model" and page.submissions == 1 for page in pages)
    assert pages[0].image_key == f"k/{pages[0].job.job_id}" and pages[0].evidence == {"ink": 0.2}
    # And a batch shows as open once the provider took it, and its page's answer is written under the parked lease
    store.batch_sent(batch_id, provider_batch_id="batch_1", input_file_id="file_1", status="validating")
    assert [b.provider_batch_id for b in store.open_batches(limit=10)] == ["batch_1"]
    assert store.complete_job(store.batch_pages(batch_id)[0].job, _answer()) is not None
    assert store.batch_pages_waiting() == 3
    assert store.close_batch(batch_id, status="completed", answered=1, failed=0)
    assert not store.close_batch(batch_id, status="completed", answered=1, failed=0)
    assert store.open_batches(limit=10) == []


def test_a_page_moved_to_sync_is_queued_on_the_sync_lane_and_its_batch_answer_is_recorded_not_kept(
    store: Store,
) -> None:
    # Given a page sent in a batch
    [job_id] = _batch_document(store, 1)
    _parked(store, job_id)
    opened = store.open_batch(
        dialect="openrouter", model="test/model", limit=10, window_seconds=60, lease_seconds=LEASE
    )
    assert opened is not None
    batch_id, [page] = opened
    # When it is moved to the sync lane
    assert store.move_to_sync(page.job, "the deadline is near")
    assert not store.move_to_sync(page.job, "again")
    # Then it is QUEUED and its next claim says it is on the sync lane
    again = _claim(store, job_id)
    assert again.lane == "sync" and store.batch_pages_waiting() == 0
    # And its batch's late answer, written with the page as its batch knows it, is recorded and not kept
    [late] = store.batch_pages(batch_id)
    assert not late.parked
    assert store.complete_job(late.job, _answer("late", cost=0.005)) is None
    assert store.complete_job(again, _answer("sync", cost=0.01)) is not None
    [kept] = store.load_pages(late.job.document_id)
    assert kept.text == "sync"
    assert sorted(a.outcome for a in store.load_attempts(late.job.document_id)) == ["KEPT", "LEASE_LOST"]
    assert store.spend(late.job.document_id).cost == pytest.approx(0.015)


def test_pages_of_a_batch_not_sent_or_not_answered_wait_again(store: Store) -> None:
    jobs = _batch_document(store, 2)
    for job_id in jobs:
        _parked(store, job_id)
    opened = store.open_batch(dialect="openai", model="test/model", limit=10, window_seconds=60, lease_seconds=LEASE)
    assert opened is not None
    store.batch_not_sent(opened[0], "503 from the provider")
    reopened = store.open_batch(dialect="openai", model="test/model", limit=10, window_seconds=60, lease_seconds=LEASE)
    assert reopened is not None and all(page.submissions == 1 for page in reopened[1])
    assert store.back_to_waiting(reopened[1][0].job)
    assert store.batch_pages_waiting() == 2
    assert [p.job.job_id for p in store.batch_pages(reopened[0]) if p.parked] == [reopened[1][1].job.job_id]


def test_the_lane_pages_due_for_sync_are_those_whose_deadline_is_near(store: Store) -> None:
    soon = _batch_document(store, 1, deadline=datetime.now(UTC) + timedelta(seconds=60))
    later = _batch_document(store, 1, deadline=datetime.now(UTC) + timedelta(hours=5))
    free = _batch_document(store, 1)
    for job_id in soon + later + free:
        _parked(store, job_id)
    assert [p.job.job_id for p in store.due_for_sync(within_seconds=600, limit=10)] == soon
    [due] = store.due_for_sync(within_seconds=600, limit=10)
    assert store.batch_pages_waiting(due.job.document_id) == 1
