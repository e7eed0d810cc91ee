"""A client of the pagescribe API, sync (``PagescribeClient``) and async (``AsyncPagescribeClient``), over httpx.

``transcribe(path_or_bytes)`` creates the document, PUTs the file to the presigned URL, waits for it (polling the
status, at the pace a ``Retry-After`` asks for, else backing off to a cap; each status handed to ``on_progress``) and
returns a typed :class:`Transcript`: the markdown, the JSON transcript's pages with their blocks, and its chunks for
retrieval when asked. ``status``, ``list_documents``, ``retry``, ``rerun`` and ``correct`` are the other routes.

Every create carries an ``Idempotency-Key``, one per logical call, sent again on each retry of the request (a
transport error, a 5xx, a 429), so a create whose answer was lost makes one document. A refusal raises
:class:`PagescribeError` with the API's status, message and field. The types are the API's own models
(:mod:`pagescribe.api_schemas`); this module imports nothing of the server's runtime or store, and no Lambda
function imports it. The API key comes from the argument or ``PAGESCRIBE_API_KEY``; the URL from the argument or
``PAGESCRIBE_URL``.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import os
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args

import httpx
from pydantic import BaseModel, ConfigDict, ValidationError

from pagescribe.api_schemas import (
    CorrectionResponse,
    CreateDocumentRequest,
    CreateDocumentResponse,
    DocumentList,
    DocumentStatusResponse,
    RerunResponse,
    RetryResponse,
)

DEFAULT_URL = "http://127.0.0.1:3000"  # `pagescribe serve`'s own default
FINISHED = frozenset({"COMPLETED", "PARTIAL", "FAILED"})
CONTENT_TYPES: tuple[str, ...] = get_args(CreateDocumentRequest.model_fields["content_type"].annotation)
REQUEST_ATTEMPTS = 4  # a request sent at most this many times (transport errors, 5xx, 429)
RETRIED_STATUSES = frozenset({429, 500, 502, 503, 504})
FIRST_POLL_SECONDS = 0.5
MAX_WAIT_SECONDS = 10.0  # no poll or retry waits longer than this, whatever a Retry-After says
_SUFFIXES = {
    ".pdf": "application/pdf",
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".tif": "image/tiff",
    ".tiff": "image/tiff",
    ".webp": "image/webp",
}


class PagescribeError(Exception):
    """A refusal of the API (its HTTP status, message and the field it names), or a document that did not finish."""

    def __init__(self, message: str, *, status_code: int | None = None, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.field = field

    def __str__(self) -> str:
        return f"{self.status_code}: {self.message}" if self.status_code else self.message


class WaitTimeout(PagescribeError):
    """The document was not finished within the wait's timeout; it goes on, and can be waited for again."""


class Block(BaseModel):
    """A block of a page's text (a heading, paragraph, table, list item...), with its box on the page image."""

    model_config = ConfigDict(extra="allow")

    id: str
    type: str
    text: str
    bbox: list[float] | None = None
    level: int | None = None


class TranscriptPage(BaseModel):
    """A page of the JSON transcript: its text, status, flags and blocks (and the rest of its fields, kept)."""

    model_config = ConfigDict(extra="allow")

    page: int
    status: str
    text: str | None
    corrected: bool = False
    error: str | None = None
    flags: list[dict[str, Any]] = []
    blocks: list[Block] = []
    model: str | None = None


class Chunk(BaseModel):
    """A chunk of the transcript for retrieval (``?format=chunks``)."""

    model_config = ConfigDict(extra="allow")

    id: str
    index: int
    heading_path: list[str]
    pages: list[int]
    tokens: int
    text: str
    blocks: list[dict[str, Any]]


class Transcript(BaseModel):
    """A finished document: its status, its markdown, the JSON transcript (``json_transcript``, whole) and its pages,
    and its chunks when they were asked for."""

    document_id: str
    status: DocumentStatusResponse
    markdown: str
    pages: list[TranscriptPage]
    json_transcript: dict[str, Any]
    chunks: list[Chunk] | None = None


ProgressCallback = Callable[[DocumentStatusResponse], object]  # the async client awaits what it returns, if awaitable


@dataclass(frozen=True)
class Upload:
    """A file to transcribe: its bytes, the name it is created under and its content type."""

    content: bytes
    filename: str
    content_type: str


def read_upload(source: str | os.PathLike[str] | bytes, filename: str | None = None) -> Upload:
    """The file at a path, or bytes, with its name and content type (from its first bytes, else its suffix);
    refused when it is none of the types the API takes."""
    if isinstance(source, bytes):
        content, name = source, filename or "document"
    else:
        path = Path(source)
        content, name = path.read_bytes(), filename or path.name
    content_type = sniff_content_type(content) or _SUFFIXES.get(Path(name).suffix.lower())
    if content_type is None:
        raise PagescribeError(f"{name!r} is not a PDF or an image the API takes ({', '.join(CONTENT_TYPES)})")
    if "." not in name:
        name += next(suffix for suffix, kind in _SUFFIXES.items() if kind == content_type)
    return Upload(content, name, content_type)


def sniff_content_type(content: bytes) -> str | None:
    """The content type the file's first bytes show, among those the API takes."""
    if content.startswith(b"%PDF-"):
        return "application/pdf"
    if content.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if content.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if content[:4] in (b"II*\x00", b"MM\x00*"):
        return "image/tiff"
    if content[:4] == b"RIFF" and content[8:12] == b"WEBP":
        return "image/webp"
    return None


def retry_after_seconds(response: httpx.Response) -> float | None:
    """The response's ``Retry-After`` as seconds from now (delay-seconds or an HTTP-date), within the cap."""
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError):
            return None
    return min(max(seconds, 0.0), MAX_WAIT_SECONDS)


def backoff_seconds(attempt: int) -> float:
    """The wait before the ``attempt``-th poll or retry (0-based) when the server named none: doubling to a cap."""
    return min(FIRST_POLL_SECONDS * 2.0 ** min(attempt, 10), MAX_WAIT_SECONDS)


def error_from(response: httpx.Response) -> PagescribeError:
    """The API's refusal as raised: its status, and the message and field of its JSON body."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        field = body.get("field")
        return PagescribeError(
            body["message"], status_code=response.status_code, field=field if isinstance(field, str) else None
        )
    return PagescribeError(response.text[:500] or response.reason_phrase, status_code=response.status_code)


ModelT = TypeVar("ModelT", bound=BaseModel)


def _parsed(response: httpx.Response, model: type[ModelT]) -> ModelT:
    if response.is_error:
        raise error_from(response)
    return model.model_validate_json(response.content)


@dataclass(frozen=True)
class _Request:
    """One API request as built, sent by either client: ``retried`` when it may be sent again after a transport
    error or a 5xx (a read, a PUT, a create with its Idempotency-Key); any request is sent again after a 429 or a
    connection never made."""

    method: str
    url: str
    retried: bool
    json: Any = None
    params: Mapping[str, Any] | None = None
    headers: Mapping[str, str] | None = None
    content: bytes | None = None


def _create_request(upload: Upload, idempotency_key: str, options: Mapping[str, Any]) -> _Request:
    """POST /documents, its body checked by the API's own model before it is sent: what the API would refuse (422)
    is refused here with the message it would give."""
    try:
        body = CreateDocumentRequest.model_validate(
            {"filename": upload.filename, "content_type": upload.content_type, **options}
        )
    except ValidationError as exc:
        problems = [(".".join(str(part) for part in error["loc"]) or "body", error["msg"]) for error in exc.errors()]
        summary = "; ".join(f"{field}: {message}" for field, message in problems)
        raise PagescribeError(f"invalid request: {summary}", status_code=422, field=problems[0][0]) from None
    payload = body.model_dump(mode="json", exclude_unset=True)
    return _Request("POST", "/documents", True, json=payload, headers={"Idempotency-Key": idempotency_key})


def _transcript_request(document_id: str, fmt: Literal["markdown", "json", "chunks"]) -> _Request:
    return _Request("GET", f"/documents/{document_id}/transcript", True, params={"format": fmt})


def _correction_request(document_id: str, page: int, markdown: str) -> _Request:
    return _Request("PUT", f"/documents/{document_id}/pages/{page}/correction", False, json={"markdown": markdown})


def _check_upload(response: httpx.Response) -> None:
    if response.is_error:  # S3's refusal is XML, not the API's JSON
        raise PagescribeError(f"the upload was refused: {response.text[:300]}", status_code=response.status_code)


def _failure(status: DocumentStatusResponse) -> PagescribeError:
    errors = "; ".join(f"page {e.page}: {e.error}" for e in status.page_errors[:5])
    return PagescribeError(f"document {status.document_id} FAILED: {status.error or errors or 'no reason given'}")


def _transcript(
    status: DocumentStatusResponse, markdown: str, document: dict[str, Any], chunks: dict[str, Any] | None
) -> Transcript:
    return Transcript(
        document_id=status.document_id,
        status=status,
        markdown=markdown,
        pages=[TranscriptPage.model_validate(page) for page in document.get("pages", [])],
        json_transcript=document,
        chunks=[Chunk.model_validate(chunk) for chunk in chunks["chunks"]] if chunks is not None else None,
    )


def _poll_pause(response: httpx.Response, attempt: int, deadline: float) -> float | None:
    """How long to wait before the next status poll: what its ``Retry-After`` asked, else the backoff, cut to what is
    left before the ``deadline`` (a ``time.monotonic()``, when the last poll is made); None once it has passed."""
    left = deadline - time.monotonic()
    return min(retry_after_seconds(response) or backoff_seconds(attempt), left) if left > 0 else None


def _should_retry(response: httpx.Response | None, request: _Request, error: Exception | None, attempt: int) -> bool:
    if attempt + 1 >= REQUEST_ATTEMPTS:
        return False
    if response is not None:
        return response.status_code == 429 or (request.retried and response.status_code in RETRIED_STATUSES)
    return request.retried or isinstance(error, httpx.ConnectError | httpx.ConnectTimeout)


def _settings(base_url: str | None, api_key: str | None) -> tuple[str, dict[str, str]]:
    url = (base_url or os.environ.get("PAGESCRIBE_URL") or DEFAULT_URL).rstrip("/")
    key = api_key if api_key is not None else os.environ.get("PAGESCRIBE_API_KEY")
    return url, {"x-api-key": key} if key else {}


class PagescribeClient:
    """The API, synchronously. ``transport``: httpx's (a proxy, a test's); ``timeout``: of each request."""

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = 60.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        url, headers = _settings(base_url, api_key)
        self._http = httpx.Client(base_url=url, headers=headers, timeout=timeout, transport=transport)
        self._uploads = httpx.Client(timeout=timeout, transport=transport)  # the presigned URL takes no API key

    def __enter__(self) -> PagescribeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()
        self._uploads.close()

    def _send(self, request: _Request, http: httpx.Client | None = None) -> httpx.Response:
        http = http or self._http
        for attempt in range(REQUEST_ATTEMPTS):
            try:
                response = http.request(
                    request.method,
                    request.url,
                    json=request.json,
                    params=request.params,
                    headers=request.headers,
                    content=request.content,
                )
            except httpx.TransportError as exc:
                if not _should_retry(None, request, exc, attempt):
                    raise PagescribeError(f"{request.method} {request.url}: {exc!r}") from exc
                time.sleep(backoff_seconds(attempt))
                continue
            if not _should_retry(response, request, None, attempt):
                return response
            time.sleep(retry_after_seconds(response) or backoff_seconds(attempt))
        raise AssertionError("unreachable: the last attempt returns or raises")

    def submit(
        self,
        source: str | os.PathLike[str] | bytes,
        *,
        filename: str | None = None,
        idempotency_key: str | None = None,
        **options: Any,
    ) -> DocumentStatusResponse:
        """Create the document (``options``: the fields of POST /documents: model, pages, chunks, ...) and upload
        the file; its status. The same ``idempotency_key`` again gives the same document, uploaded once."""
        upload = read_upload(source, filename)
        request = _create_request(upload, idempotency_key or str(uuid.uuid4()), options)
        created = _parsed(self._send(request), CreateDocumentResponse)
        status = self.status(created.document_id)
        if status.status == "AWAITING_UPLOAD":
            put = _Request("PUT", created.upload_url, True, headers=created.upload_headers, content=upload.content)
            _check_upload(self._send(put, self._uploads))
            status = self.status(created.document_id)
        return status

    def wait(
        self, document_id: str, *, wait_seconds: float = 600.0, on_progress: ProgressCallback | None = None
    ) -> DocumentStatusResponse:
        """Poll the document's status until it is finished (COMPLETED, PARTIAL or FAILED), each status given to
        ``on_progress``; :class:`WaitTimeout` after ``wait_seconds``."""
        deadline = time.monotonic() + wait_seconds
        for attempt in itertools.count():
            response = self._send(_Request("GET", f"/documents/{document_id}", True))
            status = _parsed(response, DocumentStatusResponse)
            if on_progress is not None:
                on_progress(status)
            if status.status in FINISHED:
                return status
            pause = _poll_pause(response, attempt, deadline)
            if pause is None:
                break
            time.sleep(pause)
        raise WaitTimeout(f"document {document_id} was not finished after {wait_seconds:g} s")

    def transcribe(
        self,
        source: str | os.PathLike[str] | bytes,
        *,
        filename: str | None = None,
        chunks: bool = False,
        wait_seconds: float = 600.0,
        on_progress: ProgressCallback | None = None,
        idempotency_key: str | None = None,
        **options: Any,
    ) -> Transcript:
        """Upload a file (a path, or bytes), wait for it and return its transcript (with its chunks when
        ``chunks``); ``options`` are POST /documents's fields (model, pages, prompt, profile, ...). A document that
        FAILED raises :class:`PagescribeError`."""
        submitted = self.submit(source, filename=filename, idempotency_key=idempotency_key, **options)
        status = self.wait(submitted.document_id, wait_seconds=wait_seconds, on_progress=on_progress)
        if status.status == "FAILED":
            raise _failure(status)
        return self.transcript(status.document_id, chunks=chunks, status=status)

    def transcript(
        self, document_id: str, *, chunks: bool = False, status: DocumentStatusResponse | None = None
    ) -> Transcript:
        """The finished document's transcript: markdown, JSON pages and blocks, and chunks when asked."""
        status = status or self.status(document_id)
        markdown = self.transcript_text(document_id, "markdown")
        document = self._send(_transcript_request(document_id, "json"))
        cut = self._send(_transcript_request(document_id, "chunks")) if chunks else None
        for response in (document, cut):
            if response is not None and response.is_error:
                raise error_from(response)
        return _transcript(status, markdown, document.json(), cut.json() if cut else None)

    def transcript_text(self, document_id: str, fmt: Literal["markdown", "json", "chunks"] = "markdown") -> str:
        """The transcript as the API sends it: markdown, or the JSON transcript or its chunks as JSON text."""
        response = self._send(_transcript_request(document_id, fmt))
        if response.is_error:
            raise error_from(response)
        return response.text

    def status(self, document_id: str) -> DocumentStatusResponse:
        return _parsed(self._send(_Request("GET", f"/documents/{document_id}", True)), DocumentStatusResponse)

    def list_documents(self, *, limit: int = 20, cursor: str | None = None) -> DocumentList:
        params = {"limit": limit, **({"cursor": cursor} if cursor else {})}
        return _parsed(self._send(_Request("GET", "/documents", True, params=params)), DocumentList)

    def retry(self, document_id: str) -> RetryResponse:
        """Requeue the document's FAILED pages."""
        return _parsed(self._send(_Request("POST", f"/documents/{document_id}/retry", False)), RetryResponse)

    def rerun(self, document_id: str, page: int, *, model: str | None = None) -> RerunResponse:
        """Queue one finished page again, on ``model`` if given."""
        request = _Request("POST", f"/documents/{document_id}/pages/{page}/rerun", False, json={"model": model})
        return _parsed(self._send(request), RerunResponse)

    def correct(self, document_id: str, page: int, markdown: str) -> CorrectionResponse:
        """Save a person's text for one page as its next revision."""
        return _parsed(self._send(_correction_request(document_id, page, markdown)), CorrectionResponse)


class AsyncPagescribeClient:
    """The API, asynchronously: the same methods as :class:`PagescribeClient`, awaited."""

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = 60.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        url, headers = _settings(base_url, api_key)
        self._http = httpx.AsyncClient(base_url=url, headers=headers, timeout=timeout, transport=transport)
        self._uploads = httpx.AsyncClient(timeout=timeout, transport=transport)

    async def __aenter__(self) -> AsyncPagescribeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()
        await self._uploads.aclose()

    async def _send(self, request: _Request, http: httpx.AsyncClient | None = None) -> httpx.Response:
        http = http or self._http
        for attempt in range(REQUEST_ATTEMPTS):
            try:
                response = await http.request(
                    request.method,
                    request.url,
                    json=request.json,
                    params=request.params,
                    headers=request.headers,
                    content=request.content,
                )
            except httpx.TransportError as exc:
                if not _should_retry(None, request, exc, attempt):
                    raise PagescribeError(f"{request.method} {request.url}: {exc!r}") from exc
                await asyncio.sleep(backoff_seconds(attempt))
                continue
            if not _should_retry(response, request, None, attempt):
                return response
            await asyncio.sleep(retry_after_seconds(response) or backoff_seconds(attempt))
        raise AssertionError("unreachable: the last attempt returns or raises")

    async def submit(
        self,
        source: str | os.PathLike[str] | bytes,
        *,
        filename: str | None = None,
        idempotency_key: str | None = None,
        **options: Any,
    ) -> DocumentStatusResponse:
        upload = await asyncio.to_thread(read_upload, source, filename)
        request = _create_request(upload, idempotency_key or str(uuid.uuid4()), options)
        created = _parsed(await self._send(request), CreateDocumentResponse)
        status = await self.status(created.document_id)
        if status.status == "AWAITING_UPLOAD":
            put = _Request("PUT", created.upload_url, True, headers=created.upload_headers, content=upload.content)
            _check_upload(await self._send(put, self._uploads))
            status = await self.status(created.document_id)
        return status

    async def wait(
        self, document_id: str, *, wait_seconds: float = 600.0, on_progress: ProgressCallback | None = None
    ) -> DocumentStatusResponse:
        deadline = time.monotonic() + wait_seconds
        for attempt in itertools.count():
            response = await self._send(_Request("GET", f"/documents/{document_id}", True))
            status = _parsed(response, DocumentStatusResponse)
            reported = on_progress(status) if on_progress is not None else None
            if inspect.isawaitable(reported):
                await reported
            if status.status in FINISHED:
                return status
            pause = _poll_pause(response, attempt, deadline)
            if pause is None:
                break
            await asyncio.sleep(pause)
        raise WaitTimeout(f"document {document_id} was not finished after {wait_seconds:g} s")

    async def transcribe(
        self,
        source: str | os.PathLike[str] | bytes,
        *,
        filename: str | None = None,
        chunks: bool = False,
        wait_seconds: float = 600.0,
        on_progress: ProgressCallback | None = None,
        idempotency_key: str | None = None,
        **options: Any,
    ) -> Transcript:
        submitted = await self.submit(source, filename=filename, idempotency_key=idempotency_key, **options)
        status = await self.wait(submitted.document_id, wait_seconds=wait_seconds, on_progress=on_progress)
        if status.status == "FAILED":
            raise _failure(status)
        return await self.transcript(status.document_id, chunks=chunks, status=status)

    async def transcript(
        self, document_id: str, *, chunks: bool = False, status: DocumentStatusResponse | None = None
    ) -> Transcript:
        status = status or await self.status(document_id)
        markdown = await self.transcript_text(document_id, "markdown")
        document = await self._send(_transcript_request(document_id, "json"))
        cut = await self._send(_transcript_request(document_id, "chunks")) if chunks else None
        for response in (document, cut):
            if response is not None and response.is_error:
                raise error_from(response)
        return _transcript(status, markdown, document.json(), cut.json() if cut else None)

    async def transcript_text(self, document_id: str, fmt: Literal["markdown", "json", "chunks"] = "markdown") -> str:
        response = await self._send(_transcript_request(document_id, fmt))
        if response.is_error:
            raise error_from(response)
        return response.text

    async def status(self, document_id: str) -> DocumentStatusResponse:
        return _parsed(await self._send(_Request("GET", f"/documents/{document_id}", True)), DocumentStatusResponse)

    async def list_documents(self, *, limit: int = 20, cursor: str | None = None) -> DocumentList:
        params = {"limit": limit, **({"cursor": cursor} if cursor else {})}
        return _parsed(await self._send(_Request("GET", "/documents", True, params=params)), DocumentList)

    async def retry(self, document_id: str) -> RetryResponse:
        return _parsed(await self._send(_Request("POST", f"/documents/{document_id}/retry", False)), RetryResponse)

    async def rerun(self, document_id: str, page: int, *, model: str | None = None) -> RerunResponse:
        request = _Request("POST", f"/documents/{document_id}/pages/{page}/rerun", False, json={"model": model})
        return _parsed(await self._send(request), RerunResponse)

    async def correct(self, document_id: str, page: int, markdown: str) -> CorrectionResponse:
        return _parsed(await self._send(_correction_request(document_id, page, markdown)), CorrectionResponse)
