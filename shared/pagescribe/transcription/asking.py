"""One model call for a rendered page: made, recorded and counted, its answer cleaned, grounded and checked."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from pagescribe.checks import (
    Answer,
    PageEvidence,
    PageFlag,
    Thresholds,
    check_answer,
    clean_answer,
    ground,
    hard_flags,
    merge_flags,
)
from pagescribe.domain import LOOP_CUT, FailedCall, PageOutcome
from pagescribe.governor import Admission, RateGovernor
from pagescribe.observability import count, count_flags, count_for_model, milliseconds
from pagescribe.providers.base import (
    FailedAttempt,
    PageImage,
    ProviderError,
    Transcription,
    TranscriptionProvider,
    TranscriptionRequest,
)
from pagescribe.secondread import PendingRead, SecondReader
from pagescribe.settings import Settings
from pagescribe.sources.pages import RenderedPage
from pagescribe.store.ports import Store
from pagescribe.timepolicy import Deadline
from pagescribe.transcription.loops import loop_check, priced
from pagescribe.transcription.outcomes import answer_outcome, grounding_kept
from pagescribe.transcription.results import PageContext

if TYPE_CHECKING:
    from pagescribe.grounding import PageText

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SeenPage:
    """A rendered page as its answers are checked: what the renderer saw, its own words being placed on its image
    (``placing``: a page with a text layer rendered without them), and its second read, on its way (None when the page
    has its own words, or the offline engine reads it, or reads are off)."""

    rendered: RenderedPage
    evidence: PageEvidence
    placing: asyncio.Task[PageText] | None
    reading: PendingRead | None
    mode: str  # the page's SECOND_READ
    deadline: Deadline

    async def close(self) -> None:
        """The page is done with its evidence: words still being placed and a second read still running are let go."""
        if self.placing is not None and not self.placing.done():
            self.placing.cancel()
            await asyncio.gather(self.placing, return_exceptions=True)
        if self.reading is not None:
            await self.reading.close()


@dataclass(frozen=True)
class CheckedAnswer:
    """A model's answer, cleaned and checked."""

    outcome: PageOutcome
    flags: list[PageFlag]
    words: PageText | None = None  # the page's words the answer was checked against, where it had any

    @property
    def hard(self) -> bool:
        return bool(hard_flags(self.flags))


class ModelCaller:
    """Makes a page's model calls, records each (its failed requests too) and checks its answers."""

    def __init__(
        self,
        settings: Settings,
        db: Store,
        provider: TranscriptionProvider,
        governor: RateGovernor,
        thresholds: Thresholds,
    ) -> None:
        self._settings = settings
        self._db = db
        self._provider = provider
        self._governor = governor
        self._thresholds = thresholds

    async def ask(
        self, ctx: PageContext, seen: SeenPage, model: str, seconds: float, earlier: list[PageFlag], admitted: Admission
    ) -> CheckedAnswer:
        """One model call for the page within ``seconds``, its answer cleaned, grounded and checked. ``earlier``: the
        flags of the answer the page escalated from, whose hard ones (why it escalated) stay the page's beside this
        answer's own. A call that fails is recorded before its error goes on; a 429 pauses every environment's calls
        to the model."""
        result = await self.call(ctx, seen.rendered, model, seconds, admitted, reference=seen.evidence.text_layer)
        return await self.check(seen, result, earlier, self.serving(model))

    def serving(self, model: str) -> str:
        """The provider that serves ``model``, as the ledger names it."""
        return self._provider.serving(model)

    async def call(
        self,
        ctx: PageContext,
        rendered: RenderedPage,
        model: str,
        seconds: float,
        admitted: Admission,
        *,
        reference: str,
    ) -> Transcription:
        """One model call for an image of the page (the whole page, or one of its tiles) within ``seconds``: made,
        counted and settled with the rate governor, its failed requests recorded; its answer as it came, cut where it
        streamed into a loop beyond ``reference`` (the page's text layer)."""
        request = TranscriptionRequest(
            image=PageImage(rendered.data, rendered.media_type),
            prompt=ctx.document.prompt or self._settings.prompt,
            model=model,
            max_output_tokens=self._settings.max_output_tokens,
            document_id=ctx.job.document_id,
            page_number=ctx.job.page_number,
            loop_check=loop_check(self._thresholds.repetition, reference),
            on_sent=ctx.on_sent,
        )
        started = asyncio.get_running_loop().time()
        ran = self._provider.answering_model(model)
        try:
            result = await self._provider.transcribe(request, call_seconds=seconds)
        except ProviderError as exc:
            self._call_failed(ctx, model, ran, exc, started)
            raise
        self._record_failures(ctx, ran, result.failed_attempts)
        if result.finish_reason == LOOP_CUT:
            result = self._cut(ctx, ran, result)
        self._count_call(ran, result)
        self._governor.settle(model, admitted, (result.prompt_tokens or 0) + (result.completion_tokens or 0))
        return result

    def _call_failed(self, ctx: PageContext, model: str, ran: str, exc: ProviderError, started: float) -> None:
        """Record every request of a call that failed; after a 429, pause every environment's calls to ``model`` and
        make the page wait at least as long."""
        self._record_failures(ctx, ran, exc.earlier_attempts)
        elapsed = asyncio.get_running_loop().time() - started - sum(a.latency_seconds for a in exc.earlier_attempts)
        self._record_failures(ctx, ran, [FailedAttempt(exc.status_code, exc.message, elapsed)])
        pause = self._governor.rate_limited(model, exc.retry_after) if exc.status_code == 429 else None
        if pause is not None:
            exc.retry_after = max(exc.retry_after or 0.0, pause)

    def _cut(self, ctx: PageContext, ran: str, result: Transcription) -> Transcription:
        """A call cut at a loop as it streamed: counted, and priced at the tenant's own prices of the model where its
        provider reported no cost (the usage comes last, and a cut call never gets it)."""
        count_for_model("LoopsCut", ran)
        if result.cost is None:
            result = priced(result, self._db.price_history(result.model, ctx.document.tenant_id))
        log.warning(
            "call to %s cut at a loop after %s completion tokens (cost %s%s)",
            ran,
            result.completion_tokens,
            result.cost,
            ", estimated" if result.cost_estimated else "",
            extra=ctx.log_extra,
        )
        return result

    @staticmethod
    def _count_call(ran: str, result: Transcription) -> None:
        count_for_model("ModelCalls", ran)
        milliseconds("ModelLatency", round(result.latency_seconds * 1000))
        count("PromptTokens", result.prompt_tokens or 0)
        count("CompletionTokens", result.completion_tokens or 0)
        count_for_model("CostUSD", ran, result.cost or 0.0)

    async def check(
        self, seen: SeenPage, result: Transcription, earlier: list[PageFlag], provider: str
    ) -> CheckedAnswer:
        """The answer cleaned, grounded to the page's words where it has any, and checked; its outcome with the flags
        of the page (``earlier``'s hard ones beside its own), recorded as ``provider``'s."""
        answer = Answer(clean_answer(result.text), result.finish_reason, result.completion_tokens, result.confidence)
        evidence, read = await self._evidence(seen, result)
        if result.rotation:  # the engine turned the image it was sent: the page was turned that much more
            evidence = replace(evidence, rotation=(evidence.rotation + result.rotation) % 360)
        grounding = await asyncio.to_thread(ground, answer.text, evidence.words) if evidence.words else None
        flags = check_answer(
            answer, evidence, self._thresholds, max_output_tokens=self._settings.max_output_tokens, grounding=grounding
        )
        count_flags(flag.flag for flag in flags)
        outcome = answer_outcome(result, provider, answer.text, flags)._replace(
            grounding=grounding_kept(grounding, evidence, read), second_read=read or None
        )
        if earlier:
            merged = merge_flags(hard_flags(earlier), flags)
            outcome = outcome._replace(page_flags=tuple(flag.as_dict() for flag in merged))
        return CheckedAnswer(outcome, flags, evidence.words)

    async def _evidence(self, seen: SeenPage, result: Transcription) -> tuple[PageEvidence, dict[str, Any]]:
        """The page's evidence with the words to ground the answer to, where there are any, and what the page's second
        read is recorded as with the call ({} without one)."""
        rendered = seen.rendered
        if seen.evidence.words is not None:
            return seen.evidence, {}
        if seen.placing is not None:  # its own words, placed while the call ran
            return replace(seen.evidence, words=await seen.placing), {}
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

    def _record_failures(self, ctx: PageContext, model: str, failures: Sequence[FailedAttempt]) -> None:
        """Record the requests of a call to ``model`` (the one that ran) that failed: each was made, and a 429 counts
        in the rate limit's metrics."""
        for failure in failures:
            latency = round(failure.latency_seconds * 1000)
            call = FailedCall(model, self._provider.serving(model), failure.status_code, failure.message, latency)
            self._db.record_failed_call(ctx.job, call)
            count_for_model("ModelCalls", model)
            if failure.status_code == 429:
                count_for_model("RateLimited", model)
