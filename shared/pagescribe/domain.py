"""The words of the domain: statuses, the records that pass between the domain, its database and its handlers, and a
page's result. Plain data only: nothing here talks to PostgreSQL, S3, SQS or a model.

A page is a *job* in the database. Its life: QUEUED → PROCESSING (claimed, with a lease) → COMPLETED, FAILED or
SKIPPED; a document (one uploaded file) is AWAITING_UPLOAD (created through the API), PROCESSING, then COMPLETED,
PARTIAL or FAILED. Each model call is recorded with its outcome: KEPT, ESCALATED or REJECTED when it answered,
LEASE_LOST when its answer came too late to be written, ERROR or RATE_LIMITED when it did not (``AttemptOutcome``).
What one delivery of a page's message came to is a ``PageResult``; what a page's answer was is a ``PageOutcome``.

Glossary (one word per idea; the names of JSON keys, database columns and settings are older and stay as they are):

- *claim*: one hold of a page under a lease, from one delivery of its message. A job's ``attempts`` (column and
  ``ClaimedJob.attempts``) counts its claims; MAX_ATTEMPTS caps them.
- *call*: one model call for a page, within one claim, recorded in the ``attempts`` table (``AttemptRecord``,
  ``AttemptOutcome``); an escalation is a second call in the same claim.
- *request*: one HTTP request of a call; a call retries its failed requests within its time (``FailedAttempt``,
  each recorded as a call that failed).
- *delivery*: one try at a document's completion callback; a document's ``callback_attempts`` counts them,
  CALLBACK_MAX_ATTEMPTS caps them.
- *requeue*: the page sent back to the queue by the pipeline for another claim after a failure that may pass
  (backoff, up to MAX_ATTEMPTS); *defer*: sent back before any call, its claim given back (a gate said wait).
  *retry* is the user's: ``POST /documents/{id}/retry`` queues a finished document's failed pages again
  (``DocumentRecord.retries``); *re-run* queues chosen pages again.
- *transcribe*: a page image into text, by a provider (``TranscriptionProvider.transcribe``: one call); a claimed
  page, from its source to its result (``Transcriber.transcribe_claimed``); one message of a batch
  (``TranscriptionBatch.transcribe``). The transcribe function runs batches; ``pagescribe transcribe`` runs the
  pipeline locally on files. A document's *transcript* is its finished pages written as files (``TranscriptWriter``).
- *budget*: money only, a tenant's daily budget (DAILY_BUDGET_USD) beside a document's cost cap (``max_cost_usd``).
  Time is the invocation's *deadline* (``pagescribe.timepolicy.Deadline``), shared out by the *time policy*;
  MIN_CALL_BUDGET_SECONDS keeps its older name.
- *lane*: how a document's pages are asked of the model: the *sync* lane, a call per claimed page, or the *batch*
  lane, its pages sent together in a *provider batch* (``ProviderBatch``; not an SQS batch) at the provider's batch
  price. A batch-lane page is *parked*: claimed, rendered, its image kept, then waiting PROCESSING under that claim's
  lease for its provider batch's answer (``PageResult.PARKED``, ``BatchPage``); a page *moved to sync* leaves the
  lane for good (``ClaimedJob.lane``).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from enum import StrEnum
from typing import Any, NamedTuple

DEFAULT_TENANT = "default"  # the operator's own tenant: API_KEY's, and the bucket's direct uploads by default


class JobStatus(StrEnum):
    QUEUED = "QUEUED"
    PROCESSING = "PROCESSING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    SKIPPED = "SKIPPED"  # never started: its model call would have exceeded a cost cap or a daily budget


class DocumentStatus(StrEnum):
    AWAITING_UPLOAD = "AWAITING_UPLOAD"
    PROCESSING = "PROCESSING"
    COMPLETED = "COMPLETED"
    PARTIAL = "PARTIAL"
    FAILED = "FAILED"


class CallbackStatus(StrEnum):
    """A document's completion callback (``callback_status``)."""

    PENDING = "PENDING"  # due: to be delivered, or tried again after a backoff
    DELIVERED = "DELIVERED"
    FAILED = "FAILED"  # given up: refused, or tried CALLBACK_MAX_ATTEMPTS times


class EscalationState(StrEnum):
    """A job's escalation (``escalation``; None: it never escalated)."""

    PENDING = "PENDING"  # its answer was hard-flagged: the escalation model's answer is awaited
    DONE = "DONE"  # the page ended after it escalated


class SpendGate(StrEnum):
    """The cost gate's verdict before a call (``SpendVerdict.verdict``)."""

    GO = "GO"
    DEFER = "DEFER"  # the calls in flight may leave room: the page waits in the queue
    CAP = "CAP"  # the document's max_cost_usd would be exceeded
    DAILY_BUDGET = "DAILY_BUDGET"  # the tenant's daily budget would be exceeded


class PageResult(StrEnum):
    """What one delivery of a page's message came to."""

    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    SKIPPED = "SKIPPED"
    REQUEUED = "REQUEUED"
    DEFERRED = "DEFERRED"
    DUPLICATE = "DUPLICATE"
    LEASE_LOST = "LEASE_LOST"
    REJECTED = "REJECTED"
    PARKED = "PARKED"  # rendered and waiting in the batch lane, under its lease, for a provider batch's answer


class NewDocument(NamedTuple):
    bucket: str
    object_key: str
    etag: str
    version_id: str
    size_bytes: int
    model: str
    prompt: str | None = None
    escalation_model: str | None = None
    tenant_id: str = DEFAULT_TENANT
    sha256: bytes | None = None  # of the file's bytes
    chunks: bool = False  # its transcript's chunks for retrieval are written beside it
    merge_tables: bool = True  # tables that cross pages are joined in its transcript
    furniture: str = "mark"  # its running headers, footers and page numbers in the markdown: mark, drop or keep


class ApiKeyRecord(NamedTuple):
    """A tenant's API key as listed: never the key itself, which is stored only as its SHA-256."""

    key_id: str
    tenant_id: str
    label: str  # the key's first characters, to tell keys apart
    created_at: datetime | None
    revoked_at: datetime | None


class Claims(NamedTuple):
    """A batch's claim: the jobs claimed, by id, those whose row another transaction held past the claim's wait
    (``busy``: their messages must come back, not be taken for duplicates), and the records of the claimed jobs'
    documents, by id, read with the claim."""

    claimed: dict[str, ClaimedJob]
    busy: frozenset[str]
    documents: dict[str, DocumentRecord]


class CreatedDocument(NamedTuple):
    document_id: str
    job_ids: tuple[str, ...]
    duplicate: bool
    reused: bool = False  # its pages were copied from a finished document: nothing to queue


class ClaimedJob(NamedTuple):
    job_id: str
    document_id: str
    page_number: int
    attempts: int
    lease_token: str
    escalation: str | None = None  # an EscalationState; PENDING: the page waits for the escalation model's answer
    flags: Sequence[dict[str, Any]] = ()  # the page's flags so far (those of the answer it escalated from)
    slot_in_seconds: float | None = None  # when the governor's slot it reserved comes (negative: passed); None: none
    requested_model: str | None = None  # a re-run's model, instead of the document's
    lane: str | None = None  # a Lane the page was moved to, instead of its document's (SYNC: out of the batch lane)

    @property
    def escalation_pending(self) -> bool:
        return self.escalation == EscalationState.PENDING


def document_of(jobs: Sequence[ClaimedJob]) -> str:
    """The one document whose pages ``jobs`` are (the cost gate passes the pages of one document at once)."""
    documents = {job.document_id for job in jobs}
    if len(documents) != 1:
        raise ValueError(f"one gate passes pages of one document, not of {len(documents)}: {sorted(documents)}")
    return documents.pop()


class DocumentRecord(NamedTuple):
    document_id: str
    bucket: str
    object_key: str
    etag: str
    version_id: str
    size_bytes: int
    kind: str | None
    page_count: int
    status: DocumentStatus
    error: str | None
    model: str
    prompt: str | None
    pages_completed: int
    pages_failed: int
    transcript_key: str | None
    created_at: datetime
    finished_at: datetime | None
    filename: str | None = None
    requested_pages: tuple[int, ...] | None = None
    callback_url: str | None = None
    callback_status: str | None = None  # a CallbackStatus
    callback_error: str | None = None
    escalation_model: str | None = None
    source_page_count: int | None = None  # pages in the file; page_count counts the pages asked for
    retries: int = 0  # how many times POST /retry requeued its failed pages
    tenant_id: str = DEFAULT_TENANT  # whose document it is: only that tenant's keys read or retry it
    reuse: bool = True  # a finished transcript of the same bytes and request may stand in for model calls
    reused_from: str | None = None  # the document whose pages this one's are, copied without a model call
    max_cost_usd: float | None = None  # what its model calls may cost in all; pages beyond it end SKIPPED
    tenant_daily_budget_usd: float | None = None  # its tenant's own daily budget, as it was when the record was read
    second_read: str | None = None  # auto, always or off: its pages' second reads (None: the stack's SECOND_READ)
    chunks: bool = False  # its transcript's chunks for retrieval are written beside it (<transcript>.chunks.jsonl)
    merge_tables: bool = True  # tables that cross pages are joined in its transcript (pagescribe.tables)
    furniture: str = "mark"  # its running headers, footers and page numbers in the markdown: mark, drop or keep
    lane: str | None = None  # a Lane: sync or batch (None: the stack's DEFAULT_LANE)
    deadline: datetime | None = None  # when its pages must be done by: a batch that would miss it is left for sync


class PendingDocument(NamedTuple):
    """A document created through the API, waiting for its upload to ``object_key``."""

    document_id: str
    bucket: str
    object_key: str
    filename: str
    model: str
    prompt: str | None
    requested_pages: tuple[int, ...] | None
    callback_url: str | None
    escalation_model: str | None = None
    tenant_id: str = DEFAULT_TENANT
    reuse: bool = True
    max_cost_usd: float | None = None
    second_read: str | None = None  # auto, always or off; None: the stack's SECOND_READ
    chunks: bool = False  # its transcript's chunks for retrieval are written beside it
    merge_tables: bool = True  # tables that cross pages are joined in its transcript
    furniture: str = "mark"  # its running headers, footers and page numbers in the markdown: mark, drop or keep
    lane: str | None = None  # a Lane (None: the stack's DEFAULT_LANE)
    deadline: datetime | None = None  # when its pages must be done by


class PageSummary(NamedTuple):
    status: JobStatus
    pages: int
    flagged: int
    corrected: int  # pages whose transcript shows a person's correction


class Spend(NamedTuple):
    """Every model call of a document that answered, kept or not."""

    calls: int
    prompt_tokens: int
    completion_tokens: int
    cost: float
    tile_calls: int = 0  # of the calls, those that read one tile of a page read in tiles
    pages_tiled: int = 0  # pages read in tiles


class PageIssue(NamedTuple):
    """A page with an error (its failure, or the reason of its last retry) or flags."""

    page_number: int
    status: JobStatus
    attempts: int
    error: str | None
    flags: list[dict[str, Any]]
    escalated: bool


class DocumentListing(NamedTuple):
    """A document as the tenant's list shows it."""

    document_id: str
    filename: str | None
    status: DocumentStatus
    page_count: int
    pages_completed: int
    pages_failed: int
    flagged: int  # pages with flags
    cost: float  # every model call that answered, kept or not
    model: str
    created_at: datetime
    finished_at: datetime | None


class PageRerunState(NamedTuple):
    """What decides whether a page may be re-run."""

    status: JobStatus
    reruns: int  # the times it was re-run so far
    error: str | None  # why it failed, if it did


class PageImageRecord(NamedTuple):
    """Where the image a page was sent to the model as is kept (None: none was, e.g. it was read from its text
    layer), and the page's status."""

    image_key: str | None
    status: JobStatus


class DueCallback(NamedTuple):
    document_id: str
    url: str
    attempts: int


class PageCorrection(NamedTuple):
    """A person's text for a page, saved as its ``revision`` (1, 2, ... per page) at ``corrected_at``."""

    revision: int
    markdown: str
    corrected_at: datetime


class CorrectionSave(NamedTuple):
    """What saving a correction came to: the document's status as the save found it (None: no such document), and
    the correction saved, None when none was (the document is not finished, or it has no such page)."""

    status: DocumentStatus | None
    saved: PageCorrection | None
    revisions: int | None = None  # set when the page has used its revisions (MAX_PAGE_REVISIONS): how many it has


class TranscriptVersion(NamedTuple):
    """What the transcript files of a finished document are written from, in two values that change whenever it
    does: when the document finished (a re-run reopens it and finishes it again) and how many corrections it has
    (each save adds one; none is ever removed)."""

    finished_at: datetime | None
    corrections: int


class TranscriptState(NamedTuple):
    """A finished document as its transcript files show it, read at one moment: the document, its pages (with their
    current corrections), its calls, and the version of all that."""

    document: DocumentRecord
    pages: list[PageRecord]
    attempts: list[AttemptRecord]
    version: TranscriptVersion


class PageRecord(NamedTuple):
    page_number: int
    status: JobStatus
    attempts: int
    text: str | None
    finish_reason: str | None
    error: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    cost: float | None
    model: str | None
    provider: str | None
    provider_request_id: str | None
    flags: Sequence[dict[str, Any]] = ()
    escalation: str | None = None
    confidence: float | None = None  # the offline engine's mean recognition confidence of the kept answer
    correction: PageCorrection | None = None  # the latest correction made after the page's latest answer
    grounding: dict[str, Any] | None = None  # the kept answer aligned to the page's own text, where it could be
    figures: Sequence[dict[str, Any]] = ()  # the figures cropped from its image and stored: key, bbox (pixels)

    @property
    def current_text(self) -> str | None:
        """The text the transcript shows: the correction's, else the model's answer."""
        return self.correction.markdown if self.correction is not None else self.text


class AttemptRecord(NamedTuple):
    """One model call, as the transcript lists it: one that answered, or one that failed (ERROR, RATE_LIMITED)."""

    page_number: int
    claim: int
    outcome: str  # an AttemptOutcome
    model: str | None
    provider: str | None
    finish_reason: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    cost: float | None
    latency_ms: int | None
    provider_request_id: str | None
    flags: list[dict[str, Any]]
    confidence: float | None = None
    status_code: int | None = None  # a failed call's HTTP status
    error: str | None = None  # a failed call's error
    second_read: dict[str, Any] | None = None  # the offline engine's read of the page during the call, or why none
    cost_estimated: bool = False  # its cost (and tokens the provider did not report) estimated: none came (LOOP_CUT)
    tile: str | None = None  # the tile of the page the call read ("2/4"), when the page was read in tiles


class PageEnd(NamedTuple):
    """A claimed page's completion, to be written under its lease: its answer and the key of the image it was sent as
    (once stored)."""

    job: ClaimedJob
    outcome: PageOutcome
    image_key: str | None = None


class DocumentProgress(NamedTuple):
    document_id: str
    page_count: int
    pages_completed: int
    pages_failed: int

    @property
    def all_pages_done(self) -> bool:
        return self.pages_completed + self.pages_failed >= self.page_count


class AttemptOutcome(StrEnum):
    """What became of one model call (the ``attempts`` table's ``outcome``)."""

    KEPT = "KEPT"  # the page's answer
    ESCALATED = "ESCALATED"  # hard-flagged: the page went on to the escalation model
    REJECTED = "REJECTED"  # the answer the page failed with (truncated, or hard-flagged with no escalation left)
    LEASE_LOST = "LEASE_LOST"  # it answered, but a newer claim owned the page: the answer was not written
    ERROR = "ERROR"  # it failed
    RATE_LIMITED = "RATE_LIMITED"  # it failed with a 429
    LOOP_CUT = "LOOP_CUT"  # closed as it streamed, at the first loop in its answer: the page escalated or failed on it
    TILE = "TILE"  # it read one tile of a page read in tiles (attempts.tile: "2/4")
    TILED = "TILED"  # it read the whole page, whose answer was read again in tiles (truncated, or small print)


# The finish reason of a call cut while it streamed: its answer so far was a loop
LOOP_CUT = "loop"


def recorded_as(outcome: PageOutcome, written: AttemptOutcome) -> AttemptOutcome:
    """How a call whose page write held is recorded: as asked, or LOOP_CUT for a call cut at a loop (whether its page
    escalated or failed on it, the page says; the call's own outcome says it was cut, and paid that far)."""
    return AttemptOutcome.LOOP_CUT if outcome.finish_reason == LOOP_CUT else written


class PageOutcome(NamedTuple):
    """What a page's answer was (success, or failure with whatever text came back) and the flags it raised.
    ``called``: a model call produced it (and is recorded with its cost); a text-layer answer was not paid for."""

    text: str | None
    finish_reason: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    cost: float | None
    model: str | None
    provider: str | None
    provider_request_id: str | None
    latency_ms: int | None = None
    flags: Sequence[dict[str, Any]] = ()  # the answer's own flags
    called: bool = True
    page_flags: tuple[dict[str, Any], ...] | None = None  # the page's, when more than the answer's (an escalation)
    confidence: float | None = None  # an OCR engine's mean recognition confidence
    grounding: dict[str, Any] | None = None  # the answer aligned to the page's own text (pagescribe.grounding)
    second_read: dict[str, Any] | None = None  # what the offline engine read of the page meanwhile, or why not
    cost_estimated: bool = False  # the cost (and tokens the provider did not report) estimated at the tenant's prices


class PricedCall(NamedTuple):
    """One earlier call of a model with the cost its provider reported: what a call's cost is estimated from."""

    prompt_tokens: int
    completion_tokens: int
    cost: float


NO_OUTCOME = PageOutcome(None, None, None, None, None, None, None, None, called=False)


class FailedCall(NamedTuple):
    """A model call that brought no answer back."""

    model: str
    provider: str
    status_code: int | None
    error: str
    latency_ms: int | None


class SpendVerdict(NamedTuple):
    """The cost gate's answer before a call (a ``SpendGate``), with what it was judged on (USD)."""

    verdict: str
    price: float | None  # the mean cost of the tenant's calls of the model; None before its first that reported one
    reserve: float | None  # what the call is held at: its worst case (see ADMIT_SPEND); None while price is
    spent: float  # by the document so far
    max_cost_usd: float | None
    daily_budget_usd: float | None
    spent_today: float  # by the document's tenant, this UTC day


class TenantDay(NamedTuple):
    daily_budget_usd: float | None  # the tenant's own; None: DAILY_BUDGET_USD applies
    spent_usd: float
    calls: int


class RateBucket(NamedTuple):
    """The rate governor's limits for one provider (each model has its own bucket with these limits)."""

    provider: str
    requests_per_minute: float
    tokens_per_minute: float
    burst: float

    def params(self, model: str) -> dict[str, Any]:
        per_second = self.requests_per_minute / 60
        token_rate = self.tokens_per_minute / 60
        return {
            "provider": self.provider,
            "model": model,
            "burst": self.burst,
            "requests_per_second": per_second,
            "tokens_per_second": token_rate,
            # the tokens of the calls a burst lets start at once, a second's worth at least
            "token_burst": token_rate * max(1.0, self.burst / per_second),
        }


class RateGrant(NamedTuple):
    """The governor's answer: start now (wait 0), or wait ``wait`` seconds in the queue, for the slot it reserved
    (``reserved``) or for a 429's pause to end (``paused``)."""

    wait: float
    reserved: bool
    paused: bool
    mean_tokens: float  # the tokens taken for the call: the bucket's observed mean per call
    slot_at: datetime  # when the wait ends, by the database's clock


CALLBACK_PORTS = "80, 443, or 1024 and above"  # a callback never reaches a host's SSH, SMTP, RPC... services


def callback_port_allowed(port: int) -> bool:
    """May a callback be sent to this port (CALLBACK_PORTS)?"""
    return port in (80, 443) or 1024 <= port <= 65535


class Lane(StrEnum):
    """How a document's pages are asked of the model: one call each (SYNC), or in a provider's batch (BATCH), which
    costs less and answers within its window (hours) instead of seconds."""

    SYNC = "sync"
    BATCH = "batch"


class BatchPage(NamedTuple):
    """A page of a provider batch (or waiting for one): its job as claimed when it was parked (``parked``: it still
    waits under that lease, so its answer may be written; otherwise the page moved on and an answer for it is only
    recorded), the model it is asked of, its kept image and what the checks need of its render."""

    job: ClaimedJob
    model: str
    image_key: str | None
    evidence: dict[str, Any]
    parked: bool
    submissions: int  # the batches it was sent in so far


class ProviderBatch(NamedTuple):
    """A batch sent to the provider's batch API (``provider_batches``), until its answers are collected."""

    batch_id: str
    provider_batch_id: str | None
    dialect: str
    model: str
    status: str
    submitted_at: datetime
    expires_at: datetime
    input_file_id: str | None
    output_file_id: str | None
    request_count: int
