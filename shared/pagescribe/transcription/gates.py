"""The gates before a model call: the cost caps and the tenant's daily budget, then the rate governor."""

from __future__ import annotations

import asyncio

from pagescribe.domain import ClaimedJob, PageResult, SpendGate, SpendVerdict
from pagescribe.governor import Admission, RateGovernor
from pagescribe.observability import gauge
from pagescribe.settings import Settings
from pagescribe.store.ports import Store
from pagescribe.transcription.outcomes import budget_reason
from pagescribe.transcription.results import PageContext, PageResults

BATCH_ADMISSION = Admission(0.0)  # a batch-lane page's call is its batch's: it takes no slot of the rate governor
SPEND_DEFER_SECONDS = 2  # a capped document's page waits this long for the calls in flight to settle


class CallGates:
    """Whether a page's call may start now, or the page ends SKIPPED or waits DEFERRED in the queue."""

    def __init__(self, settings: Settings, db: Store, governor: RateGovernor, results: PageResults) -> None:
        self._settings = settings
        self._db = db
        self._governor = governor
        self._results = results
        self._waiting: dict[tuple[str, str], list[tuple[ClaimedJob, asyncio.Future[SpendVerdict]]]] = {}

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
        admission = self._governor.admit(ctx.job, model)
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
        verdict = await self._spend_verdict(ctx.job, model)
        if verdict.daily_budget_usd:
            gauge("DailyBudgetUsedPercent", 100 * verdict.spent_today / verdict.daily_budget_usd)
        if verdict.verdict in (SpendGate.CAP, SpendGate.DAILY_BUDGET):
            return await self._results.skip(ctx, budget_reason(verdict, model, ctx.document.tenant_id))
        if verdict.verdict == SpendGate.DEFER:
            held = "the calls in flight may leave room under the document's cap or the tenant's daily budget"
            return await self._results.defer(ctx, Admission(SPEND_DEFER_SECONDS, why=held))
        return None

    def _spend_verdict(self, job: ClaimedJob, model: str) -> asyncio.Future[SpendVerdict]:
        """The page's verdict from the cost gate, passed together with the other pages of its document (and model)
        that reach the gate in the same turn of the event loop: one transaction for them all (``admit_spends``),
        the rows locked and the commit flushed once, in the order the pages came."""
        loop = asyncio.get_running_loop()
        verdict: asyncio.Future[SpendVerdict] = loop.create_future()
        key = (job.document_id, model)
        waiting = self._waiting.setdefault(key, [])
        if not waiting:  # the first of the turn: the gate runs once the loop has run every page ready now
            loop.call_soon(self._pass_gate, key)
        waiting.append((job, verdict))
        return verdict

    def _pass_gate(self, key: tuple[str, str]) -> None:
        waiting = self._waiting.pop(key)
        try:
            verdicts = self._db.admit_spends(
                [job for job, _ in waiting],
                key[1],
                daily_budget_usd=self._settings.daily_budget_usd,
                max_output_tokens=self._settings.max_output_tokens,
            )
        except Exception as exc:  # each page's own task raises it, as a gate of its own would have
            for _, verdict in waiting:
                if not verdict.done():
                    verdict.set_exception(exc)
            return
        for (_, verdict), said in zip(waiting, verdicts, strict=True):
            if not verdict.done():  # a page cancelled meanwhile has no one waiting
                verdict.set_result(said)
