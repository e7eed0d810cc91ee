"""What the REST API does: create a document and its upload URL, list a tenant's documents, report status, serve the
transcript and page images, retry, re-run or correct a page."""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import re
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from http import HTTPStatus
from pathlib import PurePosixPath
from typing import Any, NamedTuple

from pagescribe.aws import JobMessage, JobQueue, ObjectMissingError, ObjectStore
from pagescribe.chunking import DEFAULT_MAX_TOKENS, DEFAULT_OVERLAP, ChunkingError, check_bounds, chunk_transcript
from pagescribe.domain import (
    DocumentListing,
    DocumentRecord,
    DocumentStatus,
    JobStatus,
    Lane,
    PageCorrection,
    PendingDocument,
)
from pagescribe.outbox import send_committed
from pagescribe.settings import CLEAN_PROMPT, Settings
from pagescribe.status import DocumentSummary, describe_document
from pagescribe.store.ports import Store

log = logging.getLogger(__name__)

UPLOAD_CONTENT_TYPES = ("application/pdf", "image/png", "image/jpeg", "image/tiff", "image/webp")
FINISHED = {DocumentStatus.COMPLETED, DocumentStatus.PARTIAL, DocumentStatus.FAILED}
FINISHED_PAGES = {JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.SKIPPED}


class Refused(Exception):
    """The one way a request is refused: the HTTP status that says why, the message, and the fields the error body
    carries besides it (``field``: the offending input; ``status`` and ``detail``: a document not finished). The API
    answers it as it is; the CLI prints its message."""

    def __init__(self, code: HTTPStatus, message: str, **fields: str | None) -> None:
        super().__init__(message)
        self.code = code
        self.fields = {name: value for name, value in fields.items() if value is not None}

    @classmethod
    def invalid(cls, message: str, *, field: str | None = None) -> Refused:
        """A request that cannot be served as asked; ``field`` names the offending input where there is one."""
        return cls(HTTPStatus.UNPROCESSABLE_ENTITY, message, field=field)

    @classmethod
    def not_found(cls, message: str = "no document with this id") -> Refused:
        """An unknown document (or another tenant's: the same answer), or something of it that is not there."""
        return cls(HTTPStatus.NOT_FOUND, message)

    @classmethod
    def conflict(cls, message: str, **fields: str | None) -> Refused:
        """A document or page not in a state to take the request."""
        return cls(HTTPStatus.CONFLICT, message, **fields)

    @classmethod
    def limit(cls, message: str) -> Refused:
        """The document has used its retries (MAX_DOCUMENT_RETRIES), or the page its re-runs (MAX_PAGE_RERUNS) or its
        revisions (MAX_PAGE_REVISIONS)."""
        return cls(HTTPStatus.TOO_MANY_REQUESTS, message)

    def body(self) -> dict[str, str]:
        """The JSON error body: the message, and the fields it has."""
        return {"message": str(self), **self.fields}


MAX_IDEMPOTENCY_KEY = 255


@dataclass(frozen=True)
class NewUpload:
    filename: str
    content_type: str
    pages: str | None = None
    model: str | None = None
    prompt: str | None = None
    callback_url: str | None = None
    escalation_model: str | None = None  # None: the stack's ESCALATION_MODEL; "": no escalation
    reuse: bool = True  # the same bytes for the same request reuse a finished transcript (no model call)
    max_cost_usd: float | None = None  # what the document's model calls may cost in all; pages beyond end SKIPPED
    second_read: str | None = None  # auto, always or off: its scans' second reads (None: the stack's SECOND_READ)
    chunks: bool | None = None  # write its chunks for retrieval beside its transcript (None: the stack's CHUNKS)
    merge_tables: bool | None = None  # join its tables that cross pages (None: the stack's MERGE_TABLES)
    furniture: str | None = None  # mark, drop or keep its running headers and footers (None: the profile's)
    profile: str | None = None  # faithful (None: the stack's PROMPT and FURNITURE) or clean (CLEAN_PROMPT, drop)
    lane: str | None = None  # sync or batch (None: the stack's DEFAULT_LANE)
    deadline: datetime | None = None  # when its pages must be done by


@dataclass(frozen=True)
class Estimate:
    """What a document will cost before it starts: pages times the model's mean cost per page over its latest calls;
    unknown (None) without history, or before the page count is known."""

    model: str
    pages: int | None
    cost_per_page_usd: float | None
    cost_usd: float | None
    basis: str
    lane: str = Lane.SYNC

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def estimate_cost(
    db: Store, model: str, pages: int | None, tenant: str, *, batch_price_factor: float | None = None
) -> Estimate:
    """What ``pages`` pages would cost on ``model``, from the tenant's own calls of it (never another tenant's); with
    ``batch_price_factor``, in the batch lane: the mean price of a sync call times the factor."""
    lane = Lane.SYNC if batch_price_factor is None else Lane.BATCH
    price, calls = db.model_price(model, tenant)
    if price is None:
        unknown = f"unknown: no call of {model} for your documents has reported a cost"
        return Estimate(model, pages, None, None, unknown, lane)
    basis = f"the mean cost per page of your latest {calls} calls of {model}, escalations not counted"
    if batch_price_factor is not None:
        price *= batch_price_factor
        basis += f", at the batch price (BATCH_PRICE_FACTOR {batch_price_factor:g} of it)"
    return Estimate(model, pages, round(price, 8), round(price * pages, 8) if pages is not None else None, basis, lane)


class Described(NamedTuple):
    summary: DocumentSummary
    estimate: Estimate


@dataclass(frozen=True)
class CreatedUpload:
    document_id: str
    key: str
    upload_url: str
    content_type: str
    expires_at: datetime
    estimate: dict[str, Any] | None = None


class TranscriptFormat(StrEnum):
    MARKDOWN = "markdown"
    JSON = "json"
    CHUNKS = "chunks"  # cut from the JSON for retrieval (pagescribe.chunking)


class ChunkBounds(NamedTuple):
    """How chunks are cut: at most ``max_tokens`` each (estimated), ``overlap`` tokens carried into the next."""

    max_tokens: int = DEFAULT_MAX_TOKENS
    overlap: int = DEFAULT_OVERLAP


DEFAULT_CHUNK_BOUNDS = ChunkBounds()


MAX_PAGE_NUMBER = 2**31 - 1  # a page number is a PostgreSQL integer


def _number(text: str) -> bool:
    """ASCII digits only (``str.isdigit`` takes ``²`` too), and few enough of them for ``int`` to read."""
    return text.isascii() and text.isdigit() and len(text) <= 12


def parse_page_selection(spec: str, *, max_pages: int) -> tuple[int, ...]:
    """Pages named like "1-3,7" (1-based, inclusive ranges), sorted and without repeats."""
    pages: set[int] = set()
    for part in spec.replace(" ", "").split(","):
        first, dash, last = part.partition("-")
        if not _number(first) or (dash and not _number(last)):
            raise ValueError(f"invalid page selection {spec!r}: use page numbers and ranges like '1-3,7'")
        start, end = int(first), int(last) if dash else int(first)
        if end > MAX_PAGE_NUMBER:
            raise ValueError(f"invalid page {end} in {spec!r}: page numbers go up to {MAX_PAGE_NUMBER}")
        if start < 1 or end < start:
            raise ValueError(f"invalid page range {part!r} in {spec!r}: pages start at 1 and ranges go upwards")
        if end - start + 1 + len(pages) > max_pages:
            raise ValueError(f"the selection {spec!r} names more than MAX_PAGES={max_pages} pages")
        pages.update(range(start, end + 1))
    return tuple(sorted(pages))


def safe_filename(filename: str) -> str:
    """The last path component, without control characters, so the S3 key stays ours."""
    name = PurePosixPath(filename.replace("\\", "/")).name
    cleaned = "".join(ch for ch in name if ch.isprintable()).strip()
    if cleaned in {"", ".", ".."}:
        raise Refused.invalid(f"filename {filename!r} has no usable name", field="filename")
    return cleaned[:200]


def parse_document_id(document_id: str) -> str | None:
    """The canonical form of an id, or None for anything that is not one (never reaches SQL)."""
    try:
        return str(uuid.UUID(document_id))
    except ValueError:
        return None


MAX_LIST_LIMIT = 100


def _cursor(created_at: datetime, document_id: str) -> str:
    """An opaque position in a tenant's list: after this document."""
    return base64.urlsafe_b64encode(f"{created_at.isoformat()}|{document_id}".encode()).decode().rstrip("=")


def _read_cursor(cursor: str) -> tuple[datetime, str]:
    try:
        created_at, document_id = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode().split("|")
        position = datetime.fromisoformat(created_at), str(uuid.UUID(document_id))
    except ValueError as exc:  # binascii.Error and UnicodeDecodeError are ValueErrors
        raise Refused.invalid(f"cursor {cursor[:60]!r} is not one this API gave", field="cursor") from exc
    if position[0].tzinfo is None:
        raise Refused.invalid(f"cursor {cursor[:60]!r} is not one this API gave", field="cursor")
    return position


class PageImage(NamedTuple):
    url: str  # presigned GET of the kept image
    expires_in: int  # seconds


def _not_available(status: DocumentStatus, detail: str | None) -> Refused:
    """The refusal of a transcript that is not there to read: the document is not finished, or its file is missing."""
    return Refused.conflict(
        f"the document is {status.value}; its transcript is not available", status=status.value, detail=detail
    )


def _no_image_reason(page_number: int, status: JobStatus, keeping: bool) -> str:
    if status in (JobStatus.QUEUED, JobStatus.PROCESSING):
        return f"page {page_number} is {status.value}: its image is kept once it is rendered"
    if status is JobStatus.SKIPPED:
        return f"page {page_number} was SKIPPED before it was rendered"
    if not keeping:
        return f"page {page_number} has no image kept: KEEP_PAGE_IMAGES is off"
    return f"page {page_number} has no image kept: it was not rendered (read from its text layer, or it failed first)"


class DocumentService:
    def __init__(
        self,
        settings: Settings,
        db: Store,
        objects: ObjectStore,
        queue: JobQueue,
        rewrite: Callable[[str], bool],
        callbacks_signed: bool,
    ) -> None:
        self._settings = settings
        self._db = db
        self._objects = objects
        self._queue = queue
        self._rewrite = rewrite  # TranscriptWriter.rewrite, built on the first correction: a cold start skips it
        self._callbacks_signed = callbacks_signed

    def create(self, upload: NewUpload, tenant: str, *, idempotency_key: str | None = None) -> CreatedUpload:
        """Record the tenant's document awaiting its upload and return a presigned PUT URL under
        uploads/<tenant>/<document id>/. With ``idempotency_key``, the first answer given to that key is given again
        (and a different request with it is refused): a client that retries a timed-out request makes one
        document."""
        if idempotency_key is None:
            return self._create(upload, tenant)
        if not 1 <= len(idempotency_key) <= MAX_IDEMPOTENCY_KEY:
            raise Refused.invalid(
                f"Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY} characters, not {len(idempotency_key)}",
                field="Idempotency-Key",
            )
        if not all(" " <= character <= "~" for character in idempotency_key):
            raise Refused.invalid(
                "Idempotency-Key must be printable ASCII (a UUID, say); it holds a control or non-ASCII character",
                field="Idempotency-Key",
            )
        digest = hashlib.sha256(json.dumps(asdict(upload), sort_keys=True, default=str).encode()).digest()
        first = self._db.idempotent_answer(tenant, idempotency_key)
        if first is None:
            created = self._create(upload, tenant)
            answer = {**asdict(created), "expires_at": created.expires_at.isoformat()}
            if self._db.remember_answer(tenant, idempotency_key, digest, created.document_id, answer):
                return created
            first = self._db.idempotent_answer(tenant, idempotency_key)  # a concurrent request was first
            assert first is not None, "the key's answer exists: its insert conflicted"
        request, answer = first
        if request != digest:
            raise Refused.invalid(
                f"Idempotency-Key {idempotency_key!r} was first used with another request; use a new key",
                field="Idempotency-Key",
            )
        return CreatedUpload(**{**answer, "expires_at": datetime.fromisoformat(answer["expires_at"])})

    def _create(self, upload: NewUpload, tenant: str) -> CreatedUpload:
        if upload.content_type not in UPLOAD_CONTENT_TYPES:
            raise Refused.invalid(
                f"content_type {upload.content_type!r} is not supported; use one of {', '.join(UPLOAD_CONTENT_TYPES)}",
                field="content_type",
            )
        requested: tuple[int, ...] | None = None
        if upload.pages:
            try:
                requested = parse_page_selection(upload.pages, max_pages=self._settings.max_pages)
            except ValueError as exc:
                raise Refused.invalid(str(exc), field="pages") from exc
        stack_signs = self._callbacks_signed and tenant == self._settings.default_tenant
        if upload.callback_url and not (stack_signs or self._db.callback_secret(tenant)):
            raise Refused.invalid(
                f"callback_url needs a callback secret: the tenant's own (pagescribe tenants callback-secret --tenant "
                f"{tenant}), or for the default tenant the stack's CALLBACK_SECRET (or CALLBACK_SECRET_PARAMETER), so "
                "that callbacks can be signed",
                field="callback_url",
            )
        allowed = self._settings.model_allow_list
        for name, chosen in (("model", upload.model), ("escalation_model", upload.escalation_model)):
            if chosen and chosen not in allowed:
                raise Refused.invalid(
                    f"{name} {chosen!r} is not allowed on this stack; allowed: {', '.join(sorted(allowed))} "
                    "(the operator sets ALLOWED_MODELS)",
                    field=name,
                )
        escalation_model = self._escalation_model(upload)
        lane = self._lane(upload)
        model = upload.model or self._settings.model
        bucket = self._settings.require("bucket_name")
        document_id = str(uuid.uuid4())
        key = f"{self._settings.upload_prefix}{tenant}/{document_id}/{safe_filename(upload.filename)}"
        self._db.create_pending_document(
            PendingDocument(
                document_id=document_id,
                bucket=bucket,
                object_key=key,
                filename=safe_filename(upload.filename),
                model=model,
                escalation_model=escalation_model,
                prompt=upload.prompt or (CLEAN_PROMPT if upload.profile == "clean" else None),
                requested_pages=requested,
                callback_url=upload.callback_url,
                tenant_id=tenant,
                reuse=upload.reuse,
                max_cost_usd=upload.max_cost_usd,
                second_read=upload.second_read,
                chunks=self._settings.chunks if upload.chunks is None else upload.chunks,
                merge_tables=self._settings.merge_tables if upload.merge_tables is None else upload.merge_tables,
                furniture=upload.furniture or ("drop" if upload.profile == "clean" else self._settings.furniture),
                lane=lane,
                deadline=upload.deadline,
            )
        )
        expires_in = self._settings.upload_url_expiry_seconds
        url = self._objects.presign_put(bucket, key, content_type=upload.content_type, expires_in=expires_in)
        pages = len(requested) if requested else None
        estimate = estimate_cost(self._db, model, pages, tenant, batch_price_factor=self._batch_price(lane))
        return CreatedUpload(
            document_id,
            key,
            url,
            upload.content_type,
            datetime.now(UTC) + timedelta(seconds=expires_in),
            estimate.as_dict(),
        )

    def _lane(self, upload: NewUpload) -> str:
        """The document's lane: the request's, else the stack's DEFAULT_LANE; a deadline must be in the future."""
        lane = upload.lane or self._settings.default_lane
        if lane not in (Lane.SYNC, Lane.BATCH):
            raise Refused.invalid(f"lane {lane!r} is not one of sync, batch", field="lane")
        if lane == Lane.BATCH and not self._settings.has_batch_api:
            raise Refused.invalid(
                "lane 'batch' needs an OpenAI-compatible provider with a batch API; this stack transcribes with "
                f"PROVIDER={self._settings.provider_kind}",
                field="lane",
            )
        deadline = upload.deadline
        if deadline is not None and (deadline.utcoffset() is None or deadline <= datetime.now(UTC)):
            raise Refused.invalid(
                f"deadline {deadline.isoformat()} must be a time in the future, with its offset", field="deadline"
            )
        return lane

    def _batch_price(self, lane: str | None) -> float | None:
        """The factor of the batch price in an estimate of the lane (None for the sync lane)."""
        return self._settings.batch_price_factor if (lane or self._settings.default_lane) == Lane.BATCH else None

    def _escalation_model(self, upload: NewUpload) -> str | None:
        """The model a hard-flagged page of this document goes to: the request's, else the stack's; None for none."""
        model = self._settings.escalation_model if upload.escalation_model is None else upload.escalation_model
        if model and self._settings.uses_offline_provider:
            raise Refused.invalid(
                f"escalation_model {model!r} needs a vision model provider; this stack transcribes with the offline "
                "OCR engine, which has no stronger model to ask",
                field="escalation_model",
            )
        return model or None

    def _find(self, document_id: str, tenant: str) -> DocumentRecord | None:
        """The tenant's document with this id; None for another tenant's, as for an unknown id."""
        canonical = parse_document_id(document_id)
        document = self._db.get_document(canonical) if canonical else None
        return document if document is not None and document.tenant_id == tenant else None

    def _document(self, document_id: str, tenant: str) -> DocumentRecord:
        """The tenant's document with this id; refused (404) for another tenant's, as for an unknown id."""
        document = self._find(document_id, tenant)
        if document is None:
            raise Refused.not_found()
        return document

    def describe(self, document_id: str, tenant: str) -> Described:
        """The document's summary and what it is expected to cost."""
        document = self._document(document_id, tenant)
        pages = document.page_count if document.status is not DocumentStatus.AWAITING_UPLOAD else None
        factor = self._batch_price(document.lane)
        estimate = estimate_cost(self._db, document.model, pages, tenant, batch_price_factor=factor)
        return Described(describe_document(self._db, document), estimate)

    def transcript(
        self, document_id: str, fmt: TranscriptFormat, tenant: str, bounds: ChunkBounds = DEFAULT_CHUNK_BOUNDS
    ) -> str:
        """The finished document's transcript: markdown, JSON, or the JSON's chunks for retrieval cut to ``bounds``
        (a refusal names a bound that cannot be cut to); refused (409) while the document is not finished."""
        if fmt is TranscriptFormat.CHUNKS:
            try:
                check_bounds(*bounds)
            except ChunkingError as exc:
                raise Refused.invalid(str(exc), field=exc.field) from exc
        document = self._document(document_id, tenant)
        if document.status not in FINISHED or document.transcript_key is None:
            raise _not_available(document.status, document.error)
        key = document.transcript_key
        if fmt is not TranscriptFormat.MARKDOWN:
            key = key.removesuffix(".md") + ".json"
        try:
            body = self._objects.get_text(document.bucket, key)
        except ObjectMissingError:
            raise _not_available(document.status, "the transcript file is missing from the bucket") from None
        if fmt is TranscriptFormat.CHUNKS:
            chunks = chunk_transcript(json.loads(body), tenant_id=document.tenant_id, **bounds._asdict())
            body = json.dumps({"document_id": document_id, **bounds._asdict(), "chunks": chunks}, ensure_ascii=False)
        return body

    def list_documents(
        self, tenant: str, *, limit: int, cursor: str | None
    ) -> tuple[list[DocumentListing], str | None]:
        """The tenant's documents, newest first, ``limit`` at a time from ``cursor`` (the last answer's
        ``next_cursor``); and the cursor of the next page, None after the last."""
        if not 1 <= limit <= MAX_LIST_LIMIT:
            raise Refused.invalid(f"limit must be between 1 and {MAX_LIST_LIMIT}, not {limit}", field="limit")
        listed = self._db.list_documents(tenant, limit=limit + 1, before=_read_cursor(cursor) if cursor else None)
        if len(listed) <= limit:
            return listed, None
        last = listed[limit - 1]
        return listed[:limit], _cursor(last.created_at, last.document_id)

    def rerun_page(self, document_id: str, page_number: int, tenant: str, *, model: str | None) -> str:
        """Queue one finished page again, on ``model`` if given (one of the allowed models), and send it after the
        commit; its earlier attempts and their costs are kept. The model it is queued for."""
        document = self._document(document_id, tenant)
        allowed = self._settings.model_allow_list
        if model is not None and model not in allowed:
            raise Refused.invalid(
                f"model {model!r} is not allowed on this stack; allowed: {', '.join(sorted(allowed))} "
                "(the operator sets ALLOWED_MODELS)",
                field="model",
            )
        self._check_rerun(document, page_number)
        job_id = self._db.rerun_page(
            document.document_id,
            page_number,
            model=model,
            max_retries=self._settings.max_document_retries,
            max_page_reruns=self._settings.max_page_reruns,
        )
        if job_id is None:  # a concurrent re-run or retry got there first: say what it left
            self._check_rerun(self._find(document_id, tenant) or document, page_number)
            raise Refused.conflict(f"page {page_number} changed while it was being queued again; try again")
        send_committed(self._queue, self._db, [JobMessage(job_id, document.document_id, page_number)])
        return model or document.model

    def _check_rerun(self, document: DocumentRecord, page_number: int) -> None:
        """Refused when the page may not be re-run now: it is missing (404), not finished or failed on a render
        limit still set as it was (409), or the document or the page has used its limit (429)."""
        page = self._db.page_rerun_state(document.document_id, page_number)
        if page is None:
            raise Refused.not_found(f"the document has no page {page_number}")
        if page.status not in FINISHED_PAGES:
            raise Refused.conflict(f"page {page_number} is {page.status.value}: only a finished page is re-run")
        limit = self._settings.max_document_retries
        if document.retries >= limit:
            raise Refused.limit(
                f"the document's pages were queued again {document.retries} times (retries and re-runs); the limit "
                f"is MAX_DOCUMENT_RETRIES={limit}"
            )
        if page.reruns >= self._settings.max_page_reruns:
            raise Refused.limit(
                f"page {page_number} was re-run {page.reruns} times; the limit is "
                f"MAX_PAGE_RERUNS={self._settings.max_page_reruns}"
            )
        blown = _render_limit(page.error, self._settings) if page.status is JobStatus.FAILED else None
        if blown is not None:
            raise Refused.conflict(
                f"page {page_number} failed on {blown} ({page.error}); re-rendered under the same limit it would fail "
                "the same way: it is re-run once the operator has raised that limit",
            )

    def correct_page(self, document_id: str, page_number: int, markdown: str, tenant: str) -> PageCorrection:
        """Save a person's text for one page of a finished document as the page's next revision, then write the
        transcript files again to show it. The model's answer and the page's attempts are kept (the JSON gives the
        answer as the correction's ``original_text``); the document's status is unchanged. The revision saved."""
        document = self._document(document_id, tenant)
        limit = self._settings.max_page_revisions
        save = self._db.save_correction(document.document_id, page_number, markdown, max_revisions=limit)
        if save.status is None:
            raise Refused.not_found()
        if save.revisions is not None:
            raise Refused.limit(
                f"page {page_number} has {save.revisions} corrections; the limit is MAX_PAGE_REVISIONS={limit}"
            )
        if save.saved is None and save.status not in FINISHED:
            raise Refused.conflict(
                f"the document is {save.status.value}: only a finished document's pages are corrected"
            )
        if save.saved is None:
            raise Refused.not_found(f"the document has no page {page_number}")
        rewritten = self._rewrite(document.document_id)
        log.info(
            "page corrected",
            extra={
                "document_id": document.document_id,
                "page": page_number,
                "revision": save.saved.revision,
                "transcript_rewritten": rewritten,
            },
        )
        return save.saved

    def page_image(self, document_id: str, page_number: int, tenant: str) -> PageImage:
        """A short-lived link to the image the page was sent to the model as; refused (404) saying why there is
        none."""
        document = self._document(document_id, tenant)
        page = self._db.page_image(document.document_id, page_number)
        if page is None:
            raise Refused.not_found(f"the document has no page {page_number}")
        if page.image_key is None:
            raise Refused.not_found(_no_image_reason(page_number, page.status, self._settings.keep_page_images))
        expires_in = self._settings.image_url_expiry_seconds
        url = self._objects.presign_get(document.bucket, page.image_key, expires_in=expires_in)
        return PageImage(url, expires_in)

    def page_figures(self, document_id: str, page_number: int, tenant: str) -> tuple[list[dict[str, Any]], int]:
        """Short-lived links to the figures kept from the page (each with its box on the page image), and how long
        they last; refused (404) for an unknown page as for an unknown document."""
        document = self._document(document_id, tenant)
        figures = self._db.page_figures(document.document_id, page_number)
        if figures is None:
            raise Refused.not_found()
        expires_in = self._settings.image_url_expiry_seconds
        return [
            {
                "url": self._objects.presign_get(document.bucket, figure["key"], expires_in=expires_in),
                "bbox": figure["bbox"],
            }
            for figure in figures
        ], expires_in

    def retry(self, document_id: str, tenant: str) -> list[int]:
        """Requeue the FAILED pages and send them (after the commit); the pages retried (refused when there are
        none)."""
        document = self._document(document_id, tenant)
        limit = self._settings.max_document_retries
        if document.retries >= limit:
            raise Refused.limit(
                f"the document's failed pages were retried {document.retries} times; the limit is "
                f"MAX_DOCUMENT_RETRIES={limit}"
            )
        retried = self._db.retry_failed_pages(document.document_id, max_retries=limit)
        if not retried:
            raise Refused.conflict("the document has no FAILED pages to retry")
        send_committed(
            self._queue, self._db, [JobMessage(job_id, document.document_id, page) for job_id, page in retried]
        )
        return [page for _, page in retried]


def _render_limit(error: str | None, settings: Settings) -> str | None:
    """The stack's render limit that a page's failure names, as it is set now (None: none, or one since changed)."""
    limits = (
        f"RENDER_MEMORY_LIMIT_MB={settings.render_memory_limit_mb}",
        f"RENDER_TIMEOUT_SECONDS={settings.render_timeout_seconds:g}",
        f"MAX_IMAGE_PIXELS={settings.max_image_pixels}",
    )
    return next((limit for limit in limits if error and re.search(re.escape(limit) + r"(?![\d.])", error)), None)
