"""One SQS batch of page jobs: its messages read, its jobs claimed together, each page transcribed by its message."""

from __future__ import annotations

import contextlib
import json
import logging
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING

from pagescribe.domain import ClaimedJob, Claims, DocumentRecord, PageResult
from pagescribe.observability import count
from pagescribe.timepolicy import Deadline

if TYPE_CHECKING:
    from pagescribe.transcription.transcriber import Transcriber

log = logging.getLogger(__name__)


class MalformedMessageError(ValueError):
    """An SQS message that does not name a job; it can never succeed."""


class JobBusyError(RuntimeError):
    """The job's row stayed held by another transaction through the claim's wait: its message is left for
    redelivery."""


def parse_job_id(body: str) -> str:
    try:
        payload = json.loads(body)
    except json.JSONDecodeError as exc:
        raise MalformedMessageError(f"message body is not JSON: {body[:80]!r}") from exc
    job_id = payload.get("job_id") if isinstance(payload, dict) else None
    try:
        return str(uuid.UUID(str(job_id)))
    except ValueError as exc:
        raise MalformedMessageError(f"message body names no valid job_id: {body[:80]!r}") from exc


class TranscriptionBatch:
    """One SQS batch of page jobs. When its first message is processed, every job of the batch is claimed in
    one statement that reads their documents too (one round trip for the batch, not two per page); each
    message then transcribes its own page. A job named twice, already claimed or finished is a duplicate
    delivery, acknowledged without a model call; a job whose row stayed held by another transaction fails its
    message, which comes back."""

    def __init__(self, transcriber: Transcriber, bodies: Sequence[str], deadline: Deadline) -> None:
        self._transcriber = transcriber
        self._deadline = deadline
        self._job_ids: list[str] = []
        for body in bodies:
            with contextlib.suppress(MalformedMessageError):  # rejected when its own message is processed
                self._job_ids.append(parse_job_id(body))
        self._claims: Claims | None = None
        self._pages: dict[str, list[int]] = {}  # the pages claimed in this batch, by document
        self._open = len(bodies)  # messages not yet transcribed: the last one settles the batch's calls

    def _claim(self, job_id: str) -> tuple[ClaimedJob, DocumentRecord] | None:
        if self._claims is None:
            self._claims = self._transcriber.claim_batch(self._job_ids, self._deadline)
            for claimed in self._claims.claimed.values():
                self._pages.setdefault(claimed.document_id, []).append(claimed.page_number)
        job = self._claims.claimed.pop(job_id, None)
        if job is None:
            if job_id in self._claims.busy:
                log.warning("the job's row is held by another transaction", extra={"job_id": job_id})
                raise JobBusyError(
                    f"job {job_id}: its row stayed held by another transaction through the claim's wait; "
                    "the message is left for redelivery"
                )
            return None
        document = self._claims.documents.get(job.document_id)
        if document is None:  # the foreign key makes this impossible short of manual deletion
            raise LookupError(f"job {job_id} names document {job.document_id}, which does not exist")
        return job, document

    async def transcribe(self, body: str) -> PageResult:
        """Transcribe the page one message names (see ``Transcriber.transcribe_claimed``); the last message of the
        batch settles the batch's calls with the rate governor."""
        try:
            return await self._transcribe(body)
        finally:
            self._open -= 1
            if self._open == 0:
                self._transcriber.settle_calls()

    async def _transcribe(self, body: str) -> PageResult:
        try:
            job_id = parse_job_id(body)
        except MalformedMessageError as exc:
            # It names no job, so no page depends on it; retrying it could only loop.
            log.error("message rejected: %s", exc)
            return PageResult.REJECTED
        claimed = self._claim(job_id)
        if claimed is None:
            log.info("duplicate delivery: job is already claimed or finished", extra={"job_id": job_id})
            count("DuplicateDeliveries")
            return PageResult.DUPLICATE
        job, document = claimed
        batch_pages = self._pages.get(job.document_id, [])
        return await self._transcriber.transcribe_claimed(job, document, self._deadline, batch_pages=batch_pages)
