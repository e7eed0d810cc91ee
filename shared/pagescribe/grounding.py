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

import bisect
import functools
import itertools
import math
import re
import unicodedata
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol

from rapidfuzz import fuzz, process
from rapidfuzz.distance import Indel

if TYPE_CHECKING:
    from pagescribe.layout.boxes import TextBox

MIN_UNSUPPORTED_WORDS = 3  # a run of unaligned words counts towards ``ungrounded`` with this many words,
MIN_UNSUPPORTED_CHARS = 12  # ... or this many letters and digits
MIN_MISSED_WORDS = 3  # a run of evidence words no block took counts towards ``missed_text`` with this many words
FUZZY = 0.75  # a word is aligned with evidence at least this alike (2 x matched characters over both lengths),
FUZZY_MIN_CHARS = 4  # ... when it has this many characters; a shorter word only when it matches exactly
RARE = 4  # a word with at most this many untaken occurrences on the page votes for where its block is
CLUSTERS = 4  # a block is looked for in at most this many places,
DIAGONAL = 0.5  # ... those where its anchors agree on where it starts, when one holds this share of their weight
AMBIGUOUS = 0.75  # ... and the page repeats it when another place has this share of the best one's weight
KEEP_SHARE = 0.5  # a placement is kept whole when it aligns this share of its characters
WHOLE_SUPPORT = 0.25  # a block, or a table's row, with at most this share of its characters aligned is unsupported
# as a whole (invented, however small a share of the answer it is); a formula never is: its LaTeX is not the page's
_NOT_WHOLE = frozenset({"formula"})  # glyphs
DISTINCT_CHARS = 8  # words in a row with this many characters are looked for, and kept, on their own
PASSES = 3  # a block's unaligned runs are looked for again at most this many times
NEARER = 0.5  # an aligned word moves to an equal token this much nearer its neighbours' (of the NEARER_PLACES
NEARER_PLACES = 8  # ... nearest on either side in the evidence's order)
_FURNITURE = frozenset({"page_header", "page_footer", "page_number"})  # looked for at the page's top and bottom
_EM = 0.55  # a glyph's width in line heights, for a line box whose right edge is unknown
_UNKNOWN = -2  # the code of an answer key that no evidence word has
_TAKEN = -1  # the code an evidence token shows once an answer word has taken it

# A word: a CJK character alone (Han, kana, hangul), or a run of anything else but whitespace.
_CJK = "\u2e80-\u2fdf\u3040-\u312f\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
_WORD = re.compile(f"[{_CJK}]|[^\\s{_CJK}]+")


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
    """How an answer lines up with the page's own text (see the module's docstring)."""

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
        for word in _WORD.finditer(box.text):
            start, end = step * word.start(), step * word.end()
            if vertical:
                place = Box(box.left, box.top + start, right, box.top + end)
            else:
                place = Box(box.left + start, box.top, box.left + end, box.bottom)
            words.append(EvidenceWord(word.group(), place, line))
    return words


@functools.lru_cache(maxsize=1 << 16)
def _key(word: str) -> str:
    """A word as it is matched: NFKC, casefolded, without diacritics, its letters and digits only."""
    folded = unicodedata.normalize("NFKD", unicodedata.normalize("NFKC", word).casefold())
    return "".join(char for char in folded if char.isalnum())


def _union(boxes: Iterable[Box]) -> Box | None:
    union: Box | None = None
    for box in boxes:
        union = box if union is None else union.union(box)
    return union


def align(blocks: Sequence[GroundedText], evidence: PageText) -> PageGrounding:
    """The answer's blocks (in the answer's order) aligned to the page's own positioned words (see the module's
    docstring)."""
    page = _Evidence(evidence)
    words = {index: _Words.of(block, page) for index, block in enumerate(blocks) if block.type != "figure"}
    placed = {index: found for index, found in words.items() if found.keys}
    longest_first = sorted(placed, key=lambda index: -placed[index].chars)
    waiting = [index for index in longest_first if not _place(page, placed[index], None)]
    for index in sorted(waiting):  # the blocks of a text the page repeats, in the answer's order
        furniture = blocks[index].type in _FURNITURE
        _place(page, placed[index], page.edge if furniture else _towards(_after(placed, index)))
    results: list[BlockGrounding] = []
    counted = 0
    for index, block in enumerate(blocks):
        if index in placed:
            result, unsupported_chars = _block_grounding(block, placed[index], page)
            counted += unsupported_chars
        else:
            result = BlockGrounding(block.id, None, None, 0, 0, ())
        results.append(result)
    chars = sum(result.chars for result in results)
    aligned = sum(result.aligned_chars for result in results)
    missed, missed_chars = _missed(page)
    evidence_chars = sum(map(len, page.keys))
    return PageGrounding(
        evidence.source,
        tuple(results),
        grounding=aligned / chars if chars else 1.0,
        ungrounded=counted / chars if chars else 0.0,
        missed_text=missed_chars / evidence_chars if evidence_chars else 0.0,
        missed=tuple(missed),
    )


def _after(placed: dict[int, _Words], index: int) -> int:
    """The evidence place after the last one the block before ``index`` in the answer (that is aligned) took."""
    for before in range(index - 1, -1, -1):
        if before in placed and (after := placed[before].after(len(placed[before].keys))) is not None:
            return after
    return 0


class _Evidence:
    """The page's words as keyed tokens in the evidence's order (a word may be several: a CJK line), where each key
    occurs, and which tokens an answer word has taken."""

    def __init__(self, page: PageText) -> None:
        self.page = page
        self.keys: list[str] = []
        self.word: list[int] = []  # the index of the evidence word each token is part of
        for index, word in enumerate(page.words):
            for piece in _WORD.findall(word.text):
                if key := _key(piece):
                    self.keys.append(key)
                    self.word.append(index)
        self._codes: dict[str, int] = {}
        self.codes = [self._codes.setdefault(key, len(self._codes)) for key in self.keys]
        self.places: dict[int, list[int]] = {}
        for place, code in enumerate(self.codes):
            self.places.setdefault(code, []).append(place)
        self.left = {code: len(places) for code, places in self.places.items()}  # untaken occurrences
        self.size = len(self.keys)
        self.taken = bytearray(self.size)

    def code(self, key: str) -> int:
        return self._codes.get(key, _UNKNOWN)

    def box(self, place: int) -> Box:
        return self.page.words[self.word[place]].box

    def edge(self, cluster: _Cluster) -> float:
        """How far from the page's top or bottom edge a cluster's first word would be."""
        box = self.box(min(max(cluster.start, 0), self.size - 1))
        return min(box.y0, self.page.height - box.y1)

    def distance(self, place: int, others: Iterable[int]) -> float:
        """The sum of the distances between the middles of a token's box and of other tokens' boxes."""
        box = self.box(place)
        x, y = (box.x0 + box.x1) / 2, (box.y0 + box.y1) / 2
        return sum(math.hypot((b.x0 + b.x1) / 2 - x, (b.y0 + b.y1) / 2 - y) for b in map(self.box, others))

    def take(self, places: Iterable[int]) -> None:
        for place in places:
            if not self.taken[place]:
                self.taken[place] = 1
                self.left[self.codes[place]] -= 1

    def release(self, places: Iterable[int]) -> None:
        for place in places:
            if self.taken[place]:
                self.taken[place] = 0
                self.left[self.codes[place]] += 1

    def window(self, stretch: tuple[int, int]) -> list[int]:
        """The codes of the tokens of a stretch, a taken one as _TAKEN (which nothing matches)."""
        return [_TAKEN if self.taken[place] else self.codes[place] for place in range(*stretch)]

    def regions(
        self, keys: Sequence[str], codes: Sequence[int], within: tuple[int, int] | None, *, common: bool
    ) -> list[_Cluster]:
        """Where the words (their ``keys`` and ``codes``) may be, ``within`` a stretch or anywhere: the clusters of
        the untaken places of their rare words, or with ``common``, when none of them is rare, of any of them, or
        when none of them is on the page as it is, of the tokens most like them (:meth:`_alike_anchors`); most
        weight first; none when none of them is there."""
        anchors = self._anchors(codes, within, RARE)
        if not anchors and common:
            anchors = self._anchors(codes, within, None) or self._alike_anchors(keys, within)
        bottom, top = within or (0, self.size)
        slack = _slack(len(codes))
        return [
            _Cluster(weight, first, (max(first - slack, bottom, 0), min(last + len(codes) + slack, top, self.size)))
            for weight, first, last in _clusters(anchors, len(codes))
        ]

    def _alike_anchors(self, keys: Sequence[str], within: tuple[int, int] | None) -> list[tuple[int, int, float]]:
        """(place, index in ``keys``, weight) of the untaken token most like the words joined (fuzz.ratio at least
        FUZZY: a word hyphenated on one side only, "contin-" "gency" of "CONTINGENCY"), or else of the RARE most
        like each word of FUZZY_MIN_CHARS or more (fuzz.ratio at least FUZZY: a misread word; within a stretch the
        partial ratio, the word a piece of the token), weighed by one over how many there are. The partial ratio
        costs ten times as much, and is spent only where a block already is."""
        bottom, top = max(within[0], 0) if within else 0, min(within[1], self.size) if within else self.size
        choices = {place: self.keys[place] for place in range(bottom, top) if not self.taken[place]}
        whole = process.extractOne("".join(keys), choices, scorer=fuzz.ratio, score_cutoff=100 * FUZZY)
        if whole is not None:
            return [(whole[2], 0, 1.0)]
        scorer = fuzz.ratio if within is None else fuzz.partial_ratio
        anchors: list[tuple[int, int, float]] = []
        for index, key in enumerate(keys):
            if len(key) >= FUZZY_MIN_CHARS:
                found = process.extract(key, choices, scorer=scorer, score_cutoff=100 * FUZZY, limit=RARE)
                anchors.extend((place, index, 1 / len(found)) for _, _, place in found)
        return anchors

    def _anchors(
        self, codes: Sequence[int], within: tuple[int, int] | None, rare: int | None
    ) -> list[tuple[int, int, float]]:
        """(place, index in ``codes``, weight) for each untaken place of each word with at most ``rare`` untaken
        occurrences (any number with None), weighed by one over its occurrences."""
        anchors: list[tuple[int, int, float]] = []
        for index, code in enumerate(codes):
            left = self.left.get(code, 0)
            if left == 0 or (rare is not None and left > rare):
                continue
            places = self.places[code]
            if within is not None:
                places = places[bisect.bisect_left(places, within[0]) : bisect.bisect_left(places, within[1])]
            anchors.extend((place, index, 1 / left) for place in places if not self.taken[place])
        return anchors


def _slack(words: int) -> int:
    """Tokens of evidence looked at beyond the ends of where ``words`` words seem to be."""
    return 4 + words // 8


@dataclass(frozen=True)
class _Cluster:
    """A place where a block (or a run of its words) may be: the weight of the anchors that put it there, where they
    put its first word, and the stretch of evidence to align it with (slack around it)."""

    weight: float
    start: int
    stretch: tuple[int, int]


def _clusters(anchors: list[tuple[int, int, float]], words: int) -> list[tuple[float, int, int]]:
    """Up to CLUSTERS places where ``words`` words may be, from anchors (place, index among the words, weight):
    (weight, where its anchors put the first word at the earliest, ... at the latest).

    A block is where its anchors agree on where it starts (place - index, within twice the slack): such a diagonal
    tells two copies of a text apart. When no diagonal holds DIAGONAL of the anchors' weight, the evidence reads the
    block's lines between another's (an engine reading two columns row by row), and the block is where its anchors
    lie close together, within twice its length."""
    slack = _slack(words)
    diagonals = _heaviest_each([(place - index, index, weight) for place, index, weight in anchors], 2 * slack)
    whole = sum({index: weight for _, index, weight in anchors}.values())
    if diagonals and diagonals[0][0] >= DIAGONAL * whole:
        return [(weight, min(run)[0], max(run)[0]) for weight, run in diagonals]
    return [
        (weight, min(place - index for place, index, _ in run), max(place - index for place, index, _ in run))
        for weight, run in _heaviest_each(anchors, 2 * (words + slack))
    ]


def _heaviest_each(
    anchors: list[tuple[int, int, float]], reach: int
) -> list[tuple[float, list[tuple[int, int, float]]]]:
    """Up to CLUSTERS runs of anchors (coordinate, index, weight), each the heaviest (:func:`_heaviest`) of those
    left outside the runs before it, with its weight."""
    anchors = sorted(anchors)
    found: list[tuple[float, list[tuple[int, int, float]]]] = []
    while anchors and len(found) < CLUSTERS:
        weight, first, last = _heaviest(anchors, reach)
        found.append((weight, anchors[first : last + 1]))
        low, high = anchors[first][0], anchors[last][0]
        anchors = [anchor for anchor in anchors if not low <= anchor[0] <= high]
    return found


def _heaviest(anchors: Sequence[tuple[int, int, float]], reach: int) -> tuple[float, int, int]:
    """(weight, first, last) of the run of anchors (sorted) within ``reach`` of each other whose
    words weigh most, each word counted once (two copies of a text weigh as one), the run as short as that weight
    allows."""
    best, first, last = 0.0, 0, 0
    total, start = 0.0, 0
    counts: dict[int, int] = {}  # anchors of each word in the run
    for end, (place, index, weight) in enumerate(anchors):
        counts[index] = counts.get(index, 0) + 1
        total += weight if counts[index] == 1 else 0.0
        while place - anchors[start][0] > reach or counts[anchors[start][1]] > 1:
            counts[anchors[start][1]] -= 1
            total -= anchors[start][2] if counts[anchors[start][1]] == 0 else 0.0
            start += 1
        if total > best + 1e-9:
            best, first, last = total, start, end
    return best, first, last


def _choose(clusters: Sequence[_Cluster], prefer: Callable[[_Cluster], float] | None, *, wait: bool) -> _Cluster | None:
    """The cluster to align with: the heaviest, unless others come close to it (AMBIGUOUS of its weight: a text
    repeated on the page); then of those the one ``prefer`` puts first, and None (the block waits for its
    neighbours) when ``wait`` and there is no ``prefer``."""
    rivals = [cluster for cluster in clusters if cluster.weight >= AMBIGUOUS * clusters[0].weight]
    if len(rivals) == 1 or (prefer is None and not wait):
        return clusters[0]
    return None if prefer is None else min(rivals, key=prefer)


def _towards(place: int | None) -> Callable[[_Cluster], float] | None:
    """Clusters nearest a place of the evidence first."""
    return None if place is None else lambda cluster: abs(cluster.start - place)


@dataclass
class _Words:
    """A block's words being aligned: their keys and codes, where each is in the block's ``plain``, the table cell
    each is in (an index into the block's cells; -1 outside any), and the evidence places each is aligned with
    (empty while it is not), and the stretch of evidence the block as a whole was aligned with."""

    keys: list[str]
    codes: list[int]
    spans: list[tuple[int, int]]
    cells: list[int]
    support: list[list[int]]
    region: tuple[int, int] | None = None  # the stretch of evidence the block as a whole was aligned with

    @classmethod
    def of(cls, block: GroundedText, evidence: _Evidence) -> _Words:
        keys, spans = [], []
        for word in _WORD.finditer(block.plain):
            if key := _key(word.group()):
                keys.append(key)
                spans.append(word.span())
        codes = [evidence.code(key) for key in keys]
        return cls(keys, codes, spans, _cells_of(block, spans), [[] for _ in keys])

    @property
    def chars(self) -> int:
        return sum(map(len, self.keys))

    def runs(self, *, by_cell: bool) -> Iterator[list[int]]:
        """Maximal runs of unaligned words (their indices), ended at a table's cells when ``by_cell``."""
        run: list[int] = []
        for index, places in enumerate(self.support):
            if run and (places or (by_cell and self.cells[run[-1]] != self.cells[index])):
                yield run
                run = []
            if not places:
                run.append(index)
        if run:
            yield run

    def stretch(self) -> tuple[int, int] | None:
        """The stretch of evidence the block's region and its aligned words cover, with slack; None when it has
        neither (a table whose cells are in another order aligns little as a whole: its cells are looked for in its
        region)."""
        places = [place for support in self.support for place in support] + list(self.region or ())
        if not places:
            return None
        slack = _slack(len(self.keys))
        return max(min(places) - slack, 0), max(places) + 1 + slack

    def after(self, index: int) -> int | None:
        """The evidence place after the last one the words before ``index`` are aligned with; None for none."""
        places = [place for support in self.support[:index] for place in support]
        return max(places) + 1 if places else None

    def between(self, run: list[int]) -> tuple[int, int] | None:
        """The stretch of evidence between the places of the aligned words on either side of a run, with slack, when
        the run would about fit in it (a gap, not two pieces of the block read apart); None otherwise."""
        before, after = self.ends(run)
        if not before or not after or not 0 <= min(after) - max(before) <= len(run) + 2 * _slack(len(run)):
            return None
        return max(before) + 1 - _slack(len(run)), min(after) + _slack(len(run))

    def ends(self, members: list[int]) -> tuple[list[int], list[int]]:
        """The places the aligned words nearest before and after the words ``members`` (in one cell) took: in their
        cell, or when it has none, in the block."""
        around = (range(members[0] - 1, -1, -1), range(members[-1] + 1, len(self.keys)))
        before, after = (self._first(indices, self.cells[members[0]]) for indices in around)
        if before or after:
            return before, after
        before, after = (self._first(indices, None) for indices in around)
        return before, after

    def _first(self, indices: Iterable[int], cell: int | None) -> list[int]:
        """The places the first aligned word of ``indices`` took, if it comes before any word of a cell other than
        ``cell`` (any cell: None)."""
        for index in indices:
            if cell is not None and self.cells[index] != cell:
                break
            if self.support[index]:
                return self.support[index]
        return []

    def near(self, run: list[int]) -> int | None:
        """Where in the evidence a run of unaligned words should be: after the aligned word before it in its cell,
        before the one after it, else after the block's aligned words before it; None when there are none."""
        before, after = self.ends(run)
        if before or after:
            return max(before) + 1 if before else min(after) - len(run)
        return self.after(run[0])

    def pieces(self) -> Iterator[list[int]]:
        """Maximal runs of aligned words, each in one cell."""
        piece: list[int] = []
        for index, places in enumerate(self.support):
            if piece and (not places or self.cells[piece[-1]] != self.cells[index]):
                yield piece
                piece = []
            if places:
                piece.append(index)
        if piece:
            yield piece

    def alone(self, piece: list[int]) -> bool:
        """The words have a neighbour in their block (their cell), and no neighbour of theirs is aligned."""
        neighbours = [
            n
            for n in (piece[0] - 1, piece[-1] + 1)
            if 0 <= n < len(self.keys) and self.cells[n] == self.cells[piece[0]]
        ]
        return bool(neighbours) and not any(self.support[n] for n in neighbours)


def _cells_of(block: GroundedText, spans: Sequence[tuple[int, int]]) -> list[int]:
    """The cell each word (at ``spans`` in the block's ``plain``) is in: each cell's text is looked for in ``plain``
    after the one before it (anywhere when it is not there); -1 for a word in none, or in a block without cells."""
    ranges: list[tuple[int, int, int]] = []  # start, end, cell
    after = 0
    for index, cell in enumerate(block.cells):
        text = cell.text.strip()
        start = block.plain.find(text, after) if text else -1
        if text and start < 0:
            start = block.plain.find(text)
        if start >= 0:
            ranges.append((start, start + len(text), index))
            after = start + len(text)
    ranges.sort()
    starts = [start for start, _, _ in ranges]
    cells = []
    for start, _ in spans:
        at = bisect.bisect_right(starts, start) - 1
        cells.append(ranges[at][2] if at >= 0 and start < ranges[at][1] else -1)
    return cells


def _place(evidence: _Evidence, words: _Words, prefer: Callable[[_Cluster], float] | None) -> bool:
    """Align a block's words: the block where its rare words are (where ``prefer`` is least when the page repeats
    it; False when it does and there is no ``prefer``: the block waits), then its unaligned runs again while that
    aligns more (:func:`_again`); short words aligned alone are taken back."""
    everything = list(range(len(words.keys)))
    if _try(evidence, words, everything, None, prefer=prefer, primary=True) is None:
        return False
    for _ in range(PASSES):
        if not _again(evidence, words, everything):
            break
    for piece in list(words.pieces()):
        if all(len(words.keys[index]) < FUZZY_MIN_CHARS for index in piece) and words.alone(piece):
            for index in piece:
                evidence.release(words.support[index])
                words.support[index] = []
    return True


def _again(evidence: _Evidence, words: _Words, everything: list[int]) -> int:
    """Look for a block's unaligned runs again: where their rare words are within the stretch the block's aligned
    words cover (a word or a cell read in another order), then, with DISTINCT_CHARS, anywhere (a piece of the block
    the evidence has elsewhere), then between the places of the aligned words on either side (a misread word). How
    many words that aligned."""
    aligned = 0
    stretch = words.stretch()
    for run in list(words.runs(by_cell=True)):
        aligned += _try(evidence, words, run, stretch, prefer=_towards(words.near(run))) or 0
    for run in list(words.runs(by_cell=True)):
        if run != everything and sum(len(words.keys[index]) for index in run) >= DISTINCT_CHARS:
            aligned += _try(evidence, words, run, None, prefer=_towards(words.near(run)), common=False) or 0
    for run in list(words.runs(by_cell=True)):
        aligned += _align_at(evidence, words, run, words.between(run))
    return aligned


def _try(
    evidence: _Evidence,
    words: _Words,
    members: list[int],
    within: tuple[int, int] | None,
    *,
    prefer: Callable[[_Cluster], float] | None,
    primary: bool = False,
    common: bool = True,
) -> int | None:
    """Align the words ``members`` (indices, in order) where their rare words are, ``within`` a stretch or
    anywhere (of several places, the one :func:`_choose` picks, then the others until one keeps something): how
    many aligned, None when they wait for their neighbours. The ``primary`` placement, the whole block's, waits when
    the page repeats the block and there is no ``prefer``, and the stretch it aligns in is the block's region."""
    codes = [words.codes[index] for index in members]
    clusters = evidence.regions([words.keys[index] for index in members], codes, within, common=common)
    chosen = _choose(clusters, prefer, wait=primary) if clusters else None
    if chosen is None:
        return None if clusters else 0
    for cluster in [chosen, *(cluster for cluster in clusters if cluster is not chosen)]:
        if aligned := _align_at(evidence, words, members, cluster.stretch):
            if primary:
                words.region = cluster.stretch
            return aligned
    return 0


def _align_at(evidence: _Evidence, words: _Words, members: list[int], stretch: tuple[int, int] | None) -> int:
    """Align the words ``members`` with a stretch of evidence, keeping what :func:`_kept` keeps: how many aligned."""
    if stretch is None:
        return 0
    keys = [words.keys[index] for index in members]
    codes = [words.codes[index] for index in members]
    matches = _kept(keys, _match(evidence, keys, codes, stretch, words.ends(members)))
    for index, places in matches.items():
        words.support[members[index]] = places
        evidence.take(places)
    return len(matches)


def _kept(keys: Sequence[str], matches: dict[int, list[int]]) -> dict[int, list[int]]:
    """What a placement keeps: all of it when it aligns at least KEEP_SHARE of the words' characters, else its
    pieces of two words and DISTINCT_CHARS characters or more (words in a row aligned with tokens in a row, give or
    take one): a few common words a longest common subsequence picks out of unrelated text, or one word the page
    has elsewhere, are no piece."""
    if sum(len(keys[index]) for index in matches) >= KEEP_SHARE * sum(map(len, keys)):
        return matches
    kept: dict[int, list[int]] = {}
    piece: list[int] = []
    for index in [*sorted(matches), -2]:
        if piece and not (index == piece[-1] + 1 and 0 < min(matches[index]) - max(matches[piece[-1]]) <= 2):
            if len(piece) > 1 and sum(len(keys[word]) for word in piece) >= DISTINCT_CHARS:
                kept.update((word, matches[word]) for word in piece)
            piece = []
        piece.append(index)
    return kept


def _match(
    evidence: _Evidence,
    keys: Sequence[str],
    codes: Sequence[int],
    stretch: tuple[int, int],
    ends: tuple[list[int], list[int]],
) -> dict[int, list[int]]:
    """The words (their ``keys`` and ``codes``) aligned with the untaken tokens of a stretch of evidence: equal words
    by their longest common subsequence, the words between two runs of equal ones by their characters
    (:func:`_alike`), then moved nearer their neighbours (:func:`_nearer`; ``ends``: the places the block's aligned
    words just before and after them took). Each aligned word's index → the evidence places it lines up with."""
    lo, hi = max(stretch[0], 0), min(stretch[1], evidence.size)
    window = evidence.window((lo, hi))
    matches: dict[int, list[int]] = {}
    for equal, group in itertools.groupby(Indel.opcodes(codes, window), key=lambda op: op.tag == "equal"):
        ops = list(group)
        if equal:
            for op in ops:
                matches.update((op.src_start + k, [lo + op.dest_start + k]) for k in range(op.src_end - op.src_start))
            continue
        start, places = ops[0].src_start, [lo + j for j in range(ops[0].dest_start, ops[-1].dest_end)]
        places = [place for place in places if not evidence.taken[place]]
        for index, others in _alike(keys[start : ops[-1].src_end], [evidence.keys[place] for place in places]):
            matches[start + index] = [places[other] for other in others]
    _nearer(evidence, matches, (lo, hi), ends)
    return matches


def _nearer(
    evidence: _Evidence, matches: dict[int, list[int]], stretch: tuple[int, int], ends: tuple[list[int], list[int]]
) -> None:
    """Move each piece of words aligned with consecutive tokens (one each) to another untaken run of tokens of the
    stretch with the same keys, starting at one of the NEARER_PLACES occurrences of its first nearest (on either
    side) its place or the places of the words next to the piece, when that run is at most NEARER times as far from
    those words' tokens: a longest common subsequence takes either of two equal runs, a form's footer may be read
    next to its header, and a table has many a "0"."""
    used = {place for places in matches.values() for place in places}
    for piece, before, after in _pieces(matches, ends):
        if not before and not after:
            continue
        first = matches[piece[0]][0]
        codes = [evidence.codes[first + offset] for offset in range(len(piece))]
        same = evidence.places[codes[0]]
        middle = bisect.bisect_left(same, first)
        candidates = [
            start
            for start in same[max(middle - NEARER_PLACES, 0) : middle + NEARER_PLACES + 1]
            if stretch[0] <= start
            and start + len(piece) <= stretch[1]
            and all(
                evidence.codes[start + offset] == code
                and not evidence.taken[start + offset]
                and start + offset not in used
                for offset, code in enumerate(codes)
            )
        ]
        if not candidates:
            continue
        far = functools.partial(_far, evidence, len(piece), before, after)
        best = min(candidates, key=far)
        if far(best) < NEARER * far(first):
            used.difference_update(range(first, first + len(piece)))
            used.update(range(best, best + len(piece)))
            matches.update((index, [best + offset]) for offset, index in enumerate(piece))


def _pieces(
    matches: dict[int, list[int]], ends: tuple[list[int], list[int]]
) -> Iterator[tuple[list[int], list[int], list[int]]]:
    """Each run of words aligned with one token each, consecutive on both sides, with the places the aligned words
    just before and after it took (``ends`` beyond the first and the last)."""
    order = sorted(matches)
    start = 0
    for end, index in enumerate(order):
        following = order[end + 1] if end + 1 < len(order) else None
        if (
            following is not None
            and following == index + 1
            and len(matches[index]) == len(matches[following]) == 1
            and matches[following][0] == matches[index][0] + 1
        ):
            continue
        if all(len(matches[word]) == 1 for word in order[start : end + 1]):
            before = matches[order[start - 1]] if start else ends[0]
            yield order[start : end + 1], before, matches[following] if following is not None else ends[1]
        start = end + 1


def _far(evidence: _Evidence, length: int, before: list[int], after: list[int], start: int) -> float:
    """How far a run of ``length`` tokens from ``start`` is from the places of the words before and after it."""
    return evidence.distance(start, before) + evidence.distance(start + length - 1, after)


def _alike(keys: Sequence[str], others: Sequence[str]) -> list[tuple[int, list[int]]]:
    """The words ``keys`` that line up with words ``others`` character by character (their keys joined, aligned by
    their longest common subsequence), each with the indices of the others its characters fall in.

    A word lines up when its matched characters lie together (over at most its length and two) and 2 x them over
    its length plus the others' is at least FUZZY (exactly 1 for a word shorter than FUZZY_MIN_CHARS): fuzz.ratio's
    measure, with another word shared by several of them counted in proportion to what each matched of it ("98"
    and "452" each line up with "98452"; "a" does not with "cat")."""
    if not keys or not others:
        return []
    shared, covered, reach = _shared(keys, others)
    matched = [0] * len(keys)
    spread = [0.0] * len(keys)  # the characters of the others each word's matched characters stand for
    touched: dict[int, list[int]] = {}
    for (word, other), count in shared.items():
        matched[word] += count
        spread[word] += len(others[other]) * count / covered[other]
        touched.setdefault(word, []).append(other)
    return [
        (word, found)
        for word, found in touched.items()
        if reach[word][1] - reach[word][0] < len(keys[word]) + 2
        and _similar(len(keys[word]), 2 * matched[word] / (len(keys[word]) + spread[word]))
    ]


def _shared(
    keys: Sequence[str], others: Sequence[str]
) -> tuple[dict[tuple[int, int], int], list[int], dict[int, tuple[int, int]]]:
    """The characters each word of ``keys`` shares with each of ``others`` (by the longest common subsequence of
    their keys joined), the characters of each of the others matched, and where in the others' joined keys each
    word's matched characters start and end."""
    owner = [index for index, key in enumerate(keys) for _ in key]
    owner_other = [index for index, key in enumerate(others) for _ in key]
    shared: dict[tuple[int, int], int] = {}
    covered = [0] * len(others)
    reach: dict[int, tuple[int, int]] = {}
    for block in Indel.opcodes("".join(keys), "".join(others)).as_matching_blocks():
        for offset in range(block.size):
            word, other = owner[block.a + offset], owner_other[block.b + offset]
            shared[word, other] = shared.get((word, other), 0) + 1
            covered[other] += 1
            reach[word] = (reach.get(word, (block.b + offset,))[0], block.b + offset)
    return shared, covered, reach


def _similar(length: int, similarity: float) -> bool:
    return similarity >= FUZZY if length >= FUZZY_MIN_CHARS else similarity >= 1 - 1e-9


def _block_grounding(block: GroundedText, words: _Words, evidence: _Evidence) -> tuple[BlockGrounding, int]:
    """The block's grounding, and the characters of its unsupported runs that count towards ``ungrounded``."""
    aligned = sum(len(key) for key, support in zip(words.keys, words.support, strict=True) if support)
    unsupported, counted = [], 0
    for run in words.runs(by_cell=False):
        start, end = words.spans[run[0]][0], words.spans[run[-1]][1]
        chars = sum(len(words.keys[index]) for index in run)
        counts = len(run) >= MIN_UNSUPPORTED_WORDS or chars >= MIN_UNSUPPORTED_CHARS
        unsupported.append(Span(start, end, block.plain[start:end], counts))
        counted += chars if counts else 0
    cells = tuple(
        (
            cell.row,
            cell.col,
            _union(
                evidence.box(place)
                for support, at in zip(words.support, words.cells, strict=True)
                if at == index
                for place in support
            ),
        )
        for index, cell in enumerate(block.cells)
    )
    bbox = _union(evidence.box(place) for support in words.support for place in support)
    grounding = BlockGrounding(
        block.id, bbox, aligned / words.chars, aligned, words.chars, tuple(unsupported), cells, _whole(block, words)
    )
    return grounding, counted


def _whole(block: GroundedText, words: _Words) -> tuple[WholeUnsupported, ...]:
    """The block, or each row of its table, when at most WHOLE_SUPPORT of its characters are aligned."""
    if block.type in _NOT_WHOLE:
        return ()
    units: dict[int | None, list[int]] = {}
    for index, cell in enumerate(words.cells):
        if not block.cells:
            units.setdefault(None, []).append(index)
        elif cell >= 0:  # a table's words outside its cells (none in a well-formed table) are no row's
            units.setdefault(block.cells[cell].row, []).append(index)
    found = []
    for row, members in units.items():
        chars = sum(len(words.keys[index]) for index in members)
        aligned = sum(len(words.keys[index]) for index in members if words.support[index])
        if chars and aligned <= WHOLE_SUPPORT * chars:
            start, end = words.spans[members[0]][0], words.spans[members[-1]][1]
            found.append(WholeUnsupported(block.id, row, block.plain[start:end], chars))
    return tuple(found)


def _missed(evidence: _Evidence) -> tuple[list[MissedRegion], int]:
    """The runs of evidence words no block took, and the characters of those that count towards ``missed_text``."""
    regions, counted = [], 0
    for run in _untaken_runs(evidence):
        chars = sum(chars for _, chars in run)
        box = _union(word.box for word, _ in run)
        assert box is not None  # a run has a word
        counts = len(run) >= MIN_MISSED_WORDS
        regions.append(MissedRegion(" ".join(word.text for word, _ in run), box, chars, counts))
        counted += chars if counts else 0
    return regions, counted


def _untaken_runs(evidence: _Evidence) -> Iterator[list[tuple[EvidenceWord, int]]]:
    """Maximal runs of evidence words with letters or digits that no block took (each with its characters),
    consecutive in the evidence's order over the same or adjacent lines."""
    chars = [0] * len(evidence.page.words)
    taken = [False] * len(evidence.page.words)
    for place, key in enumerate(evidence.keys):
        chars[evidence.word[place]] += len(key)
        taken[evidence.word[place]] |= bool(evidence.taken[place])
    run: list[tuple[EvidenceWord, int]] = []
    for word, count, took in zip(evidence.page.words, chars, taken, strict=True):
        if not count:
            continue
        if run and (took or abs(word.line - run[-1][0].line) > 1):
            yield run
            run = []
        if not took:
            run.append((word, count))
    if run:
        yield run


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
