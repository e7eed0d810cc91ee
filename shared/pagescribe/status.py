"""What a document looks like from outside: status, progress, per-page errors and flags, tokens and cost. One typed
summary, read by the API's status answer, the completion callback's body and the CLI's progress."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import (
    BaseModel,
    Field,
)

from pagescribe.domain import DocumentRecord, JobStatus
from pagescribe.store.ports import Store


class PageError(BaseModel):
    page: int
    status: str
    attempts: int
    error: str


class Flag(BaseModel):
    flag: Literal[
        "repetition",
        "refusal",
        "empty",
        "blank_render",
        "truncated",
        "ungrounded",
        "missed_text",
        "text_layer_mismatch",
        "low_confidence",
        "rotated",
    ] = Field(
        description="Hard (the answer was not accepted as it is): repetition, refusal, empty, blank_render, "
        "truncated, ungrounded, missed_text. Soft: low_confidence, rotated. text_layer_mismatch is retired (pages "
        "transcribed before ungrounded and missed_text replaced it may still show it)."
    )
    value: float = Field(description="What the check measured.")
    threshold: float = Field(description="The threshold it was measured against.")
    # What the check found, in words (pagescribe.checks.PageFlag): the callback sends it and the CLI prints it; the
    # API's status answer has never had it
    detail: str = Field(default="", exclude=True)

    def as_dict(self) -> dict[str, Any]:
        """The flag as stored (pagescribe.checks.PageFlag.as_dict) and as the callback sends it: its detail only
        where it has one."""
        found: dict[str, Any] = {"flag": self.flag, "value": self.value, "threshold": self.threshold}
        return found | {"detail": self.detail} if self.detail else found


class PageFlags(BaseModel):
    page: int
    status: str
    escalated: bool = Field(description="The page was asked once more, on the escalation model.")
    flags: list[Flag]


class DocumentSource(BaseModel):
    bucket: str
    key: str
    kind: str | None


class DocumentSummary(BaseModel):
    """A document's status, progress, per-page errors and flags, tokens and cost."""

    document_id: str
    status: str
    filename: str
    source: DocumentSource
    model: str
    escalation_model: str | None
    page_count: int
    pages: dict[str, int]
    progress: float
    error: str | None
    page_errors: list[PageError]
    flagged_pages: int = Field(description="Pages whose answer raised at least one flag.")
    corrected_pages: int = Field(
        description="Pages whose transcript shows a person's correction (PUT .../pages/{page}/correction)."
    )
    page_flags: list[PageFlags] = Field(description="The flags of each flagged page.")
    model_calls: int = Field(description="Model calls made, kept, rejected or failed: each is recorded.")
    pages_tiled: int = Field(
        default=0,
        description="Pages read in tiles (TILES): small print at the render's scale, or an answer truncated at the "
        "output limit, read again as overlapping bands rendered larger, one model call each, stitched.",
    )
    tile_calls: int = Field(default=0, description="Of the model calls, those that read one tile of a page.")
    prompt_tokens: int
    completion_tokens: int
    cost: float = Field(description="USD, the sum over every model call of the document, kept or not.")
    max_cost_usd: float | None = Field(description="The document's cost cap, if it has one.")
    lane: str | None = Field(
        default=None,
        description="sync: a model call per page; batch: its pages sent in the provider's batch API at its batch "
        "price. null: the stack's DEFAULT_LANE (a file put straight into the bucket).",
    )
    deadline: datetime | None = Field(
        default=None, description="When its pages must be done by: batch pages that would miss it go to the sync lane."
    )
    batch_pages_waiting: int = Field(
        default=0, description="Pages rendered and waiting in the batch lane: for a batch, or in one sent."
    )
    created_at: datetime
    finished_at: datetime | None
    transcript_key: str | None
    chunks_key: str | None = Field(
        description="Where the transcript's chunks for retrieval are (one JSON object a line), once it is finished "
        "and when they were asked for (chunks in POST /documents, or CHUNKS)."
    )

    @property
    def pages_finished(self) -> int:
        return self.pages[JobStatus.COMPLETED] + self.pages[JobStatus.FAILED] + self.pages[JobStatus.SKIPPED]

    @property
    def pages_not_completed(self) -> int:
        """Pages that ended without a transcript of their own: FAILED or SKIPPED."""
        return self.pages[JobStatus.FAILED] + self.pages[JobStatus.SKIPPED]

    def callback_fields(self) -> dict[str, Any]:
        """The summary as the completion callback's JSON body has always carried it: each flag with its detail where
        it has one, and the timestamps in Python's isoformat (+00:00, where the API's answer has pydantic's Z)."""
        fields = self.model_dump(mode="json")
        fields["created_at"] = self.created_at.isoformat()
        fields["finished_at"] = self.finished_at.isoformat() if self.finished_at else None
        for page, flagged in zip(fields["page_flags"], self.page_flags, strict=True):
            page["flags"] = [flag.as_dict() for flag in flagged.flags]
        return fields


def describe_document(db: Store, document: DocumentRecord) -> DocumentSummary:
    summary = db.page_summary(document.document_id)
    spend = db.spend(document.document_id)
    issues = db.page_issues(document.document_id)
    by_status = {status.value: 0 for status in JobStatus}
    for row in summary:
        by_status[row.status.value] = row.pages
    done = by_status[JobStatus.COMPLETED] + by_status[JobStatus.FAILED] + by_status[JobStatus.SKIPPED]
    return DocumentSummary(
        document_id=document.document_id,
        status=document.status.value,
        filename=document.filename or document.object_key.rsplit("/", 1)[-1],
        source=DocumentSource(bucket=document.bucket, key=document.object_key, kind=document.kind),
        model=document.model,
        escalation_model=document.escalation_model,
        page_count=document.page_count,
        pages=by_status,
        progress=round(done / document.page_count, 4) if document.page_count else 0.0,
        error=document.error,
        page_errors=[
            PageError(page=i.page_number, status=i.status.value, attempts=i.attempts, error=i.error)
            for i in issues
            if i.error is not None
        ],
        flagged_pages=sum(row.flagged for row in summary),
        corrected_pages=sum(row.corrected for row in summary),
        page_flags=[
            PageFlags(
                page=i.page_number,
                status=i.status.value,
                escalated=i.escalated,
                flags=[Flag.model_validate(flag) for flag in i.flags],
            )
            for i in issues
            if i.flags
        ],
        model_calls=spend.calls,
        pages_tiled=spend.pages_tiled,
        tile_calls=spend.tile_calls,
        prompt_tokens=spend.prompt_tokens,
        completion_tokens=spend.completion_tokens,
        cost=round(spend.cost, 8),
        max_cost_usd=document.max_cost_usd,
        lane=document.lane,
        deadline=document.deadline,
        batch_pages_waiting=db.batch_pages_waiting(document.document_id),
        created_at=document.created_at,
        finished_at=document.finished_at,
        transcript_key=document.transcript_key,
        chunks_key=chunks_key(document.transcript_key) if document.chunks and document.transcript_key else None,
    )


def chunks_key(transcript_key: str) -> str:
    """Where a transcript's chunks for retrieval are written, beside its markdown: ``<id>.chunks.jsonl``."""
    return transcript_key.removesuffix(".md") + ".chunks.jsonl"
