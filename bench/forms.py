"""The offline engine on real table and form pages: tax forms and their tables, statistical tables, a table of
contents with dot leaders, forms of boxes, scored against each page's own text read line by line.

    .venv/bin/python -m bench.forms                                 # every page (about two minutes on two cores)
    .venv/bin/python -m bench.forms --markdown docs/accuracy.md     # also write the section into that file

The pages (:data:`PAGES`, sources in ``tests/data/forms/SOURCES.md`` and ``tests/data/documents/SOURCES.md``) are
born-digital: their text layer is the truth. pdfium gives that text in the order the page's program draws it, which
on a form or a table is often not the order anyone reads it in (a form's title drawn last, a table column by
column), so the truth here is the text layer read the way ``pdftotext -layout`` reads a page: line by line, top to
bottom, each line left to right (:func:`reading_truth`), within each of the page's columns of text where it has
them (:data:`PAGES` names where they divide). A dot leader's length is the font's dot spacing, not text: a run of
three dots or more (:data:`LEADER`) counts as one leader in the truth and in the reading alike. Each page is
rendered as the pipeline renders it, read by ``RapidOcrProvider`` and scored (CER); the same reading is also scored
against pdfium's order with every dot counted, and tesseract (when installed) reads the same image, both for
information. Figures are measured, not asserted: the exit status is non-zero only when the run crashes.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import re
import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from pagescribe.grounding import EvidenceWord
from pagescribe.sources.documents import DocumentKind
from pagescribe.sources.pages import render_page
from pagescribe.sources.textlayer import extract_text_layer, text_layer_words
from pagescribe_local.scoring import cer

from bench.common import REPO
from bench.ocr import (
    DOCUMENTS,
    RENDER_OPTIONS,
    Reader,
    pct,
    read_with_tesseract,
    tesseract_version,
)
from bench.report import _git_head, publish_section

HEADING = "## Offline engine on table and form pages"
FORMS = REPO / "tests" / "data" / "forms"
TARGET = 0.10  # CER median (issue 27)
LEADER = re.compile(r"(?:\.[ \t]?){3,}|\u2026+")


@dataclass(frozen=True)
class FormPage:
    """A page of the set: where it is, what kind of page it is, and where its columns of text divide (shares of the
    page's width, left to right; none for a page read across its whole width)."""

    path: Path
    page: int
    kind: str
    columns: tuple[float, ...] = ()


PAGES = (
    FormPage(FORMS / "us-007.pdf", 1, "tax notice: two columns of text, a withholding table", (0.5,)),
    FormPage(FORMS / "us-007.pdf", 2, "tax tables: withholding amounts by payroll period"),
    FormPage(DOCUMENTS / "SF424_page2.pdf", 1, "form: federal grant application, boxes and labels"),
    FormPage(DOCUMENTS / "form_dd0293.pdf", 1, "form: DoD discharge review, boxes and check boxes"),
    FormPage(DOCUMENTS / "form_dd0293.pdf", 2, "form: DoD discharge review, its tables"),
    FormPage(FORMS / "150109DSP-Milw-505-90D.pdf", 1, "form: state child welfare report, filled in"),
    FormPage(FORMS / "12s0324.pdf", 1, "statistical table: two tables, dot leaders in the stub, small type"),
    FormPage(DOCUMENTS / "nics-background-checks-2015-11.pdf", 1, "statistical table: 55 rows by 23 columns, 6 pt"),
    FormPage(FORMS / "district_health.pdf", 1, "statistical table: indicators, two surveys side by side"),
    FormPage(FORMS / "us-024.pdf", 1, "statistical table: one table, its header in two rows"),
    FormPage(FORMS / "us-024.pdf", 2, "statistical table: one table beside a heading"),
    FormPage(FORMS / "chelsea_pdta-p3.pdf", 1, "table of contents with dot leaders (French)"),
)


def reading_truth(path: Path, page: int, columns: Sequence[float] = ()) -> str:
    """The page's text layer read line by line: its words (:func:`pagescribe.sources.textlayer.text_layer_words`) in
    each column of text (divided at ``columns``, shares of the width, left to right), a word on the line whose band
    holds its middle, top to bottom, each line left to right."""
    text = text_layer_words(path, page)
    edges = [0.0, *(share * text.width for share in columns), float("inf")]
    lines: list[str] = []
    for left, right in itertools.pairwise(edges):
        lines += _lines(word for word in text.words if left <= (word.box.x0 + word.box.x1) / 2 < right)
    return "\n".join(lines)


def _lines(words: Iterable[EvidenceWord]) -> list[str]:
    bands: list[tuple[float, float, list[EvidenceWord]]] = []
    for word in sorted(words, key=lambda word: (word.box.y0 + word.box.y1) / 2):
        middle = (word.box.y0 + word.box.y1) / 2
        if bands and bands[-1][0] <= middle <= bands[-1][1]:
            top, bottom, members = bands[-1]
            bands[-1] = (min(top, word.box.y0), max(bottom, word.box.y1), [*members, word])
        else:
            bands.append((word.box.y0, word.box.y1, [word]))
    return [" ".join(word.text for word in sorted(members, key=lambda word: word.box.x0)) for *_, members in bands]


def leaders_as_one(text: str) -> str:
    """The text with each dot leader (:data:`LEADER`) written as one ``...``."""
    return LEADER.sub(" ... ", text)


@dataclass(frozen=True)
class Scored:
    """One page: its CER read line by line (the target's), against pdfium's order with every dot counted, and
    tesseract's (None when it is not installed), and the engine's seconds."""

    page: FormPage
    cer: float
    pdfium_order: float
    tesseract: float | None
    seconds: float
    tables: int  # tables in the engine's reading (markdown or HTML)
    html_tables: int


def measure(note: Callable[[str], None] = print) -> tuple[list[Scored], str, str | None]:
    """Every page of :data:`PAGES` read and scored; the engine's and tesseract's versions."""
    binary = shutil.which("tesseract")
    scored: list[Scored] = []
    with asyncio.Runner() as runner, tempfile.TemporaryDirectory(prefix="bench-forms-") as directory:
        reader = Reader(runner)
        try:
            for index, page in enumerate(PAGES, start=1):
                truth = leaders_as_one(reading_truth(page.path, page.page, page.columns))
                rendered = render_page(page.path, DocumentKind.PDF, page.page, **RENDER_OPTIONS)
                answer = reader.read(rendered, page.path.name, page.page)
                tesseract: float | None = None
                if binary is not None:
                    image = Path(directory) / f"page.{rendered.media_type.split('/')[1]}"
                    image.write_bytes(rendered.data)
                    tesseract = cer(truth, leaders_as_one(read_with_tesseract(binary, image)[0]))
                result = Scored(
                    page,
                    cer(truth, leaders_as_one(answer.text)),
                    cer(extract_text_layer(page.path, page.page), answer.text),
                    tesseract,
                    answer.latency_seconds,
                    answer.text.count("<table>") + answer.text.count("\n| --- |"),
                    answer.text.count("<table>"),
                )
                scored.append(result)
                note(f"[{index}/{len(PAGES)}] {_row(result)}")
        finally:
            reader.close()
    return scored, reader.engine, tesseract_version(binary) if binary else None


def _row(result: Scored) -> str:
    page = result.page
    tesseract = pct(result.tesseract) if result.tesseract is not None else "not installed"
    tables = f"{result.tables} ({result.html_tables} HTML)" if result.tables else "-"
    cells = [page.path.name, str(page.page), page.kind, pct(result.cer), pct(result.pdfium_order), tesseract]
    return "| " + " | ".join([*cells, tables, f"{result.seconds:.1f}"]) + " |"


def section(scored: list[Scored], engine: str, tesseract: str | None) -> str:
    """The markdown section: how it was measured, the summary against the target, and every page."""
    median = statistics.median(result.cer for result in scored)
    worst = max(scored, key=lambda result: result.cer)
    others = [result.tesseract for result in scored if result.tesseract is not None]
    lines = [
        HEADING,
        "",
        f"Written by `.venv/bin/python -m bench.forms` on {datetime.now(UTC):%Y-%m-%d %H:%M UTC}, commit "
        f"{_git_head()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}; engine {engine}, comparison "
        f"{tesseract or 'tesseract: not installed'}.",
        "",
        f"{len(scored)} born-digital pages of tables and forms that nobody here wrote (sources: "
        "`tests/data/forms/SOURCES.md`, `tests/data/documents/SOURCES.md`), rendered as the pipeline renders them "
        "(default settings), read by `RapidOcrProvider` and scored (CER) against each page's own text layer read "
        "line by line, as `pdftotext -layout` reads a page: top to bottom, each line left to right, within each "
        "column of text where a page has two (`PAGES` in `bench/forms.py` says where they divide). pdfium gives "
        "that text in the order the page draws it, which on forms and tables is often not reading order (the "
        'SF 424\'s title comes last; a table may come column by column), so the column "pdfium order" is the same '
        "reading scored against that order with every leader dot counted, for information: what a first try "
        "measures. A dot leader is one `...` in the truth and in the reading alike (its "
        "length is the font's dot spacing, not text). An HTML table's tags are markup and cost nothing, as a "
        "markdown table's pipes do (`pagescribe_local.scoring.plain`).",
        "",
        "| measure | pagescribe (offline) | tesseract |",
        "| --- | --- | --- |",
        f"| CER median / mean / worst | {pct(median)} / {pct(statistics.mean(r.cer for r in scored))} / "
        f"{pct(worst.cer)} ({worst.page.path.name} p. {worst.page.page}) | "
        + (f"{pct(statistics.median(others))} / {pct(statistics.mean(others))} / {pct(max(others))}" if others else "-")
        + " |",
        f"| CER median against pdfium's order, dots counted | "
        f"{pct(statistics.median(r.pdfium_order for r in scored))} | - |",
        "",
        f"Target: CER median <= {pct(TARGET)}: {pct(median)}, {'met' if median <= TARGET else 'MISSED'}.",
        "",
        "| document | page | kind | CER | CER, pdfium order | tesseract CER | tables (HTML) | seconds |",
        "| --- | ---: | --- | ---: | ---: | ---: | --- | ---: |",
        *(_row(result) for result in scored),
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.forms", description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", type=Path, metavar="FILE", help=f"write the section into FILE ({HEADING!r})")
    args = parser.parse_args(argv)
    publish_section(
        section(*measure(note=lambda line: print(line, file=sys.stderr, flush=True))), HEADING, args.markdown
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
