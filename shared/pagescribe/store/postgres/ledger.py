"""The ledger of model calls and the fenced writes that end a page."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from psycopg.types.json import Jsonb

from pagescribe.domain import (
    NO_OUTCOME,
    AttemptOutcome,
    ClaimedJob,
    DocumentProgress,
    FailedCall,
    PageEnd,
    PageOutcome,
    Spend,
    recorded_as,
)
from pagescribe.store.postgres.connection import Connected
from pagescribe.store.postgres.rows import (
    progress_of,
)

# A tenant's day is counted in SHARDS rows (tenant_days' shard, a page's by its number), summed when read: every call
# of the tenant moves its day, and one row would pass the tenant's calls one at a time (each holding the row until its
# commit is flushed). A document's pages ended and money spent are counted so too (document_counts), from
# SHARDED_FROM_PAGES pages on; a smaller document counts in one row (shard 0), read exactly in the write that moves it.
SHARDS = 16
SHARDED_FROM_PAGES = 256
# A page's end that finds this few pages of its sharded document left, or fewer, reads the document's count again once
# its own write is committed: the write's statement cannot see the other shards' writes committed while it ran, so the
# last two pages ending together could each miss the other's. The sweeper finishes whatever is missed still.
FINISH_WATCH_PAGES = 64


def shard(job: ClaimedJob) -> int:
    """The row of its tenant's day (and of its document's count, when sharded) a page's calls are counted in."""
    return job.page_number % SHARDS


def fenced_write(job: ClaimedJob, outcome: PageOutcome, written: AttemptOutcome) -> dict[str, Any]:
    """The parameters of a fenced result write (COMPLETE_JOB, FAIL_JOB, ESCALATE_JOB): the lease that must still
    hold, what the model answered, and how its call is recorded."""
    return {
        "job_id": job.job_id,
        "document_id": job.document_id,
        "shard": shard(job),
        "sharded_from": SHARDED_FROM_PAGES,
        "lease_token": job.lease_token,
        "claim": job.attempts,
        "answered": outcome.text is not None,
        "called": outcome.called,
        "outcome": recorded_as(outcome, written).value,
        "result_text": outcome.text,
        "finish_reason": outcome.finish_reason,
        "prompt_tokens": outcome.prompt_tokens,
        "completion_tokens": outcome.completion_tokens,
        "cost": outcome.cost,
        "cost_estimated": outcome.cost_estimated,
        "model": outcome.model,
        "provider": outcome.provider,
        "provider_request_id": outcome.provider_request_id,
        "latency_ms": outcome.latency_ms,
        "confidence": outcome.confidence,
        "grounding": Jsonb(outcome.grounding) if outcome.grounding is not None else None,
        "second_read": Jsonb(outcome.second_read) if outcome.second_read is not None else None,
        "flags": Jsonb(list(outcome.page_flags if outcome.page_flags is not None else outcome.flags)),
        "attempt_flags": Jsonb(list(outcome.flags)),
    }


class PgLedger(Connected):
    """The ledger: a page's end written by the holder of its lease, and every model call recorded, kept or not, with
    its cost."""

    # The end of a page (COMPLETE_JOB, FAIL_JOB), written by the holder of the current lease only. A write that carries
    # an answer replaces the page's answer and flags; one that does not (a failure before or without an answer) keeps
    # the answer the page has (the one it escalated from) and adds its flags to that answer's.
    #
    # A model call that answered is recorded whether or not its result may be written (recorded AS, in COMPLETE_JOB,
    # FAIL_JOB and ESCALATE_JOB): it was paid for. Its outcome is the one asked for when the fenced write it travels
    # with succeeds (LOOP_CUT for a call cut at a loop, whether its page escalated or failed), LEASE_LOST when the write
    # found the lease gone. A cut call's cost is the provider's figure or, marked cost_estimated, pagescribe's. A page
    # answered without a call (its own text layer) records nothing. The call's cost counts in its tenant's day at once
    # (counted AS).
    #
    # The image the page was sent to the model as (``image_key``, stored in the bucket while the model answered) is
    # noted by the write that ends the page, not by a statement of its own (KEEP_PAGE_IMAGE: a page that does not end).
    #
    # Fenced completion: only the holder of the current lease may write; the document's count (its shard of
    # document_counts, with the call's cost) moves in the same statement, and the count is returned: the completion
    # that sees the last page land finishes the document (FINISH_DOCUMENT lets one finish only). On a sharded document
    # the count is read again, committed, near its end (_progress).
    COMPLETE_JOB = """
    WITH written AS (
        UPDATE jobs
        SET status = 'COMPLETED', error = NULL,
            result_text = CASE WHEN %(answered)s THEN %(result_text)s ELSE result_text END,
            finish_reason = CASE WHEN %(answered)s THEN %(finish_reason)s ELSE finish_reason END,
            prompt_tokens = CASE WHEN %(answered)s THEN %(prompt_tokens)s ELSE prompt_tokens END,
            completion_tokens = CASE WHEN %(answered)s THEN %(completion_tokens)s ELSE completion_tokens END,
            cost = CASE WHEN %(answered)s THEN %(cost)s ELSE cost END,
            model = CASE WHEN %(answered)s THEN %(model)s ELSE model END,
            provider = CASE WHEN %(answered)s THEN %(provider)s ELSE provider END,
            provider_request_id = CASE WHEN %(answered)s THEN %(provider_request_id)s ELSE provider_request_id END,
            latency_ms = CASE WHEN %(answered)s THEN %(latency_ms)s ELSE latency_ms END,
            confidence = CASE WHEN %(answered)s THEN %(confidence)s ELSE confidence END,
            grounding = CASE WHEN %(answered)s THEN %(grounding)s ELSE grounding END,
            flags = CASE WHEN %(answered)s THEN %(flags)s ELSE flags || %(flags)s END,
            escalation = CASE WHEN escalation IS NOT NULL THEN 'DONE' END, rate_slot_at = NULL, reserved_usd = NULL,
            image_key = coalesce(%(image_key)s, image_key),
            lease_expires_at = NULL, completed_at = now(), updated_at = now()
        WHERE id = %(job_id)s AND status = 'PROCESSING' AND lease_token = %(lease_token)s
        RETURNING document_id
    ),
    recorded AS (
        INSERT INTO attempts (job_id, document_id, claim, outcome, model, provider, finish_reason, prompt_tokens,
                              completion_tokens, cost, cost_estimated, latency_ms, provider_request_id, flags,
                              confidence, second_read, tenant_id)
        SELECT %(job_id)s, %(document_id)s, %(claim)s,
               CASE WHEN EXISTS (SELECT 1 FROM written) THEN %(outcome)s ELSE 'LEASE_LOST' END,
               %(model)s, %(provider)s, %(finish_reason)s, %(prompt_tokens)s, %(completion_tokens)s, %(cost)s,
               %(cost_estimated)s, %(latency_ms)s, %(provider_request_id)s, %(attempt_flags)s, %(confidence)s,
               %(second_read)s, (SELECT tenant_id FROM documents WHERE id = %(document_id)s)
        WHERE %(called)s
    ),
    counted AS (
        INSERT INTO tenant_days AS t (tenant_id, day, shard, spent_usd, calls)
        SELECT tenant_id, CAST(now() AT TIME ZONE 'UTC' AS date), %(shard)s, coalesce(%(cost)s, 0), 1
        FROM documents WHERE id = %(document_id)s AND %(called)s
        ON CONFLICT (tenant_id, day, shard)
        DO UPDATE SET spent_usd = t.spent_usd + excluded.spent_usd, calls = t.calls + 1
    ),
    tallied AS (
        INSERT INTO document_counts AS c (document_id, shard, pages_completed, spent_usd)
        SELECT id, CASE WHEN page_count >= %(sharded_from)s THEN %(shard)s ELSE 0 END, (SELECT count(*) FROM written),
               CASE WHEN %(called)s THEN coalesce(%(cost)s, 0) ELSE 0 END
        FROM documents WHERE id = %(document_id)s AND (%(called)s OR EXISTS (SELECT 1 FROM written))
        ON CONFLICT (document_id, shard)
        DO UPDATE SET pages_completed = c.pages_completed + excluded.pages_completed,
                      spent_usd = c.spent_usd + excluded.spent_usd, updated_at = now()
        RETURNING shard, pages_completed, pages_failed
    )
    SELECT d.id, d.page_count, d.page_count >= %(sharded_from)s AS sharded,
           d.pages_completed + t.pages_completed + o.pages_completed AS pages_completed,
           d.pages_failed + t.pages_failed + o.pages_failed AS pages_failed
    FROM written w JOIN documents d ON d.id = w.document_id CROSS JOIN tallied t
    CROSS JOIN LATERAL (
        SELECT coalesce(sum(c.pages_completed), 0) AS pages_completed, coalesce(sum(c.pages_failed), 0) AS pages_failed
        FROM document_counts c WHERE c.document_id = d.id AND c.shard <> t.shard
    ) o
    """

    def complete_job(
        self, job: ClaimedJob, outcome: PageOutcome, *, image_key: str | None = None
    ) -> DocumentProgress | None:
        params = {**fenced_write(job, outcome, AttemptOutcome.KEPT), "image_key": image_key}
        return self._progress(self._row(self.COMPLETE_JOB, params))

    def complete_jobs(self, ends: Sequence[PageEnd]) -> list[DocumentProgress | None]:
        """COMPLETE_JOB for each page, in one transaction and one round trip. The pages are of one document, and their
        calls are counted in the first one's shard: the transaction holds one row of the tenant's day and one of the
        document's count, as one page's write does, so two such writes never hold rows the other waits for."""
        documents = sorted({end.job.document_id for end in ends})
        if len(documents) > 1:
            raise ValueError(f"pages written together are of one document, not of {len(documents)}: {documents}")
        if len(ends) == 1:
            [end] = ends
            return [self.complete_job(end.job, end.outcome, image_key=end.image_key)]
        counted_in = {"shard": shard(ends[0].job)} if ends else {}
        runs = [
            (
                self.COMPLETE_JOB,
                {**fenced_write(end.job, end.outcome, AttemptOutcome.KEPT), "image_key": end.image_key, **counted_in},
            )
            for end in ends
        ]
        return [self._progress(rows[0] if rows else None) for rows in self._each_in_one_transaction(runs)]

    # A document's count, summed over its shards (every write that moved it committed).
    DOCUMENT_PROGRESS = """
    SELECT d.id, d.page_count, d.pages_completed + o.pages_completed AS pages_completed,
           d.pages_failed + o.pages_failed AS pages_failed
    FROM documents d
    CROSS JOIN LATERAL (
        SELECT coalesce(sum(c.pages_completed), 0) AS pages_completed, coalesce(sum(c.pages_failed), 0) AS pages_failed
        FROM document_counts c WHERE c.document_id = d.id
    ) o
    WHERE d.id = %(document_id)s
    """

    def _progress(self, row: Any | None) -> DocumentProgress | None:
        """The document's count a page's end wrote, read again once committed when the end of a sharded document is
        near (FINISH_WATCH_PAGES): one more round trip for its last pages only."""
        progress = progress_of(row)
        if row is None or progress is None or not row.sharded:
            return progress
        left = progress.page_count - progress.pages_completed - progress.pages_failed
        if 0 < left <= FINISH_WATCH_PAGES:
            return progress_of(self._row(self.DOCUMENT_PROGRESS, {"document_id": progress.document_id}))
        return progress

    # A failed page keeps the text of its last answer (a truncated or hard-flagged one, or the answer before an
    # escalation that did not answer).
    FAIL_JOB = """
    WITH written AS (
        UPDATE jobs
        SET status = 'FAILED', error = %(error)s,
            result_text = CASE WHEN %(answered)s THEN %(result_text)s ELSE result_text END,
            finish_reason = CASE WHEN %(answered)s THEN %(finish_reason)s ELSE finish_reason END,
            prompt_tokens = CASE WHEN %(answered)s THEN %(prompt_tokens)s ELSE prompt_tokens END,
            completion_tokens = CASE WHEN %(answered)s THEN %(completion_tokens)s ELSE completion_tokens END,
            cost = CASE WHEN %(answered)s THEN %(cost)s ELSE cost END,
            model = CASE WHEN %(answered)s THEN %(model)s ELSE model END,
            provider = CASE WHEN %(answered)s THEN %(provider)s ELSE provider END,
            provider_request_id = CASE WHEN %(answered)s THEN %(provider_request_id)s ELSE provider_request_id END,
            latency_ms = CASE WHEN %(answered)s THEN %(latency_ms)s ELSE latency_ms END,
            confidence = CASE WHEN %(answered)s THEN %(confidence)s ELSE confidence END,
            grounding = CASE WHEN %(answered)s THEN %(grounding)s ELSE grounding END,
            flags = CASE WHEN %(answered)s THEN %(flags)s ELSE flags || %(flags)s END,
            escalation = CASE WHEN escalation IS NOT NULL THEN 'DONE' END, rate_slot_at = NULL, reserved_usd = NULL,
            image_key = coalesce(%(image_key)s, image_key),
            lease_expires_at = NULL, completed_at = now(), updated_at = now()
        WHERE id = %(job_id)s AND status = 'PROCESSING' AND lease_token = %(lease_token)s
        RETURNING document_id
    ),
    recorded AS (
        INSERT INTO attempts (job_id, document_id, claim, outcome, model, provider, finish_reason, prompt_tokens,
                              completion_tokens, cost, cost_estimated, latency_ms, provider_request_id, flags,
                              confidence, second_read, tenant_id)
        SELECT %(job_id)s, %(document_id)s, %(claim)s,
               CASE WHEN EXISTS (SELECT 1 FROM written) THEN %(outcome)s ELSE 'LEASE_LOST' END,
               %(model)s, %(provider)s, %(finish_reason)s, %(prompt_tokens)s, %(completion_tokens)s, %(cost)s,
               %(cost_estimated)s, %(latency_ms)s, %(provider_request_id)s, %(attempt_flags)s, %(confidence)s,
               %(second_read)s, (SELECT tenant_id FROM documents WHERE id = %(document_id)s)
        WHERE %(called)s
    ),
    counted AS (
        INSERT INTO tenant_days AS t (tenant_id, day, shard, spent_usd, calls)
        SELECT tenant_id, CAST(now() AT TIME ZONE 'UTC' AS date), %(shard)s, coalesce(%(cost)s, 0), 1
        FROM documents WHERE id = %(document_id)s AND %(called)s
        ON CONFLICT (tenant_id, day, shard)
        DO UPDATE SET spent_usd = t.spent_usd + excluded.spent_usd, calls = t.calls + 1
    ),
    tallied AS (
        INSERT INTO document_counts AS c (document_id, shard, pages_failed, spent_usd)
        SELECT id, CASE WHEN page_count >= %(sharded_from)s THEN %(shard)s ELSE 0 END, (SELECT count(*) FROM written),
               CASE WHEN %(called)s THEN coalesce(%(cost)s, 0) ELSE 0 END
        FROM documents WHERE id = %(document_id)s AND (%(called)s OR EXISTS (SELECT 1 FROM written))
        ON CONFLICT (document_id, shard)
        DO UPDATE SET pages_failed = c.pages_failed + excluded.pages_failed,
                      spent_usd = c.spent_usd + excluded.spent_usd, updated_at = now()
        RETURNING shard, pages_completed, pages_failed
    )
    SELECT d.id, d.page_count, d.page_count >= %(sharded_from)s AS sharded,
           d.pages_completed + t.pages_completed + o.pages_completed AS pages_completed,
           d.pages_failed + t.pages_failed + o.pages_failed AS pages_failed
    FROM written w JOIN documents d ON d.id = w.document_id CROSS JOIN tallied t
    CROSS JOIN LATERAL (
        SELECT coalesce(sum(c.pages_completed), 0) AS pages_completed, coalesce(sum(c.pages_failed), 0) AS pages_failed
        FROM document_counts c WHERE c.document_id = d.id AND c.shard <> t.shard
    ) o
    """

    def fail_job(
        self, job: ClaimedJob, error: str, outcome: PageOutcome = NO_OUTCOME, *, image_key: str | None = None
    ) -> DocumentProgress | None:
        params = {**fenced_write(job, outcome, AttemptOutcome.REJECTED), "error": error, "image_key": image_key}
        return self._progress(self._row(self.FAIL_JOB, params))

    # The one escalation of a page: its hard-flagged answer is kept on the page (the text to fail with if the escalation
    # does not do better) and the page, still under the same lease, goes to the escalation model. A page escalates once:
    # a later claim finds it PENDING and asks the escalation model directly; DONE never escalates again.
    ESCALATE_JOB = """
    WITH written AS (
        UPDATE jobs
        SET escalation = 'PENDING', flags = %(flags)s, updated_at = now(),
            result_text = %(result_text)s,
            finish_reason = %(finish_reason)s,
            prompt_tokens = %(prompt_tokens)s,
            completion_tokens = %(completion_tokens)s,
            cost = %(cost)s,
            model = %(model)s,
            provider = %(provider)s,
            provider_request_id = %(provider_request_id)s,
            latency_ms = %(latency_ms)s,
            confidence = %(confidence)s,
            grounding = %(grounding)s
        WHERE id = %(job_id)s AND status = 'PROCESSING' AND lease_token = %(lease_token)s AND escalation IS NULL
        RETURNING document_id
    ),
    recorded AS (
        INSERT INTO attempts (job_id, document_id, claim, outcome, model, provider, finish_reason, prompt_tokens,
                              completion_tokens, cost, cost_estimated, latency_ms, provider_request_id, flags,
                              confidence, second_read, tenant_id)
        SELECT %(job_id)s, %(document_id)s, %(claim)s,
               CASE WHEN EXISTS (SELECT 1 FROM written) THEN %(outcome)s ELSE 'LEASE_LOST' END,
               %(model)s, %(provider)s, %(finish_reason)s, %(prompt_tokens)s, %(completion_tokens)s, %(cost)s,
               %(cost_estimated)s, %(latency_ms)s, %(provider_request_id)s, %(attempt_flags)s, %(confidence)s,
               %(second_read)s, (SELECT tenant_id FROM documents WHERE id = %(document_id)s)
        WHERE %(called)s
    ),
    counted AS (
        INSERT INTO tenant_days AS t (tenant_id, day, shard, spent_usd, calls)
        SELECT tenant_id, CAST(now() AT TIME ZONE 'UTC' AS date), %(shard)s, coalesce(%(cost)s, 0), 1
        FROM documents WHERE id = %(document_id)s AND %(called)s
        ON CONFLICT (tenant_id, day, shard)
        DO UPDATE SET spent_usd = t.spent_usd + excluded.spent_usd, calls = t.calls + 1
    ),
    tallied AS (
        INSERT INTO document_counts AS c (document_id, shard, spent_usd)
        SELECT id, CASE WHEN page_count >= %(sharded_from)s THEN %(shard)s ELSE 0 END, coalesce(%(cost)s, 0)
        FROM documents WHERE id = %(document_id)s AND %(called)s
        ON CONFLICT (document_id, shard) DO UPDATE SET spent_usd = c.spent_usd + excluded.spent_usd, updated_at = now()
    )
    SELECT document_id FROM written
    """

    def escalate_job(self, job: ClaimedJob, outcome: PageOutcome) -> bool:
        return self._row(self.ESCALATE_JOB, fenced_write(job, outcome, AttemptOutcome.ESCALATED)) is not None

    # A page whose call would exceed its document's cost cap or its tenant's daily budget ends without being started.
    # It keeps any answer it has (one it escalated from) and counts with the pages that ended without one.
    SKIP_JOB = """
    WITH written AS (
        UPDATE jobs
        SET status = 'SKIPPED', error = %(error)s, rate_slot_at = NULL, reserved_usd = NULL,
            escalation = CASE WHEN escalation IS NOT NULL THEN 'DONE' END,
            lease_expires_at = NULL, completed_at = now(), updated_at = now()
        WHERE id = %(job_id)s AND status = 'PROCESSING' AND lease_token = %(lease_token)s
        RETURNING document_id
    ),
    tallied AS (
        INSERT INTO document_counts AS c (document_id, shard, pages_failed)
        SELECT d.id, CASE WHEN d.page_count >= %(sharded_from)s THEN %(shard)s ELSE 0 END, 1
        FROM written w JOIN documents d ON d.id = w.document_id
        ON CONFLICT (document_id, shard) DO UPDATE SET pages_failed = c.pages_failed + 1, updated_at = now()
        RETURNING shard, pages_completed, pages_failed
    )
    SELECT d.id, d.page_count, d.page_count >= %(sharded_from)s AS sharded,
           d.pages_completed + t.pages_completed + o.pages_completed AS pages_completed,
           d.pages_failed + t.pages_failed + o.pages_failed AS pages_failed
    FROM written w JOIN documents d ON d.id = w.document_id CROSS JOIN tallied t
    CROSS JOIN LATERAL (
        SELECT coalesce(sum(c.pages_completed), 0) AS pages_completed, coalesce(sum(c.pages_failed), 0) AS pages_failed
        FROM document_counts c WHERE c.document_id = d.id AND c.shard <> t.shard
    ) o
    """

    def skip_job(self, job: ClaimedJob, reason: str) -> DocumentProgress | None:
        params = {
            "job_id": job.job_id,
            "lease_token": job.lease_token,
            "error": reason,
            "shard": shard(job),
            "sharded_from": SHARDED_FROM_PAGES,
        }
        return self._progress(self._row(self.SKIP_JOB, params))

    # A model call that failed (an HTTP error, a timeout, a 429) is recorded too: it was made, and a 429 is the rate the
    # dashboard shows. A provider reports no usage for a failed call; when it does, the cost counts.
    RECORD_FAILED_CALL = """
    WITH recorded AS (
        INSERT INTO attempts (job_id, document_id, claim, outcome, model, provider, latency_ms, status_code, error,
                              tenant_id)
        SELECT %(job_id)s, %(document_id)s, %(claim)s, %(outcome)s, %(model)s, %(provider)s, %(latency_ms)s,
               %(status_code)s, %(error)s, tenant_id
        FROM documents WHERE id = %(document_id)s
    )
    INSERT INTO tenant_days AS t (tenant_id, day, shard, calls)
    SELECT tenant_id, CAST(now() AT TIME ZONE 'UTC' AS date), %(shard)s, 1 FROM documents WHERE id = %(document_id)s
    ON CONFLICT (tenant_id, day, shard) DO UPDATE SET calls = t.calls + 1
    """

    def record_failed_call(self, job: ClaimedJob, failed: FailedCall) -> None:
        self._rows(
            self.RECORD_FAILED_CALL,
            {
                "job_id": job.job_id,
                "document_id": job.document_id,
                "shard": shard(job),
                "claim": job.attempts,
                "outcome": (AttemptOutcome.RATE_LIMITED if failed.status_code == 429 else AttemptOutcome.ERROR).value,
                "model": failed.model,
                "provider": failed.provider,
                "latency_ms": failed.latency_ms,
                "status_code": failed.status_code,
                "error": failed.error[:1000],
            },
        )

    # A call that answered and is not the page's end (a tile of a page read in tiles, TILE, or the whole-page answer
    # read again in tiles, TILED): recorded as it answers, its cost counted in its tenant's day at once. The page's end
    # then carries the stitched answer as not called (recorded here already).
    RECORD_CALL = """
    WITH recorded AS (
        INSERT INTO attempts (job_id, document_id, claim, outcome, model, provider, finish_reason, prompt_tokens,
                              completion_tokens, cost, cost_estimated, latency_ms, provider_request_id, flags,
                              confidence, tile, tenant_id)
        SELECT %(job_id)s, %(document_id)s, %(claim)s, %(outcome)s, %(model)s, %(provider)s, %(finish_reason)s,
               %(prompt_tokens)s, %(completion_tokens)s, %(cost)s, %(cost_estimated)s, %(latency_ms)s,
               %(provider_request_id)s, %(attempt_flags)s, %(confidence)s, %(tile)s, tenant_id
        FROM documents WHERE id = %(document_id)s
    ),
    tallied AS (
        INSERT INTO document_counts AS c (document_id, shard, spent_usd)
        SELECT id, CASE WHEN page_count >= %(sharded_from)s THEN %(shard)s ELSE 0 END, coalesce(%(cost)s, 0)
        FROM documents WHERE id = %(document_id)s AND true
        ON CONFLICT (document_id, shard) DO UPDATE SET spent_usd = c.spent_usd + excluded.spent_usd, updated_at = now()
    )
    INSERT INTO tenant_days AS t (tenant_id, day, shard, spent_usd, calls)
    SELECT tenant_id, CAST(now() AT TIME ZONE 'UTC' AS date), %(shard)s, coalesce(%(cost)s, 0), 1
    FROM documents WHERE id = %(document_id)s
    ON CONFLICT (tenant_id, day, shard) DO UPDATE SET spent_usd = t.spent_usd + excluded.spent_usd, calls = t.calls + 1
    """

    def record_call(
        self, job: ClaimedJob, outcome: PageOutcome, recorded_as: AttemptOutcome, *, tile: str | None = None
    ) -> None:
        self._rows(self.RECORD_CALL, {**fenced_write(job, outcome, recorded_as), "tile": tile})

    # What a document has cost: every call that answered, kept or not.
    DOCUMENT_SPEND = """
    SELECT count(*) AS calls, coalesce(sum(prompt_tokens), 0) AS prompt_tokens,
           coalesce(sum(completion_tokens), 0) AS completion_tokens, coalesce(sum(cost), 0) AS cost,
           count(*) FILTER (WHERE outcome = 'TILE') AS tile_calls,
           count(DISTINCT job_id) FILTER (WHERE outcome = 'TILE') AS pages_tiled
    FROM attempts WHERE document_id = %(document_id)s
    """

    def spend(self, document_id: str) -> Spend:
        row = self._row(self.DOCUMENT_SPEND, {"document_id": document_id})
        assert row is not None, "an aggregate always returns a row"
        return Spend(
            row.calls, row.prompt_tokens, row.completion_tokens, float(row.cost), row.tile_calls, row.pages_tiled
        )
