# ruff: noqa: RUF001  (the notes are prose: they use typographic multiplication signs)
"""Benchmark 14: the database alone under the transcribe path's real statements, spread over many documents and on
one hot document (issue 32, part 3).

No rendering, no model, no queue: a worker is a page in flight. Environments of ten page threads (BATCH) in several OS
processes run, per batch and per page, exactly the data-access calls the transcribe function makes, in its order,
through ``pagescribe.store.postgres.Database``:

- per SQS batch of ten ids: ``claim_jobs`` (one statement, which reads the jobs' documents too);
- per batch, the cost gate ``admit_spends`` for its pages (one document's), as the pages of a batch reach it together
  in the transcriber: LOCK_SPENDERS, then one ADMIT_SPEND per page, in one transaction; every document has a
  ``max_cost_usd`` and every tenant a daily budget, both far above what the run spends, and each tenant has a price
  history, so the gate takes its normal path;
- per batch, the rate governor's ``take_rate_slots`` for its pages (through ``RateGovernor.admit``, with a bucket so
  large that no page waits), as the pages of a batch reach it together;
- per page, after the model's time (the think time; none in a saturation run): ``complete_job`` with an outcome that
  carries a cost, noting the page's image (KEEP_PAGE_IMAGES is on by default) in the same write.

Two layouts of the same pages: SPREAD (documents of 50 pages over tenants of four documents each) and HOT (one
document of one tenant). An environment holds one connection, as deployed (the runtime's pool of one, behind RDS
Proxy): its pages' statements take turns on it. The environments' connections share at most CONNECTION_CAP connections
to the server (fewer when it has fewer to spare), as RDS Proxy multiplexes its clients onto its connections to the
database: the wait for a connection (the environment's, then a shared one) is timed apart from the statement.
A separate connection samples ``pg_stat_activity`` (joined to ``pg_locks``) every 50 ms: which waits the busy backends
are in, and on which table's rows the lock waits are.
"""

from __future__ import annotations

import argparse
import functools
import math
import multiprocessing
import os
import random
import re
import sys
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from multiprocessing.synchronize import Event as ProcessEvent
from pathlib import Path
from typing import Any, TypeVar

import psycopg
from pagescribe.domain import ClaimedJob, DocumentRecord, NewDocument, PageOutcome, PendingDocument, SpendGate
from pagescribe.governor import RateGovernor
from pagescribe.settings import Settings
from pagescribe.store.postgres import Database, create_database_engine

from bench.common import ADMIN_URL, CorrectnessError, Mode, Result, connect, fresh_database, percentile
from bench.report import EXPLANATIONS, _table, machine_facts, publish_section

T = TypeVar("T")

MODEL = "bench/vision-model"
PROVIDER = "openai-compatible:bench"
BATCH = 10  # ids per claim, as the event source's batch size (template.yaml: BatchSize 10)
LEASE_SECONDS = 900.0
MAX_ATTEMPTS = 3
PAGES_PER_DOCUMENT = 50  # SPREAD: documents of this many pages, four documents per tenant
DOCUMENTS_PER_TENANT = 4
SEED_PAGES = 1  # each tenant's earlier pages, completed before the run: the price history the cost gate reads
PROCESSES = 5  # client processes (each with its threads and its share of the connections)
CONNECTION_CAP = 40  # most connections the environments share (the server's max_connections is shared with others)
SAMPLE_SECONDS = 0.05
WARM_UP = 0.25  # the share of a run's window whose completions are not counted in its pages/s
P99_TARGET_MS = 50.0
OUTCOME = PageOutcome(
    text="Transcribed page: " + "lorem ipsum " * 40,
    finish_reason="stop",
    prompt_tokens=1000,
    completion_tokens=120,
    cost=0.00012,
    model=MODEL,
    provider=PROVIDER,
    provider_request_id="gen-1",
    latency_ms=1000,
)
# The governor as a deployment configures it (RATE_LIMIT_RPM, RATE_LIMIT_BURST), with a bucket no run can empty: the
# statement runs as always, and no page is held back.
SETTINGS = Settings(rate_limit_rpm=60_000_000, rate_limit_burst=1_000_000_000, rate_limit_tpm=0)
# Far above what a run spends (a page reserves about $0.008 while its call runs and costs $0.00012): the gate never
# stops a page, and a verdict other than GO fails the run.
MAX_COST_USD = 10_000.0
DAILY_BUDGET_USD = 100_000.0

# The statements by the names of their constants on Database, to name what a sampled backend was running.
STATEMENTS = {
    "CLAIM_JOBS_BY_ID": "claim_jobs",
    "LOCK_SPENDERS": "admit_spends (LOCK_SPENDERS)",
    "ADMIT_SPEND": "admit_spends (ADMIT_SPEND)",
    "TAKE_RATE_SLOTS": "take_rate_slots",
    "CREATE_RATE_BUCKET": "take_rate_slots (CREATE_RATE_BUCKET)",
    "COMPLETE_JOB": "complete_job",
}
ORDER = ("claim_jobs", "admit_spends", "take_rate_slots", "complete_job")


class Layout:
    SPREAD = "spread"
    HOT = "hot"


# --- sizes ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sizes:
    pages: int  # pages of each layout (HOT: one document of this many pages)
    workers: tuple[int, ...]  # saturation runs, no think time
    window: float  # seconds each run works for (then each worker ends the page it is on, gives the rest back)
    think_workers: int  # the run with a think time standing in for the model call
    think_seconds: float
    think_window: float


SIZES: dict[Mode, Sizes] = {
    Mode.FULL: Sizes(10_000, (50, 200, 500), 15.0, 200, 1.0, 20.0),
    Mode.QUICK: Sizes(10_000, (50, 200), 10.0, 200, 1.0, 15.0),
    # SMOKE: 50 workers for a few seconds each way, a short think time: every check still runs.
    Mode.SMOKE: Sizes(1_000, (50,), 2.0, 50, 0.2, 2.0),
}


# --- the client processes ------------------------------------------------------------------------------------


@dataclass
class ClientFigures:
    """What one client process saw: latencies (ms) per call, waits for a connection (ms), CPU, violations."""

    latencies: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # (time.time() at its start, ms)
    connection_waits: list[tuple[float, float]] = field(default_factory=list)
    completed_at: list[float] = field(default_factory=list)  # time.time() of each page's completion
    started: float = 0.0
    finished: float = 0.0
    cpu_seconds: float = 0.0
    violations: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class FairSlots:
    """``n`` connections handed out first come, first served, as RDS Proxy queues a client waiting for one (a
    threading.Semaphore lets the thread that just released take it again, starving others for seconds)."""

    def __init__(self, n: int) -> None:
        self._lock = threading.Lock()
        self._free = n
        self._waiting: deque[threading.Event] = deque()

    def __enter__(self) -> None:
        with self._lock:
            if self._free and not self._waiting:
                self._free -= 1
                return
            turn = threading.Event()
            self._waiting.append(turn)
        turn.wait()

    def __exit__(self, *_: object) -> None:
        with self._lock:
            if self._waiting:
                self._waiting.popleft().set()  # the slot passes to the longest waiting
            else:
                self._free += 1


class Client:
    """One process's workers: threads sharing a deque of batches and ``connections`` pooled connections.

    As deployed, an environment holds one connection (the runtime's pool of one): its pages' statements take turns on
    it, so two pages of one batch are never in the database at once; the environments' connections share the
    process's ``connections``, as RDS Proxy multiplexes its clients onto its connections to the database."""

    def __init__(self, url: str, connections: int, think: float) -> None:
        self.db = Database(create_database_engine(url, pool_size=connections))
        self.governor = RateGovernor(SETTINGS, self.db, PROVIDER)
        self._slots = FairSlots(connections)
        self._lock = threading.Lock()
        self._think = think
        self.stop_at = float("inf")  # no batch is taken after this (time.time())
        self.figures = ClientFigures(latencies={name: [] for name in ORDER})
        # open the pool's connections before the clock starts
        pooled = [self.db.engine.raw_connection() for _ in range(connections)]
        for connection in pooled:
            connection.close()

    def timed(self, name: str, own: FairSlots, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """A Database call on the environment's connection (``own``) and one of the shared few: the wait for both and
        the call timed apart."""
        asked = time.perf_counter()
        with own, self._slots:
            started = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                done = time.perf_counter()
                with self._lock:
                    at = time.time()
                    self.figures.connection_waits.append((at, (started - asked) * 1000))
                    self.figures.latencies[name].append((at, (done - started) * 1000))

    def violation(self, text: str) -> None:
        with self._lock:
            self.figures.violations.append(text)

    def work(self, batches: deque[list[str]], start_after: float = 0.0) -> None:
        """One execution environment: a batch at a time, its pages at once on BATCH threads of its own (the
        transcriber's PAGE_CONCURRENCY), as many pages in flight as threads; its first batch ``start_after`` seconds
        after the run's start."""
        time.sleep(start_after)
        own = FairSlots(1)  # the environment's one connection
        try:
            with ThreadPoolExecutor(max_workers=BATCH) as pages:
                while time.time() < self.stop_at:
                    try:
                        batch = batches.popleft()
                    except IndexError:
                        return
                    self._batch(batch, pages, own)
        except Exception as exc:  # reported by the parent, which fails the run
            with self._lock:
                self.figures.errors.append(repr(exc))

    def _batch(self, batch: list[str], pages: ThreadPoolExecutor, own: FairSlots) -> None:
        """One SQS batch, as TranscriptionBatch and Transcriber handle it: one claim (with the jobs' documents), the
        cost gate and the rate governor for the pages together, then each page's image, call and completion, the
        pages at once."""
        claims = self.timed(
            "claim_jobs", own, self.db.claim_jobs, batch, lease_seconds=LEASE_SECONDS, max_attempts=MAX_ATTEMPTS
        )
        if len(claims.claimed) != len(batch):
            self.violation(f"a claim of {len(batch)} fresh jobs got {len(claims.claimed)} (busy {len(claims.busy)})")
        jobs = list(claims.claimed.values())
        if time.time() < self.stop_at:
            self._pass_gates(jobs, claims.documents, own)
        for _ in pages.map(functools.partial(self._page, own=own), jobs):  # an error raised here
            pass

    def _pass_gates(self, jobs: list[ClaimedJob], documents: dict[str, DocumentRecord], own: FairSlots) -> None:
        """The cost gate and the rate governor, as CallGates passes them: the pages of one document that reach them
        together (here a batch's, all of one document) in one ``admit_spends``, then one ``take_rate_slots``."""
        for document_id in dict.fromkeys(job.document_id for job in jobs):
            document = documents[document_id]
            pages = [job for job in jobs if job.document_id == document_id]
            if document.max_cost_usd is not None or document.tenant_daily_budget_usd is not None:
                self._pass_cost_gate(pages, document.model, own)
            admissions = self.timed("take_rate_slots", own, self.governor.admit, pages, document.model)
            held = [admission for admission in admissions if admission.wait > 0]
            if held:
                raise RuntimeError(f"the governor held a page back ({held[0].why}): its bucket must never empty")

    def _pass_cost_gate(self, pages: list[ClaimedJob], model: str, own: FairSlots) -> None:
        verdicts = self.timed(
            "admit_spends",
            own,
            self.db.admit_spends,
            pages,
            model,
            daily_budget_usd=SETTINGS.daily_budget_usd,
            max_output_tokens=SETTINGS.max_output_tokens,
        )
        stopped = [verdict for verdict in verdicts if verdict.verdict != SpendGate.GO]
        if stopped:
            raise RuntimeError(f"the cost gate said {stopped[0]}: the run's caps must never stop a page")

    def _give_back(self, job: ClaimedJob, own: FairSlots) -> None:
        with own, self._slots:
            deferred = self.db.defer_job(job, "the run's window ended", delay_seconds=0, slot_at=None, keep_slot=False)
        if not deferred:
            self.violation(f"job {job.job_id}: giving it back found its lease gone")

    def _page(self, job: ClaimedJob, own: FairSlots) -> None:
        if time.time() >= self.stop_at:  # the window is over: the page goes back, as a page held back by a gate
            self._give_back(job, own)  # does (its claim not counted), so that a run ends soon after it
            return
        if self._think:
            time.sleep(self._think)  # the render and the model call
        image = f"transcripts/{job.document_id}/pages/{job.page_number}.webp"
        if self.timed("complete_job", own, self.db.complete_job, job, OUTCOME, image_key=image) is None:
            self.violation(f"job {job.job_id}: the fenced completion found its lease gone")
        with self._lock:
            self.figures.completed_at.append(time.time())


def client_process(
    url: str,
    batches: list[list[str]],
    threads: int,
    connections: int,
    think: float,
    window: float,
    phase: float,
    go: ProcessEvent,
    measured: ProcessEvent,
    out: Any,
) -> None:
    """A client process (forked from the forkserver): its threads run its batches once ``go`` is set, taking none
    after ``window`` seconds; its figures are put on ``out`` (or what failed)."""
    try:
        _client(url, batches, threads, connections, think, window, phase, go, measured, out)
    except Exception as exc:  # the parent raises it
        out.put(f"client process failed: {exc!r}")


def _client(
    url: str,
    batches: list[list[str]],
    threads: int,
    connections: int,
    think: float,
    window: float,
    phase: float,
    go: ProcessEvent,
    measured: ProcessEvent,
    out: Any,
) -> None:
    client = Client(url, connections, think)
    queue = deque(batches)
    # Environments, each with BATCH page threads. With a think time they start spread over one think time, each
    # process's between the others', as environments that take batches from a queue do: started at one instant, their
    # pages would all end together, a burst no deployment's calls make, and stay so from batch to batch.
    environments = max(1, threads // BATCH)
    workers = [
        threading.Thread(target=client.work, args=(queue, think * (i + phase) / environments), daemon=True)
        for i in range(environments)
    ]
    out.put("ready")
    go.wait()
    client.figures.started = time.time()
    client.stop_at = client.figures.started + window
    cpu = time.process_time()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    client.figures.finished = time.time()
    client.figures.cpu_seconds = time.process_time() - cpu
    out.put(client.figures)
    measured.wait(timeout=120)  # the server's backends read (they end with the connections)
    client.db.engine.dispose()


# --- the sampler of waits ------------------------------------------------------------------------------------

ACTIVITY = r"""
SELECT a.wait_event_type, a.wait_event, left(a.query, 300) AS query,
       CASE WHEN a.wait_event_type = 'Lock' THEN (
           SELECT string_agg(DISTINCT l.locktype || ':' || coalesce(l.relation::regclass::text, ''), ',')
           FROM pg_locks l WHERE l.pid = a.pid AND (NOT l.granted OR l.locktype = 'tuple')) END AS locks
FROM pg_stat_activity a
WHERE a.datname = current_database() AND a.state = 'active' AND a.pid <> pg_backend_pid()
"""


def _normal(sql: str) -> str:
    """A statement's text as compared: placeholders and whitespace made alike, the start only."""
    sql = re.sub(r"%\(\w+\)s|\$\d+", "?", sql)
    return re.sub(r"\s+", " ", sql).strip()[:60]


def statement_names() -> dict[str, tuple[str, str | None]]:
    """The start of each statement's text -> its name, and the one table it writes or locks (None when it touches
    several). Constants are looked up by name: one that no longer exists is reported by the start of its text."""
    names: dict[str, tuple[str, str | None]] = {}
    for constant, name in STATEMENTS.items():
        sql = getattr(Database, constant, None)
        if isinstance(sql, str):
            written = set(re.findall(r"(?:UPDATE|INSERT INTO|DELETE FROM)\s+(\w+)", sql))
            names[_normal(sql)] = (name, written.pop() if len(written) == 1 and "FOR UPDATE OF" not in sql else None)
    return names


@dataclass
class Waits:
    samples: int = 0
    active: int = 0  # busy backends seen, summed over the samples
    events: Counter[str] = field(default_factory=Counter)  # wait_event_type:wait_event (CPU: none)
    lock_waits: Counter[str] = field(default_factory=Counter)  # table waited on -> backends seen waiting
    lock_statements: Counter[str] = field(default_factory=Counter)  # statement that waited -> backends seen

    @property
    def lock_share(self) -> float:
        return sum(self.lock_waits.values()) / self.active if self.active else 0.0

    def hot_row(self) -> str:
        """The table whose rows were waited on most (of the waits whose table was found), and the statements that
        waited most."""
        known = [(table, seen) for table, seen in self.lock_waits.most_common() if not table.startswith("unknown")]
        if not self.lock_waits:
            return "none: no backend was seen waiting on a lock"
        statements = ", ".join(f"{name} {seen}" for name, seen in self.lock_statements.most_common(3))
        total = sum(self.lock_waits.values())
        if not known:
            return f"table not found ({total} lock waits seen, by statement: {statements})"
        table, seen = known[0]
        return f"{table}: {seen} of {total} lock waits seen (by statement: {statements})"


def _table_of(locks: str | None, written: str | None) -> str:
    """The table whose row a waiting backend waits on: its tuple lock's, else the relation it waits for, else (a
    wait on the holder's transaction with no tuple lock) the one table its statement writes."""
    entries = (locks or "").split(",")
    for kind in ("tuple:", "relation:", "extend:"):
        for entry in entries:
            if entry.startswith(kind) and entry != kind:
                return f"{entry.split(':', 1)[1]} ({'row' if kind == 'tuple:' else kind.rstrip(':')})"
    if written is not None and "transactionid:" in entries:
        return f"{written} (row)"
    return f"unknown table ({locks or 'no lock row'})"


class Sampler(threading.Thread):
    """Samples the busy backends of the run's database every SAMPLE_SECONDS, from a connection of its own."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self._url = url
        self._halt = threading.Event()
        self.waits = Waits()
        self._names = statement_names()
        self.error: BaseException | None = None

    def stop(self) -> None:
        self._halt.set()
        self.join()

    def run(self) -> None:
        try:
            with connect(self._url) as conn:
                while not self._halt.wait(SAMPLE_SECONDS):
                    self._sample(conn.execute(ACTIVITY).fetchall())
        except BaseException as exc:  # reported by the run
            self.error = exc

    def _sample(self, rows: Sequence[Any]) -> None:
        waits = self.waits
        waits.samples += 1
        for event_type, event, query, locks in rows:
            waits.active += 1
            waits.events[f"{event_type}:{event}" if event_type else "CPU (no wait event)"] += 1
            if event_type == "Lock":
                normal = _normal(query or "")
                name, written = self._names.get(normal, (normal, None))
                waits.lock_waits[_table_of(locks, written)] += 1
                waits.lock_statements[name] += 1


# --- server CPU ----------------------------------------------------------------------------------------------

TICK = os.sysconf("SC_CLK_TCK")


def _cpu_of(pids: Sequence[int]) -> float:
    """CPU seconds (user + system) the processes have used so far (0 for one that is gone or not readable)."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / TICK


def _machine_busy() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far, from /proc/stat."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + values[4]
    return (sum(values) - idle) / TICK, sum(values) / TICK


# --- seeding -------------------------------------------------------------------------------------------------


def _document(db: Database, tenant: str, pages: int, label: str) -> tuple[str, list[str]]:
    """A capped document of ``pages`` pages created as the API and the upload function create one: its id and its
    jobs' ids in page order."""
    document_id = str(uuid.uuid4())
    key = f"uploads/dbload/{label}.pdf"
    db.create_pending_document(
        PendingDocument(document_id, "bench", key, f"{label}.pdf", MODEL, None, None, None, tenant_id=tenant,
                        max_cost_usd=MAX_COST_USD)
    )  # fmt: skip
    new = NewDocument("bench", key, uuid.uuid4().hex, "", 1, MODEL, tenant_id=tenant)
    created = db.create_document(new, kind="pdf", pages=list(range(1, pages + 1)), pending_id=document_id)
    return document_id, list(created.job_ids)


def _seed_history(client: Client, db: Database, tenant: str) -> None:
    """The tenant's earlier pages, done one at a time through the same calls: its price history."""
    _, job_ids = _document(db, tenant, SEED_PAGES, f"seed-{tenant}")
    client.work(deque([job_ids]))


@dataclass(frozen=True)
class Seeded:
    documents: list[str]
    batches: list[list[str]]  # the order the messages come in, ten ids each


def seed(url: str, layout: str, pages: int) -> Seeded:
    """Tenants (each with a daily budget and a price history) and their documents; the batches, shuffled, as the
    queue hands out the messages of documents uploaded together."""
    client = Client(url, 1, 0.0)
    db = client.db
    documents: list[str] = []
    batches: list[list[str]] = []
    if layout == Layout.HOT:
        tenant_documents = [("hot-tenant", [pages])]
    else:
        count = pages // PAGES_PER_DOCUMENT
        tenant_documents = [
            (f"tenant-{t}", [PAGES_PER_DOCUMENT] * min(DOCUMENTS_PER_TENANT, count - t * DOCUMENTS_PER_TENANT))
            for t in range(-(-count // DOCUMENTS_PER_TENANT))
        ]
    for tenant, sizes in tenant_documents:
        db.ensure_tenant(tenant)
        db.set_daily_budget(tenant, DAILY_BUDGET_USD)
        _seed_history(client, db, tenant)
        for number, size in enumerate(sizes):
            document_id, job_ids = _document(db, tenant, size, f"{tenant}-{number}")
            documents.append(document_id)
            batches += [job_ids[i : i + BATCH] for i in range(0, len(job_ids), BATCH)]
    if client.figures.errors or client.figures.violations:
        raise RuntimeError(f"seeding failed: {client.figures.errors or client.figures.violations}")
    if layout == Layout.SPREAD:
        random.Random(32).shuffle(batches)  # noqa: S311 - an order, not a secret
    client.db.engine.dispose()
    with connect(url) as conn:
        conn.execute("ANALYZE")
    return Seeded(documents, batches)


# --- one run -------------------------------------------------------------------------------------------------


@dataclass
class Run:
    layout: str
    workers: int
    connections: int
    think: float
    pages: int  # completed in all (the pages under way when the window ended included)
    in_window: int  # completed within the window, after its warm-up
    window: float
    seconds: float  # from the start to the last completion
    latencies: dict[str, list[float]]  # ms, every call of the run
    steady: dict[str, list[float]]  # ms, the calls started within the window, after its warm-up: the percentiles'
    connection_waits: list[float]  # ms, as steady
    client_cpu: float
    server_cpu: float  # this run's backends
    machine_busy: float  # share of the machine's CPU busy during the run
    waits: Waits

    @property
    def rate(self) -> float:
        """Pages per second while every worker was busy: those completed within the window, after its first quarter
        (the workers' start: in a think-time run no page completes before the think time); the pages under way when
        it ended are checked, not counted."""
        return self.in_window / (self.window * (1 - WARM_UP))

    def p(self, name: str, fraction: float) -> float:
        return percentile(self.steady[name], fraction)

    @property
    def calls(self) -> int:
        return sum(len(values) for values in self.latencies.values())

    def worst_p99(self) -> tuple[str, float]:
        return max(((name, self.p(name, 0.99)) for name in ORDER if self.steady[name]), key=lambda item: item[1])


def connection_budget(workers: int) -> int:
    """Connections to the server the environments share: one an environment at most, at most CONNECTION_CAP, never
    more than the server has free (less a margin for other work on the same server), a multiple of PROCESSES."""
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        row = conn.execute(
            "SELECT current_setting('max_connections')::int - current_setting('superuser_reserved_connections')::int"
            " - (SELECT count(*) FROM pg_stat_activity)"
        ).fetchone()
    free = int(row[0]) if row else 0
    budget = min(max(workers // BATCH, PROCESSES), CONNECTION_CAP, free - 20)
    if budget < PROCESSES:
        raise RuntimeError(f"only {free} connections free on the server")
    return budget - budget % PROCESSES


def _collect(out: Any, processes: list[Any], expected: int, timeout: float) -> list[Any]:
    """What the client processes put on ``out``: ``expected`` items, failing when a process died first."""
    items: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(items) < expected:
        try:
            item = out.get(timeout=1.0)
            if isinstance(item, str) and item.startswith("client process failed"):
                raise RuntimeError(item)
            items.append(item)
        except Exception as exc:  # queue.Empty: is every process still alive?
            if any(process.exitcode not in (None, 0) for process in processes):
                raise RuntimeError("a client process died") from exc
            if time.monotonic() > deadline:
                raise RuntimeError(f"the clients did not finish within {timeout:.0f} s") from exc
    return items


@dataclass
class Drive:
    """What the clients and the server did during one run."""

    figures: list[ClientFigures]
    started: float
    server_cpu: float
    machine_busy: float
    waits: Waits


def _drive(url: str, batches: list[list[str]], workers: int, connections: int, think: float, window: float) -> Drive:
    """The client processes, started and made ready (pools open), then let go together; the server sampled while
    they work."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["bench.dbload"])  # imported once, in the server the clients fork from
    go, measured, out = context.Event(), context.Event(), context.Queue()
    share = (workers // PROCESSES, connections // PROCESSES, think, window)
    processes = [
        context.Process(
            target=client_process,
            args=(url, batches[n::PROCESSES], *share, n / PROCESSES, go, measured, out),
            daemon=True,
        )
        for n in range(PROCESSES)
    ]
    for process in processes:
        process.start()
    finished = False
    try:
        _collect(out, processes, PROCESSES, timeout=300)
        with connect(url) as conn:
            backends = [
                r[0] for r in conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database()")
            ]
        sampler = Sampler(url)
        sampler.start()
        before = (_cpu_of(backends), _machine_busy())
        go.set()
        started = time.time()
        figures: list[ClientFigures] = _collect(out, processes, PROCESSES, timeout=900)
        server, (busy, total) = _cpu_of(backends), _machine_busy()
        measured.set()
        sampler.stop()
        if sampler.error is not None:
            raise RuntimeError(f"the sampler failed: {sampler.error!r}")
        finished = True
    finally:
        for process in processes:
            process.join(timeout=30 if finished else 0)
            if process.is_alive():
                process.kill()
    return Drive(
        figures,
        started,
        server - before[0],
        (busy - before[1][0]) / (total - before[1][1]),
        sampler.waits,
    )


def measure(layout: str, workers: int, pages: int, window: float, *, think: float = 0.0) -> Run:
    """One run on a fresh database: ``pages`` pages in ``layout``, taken by ``workers`` workers in PROCESSES
    processes for ``window`` seconds (then each worker ends the page it is on and gives its batch's other pages
    back)."""
    connections = connection_budget(workers)
    with fresh_database(f"dbload_{layout}") as url:
        seeded = seed(url, layout, pages)
        drive = _drive(url, seeded.batches, workers, connections, think, window)
        figures = drive.figures
        _raise_failures(figures)
        done = sum(len(f.completed_at) for f in figures)
        _check(url, seeded.documents, done, pages)
    # Latencies are read over the part of the window the pages/s are (past the warm-up: not the first batches, whose
    # claims and gates all the workers start at once); the calls are counted over the whole run.
    steady_from, steady_to = drive.started + WARM_UP * window, drive.started + window
    latencies: dict[str, list[float]] = {name: [] for name in ORDER}
    steady: dict[str, list[float]] = {name: [] for name in ORDER}
    for f in figures:
        for name, values in f.latencies.items():
            latencies[name] += [ms for _, ms in values]
            steady[name] += [ms for at, ms in values if steady_from <= at <= steady_to]
    return Run(
        layout=layout,
        workers=workers,
        connections=connections,
        think=think,
        pages=done,
        in_window=sum(
            drive.started + WARM_UP * window < t <= drive.started + window for f in figures for t in f.completed_at
        ),
        window=window,
        seconds=max(f.finished for f in figures) - drive.started,
        latencies=latencies,
        steady=steady,
        connection_waits=[ms for f in figures for at, ms in f.connection_waits if steady_from <= at <= steady_to],
        client_cpu=sum(f.cpu_seconds for f in figures),
        server_cpu=drive.server_cpu,
        machine_busy=drive.machine_busy,
        waits=drive.waits,
    )


def _raise_failures(figures: list[ClientFigures]) -> None:
    violations = [v for f in figures for v in f.violations]
    if violations:
        raise CorrectnessError(f"{len(violations)} violations, the first: {violations[0]}")
    errors = [e for f in figures for e in f.errors]
    if errors:
        raise RuntimeError(f"{len(errors)} workers failed, the first: {errors[0]}")


def _check(url: str, documents: list[str], done: int, pages: int) -> None:
    """Every page the workers did is COMPLETED once (one claim, one recorded call), the rest still QUEUED, and each
    document's counter (read through Database) equals its completed jobs."""
    with connect(url) as conn:
        statuses = dict(
            conn.execute(
                "SELECT status, count(*) FROM jobs WHERE document_id = ANY(%s::uuid[]) GROUP BY status", (documents,)
            ).fetchall()
        )
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE attempts > 1), count(*) FILTER (WHERE status = 'COMPLETED' AND attempts = 1)"
            " FROM jobs WHERE document_id = ANY(%s::uuid[])",
            (documents,),
        ).fetchone()
        calls = conn.execute(
            "SELECT count(*) FROM attempts WHERE document_id = ANY(%s::uuid[])", (documents,)
        ).fetchone()
        per_document = dict(
            conn.execute(
                "SELECT document_id::text, count(*) FROM jobs WHERE document_id = ANY(%s::uuid[])"
                " AND status = 'COMPLETED' GROUP BY document_id",
                (documents,),
            ).fetchall()
        )
    assert row is not None and calls is not None
    expected = {"COMPLETED": done} | ({"QUEUED": pages - done} if pages > done else {})
    if statuses != expected or row[0] != 0 or row[1] != done or calls[0] != done:
        raise CorrectnessError(
            f"jobs by status {statuses} (expected {expected}), claimed more than once {row[0]}, "
            f"completed once {row[1]}, calls recorded {calls[0]}, pages done {done}"
        )
    engine = create_database_engine(url)
    records = Database(engine).get_documents(documents)
    engine.dispose()
    wrong = {
        d: (r.pages_completed, per_document.get(d, 0))
        for d, r in records.items()
        if r.pages_completed != per_document.get(d, 0)
    }
    if wrong or len(records) != len(documents):
        raise CorrectnessError(f"document counters disagree with their completed jobs: {wrong}")


# --- the result ----------------------------------------------------------------------------------------------


def _ms(value: float) -> str:
    return f"{value:.1f}"


def _p50_p99(run: Run, name: str) -> str:
    return f"{_ms(run.p(name, 0.5))} / {_ms(run.p(name, 0.99))}" if run.steady[name] else "-"


def _statement_rows(label: str, spread: Run, hot: Run) -> list[tuple[str, str]]:
    rows = [
        (f"{label}: p50 / p99 ms of `{name}` ({len(spread.steady[name]):,} / {len(hot.steady[name]):,} calls past the "
         "warm-up)",
         f"spread {_p50_p99(spread, name)} · hot {_p50_p99(hot, name)}")
        for name in ORDER
    ]  # fmt: skip
    rows.append(
        (
            f"{label}: wait for a connection (the environment's, then one of the {spread.connections} to the "
            "server), p50 / p99 ms",
            f"spread {_ms(percentile(spread.connection_waits, 0.5))} / {_ms(percentile(spread.connection_waits, 0.99))}"
            f" · hot {_ms(percentile(hot.connection_waits, 0.5))} / {_ms(percentile(hot.connection_waits, 0.99))}",
        )
    )
    return rows


KINDS = {"Lock": "row and other locks", "LWLock:WALWrite": "commit flush", "IO:WALSync": "commit flush",
         "IO:WALWrite": "commit flush", "CPU (no wait event)": "on CPU"}  # fmt: skip


def _kinds(run: Run) -> str:
    """The busy backends' samples by kind of wait: locks, commit flushes, CPU, other."""
    kinds: Counter[str] = Counter()
    for event, seen in run.waits.events.items():
        kinds[KINDS.get(event, KINDS.get(event.split(":")[0], "other waits"))] += seen
    total = sum(kinds.values()) or 1
    return ", ".join(f"{kind} {seen / total:.0%}" for kind, seen in kinds.most_common())


def _events(run: Run) -> str:
    total = run.waits.active or 1
    return ", ".join(f"{event} {seen / total:.0%}" for event, seen in run.waits.events.most_common(4))


def _machine_rows(runs: list[Run]) -> list[tuple[str, str]]:
    rows = []
    for run in runs:
        kind = f"think {run.think:g} s" if run.think else "saturated"
        rows.append(
            (
                f"{run.layout}, {run.workers} workers, {kind}: CPU seconds of the clients / of this run's server "
                "backends, over the run; the machine's CPU busy (other work included)",
                f"{run.client_cpu:.1f} / {run.server_cpu:.1f} s over {run.seconds:.1f} s; {run.machine_busy:.0%}",
            )
        )
    return rows


@dataclass(frozen=True)
class Sizing:
    """The arithmetic of a deployment's size from the measured figures (and the stated assumptions)."""

    calls_per_page: float  # Database calls (transactions) per page
    statements_per_page: float
    server_cpu_ms: float  # the server's CPU per page (this run's backends), at saturation, spread
    db_ms_per_page: float  # time a page holds a connection, at the think-time load (p50s summed)

    ACU_VCPU = 0.25  # assumed: 1 ACU ≈ 2 GiB of memory and about a quarter of a vCPU
    UTILISATION = 0.5  # the server kept at half its CPU at the peak
    CALL_SECONDS = 10.0  # assumed seconds per page in Lambda: the render and the model call
    PAGES_PER_ENVIRONMENT = 10  # BatchSize 10, PAGE_CONCURRENCY 10: a batch's pages in flight together

    def line(self, label: str, pages_per_second: float) -> str:
        vcpu = pages_per_second * self.server_cpu_ms / 1000
        acu = vcpu / self.ACU_VCPU / self.UTILISATION
        environments = math.ceil(pages_per_second * self.CALL_SECONDS / self.PAGES_PER_ENVIRONMENT)
        connections = pages_per_second * self.db_ms_per_page / 1000
        return (
            f"- **{label}** ({pages_per_second:,.1f} pages/s): {pages_per_second:,.1f} × "
            f"{self.statements_per_page:.1f} = "
            f"{pages_per_second * self.statements_per_page:,.0f} statements/s "
            f"({pages_per_second * self.calls_per_page:,.0f} transactions/s); server CPU {pages_per_second:,.1f} × "
            f"{self.server_cpu_ms:.2f} ms = {vcpu:.2f} vCPU, so {vcpu:.2f} / {self.ACU_VCPU} / {self.UTILISATION} = "
            f"**{max(acu, 0.5):.1f} ACU** (Aurora's floor is 0.5); Lambda concurrency {pages_per_second:,.1f} × "
            f"{self.CALL_SECONDS:g} s / {self.PAGES_PER_ENVIRONMENT} pages per environment = **{environments:,.0f} "
            f"environments** (TranscribeMaximumConcurrency at least that); RDS Proxy client connections = "
            f"environments × pool size 1 = **{environments:,.0f}** (+ the API, upload and sweeper functions' few); "
            f"connections busy on the database at once (Little's law) {pages_per_second:,.1f} × "
            f"{self.db_ms_per_page:.0f} ms = {connections:.1f}."
        )


def _notes(saturated: dict[tuple[str, int], Run], think: dict[str, Run], sizes: Sizes) -> list[str]:
    spread_best = max((r for (layout, _), r in saturated.items() if layout == Layout.SPREAD), key=lambda r: r.rate)
    hot_best = max((r for (layout, _), r in saturated.items() if layout == Layout.HOT), key=lambda r: r.rate)
    base = think[Layout.SPREAD]
    calls = spread_best.calls / spread_best.pages
    sizing = Sizing(
        calls_per_page=calls,
        # a gate's call is two statements (LOCK_SPENDERS, then ADMIT_SPEND for its pages): one more a gate
        statements_per_page=calls + len(spread_best.latencies["admit_spends"]) / spread_best.pages,
        server_cpu_ms=1000 * spread_best.server_cpu / spread_best.pages,
        db_ms_per_page=sum(base.p(name, 0.5) * len(base.latencies[name]) for name in ORDER) / base.pages,
    )
    per_vcpu = 1000 / sizing.server_cpu_ms if sizing.server_cpu_ms else float("nan")
    return [
        "**Which figure is which.** *Saturated*: a closed loop, no time between a page's statements: the most pages "
        "per second this one server gives (by Little's law a statement's latency then grows with the workers, so "
        "its p99 there is not a deployment's). *Think time*: "
        f"{sizes.think_seconds:g} s between a page's slot and its completion, standing in for the model call: the "
        f"statement latencies {sizes.think_workers} pages in flight would see. The judged ratio is the saturated "
        "one; the p99 target (≤ 50 ms) is read at the think-time load.",
        f"**The ceiling of one database on this machine** (`nproc` = {os.cpu_count()}, the clients on the same two "
        f"cores): {spread_best.rate:,.0f} pages/s spread over many documents (at {spread_best.workers} workers), "
        f"{hot_best.rate:,.0f} pages/s on one hot document (at {hot_best.workers} workers). Busy backends, sampled "
        f"every 50 ms, at the spread ceiling: {_events(spread_best)}; at the hot ceiling: {_events(hot_best)}. "
        f"The client processes took {spread_best.client_cpu:.1f} CPU s of that run's {spread_best.seconds:.1f} s; "
        f"this run's server backends {spread_best.server_cpu:.1f} s: the clients share the server's two cores, so "
        "the ceiling here is lower than the server alone would give.",
        f"**How it scales.** A page costs {sizing.calls_per_page:.1f} transactions ({sizing.statements_per_page:.1f} "
        f"statements) and {sizing.server_cpu_ms:.2f} ms of server CPU (this run's backends, at the spread ceiling), "
        f"so one server vCPU would do about {per_vcpu:,.0f} pages/s were CPU the limit; here the backends used "
        f"{spread_best.server_cpu / spread_best.seconds:.2f} of a core at the spread ceiling and "
        f"{hot_best.server_cpu / hot_best.seconds:.2f} at the hot one. What the busy backends waited on, by kind: "
        f"spread {_kinds(spread_best)}; hot {_kinds(hot_best)}. CPU grows with the server's vCPUs and commit flushes "
        "get cheaper with faster storage (and are shared: group commit); a row lock does not: the cost gate of "
        "every batch of a capped tenant takes its document's and its tenant's rows (LOCK_SPENDERS, FOR NO KEY "
        "UPDATE, held to the gate's commit), one gate at a time by design so that no budget is overspent, so that "
        "lock's throughput (in batches: the pages of a document that reach it together pass it in one "
        "transaction) is the ceiling of one tenant whatever the server's size (the page ends' counters are sharded "
        "and the rate bucket's commits are not flushed: neither is a hot row now). "
        "On this machine a hold also lasts while the client thread that holds it waits for a core (the clients "
        "run on the same two cores): behind RDS Proxy the gap is a network round trip. "
        f"First hot row: hot layout {hot_best.waits.hot_row()}; spread layout {spread_best.waits.hot_row()}.",
        "**Sizing a deployment**, from these figures and stated assumptions (no internet here: the ACU figure is an "
        f"assumption, 1 ACU ≈ 2 GiB of memory with about {Sizing.ACU_VCPU} vCPU; {Sizing.CALL_SECONDS:g} s per page "
        f"in Lambda; the server kept under {Sizing.UTILISATION:.0%} CPU; per-page figures from the spread runs; "
        f"a page holds a connection {sizing.db_ms_per_page:.0f} ms in all at the think-time load):",
        "\n".join(
            [
                sizing.line("100,000 pages a day, on average", 100_000 / 86_400),
                sizing.line("100,000 pages a day, a peak of ten times the average", round(10 * 100_000 / 86_400, 1)),
                sizing.line("a peak of 100 pages/s", 100),
                sizing.line("this machine's spread ceiling", round(spread_best.rate)),
                f"- **What no ACU count raises** while the rows above stay hot: the pages of one document, about "
                f"{hot_best.rate:,.0f} pages/s here (its row's holds), and the pages of all tenants together, about "
                f"{spread_best.rate:,.0f} pages/s here (the one `rate_buckets` row and the commit flushes): a bigger "
                "server shortens each hold only by its faster CPU and storage.",
            ]
        ),
    ]


def run(mode: Mode) -> Result:
    sizes = SIZES[mode]
    started = time.perf_counter()
    saturated: dict[tuple[str, int], Run] = {}
    for workers in sizes.workers:  # the layouts alternate, so that drift in the machine's load hits both alike
        for layout in (Layout.SPREAD, Layout.HOT):
            saturated[layout, workers] = measure(layout, workers, sizes.pages, sizes.window)
            _progress(saturated[layout, workers])
    think = {
        layout: measure(layout, sizes.think_workers, sizes.pages, sizes.think_window, think=sizes.think_seconds)
        for layout in (Layout.SPREAD, Layout.HOT)
    }
    for each in think.values():
        _progress(each)
    judged = 200 if 200 in sizes.workers else sizes.workers[-1]
    spread, hot = saturated[Layout.SPREAD, judged], saturated[Layout.HOT, judged]
    ratio = hot.rate / spread.rate if spread.rate else math.nan
    worst = max(((*think[layout].worst_p99(), layout) for layout in think), key=lambda item: item[1])
    think_ratio = think[Layout.HOT].rate / think[Layout.SPREAD].rate if think[Layout.SPREAD].rate else math.nan
    rows = [
        (
            f"saturated, {workers} workers ({saturated[Layout.SPREAD, workers].connections} connections): pages/s "
            "spread · hot (hot / spread)",
            f"{saturated[Layout.SPREAD, workers].rate:,.0f} · {saturated[Layout.HOT, workers].rate:,.0f} "
            f"({saturated[Layout.HOT, workers].rate / max(saturated[Layout.SPREAD, workers].rate, 1e-9):.2f})",
        )
        for workers in sizes.workers
    ]
    rows += [
        (f"**hot / spread, saturated at {judged} workers (judged)**", f"**{ratio:.2f}**"),
        (
            f"think time {sizes.think_seconds:g} s, {sizes.think_workers} workers: pages/s spread · hot (hot / spread)",
            f"{think[Layout.SPREAD].rate:,.0f} · {think[Layout.HOT].rate:,.0f} ({think_ratio:.2f})",
        ),
        (
            f"**worst statement p99 at the think-time load** (target ≤ {P99_TARGET_MS:g} ms)",
            f"**{worst[1]:.1f} ms** (`{worst[0]}`, {worst[2]})",
        ),
    ]
    rows += _statement_rows(f"saturated, {judged} workers", spread, hot)
    rows += _statement_rows(f"think {sizes.think_seconds:g} s, {sizes.think_workers} workers", *think.values())
    rows += [
        (f"lock waits, share of busy backends sampled: {layout}, saturated at {judged}", f"{r.waits.lock_share:.0%} "
         f"of {r.waits.active:,} busy backends seen in {r.waits.samples} samples; on: "
         f"{', '.join(f'{t} {n}' for t, n in r.waits.lock_waits.most_common(3)) or 'none'}")
        for layout, r in ((Layout.SPREAD, spread), (Layout.HOT, hot))
    ]  # fmt: skip
    rows += [
        (f"first hot row ({layout})", r.waits.hot_row()) for layout, r in ((Layout.SPREAD, spread), (Layout.HOT, hot))
    ]
    rows += _machine_rows([spread, hot, *think.values()])
    rows.append(("pages claimed twice / lost leases / counters wrong", "0 / 0 / 0 (checked in every run)"))
    verdict = "met" if worst[1] <= P99_TARGET_MS else "MISSED"
    return Result(
        key="dbload",
        title=f"Database load: the transcribe path's statements alone ({sizes.pages:,} pages, spread vs one document)",
        ratio_label=f"hot / spread pages/s, saturated, {judged} workers",
        ratio=ratio,
        target=0.8,
        direction=">=",
        summary=(
            f"saturated at {judged} workers: hot {hot.rate:,.0f} vs spread {spread.rate:,.0f} pages/s; think "
            f"{sizes.think_seconds:g} s at {sizes.think_workers}: hot {think[Layout.HOT].rate:,.0f} vs spread "
            f"{think[Layout.SPREAD].rate:,.0f} pages/s; worst p99 there {worst[1]:.1f} ms ({worst[0]}, {worst[2]}; "
            f"target ≤ {P99_TARGET_MS:g}: {verdict}); hot row: {hot.waits.hot_row().split(':')[0]}"
        ),
        rows=rows,
        notes=_notes(saturated, think, sizes),
        seconds=time.perf_counter() - started,
    )


def _progress(run: Run) -> None:
    kind = f"think {run.think:g} s" if run.think else "saturated"
    print(
        f"  dbload {run.layout} {run.workers} workers {kind}: {run.rate:,.0f} pages/s; p99 "
        + ", ".join(f"{name} {run.p(name, 0.99):.1f}" for name in ORDER)
        + f" ms; hot row {run.waits.hot_row()}",
        flush=True,
    )


HEADING = "## Database load alone (bench.dbload)"


def section(result: Result, command: str) -> str:
    """The benchmark's section of docs/benchmarks.md as a run of this module alone writes it (a full run of bench.run
    writes the same figures among the others')."""
    facts = machine_facts()
    lines = [
        HEADING,
        "",
        f"`{command}` at commit {facts['commit']}, {facts['date']}; `nproc` = {facts['nproc']}, {facts['cpu']}; "
        f"PostgreSQL {facts['postgres']}; load average (1, 5, 15 min) at the end: {facts['load']} (the machine "
        "was shared with other work).",
        "",
        f"**{result.title}**: {result.ratio_label} = **{result.ratio:.2f}** ({result.target_text}: "
        f"{'met' if result.met else 'missed'}).",
        "",
        EXPLANATIONS["dbload"],
        "",
        _table(None, result.rows),
    ]
    for note in result.notes:
        lines += ["", note]
    lines += ["", f"*{result.summary}* ({result.seconds:.0f} s)", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--markdown", type=Path, help="write the section into this markdown file (replacing its own)")
    parser.add_argument("--quick", action="store_true", help="50 and 200 workers, shorter windows")
    args = parser.parse_args(argv)
    # The clients fork from the forkserver, which prepares each from __main__: by its path, not by this module's name,
    # already imported there (runpy would warn in every client).
    sys.modules["__main__"].__spec__ = None
    mode = Mode.QUICK if args.quick else Mode.FULL
    result = run(mode)
    print(result.line(), flush=True)
    command = ".venv/bin/python -m bench.dbload" + (" --quick" if args.quick else "")
    publish_section(section(result, command + (f" --markdown {args.markdown}" if args.markdown else "")), HEADING,
                    args.markdown)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
