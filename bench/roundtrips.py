"""Database statements and round trips, counted at the psycopg layer and put down to the Database method that ran
them (a benchmark's instrumentation: psycopg is patched for a block, in this process only; production code is not
changed).

A statement is one ``Cursor.execute`` (one round trip: automatic prepared statements are off, so psycopg sends
Parse/Bind/Execute/Sync together). A transaction (``Connection.transaction``) adds two round trips, its BEGIN and its
COMMIT (or ROLLBACK), which psycopg sends as queries of their own; a transaction sent as one query string
(``Connected._each_in_one_transaction``) is its statements in one round trip. Statements run outside a Database method
(the benchmark's own reads) are not counted."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from pagescribe.store.postgres import Database
from pagescribe.store.postgres.connection import Connected

# The steps of a page's way through the pipeline, by the Database methods that make them; a method not named here
# is a step of its own.
STEPS: dict[str, tuple[str, ...]] = {
    "upload": (
        "ensure_tenant",
        "tenant_exists",
        "find_document",
        "find_reusable_document",
        "create_document",
        "mark_enqueued",
    ),
    "claim": ("claim_jobs", "get_documents"),
    "admission": ("admit_spends",),
    "slot": ("take_rate_slots", "settle_rate_tokens"),
    "page image, figures (a page whose attempt did not end it)": ("keep_page_image", "keep_figures"),
    "attempt, completion, counters, image key": ("complete_job", "complete_jobs"),
    "finish": ("get_document", "load_pages", "load_attempts", "finish_document"),
}
STEP_OF = {method: step for step, methods in STEPS.items() for method in methods}


class RoundTrips:
    """Statements and round trips by Database method, for the instances attached, while ``counting``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._current = threading.local()
        self.calls: Counter[str] = Counter()
        self.statements: Counter[str] = Counter()
        self.round_trips: Counter[str] = Counter()

    def attach(self, db: Database) -> None:
        """Wrap every public method of ``db`` (on the instance) so that the statements it runs are put down to it; a
        method called from another is counted as the outer one."""
        for name in dir(type(db)):
            if not name.startswith("_") and callable(getattr(type(db), name)):
                setattr(db, name, self._tracked(name, getattr(db, name)))

    def _tracked(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        def tracked(*args: Any, **kwargs: Any) -> Any:
            outer = getattr(self._current, "method", None)
            if outer is not None:
                return method(*args, **kwargs)
            self._current.method = name
            try:
                return method(*args, **kwargs)
            finally:
                self._current.method = None
                with self._lock:
                    self.calls[name] += 1

        return tracked

    def _count(self, statements: int, round_trips: int) -> None:
        method = getattr(self._current, "method", None)
        if method is None or getattr(self._current, "sent_together", False):
            return
        with self._lock:
            self.statements[method] += statements
            self.round_trips[method] += round_trips

    @contextmanager
    def counting(self) -> Iterator[None]:
        """Patch psycopg's Cursor.execute and Connection.transaction, and Connected._each_in_one_transaction, for the
        block."""
        execute, transaction = psycopg.Cursor.execute, psycopg.Connection.transaction
        each_in_one_transaction = Connected._each_in_one_transaction
        counter = self

        def counted_each_in_one_transaction(db: Any, runs: Sequence[tuple[str, dict[str, Any]]]) -> list[list[Any]]:
            counter._count(len(runs), 1)  # BEGIN, the statements and COMMIT in one query string
            counter._current.sent_together = True
            try:
                return each_in_one_transaction(db, runs)
            finally:
                counter._current.sent_together = False

        def counted_execute(cursor: Any, *args: Any, **kwargs: Any) -> Any:
            counter._count(1, 1)
            return execute(cursor, *args, **kwargs)

        @contextmanager
        def counted_transaction(connection: Any, *args: Any, **kwargs: Any) -> Iterator[Any]:
            counter._count(0, 2)  # BEGIN (or SAVEPOINT) and COMMIT (or ROLLBACK, RELEASE)
            with transaction(connection, *args, **kwargs) as tx:
                yield tx

        psycopg.Cursor.execute = counted_execute  # type: ignore[method-assign]
        psycopg.Connection.transaction = counted_transaction  # type: ignore[method-assign,assignment]
        Connected._each_in_one_transaction = counted_each_in_one_transaction  # type: ignore[method-assign]
        try:
            yield
        finally:
            psycopg.Cursor.execute = execute  # type: ignore[method-assign]
            psycopg.Connection.transaction = transaction  # type: ignore[method-assign]
            Connected._each_in_one_transaction = each_in_one_transaction  # type: ignore[method-assign]

    def by_step(self) -> list[tuple[str, list[str], int, int]]:
        """(step, its methods as 'name Nx', statements, round trips), in the order of STEPS, then the others."""
        steps: dict[str, list[str]] = {}
        for method in sorted(self.calls, key=lambda m: (list(STEPS).index(STEP_OF[m]) if m in STEP_OF else 99, m)):
            steps.setdefault(STEP_OF.get(method, method), []).append(method)
        return [
            (
                step,
                [f"{m} {self.calls[m]}x" for m in methods],
                sum(self.statements[m] for m in methods),
                sum(self.round_trips[m] for m in methods),
            )
            for step, methods in steps.items()
        ]

    @property
    def total_round_trips(self) -> int:
        return sum(self.round_trips.values())

    @property
    def total_statements(self) -> int:
        return sum(self.statements.values())
