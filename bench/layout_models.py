"""Reading order from geometry (pagescribe.layout) against rapid-layout's layout_cdla.onnx, side by side.

Issue 13 asked to measure both candidates for the offline engine's reading order and keep the better one. The same
recognised boxes of each page (the offline engine's, as the pipeline renders the page) are put in reading order two
ways and scored (CER) against the page's own text layer:

- geometry: :func:`pagescribe.layout.boxes_to_text`, what the engine ships (column gutters in the boxes);
- layout_cdla: the regions of rapid-layout's bundled CDLA model (text, title, figure, table, header, footer,
  reference, equation; confidence 0.5 or more), read in the usual region order: top to bottom, a region wider than
  half the page's text closing a band, and in each band the regions whose middle is left of the page's middle before
  those right of it; each box goes to the region holding most of it (a box in none is a region of its own), and a
  region's boxes are read line by line.

rapid-layout is not a dependency of pagescribe (its other models download at run time); this measurement needs it:
``.venv/bin/python -m pip install 'rapid-layout==1.2.1'``, then ``.venv/bin/python -m bench.layout_models``.
"""

from __future__ import annotations

import argparse
import importlib
import io
import os
import statistics
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any

from pagescribe.layout import boxes_to_text
from pagescribe.layout.boxes import TextBox
from pagescribe.providers.offline import RapidOcrProvider
from pagescribe.sources.documents import DocumentKind
from pagescribe.sources.pages import render_page
from pagescribe_local.evaluation import text_layer_truth
from pagescribe_local.scoring import cer
from PIL import Image

from bench.common import CORPUS
from bench.ocr import DOCUMENTS, PROVIDER_OPTIONS, RENDER_OPTIONS, TWO_COLUMN
from bench.report import _git_head, publish_section

MIN_SCORE = 0.5  # layout_cdla's regions kept: its own default confidence threshold


@dataclass(frozen=True)
class Region:
    left: float
    top: float
    right: float
    bottom: float
    label: str


def _overlap(box: TextBox, region: Region) -> float:
    right = box.right if box.right is not None else box.left
    width = max(0.0, min(right, region.right) - max(box.left, region.left))
    height = max(0.0, min(box.bottom, region.bottom) - max(box.top, region.top))
    return width * height


def region_order(boxes: list[TextBox], regions: list[Region], page_width: float) -> str:
    """The boxes' text read region by region in the usual order of layout models' regions."""
    members: dict[int, list[TextBox]] = {}
    loose: list[Region] = []
    for box in boxes:
        best = max(range(len(regions)), key=lambda at: _overlap(box, regions[at]), default=None)
        if best is not None and _overlap(box, regions[best]) > 0:
            members.setdefault(best, []).append(box)
        else:
            loose.append(Region(box.left, box.top, box.right or box.left, box.bottom, "none"))
            members[len(regions) + len(loose) - 1] = [box]
    every = [*regions, *loose]
    used = [every[at] for at in members]
    left_edge = min((region.left for region in used), default=0.0)
    right_edge = max((region.right for region in used), default=page_width)
    middle, wide = (left_edge + right_edge) / 2, (right_edge - left_edge) / 2
    order: list[int] = []
    band: list[int] = []

    def flush() -> None:
        order.extend(sorted(band, key=lambda at: (every[at].left + every[at].right >= 2 * middle, every[at].top)))
        band.clear()

    for at in sorted(members, key=lambda at: every[at].top):
        if every[at].right - every[at].left > wide:
            flush()
            order.append(at)
        else:
            band.append(at)
    flush()
    lines: list[str] = []
    for at in order:
        for line in _lines(members[at]):
            lines.append(line)
    return "\n".join(lines)


def _lines(boxes: list[TextBox]) -> list[str]:
    """The boxes as lines, top to bottom, each left to right (a box's middle within the line's extent)."""
    rows: list[list[TextBox]] = []
    for box in sorted(boxes, key=lambda box: (box.top, box.left)):
        middle = (box.top + box.bottom) / 2
        if rows and rows[-1][0].top <= middle <= rows[-1][0].bottom:
            rows[-1].append(box)
        else:
            rows.append([box])
    return [" ".join(box.text for box in sorted(row, key=lambda box: box.left)) for row in rows]


def _layout_engine() -> Any:
    try:
        rapid_layout = importlib.import_module("rapid_layout")  # not a dependency: see the module's docstring
    except ImportError:
        sys.exit("rapid-layout is not installed: .venv/bin/python -m pip install 'rapid-layout==1.2.1'")
    model = resources.files("rapid_layout") / "models" / "layout_cdla.onnx"  # bundled: nothing is downloaded
    return rapid_layout.RapidLayout(model_type="pp_layout_cdla", model_dir_or_path=str(model), conf_thresh=MIN_SCORE)


HEADING = "## Reading order: geometry against layout_cdla"


def section(rows: list[tuple[str, int, float, float, float]], every_page: bool, commit: str) -> str:
    """The markdown section: how it was measured, the means (all pages and the two-column ones) and every page."""
    command = ".venv/bin/python -m bench.layout_models" + (" --all" if every_page else "")
    two = [row for row in rows if (row[0], row[1]) in TWO_COLUMN]
    lines = [
        HEADING,
        "",
        f"Written by `{command}` on {datetime.now(UTC):%Y-%m-%d %H:%M UTC}, commit {commit}, {os.cpu_count()} CPUs, "
        f"load {os.getloadavg()[0]:.2f}. The offline engine's boxes of each page (rendered as the pipeline renders "
        "it) put in reading order two ways and scored (CER) against the page's text layer: geometry, what the "
        "engine ships (column gutters in the boxes, `pagescribe.layout`); and the regions of rapid-layout's "
        "bundled `layout_cdla.onnx` (confidence 0.5 or more) read in the usual region order: top to bottom, a region "
        "wider than half the page's text closing a band, left regions before right ones in a band, each box in "
        "the region holding most of it, a region's boxes line by line. rapid-layout is not a dependency; the "
        "measurement needs `pip install rapid-layout==1.2.1` in the virtualenv.",
        "",
        "| pages | CER geometry (mean) | CER layout_cdla (mean) |",
        "| --- | ---: | ---: |",
    ]
    for label, chosen in ((f"all {len(rows)}", rows), (f"the {len(two)} set in two columns", two)):
        if chosen:
            geometry, model = statistics.mean(r[2] for r in chosen), statistics.mean(r[3] for r in chosen)
            lines.append(f"| {label} | {geometry:.1%} | {model:.1%} |")
    lines += [
        "",
        "Geometry is kept: it scores better and needs no model. The geometry figures here leave out the `[figure]` "
        "lines (the same boxes, no image), so they differ slightly from the section above.",
        "",
        "| document | page | CER geometry | CER layout_cdla | layout_cdla seconds |",
        "| --- | ---: | ---: | ---: | ---: |",
        *(f"| {name} | {page} | {g:.1%} | {m:.1%} | {t:.2f} |" for name, page, g, m, t in rows),
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--all", action="store_true", help="every page with a text layer, not only two-column ones")
    parser.add_argument("--markdown", type=Path, metavar="FILE", help=f"write the section into FILE ({HEADING!r})")
    args = parser.parse_args(argv)
    commit = _git_head()
    layout = _layout_engine()
    provider = RapidOcrProvider(**PROVIDER_OPTIONS)
    rows: list[tuple[str, int, float, float, float]] = []
    paths = sorted({*DOCUMENTS.glob("*.pdf"), *CORPUS.glob("*.pdf")})
    for path in paths:
        for page, truth in sorted(text_layer_truth(path).items()):
            if not args.all and (path.name, page) not in TWO_COLUMN:
                continue
            rendered = render_page(path, DocumentKind.PDF, page, **RENDER_OPTIONS)
            boxes, _, _ = provider._recognise(rendered.data)  # the boxes both orders start from
            with Image.open(io.BytesIO(rendered.data)) as image:
                started = time.perf_counter()
                found = layout(image.convert("RGB"))
                seconds = time.perf_counter() - started
                width = image.width
            regions = [
                Region(float(left), float(top), float(right), float(bottom), label)
                for (left, top, right, bottom), label in zip(found.boxes or [], found.class_names or [], strict=True)
            ]
            geometry = cer(truth, boxes_to_text(boxes))
            model = cer(truth, region_order(boxes, regions, width))
            rows.append((path.name, page, geometry, model, seconds))
            print(f"{path.name} p. {page}: geometry {geometry:.2%}, layout_cdla {model:.2%} ({len(regions)} regions)")
    print()
    publish_section(section(rows, args.all, commit), HEADING, args.markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
