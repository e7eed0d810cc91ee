"""The batch lane: a document's pages sent in a provider's batch at its batch price instead of one call each.

A page of the lane is claimed and rendered by the transcribe function like any page; its image is kept in S3 and,
instead of a model call, it is *parked*: it waits PROCESSING under the lease of that claim, with what the checks need
of its render (ink, text layer, rotation). The sweeper, already scheduled, then

1. moves to the sync lane the parked pages whose document's deadline is near (BATCH_SYNC_RESERVE_SECONDS): each is
   QUEUED again, on the sync lane, and its message sent; a batch all of whose pages moved is cancelled where the API
   allows it;
2. collects the batches that ended: each answer goes through the same checks and the same fenced writes as a call's
   (completed, failed, or escalated: a hard-flagged answer goes to the escalation model on the sync lane), and is
   recorded with its cost at the batch's price. A page no longer parked (it moved on) gets its answer recorded, not
   kept: both calls are paid and counted, one answer is the page's. A page its batch did not answer (missing from its
   results, or its batch failed or expired) waits for the next batch, or moves to the sync lane once
   BATCH_MAX_SUBMISSIONS batches did not answer it: no page is lost;
3. sends the waiting pages in batches of one model each (BATCH_MAX_PAGES at most), each page as a presigned URL of
   its kept image.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pagescribe.aws import JobMessage, JobQueue, ObjectStore
from pagescribe.checks import Answer, PageEvidence, Thresholds, check_answer, clean_answer, describe_flags, hard_flags
from pagescribe.domain import BatchPage, DocumentRecord, DocumentStatus, FailedCall, Lane, ProviderBatch
from pagescribe.observability import count, count_flags, count_for_model, gauge
from pagescribe.outbox import send_committed
from pagescribe.providers.base import Transcription
from pagescribe.providers.batches import BatchAnswer, BatchApi, BatchApiError, BatchRequest
from pagescribe.settings import Settings
from pagescribe.store.ports import Store
from pagescribe.transcription.outcomes import answer_outcome, rejection

log = logging.getLogger(__name__)

Finish = Callable[[str], DocumentStatus | None]  # writes a document's transcript files; None if already finished
LEASE_MARGIN_SECONDS = 3600  # a parked page's lease outlasts its batch's window by this much
MAX_BATCHES_PER_SWEEP = 20  # batches sent, and batches polled, by one sweep


def lane_of(document: DocumentRecord, job_lane: str | None, settings: Settings) -> Lane:
    """The lane a claimed page goes by: its own (a page moved to sync), else its document's, else DEFAULT_LANE; the
    sync lane for a document whose deadline is nearer than a batch may take, and with a provider that has no batch API
    (the offline engine, Bedrock)."""
    lane = Lane(job_lane or document.lane or settings.default_lane)
    if not settings.has_batch_api:
        return Lane.SYNC
    if lane is Lane.BATCH and document.deadline is not None:
        left = (document.deadline - datetime.now(UTC)).total_seconds()
        if left < settings.batch_sync_reserve_seconds:
            return Lane.SYNC
    return lane


def park_seconds(settings: Settings) -> float:
    """How long a parked page's lease holds: the batch's window and a margin (its lease is renewed as it is sent)."""
    return settings.batch_window_hours * 3600 + LEASE_MARGIN_SECONDS


@dataclass(frozen=True)
class BatchSweep:
    """What one sweep of the batch lane did."""

    moved_to_sync: int
    batches_submitted: int
    pages_submitted: int
    batches_collected: int
    pages_answered: int  # answers kept (completed, failed or escalated pages)
    answers_not_kept: int  # answers of pages that had moved on: recorded with their cost, not kept
    pages_waiting: int


@dataclass
class _Collected:
    answered: int = 0
    not_kept: int = 0


class BatchLane:
    """The sweeper's part of the batch lane: move the late pages, collect the ended batches, send the waiting pages."""

    def __init__(
        self,
        settings: Settings,
        db: Store,
        queue: JobQueue,
        objects: ObjectStore,
        api: BatchApi,
        finish: Finish,
        thresholds: Thresholds,
    ) -> None:
        self._settings = settings
        self._db = db
        self._queue = queue
        self._objects = objects
        self._api = api
        self._finish = finish
        self._thresholds = thresholds
        self._stop_at: float | None = None  # when this pass stops polling and sending (time.monotonic())

    def _out_of_time(self) -> bool:
        return self._stop_at is not None and time.monotonic() >= self._stop_at

    def sweep(self, seconds: float | None = None) -> BatchSweep:
        """One pass: move the late pages, collect the ended batches, send the waiting pages. With ``seconds``, no
        batch is polled or sent once they are spent (the rest waits for the next pass)."""
        self._stop_at = None if seconds is None else time.monotonic() + seconds
        moved = self.move_late_pages()
        collected, totals = self.collect()
        batches, pages = self.submit()
        waiting = self._db.batch_pages_waiting()
        gauge("BatchPagesWaiting", waiting)
        return BatchSweep(moved, batches, pages, collected, totals.answered, totals.not_kept, waiting)

    def close(self) -> None:
        self._api.close()

    # --- the deadline ----------------------------------------------------------------------------------------------

    def move_late_pages(self) -> int:
        """The parked pages whose document's deadline is near, QUEUED on the sync lane; how many."""
        due = self._db.due_for_sync(
            within_seconds=self._settings.batch_sync_reserve_seconds, limit=self._settings.sweep_batch_size
        )
        reserve = self._settings.batch_sync_reserve_seconds
        why = f"moved to the sync lane: its document's deadline is less than {reserve:g} s away"
        return self._to_sync(due, why)

    def _to_sync(self, pages: Sequence[BatchPage], reason: str) -> int:
        moved = [page.job for page in pages if self._db.move_to_sync(page.job, reason)]
        if moved:
            send_committed(self._queue, self._db, [JobMessage(j.job_id, j.document_id, j.page_number) for j in moved])
            count("BatchPagesMovedToSync", len(moved))
            log.info("%d batch pages moved to the sync lane: %s", len(moved), reason)
        return len(moved)

    # --- collecting ------------------------------------------------------------------------------------------------

    def collect(self) -> tuple[int, _Collected]:
        """Poll the open batches; take the answers of those that ended. (batches collected, what their answers came
        to)"""
        totals, collected = _Collected(), 0
        for batch in self._db.open_batches(limit=MAX_BATCHES_PER_SWEEP):
            if self._out_of_time():
                break
            if batch.provider_batch_id is None:  # its sweeper stopped before the provider took it
                self._db.batch_not_sent(batch.batch_id, "never sent: its sweeper stopped before the provider took it")
                continue
            try:
                collected += self._collect(batch, batch.provider_batch_id, totals)
            except BatchApiError as exc:
                log.warning("batch %s not collected this time: %s", batch.provider_batch_id, exc)
                count("BatchApiErrors")
        return collected, totals

    def _collect(self, batch: ProviderBatch, provider_batch_id: str, totals: _Collected) -> int:
        view = self._api.poll(provider_batch_id)
        pages = self._db.batch_pages(batch.batch_id)
        if not view.ended:
            self._db.note_batch(batch.batch_id, status=view.status, output_file_id=view.output_file_id)
            if self._api.cancellable and view.status != "cancelling" and not any(p.parked for p in pages):
                self._api.cancel(provider_batch_id)  # every page moved on: the rest of the batch is not needed
                count("BatchesCancelled")
            return 0
        waited = (datetime.now(UTC) - batch.submitted_at).total_seconds()
        answers = self._api.answers(view, batch.model, latency_seconds=max(waited, 0.0))
        received = {a.custom_id for a in answers if a.transcription is not None}
        failed = {a.custom_id for a in answers} - received
        # the sweeper that closes the batch takes its answers: an overlapping sweep that polled it too takes none
        if not self._db.close_batch(batch.batch_id, status=view.status, answered=len(received), failed=len(failed)):
            return 0
        count("BatchesCollected")
        done = self._take_answers(pages, answers, view.status)
        totals.answered += done.answered
        totals.not_kept += done.not_kept
        return 1

    def _take_answers(self, pages: list[BatchPage], answers: list[BatchAnswer], status: str) -> _Collected:
        """Each answer for a page of the batch written (or recorded), once; the parked pages it did not answer sent
        on (see ``_unanswered``)."""
        by_id = {page.job.job_id: page for page in pages}
        documents = self._db.get_documents(sorted({page.job.document_id for page in pages}))
        done, answered = _Collected(), set()
        for answer in answers:
            page = by_id.get(answer.custom_id)
            if page is None or answer.custom_id in answered:  # not a request of this batch, or a second answer
                continue
            if answer.transcription is None:
                self._db.record_failed_call(
                    page.job, FailedCall(page.model, self._api.name, None, answer.error or "", None)
                )
                count_for_model("ModelCalls", page.model)
                continue
            answered.add(answer.custom_id)
            if self._settle(page, documents[page.job.document_id], answer.transcription):
                done.answered += 1
            else:
                done.not_kept += 1
        self._unanswered([p for p in pages if p.parked and p.job.job_id not in answered], f"its batch ended {status}")
        return done

    def _unanswered(self, pages: list[BatchPage], why: str) -> None:
        """Pages their batch did not answer: to the next batch, or to the sync lane after BATCH_MAX_SUBMISSIONS."""
        limit = self._settings.batch_max_submissions
        spent = [page for page in pages if page.submissions >= limit]
        for page in pages:
            if page.submissions < limit:
                self._db.back_to_waiting(page.job)
        self._to_sync(spent, f"moved to the sync lane: {limit} batch(es) did not answer it ({why})")
        if len(pages) > len(spent):
            count("BatchPagesResubmitted", len(pages) - len(spent))

    def _settle(self, page: BatchPage, document: DocumentRecord, result: Transcription) -> bool:
        """A batch's answer for a page, checked and written under the lease the page was parked with; False when the
        fence refused it (the page had moved on): the call is recorded all the same, with its cost, and not kept."""
        evidence = _evidence(page.evidence)
        answer = Answer(clean_answer(result.text), result.finish_reason, result.completion_tokens, result.confidence)
        flags = check_answer(answer, evidence, self._thresholds, max_output_tokens=self._settings.max_output_tokens)
        outcome = answer_outcome(result, self._api.name, answer.text, flags)
        _count_call(result)
        count_flags(flag.flag for flag in flags)
        job, hard = page.job, hard_flags(flags)
        escalation_model = document.escalation_model
        if hard and job.escalation is None and escalation_model:
            if not self._db.escalate_job(job, outcome):
                return _not_kept()
            count("PagesEscalated")
            self._to_sync([page], f"escalated to {escalation_model} on the sync lane ({describe_flags(hard)})")
            return True
        if hard:
            progress = self._db.fail_job(job, rejection(flags, escalated_to=None), outcome)
        else:
            progress = self._db.complete_job(job, outcome)
        if progress is None:
            return _not_kept()
        count("PagesFailed" if hard else "PagesCompleted")
        if progress.all_pages_done:
            self._finish(progress.document_id)
        return True

    # --- sending ---------------------------------------------------------------------------------------------------

    def submit(self) -> tuple[int, int]:
        """Send the waiting pages, a batch per model of at most BATCH_MAX_PAGES: (batches sent, pages sent)."""
        settings, batches, pages = self._settings, 0, 0
        for model in self._db.waiting_models(limit=MAX_BATCHES_PER_SWEEP):
            while batches < MAX_BATCHES_PER_SWEEP and not self._out_of_time():
                opened = self._db.open_batch(
                    dialect=settings.batch_dialect,
                    model=model,
                    limit=settings.batch_max_pages,
                    window_seconds=settings.batch_window_hours * 3600,
                    lease_seconds=park_seconds(settings),
                )
                if opened is None:
                    break
                if not self._send(model, *opened):
                    return batches, pages
                batches, pages = batches + 1, pages + len(opened[1])
        return batches, pages

    def _send(self, model: str, batch_id: str, pages: list[BatchPage]) -> bool:
        documents = self._db.get_documents(sorted({page.job.document_id for page in pages}))
        requests = [self._request(page, documents[page.job.document_id], model) for page in pages]
        try:
            sent = self._api.submit(model, requests, window_hours=self._settings.batch_window_hours)
        except BatchApiError as exc:
            log.warning("a batch of %d pages was not sent: %s", len(pages), exc)
            self._db.batch_not_sent(batch_id, str(exc))
            count("BatchApiErrors")
            return False
        self._db.batch_sent(
            batch_id, provider_batch_id=sent.provider_batch_id, input_file_id=sent.input_file_id, status=sent.status
        )
        count("BatchesSubmitted")
        count("BatchPagesSubmitted", len(pages))
        log.info("batch %s sent: %d pages of %s", sent.provider_batch_id, len(pages), model)
        return True

    def _request(self, page: BatchPage, document: DocumentRecord, model: str) -> BatchRequest:
        assert page.image_key is not None, "a page is parked with its kept image"
        url = self._objects.presign_get(
            document.bucket, page.image_key, expires_in=self._settings.batch_image_url_seconds
        )
        prompt = document.prompt or self._settings.prompt
        return BatchRequest(page.job.job_id, model, prompt, url, self._settings.max_output_tokens)


def _evidence(recorded: dict[str, Any]) -> PageEvidence:
    """What the checks need of the page's render, as it was recorded when the page was parked."""
    return PageEvidence(
        ink=float(recorded.get("ink", 0.0)),
        text_layer=str(recorded.get("text_layer", "")),
        rotation=int(recorded.get("rotation", 0)),
    )


def _not_kept() -> bool:
    count("BatchAnswersNotKept")
    return False


def _count_call(result: Transcription) -> None:
    count_for_model("ModelCalls", result.model)
    count_for_model("BatchCalls", result.model)
    count("PromptTokens", result.prompt_tokens or 0)
    count("CompletionTokens", result.completion_tokens or 0)
    count_for_model("CostUSD", result.model, result.cost or 0.0)
