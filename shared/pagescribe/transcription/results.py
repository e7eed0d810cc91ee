"""A claimed page's result, written under its lease: completed, failed, skipped, deferred or requeued."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pagescribe.assembly import TranscriptWriter
from pagescribe.aws import JobMessage, JobQueue
from pagescribe.checks import PageFlag
from pagescribe.domain import (
    NO_OUTCOME,
    ClaimedJob,
    DocumentProgress,
    DocumentRecord,
    PageEnd,
    PageOutcome,
    PageResult,
)
from pagescribe.governor import Admission
from pagescribe.observability import count
from pagescribe.outbox import send_committed
from pagescribe.settings import Settings
from pagescribe.store.ports import Store
from pagescribe.transcription.completions import Completions

log = logging.getLogger(__name__)

MAX_RETRY_DELAY_SECONDS = 900  # SQS's longest message delay


def retry_delay_seconds(settings: Settings, attempts: int, retry_after: float | None) -> int:
    """Exponential backoff per claim, never sooner than the provider asked, within SQS's delay limit."""
    backoff = settings.retry_base_seconds * 2.0 ** max(0, attempts - 1)
    return min(MAX_RETRY_DELAY_SECONDS, math.ceil(max(backoff, retry_after or 0.0)))


@dataclass
class KeptImage:
    """The image a page was sent to the model as, once stored in the bucket (``key``), and whether a write noted it
    on the page."""

    key: str | None = None
    noted: bool = False


@dataclass(frozen=True)
class PageContext:
    """A claimed page at work: its job, its document, and its figures (and image) being stored."""

    job: ClaimedJob
    document: DocumentRecord
    storing: list[asyncio.Task[None]] = field(default_factory=list)  # the page's figures (and image) being stored
    on_sent: Callable[[], None] | None = None  # the page's first call is on its way (see PageImages.sent)
    image: KeptImage = field(default_factory=KeptImage)  # noted by the write that ends the page (see note_image)
    calls_over: asyncio.Event = field(default_factory=asyncio.Event)  # the page asks no more: its image is wanted

    @property
    def log_extra(self) -> dict[str, Any]:
        return {
            "document_id": self.job.document_id,
            "job_id": self.job.job_id,
            "page": self.job.page_number,
            "attempt": self.job.attempts,
        }


class PageResults:
    """Writes a page's result under its lease (a write the lease no longer allows is LEASE_LOST), counts it, and
    finishes its document when it was the last page."""

    def __init__(self, settings: Settings, db: Store, queue: JobQueue, transcripts: TranscriptWriter) -> None:
        self._settings = settings
        self._db = db
        self._queue = queue
        self._transcripts = transcripts
        self._completions = Completions(db)

    async def stored(self, ctx: PageContext) -> None:
        """The page's figures and image stored (the figures noted on it), so that the write that ends the page notes
        its image and the finish that its end may set off finds them. The page asks no more: its image is stored now,
        whether or not the batch's other pages have sent their calls (``PageImages.after_calls``)."""
        ctx.calls_over.set()
        while ctx.storing:
            await ctx.storing.pop()

    def note_image(self, ctx: PageContext) -> None:
        """The page's image noted on it by a statement of its own: for a page whose attempt did not end it (requeued,
        deferred); a page's end notes it in the same write. A failure is logged and counted, not the page's."""
        if ctx.image.key is None or ctx.image.noted:
            return
        try:
            self._db.keep_page_image(ctx.job, ctx.image.key)
        except Exception:
            log.exception("the page's image could not be noted", extra=ctx.log_extra)
            count("PageImagesNotKept")
        ctx.image.noted = True

    async def complete(self, ctx: PageContext, outcome: PageOutcome) -> PageResult:
        await self.stored(ctx)
        progress = await self._completions.complete(PageEnd(ctx.job, outcome, ctx.image.key))
        ctx.image.noted = True
        if progress is None:
            return self.lease_lost(ctx)
        log.info(
            "page completed",
            extra={
                **ctx.log_extra,
                "provider": outcome.provider,
                "model": outcome.model,
                "latency_ms": outcome.latency_ms,
                "request_id": outcome.provider_request_id,
                "flags": [flag["flag"] for flag in outcome.flags],
            },
        )
        count("PagesCompleted")
        await self._after_page(progress)
        return PageResult.COMPLETED

    async def fail(self, ctx: PageContext, reason: str, outcome: PageOutcome = NO_OUTCOME) -> PageResult:
        await self.stored(ctx)
        progress = self._db.fail_job(ctx.job, reason, outcome, image_key=ctx.image.key)
        ctx.image.noted = True
        if progress is None:
            return self.lease_lost(ctx)
        log.warning("page failed: %s", reason, extra={**ctx.log_extra, "flags": [f["flag"] for f in outcome.flags]})
        count("PagesFailed")
        if any(PageFlag.from_dict(flag).hard for flag in outcome.flags):
            count("PagesRejected")
        await self._after_page(progress)
        return PageResult.FAILED

    async def skip(self, ctx: PageContext, reason: str) -> PageResult:
        progress = self._db.skip_job(ctx.job, reason)
        if progress is None:
            return self.lease_lost(ctx)
        log.warning("page skipped: %s", reason, extra=ctx.log_extra)
        count("PagesSkipped")
        await self._after_page(progress)
        return PageResult.SKIPPED

    async def defer(self, ctx: PageContext, admission: Admission) -> PageResult:
        """Back to the queue before any call, its claim given back: no Lambda time is spent waiting."""
        delay = admission.delay_seconds
        reason = f"held back {delay} s before its model call: {admission.why}"
        deferred = self._db.defer_job(
            ctx.job, reason, delay_seconds=delay, slot_at=admission.slot_at, keep_slot=admission.keep_slot
        )
        if not deferred:
            return self.lease_lost(ctx)
        self._send_again(ctx, delay)
        log.info("page deferred: %s", reason, extra=ctx.log_extra)
        count("PagesDeferred")
        return PageResult.DEFERRED

    async def requeue(self, ctx: PageContext, reason: str, retry_after: float | None) -> PageResult:
        """Back to the queue after a backoff for another claim (an automatic retry), or FAILED when its claims are
        used up (MAX_ATTEMPTS)."""
        if ctx.job.attempts >= self._settings.max_attempts:
            return await self.fail(
                ctx, f"attempts exhausted ({ctx.job.attempts} of {self._settings.max_attempts}): {reason}"
            )
        delay = retry_delay_seconds(self._settings, ctx.job.attempts, retry_after)
        if not self._db.requeue_job(ctx.job, reason, delay_seconds=delay):
            return self.lease_lost(ctx)
        self._send_again(ctx, delay)
        log.warning("page requeued in %d s: %s", delay, reason, extra=ctx.log_extra)
        count("PagesRequeued")
        return PageResult.REQUEUED

    def _send_again(self, ctx: PageContext, delay: int) -> None:
        """The page's message, again, due in ``delay`` seconds (its row is QUEUED again and committed)."""
        job = ctx.job
        send_committed(
            self._queue, self._db, [JobMessage(job.job_id, job.document_id, job.page_number)], delay_seconds=delay
        )

    def lease_lost(self, ctx: PageContext) -> PageResult:
        log.warning("lease lost: a newer claim owns this page; the result is not written", extra=ctx.log_extra)
        count("LeaseLost")
        return PageResult.LEASE_LOST

    async def _after_page(self, progress: DocumentProgress) -> None:
        if progress.all_pages_done:
            await asyncio.to_thread(self._transcripts.finish, progress.document_id)
