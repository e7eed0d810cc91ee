"""Reading order across columns: column sections found by their gutters, each column read after the one before."""

from __future__ import annotations

import bisect
import itertools
import statistics
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace

from pagescribe.layout.boxes import (
    EDGE_SLACK,
    PARAGRAPH_GAP,
    Band,
    Line,
    TextBox,
    box_end,
    box_middle,
    em_width,
    rows_of,
)

COLUMN_GUTTER = 0.2  # the white between two columns is at least this many median line heights wide (EDGE_SLACK off
COLUMN_MIN_ROWS = 5  # ... each box's ends), and has text on both sides in at least this many rows
RUNNING_WORDS = 3  # a box of running text has at least this many words of two letters or more
RUNNING_TEXT = 0.6  # a column holds at least this share of its characters in boxes of running text,
COLUMN_FILL = 0.8  # ... and the median row with such a box spans at least this share of the column's width
BRIDGE_GAP = 0.25  # a box across a gutter at most this many line heights below two columns' lines may be two lines


@dataclass(frozen=True)
class _Gutter:
    """The white band ``left``..``right`` between two columns, through the rows ``start`` to ``stop`` (exclusive).

    A box reaches into the band only with ``slack`` taken off both its ends: detected boxes reach past their ink.
    """

    left: float
    right: float
    slack: float
    start: int = 0
    stop: int = 0

    def crossed_by(self, box: TextBox) -> bool:
        return box.left + self.slack < self.left and box_end(box) - self.slack > self.right

    def right_of(self, box: TextBox) -> bool:
        """The box's middle is right of the band's."""
        return box_middle(box) > (self.left + self.right) / 2

    def cut(self, box: TextBox) -> tuple[TextBox, TextBox] | None:
        """A box across the band (the engine read two columns' lines as one) cut at the word boundary nearest to
        where the band falls in its text, by rough glyph widths; None when it has no word boundary."""
        spaces = [index for index, char in enumerate(box.text) if char == " "]
        if not spaces:
            return None
        reach = list(itertools.accumulate(em_width(char) for char in box.text))
        share = (self.left - box.left) / (self.left - box.left + box_end(box) - self.right)
        at = min(spaces, key=lambda index: abs(reach[index] - share * reach[-1]))
        return (
            replace(box, text=box.text[:at].rstrip(), right=self.left),
            replace(box, text=box.text[at:].lstrip(), left=self.right),
        )

    def sides(self, boxes: Iterable[TextBox]) -> tuple[list[TextBox], list[TextBox]]:
        """The boxes left and right of the band, those across it cut in two."""
        sides: tuple[list[TextBox], list[TextBox]] = ([], [])
        for box in boxes:
            halves = self.cut(box) if self.crossed_by(box) else None
            if halves is None:
                sides[self.right_of(box)].append(box)
            else:
                sides[0].append(halves[0])
                sides[1].append(halves[1])
        return sides


def reading_order(boxes: list[TextBox]) -> list[Line]:
    """The lines in reading order: rows top to bottom, but the columns beside a gutter (:func:`_find_gutter`) read
    one after the other. The rows above and below the gutter and each column are laid out in the same way, so a page
    may have several column sections, and a column may hold columns of its own."""
    rows = rows_of(boxes)
    gutter = _find_gutter(rows)
    if gutter is None:
        return rows
    left, right = gutter.sides(box for row in rows[gutter.start : gutter.stop] for box in row.boxes)
    return [
        *reading_order([box for row in rows[: gutter.start] for box in row.boxes]),
        *reading_order(left),
        *reading_order(right),
        *reading_order([box for row in rows[gutter.stop :] for box in row.boxes]),
    ]


def _find_gutter(rows: list[Line]) -> _Gutter | None:
    """The gutter between two columns of running text with the most rows of text on both sides; None without one.

    A gutter is a band of white at least COLUMN_GUTTER median line heights wide through consecutive rows (in which
    boxes count without EDGE_SLACK line heights at each end). Each band is followed down from the row where it
    opens, narrowing to what stays white, until a row covers it; a row that covers it only with lines of both
    columns read as one box (:func:`_bridged`) does not. The band is a gutter when its rows make a column section
    (:func:`_column_section`): text on both sides in COLUMN_MIN_ROWS rows, and running text on each side. A table's
    cells line up in the same way but hold figures or a few words each, so its rows stay whole.
    """
    if len(rows) < COLUMN_MIN_ROWS:
        return None
    white = _White.of(rows)
    best: tuple[int, _Gutter] | None = None
    for start in range(len(rows)):
        for band in white.followed_down(start):
            # else it cannot have more rows with text on both sides than the best one, or prose on both
            if band.stop - band.start > (best[0] if best else COLUMN_MIN_ROWS - 1) and white.prose_beside(band):
                section = _column_section(rows, band, white.gap)
                best = section if section and (best is None or section[0] > best[0]) else best
    return None if best is None else best[1]


@dataclass
class _White:
    """The white of a page's rows, where gutters are looked for: each row's free stretches (:func:`_free`), and the
    middles of its boxes of running text."""

    rows: list[Line]
    free: list[list[Band]]
    running: list[list[float]]
    slack: float  # taken off both ends of each box
    min_width: float  # of a gutter
    gap: float  # between two paragraphs
    followed: list[list[Band]] = field(init=False)  # the bands that reach each row from the rows above

    def __post_init__(self) -> None:
        self.followed = [[] for _ in self.rows]

    @classmethod
    def of(cls, rows: list[Line]) -> _White:
        boxes = [box for row in rows for box in row.boxes]
        height = statistics.median(box.bottom - box.top for box in boxes)
        slack = EDGE_SLACK * height
        left, right = min(box.left for box in boxes), max(map(box_end, boxes))
        return cls(
            rows,
            free=[_free(row, left, right, slack) for row in rows],
            running=[[box_middle(box) for box in row.boxes if _running(box)] for row in rows],
            slack=slack,
            min_width=COLUMN_GUTTER * height,
            gap=PARAGRAPH_GAP * height,
        )

    def followed_down(self, start: int) -> Iterator[_Gutter]:
        """The bands of white that open in row ``start``, each followed down until a row covers it: a gutter through
        the rows it crosses, one for each stretch it narrows to."""
        bands = self._opening(start)
        stop = start + 1
        while bands:
            following = []
            for band in bands:
                parts = self._continued(band, stop)
                if parts is None:
                    yield _Gutter(*band, self.slack, start, stop)
                else:
                    following += parts
            if stop < len(self.rows):
                self.followed[stop] += following
            bands, stop = following, stop + 1

    def _opening(self, start: int) -> list[Band]:
        """The row's free stretches wide enough for a gutter, but for those followed from above already (and
        narrowed by less than the slack)."""
        return [
            band
            for band in self.free[start]
            if band[1] - band[0] >= self.min_width
            and not any(
                band[0] <= above[0] and above[1] <= band[1] and above[1] - above[0] > band[1] - band[0] - self.slack
                for above in self.followed[start]
            )
        ]

    def _continued(self, band: Band, row: int) -> list[Band] | None:
        """What stays of the band through the row: its white parts, or the whole band where the row covers it only
        with bridged boxes (:func:`_bridged`); None where the row covers it, or there is no row."""
        if row == len(self.rows):
            return None
        parts = _white(self.free[row], band, self.min_width)
        if parts or _bridged(self.rows[row - 1], self.rows[row], _Gutter(*band, self.slack)):
            return parts or [band]
        return None

    def prose_beside(self, gutter: _Gutter) -> bool:
        """Boxes of running text lie on both sides of the gutter in its rows."""
        middles = [middle for row in self.running[gutter.start : gutter.stop] for middle in row]
        return any(middle <= gutter.left for middle in middles) and any(middle >= gutter.right for middle in middles)


def _free(row: Line, left: float, right: float, slack: float) -> list[Band]:
    """The stretches of ``left``..``right`` that no box of the row covers once ``slack`` is taken off both its ends
    (a short box keeps its middle), left to right."""
    free, reached = [], left
    for box in sorted(row.boxes, key=lambda box: box.left):
        start, end = min(box.left + slack, box_middle(box)), max(box_end(box) - slack, box_middle(box))
        if start > reached:
            free.append((reached, start))
        reached = max(reached, end)
    if reached < right:
        free.append((reached, right))
    return free


def _white(free: list[Band], band: Band, min_width: float) -> list[Band]:
    """The parts of the band in a row's ``free`` stretches that are at least ``min_width`` wide."""
    parts = []
    for start, end in itertools.islice(free, max(bisect.bisect_left(free, (band[0],)) - 1, 0), None):
        if start >= band[1]:
            break
        part = max(start, band[0]), min(end, band[1])
        if part[1] - part[0] >= min_width:
            parts.append(part)
    return parts


def _bridged(previous: Line, row: Line, gutter: _Gutter) -> bool:
    """The row is right below one with text on both sides of the band (or across it), and the boxes that reach
    into the band cross it, each two lines of running text: the engine read two columns' lines as one."""
    if row.top - previous.bottom > BRIDGE_GAP * (row.bottom - row.top) or not (
        any(map(gutter.crossed_by, previous.boxes)) or len({gutter.right_of(box) for box in previous.boxes}) == 2
    ):
        return False
    inside = [
        box for box in row.boxes if box.left + gutter.slack < gutter.right and box_end(box) - gutter.slack > gutter.left
    ]
    cuts = [gutter.cut(box) if gutter.crossed_by(box) else None for box in inside]
    return bool(cuts) and all(halves is not None and all(map(_running, halves)) for halves in cuts)


def _column_section(rows: list[Line], gutter: _Gutter, gap: float) -> tuple[int, _Gutter] | None:
    """How many rows of the gutter's column section have text on both sides, and the section; None unless at least
    COLUMN_MIN_ROWS do and each side is a column of running text (:func:`_prose`).

    The section ends above the first box across the gutter that reaches out of the columns
    (:func:`_above_full_width`), and is :func:`_trimmed`.
    """
    gutter = _trimmed(rows, _above_full_width(rows, gutter), gap)
    sides = _sides(rows, gutter)
    both_sides = sum(1 for left, right in zip(*sides, strict=True) if left and right)
    return (both_sides, gutter) if both_sides >= COLUMN_MIN_ROWS and all(map(_prose, sides)) else None


def _above_full_width(rows: list[Line], gutter: _Gutter) -> _Gutter:
    """The gutter ending above its first row with a box across it that reaches out of the columns beside it: a line
    of the full width, not two columns' lines read as one."""
    beside = [box for row in rows[gutter.start : gutter.stop] for box in row.boxes if not gutter.crossed_by(box)]
    low = min((box.left for box in beside if not gutter.right_of(box)), default=gutter.left) - gutter.slack
    high = max((box_end(box) for box in beside if gutter.right_of(box)), default=gutter.right) + gutter.slack
    for index in range(gutter.start, gutter.stop):
        if any(gutter.crossed_by(box) and not low <= box.left <= box_end(box) <= high for box in rows[index].boxes):
            return replace(gutter, stop=index)
    return gutter


def _sides(rows: list[Line], gutter: _Gutter) -> tuple[list[list[TextBox]], list[list[TextBox]]]:
    """Each row's boxes left of the gutter, and right of it; a box across it is on neither side."""
    sides: tuple[list[list[TextBox]], list[list[TextBox]]] = ([], [])
    for row in rows[gutter.start : gutter.stop]:
        beside = [box for box in row.boxes if not gutter.crossed_by(box)]
        sides[0].append([box for box in beside if not gutter.right_of(box)])
        sides[1].append([box for box in beside if gutter.right_of(box)])
    return sides


def _trimmed(rows: list[Line], gutter: _Gutter, gap: float) -> _Gutter:
    """The gutter without the rows at its ends that go with the text above or below it.

    These are the rows at its top with text on one side only (a heading or running head beside the gutter; the
    left column's first lines read the same either way), the rows at either end with more than ``gap`` of white
    between them and the rest (a page number, a footer), and the rows at its bottom with text on one side only that
    are nearer to the row below the gutter than to the row above them (the heading of a full-width part).
    """
    start, stop = gutter.start, gutter.stop

    def one_sided(index: int) -> bool:
        return len({gutter.right_of(box) for box in rows[index].boxes}) == 1

    def gap_above(index: int) -> float:
        return rows[index].top - rows[index - 1].bottom

    while stop - start > 1 and (one_sided(start) or gap_above(start + 1) > gap):
        start += 1
    while stop - start > 1 and (
        gap_above(stop - 1) > gap
        or (one_sided(stop - 1) and stop < len(rows) and gap_above(stop) < gap_above(stop - 1))
    ):
        stop -= 1
    return replace(gutter, start=start, stop=stop)


def _prose(rows: list[list[TextBox]]) -> bool:
    """One side's rows are a column of running text: RUNNING_TEXT of its characters or more are in boxes of running
    text (:func:`_running`; not table cells, labels or the odd symbols read in a figure), and the median row with
    such a box spans COLUMN_FILL of the column's width or more, as the lines of a paragraph do (the items of a list
    beside another one are shorter)."""
    boxes = [box for row in rows for box in row]
    running = sum(len(box.text) for box in boxes if _running(box))
    spans = [max(map(box_end, row)) - min(box.left for box in row) for row in rows if any(map(_running, row))]
    return (
        bool(spans)
        and running >= RUNNING_TEXT * sum(len(box.text) for box in boxes)
        and statistics.median(spans) >= COLUMN_FILL * (max(map(box_end, boxes)) - min(box.left for box in boxes))
    )


def _running(box: TextBox) -> bool:
    """The box holds running text: RUNNING_WORDS words of two letters or more."""
    return sum(sum(char.isalpha() for char in token) >= 2 for token in box.text.split()) >= RUNNING_WORDS
