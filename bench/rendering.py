"""Benchmark 6: page rendering speed and image size over the corpus PDFs, at the default settings and others."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pagescribe.sources.documents import DocumentKind, InvalidDocumentError, inspect_document
from pagescribe.sources.pages import render_page

from bench.common import CORPUS, Mode, Result, median

Format = Literal["jpeg", "png"]


@dataclass(frozen=True)
class Setting:
    label: str
    image_format: Format
    dpi: int = 150
    max_long_edge: int = 1568


DEFAULT = Setting("JPEG q85, 150 dpi, long edge <= 1568 (default)", "jpeg")
SETTINGS = (
    DEFAULT,
    Setting("PNG, 150 dpi, long edge <= 1568", "png"),
    Setting("JPEG q85, 150 dpi, no long-edge cap", "jpeg", max_long_edge=10_000),
    Setting("JPEG q85, 300 dpi, long edge <= 1568", "jpeg", dpi=300),
    Setting("JPEG q85, 150 dpi, long edge <= 1024", "jpeg", max_long_edge=1024),
)


@dataclass(frozen=True)
class Measured:
    setting: Setting
    pages: int
    seconds: float
    bytes_per_page: float
    median_bytes: float
    width: float
    height: float

    @property
    def pages_per_second(self) -> float:
        return self.pages / self.seconds

    @property
    def anthropic_tokens(self) -> float:
        """Anthropic's published estimate, tokens ~ width x height / 750, after the downscale its (pre-4.7)
        guidance describes: to a long edge of at most 1,568 px and about 1,600 tokens (~1.15 megapixels)."""
        scale = min(1.0, 1568 / max(self.width, self.height))
        return min(1600.0, (self.width * scale) * (self.height * scale) / 750)


def corpus_pdfs() -> list[tuple[Path, int]]:
    """Every corpus PDF that opens (the password-protected one is refused, as the pipeline refuses it)."""
    found: list[tuple[Path, int]] = []
    for path in sorted(CORPUS.glob("*.pdf")):
        try:
            found.append((path, inspect_document(path, max_pages=10_000, max_image_pixels=60_000_000).page_count))
        except InvalidDocumentError:
            continue
    return found


def _render_all(setting: Setting, pdfs: list[tuple[Path, int]]) -> tuple[float, list[tuple[int, int, int]]]:
    """Render every page once: seconds taken, and (bytes, width, height) per page."""
    out: list[tuple[int, int, int]] = []
    started = time.perf_counter()
    for path, pages in pdfs:
        for page in range(1, pages + 1):
            rendered = render_page(
                path,
                DocumentKind.PDF,
                page,
                dpi=setting.dpi,
                max_long_edge=setting.max_long_edge,
                image_format=setting.image_format,
            )
            out.append((len(rendered.data), rendered.width, rendered.height))
    return time.perf_counter() - started, out


def measure(pdfs: list[tuple[Path, int]], passes: int, *, warm_up: bool) -> list[Measured]:
    """Each setting over the whole corpus, the settings interleaved within each pass (load drift hits all alike);
    with ``warm_up``, one pass first, not counted. Sizes are those of the first pass."""
    seconds = {setting: 0.0 for setting in SETTINGS}
    pages: dict[Setting, list[tuple[int, int, int]]] = {}
    for number in range(-1 if warm_up else 0, passes):  # -1: the warm-up
        for setting in SETTINGS:
            elapsed, rendered = _render_all(setting, pdfs)
            pages.setdefault(setting, rendered)
            if number >= 0:
                seconds[setting] += elapsed
    results: list[Measured] = []
    for setting in SETTINGS:
        sizes = pages[setting]
        count = len(sizes)
        results.append(
            Measured(
                setting=setting,
                pages=count * passes,
                seconds=seconds[setting],
                bytes_per_page=sum(b for b, _, _ in sizes) / count,
                median_bytes=median([float(b) for b, _, _ in sizes]),
                width=sum(w for _, w, _ in sizes) / count,
                height=sum(h for _, _, h in sizes) / count,
            )
        )
    return results


# counted passes over the corpus, and whether one warm-up pass comes first. SMOKE: one pass, counted: every page of
# every corpus PDF rendered once at every setting.
SIZES: dict[Mode, tuple[int, bool]] = {Mode.FULL: (6, True), Mode.QUICK: (2, True), Mode.SMOKE: (1, False)}


def run(mode: Mode) -> Result:
    passes, warm_up = SIZES[mode]
    started = time.perf_counter()
    pdfs = corpus_pdfs()
    results = measure(pdfs, passes, warm_up=warm_up)
    default, png = results[0], results[1]
    rows = [
        (
            m.setting.label,
            f"{m.pages_per_second:.1f} pages/s | {m.seconds / m.pages * 1000:.0f} ms | "
            f"{m.bytes_per_page / 1024:.0f} KiB (median {m.median_bytes / 1024:.0f}) | "
            f"{m.width:.0f} x {m.height:.0f} | ~{m.anthropic_tokens:,.0f}",
        )
        for m in results
    ]
    return Result(
        key="rendering",
        title=f"Rendering ({sum(p for _, p in pdfs)} pages of {len(pdfs)} corpus PDFs, one thread, {passes} pass(es))",
        ratio_label="default JPEG bytes / PNG bytes",
        ratio=default.bytes_per_page / png.bytes_per_page,
        target=None,
        direction="<=",
        summary=(
            f"default JPEG {default.pages_per_second:.1f} pages/s, {default.bytes_per_page / 1024:.0f} KiB/page; "
            f"PNG {png.pages_per_second:.1f} pages/s, {png.bytes_per_page / 1024:.0f} KiB/page"
        ),
        rows=rows,
        notes=[f"documents: {', '.join(f'{p.name} ({n})' for p, n in pdfs)}"],
        seconds=time.perf_counter() - started,
    )


def table_header() -> tuple[str, str]:
    return (
        "setting",
        "pages/s | per page | bytes per page (mean, median) | mean size (px) | "
        "approx. Claude input tokens (after its downscale)",
    )
