"""The rate governor: one provider rate limit shared by every environment, kept in PostgreSQL.

Each provider and model has a token bucket (RATE_LIMIT_RPM, RATE_LIMIT_TPM, RATE_LIMIT_BURST) in the
``rate_buckets`` table. Before a model call the page takes a token in one statement. When none is free it does not
wait on the Lambda clock: it reserves the next free slot and goes back to the queue until then (SQS's message delay),
and when it comes back it calls without taking another. A 429 opens a pause for its Retry-After that every
environment reads in the same statement, so processes that never saw the 429 hold their calls too.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from pagescribe.domain import ClaimedJob, RateBucket, RateGrant
from pagescribe.settings import Settings
from pagescribe.store.ports import SpendStore

MAX_DELAY_SECONDS = 900  # SQS's longest message delay
EARLY_SECONDS = 1.0  # a page back this much before its reserved slot calls anyway (SQS delays are whole seconds)
STALE_SLOT_SECONDS = 60.0  # a slot passed this long ago is given up: the page takes a token afresh
PAUSE_WITHOUT_RETRY_AFTER = 5.0  # seconds every environment holds off after a 429 that named no Retry-After


@dataclass(frozen=True)
class Admission:
    """Start the call now (``wait`` 0, ``tokens`` taken for it), or wait ``wait`` seconds in the queue: for the slot
    reserved at ``slot_at``, or for the slot the page holds already (``keep_slot``), or for no slot at all (a pause, or
    a wait longer than SQS can delay)."""

    wait: float
    slot_at: datetime | None = None
    keep_slot: bool = False
    tokens: float = 0.0
    why: str = ""

    @property
    def delay_seconds(self) -> int:
        """The queue delay: whole seconds, never sooner than the slot or the pause, within SQS's limit."""
        return min(MAX_DELAY_SECONDS, max(1, math.ceil(self.wait)))


GO = Admission(0.0)


class RateGovernor:
    def __init__(
        self, settings: Settings, db: SpendStore, provider: str, serving: Callable[[str], str] | None = None
    ) -> None:
        """``serving``: the provider that asks a model, where models are asked on several (escalation on another
        provider); each provider and model has its own bucket."""
        self._db = db
        self._serving = serving
        self._bucket = (
            RateBucket(provider, settings.rate_limit_rpm, settings.rate_limit_tpm, settings.rate_limit_burst)
            if settings.rate_limit_rpm > 0
            else None
        )
        self._counts_tokens = settings.rate_limit_tpm > 0
        self._unsettled: dict[str, list[tuple[float, int]]] = {}  # by model: each call's tokens taken and used

    @property
    def enabled(self) -> bool:
        return self._bucket is not None

    def admit(self, jobs: Sequence[ClaimedJob], model: str) -> list[Admission]:
        """May each page's call to ``model`` start now? The pages in order, each behind those before it; one round
        trip for them all, none when the governor is off or every page came back before the slot it holds."""
        if self._bucket is None:
            return [GO for _ in jobs]
        slots = [job.slot_in_seconds for job in jobs]
        taking = [slot for slot in slots if not _holds(slot)]
        bucket = self._bucket_of(self._bucket, model)
        max_wait = MAX_DELAY_SECONDS - EARLY_SECONDS
        prepaid = [_prepaid(slot) for slot in taking]
        grants = iter(self._db.take_rate_slots(bucket, model, prepaid=prepaid, max_wait=max_wait) if taking else [])
        return [_kept_slot(slot, model) if _holds(slot) else _admission(next(grants), model, slot) for slot in slots]

    def rate_limited(self, model: str, retry_after: float | None) -> float | None:
        """A 429 from the provider: pause every environment's calls to ``model``; the pause in seconds (None when
        the governor is off: the page backs off alone)."""
        if self._bucket is None:
            return None
        pause = retry_after if retry_after is not None and retry_after > 0 else PAUSE_WITHOUT_RETRY_AFTER
        self._db.pause_rate_bucket(self._bucket_of(self._bucket, model), model, pause)
        return pause

    def _bucket_of(self, bucket: RateBucket, model: str) -> RateBucket:
        return bucket if self._serving is None else bucket._replace(provider=self._serving(model))

    def settle(self, model: str, admission: Admission, actual_tokens: int) -> None:
        """The call's real tokens against those it took (token limits only), settled with the batch's other calls
        (``flush``)."""
        if self._bucket is not None and self._counts_tokens:
            self._unsettled.setdefault(model, []).append((admission.tokens, actual_tokens))

    def flush(self) -> None:
        """Settle the calls made since the last flush, one statement a model: a batch's calls end within moments of
        each other, and the bucket's row (every environment's, for the model) is written once for them, not once a
        call. Calls not yet flushed when an environment dies go unsettled, as a bucket's last takes may be lost."""
        unsettled, self._unsettled = self._unsettled, {}
        if self._bucket is None:
            return
        for model, calls in unsettled.items():
            self._db.settle_rate_tokens(self._bucket_of(self._bucket, model), model, calls=calls)


def _holds(slot: float | None) -> bool:
    """The page came back early for the slot it reserved (a resent message): the slot still holds."""
    return slot is not None and slot > EARLY_SECONDS


def _prepaid(slot: float | None) -> bool:
    """The page comes for the slot it reserved (not long ago): it calls without taking another."""
    return slot is not None and slot > -STALE_SLOT_SECONDS


def _kept_slot(slot: float | None, model: str) -> Admission:
    """A page back before the slot it reserved: it waits for that slot, taking nothing."""
    assert slot is not None, "only a page that holds a slot keeps it"
    return Admission(slot, keep_slot=True, why=f"its reserved slot for {model} is {slot:.1f} s away")


def _admission(grant: RateGrant, model: str, slot: float | None) -> Admission:
    """The governor's grant for a page as the page's admission (``slot``: the slot it held, if it came for it)."""
    if grant.wait <= 0:
        return Admission(0.0, tokens=0.0 if _prepaid(slot) else grant.mean_tokens)
    if grant.paused:
        return Admission(grant.wait, why=f"{model} is paused for {grant.wait:.1f} s after a 429")
    if grant.reserved:
        return Admission(grant.wait, grant.slot_at, why=f"the next free slot for {model} is {grant.wait:.1f} s away")
    return Admission(grant.wait, why=f"no slot for {model} within {MAX_DELAY_SECONDS} s")
