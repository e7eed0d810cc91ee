"""The offline engine's accuracy on real born-digital pages: upright, turned a quarter at a time, and tesseract's.

    .venv/bin/python -m bench.ocr                                   # every page (10-20 minutes on two cores)
    .venv/bin/python -m bench.ocr --quick                           # one single-column and one two-column page
    .venv/bin/python -m bench.ocr --markdown docs/accuracy.md       # also write the section into that file

Every page with a usable text layer of every PDF in tests/data/documents and tests/data/corpus is rendered as the
pipeline renders it (the default settings), transcribed by RapidOcrProvider and scored (CER) against its own text
layer. The same page, turned with ``Image.rotate(angle, expand=True)`` (counter-clockwise), then goes the way of a
scan (an image document: orientation detection, then the default rendering) and is transcribed and scored again.
Tesseract, when installed, reads the same upright image, for comparison only. Figures are measured, not asserted:
the exit status is non-zero only when the run crashes.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pagescribe.providers.base import PageImage, Transcription, TranscriptionRequest
from pagescribe.providers.offline import RapidOcrProvider
from pagescribe.settings import Settings
from pagescribe.sources.documents import DocumentKind, InvalidDocumentError, inspect_document
from pagescribe.sources.pages import RenderedPage, render_page
from pagescribe_local.evaluation import text_layer_truth
from pagescribe_local.scoring import cer, table_shapes
from PIL import Image

from bench.common import CORPUS, REPO
from bench.report import _git_head, publish_section

HEADING = "## Offline engine: upright, rotated, and tesseract"
DOCUMENTS = REPO / "tests" / "data" / "documents"
SOURCES = (DOCUMENTS, CORPUS)
# The pages set in two columns, looked at one by one: (document, page). The HASYv2 paper's pages 6 to 8 are its
# appendix of symbol tables, set across the page in one column; multicolumn.pdf's page 3 is a table above two columns.
TWO_COLUMN = frozenset(
    {("multicolumn.pdf", page) for page in (1, 2, 3)} | {("hasyv2-paper.pdf", page) for page in (1, 2, 3, 4, 5)}
)
QUICK = ((CORPUS / "multicolumn.pdf", 1), (CORPUS / "minimal-document.pdf", 1))
TURNS = (90, 180, 270)
MEDIAN_TARGET = 0.03
MEAN_TARGET = 0.08
TWO_COLUMN_TARGET = 0.10
TURN_POINTS = 2.0  # CER percentage points a turned page may differ from the same page upright
# The tables of the table pages, counted on the rendered pages: (rows, columns) of each, in reading order, rows being
# the table's lines of text (a header set on two lines is two rows). Google Docs' export: one table of a header and
# four rows by six columns. The HASYv2 paper, page 3: Table II (two header lines, ten classifiers; four columns) and
# Table III (two header lines, four networks; five columns).
TABLES: dict[tuple[str, int], tuple[tuple[int, int], ...]] = {
    ("google-doc-document.pdf", 1): ((5, 6),),
    ("hasyv2-paper.pdf", 3): ((12, 4), (6, 5)),
}

_DEFAULTS = Settings.model_fields
# What the pipeline passes to render_page (pagescribe.transcription), at the default settings.
RENDER_OPTIONS: dict[str, Any] = {
    "dpi": _DEFAULTS["render_dpi"].default,
    "max_long_edge": _DEFAULTS["render_max_long_edge"].default,
    "image_format": _DEFAULTS["render_format"].default,
    "max_image_pixels": _DEFAULTS["max_image_pixels"].default,
    "orient": _DEFAULTS["detect_orientation"].default,
}
BUDGET_SECONDS: float = _DEFAULTS["provider_timeout_seconds"].default
# What the pipeline builds the offline provider with (pagescribe.runtime), at the default settings.
PROVIDER_OPTIONS: dict[str, Any] = {
    "language": _DEFAULTS["ocr_language"].default,
    "page_numbers": _DEFAULTS["page_numbers"].default,
    "orient": _DEFAULTS["detect_orientation"].default,
}


@dataclass(frozen=True)
class Turned:
    """One turned copy of a page: how far it was turned, the turn the pipeline detected back, and its CER."""

    angle: int  # counter-clockwise, so the right turn back is the same angle clockwise
    detected: int  # clockwise: the renderer's turn and the engine's added up, as pagescribe.transcription does
    cer: float


@dataclass(frozen=True)
class PageResult:
    """One page: the offline engine upright and turned, and tesseract upright (None when it is not installed)."""

    document: str
    page: int
    two_column: bool
    blank: bool  # the render has no mark at all (a font that does not render): no engine can read it
    cer: float
    seconds: float
    rotation: int  # the engine's own turn of the upright image (it reads a page again turned when unsure): 0 here
    turned: tuple[Turned, ...]
    tesseract_cer: float | None
    tesseract_seconds: float | None
    tables: tuple[tuple[int, int], ...] = ()  # (rows, columns) of each table (markdown or HTML) in the upright reading


@dataclass(frozen=True)
class Run:
    """Every page measured, the documents left out and why, and the engines' versions."""

    pages: list[PageResult]
    skipped: list[str]
    engine: str
    tesseract: str | None  # its version line; None when it is not installed
    quick: bool
    commit: str  # the checked-out commit when the run started, and whether shared/ differed from it


def page_set(quick: bool, note: Callable[[str], None]) -> tuple[list[tuple[Path, int, str]], list[str]]:
    """The pages to measure with their truth (the text layer), and the documents left out with the reason."""
    if quick:
        chosen = [(path, page, text) for path, page in QUICK if (text := text_layer_truth(path).get(page))]
        return chosen, []
    pages: list[tuple[Path, int, str]] = []
    skipped: list[str] = []
    for path in (path for source in SOURCES for path in sorted(source.glob("*.pdf"))):
        try:
            inspect_document(path, max_pages=10_000, max_image_pixels=RENDER_OPTIONS["max_image_pixels"])
        except InvalidDocumentError as exc:
            skipped.append(f"{path.name}: {exc.reason}")
            note(f"skipped {path.name}: {exc.reason}")
            continue
        truth = text_layer_truth(path)
        if not truth:
            skipped.append(f"{path.name}: no page with a usable text layer")
        pages += [(path, page, text) for page, text in sorted(truth.items())]
    return pages, skipped


def tesseract_version(binary: str) -> str:
    done = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True)  # noqa: S603
    return (done.stdout or done.stderr).splitlines()[0].strip()


def read_with_tesseract(binary: str, image: Path) -> tuple[str, float]:
    """Tesseract's text for an image (default page segmentation, English) and the wall time of its process."""
    started = time.perf_counter()
    done = subprocess.run(  # noqa: S603
        [binary, str(image), "-", "-l", "eng"], capture_output=True, text=True, encoding="utf-8", check=True
    )
    return done.stdout, time.perf_counter() - started


class Reader:
    """The offline provider, built once, called synchronously through one event loop."""

    def __init__(self, runner: asyncio.Runner) -> None:
        self._runner = runner
        self._provider = RapidOcrProvider(**PROVIDER_OPTIONS)
        self.engine = "offline:rapidocr"

    def read(self, rendered: RenderedPage, label: str, page: int, *, seconds: float = BUDGET_SECONDS) -> Transcription:
        """The provider's transcription of the page, within ``seconds`` (the pipeline's call time by default)."""
        request = TranscriptionRequest(PageImage(rendered.data, rendered.media_type), "", "", 0, label, page)
        answer = self._runner.run(self._provider.transcribe(request, call_seconds=seconds))
        self.engine = f"{self._provider.name} ({answer.model})"
        return answer

    def close(self) -> None:
        self._runner.run(self._provider.aclose())


def _turned(reader: Reader, path: Path, page: int, truth: str, scratch: Path) -> tuple[Turned, ...]:
    """The page rendered losslessly, turned by each of TURNS, and read back through the scan path."""
    lossless = render_page(path, DocumentKind.PDF, page, **{**RENDER_OPTIONS, "image_format": "png"})
    results: list[Turned] = []
    with Image.open(io.BytesIO(lossless.data)) as upright:
        for angle in TURNS:
            scan = scratch / f"turned-{angle}.png"
            upright.rotate(angle, expand=True).save(scan)
            rendered = render_page(scan, DocumentKind.PNG, 1, **RENDER_OPTIONS)
            answer = reader.read(rendered, f"{path.name} turned {angle}", page)
            results.append(Turned(angle, (rendered.rotation + answer.rotation) % 360, cer(truth, answer.text)))
    return tuple(results)


def measure(quick: bool = False, note: Callable[[str], None] = print) -> Run:
    """Render, transcribe and score every page of the page set; ``note`` gets progress and skipped documents."""
    commit = _git_head()
    pages, skipped = page_set(quick, note)
    binary = shutil.which("tesseract")
    results: list[PageResult] = []
    with asyncio.Runner() as runner, tempfile.TemporaryDirectory(prefix="bench-ocr-") as directory:
        scratch = Path(directory)
        reader = Reader(runner)
        try:
            for index, (path, page, truth) in enumerate(pages, start=1):
                rendered = render_page(path, DocumentKind.PDF, page, **RENDER_OPTIONS)
                answer = reader.read(rendered, path.name, page)
                tesseract_cer: float | None = None
                tesseract_seconds: float | None = None
                if binary is not None:
                    image = scratch / f"upright.{rendered.media_type.split('/')[1]}"
                    image.write_bytes(rendered.data)
                    tesseract_text, tesseract_seconds = read_with_tesseract(binary, image)
                    tesseract_cer = cer(truth, tesseract_text)
                result = PageResult(
                    document=path.name,
                    page=page,
                    two_column=(path.name, page) in TWO_COLUMN,
                    blank=rendered.marked == 0,
                    cer=cer(truth, answer.text),
                    seconds=answer.latency_seconds,
                    rotation=answer.rotation,
                    turned=_turned(reader, path, page, truth, scratch),
                    tesseract_cer=tesseract_cer,
                    tesseract_seconds=tesseract_seconds,
                    tables=tuple(table_shapes(answer.text)),
                )
                results.append(result)
                note(f"[{index}/{len(pages)}] {_row(result)}")
        finally:
            reader.close()
    return Run(results, skipped, reader.engine, tesseract_version(binary) if binary else None, quick, commit)


def tables_found(pages: Sequence[PageResult]) -> tuple[int, int]:
    """How many of the TABLES of the measured pages were read as a table (markdown or HTML) of their rows and
    columns, of how many."""
    found = expected = 0
    for page in pages:
        shapes = list(page.tables)
        for shape in TABLES.get((page.document, page.page), ()):
            expected += 1
            if shape in shapes:
                shapes.remove(shape)
                found += 1
    return found, expected


# --- the markdown section -----------------------------------------------------------------------------------------


def pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f} %"


def _points(value: float) -> str:
    return f"{value * 100:+.1f}"


def _verdict(met: bool) -> str:
    return "met" if met else "MISSED"


def _row(result: PageResult) -> str:
    name = result.document + (" (blank render)" if result.blank else "")
    turned = [f"{pct(t.cer)} ({t.detected}°)" for t in result.turned]
    tesseract = pct(result.tesseract_cer) if result.tesseract_seconds is not None else "not installed"
    columns = "two" if result.two_column else "one"
    upright = pct(result.cer) + (f" ({result.rotation}°)" if result.rotation else "")
    tables = ", ".join(f"{rows}x{cols}" for rows, cols in result.tables) or "-"
    expected = TABLES.get((result.document, result.page))
    if expected:
        tables += " (expected " + ", ".join(f"{rows}x{cols}" for rows, cols in expected) + ")"
    return " | ".join([name, str(result.page), columns, upright, *turned, tesseract, tables])


def _spread(values: Sequence[float]) -> str:
    return f"{pct(statistics.median(values))} / {pct(statistics.mean(values))} / {pct(max(values))}"


def section(run: Run) -> str:
    """The markdown section for ``run``: how it was measured, the summary, the targets and every page."""
    pages = run.pages
    command = ".venv/bin/python -m bench.ocr" + (" --quick" if run.quick else "")
    lines = [
        HEADING,
        "",
        f"Written by `{command}` on {datetime.now(UTC):%Y-%m-%d %H:%M UTC}, commit {run.commit}, "
        f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}; engine {run.engine}, comparison "
        f"{run.tesseract or 'tesseract: not installed'}.",
        "",
        ("Two pages (`--quick`: a two-column and a single-column one)" if run.quick else "Every page")
        + " with a usable text layer of the PDFs in `tests/data/documents` and `tests/data/corpus`, rendered "
        "as the pipeline renders it (default settings: "
        + ", ".join(f"{key} {value}" for key, value in RENDER_OPTIONS.items())
        + "), read by `RapidOcrProvider` ("
        + ", ".join(f"{key} {value}" for key, value in PROVIDER_OPTIONS.items())
        + ") and scored (CER) against the page's own text layer. Turned: the same "
        "render turned counter-clockwise by 90, 180 or 270° (`Image.rotate(angle, expand=True)`), then taken "
        "as a scan (a PNG document: orientation detection, the default rendering) and read again; in brackets the "
        "clockwise turn the pipeline made (the renderer's orientation detection, then the engine's own turn "
        "of a page whose lines stand sideways or that it reads with low confidence, added up), which is right when "
        "it equals the column's angle; "
        "an upright page shows a turn only when the engine made one. Tesseract "
        "(`tesseract IMAGE - -l eng`, default page segmentation) reads the same upright image, as information. "
        "Seconds are the engine's call per upright page (tesseract's include starting its process). The column "
        '"columns" says how each page is set, looked at page by page (`TWO_COLUMN` in `bench/ocr.py`): the '
        "HASYv2 paper's pages 6 to 8 are its appendix of symbol tables, set across the page, whose text layer "
        "maps many math glyphs to other characters (the glyph of `\\sum` is the letter P there), so their CER "
        "counts those glyphs as errors whatever the engine reads.",
        "",
    ]
    if run.skipped:
        lines += ["Left out: " + "; ".join(run.skipped) + ".", ""]
    if not pages:
        return "\n".join([*lines, "No page was measured.", ""])
    scores = [page.cer for page in pages]
    documents = len({page.document for page in pages})
    two_column = [page for page in pages if page.two_column]
    worst_two = max(two_column, key=lambda page: page.cer) if two_column else None
    lines += ["### Summary", "", "| measure | pagescribe (offline) | tesseract |", "| --- | --- | --- |"]
    lines.append(f"| pages / documents | {len(pages)} / {documents} | same pages |")
    tesseract = [page.tesseract_cer for page in pages if page.tesseract_cer is not None]
    lines.append(
        f"| CER median / mean / worst, upright | {_spread(scores)} | "
        f"{_spread(tesseract) if tesseract else 'not installed'} |"
    )
    blank = [page for page in pages if page.blank]
    if blank:
        rest = [page for page in pages if not page.blank]
        rest_tesseract = [page.tesseract_cer for page in rest if page.tesseract_cer is not None]
        lines.append(
            f"| the same without {len(blank)} blank render(s) | {_spread([page.cer for page in rest]) if rest else '-'}"
            f" | {_spread(rest_tesseract) if rest_tesseract else '-'} |"
        )
    if worst_two is not None:
        tesseract_two = [page.tesseract_cer for page in two_column if page.tesseract_cer is not None]
        lines.append(
            f"| worst two-column page | {worst_two.document} p. {worst_two.page}: {pct(worst_two.cer)} | "
            f"{pct(max(tesseract_two)) if tesseract_two else '-'} |"
        )
    within: dict[int, int] = {}
    for angle in TURNS:
        differences = [turn.cer - page.cer for page in pages for turn in page.turned if turn.angle == angle]
        within[angle] = sum(abs(difference) * 100 <= TURN_POINTS for difference in differences)
        detected = sum(turn.detected == angle for page in pages for turn in page.turned if turn.angle == angle)
        lines.append(
            f"| turned {angle}°: within {TURN_POINTS:g} points of upright / turned back right / mean difference "
            f"(points) | {within[angle]} of {len(pages)} / {detected} of {len(pages)} / "
            f"{_points(statistics.mean(differences))} | - |"
        )
    tables, expected_tables = tables_found(pages)
    if expected_tables:
        lines.append(
            f"| tables read as tables (markdown or HTML) of their rows x columns | {tables} of {expected_tables} | "
            "(reads no tables) |"
        )
    tesseract_seconds = [page.tesseract_seconds for page in pages if page.tesseract_seconds is not None]
    lines.append(
        f"| seconds per page, median | {statistics.median(page.seconds for page in pages):.2f} | "
        f"{f'{statistics.median(tesseract_seconds):.2f}' if tesseract_seconds else '-'} |"
    )
    lines += _targets(scores, tesseract, worst_two, within, (tables, expected_tables), len(pages))
    lines += [
        "",
        "### By page",
        "",
        "| document | page | columns | CER upright | "
        + " | ".join(f"CER {a}° (turned back)" for a in TURNS)
        + " | tesseract CER | tables (rows x columns) |",
        "| --- | ---: | --- | ---: | " + " | ".join("---:" for _ in TURNS) + " | ---: | --- |",
        *(f"| {_row(page)} |" for page in pages),
        "",
    ]
    return "\n".join(lines)


def _targets(
    scores: list[float],
    tesseract: list[float],
    worst_two: PageResult | None,
    within: dict[int, int],
    table_counts: tuple[int, int],
    pages: int,
) -> list[str]:
    """The section's targets, each with its figure and whether it was met."""
    tables, expected_tables = table_counts
    lines = ["", "### Targets", ""]
    median, mean = statistics.median(scores), statistics.mean(scores)
    lines.append(f"- CER median <= {pct(MEDIAN_TARGET)}: {pct(median)}, {_verdict(median <= MEDIAN_TARGET)}")
    lines.append(f"- CER mean <= {pct(MEAN_TARGET)}: {pct(mean)}, {_verdict(mean <= MEAN_TARGET)}")
    if worst_two is not None:
        lines.append(
            f"- no two-column page above {pct(TWO_COLUMN_TARGET)}: worst {pct(worst_two.cer)} "
            f"({worst_two.document} p. {worst_two.page}), {_verdict(worst_two.cer <= TWO_COLUMN_TARGET)}"
        )
    for angle in TURNS:
        lines.append(
            f"- every page turned {angle}° within {TURN_POINTS:g} points of upright: {within[angle]} of "
            f"{pages}, {_verdict(within[angle] == pages)}"
        )
    if expected_tables:
        lines.append(
            f"- table pages give a table (markdown or HTML) with the right number of rows and columns: {tables} of "
            f"{expected_tables} tables, {_verdict(tables == expected_tables)}"
        )
    if tesseract:
        lines.append(
            f"- beat tesseract (information): median {pct(median)} vs {pct(statistics.median(tesseract))}, "
            f"mean {pct(mean)} vs {pct(statistics.mean(tesseract))}"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ocr", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two pages (one of them two-column), every turn")
    parser.add_argument("--markdown", type=Path, metavar="FILE", help=f"write the section into FILE ({HEADING!r})")
    args = parser.parse_args(argv)
    text = section(measure(args.quick, note=lambda line: print(line, file=sys.stderr, flush=True)))
    publish_section(text, HEADING, args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
