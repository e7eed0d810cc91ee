"""Sweeper: recover pages whose worker died, send jobs whose message was lost, finish orphaned documents."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass

from pagescribe.aws import JobMessage, JobQueue
from pagescribe.callbacks import CallbackNotifier
from pagescribe.settings import Settings
from pagescribe.storage import Storage
from pagescribe.transcripts import TranscriptWriter

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SweepReport:
    leases_requeued: int
    leases_failed: int
    jobs_sent: int
    jobs_unsent: int
    documents_finished: int
    callbacks_delivered: int


class Sweeper:
    def __init__(
        self,
        settings: Settings,
        storage: Storage,
        queue: JobQueue,
        transcripts: TranscriptWriter,
        notifier: CallbackNotifier,
    ) -> None:
        self._settings = settings
        self._storage = storage
        self._queue = queue
        self._transcripts = transcripts
        self._notifier = notifier

    def sweep(self) -> SweepReport:
        """One pass; every step takes its rows with FOR UPDATE SKIP LOCKED, so sweepers may overlap."""
        settings, limit = self._settings, self._settings.sweep_batch_size
        requeued = self._storage.requeue_expired_leases(max_attempts=settings.max_attempts, limit=limit)
        failed, documents = self._storage.fail_expired_leases(max_attempts=settings.max_attempts, limit=limit)
        finished = sum(
            self._transcripts.finish(progress.document_id) is not None
            for progress in documents
            if progress.all_pages_done
        )

        due = self._storage.claim_unsent_jobs(resend_after_seconds=settings.resend_after_seconds, limit=limit)
        sent = set(self._queue.send([JobMessage(job_id, doc, page) for job_id, doc, page in due]))
        unsent = [job_id for job_id, _, _ in due if job_id not in sent]
        self._storage.release_unsent_jobs(unsent)

        stuck = self._storage.claim_unfinished_documents(grace_seconds=settings.finish_grace_seconds, limit=limit)
        finished += sum(self._transcripts.finish(document_id) is not None for document_id in stuck)

        delivered = self._notifier.deliver_due(limit=limit)
        report = SweepReport(requeued, failed, len(sent), len(unsent), finished, delivered)
        log.info("sweep done", extra=asdict(report))
        return report
