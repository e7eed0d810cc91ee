# ruff: noqa: RUF001  (the report is prose: it uses typographic multiplication signs and dashes)
"""docs/benchmarks.md: machine facts, the results table, what each figure means, and what the runs found."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

from bench import coldstart, rendering
from bench.common import ADMIN_URL, REPO, Mode, Result

PACKAGES = ("psycopg", "sqlalchemy", "moto", "boto3", "httpx", "aws-lambda-powertools", "pypdfium2", "pillow")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gib() -> str:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
    except OSError:
        pass
    return "unknown"


def _postgres_version() -> str:
    try:
        with psycopg.connect(ADMIN_URL, autocommit=True, connect_timeout=5) as conn:
            row = conn.execute("SHOW server_version").fetchone()
            return str(row[0]) if row else "unknown"
    except psycopg.Error as exc:
        return f"unreachable ({exc})"


def _git_head() -> str:
    """The checked-out commit, and whether the production code differs from it."""

    def git(*args: str) -> str:
        command = ["git", "--no-optional-locks", *args]  # read-only: never rewrites the index
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=False)  # noqa: S603
        return done.stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--", "shared", "functions")
    return head + (" (with uncommitted changes in shared/ or functions/)" if dirty else "")


def replace_section(document: str, text: str, heading: str) -> str:
    """``document`` with its section under ``heading`` (up to the next ``## `` heading) replaced by ``text``, or
    with ``text`` appended when it has none."""
    lines = document.splitlines(keepends=True)
    start = next((index for index, line in enumerate(lines) if line.rstrip() == heading), None)
    if start is None:
        return (document.rstrip("\n") + "\n\n" if document.strip() else "") + text
    end = next((index for index in range(start + 1, len(lines)) if lines[index].startswith("## ")), len(lines))
    rest = "".join(lines[end:])
    return "".join(lines[:start]) + text + ("\n" + rest if rest else "")


def publish_section(text: str, heading: str, markdown: Path | None) -> None:
    """A measurement's markdown section printed, and written into ``markdown`` under ``heading`` when it is given
    (the section there replaced, or appended to the file)."""
    print(text)
    if markdown is not None:
        existing = markdown.read_text(encoding="utf-8") if markdown.exists() else ""
        markdown.write_text(replace_section(existing, text, heading), encoding="utf-8")
        print(f"wrote the section into {markdown}", file=sys.stderr)


def machine_facts() -> dict[str, Any]:
    nproc = subprocess.run(["nproc"], capture_output=True, text=True, check=False).stdout.strip()  # noqa: S607
    load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
    facts: dict[str, Any] = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": nproc,
        "cpu": _cpu_model(),
        "memory": _memory_gib(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "postgres": _postgres_version(),
        "packages": ", ".join(f"{name} {importlib.metadata.version(name)}" for name in PACKAGES),
        "commit": _git_head(),
        "load": load,
    }
    facts["summary"] = (
        f"nproc {nproc}, {facts['cpu']}, Python {facts['python']}, PostgreSQL {facts['postgres']}, load {load}"
    )
    return facts


EXPLANATIONS: dict[str, str] = {
    "claims": """\
Sixteen threads each repeat *claim the oldest due job* + *fenced completion* until nothing is left. The
Database side calls `Database.claim_next_queued_jobs(limit=1)` and `Database.complete_job` over
`create_database_engine(url, pool_size=16)`. The raw side runs the very same SQL constants
(`CLAIM_NEXT_QUEUED_JOBS`, `COMPLETE_JOB`) through psycopg 3, one connection per thread, `prepare_threshold=None`
like the engine. Database runs every single statement in autocommit, so the judged baseline is raw psycopg in
autocommit (the same one-statement transactions); the same SQL in explicit `BEGIN … COMMIT` per statement is
shown too. Every side and round gets fresh jobs (documents of 100 pages, as the upload function creates them);
the sides alternate in rounds (ABC CBA …) and the judged ratio is the median of the per-round ratios, because
the server and both cores are shared with other work. Every claim is counted per job id: a job claimed twice, a
completion that finds its lease gone, or a table that disagrees fails the run. The benchmark database runs with
`synchronous_commit = off`: a commit's WAL flush costs the same on both sides and on this shared disk it is
mostly noise, so without it the figure is about the code path (round trips and client CPU). Round trips come
from libpq's protocol trace (one `ReadyForQuery` per exchange), server transactions from
`pg_stat_database.xact_commit`.""",
    "connections": """\
The real transcribe handler, warm (one runtime: one provider client and pool for the whole run), gets ten
batches of ten messages for one 100-page PDF from the local Lambda service (`LambdaService.deliver_jobs`),
against `FakeChatServer`, which counts the TCP connections it accepts. The fake answers after 0.25 s so that
the ten calls of a batch are in flight together and the pool must really hold ten connections. A client per
page would open 100 connections; a client per invocation, 10 per invocation.""",
    "pipeline": """\
A 50-page PDF (the 4-page corpus document imported again and again) goes the whole local way: `put_object` into
`uploads/` in moto, S3's notification to the upload function, 50 messages, then batches of ten to the transcribe
function (PAGE_CONCURRENCY=10) until the transcript is written, against a fake provider that answers every page
after exactly 1.0 s. moto and the fake provider run in processes of their own, and the local event source keeps a
long poll out for the next batch while one is handled, as Lambda's pollers do (the other benchmarks keep moto and
their fakes in the benchmark's process). **What is measured:** one local execution environment (`LambdaService`
delivers one batch at a time), so the ideal is 5 batches × 1.0 s = 5 s. Deployed, the event source would run up to
`TranscribeMaximumConcurrency` (default 5) environments at once and the ideal would be about 1 s; that is not
measured here. Wall time runs from the `put_object` to the document being finished. Per page, from the jobs table
(`started_at` = the claim's commit, `completed_at` = the result's commit, `latency_ms` = the model call as the
provider client timed it) and the start of the invocation that carried the page: the per-page overhead is the page's
time in the handler less its model call. Renders are timed around `RenderPool.render` (the wait for a free render
process, the render in it, the image back). Database time is the wall time spent inside `Database` methods
(instrumented in this process only). Commits are durable here (`synchronous_commit` as the server has it). Every
page passes the cost gate (a tenant daily budget, with one priced call recorded before the run) and the rate
governor (a rate that never makes a page wait), so each step is made: per page, each step's statements and round
trips are counted at psycopg (`Cursor.execute`, and BEGIN and COMMIT for each `Connection.transaction`) by the
`Database` method that ran them (bench/roundtrips.py), and the functions' SQS and S3 calls by operation (botocore's
events). A second document, a PDF of scans with no text layer (congress.pdf and cardinal.pdf in turn), then goes the
same way in a stack of its own: orientation and the second read (SECOND_READ=auto) on every page; its wall / ideal
is reported beside, not judged.""",
    "fanout": """\
The upload function gets the S3 event of a 1,000-page PDF (`MAX_PAGES=1000` for this run; 300 pages with
`--quick`): it downloads the object, counts the pages, commits the document and one job per page in one
transaction, sends one message per job with `SendMessageBatch` (ten per call) and stamps them sent. Its handler
time is compared with a bare loop that sends the same number of messages of the same shape, ten per call,
through a client with the same configuration. Both send into a queue that starts empty, in the same moto
server (moto's SQS recounts the queue for every message it accepts, so a call's cost grows with queue depth:
the last row shows it). API calls are counted with botocore `before-call` hooks on the clients; database time
is the wall time inside `Database` methods. There is no fixed target: the ratio shows what the upload adds to
the sends it cannot avoid, and the call counts show it makes no more SQS calls than the bare minimum.""",
    "coldstart": """\
For each function, `import functions.<name>.app` in a fresh interpreter (`python -c`, working directory the
repository), timed with `perf_counter` around the import, median of N runs, alternated with a fresh interpreter
that imports only the third-party modules that handler import loads — the exact list, found by diffing
`sys.modules` before and after the handler import (every non-stdlib module outside `pagescribe` and
`functions`, in load order). The ratio is what pagescribe's own modules, and the standard-library modules only
they use, add. "pagescribe's own modules" is their self time from `python -X importtime`; "heaviest packages"
sums self time per top-level package. Peak RSS (`VmHWM` in `/proc/self/status`; `ru_maxrss` would do, but on
Linux it keeps the forking parent's peak across fork + exec, and this parent is large) after the import, and
after one real invocation
in a fresh process (upload: the S3 event of a 4-page PDF; transcribe: its batch of four messages against the
fake provider; api: `GET /documents/{id}`; sweeper: the scheduled event; migrate: a CloudFormation `Update`
answered to a local URL). Bytecode and page caches are warm (one import of each function first), as in a
re-used Lambda image; a first-ever start that compiles bytecode is slower on both sides. The baseline imports
a subset of what the handler imports, so a ratio below 1 is this shared machine's noise (single imports vary by
tens of percent here); the self-time column is the steadier view of what the project's own modules cost.
Locally `import httpx` also loads its command-line extra (click, rich, pygments: about 20 ms) because `.venv`
has those packages; the Lambda layer (`shared/requirements.txt`) does not, so deployed imports are a little
lighter on both sides of the ratio.""",
    "governor": """\
The issue's setting: a fake provider that allows 60 requests in any 60 seconds (a sliding window, the strictest
reading of "60 a minute"; beyond it, 429 with the Retry-After until a request leaves the window), 8 concurrent
execution environments and one 200-page document. Each environment is a thread with its own `Runtime` (its own
database pool, provider client, render process and event loop), polling the jobs queue for batches of ten as the
event source does and running the transcribe path on them. The same document goes through twice in one run: with
the governor (`RATE_LIMIT_RPM` just under the limit, `RATE_LIMIT_BURST=1`) and without it (`RATE_LIMIT_RPM=0`:
each page's provider client retries its own 429s after their Retry-After, inside the invocation). Throughput is the
requests the provider admitted per minute, from the first to the last, against its limit; function time is the sum
of the environments' invocations, what Lambda would bill. Every request the provider received must be recorded as a
call (`attempts`), or the run fails.""",
    "caps": """\
Ten 10-page documents are created through the API's service with `max_cost_usd` = (k + 0.5) × the price the fake
provider reports per call, k = 0..9, so that each one's cap is reached at page k. The model's price is known from
one earlier page. Every job message is sent three times (SQS delivers at least once), and 8 environments (as in the
governor benchmark) transcribe concurrently. A document is exact when it completed k pages, made k calls and
recorded k × the reported price; a call beyond k is a call started after the cap was reached. The provider's request
count must equal the calls recorded.""",
    "built": """\
What a user gets: `scripts/build` (`sam build`, then the bytecode compiled by python3.12 as "unchecked-hash" .pyc
files) builds the functions and the layer for this machine's architecture under `.aws-sam/bench-build`. Each
handler is imported as Lambda imports it: `import app` in a fresh python3.12 (`-s`), working directory the built
function, `PYTHONPATH` the built function then the layer's `python/` (`/var/task`, then `/opt/python`), and
`PYTHONDONTWRITEBYTECODE=1` (both are read-only in Lambda). Alternated with a fresh python3.12 importing only the
third-party modules that import loads, from the same layer; medians of five. Lambda's own runtime start and the
download of the code are not in it.""",
    "tiles": """\
Dense pages read whole and in tiles with the offline engine as the model (`bench/tiles.py`; real born-digital pages
in small print, sources in `tests/data/forms/SOURCES.md` and `tests/data/documents/SOURCES.md`): each page rendered
whole at a model-sized input (RENDER_MAX_LONG_EDGE 1,024 and 1,568 px; 1,024 only with `--quick` and `--smoke`), read
by `RapidOcrProvider`, then cut into bands as the pipeline cuts a dense page (default TILE_* settings, the words'
height from the page's text layer), each band rendered and read, the answers stitched. Both readings are scored
(CER) against the page's own text layer read line by line (`bench.forms`). The judged ratio is the mean CER with tiles
over the mean CER whole (a page not tiled at a size counts its whole reading in both); `docs/accuracy.md` has the
full table (`python -m bench.tiles --markdown docs/accuracy.md`).""",
    "secondread": """\
Ten scanned pages (an image-only PDF of the real scans in `tests/data/documents`: the page of `congress.pdf` and the
four of `cardinal.pdf`, in turn) in one SQS batch, one local execution environment, against a fake provider that
answers every page after 5.0 s (3 pages and 2.0 s with `--smoke`). The environment has the deployed one's shape:
`AWS_LAMBDA_FUNCTION_MEMORY_SIZE` is the transcribe function's `MemorySize` in template.yaml, so pages render in the
render processes that memory holds, and the second read runs in its own process (`SECOND_READ_MEMORY_LIMIT_MB`). Each
document is created through the API's service with its own `second_read` (`auto`, `off` or `always`: what
`SECOND_READ` sets for a whole stack) and `reuse` off, then put in S3; its wall time runs from the put to the document
finished. The first document (`auto`) starts the reading process and loads the engine, once per environment: it is
shown, not compared. Then in rounds: `auto` and `off` in alternating order, then `always`; the judged ratio is the
median of the rounds' `auto` / `off`, and `always` / `off` is information (`always` waits for its reads within the
page's time budget). Before each document the benchmark waits until the reading process is free (a read a page
stopped waiting for goes on in it). Pages read are the JSON transcript's `pages[].attempts[].second_read` that have
`lines`; the others say why they went without (`skipped`). Memory: each process's peak resident set (`VmHWM` in
`/proc/<pid>/status`, sampled every 0.1 s while the documents run, and once at the end) of the render processes
(`runtime.renderer.pids`), the reading process (`runtime.reading_pool.pids`) and this process, whose peak is reset
first (`/proc/self/clear_refs`). This process holds moto, the fake provider and the benchmark beside the handler, so
its figure is an upper bound of the function's own; the next row puts the 256 MB the settings reserve for the handler
in its place. Every page must complete at its first attempt with one provider call, and no page may be read with
`off`, or the run fails.""",
    "rendering": """\
`render_page` on every page of every corpus PDF that opens (the password-protected one is refused, as the
pipeline refuses it), one thread, each setting over the whole corpus in turn within each pass, after one
warm-up pass. Bytes per page are the encoded image sent to the provider (before base64, which adds a third).
The token column applies Anthropic's published estimate to the mean image size; see *Choice of image size*.""",
    "dbload": """\
No rendering, no model, no queue: a worker is a page in flight. Five OS processes (forked from one server process
that imported pagescribe once) run environments of ten page threads each, as the transcriber runs a batch, and call
`pagescribe.store.postgres.Database` exactly as the transcribe path does, in its order: per batch of ten ids
`claim_jobs` (which reads the jobs' documents too), then the cost gate `admit_spends` for the batch's pages, as they
reach it together in the transcriber (LOCK_SPENDERS, then ADMIT_SPEND for the pages, in one transaction sent as one
round trip: every document has a `max_cost_usd`, every tenant a daily budget, both far above what the run spends, and
each tenant a completed page before the run, so the gate prices calls from its history as in production), and the
rate governor's `take_rate_slots` for them through `RateGovernor.admit` (a bucket no run can empty: the statement
runs, no page waits); then the batch's ten pages at once, each after the think time: `complete_job` with a cost,
noting the page's image in the same write. SPREAD: documents of 50 pages, four per tenant, batches shuffled; HOT:
one document of one tenant. Each run takes batches for a fixed window on a fresh database; then each worker ends the
page it is on and gives its batch's other pages back (`defer_job`, as a page held back by a gate); pages/s counts
the pages completed within the window past its first quarter (the warm-up), and the latency percentiles are of the
calls started there too. With a think time the environments start spread over one think time (as environments
taking batches from a queue do; started at one instant, every page would end with all the others, batch after
batch); saturated, they start together. An environment's pages take turns on its one connection, as deployed (the
runtime's pool of one, behind RDS Proxy; the Data API's calls are not so bounded), and the environments share at most
40 connections to the server, one an environment (fewer when the server has fewer free), handed out first come first
served as RDS Proxy queues its clients; the wait for both is timed apart from the call. A
separate connection samples `pg_stat_activity` and `pg_locks` every 50 ms: the busy backends' wait events, and for
lock waits the table whose row is waited on (the waiter's tuple lock). Every run checks that each page done is
COMPLETED once (one claim, one recorded call), the rest still QUEUED, and each document's counter (read through
`get_documents`) equals its completed jobs; a claim that misses a fresh job or a completion that finds its lease
gone fails the run.""",
}

IMAGE_SIZE = """\
## Choice of image size

Pages are rendered at 150 dpi, capped at 1,568 px on the long edge, as JPEG quality 85 (`RENDER_DPI`,
`RENDER_MAX_LONG_EDGE`, `RENDER_FORMAT`). The reason is what the providers publish about how their vision
models see an image — approximate guidance that changes from model to model:

- **Anthropic** documents that an image whose long edge is over about 1,568 px, or that would cost more than
  about 1,600 tokens (≈ 1.15 megapixels), is scaled down before the model sees it, and estimates input tokens
  as about width × height / 750. A page sent larger than that costs upload bytes and resize time and gains
  nothing the model can see (newer Claude models publish a larger native size, so the cap is a setting).
- **OpenAI** (high detail, GPT-4o-class models) fits the image into 2,048 × 2,048, scales its short side to
  768 px and bills per 512 px tile, so a page-shaped image costs the same few tiles at any higher resolution.
- **Gemini** (the default model here) counts an image in 768 × 768 tiles of a fixed token cost each.

One nuance the table shows: by the same (pre-4.7) Anthropic guidance a full page at the default size is over
the area limit, so Claude would scale it down again to about 1.15 MP (roughly 900 × 1,270 px); the token
column is at that ~1,600 ceiling for every setting but the 1,024 px one. For Claude alone a cap near 1,270 px
would send no pixel it discards; the default keeps 1,568 px because it is the long-edge limit they publish,
Gemini and OpenAI tile rather than shrink, and newer models read more.

At 150 dpi a Letter or A4 page is about 1,240–1,275 × 1,650–1,754 px, so the cap trims it a little; body text
stays legible (10 pt type is about 20 px tall at 150 dpi), 300 dpi would only add render time and bytes that the
provider scales away (see the 300 dpi row: same pixels after the cap), and a 1,024 px cap would save time and
bytes but start to blur small print. JPEG q85 is somewhat smaller than PNG on these pages and faster to
encode; `RENDER_FORMAT=png` remains for line art where JPEG ringing matters."""

LIMITS = """\
## Limits of these measurements

- **A shared, small machine.** Two cores, shared with other engineers' test suites and with the PostgreSQL
  server; the load average at the start and end of the run is above. Rates move by tens of percent between
  runs; the benchmarks alternate the sides they compare and report medians of paired rounds where they can,
  and each section says what its ratio compares.
- **moto is not SQS.** Its SendMessage cost grows with queue depth and, but in the pipeline benchmark, it runs
  in this process, on the same cores. Fan-out compares the upload with a bare loop at the same depth and reports
  the API calls made; the absolute seconds say little about AWS.
- **One local execution environment.** The pipeline benchmark delivers batches one after another; Lambda
  would run several environments at once. Deployed latencies to RDS Proxy and the provider are larger than
  on 127.0.0.1, which makes round trips count for more than they do here."""


def _table(header: tuple[str, str] | None, rows: list[tuple[str, str]]) -> str:
    if header is None:
        lines = ["| figure | value |", "| --- | --- |"]
        lines += [f"| {label.strip()} | {value} |" for label, value in rows]
        return "\n".join(lines)
    columns = [header[0], *header[1].split(" | ")]
    lines = ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    lines += [f"| {label} | {value} |" for label, value in rows]
    return "\n".join(lines)


HEADERS: dict[str, tuple[str, str]] = {"coldstart": coldstart.table_header(), "rendering": rendering.table_header()}


def _row(result: Result, prefix: str) -> str:
    for label, value in result.rows:
        if label.strip("* ").startswith(prefix):
            return value.strip("*")
    return "?"


def _findings(by_key: dict[str, Result]) -> str:
    parts = [
        "## Performance problems found, and what was done\n",
        "The first full run (commit 619a961, 2026-12-03) missed three targets: claims 0.50 of raw psycopg, pipeline "
        "1.40× the ideal, cold start 1.21×. Each was traced to its cause and the cause fixed in the production code; "
        "the figures in this document are after the fixes, and the table above says which targets they meet.\n",
    ]
    claims = by_key.get("claims")
    if claims is not None:
        parts.append(
            f"""### 1. Claims: a ping before every statement, and SQLAlchemy's statement layer

**Found:** `create_database_engine` set `pool_pre_ping=True`, so every `Database` call first sent an empty query
and waited for it: 4 round trips per claim+complete pair where raw psycopg makes 2 (libpq trace), 4.03 server
transactions per pair against 2.02. And SQLAlchemy's `Connection.execute` (checkout events, the autocommit
execution option set and reset on every checkout, compiled-cache lookup, `Row` building) cost 1.17 ms of client
CPU per pair against 0.27 ms for raw psycopg: with 16 threads on 2 cores under one GIL, client CPU is
throughput. Database reached 0.50 of raw.

**Done (commit fd158a4):** `Database` runs its named SQL constants (psycopg's `%(name)s` placeholders) on the pool's
psycopg connection itself, with `namedtuple_row`; SQLAlchemy keeps the pool and Alembic the migrations. The pool's
connections are autocommit (a new document's rows still commit in one explicit transaction). Nothing pings: a
connection the server closed (restart, failover, RDS Proxy's idle timeout) is found when used, dropped, and the
statement runs once more on a fresh connection — safe for every statement here, since claims and fenced writes
find the rows already moved and the one plain insert is `ON CONFLICT (id) DO NOTHING`.
`test_a_connection_the_server_closed_is_replaced_and_the_statement_runs_once_more` terminates a pooled
connection's backend and checks the next claim succeeds exactly once; the database-restart reliability test
passes with the warm environment recovering on its next invocation.

**Now:** round trips per pair {_row(claims, "client-server round trips")}; client CPU per pair
{_row(claims, "client (Python) CPU")}; Database / raw **{claims.ratio:.2f}** (target ≥ 0.9, issue 32).
The ratio moves from run to run more than between the code of two commits: `bench.run --only claims` alternated
on one machine with commit ae11805 (before the stop that ran this; its changes do not touch the claim path) read
0.95, 0.92, 0.91, 0.92 for it and 0.91, 0.87, 0.97, 0.98 for c789f57, each run's Database and raw psycopg rounds
alternating within it.
"""
        )
    pipeline = by_key.get("pipeline")
    if pipeline is not None:
        parts.append(
            f"""### 2. Pipeline: per-page claims and reads, renders behind one lock

**Found:** each page of a batch made three `Database` calls (claim, read its document, result), each with its
pre-ping, synchronously on the event loop, before its render could start; and pdfium, which is not thread-safe,
rendered the batch's ten pages one at a time behind a process-wide lock (90 ms median per page in the batch,
mostly waiting, against about 25 ms of work). The local Lambda service deleted handled messages one call each.
Wall time was 1.40× the ideal.

**Done:**
- the transcribe handler claims its whole SQS batch in one statement (`CLAIM_JOBS_BY_ID`: `id = ANY`, `LIMIT`,
  `FOR UPDATE SKIP LOCKED` on the jobs alone) that reads the batch's documents too, joined after the lock (commits
  fd158a4, 2a4f08d): one round trip per batch instead of six per page;
- pages render in long-lived worker processes (`RenderPool`, commits de49e67 and e167f14), as many as the
  function's memory holds at `RENDER_MEMORY_LIMIT_MB` each, at most the CPUs; they also bound a bomb page's
  memory (the hostile-input suite's decompression bomb fails its page, naming the limit);
- pdfium renders RGB directly (no BGR→RGB conversion: about 2.4 ms per page) and the local service deletes with
  `DeleteMessageBatch`;
- a PDF page is JPEG-encoded straight from pdfium's bitmap (commit 6a9d26a) instead of from a copy of it: copying
  the pixels into a fresh 5 MB buffer (page faults on a new allocation every page) cost as much as the render,
  15.1 ms → 9.6 ms per page in-process, with byte-identical images.

**Issue 32 (no gap before a call):**
- pages render ahead (`PageImages`, commits 8dbf72b..bef0bda): once a page of a batch is rendered, the render
  processes the batch no longer needs render, in spare time (never while a page of a batch waits for a process),
  the pages that follow the batch in its documents, at most `RENDER_AHEAD_PAGES` (10); the next batch on the same
  environment takes its images and starts its calls at once. With other environments at work on the document, the
  window skips the pages they will take (the stride between this environment's last two batches). Pages rendered
  ahead here: {_row(pipeline, "pages whose image was rendered ahead")};
- the transcribe function starts all its render processes during init (`RenderPool.prestart(workers)`), not on the
  first batch;
- a page rendered at its claim (the first batch's) is sent before its words are placed on the image (commit
  3b1a42a): placing them, the grounding evidence, was most of a born-digital render's time; they are placed while
  its call runs, and the size of its print that decides tiling is measured with the render (each word by its first
  letter or digit, a third of the cost);
- the gates take a batch's pages at once: the cost gate's one transaction, the rate governor's take (commit
  5def5a3) and, once the batch is done, the settling of its calls' tokens (commit 6a40c5e); the write that ends a
  page notes its image (commit 3b84e00).

**Now:** wall / ideal **{pipeline.ratio:.2f}** (target ≤ 1.10: {"met" if pipeline.met else "**not met**"});
Database per page {_row(pipeline, "claim_jobs (with")} (in the pipeline / alone); renders
{_row(pipeline, "render per page")} per page in the batch (median / p95, the pages their claims rendered,
including the wait for a free process); per-page overhead {_row(pipeline, "per-page overhead")} (median / p95).
What remains is the first batch's render phase (nothing is rendered before the first claim: its last page starts
its call only when its own render is done, the renders sharing the two cores with the calls being sent and the local
stack's moto and fake provider), the time the batch's requests take to reach the fake provider and its answers to be
completed, the upload function ({_row(pipeline, "upload function")}) and the local service's polling
({_row(pipeline, "local emulation")}).
**The least this machine allows**, the upload, the first batch's renders with nothing else at work and the provider
with its client alone, one after another: {_row(pipeline, "least this machine allows")} (born-digital), and
{_row(pipeline, "scanned: least this machine allows")} with scans. Between it and the wall are the pipeline's own
steps: per batch, the claim and the gates before its calls, its last answers grounded one after another once
they come back and written together, and in the first batch the renders slowed by the calls sent beside them. A
scanned page's render (a bilevel letter page: its JBIG2 image decoded and scaled, the page looked at for its turn:
about 75-90 ms of CPU) makes the first batch's render phase about half a second on two cores, so with scans the
least is above 1.10 here: that target cannot be met on this machine while the first batch is rendered at its
claims.
**The figure depends on CPU speed**, because the render phase is CPU work measured against a fixed 1.0 s model
call. Deployed, the event source spreads a document's batches over several environments: a render ahead is used
only where the stride between an environment's batches holds, and a page's model call takes seconds rather than
1.0 s, so the first render phase is a smaller share.
"""
        )
    cold = by_key.get("coldstart")
    if cold is not None:
        parts.append(
            f"""### 3. Cold start: every function imported every module

**Found:** `pagescribe.runtime` imported all the domain modules at the top, so the sweeper, API and migrate
functions imported `pagescribe.sources` with pypdfium2 and Pillow, the transcribe function the API service,
and so on.

**Done (commits e167f14, ff654c8):** `Runtime` imports each domain module inside the cached property that builds
it, and each handler imports at cold start what it always uses (no pagescribe module is first loaded during an
invocation); `parse_page_selection` moved to the API service, so the API no longer loads pdfium to parse
"1-3,7"; `httpx` is imported where the CloudFormation answer is sent. The settings model no longer runs
pydantic-settings' container checks (`issubclass` against `Mapping`, `Sequence`, … for each field, whose
negative answers Python caches in every subclass: about 2,600 objects and 7–10 ms, which in the migrate
function set off one more full garbage collection) for its all-scalar fields, nor the empty `.env` and
secrets-directory sources. Measured in instructions executed (valgrind, fixed hash seed), pagescribe's own
import work went from 175–234 M to 28–123 M instructions per function.

**Now:** worst ratio **{cold.ratio:.2f}** (target ≤ 1.2): {cold.summary}.
"""
        )
    parts.append(
        """### 4. Checked pages: what every page does more (issue 12)

Every page is now checked, and every PDF page's render also reads the page's visible text layer (about 1.5 ms
for a full page of text here) and estimates its ink from a sixteenth of its pixels (0.2 ms; a full grey
histogram took 2.2 ms); the answer's checks take about 1 ms for a short answer and 6 ms for a full page of text;
the fenced completion inserts the call's row into `attempts` in the same statement (the claim benchmark's pairs
per second dropped on both sides alike, its ratio did not). Scans (images, and PDF pages without a usable text
layer) also run the orientation detector, about 15 ms a page; born-digital pages skip it. Measured side by side
with the code before this work (commit c43a394), alternating, two runs each, on one (busy) machine: pipeline
overhead 1.31 and 1.30 then, 1.31 and 1.28 now; rendering 86 and 78 pages/s then, 64 and 68 pages/s now. The
figures above are this run's.

### 5. The pipeline's own gaps, on a slower machine (issue 32)

On the machine of the run above, the code of commit 560eb79 measured 1.34-1.54 (`bench.run --only pipeline`). A
timeline of one run (the renders, the calls, the fake's receipts, the completions and the collector's passes, a
script not kept) showed, besides the provider's own time: each render process's first page taking 111 ms against
35-50 ms for the next (pdfium's start, the JPEG encoder, the word placing loaded); a full garbage collection in the
first batch stopping every thread for 144-149 ms (~250,000 objects tracked, most of them loaded at init); the
first model call loading the HTTP client's event-loop machinery (anyio, 134 ms of imports on the event loop); and
each batch's ten page images going to S3 while its ten model requests were being sent. The render workers now warm
up at init, init ends with `gc.freeze()` and the anyio machinery loaded, and a batch's images are stored once its
calls are sent. Interleaved with the code before each change (three runs each, twice): first invocation 0.35-0.59
-> 0.16-0.24 s after the S3 put; first batch 1.40-1.63 -> 1.23-1.35 s; later batches 1.17-1.30 -> 1.12-1.22 s. The
row "the provider and its client alone" replays the run's requests to the same fake with nothing else at work: a
batch of ten takes about 60-80 ms beyond the fake's 1.0 s on this machine (httpx's work on the event loop, about
6 ms a request, and the fake's decoding, about 2 ms), so 1.10 of ideal leaves the pipeline itself about 20 ms a
batch. What is left per batch beyond that: the receive of the next batch from moto (30-90 ms: moto's
ReceiveMessage reads the queue's attributes, every message's visibility among them, for each message it returns),
the batch's claim and gates before its calls (10-20 ms), and grounding and completing the last page (10-30 ms).

**Then, what stood in for AWS and the provider** (a later stop, on a quieter machine, where commit 5c7d2c5 measured
1.22, 1.22 and 1.25). moto and the fake provider ran in the handlers' interpreter: moto's ReceiveMessage (30-90 ms at
this queue's depth) and the fake's reading and decoding of each request held it while the handler sent, completed
and rendered ahead; and between two batches the local event source deleted the batch's messages and received the
next ones in turn (25-60 ms). Deployed, neither AWS nor the provider shares the function's interpreter, and
Lambda's pollers receive while the function works. The benchmark now runs moto (`LocalAws(own_process=True)`) and
the fake (`ChatServerProcess`) in processes of their own, and the event source with a long poll always out for the
next batch (`SqsEventSource(receive_ahead=True)`). Runs in turn on that machine, not interleaved: moto apart 1.24;
the fake apart too 1.21 and 1.21; the event source ahead too 1.14-1.18 (four runs). A later batch's timeline now:
the claim committed 3 ms in; the gates passed and the ten request bodies built 10-23 ms in; the ten requests'
answers begun 30-54 ms in; the answers back 1031-1080 ms in, the last page completed at 1090-1100 ms; the next
invocation 1-4 ms after. The first batch costs 220-300 ms more: the source's download (10-40 ms; moto's one process
receiving the next batch meanwhile), the gates (8-14 ms) and its ten renders on two processes (~160 ms). Tried and
dropped: the fenced completion in a thread (the event loop free during its round trip; the environment holds one
connection, so the completions wait in turn all the same: later batches 1.11-1.14 s against 1.08-1.13 s,
interleaved, four runs each); the upload's SendMessageBatch calls made at once (68 of its 90 ms), as the queue would
then hold the pages out of order, which rendering ahead relies on.

**Then, moto's own work and the requests' way out** (the next stop, on a machine where commit df5d8c2 measured
1.25-1.29 at first and 1.23-1.26 later, interleaved). A timeline script (not kept: the events of each page's claim,
gates, render, request body, request head and answer, the fake provider's receipt of each request line, the
completions; and the processes' CPU from /proc) showed two things. moto's SQS took 55-100 ms of CPU for a receive of
ten messages at this queue's depth and 11-24 ms for a SendMessageBatch: it reads the time through datetime objects,
for every message of the queue whenever a queue attribute is read, and it read all the queue's attributes three
times for each message it returned (its retention check). The receive made ahead as a batch starts then slowed that
batch's first steps, the first batch's source download most (11 ms alone, 60-120 ms beside the receive), and the
upload's five sends took 120 ms. The local stack now spares moto that work (`quicker_sqs`: its clock read with
`time.time()`, the retention check reading the retention period alone; what moto decides is unchanged): a receive
9-13 ms, the five sends 50-60 ms. And the ten requests of a batch went out together, late: every step of a
request's way to the socket yields to the event loop, so each request's bytes waited until every page's body was
made, and the fake received the first request line 58 ms into a later batch and the last at 92. A batch's requests
now take turns from the making of a body to its head on the wire (the body is then written while the next is made):
first line 33 ms in, last 72. Interleaved with df5d8c2, three runs each, text pages: 1.228, 1.264, 1.247 against
1.250, 1.198, 1.216; scans 1.52-1.55 against 1.38-1.57. What is left per batch: the gates before the calls (9-11 ms:
the cost gate's and the rate governor's round trips), the making and sending of ten requests (about 4 ms each on the
event loop, httpx's pool among them: its connection checks cost about 1 ms a request with ten connections), and
after the answers about 7 ms a page on the event loop (the answer read, grounded and checked, its completion's round
trip), about 70 ms for the last page's completion after the fake's last answer. Tried and not kept: the render
processes at nice 10 and moto's at nice 19 (no difference in runs in turn).

**Then, the fake's clock and the completions' turns** (the stop after, where commit ae11805 measured 1.15 here, the
least 1.09). The fake provider's own arrival stamps (a scratch copy writing them out) showed the ten requests of a
later batch, sent within 4-6 ms, stamped over 25-33 ms: in one process, each thread read its request's head only
once the others had parsed theirs (0.5 MB of JSON each, under one GIL), and its delay began after its own parse, so
the answers came 1.00-1.06 s after the requests. Its delay now counts from the request's arrival (commit e787c81),
as a provider's latency does: the provider with its client alone 1.05 -> 1.02-1.03 s a batch. The stamps still
spread over 25-33 ms (the head is read once the thread gets the interpreter), and a fake of sixteen processes on one
port (SO_REUSEPORT) did not narrow the answers (walls 5.58, 5.70, 5.73 s against 5.66, 5.79, 5.55 s alternated with
one process; not kept): on two cores the fake's parsing competes for the CPU either way. And a batch's completions
now go off the event loop, those made while one is written together in one transaction (commit c789f57):
completion round trips 1.00 -> 0.50-0.56 a page, all steps 1.68 -> 1.18-1.24; alternated with the writes one by one
(four runs each, after the fake's change), walls 5.557 s mean against 5.592. `bench.run --only pipeline` on the
same machine, before both: 1.15 (scans 1.34); after: 1.11, 1.12 (scans 1.27, 1.28), the least 1.05-1.06 (scans
1.17-1.18).

### 6. The database load test's own connections (issue 32)

The load test's worst p99 at the think-time load read 90-100 ms on the slower machines of the last two stops (37.5 ms
on an earlier one): `complete_job`, 6 ms at its p50, 89-94 ms at its p99, spread and hot alike. Its
cause was the test, not the path it tests. Its page threads took any of their process's eight connections, so the
ten pages of a batch, which end together after the same think time, were in the database at once: ten writes to the
same rows (a small document's one counter row) queued on each other's commits. A deployed environment holds one
connection (the runtime's pool of one, behind RDS Proxy), so its pages' statements take their turns on the client's
side, and the environments' connections are what RDS Proxy multiplexes. The test now holds an environment to one
connection too, and caps the connections to the server at one an environment. Run side by side on one machine
(`python -m bench.dbload`, the code before and after): think 1 s, 200 workers, `complete_job` p99 spread 89.0 ->
3.5 ms, hot 93.6 -> 4.0 ms, the worst statement's p99 93.6 -> 6.5 ms; the wait for a connection (now the
environment's own, then the server's) p99 5.8 -> 18.4 ms; saturated at 200 workers, hot / spread 0.92 -> 1.02 (598 /
649 -> 622 / 612 pages/s). With the Data API (no pooled connection) an environment's calls are not so bounded.
"""
    )
    parts.append(
        """### Not a performance problem, but seen while measuring

With `POWERTOOLS_METRICS_DISABLED=true`, Powertools 3.37 keeps every metric value and, once a metric holds 100
values, prints the whole set to stdout anyway (`add_metric` flushes at 100 values without checking the flag), and
`single_metric` prints whatever the flag says. So pagescribe records metrics only where it runs in Lambda
(`AWS_LAMBDA_FUNCTION_NAME` set; `pagescribe.observability`), and nowhere else. The benchmarks run the handlers as
in Lambda, metrics on as deployed, and discard the handlers' stdout.
"""
    )
    return "\n".join(parts)


def write_report(
    path: Path, results: list[Result], *, command: str, facts: dict[str, Any], total_seconds: float, mode: Mode
) -> None:
    by_key = {r.key: r for r in results}
    lines = [
        "# Benchmarks",
        "",
        "`bench/` measures pagescribe on the machine it runs on, all in one process: the claim path against raw",
        "psycopg, provider connection reuse, the local pipeline's overhead over the model's own time, the upload's",
        "fan-out, cold starts, page rendering, the rate governor, cost caps and the second read of scans. Each",
        "benchmark prints one line with the ratio it is judged by and its target, and every run rewrites this file.",
        "Targets are reported, not enforced: the command exits",
        "non-zero only when a benchmark crashes or sees a correctness violation (a job claimed twice, a page lost",
        "or failed, a message not sent).",
        "",
        "```sh",
        ".venv/bin/python -m bench.run            # the full run: about ten minutes",
        ".venv/bin/python -m bench.run --quick    # smaller inputs, fewer repetitions: about four minutes",
        ".venv/bin/python -m bench.run --smoke    # CI: every benchmark once at its smallest; writes nothing here",
        "```",
        "",
        "It needs PostgreSQL on 127.0.0.1:5432 (user `postgres`, trust; or set `PAGESCRIBE_BENCH_ADMIN_URL`); each",
        "benchmark creates its own database and drops it. moto and the fake provider run on 127.0.0.1, in-process",
        "but in the pipeline benchmark, where each has a process of its own;",
        "nothing leaves the machine. `ruff check bench && ruff format --check bench` keep it clean.",
        "",
        "## Last run",
        "",
        f"- code: commit {facts['commit']}",
        f"- command: `{command}`"
        + (" (the quick variant: smaller inputs, fewer repetitions)" if mode is Mode.QUICK else ""),
        f"- date: {facts['date']}; total {total_seconds:.0f} s",
        f"- machine: `nproc` = {facts['nproc']}, {facts['cpu']}, {facts['memory']} RAM; {facts['platform']}",
        f"- Python {facts['python']}; PostgreSQL {facts['postgres']} on 127.0.0.1",
        f"- packages: {facts['packages']}",
        f"- load average (1, 5, 15 min) at the start: {facts['load']}; at the end: {facts.get('load_after', '?')}",
        "",
        "## Results",
        "",
        "| benchmark | judged by | result | target | |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in results:
        verdict = {True: "met", False: "**missed**", None: "(information)"}[r.met]
        target = f"{r.direction} {r.target:g}" if r.target is not None else "none"
        lines.append(f"| [{r.title}](#{r.key}) | {r.ratio_label} | **{r.ratio:.2f}** | {target} | {verdict} |")
    lines.append("")
    lines.append("The printed lines:")
    lines.append("")
    lines.append("```")
    lines.extend(r.line() for r in results)
    lines.append("```")
    for number, r in enumerate(results, start=1):
        lines += ["", f'<a id="{r.key}"></a>', f"## {number}. {r.title}", "", EXPLANATIONS.get(r.key, ""), ""]
        lines.append(_table(HEADERS.get(r.key), r.rows))
        for note in r.notes:
            lines += ["", note]
        lines += ["", f"*{r.summary}* ({r.seconds:.0f} s)"]
    lines += ["", _findings(by_key), IMAGE_SIZE, "", LIMITS, ""]
    path.write_text("\n".join(lines), encoding="utf-8")
