"""A page's lines in reading order written as markdown: paragraphs, tables, headings, lists, page number, figures."""

from __future__ import annotations

import re
import statistics
from collections import Counter
from collections.abc import Sequence
from typing import Literal

from pagescribe.checks import BLANK_PAGE
from pagescribe.layout.boxes import BULLET, FIGURE, PARAGRAPH_GAP, Figure, Line, box_end
from pagescribe.layout.headings import heading_levels
from pagescribe.layout.tables import Tables, find_tables, in_tables

FURNITURE_GAP = 1.5  # a page number has at least this many median line heights of white between it and the rest
_PAGE_NUMBER = re.compile(
    r"(?i)(?:page\s+)?[-\u2013\u2014]?\s*(?:\d{1,4}|[ivxlcdm]{1,7})\s*[-\u2013\u2014]?(?:\s*(?:of|/)\s*\d{1,4})?"
)
_LIST_ITEM = re.compile(r"^(?:- |\d{1,3}[.)] )")
_HYPHENATED = re.compile(r"[^\W\d_]{2}-$")  # a word broken at the line's end (two letters, then a hyphen)
PageNumbers = Literal["mark", "drop"]


def markdown(lines: Sequence[Line], page_numbers: PageNumbers, figures: Sequence[Figure] = ()) -> str:
    """Lines in reading order as markdown; :data:`BLANK_PAGE` for none and no figure.

    - A gap over PARAGRAPH_GAP median line heights becomes a blank line (never from one column to the next: the
      next column starts higher up).
    - Rows of cells lined up in columns become a markdown table (:func:`find_tables`).
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
    tables = find_tables(lines, height)
    levels = heading_levels(lines, height, tables)
    furniture = _furniture(lines, height, tables, levels)
    places = _figure_places(lines, figures)
    for start, (_, rows) in tables.items():  # a figure inside a table goes before it
        places[start] += sum(places.pop(index, 0) for index in range(start + 1, start + rows))
    return _write(lines, height, tables, levels, furniture, places, page_numbers)


def _figure_places(lines: Sequence[Line], figures: Sequence[Figure]) -> Counter[int]:
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
                    and any(box.left < figure.right and box_end(box) > figure.left for box in line.boxes)
                ),
                len(lines),
            )
        ] += 1
    return places


def _write(
    lines: Sequence[Line],
    height: float,
    tables: Tables,
    levels: dict[int, int],
    furniture: dict[int, str],
    places: Counter[int],
    page_numbers: PageNumbers,
) -> str:
    """The page's markdown, line by line, with what :func:`markdown` found: tables, headings, the page number and
    the figures placed before each line (``places``, a count by line index; at ``len(lines)``: after the last)."""
    parts = _Parts()
    previous: Line | None = None
    index = 0
    while index <= len(lines):
        parts.figures(places[index])
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
        else:
            parts.line(line, levels.get(index), above=levels.get(index - 1))
        previous, index = line, index + 1
    return "\n".join(parts).strip("\n")


class _Parts(list[str]):
    """The markdown of a page being written, line by line; "" is a blank line."""

    def block(self, *lines: str) -> None:
        """Lines set apart from what precedes and follows them by blank lines."""
        if self and self[-1]:
            self.append("")
        self += [*lines, ""]

    def figures(self, count: int) -> None:
        """``count`` :data:`FIGURE` lines, each a block of its own."""
        for _ in range(count):
            self.block(FIGURE)

    def line(self, line: Line, level: int | None, *, above: int | None) -> None:
        """A heading of the ``level`` or, without one, a line of text, after a line that was a heading of the level
        ``above`` or none."""
        if level is not None:
            self.heading(line, level, continued=above == level)
        else:
            self.text(line, after_heading=above is not None)

    def heading(self, line: Line, level: int, *, continued: bool) -> None:
        """A heading line; the second line of a heading wrapped over two (``continued``) joins the first."""
        text = " ".join(line.text().split())
        marker = "#" * level + " "
        if self and self[-1].startswith(marker) and continued:
            self[-1] += " " + text
            return
        if self and self[-1]:
            self.append("")
        self.append(marker + text)

    def text(self, line: Line, *, after_heading: bool) -> None:
        """A line of text or a list item; a word hyphenated at the end of the line before is joined with its end."""
        text = _list_item(line.text())
        if self and self[-1].startswith("#") and after_heading:
            self.append("")
        if self and _HYPHENATED.search(self[-1]) and text[:1].islower() and not _LIST_ITEM.match(text):
            self[-1] = self[-1][:-1] + text
        else:
            self.append(text)


def _furniture(lines: Sequence[Line], height: float, tables: Tables, levels: dict[int, int]) -> dict[int, str]:
    """The page's page number: its line's index to ``page number``; empty without one.

    It is the page's top line, first in reading order, or its bottom line, last in reading order, that reads as a
    page number (:func:`is_page_number`), is no heading and no table's, and lies more than FURNITURE_GAP median line
    heights away from the rest of the page's lines. Running headers and footers are not told apart here: a slide's
    top and bottom lines are set off in the same way and are its title and its message; the transcript finds them
    by what recurs across the document's pages (:func:`pagescribe.assembly.running_furniture`).
    """
    if len(lines) < 2:
        return {}
    tabled = in_tables(tables)
    for index in (len(lines) - 1, 0):
        line = lines[index]
        others = [other for at, other in enumerate(lines) if at != index]
        gap = line.top - max(other.bottom for other in others) if index else min(o.top for o in others) - line.bottom
        if index not in tabled and index not in levels and gap > FURNITURE_GAP * height and is_page_number(line.text()):
            return {index: "page number"}
    return {}


def is_page_number(text: str) -> bool:
    """The text reads as a page number alone: ``7``, ``- 7 -``, ``Page 7 of 9``, ``vii``."""
    return _PAGE_NUMBER.fullmatch(text.strip()) is not None


def _list_item(text: str) -> str:
    """The line as a markdown list item when it opens with a bullet; escaped when it opens with ``#``."""
    bullet = BULLET.match(text)
    if bullet:
        return "- " + text[bullet.end() :]
    return "\\" + text if text.startswith("#") else text
