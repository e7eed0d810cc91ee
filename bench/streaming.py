"""Benchmark 11: streamed provider calls against unstreamed ones: a normal page's latency, and what a loop is billed.

The same page is asked of the fake provider (tests/fakes/chat_server.py) through the real adapter, streamed
(PROVIDER_STREAM=auto, its answer watched with the pipeline's loop check) and unstreamed (off), in interleaved rounds
(the order swapped every round) so that both see the same machine. The fake produces the answer over a fixed time:
unstreamed it sends the whole of it at the end, streamed one event a word, the last at the same end. Then one call
each to a model stuck in a loop up to the output limit: the tokens the fake sent (what a provider bills) and the
call's time, streamed (cut at the first loop) and unstreamed (paid to the limit).
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time

from pagescribe.domain import LOOP_CUT
from pagescribe.providers.base import PageImage, TranscriptionRequest
from pagescribe.providers.openai_compat import OpenAICompatibleProvider, StreamMode
from pagescribe.settings import Settings
from pagescribe.timepolicy import TimePolicy
from pagescribe.transcription.loops import loop_check

from bench.common import CorrectnessError, Mode, Result
from tests.fakes.chat_server import FakeChatServer, Loop, Ok

# rounds (each one streamed and one unstreamed call), seconds the answer takes, the loop's output limit
SIZES = {Mode.FULL: (30, 1.0, 8192), Mode.QUICK: (10, 1.0, 8192), Mode.SMOKE: (2, 0.2, 2048)}
LOOP_TOKEN_SECONDS = 0.0005  # the fake loop's pace: 2000 tokens a second


def _page_text(words: int) -> str:
    """A page's answer: varied words in lines and paragraphs, no loop in it."""
    rng = random.Random(11)  # noqa: S311 - a fixed page, not a secret
    vocabulary = [
        "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 10))) for _ in range(2000)
    ]
    lines = [" ".join(rng.choice(vocabulary) for _ in range(12)) for _ in range(words // 12)]
    return "# A page\n\n" + "\n".join(line + ("\n" if n % 6 == 5 else "") for n, line in enumerate(lines))


def _request(max_output_tokens: int, settings: Settings) -> TranscriptionRequest:
    return TranscriptionRequest(
        image=PageImage(b"\x89PNG\r\n\x1a\n a page", "image/png"),
        prompt=settings.prompt,
        model="bench/vision-model",
        max_output_tokens=max_output_tokens,
        document_id="bench",
        page_number=1,
        loop_check=loop_check(settings.flag_repetition_threshold, ""),
    )


async def _measure(fake: FakeChatServer, rounds: int, limit: int) -> dict[str, list[float]]:
    settings = Settings()
    time_policy = TimePolicy.from_settings(settings)
    providers: dict[StreamMode, OpenAICompatibleProvider] = {
        mode: OpenAICompatibleProvider(
            base_url=fake.base_url,
            api_key=None,
            time=time_policy,
            max_connections=4,
            usage_accounting=True,
            stream=mode,
        )
        for mode in ("auto", "off")
    }
    seconds: dict[str, list[float]] = {"auto": [], "off": []}
    page = _request(settings.max_output_tokens, settings)
    try:
        for mode in ("auto", "off"):  # a warm connection each, not measured
            await providers[mode].transcribe(page, call_seconds=60)
        for number in range(rounds):
            for mode in ("auto", "off") if number % 2 == 0 else ("off", "auto"):
                started = time.perf_counter()
                result = await providers[mode].transcribe(page, call_seconds=60)
                seconds[mode].append(time.perf_counter() - started)
                if result.finish_reason != "stop":
                    raise CorrectnessError(f"a normal page answered {result.finish_reason!r} ({mode})")
        fake.set_default(Loop(token_seconds=LOOP_TOKEN_SECONDS))
        looping = _request(limit, settings)
        for mode in ("auto", "off"):
            started = time.perf_counter()
            result = await providers[mode].transcribe(looping, call_seconds=120)
            seconds[f"loop-{mode}"] = [time.perf_counter() - started]
            if (result.finish_reason == LOOP_CUT) != (mode == "auto"):
                raise CorrectnessError(f"the loop answered {result.finish_reason!r} ({mode})")
    finally:
        for provider in providers.values():
            await provider.aclose()
    return seconds


def run(mode: Mode) -> Result:
    rounds, answer_seconds, limit = SIZES[mode]
    text = _page_text(400)
    with FakeChatServer(default_delay=answer_seconds) as fake:
        fake.set_default(Ok(text=text))
        seconds = asyncio.run(_measure(fake, rounds, limit))
        billed = fake.wait_billed(2 * rounds + 4)
    loop_streamed, loop_unstreamed = billed[-2:]
    streamed, unstreamed = statistics.median(seconds["auto"]), statistics.median(seconds["off"])
    ratio = streamed / unstreamed
    return Result(
        key="streaming",
        title=f"Streamed provider calls ({rounds} interleaved rounds, an answer of {len(text.split())} words over "
        f"{answer_seconds:g} s; a loop up to {limit} tokens)",
        ratio_label="streamed / unstreamed median latency of a normal page",
        ratio=ratio,
        target=1.02,
        direction="<=",
        summary=(
            f"median {streamed * 1000:.0f} ms streamed vs {unstreamed * 1000:.0f} ms unstreamed; a loop billed "
            f"{loop_streamed} tokens streamed ({loop_streamed / limit:.1%} of the limit, target <= 10%) vs "
            f"{loop_unstreamed} unstreamed"
        ),
        rows=[
            ("streamed / unstreamed", "streamed / unstreamed"),
            (
                "**normal page latency**, median (p90)",
                f"**{streamed * 1000:.0f} ms / {unstreamed * 1000:.0f} ms** "
                f"({_p90(seconds['auto']) * 1000:.0f} ms / {_p90(seconds['off']) * 1000:.0f} ms)",
            ),
            ("**loop: completion tokens billed** (what the fake sent)", f"**{loop_streamed} / {loop_unstreamed}**"),
            ("loop: the call's time", f"{seconds['loop-auto'][0]:.2f} s / {seconds['loop-off'][0]:.2f} s"),
        ],
        notes=[
            "Streamed, each answer is read as server-sent events and checked for a loop (FLAG_REPETITION_THRESHOLD) "
            "every 512 characters at first, then every eighth more; the loop is cut when the check confirms it, and "
            "the fake stops where the client closed.",
        ],
    )


def _p90(values: list[float]) -> float:
    return sorted(values)[max(0, round(0.9 * len(values)) - 1)]
