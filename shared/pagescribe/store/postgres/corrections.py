"""Corrections: the revisions people save over the model's answers."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import namedtuple_row

from pagescribe.domain import (
    CorrectionSave,
    DocumentStatus,
    PageCorrection,
)
from pagescribe.store.postgres.connection import Connected


class PgCorrections(Connected):
    """A person's corrections of a finished document's pages, saved as numbered revisions under the document's lock."""

    # A correction is saved under the document's row lock (LOCK_DOCUMENT_FOR_CORRECTION, then INSERT_CORRECTION in the
    # same short transaction): saves of one document take turns, so each reads the revision the one before it wrote and
    # no two get the same; a re-run (which updates the row) waits for a save or is waited for, so a save sees the
    # document finished with the page's round of answers, or sees it reopened and saves nothing.
    LOCK_DOCUMENT_FOR_CORRECTION = """
    SELECT status, finished_at IS NOT NULL AS finished FROM documents WHERE id = %(document_id)s FOR NO KEY UPDATE
    """

    # The page's revisions so far, under the document's lock: a page past MAX_PAGE_REVISIONS takes no more (each save
    # writes the whole transcript again).
    PAGE_REVISIONS = """
    SELECT coalesce(max(revision), 0) AS revisions FROM page_corrections
    WHERE document_id = %(document_id)s AND page_number = %(page_number)s
    """

    INSERT_CORRECTION = """
    INSERT INTO page_corrections (document_id, page_number, revision, answer_round, markdown)
    SELECT j.document_id, j.page_number,
           coalesce((SELECT max(revision) FROM page_corrections c
                     WHERE c.document_id = j.document_id AND c.page_number = j.page_number), 0) + 1,
           j.answer_round, %(markdown)s
    FROM jobs j WHERE j.document_id = %(document_id)s AND j.page_number = %(page_number)s
    RETURNING revision, markdown, created_at
    """

    def save_correction(
        self, document_id: str, page_number: int, markdown: str, *, max_revisions: int
    ) -> CorrectionSave:

        def save(connection: psycopg.Connection[Any]) -> CorrectionSave:
            with connection.transaction(), connection.cursor(row_factory=namedtuple_row) as cursor:
                document: Any = cursor.execute(
                    self.LOCK_DOCUMENT_FOR_CORRECTION, {"document_id": document_id}
                ).fetchone()
                if document is None:
                    return CorrectionSave(None, None)
                status = DocumentStatus(document.status)
                if not document.finished:
                    return CorrectionSave(status, None)
                params = {"document_id": document_id, "page_number": page_number, "markdown": markdown}
                so_far: Any = cursor.execute(self.PAGE_REVISIONS, params).fetchone()
                if so_far.revisions >= max_revisions:
                    return CorrectionSave(status, None, int(so_far.revisions))
                row: Any = cursor.execute(self.INSERT_CORRECTION, params).fetchone()
            saved = PageCorrection(row.revision, row.markdown, row.created_at) if row is not None else None
            return CorrectionSave(status, saved)

        return self._with_connection(save)
