"""The time policy of a page: how long its model call may take inside what is left of the invocation.

A call gets the configured provider timeout, capped by the invocation's remaining time less the reserve kept back to
write its result; a page that would get less than the minimum call budget is not called (it is left for redelivery, or
sent back to the queue). A claim's lease outlasts the invocation by a margin, so that an expired lease proves its
holder dead. The numbers are settings (PROVIDER_TIMEOUT_SECONDS, RESULT_RESERVE_SECONDS, MIN_CALL_BUDGET_SECONDS,
LEASE_MARGIN_SECONDS); the provider client keeps each call inside the budget it is given.
"""

from __future__ import annotations

from dataclasses import dataclass

from pagescribe.settings import Settings


@dataclass(frozen=True)
class TimeBudget:
    provider_timeout: float
    result_reserve: float
    min_call: float
    lease_margin: float

    @classmethod
    def from_settings(cls, settings: Settings) -> TimeBudget:
        return cls(
            provider_timeout=settings.provider_timeout_seconds,
            result_reserve=settings.result_reserve_seconds,
            min_call=settings.min_call_budget_seconds,
            lease_margin=settings.lease_margin_seconds,
        )

    def call(self, remaining: float) -> float:
        """Seconds a model call may take when ``remaining`` seconds of the invocation are left."""
        return min(self.provider_timeout, remaining - self.result_reserve)

    def enough_for_a_call(self, remaining: float) -> bool:
        return self.call(remaining) >= self.min_call

    def lease(self, remaining: float) -> float:
        """Seconds a claim's lease lasts: past the end of the invocation by the margin."""
        return remaining + self.lease_margin
