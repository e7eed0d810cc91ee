"""The Amazon Bedrock adapter: one page is one Converse call (``bedrock-runtime``), over the function's IAM role.

The prompt and the page image (an image block, its bytes) go to ``POST /model/{modelId}/converse``; the answer's text
blocks are the transcription. boto3 is synchronous: each call runs on this provider's own threads (as many as the
function calls at once), on one client built at cold start whose pool holds that many connections. The client does
not retry (``total_max_attempts`` 1): the failure policy below decides, as the OpenAI-compatible adapter's does, and
whatever happens :meth:`BedrockProvider.transcribe` returns or raises within the call's time (a request the deadline
abandons finishes on its thread within the client's read timeout, the longest call).

Failure policy (the OpenAI-compatible adapter's, by HTTP status):

* ThrottlingException (429) is retried with backoff inside the call's time; with ``retry_rate_limited=False`` (the
  rate governor is on) it is raised at once, so that the governor pauses every environment's calls to the model.
* ServiceUnavailableException (503), InternalServerException (500), ModelTimeoutException (408),
  ModelNotReadyException (429), transport errors (refused, reset, timeouts) and an empty answer are retried with
  backoff; when the next wait does not fit in the call's time the last error is raised, retryable.
* ValidationException (400), AccessDeniedException (403), ResourceNotFoundException (404), ModelErrorException (424)
  and any other 4xx are raised at once, not retryable; so is a model without a price (it is never called).
* ``stopReason`` max_tokens is ``finish_reason`` "length" (the ``truncated`` flag), end_turn and stop_sequence "stop".

Streaming (PROVIDER_STREAM auto or on): the call is ``POST /model/{modelId}/converse-stream`` (ConverseStream), its
answer an event stream whose text deltas are read as they come, the usage in its last event (metadata). The same
failure policy holds; an error event mid-stream (throttlingException, modelStreamErrorException...) is classified by
its name, the partial answer dropped, and a stream that ends before messageStop is retried. While the answer arrives
the request's ``loop_check`` runs on the text so far, as the OpenAI-compatible adapter runs it: at the first loop the
stream is closed (the connection with it, so Bedrock stops generating) and the call answers with the text received,
``finish_reason == LOOP_CUT``, the text events received counted as completion tokens and no cost (Bedrock's usage
comes last): the caller prices it from the tenant's own history, as it does a cut call of the other adapter.

Cost: Bedrock reports tokens, not dollars; the cost of a call is its reported input and output tokens at the model's
price (:mod:`pagescribe.providers.bedrock_prices`), a cost as exact as the price table, not an estimate.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import boto3
import urllib3
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionError,
    HTTPClientError,
)

from pagescribe.domain import LOOP_CUT
from pagescribe.providers.base import (
    ProviderError,
    Transcription,
    TranscriptionRequest,
)
from pagescribe.providers.bedrock_prices import SETTING, ModelPrice, price_of
from pagescribe.providers.policy import (
    CHECK_EVERY_CHARS,
    accepted,
    clip,
    is_retryable_status,
    retry_after_seconds,
    storable,
    with_retries,
)
from pagescribe.timepolicy import TimePolicy

logger = logging.getLogger(__name__)

IMAGE_FORMATS = {"image/png": "png", "image/jpeg": "jpeg", "image/webp": "webp", "image/gif": "gif"}
FINISH_REASONS = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length"}
# the HTTP status of each error (an error event mid-stream comes in a 200 response, and botocore reports it as a 400)
ERROR_STATUSES = {
    "ThrottlingException": 429,
    "ModelNotReadyException": 429,
    "ServiceUnavailableException": 503,
    "InternalServerException": 500,
    "ModelTimeoutException": 408,
    "ValidationException": 400,
    "AccessDeniedException": 403,
    "ResourceNotFoundException": 404,
    "ModelErrorException": 424,
    "ModelStreamErrorException": 502,  # mid-stream: "retry your request"
}


def bedrock_client(*, time: TimePolicy, max_connections: int) -> Any:
    """The ``bedrock-runtime`` client: no retries of its own, a connection per concurrent call, its timeouts those of
    the longest call (each call is also cut at its own deadline). Its region is the function's (AWS_REGION), its
    endpoint the region's (a VPC endpoint's private DNS name answers for it), or AWS_ENDPOINT_URL_BEDROCK_RUNTIME."""
    config = Config(
        retries={"total_max_attempts": 1, "mode": "standard"},  # "max_attempts" counts retries: 1 would be two
        connect_timeout=time.connect_timeout,
        read_timeout=time.provider_timeout,
        max_pool_connections=max_connections,
    )
    return boto3.client("bedrock-runtime", config=config)


class BedrockProvider:
    """Transcribes page images with Bedrock's Converse API; ``prices`` (BEDROCK_PRICES) over the default table."""

    def __init__(
        self,
        *,
        client: Any,
        prices: dict[str, ModelPrice],
        max_connections: int,
        retry_rate_limited: bool = True,
        stream: bool = True,
    ) -> None:
        self._client = client
        self._stream = stream
        self._prices = prices
        self._retry_rate_limited = retry_rate_limited
        self._threads = ThreadPoolExecutor(max_workers=max_connections, thread_name_prefix="bedrock")
        self._name = f"bedrock:{client.meta.region_name}"

    def __repr__(self) -> str:
        return f"BedrockProvider(region={self._client.meta.region_name!r})"

    @property
    def name(self) -> str:
        return self._name

    def answering_model(self, requested: str) -> str:
        return requested

    def serving(self, model: str) -> str:
        return self._name

    async def transcribe(self, request: TranscriptionRequest, *, call_seconds: float) -> Transcription:
        """Transcribe one page; return or raise :class:`ProviderError` within ``call_seconds``."""
        price = price_of(request.model, self._prices)
        if price is None:
            raise ProviderError(f"no Bedrock price for {request.model!r}: set it in {SETTING}", retryable=False)
        body = _converse_body(request)
        loop = asyncio.get_running_loop()
        started = loop.time()

        async def converse(_deadline: float) -> Transcription:
            if self._stream:
                answer = await loop.run_in_executor(self._threads, self._converse_stream, body, request.loop_check)
            else:
                answer = await loop.run_in_executor(self._threads, self._converse, body)
            return _transcription(answer, request, price, loop.time() - started)

        return await with_retries(
            converse, request, call_seconds, retry_rate_limited=self._retry_rate_limited, provider="Bedrock"
        )

    async def aclose(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)
        self._client.close()

    def _converse(self, body: dict[str, Any]) -> dict[str, Any]:
        """One Converse request, on a thread; its failure as the ProviderError it amounts to."""
        return self._calling(lambda: dict(self._client.converse(**body)))

    def _converse_stream(self, body: dict[str, Any], loop_check: Callable[[str], bool] | None) -> dict[str, Any]:
        """One ConverseStream request, on a thread, read to its end or to the first loop (then closed): the answer as
        Converse would give it."""

        def read() -> dict[str, Any]:
            response = self._client.converse_stream(**body)
            answer = _StreamedAnswer(loop_check)
            stream = response["stream"]
            try:
                for event in stream:
                    if answer.take(event):
                        break
            finally:
                stream.close()
            return answer.as_converse(response.get("ResponseMetadata", {}))

        return self._calling(read)

    @staticmethod
    def _calling(call: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """``call``'s answer; botocore's failures as the ProviderErrors they amount to."""
        try:
            return call()
        except ClientError as exc:
            raise _client_error(exc) from exc
        except (HTTPClientError, ConnectionError, urllib3.exceptions.HTTPError) as exc:  # urllib3's: read mid-stream
            raise ProviderError(f"could not reach Bedrock: {type(exc).__name__}: {exc}", retryable=True) from exc
        except BotoCoreError as exc:  # no credentials, a parameter botocore refuses...
            raise ProviderError(f"cannot call Bedrock: {type(exc).__name__}: {exc}", retryable=False) from exc


def _converse_body(request: TranscriptionRequest) -> dict[str, Any]:
    image_format = IMAGE_FORMATS.get(request.image.media_type)
    if image_format is None:
        raise ProviderError(f"Bedrock takes no {request.image.media_type} images", retryable=False)
    image = {"image": {"format": image_format, "source": {"bytes": request.image.data}}}
    return {
        "modelId": request.model,
        "messages": [{"role": "user", "content": [{"text": request.prompt}, image]}],
        "inferenceConfig": {"maxTokens": request.max_output_tokens, "temperature": 0},
    }


class _StreamedAnswer:
    """A ConverseStream answer as its events arrive: the text so far, its stop reason and usage; the loop check run
    on the text as it grows, as the OpenAI-compatible adapter runs it."""

    def __init__(self, loop_check: Callable[[str], bool] | None) -> None:
        self._loop_check = loop_check
        self._parts: list[str] = []
        self._chars = 0
        self._checked_at = 0
        self._pieces = 0  # text events: the tokens received, when the usage never comes
        self._stop_reason: str | None = None
        self._usage: dict[str, Any] = {}
        self._cut = False

    def take(self, event: dict[str, Any]) -> bool:
        """Take one event; True when the text so far is a loop (stop reading: the caller closes the stream)."""
        text = event.get("contentBlockDelta", {}).get("delta", {}).get("text")
        if isinstance(text, str) and text:
            self._parts.append(text)
            self._chars += len(text)
            self._pieces += 1
        self._stop_reason = event.get("messageStop", {}).get("stopReason", self._stop_reason)
        self._usage = event.get("metadata", {}).get("usage", self._usage)
        threshold = max(CHECK_EVERY_CHARS, self._checked_at // 8)
        if self._loop_check is None or self._chars - self._checked_at < threshold:
            return False
        self._checked_at = self._chars
        self._cut = self._loop_check("".join(self._parts))
        return self._cut

    def as_converse(self, metadata: dict[str, Any]) -> dict[str, Any]:
        """The answer as Converse gives one; a cut one's stop reason LOOP_CUT and its text events as output tokens."""
        if self._cut:
            stop_reason, usage = LOOP_CUT, {"outputTokens": self._pieces}
        elif self._stop_reason is None:
            raise ProviderError("Bedrock's stream ended before the answer did", retryable=True)
        else:
            stop_reason, usage = self._stop_reason, self._usage
        return {
            "output": {"message": {"role": "assistant", "content": [{"text": "".join(self._parts)}]}},
            "stopReason": stop_reason,
            "usage": usage,
            "ResponseMetadata": metadata,
        }


def _client_error(exc: ClientError) -> ProviderError:
    error = exc.response.get("Error", {})
    metadata = exc.response.get("ResponseMetadata", {})
    code = str(error.get("Code") or "error")
    code = code[:1].upper() + code[1:]  # an error event mid-stream is named in camel case: throttlingException
    status = ERROR_STATUSES.get(code) or metadata.get("HTTPStatusCode")  # an error event's HTTP status is 400
    detail = clip(str(error.get("Message") or "")) or "no error message"
    headers = metadata.get("HTTPHeaders", {})
    retry_after = retry_after_seconds(headers.get("retry-after")) if status in (429, 503) else None
    return ProviderError(
        f"Bedrock returned HTTP {status} {code}: {detail}",
        retryable=isinstance(status, int) and is_retryable_status(status),
        status_code=status,
        retry_after=retry_after,
    )


def _transcription(
    answer: dict[str, Any], request: TranscriptionRequest, price: ModelPrice, latency: float
) -> Transcription:
    """A Converse answer as a Transcription, priced; an empty or failed one raises as the failure policy says."""
    message = answer.get("output", {}).get("message", {})
    blocks = message.get("content") if isinstance(message, dict) else None
    if not isinstance(blocks, list):
        raise ProviderError("Bedrock returned a malformed response: no output.message.content", retryable=True)
    text = storable("".join(block["text"] for block in blocks if isinstance(block.get("text"), str)))
    stop_reason = str(answer.get("stopReason") or "unknown")
    finish_reason = accepted(text, FINISH_REASONS.get(stop_reason, stop_reason))
    usage = answer.get("usage", {})
    input_tokens, output_tokens = usage.get("inputTokens"), usage.get("outputTokens")
    priced = isinstance(input_tokens, int) and isinstance(output_tokens, int)  # a stream cut at a loop has no usage
    return Transcription(
        text=text,
        finish_reason=finish_reason,
        model=request.model,
        prompt_tokens=input_tokens if isinstance(input_tokens, int) else None,
        completion_tokens=output_tokens if isinstance(output_tokens, int) else None,
        cost=price.cost(input_tokens, output_tokens) if priced else None,
        request_id=answer.get("ResponseMetadata", {}).get("RequestId"),
        latency_seconds=latency,
    )
