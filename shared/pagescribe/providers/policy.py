"""What every network adapter shares: the failure policy of one call (requests retried with backoff inside the call's
time, never sooner than ``Retry-After``), and the hygiene of a provider's text (storable, clipped, accepted).

The OpenAI-compatible adapter and the Bedrock adapter each turn their own failures into :class:`ProviderError` and
their own answers into :class:`Transcription`; how a call is retried, and when an answer may be kept, is decided here
once, for both.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

from pagescribe.providers.base import FailedAttempt, ProviderError, Transcription, TranscriptionRequest

logger = logging.getLogger(__name__)

BACKOFF_BASE_SECONDS = 0.5
BACKOFF_CAP_SECONDS = 20.0
CHECK_EVERY_CHARS = 512  # a streamed answer is checked for a loop at least this many new characters apart
_NOT_RETRYABLE_5XX = frozenset({501, 505})  # Not Implemented, HTTP Version Not Supported
_DETAIL_LIMIT = 500  # characters of a provider's error text kept in a message


async def with_retries(
    one_request: Callable[[float], Awaitable[Transcription]],
    request: TranscriptionRequest,
    call_seconds: float,
    *,
    retry_rate_limited: bool,
    provider: str,
) -> Transcription:
    """``one_request(deadline)`` (the loop's time the call must end by) until it answers, retried as the failure
    policy says within ``call_seconds``; the requests that failed before the answer (or the error) travel with it.

    A retryable error is retried after a backoff with jitter, never sooner than its ``retry_after``; one that is not,
    or a 429 when ``retry_rate_limited`` is off (the rate governor pauses every environment instead), is raised at
    once; when the next wait does not fit in the call's time, the last error is raised. ``provider`` names the
    provider in the message of a call that ran out of time."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + call_seconds
    failed: list[FailedAttempt] = []  # the requests retried, each recorded by the caller as a call
    last_error: ProviderError | None = None
    try:
        async with asyncio.timeout_at(deadline):
            while True:
                request_started = loop.time()
                try:
                    return replace(await one_request(deadline), failed_attempts=tuple(failed))
                except ProviderError as error:
                    error.earlier_attempts = tuple(failed)
                    if not error.retryable or (error.status_code == 429 and not retry_rate_limited):
                        raise
                    last_error = error
                # Retry-After is a floor: "0" or a date in the past must not turn backoff into a tight loop.
                wait = max(backoff(len(failed) + 1), last_error.retry_after or 0.0)
                if loop.time() + wait >= deadline:
                    raise last_error
                failed.append(FailedAttempt(last_error.status_code, last_error.message, loop.time() - request_started))
                logger.warning(
                    "page %d of document %s: attempt %d failed (%s); retrying in %.2f s",
                    request.page_number,
                    request.document_id,
                    len(failed),
                    last_error.message,
                    wait,
                )
                await asyncio.sleep(wait)
    except TimeoutError:
        message = f"no answer from {provider} within the call's {call_seconds:.1f} s"
        if last_error is not None:
            message += f" (last error: {last_error.message})"
        timed_out = ProviderError(message, retryable=True)
        timed_out.earlier_attempts = tuple(failed)
        raise timed_out from None


def backoff(attempt: int) -> float:
    """Exponential backoff with jitter: between half and all of min(cap, base * 2**(attempt-1))."""
    ceiling = min(BACKOFF_CAP_SECONDS, BACKOFF_BASE_SECONDS * 2.0 ** (attempt - 1))
    return ceiling / 2 + random.uniform(0, ceiling / 2)  # noqa: S311 - jitter, not cryptography


def retry_after_seconds(value: str | None) -> float | None:
    """A ``Retry-After`` header as seconds from now: delay-seconds or an HTTP-date."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - datetime.now(UTC)).total_seconds()
    return max(0.0, seconds) if math.isfinite(seconds) else None


def is_retryable_status(status: int) -> bool:
    return status in (408, 429) or (500 <= status <= 599 and status not in _NOT_RETRYABLE_5XX)


def clip(text: str) -> str | None:
    """Provider text fit for a one-line message: whitespace collapsed, at most _DETAIL_LIMIT characters."""
    return " ".join(storable(text).split())[:_DETAIL_LIMIT] or None


def storable(text: str) -> str:
    """Provider text as PostgreSQL can store it: JSON strings may carry NUL and lone surrogates; it cannot."""
    return text.replace("\x00", "").encode("utf-8", "replace").decode("utf-8")


def accepted(text: str, finish_reason: str) -> str:
    """The finish reason of an answer that may be kept; a failed or empty answer raises."""
    if finish_reason == "error":
        raise ProviderError("provider reported an error while answering (finish_reason=error)", retryable=True)
    if not text.strip() and finish_reason != "length":
        raise ProviderError(f"provider returned an empty answer (finish_reason={finish_reason})", retryable=True)
    return finish_reason
