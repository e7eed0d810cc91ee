"""The provider boundary: what a page transcription asks for, what comes back, and how it fails.

Everything the pipeline knows about a vision model goes through :class:`TranscriptionProvider`. The
evidence of one call (tokens, cost, request id, latency, failed requests) travels with its
:class:`Transcription`, never on the shared provider object, so concurrent calls cannot mix it up.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from pagescribe.layout.boxes import TextBox


@dataclass(frozen=True)
class PageImage:
    """One rendered page, as encoded image bytes."""

    data: bytes
    media_type: str  # e.g. "image/jpeg"


@dataclass(frozen=True)
class TranscriptionRequest:
    """Transcribe one page image with one prompt on one model."""

    image: PageImage
    prompt: str
    model: str
    max_output_tokens: int
    document_id: str  # for logs only
    page_number: int  # for logs only
    # the answer so far is a loop: a streamed call is cut (closed) when this says so, and answers with
    # finish_reason pagescribe.domain.LOOP_CUT
    loop_check: Callable[[str], bool] | None = None
    # called when a request of the call is on its way (streamed: its answer has begun), so that work that can wait
    # (rendering the next batch's pages ahead) does not compete with sending it; a provider may never call it
    on_sent: Callable[[], None] | None = None


@dataclass(frozen=True)
class FailedAttempt:
    """One HTTP request of a call that failed and was retried within the call (a 429, a 5xx, a reset...)."""

    status_code: int | None
    message: str
    latency_seconds: float


@dataclass(frozen=True)
class Transcription:
    """A model's answer for one page, with the evidence of the call that produced it."""

    text: str
    finish_reason: str
    model: str  # the model the provider says answered
    prompt_tokens: int | None
    completion_tokens: int | None
    cost: float | None  # USD, as OpenRouter reports it in usage.cost
    request_id: str | None  # the response "id", else the x-request-id header
    latency_seconds: float  # the whole call, retries and backoff included
    confidence: float | None = None  # an OCR engine's mean recognition confidence (0..1); a vision model has none
    rotation: int = 0  # degrees clockwise an OCR engine turned the image it was sent to read it upright
    failed_attempts: tuple[FailedAttempt, ...] = ()  # the requests before the one that answered, which failed
    lines: tuple[TextBox, ...] = ()  # an OCR engine's recognised lines, in pixels of the image it was sent
    cost_estimated: bool = False  # the cost (and tokens the provider did not report) are pagescribe's estimate


class ProviderError(Exception):
    """A transcription failed. ``retryable`` says whether trying the same page again later may help.

    The message is user-facing and carries the provider's own error text when there is one.
    ``retry_after`` is the wait in seconds the provider asked for (``Retry-After``), if it asked.
    ``earlier_attempts``: the requests of the same call that failed before this one and were retried.
    """

    def __init__(
        self,
        message: str,
        *,
        retryable: bool,
        status_code: int | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.retryable = retryable
        self.status_code = status_code
        self.retry_after = retry_after
        self.earlier_attempts: tuple[FailedAttempt, ...] = ()


class TranscriptionProvider(Protocol):
    """A vision model reachable over the network."""

    @property
    def name(self) -> str:
        """Which provider this is, for logs and stored metadata, e.g. "openai-compatible:openrouter.ai"."""
        ...

    def answering_model(self, requested: str) -> str:
        """The model that answers a request for ``requested``: that model, unless the provider runs one of its own
        whatever is asked (the offline OCR engine). Metrics and the ledger name it."""
        ...

    def serving(self, model: str) -> str:
        """The name of the provider that asks ``model``: :attr:`name`, unless this one routes models to several
        (escalation on another provider). The ledger and the rate governor's buckets name it."""
        ...

    async def transcribe(self, request: TranscriptionRequest, *, call_seconds: float) -> Transcription:
        """Transcribe one page, retrying transient failures, finishing within ``call_seconds``.

        Raises :class:`ProviderError` on failure, including when that time runs out.
        """
        ...

    async def aclose(self) -> None:
        """Release the connections; the provider cannot be used afterwards."""
        ...
