"""The engine and the one way every statement runs: on the pool's psycopg connection, run again once on a fresh
connection when the server had closed the one it was given.

PostgreSQL only, in every mode (RDS/Aurora behind RDS Proxy, CI's server, the embedded server of the local
commands). Nothing here pins a proxied session: psycopg's automatic prepared statements are off, no ``SET``,
no advisory locks, no temporary tables. Every transaction is one short unit of work; none is ever open
while a model call runs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import psycopg
from psycopg.pq import ExecStatus, TransactionStatus
from psycopg.rows import namedtuple_row
from sqlalchemy import Engine, create_engine
from sqlalchemy.pool import QueuePool

log = logging.getLogger(__name__)

T = TypeVar("T")


def create_database_engine(url: str, *, pool_size: int = 1) -> Engine:
    """A tiny pool suited to Lambda behind RDS Proxy: autocommit connections, no prepared statements.

    SQLAlchemy keeps the pool (and Alembic the migrations); ``Database`` runs its statements on the pooled
    psycopg connections directly. Connections are not pinged before use: a connection found dead is replaced
    and its statement run once more (see ``Database._rows``), which costs a round trip only when one died."""
    return create_engine(
        url,
        pool_size=pool_size,
        max_overflow=0,
        pool_pre_ping=False,
        pool_recycle=300,
        pool_timeout=30,
        isolation_level="AUTOCOMMIT",
        connect_args={"prepare_threshold": None, "connect_timeout": 10, "application_name": "pagescribe"},
    )


_Work = Callable[[psycopg.Connection[Any]], T]


def _returns_rows(cursor: psycopg.Cursor[Any]) -> bool:
    """Whether the cursor's statement returned rows (none, or some), as ``cursor.description is not None`` says,
    without building a description of each column: a claim's 25 columns cost more client CPU than its row."""
    result = cursor.pgresult
    return result is not None and result.status == ExecStatus.TUPLES_OK


class Connected:
    """What every store of the data-access layer shares: each of its methods is one statement (one round trip,
    autocommitted) or one short transaction.

    Statements run on the pool's psycopg connection itself: SQLAlchemy's statement layer would cost more
    client CPU than the database spends on a claim. A connection the server closed (a restart, a failover,
    RDS Proxy's idle timeout while the environment was frozen) is found on use, not by a ping before every
    call: it is dropped from the pool and the work runs once more on a fresh connection. Running it again is
    safe for every statement here: the connection died before the answer came back, so either nothing was
    done, or it was done and the repeat finds the rows already moved (a claim finds the job leased, a fenced
    write finds the lease gone, an insert finds the row) and changes nothing."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def _with_connection(self, work: _Work[T]) -> T:
        # A pool of n may hold n dead connections (a restarted server killed them all): each is found and
        # dropped in turn, then a fresh one is made. Failing to connect raises at once.
        pool = self.engine.pool
        attempts = (pool.size() if isinstance(pool, QueuePool) else 1) + 1
        for attempt in range(1, attempts + 1):
            pooled = self.engine.raw_connection()
            try:
                connection = pooled.driver_connection
                assert isinstance(connection, psycopg.Connection)
                try:
                    return work(connection)
                except psycopg.OperationalError as exc:
                    if not connection.broken or attempt == attempts:
                        raise
                    pooled.invalidate(exc)
                    log.warning("database connection lost (%s); running the statement on a new connection", exc)
            finally:
                pooled.close()
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _rows(self, statement: str, params: dict[str, Any]) -> list[Any]:
        """Run one statement in autocommit: its rows (none for a statement that returns none)."""

        def run(connection: psycopg.Connection[Any]) -> list[Any]:
            with connection.cursor(row_factory=namedtuple_row) as cursor:
                cursor.execute(statement, params)
                return cursor.fetchall() if _returns_rows(cursor) else []

        return self._with_connection(run)

    def _row(self, statement: str, params: dict[str, Any]) -> Any | None:
        rows = self._rows(statement, params)
        return rows[0] if rows else None

    def _in_one_transaction(self, statements: Sequence[str], params: dict[str, Any]) -> list[Any]:
        """Run ``statements`` in one transaction and one round trip (``_each_in_one_transaction``, each with
        ``params``): the rows of the last. Each statement still reads with a snapshot of its own, taken when it starts
        (READ COMMITTED), as when they are sent one by one: a statement after a lock reads what the lock's holder
        committed."""
        return self._each_in_one_transaction([(statement, params) for statement in statements])[-1]

    def _each_in_one_transaction(self, runs: Sequence[tuple[str, dict[str, Any]]]) -> list[list[Any]]:
        """Run each statement with its own parameters, in one transaction and one round trip: each one's rows.

        BEGIN, the statements and COMMIT go as one query string (the simple query protocol, so the parameters are bound
        here, by psycopg's ClientCursor). A failed statement ends the string; its transaction is rolled back here."""

        def run(connection: psycopg.Connection[Any]) -> list[list[Any]]:
            try:
                with psycopg.ClientCursor(connection, row_factory=namedtuple_row) as cursor:
                    bound = [cursor.mogrify(statement, params) for statement, params in runs]
                    cursor.execute(";\n".join(("BEGIN", *bound, "COMMIT")))
                    rows: list[list[Any]] = []
                    for _ in runs:  # past BEGIN's result, to each statement's
                        cursor.nextset()
                        rows.append(cursor.fetchall() if _returns_rows(cursor) else [])
                    return rows
            except psycopg.Error:
                if not connection.closed and connection.info.transaction_status is TransactionStatus.INERROR:
                    connection.rollback()
                raise

        return self._with_connection(run)
