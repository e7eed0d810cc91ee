"""The OpenAI-compatible chat-completions adapter (OpenRouter, OpenAI, vLLM, LiteLLM, ...).

One page is one POST to ``{base_url}/chat/completions`` carrying the prompt and the page image as a
base64 data URL. Transient failures are retried inside the time the caller gives the call; whatever happens,
:meth:`OpenAICompatibleProvider.transcribe` returns or raises within that time.

Failure policy:

* HTTP 408, 429 and 5xx (except 501 and 505), transport errors (refused, reset, protocol errors,
  timeouts), a 200 whose body is malformed, an empty answer and ``finish_reason == "error"`` are
  retried with exponential backoff and jitter, never sooner than the server's ``Retry-After`` on 429/503.
  When the next wait does not fit in the call's remaining time, the last error is raised, retryable.
  With ``retry_rate_limited=False`` (the rate governor is on) a 429 is raised at once: the governor pauses every
  environment and the page waits in the queue, not here.
* Any other status (other 4xx, 501, 505, 3xx) is raised at once, not retryable.
* A 200 whose body is an error object (OpenRouter does this) is treated like its code as a status.
* ``finish_reason == "length"`` is a result (the ``truncated`` flag of the checks), not an error.

Streaming (``stream``: auto, on, off). Streamed, the answer comes as server-sent events (``stream: true``, with
``stream_options.include_usage`` for the usage in the last event, where OpenRouter also puts ``usage.cost``); comments
(``: OPENROUTER PROCESSING``) are keep-alives. The same failure policy holds: an error status before the stream, an
error object in an event (mid-stream too: the partial answer is dropped) and a stream that ends before the answer
did are classified and retried as above. While the answer arrives the request's ``loop_check`` is run on the text so
far, every ``CHECK_EVERY_CHARS`` characters at first, then every eighth more: when it finds a loop, the response is
closed (the connection with it, so the provider stops generating) and the call answers with the text received,
``finish_reason == LOOP_CUT``, the usage if it came, else the text events received counted as completion tokens.
An endpoint that answers a streamed request with a plain JSON body is read as today; with ``auto``, one that rejects
the stream parameter (HTTP 400/422 naming it) is called unstreamed from then on, for the life of the provider.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import re
import threading
from collections.abc import Callable
from dataclasses import asdict
from typing import Literal

import anyio
import httpx

from pagescribe.domain import LOOP_CUT
from pagescribe.providers.base import (
    PageImage,
    ProviderError,
    Transcription,
    TranscriptionRequest,
)
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

_RETRY_AFTER_STATUSES = frozenset({429, 503})
_JSON_HEADERS = {"Content-Type": "application/json"}
# "stream", "stream_options" or "streaming is not supported"; not "upstream error"
_NAMES_STREAM = re.compile(r"\bstream(?:_options|ing)?\b", re.IGNORECASE)

StreamMode = Literal["auto", "on", "off"]


# Where the image's data URL goes in a request's JSON body (see ``_body``): a string no encoder leaves as it is.
_IMAGE_MARKER = "\x00image\x00"
_IMAGE_MARKER_JSON = json.dumps(_IMAGE_MARKER)[1:-1].encode()  # as it stands in the body, between its quotes


class _StreamRefusedError(Exception):
    """The endpoint rejected the stream parameter: call it unstreamed."""


# httpcore's trace events at which a request's turn ends (see _SendTurn): its head written, or not to be; or a new
# connection being opened for it (a TCP connect and a TLS handshake take round trips: never one at a time)
_TURN_ENDS = frozenset(
    {
        "http11.send_request_headers.complete",
        "http11.send_request_headers.failed",
        "connection.connect_tcp.started",
        "connection.connect_unix_socket.started",
    }
)


class _SendTurn:
    """A request's turn to go out: from the making of its body to its head on the wire, one request at a time (its
    body is then written while the next one is made). A batch's calls start together, and every step of a request's
    way to the socket yields to the event loop: without turns, each request's bytes waited for every other request's
    body to be made (about 2 ms each), and the provider received the first request when the last one was ready, not
    when the first was. The turn ends at its head's trace event from httpcore, or as a new connection starts to be
    opened for it (connections open at once, as before), or when the request fails; with a transport that traces
    nothing, once a streamed response begins or an unstreamed one ends."""

    def __init__(self, turns: asyncio.Lock) -> None:
        self._turns = turns
        self._held = False

    async def __aenter__(self) -> _SendTurn:
        await self._turns.acquire()
        self._held = True
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.end()

    def end(self) -> None:
        if self._held:
            self._held = False
            self._turns.release()

    async def trace(self, event: str, info: dict[str, object]) -> None:
        """httpcore's ``trace`` extension."""
        if event in _TURN_ENDS:
            self.end()


class OpenAICompatibleProvider:
    """Transcribes page images through an OpenAI-compatible chat-completions endpoint.

    One :class:`httpx.AsyncClient` is created here and reused for every call, so connections are
    pooled and kept alive. It binds to the event loop it is first used on: use one long-lived loop.
    """

    def __init__(
        self,
        *,
        base_url: str,
        api_key: str | None,
        time: TimePolicy,
        max_connections: int,
        usage_accounting: bool,
        app_name: str = "pagescribe",
        app_url: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        retry_rate_limited: bool = True,
        stream: StreamMode = "auto",
    ) -> None:
        headers = {"X-Title": app_name}
        if app_url:
            headers["HTTP-Referer"] = app_url
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self._client = httpx.AsyncClient(
            base_url=base_url,
            headers=headers,
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
            transport=transport,
        )
        self._time = time
        self._usage_accounting = usage_accounting
        self._retry_rate_limited = retry_rate_limited
        self._stream_mode = stream
        self._streams = stream != "off"  # auto turns it off when the endpoint rejects the stream parameter
        self._turns = asyncio.Lock()  # see _SendTurn
        url = self._client.base_url
        self._name = f"openai-compatible:{url.host}" + (f":{url.port}" if url.port is not None else "")

    def __repr__(self) -> str:
        return f"OpenAICompatibleProvider(base_url={str(self._client.base_url)!r})"

    @property
    def name(self) -> str:
        return self._name

    def answering_model(self, requested: str) -> str:
        return requested

    def serving(self, model: str) -> str:
        return self.name

    async def transcribe(self, request: TranscriptionRequest, *, call_seconds: float) -> Transcription:
        """Transcribe one page; return or raise :class:`ProviderError` within ``call_seconds``."""
        started = asyncio.get_running_loop().time()

        async def one_request(deadline: float) -> Transcription:
            return await self._request(request, started, deadline)

        return await with_retries(
            one_request, request, call_seconds, retry_rate_limited=self._retry_rate_limited, provider="the provider"
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    async def _request(self, request: TranscriptionRequest, started: float, deadline: float) -> Transcription:
        """One HTTP request (streamed unless streaming is off) with timeouts from what is left of the call's time."""
        loop = asyncio.get_running_loop()
        remaining = deadline - loop.time()
        if remaining <= 0:
            raise TimeoutError  # reported like the deadline itself
        timeout = httpx.Timeout(**asdict(self._time.request(remaining)))
        try:
            if self._streams:
                try:
                    return await self._streamed(request, started, timeout)
                except _StreamRefusedError:
                    self._streams = False
                    logger.warning("%s rejects streamed calls; its calls are made unstreamed from now on", self._name)
            async with _SendTurn(self._turns) as turn:
                body = self._body(request, stream=False)
                _sent(request)  # an unstreamed answer's headers come with its end: sent is as late as can be told
                response = await self._client.post(
                    "chat/completions",
                    content=body,
                    headers=_JSON_HEADERS,
                    timeout=timeout,
                    extensions={"trace": turn.trace},
                )
        except (httpx.UnsupportedProtocol, httpx.LocalProtocolError) as exc:
            raise ProviderError(f"cannot send the request to the provider: {_describe(exc)}", retryable=False) from exc
        except httpx.RequestError as exc:
            raise ProviderError(f"could not reach the provider: {_describe(exc)}", retryable=True) from exc
        return _transcription(response, request, loop.time() - started)

    async def _streamed(self, request: TranscriptionRequest, started: float, limits: httpx.Timeout) -> Transcription:
        """A streamed request: its events read as they come, the answer checked for a loop on the way and the response
        closed at the first one; a plain JSON answer (an endpoint that does not stream) read as today."""
        async with _SendTurn(self._turns) as turn:
            body = self._body(request, stream=True)
            stream = self._client.stream(
                "POST",
                "chat/completions",
                content=body,
                headers=_JSON_HEADERS,
                timeout=limits,
                extensions={"trace": turn.trace},
            )
            async with stream as response:
                turn.end()
                _sent(request)
                if response.is_success and _is_event_stream(response):
                    answer = _StreamedAnswer(request.loop_check)
                    await answer.read(response)
                    return answer.transcription(response, request, asyncio.get_running_loop().time() - started)
                await response.aread()
                if self._stream_mode == "auto" and _refuses_stream(response):
                    raise _StreamRefusedError
        return _transcription(response, request, asyncio.get_running_loop().time() - started)

    def _body(self, request: TranscriptionRequest, *, stream: bool) -> bytes:
        """The request's JSON body. The image's data URL, most of it, goes in as bytes where the payload holds its
        place: base64 needs no escaping, and the JSON encoder would scan and copy it twice more (2 ms a page of the
        event loop's time for a 300 KB image, against 0.5). Nothing after the image in the payload is the user's
        text, so its place is the marker's last occurrence."""
        encoded = json.dumps(self._payload(request, stream=stream), separators=(",", ":")).encode()
        head, marker, tail = encoded.rpartition(_IMAGE_MARKER_JSON)
        if not marker:
            raise AssertionError("the payload lost the image's place")
        return b"".join((head, _data_url(request.image), tail))

    def _payload(self, request: TranscriptionRequest, *, stream: bool) -> dict[str, object]:
        payload: dict[str, object] = {
            "model": request.model,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": request.prompt},
                        {"type": "image_url", "image_url": {"url": _IMAGE_MARKER}},
                    ],
                }
            ],
            "max_tokens": request.max_output_tokens,
            "temperature": 0,
        }
        if self._usage_accounting:
            payload["usage"] = {"include": True}
        if stream:
            payload["stream"] = True
            payload["stream_options"] = {"include_usage": True}
        return payload


class _StreamedAnswer:
    """A streamed answer as its events arrive: the text so far, its finish reason, id, model and usage."""

    def __init__(self, loop_check: Callable[[str], bool] | None) -> None:
        self._loop_check = loop_check
        self._parts: list[str] = []
        self._chars = 0
        self._checked_at = 0  # characters when the loop check last ran
        self._pieces = 0  # events that carried text: the tokens received, where no usage comes
        self._finish_reason: str | None = None
        self._usage: object = None
        self._model: object = None
        self._id: object = None
        self._done = False  # data: [DONE]
        self._cut = False

    async def read(self, response: httpx.Response) -> None:
        """Read the events to the end of the answer, or to the first loop (then stop reading: the caller closes)."""
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue  # blank lines between events, comments (": OPENROUTER PROCESSING" keep-alives), other fields
            data = line[5:].strip()
            if data == "[DONE]" or self._done:  # read on to the body's end: the connection stays reusable
                self._done = True
                continue
            try:
                chunk: object = json.loads(data)
            except ValueError as exc:
                raise _malformed(f"an event is not JSON ({exc})") from exc
            if not isinstance(chunk, dict):
                raise _malformed("an event is not a JSON object")
            self._take(chunk)
            if self._looping():
                self._cut = True
                return

    def _take(self, chunk: dict[str, object]) -> None:
        error = chunk.get("error")
        if isinstance(error, dict | str) and error:
            raise _body_error(error)
        self._id = chunk.get("id") or self._id
        self._model = chunk.get("model") or self._model
        if isinstance(chunk.get("usage"), dict):
            self._usage = chunk["usage"]
        choices = chunk.get("choices")
        choice = choices[0] if isinstance(choices, list) and choices else None
        if not isinstance(choice, dict):
            return  # the usage event has no choices
        delta = choice.get("delta")
        text = _content_text(delta.get("content")) if isinstance(delta, dict) else None
        if text:
            self._parts.append(text)
            self._chars += len(text)
            self._pieces += 1
        if isinstance(choice.get("finish_reason"), str):
            self._finish_reason = str(choice["finish_reason"])

    def _looping(self) -> bool:
        """Whether the text so far is a loop, checked when it has grown enough since the check before."""
        if self._loop_check is None or self._chars - self._checked_at < max(CHECK_EVERY_CHARS, self._checked_at // 8):
            return False
        self._checked_at = self._chars
        return self._loop_check("".join(self._parts))

    def transcription(self, response: httpx.Response, request: TranscriptionRequest, latency: float) -> Transcription:
        text = storable("".join(self._parts))
        if self._cut:
            finish_reason = LOOP_CUT
        elif self._finish_reason is None and not self._done:
            raise _malformed("the stream ended before the answer did")
        else:
            finish_reason = accepted(text, self._finish_reason or "unknown")
        prompt_tokens, completion_tokens, cost = _usage({"usage": self._usage})
        if completion_tokens is None and self._cut:
            completion_tokens = self._pieces
        model, response_id = self._model, self._id
        return Transcription(
            text=text,
            finish_reason=finish_reason,
            model=model if isinstance(model, str) and model else request.model,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            cost=cost,
            request_id=response_id if isinstance(response_id, str) else response.headers.get("x-request-id"),
            latency_seconds=latency,
        )


def load_event_loop_network() -> None:
    """Load what the client's first request on an event loop would (anyio's asyncio backend, its sockets, streams and
    locks), for a cold start to call: in the first batch's first call it held the event loop for ~100 ms of imports
    (the pipeline benchmark, uncompiled bytecode) while the batch's other pages waited to be sent. Run on a thread of
    its own: the caller may be on a running event loop."""
    loading = threading.Thread(target=anyio.run, args=(anyio.sleep, 0), name="load-event-loop-network")
    loading.start()
    loading.join()


def _is_event_stream(response: httpx.Response) -> bool:
    content_type = str(response.headers.get("content-type", ""))
    return content_type.split(";")[0].strip().lower() == "text/event-stream"


def _refuses_stream(response: httpx.Response) -> bool:
    """A 400 or 422 whose error names the stream parameter: the endpoint does not stream."""
    return response.status_code in (400, 422) and _NAMES_STREAM.search(response.text) is not None


def _sent(request: TranscriptionRequest) -> None:
    if request.on_sent is not None:
        request.on_sent()


def _data_url(image: PageImage) -> bytes:
    return b"data:" + image.media_type.encode("ascii") + b";base64," + base64.b64encode(image.data)


def _describe(exc: Exception) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _error_detail(error: object) -> str | None:
    """The text of an error: a string, or an OpenAI-style object with OpenRouter's ``metadata.raw``."""
    if isinstance(error, str):
        return clip(error)
    if not isinstance(error, dict):
        return None
    message = error.get("message")
    detail = clip(message) if isinstance(message, str) else None
    metadata = error.get("metadata")
    upstream = metadata.get("raw") if isinstance(metadata, dict) else None
    raw = clip(upstream) if isinstance(upstream, str) else None
    if raw and raw != detail:
        return clip(f"{detail} ({raw})") if detail else raw
    return detail


def _status_error(response: httpx.Response) -> ProviderError:
    status = response.status_code
    try:
        body: object = json.loads(response.content)
    except ValueError:
        detail = clip(response.text)
    else:
        detail = _error_detail(body.get("error")) if isinstance(body, dict) else None
    message = f"provider returned HTTP {status}: {detail or response.reason_phrase or 'no error message'}"
    retry_after = retry_after_seconds(response.headers.get("retry-after")) if status in _RETRY_AFTER_STATUSES else None
    return ProviderError(message, retryable=is_retryable_status(status), status_code=status, retry_after=retry_after)


def _body_error(error: dict[str, object] | str) -> ProviderError:
    """A 200 whose body is an error: classify it by its code as if it were the HTTP status."""
    code = error.get("code") if isinstance(error, dict) else None
    status = code if isinstance(code, int) and not isinstance(code, bool) else None
    if isinstance(code, str) and code.isdigit():
        status = int(code)
    detail = _error_detail(error) or "no message"
    label = f"error {code}" if code is not None else "an error"
    return ProviderError(
        f"provider reported {label}: {detail}",
        retryable=status is None or is_retryable_status(status),
        status_code=status,
    )


def _malformed(reason: str) -> ProviderError:
    return ProviderError(f"provider returned a malformed response: {reason}", retryable=True)


def _content_text(content: object) -> str | None:
    """message.content as text: a string, or a list of parts whose text parts are joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part["text"]
            for part in content
            if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
        )
    return None


def _optional_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _transcription(response: httpx.Response, request: TranscriptionRequest, latency: float) -> Transcription:
    """A 2xx chat completion as a Transcription; anything else as the ProviderError it amounts to."""
    body = _json_body(response)
    text, finish_reason = _answer(body)
    prompt_tokens, completion_tokens, cost = _usage(body)
    model = body.get("model")
    response_id = body.get("id")
    if not isinstance(response_id, str) or not response_id:
        response_id = response.headers.get("x-request-id")
    return Transcription(
        text=text,
        finish_reason=finish_reason,
        model=model if isinstance(model, str) and model else request.model,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        cost=cost,
        request_id=response_id,
        latency_seconds=latency,
    )


def completion(body: dict[str, object], model: str, latency_seconds: float) -> Transcription:
    """A chat completion's JSON body (one answer of a provider batch) as a Transcription; a body that is an error, or
    holds none or an empty answer, raises the ProviderError it amounts to."""
    error = body.get("error")
    if isinstance(error, dict | str) and error:
        raise _body_error(error)
    text, finish_reason = _answer(body)
    prompt_tokens, completion_tokens, cost = _usage(body)
    answered_by, response_id = body.get("model"), body.get("id")
    return Transcription(
        text=text,
        finish_reason=finish_reason,
        model=answered_by if isinstance(answered_by, str) and answered_by else model,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        cost=cost,
        request_id=response_id if isinstance(response_id, str) and response_id else None,
        latency_seconds=latency_seconds,
    )


def _json_body(response: httpx.Response) -> dict[str, object]:
    """The response's JSON object; an error status, a body that is not one, or an error object in a 200 raises."""
    if not response.is_success:
        raise _status_error(response)
    try:
        body: object = json.loads(response.content)
    except ValueError as exc:
        raise _malformed(f"body is not JSON ({exc})") from exc
    if not isinstance(body, dict):
        raise _malformed("body is not a JSON object")
    error = body.get("error")
    if isinstance(error, dict | str) and error:
        raise _body_error(error)
    return body


def _answer(body: dict[str, object]) -> tuple[str, str]:
    """The first choice's text (storable) and finish reason; a missing, failed or empty answer raises."""
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise _malformed("no choices")
    message = choices[0].get("message")
    if not isinstance(message, dict):
        raise _malformed("choices[0] has no message")
    text = _content_text(message.get("content"))
    if text is None:
        raise _malformed("choices[0].message.content is neither text nor a list of parts")
    text = storable(text)
    raw_finish_reason = choices[0].get("finish_reason")
    finish_reason = raw_finish_reason if isinstance(raw_finish_reason, str) else "unknown"
    return text, accepted(text, finish_reason)


def _usage(body: dict[str, object]) -> tuple[int | None, int | None, float | None]:
    """Prompt tokens, completion tokens and cost (USD, OpenRouter's usage.cost), each None when not reported."""
    usage = body.get("usage")
    if not isinstance(usage, dict):
        return None, None, None
    raw_cost = usage.get("cost")
    cost = float(raw_cost) if isinstance(raw_cost, int | float) and not isinstance(raw_cost, bool) else None
    return _optional_int(usage.get("prompt_tokens")), _optional_int(usage.get("completion_tokens")), cost
