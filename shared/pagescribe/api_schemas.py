"""The API's request and response bodies (pydantic): what it validates, what docs/openapi.json describes, and what
the client (pagescribe.client) reads. Outside the handlers, and free of the server's runtime, so that the client
imports them without importing the server."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, HttpUrl, field_validator

from pagescribe.domain import CALLBACK_PORTS, callback_port_allowed
from pagescribe.status import DocumentSummary


class CreateDocumentRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    filename: str = Field(min_length=1, max_length=255, description="Name of the file you will upload.")
    content_type: Literal["application/pdf", "image/png", "image/jpeg", "image/tiff", "image/webp"] = Field(
        description="Content-Type header the upload PUT must carry."
    )
    pages: str | None = Field(default=None, max_length=1000, description='Pages to transcribe, e.g. "1-3,7".')
    model: str | None = Field(default=None, min_length=1, max_length=200)
    escalation_model: str | None = Field(
        default=None,
        max_length=200,
        description="A stronger model asked once more for a page whose answer carries a hard flag. Absent: the "
        'stack\'s ESCALATION_MODEL; "": no escalation.',
    )
    prompt: str | None = Field(default=None, min_length=1, max_length=20_000)
    callback_url: HttpUrl | None = Field(
        default=None, description="POSTed a signed JSON summary when the document finishes."
    )
    reuse: bool = Field(
        default=True,
        description="When the same bytes were transcribed for the same model, escalation model, prompt and pages, "
        "reuse that transcript without a model call. false: transcribe again.",
    )
    max_cost_usd: float | None = Field(
        default=None,
        ge=0,
        le=1_000_000,
        description="What the document's model calls may cost in all (USD). A page whose call would exceed it is not "
        "started: it ends SKIPPED (reason: budget) and the document PARTIAL.",
    )
    second_read: Literal["auto", "always", "off"] | None = Field(
        default=None,
        description="A page without a usable text layer is read again by the offline engine while its model call is "
        "in flight, to ground the answer to (block boxes, the ungrounded and missed_text checks). auto: when the CPU "
        "and the time allow; always: whenever the page's time allows; off: never. Absent: the stack's "
        "SECOND_READ.",
    )
    chunks: bool | None = Field(
        default=None,
        description="Write the transcript's chunks for retrieval beside it, <transcript>.chunks.jsonl (a chunk a line, "
        "cut as ?format=chunks cuts them, to CHUNK_MAX_TOKENS and CHUNK_OVERLAP); its key is chunks_key in the "
        "status and the completion callback. Absent: the stack's CHUNKS.",
    )
    merge_tables: bool | None = Field(
        default=None,
        description="Join a table that ends one page to the table that starts the next when their columns agree (the "
        "same number, and the same header where the next page repeats it, which is dropped): one table in the "
        "markdown and the JSON, its rows keeping their pages. false: each page's tables stay its own. Absent: the "
        "stack's MERGE_TABLES (on).",
    )
    furniture: Literal["mark", "drop", "keep"] | None = Field(
        default=None,
        description="How the markdown shows running headers, footers and page numbers: mark (as comments), drop (not "
        "at all: the JSON keeps them as page_header, page_footer and page_number blocks) or keep (as text). Absent: "
        "the stack's FURNITURE (mark).",
    )
    lane: Literal["sync", "batch"] | None = Field(
        default=None,
        description="sync: each page asked of the model as it comes. batch: the pages sent in the provider's batch API "
        "(about half the price, answered within its window, hours): for work nobody waits for. Absent: the stack's "
        "DEFAULT_LANE.",
    )
    deadline: datetime | None = Field(
        default=None,
        description="When the pages must be done by (an ISO 8601 time with its offset, in the future). A batch page "
        "that would miss it is moved to the sync lane in time (BATCH_SYNC_RESERVE_SECONDS before it), paid once.",
    )
    profile: Literal["faithful", "clean"] | None = Field(
        default=None,
        description="faithful: everything on the page as it stands (the stack's PROMPT; furniture marked). clean: "
        "the page for reading and retrieval (a prompt that leaves out running headers, footers and page numbers, "
        "writes tables as HTML and mathematics as LaTeX; furniture dropped). A prompt or furniture given as well "
        "wins. Absent: faithful.",
    )

    @field_validator(
        "model", "escalation_model", "prompt"
    )  # stored as given (the filename is cleaned, pages are parsed)
    @classmethod
    def _no_nul(cls, value: str | None) -> str | None:
        if value is not None and "\x00" in value:  # PostgreSQL text cannot hold NUL
            raise ValueError("must not contain NUL characters")
        return value

    @field_validator("deadline")
    @classmethod
    def _deadline_with_offset(cls, value: datetime | None) -> datetime | None:
        if value is not None and value.utcoffset() is None:
            raise ValueError("must carry its time zone offset (e.g. 2026-01-31T18:00:00Z)")
        return value

    @field_validator("callback_url")
    @classmethod
    def _callback_port(cls, value: HttpUrl | None) -> HttpUrl | None:
        if value is not None and value.port is not None and not callback_port_allowed(value.port):
            raise ValueError(f"port {value.port} is not allowed: {CALLBACK_PORTS}")
        return value


class Estimate(BaseModel):
    model: str
    pages: int | None = Field(description="The pages asked for; null until the upload is read (no pages named).")
    cost_per_page_usd: float | None = Field(
        description="The model's mean cost per page over its latest calls; null without history."
    )
    cost_usd: float | None = Field(description="pages times cost_per_page_usd; null when either is unknown.")
    lane: Literal["sync", "batch"] = Field(
        default="sync", description="The lane priced: batch at BATCH_PRICE_FACTOR of the sync price."
    )
    basis: str = Field(description="What the estimate rests on.")


class CreateDocumentResponse(BaseModel):
    document_id: str
    status: str
    upload_url: str
    upload_method: Literal["PUT"] = "PUT"
    upload_headers: dict[str, str]
    expires_at: datetime
    estimate: Estimate = Field(description="What the document is expected to cost, before it starts.")


class DocumentStatusResponse(DocumentSummary):
    estimate: Estimate


class ListedDocument(BaseModel):
    document_id: str
    filename: str | None
    status: str
    page_count: int
    pages_completed: int
    pages_failed: int
    flagged: int = Field(description="Pages with flags")
    cost: float = Field(
        description="USD, every model call that answered, a call cut at a loop included (at pagescribe's estimate, "
        "marked cost_estimated in the JSON transcript's attempts, where the provider reported no cost)"
    )
    model: str
    created_at: datetime
    finished_at: datetime | None


class DocumentList(BaseModel):
    documents: list[ListedDocument]
    next_cursor: str | None = Field(description="Pass as ?cursor= for the next page; null after the last")


class RerunRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str | None = Field(
        default=None, max_length=200, description="One of ALLOWED_MODELS; the document's if absent"
    )


class RerunResponse(BaseModel):
    document_id: str
    page_number: int
    model: str


MAX_CORRECTION_CHARACTERS = 60_000


class CorrectionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    markdown: str = Field(
        max_length=MAX_CORRECTION_CHARACTERS,
        description='The page\'s corrected text (markdown); "" for a page with no text',
    )

    @field_validator("markdown")
    @classmethod
    def _no_nul(cls, value: str) -> str:
        if "\x00" in value:  # PostgreSQL text cannot hold NUL
            raise ValueError("must not contain NUL characters")
        return value


class CorrectionResponse(BaseModel):
    document_id: str
    page_number: int
    revision: int = Field(description="The page's revisions are numbered 1, 2, ...; the latest one is shown")
    corrected_at: datetime


class PageImageResponse(BaseModel):
    document_id: str
    page_number: int
    url: str = Field(description="GET it, with no API key, to read the image the page was sent to the model as")
    expires_in: int = Field(description="Seconds the url stays valid")


class PageFigure(BaseModel):
    url: str = Field(description="GET it, with no API key, to read the figure (PNG)")
    bbox: list[float] = Field(description="Where it stands on the page image: x0, y0, x1, y1 in pixels, top left")


class PageFiguresResponse(BaseModel):
    document_id: str
    page_number: int
    figures: list[PageFigure] = Field(description="The figures kept from the page, top to bottom")
    expires_in: int = Field(description="Seconds the urls stay valid")


class RetryResponse(BaseModel):
    document_id: str
    pages_requeued: list[int]


class ErrorResponse(BaseModel):
    message: str
    status: str | None = None
    field: str | None = None
