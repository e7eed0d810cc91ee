"""The batch lane, in memory (BatchStore)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from pagescribe.domain import BatchPage, ClaimedJob, JobStatus, Lane, ProviderBatch

from tests.support.memory_store.state import JobRow, MemoryState

STALE_SECONDS = 900
WAITING, SUBMITTED = "WAITING", "SUBMITTED"  # jobs.batch_state


@dataclass
class BatchRow:
    id: str
    dialect: str
    model: str
    submitted_at: datetime
    expires_at: datetime
    request_count: int
    status: str = "submitting"
    provider_batch_id: str | None = None
    input_file_id: str | None = None
    output_file_id: str | None = None
    error: str | None = None
    answered_count: int = 0
    failed_count: int = 0
    collected_at: datetime | None = None

    def record(self) -> ProviderBatch:
        return ProviderBatch(
            self.id,
            self.provider_batch_id,
            self.dialect,
            self.model,
            self.status,
            self.submitted_at,
            self.expires_at,
            self.input_file_id,
            self.output_file_id,
            self.request_count,
        )


def _page(job: JobRow, *, parked: bool) -> BatchPage:
    token = job.lease_token if parked and job.lease_token is not None else str(uuid.uuid4())
    claimed = ClaimedJob(
        job.id, job.document_id, job.page_number, job.attempts, token, job.escalation, tuple(job.flags), None,
        job.requested_model, job.lane,
    )  # fmt: skip
    return BatchPage(
        claimed, job.batch_model or "", job.image_key, dict(job.batch_evidence or {}), parked, job.batch_submissions
    )


def _in_lane(job: JobRow) -> bool:
    return job.batch_state is not None and job.status is JobStatus.PROCESSING


class MemoryBatches:
    state: MemoryState

    def _batches(self) -> dict[str, BatchRow]:
        batches: dict[str, BatchRow] = self.state.batches
        return batches

    def _leased(self, job: ClaimedJob) -> JobRow | None:
        row = self.state.jobs.get(job.job_id)
        return row if row is not None and row.leased_to(job.lease_token) else None

    def park_for_batch(
        self, job: ClaimedJob, *, model: str, image_key: str, evidence: dict[str, Any], wait_seconds: float
    ) -> bool:
        with self.state.lock:
            row = self._leased(job)
            if row is None:
                return False
            now = self.state.now()
            row.batch_state, row.batch_id, row.batch_model = WAITING, None, model
            row.image_key, row.batch_evidence, row.rate_slot_at = image_key, dict(evidence), None
            row.lease_expires_at, row.updated_at = now + timedelta(seconds=wait_seconds), now
            return True

    def _waiting(self, model: str | None = None) -> list[JobRow]:
        rows = [j for j in self.state.jobs.values() if _in_lane(j) and j.batch_state == WAITING]
        return [j for j in rows if model is None or j.batch_model == model]

    def waiting_models(self, *, limit: int) -> list[str]:
        with self.state.lock:
            return sorted({j.batch_model for j in self._waiting() if j.batch_model is not None})[:limit]

    def open_batch(
        self, *, dialect: str, model: str, limit: int, window_seconds: float, lease_seconds: float
    ) -> tuple[str, list[BatchPage]] | None:
        with self.state.lock:
            now = self.state.now()
            taken = sorted(self._waiting(model), key=lambda j: j.updated_at or now)[:limit]
            if not taken:
                return None
            batch = BatchRow(
                str(uuid.uuid4()), dialect, model, now, now + timedelta(seconds=window_seconds), len(taken)
            )
            self._batches()[batch.id] = batch
            for job in taken:
                job.batch_state, job.batch_id, job.updated_at = SUBMITTED, batch.id, now
                job.batch_submissions += 1
                job.lease_expires_at = now + timedelta(seconds=lease_seconds)
            return batch.id, sorted((_page(job, parked=True) for job in taken), key=lambda page: page.job.job_id)

    def batch_sent(self, batch_id: str, *, provider_batch_id: str, input_file_id: str | None, status: str) -> None:
        with self.state.lock:
            batch = self._batches()[batch_id]
            batch.provider_batch_id, batch.input_file_id, batch.status = provider_batch_id, input_file_id, status

    def batch_not_sent(self, batch_id: str, error: str) -> None:
        with self.state.lock:
            for job in self.state.jobs.values():
                if job.batch_id == batch_id and _in_lane(job) and job.batch_state == SUBMITTED:
                    job.batch_state, job.batch_id, job.updated_at = WAITING, None, self.state.now()
                    job.batch_submissions -= 1
            batch = self._batches()[batch_id]
            batch.status, batch.error, batch.collected_at = "not_sent", error[:1000], self.state.now()

    def open_batches(self, *, limit: int) -> list[ProviderBatch]:
        with self.state.lock:
            stale = self.state.now() - timedelta(seconds=STALE_SECONDS)
            rows = [
                b
                for b in self._batches().values()
                if b.collected_at is None and (b.provider_batch_id is not None or b.submitted_at < stale)
            ]
            return [b.record() for b in sorted(rows, key=lambda b: b.submitted_at)[:limit]]

    def note_batch(self, batch_id: str, *, status: str, output_file_id: str | None) -> None:
        with self.state.lock:
            batch = self._batches()[batch_id]
            batch.status, batch.output_file_id = status, output_file_id

    def batch_pages(self, batch_id: str) -> list[BatchPage]:
        with self.state.lock:
            sent = [j for j in self.state.jobs.values() if j.batch_id == batch_id]
            return [_page(j, parked=j.status is JobStatus.PROCESSING and j.batch_state == SUBMITTED) for j in sent]

    def close_batch(self, batch_id: str, *, status: str, answered: int, failed: int) -> bool:
        with self.state.lock:
            batch = self._batches()[batch_id]
            if batch.collected_at is not None:
                return False
            batch.status, batch.answered_count, batch.failed_count = status, answered, failed
            batch.collected_at = self.state.now()
            return True

    def back_to_waiting(self, job: ClaimedJob) -> bool:
        with self.state.lock:
            row = self._leased(job)
            if row is None:
                return False
            row.batch_state, row.batch_id, row.updated_at = WAITING, None, self.state.now()
            return True

    def move_to_sync(self, job: ClaimedJob, reason: str) -> bool:
        with self.state.lock:
            row = self._leased(job)
            if row is None:
                return False
            now = self.state.now()
            row.status, row.lane, row.batch_state, row.error = JobStatus.QUEUED, Lane.SYNC, None, reason[:1000]
            row.lease_token = None
            row.lease_expires_at = row.reserved_usd = row.rate_slot_at = row.enqueued_at = None
            row.available_at = row.updated_at = now
            return True

    def due_for_sync(self, *, within_seconds: float, limit: int) -> list[BatchPage]:
        with self.state.lock:
            by = self.state.now() + timedelta(seconds=within_seconds)
            due = []
            for job in self.state.jobs.values():
                deadline = self.state.documents[job.document_id].deadline
                if _in_lane(job) and deadline is not None and deadline < by:
                    due.append((deadline, job))
            due.sort(key=lambda item: item[0])
            return [_page(job, parked=True) for _, job in due[:limit]]

    def batch_pages_waiting(self, document_id: str | None = None) -> int:
        with self.state.lock:
            jobs = self.state.jobs.values()
            return sum(1 for j in jobs if _in_lane(j) and (document_id is None or j.document_id == document_id))
