"""Grounding: a page's answer aligned to the page's own text, so that each block of the answer gets a box on the page
image and a share of its words the page supports, and the answer's invented text and the page's dropped text are found.

Why: a vision model's answer reads fluently whether or not it is faithful. The page's own text is evidence to hold it
against, and that evidence is positioned: a born-digital PDF page's text layer (pdfium's characters and their boxes,
:func:`pagescribe.sources.text_layer_words`) or a second read of the same image by the offline OCR engine (its
positioned lines, :func:`words_from_boxes`). Lining the answer up with it gives each block a box (the review page can
show where a paragraph came from), a grounding (the share of its characters the page supports), the runs of words
nothing on the page supports, and the runs of the page's words no block took.

A faithful answer differs from its evidence in ways that must not count: blocks and columns in another order, the
markup (already gone from a block's ``plain``), a word hyphenated at a line's end on one side and whole on the other,
ligatures, Unicode forms, accents and quotes, punctuation, numbers whose thousands separator pdfium reads as a space,
table cells in another order, running headers, footers and page numbers moved, and for a second read the engine's
confusions (rn/m, l/1, O/0). So the alignment is local, block by block, and on words:

1. Words and keys. Both sides are cut into words at whitespace (a CJK character is a word of its own: those scripts
   do not space their words). Each word is matched by its key only: NFKC (ligatures, full-width forms), casefolded,
   diacritics dropped, and only its letters and digits kept (so attached punctuation, quotes and dashes of any kind,
   separators). A word with no letter or digit takes no part. A block's characters are its keys' characters.
2. Where a block is. A block is looked for wherever it is on the page, never in one monotone pass over the answer.
   Its words that are rare among the page's words not yet taken (at most RARE occurrences) are its anchors, each
   occurrence weighed by one over their number; failing those, all its words; failing any, the tokens most like its
   words (rapidfuzz's process.extract). A place is a cluster of anchors, each of the block's words counted once:
   where they agree on where the block starts (a diagonal: two copies of a text are two places), or, when no
   diagonal holds DIAGONAL of their weight, where they lie within twice the block's length (the engine reads two
   columns' lines row by row, and a block's lines come between another's). Blocks are placed longest first, so that
   the short ones (a heading, a page number, a running footer written at the top) find what the paragraphs have
   left; a block the page repeats (another place weighs AMBIGUOUS of the best) waits, and the waiting ones are
   placed in the answer's order, each in the copy nearest where the block before it ended (running furniture:
   nearest the page's top or bottom edge).
3. Lining up. The block's keys are aligned with its place's stretch of evidence (with slack) by their longest
   common subsequence (rapidfuzz's Indel opcodes on token codes: bit-parallel, in C). Between two runs of equal
   words, what is left on both sides is compared character by character (Indel again, on the keys joined): a word
   is aligned with the evidence words its characters fall in when they lie together and it is alike enough,
   2 x matched characters over its length plus theirs (fuzz.ratio's measure; an evidence word shared with
   neighbours counts in proportion), at least FUZZY for a word of FUZZY_MIN_CHARS characters or more, exactly for a
   shorter one. That one measure takes the engine's confusions, a word split on one side only ("applica-" "tions"
   and "applications", "98 452" and "98,452") and merged words. A run of aligned words then moves to an equal run
   of tokens at most NEARER times as far from its neighbours' (the longest common subsequence takes either of two
   equal runs: a form's footer read next to its header, a "0" among many).
4. What is left. The block's unaligned runs are looked for again, while that aligns more: within the stretch its
   region and aligned words cover (a word or a cell read in another order), then, of DISTINCT_CHARS or more,
   anywhere (a piece of the block the evidence reads elsewhere), then between its aligned neighbours' places (a
   misread word). A table's runs end at its cells, so cells in any order find their own place. A placement is kept
   whole when it aligns KEEP_SHARE of its characters, else only its pieces of two words and DISTINCT_CHARS in a row:
   a few common words lined up by chance, or one word the page has elsewhere, are not support. Short words aligned
   with both neighbours unaligned are taken back: a "for the" in an invented sentence is a coincidence.

Each evidence token supports one answer word at most, so a paragraph written twice is grounded once. FIGURE blocks
(their text describes, it does not transcribe) and blocks without letters or digits are not aligned.

The answer's unsupported spans are the runs of unaligned words; a run counts towards ``ungrounded`` when it has at
least MIN_UNSUPPORTED_WORDS words or MIN_UNSUPPORTED_CHARS characters (a misread word is noise, an invented
sentence or an invented "forty million" is not). A block, or a row of a table, with at most WHOLE_SUPPORT of its
characters aligned is unsupported as a whole (``whole``): an invented paragraph or row is a small share of a dense
page's answer, but nothing of it is on the page. The missed regions are the runs of evidence words no block took,
in the evidence's order over the same or adjacent lines; a run counts towards ``missed_text`` when it has at least
MIN_MISSED_WORDS words (a stray mark or a garbage token of the engine is not a dropped passage). Text inside a
figure (an axis label) is evidence no block takes: it shows as missed.

Cost: it runs after every answer. A dense page (1,000 to 1,500 evidence words, 50 to 100 blocks) aligns in 10 to 50
ms on one core, an answer the page has nothing of (every block looked for by its words' likeness) in about 90 ms:
the quadratic work is rapidfuzz's, on stretches of the page, and Python walks each token a bounded number of times.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol

from pagescribe.grounding.keys import WORD

if TYPE_CHECKING:
    from pagescribe.layout.boxes import TextBox

_EM = 0.55  # a glyph's width in line heights, for a line box whose right edge is unknown


class GroundingSource(StrEnum):
    TEXT_LAYER = "text_layer"  # a born-digital PDF page's own text (pdfium)
    SECOND_READ = "second_read"  # the offline engine's read of the image the model was sent
    ENGINE = "engine"  # the offline engine's own answer, grounded to its own boxes


@dataclass(frozen=True)
class Box:
    """A rectangle in pixels of the page image as sent to the model, origin top left, y downwards."""

    x0: float
    y0: float
    x1: float
    y1: float

    def union(self, other: Box) -> Box:
        return Box(min(self.x0, other.x0), min(self.y0, other.y0), max(self.x1, other.x1), max(self.y1, other.y1))

    def iou(self, other: Box) -> float:
        """Intersection over union; 0.0 for boxes that do not overlap or have no area."""
        width = min(self.x1, other.x1) - max(self.x0, other.x0)
        height = min(self.y1, other.y1) - max(self.y0, other.y0)
        if width <= 0 or height <= 0:
            return 0.0
        overlap = width * height
        return overlap / (self._area() + other._area() - overlap)

    def as_list(self, digits: int = 1) -> list[float]:
        """``[x0, y0, x1, y1]`` rounded to ``digits`` decimals (for JSON)."""
        return [round(value, digits) for value in (self.x0, self.y0, self.x1, self.y1)]

    def _area(self) -> float:
        return (self.x1 - self.x0) * (self.y1 - self.y0)


@dataclass(frozen=True)
class EvidenceWord:
    """A word on the page, as the evidence reads it."""

    text: str  # as on the page
    box: Box
    line: int  # index of its line in the evidence's reading order


@dataclass(frozen=True)
class PageText:
    """The page's own positioned words: the evidence an answer is aligned to."""

    source: GroundingSource
    words: tuple[EvidenceWord, ...]  # in the evidence's reading order
    width: int  # the page image's size in pixels
    height: int
    points_per_pixel: float | None  # PDF pages: points = pixels * this (origin top left of the visible page)


class CellLike(Protocol):
    """A table cell of a block (:class:`pagescribe.blocks.Cell` is one)."""

    @property
    def row(self) -> int: ...

    @property
    def col(self) -> int: ...

    @property
    def text(self) -> str: ...


class GroundedText(Protocol):
    """What alignment needs of a block of the answer (:class:`pagescribe.blocks.Block` is one)."""

    @property
    def id(self) -> str: ...

    @property
    def type(self) -> str: ...

    @property
    def plain(self) -> str: ...

    @property
    def cells(self) -> Sequence[CellLike]: ...


@dataclass(frozen=True)
class Span:
    """A stretch of a block's ``plain``: ``plain[start:end] == text``."""

    start: int
    end: int
    text: str
    counts: bool = False  # long enough to count towards ``ungrounded`` (MIN_UNSUPPORTED_*): not a misread word


@dataclass(frozen=True)
class MissedRegion:
    """Consecutive evidence words (same or adjacent lines) that no block took."""

    text: str
    box: Box
    chars: int  # letters and digits
    counts: bool = False  # long enough to count towards ``missed_text`` (MIN_MISSED_WORDS): not a stray mark


@dataclass(frozen=True)
class BlockGrounding:
    """How one block lines up with the page; a block that is not aligned (a figure, a block without letters or
    digits) has no box, no characters and a grounding of None."""

    block_id: str
    bbox: Box | None  # the union of the boxes of its aligned words; None when nothing aligned
    grounding: float | None  # the share of the block's characters (letters and digits) aligned
    aligned_chars: int
    chars: int
    unsupported: tuple[Span, ...]  # every run of the block's words that nothing on the page supports
    cells: tuple[tuple[int, int, Box | None], ...] = ()  # tables: (row, col, bbox) per cell
    whole: tuple[WholeUnsupported, ...] = ()  # the block, or those of its table's rows, unsupported as a whole


@dataclass(frozen=True)
class WholeUnsupported:
    """A block, or a table's row, that nothing on the page supports as a whole (at most WHOLE_SUPPORT of its
    characters aligned): an invented sentence or row, however small a share of a dense page's answer it is."""

    block_id: str
    row: int | None  # the table's row (0-based, in its grid); None: the whole block
    text: str  # from its first word to its last, in the block's ``plain``
    chars: int  # letters and digits


@dataclass(frozen=True)
class PageGrounding:
    """How an answer lines up with the page's own text (see the package's docstring)."""

    source: GroundingSource
    blocks: tuple[BlockGrounding, ...]  # in the answer's order
    grounding: float  # share of the answer's characters aligned (blocks that carry page text only); 1.0 for none
    ungrounded: float  # share of the answer's characters in unsupported runs that count (MIN_UNSUPPORTED_*)
    missed_text: float  # share of the evidence's characters in missed regions that count (MIN_MISSED_WORDS)
    missed: tuple[MissedRegion, ...]  # every run of evidence words no block took

    @property
    def whole(self) -> tuple[WholeUnsupported, ...]:
        """Every block and table row of the answer unsupported as a whole, in the answer's order."""
        return tuple(unit for block in self.blocks for unit in block.whole)


def words_from_boxes(boxes: Sequence[TextBox]) -> list[EvidenceWord]:
    """OCR lines → words, each word's box a slice of its line's box proportional to its characters.

    Each box is a line of the evidence, in the order given (the engine's: rows top to bottom, two columns' lines
    side by side; the alignment finds a block's words among another's). A line taller than it is wide and of more
    than one character is vertical writing, sliced downwards. A box without a right edge is taken as wide as its
    text at about half a line height a glyph.
    """
    words = []
    for line, box in enumerate(boxes):
        right = box.right if box.right is not None else box.left + _EM * (box.bottom - box.top) * len(box.text)
        vertical = len(box.text) > 1 and box.bottom - box.top > right - box.left
        step = ((box.bottom - box.top) if vertical else (right - box.left)) / max(len(box.text), 1)
        for word in WORD.finditer(box.text):
            start, end = step * word.start(), step * word.end()
            if vertical:
                place = Box(box.left, box.top + start, right, box.top + end)
            else:
                place = Box(box.left + start, box.top, box.left + end, box.bottom)
            words.append(EvidenceWord(word.group(), place, line))
    return words


def union_of(boxes: Iterable[Box]) -> Box | None:
    """The smallest box holding all of them; None for none. Made once, not box by box: a page's missed words are
    hundreds of boxes, and a box made for each of them was a third of grounding an answer that leaves them out."""
    listed = list(boxes)
    if not listed:
        return None
    return Box(
        min(box.x0 for box in listed),
        min(box.y0 for box in listed),
        max(box.x1 for box in listed),
        max(box.y1 for box in listed),
    )


# --- stored and shown ---------------------------------------------------------------------------------------------


def evidence_as_json(page: PageText) -> dict[str, Any]:
    """The evidence as JSON (from a render process to the function): its words as ``[text, x0, y0, x1, y1, line]``."""
    return {
        "source": page.source.value,
        "width": page.width,
        "height": page.height,
        "points_per_pixel": page.points_per_pixel,
        "words": [[word.text, *word.box.as_list(2), word.line] for word in page.words],
    }


def evidence_from_json(data: Mapping[str, Any]) -> PageText:
    words = tuple(EvidenceWord(text, Box(x0, y0, x1, y1), line) for text, x0, y0, x1, y1, line in data["words"])
    return PageText(
        GroundingSource(data["source"]), words, int(data["width"]), int(data["height"]), data["points_per_pixel"]
    )


def grounding_record(result: PageGrounding, page: PageText) -> dict[str, Any]:
    """What is kept with the page's answer (``jobs.grounding``) and shown in its JSON transcript: the source, the
    image the boxes are in, the page's shares, each block's box and grounding by its id, the unsupported runs that
    count (offsets in the block's ``plain``) and the missed regions that count. Boxes are ``[x0, y0, x1, y1]`` in the
    image's pixels."""
    return {
        "source": result.source.value,
        "image": {"width": page.width, "height": page.height, "points_per_pixel": page.points_per_pixel},
        "grounding": round(result.grounding, 4),
        "ungrounded": round(result.ungrounded, 4),
        "missed_text": round(result.missed_text, 4),
        "blocks": {block.block_id: _block_record(block) for block in result.blocks},
        "missed": [
            {"text": region.text, "bbox": region.box.as_list(), "chars": region.chars}
            for region in result.missed
            if region.counts
        ],
    }


def _block_record(block: BlockGrounding) -> dict[str, Any]:
    return {
        "bbox": block.bbox.as_list() if block.bbox is not None else None,
        "grounding": round(block.grounding, 4) if block.grounding is not None else None,
        "unsupported": [[span.start, span.end] for span in block.unsupported if span.counts],
        "cells": [[row, col, box.as_list() if box is not None else None] for row, col, box in block.cells],
    }
