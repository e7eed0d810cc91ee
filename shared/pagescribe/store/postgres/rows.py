"""Rows into the domain's records: the mappings more than one store reads with."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

from pagescribe.domain import (
    AttemptRecord,
    ClaimedJob,
    Claims,
    DocumentProgress,
    DocumentRecord,
    DocumentStatus,
    JobStatus,
    PageCorrection,
    PageRecord,
)


def float_or_none(value: Any) -> float | None:
    return float(value) if value is not None else None


def progress_of(row: Any | None) -> DocumentProgress | None:
    if row is None:
        return None
    return DocumentProgress(str(row.id), row.page_count, row.pages_completed, row.pages_failed)


def claimed_job(row: Any, slot_in_seconds: float | None = None) -> ClaimedJob:
    """A claimed job from a row of the jobs table's columns (``id``, ``lane`` and the others of ClaimedJob)."""
    return ClaimedJob(
        str(row.id),
        str(row.document_id),
        row.page_number,
        row.attempts,
        str(row.lease_token),
        row.escalation,
        tuple(row.flags),
        slot_in_seconds,
        row.requested_model,
        row.lane,
    )


def claims_with_documents(rows: Sequence[Any], busy: frozenset[str]) -> Claims:
    """A claim's rows (PgClaims.CLAIMED: each job, with its document's columns prefixed document_) as Claims; a job
    whose document is gone has no record in ``documents``."""
    claimed = {str(r.id): claimed_job(r, float_or_none(r.slot_in_seconds)) for r in rows}
    documents = {
        str(r.document_id): document_record(_prefixed(r, "document_")) for r in rows if r.document_status is not None
    }
    return Claims(claimed, busy, documents)


def _prefixed(row: Any, prefix: str) -> SimpleNamespace:
    """The columns of ``row`` named with ``prefix``, without it: a record read beside another in one row."""
    return SimpleNamespace(**{short: row[index] for index, short in _columns_with(row._fields, prefix)})


@functools.lru_cache(maxsize=64)
def _columns_with(fields: tuple[str, ...], prefix: str) -> tuple[tuple[int, str], ...]:
    """Where the columns named with ``prefix`` are in a row of ``fields``, and their names without it (the same for
    every row a statement returns: worked out once)."""
    return tuple((index, name.removeprefix(prefix)) for index, name in enumerate(fields) if name.startswith(prefix))


def document_record(row: Any) -> DocumentRecord:
    return DocumentRecord(
        document_id=str(row.id),
        bucket=row.bucket,
        object_key=row.object_key,
        etag=row.etag,
        version_id=row.version_id,
        size_bytes=row.size_bytes,
        kind=row.kind,
        page_count=row.page_count,
        status=DocumentStatus(row.status),
        error=row.error,
        model=row.model,
        escalation_model=row.escalation_model,
        source_page_count=row.source_page_count,
        prompt=row.prompt,
        pages_completed=row.pages_completed,
        pages_failed=row.pages_failed,
        transcript_key=row.transcript_key,
        created_at=row.created_at,
        finished_at=row.finished_at,
        filename=row.filename,
        requested_pages=tuple(row.requested_pages) if row.requested_pages is not None else None,
        callback_url=row.callback_url,
        callback_status=row.callback_status,
        callback_error=row.callback_error,
        retries=row.retries,
        tenant_id=row.tenant_id,
        reuse=row.reuse,
        reused_from=str(row.reused_from) if row.reused_from else None,
        max_cost_usd=float_or_none(row.max_cost_usd),
        tenant_daily_budget_usd=float_or_none(row.tenant_daily_budget_usd),
        second_read=row.second_read,
        chunks=row.chunks,
        merge_tables=row.merge_tables,
        furniture=row.furniture,
        lane=row.lane,
        deadline=row.deadline,
    )


def page_records(rows: Sequence[Any]) -> list[PageRecord]:
    return [
        PageRecord(
            page_number=r.page_number,
            status=JobStatus(r.status),
            attempts=r.attempts,
            text=r.result_text,
            finish_reason=r.finish_reason,
            error=r.error,
            prompt_tokens=r.prompt_tokens,
            completion_tokens=r.completion_tokens,
            cost=float(r.cost) if r.cost is not None else None,
            model=r.model,
            provider=r.provider,
            provider_request_id=r.provider_request_id,
            flags=r.flags,
            escalation=r.escalation,
            confidence=r.confidence,
            correction=(
                PageCorrection(r.corrected_revision, r.corrected_markdown, r.corrected_at)
                if r.corrected_revision is not None
                else None
            ),
            grounding=r.grounding,
            figures=r.figures or (),
        )
        for r in rows
    ]


def attempt_records(rows: Sequence[Any]) -> list[AttemptRecord]:
    return [
        AttemptRecord(
            page_number=r.page_number,
            claim=r.claim,
            outcome=r.outcome,
            model=r.model,
            provider=r.provider,
            finish_reason=r.finish_reason,
            prompt_tokens=r.prompt_tokens,
            completion_tokens=r.completion_tokens,
            cost=float(r.cost) if r.cost is not None else None,
            latency_ms=r.latency_ms,
            provider_request_id=r.provider_request_id,
            flags=r.flags,
            confidence=r.confidence,
            status_code=r.status_code,
            error=r.error,
            second_read=r.second_read,
            cost_estimated=r.cost_estimated,
            tile=r.tile,
        )
        for r in rows
    ]
