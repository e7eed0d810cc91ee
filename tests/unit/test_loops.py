"""The check a streamed answer is watched with, and the price of a call cut before its provider said what it cost."""

from __future__ import annotations

import pytest
from pagescribe.domain import PricedCall
from pagescribe.providers.base import Transcription
from pagescribe.transcription.loops import loop_check, priced, token_prices

LOOP_LINE = "Hakate Toolbox: open the lid and take the tool out.\n"


def test_the_loop_check_flags_a_loop_beyond_what_the_page_itself_repeats() -> None:
    looping = loop_check(8, "")
    assert looping("A heading\n\n" + LOOP_LINE * 9)
    assert not looping("A heading\n\n" + LOOP_LINE * 3)
    # a page whose own text repeats the line that often is transcribed faithfully, not cut
    assert not loop_check(8, LOOP_LINE * 9)("A heading\n\n" + LOOP_LINE * 9)


def test_prices_per_token_are_fitted_to_the_calls_costs() -> None:
    # prompt tokens at $0.3 per million, completion tokens at $2.5 per million
    calls = [PricedCall(p, c, p * 0.3e-6 + c * 2.5e-6) for p, c in [(1000, 200), (1200, 800), (900, 50), (1500, 400)]]
    prompt, completion = token_prices(calls) or (0.0, 0.0)
    assert prompt == pytest.approx(0.3e-6) and completion == pytest.approx(2.5e-6)


def test_calls_that_cannot_tell_the_prices_apart_give_one_price_per_token() -> None:
    one = [PricedCall(1000, 100, 0.0011)]
    assert token_prices(one) == pytest.approx((1e-6, 1e-6))
    assert token_prices([]) is None


def _cut(prompt_tokens: int | None = None, cost: float | None = None) -> Transcription:
    return Transcription("loop loop", "loop", "m", prompt_tokens, 200, cost, "gen-1", 1.0)


def test_a_cut_call_without_a_cost_is_priced_at_the_calls_gone_by_and_marked_estimated() -> None:
    calls = [PricedCall(p, c, p * 0.3e-6 + c * 2.5e-6) for p, c in [(1000, 200), (1200, 800), (900, 50)]]
    estimated = priced(_cut(), calls)
    # its prompt as the calls' on average (the provider reported none), its completion as received
    assert estimated.prompt_tokens == round((1000 + 1200 + 900) / 3)
    assert estimated.cost == pytest.approx(estimated.prompt_tokens * 0.3e-6 + 200 * 2.5e-6)
    assert estimated.cost_estimated
    reported = _cut(prompt_tokens=1000, cost=0.002)
    assert priced(reported, calls) == reported  # the provider's own figure stands
    assert priced(_cut(), []) == _cut()  # nothing to go by: no cost is made up
