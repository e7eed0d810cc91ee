"""Callbacks: the finished-document notifications and their delivery state."""

from __future__ import annotations

from pagescribe.domain import (
    DueCallback,
)
from pagescribe.store.postgres.connection import Connected


class PgCallbacks(Connected):
    """Callbacks of finished documents: taken when due (a fair share per tenant), given back, recorded, abandoned."""

    # A due callback, taken for a while (callback_next_at moves on) so that no one else delivers it meanwhile.
    # At most %(per_tenant)s of each tenant's callbacks in one round, the longest due first: a tenant whose receivers
    # stall fills no more than its share of the round, and every other tenant's due callbacks go in the same round.
    TAKE_DUE_CALLBACKS = """
    WITH ranked AS (
        SELECT id, row_number() OVER (PARTITION BY tenant_id ORDER BY callback_next_at, id) AS place
        FROM documents
        WHERE callback_status = 'PENDING' AND callback_next_at <= now() AND callback_attempts < %(max_attempts)s
    ),
    due AS (
        SELECT id FROM documents
        WHERE id IN (SELECT id FROM ranked WHERE place <= %(per_tenant)s)
          AND callback_status = 'PENDING' AND callback_next_at <= now() AND callback_attempts < %(max_attempts)s
        ORDER BY callback_next_at
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    )
    UPDATE documents
    SET callback_attempts = callback_attempts + 1, callback_next_at = now() + interval '5 minutes'
    WHERE id IN (SELECT id FROM due)
    RETURNING id, callback_url, callback_attempts
    """

    def take_due_callbacks(self, *, limit: int, max_attempts: int, per_tenant: int) -> list[DueCallback]:
        params = {"limit": limit, "max_attempts": max_attempts, "per_tenant": per_tenant}
        rows = self._rows(self.TAKE_DUE_CALLBACKS, params)
        return [DueCallback(str(r.id), r.callback_url, r.callback_attempts) for r in rows]

    # A callback taken for a round that had no time left to start it: its attempt given back, due again at once.
    RELEASE_CALLBACK = """
    UPDATE documents SET callback_attempts = callback_attempts - 1, callback_next_at = now()
    WHERE id = %(document_id)s AND callback_status = 'PENDING' AND callback_attempts > 0
    """

    def release_callback(self, document_id: str) -> None:
        self._rows(self.RELEASE_CALLBACK, {"document_id": document_id})

    # A callback taken as often as it may be and never recorded since (its deliverer died mid-delivery): given up.
    ABANDON_CALLBACKS = """
    UPDATE documents
    SET callback_status = 'FAILED',
        callback_error = concat_ws('; last error: ', 'no delivery recorded after '
                                   || callback_attempts || ' attempts', callback_error)
    WHERE callback_status = 'PENDING' AND callback_attempts >= %(max_attempts)s AND callback_next_at <= now()
    """

    def abandon_callbacks(self, *, max_attempts: int) -> None:
        self._rows(self.ABANDON_CALLBACKS, {"max_attempts": max_attempts})

    RECORD_CALLBACK = """
    UPDATE documents
    SET callback_status = %(status)s, callback_error = %(error)s,
        callback_next_at = now() + make_interval(secs => %(retry_in_seconds)s)
    WHERE id = %(document_id)s AND callback_status = 'PENDING'
    """

    def record_callback(self, document_id: str, *, status: str, error: str | None, retry_in_seconds: float = 0) -> None:
        self._rows(
            self.RECORD_CALLBACK,
            {"document_id": document_id, "status": status, "error": error, "retry_in_seconds": retry_in_seconds},
        )
