# ruff: noqa: RUF001  (the report is prose: it uses typographic multiplication signs and dashes)
"""docs/benchmarks.md: machine facts, the results table, what each figure means, and what the runs found."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

from bench import coldstart, rendering
from bench.common import ADMIN_URL, REPO, Result

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
Storage side calls `Storage.claim_next_queued_jobs(limit=1)` and `Storage.complete_job` over
`create_database_engine(url, pool_size=16)`. The raw side runs the same SQL text (the `CLAIM_NEXT_QUEUED_JOBS`
and `COMPLETE_JOB` constants, `:name` turned into `%(name)s`) through psycopg 3, one connection per thread,
`prepare_threshold=None` like the engine. Since commit 619a961 Storage runs every single statement in
autocommit, so the judged baseline is raw psycopg in autocommit (the same one-statement transactions); the
same SQL in explicit `BEGIN … COMMIT` per statement (what Storage did before) is shown too. Every side and round
gets fresh jobs (documents of 100 pages, as the upload function creates them); the sides alternate in rounds
(ABCD DCBA …) and the judged ratio is the median of the per-round ratios, because the server and both cores are
shared with other work. Every claim is counted per job id: a job claimed twice, a completion that finds its
lease gone, or a table that disagrees fails the run. The benchmark database runs with
`synchronous_commit = off`: a commit's WAL flush costs the same on both sides and on this shared disk it is
mostly noise, so without it the figure is about the code path (round trips and client CPU). Round trips come
from libpq's protocol trace (one `ReadyForQuery` per exchange), server transactions from
`pg_stat_database.xact_commit`. The "ping only after idle" row runs the unchanged `Storage` class over the
engine of the fix proposed below, in the same rounds.""",
    "connections": """\
The real transcribe handler, warm (one runtime: one provider client and pool for the whole run), gets ten
batches of ten messages for one 100-page PDF from the local Lambda service (`LambdaService.deliver_jobs`),
against `FakeChatServer`, which counts the TCP connections it accepts. The fake answers after 0.25 s so that
the ten calls of a batch are in flight together and the pool must really hold ten connections. A client per
page would open 100 connections; a client per invocation, 10 per invocation.""",
    "pipeline": """\
A 50-page PDF (the 4-page corpus document imported again and again) goes the whole local way: `put_object` into
`uploads/` in moto, S3's notification to the upload function, 50 messages, then batches of ten to the
transcribe function (PAGE_CONCURRENCY=10) until the transcript is written, against a fake provider that answers
every page after exactly 1.0 s. **What is measured:** one local execution environment (`LambdaService`
delivers one batch at a time), so the ideal is 5 batches × 1.0 s = 5 s. Deployed, the event source would run up
to `TranscribeMaximumConcurrency` (default 5) environments at once and the ideal would be about 1 s; that is
not measured here. Wall time runs from the `put_object` to the document being finished. Per page, from the
jobs table (`started_at` = the claim's commit, `completed_at` = the result's commit, `latency_ms` = the
model call as the provider client timed it) and the start of the invocation that carried the page: the
per-page overhead is the page's time in the handler less its model call. Database time is the wall time
spent inside `Storage` methods (instrumented in this process only). Commits are durable here
(`synchronous_commit` as the server has it).""",
    "fanout": """\
The upload function gets the S3 event of a 1,000-page PDF (`MAX_PAGES=1000` for this run; 300 pages with
`--quick`): it downloads the object, counts the pages, commits the document and one job per page in one
transaction, sends one message per job with `SendMessageBatch` (ten per call) and stamps them sent. Its handler
time is compared with a bare loop that sends the same number of messages of the same shape, ten per call,
through a client with the same configuration. Both send into a queue that starts empty, in the same moto
server (moto's SQS recounts the queue for every message it accepts, so a call's cost grows with queue depth:
the last row shows it). API calls are counted with botocore `before-call` hooks on the clients; database time
is the wall time inside `Storage` methods. There is no fixed target: the ratio shows what the upload adds to
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
    "rendering": """\
`render_page` on every page of every corpus PDF that opens (the password-protected one is refused, as the
pipeline refuses it), one thread, each setting over the whole corpus in turn within each pass, after one
warm-up pass. Bytes per page are the encoded image sent to the provider (before base64, which adds a third).
The token column applies Anthropic's published estimate to the mean image size; see *Choice of image size*.""",
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
- **moto is not SQS.** Its SendMessage cost grows with queue depth and it runs in this process, on the same
  cores. Fan-out compares the upload with a bare loop at the same depth and reports the API calls made; the
  absolute seconds say little about AWS.
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
        "## Performance problems found\n",
        "Production code is unchanged; each problem comes with its evidence and a proposed diff.\n",
    ]
    claims = by_key.get("claims")
    if claims is not None:
        parts.append(
            f"""### 1. Every `Storage` call still pings the server before its statement

`create_database_engine` sets `pool_pre_ping=True`, so every pool checkout, that is every `Storage` call,
first sends an empty query (`;`) and waits for the answer. Since commit 619a961 (single statements in
autocommit, made while these benchmarks were written; it removed the `BEGIN`/`COMMIT` round trips these
benchmarks first measured) a call is two round trips where one would do. Measured: round trips per
claim+complete pair {_row(claims, "client-server round trips")}; server transactions per pair
{_row(claims, "server transactions")} (each ping is a transaction of its own); client CPU per pair
{_row(claims, "client (Python) CPU")}. Storage reaches **{claims.ratio:.2f}** of raw psycopg making the same
autocommitted statements (target ≥ 0.7). In the transcribe function each page makes three calls
(`claim_job`, `get_document`, `complete_job`), synchronously on the event loop: six round trips to RDS Proxy
where three would do, ahead of the batch's later pages.

Proposed: ping a connection only when it sat idle in the pool (a thawed Lambda environment), not before
every call; a failed ping makes the pool replace the connection, exactly as `pool_pre_ping` does. The "ping
only after idle" row runs this engine with the unchanged `Storage`: {_row(claims, "Storage over an engine")}.

```diff
--- a/shared/pagescribe/storage.py
+++ b/shared/pagescribe/storage.py
@@ imports
+import time
-from sqlalchemy import Engine, Row, TextClause, create_engine, text
+from sqlalchemy import Engine, Row, TextClause, create_engine, event, exc, text
@@ def create_database_engine(url: str, *, pool_size: int = 1) -> Engine:
-    return create_engine(
+    engine = create_engine(
         url,
         pool_size=pool_size,
         max_overflow=0,
-        pool_pre_ping=True,
         pool_recycle=300,
         pool_timeout=30,
         connect_args={{"prepare_threshold": None, "connect_timeout": 10, "application_name": "pagescribe"}},
     )
+
+    @event.listens_for(engine, "checkin")
+    def _checked_in(dbapi_connection: Any, record: Any) -> None:
+        record.info["checked_in_at"] = time.monotonic()
+
+    @event.listens_for(engine, "checkout")
+    def _ping_after_idle(dbapi_connection: Any, record: Any, proxy: Any) -> None:
+        checked_in_at = record.info.get("checked_in_at")
+        if checked_in_at is not None and time.monotonic() - checked_in_at > PING_AFTER_IDLE_SECONDS:
+            try:
+                engine.dialect.do_ping(dbapi_connection)
+            except Exception as error:
+                raise exc.DisconnectionError() from error  # the pool reconnects and retries the checkout
+
+    return engine
```

with `PING_AFTER_IDLE_SECONDS = 1.0` beside it. A new connection is not pinged (it was just made), and
`record.info` is dropped with an invalidated connection. Within a busy invocation a connection is back in the
pool for milliseconds between calls, so nearly every ping goes; the first call after a model call or after a
thaw still pings (the pipeline benchmark counts the pings the current engine makes).

**The trade-off, stated plainly:** a connection the server killed less than a second after its last use is
no longer caught before use: that one call fails with an `OperationalError`, SQLAlchemy invalidates the pool,
and the page's message comes back from SQS. With a 10 s threshold the reliability test
`test_a_database_restart_in_the_middle_of_a_run_loses_and_doubles_nothing` fails for exactly that reason (the
test's own pooled connection, used seconds before the restart, is not pinged); with 1 s it passes (3 of 3
runs), but only because its connections sit idle longer than a second across the restart. Whether six
round trips per page against three is worth that is the maintainers' call; behind RDS Proxy, which hides
failovers from its clients, the exposure is smaller.

The whole patch, against 619a961, is
[`bench/proposed-storage-ping-after-idle.diff`](../bench/proposed-storage-ping-after-idle.diff) (`git apply`
it to try); it is not applied. Applied to a scratch copy of the repository, the integration tests of storage,
transcribe, sweeper, upload and the API and the whole reliability suite ran 288 tests: 287 passed and one
timing-bound delivery test timed out while the machine was busy with these benchmarks; it passed alone twice,
and `tests/reliability/test_delivery.py` passed whole (8 of 8).
"""
        )
    pipeline = by_key.get("pipeline")
    alone = "about 25 ms"
    if "rendering" in by_key:
        alone = _row(by_key["rendering"], "JPEG q85, 150 dpi, long edge <= 1568").split(" | ")[1]
    if pipeline is not None:
        parts.append(
            f"""### 2. Pipeline overhead: a batch's pages wait for each other's claims and renders

Wall time is **{pipeline.ratio:.2f}×** the ideal (target ≤ 1.25). The breakdown: the transcribe invocations
take {_row(pipeline, "transcribe function")} for batches whose model time is 1.0 s, the local emulation adds
{_row(pipeline, "local emulation")} and the upload {_row(pipeline, "upload function")}. Inside a batch the ten
pages start together, but:

- their claims and document reads run one after another, synchronously on the event loop ("invocation start ->
  claim committed": {_row(pipeline, "part: invocation start")}, median / p95). The three Storage calls of a
  page take {_row(pipeline, "claim_job + get_document")} (in the pipeline / alone, same engine, after the run): with
  both cores busy (render threads, and locally the in-process fake provider, moto and PostgreSQL), every
  round trip also waits for a core, so the extra round trip per call of problem 1 costs more than its
  network time;
- renders are serialised by the pdfium lock (pdfium is not thread-safe): `render_page` takes
  {_row(pipeline, "render_page per page")} (median / p95) in the batch, mostly waiting for the lock, against
  {alone} of work per page alone (rendering benchmark).

The last page of a batch therefore starts its model call only after ten claims and ten renders. Proposed, in
order of payoff: fix 1 above (each claim and read: one round trip instead of two); then claim the batch's jobs
in one statement (`CLAIM_JOB_BY_ID` with `id = ANY(:job_ids)`) and read the document once per batch rather than
once per page (a design change, not a one-liner). Nothing cheap for the renders: a 1,024 MB Lambda gets well
under one vCPU, so more render parallelism would need processes and memory; the cap on image size (below)
is what keeps each render short.
"""
        )
    cold = by_key.get("coldstart")
    if cold is not None:
        parts.append(
            """### 3. Cold start: every function imports every module

`pagescribe.runtime` imports all the domain modules at the top, so the sweeper, API and migrate functions,
which never render a page, import `pagescribe.documents` with pypdfium2 and Pillow (about 35–45 ms cumulative
on this machine in `-X importtime`, of the 500–800 ms imports in the table), and the migrate function loads
the whole runtime to read one database URL. Proposed (small): import `Ingestor`, `Transcriber` and
`SourceCache` inside the `Runtime.ingestor` / `Runtime.transcriber` / `Runtime.sources` properties (their types
under `TYPE_CHECKING`), so only the functions that use them pay for them. The project's own modules are a small
part of each import (their self time is in the table); the rest is SQLAlchemy, botocore, Powertools, pydantic.
"""
        )
    parts.append(
        """### Not a performance problem, but seen while measuring

With `POWERTOOLS_METRICS_DISABLED=true` (which `pagescribe transcribe` sets to keep stdout for `--out -`),
Powertools 3.37 keeps every metric value and, once a metric holds 100 values, prints the whole set to stdout
anyway (`add_metric` flushes at 100 values without checking the flag). A 100-page run of the transcribe
handler in this process printed one EMF JSON blob. `pagescribe transcribe big.pdf --out -` on a document of 100
pages or more would therefore mix a JSON line into the markdown on stdout. The benchmarks keep metrics on (as
deployed) and discard the handlers' stdout instead.
"""
    )
    return "\n".join(parts)


def write_report(
    path: Path, results: list[Result], *, command: str, facts: dict[str, Any], total_seconds: float, quick: bool
) -> None:
    by_key = {r.key: r for r in results}
    lines = [
        "# Benchmarks",
        "",
        "`bench/` measures pagescribe on the machine it runs on, all in one process: the claim path against raw",
        "psycopg, provider connection reuse, the local pipeline's overhead over the model's own time, the upload's",
        "fan-out, cold starts, and page rendering. Each benchmark prints one line with the ratio it is judged by and",
        "its target, and every run rewrites this file. Targets are reported, not enforced: the command exits",
        "non-zero only when a benchmark crashes or sees a correctness violation (a job claimed twice, a page lost",
        "or failed, a message not sent).",
        "",
        "```sh",
        ".venv/bin/python -m bench.run            # the full run: a few minutes",
        ".venv/bin/python -m bench.run --quick    # smaller inputs, fewer repetitions: about two minutes",
        "```",
        "",
        "It needs PostgreSQL on 127.0.0.1:5432 (user `postgres`, trust; or set `PAGESCRIBE_BENCH_ADMIN_URL`); each",
        "benchmark creates its own database and drops it. moto and the fake provider run in-process on 127.0.0.1;",
        "nothing leaves the machine. `ruff check bench && ruff format --check bench` keep it clean.",
        "",
        "## Last run",
        "",
        f"- code: commit {facts['commit']}",
        f"- command: `{command}`" + (" (the quick variant: smaller inputs, fewer repetitions)" if quick else ""),
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
