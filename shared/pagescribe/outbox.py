"""Sending page jobs: only after the rows that say they are due are committed, then stamping the ones sent.

Every place that queues pages (the upload, a retry, a page sent back to wait or to try again) does it this way: a
crash between the commit and the send leaves the jobs unstamped, and the sweeper sends them; a send SQS refuses
leaves them unstamped too. A job is never sent before its row exists, so no message can name a job that is not there.
"""

from __future__ import annotations

from collections.abc import Sequence

from pagescribe.aws import JobMessage, JobQueue
from pagescribe.store.ports import DocumentStore


def send_committed(
    queue: JobQueue, db: DocumentStore, messages: Sequence[JobMessage], *, delay_seconds: int = 0
) -> list[str]:
    """Send the messages of committed jobs, then stamp the ones SQS accepted as sent; their job ids."""
    sent = queue.send(messages, delay_seconds=delay_seconds)
    db.mark_enqueued(sent)
    return sent
