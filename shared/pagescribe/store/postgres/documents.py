"""Documents: one transaction records a document and one QUEUED job per page; reads and the finish."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import namedtuple_row

from pagescribe.domain import (
    AttemptRecord,
    CreatedDocument,
    DocumentListing,
    DocumentRecord,
    DocumentStatus,
    NewDocument,
    PageRecord,
    PendingDocument,
    TranscriptState,
    TranscriptVersion,
)
from pagescribe.store.postgres.connection import Connected
from pagescribe.store.postgres.rows import (
    attempt_records,
    document_record,
    page_records,
)


class PgDocuments(Connected):
    """Documents and their jobs: recorded once per object, read, listed, finished; the sweeper's hold on the
    ones whose finishing invocation died or whose upload never came."""

    INSERT_DOCUMENT = """
    INSERT INTO documents (id, bucket, object_key, etag, version_id, size_bytes, kind, page_count, source_page_count,
                           status, error, model, escalation_model, prompt, tenant_id, sha256, chunks, merge_tables,
                           furniture, finished_at)
    VALUES (%(id)s, %(bucket)s, %(object_key)s, %(etag)s, %(version_id)s, %(size_bytes)s, %(kind)s, %(page_count)s,
            %(source_page_count)s, %(status)s, %(error)s, %(model)s, %(escalation_model)s, %(prompt)s, %(tenant_id)s,
            %(sha256)s, %(chunks)s, %(merge_tables)s, %(furniture)s, CASE WHEN %(status)s = 'FAILED' THEN now() END)
    ON CONFLICT (bucket, object_key, etag, version_id) DO NOTHING
    RETURNING id
    """

    # The upload of a document created through the API: it becomes PROCESSING (or FAILED) once.
    ACTIVATE_DOCUMENT = """
    UPDATE documents
    SET etag = %(etag)s, version_id = %(version_id)s, size_bytes = %(size_bytes)s, kind = %(kind)s,
        page_count = %(page_count)s, source_page_count = %(source_page_count)s, sha256 = %(sha256)s,
        status = %(status)s, error = %(error)s, finished_at = CASE WHEN %(status)s = 'FAILED' THEN now() END,
        updated_at = now()
    WHERE id = %(id)s AND status = 'AWAITING_UPLOAD'
    RETURNING id
    """

    FIND_DOCUMENT_BY_OBJECT = """
    SELECT id FROM documents
    WHERE bucket = %(bucket)s AND object_key = %(object_key)s AND etag = %(etag)s AND version_id = %(version_id)s
    """

    INSERT_JOBS = """
    INSERT INTO jobs (document_id, page_number)
    SELECT %(document_id)s, page FROM unnest(CAST(%(pages)s AS integer[])) AS page
    RETURNING id, page_number
    """

    # A reused document's pages: the donor's answers and flags, COMPLETED, with no attempt and nothing spent.
    COPY_JOBS = """
    INSERT INTO jobs (document_id, page_number, status, result_text, finish_reason, prompt_tokens, completion_tokens,
                      cost, model, provider, flags, confidence, grounding, escalation, completed_at)
    SELECT %(document_id)s, j.page_number, 'COMPLETED', j.result_text, j.finish_reason, 0, 0, 0, j.model, j.provider,
           j.flags, j.confidence, j.grounding, j.escalation, now()
    FROM jobs j WHERE j.document_id = %(donor_id)s AND j.page_number = ANY(CAST(%(pages)s AS integer[]))
    RETURNING id, page_number
    """

    MARK_REUSED = """
    UPDATE documents SET pages_completed = %(pages)s, reused_from = %(donor_id)s, updated_at = now()
    WHERE id = %(document_id)s
    """

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
        document_id = pending_id or str(uuid.uuid4())
        statement, params = self._document_row(new, document_id, kind, pages, source_page_count, error, pending_id)

        def record(connection: psycopg.Connection[Any]) -> CreatedDocument:
            with connection.transaction(), connection.cursor(row_factory=namedtuple_row) as cursor:
                if cursor.execute(statement, params).fetchone() is None:
                    return CreatedDocument(pending_id or self._recorded(cursor, new), (), duplicate=True)
                job_ids = () if error else self._queue_pages(cursor, document_id, pages, donor_id)
            return CreatedDocument(document_id, job_ids, duplicate=False, reused=donor_id is not None and not error)

        return self._with_connection(record)

    def _document_row(
        self,
        new: NewDocument,
        document_id: str,
        kind: str | None,
        pages: Sequence[int],
        source_page_count: int | None,
        error: str | None,
        pending_id: str | None,
    ) -> tuple[str, dict[str, Any]]:
        """The statement that records the document (ACTIVATE_DOCUMENT for a document the API created, else
        INSERT_DOCUMENT) and its parameters."""
        params: dict[str, Any] = {
            "id": document_id,
            "etag": new.etag,
            "version_id": new.version_id,
            "size_bytes": new.size_bytes,
            "kind": kind,
            "page_count": 0 if error else len(pages),
            "source_page_count": source_page_count,
            "status": DocumentStatus.FAILED.value if error else DocumentStatus.PROCESSING.value,
            "error": error,
            "sha256": new.sha256,
        }
        if pending_id is not None:
            return self.ACTIVATE_DOCUMENT, params
        return self.INSERT_DOCUMENT, params | {
            "bucket": new.bucket,
            "object_key": new.object_key,
            "model": new.model,
            "escalation_model": new.escalation_model,
            "prompt": new.prompt,
            "tenant_id": new.tenant_id,
            "chunks": new.chunks,
            "merge_tables": new.merge_tables,
            "furniture": new.furniture,
        }

    def _recorded(self, cursor: psycopg.Cursor[Any], new: NewDocument) -> str:
        """The document recorded before for this object (ON CONFLICT skipped the insert, so the row exists)."""
        params = {"bucket": new.bucket, "object_key": new.object_key, "etag": new.etag, "version_id": new.version_id}
        existing: Any = cursor.execute(self.FIND_DOCUMENT_BY_OBJECT, params).fetchone()
        assert existing is not None, "ON CONFLICT skipped the insert, so the row exists"
        return str(existing.id)

    def _queue_pages(
        self, cursor: psycopg.Cursor[Any], document_id: str, pages: Sequence[int], donor_id: str | None
    ) -> tuple[str, ...]:
        """One QUEUED job per page (INSERT_JOBS), or the donor's answers (COPY_JOBS, MARK_REUSED): their ids."""
        params = {"document_id": document_id, "pages": list(pages), "donor_id": donor_id}
        jobs: list[Any] = cursor.execute(self.COPY_JOBS if donor_id else self.INSERT_JOBS, params).fetchall()
        if donor_id:
            cursor.execute(self.MARK_REUSED, {"document_id": document_id, "donor_id": donor_id, "pages": len(jobs)})
        return tuple(str(j.id) for j in sorted(jobs, key=lambda j: j.page_number))

    INSERT_PENDING_DOCUMENT = """
    INSERT INTO documents (id, bucket, object_key, etag, version_id, size_bytes, status, model, escalation_model,
                           prompt, filename, requested_pages, callback_url, tenant_id, reuse, max_cost_usd,
                           second_read, chunks, merge_tables, furniture, lane, deadline)
    VALUES (%(id)s, %(bucket)s, %(object_key)s, '', '', 0, 'AWAITING_UPLOAD', %(model)s, %(escalation_model)s,
            %(prompt)s, %(filename)s, CAST(%(requested_pages)s AS integer[]), %(callback_url)s, %(tenant_id)s,
            %(reuse)s, %(max_cost_usd)s, %(second_read)s, %(chunks)s, %(merge_tables)s, %(furniture)s, %(lane)s,
            %(deadline)s)
    ON CONFLICT (id) DO NOTHING
    """

    def create_pending_document(self, pending: PendingDocument) -> None:
        self._rows(
            self.INSERT_PENDING_DOCUMENT,
            {
                "id": pending.document_id,
                "bucket": pending.bucket,
                "object_key": pending.object_key,
                "model": pending.model,
                "escalation_model": pending.escalation_model,
                "prompt": pending.prompt,
                "filename": pending.filename,
                "requested_pages": list(pending.requested_pages) if pending.requested_pages else None,
                "callback_url": pending.callback_url,
                "tenant_id": pending.tenant_id,
                "reuse": pending.reuse,
                "max_cost_usd": pending.max_cost_usd,
                "second_read": pending.second_read,
                "chunks": pending.chunks,
                "merge_tables": pending.merge_tables,
                "furniture": pending.furniture,
                "lane": pending.lane,
                "deadline": pending.deadline,
            },
        )

    def find_document(self, new: NewDocument) -> str | None:
        row = self._row(
            self.FIND_DOCUMENT_BY_OBJECT,
            {"bucket": new.bucket, "object_key": new.object_key, "etag": new.etag, "version_id": new.version_id},
        )
        return str(row.id) if row is not None else None

    # The latest finished document of the tenant with the same bytes and the same request (model, escalation model,
    # prompt, pages) whose pages all completed: its answers stand in for model calls. ix_documents_reusable serves it.
    FIND_REUSABLE_DOCUMENT = """
    SELECT d.id FROM documents d
    WHERE d.tenant_id = %(tenant_id)s AND d.sha256 = %(sha256)s AND d.status = 'COMPLETED'
      AND d.model = %(model)s AND d.escalation_model IS NOT DISTINCT FROM %(escalation_model)s
      AND d.prompt IS NOT DISTINCT FROM %(prompt)s AND d.page_count = cardinality(CAST(%(pages)s AS integer[]))
      AND (SELECT count(*) FROM jobs j
           WHERE j.document_id = d.id AND j.status = 'COMPLETED'
             AND j.page_number = ANY(CAST(%(pages)s AS integer[]))) = d.page_count
    ORDER BY d.finished_at DESC
    LIMIT 1
    """

    def find_reusable_document(self, new: NewDocument, pages: Sequence[int]) -> str | None:
        row = self._row(
            self.FIND_REUSABLE_DOCUMENT,
            {
                "tenant_id": new.tenant_id,
                "sha256": new.sha256,
                "model": new.model,
                "escalation_model": new.escalation_model,
                "prompt": new.prompt,
                "pages": list(pages),
            },
        )
        return None if row is None else str(row.id)

    MARK_ENQUEUED = """
    UPDATE jobs SET enqueued_at = now(), updated_at = now()
    WHERE id = ANY(CAST(%(ids)s AS uuid[])) AND status = 'QUEUED'
    """

    def mark_enqueued(self, job_ids: Sequence[str]) -> None:
        if job_ids:
            self._rows(self.MARK_ENQUEUED, {"ids": list(job_ids)})

    # A document's pages ended: its own count (moved by the sweeper, retries and re-runs) plus its shards'
    # (document_counts, moved by each page's end).
    GET_DOCUMENTS = """
    SELECT id, bucket, object_key, etag, version_id, size_bytes, kind, page_count, source_page_count, status, error,
           model, escalation_model, prompt, pages_completed + o.completed AS pages_completed,
           pages_failed + o.failed AS pages_failed, transcript_key, created_at, finished_at,
           filename, requested_pages, callback_url, callback_status, callback_error, retries, tenant_id, reuse,
           reused_from, max_cost_usd, second_read, chunks, merge_tables, furniture, lane, deadline,
           (SELECT daily_budget_usd FROM tenants WHERE tenants.id = documents.tenant_id) AS tenant_daily_budget_usd
    FROM documents
    CROSS JOIN LATERAL (
        SELECT coalesce(sum(c.pages_completed), 0) AS completed, coalesce(sum(c.pages_failed), 0) AS failed,
               max(c.updated_at) AS updated_at
        FROM document_counts c WHERE c.document_id = documents.id
    ) o
    WHERE id = ANY(CAST(%(document_ids)s AS uuid[]))
    """

    def get_document(self, document_id: str) -> DocumentRecord | None:
        row = self._row(self.GET_DOCUMENTS, {"document_ids": [document_id]})
        return document_record(row) if row is not None else None

    def get_documents(self, document_ids: Sequence[str]) -> dict[str, DocumentRecord]:
        unique = list(dict.fromkeys(document_ids))
        if not unique:
            return {}
        return {str(row.id): document_record(row) for row in self._rows(self.GET_DOCUMENTS, {"document_ids": unique})}

    # A tenant's documents, newest first, a page at a time: keyset pagination on (created_at, id), which
    # ix_documents_tenant (tenant_id, created_at) serves.
    LIST_DOCUMENTS = """
    SELECT d.id, d.filename, d.status, d.page_count, d.pages_completed + o.completed AS pages_completed,
           d.pages_failed + o.failed AS pages_failed, d.model, d.created_at, d.finished_at,
           (SELECT count(*) FROM jobs WHERE jobs.document_id = d.id AND jobs.flags <> '[]'::jsonb) AS flagged,
           (SELECT coalesce(sum(cost), 0) FROM attempts WHERE attempts.document_id = d.id) AS cost
    FROM documents d
    CROSS JOIN LATERAL (
        SELECT coalesce(sum(c.pages_completed), 0) AS completed, coalesce(sum(c.pages_failed), 0) AS failed,
               max(c.updated_at) AS updated_at
        FROM document_counts c WHERE c.document_id = d.id
    ) o
    WHERE d.tenant_id = %(tenant_id)s
      AND (CAST(%(before_at)s AS timestamptz) IS NULL
           OR (d.created_at, d.id) < (CAST(%(before_at)s AS timestamptz), CAST(%(before_id)s AS uuid)))
    ORDER BY d.created_at DESC, d.id DESC
    LIMIT %(limit)s
    """

    def list_documents(
        self, tenant_id: str, *, limit: int, before: tuple[datetime, str] | None = None
    ) -> list[DocumentListing]:
        before_at, before_id = before if before is not None else (None, None)
        rows = self._rows(
            self.LIST_DOCUMENTS,
            {"tenant_id": tenant_id, "limit": limit, "before_at": before_at, "before_id": before_id},
        )
        return [
            DocumentListing(
                document_id=str(row.id),
                filename=row.filename,
                status=DocumentStatus(row.status),
                page_count=row.page_count,
                pages_completed=row.pages_completed,
                pages_failed=row.pages_failed,
                flagged=row.flagged,
                cost=float(row.cost),
                model=row.model,
                created_at=row.created_at,
                finished_at=row.finished_at,
            )
            for row in rows
        ]

    # Each page with its current correction: the latest one made on the page's latest round of answers (the primary key
    # of page_corrections serves the lookup).
    LOAD_PAGES = """
    SELECT j.page_number, j.status, j.attempts, j.result_text, j.finish_reason, j.error, j.prompt_tokens,
           j.completion_tokens, j.cost, j.model, j.provider, j.provider_request_id, j.flags, j.escalation,
           j.confidence, j.grounding, j.figures, c.revision AS corrected_revision, c.markdown AS corrected_markdown,
           c.created_at AS corrected_at
    FROM jobs j
    LEFT JOIN LATERAL (
        SELECT revision, markdown, created_at FROM page_corrections
        WHERE document_id = j.document_id AND page_number = j.page_number AND answer_round = j.answer_round
        ORDER BY revision DESC
        LIMIT 1
    ) c ON true
    WHERE j.document_id = %(document_id)s
    ORDER BY j.page_number
    """

    def load_pages(self, document_id: str) -> list[PageRecord]:
        return page_records(self._rows(self.LOAD_PAGES, {"document_id": document_id}))

    LOAD_ATTEMPTS = """
    SELECT j.page_number, a.claim, a.outcome, a.model, a.provider, a.finish_reason, a.prompt_tokens,
           a.completion_tokens, a.cost, a.latency_ms, a.provider_request_id, a.flags, a.confidence, a.status_code,
           a.error, a.second_read, a.cost_estimated, a.tile
    FROM attempts a JOIN jobs j ON j.id = a.job_id
    WHERE a.document_id = %(document_id)s
    ORDER BY j.page_number, a.id
    """

    def load_attempts(self, document_id: str) -> list[AttemptRecord]:
        return attempt_records(self._rows(self.LOAD_ATTEMPTS, {"document_id": document_id}))

    # What a finished document's transcript files are written from changes only with these two (TranscriptVersion).
    TRANSCRIPT_VERSION = """
    SELECT finished_at, (SELECT count(*) FROM page_corrections c WHERE c.document_id = d.id) AS corrections
    FROM documents d WHERE d.id = %(document_id)s
    """

    def transcript_version(self, document_id: str) -> TranscriptVersion | None:
        row = self._row(self.TRANSCRIPT_VERSION, {"document_id": document_id})
        return TranscriptVersion(row.finished_at, row.corrections) if row is not None else None

    # The same, with the document's row share-locked for a transaction that reads its pages and calls: no correction,
    # re-run or finish can land between the reads.
    LOCK_TRANSCRIPT_VERSION = """
    SELECT finished_at, (SELECT count(*) FROM page_corrections c WHERE c.document_id = d.id) AS corrections
    FROM documents d WHERE d.id = %(document_id)s FOR SHARE
    """

    def transcript_state(self, document_id: str) -> TranscriptState | None:

        def read(connection: psycopg.Connection[Any]) -> TranscriptState | None:
            params = {"document_id": document_id}
            with connection.transaction(), connection.cursor(row_factory=namedtuple_row) as cursor:
                version: Any = cursor.execute(self.LOCK_TRANSCRIPT_VERSION, params).fetchone()
                if version is None or version.finished_at is None:
                    return None
                document = document_record(
                    cursor.execute(self.GET_DOCUMENTS, {"document_ids": [document_id]}).fetchone()
                )
                pages = page_records(cursor.execute(self.LOAD_PAGES, params).fetchall())
                attempts = attempt_records(cursor.execute(self.LOAD_ATTEMPTS, params).fetchall())
            return TranscriptState(
                document, pages, attempts, TranscriptVersion(version.finished_at, version.corrections)
            )

        return self._with_connection(read)

    # Only a document whose pages are all terminal (its count and its shards'), and only once: the update of its row
    # waits for a concurrent finish, then finds finished_at set.
    FINISH_DOCUMENT = """
    UPDATE documents
    SET status = %(status)s, error = %(error)s, transcript_key = %(transcript_key)s,
        finished_at = now(), updated_at = now(),
        callback_status = CASE WHEN callback_url IS NOT NULL THEN 'PENDING' END,
        callback_attempts = 0, callback_next_at = now(), callback_error = NULL
    WHERE id = %(document_id)s AND finished_at IS NULL
      AND pages_completed + pages_failed
          + (SELECT coalesce(sum(c.pages_completed + c.pages_failed), 0) FROM document_counts c
             WHERE c.document_id = documents.id) >= page_count
    RETURNING status
    """

    def finish_document(
        self, document_id: str, *, status: DocumentStatus, error: str | None, transcript_key: str
    ) -> bool:
        row = self._row(
            self.FINISH_DOCUMENT,
            {"document_id": document_id, "status": status.value, "error": error, "transcript_key": transcript_key},
        )
        return row is not None

    # Documents whose pages are all terminal but whose finishing invocation died: touched, so that a concurrent
    # sweeper leaves them alone for the grace period. The grace runs from the last move of the document or of its
    # count (a page's end moves its shard only).
    TAKE_UNFINISHED_DOCUMENTS = """
    WITH stuck AS (
        SELECT d.id FROM documents d
        CROSS JOIN LATERAL (
            SELECT coalesce(sum(c.pages_completed), 0) AS completed, coalesce(sum(c.pages_failed), 0) AS failed,
                   max(c.updated_at) AS updated_at
            FROM document_counts c WHERE c.document_id = d.id
        ) o
        WHERE d.finished_at IS NULL AND d.status = 'PROCESSING'
          AND d.pages_completed + d.pages_failed + o.completed + o.failed >= d.page_count
          AND greatest(d.updated_at, o.updated_at) < now() - make_interval(secs => %(grace_seconds)s)
        ORDER BY d.updated_at
        LIMIT %(limit)s
        FOR UPDATE OF d SKIP LOCKED
    )
    UPDATE documents SET updated_at = now()
    WHERE id IN (SELECT id FROM stuck)
    RETURNING id
    """

    def take_unfinished_documents(self, *, grace_seconds: float, limit: int) -> list[str]:
        rows = self._rows(self.TAKE_UNFINISHED_DOCUMENTS, {"grace_seconds": grace_seconds, "limit": limit})
        return [str(r.id) for r in rows]

    # A document created through the API whose file never came: FAILED once its upload URL has long expired (the partial
    # index ix_documents_awaiting_upload serves it), its callback armed as for any finished document.
    EXPIRE_AWAITING_UPLOADS = """
    WITH due AS (
        SELECT id FROM documents
        WHERE status = 'AWAITING_UPLOAD' AND created_at < now() - make_interval(secs => %(after_seconds)s)
        ORDER BY created_at
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    )
    UPDATE documents
    SET status = 'FAILED', error = %(error)s, finished_at = now(), updated_at = now(),
        callback_status = CASE WHEN callback_url IS NOT NULL THEN 'PENDING' END,
        callback_attempts = 0, callback_next_at = now(), callback_error = NULL
    WHERE id IN (SELECT id FROM due)
    RETURNING id
    """

    def expire_awaiting_uploads(self, *, after_seconds: float, error: str, limit: int) -> list[str]:
        rows = self._rows(
            self.EXPIRE_AWAITING_UPLOADS, {"after_seconds": after_seconds, "error": error, "limit": limit}
        )
        return [str(r.id) for r in rows]
