"""The cost gate and the rate governor's buckets, in memory (SpendStore): ADMIT_SPEND and TAKE_RATE_SLOTS' rules."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from pagescribe.domain import (
    ClaimedJob,
    JobStatus,
    PricedCall,
    RateBucket,
    RateGrant,
    SpendVerdict,
    TenantDay,
    document_of,
)

from tests.support.memory_store.state import AttemptRow, BucketRow, DocumentRow, MemoryState

HISTORY = 100  # the latest calls a price is read from


class MemorySpend:
    state: MemoryState

    def _history(self, tenant_id: str, model: str) -> list[AttemptRow]:
        """The tenant's latest calls of the model that reported a cost, newest first."""
        mine = [
            a
            for a in self.state.attempts
            if a.model == model
            and a.cost is not None
            and not a.cost_estimated
            and self.state.documents[a.document_id].tenant_id == tenant_id
        ]
        return sorted(mine, key=lambda a: a.id, reverse=True)[:HISTORY]

    def _admit_one(
        self, job: ClaimedJob, model: str, *, daily_budget_usd: float | None, max_output_tokens: int
    ) -> SpendVerdict:
        with self.state.lock:
            document = self.state.documents.get(job.document_id)
            if document is None:
                return SpendVerdict("GO", None, None, 0.0, None, None, 0.0)
            tenant = self.state.tenants[document.tenant_id]
            budget = tenant.daily_budget_usd if tenant.daily_budget_usd is not None else daily_budget_usd
            today = self.state.day(document.tenant_id).spent_usd
            history = self._history(document.tenant_id, model)
            price = sum(a.cost or 0 for a in history) / len(history) if history else None
            reserve = _worst_case(history, len((document.prompt or "").encode()), max_output_tokens)
            spent = sum(a.cost or 0 for a in self.state.attempts if a.document_id == document.id)
            verdict = self._verdict(job, document, budget, today, spent, reserve)
            row = self.state.jobs.get(job.job_id)
            capped = budget is not None or document.max_cost_usd is not None
            if verdict == "GO" and capped and row is not None and row.leased_to(job.lease_token):
                row.reserved_usd = reserve or 0.0
            return SpendVerdict(verdict, price, reserve, spent, document.max_cost_usd, budget, today)

    def admit_spends(
        self, jobs: Sequence[ClaimedJob], model: str, *, daily_budget_usd: float | None, max_output_tokens: int
    ) -> list[SpendVerdict]:
        document_of(jobs)
        with self.state.lock:  # reentrant: the pages in turn, with no other gate between them
            return [
                self._admit_one(job, model, daily_budget_usd=daily_budget_usd, max_output_tokens=max_output_tokens)
                for job in jobs
            ]

    def _verdict(
        self,
        job: ClaimedJob,
        document: DocumentRow,
        budget: float | None,
        today: float,
        spent: float,
        reserve: float | None,
    ) -> str:
        cap, worst = document.max_cost_usd, reserve or 0.0
        if budget is not None and (today >= budget or today + worst > budget):
            return "DAILY_BUDGET"
        if cap is not None and (spent >= cap or spent + worst > cap):
            return "CAP"
        if budget is None and cap is None:
            return "GO"
        now = self.state.now()
        in_flight = [
            j
            for j in self.state.jobs.values()
            if j.reserved_usd is not None
            and j.status is JobStatus.PROCESSING
            and j.lease_expires_at is not None
            and j.lease_expires_at > now
            and j.id != job.job_id
            and self.state.documents[j.document_id].tenant_id == document.tenant_id
        ]
        mine = [j for j in in_flight if j.document_id == document.id]
        if reserve is None and ((budget is not None and in_flight) or (cap is not None and mine)):
            return "DEFER"
        if budget is not None and today + sum(j.reserved_usd or 0 for j in in_flight) + worst > budget:
            return "DEFER"
        if cap is not None and spent + sum(j.reserved_usd or 0 for j in mine) + worst > cap:
            return "DEFER"
        return "GO"

    def model_price(self, model: str, tenant_id: str) -> tuple[float | None, int]:
        with self.state.lock:
            history = self._history(tenant_id, model)
            return (sum(a.cost or 0 for a in history) / len(history) if history else None), len(history)

    def price_history(self, model: str, tenant_id: str) -> list[PricedCall]:
        with self.state.lock:
            return [
                PricedCall(a.prompt_tokens, a.completion_tokens, a.cost or 0.0)
                for a in self._history(tenant_id, model)
                if a.prompt_tokens is not None and a.completion_tokens is not None
            ]

    def set_daily_budget(self, tenant_id: str, usd: float | None) -> bool:
        with self.state.lock:
            tenant = self.state.tenants.get(tenant_id)
            if tenant is None:
                return False
            tenant.daily_budget_usd = usd
            return True

    def tenant_day(self, tenant_id: str) -> TenantDay | None:
        with self.state.lock:
            tenant = self.state.tenants.get(tenant_id)
            if tenant is None:
                return None
            day = self.state.days.get((tenant_id, self.state.clock.today()))
            return TenantDay(tenant.daily_budget_usd, day.spent_usd if day else 0.0, day.calls if day else 0)

    def take_rate_slots(
        self, bucket: RateBucket, model: str, *, prepaid: Sequence[bool], max_wait: float
    ) -> list[RateGrant]:
        with self.state.lock:
            p, now = bucket.params(model), self.state.now()
            row = self.state.buckets.setdefault((bucket.provider, model), BucketRow(p["burst"], p["token_burst"], now))
            return [_take(row, p, now, held, max_wait) for held in prepaid]

    def pause_rate_bucket(self, bucket: RateBucket, model: str, seconds: float) -> None:
        with self.state.lock:
            row = self.state.buckets.get((bucket.provider, model))
            if row is not None:
                now = self.state.now()
                row.paused_until = max(row.paused_until or now, now + timedelta(seconds=seconds))

    def settle_rate_tokens(self, bucket: RateBucket, model: str, *, calls: Sequence[tuple[float, int]]) -> None:
        with self.state.lock:
            row = self.state.buckets.get((bucket.provider, model))
            if row is not None:
                for estimate, actual in calls:
                    row.tokens -= actual - estimate
                    row.mean_tokens = actual if row.mean_tokens is None else 0.9 * row.mean_tokens + 0.1 * actual


def _worst_case(history: list[AttemptRow], prompt_bytes: int, max_output_tokens: int) -> float | None:
    """What a call may cost at most, from the calls seen (ADMIT_SPEND's reserve)."""
    if not history:
        return None
    paid = [a for a in history if (a.cost or 0) > 0]
    per_prompt = [(a.cost or 0) / a.prompt_tokens for a in paid if a.prompt_tokens]
    per_completion = [(a.cost or 0) / a.completion_tokens for a in paid if a.completion_tokens]
    prompts = [a.prompt_tokens for a in history if a.prompt_tokens is not None]
    if per_prompt and per_completion and prompts:
        return min(per_prompt) * (max(prompts) + prompt_bytes) + min(per_completion) * max_output_tokens
    return max(a.cost or 0 for a in history)


def _take(row: BucketRow, p: dict[str, Any], now: datetime, prepaid: bool, max_wait: float) -> RateGrant:
    """One page's take (TAKE_RATE_SLOTS' rule for a page): the pages before it in the list took theirs just before."""
    elapsed = (now - row.refilled_at).total_seconds()
    requests = min(p["burst"], row.requests + elapsed * p["requests_per_second"])
    tokens = min(p["token_burst"], row.tokens + elapsed * p["tokens_per_second"])
    mean = row.mean_tokens or 0.0
    paused = max(0.0, (row.paused_until - now).total_seconds()) if row.paused_until else 0.0
    waits = [0.0, (1 - requests) / p["requests_per_second"]]
    if p["tokens_per_second"]:
        waits.append((min(mean, p["token_burst"]) - tokens) / p["tokens_per_second"])
    wait = paused if paused > 0 else 0.0 if prepaid else max(waits)
    takes = paused == 0 and not prepaid and wait <= max_wait
    row.requests = requests - (1 if takes else 0)
    row.tokens = tokens - (mean if takes and p["tokens_per_second"] > 0 else 0)
    row.refilled_at = now
    return RateGrant(wait, takes, paused > 0, mean, now + timedelta(seconds=wait))
