"""A claimed page, from its source to its result: rendered (or read from its text layer), asked of the model, escalated
when its answer must be, and its result written under its lease."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pagescribe.assembly import TranscriptWriter
from pagescribe.aws import JobQueue, ObjectMissingError
from pagescribe.batchlane import lane_of, park_seconds
from pagescribe.checks import Flag, PageEvidence, PageFlag, describe_flags, hard_flags, usable_text_layer
from pagescribe.domain import NO_OUTCOME, ClaimedJob, Claims, DocumentRecord, Lane, PageResult
from pagescribe.governor import Admission, RateGovernor
from pagescribe.observability import count, count_flags
from pagescribe.providers.base import ProviderError, TranscriptionProvider
from pagescribe.rendering import RenderPool, RenderWorkerError
from pagescribe.secondread import SecondReader, quiet
from pagescribe.settings import Settings
from pagescribe.sources.documents import DocumentKind, InvalidDocumentError
from pagescribe.sources.pages import RenderedPage, crop_figures
from pagescribe.store.ports import Store
from pagescribe.timepolicy import Deadline
from pagescribe.transcription.asking import CheckedAnswer, ModelCaller, SeenPage
from pagescribe.transcription.batch import TranscriptionBatch
from pagescribe.transcription.gates import CallGates
from pagescribe.transcription.outcomes import rejection, text_layer_outcome, thresholds
from pagescribe.transcription.prerender import PageImages, page_key
from pagescribe.transcription.results import PageContext, PageResults
from pagescribe.transcription.sourcecache import SourceCache
from pagescribe.transcription.tiles import TileAsk, TiledReader

if TYPE_CHECKING:
    from pagescribe.grounding import PageText

log = logging.getLogger(__name__)


class NotEnoughTimeError(RuntimeError):
    """Too little of the invocation is left for a useful model call: the page is left for redelivery."""


@dataclass(frozen=True)
class AskedFor:
    """What a claimed page is asked of: the model, the flags it escalated with, and what the gates granted."""

    model: str
    earlier: list[PageFlag]
    escalated_to: str | None
    admitted: Admission


def _model_to_ask(job: ClaimedJob, document: DocumentRecord) -> tuple[str, list[PageFlag], str | None]:
    """The model a claimed page is asked of, with the flags it escalated with and the model it escalated to: the
    re-run's or the document's model, or straight the escalation model when an earlier claim escalated the page."""
    escalation_model = document.escalation_model
    if job.escalation_pending and escalation_model:
        return escalation_model, [PageFlag.from_dict(flag) for flag in job.flags], escalation_model
    return job.requested_model or document.model, [], None


class Transcriber:
    """Transcribes the claimed pages of a batch, each by its own message, concurrently."""

    def __init__(
        self,
        settings: Settings,
        db: Store,
        queue: JobQueue,
        provider: TranscriptionProvider,
        sources: SourceCache,
        renderer: RenderPool,
        transcripts: TranscriptWriter,
        reader: SecondReader,
    ) -> None:
        self._settings = settings
        self._db = db
        self._sources = sources
        self._images = PageImages(settings, renderer)
        self._transcripts = transcripts
        self._reader = reader
        self._governor = RateGovernor(settings, db, provider.name, provider.serving)
        self._results = PageResults(settings, db, queue, transcripts)
        self._gates = CallGates(settings, db, self._governor, self._results)
        self._caller = ModelCaller(settings, db, provider, self._governor, thresholds(settings))
        self._tiles = TiledReader(settings, db, self._caller, self._gates, self._results, renderer, sources)

    def batch(self, bodies: Sequence[str], deadline: Deadline) -> TranscriptionBatch:
        """The jobs of one SQS batch, to be transcribed concurrently by ``deadline``, one
        ``TranscriptionBatch.transcribe`` per message."""
        return TranscriptionBatch(self, bodies, deadline)

    def settle_calls(self) -> None:
        """The calls' real tokens settled with the rate governor, for the calls made since the last time. A failure
        is logged, not the batch's: its pages are written, and the bucket is an estimate (the next calls' settle)."""
        try:
            self._governor.flush()
        except Exception:
            log.exception("the batch's calls could not be settled with the rate governor")

    def claim_batch(self, job_ids: Sequence[str], deadline: Deadline) -> Claims:
        """Claim a batch's jobs, and read their documents, in one statement.

        Raises NotEnoughTimeError, claiming nothing, when too little of the invocation is left for a useful
        model call. Each claim is committed before any model is called, and no transaction stays open."""
        remaining = deadline.remaining()
        if not deadline.policy.enough_for_a_call(remaining):
            raise NotEnoughTimeError(
                f"only {remaining:.1f} s of the invocation left; the batch's jobs are left for redelivery"
            )
        claims = self._db.claim_jobs(
            job_ids,
            lease_seconds=deadline.policy.lease(remaining),
            max_attempts=self._settings.max_attempts,
        )
        documents = claims.documents  # nothing is rendered ahead before the batch's calls are sent
        self._images.hold(
            page_key(documents[job.document_id], job.page_number)
            for job in claims.claimed.values()
            if job.document_id in documents
        )
        return claims

    async def transcribe_claimed(
        self, job: ClaimedJob, document: DocumentRecord, deadline: Deadline, *, batch_pages: Collection[int] = ()
    ) -> PageResult:
        """Transcribe a claimed page and store the result under its lease (or its failure, or a retry). The pages
        after ``batch_pages`` (the document's pages claimed with it) are rendered ahead once it is rendered."""
        sent = functools.partial(self._images.sent, page_key(document, job.page_number))
        ctx = PageContext(job, document, on_sent=sent)
        try:
            return await self._transcribe_claimed(ctx, deadline, batch_pages)
        except InvalidDocumentError as exc:
            return await self._results.fail(ctx, f"the page could not be rendered: {exc.reason}")
        except ObjectMissingError as exc:
            return await self._results.fail(ctx, f"the source document is gone: {exc}")
        except RenderWorkerError as exc:  # the render processes', not the page's: another attempt may get a working one
            return await self._results.requeue(ctx, str(exc), None)
        except ProviderError as exc:
            if not exc.retryable:
                return await self._results.fail(ctx, exc.args[0])
            if exc.status_code == 429 and self._governor.enabled:  # paused for everyone: the page waits its turn
                return await self._results.defer(ctx, Admission(exc.retry_after or 0.0, why=exc.args[0]))
            return await self._results.requeue(ctx, exc.args[0], retry_after=exc.retry_after)
        except Exception:  # the page's message goes back to the queue, its lease to the sweeper: say why, with its ids
            log.exception("page failed unexpectedly; its message will be delivered again", extra=ctx.log_extra)
            raise
        finally:
            sent()  # the page ended, with or without a call

    async def _transcribe_claimed(
        self, ctx: PageContext, deadline: Deadline, batch_pages: Collection[int]
    ) -> PageResult:
        settings, job, document = self._settings, ctx.job, ctx.document
        async with self._sources.use(document) as source:  # the file stays on disk while it is read
            if document.kind is None:
                raise InvalidDocumentError("the document has no detected type")
            kind = DocumentKind(document.kind)
            if settings.text_layer == "auto" and kind is DocumentKind.PDF:
                embedded = await self._images.text_layer(document, source, job.page_number)
                if usable_text_layer(embedded.text):
                    return await self._results.complete(ctx, text_layer_outcome(embedded.laid_out, []))
            model, earlier, escalated_to = _model_to_ask(job, document)
            batch = lane_of(document, job.lane, settings) is Lane.BATCH and not job.escalation_pending
            # before the render: a page held back renders nothing
            admitted = await (self._gates.admit_batch(ctx, model) if batch else self._gates.admit(ctx, model))
            if isinstance(admitted, PageResult):
                return admitted
            rendered = await self._images.render(document, source, kind, job.page_number)
            self._images.follow(document, source, batch_pages)  # once a page of the batch is rendered: no sooner
        keeping = [self._keep_image(ctx, rendered)] if settings.keep_page_images and not batch else []
        keeping += [self._keep_figures(ctx, rendered)] if rendered.figures else []
        ctx.storing.extend(asyncio.create_task(work) for work in keeping)
        try:
            if batch and not rendered.draws:
                return await self._park(ctx, rendered, model)
            return await self._answer(ctx, rendered, AskedFor(model, earlier, escalated_to, admitted), deadline)
        finally:  # stored while the model answered; the invocation does not end before they are
            await self._results.stored(ctx)
            self._results.note_image(ctx)

    async def _answer(
        self, ctx: PageContext, rendered: RenderedPage, asked: AskedFor, deadline: Deadline
    ) -> PageResult:
        """The rendered page to the model (and on to the escalation model if its answer must), and its result."""
        if rendered.draws:
            return await self._blank_render(ctx, rendered)
        call_seconds = deadline.call()
        if call_seconds < deadline.policy.min_call:
            return await self._results.requeue(
                ctx, f"only {call_seconds:.1f} s left for the model call after rendering", None
            )
        seen = self._seen(ctx, rendered, deadline)
        try:
            tiled = TileAsk(asked.model, asked.earlier, asked.admitted)
            checked = await self._tiles.ask(ctx, seen, tiled, call_seconds)
            if isinstance(checked, PageResult):  # a tile was held back, or too little time was left for one
                return checked
            if not checked.hard:
                return await self._results.complete(ctx, checked.outcome)
            escalation_model = ctx.document.escalation_model
            if ctx.job.escalation is not None or not escalation_model:  # escalated already, or nowhere to escalate to
                flags, to = checked.flags, asked.escalated_to
                return await self._results.fail(ctx, rejection(flags, escalated_to=to), checked.outcome)
            return await self._escalate(ctx, seen, checked, escalation_model)
        finally:
            await seen.close()

    def _seen(self, ctx: PageContext, rendered: RenderedPage, deadline: Deadline) -> SeenPage:
        """The page as its answers are checked: its own words where it has a usable text layer (rendered ahead with
        its image, or placed now, as its call starts); otherwise its second read, started now too (none when the
        offline engine itself reads the page)."""
        evidence = PageEvidence(
            ink=rendered.ink, text_layer=rendered.text_layer, rotation=rendered.rotation, words=rendered.words
        )
        mode = ctx.document.second_read or self._settings.second_read
        own_words = usable_text_layer(rendered.text_layer)
        placing = None
        if own_words and rendered.words is None:
            placing = asyncio.create_task(self._place_words(ctx.document, ctx.job.page_number))
            placing.add_done_callback(quiet)
        reading = None
        if not own_words and not self._settings.uses_offline_provider:
            reading = self._reader.start(rendered, mode=mode, seconds_left=deadline.until_result())
        return SeenPage(rendered, evidence, placing, reading, mode, deadline)

    async def _place_words(self, document: DocumentRecord, page_number: int) -> PageText:
        async with self._sources.use(document) as source:  # the file stays on disk while they are placed
            return await self._images.words(source, page_number)

    async def _park(self, ctx: PageContext, rendered: RenderedPage, model: str) -> PageResult:
        """A page of the batch lane: its image kept (the provider reads it from a presigned URL) and the page parked
        under its lease, with what the checks need of its render, for the sweeper to send in a batch."""
        image_key = await asyncio.to_thread(
            self._transcripts.keep_page_image, ctx.document, ctx.job.page_number, rendered.data, rendered.media_type
        )
        evidence = {"ink": rendered.ink, "text_layer": rendered.text_layer, "rotation": rendered.rotation}
        wait = park_seconds(self._settings)
        if not self._db.park_for_batch(ctx.job, model=model, image_key=image_key, evidence=evidence, wait_seconds=wait):
            return self._results.lease_lost(ctx)
        log.info("page parked for a batch of %s", model, extra=ctx.log_extra)
        count("BatchPagesParked")
        return PageResult.PARKED

    async def _keep_figures(self, ctx: PageContext, rendered: RenderedPage) -> None:
        """Crop the page's figures from its image, store them beside the transcript and note their keys and boxes on
        the page. A page whose figures could not be kept is transcribed all the same: logged and counted."""
        try:
            crops = await asyncio.to_thread(crop_figures, rendered.data, rendered.figures)
            figures = []
            for number, (box, crop) in enumerate(zip(rendered.figures, crops, strict=True), start=1):
                key = await asyncio.to_thread(
                    self._transcripts.keep_figure, ctx.document, ctx.job.page_number, number, crop
                )
                figures.append({"key": key, "bbox": list(box), "points_per_pixel": rendered.points_per_pixel})
            self._db.keep_figures(ctx.job, figures)
        except Exception:
            log.exception("the page's figures could not be kept", extra=ctx.log_extra)
            count("FiguresNotKept")

    async def _keep_image(self, ctx: PageContext, rendered: RenderedPage) -> None:
        """Store the image the page is sent to the model as, once the batch's calls are sent (or the page's own are
        over); its key is noted on the page by the write that ends it (PageResults.note_image). A page whose image
        could not be kept is transcribed all the same: the failure is logged and counted, not the page's."""
        try:
            await self._images.after_calls(ctx.calls_over)  # the batch's calls go out first
            ctx.image.key = await asyncio.to_thread(
                self._transcripts.keep_page_image, ctx.document, ctx.job.page_number, rendered.data, rendered.media_type
            )
        except Exception:
            log.exception("the page's image could not be kept", extra=ctx.log_extra)
            count("PageImagesNotKept")

    async def _escalate(self, ctx: PageContext, seen: SeenPage, checked: CheckedAnswer, model: str) -> PageResult:
        """Ask the escalation model once for a page whose answer is hard-flagged. The escalation is recorded (with the
        flagged answer, kept as the page's text meanwhile) before the call, under the lease: a duplicate or a later
        delivery of the page finds it escalated and never escalates it again."""
        if not self._db.escalate_job(ctx.job, checked.outcome):
            return self._results.lease_lost(ctx)
        why = describe_flags(hard_flags(checked.flags))
        log.warning("page escalated to %s: %s", model, why, extra=ctx.log_extra)
        count("PagesEscalated")
        admitted = await self._gates.admit(ctx, model)
        if isinstance(admitted, PageResult):
            return admitted
        call_seconds = seen.deadline.call()
        if call_seconds < seen.deadline.policy.min_call:
            return await self._results.requeue(
                ctx, f"escalated to {model} ({why}); only {call_seconds:.1f} s left for its call", None
            )
        try:
            escalated = await self._tiles.ask(ctx, seen, TileAsk(model, checked.flags, admitted), call_seconds)
        except ProviderError as exc:
            raise ProviderError(
                f"escalated to {model} ({why}), which failed: {exc.message}",
                retryable=exc.retryable,
                status_code=exc.status_code,
                retry_after=exc.retry_after,
            ) from exc
        if isinstance(escalated, PageResult):
            return escalated
        if not escalated.hard:
            return await self._results.complete(ctx, escalated.outcome)
        return await self._results.fail(ctx, rejection(escalated.flags, escalated_to=model), escalated.outcome)

    async def _blank_render(self, ctx: PageContext, rendered: RenderedPage) -> PageResult:
        """A page that draws text or paths but rendered blank is not sent to the model as a blank image: its own text
        layer stands in for it where it has a usable one (flagged); otherwise it fails, with no call made."""
        flags = [PageFlag(Flag.BLANK_RENDER, rendered.marked, self._settings.flag_blank_render_threshold)]
        count_flags(flag.flag for flag in flags)
        usable = usable_text_layer(rendered.text_layer)
        if usable and self._settings.text_layer != "off":
            return await self._results.complete(ctx, text_layer_outcome(rendered.laid_out_text, flags))
        instead = "with TEXT_LAYER=off its text layer may not stand in" if usable else "it has no usable text layer"
        reason = rejection(flags, then=f"{instead}, and no model was asked to read a blank image")
        return await self._results.fail(ctx, reason, NO_OUTCOME._replace(flags=tuple(flag.as_dict() for flag in flags)))
