"""Page layout from positioned text: lines in reading order, columns read one after the other, as text.

The offline OCR engine gives positioned boxes of text; so does a PDF's text layer. Both are laid out here the same
way. The text is the lines in reading order, top to bottom and left to right, with a blank line where the gap
between two lines is large; a page with no text reads :data:`BLANK_PAGE`, as the vision prompt asks.
Columns of running text are read one after the other: a column section is found by its gutter, a band of
white through many consecutive lines with prose on both sides (in the manner of whitespace-gutter and
recursive X-Y cut page segmentation), and the rows above and below it keep their place. Anything else
side by side at the same height (table cells, form fields, a figure's labels beside text) is joined on
one line, as is a short column section (fewer than COLUMN_MIN_ROWS lines).
"""

from __future__ import annotations

import bisect
import html
import itertools
import math
import re
import statistics
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from pagescribe.checks import BLANK_PAGE

PARAGRAPH_GAP = 1.5  # a gap between two lines taller than this many median line heights starts a paragraph
COLUMN_GUTTER = 0.2  # the white between two columns is at least this many median line heights wide,
EDGE_SLACK = 0.5  # ... once this many are taken off both ends of every box (boxes reach past their ink),
COLUMN_MIN_ROWS = 5  # ... and has text on both sides in at least this many rows
RUNNING_WORDS = 3  # a box of running text has at least this many words of two letters or more
RUNNING_TEXT = 0.6  # a column holds at least this share of its characters in boxes of running text,
COLUMN_FILL = 0.8  # ... and the median row with such a box spans at least this share of the column's width
BRIDGE_GAP = 0.25  # a box across a gutter at most this many line heights below two columns' lines may be two lines
HEADING_SIZE = 1.2  # a line whose type is at least this many times the page's median size is a heading,
HEADING_WORDS = 12  # ... when it has at most this many words
HEADING_LINES = 2  # ... over at most this many lines
HEADING_STEP = 0.1  # heading sizes within this share of each other are one level
TABLE_MIN_ROWS = 3  # a table has at least this many rows,
TABLE_ROW_GAP = 2.5  # ... each at most this many median line heights below the one before,
TABLE_SPAN = 0.15  # ... and white between its columns in all rows but this share of them
_BULLET = re.compile(
    "^[\u2022\u00b7\u25cf\u25cb\u25e6\u25aa\u25a0\u2023\u25ba\u27a2\u2756\u2713*+\u2013-](?:\\s+|(?=[A-Z]))"
)  # a bullet, then a space or a capital
_LIST_ITEM = re.compile(r"^(?:- |\d{1,3}[.)] )")
_HYPHENATED = re.compile(r"[^\W\d_]{2}-$")  # a word broken at the line's end (two letters, then a hyphen)
_CJK = re.compile(
    r"[\u2e80-\u2fdf\u3040-\u312f\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]"
)  # Han, kana, hangul
_LATIN_PUNCTUATION = str.maketrans(  # CJK full stop, commas, colon, ... and their Latin forms
    "\u3002\uff0c\u3001\uff1a\uff1b\uff08\uff09\uff01\uff1f\u3010\u3011", ".,,:;()!?[]"
)
FURNITURE_GAP = 1.5  # a page number has at least this many median line heights of white between it and the rest
_PAGE_NUMBER = re.compile(
    r"(?i)(?:page\s+)?[-\u2013\u2014]?\s*(?:\d{1,4}|[ivxlcdm]{1,7})\s*[-\u2013\u2014]?(?:\s*(?:of|/)\s*\d{1,4})?"
)
PageNumbers = Literal["mark", "drop"]
_NARROW, _WIDE = frozenset(" fijlrtI.,;:'!|()[]"), frozenset("mwMW")  # glyphs of about 0.3 and 0.8 em


@dataclass(frozen=True)
class TextBox:
    """One detected run of text and its extent on the page, in pixels (y grows downwards).

    ``right`` is None where the box's right edge is unknown; columns are only looked for when every box has one.
    """

    text: str
    left: float
    top: float
    bottom: float
    score: float = 1.0  # the engine's recognition confidence
    right: float | None = None


@dataclass
class _Line:
    top: float
    bottom: float
    boxes: list[TextBox] = field(default_factory=list)

    def accepts(self, box: TextBox) -> bool:
        """The box's vertical centre is within the line and the line's is within the box."""
        return (
            self.top <= (box.top + box.bottom) / 2 <= self.bottom
            and box.top <= (self.top + self.bottom) / 2 <= box.bottom
        )

    def add(self, box: TextBox) -> None:
        self.boxes.append(box)
        self.top = min(self.top, box.top)
        self.bottom = max(self.bottom, box.bottom)

    def text(self) -> str:
        return " ".join(box.text for box in sorted(self.boxes, key=lambda box: box.left))


@dataclass(frozen=True)
class Figure:
    """A figure's extent on the page, in pixels (y grows downwards): ink that no text box accounts for."""

    left: float
    top: float
    right: float
    bottom: float


FIGURE = "[figure]"  # the placeholder line of a figure, in the square brackets the vision prompt asks for


_Band = tuple[float, float]  # a horizontal stretch of the page, left to right


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
        return box.left + self.slack < self.left and _end(box) - self.slack > self.right

    def right_of(self, box: TextBox) -> bool:
        """The box's middle is right of the band's."""
        return _middle(box) > (self.left + self.right) / 2

    def cut(self, box: TextBox) -> tuple[TextBox, TextBox] | None:
        """A box across the band (the engine read two columns' lines as one) cut at the word boundary nearest to
        where the band falls in its text, by rough glyph widths; None when it has no word boundary."""
        spaces = [index for index, char in enumerate(box.text) if char == " "]
        if not spaces:
            return None
        reach = list(itertools.accumulate(_em(char) for char in box.text))
        share = (self.left - box.left) / (self.left - box.left + _end(box) - self.right)
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


def boxes_to_text(
    boxes: Iterable[TextBox], *, page_numbers: PageNumbers = "mark", figures: Sequence[Figure] = ()
) -> str:
    """The boxes as markdown, their lines in reading order (:func:`_markdown`), with a :data:`FIGURE` line where
    each of ``figures`` falls in that order."""
    boxes = [replace(box, text=latin_punctuation(box.text)) for box in boxes]
    lines = _reading_order(boxes) if all(box.right is not None for box in boxes) else _rows(boxes)
    return _markdown(lines, page_numbers, figures)


def _figure_places(lines: Sequence[_Line], figures: Sequence[Figure]) -> Counter[int]:
    """How many figures go before each line: a figure goes before the first line in reading order that starts no
    higher than the figure and has a box beside or under it (the column it stands in), or after the last line."""
    places: Counter[int] = Counter()
    for figure in figures:
        places[
            next(
                (
                    index
                    for index, line in enumerate(lines)
                    if line.top >= figure.top
                    and any(box.left < figure.right and _end(box) > figure.left for box in line.boxes)
                ),
                len(lines),
            )
        ] += 1
    return places


def _markdown(lines: Sequence[_Line], page_numbers: PageNumbers, figures: Sequence[Figure] = ()) -> str:
    """Lines in reading order as markdown; :data:`BLANK_PAGE` for none and no figure.

    - A gap over PARAGRAPH_GAP median line heights becomes a blank line (never from one column to the next: the
      next column starts higher up).
    - Rows of cells lined up in columns become a markdown table (:func:`_tables`).
    - A short line at least HEADING_SIZE times as tall as the median line is a heading: ``#`` for the tallest on
      the page, ``##`` for the next size, ``###`` for any smaller; a heading wrapped over two lines is one heading.
    - A line opening with a bullet is a list item (``- ``); a line opening with ``#`` that is no heading is escaped.
    - A word hyphenated at a line's end is joined with its end on the next line of the same paragraph.
    - The page number (:func:`_furniture`) is marked as an HTML comment, ``<!-- page number: 7 -->``, or dropped
      (``page_numbers="drop"``).
    - A figure is a :data:`FIGURE` line of its own (:func:`_figure_places`; before a table it falls into).
    """
    if not lines:
        return "\n\n".join([FIGURE] * len(figures)) or BLANK_PAGE
    height = statistics.median(line.bottom - line.top for line in lines)
    tables = _tables(lines, height)
    levels = _heading_levels(lines, height, tables)
    furniture = _furniture(lines, height, tables, levels)
    places = _figure_places(lines, figures)
    for start, (_, rows) in tables.items():  # a figure inside a table goes before it
        places[start] += sum(places.pop(index, 0) for index in range(start + 1, start + rows))
    return _write(lines, height, tables, levels, furniture, places, page_numbers)


def _write(
    lines: Sequence[_Line],
    height: float,
    tables: dict[int, tuple[list[str], int]],
    levels: dict[int, int],
    furniture: dict[int, str],
    places: Counter[int],
    page_numbers: PageNumbers,
) -> str:
    """The page's markdown, line by line, with what :func:`_markdown` found: tables, headings, the page number and
    the figures placed before each line (``places``, a count by line index; at ``len(lines)``: after the last)."""
    parts = _Parts()
    previous: _Line | None = None
    index = 0
    while index <= len(lines):
        for _ in range(places[index]):
            parts.block(FIGURE)
        if index == len(lines):
            break
        line = lines[index]
        if previous is not None and parts[-1] and line.top - previous.bottom > PARAGRAPH_GAP * height:
            parts.append("")
        if index in tables:
            table, rows = tables[index]
            parts.block(*table)  # a table is a block of its own
            previous, index = lines[index + rows - 1], index + rows
            continue
        if index in furniture:
            if page_numbers == "mark":
                parts.block(f"<!-- {furniture[index]}: {line.text().replace('--', '- -')} -->")
        elif index in levels:
            parts.heading(line, levels[index], continued=levels.get(index - 1) == levels[index])
        else:
            parts.text(line, after_heading=previous is not None and levels.get(index - 1) is not None)
        previous, index = line, index + 1
    return "\n".join(parts).strip("\n")


class _Parts(list[str]):
    """The markdown of a page being written, line by line; "" is a blank line."""

    def block(self, *lines: str) -> None:
        """Lines set apart from what precedes and follows them by blank lines."""
        if self and self[-1]:
            self.append("")
        self += [*lines, ""]

    def heading(self, line: _Line, level: int, *, continued: bool) -> None:
        """A heading line; the second line of a heading wrapped over two (``continued``) joins the first."""
        text = " ".join(line.text().split())
        marker = "#" * level + " "
        if self and self[-1].startswith(marker) and continued:
            self[-1] += " " + text
            return
        if self and self[-1]:
            self.append("")
        self.append(marker + text)

    def text(self, line: _Line, *, after_heading: bool) -> None:
        """A line of text or a list item; a word hyphenated at the end of the line before is joined with its end."""
        text = _list_item(line.text())
        if self and self[-1].startswith("#") and after_heading:
            self.append("")
        if self and _HYPHENATED.search(self[-1]) and text[:1].islower() and not _LIST_ITEM.match(text):
            self[-1] = self[-1][:-1] + text
        else:
            self.append(text)


def _furniture(
    lines: Sequence[_Line], height: float, tables: dict[int, tuple[list[str], int]], levels: dict[int, int]
) -> dict[int, str]:
    """The page's page number: its line's index to ``page number``; empty without one.

    It is the page's top line, first in reading order, or its bottom line, last in reading order, that reads as a
    page number (:func:`is_page_number`), is no heading and no table's, and lies more than FURNITURE_GAP median line
    heights away from the rest of the page's lines. Running headers and footers are not told apart here: a slide's
    top and bottom lines are set off in the same way and are its title and its message; the transcript finds them
    by what recurs across the document's pages (:func:`pagescribe.assembly.running_furniture`).
    """
    if len(lines) < 2:
        return {}
    in_tables = {start + offset for start, (_, rows) in tables.items() for offset in range(rows)}
    for index in (len(lines) - 1, 0):
        line = lines[index]
        others = [other for at, other in enumerate(lines) if at != index]
        gap = line.top - max(other.bottom for other in others) if index else min(o.top for o in others) - line.bottom
        if (
            index not in in_tables
            and index not in levels
            and gap > FURNITURE_GAP * height
            and is_page_number(line.text())
        ):
            return {index: "page number"}
    return {}


def is_page_number(text: str) -> bool:
    """The text reads as a page number alone: ``7``, ``- 7 -``, ``Page 7 of 9``, ``vii``."""
    return _PAGE_NUMBER.fullmatch(text.strip()) is not None


def latin_punctuation(text: str) -> str:
    """Text with no CJK character in it keeps no CJK punctuation: the recognition model, trained on Chinese and
    English, reads a Latin full stop after a digit as ``。`` (``1。 Installation``). Text with CJK keeps it."""
    if _CJK.search(text) or not any(char.isascii() and char.isalpha() for char in text):
        return text
    return text.translate(_LATIN_PUNCTUATION)


def _list_item(text: str) -> str:
    """The line as a markdown list item when it opens with a bullet; escaped when it opens with ``#``."""
    bullet = _BULLET.match(text)
    if bullet:
        return "- " + text[bullet.end() :]
    return "\\" + text if text.startswith("#") else text


def _worded_like_a_heading(line: _Line) -> bool:
    """One box of words (letters make half of its characters or more), no more than HEADING_WORDS, no bullet."""
    text = line.text()
    letters = sum(char.isalpha() for char in text)
    return (
        len(line.boxes) == 1
        and len(text.split()) <= HEADING_WORDS
        and letters * 2 >= len(text.replace(" ", ""))
        and not _BULLET.match(text)
    )


def _runs_on(lines: Sequence[_Line], index: int, height: float) -> bool:
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


def _heading_levels(lines: Sequence[_Line], height: float, tables: dict[int, tuple[list[str], int]]) -> dict[int, int]:
    """The headings among the lines outside tables: line index to level (1 to 3), by size on the page.

    A heading is a line of one box, of words (letters make half of its characters or more) and no more than
    HEADING_WORDS of them, that opens a block (the page's or a column's first line, or one more than half a line
    height below the line before, or right below another heading), and whose type is HEADING_SIZE times the page's
    median size or more; more than HEADING_LINES such lines in a row are a block of large type, not a heading, and
    a line ending in a comma, semicolon or hyphen, or followed in its paragraph by a line opening in lower case, is
    a sentence going on.
    The size of a box is the geometric mean of its height and of its width per character (by
    rough glyph widths): the engine's boxes are not as tall as the type is large, but wider type takes both.
    """
    boxes = [box for line in lines for box in line.boxes]
    heights = statistics.median(box.bottom - box.top for box in boxes)
    widths = statistics.median(_em_size(box) for box in boxes)
    in_tables = {start + offset for start, (_, rows) in tables.items() for offset in range(rows)}
    sizes: dict[int, float] = {}
    for index, line in enumerate(lines):
        if index in in_tables or not _worded_like_a_heading(line):
            continue
        box = line.boxes[0]
        size = math.sqrt((box.bottom - box.top) / heights * _em_size(box) / widths) if widths else 0.0
        previous = lines[index - 1] if index else None
        opens = (
            previous is None
            or previous.top >= line.top
            or line.top - previous.bottom > height / 2
            or index - 1 in sizes
        )
        if size >= HEADING_SIZE and opens and not _runs_on(lines, index, height):
            sizes[index] = size
    _drop_long_runs(sizes)
    ranks: list[float] = []  # one size per level, largest first; sizes within HEADING_STEP of each other are one
    for size in sorted(sizes.values(), reverse=True):
        if not ranks or size < ranks[-1] * (1 - HEADING_STEP):
            ranks.append(size)
    return {
        index: 1 + min(2, next(rank for rank, top in enumerate(ranks) if size >= top * (1 - HEADING_STEP)))
        for index, size in sizes.items()
    }


def _em_size(box: TextBox) -> float:
    """The box's width per character in rough glyph widths (ems): its type's size; 0 where its width is unknown."""
    ems = sum(map(_em, box.text))
    return (_end(box) - box.left) / ems if ems and box.right is not None else 0.0


def _tables(lines: Sequence[_Line], height: float) -> dict[int, tuple[list[str], int]]:
    """The tables among the lines: the index of each table's first line, its markdown lines and its count of rows.

    A table is a run of at least TABLE_MIN_ROWS rows of cells (lines of two boxes or more that hold more than a
    bullet, the engine's boxes being separated by more than a word space), each at most TABLE_ROW_GAP line heights
    below the one before; a line of one box between two rows of cells belongs to the table too. Its columns are the
    stretches of the run's width that its boxes cover, between bands of white through all of its rows but TABLE_SPAN
    of them (one row from four rows on: a title or a merged cell across the columns), each holding the middle of a
    box in two rows or more; a box goes to the column nearest to its middle. A table needs two columns or more, and
    cells in two columns or more in most of its rows.
    """
    tables: dict[int, tuple[list[str], int]] = {}
    index = 0
    while index < len(lines):
        stop = index
        while stop < len(lines) and (
            _cells(lines[stop]) >= 2
            or (
                stop > index
                and stop + 1 < len(lines)
                and _cells(lines[stop + 1]) >= 2
                and _below(lines[stop], lines[stop + 1], height)
            )
        ):
            if stop > index and not _below(lines[stop - 1], lines[stop], height):
                break
            stop += 1
        table = _table(lines[index:stop], height) if stop - index >= TABLE_MIN_ROWS else None
        if table is None:
            index += 1
        else:
            tables[index] = (table, stop - index)
            index = stop
    return tables


def _cells(line: _Line) -> int:
    """How many boxes of the line hold more than a bullet."""
    return sum(not _BULLET.fullmatch(box.text + " ") for box in line.boxes)


def _below(upper: _Line, lower: _Line, height: float) -> bool:
    """The lower line starts under the upper one, at most TABLE_ROW_GAP line heights below it."""
    return upper.top < lower.top and lower.top - upper.bottom <= TABLE_ROW_GAP * height


def _table(rows: Sequence[_Line], height: float) -> list[str] | None:
    """The rows as a table (the first as its header), or None when they do not line up in columns: markdown, or
    HTML where a cell of the header row, or the one cell of a row, spans columns (:func:`_placed`)."""
    boxes = [box for row in rows for box in row.boxes]
    if any(box.right is None for box in boxes):
        return None
    supported = [
        column
        for column in _columns(rows, boxes, height)
        if sum(any(column[0] <= _middle(box) <= column[1] for box in row.boxes) for row in rows) >= 2
    ]
    if len(supported) < 2:
        return None
    # a span is believed in the header row and in a row of one cell (a title or note across the table); elsewhere a
    # box across the white is more often two cells' text read as one run (a long name running into the next column)
    cells = [
        _placed(row, supported, EDGE_SLACK * height, may_span=at == 0 or len(row.boxes) == 1)
        for at, row in enumerate(rows)
    ]
    if sum(len(row_cells) >= 2 for row_cells in cells) * 2 <= len(rows):
        return None
    if all(span == 1 for row_cells in cells for span, _ in row_cells.values()):
        lines = [
            "| " + " | ".join(_cell(row_cells[at][1] if at in row_cells else "") for at in range(len(supported))) + " |"
            for row_cells in cells
        ]
        return [lines[0], "|" + " --- |" * len(supported), *lines[1:]]
    return [
        "<table>",
        *(_html_row(row_cells, len(supported), header=not at) for at, row_cells in enumerate(cells)),
        "</table>",
    ]


def _placed(row: _Line, columns: Sequence[_Band], slack: float, *, may_span: bool) -> dict[int, tuple[int, str]]:
    """The row's cells by the column each starts in: how many columns it spans, and its text.

    A box goes to the column nearest to its middle; boxes in one column are joined left to right. Where ``may_span``, a
    column's lone box whose text runs across the white between columns (its ends, ``slack`` taken off, reach into two
    columns or more) spans them, where no other cell of the row is in any of them."""
    nearest: dict[int, list[TextBox]] = {}
    for box in sorted(row.boxes, key=lambda box: box.left):
        middle = _middle(box)
        at = min(range(len(columns)), key=lambda index: max(columns[index][0] - middle, middle - columns[index][1]))
        nearest.setdefault(at, []).append(box)
    cells = {at: (1, " ".join(box.text for box in boxes)) for at, boxes in nearest.items()}
    for at, boxes in nearest.items() if may_span else ():
        start, end = _covered(_Line(boxes[0].top, boxes[0].bottom, boxes), slack)[0]
        reach = [index for index, (low, high) in enumerate(columns) if start <= high and end >= low]
        taken = {column for other, (span, _) in cells.items() if other != at for column in range(other, other + span)}
        if len(boxes) == 1 and len(reach) > 1 and at in reach and not taken.intersection(reach):
            del cells[at]
            cells[reach[0]] = (len(reach), boxes[0].text)
    return dict(sorted(cells.items()))


def _html_row(cells: dict[int, tuple[int, str]], columns: int, *, header: bool) -> str:
    """A table row in HTML: its cells in their columns, empty ones where there is none, a span as ``colspan``."""
    tag = "th" if header else "td"
    parts: list[str] = []
    at = 0
    while at < columns:
        span, text = cells.get(at, (1, ""))
        attribute = f' colspan="{span}"' if span > 1 else ""
        parts.append(f"<{tag}{attribute}>{html.escape(text, quote=False)}</{tag}>")
        at += span
    return "<tr>" + "".join(parts) + "</tr>"


def _columns(rows: Sequence[_Line], boxes: Sequence[TextBox], height: float) -> list[_Band]:
    """The stretches of x that the rows' boxes cover in more rows than one spanning row may account for."""
    left, right = math.floor(min(box.left for box in boxes)), math.ceil(max(map(_end, boxes)))
    cover = [0] * (right - left + 1)
    slack = EDGE_SLACK * height
    for row in rows:
        for start, end in _covered(row, slack):
            for x in range(math.floor(start) - left, math.ceil(end) - left + 1):
                cover[x] += 1
    allowed = int(TABLE_SPAN * len(rows)) or int(len(rows) > TABLE_MIN_ROWS)  # one row may span from four rows on
    columns: list[_Band] = []
    for covered, run in itertools.groupby(enumerate(cover), key=lambda item: item[1] > allowed):
        if covered:
            span = [x for x, _ in run]
            columns.append((span[0] + left, span[-1] + left))
    return columns


def _covered(row: _Line, slack: float) -> list[_Band]:
    """The stretches the row's boxes cover, ``slack`` taken off both ends of each (a short box keeps its middle)."""
    return [(min(box.left + slack, _middle(box)), max(_end(box) - slack, _middle(box))) for box in row.boxes]


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _rows(boxes: Iterable[TextBox]) -> list[_Line]:
    """The boxes grouped into lines across the whole width, top to bottom, each read left to right."""
    lines: list[_Line] = []
    for box in sorted(boxes, key=lambda box: (box.top, box.left)):
        if not lines or not lines[-1].accepts(box):
            lines.append(_Line(box.top, box.bottom))
        lines[-1].add(box)
    return lines


def _reading_order(boxes: list[TextBox]) -> list[_Line]:
    """The lines in reading order: rows top to bottom, but the columns beside a gutter (:func:`_find_gutter`) read
    one after the other. The rows above and below the gutter and each column are laid out in the same way, so a page
    may have several column sections, and a column may hold columns of its own."""
    rows = _rows(boxes)
    gutter = _find_gutter(rows)
    if gutter is None:
        return rows
    left, right = gutter.sides(box for row in rows[gutter.start : gutter.stop] for box in row.boxes)
    return [
        *_reading_order([box for row in rows[: gutter.start] for box in row.boxes]),
        *_reading_order(left),
        *_reading_order(right),
        *_reading_order([box for row in rows[gutter.stop :] for box in row.boxes]),
    ]


def _find_gutter(rows: list[_Line]) -> _Gutter | None:
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
    boxes = [box for row in rows for box in row.boxes]
    height = statistics.median(box.bottom - box.top for box in boxes)
    slack, min_width = EDGE_SLACK * height, COLUMN_GUTTER * height
    free = [_free(row, min(box.left for box in boxes), max(map(_end, boxes)), slack) for row in rows]
    followed: list[list[_Band]] = [[] for _ in rows]  # the bands that reach each row from the rows above
    running = [[_middle(box) for box in row.boxes if _running(box)] for row in rows]
    best: tuple[int, _Gutter] | None = None
    for start in range(len(rows)):
        bands = [
            band
            for band in free[start]
            if band[1] - band[0] >= min_width
            and not any(  # followed from above already, and narrowed by less than the slack
                band[0] <= above[0] and above[1] <= band[1] and above[1] - above[0] > band[1] - band[0] - slack
                for above in followed[start]
            )
        ]
        stop = start + 1
        while bands:
            following = []
            for band in bands:
                if stop < len(rows):
                    parts = _white(free[stop], band, min_width)
                    if parts or _bridged(rows[stop - 1], rows[stop], _Gutter(*band, slack)):
                        following += parts or [band]
                        continue
                middles = [middle for row in running[start:stop] for middle in row]
                if (  # else it cannot have more rows with text on both sides than the best one, or prose on both
                    stop - start > (best[0] if best else COLUMN_MIN_ROWS - 1)
                    and any(middle <= band[0] for middle in middles)
                    and any(middle >= band[1] for middle in middles)
                ):
                    section = _column_section(rows, _Gutter(*band, slack, start, stop), PARAGRAPH_GAP * height)
                    best = section if section and (best is None or section[0] > best[0]) else best
            if stop < len(rows):
                followed[stop] += following
            bands, stop = following, stop + 1
    return None if best is None else best[1]


def _free(row: _Line, left: float, right: float, slack: float) -> list[_Band]:
    """The stretches of ``left``..``right`` that no box of the row covers once ``slack`` is taken off both its ends
    (a short box keeps its middle), left to right."""
    free, reached = [], left
    for box in sorted(row.boxes, key=lambda box: box.left):
        start, end = min(box.left + slack, _middle(box)), max(_end(box) - slack, _middle(box))
        if start > reached:
            free.append((reached, start))
        reached = max(reached, end)
    if reached < right:
        free.append((reached, right))
    return free


def _white(free: list[_Band], band: _Band, min_width: float) -> list[_Band]:
    """The parts of the band in a row's ``free`` stretches that are at least ``min_width`` wide."""
    parts = []
    for start, end in itertools.islice(free, max(bisect.bisect_left(free, (band[0],)) - 1, 0), None):
        if start >= band[1]:
            break
        part = max(start, band[0]), min(end, band[1])
        if part[1] - part[0] >= min_width:
            parts.append(part)
    return parts


def _bridged(previous: _Line, row: _Line, gutter: _Gutter) -> bool:
    """The row is right below one with text on both sides of the band (or across it), and the boxes that reach
    into the band cross it, each two lines of running text: the engine read two columns' lines as one."""
    if row.top - previous.bottom > BRIDGE_GAP * (row.bottom - row.top) or not (
        any(map(gutter.crossed_by, previous.boxes)) or len({gutter.right_of(box) for box in previous.boxes}) == 2
    ):
        return False
    inside = [
        box for box in row.boxes if box.left + gutter.slack < gutter.right and _end(box) - gutter.slack > gutter.left
    ]
    cuts = [gutter.cut(box) if gutter.crossed_by(box) else None for box in inside]
    return bool(cuts) and all(halves is not None and all(map(_running, halves)) for halves in cuts)


def _column_section(rows: list[_Line], gutter: _Gutter, gap: float) -> tuple[int, _Gutter] | None:
    """How many rows of the gutter's column section have text on both sides, and the section; None unless at least
    COLUMN_MIN_ROWS do and each side is a column of running text (:func:`_prose`).

    The section ends above the first box across the gutter that reaches out of the columns (a line of the full
    width, not two columns' lines read as one), and is :func:`_trimmed`.
    """
    beside = [box for row in rows[gutter.start : gutter.stop] for box in row.boxes if not gutter.crossed_by(box)]
    reach = (
        min((box.left for box in beside if not gutter.right_of(box)), default=gutter.left) - gutter.slack,
        max((_end(box) for box in beside if gutter.right_of(box)), default=gutter.right) + gutter.slack,
    )
    for index in range(gutter.start, gutter.stop):
        if any(
            gutter.crossed_by(box) and not reach[0] <= box.left <= _end(box) <= reach[1] for box in rows[index].boxes
        ):
            gutter = replace(gutter, stop=index)
            break
    gutter = _trimmed(rows, gutter, gap)
    sides: tuple[list[list[TextBox]], list[list[TextBox]]] = ([], [])
    for row in rows[gutter.start : gutter.stop]:
        beside = [box for box in row.boxes if not gutter.crossed_by(box)]
        sides[0].append([box for box in beside if not gutter.right_of(box)])
        sides[1].append([box for box in beside if gutter.right_of(box)])
    both_sides = sum(1 for left, right in zip(*sides, strict=True) if left and right)
    return (both_sides, gutter) if both_sides >= COLUMN_MIN_ROWS and all(map(_prose, sides)) else None


def _trimmed(rows: list[_Line], gutter: _Gutter, gap: float) -> _Gutter:
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
    spans = [max(map(_end, row)) - min(box.left for box in row) for row in rows if any(map(_running, row))]
    return (
        bool(spans)
        and running >= RUNNING_TEXT * sum(len(box.text) for box in boxes)
        and statistics.median(spans) >= COLUMN_FILL * (max(map(_end, boxes)) - min(box.left for box in boxes))
    )


def _running(box: TextBox) -> bool:
    """The box holds running text: RUNNING_WORDS words of two letters or more."""
    return sum(sum(char.isalpha() for char in token) >= 2 for token in box.text.split()) >= RUNNING_WORDS


def _end(box: TextBox) -> float:
    """The box's right edge; its left one where that is unknown."""
    return box.left if box.right is None else box.right


def _middle(box: TextBox) -> float:
    return (box.left + _end(box)) / 2


def _em(char: str) -> float:
    """A rough width of the character in a proportional font, in ems."""
    if char in _NARROW:
        return 0.3
    if char in _WIDE:
        return 0.8
    return 0.7 if char.isupper() else 0.5


def mean_confidence(boxes: Iterable[TextBox]) -> float | None:
    """The recognition confidence of the page: the boxes' scores weighted by their characters; None without text."""
    weighted = [(box.score, len(box.text)) for box in boxes]
    characters = sum(size for _, size in weighted)
    return sum(score * size for score, size in weighted) / characters if characters else None
