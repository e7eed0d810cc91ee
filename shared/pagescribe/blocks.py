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
import html
import itertools
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cache
from html.parser import HTMLParser

from markdown_it import MarkdownIt
from markdown_it.token import Token
from mdit_py_plugins.dollarmath import dollarmath_plugin
from mdit_py_plugins.footnote import footnote_plugin

BLANK_PAGE = "(blank page)"  # the answer for a page with no text (pagescribe.checks.BLANK_PAGE): no blocks
CAPTION_LENGTH = 300  # a paragraph right before or after a figure is its caption when its plain text is this short
MAX_COLSPAN = 1000  # an HTML cell spans at most this many columns (HTML's own limit)


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


_FURNITURE = {
    "running header": BlockType.PAGE_HEADER,
    "running footer": BlockType.PAGE_FOOTER,
    "page number": BlockType.PAGE_NUMBER,
}  # pagescribe.assembly.running_furniture's kinds, which are also the offline engine's and assembly's comments
_FURNITURE_COMMENT = re.compile(r"<!--\s*(page number|running header|running footer)\s*:\s*(.*?)\s*-->", re.S)
_CAPTION = re.compile(
    r"(?:Figure|FIGURE|Fig\.|FIG\.|Table|TABLE|Abbildung|ABBILDUNG|Abb\.|Tabelle|TABELLE)"
    r"\s*(?:\d+|[IVXLCDM]+)(?=[:.\s]|$)"
)  # "Figure 3:", "Fig. 2.", "Table 26.2.:", "Tabelle IV "
_FIGURE_WORDS = re.compile(
    r"(?i)(?:an?\s+|the\s+)?(?:figure|fig\.|image|picture|photo(?:graph)?|chart|diagram|graph(?:ic)?|logo|"
    r"illustration|drawing|sketch|icon|map|plot|screenshot|signature|stamp|seal|qr[ -]code|barcode)s?(?![^\W\d_])"
)  # the first words of a figure's description in square brackets: "[figure]", "[Image: ...]", "[A photo of ...]"
_ENTITY = re.compile(r"&(?:#[0-9]+|#[xX][0-9a-fA-F]+|[A-Za-z][A-Za-z0-9]*);?")  # a character reference in HTML
_NEWLINE = re.compile(r"\r\n?|\n")  # where markdown-it breaks lines (it normalises \r\n and \r to \n)
_BREAK_TAG = re.compile(r"<br\s*/?>", re.I)
_BLANK = " \t\r\n"  # what markdown takes for blank: the indentation before a block, the blank lines after it
_INLINE_TAGS = frozenset(
    {"a", "abbr", "b", "bdi", "bdo", "cite", "code", "data", "del", "dfn", "em", "font", "i", "ins", "kbd", "mark"}
    | {"q", "s", "samp", "small", "span", "strike", "strong", "sub", "sup", "time", "u", "var"}
)  # HTML elements inside a line of text: any other tag separates the words on either side


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


def parse_blocks(answer: str, furniture: Mapping[int, str] | None = None) -> list[Block]:
    """The answer's blocks in order. `furniture`: the answer's line index (0-based, in answer.splitlines()) →
    "running header" | "running footer" | "page number", as pagescribe.assembly.running_furniture gives it: a
    block on such a line is a PAGE_HEADER / PAGE_FOOTER / PAGE_NUMBER.

    One block per heading, paragraph, list item, table, code block, footnote and display formula:

    - A list item is its own paragraphs (not its nested items, which are blocks of their own, one level deeper); an
      item with no paragraph before its other content (an empty one, one opening with a nested list or a code block)
      is no block, and a paragraph of an item after its nested list is a paragraph of its own.
    - A blockquote is its content: its paragraphs, lists and so on are blocks.
    - A table's ``plain`` is its non-empty cells joined by a space, row by row, the rows by a line break; an HTML
      ``<table>`` is read into the same grid of cells, its spans expanded (:class:`Cell`), its text outside cells
      (a ``<caption>``) left out.
    - A FIGURE is a paragraph of images alone, or one that is a square-bracketed description opening with a word
      for a picture (``[figure]``, ``[Image: a map]``, ``[Photo of ...]``, ``[Chart ...]``); ``[1] Smith et al.``
      or ``[Name Redacted]`` is no figure.
    - A CAPTION is a paragraph opening with ``Figure 3``, ``Fig. 3``, ``Table 3``, ``Abbildung 3`` or ``Tabelle 3``
      (a number or a Roman numeral, then ``:``, ``.``, a space or the end), or one right before or after a figure
      that is at most CAPTION_LENGTH characters long.
    - A FORMULA is a ``$$ ... $$`` block or a paragraph that is only ``\\[ ... \\]``; its ``plain`` is the LaTeX.
    - A FOOTNOTE is a definition ``[^2]: ...``; its ``plain`` opens with its mark where that is a number (``2``),
      as the page prints it, as does a reference's in the text.
    - The offline engine's and assembly's comments ``<!-- page number: 7 -->``, ``<!-- running header: X -->`` and
      ``<!-- running footer: X -->`` are PAGE_NUMBER, PAGE_HEADER and PAGE_FOOTER blocks saying the comment's text;
      any other comment is no block, any other HTML block a paragraph with its tags stripped (no block if it has
      no text).
    - A block whose first line is in ``furniture`` takes that line's type, whatever it parsed as. A paragraph whose
      lines are furniture and text both is first split at its line breaks where the furniture starts and ends (a
      running header run on into the page's first sentence, a page number into its last).
    - A thematic break (``---``) is no block; an answer that is :data:`BLANK_PAGE` has none.
    """
    if not answer.strip() or answer.strip() == BLANK_PAGE:
        return []
    kinds = dict(furniture or {})
    unknown = set(kinds.values()) - set(_FURNITURE)
    if unknown:
        raise ValueError(f"not a kind of running furniture: {sorted(unknown)}")
    source = _Source(answer, {line: _FURNITURE[kind] for line, kind in kinds.items()})
    reader = _Reader(source, _markdown().parse(answer))
    reader.read(0, len(reader.tokens), depth=0)
    drafts = reader.drafts
    for draft in drafts:
        draft.type = source.furniture_at(draft.start) or draft.type
    _mark_captions(drafts)
    return [
        Block(
            id=f"b{number}",
            type=draft.type,
            text=answer[draft.start : draft.end],
            start=draft.start,
            end=draft.end,
            plain=draft.plain.text(),
            runs=draft.plain.runs(),
            level=draft.level if draft.type in (BlockType.HEADING, BlockType.LIST_ITEM) else None,
            cells=draft.cells if draft.type is BlockType.TABLE else (),
        )
        for number, draft in enumerate(drafts, 1)
    ]


@cache
def _markdown() -> MarkdownIt:
    """The parser: CommonMark with tables, footnote definitions and ``$$`` display math.

    Footnote definitions stay where they stand (not moved to the end), and text_join is off, so that an escaped
    character or an entity stays a token of its own whose source (``markup``) can be found in the answer.
    """
    parser = MarkdownIt("commonmark").enable("table")
    parser.use(footnote_plugin, inline=False, move_to_end=False)
    parser.use(dollarmath_plugin, allow_blank_lines=False)
    parser.disable(["math_inline", "reference", "text_join"])
    return parser


def _mark_captions(drafts: Sequence[_Draft]) -> None:
    """A paragraph right before or after a figure, at most CAPTION_LENGTH characters long, is its caption."""
    for number, draft in enumerate(drafts):
        if draft.type is not BlockType.FIGURE:
            continue
        for neighbour in (*drafts[max(number - 1, 0) : number], *drafts[number + 1 : number + 2]):
            if neighbour.type is BlockType.PARAGRAPH and len(neighbour.plain.chars) <= CAPTION_LENGTH:
                neighbour.type = BlockType.CAPTION


# --- plain text and where it stands ------------------------------------------------------------------------------


@dataclass
class _Plain:
    """Plain text being built: each character, and the answer offset it stands at verbatim (None: nowhere)."""

    chars: list[str] = field(default_factory=list)
    offsets: list[int | None] = field(default_factory=list)

    def add(self, text: str, at: int | None = None) -> None:
        self.chars += text
        self.offsets += range(at, at + len(text)) if at is not None else [None] * len(text)

    def extend(self, other: _Plain) -> None:
        self.chars += other.chars
        self.offsets += other.offsets

    def text(self) -> str:
        return "".join(self.chars)

    def sliced(self, start: int, stop: int) -> _Plain:
        return _Plain(self.chars[start:stop], self.offsets[start:stop])

    def stripped(self) -> _Plain:
        text = self.text()
        return self.sliced(len(text) - len(text.lstrip()), len(text.rstrip()))

    def collapsed(self) -> _Plain:
        """The text with each stretch of whitespace one space, and none at either end (HTML's text)."""
        plain = _Plain()
        space: list[int | None] = []  # the offset of a space pending before the next word, if any is pending
        for char, at in zip(self.chars, self.offsets, strict=True):
            if char.isspace():
                space = space or [at if char == " " else None]
                continue
            if space and plain.chars:
                plain.add(" ", space[0])
            space = []
            plain.add(char, at)
        return plain

    def runs(self) -> tuple[Run, ...]:
        """The stretches that stand verbatim in the answer: (offset in plain, offset in the answer, length)."""
        runs: list[list[int]] = []
        for index, at in enumerate(self.offsets):
            if at is None:
                continue
            if runs and runs[-1][0] + runs[-1][2] == index and runs[-1][1] + runs[-1][2] == at:
                runs[-1][2] += 1
            else:
                runs.append([index, at, 1])
        return tuple((plain, at, length) for plain, at, length in runs)


@dataclass
class _Cursor:
    """A position moving forward through a block of the answer: where the block's next piece of text is looked for."""

    answer: str
    at: int
    end: int

    def find(self, text: str) -> int | None:
        """Where the text stands next, verbatim, moving past it; None, not moving, where it stands nowhere."""
        found = self.answer.find(text, self.at, self.end)
        if found < 0:
            return None
        self.at = found + len(text)
        return found

    def next(self, text: str) -> int | None:
        """Where the text stands right at the cursor, moving past it; None, not moving, where it does not."""
        if not self.answer.startswith(text, self.at, self.end):
            return None
        self.at += len(text)
        return self.at - len(text)


def _inline(tokens: Sequence[Token], cursor: _Cursor, plain: _Plain) -> None:
    """Add what inline tokens say to ``plain``, each piece found in the answer from the cursor on."""
    for token in tokens:
        kind = token.type
        if kind in ("text", "code_inline"):
            plain.add(token.content, cursor.find(token.content))
        elif kind == "text_special":  # an escape (\#: the character after the backslash), an entity (&amp;: none)
            at = cursor.find(token.markup)
            escaped = at is not None and token.info == "escape" and token.markup.endswith(token.content)
            plain.add(
                token.content, at + len(token.markup) - len(token.content) if escaped and at is not None else None
            )
        elif kind in ("softbreak", "hardbreak"):
            plain.add(" " if kind == "softbreak" else "\n")
        elif kind == "image":  # its alt text
            _inline(token.children or [], cursor, plain)
        elif kind == "html_inline":  # a tag is markup; a line break tag, a line break
            cursor.find(token.content)
            if _BREAK_TAG.fullmatch(token.content):
                plain.add("\n")
        elif kind == "footnote_ref":
            _footnote_mark(token.meta["label"], f"[^{token.meta['label']}]", cursor, plain)


def _footnote_mark(label: str, markup: str, cursor: _Cursor, plain: _Plain) -> None:
    """A footnote's mark (``[^2]``, ``[^2]:``) as the page prints it: its number; a named label is markup only."""
    at = cursor.find(markup)
    if label.isdigit():
        plain.add(label, at + 2 if at is not None else None)


def _verbatim(text: str, cursor: _Cursor, plain: _Plain) -> None:
    """Add text that the answer holds line by line (code, LaTeX), each line where it stands next."""
    for number, line in enumerate(text.split("\n")):
        if number:
            plain.add("\n", cursor.next("\n"))
        plain.add(line, cursor.find(line))


# --- the answer's lines ------------------------------------------------------------------------------------------


class _Source:
    """The answer, its lines as markdown-it counts them (broken at \\r\\n, \\r and \\n), and its running furniture by
    line as ``str.splitlines`` counts them (which also breaks at \\f, \\x1c-\\x1e, \\x85, \\u2028...)."""

    def __init__(self, answer: str, furniture: dict[int, BlockType]) -> None:
        self.answer = answer
        breaks = list(_NEWLINE.finditer(answer))
        self.starts = [0, *(line_break.end() for line_break in breaks)]
        self.ends = [*(line_break.start() for line_break in breaks), len(answer)]
        self.furniture = furniture
        self._split_starts = [0, *itertools.accumulate(map(len, answer.splitlines(keepends=True)))]

    def span(self, first: int, stop: int) -> tuple[int, int]:
        """The answer offsets of the lines ``first`` to ``stop`` (exclusive), from their first character that is not
        blank (as markdown sees it: a space, a tab or a line break) to their last."""
        start, end = self.starts[first], self.ends[stop - 1]
        text = self.answer[start:end]
        stripped = text.strip(_BLANK)
        start += len(text) - len(text.lstrip(_BLANK))
        return start, start + len(stripped)

    def cursor(self, start: int, end: int) -> _Cursor:
        return _Cursor(self.answer, start, end)

    def furniture_at(self, offset: int) -> BlockType | None:
        """The type of running furniture that the line holding the offset is (``str.splitlines``' lines)."""
        if not self.furniture:
            return None
        return self.furniture.get(bisect.bisect_right(self._split_starts, offset) - 1)


def _lines(token: Token) -> tuple[int, int]:
    """The token's source lines: the first, and the one after its last (every block token read here has them)."""
    if token.map is None:
        raise ValueError(f"markdown-it gave no source lines for a {token.type} token")
    return token.map[0], token.map[1]


# --- blocks from the token stream --------------------------------------------------------------------------------


@dataclass
class _Draft:
    """A block being made: typed, placed and said; its id, text and runs come last."""

    type: BlockType
    start: int
    end: int
    plain: _Plain
    level: int | None = None
    cells: tuple[Cell, ...] = ()


class _Reader:
    """Reads markdown-it's token stream into drafts of blocks, in order."""

    def __init__(self, source: _Source, tokens: list[Token]) -> None:
        self.source = source
        self.tokens = tokens
        self.drafts: list[_Draft] = []
        self.closing: dict[int, int] = {}  # the index of each opening token to its closing token's
        opened: list[int] = []
        for index, token in enumerate(tokens):
            if token.nesting == 1:
                opened.append(index)
            elif token.nesting == -1:
                self.closing[opened.pop()] = index

    def read(self, start: int, stop: int, depth: int) -> None:
        """Read the tokens from ``start`` to ``stop`` (exclusive); ``depth``: the lists they are in."""
        index = start
        while index < stop:
            read = _READERS.get(self.tokens[index].type, _Reader._container)
            index = read(self, index, depth)

    def _container(self, index: int, depth: int) -> int:
        """A blockquote's (or any other container's) content is blocks of its own; a thematic break is none."""
        if self.tokens[index].nesting != 1:
            return index + 1
        self.read(index + 1, self.closing[index], depth)
        return self.closing[index] + 1

    def _list(self, index: int, depth: int) -> int:
        self.read(index + 1, self.closing[index], depth + 1)
        return self.closing[index] + 1

    def _heading(self, index: int, depth: int) -> int:
        opening, inline = self.tokens[index], self.tokens[index + 1]
        start, end = self.source.span(*_lines(opening))
        plain = _Plain()
        _inline(inline.children or [], self.source.cursor(start, end), plain)
        self.drafts.append(_Draft(BlockType.HEADING, start, end, plain, level=int(opening.tag[1:])))
        return self.closing[index] + 1

    def _paragraph(self, index: int, depth: int) -> int:
        inline = self.tokens[index + 1]
        pieces = self._pieces(inline)
        formula = inline.content.strip()
        if len(pieces) == 1 and len(formula) >= 4 and formula.startswith("\\[") and formula.endswith("\\]"):
            start, end = self.source.span(*_lines(inline))
            plain = _Plain()
            _verbatim(formula[2:-2].strip(), self.source.cursor(start + 2, end), plain)
            self.drafts.append(_Draft(BlockType.FORMULA, start, end, plain))
        else:
            for children, first, stop in pieces:
                start, end = self.source.span(first, stop)
                plain = _Plain()
                _inline(children, self.source.cursor(start, end), plain)
                kind, plain = _prose_type(children, plain)
                self.drafts.append(_Draft(kind, start, end, plain))
        return self.closing[index] + 1

    def _pieces(self, inline: Token) -> list[tuple[list[Token], int, int]]:
        """The paragraph's inline tokens and lines (first, stop): in one piece, unless some of its lines are running
        furniture and some are not: then in pieces of lines, cut where the furniture starts and ends."""
        first, stop = _lines(inline)
        children = inline.children or []
        if not self.source.furniture:
            return [(children, first, stop)]
        breaks = [number for number, child in enumerate(children) if child.type in ("softbreak", "hardbreak")]
        kinds = [self.source.furniture_at(self.source.span(line, line + 1)[0]) for line in range(first, stop)]
        if len(breaks) != stop - first - 1 or len(set(kinds)) == 1:  # a line break inside code or a tag: one piece
            return [(children, first, stop)]
        bounds = [-1, *breaks, len(children)]  # line n's tokens lie between bounds n and n + 1
        pieces, line = [], 0
        for _, same in itertools.groupby(kinds):
            following = line + len(list(same))
            pieces.append((children[bounds[line] + 1 : bounds[following]], first + line, first + following))
            line = following
        return pieces

    def _item(self, index: int, depth: int) -> int:
        return self._leading_paragraphs(index, depth, BlockType.LIST_ITEM)

    def _footnote(self, index: int, depth: int) -> int:
        return self._leading_paragraphs(index, depth, BlockType.FOOTNOTE)

    def _leading_paragraphs(self, index: int, depth: int, kind: BlockType) -> int:
        """A list item or a footnote: a block of the paragraphs it opens with, then blocks of what follows them."""
        close = self.closing[index]
        inner, paragraphs = index + 1, []
        while inner < close and self.tokens[inner].type == "paragraph_open":
            paragraphs.append(self.tokens[inner + 1])
            inner = self.closing[inner] + 1
        if paragraphs:
            start, end = self.source.span(_lines(self.tokens[index])[0], _lines(paragraphs[-1])[1])
            cursor, plain = self.source.cursor(start, end), _Plain()
            if kind is BlockType.FOOTNOTE:
                label = self.tokens[index].meta["label"]
                _footnote_mark(label, f"[^{label}]:", cursor, plain)
                if plain.chars:
                    plain.add(" ")
            for number, paragraph in enumerate(paragraphs):
                if number:
                    plain.add("\n", cursor.next("\n"))
                _inline(paragraph.children or [], cursor, plain)
            level = depth if kind is BlockType.LIST_ITEM else None
            self.drafts.append(_Draft(kind, start, end, plain, level=level))
        self.read(inner, close, depth)
        return close + 1

    def _code(self, index: int, depth: int) -> int:
        token = self.tokens[index]
        first, stop = _lines(token)
        start, end = self.source.span(first, stop)
        content = first + 1 if token.type == "fence" and stop - first > 1 else first  # after the opening fence
        plain = _Plain()
        _verbatim(
            token.content.removesuffix("\n"), self.source.cursor(max(start, self.source.starts[content]), end), plain
        )
        self.drafts.append(_Draft(BlockType.CODE, start, end, plain))
        return index + 1

    def _math(self, index: int, depth: int) -> int:
        start, end = self.source.span(*_lines(self.tokens[index]))
        plain = _Plain()
        _verbatim(self.tokens[index].content.strip(), self.source.cursor(start + 2, end), plain)  # after the $$
        self.drafts.append(_Draft(BlockType.FORMULA, start, end, plain))
        return index + 1

    def _table(self, index: int, depth: int) -> int:
        start, end = self.source.span(*_lines(self.tokens[index]))
        cursor = self.source.cursor(start, end)
        rows: list[list[tuple[Cell, _Plain]]] = []
        for inner in range(index + 1, self.closing[index]):
            token = self.tokens[inner]
            if token.type == "tr_open":
                rows.append([])
            elif token.type in ("th_open", "td_open"):
                plain = _Plain()
                _inline(self.tokens[inner + 1].children or [], cursor, plain)
                plain = plain.collapsed()
                cell = Cell(len(rows) - 1, len(rows[-1]), plain.text(), header=token.type == "th_open")
                rows[-1].append((cell, plain))
        self.drafts.append(_table_draft(rows, start, end))
        return self.closing[index] + 1

    def _html(self, index: int, depth: int) -> int:
        """An HTML block: running furniture's comment, a table (with the HTML blocks it goes on in, when blank
        lines cut it into several), or a paragraph of its text."""
        token = self.tokens[index]
        comment = _FURNITURE_COMMENT.fullmatch(token.content.strip())
        start, end = self.source.span(*_lines(token))
        if comment:
            plain = _Plain()
            plain.add(comment[2], self.source.cursor(start, end).find(comment[2]))
            self.drafts.append(_Draft(_FURNITURE[comment[1]], start, end, plain))
            return index + 1
        reader = _Html(self.source)
        reader.read(token)
        last = index
        while reader.tables and last + 1 < len(self.tokens) and self.tokens[last + 1].type == "html_block":
            last += 1
            reader.read(self.tokens[last])
        reader.close()
        end = self.source.span(*_lines(self.tokens[last]))[1]
        if reader.had_table:
            self.drafts.append(_table_draft(reader.grid(), start, end))
        elif (text := reader.text.collapsed()).chars:
            self.drafts.append(_Draft(BlockType.PARAGRAPH, start, end, text))
        return last + 1


_READERS: dict[str, Callable[[_Reader, int, int], int]] = {
    "paragraph_open": _Reader._paragraph,
    "heading_open": _Reader._heading,
    "bullet_list_open": _Reader._list,
    "ordered_list_open": _Reader._list,
    "list_item_open": _Reader._item,
    "footnote_reference_open": _Reader._footnote,
    "table_open": _Reader._table,
    "fence": _Reader._code,
    "code_block": _Reader._code,
    "math_block": _Reader._math,
    "math_block_label": _Reader._math,
    "html_block": _Reader._html,
}


def _prose_type(children: Sequence[Token], plain: _Plain) -> tuple[BlockType, _Plain]:
    """A paragraph's type, and its plain text (a bracketed figure's: the description inside the brackets)."""
    kinds = {child.type for child in children if child.type != "text" or child.content.strip()}
    if "image" in kinds and kinds <= {"image", "softbreak", "hardbreak", "link_open", "link_close"}:
        return BlockType.FIGURE, plain
    text = plain.text()
    if _bracketed(text) and _FIGURE_WORDS.match(text[1:-1].strip()):
        return BlockType.FIGURE, plain.sliced(1, len(text) - 1).stripped()
    if _CAPTION.match(text):
        return BlockType.CAPTION, plain
    return BlockType.PARAGRAPH, plain


def _bracketed(text: str) -> bool:
    """The text is one pair of square brackets and what they hold (``[a [b] c]``, not ``[1] Smith [2]``)."""
    depth = 0
    for at, char in enumerate(text):
        depth += (char == "[") - (char == "]")
        if depth <= 0 and at < len(text) - 1:
            return False
    return len(text) >= 2 and depth == 0 and text.endswith("]")


def _table_draft(rows: Sequence[Sequence[tuple[Cell, _Plain]]], start: int, end: int) -> _Draft:
    """A table's block: its cells, and its plain text (the non-empty cells by a space, row by row, by line breaks)."""
    plain = _Plain()
    for row in rows:
        filled = [cell_plain for cell, cell_plain in row if cell.text]
        if filled and plain.chars:
            plain.add("\n")
        for number, cell_plain in enumerate(filled):
            plain.add(" " if number else "")
            plain.extend(cell_plain)
    return _Draft(BlockType.TABLE, start, end, plain, cells=tuple(cell for row in rows for cell, _ in row))


# --- HTML blocks -------------------------------------------------------------------------------------------------


@dataclass
class _HtmlCell:
    header: bool
    rowspan: int  # 0: to the table's last row
    colspan: int
    plain: _Plain = field(default_factory=_Plain)


def _span(value: str | None) -> int:
    """An HTML rowspan or colspan: a whole number from 0 to MAX_COLSPAN; 1 where it is none."""
    try:
        return min(max(int(value or 1), 0), MAX_COLSPAN)
    except ValueError:
        return 1


class _Html(HTMLParser):
    """An HTML block's text, each piece at the answer offset where it stands verbatim; and the cells of its table,
    row by row (the outermost table's: a nested table's text is its cell's)."""

    def __init__(self, source: _Source) -> None:
        super().__init__(convert_charrefs=True)
        self.source = source
        self.text = _Plain()  # the text outside any table
        self.rows: list[list[_HtmlCell]] = []
        self.tables = 0  # the tables open
        self.had_table = False
        self._cell: _HtmlCell | None = None
        self._head = False  # in <thead>
        self._lines: list[tuple[int, str]] = []  # each line fed: its line in the answer, its text as fed

    def read(self, token: Token) -> None:
        """Feed an HTML block's content (without the prefixes of the blockquotes or list items it is in)."""
        content = token.content if token.content.endswith("\n") else token.content + "\n"
        first = _lines(token)[0]
        self._lines += [(first + number, line) for number, line in enumerate(content.split("\n")[:-1])]
        self.feed(content)

    def grid(self) -> list[list[tuple[Cell, _Plain]]]:
        """The table's cells at their grid places: each row's cells go left to right into the places that the
        spans of the rows above leave free."""
        taken: set[tuple[int, int]] = set()
        grid: list[list[tuple[Cell, _Plain]]] = []
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

    def _add(self, plain: _Plain, segment: str, line: int, col: int) -> None:
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
        pieces = _Plain()
        for verbatim, entity in itertools.zip_longest(_ENTITY.split(raw), _ENTITY.findall(raw), fillvalue=""):
            pieces.add(verbatim, at)
            pieces.add(html.unescape(entity))
            at += len(verbatim) + len(entity)
        plain.extend(pieces if pieces.text() == segment else _Plain(list(segment), [None] * len(segment)))

    def _separate(self, tag: str) -> None:
        """A tag other than an inline one (``<b>``, ``<span>``...) separates the words on either side of it."""
        plain = self._target()
        if plain is not None and tag not in _INLINE_TAGS:
            plain.add("\n" if tag == "br" else " ")

    def _target(self) -> _Plain | None:
        """Where text goes now: the open cell, the block's text outside tables, or nowhere (a table outside cells)."""
        if self._cell is not None:
            return self._cell.plain
        return self.text if self.tables == 0 else None
