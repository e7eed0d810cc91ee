"""A real local HTTP server that speaks two provider batch APIs and can be told how each batch ends.

    with FakeBatchServer() as fake:
        fake.script(Partial(missing=3), Expire(answered=10), Fail(), Hold())  # one per batch, then Complete()
        ... point the code under test at fake.base_url (BATCH_BASE_URL) ...
        assert fake.fetches == ...; fake.batches[...]

Dialects, served side by side under ``/v1``:

* OpenAI-style: ``POST /v1/files`` (multipart, ``purpose=batch``, a JSONL file of {custom_id, method, url, body}),
  ``POST /v1/batches`` {input_file_id, endpoint: "/v1/chat/completions", completion_window: "24h"},
  ``GET /v1/batches/{id}`` (status validating, in_progress, finalizing, completed, failed, expired, cancelling,
  cancelled; output_file_id and error_file_id once it ended; request_counts), ``GET /v1/files/{id}/content`` (JSONL
  lines {custom_id, response: {status_code, body}, error}), ``POST /v1/batches/{id}/cancel``.
* OpenRouter's: ``POST /v1/beta/batches`` {endpoint, model, requests: [{custom_id, body}]} answered 202 with status
  "validating"; ``GET /v1/beta/batches/{id}`` with the results inline once it ended, each with exactly one of
  ``response`` or ``error``. As OpenRouter documents it, a request whose image is not an http(s) URL is refused (a
  data: URL is), and there is no cancellation. Where OpenRouter's documentation is silent (the exact path under the
  API base and the result line's fields) the fake follows the OpenAI-style lines: an assumption, said so in README.

A batch does its work when it is first polled after it was sent (a provider works between polls): it FETCHES each
request's image URL, as a real provider does (a presigned S3 URL from moto), and answers each with
``expected_text(<image bytes>)`` (the chat fake's answer), priced at ``price_per_token`` (the batch price) for
``PROMPT_TOKENS`` + ``COMPLETION_TOKENS`` tokens in ``usage.cost``. A request whose image cannot be fetched gets an
error line. ``refuse_batches`` answers that many batch creations 503, as an outage would. How a batch ends is
scripted, one behaviour per batch in the order they are sent:

* ``Complete()``: every request answered (the default);
* ``Partial(missing)``: completed, the last ``missing`` requests absent from the results;
* ``Errors(count)``: completed, the first ``count`` requests answered with an error line;
* ``Repeat()``: completed, every answer given twice (two result lines for each request);
* ``Expire(answered)``: expired, only the first ``answered`` requests answered;
* ``Fail()``: failed, no results;
* ``Hold()``: in_progress at every poll until ``release()`` (then completed) or a cancel (then cancelled, no
  results): a batch slower than any deadline.
"""

from __future__ import annotations

import email.parser
import hashlib
import itertools
import json
import threading
import urllib.request
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

from tests.fakes.chat_server import PROMPT_TOKENS, expected_text

COMPLETION_TOKENS = 50
SYNC_PRICE_PER_CALL = 0.00012  # the chat fake's default usage.cost of one call
DEFAULT_PRICE_PER_TOKEN = SYNC_PRICE_PER_CALL / (PROMPT_TOKENS + COMPLETION_TOKENS) / 2  # half the chat fake's price
ENDPOINT = "/v1/chat/completions"


@dataclass(frozen=True)
class Complete:
    pass


@dataclass(frozen=True)
class Partial:
    missing: int


@dataclass(frozen=True)
class Errors:
    count: int


@dataclass(frozen=True)
class Expire:
    answered: int


@dataclass(frozen=True)
class Repeat:
    pass


@dataclass(frozen=True)
class Fail:
    pass


@dataclass(frozen=True)
class Hold:
    pass


Ending = Complete | Partial | Errors | Expire | Fail | Hold | Repeat


@dataclass
class FakeBatch:
    """A batch as the fake keeps it."""

    id: str
    dialect: str  # openai | openrouter
    model: str
    requests: list[dict[str, Any]]  # {custom_id, body}
    ending: Ending
    status: str = "validating"
    results: list[dict[str, Any]] = field(default_factory=list)
    output_file_id: str | None = None
    error_file_id: str | None = None
    polls: int = 0
    released: bool = False


class FakeBatchServer:
    def __init__(self, *, price_per_token: float = DEFAULT_PRICE_PER_TOKEN) -> None:
        self.price_per_token = price_per_token
        self.batches: dict[str, FakeBatch] = {}
        self.files: dict[str, bytes] = {}
        self.fetches = 0
        self.cancelled: list[str] = []
        self.answer: Callable[[bytes], str] = expected_text  # the text a page's image is answered with
        self.refuse_batches = 0  # how many batch creations to answer 503 (an outage) before taking them again
        self._script: deque[Ending] = deque()
        self._ids = itertools.count(1)
        self._lock = threading.RLock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def __enter__(self) -> FakeBatchServer:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self._server.shutdown()
        self._server.server_close()

    def script(self, *endings: Ending) -> None:
        with self._lock:
            self._script.extend(endings)

    def release(self) -> None:
        """Held batches complete at their next poll."""
        with self._lock:
            for batch in self.batches.values():
                batch.released = True

    def cost(self) -> float:
        """One answer's usage.cost."""
        return (PROMPT_TOKENS + COMPLETION_TOKENS) * self.price_per_token

    def answered_ids(self) -> list[str]:
        """The custom_id of every request the fake answered, once per batch that answered it (an id twice: answered by
        two batches)."""
        with self._lock:
            return [
                custom_id
                for b in self.batches.values()
                for custom_id in dict.fromkeys(r["custom_id"] for r in b.results if r.get("response"))
            ]

    # --- the protocol ----------------------------------------------------------------------------------------------

    def new_id(self, prefix: str) -> str:
        return f"{prefix}_{next(self._ids)}"

    def create(self, dialect: str, model: str, requests: list[dict[str, Any]]) -> FakeBatch:
        with self._lock:
            ending = self._script.popleft() if self._script else Complete()
            batch = FakeBatch(self.new_id("batch"), dialect, model, requests, ending)
            self.batches[batch.id] = batch
            return batch

    def poll(self, batch_id: str) -> FakeBatch | None:
        with self._lock:
            batch = self.batches.get(batch_id)
            if batch is None:
                return None
            batch.polls += 1
            if batch.status in ("validating", "in_progress"):
                self._work(batch)
            return batch

    def cancel(self, batch_id: str) -> FakeBatch | None:
        with self._lock:
            batch = self.batches.get(batch_id)
            if batch is not None and batch.status in ("validating", "in_progress"):
                batch.status = "cancelled"
                self.cancelled.append(batch_id)
                self._files_for(batch)
            return batch

    def _work(self, batch: FakeBatch) -> None:
        ending = batch.ending
        if isinstance(ending, Hold) and not batch.released:
            batch.status = "in_progress"
            return
        if isinstance(ending, Fail):
            batch.status = "failed"
            return
        requests = batch.requests
        if isinstance(ending, Partial):
            requests = requests[: max(0, len(requests) - ending.missing)]
        if isinstance(ending, Expire):
            requests = requests[: ending.answered]
        errors = ending.count if isinstance(ending, Errors) else 0
        batch.results = [
            self._error(r["custom_id"], "simulated request error") if n < errors else self._answer(batch, r)
            for n, r in enumerate(requests)
        ]
        if isinstance(ending, Repeat):
            batch.results += batch.results
        batch.status = "expired" if isinstance(ending, Expire) else "completed"
        self._files_for(batch)

    def _files_for(self, batch: FakeBatch) -> None:
        if batch.dialect != "openai":
            return
        answered = [r for r in batch.results if r.get("response")]
        failed = [r for r in batch.results if r.get("error")]
        for lines, attribute in ((answered, "output_file_id"), (failed, "error_file_id")):
            if lines:
                file_id = self.new_id("file")
                self.files[file_id] = "\n".join(json.dumps(line) for line in lines).encode()
                setattr(batch, attribute, file_id)

    @staticmethod
    def _error(custom_id: str, message: str) -> dict[str, Any]:
        return {"custom_id": custom_id, "error": {"code": "request_failed", "message": message}}

    def _answer(self, batch: FakeBatch, request: dict[str, Any]) -> dict[str, Any]:
        custom_id = request["custom_id"]
        url = _image_url(request["body"])
        try:
            with urllib.request.urlopen(url, timeout=30) as response:
                image = response.read()
        except Exception as exc:  # an expired or wrong URL: the request fails, as a provider's would
            return self._error(custom_id, f"the image could not be fetched: {exc}")
        self.fetches += 1
        body = {
            "id": f"gen-{hashlib.sha256(custom_id.encode()).hexdigest()[:12]}",
            "object": "chat.completion",
            "model": batch.model,
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": self.answer(image)}, "finish_reason": "stop"}
            ],
            "usage": {
                "prompt_tokens": PROMPT_TOKENS,
                "completion_tokens": COMPLETION_TOKENS,
                "total_tokens": PROMPT_TOKENS + COMPLETION_TOKENS,
                "cost": self.cost(),
            },
        }
        return {"custom_id": custom_id, "response": {"status_code": 200, "body": body}, "error": None}


def _image_url(body: dict[str, Any]) -> str:
    for message in body.get("messages", []):
        for part in message.get("content", []) if isinstance(message.get("content"), list) else []:
            if isinstance(part, dict) and part.get("type") == "image_url":
                return str(part["image_url"]["url"])
    raise ValueError("the request carries no image_url part")


def _valid_request(request: object, *, urls_only: bool) -> str | None:
    """Why a batch's request is invalid; None when it is valid."""
    if not isinstance(request, dict) or not isinstance(request.get("custom_id"), str):
        return "each request needs a custom_id"
    body = request.get("body")
    if not isinstance(body, dict) or not body.get("model") or not body.get("messages"):
        return "each request needs a body with model and messages"
    try:
        url = _image_url(body)
    except (ValueError, KeyError, TypeError) as exc:
        return str(exc)
    if urls_only and not url.startswith(("http://", "https://")):
        return "image parts must be http(s) URLs; base64 and data: URIs are rejected"
    return None


def _batch_json(batch: FakeBatch) -> dict[str, Any]:
    answered = len({r["custom_id"] for r in batch.results if r.get("response")})
    failed = sum(bool(r.get("error")) for r in batch.results)
    body: dict[str, Any] = {
        "id": batch.id,
        "object": "batch",
        "endpoint": ENDPOINT,
        "status": batch.status,
        "request_counts": {"total": len(batch.requests), "completed": answered, "failed": failed},
    }
    if batch.dialect == "openai":
        body |= {"output_file_id": batch.output_file_id, "error_file_id": batch.error_file_id}
    elif batch.status in ("completed", "expired", "failed", "cancelled"):
        body["results"] = batch.results
    return body


class _Handler(BaseHTTPRequestHandler):
    fake: FakeBatchServer

    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        return

    def _send(self, status: int, body: object, content_type: str = "application/json") -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str) -> None:
        self._send(status, {"error": {"message": message, "type": "invalid_request_error"}})

    def _body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def do_GET(self) -> None:
        parts = self.path.strip("/").split("/")
        if parts[:2] == ["v1", "batches"] and len(parts) == 3:
            return self._poll(parts[2], "openai")
        if parts[:3] == ["v1", "beta", "batches"] and len(parts) == 4:
            return self._poll(parts[3], "openrouter")
        if parts[:2] == ["v1", "files"] and len(parts) == 4 and parts[3] == "content":
            content = self.fake.files.get(parts[2])
            if content is None:
                return self._error(404, f"no file {parts[2]}")
            return self._send(200, content, "application/jsonl")
        return self._error(404, f"no route GET {self.path}")

    def _poll(self, batch_id: str, dialect: str) -> None:
        batch = self.fake.poll(batch_id)
        if batch is None or batch.dialect != dialect:
            return self._error(404, f"no batch {batch_id}")
        return self._send(200, _batch_json(batch))

    def do_POST(self) -> None:
        body = self._body()
        path = self.path.rstrip("/")
        if path == "/v1/files":
            return self._upload(body)
        if path == "/v1/batches":
            return self._create_openai(body)
        if path == "/v1/beta/batches":
            return self._create_openrouter(body)
        parts = path.strip("/").split("/")
        if parts[:2] == ["v1", "batches"] and len(parts) == 4 and parts[3] == "cancel":
            batch = self.fake.cancel(parts[2])
            if batch is None or batch.dialect != "openai":
                return self._error(404, f"no batch {parts[2]}")
            return self._send(200, _batch_json(batch))
        return self._error(404, f"no route POST {self.path}")

    def _upload(self, body: bytes) -> None:
        header = f"Content-Type: {self.headers.get('Content-Type')}\r\n\r\n".encode()
        message = email.parser.BytesParser().parsebytes(header + body)
        fields: dict[str, bytes] = {}
        for part in message.walk():
            name, payload = part.get_param("name", header="content-disposition"), part.get_payload(decode=True)
            if isinstance(name, str) and isinstance(payload, bytes):
                fields[name] = payload
        if fields.get("purpose") != b"batch" or not fields.get("file"):
            return self._error(400, "a batch input file needs purpose=batch and a file")
        file_id = self.fake.new_id("file")
        self.fake.files[file_id] = fields["file"]
        return self._send(200, {"id": file_id, "object": "file", "purpose": "batch"})

    def _refused(self) -> bool:
        """Answer 503 to a batch's creation while the fake is told to refuse them."""
        with self.fake._lock:
            if self.fake.refuse_batches <= 0:
                return False
            self.fake.refuse_batches -= 1
        self._error(503, "the batch service is unavailable")
        return True

    def _create_openai(self, body: bytes) -> None:
        if self._refused():
            return None
        request = json.loads(body)
        content = self.fake.files.get(request.get("input_file_id", ""))
        if content is None:
            return self._error(400, "input_file_id names no uploaded file")
        if request.get("endpoint") != ENDPOINT or request.get("completion_window") != "24h":
            return self._error(400, f"endpoint must be {ENDPOINT} and completion_window 24h")
        lines = [json.loads(line) for line in content.decode().splitlines() if line.strip()]
        for line in lines:
            problem = _valid_request(line, urls_only=False)
            if problem is None and (line.get("method") != "POST" or line.get("url") != ENDPOINT):
                problem = f"each line must be a POST to {ENDPOINT}"
            if problem is not None:
                return self._error(400, problem)
        batch = self.fake.create("openai", lines[0]["body"]["model"] if lines else "", lines)
        return self._send(200, _batch_json(batch))

    def _create_openrouter(self, body: bytes) -> None:
        if self._refused():
            return None
        request = json.loads(body)
        if list(request)[:2] != ["endpoint", "model"] or request.get("endpoint") != ENDPOINT:
            return self._error(400, f"endpoint ({ENDPOINT}) and model must come before requests")
        requests = request.get("requests")
        if not isinstance(requests, list) or not requests:
            return self._error(400, "requests must be a non-empty list")
        for item in requests:
            problem = _valid_request(item, urls_only=True)
            if problem is not None:
                return self._error(400, problem)
        batch = self.fake.create("openrouter", str(request["model"]), requests)
        return self._send(202, _batch_json(batch))


def _handler(fake: FakeBatchServer) -> type[BaseHTTPRequestHandler]:
    return type("Handler", (_Handler,), {"fake": fake})
