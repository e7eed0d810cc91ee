"""What a page's result records and says: the checks' thresholds, its outcome, and why it was rejected or not
started."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pagescribe.checks import Flag, PageEvidence, PageFlag, Thresholds, hard_flags
from pagescribe.domain import PageOutcome, SpendGate, SpendVerdict
from pagescribe.providers.base import Transcription
from pagescribe.settings import Settings

if TYPE_CHECKING:  # grounding (rapidfuzz, markdown-it) is loaded by the first answer grounded
    from pagescribe.grounding import PageGrounding

TEXT_LAYER = "pdf-text-layer"


def thresholds(settings: Settings) -> Thresholds:
    """The checks' thresholds, as configured."""
    return Thresholds(
        repetition=settings.flag_repetition_threshold,
        refusal=settings.flag_refusal_threshold,
        ink=settings.flag_ink_threshold,
        ungrounded=settings.flag_ungrounded_threshold,
        ungrounded_block_chars=settings.flag_ungrounded_block_chars,
        missed_text=settings.flag_missed_text_threshold,
        low_confidence=settings.flag_low_confidence_threshold,
    )


_WHY = {
    Flag.TRUNCATED: "the model stopped at the output limit (finish_reason=length, MAX_OUTPUT_TOKENS)",
    Flag.REPETITION: "the answer repeats itself in a loop",
    Flag.REFUSAL: "the model apologised or refused instead of transcribing",
    Flag.EMPTY: "no text from a page that has ink",
    Flag.BLANK_RENDER: "the page rendered blank although it draws text or paths (missing fonts, or a render failure)",
    Flag.UNGROUNDED: "the answer holds text that nothing on the page supports (invented text)",
    Flag.MISSED_TEXT: "the answer leaves out text that is on the page (dropped regions)",
}


def rejection(flags: list[PageFlag], *, escalated_to: str | None = None, then: str = "its text is kept") -> str:
    """Why a page failed on its hard flags: each flag with its value and threshold, and what it means."""
    reasons = "; ".join(f"{flag.describe()}: {_WHY[flag.flag]}" for flag in hard_flags(flags))
    after = f", also from the escalation model {escalated_to}" if escalated_to else ""
    return f"the answer was not accepted{after}: {reasons}; {then}"


def budget_reason(verdict: SpendVerdict, model: str, tenant_id: str) -> str:
    """Why a page was not started: the cap or budget, what was spent, and the price its call was judged at."""
    price = (
        f"a call of {model} is held at its worst case, ${verdict.reserve:.6f} (its output limit at the tenant's own "
        f"prices; ${verdict.price:.6f} on average)"
        if verdict.reserve is not None and verdict.price is not None
        else f"{model} has no cost history yet"
    )
    if verdict.verdict == SpendGate.DAILY_BUDGET:
        assert verdict.daily_budget_usd is not None
        return (
            f"budget: tenant {tenant_id}'s daily budget of ${verdict.daily_budget_usd:.6f} would be exceeded "
            f"(${verdict.spent_today:.6f} spent today, UTC; {price})"
        )
    assert verdict.max_cost_usd is not None
    return (
        f"budget: the document's max_cost_usd of ${verdict.max_cost_usd:.6f} would be exceeded "
        f"(${verdict.spent:.6f} spent; {price})"
    )


def answer_outcome(result: Transcription, provider: str, text: str, flags: list[PageFlag]) -> PageOutcome:
    return PageOutcome(
        text=text,
        finish_reason=result.finish_reason,
        prompt_tokens=result.prompt_tokens,
        completion_tokens=result.completion_tokens,
        cost=result.cost,
        cost_estimated=result.cost_estimated,
        model=result.model,
        provider=provider,
        provider_request_id=result.request_id,
        latency_ms=round(result.latency_seconds * 1000),
        flags=tuple(flag.as_dict() for flag in flags),
        confidence=result.confidence,
    )


def text_layer_outcome(text: str, flags: list[PageFlag]) -> PageOutcome:
    """The page's own text layer, laid out in reading order, as its answer: no model call, nothing paid."""
    return PageOutcome(
        text,
        "text-layer",
        0,
        0,
        0.0,
        TEXT_LAYER,
        TEXT_LAYER,
        None,
        0,
        flags=tuple(flag.as_dict() for flag in flags),
        called=False,
    )


def grounding_kept(
    grounding: PageGrounding | None, evidence: PageEvidence, read: dict[str, Any]
) -> dict[str, Any] | None:
    """What is kept of the answer's grounding: the grounding, or why the page had nothing to ground it to."""
    if grounding is not None and evidence.words is not None:
        from pagescribe.grounding import grounding_record

        return grounding_record(grounding, evidence.words)
    if "skipped" in read:
        return {"source": None, "skipped": f"no second read: {read['skipped']}"}
    return None
