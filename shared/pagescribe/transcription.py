"""Transcribe: one page job from claim to fenced result, concurrently with the other pages of a batch."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import shutil
import tempfile
import uuid
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pagescribe.assembly import TranscriptWriter
from pagescribe.aws import JobMessage, JobQueue, ObjectMissingError, ObjectStore
from pagescribe.checks import (
    Answer,
    Flag,
    PageEvidence,
    PageFlag,
    Thresholds,
    check_answer,
    clean_answer,
    describe_flags,
    ground,
    hard_flags,
    merge_flags,
    usable_text_layer,
)
from pagescribe.database import Database
from pagescribe.domain import (
    NO_OUTCOME,
    ClaimedJob,
    Claims,
    DocumentProgress,
    DocumentRecord,
    FailedCall,
    PageOutcome,
    PageResult,
    SpendVerdict,
)
from pagescribe.governor import Admission, RateGovernor
from pagescribe.observability import count, count_flags, count_for_model, gauge, milliseconds
from pagescribe.outbox import send_committed
from pagescribe.providers.base import (
    FailedAttempt,
    PageImage,
    ProviderError,
    Transcription,
    TranscriptionProvider,
    TranscriptionRequest,
)
from pagescribe.rendering import RenderPool, RenderWorkerError
from pagescribe.secondread import PendingRead, SecondReader
from pagescribe.settings import Settings
from pagescribe.sources import DocumentKind, InvalidDocumentError, RenderedPage, crop_figures
from pagescribe.timepolicy import Deadline

if TYPE_CHECKING:  # grounding (rapidfuzz, markdown-it) is loaded by the first answer grounded
    from pagescribe.grounding import PageGrounding

log = logging.getLogger(__name__)

MAX_RETRY_DELAY_SECONDS = 900  # SQS's longest message delay


class MalformedMessageError(ValueError):
    """An SQS message that does not name a job; it can never succeed."""


class JobBusyError(RuntimeError):
    """The job's row stayed held by another transaction through the claim's wait: its message is left for
    redelivery."""


class NotEnoughTimeError(RuntimeError):
    """Too little of the invocation is left for a useful model call: the page is left for redelivery."""


def parse_job_id(body: str) -> str:
    try:
        payload = json.loads(body)
    except json.JSONDecodeError as exc:
        raise MalformedMessageError(f"message body is not JSON: {body[:80]!r}") from exc
    job_id = payload.get("job_id") if isinstance(payload, dict) else None
    try:
        return str(uuid.UUID(str(job_id)))
    except ValueError as exc:
        raise MalformedMessageError(f"message body names no valid job_id: {body[:80]!r}") from exc


TEXT_LAYER = "pdf-text-layer"


def thresholds(settings: Settings) -> Thresholds:
    """The checks' thresholds, as configured."""
    return Thresholds(
        repetition=settings.flag_repetition_threshold,
        refusal=settings.flag_refusal_threshold,
        ink=settings.flag_ink_threshold,
        blank_render=settings.flag_blank_render_threshold,
        ungrounded=settings.flag_ungrounded_threshold,
        ungrounded_block_chars=settings.flag_ungrounded_block_chars,
        missed_text=settings.flag_missed_text_threshold,
        low_confidence=settings.flag_low_confidence_threshold,
    )


_WHY = {
    Flag.TRUNCATED: "the model stopped at the output limit (finish_reason=length, MAX_OUTPUT_TOKENS)",
    Flag.REPETITION: "the answer repeats itself in a loop",
    Flag.REFUSAL: "the model apologised or refused instead of transcribing",
    Flag.EMPTY: "no text from a page that has ink",
    Flag.BLANK_RENDER: "the page rendered blank although it draws text or paths (missing fonts, or a render failure)",
    Flag.UNGROUNDED: "the answer holds text that nothing on the page supports (invented text)",
    Flag.MISSED_TEXT: "the answer leaves out text that is on the page (dropped regions)",
}


def rejection(flags: list[PageFlag], *, escalated_to: str | None = None, then: str = "its text is kept") -> str:
    """Why a page failed on its hard flags: each flag with its value and threshold, and what it means."""
    reasons = "; ".join(f"{flag.describe()}: {_WHY[flag.flag]}" for flag in hard_flags(flags))
    after = f", also from the escalation model {escalated_to}" if escalated_to else ""
    return f"the answer was not accepted{after}: {reasons}; {then}"


def budget_reason(verdict: SpendVerdict, model: str, tenant_id: str) -> str:
    """Why a page was not started: the cap or budget, what was spent, and the price its call was judged at."""
    price = (
        f"a call of {model} is held at its worst case, ${verdict.reserve:.6f} (its output limit at the tenant's own "
        f"prices; ${verdict.price:.6f} on average)"
        if verdict.reserve is not None and verdict.price is not None
        else f"{model} has no cost history yet"
    )
    if verdict.verdict == "DAILY_BUDGET":
        assert verdict.daily_budget_usd is not None
        return (
            f"budget: tenant {tenant_id}'s daily budget of ${verdict.daily_budget_usd:.6f} would be exceeded "
            f"(${verdict.spent_today:.6f} spent today, UTC; {price})"
        )
    assert verdict.max_cost_usd is not None
    return (
        f"budget: the document's max_cost_usd of ${verdict.max_cost_usd:.6f} would be exceeded "
        f"(${verdict.spent:.6f} spent; {price})"
    )


SPEND_DEFER_SECONDS = 2  # a capped document's page waits this long for the calls in flight to settle


def retry_delay_seconds(settings: Settings, attempts: int, retry_after: float | None) -> int:
    """Exponential backoff per attempt, never sooner than the provider asked, within SQS's delay limit."""
    backoff = settings.retry_base_seconds * 2.0 ** max(0, attempts - 1)
    return min(MAX_RETRY_DELAY_SECONDS, math.ceil(max(backoff, retry_after or 0.0)))


class SourceCache:
    """Downloaded source documents, kept on local disk across warm invocations (a batch's pages usually
    share one document). Bounded by entry count, but a file a page is reading is never evicted; one
    download per document at a time."""

    def __init__(self, objects: ObjectStore, *, max_entries: int = 4) -> None:
        self._objects = objects
        self._max_entries = max_entries
        self._root = Path(tempfile.mkdtemp(prefix="pagescribe-sources-"))
        self._entries: OrderedDict[str, Path] = OrderedDict()
        self._locks: dict[str, asyncio.Lock] = {}
        self._in_use: Counter[str] = Counter()

    @staticmethod
    def _key(document: DocumentRecord) -> str:
        return f"{document.document_id}-{document.etag}-{document.version_id}"

    @contextlib.asynccontextmanager
    async def use(self, document: DocumentRecord) -> AsyncIterator[Path]:
        """The document's local copy, kept on disk until the block ends (pages of more documents than the
        cache holds run concurrently in one batch: evicting a file another page reads would fail that page)."""
        key = self._key(document)
        self._in_use[key] += 1
        try:
            yield await self.path_for(document)
        finally:
            self._in_use[key] -= 1
            if self._in_use[key] <= 0:
                del self._in_use[key]
            self._evict()

    def _evict(self) -> None:
        idle = [key for key in self._entries if key not in self._in_use]
        for key in idle[: max(0, len(self._entries) - self._max_entries)]:
            self._entries.pop(key).unlink(missing_ok=True)

    async def path_for(self, document: DocumentRecord) -> Path:
        key = self._key(document)
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            cached = self._entries.get(key)
            if cached is not None and cached.exists():
                self._entries.move_to_end(key)
                return cached
            path = self._root / f"{len(self._entries)}-{document.document_id}"
            await asyncio.to_thread(
                self._objects.download,
                document.bucket,
                document.object_key,
                path,
                version_id=document.version_id or None,
                etag=document.etag or None,
            )
            self._entries[key] = path
            self._evict()
            return path

    def close(self) -> None:
        shutil.rmtree(self._root, ignore_errors=True)


@dataclass(frozen=True)
class _Context:
    job: ClaimedJob
    document: DocumentRecord
    storing: list[asyncio.Task[None]] = field(default_factory=list)  # the page's figures (and image) being stored

    @property
    def log_extra(self) -> dict[str, Any]:
        return {
            "document_id": self.job.document_id,
            "job_id": self.job.job_id,
            "page": self.job.page_number,
            "attempt": self.job.attempts,
        }


def _outcome(result: Transcription, provider: str, text: str, flags: list[PageFlag]) -> PageOutcome:
    return PageOutcome(
        text=text,
        finish_reason=result.finish_reason,
        prompt_tokens=result.prompt_tokens,
        completion_tokens=result.completion_tokens,
        cost=result.cost,
        model=result.model,
        provider=provider,
        provider_request_id=result.request_id,
        latency_ms=round(result.latency_seconds * 1000),
        flags=tuple(flag.as_dict() for flag in flags),
        confidence=result.confidence,
    )


def _text_layer_outcome(text: str, flags: list[PageFlag]) -> PageOutcome:
    """The page's own text layer, laid out in reading order, as its answer: no model call, nothing paid."""
    return PageOutcome(
        text,
        "text-layer",
        0,
        0,
        0.0,
        TEXT_LAYER,
        TEXT_LAYER,
        None,
        0,
        flags=tuple(flag.as_dict() for flag in flags),
        called=False,
    )


def _grounding_kept(
    grounding: PageGrounding | None, evidence: PageEvidence, read: dict[str, Any]
) -> dict[str, Any] | None:
    """What is kept of the answer's grounding: the grounding, or why the page had nothing to ground it to."""
    if grounding is not None and evidence.words is not None:
        from pagescribe.grounding import grounding_record

        return grounding_record(grounding, evidence.words)
    if "skipped" in read:
        return {"source": None, "skipped": f"no second read: {read['skipped']}"}
    return None


@dataclass(frozen=True)
class _Seen:
    """A rendered page as its answers are checked: what the renderer saw, and its second read, on its way (None when
    the page has its own words, or the offline engine reads it, or reads are off)."""

    rendered: RenderedPage
    evidence: PageEvidence
    reading: PendingRead | None
    mode: str  # the page's SECOND_READ
    deadline: Deadline


@dataclass(frozen=True)
class _Asked:
    """What a claimed page is asked of: the model, the flags it escalated with, and what the gates granted."""

    model: str
    earlier: list[PageFlag]
    escalated_to: str | None
    admitted: Admission


@dataclass(frozen=True)
class _Checked:
    """A model's answer, cleaned and checked."""

    outcome: PageOutcome
    flags: list[PageFlag]

    @property
    def hard(self) -> bool:
        return bool(hard_flags(self.flags))


class Transcriber:
    def __init__(
        self,
        settings: Settings,
        db: Database,
        queue: JobQueue,
        provider: TranscriptionProvider,
        sources: SourceCache,
        renderer: RenderPool,
        transcripts: TranscriptWriter,
        reader: SecondReader,
    ) -> None:
        self._settings = settings
        self._db = db
        self._queue = queue
        self._provider = provider
        self._sources = sources
        self._renderer = renderer
        self._transcripts = transcripts
        self._reader = reader
        self._thresholds = thresholds(settings)
        self._governor = RateGovernor(settings, db, provider.name)

    def batch(self, bodies: Sequence[str], deadline: Deadline) -> TranscriptionBatch:
        """The jobs of one SQS batch, to be transcribed concurrently by ``deadline``, one
        ``TranscriptionBatch.transcribe`` per message."""
        return TranscriptionBatch(self, bodies, deadline)

    def claim_batch(self, job_ids: Sequence[str], deadline: Deadline) -> tuple[Claims, dict[str, DocumentRecord]]:
        """Claim a batch's jobs in one statement and read their documents in one: (claims, documents by id).

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
        documents = self._db.get_documents([job.document_id for job in claims.claimed.values()])
        return claims, documents

    async def transcribe_claimed(self, job: ClaimedJob, document: DocumentRecord, deadline: Deadline) -> PageResult:
        """Transcribe a claimed page and store the result under its lease (or its failure, or a retry)."""
        ctx = _Context(job, document)
        try:
            return await self._transcribe_claimed(ctx, deadline)
        except InvalidDocumentError as exc:
            return await self._fail(ctx, f"the page could not be rendered: {exc.reason}")
        except ObjectMissingError as exc:
            return await self._fail(ctx, f"the source document is gone: {exc}")
        except RenderWorkerError as exc:  # the render processes', not the page's: another attempt may get a working one
            return await self._retry(ctx, str(exc), None)
        except ProviderError as exc:
            if not exc.retryable:
                return await self._fail(ctx, exc.args[0])
            if exc.status_code == 429 and self._governor.enabled:  # paused for everyone: the page waits its turn
                return await self._defer(ctx, Admission(exc.retry_after or 0.0, why=exc.args[0]))
            return await self._retry(ctx, exc.args[0], retry_after=exc.retry_after)
        except Exception:  # the page's message goes back to the queue, its lease to the sweeper: say why, with its ids
            log.exception("page failed unexpectedly; its message will be delivered again", extra=ctx.log_extra)
            raise

    async def _transcribe_claimed(self, ctx: _Context, deadline: Deadline) -> PageResult:
        settings, job, document = self._settings, ctx.job, ctx.document
        async with self._sources.use(document) as source:  # the file stays on disk while it is read
            if document.kind is None:
                raise InvalidDocumentError("the document has no detected type")
            kind = DocumentKind(document.kind)
            if settings.text_layer == "auto" and kind is DocumentKind.PDF:
                embedded = await self._renderer.text_layer(source, job.page_number)
                if usable_text_layer(embedded.text):
                    return await self._complete(ctx, _text_layer_outcome(embedded.laid_out, []))
            escalation_model = document.escalation_model
            model, earlier, escalated_to = job.requested_model or document.model, [], None
            if job.escalation_pending and escalation_model:  # escalated by an earlier claim: straight to that model
                model = escalated_to = escalation_model
                earlier = [PageFlag.from_dict(flag) for flag in job.flags]
            admitted = await self._admit(ctx, model)  # before the render: a page held back renders nothing
            if isinstance(admitted, PageResult):
                return admitted
            rendered = await self._renderer.render(
                source,
                kind,
                job.page_number,
                dpi=settings.render_dpi,
                max_long_edge=settings.render_max_long_edge,
                image_format=settings.render_format,
                max_image_pixels=settings.max_image_pixels,
                orient=settings.detect_orientation,
                blank_below=settings.flag_blank_render_threshold,
                words=True,
            )
        keeping = [self._keep_image(ctx, rendered)] if settings.keep_page_images else []
        keeping += [self._keep_figures(ctx, rendered)] if rendered.figures else []
        ctx.storing.extend(asyncio.create_task(work) for work in keeping)
        try:
            return await self._answer(ctx, rendered, _Asked(model, earlier, escalated_to, admitted), deadline)
        finally:
            await self._stored(ctx)  # stored while the model answered; the invocation does not end before they are

    async def _answer(self, ctx: _Context, rendered: RenderedPage, asked: _Asked, deadline: Deadline) -> PageResult:
        """The rendered page to the model (and on to the escalation model if its answer must), and its result."""
        if rendered.draws:
            return await self._blank_render(ctx, rendered)
        call_seconds = deadline.call()
        if call_seconds < deadline.policy.min_call:
            return await self._retry(ctx, f"only {call_seconds:.1f} s left for the model call after rendering", None)
        seen = self._seen(ctx, rendered, deadline)
        try:
            checked = await self._ask(ctx, seen, asked.model, call_seconds, asked.earlier, asked.admitted)
            if not checked.hard:
                return await self._complete(ctx, checked.outcome)
            escalation_model = ctx.document.escalation_model
            if ctx.job.escalation is not None or not escalation_model:  # escalated already, or nowhere to escalate to
                flags, to = checked.flags, asked.escalated_to
                return await self._fail(ctx, rejection(flags, escalated_to=to), checked.outcome)
            return await self._escalate(ctx, seen, checked, escalation_model)
        finally:
            if seen.reading is not None:
                await seen.reading.close()

    def _seen(self, ctx: _Context, rendered: RenderedPage, deadline: Deadline) -> _Seen:
        """The page as its answers are checked: its own words where it has a usable text layer; otherwise its second
        read, started now, as its call starts (none when the offline engine itself reads the page)."""
        evidence = PageEvidence(
            ink=rendered.ink, text_layer=rendered.text_layer, rotation=rendered.rotation, words=rendered.words
        )
        mode = ctx.document.second_read or self._settings.second_read
        reading = None
        if rendered.words is None and not self._settings.uses_offline_provider:
            reading = self._reader.start(rendered, mode=mode, seconds_left=deadline.until_result())
        return _Seen(rendered, evidence, reading, mode, deadline)

    async def _keep_figures(self, ctx: _Context, rendered: RenderedPage) -> None:
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

    async def _keep_image(self, ctx: _Context, rendered: RenderedPage) -> None:
        """Store the image the page is sent to the model as, and note its key on the page. A page whose image could
        not be kept is transcribed all the same: the failure is logged and counted, not the page's."""
        try:
            key = await asyncio.to_thread(
                self._transcripts.keep_page_image, ctx.document, ctx.job.page_number, rendered.data, rendered.media_type
            )
            self._db.keep_page_image(ctx.job, key)  # one short statement, on the loop's thread like the others
        except Exception:
            log.exception("the page's image could not be kept", extra=ctx.log_extra)
            count("PageImagesNotKept")

    async def _escalate(self, ctx: _Context, seen: _Seen, checked: _Checked, model: str) -> PageResult:
        """Ask the escalation model once for a page whose answer is hard-flagged. The escalation is recorded (with the
        flagged answer, kept as the page's text meanwhile) before the call, under the lease: a duplicate or a later
        delivery of the page finds it escalated and never escalates it again."""
        if not self._db.escalate_job(ctx.job, checked.outcome):
            return self._lease_lost(ctx)
        why = describe_flags(hard_flags(checked.flags))
        log.warning("page escalated to %s: %s", model, why, extra=ctx.log_extra)
        count("PagesEscalated")
        admitted = await self._admit(ctx, model)
        if isinstance(admitted, PageResult):
            return admitted
        call_seconds = seen.deadline.call()
        if call_seconds < seen.deadline.policy.min_call:
            return await self._retry(
                ctx, f"escalated to {model} ({why}); only {call_seconds:.1f} s left for its call", None
            )
        try:
            escalated = await self._ask(ctx, seen, model, call_seconds, checked.flags, admitted)
        except ProviderError as exc:
            raise ProviderError(
                f"escalated to {model} ({why}), which failed: {exc.message}",
                retryable=exc.retryable,
                status_code=exc.status_code,
                retry_after=exc.retry_after,
            ) from exc
        if not escalated.hard:
            return await self._complete(ctx, escalated.outcome)
        return await self._fail(ctx, rejection(escalated.flags, escalated_to=model), escalated.outcome)

    async def _ask(
        self, ctx: _Context, seen: _Seen, model: str, seconds: float, earlier: list[PageFlag], admitted: Admission
    ) -> _Checked:
        """One model call for the page, its answer cleaned, grounded and checked. ``earlier``: the flags of the answer
        the page escalated from, whose hard ones (why it escalated) stay the page's beside this answer's own. A call
        that fails is recorded before its error goes on; a 429 pauses every environment's calls to the model."""
        rendered = seen.rendered
        request = TranscriptionRequest(
            image=PageImage(rendered.data, rendered.media_type),
            prompt=ctx.document.prompt or self._settings.prompt,
            model=model,
            max_output_tokens=self._settings.max_output_tokens,
            document_id=ctx.job.document_id,
            page_number=ctx.job.page_number,
        )
        started = asyncio.get_running_loop().time()
        ran = self._provider.answering_model(model)
        try:
            result = await self._provider.transcribe(request, budget_seconds=seconds)
        except ProviderError as exc:
            self._record_failures(ctx, ran, exc.earlier_attempts)
            elapsed = asyncio.get_running_loop().time() - started - sum(a.latency_seconds for a in exc.earlier_attempts)
            self._record_failures(ctx, ran, [FailedAttempt(exc.status_code, exc.message, elapsed)])
            pause = self._governor.rate_limited(model, exc.retry_after) if exc.status_code == 429 else None
            if pause is not None:
                exc.retry_after = max(exc.retry_after or 0.0, pause)
            raise
        self._record_failures(ctx, ran, result.failed_attempts)
        count_for_model("ModelCalls", ran)
        self._governor.settle(model, admitted, (result.prompt_tokens or 0) + (result.completion_tokens or 0))
        milliseconds("ModelLatency", round(result.latency_seconds * 1000))
        count("PromptTokens", result.prompt_tokens or 0)
        count("CompletionTokens", result.completion_tokens or 0)
        count_for_model("CostUSD", ran, result.cost or 0.0)
        answer = Answer(clean_answer(result.text), result.finish_reason, result.completion_tokens, result.confidence)
        evidence, read = await self._evidence(seen, result)
        if result.rotation:  # the engine turned the image it was sent: the page was turned that much more
            evidence = replace(evidence, rotation=(evidence.rotation + result.rotation) % 360)
        grounding = await asyncio.to_thread(ground, answer.text, evidence.words) if evidence.words else None
        flags = check_answer(
            answer, evidence, self._thresholds, max_output_tokens=self._settings.max_output_tokens, grounding=grounding
        )
        count_flags(flag.flag for flag in flags)
        outcome = _outcome(result, self._provider.name, answer.text, flags)._replace(
            grounding=_grounding_kept(grounding, evidence, read), second_read=read or None
        )
        if earlier:
            merged = merge_flags(hard_flags(earlier), flags)
            outcome = outcome._replace(page_flags=tuple(flag.as_dict() for flag in merged))
        return _Checked(outcome, flags)

    async def _evidence(self, seen: _Seen, result: Transcription) -> tuple[PageEvidence, dict[str, Any]]:
        """The page's evidence with the words to ground the answer to, where there are any, and what the page's second
        read is recorded as with the call ({} without one)."""
        rendered = seen.rendered
        if seen.evidence.words is not None:
            return seen.evidence, {}
        if result.lines:  # the offline engine's own answer, with its own boxes
            from pagescribe.grounding import GroundingSource, PageText, words_from_boxes

            words = words_from_boxes(result.lines)
            engine = PageText(GroundingSource.ENGINE, tuple(words), rendered.width, rendered.height, None)
            return replace(seen.evidence, words=engine), {}
        if seen.reading is None:
            return seen.evidence, {}
        wait = SecondReader.wait_seconds(
            seen.mode, call_seconds=result.latency_seconds, seconds_left=seen.deadline.until_result()
        )
        read = await seen.reading.evidence(wait_seconds=wait)
        return replace(seen.evidence, words=read.words), read.record

    def _record_failures(self, ctx: _Context, model: str, failures: Sequence[FailedAttempt]) -> None:
        """Record the requests of a call to ``model`` (the one that ran) that failed: each was made, and a 429 counts
        in the rate limit's metrics."""
        for failure in failures:
            latency = round(failure.latency_seconds * 1000)
            call = FailedCall(model, self._provider.name, failure.status_code, failure.message, latency)
            self._db.record_failed_call(ctx.job, call)
            count_for_model("ModelCalls", model)
            if failure.status_code == 429:
                count_for_model("RateLimited", model)

    async def _blank_render(self, ctx: _Context, rendered: RenderedPage) -> PageResult:
        """A page that draws text or paths but rendered blank is not sent to the model as a blank image: its own text
        layer stands in for it where it has a usable one (flagged); otherwise it fails, with no call made."""
        flags = [PageFlag(Flag.BLANK_RENDER, rendered.marked, self._settings.flag_blank_render_threshold)]
        count_flags(flag.flag for flag in flags)
        usable = usable_text_layer(rendered.text_layer)
        if usable and self._settings.text_layer != "off":
            return await self._complete(ctx, _text_layer_outcome(rendered.laid_out_text, flags))
        instead = "with TEXT_LAYER=off its text layer may not stand in" if usable else "it has no usable text layer"
        reason = rejection(flags, then=f"{instead}, and no model was asked to read a blank image")
        return await self._fail(ctx, reason, NO_OUTCOME._replace(flags=tuple(flag.as_dict() for flag in flags)))

    async def _stored(self, ctx: _Context) -> None:
        """The page's figures and image stored and noted on it, so that the finish that its end may set off finds
        them."""
        while ctx.storing:
            await ctx.storing.pop()

    async def _complete(self, ctx: _Context, outcome: PageOutcome) -> PageResult:
        await self._stored(ctx)
        progress = self._db.complete_job(ctx.job, outcome)
        if progress is None:
            return self._lease_lost(ctx)
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

    async def _fail(self, ctx: _Context, reason: str, outcome: PageOutcome = NO_OUTCOME) -> PageResult:
        await self._stored(ctx)
        progress = self._db.fail_job(ctx.job, reason, outcome)
        if progress is None:
            return self._lease_lost(ctx)
        log.warning("page failed: %s", reason, extra={**ctx.log_extra, "flags": [f["flag"] for f in outcome.flags]})
        count("PagesFailed")
        if any(PageFlag.from_dict(flag).hard for flag in outcome.flags):
            count("PagesRejected")
        await self._after_page(progress)
        return PageResult.FAILED

    async def _admit(self, ctx: _Context, model: str) -> Admission | PageResult:
        """The gates before a call: the cost caps (the page ends SKIPPED when its call would exceed one), then the rate
        governor (the page waits in the queue when no call may start now). Admitted: what the call took. The cost gate
        costs no round trip when neither a cap nor a budget applies."""
        document = ctx.document
        budgeted = document.tenant_daily_budget_usd is not None or self._settings.daily_budget_usd is not None
        if document.max_cost_usd is not None or budgeted:
            skipped = await self._spend_gate(ctx, model)
            if skipped is not None:
                return skipped
        admission = self._governor.admit(ctx.job, model)
        if admission.wait > 0:
            return await self._defer(ctx, admission)
        return admission

    async def _spend_gate(self, ctx: _Context, model: str) -> PageResult | None:
        """The cost caps: the page's result when it may not start (SKIPPED, or DEFERRED behind calls in flight)."""
        verdict = self._db.admit_spend(
            ctx.job,
            model,
            daily_budget_usd=self._settings.daily_budget_usd,
            max_output_tokens=self._settings.max_output_tokens,
        )
        if verdict.daily_budget_usd:
            gauge("DailyBudgetUsedPercent", 100 * verdict.spent_today / verdict.daily_budget_usd)
        if verdict.verdict in ("CAP", "DAILY_BUDGET"):
            return await self._skip(ctx, budget_reason(verdict, model, ctx.document.tenant_id))
        if verdict.verdict == "DEFER":
            held = "the calls in flight may leave room under the document's cap or the tenant's daily budget"
            return await self._defer(ctx, Admission(SPEND_DEFER_SECONDS, why=held))
        return None

    async def _skip(self, ctx: _Context, reason: str) -> PageResult:
        progress = self._db.skip_job(ctx.job, reason)
        if progress is None:
            return self._lease_lost(ctx)
        log.warning("page skipped: %s", reason, extra=ctx.log_extra)
        count("PagesSkipped")
        await self._after_page(progress)
        return PageResult.SKIPPED

    async def _defer(self, ctx: _Context, admission: Admission) -> PageResult:
        """Back to the queue before any call, its attempt given back: no Lambda time is spent waiting."""
        delay = admission.delay_seconds
        reason = f"held back {delay} s before its model call: {admission.why}"
        deferred = self._db.defer_job(
            ctx.job, reason, delay_seconds=delay, slot_at=admission.slot_at, keep_slot=admission.keep_slot
        )
        if not deferred:
            return self._lease_lost(ctx)
        self._send_again(ctx, delay)
        log.info("page deferred: %s", reason, extra=ctx.log_extra)
        count("PagesDeferred")
        return PageResult.DEFERRED

    async def _retry(self, ctx: _Context, reason: str, retry_after: float | None) -> PageResult:
        if ctx.job.attempts >= self._settings.max_attempts:
            return await self._fail(
                ctx, f"attempts exhausted ({ctx.job.attempts} of {self._settings.max_attempts}): {reason}"
            )
        delay = retry_delay_seconds(self._settings, ctx.job.attempts, retry_after)
        if not self._db.requeue_job(ctx.job, reason, delay_seconds=delay):
            return self._lease_lost(ctx)
        self._send_again(ctx, delay)
        log.warning("page requeued in %d s: %s", delay, reason, extra=ctx.log_extra)
        count("PagesRequeued")
        return PageResult.REQUEUED

    def _send_again(self, ctx: _Context, delay: int) -> None:
        """The page's message, again, due in ``delay`` seconds (its row is QUEUED again and committed)."""
        job = ctx.job
        send_committed(
            self._queue, self._db, [JobMessage(job.job_id, job.document_id, job.page_number)], delay_seconds=delay
        )

    def _lease_lost(self, ctx: _Context) -> PageResult:
        log.warning("lease lost: a newer claim owns this page; the result is not written", extra=ctx.log_extra)
        count("LeaseLost")
        return PageResult.LEASE_LOST

    async def _after_page(self, progress: DocumentProgress) -> None:
        if progress.all_pages_done:
            await asyncio.to_thread(self._transcripts.finish, progress.document_id)


class TranscriptionBatch:
    """One SQS batch of page jobs. When its first message is processed, every job of the batch is claimed in
    one statement and their documents read in one (two round trips for the batch, not two per page); each
    message then transcribes its own page. A job named twice, already claimed or finished is a duplicate
    delivery, acknowledged without a model call; a job whose row stayed held by another transaction fails its
    message, which comes back."""

    def __init__(self, transcriber: Transcriber, bodies: Sequence[str], deadline: Deadline) -> None:
        self._transcriber = transcriber
        self._deadline = deadline
        self._job_ids: list[str] = []
        for body in bodies:
            with contextlib.suppress(MalformedMessageError):  # rejected when its own message is processed
                self._job_ids.append(parse_job_id(body))
        self._claims: Claims | None = None
        self._documents: dict[str, DocumentRecord] = {}

    def _claim(self, job_id: str) -> tuple[ClaimedJob, DocumentRecord] | None:
        if self._claims is None:
            self._claims, self._documents = self._transcriber.claim_batch(self._job_ids, self._deadline)
        job = self._claims.claimed.pop(job_id, None)
        if job is None:
            if job_id in self._claims.busy:
                log.warning("the job's row is held by another transaction", extra={"job_id": job_id})
                raise JobBusyError(
                    f"job {job_id}: its row stayed held by another transaction through the claim's wait; "
                    "the message is left for redelivery"
                )
            return None
        document = self._documents.get(job.document_id)
        if document is None:  # the foreign key makes this impossible short of manual deletion
            raise LookupError(f"job {job_id} names document {job.document_id}, which does not exist")
        return job, document

    async def transcribe(self, body: str) -> PageResult:
        """Transcribe the page one message names (see ``Transcriber.transcribe_claimed``)."""
        try:
            job_id = parse_job_id(body)
        except MalformedMessageError as exc:
            # It names no job, so no page depends on it; retrying it could only loop.
            log.error("message rejected: %s", exc)
            return PageResult.REJECTED
        claimed = self._claim(job_id)
        if claimed is None:
            log.info("duplicate delivery: job is already claimed or finished", extra={"job_id": job_id})
            count("DuplicateDeliveries")
            return PageResult.DUPLICATE
        job, document = claimed
        return await self._transcriber.transcribe_claimed(job, document, self._deadline)
