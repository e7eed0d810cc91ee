"""Loops cut while they stream: the check a call's answer is watched with, and the price of a call cut before its
provider said what it cost.

A streamed call is closed at the first loop in its answer (:mod:`pagescribe.providers.openai_compat`): the same
``repetition`` check at the same threshold, against the same page text, as the answer's own check, so the text
received is flagged ``repetition`` (hard) and the page escalates or fails on it. The provider reports a call's usage
in its last event, which a cut call never gets: its completion tokens are then the text events received, and its cost
is estimated at the tenant's own prices of the model (``attempts.cost_estimated``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from pagescribe.checks import clean_answer, repetition
from pagescribe.domain import PricedCall
from pagescribe.providers.base import Transcription


def loop_check(threshold: int, reference: str) -> Callable[[str], bool]:
    """Whether an answer so far is a loop, as the answer's own check would flag it (``FLAG_REPETITION_THRESHOLD``,
    beyond the page's own text layer ``reference``)."""

    def looping(text: str) -> bool:
        return repetition(clean_answer(text), threshold, reference) >= threshold

    return looping


def token_prices(history: Sequence[PricedCall]) -> tuple[float, float] | None:
    """USD per prompt token and per completion token, from calls with their reported costs: cost = a * prompt +
    b * completion fitted by least squares; where the calls cannot tell the two apart (one call, calls all of one
    shape) or the fit is not positive, one price per token for both (the calls' cost over their tokens). None without
    a call to go by."""
    tokens = sum(call.prompt_tokens + call.completion_tokens for call in history)
    if not history or tokens <= 0:
        return None
    spp = sum(call.prompt_tokens**2 for call in history)
    scc = sum(call.completion_tokens**2 for call in history)
    spc = sum(call.prompt_tokens * call.completion_tokens for call in history)
    spy = sum(call.prompt_tokens * call.cost for call in history)
    scy = sum(call.completion_tokens * call.cost for call in history)
    determinant = spp * scc - spc * spc
    if determinant > 1e-9 * spp * scc:
        prompt, completion = (spy * scc - scy * spc) / determinant, (scy * spp - spy * spc) / determinant
        if prompt >= 0 and completion >= 0:
            return prompt, completion
    blended = sum(call.cost for call in history) / tokens
    return blended, blended


def priced(result: Transcription, history: Sequence[PricedCall]) -> Transcription:
    """A call that reported no cost, priced at ``history``'s prices and marked estimated; its prompt tokens, when the
    provider did not report them either, those of the calls gone by on average. As it was without a history."""
    prices = token_prices(history)
    if result.cost is not None or prices is None:
        return result
    prompt_tokens = result.prompt_tokens
    if prompt_tokens is None:
        prompt_tokens = round(sum(call.prompt_tokens for call in history) / len(history))
    cost = prompt_tokens * prices[0] + (result.completion_tokens or 0) * prices[1]
    return replace(result, prompt_tokens=prompt_tokens, cost=cost, cost_estimated=True)
