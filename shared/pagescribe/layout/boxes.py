"""Positioned text: the boxes an engine or a PDF's text layer gives, the lines they make, and their measures."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

PARAGRAPH_GAP = 1.5  # a gap between two lines taller than this many median line heights starts a paragraph
EDGE_SLACK = 0.5  # boxes reach past their ink: where white is looked for, this many line heights come off both ends
BULLET = re.compile(
    "^[\u2022\u00b7\u25cf\u25cb\u25e6\u25aa\u25a0\u2023\u25ba\u27a2\u2756\u2713*+\u2013-](?:\\s+|(?=[A-Z]))"
)  # a bullet, then a space or a capital
_CJK = re.compile(
    r"[\u2e80-\u2fdf\u3040-\u312f\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]"
)  # Han, kana, hangul
_LATIN_PUNCTUATION = str.maketrans(  # CJK full stop, commas, colon, ... and their Latin forms
    "\u3002\uff0c\u3001\uff1a\uff1b\uff08\uff09\uff01\uff1f\u3010\u3011", ".,,:;()!?[]"
)
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
class Line:
    """A line of text: the boxes side by side at one height, and the height they take together."""

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


Band = tuple[float, float]  # a horizontal stretch of the page, left to right


def rows_of(boxes: Iterable[TextBox]) -> list[Line]:
    """The boxes grouped into lines across the whole width, top to bottom, each read left to right."""
    lines: list[Line] = []
    for box in sorted(boxes, key=lambda box: (box.top, box.left)):
        if not lines or not lines[-1].accepts(box):
            lines.append(Line(box.top, box.bottom))
        lines[-1].add(box)
    return lines


def box_end(box: TextBox) -> float:
    """The box's right edge; its left one where that is unknown."""
    return box.left if box.right is None else box.right


def box_middle(box: TextBox) -> float:
    return (box.left + box_end(box)) / 2


def em_width(char: str) -> float:
    """A rough width of the character in a proportional font, in ems."""
    if char in _NARROW:
        return 0.3
    if char in _WIDE:
        return 0.8
    return 0.7 if char.isupper() else 0.5


def latin_punctuation(text: str) -> str:
    """Text with no CJK character in it keeps no CJK punctuation: the recognition model, trained on Chinese and
    English, reads a Latin full stop after a digit as ``。`` (``1。 Installation``). Text with CJK keeps it."""
    if _CJK.search(text) or not any(char.isascii() and char.isalpha() for char in text):
        return text
    return text.translate(_LATIN_PUNCTUATION)


def mean_confidence(boxes: Iterable[TextBox]) -> float | None:
    """The recognition confidence of the page: the boxes' scores weighted by their characters; None without text."""
    weighted = [(box.score, len(box.text)) for box in boxes]
    characters = sum(size for _, size in weighted)
    return sum(score * size for score, size in weighted) / characters if characters else None
