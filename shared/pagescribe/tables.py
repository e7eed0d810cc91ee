"""Tables that cross pages: the finish pass joins a table that ends one page to the table that starts the next.

Each page is transcribed alone, so a table that runs over two pages comes back as two tables. Two tables are one
when, on consecutive pages, the first is the last block of its page and the second the first block of the next
(running headers, footers and page numbers aside), both are markdown pipe tables, and their columns agree: the same
number of columns and, where the second repeats a header row, the same header (the repeated header is dropped). A
second table whose first row is not the first's header keeps that row as a row of the table: a model that reads a
page beginning in the middle of a table writes its first row as the header, as markdown requires. A false join is
worse than a missed one: tables whose columns differ, HTML tables (whose header rows and spans cannot be told apart
this simply) and tables with anything between them stay apart. A join runs on over as many pages as the table does.

The joins are deterministic (the pages' blocks alone decide them), recorded in the JSON transcript, and a document
may turn them off (``merge_tables``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pagescribe.blocks import Block, BlockType, Cell

_FURNITURE = frozenset({BlockType.PAGE_HEADER, BlockType.PAGE_FOOTER, BlockType.PAGE_NUMBER})


@dataclass(frozen=True)
class TableJoin:
    """A table that continues another: the one on ``page`` (its block ``block``) goes on from ``head``, the block of
    the table as it starts on ``head_page``."""

    head_page: int
    head: str  # the block id, page-local ("b7")
    page: int
    block: str
    header_repeated: bool  # its first row repeats the head's header row, and is dropped


def table_joins(pages: Sequence[tuple[int, Sequence[Block]]]) -> list[TableJoin]:
    """The joins among the pages' tables (page number and blocks, in page order), in page order."""
    joins: list[TableJoin] = []
    # the page before, when a table ends it: its number, and where the table it is (or continues) starts
    tail: tuple[int, int, Block] | None = None
    for number, blocks in pages:
        content = [block for block in blocks if block.type not in _FURNITURE]
        head = _continued_head(tail, number, content)
        if head is not None:
            first = content[0]
            joins.append(TableJoin(head[0], head[1].id, number, first.id, _same_row(_row(head[1], 0), _row(first, 0))))
        tail = _tail(number, content, head)
    return joins


def _continued_head(
    tail: tuple[int, int, Block] | None, number: int, content: Sequence[Block]
) -> tuple[int, Block] | None:
    """Where the table that the page's first block continues starts (its page and block), when the page before ended
    in a table (``tail``); None when the page opens with no continuation."""
    if tail is None or not content or tail[0] + 1 != number or not _continues(tail[2], content[0]):
        return None
    return tail[1], tail[2]


def _tail(number: int, content: Sequence[Block], head: tuple[int, Block] | None) -> tuple[int, int, Block] | None:
    """The page's number and where the table that ends it starts (its page and block; ``head`` where the page's one
    table continues it); None when no pipe table ends the page."""
    last = content[-1] if content else None
    if last is None or last.type is not BlockType.TABLE or not _pipe(last):
        return None
    if head is not None and last is content[0]:
        return (number, *head)
    return (number, number, last)


def _continues(head: Block, table: Block) -> bool:
    """``table`` goes on from the table that ends the page before, which is or continues ``head``."""
    return table.type is BlockType.TABLE and _pipe(table) and _width(table) == _width(head)


def _pipe(block: Block) -> bool:
    return bool(block.cells) and not block.text.lstrip().startswith("<")


def _width(block: Block) -> int:
    return max(cell.col + cell.colspan for cell in block.cells)


def _row(block: Block, row: int) -> list[Cell]:
    return sorted((cell for cell in block.cells if cell.row == row), key=lambda cell: cell.col)


def _same_row(first: list[Cell], second: list[Cell]) -> bool:
    def key(cells: list[Cell]) -> list[str]:
        return [" ".join(cell.text.split()).casefold() for cell in cells]

    return bool(first) and key(first) == key(second)


def continued_rows(table: Block, header_repeated: bool) -> list[str]:
    """The markdown lines of a continuation's rows as rows of the table it continues: without its separator line, and
    without its first row where that repeats the header."""
    lines = [line.strip() for line in table.text.splitlines() if line.strip()]
    return lines[2:] if header_repeated else lines[:1] + lines[2:]
