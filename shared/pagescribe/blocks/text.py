"""Plain text and where it stands in the answer: the answer's lines, a cursor through a block, inline tokens' text."""

from __future__ import annotations

import bisect
import itertools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pagescribe.blocks import Run

if TYPE_CHECKING:
    from markdown_it.token import Token

    from pagescribe.blocks import BlockType

_NEWLINE = re.compile(r"\r\n?|\n")  # where markdown-it breaks lines (it normalises \r\n and \r to \n)
_BREAK_TAG = re.compile(r"<br\s*/?>", re.I)
_BLANK = " \t\r\n"  # what markdown takes for blank: the indentation before a block, the blank lines after it


@dataclass
class Plain:
    """Plain text being built: each character, and the answer offset it stands at verbatim (None: nowhere)."""

    chars: list[str] = field(default_factory=list)
    offsets: list[int | None] = field(default_factory=list)

    def add(self, text: str, at: int | None = None) -> None:
        self.chars += text
        self.offsets += range(at, at + len(text)) if at is not None else [None] * len(text)

    def extend(self, other: Plain) -> None:
        self.chars += other.chars
        self.offsets += other.offsets

    def text(self) -> str:
        return "".join(self.chars)

    def sliced(self, start: int, stop: int) -> Plain:
        return Plain(self.chars[start:stop], self.offsets[start:stop])

    def stripped(self) -> Plain:
        text = self.text()
        return self.sliced(len(text) - len(text.lstrip()), len(text.rstrip()))

    def collapsed(self) -> Plain:
        """The text with each stretch of whitespace one space, and none at either end (HTML's text)."""
        plain = Plain()
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
class Cursor:
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


def add_inline(tokens: Sequence[Token], cursor: Cursor, plain: Plain) -> None:
    """Add what inline tokens say to ``plain``, each piece found in the answer from the cursor on (markup, such as
    emphasis or a link's ends, says nothing)."""
    for token in tokens:
        add = _INLINE.get(token.type)
        if add is not None:
            add(token, cursor, plain)


def _text(token: Token, cursor: Cursor, plain: Plain) -> None:
    """Text or inline code: as it stands."""
    plain.add(token.content, cursor.find(token.content))


def _special(token: Token, cursor: Cursor, plain: Plain) -> None:
    """An escape (\\#: the character after the backslash), an entity (&amp;: none)."""
    at = cursor.find(token.markup)
    escaped = at is not None and token.info == "escape" and token.markup.endswith(token.content)
    plain.add(token.content, at + len(token.markup) - len(token.content) if escaped and at is not None else None)


def _soft_break(token: Token, cursor: Cursor, plain: Plain) -> None:
    plain.add(" ")


def _hard_break(token: Token, cursor: Cursor, plain: Plain) -> None:
    plain.add("\n")


def _image(token: Token, cursor: Cursor, plain: Plain) -> None:
    """An image: its alt text."""
    add_inline(token.children or [], cursor, plain)


def _html_inline(token: Token, cursor: Cursor, plain: Plain) -> None:
    """A tag is markup; a line break tag, a line break."""
    cursor.find(token.content)
    if _BREAK_TAG.fullmatch(token.content):
        plain.add("\n")


def _footnote_ref(token: Token, cursor: Cursor, plain: Plain) -> None:
    add_footnote_mark(token.meta["label"], f"[^{token.meta['label']}]", cursor, plain)


_INLINE: dict[str, Callable[[Token, Cursor, Plain], None]] = {
    "text": _text,
    "code_inline": _text,
    "text_special": _special,
    "softbreak": _soft_break,
    "hardbreak": _hard_break,
    "image": _image,
    "html_inline": _html_inline,
    "footnote_ref": _footnote_ref,
}


def add_footnote_mark(label: str, markup: str, cursor: Cursor, plain: Plain) -> None:
    """A footnote's mark (``[^2]``, ``[^2]:``) as the page prints it: its number; a named label is markup only."""
    at = cursor.find(markup)
    if label.isdigit():
        plain.add(label, at + 2 if at is not None else None)


def add_verbatim(text: str, cursor: Cursor, plain: Plain) -> None:
    """Add text that the answer holds line by line (code, LaTeX), each line where it stands next."""
    for number, line in enumerate(text.split("\n")):
        if number:
            plain.add("\n", cursor.next("\n"))
        plain.add(line, cursor.find(line))


# --- the answer's lines ------------------------------------------------------------------------------------------


class Source:
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

    def cursor(self, start: int, end: int) -> Cursor:
        return Cursor(self.answer, start, end)

    def furniture_at(self, offset: int) -> BlockType | None:
        """The type of running furniture that the line holding the offset is (``str.splitlines``' lines)."""
        if not self.furniture:
            return None
        return self.furniture.get(bisect.bisect_right(self._split_starts, offset) - 1)


def lines_of(token: Token) -> tuple[int, int]:
    """The token's source lines: the first, and the one after its last (every block token read here has them)."""
    if token.map is None:
        raise ValueError(f"markdown-it gave no source lines for a {token.type} token")
    return token.map[0], token.map[1]
