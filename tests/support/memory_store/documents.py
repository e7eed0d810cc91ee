"""Documents, pages and corrections, in memory (DocumentStore, PageStore, CorrectionStore)."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from pagescribe.domain import (
    AttemptRecord,
    ClaimedJob,
    CorrectionSave,
    CreatedDocument,
    DocumentListing,
    DocumentRecord,
    DocumentStatus,
    JobStatus,
    NewDocument,
    PageCorrection,
    PageImageRecord,
    PageIssue,
    PageRecord,
    PageRerunState,
    PageSummary,
    PendingDocument,
    TranscriptState,
    TranscriptVersion,
)

from tests.support.memory_store.state import TERMINAL, CorrectionRow, DocumentRow, JobRow, MemoryState

ANSWER = (
    "result_text",
    "finish_reason",
    "prompt_tokens",
    "completion_tokens",
    "cost",
    "model",
    "provider",
    "provider_request_id",
    "latency_ms",
    "confidence",
    "grounding",
)


def queued_afresh(job: JobRow, now: datetime) -> None:
    """A finished page back in the queue as new: a new round of answers, its attempts rows kept."""
    job.status, job.attempts, job.error, job.answer_round = JobStatus.QUEUED, 0, None, job.answer_round + 1
    for column in ANSWER:
        setattr(job, column, None)
    job.flags, job.lease_token, job.lease_expires_at, job.enqueued_at = [], None, None, None
    job.available_at, job.completed_at = now, None


def arm_callback(row: DocumentRow, now: datetime) -> None:
    row.callback_status = "PENDING" if row.callback_url is not None else None
    row.callback_attempts, row.callback_next_at, row.callback_error = 0, now, None


class MemoryDocuments:
    state: MemoryState

    def create_document(
        self,
        new: NewDocument,
        *,
        kind: str | None,
        pages: Sequence[int],
        source_page_count: int | None = None,
        error: str | None = None,
        pending_id: str | None = None,
        donor_id: str | None = None,
    ) -> CreatedDocument:
        with self.state.lock:
            now = self.state.now()
            if pending_id is not None:
                row = self.state.documents.get(pending_id)
                if row is None or row.status is not DocumentStatus.AWAITING_UPLOAD:
                    return CreatedDocument(pending_id, (), duplicate=True)
                row.etag, row.version_id, row.size_bytes, row.sha256 = (
                    new.etag,
                    new.version_id,
                    new.size_bytes,
                    new.sha256,
                )
            else:
                self._known(new.tenant_id)
                existing = self.find_document(new)
                if existing is not None:
                    return CreatedDocument(existing, (), duplicate=True)
                row = DocumentRow(
                    id=str(uuid.uuid4()),
                    bucket=new.bucket,
                    object_key=new.object_key,
                    etag=new.etag,
                    version_id=new.version_id,
                    size_bytes=new.size_bytes,
                    status=DocumentStatus.PROCESSING,
                    model=new.model,
                    created_at=now,
                    updated_at=now,
                    tenant_id=new.tenant_id,
                    escalation_model=new.escalation_model,
                    prompt=new.prompt,
                    sha256=new.sha256,
                    chunks=new.chunks,
                    merge_tables=new.merge_tables,
                    furniture=new.furniture,
                )
                self.state.documents[row.id] = row
            row.kind, row.source_page_count, row.error = kind, source_page_count, error
            row.page_count = 0 if error else len(pages)
            row.status = DocumentStatus.FAILED if error else DocumentStatus.PROCESSING
            row.finished_at = now if error else None
            row.updated_at = now
            if error:
                return CreatedDocument(row.id, (), duplicate=False)
            jobs = [self._new_job(row.id, page, donor_id, now) for page in pages]
            if donor_id:
                row.pages_completed, row.reused_from = len(jobs), donor_id
            return CreatedDocument(row.id, tuple(j.id for j in jobs), duplicate=False, reused=donor_id is not None)

    def _known(self, tenant_id: str) -> None:
        """A document belongs to a known tenant (the foreign key documents.tenant_id)."""
        if tenant_id not in self.state.tenants:
            raise ValueError(f"documents.tenant_id: no tenant {tenant_id!r}")

    def _new_job(self, document_id: str, page: int, donor_id: str | None, now: datetime) -> JobRow:
        job = JobRow(str(uuid.uuid4()), document_id, page, created_at=now, available_at=now)
        if donor_id:
            [donor] = [j for j in self.state.pages_of(donor_id) if j.page_number == page]
            for column in ANSWER:
                setattr(job, column, getattr(donor, column))
            job.status, job.prompt_tokens, job.completion_tokens, job.cost = JobStatus.COMPLETED, 0, 0, 0.0
            job.flags, job.escalation, job.completed_at = list(donor.flags), donor.escalation, now
            job.latency_ms = job.provider_request_id = None
        self.state.jobs[job.id] = job
        return job

    def create_pending_document(self, pending: PendingDocument) -> None:
        with self.state.lock:
            self._known(pending.tenant_id)
            if pending.document_id in self.state.documents:
                return
            now = self.state.now()
            self.state.documents[pending.document_id] = DocumentRow(
                id=pending.document_id,
                bucket=pending.bucket,
                object_key=pending.object_key,
                etag="",
                version_id="",
                size_bytes=0,
                status=DocumentStatus.AWAITING_UPLOAD,
                model=pending.model,
                created_at=now,
                updated_at=now,
                tenant_id=pending.tenant_id,
                escalation_model=pending.escalation_model,
                prompt=pending.prompt,
                filename=pending.filename,
                requested_pages=pending.requested_pages or None,
                callback_url=pending.callback_url,
                reuse=pending.reuse,
                max_cost_usd=pending.max_cost_usd,
                second_read=pending.second_read,
                chunks=pending.chunks,
                merge_tables=pending.merge_tables,
                furniture=pending.furniture,
                lane=pending.lane,
                deadline=pending.deadline,
            )

    def find_document(self, new: NewDocument) -> str | None:
        with self.state.lock:
            key = (new.bucket, new.object_key, new.etag, new.version_id)
            found = [
                d.id for d in self.state.documents.values() if (d.bucket, d.object_key, d.etag, d.version_id) == key
            ]
            return found[0] if found else None

    def find_reusable_document(self, new: NewDocument, pages: Sequence[int]) -> str | None:
        with self.state.lock:
            wanted = set(pages)
            donors = [
                d
                for d in self.state.documents.values()
                if (d.tenant_id, d.sha256, d.status, d.model)
                == (new.tenant_id, new.sha256, DocumentStatus.COMPLETED, new.model)
                and (d.escalation_model, d.prompt, d.page_count) == (new.escalation_model, new.prompt, len(pages))
                and sum(j.status is JobStatus.COMPLETED and j.page_number in wanted for j in self.state.pages_of(d.id))
                == d.page_count
            ]
            latest = max(donors, key=lambda d: d.finished_at or d.created_at, default=None)
            return latest.id if latest else None

    def mark_enqueued(self, job_ids: Sequence[str]) -> None:
        with self.state.lock:
            for job_id in job_ids:
                job = self.state.jobs.get(job_id)
                if job is not None and job.status is JobStatus.QUEUED:
                    job.enqueued_at = self.state.now()

    def get_document(self, document_id: str) -> DocumentRecord | None:
        return self.get_documents([document_id]).get(document_id)

    def get_documents(self, document_ids: Sequence[str]) -> dict[str, DocumentRecord]:
        with self.state.lock:
            rows = (self.state.documents.get(i) for i in dict.fromkeys(document_ids))
            return {row.id: self.state.document_record(row) for row in rows if row is not None}

    def list_documents(
        self, tenant_id: str, *, limit: int, before: tuple[datetime, str] | None = None
    ) -> list[DocumentListing]:
        with self.state.lock:
            rows = sorted(
                (d for d in self.state.documents.values() if d.tenant_id == tenant_id),
                key=lambda d: (d.created_at, d.id),
                reverse=True,
            )
            if before is not None:
                rows = [d for d in rows if (d.created_at, d.id) < before]
            return [self._listing(d) for d in rows[:limit]]

    def _listing(self, d: DocumentRow) -> DocumentListing:
        cost = sum(a.cost or 0 for a in self.state.attempts if a.document_id == d.id)
        flagged = sum(bool(j.flags) for j in self.state.pages_of(d.id))
        return DocumentListing(
            d.id, d.filename, d.status, d.page_count, d.pages_completed, d.pages_failed, flagged, cost, d.model,
            d.created_at, d.finished_at,
        )  # fmt: skip

    def load_pages(self, document_id: str) -> list[PageRecord]:
        with self.state.lock:
            return [self.state.page_record(j) for j in self.state.pages_of(document_id)]

    def load_attempts(self, document_id: str) -> list[AttemptRecord]:
        with self.state.lock:
            return self.state.attempt_records(document_id)

    def transcript_version(self, document_id: str) -> TranscriptVersion | None:
        with self.state.lock:
            row = self.state.documents.get(document_id)
            if row is None:
                return None
            return TranscriptVersion(row.finished_at, sum(c.document_id == document_id for c in self.state.corrections))

    def transcript_state(self, document_id: str) -> TranscriptState | None:
        with self.state.lock:
            version = self.transcript_version(document_id)
            if version is None or version.finished_at is None:
                return None
            document = self.state.document_record(self.state.documents[document_id])
            return TranscriptState(document, self.load_pages(document_id), self.load_attempts(document_id), version)

    def finish_document(
        self, document_id: str, *, status: DocumentStatus, error: str | None, transcript_key: str
    ) -> bool:
        with self.state.lock:
            row = self.state.documents.get(document_id)
            if row is None or row.finished_at is not None or row.pages_completed + row.pages_failed < row.page_count:
                return False
            now = self.state.now()
            row.status, row.error, row.transcript_key, row.finished_at, row.updated_at = (
                status, error, transcript_key, now, now,
            )  # fmt: skip
            arm_callback(row, now)
            return True

    def take_unfinished_documents(self, *, grace_seconds: float, limit: int) -> list[str]:
        with self.state.lock:
            now = self.state.now()
            stuck = sorted(
                (
                    d
                    for d in self.state.documents.values()
                    if d.finished_at is None
                    and d.status is DocumentStatus.PROCESSING
                    and d.pages_completed + d.pages_failed >= d.page_count
                    and d.updated_at < now - timedelta(seconds=grace_seconds)
                ),
                key=lambda d: d.updated_at,
            )[:limit]
            for d in stuck:
                d.updated_at = now
            return [d.id for d in stuck]

    def expire_awaiting_uploads(self, *, after_seconds: float, error: str, limit: int) -> list[str]:
        with self.state.lock:
            now = self.state.now()
            due = sorted(
                (
                    d
                    for d in self.state.documents.values()
                    if d.status is DocumentStatus.AWAITING_UPLOAD
                    and d.created_at < now - timedelta(seconds=after_seconds)
                ),
                key=lambda d: d.created_at,
            )[:limit]
            for d in due:
                d.status, d.error, d.finished_at, d.updated_at = DocumentStatus.FAILED, error, now, now
                arm_callback(d, now)
            return [d.id for d in due]


class MemoryPages:
    state: MemoryState

    def page_summary(self, document_id: str) -> list[PageSummary]:
        with self.state.lock:
            jobs = self.state.pages_of(document_id)
            counts = Counter(j.status for j in jobs)
            return [
                PageSummary(
                    status,
                    pages,
                    sum(bool(j.flags) for j in jobs if j.status is status),
                    sum(self.state.correction_of(j) is not None for j in jobs if j.status is status),
                )
                for status, pages in counts.items()
            ]

    def page_issues(self, document_id: str, *, limit: int = 1000) -> list[PageIssue]:
        with self.state.lock:
            return [
                PageIssue(j.page_number, j.status, j.attempts, j.error, list(j.flags), j.escalation is not None)
                for j in self.state.pages_of(document_id)
                if j.error is not None or j.flags
            ][:limit]

    def retry_failed_pages(self, document_id: str, *, max_retries: int) -> list[tuple[str, int]]:
        with self.state.lock:
            row = self.state.documents.get(document_id)
            if row is None or row.retries >= max_retries:
                return []
            failed = [j for j in self.state.pages_of(document_id) if j.status is JobStatus.FAILED]
            if not failed:
                return []
            now = self.state.now()
            for job in failed:
                queued_afresh(job, now)
            row.pages_failed -= len(failed)
            self._reopen(row, now)
            return [(j.id, j.page_number) for j in failed]

    def _reopen(self, row: DocumentRow, now: datetime) -> None:
        row.status, row.error, row.finished_at, row.callback_status = DocumentStatus.PROCESSING, None, None, None
        row.retries, row.updated_at = row.retries + 1, now

    def rerun_page(
        self, document_id: str, page_number: int, *, model: str | None, max_retries: int, max_page_reruns: int
    ) -> str | None:
        with self.state.lock:
            row = self.state.documents.get(document_id)
            job = self._page(document_id, page_number)
            if row is None or job is None or row.retries >= max_retries:
                return None
            if job.status not in TERMINAL or job.reruns >= max_page_reruns:
                return None
            was, now = job.status, self.state.now()
            queued_afresh(job, now)
            job.escalation, job.requested_model, job.reruns = None, model, job.reruns + 1
            if was is JobStatus.COMPLETED:
                row.pages_completed -= 1
            else:
                row.pages_failed -= 1
            self._reopen(row, now)
            return job.id

    def _page(self, document_id: str, page_number: int) -> JobRow | None:
        found = [j for j in self.state.pages_of(document_id) if j.page_number == page_number]
        return found[0] if found else None

    def page_rerun_state(self, document_id: str, page_number: int) -> PageRerunState | None:
        with self.state.lock:
            job = self._page(document_id, page_number)
            return PageRerunState(job.status, job.reruns, job.error) if job else None

    def keep_page_image(self, job: ClaimedJob, image_key: str) -> None:
        with self.state.lock:
            self.state.jobs[job.job_id].image_key = image_key

    def keep_figures(self, job: ClaimedJob, figures: list[dict[str, Any]]) -> None:
        with self.state.lock:
            self.state.jobs[job.job_id].figures = list(figures)

    def page_image(self, document_id: str, page_number: int) -> PageImageRecord | None:
        with self.state.lock:
            job = self._page(document_id, page_number)
            return PageImageRecord(job.image_key, job.status) if job else None

    def page_figures(self, document_id: str, page_number: int) -> list[dict[str, Any]] | None:
        with self.state.lock:
            job = self._page(document_id, page_number)
            return list(job.figures or ()) if job else None


class MemoryCorrections:
    state: MemoryState

    def save_correction(
        self, document_id: str, page_number: int, markdown: str, *, max_revisions: int
    ) -> CorrectionSave:
        with self.state.lock:
            row = self.state.documents.get(document_id)
            if row is None:
                return CorrectionSave(None, None)
            if row.finished_at is None:
                return CorrectionSave(row.status, None)
            revisions = max(
                (
                    c.revision
                    for c in self.state.corrections
                    if (c.document_id, c.page_number) == (document_id, page_number)
                ),
                default=0,
            )
            if revisions >= max_revisions:
                return CorrectionSave(row.status, None, revisions)
            jobs = [j for j in self.state.pages_of(document_id) if j.page_number == page_number]
            if not jobs:
                return CorrectionSave(row.status, None)
            saved = CorrectionRow(
                document_id, page_number, revisions + 1, jobs[0].answer_round, markdown, self.state.now()
            )
            self.state.corrections.append(saved)
            return CorrectionSave(row.status, PageCorrection(saved.revision, saved.markdown, saved.created_at))
