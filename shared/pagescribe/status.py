"""What a document looks like from outside: status, progress, per-page errors and flags, tokens and cost."""

from __future__ import annotations

from typing import Any

from pagescribe.domain import DocumentRecord, JobStatus
from pagescribe.store.ports import Store


def describe_document(db: Store, document: DocumentRecord) -> dict[str, Any]:
    summary = db.page_summary(document.document_id)
    spend = db.spend(document.document_id)
    issues = db.page_issues(document.document_id)
    by_status = {status.value: 0 for status in JobStatus}
    for row in summary:
        by_status[row.status.value] = row.pages
    done = by_status[JobStatus.COMPLETED] + by_status[JobStatus.FAILED] + by_status[JobStatus.SKIPPED]
    return {
        "document_id": document.document_id,
        "status": document.status.value,
        "filename": document.filename or document.object_key.rsplit("/", 1)[-1],
        "source": {"bucket": document.bucket, "key": document.object_key, "kind": document.kind},
        "model": document.model,
        "escalation_model": document.escalation_model,
        "page_count": document.page_count,
        "pages": by_status,
        "progress": round(done / document.page_count, 4) if document.page_count else 0.0,
        "error": document.error,
        "page_errors": [
            {"page": i.page_number, "status": i.status.value, "attempts": i.attempts, "error": i.error}
            for i in issues
            if i.error is not None
        ],
        "flagged_pages": sum(row.flagged for row in summary),
        "corrected_pages": sum(row.corrected for row in summary),
        "page_flags": [
            {"page": i.page_number, "status": i.status.value, "escalated": i.escalated, "flags": i.flags}
            for i in issues
            if i.flags
        ],
        "model_calls": spend.calls,
        "prompt_tokens": spend.prompt_tokens,
        "completion_tokens": spend.completion_tokens,
        "cost": round(spend.cost, 8),
        "max_cost_usd": document.max_cost_usd,
        "created_at": document.created_at.isoformat(),
        "finished_at": document.finished_at.isoformat() if document.finished_at else None,
        "transcript_key": document.transcript_key,
        "chunks_key": chunks_key(document.transcript_key) if document.chunks and document.transcript_key else None,
    }


def chunks_key(transcript_key: str) -> str:
    """Where a transcript's chunks for retrieval are written, beside its markdown: ``<id>.chunks.jsonl``."""
    return transcript_key.removesuffix(".md") + ".chunks.jsonl"
