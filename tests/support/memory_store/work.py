"""Claims, leases and the ledger, in memory (ClaimStore, Ledger)."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Sequence
from datetime import datetime, timedelta

from pagescribe.domain import (
    NO_OUTCOME,
    AttemptOutcome,
    ClaimedJob,
    Claims,
    DocumentProgress,
    EscalationState,
    FailedCall,
    JobStatus,
    PageEnd,
    PageOutcome,
    Spend,
    recorded_as,
)

from tests.support.memory_store.state import AttemptRow, JobRow, MemoryState


class MemoryClaims:
    state: MemoryState

    def claim_jobs(self, job_ids: Sequence[str], *, lease_seconds: float, max_attempts: int) -> Claims:
        with self.state.lock:
            now, token = self.state.now(), str(uuid.uuid4())
            claimed = {}
            for job_id in dict.fromkeys(job_ids):
                job = self.state.jobs.get(job_id)
                if job is None or job.attempts >= max_attempts or not _claimable(job, now):
                    continue
                job.status, job.attempts, job.lease_token = JobStatus.PROCESSING, job.attempts + 1, token
                job.lease_expires_at, job.reserved_usd, job.started_at = (
                    now + timedelta(seconds=lease_seconds),
                    None,
                    now,
                )
                slot = (job.rate_slot_at - now).total_seconds() if job.rate_slot_at is not None else None
                claimed[job_id] = ClaimedJob(
                    job.id, job.document_id, job.page_number, job.attempts, token, job.escalation, tuple(job.flags),
                    slot, job.requested_model, job.lane,
                )  # fmt: skip
            documents = {
                job.document_id: self.state.document_record(self.state.documents[job.document_id])
                for job in claimed.values()
                if job.document_id in self.state.documents
            }
            return Claims(claimed, frozenset(), documents)  # no row is ever held past a statement here: nothing is busy

    def requeue_job(self, job: ClaimedJob, error: str, *, delay_seconds: float) -> bool:
        with self.state.lock:
            row = self.state.jobs.get(job.job_id)
            if row is None or not row.leased_to(job.lease_token):
                return False
            _back_to_queue(row, error, self.state.now() + timedelta(seconds=delay_seconds))
            row.rate_slot_at = None
            return True

    def defer_job(
        self, job: ClaimedJob, reason: str, *, delay_seconds: float, slot_at: datetime | None, keep_slot: bool
    ) -> bool:
        with self.state.lock:
            row = self.state.jobs.get(job.job_id)
            if row is None or not row.leased_to(job.lease_token):
                return False
            _back_to_queue(row, reason, self.state.now() + timedelta(seconds=delay_seconds))
            row.attempts -= 1
            row.rate_slot_at = row.rate_slot_at if keep_slot else slot_at
            return True

    def _expired(self, *, spent: bool, max_attempts: int, limit: int) -> list[JobRow]:
        now = self.state.now()
        expired = [
            j
            for j in self.state.jobs.values()
            if j.status is JobStatus.PROCESSING
            and j.lease_expires_at is not None
            and j.lease_expires_at < now
            and (j.attempts >= max_attempts) == spent
        ]
        return sorted(expired, key=lambda j: j.lease_expires_at or now)[:limit]

    def requeue_expired_leases(self, *, max_attempts: int, limit: int) -> int:
        with self.state.lock:
            expired = self._expired(spent=False, max_attempts=max_attempts, limit=limit)
            for job in expired:
                error = f"the lease of attempt {job.attempts} expired: the worker stopped before finishing"
                _back_to_queue(job, error, self.state.now())
            return len(expired)

    def fail_expired_leases(self, *, max_attempts: int, limit: int) -> tuple[int, list[DocumentProgress]]:
        with self.state.lock:
            expired = self._expired(spent=True, max_attempts=max_attempts, limit=limit)
            now = self.state.now()
            for job in expired:
                job.status, job.lease_expires_at, job.completed_at, job.reserved_usd = JobStatus.FAILED, None, now, None
                job.error = (
                    f"attempts exhausted ({job.attempts} of {max_attempts}): the lease expired; the worker stopped "
                    "before finishing"
                )
            counts = Counter(job.document_id for job in expired)
            progress = []
            for document_id, failed in counts.items():
                document = self.state.documents[document_id]
                document.pages_failed += failed
                document.updated_at = now
                progress.append(document.progress())
            return len(expired), progress

    def take_unsent_jobs(self, *, resend_after_seconds: float, limit: int) -> list[tuple[str, str, int]]:
        with self.state.lock:
            now = self.state.now()
            resend_before = now - timedelta(seconds=resend_after_seconds)
            due = sorted(
                (
                    j
                    for j in self.state.jobs.values()
                    if j.status is JobStatus.QUEUED
                    and j.available_at <= now
                    and (j.enqueued_at is None or j.enqueued_at < resend_before)
                ),
                key=lambda j: (j.created_at, j.page_number),
            )[:limit]
            for job in due:
                job.enqueued_at = now
            return [(j.id, j.document_id, j.page_number) for j in due]

    def release_unsent_jobs(self, job_ids: Sequence[str]) -> None:
        with self.state.lock:
            for job_id in job_ids:
                job = self.state.jobs.get(job_id)
                if job is not None and job.status is JobStatus.QUEUED:
                    job.enqueued_at = None


def _claimable(job: JobRow, now: datetime) -> bool:
    if job.status is JobStatus.QUEUED:
        return True
    return job.status is JobStatus.PROCESSING and job.lease_expires_at is not None and job.lease_expires_at < now


def _back_to_queue(job: JobRow, error: str, available_at: datetime) -> None:
    job.status, job.error, job.lease_token, job.lease_expires_at = JobStatus.QUEUED, error, None, None
    job.reserved_usd, job.available_at, job.enqueued_at = None, available_at, None


class MemoryLedger:
    state: MemoryState

    def complete_job(
        self, job: ClaimedJob, outcome: PageOutcome, *, image_key: str | None = None
    ) -> DocumentProgress | None:
        return self._end(job, outcome, (JobStatus.COMPLETED, None, image_key), AttemptOutcome.KEPT)

    def complete_jobs(self, ends: Sequence[PageEnd]) -> list[DocumentProgress | None]:
        documents = sorted({end.job.document_id for end in ends})
        if len(documents) > 1:
            raise ValueError(f"pages written together are of one document, not of {len(documents)}: {documents}")
        with self.state.lock:  # one transaction (the lock is re-entrant)
            return [self.complete_job(end.job, end.outcome, image_key=end.image_key) for end in ends]

    def fail_job(
        self, job: ClaimedJob, error: str, outcome: PageOutcome = NO_OUTCOME, *, image_key: str | None = None
    ) -> DocumentProgress | None:
        return self._end(job, outcome, (JobStatus.FAILED, error, image_key), AttemptOutcome.REJECTED)

    def _end(
        self,
        job: ClaimedJob,
        outcome: PageOutcome,
        end: tuple[JobStatus, str | None, str | None],
        recorded_as: AttemptOutcome,
    ) -> DocumentProgress | None:
        """The page's end (its status, error and image) written under its lease, as COMPLETE_JOB and FAIL_JOB."""
        status, error, image_key = end
        with self.state.lock:
            row = self.state.jobs.get(job.job_id)
            written = row is not None and row.leased_to(job.lease_token)
            self._record(job, outcome, recorded_as if written else None)
            if row is None or not written:
                return None
            answered = outcome.text is not None
            flags = list(outcome.page_flags if outcome.page_flags is not None else outcome.flags)
            if answered:
                _write_answer(row, outcome)
            row.flags = flags if answered else row.flags + flags
            row.status, row.error = status, error
            row.image_key = image_key or row.image_key
            row.escalation = EscalationState.DONE if row.escalation is not None else None
            row.rate_slot_at = row.reserved_usd = row.lease_expires_at = None
            row.completed_at = self.state.now()
            return self._count(row.document_id, completed=status is JobStatus.COMPLETED)

    def _count(self, document_id: str, *, completed: bool) -> DocumentProgress | None:
        document = self.state.documents.get(document_id)
        if document is None:
            return None
        if completed:
            document.pages_completed += 1
        else:
            document.pages_failed += 1
        document.updated_at = self.state.now()
        return document.progress()

    def _record(self, job: ClaimedJob, outcome: PageOutcome, written: AttemptOutcome | None) -> None:
        """The call that produced ``outcome``, recorded whether or not its write held (LEASE_LOST when not)."""
        if not outcome.called:
            return
        self.state.attempts.append(
            AttemptRow(
                id=next(self.state.attempt_ids),
                job_id=job.job_id,
                document_id=job.document_id,
                claim=job.attempts,
                outcome=recorded_as(outcome, written).value if written is not None else AttemptOutcome.LEASE_LOST.value,
                model=outcome.model,
                provider=outcome.provider,
                finish_reason=outcome.finish_reason,
                prompt_tokens=outcome.prompt_tokens,
                completion_tokens=outcome.completion_tokens,
                cost=outcome.cost,
                cost_estimated=outcome.cost_estimated,
                latency_ms=outcome.latency_ms,
                provider_request_id=outcome.provider_request_id,
                flags=list(outcome.flags),
                confidence=outcome.confidence,
                second_read=outcome.second_read,
            )
        )
        self._count_call(job.document_id, outcome.cost or 0.0)

    def _count_call(self, document_id: str, cost: float) -> None:
        document = self.state.documents.get(document_id)
        if document is not None:
            day = self.state.day(document.tenant_id)
            day.spent_usd, day.calls = day.spent_usd + cost, day.calls + 1

    def escalate_job(self, job: ClaimedJob, outcome: PageOutcome) -> bool:
        with self.state.lock:
            row = self.state.jobs.get(job.job_id)
            written = row is not None and row.leased_to(job.lease_token) and row.escalation is None
            self._record(job, outcome, AttemptOutcome.ESCALATED if written else None)
            if row is None or not written:
                return False
            _write_answer(row, outcome)
            row.escalation = EscalationState.PENDING
            row.flags = list(outcome.page_flags if outcome.page_flags is not None else outcome.flags)
            return True

    def skip_job(self, job: ClaimedJob, reason: str) -> DocumentProgress | None:
        with self.state.lock:
            row = self.state.jobs.get(job.job_id)
            if row is None or not row.leased_to(job.lease_token):
                return None
            row.status, row.error, row.rate_slot_at, row.reserved_usd = JobStatus.SKIPPED, reason, None, None
            row.escalation = EscalationState.DONE if row.escalation is not None else None
            row.lease_expires_at, row.completed_at = None, self.state.now()
            return self._count(row.document_id, completed=False)

    def record_failed_call(self, job: ClaimedJob, failed: FailedCall) -> None:
        with self.state.lock:
            self.state.attempts.append(
                AttemptRow(
                    id=next(self.state.attempt_ids),
                    job_id=job.job_id,
                    document_id=job.document_id,
                    claim=job.attempts,
                    outcome=(AttemptOutcome.RATE_LIMITED if failed.status_code == 429 else AttemptOutcome.ERROR).value,
                    model=failed.model,
                    provider=failed.provider,
                    latency_ms=failed.latency_ms,
                    status_code=failed.status_code,
                    error=failed.error[:1000],
                )
            )
            self._count_call(job.document_id, 0.0)

    def record_call(
        self, job: ClaimedJob, outcome: PageOutcome, recorded_as: AttemptOutcome, *, tile: str | None = None
    ) -> None:
        with self.state.lock:
            self._record(job, outcome._replace(called=True, second_read=None), recorded_as)
            self.state.attempts[-1].tile = tile

    def spend(self, document_id: str) -> Spend:
        with self.state.lock:
            calls = [a for a in self.state.attempts if a.document_id == document_id]
            return Spend(
                len(calls),
                sum(a.prompt_tokens or 0 for a in calls),
                sum(a.completion_tokens or 0 for a in calls),
                sum(a.cost or 0 for a in calls),
                sum(a.outcome == AttemptOutcome.TILE for a in calls),
                len({a.job_id for a in calls if a.outcome == AttemptOutcome.TILE}),
            )


def _write_answer(row: JobRow, outcome: PageOutcome) -> None:
    row.result_text, row.finish_reason = outcome.text, outcome.finish_reason
    row.prompt_tokens, row.completion_tokens, row.cost = outcome.prompt_tokens, outcome.completion_tokens, outcome.cost
    row.model, row.provider, row.provider_request_id = outcome.model, outcome.provider, outcome.provider_request_id
    row.latency_ms, row.confidence, row.grounding = outcome.latency_ms, outcome.confidence, outcome.grounding
