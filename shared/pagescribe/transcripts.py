"""Assemble a finished document's pages into transcripts/<id>.md and .json in the bucket."""

from __future__ import annotations

import json
import logging

from pagescribe.aws import DocumentStore
from pagescribe.callbacks import CallbackNotifier
from pagescribe.settings import Settings
from pagescribe.storage import DocumentRecord, DocumentStatus, JobStatus, PageRecord, Storage

log = logging.getLogger(__name__)


def _page_marker(page: PageRecord, page_count: int) -> str:
    if page.status is JobStatus.COMPLETED:
        return f"<!-- page {page.page_number} of {page_count} ({page.provider} {page.model}) -->"
    return f"<!-- page {page.page_number} of {page_count}: {page.status.value}: {page.error or 'no reason'} -->"


def render_markdown(document: DocumentRecord, pages: list[PageRecord]) -> str:
    """Pages in order, each opened by a marker; a page that failed says why (its partial text is kept)."""
    parts = [f"<!-- pagescribe document {document.document_id}: {document.object_key} -->"]
    for page in pages:
        body = (page.text or "").strip()
        parts.append(_page_marker(page, document.page_count) + ("\n\n" + body if body else ""))
    return "\n\n".join(parts) + "\n"


def render_json(document: DocumentRecord, status: DocumentStatus, pages: list[PageRecord]) -> str:
    return json.dumps(
        {
            "document_id": document.document_id,
            "source": {"bucket": document.bucket, "key": document.object_key, "kind": document.kind},
            "status": status.value,
            "page_count": document.page_count,
            "prompt_tokens": sum(p.prompt_tokens or 0 for p in pages),
            "completion_tokens": sum(p.completion_tokens or 0 for p in pages),
            "cost": round(sum(p.cost or 0.0 for p in pages), 8),
            "pages": [
                {
                    "page": p.page_number,
                    "status": p.status.value,
                    "text": p.text,
                    "error": p.error,
                    "finish_reason": p.finish_reason,
                    "attempts": p.attempts,
                    "prompt_tokens": p.prompt_tokens,
                    "completion_tokens": p.completion_tokens,
                    "cost": p.cost,
                    "model": p.model,
                    "provider": p.provider,
                    "provider_request_id": p.provider_request_id,
                }
                for p in pages
            ],
        },
        ensure_ascii=False,
        indent=2,
    )


def _final_status(pages: list[PageRecord]) -> tuple[DocumentStatus, str | None]:
    failed = sum(p.status is JobStatus.FAILED for p in pages)
    if failed == 0:
        return DocumentStatus.COMPLETED, None
    status = DocumentStatus.FAILED if failed == len(pages) else DocumentStatus.PARTIAL
    return status, f"{failed} of {len(pages)} pages failed"


class TranscriptWriter:
    def __init__(self, settings: Settings, storage: Storage, store: DocumentStore, notifier: CallbackNotifier) -> None:
        self._settings = settings
        self._storage = storage
        self._store = store
        self._notifier = notifier

    def transcript_key(self, document_id: str, suffix: str) -> str:
        return f"{self._settings.transcript_prefix}{document_id}.{suffix}"

    def finish(self, document_id: str) -> DocumentStatus | None:
        """Write the transcript files, then mark the document finished. Writing is idempotent, so the
        sweeper may finish a document whose finishing invocation died; None if it was already finished."""
        document = self._storage.get_document(document_id)
        if document is None or document.finished_at is not None:
            return None
        pages = self._storage.load_pages(document_id)
        status, error = _final_status(pages)
        markdown_key = self.transcript_key(document_id, "md")
        self._store.put_text(
            document.bucket,
            self.transcript_key(document_id, "json"),
            render_json(document, status, pages),
            content_type="application/json",
        )
        self._store.put_text(
            document.bucket,
            markdown_key,
            render_markdown(document, pages),
            content_type="text/markdown; charset=utf-8",
        )
        if not self._storage.finish_document(document_id, status=status, error=error, transcript_key=markdown_key):
            return None
        log.info("document finished", extra={"document_id": document_id, "status": status.value})
        self._notifier.deliver_due(document_id=document_id)
        return status
