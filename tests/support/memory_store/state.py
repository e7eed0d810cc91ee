"""The in-memory store's rows and clock: one ``MemoryState`` shared by every port of a ``MemoryStore``."""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from types import SimpleNamespace
from typing import Any

from pagescribe.domain import (
    DEFAULT_TENANT,
    AttemptRecord,
    DocumentProgress,
    DocumentRecord,
    DocumentStatus,
    JobStatus,
    PageRecord,
)
from pagescribe.store.postgres import rows

TERMINAL = (JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.SKIPPED)


@dataclass
class DocumentRow:
    id: str
    bucket: str
    object_key: str
    etag: str
    version_id: str
    size_bytes: int
    status: DocumentStatus
    model: str
    created_at: datetime
    updated_at: datetime
    tenant_id: str = DEFAULT_TENANT
    kind: str | None = None
    page_count: int = 0
    source_page_count: int | None = None
    error: str | None = None
    escalation_model: str | None = None
    prompt: str | None = None
    sha256: bytes | None = None
    filename: str | None = None
    requested_pages: tuple[int, ...] | None = None
    callback_url: str | None = None
    callback_status: str | None = None
    callback_attempts: int = 0
    callback_next_at: datetime | None = None
    callback_error: str | None = None
    pages_completed: int = 0
    pages_failed: int = 0
    transcript_key: str | None = None
    finished_at: datetime | None = None
    retries: int = 0
    reuse: bool = True
    reused_from: str | None = None
    max_cost_usd: float | None = None
    second_read: str | None = None
    chunks: bool = False
    merge_tables: bool = True
    furniture: str = "mark"
    lane: str | None = None
    deadline: datetime | None = None

    def progress(self) -> DocumentProgress:
        return DocumentProgress(self.id, self.page_count, self.pages_completed, self.pages_failed)


@dataclass
class JobRow:
    id: str
    document_id: str
    page_number: int
    created_at: datetime
    available_at: datetime
    status: JobStatus = JobStatus.QUEUED
    attempts: int = 0
    lease_token: str | None = None
    lease_expires_at: datetime | None = None
    enqueued_at: datetime | None = None
    started_at: datetime | None = None
    completed_at: datetime | None = None
    error: str | None = None
    result_text: str | None = None
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cost: float | None = None
    model: str | None = None
    provider: str | None = None
    provider_request_id: str | None = None
    latency_ms: int | None = None
    confidence: float | None = None
    grounding: dict[str, Any] | None = None
    flags: list[dict[str, Any]] = field(default_factory=list)
    escalation: str | None = None
    rate_slot_at: datetime | None = None
    reserved_usd: float | None = None
    requested_model: str | None = None
    reruns: int = 0
    answer_round: int = 0
    image_key: str | None = None
    figures: list[dict[str, Any]] | None = None
    lane: str | None = None
    batch_state: str | None = None
    batch_id: str | None = None
    batch_model: str | None = None
    batch_evidence: dict[str, Any] | None = None
    batch_submissions: int = 0
    updated_at: datetime | None = None

    def leased_to(self, lease_token: str) -> bool:
        return self.status is JobStatus.PROCESSING and self.lease_token == lease_token


@dataclass
class AttemptRow:
    id: int
    job_id: str
    document_id: str
    claim: int
    outcome: str
    model: str | None
    provider: str | None
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cost: float | None = None
    latency_ms: int | None = None
    provider_request_id: str | None = None
    flags: list[dict[str, Any]] = field(default_factory=list)
    confidence: float | None = None
    status_code: int | None = None
    error: str | None = None
    second_read: dict[str, Any] | None = None
    cost_estimated: bool = False
    tile: str | None = None


@dataclass
class TenantRow:
    id: str
    daily_budget_usd: float | None = None
    callback_secret: str | None = None


@dataclass
class KeyRow:
    id: str
    tenant_id: str
    key_hash: bytes
    label: str
    created_at: datetime
    revoked_at: datetime | None = None


@dataclass
class CorrectionRow:
    document_id: str
    page_number: int
    revision: int
    answer_round: int
    markdown: str
    created_at: datetime


@dataclass
class BucketRow:
    requests: float
    tokens: float
    refilled_at: datetime
    mean_tokens: float | None = None
    paused_until: datetime | None = None


@dataclass
class DayRow:
    spent_usd: float = 0.0
    calls: int = 0


class Clock:
    """The store's ``now()``: the real time, moved on by hand where a test needs time to pass."""

    def __init__(self) -> None:
        self.offset = timedelta()

    def now(self) -> datetime:
        return datetime.now(UTC) + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += timedelta(seconds=seconds)

    def today(self) -> date:
        return self.now().date()


class MemoryState:
    """Every table as a dict, behind one lock: a port's method is one transaction."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.clock = Clock()
        self.documents: dict[str, DocumentRow] = {}
        self.jobs: dict[str, JobRow] = {}
        self.attempts: list[AttemptRow] = []
        self.tenants: dict[str, TenantRow] = {DEFAULT_TENANT: TenantRow(DEFAULT_TENANT)}
        self.keys: dict[str, KeyRow] = {}
        self.corrections: list[CorrectionRow] = []
        self.buckets: dict[tuple[str, str], BucketRow] = {}
        self.days: dict[tuple[str, date], DayRow] = {}
        self.answers: dict[tuple[str, str], tuple[bytes, dict[str, Any]]] = {}
        self.attempt_ids = itertools.count(1)
        self.batches: dict[str, Any] = {}  # provider_batches, by id (memory_store.batches.BatchRow)

    def now(self) -> datetime:
        return self.clock.now()

    def pages_of(self, document_id: str) -> list[JobRow]:
        return sorted((j for j in self.jobs.values() if j.document_id == document_id), key=lambda j: j.page_number)

    def day(self, tenant_id: str) -> DayRow:
        return self.days.setdefault((tenant_id, self.clock.today()), DayRow())

    def document_record(self, row: DocumentRow) -> DocumentRecord:
        """The record PostgreSQL's store reads for the row (the same mapping, on the same columns)."""
        tenant = self.tenants.get(row.tenant_id)
        budget = tenant.daily_budget_usd if tenant else None
        return rows.document_record(SimpleNamespace(**vars(row), tenant_daily_budget_usd=budget))

    def correction_of(self, job: JobRow) -> CorrectionRow | None:
        """The latest correction made on the page's latest round of answers."""
        made = [
            c
            for c in self.corrections
            if (c.document_id, c.page_number, c.answer_round) == (job.document_id, job.page_number, job.answer_round)
        ]
        return max(made, key=lambda c: c.revision, default=None)

    def page_record(self, job: JobRow) -> PageRecord:
        correction = self.correction_of(job)
        [record] = rows.page_records(
            [
                SimpleNamespace(
                    **vars(job),
                    corrected_revision=correction.revision if correction else None,
                    corrected_markdown=correction.markdown if correction else None,
                    corrected_at=correction.created_at if correction else None,
                )
            ]
        )
        return record

    def attempt_records(self, document_id: str) -> list[AttemptRecord]:
        made = sorted(
            (a for a in self.attempts if a.document_id == document_id),
            key=lambda a: (self.jobs[a.job_id].page_number, a.id),
        )
        return rows.attempt_records(
            [SimpleNamespace(**vars(a), page_number=self.jobs[a.job_id].page_number) for a in made]
        )
