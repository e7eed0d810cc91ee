"""Provider batch APIs: pages sent together at the batch price, answered within the batch's window.

Two dialects, one port (``BatchApi``):

* ``openai``: the OpenAI-style file + batch flow that many OpenAI-compatible endpoints serve. The requests go up as a
  JSONL file (``POST /files``, purpose ``batch``); ``POST /batches`` starts the batch on it (endpoint
  ``/v1/chat/completions``, completion window ``24h``); ``GET /batches/{id}`` tells its status and, once it ends,
  its output and error files, read with ``GET /files/{id}/content`` (one JSONL line per request: ``custom_id``,
  ``response`` {``status_code``, ``body``} or ``error``). ``POST /batches/{id}/cancel`` cancels it; an expired or
  cancelled batch still has an output file of the requests it answered.
* ``openrouter``: OpenRouter's batch API as its documentation describes it: ``POST /beta/batches`` with the
  requests inline (``endpoint``, ``model``, then ``requests`` of {``custom_id``, ``body``}), answered 202 with
  status ``validating``; ``GET /beta/batches/{id}`` tells the status and, once it ends, holds the results inline
  (each with exactly one of ``response`` or ``error``). Images must be http(s) URLs (no data URLs), and the API
  offers no cancellation. Assumed here: the paths are relative to the API base URL (``BATCH_BASE_URL`` when not).

In both, a page is sent as a presigned URL of its kept image (OpenAI's chat completions take image URLs as well as
data URLs; OpenRouter's batches take URLs only), which must outlive the batch's window (BATCH_IMAGE_URL_SECONDS).
Calls here are synchronous: the sweeper makes them, one batch at a time, on no event loop.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from pagescribe.providers.base import ProviderError, Transcription
from pagescribe.providers.openai_compat import completion

CHAT_COMPLETIONS = "/v1/chat/completions"
TERMINAL = frozenset({"completed", "failed", "expired", "cancelled"})
_TIMEOUT = httpx.Timeout(30.0, connect=10.0)  # one file of a few hundred requests up or down, within a sweep


class BatchApiError(RuntimeError):
    """The batch API refused or failed a request (the batch is tried again on the sweeper's next pass)."""


@dataclass(frozen=True)
class BatchRequest:
    """One page asked of the model in a batch: ``custom_id`` ties its answer back to it."""

    custom_id: str
    model: str
    prompt: str
    image_url: str
    max_output_tokens: int

    def body(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": self.prompt},
                        {"type": "image_url", "image_url": {"url": self.image_url}},
                    ],
                }
            ],
            "max_tokens": self.max_output_tokens,
            "temperature": 0,
        }


@dataclass(frozen=True)
class BatchAnswer:
    """What a batch said for one request: its answer, or why it has none."""

    custom_id: str
    transcription: Transcription | None
    error: str | None = None


@dataclass(frozen=True)
class SentBatch:
    provider_batch_id: str
    input_file_id: str | None
    status: str


@dataclass(frozen=True)
class BatchView:
    """A batch as the provider tells it: its status and, once it ended, where its answers are."""

    status: str
    output_file_id: str | None = None
    error_file_id: str | None = None
    results: list[dict[str, Any]] = field(default_factory=list)  # inline results (OpenRouter)

    @property
    def ended(self) -> bool:
        return self.status in TERMINAL


class BatchApi(Protocol):
    """A provider's batch API, in one dialect."""

    @property
    def name(self) -> str:
        """The provider as calls are recorded (``attempts.provider``)."""

    @property
    def cancellable(self) -> bool:
        """Whether a batch can be cancelled."""

    def submit(self, model: str, requests: list[BatchRequest], *, window_hours: int) -> SentBatch: ...

    def poll(self, provider_batch_id: str) -> BatchView: ...

    def answers(self, view: BatchView, model: str, *, latency_seconds: float) -> list[BatchAnswer]:
        """The answers of an ended batch, one per request it answered (or failed)."""

    def cancel(self, provider_batch_id: str) -> None: ...

    def close(self) -> None: ...


def _answer(line: dict[str, Any], model: str, latency_seconds: float) -> BatchAnswer | None:
    """One result line as the answer for its request; None for a line that names no request."""
    custom_id = line.get("custom_id")
    if not isinstance(custom_id, str):
        return None
    response, error = line.get("response"), line.get("error")
    if isinstance(response, dict):
        status, body = response.get("status_code", 200), response.get("body")
        if isinstance(status, int) and status >= 400:
            return BatchAnswer(custom_id, None, f"HTTP {status}: {json.dumps(body)[:300]}")
        if isinstance(body, dict):
            try:
                return BatchAnswer(custom_id, completion(body, model, latency_seconds))
            except ProviderError as exc:
                return BatchAnswer(custom_id, None, exc.message)
    reason = json.dumps(error)[:300] if error else "no response in the batch's result"
    return BatchAnswer(custom_id, None, reason)


def _answer_line(text: str, model: str, latency_seconds: float) -> BatchAnswer | None:
    """One JSONL line of a result file as its answer; None for a blank or unreadable line (its request, unanswered,
    is sent again)."""
    try:
        line = json.loads(text) if text.strip() else None
    except ValueError:
        return None
    return _answer(line, model, latency_seconds) if isinstance(line, dict) else None


class _HttpBatchApi:
    def __init__(self, *, base_url: str, api_key: str | None, transport: httpx.BaseTransport | None = None) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(
            base_url=base_url.rstrip("/") + "/", headers=headers, timeout=_TIMEOUT, transport=transport
        )
        url = self._client.base_url
        self._host = url.host + (f":{url.port}" if url.port is not None else "")

    def _call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._client.request(method, path, **kwargs)
        except httpx.RequestError as exc:
            raise BatchApiError(f"{method} {path}: could not reach the batch API ({type(exc).__name__})") from exc
        if not response.is_success:
            raise BatchApiError(f"{method} {path}: HTTP {response.status_code}: {response.text[:300]}")
        return response

    def _json(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        response = self._call(method, path, **kwargs)
        try:
            body = response.json()
        except ValueError as exc:
            raise BatchApiError(f"{method} {path}: the answer is not JSON") from exc
        if not isinstance(body, dict):
            raise BatchApiError(f"{method} {path}: the answer is not a JSON object")
        return body

    def close(self) -> None:
        self._client.close()


def _batch_id(body: dict[str, Any]) -> str:
    batch_id = body.get("id")
    if not isinstance(batch_id, str) or not batch_id:
        raise BatchApiError("the batch API answered with no batch id")
    return batch_id


def _optional_str(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


class OpenAIBatchApi(_HttpBatchApi):
    """The OpenAI-style file + batch flow."""

    cancellable = True

    @property
    def name(self) -> str:
        return f"openai-batch:{self._host}"

    def submit(self, model: str, requests: list[BatchRequest], *, window_hours: int) -> SentBatch:
        lines = [
            {"custom_id": r.custom_id, "method": "POST", "url": CHAT_COMPLETIONS, "body": r.body()} for r in requests
        ]
        content = "\n".join(json.dumps(line, separators=(",", ":")) for line in lines).encode()
        uploaded = self._json(
            "POST", "files", data={"purpose": "batch"}, files={"file": ("batch.jsonl", content, "application/jsonl")}
        )
        file_id = _batch_id(uploaded)
        started = self._json(
            "POST",
            "batches",
            json={"input_file_id": file_id, "endpoint": CHAT_COMPLETIONS, "completion_window": f"{window_hours}h"},
        )
        return SentBatch(_batch_id(started), file_id, str(started.get("status") or "validating"))

    def poll(self, provider_batch_id: str) -> BatchView:
        body = self._json("GET", f"batches/{provider_batch_id}")
        return BatchView(
            str(body.get("status") or "unknown"),
            _optional_str(body.get("output_file_id")),
            _optional_str(body.get("error_file_id")),
        )

    def answers(self, view: BatchView, model: str, *, latency_seconds: float) -> list[BatchAnswer]:
        answers = []
        for file_id in (view.output_file_id, view.error_file_id):
            if file_id is None:
                continue
            for text in self._call("GET", f"files/{file_id}/content").text.splitlines():
                answer = _answer_line(text, model, latency_seconds)
                if answer is not None:
                    answers.append(answer)
        return answers

    def cancel(self, provider_batch_id: str) -> None:
        self._call("POST", f"batches/{provider_batch_id}/cancel")


class OpenRouterBatchApi(_HttpBatchApi):
    """OpenRouter's batch API: the requests inline, the results in the batch; no cancellation."""

    cancellable = False

    @property
    def name(self) -> str:
        return f"openrouter-batch:{self._host}"

    def submit(self, model: str, requests: list[BatchRequest], *, window_hours: int) -> SentBatch:
        # endpoint and model before requests: the API reads the body as a stream
        payload = {
            "endpoint": CHAT_COMPLETIONS,
            "model": model,
            "requests": [{"custom_id": r.custom_id, "body": r.body()} for r in requests],
        }
        started = self._json("POST", "beta/batches", json=payload)
        return SentBatch(_batch_id(started), None, str(started.get("status") or "validating"))

    def poll(self, provider_batch_id: str) -> BatchView:
        body = self._json("GET", f"beta/batches/{provider_batch_id}")
        results = body.get("results")
        return BatchView(str(body.get("status") or "unknown"), results=results if isinstance(results, list) else [])

    def answers(self, view: BatchView, model: str, *, latency_seconds: float) -> list[BatchAnswer]:
        answers = (_answer(line, model, latency_seconds) for line in view.results if isinstance(line, dict))
        return [answer for answer in answers if answer is not None]

    def cancel(self, provider_batch_id: str) -> None:
        raise BatchApiError("OpenRouter's batch API offers no cancellation")


def batch_api(dialect: str, *, base_url: str, api_key: str | None) -> BatchApi:
    """The batch API of ``dialect`` at ``base_url``."""
    if dialect == "openrouter":
        return OpenRouterBatchApi(base_url=base_url, api_key=api_key)
    return OpenAIBatchApi(base_url=base_url, api_key=api_key)
