"""A real local HTTP server speaking Bedrock's Converse wire format (rest-json), scriptable like chat_server.py.

    with FakeBedrockServer() as fake:
        fake.script(Throttle(), Answer())      # one behaviour per request, then the default (Answer())
        client = boto3.client("bedrock-runtime", endpoint_url=fake.endpoint_url, region_name="us-east-1", ...)
        ... ; fake.calls, fake.answered  # requests per model; (model, image digest) of every answer sent

``POST /model/{modelId}/converse`` with a SigV4-signed JSON body (messages with a text block and an image block
whose ``source.bytes`` is base64, inferenceConfig) is answered like a vision model: 200 with the text
``expected_text(<decoded image>)`` (the OpenAI-compatible fake's, so a test can tell which page produced which answer),
``stopReason``, ``usage`` (input and output tokens) and ``metrics``, and an ``x-amzn-RequestId`` header. An error is a
status with the ``x-amzn-ErrorType`` header naming the exception and a ``{"message": ...}`` body, as Bedrock sends
them. A request that is not valid Converse (unsigned, no image, a format Bedrock does not take) is refused with
ValidationException without consuming the script.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import struct
import threading
import time
import urllib.parse
import zlib
from collections import Counter
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

from tests.fakes.chat_server import PROMPT_TOKENS, expected_text

IMAGE_FORMATS = frozenset({"png", "jpeg", "gif", "webp"})


@dataclass(frozen=True)
class Answer:
    """200 with an answer: ``text`` or ``expected_text(image)``; ``output_tokens`` or one per word; after ``delay``."""

    text: str | None = None
    stop_reason: str = "end_turn"
    input_tokens: int = PROMPT_TOKENS
    output_tokens: int | None = None
    delay: float = 0.0


@dataclass(frozen=True)
class Fail:
    """An error answer: ``status`` with ``x-amzn-ErrorType: error_type`` (and Retry-After when given)."""

    status: int
    error_type: str
    message: str = "simulated Bedrock error"
    retry_after: str | None = None


def Throttle(retry_after: str | None = None) -> Fail:
    """Bedrock's answer to too many requests or tokens."""
    return Fail(429, "ThrottlingException", "Too many requests, please wait before trying again.", retry_after)


@dataclass(frozen=True)
class Loop:
    """A model stuck in a loop: ``unit`` again and again up to the request's maxTokens (a token a word), a word every
    ``token_seconds``, then stopReason max_tokens. Streamed, it stops when the client goes away."""

    unit: str = "The same line once more. "
    token_seconds: float = 0.001


@dataclass(frozen=True)
class StreamError:
    """Streamed: ``after`` words of an answer, then an error event (``error_type`` in camel case, as Bedrock names
    them: throttlingException, modelStreamErrorException...)."""

    error_type: str = "modelStreamErrorException"
    after: int = 3


Behaviour = Answer | Fail | Loop | StreamError


class FakeBedrockServer:
    """A threaded HTTP/1.1 Converse server on 127.0.0.1."""

    def __init__(self) -> None:
        self._script: list[Behaviour] = []
        self._lock = threading.Lock()
        self.default: Behaviour = Answer()
        self.calls: Counter[str] = Counter()  # valid requests per model id
        self.answered: list[tuple[str, str]] = []  # (model id, sha256 of the image) of every 200 sent
        self.bodies: list[dict[str, Any]] = []  # valid request bodies, in order
        self.signers: list[str] = []  # "<access key id>/<region>/<service>" each valid request was signed for
        self.streamed: list[bool] = []  # whether each valid request was a ConverseStream
        self.billed: list[int] = []  # output tokens each streamed answer sent before it ended or the client went
        self._server = _Server(self)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> FakeBedrockServer:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self._server.shutdown()
        self._server.server_close()

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def script(self, *behaviours: Behaviour) -> None:
        """Answer the next valid requests with these, in order, then with the default."""
        with self._lock:
            self._script.extend(behaviours)

    def next_behaviour(self, model: str, body: dict[str, Any], signer: str) -> Behaviour:
        with self._lock:
            self.calls[model] += 1
            self.signers.append(signer)
            self.bodies.append(body)
            return self._script.pop(0) if self._script else self.default

    def wait_billed(self, answers: int, timeout: float = 30.0) -> list[int]:
        """The tokens sent by the first ``answers`` streamed answers, once that many have ended."""
        deadline = time.monotonic() + timeout
        while len(self.billed) < answers and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.billed[:answers]

    def bill(self, output_tokens: int) -> None:
        with self._lock:
            self.billed.append(output_tokens)

    def record_answer(self, model: str, image: bytes) -> None:
        with self._lock:
            self.answered.append((model, hashlib.sha256(image).hexdigest()))


def _invalid(body: object) -> str | None:
    """Why a Converse body is not one this fake accepts (a text block and an image block), else None."""
    if not isinstance(body, dict):
        return "the body is not a JSON object"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not isinstance(messages[0], dict):
        return "messages: at least one message is required"
    content = messages[0].get("content")
    blocks = content if isinstance(content, list) else []
    if not any(isinstance(b, dict) and isinstance(b.get("text"), str) for b in blocks):
        return "messages[0].content: a text block is required"
    images = [b["image"] for b in blocks if isinstance(b, dict) and isinstance(b.get("image"), dict)]
    if not images or images[0].get("format") not in IMAGE_FORMATS:
        return "messages[0].content: an image block of a supported format is required"
    if not isinstance(body.get("inferenceConfig", {}).get("maxTokens"), int):
        return "inferenceConfig.maxTokens is required"
    return None


class _RefusedError(Exception):
    def __init__(self, status: int, error_type: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.error_type = error_type


def _converse_request(path: str, authorization: str, raw: bytes) -> tuple[str, dict[str, Any], bytes]:
    """The model, body and decoded image of a valid Converse (or ConverseStream) request; any other raises the error
    Bedrock answers."""
    parts = path.split("/")
    if len(parts) != 4 or parts[1] != "model" or parts[3] not in ("converse", "converse-stream"):
        raise _RefusedError(404, "UnknownOperationException", f"no such operation: {path}")
    if not authorization.startswith("AWS4-HMAC-SHA256 "):
        raise _RefusedError(403, "AccessDeniedException", "Missing Authentication Token")
    try:
        body: object = json.loads(raw)
        problem = _invalid(body)
        if problem is None and isinstance(body, dict):
            return urllib.parse.unquote(parts[2]), body, _image(body)
    except (ValueError, KeyError, binascii.Error) as exc:
        problem = f"malformed request: {exc}"
    raise _RefusedError(400, "ValidationException", problem or "the body is not a JSON object")


def _loop_words(loop: Loop, max_tokens: int) -> list[str]:
    unit = loop.unit.split()
    return (unit * (max_tokens // len(unit) + 1))[:max_tokens]


def _event(event_type: str, payload: dict[str, Any], message_type: str = "event") -> bytes:
    """One message of the AWS event stream encoding: prelude (lengths and their CRC32), headers, payload, CRC32."""
    kind = ":exception-type" if message_type == "exception" else ":event-type"
    headers = b"".join(
        _header(name, value)
        for name, value in ((kind, event_type), (":content-type", "application/json"), (":message-type", message_type))
    )
    payload_bytes = json.dumps(payload).encode()
    prelude = struct.pack(">II", 12 + len(headers) + len(payload_bytes) + 4, len(headers))
    message = prelude + struct.pack(">I", zlib.crc32(prelude)) + headers + payload_bytes
    return message + struct.pack(">I", zlib.crc32(message))


def _header(name: str, value: str) -> bytes:
    name_bytes, value_bytes = name.encode(), value.encode()
    return struct.pack(">B", len(name_bytes)) + name_bytes + b"\x07" + struct.pack(">H", len(value_bytes)) + value_bytes


def _signer(authorization: str) -> str:
    """The SigV4 scope's key, region and service: ``Credential=AKID/20261206/eu-west-1/bedrock/aws4_request``."""
    scope = authorization.split("Credential=", 1)[-1].split(",", 1)[0].split("/")
    return "/".join([scope[0], *scope[2:4]]) if len(scope) == 5 else "unsigned"


def _image(body: dict[str, Any]) -> bytes:
    block = next(b["image"] for b in body["messages"][0]["content"] if isinstance(b.get("image"), dict))
    return base64.b64decode(block["source"]["bytes"], validate=True)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, fake: FakeBedrockServer) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.fake = fake


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_POST(self) -> None:
        fake = self.server.fake
        raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        try:
            model, body, image = _converse_request(self.path, self.headers.get("Authorization", ""), raw)
        except _RefusedError as refused:
            self._send(refused.status, {"message": str(refused)}, refused.error_type)
            return
        behaviour = fake.next_behaviour(model, body, _signer(self.headers.get("Authorization", "")))
        streamed = self.path.endswith("-stream")
        fake.streamed.append(streamed)
        if isinstance(behaviour, Fail) or not streamed:
            self._perform(behaviour, model, body, image)
        else:
            self._stream(behaviour, model, body, image)

    def _stream(self, behaviour: Answer | Loop | StreamError, model: str, body: dict[str, Any], image: bytes) -> None:
        """An event stream: the answer a word an event, then messageStop and metadata (the usage); the connection
        closed at its end."""
        self.close_connection = True
        self.send_response(200)
        self.send_header("Content-Type", "application/vnd.amazon.eventstream")
        self.send_header("x-amzn-RequestId", f"req-{sum(self.server.fake.calls.values())}")
        self.end_headers()
        if isinstance(behaviour, Loop):
            words = _loop_words(behaviour, int(body["inferenceConfig"]["maxTokens"]))
            pause, stop = behaviour.token_seconds, "max_tokens"
        else:
            answer = behaviour if isinstance(behaviour, Answer) else Answer()
            time.sleep(answer.delay)
            words = (expected_text(image) if answer.text is None else answer.text).split()
            pause, stop = 0.0, answer.stop_reason
        reported = behaviour.output_tokens if isinstance(behaviour, Answer) else None
        failing = behaviour.after if isinstance(behaviour, StreamError) else None
        sent = 0
        try:
            self.wfile.write(_event("messageStart", {"role": "assistant"}))
            for word in words:
                if sent == failing and isinstance(behaviour, StreamError):
                    self.wfile.write(
                        _event(behaviour.error_type, {"message": "simulated error mid-stream"}, "exception")
                    )
                    return
                delta = {"contentBlockIndex": 0, "delta": {"text": (" " if sent else "") + word}}
                self.wfile.write(_event("contentBlockDelta", delta))
                self.wfile.flush()
                sent += 1
                time.sleep(pause)
            self._end_stream(stop, sent if reported is None else reported)
            self.server.fake.record_answer(model, image)
        except (TimeoutError, BrokenPipeError, ConnectionResetError):
            pass  # the client went away: it cut the answer
        finally:
            self.server.fake.bill(sent)

    def _end_stream(self, stop_reason: str, output_tokens: int) -> None:
        self.wfile.write(_event("contentBlockStop", {"contentBlockIndex": 0}))
        self.wfile.write(_event("messageStop", {"stopReason": stop_reason}))
        usage = {
            "inputTokens": PROMPT_TOKENS,
            "outputTokens": output_tokens,
            "totalTokens": PROMPT_TOKENS + output_tokens,
        }
        self.wfile.write(_event("metadata", {"usage": usage, "metrics": {"latencyMs": 1}}))

    def _perform(self, behaviour: Behaviour, model: str, body: dict[str, Any], image: bytes) -> None:
        if isinstance(behaviour, StreamError):  # unstreamed, the error is the answer's status
            behaviour = Fail(500, "InternalServerException", "simulated error")
        if isinstance(behaviour, Fail):
            extra = {"Retry-After": behaviour.retry_after} if behaviour.retry_after else {}
            self._send(behaviour.status, {"message": behaviour.message}, behaviour.error_type, extra)
            return
        if isinstance(behaviour, Loop):  # unstreamed, the whole loop is generated (and paid) before it is sent
            words = _loop_words(behaviour, int(body["inferenceConfig"]["maxTokens"]))
            behaviour = Answer(" ".join(words), "max_tokens")
        time.sleep(behaviour.delay)
        text = expected_text(image) if behaviour.text is None else behaviour.text
        output_tokens = len(text.split()) if behaviour.output_tokens is None else behaviour.output_tokens
        answer = {
            "output": {"message": {"role": "assistant", "content": [{"text": text}]}},
            "stopReason": behaviour.stop_reason,
            "usage": {
                "inputTokens": behaviour.input_tokens,
                "outputTokens": output_tokens,
                "totalTokens": behaviour.input_tokens + output_tokens,
            },
            "metrics": {"latencyMs": round(behaviour.delay * 1000)},
        }
        self.server.fake.record_answer(model, image)
        self._send(200, answer)

    def _send(self, status: int, body: dict[str, Any], error_type: str | None = None, extra: Any = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("x-amzn-RequestId", f"req-{sum(self.server.fake.calls.values())}")
        if error_type is not None:
            self.send_header("x-amzn-ErrorType", f"{error_type}:http://internal.amazon.com/coral/com.amazon.bedrock/")
        for name, value in (extra or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)
