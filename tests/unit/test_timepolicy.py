"""The time policy of a page, without a database, a provider or a clock."""

from __future__ import annotations

import pytest
from pagescribe.settings import Settings
from pagescribe.timepolicy import Deadline, TimePolicy

BUDGET = TimePolicy(
    provider_timeout=180, result_reserve=10, min_call=5, lease_margin=60, connect_timeout=10, render_timeout=60
)


@pytest.mark.parametrize(
    ("remaining", "call"),
    [
        (300, 180),  # plenty left: the configured provider timeout
        (150, 140),  # less left: what remains, less the reserve for writing the result
        (14, 4),  # too little for a useful call
        (3, -7),  # past the reserve already
    ],
)
def test_a_call_gets_the_provider_timeout_capped_by_what_is_left_less_the_reserve(
    remaining: float, call: float
) -> None:
    assert BUDGET.call(remaining) == call
    assert BUDGET.enough_for_a_call(remaining) == (call >= 5)


def test_the_minimum_call_is_the_line_between_calling_and_leaving_the_page() -> None:
    # Given exactly the minimum left for the call after the reserve, and a hair less
    assert BUDGET.enough_for_a_call(15)
    assert not BUDGET.enough_for_a_call(14.999)


def test_a_lease_outlasts_the_invocation_by_the_margin() -> None:
    assert BUDGET.lease(120) == 180
    assert TimePolicy(180, 10, 5, lease_margin=0, connect_timeout=10, render_timeout=60).lease(120) == 120


@pytest.mark.parametrize(
    ("left_of_call", "connect"),
    [
        (120, 10),  # a connection may take the connect timeout, the rest of the request what is left of the call
        (4, 4),  # near the end of the call's time, no phase outlasts it
    ],
)
def test_each_request_of_a_call_is_limited_per_phase_within_what_is_left(left_of_call: float, connect: float) -> None:
    timeouts = BUDGET.request(left_of_call)
    assert (timeouts.connect, timeouts.read, timeouts.write, timeouts.pool) == (
        connect,
        left_of_call,
        left_of_call,
        left_of_call,
    )


def test_the_budget_is_read_from_the_settings() -> None:
    settings = Settings(
        provider_timeout_seconds=90,
        result_reserve_seconds=7,
        min_call_budget_seconds=3,
        lease_margin_seconds=30,
        function_timeout_seconds=300,
        provider_connect_timeout_seconds=4,
        render_timeout_seconds=20,
    )
    assert TimePolicy.from_settings(settings) == TimePolicy(90, 7, 3, 30, connect_timeout=4, render_timeout=20)


class _Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_deadline_shares_out_what_is_left_of_the_invocation_as_its_clock_runs() -> None:
    # Given an invocation with 300 s left, under the policy above
    clock = _Clock()
    deadline = Deadline.after(300, BUDGET, clock=clock)
    # Then a call now gets the provider timeout, a claim lasts past the end by the margin
    assert (deadline.call(), deadline.lease(), deadline.until_result()) == (180, 360, 290)
    # When 150 s pass, a call gets what is left less the reserve
    clock.now += 150
    assert (deadline.remaining(), deadline.call(), deadline.enough_for_a_call()) == (150, 140, True)
    # And past the end, nothing is left (as the Lambda context says): no call
    clock.now += 200
    assert (deadline.remaining(), deadline.enough_for_a_call()) == (0, False)
