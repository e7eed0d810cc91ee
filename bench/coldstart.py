"""Benchmark 5: cold start of each function: handler import vs its third-party imports alone, and peak memory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import boto3
from pagescribe_local.stack import SCHEDULED_EVENT, api_gateway_event, sqs_event

from bench.common import CORPUS, REPO, Mode, Result, fresh_database, median
from bench.stack import local_pipeline
from tests.fakes.chat_server import FakeChatServer

FUNCTIONS = ("upload", "transcribe", "sweeper", "api", "migrate")
MARK = "BENCH-RESULT "

# Runs in a fresh interpreter. Nothing is imported before the clock starts but what every mode shares
# (sys, time: both built in); json comes after.
CHILD = r"""
import sys, time
mode, target = sys.argv[1], sys.argv[2]
before = set(sys.modules)
started = time.perf_counter()
failed = []
if mode == "deps":
    for name in target.split(",") if target else []:
        try:
            __import__(name)
        except Exception:
            failed.append(name)
else:
    __import__(target)
seconds = time.perf_counter() - started
import json

def peak_kb():
    # VmHWM, this process's peak resident set. Not ru_maxrss: on Linux that keeps the peak of the process that
    # forked this one across fork + exec, so a child of a big parent reports the parent's peak.
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))

result = {"seconds": seconds, "failed": failed, "rss_import_kb": peak_kb()}
if mode == "discover":
    project = {"pagescribe", "functions", "__main__", "app"}  # app: a handler module as Lambda imports it
    result["modules"] = [
        name for name in sys.modules
        if name not in before and name.split(".")[0] not in sys.stdlib_module_names
        and name.split(".")[0] not in project
    ]
if mode == "invoke":
    class Context:
        function_name = "pagescribe-bench"
        function_version = "$LATEST"
        invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:pagescribe-bench"
        memory_limit_in_mb = 1024
        aws_request_id = "c6af9ac6-7b61-11e6-9a41-93e812345678"
        log_group_name = "/aws/lambda/pagescribe-bench"
        log_stream_name = "2026/12/03/[$LATEST]bench"
        def __init__(self):
            self._deadline = time.monotonic() + 120
        def get_remaining_time_in_millis(self):
            return max(0, int((self._deadline - time.monotonic()) * 1000))
    event = json.loads(sys.stdin.read())
    invoke_started = time.perf_counter()
    response = sys.modules[target].handler(event, Context())
    result["invoke_seconds"] = time.perf_counter() - invoke_started
    result["rss_invoke_kb"] = peak_kb()
    result["response"] = json.loads(json.dumps(response, default=str))
print("BENCH-RESULT " + json.dumps(result), flush=True)
"""


def _clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if k in {"PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "VIRTUAL_ENV"}}
    return {**keep, "AWS_DEFAULT_REGION": "us-east-1", "POWERTOOLS_LOG_LEVEL": "WARNING", **(extra or {})}


def child(
    mode: str,
    target: str,
    *,
    env: dict[str, str] | None = None,
    stdin: str = "",
    flags: tuple[str, ...] = (),
    python: str = sys.executable,
    cwd: Path = REPO,
) -> tuple[dict[str, Any], str]:
    """Run CHILD in a fresh interpreter: ``mode`` (discover, handler, deps, invoke) on ``target``."""
    completed = subprocess.run(  # noqa: S603 - our own interpreter and code
        [python, *flags, "-c", CHILD, mode, target],
        cwd=cwd,
        env=env or _clean_env(),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    lines = [line for line in completed.stdout.splitlines() if line.startswith(MARK)]
    if completed.returncode != 0 or not lines:
        raise RuntimeError(f"{mode} {target[:60]} failed ({completed.returncode}): {completed.stderr[-2000:]}")
    return json.loads(lines[-1][len(MARK) :]), completed.stderr


def _importtime_by_package(stderr: str) -> dict[str, float]:
    """Self import time (seconds) summed per top-level package, from ``python -X importtime``."""
    totals: dict[str, float] = defaultdict(float)
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        self_us, _, name = (part.strip() for part in line[len("import time:") :].split("|"))
        totals[name.split(".")[0]] += int(self_us) / 1e6
    return totals


@dataclass
class ColdStart:
    function: str
    handler_seconds: float
    deps_seconds: float
    modules: int
    failed: list[str]
    rss_import_mb: float
    rss_deps_mb: float
    project_self_seconds: float
    top_packages: list[tuple[str, float]]
    rss_invoke_mb: float | None = None
    invoke_seconds: float | None = None

    @property
    def ratio(self) -> float:
        return self.handler_seconds / self.deps_seconds


def measure_imports(function: str, runs: int) -> ColdStart:
    target = f"pagescribe.handlers.{function}"
    discovered, _ = child("discover", target)
    modules: list[str] = discovered["modules"]
    names = ",".join(modules)
    _, importtime = child("handler", target, flags=("-X", "importtime"))
    by_package = _importtime_by_package(importtime)
    handler: list[float] = []
    deps: list[float] = []
    rss: list[int] = []
    rss_deps: list[int] = []
    failed: list[str] = []
    for _ in range(runs):  # alternate, so that drift in the machine's load hits both alike
        result, _ = child("handler", target)
        handler.append(result["seconds"])
        rss.append(result["rss_import_kb"])
        result, _ = child("deps", names)
        deps.append(result["seconds"])
        rss_deps.append(result["rss_import_kb"])
        failed = result["failed"]
    third_party = {name for name in (m.split(".")[0] for m in modules)}
    top = sorted(((p, s) for p, s in by_package.items() if p in third_party), key=lambda item: -item[1])[:5]
    return ColdStart(
        function=function,
        handler_seconds=median(handler),
        deps_seconds=median(deps),
        modules=len(modules),
        failed=failed,
        rss_import_mb=median(rss) / 1024,
        rss_deps_mb=median(rss_deps) / 1024,
        project_self_seconds=by_package.get("pagescribe", 0.0) + by_package.get("functions", 0.0),
        top_packages=top,
    )


class _CloudFormation(BaseHTTPRequestHandler):
    def do_PUT(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


def measure_invocations(results: dict[str, ColdStart]) -> None:
    """One real invocation of each function in a fresh process, against this machine's stack; peak memory."""
    cloudformation = ThreadingHTTPServer(("127.0.0.1", 0), _CloudFormation)
    threading.Thread(target=cloudformation.serve_forever, daemon=True).start()
    try:
        with (
            fresh_database("coldstart") as url,
            FakeChatServer() as fake,
            local_pipeline(url, PROVIDER_BASE_URL=fake.base_url) as pipeline,
        ):
            env = _clean_env({k: v for k, v in os.environ.items() if k.isupper()})
            sqs, resources = boto3.client("sqs"), pipeline.stack.resources
            pipeline.put("uploads/coldstart.pdf", CORPUS / "pdflatex-4-pages.pdf")
            notifications = sqs.receive_message(QueueUrl=resources.notifications_url, MaxNumberOfMessages=10)
            [s3_event] = [
                json.loads(m["Body"])
                for m in notifications.get("Messages", [])
                if json.loads(m["Body"]).get("Event") != "s3:TestEvent"
            ]
            upload = _invoke(results["upload"], env, s3_event)
            document_id = upload["documents"][0]["document_id"]
            jobs = sqs.receive_message(
                QueueUrl=resources.queue_url, MaxNumberOfMessages=10, AttributeNames=["All"]
            ).get("Messages", [])
            transcribed = _invoke(results["transcribe"], env, sqs_event([dict(m) for m in jobs], resources.queue_arn))
            if transcribed.get("batchItemFailures"):
                raise RuntimeError(f"the transcribe invocation failed pages: {transcribed}")
            _invoke(results["api"], env, api_gateway_event("GET", f"/documents/{document_id}"))
            _invoke(results["sweeper"], env, dict(SCHEDULED_EVENT))
            port = cloudformation.server_address[1]
            _invoke(
                results["migrate"],
                env,
                {
                    "RequestType": "Update",
                    "ServiceToken": "arn:aws:lambda:us-east-1:123456789012:function:pagescribe-MigrateFunction",
                    "ResponseURL": f"http://127.0.0.1:{port}/cloudformation-response",
                    "StackId": "arn:aws:cloudformation:us-east-1:123456789012:stack/pagescribe/6a1f0b5e",
                    "RequestId": "8d3b7c1e-0f3a-4c55-9d1b-2c7e5b8f4a10",
                    "LogicalResourceId": "DatabaseMigration",
                    "PhysicalResourceId": "pagescribe-schema",
                    "ResourceType": "Custom::DatabaseMigration",
                    "ResourceProperties": {"ServiceToken": "arn:aws:lambda:us-east-1:123456789012:function:x"},
                },
            )
    finally:
        cloudformation.shutdown()
        cloudformation.server_close()


def _invoke(cold: ColdStart, env: dict[str, str], event: dict[str, Any]) -> Any:
    result, _ = child("invoke", f"pagescribe.handlers.{cold.function}", env=env, stdin=json.dumps(event))
    cold.rss_invoke_mb = result["rss_invoke_kb"] / 1024
    cold.invoke_seconds = result["invoke_seconds"]
    return result["response"]


def _repeats(runs: int) -> str:
    return f"median of {runs}" if runs > 1 else "one run"


# Pairs of fresh interpreters per function (handler, third-party alone), whether each function is imported once first
# to warm the page and bytecode caches, and how many functions are measured at once. QUICK as FULL: a median of 3
# swung with the load of a shared machine (CI saw 1.15, 1.48). SMOKE: one pair, no warm-up, two functions at a time
# (its figures are not compared): every function is still imported, timed against its third-party imports and
# invoked once in a fresh process against the local stack.
SIZES: dict[Mode, tuple[int, bool, int]] = {
    Mode.FULL: (5, True, 1),
    Mode.QUICK: (5, True, 1),
    Mode.SMOKE: (1, False, 2),
}


def run(mode: Mode) -> Result:
    runs, warm_up, at_once = SIZES[mode]
    started = time.perf_counter()
    for function in FUNCTIONS if warm_up else ():  # warm the page cache and bytecode caches, not counted
        child("handler", f"pagescribe.handlers.{function}")
    with ThreadPoolExecutor(max_workers=at_once) as pool:  # one: one after another, in order
        results = dict(
            zip(FUNCTIONS, pool.map(lambda function: measure_imports(function, runs), FUNCTIONS), strict=True)
        )
    measure_invocations(results)
    worst = max(results.values(), key=lambda r: r.ratio)
    rows: list[tuple[str, str]] = []
    for r in results.values():
        top = ", ".join(f"{name} {seconds * 1000:.0f}" for name, seconds in r.top_packages)
        rows.append(
            (
                f"`{r.function}`",
                f"{r.handler_seconds * 1000:.0f} ms | {r.deps_seconds * 1000:.0f} ms | **{r.ratio:.2f}** | "
                f"{r.project_self_seconds * 1000:.0f} ms | {r.modules} | {r.rss_import_mb:.0f} MB "
                f"({r.rss_deps_mb:.0f}) | "
                + (
                    f"{r.rss_invoke_mb:.0f} MB ({r.invoke_seconds * 1000:.0f} ms)"
                    if r.rss_invoke_mb is not None and r.invoke_seconds is not None
                    else "-"
                )
                + f" | {top}",
            )
        )
    failed = sorted({name for r in results.values() for name in r.failed})
    return Result(
        key="coldstart",
        title=f"Cold start (import in a fresh interpreter, {_repeats(runs)})",
        ratio_label=f"worst handler import / its third-party imports alone ({worst.function})",
        ratio=worst.ratio,
        target=1.2,
        direction="<=",
        summary=", ".join(
            f"{r.function} {r.handler_seconds * 1000:.0f}/{r.deps_seconds * 1000:.0f} ms = {r.ratio:.2f}"
            for r in results.values()
        ),
        rows=rows,
        notes=[f"third-party modules that would not import on their own (left out of the baseline): {failed}"]
        if failed
        else [],
        seconds=time.perf_counter() - started,
    )


def table_header() -> tuple[str, str]:
    return (
        "function",
        "handler import | third-party alone | ratio | pagescribe's own modules (self time) | third-party modules | "
        "peak RSS after import (deps alone) | peak RSS after one invocation (its time) | heaviest packages, ms self",
    )


if __name__ == "__main__":  # a quick look: python -m bench.coldstart
    outcome = run(Mode.FULL)
    print(outcome.line())
    for label, value in outcome.rows:
        print(label, value)
