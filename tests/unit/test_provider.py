"""The OpenAI-compatible adapter against a real HTTP server on loopback (tests/fakes/chat_server.py).

Wall-clock assertions give generous upper slack; the lower bounds are what prove a wait happened.
Backoff between attempts is 0.25-0.5 s, 0.5-1 s, 1-2 s, ... (base 0.5 s with jitter).
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import pytest
from pagescribe.checks import repetition
from pagescribe.domain import LOOP_CUT
from pagescribe.providers.base import (
    PageImage,
    ProviderError,
    Transcription,
    TranscriptionProvider,
    TranscriptionRequest,
)
from pagescribe.providers.openai_compat import OpenAICompatibleProvider, _SendTurn
from pagescribe.settings import Settings
from pagescribe.timepolicy import TimePolicy

from tests.fakes.chat_server import (
    BodyError,
    Empty,
    FakeChatServer,
    Gate,
    Hang,
    Loop,
    Malformed,
    Ok,
    Reset,
    Status,
    StreamError,
    Trickle,
    Truncated,
    expected_text,
)

API_KEY = "sk-test-not-a-real-key"
IMAGE = PageImage(data=b"\x89PNG\r\n\x1a\n fake page one", media_type="image/png")
REPO_ROOT = Path(__file__).resolve().parents[2]


def page_request(image: PageImage = IMAGE, page_number: int = 1) -> TranscriptionRequest:
    return TranscriptionRequest(
        image=image,
        prompt="Transcribe this page.",
        model="vendor/vision-model",
        max_output_tokens=4096,
        document_id="doc-1",
        page_number=page_number,
    )


SETTINGS = Settings()
TIME = TimePolicy.from_settings(SETTINGS)


def make_provider(base_url: str, **kwargs: Any) -> TranscriptionProvider:
    """The provider as the settings' defaults configure it, with ``kwargs``."""
    kwargs.setdefault("api_key", API_KEY)
    kwargs.setdefault("time", TIME)
    kwargs.setdefault("max_connections", SETTINGS.page_concurrency)
    kwargs.setdefault("usage_accounting", SETTINGS.provider_usage_accounting)
    return OpenAICompatibleProvider(base_url=base_url, **kwargs)


def transcribe(
    base_url: str, *, budget: float = 5.0, request: TranscriptionRequest | None = None, **kwargs: Any
) -> Transcription:
    async def go() -> Transcription:
        provider = make_provider(base_url, **kwargs)
        try:
            return await provider.transcribe(request or page_request(), call_seconds=budget)
        finally:
            await provider.aclose()

    return asyncio.run(go())


def transcribe_failing(base_url: str, *, budget: float = 5.0, **kwargs: Any) -> tuple[ProviderError, float]:
    started = time.monotonic()
    with pytest.raises(ProviderError) as info:
        transcribe(base_url, budget=budget, **kwargs)
    return info.value, time.monotonic() - started


def transcribe_timed(base_url: str, **kwargs: Any) -> tuple[Transcription, float]:
    started = time.monotonic()
    result = transcribe(base_url, **kwargs)
    return result, time.monotonic() - started


@pytest.fixture
def fake() -> Iterator[FakeChatServer]:
    with FakeChatServer() as server:
        yield server


# the answer and the request


def test_ok_answer_carries_text_and_call_evidence(fake: FakeChatServer) -> None:
    result = transcribe(fake.base_url)

    text = expected_text(IMAGE.data)
    assert result.text == text
    assert result.finish_reason == "stop"
    assert result.finish_reason != "length"
    assert result.model == "vendor/vision-model"
    assert result.prompt_tokens == 1000
    assert result.completion_tokens == len(text.split())
    assert result.cost == pytest.approx(0.00012)
    assert result.request_id == "gen-1"
    assert len(result.failed_attempts) == 0
    assert 0 < result.latency_seconds < 5


def test_request_has_the_chat_completions_shape(fake: FakeChatServer) -> None:
    transcribe(fake.base_url)

    [received] = fake.received
    assert (received.method, received.path) == ("POST", "/v1/chat/completions")
    assert received.headers["authorization"] == f"Bearer {API_KEY}"
    assert received.headers["x-title"] == "pagescribe"
    assert received.headers["content-type"] == "application/json"
    body = received.body
    assert body is not None
    assert body["model"] == "vendor/vision-model"
    assert body["max_tokens"] == 4096
    assert body["temperature"] == 0
    assert body["usage"] == {"include": True}
    [message] = body["messages"]
    assert message["role"] == "user"
    text_part, image_part = message["content"]
    assert text_part == {"type": "text", "text": "Transcribe this page."}
    assert image_part["type"] == "image_url"
    header, data = image_part["image_url"]["url"].split(",", 1)
    assert header == "data:image/png;base64"
    assert base64.b64decode(data) == IMAGE.data


def test_a_prompt_that_holds_what_marks_the_images_place_is_sent_as_written_beside_the_image(
    fake: FakeChatServer,
) -> None:
    # Given a document's prompt that contains the very string the body's image is put in place of
    prompt = 'Transcribe this page. \x00image\x00 "quoted" \\ and more'
    # When the page is sent
    transcribe(fake.base_url, request=dataclasses.replace(page_request(), prompt=prompt))
    # Then the prompt arrives as written and the image whole, in its own part
    [received] = fake.received
    assert received.body is not None
    text_part, image_part = received.body["messages"][0]["content"]
    assert text_part == {"type": "text", "text": prompt}
    assert base64.b64decode(image_part["image_url"]["url"].split(",", 1)[1]) == IMAGE.data


def test_without_key_or_accounting_no_authorization_or_usage_is_sent(fake: FakeChatServer) -> None:
    transcribe(fake.base_url, api_key=None, usage_accounting=False, app_url="https://example.org/app")

    [received] = fake.received
    assert "authorization" not in received.headers
    assert received.headers["http-referer"] == "https://example.org/app"
    assert received.body is not None
    assert "usage" not in received.body


def test_name_identifies_the_endpoint_and_repr_hides_the_key(fake: FakeChatServer) -> None:
    provider = make_provider(fake.base_url, api_key="sk-secret-value")
    try:
        port = fake.base_url.split(":")[2].split("/")[0]
        assert provider.name == f"openai-compatible:127.0.0.1:{port}"
        assert "sk-secret-value" not in repr(provider)
    finally:
        asyncio.run(provider.aclose())


@pytest.mark.parametrize(
    ("behaviour", "text", "cost", "request_id_prefix"),
    [
        (Ok(text="Hello world", as_parts=True), "Hello world", 0.00012, "gen-"),
        (Ok(text="no id", include_id=False), "no id", 0.00012, "req-"),
        (Ok(text="free", cost=None), "free", None, "gen-"),
    ],
)
def test_answer_variants_are_read(
    fake: FakeChatServer, behaviour: Ok, text: str, cost: float | None, request_id_prefix: str
) -> None:
    fake.script(behaviour)

    result = transcribe(fake.base_url)

    assert result.text == text
    assert result.cost == cost
    assert result.request_id is not None
    assert result.request_id.startswith(request_id_prefix)


def test_truncated_answer_is_a_result_not_an_error(fake: FakeChatServer) -> None:
    fake.script(Truncated("partial text"))

    result = transcribe(fake.base_url)

    assert (result.text, result.finish_reason, result.failed_attempts) == ("partial text", "length", ())


# connections


def test_calls_on_one_provider_reuse_pooled_connections(fake: FakeChatServer) -> None:
    images = [PageImage(data=f"page {n}".encode(), media_type="image/jpeg") for n in range(30)]

    async def go() -> tuple[list[str], int, list[str]]:
        provider = make_provider(fake.base_url, max_connections=10)
        try:
            sequential = [
                (await provider.transcribe(page_request(image), call_seconds=5)).text for image in images[:20]
            ]
            after_sequential = fake.connections_opened
            fake.default_delay = 0.2  # keeps all 10 concurrent calls in flight at once
            results = await asyncio.gather(
                *(provider.transcribe(page_request(image), call_seconds=5) for image in images[20:])
            )
            return sequential, after_sequential, [r.text for r in results]
        finally:
            await provider.aclose()

    sequential, after_sequential, concurrent = asyncio.run(go())

    assert sequential == [expected_text(image.data) for image in images[:20]]
    assert concurrent == [expected_text(image.data) for image in images[20:]]
    assert after_sequential == 1  # one keep-alive connection served all 20 sequential calls
    assert fake.connections_opened == 10  # the idle one plus 9 new, up to max_connections
    assert fake.calls == 30


def test_concurrent_calls_queue_for_the_connection_limit(fake: FakeChatServer) -> None:
    fake.default_delay = 0.2

    async def go() -> list[Transcription]:
        provider = make_provider(fake.base_url, max_connections=3)
        try:
            return await asyncio.gather(*(provider.transcribe(page_request(), call_seconds=5) for _ in range(10)))
        finally:
            await provider.aclose()

    started = time.monotonic()
    results = asyncio.run(go())

    assert [r.failed_attempts for r in results] == [()] * 10
    assert fake.connections_opened == 3
    assert time.monotonic() - started >= 0.7  # 10 calls through 3 connections: 4 rounds of 0.2 s


@pytest.mark.parametrize("stream", ["auto", "off"])
def test_concurrent_calls_are_in_flight_together_streamed_or_not(fake: FakeChatServer, stream: str) -> None:
    # Given a provider that holds every request until told to answer, streamed (its head would come at once) or not
    # (its head comes with its end), and a client whose ten connections are open already
    async def ten_held(provider: TranscriptionProvider, gate: Gate) -> list[Transcription]:
        fake.route(gate)
        calls = [asyncio.ensure_future(provider.transcribe(page_request(), call_seconds=30)) for _ in range(10)]
        try:
            await asyncio.to_thread(gate.wait_held, 10, 20.0)  # 20 s bounds the failure only
        finally:
            gate.open()
        return await asyncio.gather(*calls)

    first, second = Gate(), Gate()

    async def go() -> tuple[int, list[Transcription]]:
        provider = make_provider(fake.base_url, max_connections=10, stream=stream)
        try:
            await ten_held(provider, first)  # the ten connections opened
            opened = fake.connections_opened
            return opened, await ten_held(provider, second)
        finally:
            await provider.aclose()

    # When ten calls start together on them
    opened, results = asyncio.run(go())
    # Then each request's turn to go out ended once its head was written, not with its answer: the provider held all
    # ten at once, on those ten connections
    assert opened == 10
    assert second.most_held == 10
    assert [r.failed_attempts for r in results] == [()] * 10
    assert fake.connections_opened == 10


def test_a_requests_turn_to_go_out_ends_once_its_head_is_written_or_its_connection_opens() -> None:
    async def go() -> list[str]:
        turns, seen = asyncio.Lock(), []

        async def request(name: str, events: list[str]) -> None:
            async with _SendTurn(turns) as turn:
                seen.append(f"{name} made")
                for event in events:
                    await asyncio.sleep(0)
                    await turn.trace(event, {})
                    seen.append(f"{name} {event}")
                await asyncio.sleep(0.01)  # the rest of the request, its turn ended or not
                seen.append(f"{name} answered")

        head = ["http11.send_request_headers.started", "http11.send_request_headers.complete"]
        connect = ["connection.connect_tcp.started", "connection.connect_tcp.complete", *head]
        await asyncio.gather(request("first", head), request("second", connect), request("third", []))
        return seen

    # Given three requests taking turns: one on an open connection, one opening a connection, one untraced
    seen = asyncio.run(go())
    # Then the second is made once the first's head is written (not before, nor after its answer), and the third
    # once the second's connection starts to open, though none had been answered
    assert seen.index("second made") == seen.index("first http11.send_request_headers.complete") + 1
    assert seen.index("third made") == seen.index("second connection.connect_tcp.started") + 1
    assert seen.index("third made") < seen.index("first answered")


def test_a_turn_ends_when_its_request_fails_before_its_head_is_written() -> None:
    async def go() -> bool:
        turns = asyncio.Lock()
        with pytest.raises(OSError):
            async with _SendTurn(turns) as turn:
                await turn.trace("connection.connect_tcp.started", {})
                raise OSError("connection refused")
        return turns.locked()

    assert asyncio.run(go()) is False


# retries within the call's time


def test_429_with_retry_after_waits_then_succeeds(fake: FakeChatServer) -> None:
    fake.script(Status(429, "Rate limit exceeded", retry_after="1"))

    result, elapsed = transcribe_timed(fake.base_url, budget=10)

    assert result.text == expected_text(IMAGE.data)
    assert len(result.failed_attempts) == 1
    assert elapsed >= 0.95
    assert result.latency_seconds >= 0.95
    assert fake.calls == 2


def test_server_errors_are_retried_until_an_answer(fake: FakeChatServer) -> None:
    fake.script(Status(500), Status(502), Status(503))

    result, elapsed = transcribe_timed(fake.base_url, budget=10)

    assert len(result.failed_attempts) == 3
    assert result.text == expected_text(IMAGE.data)
    assert elapsed >= 0.25 + 0.5 + 1.0  # the shortest three backoffs
    assert fake.calls == 4


@pytest.mark.parametrize(
    "failure", [Status(408), Status(504), BodyError(502), BodyError("429"), Reset(), Malformed(), Empty()]
)
def test_transient_failure_then_ok_is_retried(fake: FakeChatServer, failure: Any) -> None:
    fake.script(failure)

    result = transcribe(fake.base_url)

    assert len(result.failed_attempts) == 1
    assert result.text == expected_text(IMAGE.data)


def test_reset_connection_is_replaced_by_a_new_one(fake: FakeChatServer) -> None:
    fake.script(Reset())

    result = transcribe(fake.base_url)

    assert len(result.failed_attempts) == 1
    assert fake.connections_opened == 2


# failures


def test_400_is_not_retried_and_carries_the_provider_message(fake: FakeChatServer) -> None:
    fake.script(Status(400, "Invalid image format"))

    error, _ = transcribe_failing(fake.base_url)

    assert str(error) == "provider returned HTTP 400: Invalid image format"
    assert not error.retryable
    assert error.status_code == 400
    assert fake.calls == 1


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        ("<html><body>\n  502   Bad Gateway\n</body></html>", "<html><body> 502 Bad Gateway </body></html>"),
        (
            json.dumps({"error": {"message": "Provider returned error", "metadata": {"raw": "bad image"}}}),
            "Provider returned error (bad image)",
        ),
        ("", "Bad Request"),
    ],
)
def test_error_text_is_taken_from_any_kind_of_error_body(fake: FakeChatServer, body: str, detail: str) -> None:
    fake.script(Status(400, body=body))

    error, _ = transcribe_failing(fake.base_url)

    assert str(error) == f"provider returned HTTP 400: {detail}"


def test_error_object_in_a_200_body_is_classified_by_its_code(fake: FakeChatServer) -> None:
    fake.script(BodyError(400, "Provider returned error"))

    error, _ = transcribe_failing(fake.base_url)

    assert str(error) == "provider reported error 400: Provider returned error"
    assert not error.retryable
    assert error.status_code == 400
    assert fake.calls == 1


def test_unsupported_url_scheme_is_not_retried() -> None:
    error, _ = transcribe_failing("ftp://127.0.0.1/v1")

    assert str(error).startswith("cannot send the request to the provider: UnsupportedProtocol")
    assert not error.retryable


def test_no_budget_left_means_no_request(fake: FakeChatServer) -> None:
    error, _ = transcribe_failing(fake.base_url, budget=0)

    assert str(error) == "no answer from the provider within the call's 0.0 s"
    assert error.retryable
    assert fake.calls == 0


def test_wrong_api_key_is_not_retried() -> None:
    with FakeChatServer(require_api_key="sk-right") as fake:
        error, _ = transcribe_failing(fake.base_url, api_key="sk-wrong")

        assert str(error) == "provider returned HTTP 401: Incorrect API key provided"
        assert not error.retryable
        assert error.status_code == 401
        assert fake.calls == 1


def test_retry_after_beyond_the_budget_fails_at_once_with_the_wait(fake: FakeChatServer) -> None:
    fake.script(Status(429, "Rate limit exceeded", retry_after="30"))

    error, elapsed = transcribe_failing(fake.base_url, budget=5)

    assert str(error) == "provider returned HTTP 429: Rate limit exceeded"
    assert error.retryable
    assert error.status_code == 429
    assert error.retry_after == 30.0
    assert elapsed < 1.0
    assert fake.calls == 1


def test_retry_after_as_an_http_date_is_understood(fake: FakeChatServer) -> None:
    when = datetime.now(UTC) + timedelta(seconds=100)
    fake.script(Status(503, "Service Unavailable", retry_after=format_datetime(when, usegmt=True)))

    error, elapsed = transcribe_failing(fake.base_url, budget=5)

    assert error.retryable
    assert error.status_code == 503
    assert error.retry_after is not None
    assert 97 <= error.retry_after <= 101
    assert elapsed < 1.0


def test_hanging_provider_is_cut_at_the_budget(fake: FakeChatServer) -> None:
    fake.script(Hang(30))

    error, elapsed = transcribe_failing(fake.base_url, budget=1.0)

    assert str(error) == "no answer from the provider within the call's 1.0 s"
    assert error.retryable
    assert 0.9 <= elapsed < 5


def test_budget_error_names_the_last_failure(fake: FakeChatServer) -> None:
    fake.script(Status(500, "Internal error"), Hang(30))

    error, elapsed = transcribe_failing(fake.base_url, budget=1.0)

    assert str(error) == (
        "no answer from the provider within the call's 1.0 s (last error: provider returned HTTP 500: Internal error)"
    )
    assert error.retryable
    assert 0.9 <= elapsed < 5
    assert fake.calls == 2


def test_trickling_answer_is_cut_at_the_budget(fake: FakeChatServer) -> None:
    fake.script(Trickle(total_seconds=3.0, chunks=30))  # a piece every 0.1 s: no read ever waits long

    error, elapsed = transcribe_failing(fake.base_url, budget=1.0)

    assert str(error) == "no answer from the provider within the call's 1.0 s"
    assert 0.9 <= elapsed < 2.5  # well before the trickle would have finished


def test_trickling_answer_within_the_budget_is_read(fake: FakeChatServer) -> None:
    fake.script(Trickle(total_seconds=0.5, chunks=5))

    result, elapsed = transcribe_timed(fake.base_url, budget=5)

    assert result.text == expected_text(IMAGE.data)
    assert elapsed >= 0.45


@pytest.mark.parametrize(
    ("failure", "message"),
    [
        (Malformed(), "provider returned a malformed response: body is not JSON"),
        (Empty(), "provider returned an empty answer (finish_reason=stop)"),
        (Ok(text="half an answ", finish_reason="error"), "provider reported an error while answering"),
        (Status(500, "Internal error"), "provider returned HTTP 500: Internal error"),
    ],
)
def test_persistent_retryable_failure_is_retried_until_the_budget_runs_out(
    fake: FakeChatServer, failure: Any, message: str
) -> None:
    fake.set_default(failure)

    error, elapsed = transcribe_failing(fake.base_url, budget=1.0)

    assert message in str(error)  # alone, or as the last error when an attempt was cut at the deadline
    assert error.retryable
    assert fake.calls >= 2  # the first backoff (at most 0.5 s) fits in the call's time
    assert elapsed < 1.5


def test_unreachable_provider_is_retried_until_the_budget_runs_out() -> None:
    with socket.socket() as probe:  # a port that nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    error, elapsed = transcribe_failing(f"http://127.0.0.1:{port}/v1", budget=1.0)

    assert "could not reach the provider: ConnectError" in str(error)
    assert error.retryable
    assert error.status_code is None
    assert elapsed < 1.5


def test_fake_server_runs_standalone_for_subprocess_tests() -> None:
    command = [sys.executable, "-m", "tests.fakes.chat_server", "--port", "0", "--delay", "0"]
    process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        base_url = process.stdout.readline().strip()
        assert base_url.startswith("http://127.0.0.1:")
        assert transcribe(base_url).text == expected_text(IMAGE.data)
    finally:
        process.terminate()
        assert process.wait(timeout=5) == 0


# streamed calls


def loops(text: str) -> bool:
    """The loop check the pipeline gives a call: the repetition check at its default threshold."""
    return repetition(text, SETTINGS.flag_repetition_threshold) >= SETTINGS.flag_repetition_threshold


def looping_request(max_output_tokens: int = 4096, *, check: bool = True) -> TranscriptionRequest:
    request = page_request()
    return TranscriptionRequest(
        image=request.image,
        prompt=request.prompt,
        model=request.model,
        max_output_tokens=max_output_tokens,
        document_id=request.document_id,
        page_number=request.page_number,
        loop_check=loops if check else None,
    )


def test_streamed_answer_is_read_from_its_events_with_the_usage_of_the_last(fake: FakeChatServer) -> None:
    fake.script(Ok(keepalives=3, text="One two three four five six."))

    result = transcribe(fake.base_url)

    body = fake.requests[0]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert result.text == "One two three four five six."  # six events, after three keep-alive comments
    assert result.finish_reason == "stop"
    assert (result.prompt_tokens, result.completion_tokens, result.cost) == (1000, 6, 0.00012)
    assert result.request_id == "gen-1"
    assert result.model == "vendor/vision-model"
    assert fake.wait_billed(1) == [6]


@pytest.mark.parametrize("stream", ["auto", "off"])
def test_the_request_tells_when_it_is_on_its_way_once(fake: FakeChatServer, stream: str) -> None:
    # Given a request whose caller waits to hear that it is on its way (to start the work that can wait)
    seen: list[int] = []
    request = dataclasses.replace(page_request(), on_sent=lambda: seen.append(len(fake.requests)))
    # When it is made, streamed or not
    result = transcribe(fake.base_url, request=request, stream=stream)
    # Then it was told once; streamed, once the server had the request (its answer had begun)
    assert result.text == expected_text(IMAGE.data)
    assert seen == ([1] if stream == "auto" else [0])


def test_stream_off_makes_the_call_unstreamed(fake: FakeChatServer) -> None:
    result = transcribe(fake.base_url, stream="off")

    assert result.text == expected_text(IMAGE.data)
    assert "stream" not in fake.requests[0] and "stream_options" not in fake.requests[0]


def test_endpoint_that_cannot_stream_is_read_from_its_json_body() -> None:
    with FakeChatServer(streams=False) as plain:
        result = transcribe(plain.base_url)

        assert plain.requests[0]["stream"] is True  # asked to stream, it answered with one JSON body
        assert result.text == expected_text(IMAGE.data)
        assert (result.prompt_tokens, result.cost) == (1000, 0.00012)


def refuses_streaming(body: dict[str, Any], image: bytes) -> Status | None:
    """An endpoint that rejects the stream parameter, as some OpenAI-compatible servers do."""
    return Status(400, "Unrecognized request argument supplied: stream") if "stream" in body else None


def test_refusals_of_streaming_are_told_from_other_client_errors() -> None:
    from pagescribe.providers.openai_compat import _NAMES_STREAM

    refusals = ["Unrecognized request argument supplied: stream", "Streaming is not supported", "stream_options: bad"]
    assert all(_NAMES_STREAM.search(text) for text in refusals)
    assert not _NAMES_STREAM.search("Upstream provider rejected the request")


def test_endpoint_that_rejects_the_stream_parameter_is_called_unstreamed_from_then_on(fake: FakeChatServer) -> None:
    fake.route(refuses_streaming)

    async def go() -> list[Transcription]:
        provider = make_provider(fake.base_url)
        try:
            return [await provider.transcribe(page_request(), call_seconds=5) for _ in range(2)]
        finally:
            await provider.aclose()

    results = asyncio.run(go())

    assert [result.text for result in results] == [expected_text(IMAGE.data)] * 2
    assert ["stream" in body for body in fake.requests] == [True, False, False]  # refused once, then never asked
    assert results[0].failed_attempts == ()  # the refusal is no failed request of the call


def test_a_400_about_something_else_does_not_turn_streaming_off(fake: FakeChatServer) -> None:
    fake.script(Status(400, "Upstream provider rejected the request"))

    async def go() -> tuple[ProviderError, Transcription]:
        provider = make_provider(fake.base_url)
        try:
            with pytest.raises(ProviderError) as info:
                await provider.transcribe(page_request(), call_seconds=5)
            return info.value, await provider.transcribe(page_request(), call_seconds=5)
        finally:
            await provider.aclose()

    error, result = asyncio.run(go())

    assert error.status_code == 400 and "Upstream provider" in error.message
    assert result.text == expected_text(IMAGE.data)
    assert ["stream" in body for body in fake.requests] == [True, True]  # still streaming


def test_stream_on_does_not_fall_back_when_the_endpoint_rejects_it(fake: FakeChatServer) -> None:
    fake.route(refuses_streaming)

    error, _ = transcribe_failing(fake.base_url, stream="on")

    assert error.status_code == 400 and not error.retryable
    assert "stream" in error.message
    assert fake.calls == 1


def test_error_event_mid_stream_is_retried_like_an_error_body(fake: FakeChatServer) -> None:
    fake.script(StreamError(502, after=3), Ok())

    result = transcribe(fake.base_url)

    assert result.text == expected_text(IMAGE.data)  # the partial answer before the error is dropped
    assert [failure.status_code for failure in result.failed_attempts] == [502]
    assert "simulated upstream error mid-stream" in result.failed_attempts[0].message
    assert fake.calls == 2


def test_error_event_with_a_client_error_code_is_not_retried(fake: FakeChatServer) -> None:
    fake.script(StreamError(400, message="context length exceeded"))

    error, _ = transcribe_failing(fake.base_url)

    assert not error.retryable and error.status_code == 400
    assert "context length exceeded" in error.message
    assert fake.calls == 1


def test_stream_slower_than_the_call_is_cut_at_its_time(fake: FakeChatServer) -> None:
    fake.script(Ok(delay=30.0))  # its words arrive 5 s apart

    error, elapsed = transcribe_failing(fake.base_url, budget=1.0)

    assert error.retryable
    assert "within the call's 1.0 s" in error.message
    assert elapsed < 3.0


def test_looping_stream_is_cut_at_the_first_loop_and_billed_a_fraction_of_the_limit(fake: FakeChatServer) -> None:
    fake.script(Loop())

    result = transcribe(fake.base_url, request=looping_request(4096))

    assert result.finish_reason == LOOP_CUT
    assert loops(result.text)  # the text received is the loop, as the final check will see it
    assert result.completion_tokens is not None and 0 < result.completion_tokens <= 409
    assert result.cost is None  # the usage never came: the stream was closed before its last event
    billed = fake.wait_billed(1)  # what the server sent before it saw the client gone
    assert billed[0] <= 409  # at most 10 % of the output limit
    assert billed[0] >= result.completion_tokens


def test_looping_stream_without_a_loop_check_runs_to_the_output_limit(fake: FakeChatServer) -> None:
    fake.script(Loop())

    result = transcribe(fake.base_url, request=looping_request(300, check=False))

    assert result.finish_reason == "length"
    assert result.completion_tokens == 300
    assert fake.wait_billed(1) == [300]


def test_unstreamed_loop_is_billed_to_the_output_limit(fake: FakeChatServer) -> None:
    fake.script(Loop())

    result = transcribe(fake.base_url, request=looping_request(300), stream="off")

    assert result.finish_reason == "length"  # nothing could cut it: the check sees it only once it is all paid
    assert fake.wait_billed(1) == [300]
