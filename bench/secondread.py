"""Benchmark 10: the second read of scans. Ten scanned pages in one SQS batch, one execution environment, a provider
answering every page after 5.0 s: the document's wall time with the offline engine's second read (SECOND_READ=auto,
and always) against without it (off), how many pages got a read, and the peak resident memory of the render
processes, the reading process and the function's own process against the transcribe function's MemorySize.

Each mode is the document's own ``second_read`` (as ``POST /documents`` sets it), so that one warm environment
serves every run: the reading process starts, and loads the engine, on the first document (reported, not compared),
as it does once per deployed environment."""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pagescribe.runtime import Runtime
from pagescribe.service import NewUpload
from pagescribe.settings import HANDLER_MEMORY_MB

from bench.common import REPO, CorrectnessError, Mode, Result, fresh_database, median
from bench.pdfs import build_scan_pdf
from bench.stack import Pipeline, local_pipeline
from tests.fakes.chat_server import FakeChatServer

# pages (one batch), the provider's delay in seconds, rounds (auto and off in turn, then always)
SIZES = {Mode.FULL: (10, 5.0, 3), Mode.QUICK: (10, 5.0, 1), Mode.SMOKE: (3, 2.0, 1)}
TARGET = 1.10
SAMPLE_SECONDS = 0.1
DOCUMENT_TIMEOUT = 400.0  # always: every page waits for its read, within the function's 300 s


def function_memory_mb(function: str = "TranscribeFunction") -> int:
    """The function's MemorySize in template.yaml (the first one after the function's own line)."""
    text = (REPO / "template.yaml").read_text(encoding="utf-8")
    found = re.search(rf"^  {function}:\n(?:.*\n)*?\s+MemorySize:\s*(\d+)", text, re.MULTILINE)
    if found is None:
        raise ValueError(f"no MemorySize for {function} in template.yaml")
    return int(found.group(1))


# --- memory --------------------------------------------------------------------------------------------------------


def _status_kb(pid: int) -> dict[str, int]:
    """VmHWM and VmRSS (kB) of a live process; {} once it is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text(encoding="ascii")
    except OSError:
        return {}
    values = {}
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name in ("VmHWM", "VmRSS"):
            values[name] = int(value.split()[0])
    return values


def _reset_own_peak() -> bool:
    """Reset this process's VmHWM to its current resident set (clear_refs 5, Linux 4.0+): a benchmark run in turn
    with others would otherwise report their peaks. Whether it could."""
    try:
        Path("/proc/self/clear_refs").write_text("5", encoding="ascii")
    except OSError:
        return False
    return True


class PeakMemory:
    """Peak resident memory (VmHWM) of the render processes, the reading process and this process, sampled in a
    thread while the runs go on (a process replaced meanwhile keeps its own peak), and the peak of their resident
    sets summed at one moment."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime
        self.peaks_kb: dict[tuple[str, int], int] = {}  # (role, pid) -> VmHWM
        self.peak_sum_kb = 0
        self._stop = threading.Event()

    def _processes(self) -> list[tuple[str, int]]:
        runtime = self._runtime
        processes = [("function", os.getpid())] + [("render", pid) for pid in runtime.renderer.pids]
        if "reading_pool" in runtime.__dict__:  # built on the first read; never built from here
            processes += [("read", pid) for pid in runtime.reading_pool.pids]
        return processes

    def sample(self) -> None:
        resident = 0
        for process in self._processes():
            status = _status_kb(process[1])
            if status:
                self.peaks_kb[process] = max(self.peaks_kb.get(process, 0), status["VmHWM"])
                resident += status["VmRSS"]
        self.peak_sum_kb = max(self.peak_sum_kb, resident)

    def _loop(self) -> None:
        while not self._stop.wait(SAMPLE_SECONDS):
            self.sample()

    @contextmanager
    def sampling(self) -> Iterator[PeakMemory]:
        thread = threading.Thread(target=self._loop, name="bench-memory", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            thread.join()
            self.sample()  # the last look, before the stack's processes exit

    def mb(self, role: str) -> float:
        """The role's processes' peaks, summed (MB)."""
        return sum(kb for (who, _), kb in self.peaks_kb.items() if who == role) / 1024

    def described(self, role: str) -> str:
        peaks = [f"{kb / 1024:.0f}" for (who, _), kb in sorted(self.peaks_kb.items()) if who == role]
        return " + ".join(peaks) + " MB" if peaks else "none"


# --- runs ----------------------------------------------------------------------------------------------------------


@dataclass
class Run:
    mode: str
    wall: float  # seconds from the object's put to the document finished
    read: list[int]  # the pages whose call came with a second read (its lines)
    skipped: Counter[str] = field(default_factory=Counter)  # why the others went without
    cpu: list[float] = field(default_factory=list)  # each read's CPU seconds, as the reading process measured it


def _wait_for_reader(runtime: Runtime, timeout: float = 120.0) -> None:
    """Wait until the reading process is free: a read that a page of the previous run stopped waiting for goes on in
    it, and would make the next run's pages find it busy (and take a core from them)."""
    if "reading_pool" not in runtime.__dict__:
        return
    deadline = time.monotonic() + timeout
    while runtime.reading_pool.busy():
        if time.monotonic() > deadline:
            raise CorrectnessError(f"the reading process was still busy {timeout:.0f} s after a run")
        time.sleep(0.05)


def _transcript(pipeline: Pipeline, document_id: str) -> dict[str, Any]:
    key = f"{pipeline.stack.runtime.settings.transcript_prefix}{document_id}.json"
    body = pipeline.s3.get_object(Bucket=pipeline.bucket, Key=key)["Body"].read()
    return dict(json.loads(body))


def _transcribe(pipeline: Pipeline, fake: FakeChatServer, pdf: Path, mode: str, pages: int, label: str) -> Run:
    """One document of ``pages`` scans with ``second_read=mode``, from its put to the document finished; every page
    checked completed at its first attempt, with one provider call."""
    runtime = pipeline.stack.runtime
    _wait_for_reader(runtime)
    upload = NewUpload(
        filename=f"scans-{label}-{mode}.pdf", content_type="application/pdf", reuse=False, second_read=mode
    )
    created = runtime.documents.create(upload, runtime.settings.default_tenant)
    calls = fake.calls
    started = time.perf_counter()
    pipeline.put(created.key, pdf)
    document_id = pipeline.document_id(pipeline.deliver_upload())
    if document_id != created.document_id:
        raise CorrectnessError(f"the upload made document {document_id}, not the one created ({created.document_id})")
    pipeline.run_until_finished(document_id, timeout=DOCUMENT_TIMEOUT)
    wall = time.perf_counter() - started
    pipeline.check_all_completed(document_id, pages)
    if fake.calls - calls != pages:
        raise CorrectnessError(f"{pages} pages made {fake.calls - calls} provider calls ({mode})")
    run = Run(mode, wall, [])
    for page in _transcript(pipeline, document_id)["pages"]:
        attempts = page["attempts"]
        if page["status"] != "COMPLETED" or len(attempts) != 1:
            raise CorrectnessError(f"page {page['page']}: {page['status']} with {len(attempts)} attempts ({mode})")
        read = attempts[0].get("second_read")
        if mode == "off" and read is not None:
            raise CorrectnessError(f"page {page['page']} was read a second time with second_read=off: {read}")
        if read is None:
            continue
        if "lines" in read:
            run.read.append(page["page"])
            run.cpu.append(float(read["cpu_seconds"]))
        else:
            run.skipped[_reason(str(read.get("skipped")))] += 1
    return run


def _reason(skipped: str) -> str:
    """Why a page went without, short enough to count: a failed read's first line and the end of its error's last
    line (not the traceback between), seconds as N."""
    lines = [line.strip() for line in skipped.strip().splitlines() if line.strip()]
    head = lines[0].removesuffix("Traceback (most recent call last):").strip() if lines else skipped
    if "std::bad_alloc" in skipped:  # the engine ran out of memory, on whichever of its nodes
        return f"{head} ... std::bad_alloc (out of memory)"
    reason = f"{head} ... {lines[-1][-160:]}" if len(lines) > 1 else head
    return re.sub(r"\d+\.\d+", "N", reason)


# --- the benchmark -------------------------------------------------------------------------------------------------


def _reads(runs: list[Run], pages: int) -> str:
    """Pages read in each run, of ``pages``: one figure when every run read as many."""
    counts = [len(run.read) for run in runs]
    return f"{counts[0] if len(set(counts)) == 1 else ', '.join(map(str, counts))} of {pages}"


def _which(runs: list[Run]) -> str:
    read = sorted({page for run in runs for page in run.read})
    return ("page " if len(read) == 1 else "pages ") + ", ".join(map(str, read)) if read else "none"


def _walls(runs: list[Run]) -> str:
    return f"{median([r.wall for r in runs]):.2f} s (" + ", ".join(f"{r.wall:.2f}" for r in runs) + ")"


def _why(runs: list[Run]) -> str:
    reasons: Counter[str] = Counter()
    for run in runs:
        reasons.update(run.skipped)
    return "; ".join(f"{n}x {why}" for why, n in reasons.most_common()) or "none"


def _fits(total_mb: float, memory_mb: int) -> str:
    return "fits" if total_mb <= memory_mb else f"does NOT fit (over by {total_mb - memory_mb:.0f} MB)"


def run(mode: Mode, *, scratch: Path) -> Result:
    pages, delay, rounds = SIZES[mode]
    started = time.perf_counter()
    pdf = build_scan_pdf(pages, scratch)
    memory_mb = function_memory_mb()
    runs: dict[str, list[Run]] = {"auto": [], "off": [], "always": []}
    with (
        fresh_database("secondread") as url,
        FakeChatServer(default_delay=delay) as fake,
        # as Lambda sets it: the render processes the function's memory holds (one at 1,024 MB), as deployed
        local_pipeline(
            url, PROVIDER_BASE_URL=fake.base_url, AWS_LAMBDA_FUNCTION_MEMORY_SIZE=str(memory_mb)
        ) as pipeline,
    ):
        runtime = pipeline.stack.runtime
        reset = _reset_own_peak()
        with PeakMemory(runtime).sampling() as memory:
            first = _transcribe(pipeline, fake, pdf, "auto", pages, "first")  # starts the reading process: not compared
            for number in range(rounds):
                pair = ("auto", "off") if number % 2 == 0 else ("off", "auto")  # load drift hits both alike
                for second_read in (*pair, "always"):
                    runs[second_read].append(_transcribe(pipeline, fake, pdf, second_read, pages, str(number)))
        settings = runtime.settings
        workers, render_limit, read_limit = (
            runtime.renderer.workers,
            settings.render_memory_limit_mb,
            settings.second_read_memory_limit_mb,
        )

    auto, off, always = runs["auto"], runs["off"], runs["always"]
    ratios = [a.wall / o.wall for a, o in zip(auto, off, strict=True)]
    always_ratios = [a.wall / o.wall for a, o in zip(always, off, strict=True)]
    ratio, always_ratio = median(ratios), median(always_ratios)
    render_mb, read_mb, own_mb = memory.mb("render"), memory.mb("read"), memory.mb("function")
    total_mb = render_mb + read_mb + own_mb
    reserved_mb = render_mb + read_mb + HANDLER_MEMORY_MB
    limits_mb = workers * render_limit + read_limit + HANDLER_MEMORY_MB
    cpu = [c for r in auto + always for c in r.cpu]
    own_is = "here also moto, the fake provider and the bench: an upper bound" + (
        "" if reset else "; its peak could not be reset, so earlier benchmarks count too"
    )
    return Result(
        key="secondread",
        title=f"Second read of scans ({pages} scanned pages in one batch, provider answering in {delay:.1f} s)",
        ratio_label="wall with / without (auto)",
        ratio=ratio,
        target=TARGET,
        direction="<=",
        summary=(
            f"auto {ratio:.2f} ({_reads(auto, pages)} pages read), always {always_ratio:.2f} "
            f"({_reads(always, pages)} read); peak memory render {render_mb:.0f} + read {read_mb:.0f} + function "
            f"{own_mb:.0f} = {total_mb:.0f} MB of MemorySize {memory_mb} MB: {_fits(total_mb, memory_mb)}"
        ),
        rows=[
            ("wall, S3 put -> document finished, off (median, each run)", _walls(off)),
            ("wall, auto", _walls(auto)),
            ("wall, always", _walls(always)),
            (
                "**wall with / without, auto** (judged: median of the pairs)",
                f"**{ratio:.2f}** (" + ", ".join(f"{r:.2f}" for r in ratios) + ")",
            ),
            (
                "wall with / without, always (information)",
                f"{always_ratio:.2f} (" + ", ".join(f"{r:.2f}" for r in always_ratios) + ")",
            ),
            ("pages with a second read, auto", f"{_reads(auto, pages)} ({_which(auto)})"),
            ("  why the others went without, auto", _why(auto)),
            ("pages with a second read, always", f"{_reads(always, pages)} ({_which(always)})"),
            ("  why the others went without, always", _why(always)),
            (
                "CPU seconds per read (median, as the reading process measured it)",
                f"{median(cpu):.2f} s" if cpu else "no read",
            ),
            (
                "first document, cold reading process (auto; not compared): wall / pages read",
                f"{first.wall:.2f} s / {len(first.read)} of {pages}",
            ),
            (f"peak resident (VmHWM), render processes ({workers})", memory.described("render")),
            ("peak resident, the second read's process", memory.described("read")),
            (f"peak resident, the function's own process ({own_is})", memory.described("function")),
            (
                f"**render + read + function, against MemorySize {memory_mb} MB**",
                f"**{total_mb:.0f} MB: {_fits(total_mb, memory_mb)}**",
            ),
            (
                f"render + read + the handler's {HANDLER_MEMORY_MB} MB that the settings reserve for it",
                f"{reserved_mb:.0f} MB: {_fits(reserved_mb, memory_mb)}",
            ),
            (
                f"their resident sets summed at one moment, peak (sampled every {SAMPLE_SECONDS:g} s)",
                f"{memory.peak_sum_kb / 1024:.0f} MB",
            ),
            (
                f"address-space limits: {workers} x RENDER_MEMORY_LIMIT_MB {render_limit} + "
                f"SECOND_READ_MEMORY_LIMIT_MB {read_limit} + handler {HANDLER_MEMORY_MB}",
                f"{limits_mb} MB: {_fits(limits_mb, memory_mb)}",
            ),
        ],
        notes=[
            "Peaks are each process's own high-water mark, summed: the processes need not peak at the same moment, "
            "so the sum is an upper bound of what they held at once (the row after it is the sampled peak of their "
            "sum). The function's own process here is this benchmark's whole process.",
        ],
        seconds=time.perf_counter() - started,
    )
