"""Sweeper: recover pages whose worker died, send jobs whose message was lost, finish orphaned documents, and
account for uploads that failed for good or never came."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING

from pagescribe.aws import FailedInvocations, JobMessage, JobQueue
from pagescribe.callbacks import CallbackNotifier
from pagescribe.domain import DocumentStatus
from pagescribe.settings import Settings
from pagescribe.store.ports import Store
from pagescribe.timepolicy import Deadline

if TYPE_CHECKING:  # the ingestion (and the file formats it reads) loads only when a failed upload is to be recorded
    from pagescribe.batchlane import BatchLane
    from pagescribe.ingestion import Ingestor

Finish = Callable[[str], DocumentStatus | None]  # writes a document's transcript files; None if already finished

log = logging.getLogger(__name__)
SWEEP_MARGIN_SECONDS = 5.0  # the callbacks' round ends this long before the invocation's time is up


@dataclass(frozen=True)
class SweepReport:
    leases_requeued: int
    leases_failed: int
    jobs_sent: int
    jobs_unsent: int
    documents_finished: int
    callbacks_delivered: int
    uploads_failed: int  # objects the upload function gave up on, now FAILED documents
    uploads_expired: int  # API documents whose file never arrived, now FAILED
    batch_pages_moved: int = 0  # batch-lane pages moved to the sync lane (a deadline near, or no batch answered them)
    batches_submitted: int = 0
    batch_pages_submitted: int = 0
    batches_collected: int = 0
    batch_pages_answered: int = 0
    batch_answers_not_kept: int = 0  # answers of pages that had moved on: recorded with their cost, not kept
    batch_pages_waiting: int = 0


class Sweeper:
    def __init__(
        self,
        settings: Settings,
        db: Store,
        queue: JobQueue,
        finish: Finish,
        notifier: CallbackNotifier,
        ingestor: Callable[[], Ingestor],
        failed_uploads: FailedInvocations | None,
        batches: Callable[[], BatchLane] | None = None,
    ) -> None:
        self._settings = settings
        self._db = db
        self._queue = queue
        self._finish = finish
        self._notifier = notifier
        self._ingestor = ingestor
        self._failed_uploads = failed_uploads
        self._batches = batches  # the batch lane, built on the first sweep (None: the provider has no batch API)

    def sweep(self, deadline: Deadline | None = None) -> SweepReport:
        """One pass; every step takes its rows with FOR UPDATE SKIP LOCKED, so sweepers may overlap. With the
        invocation's ``deadline``, the callbacks' round ends SWEEP_MARGIN_SECONDS before it."""
        settings, limit = self._settings, self._settings.sweep_batch_size
        requeued = self._db.requeue_expired_leases(max_attempts=settings.max_attempts, limit=limit)
        failed, documents = self._db.fail_expired_leases(max_attempts=settings.max_attempts, limit=limit)
        finished = sum(
            self._finish(progress.document_id) is not None for progress in documents if progress.all_pages_done
        )

        due = self._db.take_unsent_jobs(resend_after_seconds=settings.resend_after_seconds, limit=limit)
        sent = set(self._queue.send([JobMessage(job_id, doc, page) for job_id, doc, page in due]))
        unsent = [job_id for job_id, _, _ in due if job_id not in sent]
        self._db.release_unsent_jobs(unsent)

        stuck = self._db.take_unfinished_documents(grace_seconds=settings.finish_grace_seconds, limit=limit)
        finished += sum(self._finish(document_id) is not None for document_id in stuck)

        uploads_failed = self._account_for_failed_uploads(limit)
        expired = self._db.expire_awaiting_uploads(
            after_seconds=settings.upload_url_expiry_seconds + settings.upload_grace_seconds,
            error="the upload never arrived: no file came before the upload URL expired "
            f"(UPLOAD_URL_EXPIRY_SECONDS={settings.upload_url_expiry_seconds}, "
            f"UPLOAD_GRACE_SECONDS={settings.upload_grace_seconds})",
            limit=limit,
        )

        # the batch lane takes at most half of what is left of the invocation: the callbacks' round comes after it
        lane_seconds = (deadline.remaining() - SWEEP_MARGIN_SECONDS) / 2 if deadline is not None else None
        batch = self._batches().sweep(lane_seconds) if self._batches is not None else None

        seconds = deadline.remaining() - SWEEP_MARGIN_SECONDS if deadline is not None else None
        delivered = self._notifier.deliver_due(limit=limit, seconds=seconds)
        report = SweepReport(
            requeued, failed, len(sent), len(unsent), finished, delivered, uploads_failed, len(expired)
        )
        if batch is not None:
            report = replace(
                report,
                batch_pages_moved=batch.moved_to_sync,
                batches_submitted=batch.batches_submitted,
                batch_pages_submitted=batch.pages_submitted,
                batches_collected=batch.batches_collected,
                batch_pages_answered=batch.pages_answered,
                batch_answers_not_kept=batch.answers_not_kept,
                batch_pages_waiting=batch.pages_waiting,
            )
        log.info("sweep done", extra=asdict(report))
        return report

    def _account_for_failed_uploads(self, limit: int) -> int:
        """Each object of each event the upload function gave up on (its on-failure destination) becomes a FAILED
        document naming the error, unless it was recorded after all; then the record is deleted."""
        if self._failed_uploads is None:
            return 0
        records = self._failed_uploads.receive(limit)
        if not records:
            return 0
        from pagescribe.ingestion import uploaded_objects

        ingestor, failed = self._ingestor(), 0
        for record in records:
            for uploaded in uploaded_objects(record.event):
                reason = f"the upload function failed on this file and gave up ({record.error})"
                failed += ingestor.reject(uploaded, reason).status == DocumentStatus.FAILED
        self._failed_uploads.delete([record.receipt for record in records])
        return failed
