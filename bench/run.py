"""Run every benchmark in one process, print one judged line each, and write docs/benchmarks.md.

    .venv/bin/python -m bench.run            # the full run (about fifteen minutes)
    .venv/bin/python -m bench.run --quick    # smaller and faster
    .venv/bin/python -m bench.run --smoke    # CI: every benchmark once at its smallest, a minute and a half

Benchmarks are run, not asserted: a missed target is reported, not failed. The exit status is non-zero only
when a benchmark crashes or sees a correctness violation (a job claimed twice, a page lost). A smoke run keeps
every correctness check but its figures are not comparable with docs/benchmarks.md, which it never writes (nor
does --no-docs or --only). Each benchmark's line ends with its own elapsed seconds."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from bench import (
    batchlane,
    built,
    caps,
    claims,
    coldstart,
    connections,
    dbload,
    fanout,
    governor,
    pipeline,
    rendering,
    secondread,
    streaming,
    tiles,
)
from bench.common import REPO, CorrectnessError, Mode, Result
from bench.report import machine_facts, write_report

DOCS = REPO / "docs" / "benchmarks.md"


def benchmarks(mode: Mode, scratch: Path, built_ahead: Future[None] | None) -> list[tuple[str, Callable[[], Result]]]:
    return [
        ("claims", lambda: claims.run(mode)),
        ("connections", lambda: connections.run(mode, scratch=scratch)),
        ("pipeline", lambda: pipeline.run(mode, scratch=scratch)),
        ("fanout", lambda: fanout.run(mode, scratch=scratch)),
        ("coldstart", lambda: coldstart.run(mode)),
        ("built", lambda: built.run(mode, built_ahead=built_ahead)),
        ("rendering", lambda: rendering.run(mode)),
        ("governor", lambda: governor.run(mode, scratch=scratch)),
        ("caps", lambda: caps.run(mode, scratch=scratch)),
        ("secondread", lambda: secondread.run(mode, scratch=scratch)),
        ("streaming", lambda: streaming.run(mode)),
        ("batchlane", lambda: batchlane.run(mode, scratch=scratch)),
        ("tiles", lambda: tiles.run(mode)),
        ("dbload", lambda: dbload.run(mode)),
    ]


def build_ahead(mode: Mode, only: list[str] | None, pool: ThreadPoolExecutor) -> Future[None] | None:
    """A smoke run starts the built benchmark's layer build (sam build: about half a minute, most of that benchmark's
    time) with the first benchmark, so that it overlaps the benchmarks before it; a measuring run builds it in turn,
    on a quiet machine."""
    if mode is not Mode.SMOKE or (only and "built" not in only):
        return None
    return pool.submit(built.build)


def run_one(key: str, benchmark: Callable[[], Result]) -> tuple[Result | str, float]:
    """Run one benchmark and print its line with its elapsed seconds: its result (or the line saying how it
    failed), and the seconds."""
    print(f"... {key}", file=sys.stderr, flush=True)
    started = time.perf_counter()
    outcome: Result | str
    try:
        outcome = benchmark()
    except CorrectnessError as exc:
        outcome = f"[{key}] CORRECTNESS VIOLATION: {exc}"
    except Exception:
        traceback.print_exc()
        outcome = f"[{key}] CRASHED (traceback above)"
    seconds = time.perf_counter() - started
    print(f"{outcome.line() if isinstance(outcome, Result) else outcome} [{seconds:.1f} s]", flush=True)
    return outcome, seconds


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.splitlines()[0])
    size = parser.add_mutually_exclusive_group()
    size.add_argument(
        "--quick",
        dest="mode",
        action="store_const",
        const=Mode.QUICK,
        help="smaller inputs and fewer repetitions (about 6 min)",
    )
    size.add_argument(
        "--smoke",
        dest="mode",
        action="store_const",
        const=Mode.SMOKE,
        help="CI: every benchmark once at its smallest (about a minute and a half), failing only on a crash or a "
        "correctness violation; figures not comparable, docs not written",
    )
    parser.set_defaults(mode=Mode.FULL)
    parser.add_argument("--only", nargs="+", metavar="KEY", help="run these benchmarks only (docs are not written)")
    parser.add_argument("--no-docs", action="store_true", help=f"do not write {DOCS.relative_to(REPO)}")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    mode: Mode = args.mode
    command = ".venv/bin/python -m bench.run" + ("" if mode is Mode.FULL else f" --{mode}")
    facts = machine_facts()
    print(f"{command}: {facts['summary']}", flush=True)
    if mode is Mode.SMOKE:
        print(
            "a smoke run: every benchmark once at its smallest, for its correctness checks; its figures are not "
            f"comparable with {DOCS.relative_to(REPO)}, which it does not write",
            flush=True,
        )
    writes_docs = not (args.no_docs or args.only or mode is Mode.SMOKE)
    started = time.perf_counter()
    results: list[Result] = []
    failures: list[str] = []
    seconds: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="bench-") as scratch, ThreadPoolExecutor(max_workers=1) as ahead:
        for key, benchmark in benchmarks(mode, Path(scratch), build_ahead(mode, args.only, ahead)):
            if args.only and key not in args.only:
                continue
            outcome, seconds[key] = run_one(key, benchmark)
            if isinstance(outcome, Result):
                results.append(outcome)
            else:
                failures.append(outcome)
    total = time.perf_counter() - started
    facts["load_after"] = machine_facts()["load"]
    print(f"total {total:.0f} s; {len(results)} benchmarks ran, {len(failures)} failed", flush=True)
    print("seconds: " + ", ".join(f"{key} {elapsed:.1f}" for key, elapsed in seconds.items()), flush=True)
    if failures:
        if writes_docs:
            print(f"{DOCS.relative_to(REPO)} not written: a benchmark failed", file=sys.stderr)
        return 1
    if writes_docs:
        write_report(DOCS, results, command=command, facts=facts, total_seconds=total, mode=mode)
        print(f"wrote {DOCS.relative_to(REPO)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
