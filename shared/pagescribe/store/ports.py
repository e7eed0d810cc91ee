"""The ports of the data-access layer: what each concern keeps, as the use cases see it.

One ``Protocol`` per concern; ``pagescribe.store.postgres`` implements them all on PostgreSQL (``Database``), and the
tests' in-memory store (``tests/support/memory_store``) implements them in the process, held to the same contract
(``tests/contract``). A use case asks for the ports it uses; ``Store`` is all of them, what a function holds.

Every write that ends a page is fenced: it takes effect only for the holder of the page's current lease (the token
of its latest claim), and reports whether it did.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Protocol

from pagescribe.domain import (
    NO_OUTCOME,
    ApiKeyRecord,
    AttemptOutcome,
    AttemptRecord,
    BatchPage,
    ClaimedJob,
    Claims,
    CorrectionSave,
    CreatedDocument,
    DocumentListing,
    DocumentProgress,
    DocumentRecord,
    DocumentStatus,
    DueCallback,
    FailedCall,
    NewDocument,
    PageEnd,
    PageImageRecord,
    PageIssue,
    PageOutcome,
    PageRecord,
    PageRerunState,
    PageSummary,
    PendingDocument,
    PricedCall,
    ProviderBatch,
    RateBucket,
    RateGrant,
    Spend,
    SpendVerdict,
    TenantDay,
    TranscriptState,
    TranscriptVersion,
)


class DocumentStore(Protocol):
    """Documents and their jobs: recorded once per object, read, listed, finished."""

    def create_document(
        self,
        new: NewDocument,
        *,
        kind: str | None,
        pages: Sequence[int],
        source_page_count: int | None = None,
        error: str | None = None,
        pending_id: str | None = None,
        donor_id: str | None = None,
    ) -> CreatedDocument:
        """Record a document and one QUEUED job per page in one transaction; with ``error``, a FAILED
        document and no jobs. The same object (bucket, key, etag, version) is recorded once. With
        ``pending_id``, the document the API created for this upload is the one recorded. ``source_page_count``
        is the file's own page count (``pages`` may be a selection of them). With ``donor_id`` (a finished document
        of the same bytes and request) the jobs are that document's answers, COMPLETED, and nothing is queued."""

    def create_pending_document(self, pending: PendingDocument) -> None: ...

    def find_document(self, new: NewDocument) -> str | None:
        """The id of the document already recorded for this exact object, if any."""

    def find_reusable_document(self, new: NewDocument, pages: Sequence[int]) -> str | None:
        """The tenant's latest finished document of the same bytes, model, escalation model, prompt and pages."""

    def mark_enqueued(self, job_ids: Sequence[str]) -> None: ...

    def get_document(self, document_id: str) -> DocumentRecord | None: ...

    def get_documents(self, document_ids: Sequence[str]) -> dict[str, DocumentRecord]:
        """The records of these documents, in one statement: {document id: record}; unknown ids are absent."""

    def list_documents(
        self, tenant_id: str, *, limit: int, before: tuple[datetime, str] | None = None
    ) -> list[DocumentListing]:
        """The tenant's documents, newest first, up to ``limit``, after ``before`` (created_at, id) if given."""

    def load_pages(self, document_id: str) -> list[PageRecord]:
        """The document's pages in order, each with its current correction, if any."""

    def load_attempts(self, document_id: str) -> list[AttemptRecord]:
        """Every call of the document, answered or failed, by page and in the order they were made."""

    def transcript_version(self, document_id: str) -> TranscriptVersion | None: ...

    def transcript_state(self, document_id: str) -> TranscriptState | None:
        """The finished document, its pages and its calls, read in one short transaction under a share lock of the
        document's row (so at one moment); None when it is not finished (or does not exist)."""

    def finish_document(
        self, document_id: str, *, status: DocumentStatus, error: str | None, transcript_key: str
    ) -> bool:
        """Mark a document whose pages are all terminal as finished; False if it was already finished."""

    def take_unfinished_documents(self, *, grace_seconds: float, limit: int) -> list[str]: ...

    def expire_awaiting_uploads(self, *, after_seconds: float, error: str, limit: int) -> list[str]:
        """End as FAILED with ``error`` the documents still awaiting their upload ``after_seconds`` after creation."""


class PageStore(Protocol):
    """A document's pages: what they show, and the user's retry and re-run."""

    def page_summary(self, document_id: str) -> list[PageSummary]: ...

    def page_issues(self, document_id: str, *, limit: int = 1000) -> list[PageIssue]: ...

    def retry_failed_pages(self, document_id: str, *, max_retries: int) -> list[tuple[str, int]]:
        """Requeue the FAILED pages of a document retried fewer than ``max_retries`` times: (job id, page) of each, to
        be sent after this commit; none when it has none or has used its retries."""

    def rerun_page(
        self, document_id: str, page_number: int, *, model: str | None, max_retries: int, max_page_reruns: int
    ) -> str | None:
        """Queue a finished page again (on ``model``, or the document's), reopening its document and counting one of
        its retries and one of the page's re-runs; its job id, to be sent after this commit, or None when the page
        is not finished (or does not exist), or the document or the page has used its limit."""

    def page_rerun_state(self, document_id: str, page_number: int) -> PageRerunState | None:
        """The page's status, re-runs so far and error; None for no such page."""

    def keep_page_image(self, job: ClaimedJob, image_key: str) -> None: ...

    def keep_figures(self, job: ClaimedJob, figures: list[dict[str, Any]]) -> None: ...

    def page_image(self, document_id: str, page_number: int) -> PageImageRecord | None:
        """The page's status and the key of its kept image (None when none was kept); None for no such page."""

    def page_figures(self, document_id: str, page_number: int) -> list[dict[str, Any]] | None:
        """The figures kept from the page (key, bbox), in order; None for no such page."""


class ClaimStore(Protocol):
    """Claims and leases: who may work on a page, for how long; the resend of lost messages."""

    def claim_jobs(self, job_ids: Sequence[str], *, lease_seconds: float, max_attempts: int) -> Claims:
        """Claim the claimable ones of these jobs (an SQS batch's) in one statement, which reads their documents'
        records too. A job already claimed, finished, out of attempts or unknown is not claimed; a job named twice is
        claimed once. A job whose row another transaction held is claimed once more, waiting for its row
        (CLAIM_JOB_WAITING); one still held after that wait is ``busy``: neither claimed nor a duplicate."""

    def requeue_job(self, job: ClaimedJob, error: str, *, delay_seconds: float) -> bool:
        """Put a page back to QUEUED, due after ``delay_seconds``; False when the lease was lost."""

    def defer_job(
        self, job: ClaimedJob, reason: str, *, delay_seconds: float, slot_at: datetime | None, keep_slot: bool
    ) -> bool:
        """Put a page held back before its call back to QUEUED, due after ``delay_seconds``, giving back its attempt,
        with the governor slot it reserved (``slot_at``; or the one it had, ``keep_slot``); False when the lease was
        lost."""

    def requeue_expired_leases(self, *, max_attempts: int, limit: int) -> int: ...

    def fail_expired_leases(self, *, max_attempts: int, limit: int) -> tuple[int, list[DocumentProgress]]:
        """FAIL the expired leases that used their last attempt: (jobs failed, progress of their documents)."""

    def take_unsent_jobs(self, *, resend_after_seconds: float, limit: int) -> list[tuple[str, str, int]]:
        """(job id, document id, page) of due QUEUED jobs never sent, or sent long ago; stamped as sent."""

    def release_unsent_jobs(self, job_ids: Sequence[str]) -> None: ...


class Ledger(Protocol):
    """The fenced writes that end a page, and every model call recorded with its cost."""

    def complete_job(
        self, job: ClaimedJob, outcome: PageOutcome, *, image_key: str | None = None
    ) -> DocumentProgress | None:
        """Store a page's transcription (and the key of the image it was sent as, once stored) if this worker still
        holds the lease; None when the lease was lost. The call that produced it is recorded either way."""

    def complete_jobs(self, ends: Sequence[PageEnd]) -> list[DocumentProgress | None]:
        """Store the completions of pages of one document together, in one transaction (one round trip where the
        connection allows), in the order given: each one's result as ``complete_job``'s, a later one's progress counting
        the earlier ones. Nothing is written when one of them fails. Raises ValueError for pages of more than one
        document."""

    def fail_job(
        self, job: ClaimedJob, error: str, outcome: PageOutcome = NO_OUTCOME, *, image_key: str | None = None
    ) -> DocumentProgress | None:
        """Mark a page FAILED with its reason (keeping any text, noting the image it was sent as) if this worker holds
        the lease; the call that produced ``outcome`` is recorded either way."""

    def escalate_job(self, job: ClaimedJob, outcome: PageOutcome) -> bool:
        """Record a page's one escalation, keeping the hard-flagged answer it escalates from; False when the lease was
        lost (or the page had escalated already). The call that produced ``outcome`` is recorded either way."""

    def skip_job(self, job: ClaimedJob, reason: str) -> DocumentProgress | None:
        """End a page SKIPPED (not started: a cost cap or a daily budget) if this worker holds the lease."""

    def record_failed_call(self, job: ClaimedJob, failed: FailedCall) -> None:
        """Record a model call that failed (no answer came back), whatever became of the page."""

    def record_call(
        self, job: ClaimedJob, outcome: PageOutcome, recorded_as: AttemptOutcome, *, tile: str | None = None
    ) -> None:
        """Record a model call that answered but is not the page's end (TILE: one tile of a page read in tiles, named
        ``tile`` "2/4"; TILED: the whole-page answer read again in tiles), its cost counted at once."""

    def spend(self, document_id: str) -> Spend: ...


class SpendStore(Protocol):
    """The cost gate, the price estimate and the rate governor's shared buckets."""

    def admit_spends(
        self, jobs: Sequence[ClaimedJob], model: str, *, daily_budget_usd: float | None, max_output_tokens: int
    ) -> list[SpendVerdict]:
        """The cost gate before the model calls of pages of one document (see ADMIT_SPEND): for each, GO, DEFER, CAP
        or DAILY_BUDGET, with the figures. One short transaction (the locks, then each page in turn: its verdict is
        the one a gate of its own would give it just after the pages before it); no lock outlives it."""

    def model_price(self, model: str, tenant_id: str) -> tuple[float | None, int]:
        """The mean cost per call of the model's latest (up to 100) calls for the tenant's documents that reported
        one, and how many."""

    def price_history(self, model: str, tenant_id: str) -> list[PricedCall]:
        """The tenant's latest (up to 100) calls of the model with the tokens and cost their provider reported, newest
        first: the prices a call that reported no cost is estimated at."""

    def set_daily_budget(self, tenant_id: str, usd: float | None) -> bool: ...

    def tenant_day(self, tenant_id: str) -> TenantDay | None:
        """A tenant's daily budget and what it spent today (UTC); None for an unknown tenant."""

    def take_rate_slots(
        self, bucket: RateBucket, model: str, *, prepaid: Sequence[bool], max_wait: float
    ) -> list[RateGrant]:
        """The governor's takes for calls of ``model``, one a page in order (``prepaid``: the page holds its slot
        already), each behind those before it (see TAKE_RATE_SLOTS); the bucket is made on first use."""

    def pause_rate_bucket(self, bucket: RateBucket, model: str, seconds: float) -> None:
        """Hold every environment's calls to ``model`` for ``seconds`` (a 429's Retry-After)."""

    def settle_rate_tokens(self, bucket: RateBucket, model: str, *, calls: Sequence[tuple[float, int]]) -> None:
        """Calls' real tokens against the estimates they took (``calls``: each call's estimate and actual tokens, in
        the order they ended): the bucket owes or is owed the difference, and learns their mean."""


class TenantStore(Protocol):
    """Tenants, their API keys, callback secrets and idempotent answers.

    The operator's administration (``pagescribe tenants``: keys added, listed and revoked, a callback secret, a daily
    budget through ``SpendStore.set_daily_budget``) ships in the layer although only the local command calls it: it is
    SQL, and SQL lives in the data-access layer; the command runs it on the deployed database as the functions do."""

    def ensure_tenant(self, tenant_id: str) -> None: ...

    def tenant_exists(self, tenant_id: str) -> bool: ...

    def add_api_key(self, tenant_id: str, key_hash: bytes, label: str) -> str:
        """Record a key (its hash only) for the tenant, creating the tenant; the key's id."""

    def list_api_keys(self, tenant_id: str | None = None) -> list[ApiKeyRecord]: ...

    def revoke_api_key(self, key: str, tenant_id: str | None = None) -> list[ApiKeyRecord]:
        """Revoke the live keys whose id or label is ``key``; the keys revoked."""

    def find_api_key(self, key_hash: bytes) -> tuple[str, bool] | None:
        """The tenant of the key with this hash and whether it was revoked; None for an unknown key."""

    def any_tenant_key(self) -> bool:
        """Whether any tenant holds a key that is not revoked."""

    def set_callback_secret(self, tenant_id: str, secret: str) -> bool: ...

    def callback_secret(self, tenant_id: str) -> str | None: ...

    def idempotent_answer(self, tenant_id: str, key: str) -> tuple[bytes, dict[str, Any]] | None:
        """The request digest and the answer first given for this Idempotency-Key of the tenant, if any."""

    def remember_answer(
        self, tenant_id: str, key: str, request: bytes, document_id: str, answer: dict[str, Any]
    ) -> bool:
        """Keep the first answer for the key; False when another request with it was first."""


class CallbackStore(Protocol):
    """The callbacks of finished documents and their delivery state."""

    def take_due_callbacks(self, *, limit: int, max_attempts: int, per_tenant: int) -> list[DueCallback]:
        """Take the callbacks due and tried fewer than ``max_attempts`` times, at most ``per_tenant`` of each
        tenant's."""

    def release_callback(self, document_id: str) -> None:
        """Give back a callback taken for a round that could not start it: due again, its attempt not counted."""

    def abandon_callbacks(self, *, max_attempts: int) -> None:
        """End as FAILED the callbacks taken ``max_attempts`` times whose last delivery ran out unrecorded."""

    def record_callback(
        self, document_id: str, *, status: str, error: str | None, retry_in_seconds: float = 0
    ) -> None: ...


class CorrectionStore(Protocol):
    """People's corrections of finished pages, as numbered revisions."""

    def save_correction(
        self, document_id: str, page_number: int, markdown: str, *, max_revisions: int
    ) -> CorrectionSave:
        """Save a person's text for a page of a finished document as the page's next revision, unless it has
        ``max_revisions`` already; the model's answer and the page's attempts are left as they are."""


class BatchStore(Protocol):
    """The batch lane: pages parked under their lease for a provider's batch, the batches sent, and the pages moved
    out of the lane. Every write to a page is fenced by the lease it was parked with."""

    def park_for_batch(
        self, job: ClaimedJob, *, model: str, image_key: str, evidence: dict[str, Any], wait_seconds: float
    ) -> bool:
        """The claimed, rendered page WAITING for a batch of ``model``, its lease held ``wait_seconds``; False when the
        lease was lost."""

    def waiting_models(self, *, limit: int) -> list[str]:
        """The models that pages WAITING for a batch are asked of."""

    def open_batch(
        self, *, dialect: str, model: str, limit: int, window_seconds: float, lease_seconds: float
    ) -> tuple[str, list[BatchPage]] | None:
        """Record a batch of up to ``limit`` of the model's WAITING pages, oldest first, SUBMITTED in it with their
        leases renewed for ``lease_seconds``: its id and pages; None when none waits."""

    def batch_sent(self, batch_id: str, *, provider_batch_id: str, input_file_id: str | None, status: str) -> None: ...

    def batch_not_sent(self, batch_id: str, error: str) -> None:
        """Close a batch the provider did not take; its pages wait again, their submission not counted."""

    def open_batches(self, *, limit: int) -> list[ProviderBatch]:
        """The batches not collected yet, oldest first (one never sent shows once it is stale, to be given up)."""

    def note_batch(self, batch_id: str, *, status: str, output_file_id: str | None) -> None: ...

    def batch_pages(self, batch_id: str) -> list[BatchPage]:
        """Every page sent in the batch; one no longer parked in it carries a token no lease has."""

    def close_batch(self, batch_id: str, *, status: str, answered: int, failed: int) -> bool:
        """Mark the batch collected; False when it was already."""

    def back_to_waiting(self, job: ClaimedJob) -> bool:
        """A parked page its batch did not answer WAITING for the next one; False when the lease was lost."""

    def move_to_sync(self, job: ClaimedJob, reason: str) -> bool:
        """A parked page out of the batch lane, QUEUED to be called on its own (its message to be sent after this
        commit); False when the lease was lost."""

    def due_for_sync(self, *, within_seconds: float, limit: int) -> list[BatchPage]:
        """The lane's parked pages whose document's deadline comes within ``within_seconds``, soonest first."""

    def batch_pages_waiting(self, document_id: str | None = None) -> int:
        """How many pages wait in the batch lane (of the document, or in all)."""


class Store(
    DocumentStore,
    PageStore,
    ClaimStore,
    Ledger,
    SpendStore,
    TenantStore,
    CallbackStore,
    CorrectionStore,
    BatchStore,
    Protocol,
):
    """Every port at once: what a function holds and hands to its use cases."""
