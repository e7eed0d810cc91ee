"""A real local HTTP server that speaks the OpenAI chat-completions protocol and can be told to misbehave.

    with FakeChatServer() as fake:
        fake.script(Status(429, retry_after="1"), Ok())   # one behaviour per request, then the default
        ... point the code under test at fake.base_url ...
        assert fake.calls == 2 and fake.connections_opened == 1

By default every request is answered like a vision model would: 200 with the text
``expected_text(<decoded first image>)``, so a test can check which page image produced which answer.
Requests are validated like a real server would (path, API key, JSON body with model, messages and a
base64 ``image_url`` data URL) before a scripted behaviour is consumed; invalid ones get an
OpenAI-style error body and do not consume the script.

A request with ``"stream": true`` is answered with server-sent events (``streams=False``: a server that cannot
stream, answering with a JSON body): one event per word of the answer, spread over the answer's delay, usage (and
cost) in a last event when ``stream_options.include_usage`` or ``usage.include`` asks, then ``data: [DONE]``.
``fake.billed`` lists the completion tokens each answer actually sent, streamed ones up to the client going away.

Standalone: ``python -m tests.fakes.chat_server --port 0 --delay 0`` prints its base URL and serves
until killed.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import contextlib
import hashlib
import json
import math
import os
import re
import signal
import socket
import struct
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType, TracebackType
from typing import Any

CHAT_COMPLETIONS_PATH = "/v1/chat/completions"
PROMPT_TOKENS = 1000


def expected_text(image_bytes: bytes) -> str:
    """The answer the fake gives by default for a page image (the decoded bytes of its data URL)."""
    return f"Transcribed page image {hashlib.sha256(image_bytes).hexdigest()[:16]}"


@dataclass(frozen=True)
class Ok:
    """200 with an answer; ``text=None`` answers ``expected_text(image)``.

    The answer is sent ``FakeChatServer.default_delay + delay`` seconds after the request's head was read: the fake's
    own reading and decoding of its body are within that time, as a provider's are within its latency. (Its thread
    reads the head only once it holds the GIL, so requests arriving together while others are being decoded are still
    stamped up to a few decodings apart.) Its body "id" is
    "gen-<n>" (``include_id=False`` leaves it out); every response carries an x-request-id header
    "req-<n>". ``cost=None`` leaves usage.cost out; ``as_parts=True`` sends message.content as a list
    of two text parts (the halves of the text) instead of a string.
    """

    text: str | None = None
    finish_reason: str = "stop"
    delay: float = 0.0
    cost: float | None = 0.00012
    include_id: bool = True
    as_parts: bool = False
    keepalives: int = 0  # streamed: SSE comments (": OPENROUTER PROCESSING") before the first event


@dataclass(frozen=True)
class Status:
    """An HTTP error status with an optional Retry-After header.

    The body is ``{"error": {"code": code, "message": message}}``, or ``body`` verbatim when given
    (say an HTML page from a proxy, or an error object with OpenRouter's metadata).
    """

    code: int
    message: str = "simulated provider error"
    retry_after: str | None = None
    body: str | None = None


@dataclass(frozen=True)
class BodyError:
    """200 whose body is an error object, as OpenRouter sends for some upstream failures."""

    code: int | str
    message: str = "simulated upstream error"


@dataclass(frozen=True)
class Hang:
    """Read the request, then answer nothing for ``seconds`` (or until the server stops) and close."""

    seconds: float


@dataclass(frozen=True)
class Reset:
    """Read the request, then reset the TCP connection (RST) without a response."""


@dataclass(frozen=True)
class Malformed:
    """200 whose body is not JSON."""


@dataclass(frozen=True)
class Empty:
    """200 with an empty answer (content "", finish_reason "stop")."""


@dataclass(frozen=True)
class Truncated:
    """200 with a partial answer cut at the token limit (finish_reason "length")."""

    text: str = "partial"


@dataclass(frozen=True)
class Trickle:
    """A valid 200 answer whose bytes (head and body) are sent in ``chunks`` pieces over ``total_seconds``.

    Every piece arrives well within any per-read timeout, so only an overall deadline can cut it.
    """

    total_seconds: float
    chunks: int = 10


@dataclass(frozen=True)
class Loop:
    """A model stuck in a loop: ``unit`` written again and again up to the request's max_tokens (one token a word),
    ``token_seconds`` apart, then finish_reason "length". Streamed, it stops when the client goes away; unstreamed,
    the whole of it is generated (and billed) before the answer is sent."""

    unit: str = "The same line once more. "
    token_seconds: float = 0.001


@dataclass(frozen=True)
class StreamError:
    """Streamed: ``after`` words of an answer, then an error event (OpenRouter's mid-stream error); unstreamed: a 200
    whose body is that error."""

    code: int = 502
    after: int = 3
    message: str = "simulated upstream error mid-stream"


Behaviour = Ok | Status | BodyError | Hang | Reset | Malformed | Empty | Truncated | Trickle | Loop | StreamError
_UNSTREAMED = Status | BodyError | Hang | Reset | Malformed | Trickle  # the same whether streamed or not
# Chooses the behaviour for a request from its JSON body and its decoded page image; None leaves it to the script.
Rule = Callable[[dict[str, Any], bytes], Behaviour | None]


class RateLimit:
    """A provider's rate limit, as a route rule: at most ``limit`` requests in any ``window_seconds`` (a sliding
    window, the strictest reading of "60 requests per minute"); a request beyond it is answered 429 with a
    Retry-After of the whole seconds until the oldest request in the window leaves it.

        limit = RateLimit(60)
        fake.route(limit)
        ... ; limit.admitted, limit.refused
    """

    def __init__(self, limit: int, window_seconds: float = 60.0) -> None:
        self.limit = limit
        self.window_seconds = window_seconds
        self._times: deque[float] = deque()
        self._lock = threading.Lock()
        self.admitted = 0
        self.refused = 0
        self.admitted_at: list[float] = []  # time.monotonic() of each admitted request

    def __call__(self, body: dict[str, Any], image: bytes) -> Behaviour | None:
        with self._lock:
            now = time.monotonic()
            while self._times and self._times[0] <= now - self.window_seconds:
                self._times.popleft()
            if len(self._times) < self.limit:
                self._times.append(now)
                self.admitted += 1
                self.admitted_at.append(now)
                return None
            self.refused += 1
            free_in = self._times[0] + self.window_seconds - now
        return Status(429, "rate limit exceeded: too many requests per minute", retry_after=str(math.ceil(free_in)))


class Gate:
    """A route rule that holds every request until the gate is opened, then lets each go on to the script and the
    default; it counts the requests it holds and the most it held at once.

        gate = Gate()
        fake.route(gate)
        ... ; gate.held, gate.most_held, gate.wait_held(10, timeout=20); gate.open()
    """

    def __init__(self) -> None:
        self._opened = threading.Event()
        self._changed = threading.Condition()
        self.held = 0
        self.most_held = 0

    def __call__(self, body: dict[str, Any], image: bytes) -> Behaviour | None:
        with self._changed:
            self.held += 1
            self.most_held = max(self.most_held, self.held)
            self._changed.notify_all()
        self._opened.wait()
        with self._changed:
            self.held -= 1
        return None

    def wait_held(self, count: int, timeout: float) -> bool:
        """Whether ``count`` requests came to be held at once within ``timeout`` seconds."""
        with self._changed:
            return self._changed.wait_for(lambda: self.most_held >= count, timeout)

    def open(self) -> None:
        self._opened.set()


@dataclass(frozen=True)
class ReceivedRequest:
    """One HTTP request as the server saw it; header names are lower case."""

    method: str
    path: str
    headers: dict[str, str]
    body: dict[str, Any] | None  # None when the body is not a JSON object


class FakeChatServer:
    """A threaded HTTP/1.1 chat-completions server on 127.0.0.1 with keep-alive and scripted faults."""

    def __init__(
        self, *, port: int = 0, require_api_key: str | None = None, default_delay: float = 0.0, streams: bool = True
    ) -> None:
        self.require_api_key = require_api_key
        self.default_delay = default_delay  # seconds before every Ok, Empty and Truncated answer
        self.streams = streams  # answers "stream": true with events; False: with a JSON body, as it cannot stream
        self._billed: list[int] = []
        self._port = port
        self._lock = threading.Lock()
        self._billing = threading.Condition(self._lock)
        self._stopping = threading.Event()
        self._script: deque[Behaviour] = deque()
        self._rules: list[Rule] = []
        self._default: Behaviour = Ok()
        self._received: list[ReceivedRequest] = []
        self._connections_opened = 0
        self._answers = 0
        self._responses = 0
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # lifecycle

    def start(self) -> FakeChatServer:
        if self._server is not None:
            raise RuntimeError("the fake chat server is already running")
        self._stopping.clear()
        self._server = _Server(self, self._port)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, release hanging and delayed answers, and close every open connection."""
        server, thread = self._server, self._thread
        if server is None or thread is None:
            return
        self._stopping.set()
        server.shutdown()
        server.close_open_connections()
        server.server_close()
        thread.join()
        self._server = self._thread = None

    def __enter__(self) -> FakeChatServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        if self._server is None:
            raise RuntimeError("the fake chat server is not running; call start() first")
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    # scripting

    def script(self, *behaviours: Behaviour) -> None:
        """Queue behaviours, consumed one per valid request in order; then the default applies."""
        with self._lock:
            self._script.extend(behaviours)

    def route(self, rule: Rule) -> None:
        """Answer each valid request for which ``rule(body, image)`` returns a behaviour with that behaviour, before
        the script and the default: e.g. a given answer for one page image, or for one model."""
        with self._lock:
            self._rules.append(rule)

    def set_default(self, behaviour: Behaviour) -> None:
        """The behaviour for valid requests once the script is used up (initially ``Ok()``)."""
        with self._lock:
            self._default = behaviour

    # evidence

    @property
    def connections_opened(self) -> int:
        """TCP connections accepted since start."""
        with self._lock:
            return self._connections_opened

    @property
    def received(self) -> list[ReceivedRequest]:
        """Every HTTP request received, valid or not, in arrival order."""
        with self._lock:
            return list(self._received)

    @property
    def requests(self) -> list[dict[str, Any]]:
        """The JSON object bodies of the requests received, in arrival order."""
        return [r.body for r in self.received if r.body is not None]

    def images(self) -> list[bytes]:
        """The decoded first image of each request received that carried one, in the order they came."""
        images = []
        for request in self.received:
            with contextlib.suppress(_InvalidRequest):
                images.append(_first_image(request.body or {}))
        return images

    @property
    def billed(self) -> list[int]:
        """The completion tokens each answer sent, in the order the answers ended: a streamed answer's up to the
        client's going away (what a provider bills for a call closed mid-answer)."""
        with self._lock:
            return list(self._billed)

    @property
    def calls(self) -> int:
        """HTTP requests received, valid or not."""
        with self._lock:
            return len(self._received)

    # used by the handler threads

    def _connection_accepted(self) -> None:
        with self._lock:
            self._connections_opened += 1

    def _record(self, request: ReceivedRequest) -> None:
        with self._lock:
            self._received.append(request)

    def _next_behaviour(self, body: dict[str, Any], image: bytes) -> Behaviour:
        with self._lock:
            rules = list(self._rules)
        for rule in rules:
            chosen = rule(body, image)
            if chosen is not None:
                return chosen
        with self._lock:
            return self._script.popleft() if self._script else self._default

    def wait_billed(self, answers: int, timeout: float = 30.0) -> list[int]:
        """``billed`` once that many answers have ended (a streamed one ends when the server sees the client gone)."""
        with self._billing:
            if not self._billing.wait_for(lambda: len(self._billed) >= answers, timeout):
                raise TimeoutError(f"{len(self._billed)} answers billed, not {answers}, within {timeout} s")
            return list(self._billed)

    def _bill(self, tokens: int) -> None:
        with self._billing:
            self._billed.append(tokens)
            self._billing.notify_all()

    def _next_answer_number(self) -> int:
        with self._lock:
            self._answers += 1
            return self._answers

    def _next_response_number(self) -> int:
        with self._lock:
            self._responses += 1
            return self._responses

    def _pause(self, seconds: float) -> bool:
        """Wait ``seconds``; False when the server is stopping instead."""
        return seconds <= 0 or not self._stopping.wait(seconds)


def _as_answer(behaviour: Behaviour) -> Behaviour:
    """Empty and Truncated are answers of a given text and finish reason."""
    match behaviour:
        case Empty():
            return Ok(text="")
        case Truncated(text=text):
            return Ok(text=text, finish_reason="length")
    return behaviour


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # stop() closes the connections itself; never wait on a client

    def __init__(self, fake: FakeChatServer, port: int) -> None:
        self.fake = fake
        self._open: set[socket.socket] = set()
        self._open_lock = threading.Lock()
        super().__init__(("127.0.0.1", port), _Handler)

    def get_request(self) -> tuple[socket.socket, Any]:
        connection, address = super().get_request()
        with self._open_lock:
            self._open.add(connection)
        self.fake._connection_accepted()
        return connection, address

    def shutdown_request(self, request: Any) -> None:
        with self._open_lock:
            self._open.discard(request)
        super().shutdown_request(request)

    def close_open_connections(self) -> None:
        with self._open_lock:
            connections = list(self._open)
        for connection in connections:
            with contextlib.suppress(OSError):  # already closed by either side
                connection.shutdown(socket.SHUT_RDWR)

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], OSError):  # clients vanishing mid-request are part of the job
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server
    _arrived: float  # time.monotonic() when the request's headers were read

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet: tests inspect FakeChatServer.received instead

    def do_POST(self) -> None:
        self._arrived = time.monotonic()  # an answer's delay counts from here
        try:
            self._serve()
        except OSError:  # the client went away, or stop() shut the connection, mid-answer
            self.close_connection = True

    do_GET = do_POST

    def _serve(self) -> None:
        fake = self.server.fake
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        try:
            parsed = json.loads(raw)
        except ValueError:
            parsed = None
        body = parsed if isinstance(parsed, dict) else None
        headers = {name.lower(): value for name, value in self.headers.items()}
        fake._record(ReceivedRequest(self.command, self.path, headers, body))

        if self.path != CHAT_COMPLETIONS_PATH:
            self._send_error(404, f"no route for {self.command} {self.path}")
            return
        if self.command != "POST":
            self._send_error(405, f"method {self.command} not allowed")
            return
        if fake.require_api_key is not None:
            authorization = self.headers.get("Authorization")
            if authorization is None:
                self._send_error(401, "No auth credentials found")
                return
            if authorization != f"Bearer {fake.require_api_key}":
                self._send_error(401, "Incorrect API key provided")
                return
        if body is None:
            self._send_error(400, "request body is not a valid JSON object")
            return
        try:
            image = _first_image(body)
        except _InvalidRequest as exc:
            self._send_error(400, str(exc))
            return
        behaviour = fake._next_behaviour(body, image)
        if body.get("stream") is True and fake.streams and not isinstance(behaviour, _UNSTREAMED):
            self._stream(_as_answer(behaviour), body, image)
        else:
            self._perform(behaviour, body, image)

    def _perform(self, behaviour: Behaviour, body: dict[str, Any], image: bytes) -> None:
        fake = self.server.fake
        match _as_answer(behaviour):
            case Ok() as ok:
                self._answer(ok, body, image)
            case Loop() as loop:
                self._loop_answer(loop, body, image)
            case Status() as status:
                self._status(status)
            case BodyError(code=code, message=message) | StreamError(code=code, message=message):
                self._send_json(200, {"error": {"code": code, "message": message}})
            case Hang(seconds=seconds):
                fake._pause(seconds)
                self.close_connection = True
            case Reset():
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                os.close(self.connection.detach())  # linger 0: the kernel answers with RST, not FIN
                self.close_connection = True
            case Malformed():
                self._send(200, b"{not json")
            case Trickle(total_seconds=total, chunks=chunks):
                completion = _completion(fake._next_answer_number(), body, image, Ok())
                self._trickle(json.dumps(completion).encode(), total, chunks)

    def _answer(self, ok: Ok, body: dict[str, Any], image: bytes) -> None:
        fake = self.server.fake
        if not fake._pause(self._arrived + fake.default_delay + ok.delay - time.monotonic()):
            self.close_connection = True
            return
        completion = _completion(fake._next_answer_number(), body, image, ok)
        fake._bill(completion["usage"]["completion_tokens"])
        self._send_json(200, completion)

    def _loop_answer(self, loop: Loop, body: dict[str, Any], image: bytes) -> None:
        """Unstreamed, a loop is generated to the output limit, all of it billed, before the answer is sent."""
        fake = self.server.fake
        tokens = body.get("max_tokens") or 4096
        if not fake._pause(tokens * loop.token_seconds):
            self.close_connection = True
            return
        fake._bill(tokens)
        text = "".join(_words(loop.unit * (tokens // len(loop.unit.split()) + 1))[:tokens])
        self._send_json(
            200, _completion(fake._next_answer_number(), body, image, Ok(text=text, finish_reason="length"))
        )

    def _stream(self, behaviour: Behaviour, body: dict[str, Any], image: bytes) -> None:
        """The answer as server-sent events, one a word, over a chunked response; billed up to what was sent."""
        fake = self.server.fake
        self._start_events()
        sent = 0
        try:
            match behaviour:
                case Ok() as ok:
                    self._event(b": OPENROUTER PROCESSING" for _ in range(ok.keepalives))
                    sent = self._stream_answer(ok, body, image)
                case Loop(unit=unit, token_seconds=seconds):
                    sent = self._stream_loop(unit, seconds, body)
                case StreamError(code=code, after=after, message=message):
                    head = {"id": f"gen-{fake._next_answer_number()}", "model": body["model"]}
                    for sent in range(1, after + 1):
                        self._data(head | {"choices": [{"index": 0, "delta": {"content": f"word{sent} "}}]})
                    error = {"error": {"code": code, "message": message}}
                    self._data(head | error | {"choices": [{"index": 0, "delta": {}, "finish_reason": "error"}]})
                    self._data_done()
        finally:
            fake._bill(sent)

    def _stream_answer(self, ok: Ok, body: dict[str, Any], image: bytes) -> int:
        fake = self.server.fake
        completion = _completion(fake._next_answer_number(), body, image, ok)
        text = expected_text(image) if ok.text is None else ok.text
        words = _words(text)
        head = {key: completion[key] for key in ("id", "model") if key in completion}
        sent, started, step = 0, self._arrived, (fake.default_delay + ok.delay) / max(1, len(words))
        for word in words:  # each at its time from the start: the last at the answer's delay, as unstreamed
            if not fake._pause(started + (sent + 1) * step - time.monotonic()):
                self.close_connection = True
                return sent
            self._data(head | {"choices": [{"index": 0, "delta": {"content": word}, "finish_reason": None}]})
            sent += 1
        if not words and not fake._pause(self._arrived + fake.default_delay + ok.delay - time.monotonic()):
            self.close_connection = True
            return sent
        self._data(head | {"choices": [{"index": 0, "delta": {}, "finish_reason": ok.finish_reason}]})
        if _wants_usage(body):
            self._data(head | {"choices": [], "usage": completion["usage"]})
        self._data_done()
        return sent

    def _stream_loop(self, unit: str, seconds: float, body: dict[str, Any]) -> int:
        fake = self.server.fake
        head = {"id": f"gen-{fake._next_answer_number()}", "model": body["model"]}
        tokens = body.get("max_tokens") or 4096
        pieces = _words(unit)
        for sent in range(tokens):
            if not fake._pause(seconds):
                self.close_connection = True
                return sent
            try:
                self._data(head | {"choices": [{"index": 0, "delta": {"content": pieces[sent % len(pieces)]}}]})
            except OSError:  # the client closed the stream: the provider stops generating
                self.close_connection = True
                return sent
        self._data(head | {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
        if _wants_usage(body):
            usage = {
                "prompt_tokens": PROMPT_TOKENS,
                "completion_tokens": tokens,
                "total_tokens": PROMPT_TOKENS + tokens,
            }
            self._data(head | {"choices": [], "usage": usage})
        self._data_done()
        return tokens

    def _start_events(self) -> None:
        head = (
            "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
            f"Transfer-Encoding: chunked\r\nx-request-id: req-{self.server.fake._next_response_number()}\r\n\r\n"
        )
        self.wfile.write(head.encode("latin-1"))

    def _event(self, lines: Any) -> None:
        for line in lines:
            self._chunk(line + b"\n\n")

    def _data(self, payload: dict[str, Any]) -> None:
        self._chunk(b"data: " + json.dumps(payload).encode() + b"\n\n")

    def _data_done(self) -> None:
        self._chunk(b"data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")

    def _status(self, status: Status) -> None:
        extra = {"Retry-After": status.retry_after} if status.retry_after is not None else {}
        if status.body is None:
            self._send_error(status.code, status.message, extra)
        else:
            self._send(status.code, status.body.encode(), extra)

    def _send_error(self, code: int, message: str, extra_headers: dict[str, str] | None = None) -> None:
        self._send_json(code, {"error": {"code": code, "message": message}}, extra_headers)

    def _send_json(self, status: int, payload: dict[str, Any], extra_headers: dict[str, str] | None = None) -> None:
        self._send(status, json.dumps(payload).encode(), extra_headers)

    def _send(self, status: int, data: bytes, extra_headers: dict[str, str] | None = None) -> None:
        self.wfile.write(self._response(status, data, extra_headers))

    def _response(self, status: int, data: bytes, extra_headers: dict[str, str] | None = None) -> bytes:
        """The whole HTTP/1.1 response; Content-Length always set so the connection can be kept alive."""
        reason = self.responses.get(status, ("Unknown",))[0]
        headers = {
            "Content-Type": "application/json",
            "Content-Length": str(len(data)),
            "x-request-id": f"req-{self.server.fake._next_response_number()}",
            **(extra_headers or {}),
        }
        head = f"HTTP/1.1 {status} {reason}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        return (head + "\r\n").encode("latin-1") + data

    def _trickle(self, data: bytes, total_seconds: float, chunks: int) -> None:
        message = self._response(200, data)
        pieces = max(1, chunks)
        size = -(-len(message) // pieces)  # ceiling division
        for offset in range(0, len(message), size):
            if not self.server.fake._pause(total_seconds / pieces):
                self.close_connection = True
                return
            self.wfile.write(message[offset : offset + size])


class _InvalidRequest(ValueError):
    """The request is not one a real chat-completions server would accept (answered with 400)."""


def _first_image(body: dict[str, Any]) -> bytes:
    """Validate a request body and return the decoded bytes of its first image_url data URL."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _InvalidRequest("model is required")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _InvalidRequest("messages must be a non-empty list")
    max_tokens = body.get("max_tokens")
    if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens <= 0):
        raise _InvalidRequest("max_tokens must be a positive integer")
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        for part in content if isinstance(content, list) else []:
            if isinstance(part, dict) and part.get("type") == "image_url":
                image_url = part.get("image_url")
                url = image_url.get("url") if isinstance(image_url, dict) else None
                if not isinstance(url, str):
                    raise _InvalidRequest("image_url.url is required")
                return _decode_data_url(url)
    raise _InvalidRequest("the request carries no image_url part; this fake transcribes page images")


def _decode_data_url(url: str) -> bytes:
    header, separator, data = url.partition(",")
    if not separator or not header.startswith("data:image/") or not header.endswith(";base64"):
        raise _InvalidRequest("Invalid image URL: expected data:image/<type>;base64,<data>")
    try:
        return base64.b64decode(data, validate=True)
    except binascii.Error as exc:
        raise _InvalidRequest("Invalid image data: not valid base64") from exc


def _words(text: str) -> list[str]:
    """The answer's tokens as the fake counts them: each word with the white space around it."""
    return re.findall(r"\s*\S+\s*", text)


def _wants_usage(body: dict[str, Any]) -> bool:
    options, usage = body.get("stream_options"), body.get("usage")
    return (isinstance(options, dict) and options.get("include_usage") is True) or (
        isinstance(usage, dict) and usage.get("include") is True
    )


def _completion(number: int, body: dict[str, Any], image: bytes, ok: Ok) -> dict[str, Any]:
    text = expected_text(image) if ok.text is None else ok.text
    completion_tokens = len(text.split())
    usage: dict[str, Any] = {
        "prompt_tokens": PROMPT_TOKENS,
        "completion_tokens": completion_tokens,
        "total_tokens": PROMPT_TOKENS + completion_tokens,
    }
    if ok.cost is not None:
        usage["cost"] = ok.cost
    content: str | list[dict[str, str]] = text
    if ok.as_parts:
        half = len(text) // 2
        content = [{"type": "text", "text": text[:half]}, {"type": "text", "text": text[half:]}]
    completion: dict[str, Any] = {"id": f"gen-{number}"} if ok.include_id else {}
    completion |= {
        "object": "chat.completion",
        "model": body["model"],
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": ok.finish_reason,
            }
        ],
        "usage": usage,
    }
    return completion


def main() -> None:
    parser = argparse.ArgumentParser(description="Serve a fake OpenAI-compatible chat-completions API.")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds before every answer")
    parser.add_argument("--api-key", default=None, help="require this bearer token")
    arguments = parser.parse_args()

    def exit_on_signal(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, exit_on_signal)
    signal.signal(signal.SIGINT, exit_on_signal)  # also when started in the background, where SIGINT is ignored
    with FakeChatServer(port=arguments.port, require_api_key=arguments.api_key, default_delay=arguments.delay) as fake:
        print(fake.base_url, flush=True)
        threading.Event().wait()


if __name__ == "__main__":
    main()
