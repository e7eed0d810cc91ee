"""Dense pages read in tiles: the page's answer from the whole page, or, when its print is small at the render's scale
or its answer was truncated, from overlapping bands of it rendered larger, one model call each, their answers stitched
(which pages, and how they are cut: :mod:`pagescribe.transcription.tileplan`; the stitching:
:mod:`pagescribe.transcription.stitching`).

When: a page with a text layer is known to be dense before any call (its print's height), and goes straight to tiles;
a scan is known dense only from the offline engine's lines (its second read, or its own answer when the offline
engine is the model), so after the whole page's answer; a truncated answer, after it too. That whole-page answer is
recorded as a call (TILED) and paid for; the tiles are read once, never tiles of tiles: a truncated tile leaves the
stitched answer truncated (the page's flag).

Every tile call passes the same gates as a page's call (the cost caps, the tenant's daily budget, the rate governor)
just before it starts, gets what the page's time leaves for a call (a page left too little goes back to the queue, as
a page does), and is recorded as it answers (TILE, with its tile "2/4", its tokens and cost). At most
TILE_CONCURRENCY tile calls run at once, one at a time when a cost cap or a budget applies (each gate then sees what
the previous tile cost). A tile call that fails fails the page's call: the page is requeued or failed as after any
failed call (the tiles already paid for stay recorded; a later claim reads the page again). The stitched answer is
checked like any answer (against the whole page's words); its tokens and cost are the sum of every call the page made
(the whole-page one too), and its write records no call of its own.

A page that was turned upright to read (a scan that lay sideways) is not tiled: the bands are cut from the page as it
lies.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from statistics import mean
from typing import TypeVar

from pagescribe.checks import Flag, PageFlag, clean_answer
from pagescribe.domain import AttemptOutcome, PageOutcome, PageResult
from pagescribe.governor import Admission
from pagescribe.observability import count
from pagescribe.providers.base import Transcription
from pagescribe.rendering import RenderPool
from pagescribe.settings import Settings
from pagescribe.sources.documents import DocumentKind
from pagescribe.sources.pages import RenderedPage
from pagescribe.store.ports import Store
from pagescribe.transcription.asking import CheckedAnswer, ModelCaller, SeenPage
from pagescribe.transcription.gates import CallGates
from pagescribe.transcription.outcomes import answer_outcome
from pagescribe.transcription.results import PageContext, PageResults
from pagescribe.transcription.sourcecache import SourceCache
from pagescribe.transcription.stitching import stitch
from pagescribe.transcription.tileplan import TileLimits, TilePlan, plan_tiles, print_height, text_height

log = logging.getLogger(__name__)

TILE_CONCURRENCY = 3  # tile calls of one page in flight at once (uncapped pages)
N = TypeVar("N", int, float)


@dataclass(frozen=True)
class TileAsk:
    """What a page's call is asked with: the model, the flags it escalated with, and what the gates granted for it."""

    model: str
    earlier: list[PageFlag]
    admitted: Admission


class TiledReader:
    """A page's answer, read whole or in tiles (see the module's docstring)."""

    def __init__(
        self,
        settings: Settings,
        db: Store,
        caller: ModelCaller,
        gates: CallGates,
        results: PageResults,
        renderer: RenderPool,
        sources: SourceCache,
    ) -> None:
        self._settings = settings
        self._db = db
        self._caller = caller
        self._gates = gates
        self._results = results
        self._renderer = renderer
        self._sources = sources
        self._limits = TileLimits.of(settings)

    async def ask(self, ctx: PageContext, seen: SeenPage, asked: TileAsk, seconds: float) -> CheckedAnswer | PageResult:
        """The page's checked answer: from the whole page (a call within ``seconds``), or from its tiles; or the page's
        result when a tile could not be called (held back by a gate, or too little time left)."""
        plan = self._plan(seen, print_height(seen.rendered.print_size), truncated=False)
        if plan is not None:  # dense by its own text layer: no whole-page call
            return await self._read(ctx, seen, asked, plan, paid=[], first=asked.admitted)
        checked = await self._caller.ask(ctx, seen, asked.model, seconds, asked.earlier, asked.admitted)
        truncated = any(flag.flag is Flag.TRUNCATED for flag in checked.flags)
        plan = self._plan(seen, text_height(checked.words), truncated=truncated)
        if plan is None:
            return checked
        self._db.record_call(ctx.job, checked.outcome, AttemptOutcome.TILED)
        return await self._read(ctx, seen, asked, plan, paid=[checked.outcome], first=None)

    def _plan(self, seen: SeenPage, text_px: float | None, *, truncated: bool) -> TilePlan | None:
        rendered = seen.rendered
        if self._settings.tiles == "off" or rendered.rotation:
            return None
        return plan_tiles(rendered.width, rendered.height, text_px=text_px, truncated=truncated, limits=self._limits)

    async def _read(
        self,
        ctx: PageContext,
        seen: SeenPage,
        asked: TileAsk,
        plan: TilePlan,
        *,
        paid: list[PageOutcome],
        first: Admission | None,
    ) -> CheckedAnswer | PageResult:
        """The page read in the plan's tiles. ``paid``: the page's calls already made (the whole-page one); ``first``:
        the gates' admission the first tile call may use (the page's own, when no call used it), else each is
        admitted anew."""
        log.info("page %s", plan.why, extra=ctx.log_extra)
        count("PagesTiled")
        tiles = await self._render(ctx, plan)
        answers = await self._call_all(ctx, seen, asked.model, tiles, first)
        if isinstance(answers, PageResult):
            return answers
        return await self._stitched(seen, answers, asked, paid)

    async def _render(self, ctx: PageContext, plan: TilePlan) -> list[RenderedPage]:
        settings, document = self._settings, ctx.document
        async with self._sources.use(document) as source:
            assert document.kind is not None  # the page rendered whole already
            renders = [
                self._renderer.render_band(
                    source,
                    DocumentKind(document.kind),
                    ctx.job.page_number,
                    band,
                    zoom=plan.zoom,
                    dpi=settings.render_dpi,
                    max_long_edge=settings.render_max_long_edge,
                    image_format=settings.render_format,
                    max_image_pixels=settings.max_image_pixels,
                )
                for band in plan.bands
            ]
            return list(await asyncio.gather(*renders))

    async def _call_all(
        self, ctx: PageContext, seen: SeenPage, model: str, tiles: Sequence[RenderedPage], first: Admission | None
    ) -> list[Transcription] | PageResult:
        """Every tile's call, each admitted by the gates as it is about to start, at most TILE_CONCURRENCY at once;
        the page's result instead when a tile may not start (the calls already started are awaited, and recorded)."""
        slots = asyncio.Semaphore(1 if self._capped(ctx) else TILE_CONCURRENCY)
        calls: list[asyncio.Task[Transcription]] = []
        stopped: PageResult | str | None = None  # the page's result, or why it goes back to the queue
        admitted = first
        for number, tile in enumerate(tiles, start=1):
            await slots.acquire()
            granted = admitted if admitted is not None else await self._gates.admit(ctx, model)
            admitted, seconds = None, seen.deadline.call()
            if isinstance(granted, PageResult) or seconds < seen.deadline.policy.min_call:
                slots.release()
                stopped = granted if isinstance(granted, PageResult) else f"only {seconds:.1f} s left for tile {number}"
                break
            tag = f"{number}/{len(tiles)}"
            call = self._tile_call(ctx, seen, model, tile, tag, seconds, granted, slots)
            calls.append(asyncio.create_task(call))
        done = await asyncio.gather(*calls, return_exceptions=True)  # every call started is awaited, and recorded
        failure = next((result for result in done if isinstance(result, BaseException)), None)
        if failure is not None:
            raise failure
        if isinstance(stopped, str):
            return await self._results.requeue(ctx, f"read in {len(tiles)} tiles: {stopped}", None)
        return stopped or [result for result in done if isinstance(result, Transcription)]

    def _capped(self, ctx: PageContext) -> bool:
        """A cost cap or a daily budget applies to the page: its tile calls go one at a time."""
        document = ctx.document
        budgets = (document.max_cost_usd, document.tenant_daily_budget_usd, self._settings.daily_budget_usd)
        return any(budget is not None for budget in budgets)

    async def _tile_call(
        self,
        ctx: PageContext,
        seen: SeenPage,
        model: str,
        tile: RenderedPage,
        tag: str,
        seconds: float,
        admitted: Admission,
        slots: asyncio.Semaphore,
    ) -> Transcription:
        try:
            result = await self._caller.call(ctx, tile, model, seconds, admitted, reference=seen.evidence.text_layer)
        finally:
            slots.release()
        count("TileCalls")
        outcome = answer_outcome(result, self._caller.serving(model), clean_answer(result.text), [])
        self._db.record_call(ctx.job, outcome, AttemptOutcome.TILE, tile=tag)
        return result

    async def _stitched(
        self, seen: SeenPage, answers: Sequence[Transcription], asked: TileAsk, paid: list[PageOutcome]
    ) -> CheckedAnswer:
        """The tiles' answers as one, checked like any answer; its tokens and cost every call's of the page."""
        text, seams = stitch([clean_answer(answer.text) for answer in answers])
        truncated = next((answer for answer in answers if answer.finish_reason == "length"), None)
        confidences = [answer.confidence for answer in answers if answer.confidence is not None]
        whole = Transcription(
            text=text,
            finish_reason="length" if truncated else answers[-1].finish_reason,
            model=answers[0].model,
            prompt_tokens=_total(answer.prompt_tokens for answer in answers),
            completion_tokens=(truncated or answers[-1]).completion_tokens,  # what the output limit is judged on
            cost=None,
            request_id=None,
            latency_seconds=sum(answer.latency_seconds for answer in answers),
            confidence=mean(confidences) if confidences else None,
        )
        provider = self._caller.serving(asked.model)
        checked = await self._caller.check(seen, whole, asked.earlier, provider)
        calls = [*paid, *(answer_outcome(answer, provider, "", []) for answer in answers)]
        outcome = checked.outcome._replace(
            prompt_tokens=_total(call.prompt_tokens for call in calls),
            completion_tokens=_total(call.completion_tokens for call in calls),
            cost=_total(call.cost for call in calls),
            provider_request_id=None,
            called=False,  # every call is recorded already
        )
        log.info(
            "tiles stitched: %d seams, %d with an overlap found", len(seams), sum(matched > 0 for matched in seams)
        )
        return CheckedAnswer(outcome, checked.flags, checked.words)


def _total(values: Iterable[N | None]) -> N | None:
    """The sum of the values given, None when none is."""
    known = [value for value in values if value is not None]
    return sum(known[1:], known[0]) if known else None
