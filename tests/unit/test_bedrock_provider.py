"""The Bedrock adapter through boto3 against a real local server speaking Converse (tests/fakes/bedrock_server.py)."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from pagescribe.checks import repetition
from pagescribe.domain import LOOP_CUT
from pagescribe.providers.base import PageImage, ProviderError, Transcription, TranscriptionRequest
from pagescribe.providers.bedrock import BedrockProvider, bedrock_client
from pagescribe.providers.bedrock_prices import DEFAULT_PRICES, ModelPrice, parse_prices, price_of
from pagescribe.settings import ConfigurationError, Settings
from pagescribe.timepolicy import TimePolicy

from tests.fakes.bedrock_server import Answer, Fail, FakeBedrockServer, Loop, StreamError, Throttle
from tests.fakes.chat_server import PROMPT_TOKENS, expected_text

MODEL = "amazon.nova-lite-v1:0"
IMAGE = PageImage(data=b"\x89PNG\r\n\x1a\n a bedrock page", media_type="image/png")
TIME = TimePolicy.from_settings(Settings())


def page_request(model: str = MODEL, max_output_tokens: int = 2048, *, check: bool = False) -> TranscriptionRequest:
    return TranscriptionRequest(
        image=IMAGE,
        prompt="Transcribe this page.",
        model=model,
        max_output_tokens=max_output_tokens,
        document_id="d",
        page_number=1,
        loop_check=(lambda text: repetition(text, 8) >= 8) if check else None,
    )


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeBedrockServer]:
    with FakeBedrockServer() as server:
        monkeypatch.setenv("AWS_ENDPOINT_URL_BEDROCK_RUNTIME", server.endpoint_url)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
        for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_BEARER_TOKEN_BEDROCK"):
            monkeypatch.delenv(name, raising=False)
        yield server


def transcribe(
    *,
    request: TranscriptionRequest | None = None,
    seconds: float = 10.0,
    prices: Any = None,
    time: TimePolicy = TIME,
    **kwargs: Any,
) -> Transcription:
    async def go() -> Transcription:
        client = bedrock_client(time=time, max_connections=2)
        provider = BedrockProvider(client=client, prices=prices or {}, max_connections=2, **kwargs)
        try:
            return await provider.transcribe(request or page_request(), call_seconds=seconds)
        finally:
            await provider.aclose()

    return asyncio.run(go())


def failing(**kwargs: Any) -> ProviderError:
    with pytest.raises(ProviderError) as info:
        transcribe(**kwargs)
    return info.value


@pytest.mark.parametrize("stream", [True, False])
def test_a_page_is_one_converse_call_priced_from_the_table(fake: FakeBedrockServer, stream: bool) -> None:
    result = transcribe(stream=stream)
    text = expected_text(IMAGE.data)
    assert result.text == text and result.finish_reason == "stop" and result.model == MODEL
    assert (result.prompt_tokens, result.completion_tokens) == (PROMPT_TOKENS, len(text.split()))
    price = DEFAULT_PRICES[MODEL]
    assert result.cost == pytest.approx((PROMPT_TOKENS * price.input_per_mtok + 4 * price.output_per_mtok) / 1e6)
    assert not result.cost_estimated and result.request_id == "req-1" and result.failed_attempts == ()
    assert fake.calls == {MODEL: 1} and fake.signers == ["testing/eu-west-1/bedrock"] and fake.streamed == [stream]
    body = fake.bodies[0]
    image = body["messages"][0]["content"][1]["image"]
    assert image["format"] == "png" and base64.b64decode(image["source"]["bytes"]) == IMAGE.data
    assert body["messages"][0]["content"][0] == {"text": "Transcribe this page."}
    assert body["inferenceConfig"] == {"maxTokens": 2048, "temperature": 0}


def test_bedrock_prices_override_the_table_and_price_inference_profiles(fake: FakeBedrockServer) -> None:
    profile = f"eu.{MODEL}"
    result = transcribe(request=page_request(profile), prices={profile: ModelPrice(1000.0, 0.0)})
    assert fake.calls == {profile: 1}
    assert result.cost == pytest.approx(PROMPT_TOKENS * 1000.0 / 1e6)
    assert price_of(f"us.{MODEL}", {}) == DEFAULT_PRICES[MODEL]


def test_a_model_without_a_price_is_never_called(fake: FakeBedrockServer) -> None:
    error = failing(request=page_request("vendor.unpriced-v1:0"))
    assert not error.retryable and "BEDROCK_PRICES" in error.message
    assert fake.calls == {}


def test_max_tokens_is_a_truncated_answer(fake: FakeBedrockServer) -> None:
    fake.script(Answer(text="partial", stop_reason="max_tokens"))
    assert transcribe().finish_reason == "length"


def test_with_the_governor_on_a_throttle_is_raised_at_once_for_it_to_pause(fake: FakeBedrockServer) -> None:
    fake.script(Throttle(retry_after="7"))
    error = failing(retry_rate_limited=False)
    assert error.status_code == 429 and error.retryable and error.retry_after == 7
    assert "ThrottlingException" in error.message
    assert fake.calls == {MODEL: 1}


def test_without_the_governor_throttles_and_5xx_are_retried_within_the_call(fake: FakeBedrockServer) -> None:
    fake.script(Throttle(), Fail(503, "ServiceUnavailableException"))
    result = transcribe()
    assert result.text == expected_text(IMAGE.data)
    assert [a.status_code for a in result.failed_attempts] == [429, 503]
    assert fake.calls == {MODEL: 3}


@pytest.mark.parametrize(
    ("status", "error_type"),
    [(400, "ValidationException"), (403, "AccessDeniedException"), (424, "ModelErrorException")],
)
def test_refusals_are_not_retried(fake: FakeBedrockServer, status: int, error_type: str) -> None:
    fake.script(Fail(status, error_type, "the model refuses this"))
    error = failing()
    assert not error.retryable and error.status_code == status
    assert error_type in error.message and "the model refuses this" in error.message
    assert fake.calls == {MODEL: 1}


def test_an_unreachable_endpoint_is_retryable(fake: FakeBedrockServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_BEDROCK_RUNTIME", "http://127.0.0.1:9")
    error = failing(seconds=1.5)
    assert error.retryable and error.status_code is None


def test_a_stream_that_stalls_past_the_read_timeout_is_retried_within_the_call(fake: FakeBedrockServer) -> None:
    # Given a client whose reads time out after 0.5 s, and a stream whose second event is 5 s away
    fake.script(Loop(token_seconds=5.0), Loop(token_seconds=5.0))
    quick = replace(TIME, provider_timeout=0.5)
    # Then the stalled read is a retryable failure, retried until the call's time runs out
    error = failing(seconds=1.5, time=quick)
    assert error.retryable and "ReadTimeoutError" in error.message


def test_a_call_ends_at_its_deadline(fake: FakeBedrockServer) -> None:
    fake.script(Answer(delay=5.0))
    error = failing(seconds=0.5)
    assert error.retryable and "within the call's 0.5 s" in error.message


def test_an_image_bedrock_cannot_take_is_refused_before_the_call(fake: FakeBedrockServer) -> None:
    tiff = TranscriptionRequest(PageImage(b"II*\x00", "image/tiff"), "p", MODEL, 10, "d", 1)
    assert not failing(request=tiff).retryable
    assert fake.calls == {}


def test_bedrock_prices_setting_is_validated() -> None:
    assert parse_prices('{"m": {"input_per_mtok": 1, "output_per_mtok": 2.5}}') == {"m": ModelPrice(1.0, 2.5)}
    for bad in ("[1]", '{"m": {"input_per_mtok": 1}}', '{"m": {"input_per_mtok": -1, "output_per_mtok": 1}}', "{"):
        with pytest.raises(ValueError, match="BEDROCK_PRICES"):
            Settings(bedrock_prices=bad)


def test_cold_start_refuses_a_bedrock_model_without_a_price() -> None:
    with pytest.raises(ConfigurationError, match=r"'vendor\.unpriced-v1:0'.*BEDROCK_PRICES"):
        Settings(provider="bedrock", model="vendor.unpriced-v1:0").check_bedrock_prices()
    with pytest.raises(ConfigurationError, match=r"'vendor\.big-v1:0'"):
        Settings(
            provider="bedrock", model=MODEL, escalation_model="vendor.big-v1:0", escalation_provider="bedrock"
        ).check_bedrock_prices()
    priced = '{"vendor.unpriced-v1:0": {"input_per_mtok": 1, "output_per_mtok": 1}}'
    Settings(provider="bedrock", model="vendor.unpriced-v1:0", bedrock_prices=priced).check_bedrock_prices()
    # an escalation model asked on the OpenAI-compatible endpoint has its price from there
    Settings(
        provider="bedrock", model=MODEL, escalation_model="vendor/big", escalation_provider="openai-compatible"
    ).check_bedrock_prices()
    Settings(model="vendor/unpriced").check_bedrock_prices()  # no Bedrock at all
    assert Settings.model_validate({"escalation_provider": ""}).escalation_provider is None  # the template's default


def test_a_looping_stream_is_cut_at_the_first_loop_and_paid_a_fraction_of_the_limit(fake: FakeBedrockServer) -> None:
    fake.script(Loop(token_seconds=0.005))
    result = transcribe(request=page_request(max_output_tokens=4096, check=True))
    assert result.finish_reason == LOOP_CUT and repetition(result.text, 8) >= 8
    assert result.completion_tokens is not None and 0 < result.completion_tokens <= 409  # checked at 512 characters
    assert result.cost is None  # the usage comes last: the caller prices a cut call from the tenant's history
    [billed] = fake.wait_billed(1)  # what Bedrock sent before it saw the client gone (socket buffers lag a little)
    assert result.completion_tokens <= billed <= 4096 // 4


def test_without_a_loop_check_a_looping_stream_runs_to_the_limit(fake: FakeBedrockServer) -> None:
    fake.script(Loop())
    result = transcribe(request=page_request(max_output_tokens=300))
    assert (result.finish_reason, result.completion_tokens, fake.wait_billed(1)) == ("length", 300, [300])


def test_an_error_event_mid_stream_is_retried_or_raised_by_its_name(fake: FakeBedrockServer) -> None:
    fake.script(StreamError("modelStreamErrorException"), StreamError("throttlingException"))
    result = transcribe()
    assert result.text == expected_text(IMAGE.data)  # the partial answers were dropped
    assert [a.status_code for a in result.failed_attempts] == [502, 429]
    fake.script(StreamError("throttlingException"))
    assert failing(retry_rate_limited=False).status_code == 429
    fake.script(StreamError("validationException"))
    refused = failing()
    assert not refused.retryable and refused.status_code == 400
    assert fake.calls == {MODEL: 5}
