"""Benchmark 3: a 50-page PDF (10 in a smoke run) through the local pipeline against a provider answering in exactly
1.0 s; then a PDF of scans (no text layer: orientation and the second read, in its auto mode) the same way. Every
page passes the cost gate and the rate governor (set never to hold a page back), and each step's database statements
and round trips, and the SQS and S3 calls, are counted per page."""

from __future__ import annotations

import asyncio
import json
import math
import resource
import time
import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from pagescribe.domain import NewDocument, PageOutcome
from pagescribe.sources.documents import DocumentKind
from pagescribe.store.postgres import Database

from bench.common import (
    ApiCalls,
    Mode,
    Result,
    StorageTimer,
    fresh_database,
    median,
    percentile,
    spread_ms,
    timed_async_method,
)
from bench.pdfs import build_pdf, build_scan_pdf
from bench.roundtrips import RoundTrips
from bench.stack import ChatServerProcess, Invocation, Pipeline, local_pipeline

# pages of the PDF. SMOKE: one batch of ten, the whole way from the S3 put to the transcript, every page checked.
PAGES = {Mode.FULL: 50, Mode.QUICK: 50, Mode.SMOKE: 10}
SCANNED_PAGES = {Mode.FULL: 30, Mode.QUICK: 20, Mode.SMOKE: 4}
BATCH = 10
MODEL_SECONDS = 1.0
PAGE_CONCURRENCY = 10
MODEL = "bench/vision-model"
# The cost gate (a tenant daily budget, every page's admission) and the rate governor (its slot, and the settling of
# its tokens), on, and set never to hold a page back: every step a page can take is made, and counted.
GATES = {
    "DAILY_BUDGET_USD": "1000000",
    "RATE_LIMIT_RPM": "1000000",
    "RATE_LIMIT_TPM": "10000000000",
    "RATE_LIMIT_BURST": "1000",
}


def _page_storage_alone(db: Database, batches: int = 8) -> float:
    """Median seconds per page of the transcribe path's Database calls (a batch of ten claimed with its
    document in one statement, then each page's fenced result), with nothing else running."""
    new = NewDocument("bench", f"uploads/alone-{uuid.uuid4().hex}.pdf", "etag", "", 1, "bench/model")
    created = db.create_document(new, kind="pdf", pages=list(range(1, batches * BATCH + 1)))
    outcome = PageOutcome("text", "stop", 1000, 4, 0.0001, "bench/model", "bench", "gen-1", 1000)
    durations: list[float] = []
    for start in range(0, len(created.job_ids), BATCH):
        started = time.perf_counter()
        claims = db.claim_jobs(created.job_ids[start : start + BATCH], lease_seconds=300, max_attempts=3).claimed
        for job in claims.values():
            db.complete_job(job, outcome)
        durations.append((time.perf_counter() - started) / len(claims))
    return median(durations)


def _seed_prices(db: Database) -> None:
    """One priced call of the model on the tenant's record, so that the cost gate knows a call's worst case from the
    first page (before it, a tenant with a budget makes one call at a time, and the batch's other pages wait)."""
    new = NewDocument("bench", f"uploads/priced-{uuid.uuid4().hex}.pdf", "etag", "", 1, MODEL)
    created = db.create_document(new, kind="pdf", pages=[1])
    [job] = db.claim_jobs(created.job_ids, lease_seconds=300, max_attempts=3).claimed.values()
    db.complete_job(job, PageOutcome("text", "stop", 1000, 4, 0.00012, MODEL, "bench", "gen-0", 1000))


def _cpu_seconds(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


@dataclass
class Counted:
    """What one document's run cost beyond the model: database calls by method, statements and round trips by
    step, the AWS calls of the functions' clients."""

    db: StorageTimer
    trips: RoundTrips
    aws: ApiCalls


@contextmanager
def _counted(pipeline: Pipeline) -> Iterator[Counted]:
    runtime = pipeline.stack.runtime
    _seed_prices(runtime.db)
    counted = Counted(StorageTimer(), RoundTrips(), ApiCalls())
    counted.db.attach(runtime.db)
    counted.trips.attach(runtime.db)
    counted.aws.attach(runtime.queue._client)  # the functions' SQS and S3 clients (private: a benchmark)
    counted.aws.attach(runtime.objects._client)
    with counted.trips.counting():
        yield counted


@dataclass
class Run:
    """One document through the pipeline: its wall time, and the invocations and pages behind it."""

    pages: int
    wall: float
    ideal: float
    t0_wall: float
    upload: Invocation
    transcribes: list[Invocation]
    rows: list[dict[str, Any]]

    @property
    def ratio(self) -> float:
        return self.wall / self.ideal

    @property
    def batches(self) -> int:
        return math.ceil(self.pages / BATCH)

    @property
    def rounds_per_batch(self) -> int:
        return math.ceil(min(BATCH, self.pages) / PAGE_CONCURRENCY)

    def overheads(self) -> tuple[list[float], list[float], list[float]]:
        """Per page, seconds: invocation start -> result committed less the model call; claim committed -> result
        committed less the model call; invocation start -> claim committed."""
        invocation_of = {job: inv for inv in self.transcribes for job in inv.job_ids}
        model = [float(r["latency_ms"]) / 1000 for r in self.rows]
        started = [float(invocation_of[str(r["job_id"])].started_at) for r in self.rows]
        claimed = [float(r["started_at"]) for r in self.rows]
        completed = [float(r["completed_at"]) for r in self.rows]
        overhead = [c - s - m for c, s, m in zip(completed, started, model, strict=True)]
        claimed_overhead = [c - s - m for c, s, m in zip(completed, claimed, model, strict=True)]
        claim_wait = [c - s for c, s in zip(claimed, started, strict=True)]
        return overhead, claimed_overhead, claim_wait


def _run_document(pipeline: Pipeline, pdf: Path, pages: int) -> Run:
    batches = math.ceil(pages / BATCH)
    ideal = batches * math.ceil(min(BATCH, pages) / PAGE_CONCURRENCY) * MODEL_SECONDS  # one environment, in turn
    before = len(pipeline.invocations)
    t0_wall, t0 = time.time(), time.perf_counter()
    pipeline.put(f"uploads/{pdf.name}", pdf)
    upload = pipeline.deliver_upload()
    document_id = pipeline.document_id(upload)
    pipeline.run_until_finished(document_id, timeout=120 + 10 * pages)
    wall = time.perf_counter() - t0
    rows = pipeline.check_all_completed(document_id, pages)
    transcribes = [i for i in pipeline.invocations[before:] if i.function == "transcribe"]
    return Run(pages, wall, ideal, t0_wall, upload, transcribes, rows)


def _pipeline(url: str, fake: ChatServerProcess) -> AbstractContextManager[Pipeline]:
    return local_pipeline(
        url,
        aws_apart=True,
        PROVIDER_BASE_URL=fake.base_url,
        PAGE_CONCURRENCY=str(PAGE_CONCURRENCY),
        PROVIDER_TIMEOUT_SECONDS="60",
        MODEL=MODEL,
        **GATES,
    )


def provider_alone(fake: ChatServerProcess, bodies: list[dict[str, Any]], batch: int) -> float:
    """Seconds the very requests the pipeline sent take with nothing else at work: each batch's sent at once by a bare
    httpx client (streamed, read to their end, as the provider adapter reads them), the batches in turn. What the
    client and the fake provider cost beyond the fake's delay is in it: sending and reading each request through
    httpx in this process, receiving and decoding its image in the fake's, as in the pipeline's run."""

    async def one(client: httpx.AsyncClient, body: bytes) -> None:
        async with client.stream("POST", "chat/completions", content=body, headers=_JSON) as response:
            response.raise_for_status()
            async for _ in response.aiter_bytes():
                pass

    async def run() -> float:
        encoded = [json.dumps(body, separators=(",", ":")).encode() for body in bodies]
        async with httpx.AsyncClient(base_url=fake.base_url + "/", timeout=60) as client:
            await asyncio.gather(*(one(client, body) for body in encoded[:batch]))  # the connections opened
            started = time.perf_counter()
            for start in range(0, len(encoded), batch):
                await asyncio.gather(*(one(client, body) for body in encoded[start : start + batch]))
            return time.perf_counter() - started

    return asyncio.run(run())


_JSON = {"Content-Type": "application/json"}


def first_renders_alone(pipeline: Pipeline, pdf: Path, pages: int) -> float:
    """Seconds the first batch's renders take with nothing else at work: its pages rendered at once by the run's own
    render processes (warm), as its claims render them. Nothing is rendered before the first claim, and the batch's
    last call starts when its page's render is done: the least the first batch can add to the model's time here."""
    runtime = pipeline.stack.runtime
    params = runtime.transcriber._images._params  # the claims' own settings (private: a benchmark)

    async def batch() -> float:
        started = time.perf_counter()
        first = range(1, min(BATCH, pages) + 1)
        await asyncio.gather(*(runtime.renderer.render(pdf, DocumentKind.PDF, page, **params) for page in first))
        return time.perf_counter() - started

    return asyncio.run(batch())


def least_row(run: Run, renders: float, provider: float, *, label: str) -> tuple[str, str]:
    """The least wall time this machine allows the run: its upload function, its first batch's renders alone and the
    provider and its client alone, one after another (every other step taking no time)."""
    least = run.upload.seconds + renders + provider
    return (
        f"{label}least this machine allows: the upload function ({run.upload.seconds * 1000:.0f} ms) + the first "
        f"batch's renders alone ({renders * 1000:.0f} ms: its pages at once on the run's render processes, nothing "
        f"else at work) + the provider and its client alone ({provider:.2f} s)",
        f"{least:.2f} s / {run.ideal:.1f} s = {least / run.ideal:.2f}",
    )


def _per_page(count: int, pages: int) -> str:
    return f"{count / pages:.2f}"


def round_trip_rows(trips: RoundTrips, aws: ApiCalls, pages: int) -> list[tuple[str, str]]:
    """The table of the issue: each step's statements / round trips per page, then SQS's and S3's calls."""
    rows = [
        (
            f"  {step} ({', '.join(methods)}): statements / round trips per page",
            f"{_per_page(statements, pages)} / {_per_page(round_trips, pages)}",
        )
        for step, methods, statements, round_trips in trips.by_step()
    ]
    rows.append(
        (
            "  all steps: statements / round trips per page",
            f"{_per_page(trips.total_statements, pages)} / {_per_page(trips.total_round_trips, pages)}",
        )
    )
    for service in ("sqs", "s3"):
        calls = {op.split(":", 1)[1]: n for op, n in aws.by_operation.items() if op.startswith(f"{service}:")}
        described = ", ".join(f"{op} {n / pages:.2f}" for op, n in sorted(calls.items())) or "none"
        rows.append((f"  {service.upper()}: calls per page, by operation", described))
    return rows


def _scanned(run: Run, trips: RoundTrips, renders: list[float], least: tuple[str, str]) -> list[tuple[str, str]]:
    overhead, _, _ = run.overheads()
    return [
        (
            f"scanned pages (second run): {run.pages}-page PDF of scans, no text layer, orientation and the second "
            "read (SECOND_READ=auto); wall / ideal",
            f"{run.wall:.2f} s / {run.ideal:.1f} s = **{run.ratio:.2f}**",
        ),
        least,
        ("  scanned: per-page overhead, invocation start -> result committed, less model", spread_ms(overhead)),
        ("  scanned: render per page in the batch", spread_ms(renders)),
        ("  scanned: pages whose image was rendered ahead", f"{run.pages - len(renders)} of {run.pages}"),
        (
            "  scanned: statements / round trips per page, all steps",
            f"{_per_page(trips.total_statements, run.pages)} / {_per_page(trips.total_round_trips, run.pages)}",
        ),
    ]


def _scanned_run(mode: Mode, scratch: Path) -> list[tuple[str, str]]:
    """The same pipeline on a PDF of scans, in a stack of its own: the rows of the Result it adds."""
    pages = SCANNED_PAGES[mode]
    pdf = build_scan_pdf(pages, scratch)
    with (
        fresh_database("pipeline_scans") as url,
        ChatServerProcess(MODEL_SECONDS) as fake,
        _pipeline(url, fake) as pipeline,
        timed_async_method(pipeline.stack.runtime.renderer, "render") as renders,
        _counted(pipeline) as counted,
    ):
        run = _run_document(pipeline, pdf, pages)
        provider = provider_alone(fake, fake.seen().requests, BATCH)
        first = first_renders_alone(pipeline, pdf, pages)
    return _scanned(run, counted.trips, renders, least_row(run, first, provider, label="  scanned: "))


def run(mode: Mode, *, scratch: Path) -> Result:
    pages = PAGES[mode]
    started = time.perf_counter()
    pdf = build_pdf(pages, scratch)
    with (
        fresh_database("pipeline") as url,
        ChatServerProcess(MODEL_SECONDS) as fake,
        _pipeline(url, fake) as pipeline,
        timed_async_method(pipeline.stack.runtime.renderer, "render") as renders,
    ):
        with _counted(pipeline) as counted:
            children_before = _cpu_seconds(resource.RUSAGE_CHILDREN)
            self_before = _cpu_seconds(resource.RUSAGE_SELF)
            document = _run_document(pipeline, pdf, pages)
            own_cpu = _cpu_seconds(resource.RUSAGE_SELF) - self_before
        seen = fake.seen()
        calls, connections = seen.calls, seen.connections
        alone_seconds = provider_alone(fake, seen.requests, BATCH)  # the very requests of the run, again
        least = least_row(document, first_renders_alone(pipeline, pdf, pages), alone_seconds, label="")
        db = counted.db
        page_path = ("claim_jobs", "complete_job", "complete_jobs")
        in_pipeline = sum(db.seconds.get(name, 0.0) for name in page_path) / pages  # a mean: calls are timed apart
        db_seconds, db_calls, db_described = db.total_seconds, db.total_calls, db.describe()
        table = round_trip_rows(counted.trips, counted.aws, pages)
        alone = _page_storage_alone(pipeline.stack.runtime.db)
        renderer = pipeline.stack.runtime.renderer

    render_cpu = _cpu_seconds(resource.RUSAGE_CHILDREN) - children_before  # the render processes, reaped on exit
    scanned = _scanned_run(mode, scratch)
    for label, value in [least, *table, *scanned]:  # the table, printed as well as reported
        print(f"  [pipeline] {label.strip()}: {value.replace('**', '')}", flush=True)
    return _result(
        document,
        renders,
        table=table,
        scanned=scanned,
        least=least,
        figures={
            "own_cpu": own_cpu,
            "render_cpu": render_cpu,
            "in_pipeline": in_pipeline,
            "alone": alone,
            "db_seconds": db_seconds,
            "db_calls": db_calls,
            "provider_alone": alone_seconds,
        },
        described=(db_described, f"{calls} / {connections}", str(renderer.workers)),
        seconds=time.perf_counter() - started,
    )


def _result(
    document: Run,
    renders: list[float],
    *,
    table: list[tuple[str, str]],
    scanned: list[tuple[str, str]],
    least: tuple[str, str],
    figures: dict[str, float],
    described: tuple[str, str, str],
    seconds: float,
) -> Result:
    pages, wall, ideal = document.pages, document.wall, document.ideal
    db_described, provider_calls, workers = described
    overhead, claimed_overhead, claim_wait = document.overheads()
    model = [float(r["latency_ms"]) / 1000 for r in document.rows]
    last_completed = max(float(r["completed_at"]) for r in document.rows)
    transcribes, upload = document.transcribes, document.upload
    transcribe_seconds = sum(i.seconds for i in transcribes)
    emulator = wall - upload.seconds - transcribe_seconds
    own_cpu, render_cpu = figures["own_cpu"], figures["render_cpu"]
    provider = figures["provider_alone"]
    return Result(
        key="pipeline",
        title=f"Pipeline overhead ({pages}-page PDF, {len(transcribes)} batches, provider answering in 1.0 s)",
        ratio_label="wall / ideal",
        ratio=document.ratio,
        target=1.10,
        direction="<=",
        summary=(
            f"wall {wall:.2f} s vs ideal {ideal:.1f} s (one environment, batches in turn); per-page overhead "
            f"median {median(overhead) * 1000:.0f} ms, p95 {percentile(overhead, 0.95) * 1000:.0f} ms"
        ),
        rows=[
            ("wall time, S3 put -> document finished (transcript written)", f"{wall:.2f} s"),
            (
                f"ideal: {document.batches} batches x {document.rounds_per_batch} x {MODEL_SECONDS:.1f} s, one env.",
                f"{ideal:.1f} s",
            ),
            ("**wall / ideal** (judged)", f"**{document.ratio:.2f}**"),
            ("upload function (S3 event -> jobs committed, messages sent)", f"{upload.seconds * 1000:.0f} ms"),
            (
                f"transcribe function, {len(transcribes)} invocations",
                f"{transcribe_seconds:.2f} s (median {median([i.seconds for i in transcribes]):.2f} s each)",
            ),
            ("local emulation (receive, delete, polling) and the rest", f"{emulator * 1000:.0f} ms"),
            (
                "last page committed -> document finished",
                f"{(document.t0_wall + wall - last_completed) * 1000:.0f} ms",
            ),
            ("model call as the handler timed it (latency_ms), median / p95", spread_ms(model)),
            (
                f"the provider and its client alone: the run's {pages} requests again, each batch's "
                f"{min(BATCH, pages)} sent at once by a bare httpx client in this process (the fake answering in its "
                "own, as in the run), batches in turn",
                f"{provider:.2f} s / {ideal:.1f} s = {provider / ideal:.2f}",
            ),
            (
                "the pipeline beyond the provider alone (wall less it), per batch",
                f"{(wall - provider) / document.batches * 1000:.0f} ms",
            ),
            least,
            ("**per-page overhead**: invocation start -> result committed, less model", f"**{spread_ms(overhead)}**"),
            ("  part: invocation start -> claim committed", spread_ms(claim_wait)),
            ("  part: claim committed -> result committed, less the model call", spread_ms(claimed_overhead)),
            (
                "render per page in the batch (RenderPool.render: the wait for a free render process, the render "
                f"in it, the image back; {workers} process(es))",
                spread_ms(renders),
            ),
            ("sum of the renders over the document", f"{sum(renders):.2f} s"),
            (
                "pages whose image was rendered ahead (RENDER_AHEAD_PAGES: while the batch before them was at the "
                "model), not by their claim",
                f"{pages - len(renders)} of {pages}",
            ),
            (
                "database time in Database calls (all functions), per page",
                f"{figures['db_seconds'] / pages * 1000:.1f} ms in {figures['db_calls'] / pages:.1f} calls",
            ),
            ("Database calls", db_described),
            (
                "claim_jobs (with the batch's documents, per batch) + complete_job, per page: in the pipeline (mean) "
                "/ alone (median)",
                f"{figures['in_pipeline'] * 1000:.1f} ms / {figures['alone'] * 1000:.1f} ms",
            ),
            ("**round trips per page, by step** (statements counted at psycopg; a transaction adds 2)", ""),
            *table,
            ("provider calls / connections opened", provider_calls),
            (
                "CPU during the run: this process (the handlers and the local Lambda service) / its child processes "
                "(render workers, moto, the fake provider; each with its start, reaped at the end) / both, of the "
                "wall time's two cores",
                f"{own_cpu:.2f} s / {render_cpu:.2f} s / {(own_cpu + render_cpu) / (2 * wall):.0%}",
            ),
            *scanned,
        ],
        notes=[
            "What stands in for AWS and the provider works apart from the handlers, as they do deployed: moto in a "
            "process of its own, its SQS spared the work it need not do (quicker_sqs: a receive of ten at this "
            "queue's depth had taken 55-100 ms of its CPU, beside the handlers'), the fake provider in another "
            "(reading and decoding ten 0.5 MB requests a batch), and the local event source's receives and deletes "
            "on threads of their own, a long poll always out for the next batch, as Lambda's pollers are "
            "(SqsEventSource receive_ahead). The other benchmarks keep both in this process.",
            "Measured: one local execution environment, batches delivered one after another (LambdaService). "
            f"Deployed, the event source runs up to MaximumConcurrency (default 5) environments at once, so the "
            f"{document.batches} batches could overlap and the ideal would be about "
            f"{math.ceil(document.batches / 5) * MODEL_SECONDS:.0f} s; this run does not measure that.",
            "Every page passes the cost gate (a tenant daily budget of $1,000,000, one priced call of the model "
            "recorded before the run so that no page waits for the first price) and the rate governor (1,000,000 "
            "requests and 10^10 tokens a minute, burst 1,000: never a wait), so that each step is made and counted.",
            "Round trips per page, all steps, as measured by this benchmark's full run (50-page PDF): 8.48 (6.44 "
            "statements) on commit 945c7c1; 5.38 (6.34 statements) on commit 8ccc8db, where the claim reads its "
            "documents in its own statement (claim 0.20 -> 0.10 per page) and the cost gate's transaction goes as one "
            "query string (admission 4.00 -> 1.00); 4.48 (4.54 statements) on commit 9a94aba, where the cost gate "
            "passes a batch's pages of a document at once (admission 1.00 -> 0.10); 1.68 (1.74 statements) on commit "
            "0781d37, where the rate governor takes a batch's slots at once and settles its calls once it is done "
            "(slot 2.04 -> 0.24), and the write that ends a page notes its image (page image 1.00 -> 0). The count is "
            "the code's, not the machine's: the first two runs were at a load average of about 8 and 27 (other work "
            "on the machine), which their wall times show and their counts do not. Then 1.18-1.24 (1.74 statements), "
            "where a batch's completions made while one is being written go together in one transaction (completion "
            "1.00 -> 0.50-0.56).",
            "The fake provider's delay counts from each request's arrival, its own reading and decoding of the request "
            "within it, as a provider's latency does (from commit e787c81): before, ten requests arriving together "
            "were parsed in turn under the fake's one GIL before each delay began, and their answers came over ~50 ms "
            "(the provider and its client alone 1.05 s a batch; 1.03 since).",
        ],
        seconds=seconds,
    )
