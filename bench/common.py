"""Small helpers every benchmark shares: results, fresh databases, environment, statistics, counters."""

from __future__ import annotations

import math
import os
import secrets
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

import psycopg
from pagescribe.migrate import upgrade_database
from pagescribe.runtime import shutdown_runtime
from pagescribe.settings import get_settings
from pagescribe.store.postgres import Database

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "tests" / "data" / "corpus"
ADMIN_URL = os.environ.get("PAGESCRIBE_BENCH_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


class Mode(StrEnum):
    """How big a run is. Each benchmark picks its sizes per mode in one place, near the top of its run function.

    FULL is the run docs/benchmarks.md reports; QUICK (``--quick``) a smaller, quicker measurement; SMOKE
    (``--smoke``, CI) every benchmark once at the smallest inputs that still reach all its correctness checks: its
    figures are printed but not comparable with either, and it writes no docs."""

    SMOKE = "smoke"
    QUICK = "quick"
    FULL = "full"


class CorrectnessError(AssertionError):
    """A benchmark saw the system break a guarantee (a job claimed twice, a page lost): the run fails."""


@dataclass
class Result:
    """One benchmark's outcome: the ratio it is judged by, its target, and the figures behind it."""

    key: str
    title: str
    ratio_label: str
    ratio: float
    target: float | None
    direction: Literal["<=", ">="]
    summary: str
    rows: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def target_text(self) -> str:
        return f"target {self.direction} {self.target:g}" if self.target is not None else "no fixed target"

    @property
    def met(self) -> bool | None:
        if self.target is None:
            return None
        return self.ratio <= self.target if self.direction == "<=" else self.ratio >= self.target

    def line(self) -> str:
        verdict = {True: "met", False: "MISSED", None: "info"}[self.met]
        return (
            f"[{self.key}] {self.title}: {self.ratio_label} = {self.ratio:.2f} "
            f"({self.target_text}: {verdict}) | {self.summary}"
        )


# --- statistics -------------------------------------------------------------------------------------------


def percentile(values: Sequence[float], fraction: float) -> float:
    """Linear-interpolated percentile (fraction in [0, 1]) of a non-empty sequence."""
    if not values:
        return math.nan
    ordered = sorted(values)
    position = (len(ordered) - 1) * fraction
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


# --- databases and environment ----------------------------------------------------------------------------


def plain_url(sqlalchemy_url: str) -> str:
    """The libpq form (postgresql://) of a SQLAlchemy URL, for psycopg."""
    return sqlalchemy_url.replace("postgresql+psycopg://", "postgresql://", 1)


def connect(sqlalchemy_url: str) -> psycopg.Connection[Any]:
    """An autocommit connection of its own, to read what a run left in the database."""
    return psycopg.connect(plain_url(sqlalchemy_url), autocommit=True)


@contextmanager
def fresh_database(label: str) -> Iterator[str]:
    """A new database on the system server, migrated to head, dropped afterwards; yields its SQLAlchemy URL."""
    name = f"pagescribe_bench_{label}_{os.getpid()}_{secrets.token_hex(3)}"
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = f"{ADMIN_URL.rsplit('/', 1)[0]}/{name}".replace("postgresql://", "postgresql+psycopg://", 1)
    try:
        upgrade_database(url)
        yield url
    finally:
        shutdown_runtime()
        with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# Handler logs at WARNING. The handlers run as in Lambda (which sets AWS_LAMBDA_FUNCTION_NAME), so their metrics are
# recorded as deployed (their EMF lines are discarded by bench.stack); outside Lambda they are not recorded at all.
QUIET = {"POWERTOOLS_LOG_LEVEL": "WARNING", "AWS_LAMBDA_FUNCTION_NAME": "pagescribe-bench"}
# The fake provider answers with a text of its own, not the page's: the answers are grounded (the work is measured)
# but the two grounding checks never fire on them, as they would on every such answer.
SYNTHETIC_ANSWERS = {
    "FLAG_UNGROUNDED_THRESHOLD": "1",
    "FLAG_UNGROUNDED_BLOCK_CHARS": "0",
    "FLAG_MISSED_TEXT_THRESHOLD": "1",
}


@contextmanager
def environment(**values: str) -> Iterator[None]:
    """Set environment variables for a block, rebuilding the settings and runtime on the way in and out.

    The whole environment is restored afterwards (the local stack also sets AWS_* and queue variables)."""
    saved = dict(os.environ)
    for name in ("PROVIDER_API_KEY", "PROVIDER_API_KEY_PARAMETER", "DATABASE_SECRET_ARN"):
        os.environ.pop(name, None)
    os.environ.update(values)
    shutdown_runtime()
    get_settings.cache_clear()
    try:
        yield
    finally:
        shutdown_runtime()
        os.environ.clear()
        os.environ.update(saved)
        get_settings.cache_clear()


# --- instrumentation (in this process only; production code is not changed) -------------------------------


@contextmanager
def timed_async_method(target: object, name: str) -> Iterator[list[float]]:
    """Time every await of ``target.name`` (an async method, wrapped on the instance) for a block; yields the
    durations (seconds), filled as calls finish."""
    original = getattr(target, name)
    durations: list[float] = []

    async def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return await original(*args, **kwargs)
        finally:
            durations.append(time.perf_counter() - started)

    setattr(target, name, timed)
    try:
        yield durations
    finally:
        delattr(target, name)


class ApiCalls:
    """AWS API operations made by the boto3 clients it is attached to, counted per operation."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.by_operation: Counter[str] = Counter()

    def attach(self, client: Any) -> None:
        client.meta.events.register("before-call.*.*", self._on_call)

    def _on_call(self, event_name: str, **kwargs: Any) -> None:
        _, service, operation = event_name.split(".", 2)
        with self._lock:
            self.by_operation[f"{service}:{operation}"] += 1

    def count(self, prefix: str = "") -> int:
        return sum(n for op, n in self.by_operation.items() if op.startswith(prefix))

    def describe(self, prefix: str = "") -> str:
        items = sorted((op, n) for op, n in self.by_operation.items() if op.startswith(prefix))
        return ", ".join(f"{op.split(':', 1)[1]} {n}" for op, n in items) or "none"


STORAGE_METHODS = (
    "create_document",
    "find_document",
    "get_document",
    "get_documents",
    "mark_enqueued",
    "claim_jobs",
    "complete_job",
    "complete_jobs",
    "fail_job",
    "requeue_job",
    "load_pages",
    "finish_document",
    "take_due_callbacks",
    "record_callback",
)


class CallTimer:
    """Wall time spent inside some methods of one object, wrapped on the instance (the class is untouched)."""

    def __init__(self, methods: Sequence[str]) -> None:
        self._methods = tuple(methods)
        self._lock = threading.Lock()
        self.calls: Counter[str] = Counter()
        self.seconds: dict[str, float] = {}

    def attach(self, target: object) -> None:
        for name in self._methods:
            setattr(target, name, self._timed(name, getattr(target, name)))

    def _timed(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - started
                with self._lock:
                    self.calls[name] += 1
                    self.seconds[name] = self.seconds.get(name, 0.0) + elapsed

        return timed

    @property
    def total_seconds(self) -> float:
        return sum(self.seconds.values())

    @property
    def total_calls(self) -> int:
        return sum(self.calls.values())

    def describe(self) -> str:
        return ", ".join(f"{name} {self.calls[name]}x {ms(self.seconds[name])}" for name in sorted(self.calls))


class StorageTimer(CallTimer):
    """Wall time spent inside the Database methods of one instance (each is one short transaction, so this is
    the database time as the code experiences it: pool checkout and the statement)."""

    def __init__(self) -> None:
        super().__init__(STORAGE_METHODS)

    def attach(self, target: object) -> None:
        assert isinstance(target, Database)
        super().attach(target)


def spread_ms(values: Sequence[float]) -> str:
    """Median / p95 of durations in seconds, as milliseconds."""
    return f"{median(values) * 1000:.0f} / {percentile(values, 0.95) * 1000:.0f} ms"
