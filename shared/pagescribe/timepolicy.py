"""The time policy of a page, whole: how long each phase may take inside what is left of the invocation.

A page is rendered, then sent to the model, then its result is written. The render of one page may take
RENDER_TIMEOUT_SECONDS (a page over it is a bomb: it fails and its render process is replaced). A model call gets
PROVIDER_TIMEOUT_SECONDS, capped by the invocation's remaining time less RESULT_RESERVE_SECONDS, kept back to write its
result; a page that would get less than MIN_CALL_BUDGET_SECONDS is not called (it is left for redelivery, or sent back
to the queue). Within the call, each HTTP request may take what is left of the call's time, and its connection
PROVIDER_CONNECT_TIMEOUT_SECONDS at most. A claim's lease outlasts the invocation by LEASE_MARGIN_SECONDS, so that an
expired lease proves its holder dead. The numbers are settings; nothing else in the package decides a time limit of
a page's work.

An invocation's end is one ``Deadline``, built once per invocation (per SQS batch, per sweep) from the Lambda's
remaining time and the time policy, and passed to whatever times its work.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from pagescribe.settings import Settings


@dataclass(frozen=True)
class RequestTimeouts:
    """The limits of one HTTP request to the provider, in seconds."""

    connect: float
    read: float
    write: float
    pool: float


@dataclass(frozen=True)
class TimePolicy:
    """The time limits of a page's phases (settings), as functions of what is left of the invocation."""

    provider_timeout: float
    result_reserve: float
    min_call: float
    lease_margin: float
    connect_timeout: float
    render_timeout: float

    @classmethod
    def from_settings(cls, settings: Settings) -> TimePolicy:
        return cls(
            provider_timeout=settings.provider_timeout_seconds,
            result_reserve=settings.result_reserve_seconds,
            min_call=settings.min_call_budget_seconds,
            lease_margin=settings.lease_margin_seconds,
            connect_timeout=settings.provider_connect_timeout_seconds,
            render_timeout=settings.render_timeout_seconds,
        )

    def call(self, remaining: float) -> float:
        """Seconds a model call may take when ``remaining`` seconds of the invocation are left."""
        return min(self.provider_timeout, remaining - self.result_reserve)

    def enough_for_a_call(self, remaining: float) -> bool:
        return self.call(remaining) >= self.min_call

    def request(self, left_of_call: float) -> RequestTimeouts:
        """Limits of one HTTP request when ``left_of_call`` seconds of the call's time are left."""
        return RequestTimeouts(
            connect=min(self.connect_timeout, left_of_call), read=left_of_call, write=left_of_call, pool=left_of_call
        )

    def lease(self, remaining: float) -> float:
        """Seconds a claim's lease lasts: past the end of the invocation by the margin."""
        return remaining + self.lease_margin


@dataclass(frozen=True)
class Deadline:
    """When one invocation's time is up, on ``clock`` (monotonic seconds), with the time policy that shares out what is
    left of it."""

    policy: TimePolicy
    ends_at: float
    clock: Callable[[], float] = time.monotonic

    @classmethod
    def after(cls, seconds: float, policy: TimePolicy, *, clock: Callable[[], float] = time.monotonic) -> Deadline:
        """The deadline ``seconds`` from now (a Lambda context's remaining time)."""
        return cls(policy, clock() + seconds, clock)

    def remaining(self) -> float:
        """Seconds left of the invocation, never below zero (like the Lambda context's)."""
        return max(0.0, self.ends_at - self.clock())

    def call(self) -> float:
        """Seconds a model call starting now may take."""
        return self.policy.call(self.remaining())

    def enough_for_a_call(self) -> bool:
        return self.policy.enough_for_a_call(self.remaining())

    def lease(self) -> float:
        """Seconds a claim made now lasts."""
        return self.policy.lease(self.remaining())

    def until_result(self) -> float:
        """Seconds left before a page's result must be written (the reserve kept back for it is not counted)."""
        return self.remaining() - self.policy.result_reserve
