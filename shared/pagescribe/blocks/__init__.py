"""A page's answer parsed into typed blocks: the one model of a page that every later output is derived from.

The answer is markdown (a vision model's, or the offline engine's from :mod:`pagescribe.layout`), so it is read by a
markdown parser, markdown-it-py in its CommonMark preset with tables, footnotes (mdit-py-plugins' footnote plugin)
and display math (its dollarmath plugin), never by patterns over lines: what is a list item, a table row or a
paragraph's continuation is the parser's to say. Each block keeps where it stands in the answer, so that whatever is
derived from it (a JSON block, a box on the page, the review page's overlay, a chunk) points back to the very
characters the model wrote:

- ``text`` is the block's markdown source, ``answer[start:end]``: its lines, as the parser's line map gives them,
  without the indentation before its first character and the whitespace after its last.
- ``plain`` is what the block says without markup, the words a reader of the page sees: inline text and code, a
  link's text, an image's alt text; a soft line break is a space, a hard one a line break.
- ``runs`` map ``plain`` back to the answer: ``(offset in plain, offset in the answer, length)``, each a stretch
  that stands verbatim in both (``answer[a:a + n] == plain[p:p + n]``). Text the parser decoded (an entity, an
  escaped character's backslash) or that no longer stands as written is in no run: a run may be missing, never
  wrong. :meth:`Block.answer_span` maps a stretch of ``plain`` to the answer through them.

The parser is configured for fidelity to the page. Link reference definitions are off (``[1]: Smith, 2020`` is a
line of the page, not a definition that vanishes), as is inline ``$...$`` math (``$5 and $10`` on an invoice is
money). Blocks do not overlap and come in the answer's order; a block's ``id`` is ``b1``, ``b2``, ... in that order.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from enum import StrEnum

BLANK_PAGE = "(blank page)"  # the answer for a page with no text (pagescribe.checks.BLANK_PAGE): no blocks


class BlockType(StrEnum):
    HEADING = "heading"
    PARAGRAPH = "paragraph"
    LIST_ITEM = "list_item"
    TABLE = "table"
    FIGURE = "figure"
    CAPTION = "caption"
    FORMULA = "formula"
    CODE = "code"
    FOOTNOTE = "footnote"
    PAGE_HEADER = "page_header"
    PAGE_FOOTER = "page_footer"
    PAGE_NUMBER = "page_number"


@dataclass(frozen=True)
class Cell:
    """One cell of a table, at its place in the table's grid: a cell that spans rows or columns stands at its
    top-left place, and the places it covers hold no other cell. Its text is one line: a line break in it (``<br>``)
    is a space."""

    row: int  # 0-based, in the table's grid (the header row is row 0)
    col: int  # 0-based grid column
    text: str  # the cell's plain text
    rowspan: int = 1
    colspan: int = 1
    header: bool = False  # a header cell: a markdown table's first row, an HTML <th> or a cell in <thead>


Run = tuple[int, int, int]  # (offset in plain, offset in the answer, length)


@dataclass(frozen=True)
class Block:
    """One block of a page's answer: what it is, where it stands, what it says.

    ``plain`` is the words a reader sees, except in a FIGURE: there it is the figure's description (an image's alt
    text, the words in a bracketed ``[Figure: ...]``), which the model wrote and the page does not show, so it must
    not be aligned to the page's text. A FORMULA's and a CODE block's ``plain`` is their source as written (LaTeX,
    code). See the module's docstring for ``text``, ``start``, ``end`` and ``runs``.
    """

    id: str  # "b1", "b2", ... in the answer's order (page-local)
    type: BlockType
    text: str  # the block's markdown source, exactly as it stands in the answer
    start: int  # offset of `text` in the answer string (answer[start:end] == text)
    end: int
    plain: str  # what the block says, without markup: the words a reader sees (for alignment to the page)
    runs: tuple[Run, ...]  # verbatim runs mapping plain back to the answer, in the order of both
    level: int | None = None  # heading level 1-6; list nesting depth (1 = top level) for list items
    cells: tuple[Cell, ...] = ()  # table cells (tables only), row by row

    def answer_span(self, plain_start: int, plain_end: int) -> tuple[int, int]:
        """The answer offsets covering plain[plain_start:plain_end] (as closely as the runs allow).

        An end inside a run maps exactly. An end between runs (a soft break, a decoded entity, a separator between
        table cells) takes the nearest edge outwards: the start goes back to the end of the run before it, the end
        forward to the start of the run after it, and the block's own start or end where there is none.
        """
        starts = [plain for plain, _, _ in self.runs]
        before = bisect.bisect_right(starts, plain_start) - 1  # the last run starting at or before plain_start
        if before >= 0 and plain_start < self.runs[before][0] + self.runs[before][2]:
            start = self.runs[before][1] + plain_start - self.runs[before][0]
        else:
            start = self.runs[before][1] + self.runs[before][2] if before >= 0 else self.start
        after = bisect.bisect_left(starts, plain_end)  # the first run starting at or after plain_end
        if after > 0 and plain_end <= self.runs[after - 1][0] + self.runs[after - 1][2]:
            end = self.runs[after - 1][1] + plain_end - self.runs[after - 1][0]
        else:
            end = self.runs[after][1] if after < len(self.runs) else self.end
        return start, max(start, end)
