"""The gates before a model call: the cost caps and the tenant's daily budget, then the rate governor."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable, Sequence
from typing import Generic, TypeVar

from pagescribe.domain import ClaimedJob, PageResult, SpendGate, SpendVerdict
from pagescribe.governor import Admission, RateGovernor
from pagescribe.observability import gauge
from pagescribe.settings import Settings
from pagescribe.store.ports import Store
from pagescribe.transcription.outcomes import budget_reason
from pagescribe.transcription.results import PageContext, PageResults

BATCH_ADMISSION = Admission(0.0)  # a batch-lane page's call is its batch's: it takes no slot of the rate governor
SPEND_DEFER_SECONDS = 2  # a capped document's page waits this long for the calls in flight to settle

Key = TypeVar("Key", bound=Hashable)
Said = TypeVar("Said")


class Together(Generic[Key, Said]):
    """A gate that the pages reaching it in the same turn of the event loop pass together, one pass for each key:
    ``passing(key, jobs)`` answers for the pages in the order they came (one transaction, the rows locked and the commit
    flushed once). Each page awaits its own answer; a failure of the pass is each page's, as a pass of its own would
    have raised it."""

    def __init__(self, passing: Callable[[Key, Sequence[ClaimedJob]], list[Said]]) -> None:
        self._passing = passing
        self._waiting: dict[Key, list[tuple[ClaimedJob, asyncio.Future[Said]]]] = {}

    def __call__(self, key: Key, job: ClaimedJob) -> asyncio.Future[Said]:
        loop = asyncio.get_running_loop()
        said: asyncio.Future[Said] = loop.create_future()
        waiting = self._waiting.setdefault(key, [])
        if not waiting:  # the first of the turn: the gate is passed once the loop has run every page ready now
            loop.call_soon(self._pass, key)
        waiting.append((job, said))
        return said

    def _pass(self, key: Key) -> None:
        waiting = self._waiting.pop(key)
        try:
            answers = self._passing(key, [job for job, _ in waiting])
        except Exception as exc:
            for _, said in waiting:
                if not said.done():
                    said.set_exception(exc)
            return
        for (_, said), answer in zip(waiting, answers, strict=True):
            if not said.done():  # a page cancelled meanwhile has no one waiting
                said.set_result(answer)


class CallGates:
    """Whether a page's call may start now, or the page ends SKIPPED or waits DEFERRED in the queue."""

    def __init__(self, settings: Settings, db: Store, governor: RateGovernor, results: PageResults) -> None:
        self._settings = settings
        self._db = db
        self._results = results
        # the cost gate, for the pages of a document (and model); the rate governor, for the pages of a model
        self._spend: Together[tuple[str, str], SpendVerdict] = Together(self._admit_spends)
        self._rate: Together[str, Admission] = Together(lambda model, jobs: governor.admit(jobs, model))

    async def admit(self, ctx: PageContext, model: str) -> Admission | PageResult:
        """The gates before a call: the cost caps (the page ends SKIPPED when its call would exceed one), then the rate
        governor (the page waits in the queue when no call may start now). Admitted: what the call took. The cost gate
        costs no round trip when neither a cap nor a budget applies."""
        document = ctx.document
        budgeted = document.tenant_daily_budget_usd is not None or self._settings.daily_budget_usd is not None
        if document.max_cost_usd is not None or budgeted:
            skipped = await self._spend_gate(ctx, model)
            if skipped is not None:
                return skipped
        admission = await self._rate(model, ctx.job)
        if admission.wait > 0:
            return await self._results.defer(ctx, admission)
        return admission

    async def admit_batch(self, ctx: PageContext, model: str) -> Admission | PageResult:
        """The cost caps alone, for a page of the batch lane (its call is the batch's, which no rate governor paces):
        the page's result when it may not start."""
        document = ctx.document
        budgeted = document.tenant_daily_budget_usd is not None or self._settings.daily_budget_usd is not None
        if document.max_cost_usd is not None or budgeted:
            skipped = await self._spend_gate(ctx, model)
            if skipped is not None:
                return skipped
        return BATCH_ADMISSION

    async def _spend_gate(self, ctx: PageContext, model: str) -> PageResult | None:
        """The cost caps: the page's result when it may not start (SKIPPED, or DEFERRED behind calls in flight)."""
        verdict = await self._spend((ctx.job.document_id, model), ctx.job)
        if verdict.daily_budget_usd:
            gauge("DailyBudgetUsedPercent", 100 * verdict.spent_today / verdict.daily_budget_usd)
        if verdict.verdict in (SpendGate.CAP, SpendGate.DAILY_BUDGET):
            return await self._results.skip(ctx, budget_reason(verdict, model, ctx.document.tenant_id))
        if verdict.verdict == SpendGate.DEFER:
            held = "the calls in flight may leave room under the document's cap or the tenant's daily budget"
            return await self._results.defer(ctx, Admission(SPEND_DEFER_SECONDS, why=held))
        return None

    def _admit_spends(self, key: tuple[str, str], jobs: Sequence[ClaimedJob]) -> list[SpendVerdict]:
        return self._db.admit_spends(
            jobs,
            key[1],
            daily_budget_usd=self._settings.daily_budget_usd,
            max_output_tokens=self._settings.max_output_tokens,
        )
