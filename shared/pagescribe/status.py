"""What a document looks like from outside: status, progress, per-page errors, tokens and cost."""

from __future__ import annotations

from typing import Any

from pagescribe.storage import DocumentRecord, JobStatus, Storage


def describe_document(storage: Storage, document: DocumentRecord) -> dict[str, Any]:
    summary = storage.page_summary(document.document_id)
    by_status = {status.value: 0 for status in JobStatus}
    for row in summary:
        by_status[row.status.value] = row.pages
    done = by_status[JobStatus.COMPLETED] + by_status[JobStatus.FAILED]
    return {
        "document_id": document.document_id,
        "status": document.status.value,
        "filename": document.filename or document.object_key.rsplit("/", 1)[-1],
        "source": {"bucket": document.bucket, "key": document.object_key, "kind": document.kind},
        "model": document.model,
        "page_count": document.page_count,
        "pages": by_status,
        "progress": round(done / document.page_count, 4) if document.page_count else 0.0,
        "error": document.error,
        "page_errors": [
            {"page": e.page_number, "status": e.status.value, "attempts": e.attempts, "error": e.error}
            for e in storage.page_errors(document.document_id)
        ],
        "prompt_tokens": sum(r.prompt_tokens for r in summary),
        "completion_tokens": sum(r.completion_tokens for r in summary),
        "cost": round(sum(r.cost for r in summary), 8),
        "created_at": document.created_at.isoformat(),
        "finished_at": document.finished_at.isoformat() if document.finished_at else None,
        "transcript_key": document.transcript_key,
    }
