"""The rate governor on the in-memory store: one bucket per model shared by every environment."""

from __future__ import annotations

from collections.abc import Sequence

from pagescribe.domain import ClaimedJob, RateBucket
from pagescribe.governor import EARLY_SECONDS, Admission, RateGovernor
from pagescribe.settings import Settings

from tests.support.memory_store import MemoryStore

LIMITED = Settings(rate_limit_rpm=60, rate_limit_burst=2)


def _page(slot_in_seconds: float | None = None) -> ClaimedJob:
    return ClaimedJob("job", "document", 1, 1, "token", slot_in_seconds=slot_in_seconds)


def _one(governor: RateGovernor, page: ClaimedJob, model: str) -> Admission:
    [admission] = governor.admit([page], model)
    return admission


def test_with_no_limit_every_call_goes_and_no_bucket_is_kept(store: MemoryStore) -> None:
    governor = RateGovernor(Settings(rate_limit_rpm=0), store, "fake")
    assert not governor.enabled
    assert [_one(governor, _page(), "m").wait for _ in range(100)] == [0.0] * 100
    assert governor.rate_limited("m", 30) is None
    assert store.state.buckets == {}


def test_a_burst_goes_at_once_then_each_call_reserves_the_next_free_slot(store: MemoryStore) -> None:
    # Given 60 calls a minute with a burst of two
    governor = RateGovernor(LIMITED, store, "fake")
    # When three calls ask at once
    first, second, third = (_one(governor, _page(), "m") for _ in range(3))
    # Then two go and the third waits in the queue for the slot it reserved, a second away
    assert (first.wait, second.wait) == (0.0, 0.0)
    assert third.slot_at is not None and 0.9 < third.wait <= 1.0 and third.delay_seconds == 1
    assert "next free slot" in third.why


def test_a_page_back_before_its_slot_waits_again_without_taking_another(store: MemoryStore) -> None:
    governor = RateGovernor(LIMITED, store, "fake")
    early = _one(governor, _page(slot_in_seconds=EARLY_SECONDS + 5), "m")
    assert early.keep_slot and early.wait == EARLY_SECONDS + 5
    assert store.state.buckets == {}  # not a statement was run
    # And a page back on time calls on the slot it holds, taking nothing more
    on_time = _one(governor, _page(slot_in_seconds=0.2), "m")
    assert on_time.wait == 0 and on_time.tokens == 0
    assert store.state.buckets[("fake", "m")].requests == 2  # the burst is whole


def test_a_429_in_one_environment_pauses_the_others(store: MemoryStore) -> None:
    # Given two environments sharing the store
    seen, other = RateGovernor(LIMITED, store, "fake"), RateGovernor(LIMITED, store, "fake")
    # When the provider answers a call of one with a 429 and a Retry-After of 30 s
    assert _one(seen, _page(), "m").wait == 0
    assert seen.rate_limited("m", 30) == 30
    # Then the other, which never saw it, waits out the pause without reserving a slot
    held = _one(other, _page(), "m")
    assert 29 < held.wait <= 30 and held.slot_at is None and "paused" in held.why
    # And another model is not held
    assert _one(other, _page(), "another").wait == 0


def test_a_429_without_retry_after_pauses_for_the_default(store: MemoryStore) -> None:
    governor = RateGovernor(LIMITED, store, "fake")
    _one(governor, _page(), "m")
    assert governor.rate_limited("m", None) == 5.0


def test_token_limits_learn_what_a_call_takes(store: MemoryStore) -> None:
    # Given a limit of 1,000 tokens a second, and a first call that took none (no call seen yet) but used 1,200
    governor = RateGovernor(Settings(rate_limit_rpm=600, rate_limit_tpm=60_000, rate_limit_burst=5), store, "fake")
    first = _one(governor, _page(), "m")
    governor.settle("m", first, 1200)
    governor.flush()
    # Then the bucket owes those tokens: the next call waits until they are back and its own mean has come in
    assert first.tokens == 0 and store.state.buckets[("fake", "m")].mean_tokens == 1200
    owed = _one(governor, _page(), "m")
    assert 1.1 < owed.wait <= 1.2 and owed.slot_at is not None


def test_models_asked_on_different_providers_have_each_their_providers_bucket(store: MemoryStore) -> None:
    # Given pages on Bedrock and an escalation model on another provider (a routing provider's ``serving``)
    serving = {"amazon.nova-lite-v1:0": "bedrock:us-east-1", "vendor/strong": "openai-compatible:example.com"}
    governor = RateGovernor(LIMITED, store, "bedrock:us-east-1+openai-compatible:example.com", serving.__getitem__)
    # When each model is called and Bedrock throttles its own
    _one(governor, _page(), "amazon.nova-lite-v1:0")
    _one(governor, _page(), "vendor/strong")
    governor.rate_limited("amazon.nova-lite-v1:0", 30)
    # Then each bucket is its provider's and model's, and only Bedrock's model is paused
    assert set(store.state.buckets) == {(provider, model) for model, provider in serving.items()}
    assert _one(governor, _page(), "vendor/strong").wait == 0
    assert _one(governor, _page(), "amazon.nova-lite-v1:0").wait > 29


def test_pages_that_ask_together_take_their_slots_as_if_one_after_another(store: MemoryStore) -> None:
    # Given 60 calls a minute with a burst of two
    governor = RateGovernor(LIMITED, store, "fake")
    # When a batch asks at once: two pages, one back early for its slot, one back on time for it, and two more
    batch = [_page(), _page(), _page(slot_in_seconds=EARLY_SECONDS + 5), _page(slot_in_seconds=0.2), _page(), _page()]
    admissions = governor.admit(batch, "m")
    # Then the burst goes, the early page waits for its own slot, the page on time calls on it, and the last two
    # reserve the next free slots, one and two seconds away: what the pages asking one after another get
    assert [a.wait for a in admissions[:4]] == [0.0, 0.0, EARLY_SECONDS + 5, 0.0]
    assert admissions[2].keep_slot and admissions[3].tokens == 0
    assert 0.9 < admissions[4].wait <= 1.0 and 1.9 < admissions[5].wait <= 2.0
    assert store.state.buckets[("fake", "m")].requests == -2  # four taken, none for the two holding theirs


class SettleSpy(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.settled: list[tuple[str, int]] = []

    def settle_rate_tokens(self, bucket: RateBucket, model: str, *, calls: Sequence[tuple[float, int]]) -> None:
        self.settled.append((model, len(calls)))
        super().settle_rate_tokens(bucket, model, calls=calls)


def test_calls_are_settled_together_one_statement_a_model_when_flushed() -> None:
    # Given token limits, and five calls of two models that took their tokens
    store = SettleSpy()
    governor = RateGovernor(Settings(rate_limit_rpm=600, rate_limit_tpm=60_000, rate_limit_burst=5), store, "fake")
    calls = [(model, _one(governor, _page(), model)) for model in ("m", "m", "other", "other", "other")]
    # When each ends and is settled, nothing is written until the flush, which writes once a model
    for model, admission in calls:
        governor.settle(model, admission, 700)
    assert store.settled == []
    governor.flush()
    assert store.settled == [("m", 2), ("other", 3)]
    # And the bucket learned the calls' tokens; a second flush has nothing to settle
    assert store.state.buckets[("fake", "m")].mean_tokens == 700
    governor.flush()
    assert store.settled == [("m", 2), ("other", 3)]
