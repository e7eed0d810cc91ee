"""Run every benchmark in one process, print one judged line each, and write docs/benchmarks.md.

    .venv/bin/python -m bench.run            # the full run (about fifteen minutes)
    .venv/bin/python -m bench.run --quick    # smaller and faster

Benchmarks are run, not asserted: a missed target is reported, not failed. The exit status is non-zero only
when a benchmark crashes or sees a correctness violation (a job claimed twice, a page lost)."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from bench import built, caps, claims, coldstart, connections, fanout, governor, pipeline, rendering
from bench.common import REPO, CorrectnessError, Result
from bench.report import machine_facts, write_report

DOCS = REPO / "docs" / "benchmarks.md"


def benchmarks(quick: bool, scratch: Path) -> list[tuple[str, Callable[[], Result]]]:
    return [
        ("claims", lambda: claims.run(quick=quick)),
        ("connections", lambda: connections.run(quick=quick, scratch=scratch)),
        ("pipeline", lambda: pipeline.run(quick=quick, scratch=scratch)),
        ("fanout", lambda: fanout.run(quick=quick, scratch=scratch)),
        ("coldstart", coldstart.run),
        ("built", built.run),
        ("rendering", lambda: rendering.run(quick=quick)),
        ("governor", lambda: governor.run(quick=quick, scratch=scratch)),
        ("caps", lambda: caps.run(quick=quick, scratch=scratch)),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller inputs and fewer repetitions (about 6 min)")
    parser.add_argument("--only", nargs="+", metavar="KEY", help="run these benchmarks only (docs are not written)")
    parser.add_argument("--no-docs", action="store_true", help=f"do not write {DOCS.relative_to(REPO)}")
    args = parser.parse_args(argv)
    command = ".venv/bin/python -m bench.run" + (" --quick" if args.quick else "")
    facts = machine_facts()
    print(f"{command}: {facts['summary']}", flush=True)
    started = time.perf_counter()
    results: list[Result] = []
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench-") as scratch:
        for key, benchmark in benchmarks(args.quick, Path(scratch)):
            if args.only and key not in args.only:
                continue
            print(f"... {key}", file=sys.stderr, flush=True)
            try:
                result = benchmark()
            except CorrectnessError as exc:
                failures.append(f"[{key}] CORRECTNESS VIOLATION: {exc}")
                print(failures[-1], flush=True)
                continue
            except Exception:
                traceback.print_exc()
                failures.append(f"[{key}] CRASHED (traceback above)")
                print(failures[-1], flush=True)
                continue
            results.append(result)
            print(result.line(), flush=True)
    total = time.perf_counter() - started
    facts["load_after"] = machine_facts()["load"]
    print(f"total {total:.0f} s; {len(results)} benchmarks ran, {len(failures)} failed", flush=True)
    if failures:
        print("docs/benchmarks.md not written: a benchmark failed", file=sys.stderr)
        return 1
    if not args.no_docs and not args.only:
        write_report(DOCS, results, command=command, facts=facts, total_seconds=total, quick=args.quick)
        print(f"wrote {DOCS.relative_to(REPO)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
