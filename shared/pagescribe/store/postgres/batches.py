"""The batch lane: pages parked under their lease to be sent in a provider's batch, the batches sent, and the pages
moved out of the lane to be called one by one."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from psycopg.types.json import Jsonb

from pagescribe.domain import BatchPage, ClaimedJob, ProviderBatch
from pagescribe.store.postgres.connection import Connected
from pagescribe.store.postgres.rows import claimed_job


def batch_pages(rows: Sequence[Any]) -> list[BatchPage]:
    return [
        BatchPage(
            claimed_job(r),
            r.batch_model,
            r.image_key,
            dict(r.batch_evidence or {}),
            r.parked,
            r.batch_submissions,
        )
        for r in rows
    ]


def provider_batches(rows: Sequence[Any]) -> list[ProviderBatch]:
    return [
        ProviderBatch(
            str(r.id),
            r.provider_batch_id,
            r.dialect,
            r.model,
            r.status,
            r.submitted_at,
            r.expires_at,
            r.input_file_id,
            r.output_file_id,
            r.request_count,
        )
        for r in rows
    ]


class PgBatches(Connected):
    """The batch lane's pages and batches. A page of the lane stays PROCESSING under the lease of the claim that
    rendered it, so that its batch's answer is written by the same fenced writes as a call's (COMPLETE_JOB, FAIL_JOB,
    ESCALATE_JOB); ``batch_state`` says where it waits. A page that leaves the lane (moved to sync, or its lease
    taken over) is no longer ``parked``: its batch's answer, if one comes, is recorded with its cost and not kept."""

    # The page's render done and its image kept: it waits for a batch, under its lease, until its batch's window and a
    # margin have passed (then the sweeper takes its lease over like any expired one: no page is lost).
    PARK_FOR_BATCH = """
    UPDATE jobs
    SET batch_state = 'WAITING', batch_id = NULL, batch_model = %(model)s, image_key = %(image_key)s,
        batch_evidence = %(evidence)s, rate_slot_at = NULL,
        lease_expires_at = now() + make_interval(secs => %(wait_seconds)s), updated_at = now()
    WHERE id = %(job_id)s AND status = 'PROCESSING' AND lease_token = %(lease_token)s
    RETURNING id
    """

    def park_for_batch(
        self, job: ClaimedJob, *, model: str, image_key: str, evidence: dict[str, Any], wait_seconds: float
    ) -> bool:
        params = {
            "job_id": job.job_id,
            "lease_token": job.lease_token,
            "model": model,
            "image_key": image_key,
            "evidence": Jsonb(evidence),
            "wait_seconds": wait_seconds,
        }
        return self._row(self.PARK_FOR_BATCH, params) is not None

    WAITING_MODELS = """
    SELECT DISTINCT batch_model FROM jobs
    WHERE batch_state = 'WAITING' AND status = 'PROCESSING'
    LIMIT %(limit)s
    """

    def waiting_models(self, *, limit: int) -> list[str]:
        return [row.batch_model for row in self._rows(self.WAITING_MODELS, {"limit": limit})]

    # A batch opened with up to ``limit`` of the model's waiting pages, oldest first, in one statement: the batch's row
    # (none when no page waits) and its pages, SUBMITTED in it, their leases renewed for ``lease_seconds`` (the
    # batch's window and a margin). Concurrent sweepers take different pages.
    OPEN_BATCH = """
    WITH taken AS (
        SELECT id FROM jobs
        WHERE batch_state = 'WAITING' AND status = 'PROCESSING' AND batch_model = %(model)s
        ORDER BY updated_at
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ),
    opened AS (
        INSERT INTO provider_batches (id, dialect, model, expires_at, request_count)
        SELECT %(batch_id)s, %(dialect)s, %(model)s, now() + make_interval(secs => %(window_seconds)s), count(*)
        FROM taken HAVING count(*) > 0
        RETURNING id
    )
    UPDATE jobs
    SET batch_state = 'SUBMITTED', batch_id = (SELECT id FROM opened), batch_submissions = batch_submissions + 1,
        lease_expires_at = now() + make_interval(secs => %(lease_seconds)s), updated_at = now()
    WHERE id IN (SELECT id FROM taken) AND EXISTS (SELECT 1 FROM opened)
    RETURNING id, document_id, page_number, attempts, lease_token, escalation, flags, requested_model, lane,
              batch_model, image_key, batch_evidence, true AS parked, batch_submissions
    """

    def open_batch(
        self, *, dialect: str, model: str, limit: int, window_seconds: float, lease_seconds: float
    ) -> tuple[str, list[BatchPage]] | None:
        batch_id = str(uuid.uuid4())
        params = {
            "batch_id": batch_id,
            "dialect": dialect,
            "model": model,
            "limit": limit,
            "window_seconds": window_seconds,
            "lease_seconds": lease_seconds,
        }
        pages = batch_pages(self._rows(self.OPEN_BATCH, params))
        return (batch_id, sorted(pages, key=lambda page: page.job.job_id)) if pages else None

    BATCH_SENT = """
    UPDATE provider_batches
    SET provider_batch_id = %(provider_batch_id)s, input_file_id = %(input_file_id)s, status = %(status)s,
        updated_at = now()
    WHERE id = %(batch_id)s
    """

    def batch_sent(self, batch_id: str, *, provider_batch_id: str, input_file_id: str | None, status: str) -> None:
        params = {
            "batch_id": batch_id,
            "provider_batch_id": provider_batch_id,
            "input_file_id": input_file_id,
            "status": status,
        }
        self._rows(self.BATCH_SENT, params)

    # A batch the provider did not take: its pages wait again (the submission not counted), the batch is closed.
    BATCH_NOT_SENT = """
    WITH back AS (
        UPDATE jobs
        SET batch_state = 'WAITING', batch_id = NULL, batch_submissions = batch_submissions - 1, updated_at = now()
        WHERE batch_id = %(batch_id)s AND batch_state = 'SUBMITTED' AND status = 'PROCESSING'
    )
    UPDATE provider_batches
    SET status = 'not_sent', error = %(error)s, collected_at = now(), updated_at = now()
    WHERE id = %(batch_id)s
    """

    def batch_not_sent(self, batch_id: str, error: str) -> None:
        self._rows(self.BATCH_NOT_SENT, {"batch_id": batch_id, "error": error[:1000]})

    # The batches whose answers are not collected yet, oldest first; a batch left without a provider id (its sweeper
    # died between opening and sending it) shows once it is STALE_SECONDS old, to be given up.
    STALE_SECONDS = 900

    OPEN_BATCHES = """
    SELECT id, provider_batch_id, dialect, model, status, submitted_at, expires_at, input_file_id, output_file_id,
           request_count
    FROM provider_batches
    WHERE collected_at IS NULL
      AND (provider_batch_id IS NOT NULL OR submitted_at < now() - make_interval(secs => %(stale_seconds)s))
    ORDER BY submitted_at
    LIMIT %(limit)s
    """

    def open_batches(self, *, limit: int) -> list[ProviderBatch]:
        return provider_batches(self._rows(self.OPEN_BATCHES, {"limit": limit, "stale_seconds": self.STALE_SECONDS}))

    NOTE_BATCH = """
    UPDATE provider_batches SET status = %(status)s, output_file_id = %(output_file_id)s, updated_at = now()
    WHERE id = %(batch_id)s
    """

    def note_batch(self, batch_id: str, *, status: str, output_file_id: str | None) -> None:
        self._rows(self.NOTE_BATCH, {"batch_id": batch_id, "status": status, "output_file_id": output_file_id})

    # Every page ever sent in the batch: ``parked`` while it still waits in it under the lease it was parked with (its
    # answer may be written); any other carries a token no lease has, so that a fenced write of its answer records the
    # call (LEASE_LOST, with its cost) and writes nothing.
    BATCH_PAGES = """
    SELECT id, document_id, page_number, attempts,
           CASE WHEN parked THEN lease_token ELSE gen_random_uuid() END AS lease_token,
           escalation, flags, requested_model, lane, batch_model, image_key, batch_evidence, parked, batch_submissions
    FROM (SELECT *, (status = 'PROCESSING' AND batch_state = 'SUBMITTED') AS parked
          FROM jobs WHERE batch_id = %(batch_id)s) AS sent
    """

    def batch_pages(self, batch_id: str) -> list[BatchPage]:
        return batch_pages(self._rows(self.BATCH_PAGES, {"batch_id": batch_id}))

    CLOSE_BATCH = """
    UPDATE provider_batches
    SET status = %(status)s, answered_count = %(answered)s, failed_count = %(failed)s, collected_at = now(),
        updated_at = now()
    WHERE id = %(batch_id)s AND collected_at IS NULL
    RETURNING id
    """

    def close_batch(self, batch_id: str, *, status: str, answered: int, failed: int) -> bool:
        params = {"batch_id": batch_id, "status": status, "answered": answered, "failed": failed}
        return self._row(self.CLOSE_BATCH, params) is not None

    # A page its batch did not answer (missing from its results, or its batch failed or expired) waits for the next.
    BACK_TO_WAITING = """
    UPDATE jobs SET batch_state = 'WAITING', batch_id = NULL, updated_at = now()
    WHERE id = %(job_id)s AND status = 'PROCESSING' AND lease_token = %(lease_token)s
    RETURNING id
    """

    def back_to_waiting(self, job: ClaimedJob) -> bool:
        return self._row(self.BACK_TO_WAITING, {"job_id": job.job_id, "lease_token": job.lease_token}) is not None

    # Out of the batch lane, for good: QUEUED again (its message to be sent after this commit), to be called on its own.
    # It keeps its batch_id, so that its batch's answer, if one comes, is recorded and not kept.
    MOVE_TO_SYNC = """
    UPDATE jobs
    SET status = 'QUEUED', lane = 'sync', batch_state = NULL, error = %(reason)s, lease_token = NULL,
        lease_expires_at = NULL, reserved_usd = NULL, rate_slot_at = NULL, available_at = now(), enqueued_at = NULL,
        updated_at = now()
    WHERE id = %(job_id)s AND status = 'PROCESSING' AND lease_token = %(lease_token)s
    RETURNING id
    """

    def move_to_sync(self, job: ClaimedJob, reason: str) -> bool:
        params = {"job_id": job.job_id, "lease_token": job.lease_token, "reason": reason[:1000]}
        return self._row(self.MOVE_TO_SYNC, params) is not None

    # The pages of the lane (waiting or sent) whose document's deadline comes within ``within_seconds``: the batch may
    # not answer in time, so they are to be called on their own. ix_jobs_batch keeps this to the lane's pages.
    DUE_FOR_SYNC = """
    SELECT j.id, j.document_id, j.page_number, j.attempts, j.lease_token, j.escalation, j.flags, j.requested_model,
           j.lane, j.batch_model, j.image_key, j.batch_evidence, true AS parked, j.batch_submissions
    FROM jobs j JOIN documents d ON d.id = j.document_id
    WHERE j.batch_state IS NOT NULL AND j.status = 'PROCESSING'
      AND d.deadline < now() + make_interval(secs => %(within_seconds)s)
    ORDER BY d.deadline
    LIMIT %(limit)s
    """

    def due_for_sync(self, *, within_seconds: float, limit: int) -> list[BatchPage]:
        return batch_pages(self._rows(self.DUE_FOR_SYNC, {"within_seconds": within_seconds, "limit": limit}))

    BATCH_PAGES_WAITING = """
    SELECT count(*) AS pages FROM jobs
    WHERE batch_state IS NOT NULL AND status = 'PROCESSING'
      AND (CAST(%(document_id)s AS uuid) IS NULL OR document_id = CAST(%(document_id)s AS uuid))
    """

    def batch_pages_waiting(self, document_id: str | None = None) -> int:
        row = self._row(self.BATCH_PAGES_WAITING, {"document_id": document_id})
        assert row is not None, "an aggregate always returns a row"
        return int(row.pages)
