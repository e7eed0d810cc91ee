"""Claims and leases: who may work on a page, and for how long."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import namedtuple_row

from pagescribe.domain import (
    ClaimedJob,
    Claims,
    DocumentProgress,
)
from pagescribe.store.postgres.connection import Connected
from pagescribe.store.postgres.rows import claims_with_documents


class PgClaims(Connected):
    """Claims and leases: a page moves QUEUED → PROCESSING under a lease, goes back (requeue, defer) or is taken
    over once its lease expired; the sweeper's resend of the messages that were lost."""

    # What a claim returns: each job claimed, with its document's record beside it (read in the claim's snapshot, not
    # locked: only the jobs' rows are), so that a batch's claim and the read of its documents are one round trip. The
    # fields a page is transcribed by (kind, model, prompt, caps, lane) are written with its jobs and never change; a
    # re-run changes only the document's status and counters, which no page reads from here (the counters are summed
    # with the document's shards in document_counts all the same, as every reader of a document sums them). The
    # document's columns carry the prefix document_ (its id is the job's document_id).
    CLAIMED = """
    claimed AS (
        UPDATE jobs
        SET status = 'PROCESSING', attempts = attempts + 1, lease_token = %(lease_token)s,
            lease_expires_at = now() + make_interval(secs => %(lease_seconds)s), reserved_usd = NULL,
            started_at = now(), updated_at = now()
        WHERE id IN (SELECT id FROM candidate)
        RETURNING id, document_id, page_number, attempts, lease_token, escalation, flags,
                  extract(epoch FROM rate_slot_at - now()) AS slot_in_seconds, requested_model, lane
    )
    SELECT c.id, c.document_id, c.page_number, c.attempts, c.lease_token, c.escalation, c.flags, c.slot_in_seconds,
           c.requested_model, c.lane,
           d.bucket AS document_bucket, d.object_key AS document_object_key, d.etag AS document_etag,
           d.version_id AS document_version_id, d.size_bytes AS document_size_bytes, d.kind AS document_kind,
           d.page_count AS document_page_count, d.source_page_count AS document_source_page_count,
           d.status AS document_status, d.error AS document_error, d.model AS document_model,
           d.escalation_model AS document_escalation_model, d.prompt AS document_prompt,
           d.pages_completed + o.completed AS document_pages_completed,
           d.pages_failed + o.failed AS document_pages_failed,
           d.transcript_key AS document_transcript_key, d.created_at AS document_created_at,
           d.finished_at AS document_finished_at, d.filename AS document_filename,
           d.requested_pages AS document_requested_pages, d.callback_url AS document_callback_url,
           d.callback_status AS document_callback_status, d.callback_error AS document_callback_error,
           d.retries AS document_retries, d.tenant_id AS document_tenant_id, d.reuse AS document_reuse,
           d.reused_from AS document_reused_from, d.max_cost_usd AS document_max_cost_usd,
           d.second_read AS document_second_read, d.chunks AS document_chunks,
           d.merge_tables AS document_merge_tables, d.furniture AS document_furniture, d.lane AS document_lane,
           d.deadline AS document_deadline,
           (SELECT daily_budget_usd FROM tenants WHERE tenants.id = d.tenant_id) AS document_tenant_daily_budget_usd
    FROM claimed c LEFT JOIN documents d ON d.id = c.document_id
    CROSS JOIN LATERAL (
        SELECT coalesce(sum(n.pages_completed), 0) AS completed, coalesce(sum(n.pages_failed), 0) AS failed
        FROM document_counts n WHERE n.document_id = c.document_id
    ) o
    """

    # The claim: one statement, one round trip, for every job of an SQS batch at once, with their documents. The rows
    # are locked with SKIP LOCKED, so a concurrent claim of the same job (a duplicate delivery) finds nothing and
    # returns nothing. An expired lease proves its holder dead (Lambda is killed at its timeout and the lease outlasts
    # the invocation), so it may be taken over. The jobs claimed together share the statement's fresh lease token:
    # a token fences one claim of one job, and no statement claims a job twice.
    CLAIM_JOBS_BY_ID = (
        """
    WITH candidate AS (
        SELECT id FROM jobs
        WHERE id = ANY(CAST(%(job_ids)s AS uuid[]))
          AND attempts < %(max_attempts)s
          AND (status = 'QUEUED' OR (status = 'PROCESSING' AND lease_expires_at < now()))
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ),"""
        + CLAIMED
    )

    def claim_jobs(self, job_ids: Sequence[str], *, lease_seconds: float, max_attempts: int) -> Claims:
        unique = list(dict.fromkeys(job_ids))
        if not unique:
            return Claims({}, frozenset(), {})
        lease_token = str(uuid.uuid4())
        params = {"lease_token": lease_token, "lease_seconds": lease_seconds, "max_attempts": max_attempts}
        rows = self._rows(self.CLAIM_JOBS_BY_ID, {**params, "job_ids": unique, "limit": len(unique)})
        busy: set[str] = set()
        claimed_ids = {str(row.id) for row in rows}
        for job_id in unique:
            if job_id not in claimed_ids:
                waited = self._claim_waiting({**params, "job_id": job_id})
                if waited is None:
                    busy.add(job_id)
                rows += waited or []
        return claims_with_documents(rows, frozenset(busy))

    # A job the claim skipped is a duplicate only if it is still not claimable once the transaction holding its row has
    # ended: the upload (or a retry, a re-run) holds the row for a moment while it stamps it as sent, just after its
    # message went out, and the sweeper while it takes it to resend; a delivery arriving then must not be dropped. So a
    # skipped job is claimed once more, alone, waiting for its row at most CLAIM_LOCK_WAIT_MS; once the row is free its
    # condition is checked again on the state just committed, so a job a concurrent delivery claimed is not taken twice.
    CLAIM_LOCK_WAIT_MS = 2000

    SET_CLAIM_LOCK_WAIT = "SELECT set_config('lock_timeout', %(lock_wait)s, true)"

    CLAIM_JOB_WAITING = (
        """
    WITH candidate AS (
        SELECT id FROM jobs
        WHERE id = %(job_id)s
          AND attempts < %(max_attempts)s
          AND (status = 'QUEUED' OR (status = 'PROCESSING' AND lease_expires_at < now()))
        FOR UPDATE
    ),"""
        + CLAIMED
    )

    def _claim_waiting(self, params: dict[str, Any]) -> list[Any] | None:
        """CLAIM_JOB_WAITING in a transaction of its own: the claimed row, none, or None when the row stayed held."""

        def claim(connection: psycopg.Connection[Any]) -> list[Any] | None:
            try:
                with connection.transaction(), connection.cursor(row_factory=namedtuple_row) as cursor:
                    cursor.execute(self.SET_CLAIM_LOCK_WAIT, {"lock_wait": f"{self.CLAIM_LOCK_WAIT_MS}ms"})
                    cursor.execute(self.CLAIM_JOB_WAITING, params)
                    return cursor.fetchall()
            except psycopg.errors.LockNotAvailable:
                return None

        return self._with_connection(claim)

    REQUEUE_JOB = """
    UPDATE jobs
    SET status = 'QUEUED', error = %(error)s, lease_token = NULL, lease_expires_at = NULL, reserved_usd = NULL,
        rate_slot_at = NULL, available_at = now() + make_interval(secs => %(delay_seconds)s), enqueued_at = NULL,
        updated_at = now()
    WHERE id = %(job_id)s AND status = 'PROCESSING' AND lease_token = %(lease_token)s
    RETURNING id
    """

    def requeue_job(self, job: ClaimedJob, error: str, *, delay_seconds: float) -> bool:
        row = self._row(
            self.REQUEUE_JOB,
            {"job_id": job.job_id, "lease_token": job.lease_token, "error": error, "delay_seconds": delay_seconds},
        )
        return row is not None

    # A page held back before its call (the rate governor, or a cost cap waiting on calls in flight): back to QUEUED
    # without using up an attempt (it never reached the model), keeping the governor's slot it reserved, if any.
    DEFER_JOB = """
    UPDATE jobs
    SET status = 'QUEUED', attempts = attempts - 1, error = %(error)s, lease_token = NULL, lease_expires_at = NULL,
        reserved_usd = NULL, rate_slot_at = CASE WHEN %(keep_slot)s THEN rate_slot_at ELSE %(slot_at)s END,
        available_at = now() + make_interval(secs => %(delay_seconds)s), enqueued_at = NULL, updated_at = now()
    WHERE id = %(job_id)s AND status = 'PROCESSING' AND lease_token = %(lease_token)s
    RETURNING id
    """

    def defer_job(
        self, job: ClaimedJob, reason: str, *, delay_seconds: float, slot_at: datetime | None, keep_slot: bool
    ) -> bool:
        row = self._row(
            self.DEFER_JOB,
            {
                "job_id": job.job_id,
                "lease_token": job.lease_token,
                "error": reason,
                "delay_seconds": delay_seconds,
                "slot_at": slot_at,
                "keep_slot": keep_slot,
            },
        )
        return row is not None

    # An expired lease proves its holder dead (the lease outlasts the invocation): the page goes back to QUEUED,
    # unsent, so the same sweep sends it again.
    REQUEUE_EXPIRED_LEASES = """
    WITH expired AS (
        SELECT id FROM jobs
        WHERE status = 'PROCESSING' AND lease_expires_at < now() AND attempts < %(max_attempts)s
        ORDER BY lease_expires_at
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    )
    UPDATE jobs
    SET status = 'QUEUED', lease_token = NULL, lease_expires_at = NULL, enqueued_at = NULL, reserved_usd = NULL,
        available_at = now(), updated_at = now(),
        error = 'the lease of attempt ' || attempts || ' expired: the worker stopped before finishing'
    WHERE id IN (SELECT id FROM expired)
    RETURNING id
    """

    def requeue_expired_leases(self, *, max_attempts: int, limit: int) -> int:
        return len(self._rows(self.REQUEUE_EXPIRED_LEASES, {"max_attempts": max_attempts, "limit": limit}))

    FAIL_EXPIRED_LEASES = """
    WITH expired AS (
        SELECT id FROM jobs
        WHERE status = 'PROCESSING' AND lease_expires_at < now() AND attempts >= %(max_attempts)s
        ORDER BY lease_expires_at
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ),
    failed AS (
        UPDATE jobs
        SET status = 'FAILED', lease_expires_at = NULL, completed_at = now(), updated_at = now(), reserved_usd = NULL,
            error = 'attempts exhausted (' || attempts || ' of ' || CAST(%(max_attempts)s AS text)
                    || '): the lease expired; the worker stopped before finishing'
        WHERE id IN (SELECT id FROM expired)
        RETURNING document_id
    ),
    counts AS (SELECT document_id, count(*) AS n FROM failed GROUP BY document_id)
    UPDATE documents
    SET pages_failed = pages_failed + counts.n, updated_at = now()
    FROM counts
    WHERE documents.id = counts.document_id
    RETURNING documents.id, documents.page_count,
              documents.pages_completed + (SELECT coalesce(sum(c.pages_completed), 0) FROM document_counts c
                                           WHERE c.document_id = documents.id) AS pages_completed,
              documents.pages_failed + (SELECT coalesce(sum(c.pages_failed), 0) FROM document_counts c
                                        WHERE c.document_id = documents.id) AS pages_failed,
              counts.n AS jobs_failed
    """

    def fail_expired_leases(self, *, max_attempts: int, limit: int) -> tuple[int, list[DocumentProgress]]:
        rows = self._rows(self.FAIL_EXPIRED_LEASES, {"max_attempts": max_attempts, "limit": limit})
        progress = [DocumentProgress(str(r.id), r.page_count, r.pages_completed, r.pages_failed) for r in rows]
        return sum(r.jobs_failed for r in rows), progress

    # Stamping enqueued_at before the send is this sweeper's hold on sending: a concurrent sweeper skips the
    # locked rows and then sees them stamped. A failed send clears the stamp again.
    TAKE_UNSENT_JOBS = """
    WITH due AS (
        SELECT id FROM jobs
        WHERE status = 'QUEUED' AND available_at <= now()
          AND (enqueued_at IS NULL OR enqueued_at < now() - make_interval(secs => %(resend_after_seconds)s))
        ORDER BY created_at, page_number
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    )
    UPDATE jobs SET enqueued_at = now(), updated_at = now()
    WHERE id IN (SELECT id FROM due)
    RETURNING id, document_id, page_number
    """

    def take_unsent_jobs(self, *, resend_after_seconds: float, limit: int) -> list[tuple[str, str, int]]:
        rows = self._rows(self.TAKE_UNSENT_JOBS, {"resend_after_seconds": resend_after_seconds, "limit": limit})
        return [(str(r.id), str(r.document_id), r.page_number) for r in rows]

    RELEASE_UNSENT_JOBS = """
    UPDATE jobs SET enqueued_at = NULL, updated_at = now()
    WHERE id = ANY(CAST(%(ids)s AS uuid[])) AND status = 'QUEUED'
    """

    def release_unsent_jobs(self, job_ids: Sequence[str]) -> None:
        if job_ids:
            self._rows(self.RELEASE_UNSENT_JOBS, {"ids": list(job_ids)})
