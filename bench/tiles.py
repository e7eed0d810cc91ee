"""Dense pages read whole and in tiles, the offline engine as the model: does reading small print in tiles lose less?

    .venv/bin/python -m bench.tiles                                # every page at two input sizes (a few minutes)
    .venv/bin/python -m bench.tiles --markdown docs/accuracy.md    # also write the section into that file
    .venv/bin/python -m bench.run --only tiles                     # one line, as the benchmark run prints it

Each page (:data:`PAGES`: real born-digital pages in small print, sources in ``tests/data/forms/SOURCES.md`` and
``tests/data/documents/SOURCES.md``) is rendered whole at a model-sized input (RENDER_MAX_LONG_EDGE, each size of
:data:`SIZES`) and read by the offline engine (``RapidOcrProvider``, what ``PROVIDER=offline`` runs); then cut as the
pipeline cuts it (:func:`pagescribe.transcription.tileplan.plan_tiles`, the default TILE_* settings, its words'
height from its text layer at that size), each band rendered (:func:`pagescribe.sources.pages.render_band`) and read
by the same engine, the answers stitched (:func:`pagescribe.transcription.stitching.stitch`). Both readings are scored
(CER) against the page's own text layer read line by line, as ``bench.forms`` scores them. A page the plan does not
tile at a size is read whole only, and says so. Figures are measured, not asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from pagescribe.settings import Settings
from pagescribe.sources.documents import DocumentKind
from pagescribe.sources.pages import render_band, render_page
from pagescribe.sources.textlayer import text_layer_print
from pagescribe.transcription.stitching import stitch
from pagescribe.transcription.tileplan import TileLimits, plan_tiles, print_height
from pagescribe_local.scoring import cer

from bench.common import Mode, Result
from bench.forms import FORMS, FormPage, leaders_as_one, reading_truth
from bench.ocr import DOCUMENTS, RENDER_OPTIONS, Reader, pct
from bench.report import _git_head, publish_section

HEADING = "## Dense pages read in tiles"
PAGES = (
    FormPage(FORMS / "district_health.pdf", 1, "statistical table: two surveys side by side"),
    FormPage(DOCUMENTS / "nics-background-checks-2015-11.pdf", 1, "statistical table: 55 rows by 23 columns, 6 pt"),
    FormPage(FORMS / "12s0324.pdf", 1, "statistical tables in small type, dot leaders"),
    FormPage(FORMS / "us-007.pdf", 1, "tax notice: two columns of text, a withholding table", (0.5,)),
)
SIZES = {Mode.SMOKE: (1024,), Mode.QUICK: (1024,), Mode.FULL: (1024, 1568)}
READ_SECONDS = 900.0  # accuracy, not speed: a loaded machine's slow read is no failure of the page
PAGE_COUNT = {Mode.SMOKE: 1, Mode.QUICK: 3, Mode.FULL: len(PAGES)}  # the first is the lightest page that is tiled


@dataclass(frozen=True)
class Read:
    """One page at one input size: whole and in tiles (``tiles`` 0: not tiled), scored."""

    page: FormPage
    long_edge: int
    text_px: float | None
    whole: float
    tiled: float | None
    tiles: int
    zoom: float
    seconds_whole: float
    seconds_tiles: float


def _read_page(reader: Reader, page: FormPage, long_edge: int) -> Read:
    options = {**RENDER_OPTIONS, "max_long_edge": long_edge}
    truth = leaders_as_one(reading_truth(page.path, page.page, page.columns))
    whole = render_page(page.path, DocumentKind.PDF, page.page, **options)
    answer = reader.read(whole, page.path.name, page.page, seconds=READ_SECONDS)
    # the print as the transcriber measures it with the page's render, before any call
    text_px = print_height(text_layer_print(page.path, page.page, dpi=options["dpi"], max_long_edge=long_edge))
    plan = plan_tiles(whole.width, whole.height, text_px=text_px, truncated=False, limits=TileLimits.of(Settings()))
    scored = cer(truth, leaders_as_one(answer.text))
    if plan is None:
        return Read(page, long_edge, text_px, scored, None, 0, 1.0, answer.latency_seconds, 0.0)
    band_options = {key: options[key] for key in ("dpi", "max_long_edge", "image_format", "max_image_pixels")}
    started = time.perf_counter()
    answers = [
        reader.read(
            render_band(page.path, DocumentKind.PDF, page.page, band, zoom=plan.zoom, **band_options),
            page.path.name,
            page.page,
            seconds=READ_SECONDS,
        )
        for band in plan.bands
    ]
    text, _ = stitch([tile.text for tile in answers])
    tiled = cer(truth, leaders_as_one(text))
    seconds = time.perf_counter() - started
    return Read(page, long_edge, text_px, scored, tiled, len(plan.bands), plan.zoom, answer.latency_seconds, seconds)


def measure(mode: Mode, note: Callable[[str], None] = print, cache: Path | None = None) -> tuple[list[Read], str]:
    """Every page of the mode read whole and in tiles at each size; the engine's name. With ``cache`` (JSON lines),
    each reading is kept there as it is made, and a reading kept there already is not made again (a long run that
    stopped resumes)."""
    kept = _cached(cache)
    reads: list[Read] = []
    with asyncio.Runner() as runner:
        reader = Reader(runner)
        try:
            for long_edge in SIZES[mode]:
                for page in PAGES[: PAGE_COUNT[mode]]:
                    read = kept.get((page.path.name, page.page, long_edge)) or _read_page(reader, page, long_edge)
                    reads.append(read)
                    note(_row(read))
                    if cache is not None and (page.path.name, page.page, long_edge) not in kept:
                        with cache.open("a", encoding="utf-8") as out:
                            out.write(json.dumps({**asdict(read), "page": [page.path.name, page.page]}) + "\n")
        finally:
            reader.close()
    return reads, reader.engine


def _cached(cache: Path | None) -> dict[tuple[str, int, int], Read]:
    if cache is None or not cache.exists():
        return {}
    pages = {(page.path.name, page.page): page for page in PAGES}
    reads = {}
    for line in cache.read_text(encoding="utf-8").splitlines():
        fields = json.loads(line)
        page = pages[(fields["page"][0], fields["page"][1])]
        reads[(page.path.name, page.page, fields["long_edge"])] = Read(**{**fields, "page": page})
    return reads


def _row(read: Read) -> str:
    page = read.page
    height = f"{read.text_px:.1f}" if read.text_px is not None else "-"
    tiled = f"{pct(read.tiled)} ({read.tiles} at {read.zoom:.2f}x)" if read.tiled is not None else "not tiled"
    ratio = f"{read.tiled / read.whole:.2f}" if read.tiled is not None and read.whole else "-"
    cells = [page.path.name, str(page.page), page.kind, str(read.long_edge), height, pct(read.whole), tiled, ratio]
    return "| " + " | ".join([*cells, f"{read.seconds_whole:.1f} / {read.seconds_tiles:.1f}"]) + " |"


def _figures(read: Read) -> str:
    height = f"{read.text_px:.1f} px" if read.text_px is not None else "unknown"
    tiled = (
        f"with tiles {pct(read.tiled)} ({read.tiles} at {read.zoom:.2f}x), ratio {read.tiled / read.whole:.2f}"
        if read.tiled is not None and read.whole
        else "not tiled"
    )
    return f"words {height}; CER whole {pct(read.whole)}, {tiled}"


def _summary(reads: list[Read]) -> tuple[float, float, int, int]:
    """Mean CER whole and with tiles (a page not tiled counts its whole reading in both), pages tiled, pages better."""
    whole = statistics.mean(read.whole for read in reads)
    tiled = statistics.mean(read.tiled if read.tiled is not None else read.whole for read in reads)
    better = sum(read.tiled is not None and read.tiled < read.whole for read in reads)
    return whole, tiled, sum(read.tiled is not None for read in reads), better


def section(reads: list[Read], engine: str) -> str:
    whole, tiled, count, better = _summary(reads)
    limits = TileLimits.of(Settings())
    lines = [
        HEADING,
        "",
        f"Written by `.venv/bin/python -m bench.tiles` on {datetime.now(UTC):%Y-%m-%d %H:%M UTC}, commit "
        f"{_git_head()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}; engine {engine}. A reading kept with "
        "`--cache` comes from the run that made it, its seconds too (a loaded machine's: three jobs shared two cores).",
        "",
        f"{len({(r.page.path, r.page.page) for r in reads})} born-digital pages in small print that nobody here wrote "
        "(sources: `tests/data/forms/SOURCES.md`, `tests/data/documents/SOURCES.md`), each rendered whole at a "
        "model-sized input (RENDER_MAX_LONG_EDGE below, the other settings their defaults) and read by the offline "
        "engine as the model (`RapidOcrProvider`, `PROVIDER=offline`); then cut into bands as the pipeline cuts a "
        f"dense page (default settings: TILE_MIN_TEXT_PX={limits.min_text_px:g}, TILE_MAX_TILES={limits.max_tiles}, "
        f"TILE_MAX_PIXELS={limits.max_pixels:,}, TILE_MAX_LONG_EDGE={limits.max_long_edge}, "
        f"TILE_OVERLAP={limits.overlap:g}; the words' height from the page's text layer at that size), each band "
        "read by the same engine and the answers stitched. Both are scored (CER) against the page's own text layer "
        "read line by line, as `bench.forms` scores (dot leaders as one `...`). A page whose words are tall enough "
        "at a size is not tiled there, and its whole reading counts for both.",
        "",
        f"Mean CER whole {pct(whole)}, with tiles {pct(tiled)} (ratio {tiled / whole:.2f}); {count} of {len(reads)} "
        f"readings tiled, {better} of them better than whole.",
        "",
        "| document | page | what it is | long edge (px) | words' height (px) | CER whole | CER tiles (tiles, "
        "zoom) | tiles / whole | seconds whole / tiles |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        *(_row(read) for read in reads),
    ]
    return "\n".join(lines) + "\n"


def run(mode: Mode) -> Result:
    started = time.perf_counter()
    reads, engine = measure(mode, note=lambda line: print(line, file=sys.stderr))
    whole, tiled, count, better = _summary(reads)
    return Result(
        key="tiles",
        title=f"Dense pages read in tiles ({len(reads)} readings, offline engine as the model)",
        ratio_label="mean CER with tiles / whole",
        ratio=tiled / whole if whole else 1.0,
        target=1.0,
        direction="<=",
        summary=f"mean CER whole {pct(whole)}, with tiles {pct(tiled)}; {count} tiled, {better} better",
        rows=[(f"{read.page.path.name} p. {read.page.page} at {read.long_edge} px", _figures(read)) for read in reads],
        notes=[f"engine: {engine}"],
        seconds=time.perf_counter() - started,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--markdown", type=Path, help="write the section into this markdown file (replacing its own)")
    parser.add_argument("--quick", action="store_true", help="three pages at one size")
    parser.add_argument("--cache", type=Path, help="keep each reading in this JSON-lines file, and resume from it")
    args = parser.parse_args(argv)
    mode = Mode.QUICK if args.quick else Mode.FULL
    reads, engine = measure(mode, note=lambda line: print(line, flush=True), cache=args.cache)
    publish_section(section(reads, engine), HEADING, args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
