"""HTML blocks: their text, each piece where it stands in the answer, and their table's cells on its grid."""

from __future__ import annotations

import html
import itertools
import re
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import TYPE_CHECKING

from pagescribe.blocks import Cell
from pagescribe.blocks.text import Plain, lines_of

if TYPE_CHECKING:
    from markdown_it.token import Token

    from pagescribe.blocks.text import Source

MAX_COLSPAN = 1000  # an HTML cell spans at most this many columns (HTML's own limit)
_ENTITY = re.compile(r"&(?:#[0-9]+|#[xX][0-9a-fA-F]+|[A-Za-z][A-Za-z0-9]*);?")  # a character reference in HTML
_INLINE_TAGS = frozenset(
    {"a", "abbr", "b", "bdi", "bdo", "cite", "code", "data", "del", "dfn", "em", "font", "i", "ins", "kbd", "mark"}
    | {"q", "s", "samp", "small", "span", "strike", "strong", "sub", "sup", "time", "u", "var"}
)  # HTML elements inside a line of text: any other tag separates the words on either side


@dataclass
class _HtmlCell:
    header: bool
    rowspan: int  # 0: to the table's last row
    colspan: int
    plain: Plain = field(default_factory=Plain)


def _span(value: str | None) -> int:
    """An HTML rowspan or colspan: a whole number from 0 to MAX_COLSPAN; 1 where it is none."""
    try:
        return min(max(int(value or 1), 0), MAX_COLSPAN)
    except ValueError:
        return 1


class HtmlReader(HTMLParser):
    """An HTML block's text, each piece at the answer offset where it stands verbatim; and the cells of its table,
    row by row (the outermost table's: a nested table's text is its cell's)."""

    def __init__(self, source: Source) -> None:
        super().__init__(convert_charrefs=True)
        self.source = source
        self.text = Plain()  # the text outside any table
        self.rows: list[list[_HtmlCell]] = []
        self.tables = 0  # the tables open
        self.had_table = False
        self._cell: _HtmlCell | None = None
        self._head = False  # in <thead>
        self._lines: list[tuple[int, str]] = []  # each line fed: its line in the answer, its text as fed

    def read(self, token: Token) -> None:
        """Feed an HTML block's content (without the prefixes of the blockquotes or list items it is in)."""
        content = token.content if token.content.endswith("\n") else token.content + "\n"
        first = lines_of(token)[0]
        self._lines += [(first + number, line) for number, line in enumerate(content.split("\n")[:-1])]
        self.feed(content)

    def grid(self) -> list[list[tuple[Cell, Plain]]]:
        """The table's cells at their grid places: each row's cells go left to right into the places that the
        spans of the rows above leave free."""
        taken: set[tuple[int, int]] = set()
        grid: list[list[tuple[Cell, Plain]]] = []
        for row, cells in enumerate(self.rows):
            grid.append([])
            col = 0
            for cell in cells:
                while (row, col) in taken:
                    col += 1
                rowspan = min(cell.rowspan or len(self.rows), len(self.rows) - row)
                colspan = max(cell.colspan, 1)
                plain = cell.plain.collapsed()
                grid[-1].append((Cell(row, col, plain.text(), rowspan, colspan, cell.header), plain))
                taken.update(itertools.product(range(row, row + rowspan), range(col, col + colspan)))
                col += colspan
        return grid

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._separate(tag)
        if tag == "table":
            self.tables += 1
            self.had_table = True
        elif self.tables == 1 and tag in ("thead", "tbody", "tfoot"):
            self._head = tag == "thead"
        elif self.tables == 1 and tag == "tr":
            self.rows.append([])
            self._cell = None
        elif self.tables == 1 and tag in ("td", "th"):
            if not self.rows:
                self.rows.append([])
            values = dict(attrs)
            self._cell = _HtmlCell(
                tag == "th" or self._head, _span(values.get("rowspan")), _span(values.get("colspan"))
            )
            self.rows[-1].append(self._cell)

    def handle_endtag(self, tag: str) -> None:
        self._separate(tag)
        if tag == "table":
            self.tables = max(self.tables - 1, 0)
        if self.tables == 0 or (self.tables == 1 and tag in ("td", "th", "tr")):
            self._cell = None
        if tag == "thead":
            self._head = False

    def handle_data(self, data: str) -> None:
        plain = self._target()
        if plain is None:
            return
        line, col = self.getpos()
        for number, segment in enumerate(data.split("\n")):
            if number:
                plain.add("\n")
            if segment:
                self._add(plain, segment, line + number, col if number == 0 else 0)

    def _add(self, plain: Plain, segment: str, line: int, col: int) -> None:
        """Add a line's piece of text, decoded, at its place in the fed content: where it stands verbatim in the
        answer, and its entities (``&amp;``) decoded, at no offset."""
        answer_line, text = self._lines[line - 1]
        start, end = self.source.starts[answer_line], self.source.ends[answer_line]
        answer = self.source.answer
        if not answer.endswith(text, start, end):  # a tab in an indentation made spaces: the place is unknown
            plain.add(segment)
            return
        at = end - len(text) + col
        if answer.startswith(segment, at):
            plain.add(segment, at)
            return
        tag = answer.find("<", at + 1, end)
        raw = answer[at : tag if tag >= 0 else end]  # the piece as written: up to the next tag or the line's end
        pieces = Plain()
        for verbatim, entity in itertools.zip_longest(_ENTITY.split(raw), _ENTITY.findall(raw), fillvalue=""):
            pieces.add(verbatim, at)
            pieces.add(html.unescape(entity))
            at += len(verbatim) + len(entity)
        plain.extend(pieces if pieces.text() == segment else Plain(list(segment), [None] * len(segment)))

    def _separate(self, tag: str) -> None:
        """A tag other than an inline one (``<b>``, ``<span>``...) separates the words on either side of it."""
        plain = self._target()
        if plain is not None and tag not in _INLINE_TAGS:
            plain.add("\n" if tag == "br" else " ")

    def _target(self) -> Plain | None:
        """Where text goes now: the open cell, the block's text outside tables, or nowhere (a table outside cells)."""
        if self._cell is not None:
            return self._cell.plain
        return self.text if self.tables == 0 else None
