"""Pages: what a page shows and what a user may do to it once it is finished."""

from __future__ import annotations

from typing import Any

from psycopg.types.json import Jsonb

from pagescribe.domain import (
    ClaimedJob,
    JobStatus,
    PageImageRecord,
    PageIssue,
    PageRerunState,
    PageSummary,
)
from pagescribe.store.postgres.connection import Connected


class PgPages(Connected):
    """A document's pages after their answer: the summary and issues shown, the user's retry and re-run, the page's
    kept image and figures."""

    # A page counts as corrected while a correction made on its latest round of answers exists (LOAD_PAGES shows it).
    PAGE_SUMMARY = """
    SELECT status, count(*) AS pages, count(*) FILTER (WHERE flags <> '[]'::jsonb) AS flagged,
           count(*) FILTER (WHERE EXISTS (
               SELECT 1 FROM page_corrections c
               WHERE c.document_id = j.document_id AND c.page_number = j.page_number
                 AND c.answer_round = j.answer_round
           )) AS corrected
    FROM jobs j WHERE document_id = %(document_id)s
    GROUP BY status
    """

    def page_summary(self, document_id: str) -> list[PageSummary]:
        rows = self._rows(self.PAGE_SUMMARY, {"document_id": document_id})
        return [PageSummary(JobStatus(r.status), r.pages, r.flagged, r.corrected) for r in rows]

    # Pages with something to say: an error (a failure, or the reason of a retry) or flags.
    PAGE_ISSUES = """
    SELECT page_number, status, attempts, error, flags, escalation IS NOT NULL AS escalated FROM jobs
    WHERE document_id = %(document_id)s AND (error IS NOT NULL OR flags <> '[]'::jsonb)
    ORDER BY page_number
    LIMIT %(limit)s
    """

    def page_issues(self, document_id: str, *, limit: int = 1000) -> list[PageIssue]:
        rows = self._rows(self.PAGE_ISSUES, {"document_id": document_id, "limit": limit})
        return [PageIssue(r.page_number, JobStatus(r.status), r.attempts, r.error, r.flags, r.escalated) for r in rows]

    # A finished page goes back to the queue as new (RETRY_FAILED_PAGES, RERUN_PAGE): no answer, no flags, no lease,
    # never sent; its attempts rows are kept. Its next answer is a new round: the corrections made on the earlier
    # answers no longer hold (they stay, as history).
    #
    # Only FAILED pages go back, with a fresh set of attempts; the document is unfinished again.
    # Bounded per document: the document's row is locked first (a concurrent retry waits, then finds the count moved on
    # and no FAILED page left), and the count goes up only when pages were requeued.
    RETRY_FAILED_PAGES = """
    WITH allowed AS (
        SELECT id FROM documents WHERE id = %(document_id)s AND retries < %(max_retries)s FOR UPDATE
    ),
    retried AS (
        UPDATE jobs
        SET status = 'QUEUED', attempts = 0, error = NULL, answer_round = answer_round + 1,
            result_text = NULL, finish_reason = NULL, prompt_tokens = NULL, completion_tokens = NULL, cost = NULL,
            model = NULL, provider = NULL, provider_request_id = NULL, latency_ms = NULL, confidence = NULL,
            grounding = NULL, flags = '[]'::jsonb, lease_token = NULL, lease_expires_at = NULL, enqueued_at = NULL,
            available_at = now(), completed_at = NULL, updated_at = now()
        WHERE document_id = %(document_id)s AND status = 'FAILED' AND EXISTS (SELECT 1 FROM allowed)
        RETURNING id, page_number
    ),
    reopened AS (
        UPDATE documents
        SET pages_failed = pages_failed - (SELECT count(*) FROM retried), status = 'PROCESSING', error = NULL,
            finished_at = NULL, callback_status = NULL, retries = retries + 1, updated_at = now()
        WHERE id = %(document_id)s AND EXISTS (SELECT 1 FROM retried)
        RETURNING id
    )
    SELECT id, page_number FROM retried ORDER BY page_number
    """

    def retry_failed_pages(self, document_id: str, *, max_retries: int) -> list[tuple[str, int]]:
        rows = self._rows(self.RETRY_FAILED_PAGES, {"document_id": document_id, "max_retries": max_retries})
        return [(str(r.id), r.page_number) for r in rows]

    # One finished page (COMPLETED, FAILED or SKIPPED) queued again, on the model asked for (NULL: the document's):
    # its answer and flags are cleared, its attempts (and their costs) kept, and its document reopened, so that the
    # transcript files are written again when the page is done. Bounded as retries are: the document's row is locked
    # first and its retries counted (a re-run is one), and the page's own re-runs; a page past either limit is not
    # queued.
    RERUN_PAGE = """
    WITH allowed AS (
        SELECT id FROM documents WHERE id = %(document_id)s AND retries < %(max_retries)s FOR UPDATE
    ),
    page AS (
        SELECT id, status FROM jobs
        WHERE document_id = %(document_id)s AND page_number = %(page_number)s
          AND status IN ('COMPLETED', 'FAILED', 'SKIPPED') AND reruns < %(max_page_reruns)s
          AND EXISTS (SELECT 1 FROM allowed)
        FOR UPDATE
    ),
    rerun AS (
        UPDATE jobs
        SET status = 'QUEUED', attempts = 0, error = NULL, answer_round = answer_round + 1,
            result_text = NULL, finish_reason = NULL, prompt_tokens = NULL, completion_tokens = NULL, cost = NULL,
            model = NULL, provider = NULL, provider_request_id = NULL, latency_ms = NULL, confidence = NULL,
            grounding = NULL, flags = '[]'::jsonb, lease_token = NULL, lease_expires_at = NULL, enqueued_at = NULL,
            available_at = now(), completed_at = NULL, updated_at = now(),
            escalation = NULL, requested_model = %(model)s, reruns = reruns + 1
        FROM page WHERE jobs.id = page.id
        RETURNING jobs.id, page.status AS was
    ),
    reopened AS (
        UPDATE documents
        SET pages_completed = pages_completed - (SELECT count(*) FROM rerun WHERE was = 'COMPLETED'),
            pages_failed = pages_failed - (SELECT count(*) FROM rerun WHERE was <> 'COMPLETED'),
            status = 'PROCESSING', error = NULL, finished_at = NULL, callback_status = NULL, retries = retries + 1,
            updated_at = now()
        WHERE id = %(document_id)s AND EXISTS (SELECT 1 FROM rerun)
        RETURNING id
    )
    SELECT id FROM rerun
    """

    def rerun_page(
        self, document_id: str, page_number: int, *, model: str | None, max_retries: int, max_page_reruns: int
    ) -> str | None:
        params = {
            "document_id": document_id,
            "page_number": page_number,
            "model": model,
            "max_retries": max_retries,
            "max_page_reruns": max_page_reruns,
        }
        row = self._row(self.RERUN_PAGE, params)
        return str(row.id) if row is not None else None

    # What decides whether a page may be re-run: its status, its re-runs so far, and why it failed.
    PAGE_RERUN_STATE = """
    SELECT status, reruns, error FROM jobs WHERE document_id = %(document_id)s AND page_number = %(page_number)s
    """

    def page_rerun_state(self, document_id: str, page_number: int) -> PageRerunState | None:
        row = self._row(self.PAGE_RERUN_STATE, {"document_id": document_id, "page_number": page_number})
        return PageRerunState(JobStatus(row.status), row.reruns, row.error) if row is not None else None

    # The image a page was sent to the model as, once it is in the bucket. Not fenced by the lease: every holder of the
    # page stores the same render under the same key, and the page's result is written apart from it.
    KEEP_PAGE_IMAGE = "UPDATE jobs SET image_key = %(image_key)s WHERE id = %(job_id)s"

    def keep_page_image(self, job: ClaimedJob, image_key: str) -> None:
        self._rows(self.KEEP_PAGE_IMAGE, {"job_id": job.job_id, "image_key": image_key})

    # The figures cropped from the page's image and stored beside the transcript: their keys and boxes.
    KEEP_FIGURES = "UPDATE jobs SET figures = %(figures)s WHERE id = %(job_id)s"

    def keep_figures(self, job: ClaimedJob, figures: list[dict[str, Any]]) -> None:
        self._rows(self.KEEP_FIGURES, {"job_id": job.job_id, "figures": Jsonb(figures)})

    PAGE_IMAGE = """
    SELECT image_key, status FROM jobs WHERE document_id = %(document_id)s AND page_number = %(page_number)s
    """

    def page_image(self, document_id: str, page_number: int) -> PageImageRecord | None:
        row = self._row(self.PAGE_IMAGE, {"document_id": document_id, "page_number": page_number})
        return PageImageRecord(row.image_key, JobStatus(row.status)) if row is not None else None

    PAGE_FIGURES = """
    SELECT figures FROM jobs WHERE document_id = %(document_id)s AND page_number = %(page_number)s
    """

    def page_figures(self, document_id: str, page_number: int) -> list[dict[str, Any]] | None:
        row = self._row(self.PAGE_FIGURES, {"document_id": document_id, "page_number": page_number})
        return list(row.figures or ()) if row is not None else None
