"""Tables among a page's lines: runs of rows whose cells line up in columns, written as markdown or HTML."""

from __future__ import annotations

import html
import itertools
import math
from collections.abc import Sequence

from pagescribe.layout.boxes import BULLET, EDGE_SLACK, Band, Line, TextBox, box_end, box_middle

TABLE_MIN_ROWS = 3  # a table has at least this many rows,
TABLE_ROW_GAP = 2.5  # ... each at most this many median line heights below the one before,
TABLE_SPAN = 0.15  # ... and white between its columns in all rows but this share of them

Tables = dict[int, tuple[list[str], int]]  # the index of each table's first line: its markdown lines and its rows
_Cells = dict[int, tuple[int, str]]  # a row's cells by the column each starts in: how many columns it spans, its text


def find_tables(lines: Sequence[Line], height: float) -> Tables:
    """The tables among the lines: the index of each table's first line, its markdown lines and its count of rows.

    A table is a run of at least TABLE_MIN_ROWS rows of cells (lines of two boxes or more that hold more than a
    bullet, the engine's boxes being separated by more than a word space), each at most TABLE_ROW_GAP line heights
    below the one before; a line of one box between two rows of cells belongs to the table too. Its columns are the
    stretches of the run's width that its boxes cover, between bands of white through all of its rows but TABLE_SPAN
    of them (one row from four rows on: a title or a merged cell across the columns), each holding the middle of a
    box in two rows or more; a box goes to the column nearest to its middle. A table needs two columns or more, and
    cells in two columns or more in most of its rows.
    """
    tables: Tables = {}
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


def in_tables(tables: Tables) -> set[int]:
    """The indexes of all the lines the tables take."""
    return {start + offset for start, (_, rows) in tables.items() for offset in range(rows)}


def _cells(line: Line) -> int:
    """How many boxes of the line hold more than a bullet."""
    return sum(not BULLET.fullmatch(box.text + " ") for box in line.boxes)


def _below(upper: Line, lower: Line, height: float) -> bool:
    """The lower line starts under the upper one, at most TABLE_ROW_GAP line heights below it."""
    return upper.top < lower.top and lower.top - upper.bottom <= TABLE_ROW_GAP * height


def _table(rows: Sequence[Line], height: float) -> list[str] | None:
    """The rows as a table (the first as its header), or None when they do not line up in columns: markdown, or
    HTML where a cell of the header row, or the one cell of a row, spans columns (:func:`_placed`)."""
    supported = _supported_columns(rows, height)
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
        return _markdown_table(cells, len(supported))
    return [
        "<table>",
        *(_html_row(row_cells, len(supported), header=not at) for at, row_cells in enumerate(cells)),
        "</table>",
    ]


def _supported_columns(rows: Sequence[Line], height: float) -> list[Band]:
    """The rows' columns (:func:`_columns`) that hold the middle of a box in two rows or more; none where a box's
    right edge is unknown."""
    boxes = [box for row in rows for box in row.boxes]
    if any(box.right is None for box in boxes):
        return []
    return [
        column
        for column in _columns(rows, boxes, height)
        if sum(any(column[0] <= box_middle(box) <= column[1] for box in row.boxes) for row in rows) >= 2
    ]


def _markdown_table(cells: Sequence[_Cells], columns: int) -> list[str]:
    """Rows of cells that span no columns as a markdown table, the first row its header."""
    lines = [
        "| " + " | ".join(_cell(row_cells[at][1] if at in row_cells else "") for at in range(columns)) + " |"
        for row_cells in cells
    ]
    return [lines[0], "|" + " --- |" * columns, *lines[1:]]


def _placed(row: Line, columns: Sequence[Band], slack: float, *, may_span: bool) -> _Cells:
    """The row's cells by the column each starts in: how many columns it spans, and its text.

    A box goes to the column nearest to its middle; boxes in one column are joined left to right. Where ``may_span``, a
    column's lone box whose text runs across the white between columns (its ends, ``slack`` taken off, reach into two
    columns or more) spans them, where no other cell of the row is in any of them."""
    nearest = _nearest_columns(row, columns)
    cells = {at: (1, " ".join(box.text for box in boxes)) for at, boxes in nearest.items()}
    for at, boxes in nearest.items() if may_span else ():
        reach = _reach(boxes, columns, slack)
        taken = {column for other, (span, _) in cells.items() if other != at for column in range(other, other + span)}
        if len(boxes) == 1 and len(reach) > 1 and at in reach and not taken.intersection(reach):
            del cells[at]
            cells[reach[0]] = (len(reach), boxes[0].text)
    return dict(sorted(cells.items()))


def _nearest_columns(row: Line, columns: Sequence[Band]) -> dict[int, list[TextBox]]:
    """The row's boxes, left to right, by the column nearest to the middle of each."""
    nearest: dict[int, list[TextBox]] = {}
    for box in sorted(row.boxes, key=lambda box: box.left):
        middle = box_middle(box)
        at = min(range(len(columns)), key=lambda index: max(columns[index][0] - middle, middle - columns[index][1]))
        nearest.setdefault(at, []).append(box)
    return nearest


def _reach(boxes: list[TextBox], columns: Sequence[Band], slack: float) -> list[int]:
    """The columns that the first box's stretch (:func:`_covered`) reaches into."""
    start, end = _covered(Line(boxes[0].top, boxes[0].bottom, boxes), slack)[0]
    return [index for index, (low, high) in enumerate(columns) if start <= high and end >= low]


def _html_row(cells: _Cells, columns: int, *, header: bool) -> str:
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


def _columns(rows: Sequence[Line], boxes: Sequence[TextBox], height: float) -> list[Band]:
    """The stretches of x that the rows' boxes cover in more rows than one spanning row may account for."""
    left, right = math.floor(min(box.left for box in boxes)), math.ceil(max(map(box_end, boxes)))
    cover = [0] * (right - left + 1)
    slack = EDGE_SLACK * height
    for row in rows:
        for start, end in _covered(row, slack):
            for x in range(math.floor(start) - left, math.ceil(end) - left + 1):
                cover[x] += 1
    allowed = int(TABLE_SPAN * len(rows)) or int(len(rows) > TABLE_MIN_ROWS)  # one row may span from four rows on
    columns: list[Band] = []
    for covered, run in itertools.groupby(enumerate(cover), key=lambda item: item[1] > allowed):
        if covered:
            span = [x for x, _ in run]
            columns.append((span[0] + left, span[-1] + left))
    return columns


def _covered(row: Line, slack: float) -> list[Band]:
    """The stretches the row's boxes cover, ``slack`` taken off both ends of each (a short box keeps its middle)."""
    return [(min(box.left + slack, box_middle(box)), max(box_end(box) - slack, box_middle(box))) for box in row.boxes]


def _cell(text: str) -> str:
    return text.replace("|", "\\|")
