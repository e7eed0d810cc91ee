"""Headings among a page's lines: short lines of large type that open a block, levelled by their size."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from pagescribe.layout.boxes import BULLET, PARAGRAPH_GAP, Line, TextBox, box_end, em_width
from pagescribe.layout.tables import Tables, in_tables

HEADING_SIZE = 1.2  # a line whose type is at least this many times the page's median size is a heading,
HEADING_WORDS = 12  # ... when it has at most this many words
HEADING_LINES = 2  # ... over at most this many lines
HEADING_STEP = 0.1  # heading sizes within this share of each other are one level


def heading_levels(lines: Sequence[Line], height: float, tables: Tables) -> dict[int, int]:
    """The headings among the lines outside tables: line index to level (1 to 3), by size on the page.

    A heading is a line of one box, of words (letters make half of its characters or more) and no more than
    HEADING_WORDS of them, that opens a block (the page's or a column's first line, or one more than half a line
    height below the line before, or right below another heading), and whose type is HEADING_SIZE times the page's
    median size or more; more than HEADING_LINES such lines in a row are a block of large type, not a heading, and
    a line ending in a comma, semicolon or hyphen, or followed in its paragraph by a line opening in lower case, is
    a sentence going on.
    """
    sizes = _heading_sizes(lines, height, tables)
    _drop_long_runs(sizes)
    ranks: list[float] = []  # one size per level, largest first; sizes within HEADING_STEP of each other are one
    for size in sorted(sizes.values(), reverse=True):
        if not ranks or size < ranks[-1] * (1 - HEADING_STEP):
            ranks.append(size)
    return {
        index: 1 + min(2, next(rank for rank, top in enumerate(ranks) if size >= top * (1 - HEADING_STEP)))
        for index, size in sizes.items()
    }


def _heading_sizes(lines: Sequence[Line], height: float, tables: Tables) -> dict[int, float]:
    """The candidate headings (:func:`heading_levels`, runs of large type not yet dropped): line index to size.

    The size of a box is the geometric mean of its height and of its width per character (by rough glyph widths),
    each relative to the page's median: the engine's boxes are not as tall as the type is large, but wider type
    takes both.
    """
    boxes = [box for line in lines for box in line.boxes]
    heights = statistics.median(box.bottom - box.top for box in boxes)
    widths = statistics.median(_em_size(box) for box in boxes)
    tabled = in_tables(tables)
    sizes: dict[int, float] = {}
    for index, line in enumerate(lines):
        if index in tabled or not _worded_like_a_heading(line):
            continue
        box = line.boxes[0]
        size = math.sqrt((box.bottom - box.top) / heights * _em_size(box) / widths) if widths else 0.0
        if size >= HEADING_SIZE and _opens_a_block(lines, index, height, sizes) and not _runs_on(lines, index, height):
            sizes[index] = size
    return sizes


def _opens_a_block(lines: Sequence[Line], index: int, height: float, headings: dict[int, float]) -> bool:
    """The line is the page's or a column's first, more than half a line height below the line before, or right
    below one of the ``headings``."""
    line = lines[index]
    previous = lines[index - 1] if index else None
    return (
        previous is None or previous.top >= line.top or line.top - previous.bottom > height / 2 or index - 1 in headings
    )


def _worded_like_a_heading(line: Line) -> bool:
    """One box of words (letters make half of its characters or more), no more than HEADING_WORDS, no bullet."""
    text = line.text()
    letters = sum(char.isalpha() for char in text)
    return (
        len(line.boxes) == 1
        and len(text.split()) <= HEADING_WORDS
        and letters * 2 >= len(text.replace(" ", ""))
        and not BULLET.match(text)
    )


def _runs_on(lines: Sequence[Line], index: int, height: float) -> bool:
    """The line is a sentence going on: it ends in a comma, semicolon or hyphen, or the next line of its paragraph
    opens in lower case."""
    line = lines[index]
    following = lines[index + 1] if index + 1 < len(lines) else None
    return line.text()[-1] in ",;-" or (
        following is not None
        and following.top > line.top
        and following.top - line.bottom <= PARAGRAPH_GAP * height
        and following.text()[:1].islower()
    )


def _drop_long_runs(sizes: dict[int, float]) -> None:
    """Remove the candidates in runs of more than HEADING_LINES consecutive lines: a block of large type."""
    runs: list[list[int]] = []
    for index in sorted(sizes):
        if runs and runs[-1][-1] == index - 1:
            runs[-1].append(index)
        else:
            runs.append([index])
    for run in runs:
        if len(run) > HEADING_LINES:
            for index in run:
                del sizes[index]


def _em_size(box: TextBox) -> float:
    """The box's width per character in rough glyph widths (ems): its type's size; 0 where its width is unknown."""
    ems = sum(map(em_width, box.text))
    return (box_end(box) - box.left) / ems if ems and box.right is not None else 0.0
