"""Which pages are read in tiles, and how the page is cut: pure geometry, no I/O.

A page is read in tiles when its text is small at the render's scale (dense: the median height of its words, from
its text layer's glyphs or the offline engine's lines, is below TILE_MIN_TEXT_PX pixels) or when its answer was cut at
the output limit (truncated). Tiles are horizontal bands, full width, top to bottom, each overlapping the next by
TILE_OVERLAP of its height, rendered ``zoom`` times as large as the whole page was:

- bands, not a grid: the reading order of bands is simply top to bottom, a table's row or a form's line lies whole in
  one band (a grid would cut every row in two, and two half-rows cannot be told apart and joined from the answers), and
  the answers' overlap is whole lines, which can be aligned (:mod:`pagescribe.transcription.stitching`). What bands do
  not keep: the columns of a multi-column page are read band by band, so a band's answer holds a stretch of each
  column in turn (the text is all there; the columns' order is by band).
- the zoom: enough for the words to reach twice TILE_MIN_TEXT_PX, but a band's width never past TILE_MAX_LONG_EDGE
  (what the model takes without shrinking it), and no more than TILE_MAX_TILES bands of TILE_MAX_PIXELS each cover the
  page. A dense page the zoom cannot help (the cap leaves under DENSE_MIN_GAIN) is not tiled.
- a truncated answer asks for smaller parts, not more detail: at least TRUNCATED_TILES bands (at most TILE_MAX_TILES),
  each with less of the page to say.
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pagescribe.settings import Settings
from pagescribe.sources.pages import Band
from pagescribe.sources.textlayer import PrintSize

if TYPE_CHECKING:
    from pagescribe.grounding import PageText

TARGET_FACTOR = 2.0  # a dense page's tiles aim at this many times TILE_MIN_TEXT_PX
DENSE_MIN_GAIN = 1.2  # a dense page is tiled only when its text grows at least this much
MIN_WORDS = 20  # fewer words than this are no measure of a page's print
TRUNCATED_TILES = 3  # a truncated page is read in at least this many bands


@dataclass(frozen=True)
class TileLimits:
    """The tile settings."""

    min_text_px: float
    max_tiles: int
    max_pixels: int
    max_long_edge: int
    overlap: float

    @classmethod
    def of(cls, settings: Settings) -> TileLimits:
        return cls(
            settings.tile_min_text_px,
            settings.tile_max_tiles,
            settings.tile_max_pixels,
            settings.tile_max_long_edge,
            settings.tile_overlap,
        )


@dataclass(frozen=True)
class TilePlan:
    """The bands a page is read in, top to bottom, the zoom they render at, and why the page is tiled."""

    bands: tuple[Band, ...]
    zoom: float
    why: str


# a character str.isalnum() holds true of (\w less the underscore), found in C: this runs for every word of a page
# between its answer and its completion
_LETTER_OR_DIGIT = re.compile(r"[^\W_]").search


def text_height(words: PageText | None) -> float | None:
    """The median height in pixels of a page's words that have a letter or a digit (None with fewer than MIN_WORDS):
    dot leaders and rules are no measure of its print."""
    if words is None:
        return None
    heights = [
        word.box.y1 - word.box.y0
        for word in words.words
        if word.box.y1 > word.box.y0 and _LETTER_OR_DIGIT(word.text)  # a dot leader is no print size
    ]
    return statistics.median(heights) if len(heights) >= MIN_WORDS else None


def print_height(size: PrintSize | None) -> float | None:
    """The height in pixels of a page's print, measured on its text layer as it renders (None with fewer than
    MIN_WORDS words): what decides, before any call, whether a page with a text layer is dense."""
    return size.px if size is not None and size.words >= MIN_WORDS else None


def _bands(count: int, share: float) -> tuple[Band, ...]:
    """``count`` bands of ``share`` of the page's height each, evenly spread from its top to its bottom."""
    if count == 1:
        return (Band(0.0, 1.0),)
    step = (1.0 - share) / (count - 1)
    return tuple(Band(round(k * step, 6), min(1.0, round(k * step + share, 6))) for k in range(count))


def _share(count: int, overlap: float) -> float:
    """The share of the page's height each of ``count`` bands covers, when each overlaps the next by ``overlap``."""
    return 1.0 / (count - (count - 1) * overlap)


def plan_tiles(
    width: int, height: int, *, text_px: float | None, truncated: bool, limits: TileLimits
) -> TilePlan | None:
    """The tiles of a page rendered whole at ``width`` x ``height`` pixels whose words are ``text_px`` high (None:
    unknown), or None when it is not to be tiled."""
    dense = text_px is not None and text_px < limits.min_text_px
    if not dense and not truncated:
        return None
    fit = math.sqrt(limits.max_pixels / (width * height * _share(limits.max_tiles, limits.overlap)))
    zoom = min(limits.max_long_edge / width, fit)
    if dense and text_px is not None:
        zoom = min(zoom, TARGET_FACTOR * limits.min_text_px / text_px)
    if zoom < DENSE_MIN_GAIN:
        if not truncated:
            return None
        dense, zoom = False, min(1.0, zoom)
    least = min(TRUNCATED_TILES, limits.max_tiles) if truncated else 1
    count = next(
        n
        for n in range(least, limits.max_tiles + 1)
        if n == limits.max_tiles or width * height * _share(n, limits.overlap) * zoom * zoom <= limits.max_pixels
    )
    reasons = [f"its words are {text_px:.1f} px high (TILE_MIN_TEXT_PX={limits.min_text_px:g})"] if dense else []
    reasons += ["its answer was truncated at the output limit"] if truncated else []
    why = f"read in {count} tiles at {zoom:.2f}x: " + " and ".join(reasons)
    return TilePlan(_bands(count, _share(count, limits.overlap)), math.floor(zoom * 10_000) / 10_000, why)
