"""The answer parsed into blocks: markdown-it configured for fidelity to the page, its tokens read into typed blocks."""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache

from markdown_it import MarkdownIt
from markdown_it.token import Token
from mdit_py_plugins.dollarmath import dollarmath_plugin
from mdit_py_plugins.footnote import footnote_plugin

from pagescribe.blocks import BLANK_PAGE, Block, BlockType, Cell
from pagescribe.blocks.html_blocks import HtmlReader
from pagescribe.blocks.text import Plain, Source, add_footnote_mark, add_inline, add_verbatim, lines_of

CAPTION_LENGTH = 300  # a paragraph right before or after a figure is its caption when its plain text is this short

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
    source = Source(answer, {line: _FURNITURE[kind] for line, kind in kinds.items()})
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


@dataclass
class _Draft:
    """A block being made: typed, placed and said; its id, text and runs come last."""

    type: BlockType
    start: int
    end: int
    plain: Plain
    level: int | None = None
    cells: tuple[Cell, ...] = ()


class _Reader:
    """Reads markdown-it's token stream into drafts of blocks, in order."""

    def __init__(self, source: Source, tokens: list[Token]) -> None:
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
        start, end = self.source.span(*lines_of(opening))
        plain = Plain()
        add_inline(inline.children or [], self.source.cursor(start, end), plain)
        self.drafts.append(_Draft(BlockType.HEADING, start, end, plain, level=int(opening.tag[1:])))
        return self.closing[index] + 1

    def _paragraph(self, index: int, depth: int) -> int:
        inline = self.tokens[index + 1]
        pieces = self._pieces(inline)
        formula = inline.content.strip()
        if len(pieces) == 1 and len(formula) >= 4 and formula.startswith("\\[") and formula.endswith("\\]"):
            start, end = self.source.span(*lines_of(inline))
            plain = Plain()
            add_verbatim(formula[2:-2].strip(), self.source.cursor(start + 2, end), plain)
            self.drafts.append(_Draft(BlockType.FORMULA, start, end, plain))
        else:
            for children, first, stop in pieces:
                start, end = self.source.span(first, stop)
                plain = Plain()
                add_inline(children, self.source.cursor(start, end), plain)
                kind, plain = _prose_type(children, plain)
                self.drafts.append(_Draft(kind, start, end, plain))
        return self.closing[index] + 1

    def _pieces(self, inline: Token) -> list[tuple[list[Token], int, int]]:
        """The paragraph's inline tokens and lines (first, stop): in one piece, unless some of its lines are running
        furniture and some are not: then in pieces of lines, cut where the furniture starts and ends."""
        first, stop = lines_of(inline)
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
            self.drafts.append(self._leading_draft(index, depth, kind, paragraphs))
        self.read(inner, close, depth)
        return close + 1

    def _leading_draft(self, index: int, depth: int, kind: BlockType, paragraphs: Sequence[Token]) -> _Draft:
        """The block of the paragraphs a list item or a footnote opens with: a footnote's plain text opens with its
        mark, and its paragraphs are by line breaks."""
        start, end = self.source.span(lines_of(self.tokens[index])[0], lines_of(paragraphs[-1])[1])
        cursor, plain = self.source.cursor(start, end), Plain()
        if kind is BlockType.FOOTNOTE:
            label = self.tokens[index].meta["label"]
            add_footnote_mark(label, f"[^{label}]:", cursor, plain)
            if plain.chars:
                plain.add(" ")
        for number, paragraph in enumerate(paragraphs):
            if number:
                plain.add("\n", cursor.next("\n"))
            add_inline(paragraph.children or [], cursor, plain)
        level = depth if kind is BlockType.LIST_ITEM else None
        return _Draft(kind, start, end, plain, level=level)

    def _code(self, index: int, depth: int) -> int:
        token = self.tokens[index]
        first, stop = lines_of(token)
        start, end = self.source.span(first, stop)
        content = first + 1 if token.type == "fence" and stop - first > 1 else first  # after the opening fence
        plain = Plain()
        add_verbatim(
            token.content.removesuffix("\n"), self.source.cursor(max(start, self.source.starts[content]), end), plain
        )
        self.drafts.append(_Draft(BlockType.CODE, start, end, plain))
        return index + 1

    def _math(self, index: int, depth: int) -> int:
        start, end = self.source.span(*lines_of(self.tokens[index]))
        plain = Plain()
        add_verbatim(self.tokens[index].content.strip(), self.source.cursor(start + 2, end), plain)  # after the $$
        self.drafts.append(_Draft(BlockType.FORMULA, start, end, plain))
        return index + 1

    def _table(self, index: int, depth: int) -> int:
        start, end = self.source.span(*lines_of(self.tokens[index]))
        cursor = self.source.cursor(start, end)
        rows: list[list[tuple[Cell, Plain]]] = []
        for inner in range(index + 1, self.closing[index]):
            token = self.tokens[inner]
            if token.type == "tr_open":
                rows.append([])
            elif token.type in ("th_open", "td_open"):
                plain = Plain()
                add_inline(self.tokens[inner + 1].children or [], cursor, plain)
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
        start, end = self.source.span(*lines_of(token))
        if comment:
            plain = Plain()
            plain.add(comment[2], self.source.cursor(start, end).find(comment[2]))
            self.drafts.append(_Draft(_FURNITURE[comment[1]], start, end, plain))
            return index + 1
        reader = HtmlReader(self.source)
        reader.read(token)
        last = index
        while reader.tables and last + 1 < len(self.tokens) and self.tokens[last + 1].type == "html_block":
            last += 1
            reader.read(self.tokens[last])
        reader.close()
        end = self.source.span(*lines_of(self.tokens[last]))[1]
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


def _prose_type(children: Sequence[Token], plain: Plain) -> tuple[BlockType, Plain]:
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


def _table_draft(rows: Sequence[Sequence[tuple[Cell, Plain]]], start: int, end: int) -> _Draft:
    """A table's block: its cells, and its plain text (the non-empty cells by a space, row by row, by line breaks)."""
    plain = Plain()
    for row in rows:
        filled = [cell_plain for cell, cell_plain in row if cell.text]
        if filled and plain.chars:
            plain.add("\n")
        for number, cell_plain in enumerate(filled):
            plain.add(" " if number else "")
            plain.extend(cell_plain)
    return _Draft(BlockType.TABLE, start, end, plain, cells=tuple(cell for row in rows for cell, _ in row))
