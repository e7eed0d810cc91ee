"""What an alignment says: each block's grounding and unsupported runs, and the page's words no block took."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from pagescribe.grounding import (
    BlockGrounding,
    Box,
    EvidenceWord,
    GroundedText,
    MissedRegion,
    Span,
    WholeUnsupported,
    union_of,
)

if TYPE_CHECKING:
    from pagescribe.grounding.evidence import Evidence
    from pagescribe.grounding.words import BlockWords

MIN_UNSUPPORTED_WORDS = 3  # a run of unaligned words counts towards ``ungrounded`` with this many words,
MIN_UNSUPPORTED_CHARS = 12  # ... or this many letters and digits
MIN_MISSED_WORDS = 3  # a run of evidence words no block took counts towards ``missed_text`` with this many words
WHOLE_SUPPORT = 0.25  # a block, or a table's row, with at most this share of its characters aligned is unsupported
# as a whole (invented, however small a share of the answer it is); a formula never is: its LaTeX is not the page's
_NOT_WHOLE = frozenset({"formula"})  # glyphs


def block_grounding(block: GroundedText, words: BlockWords, evidence: Evidence) -> tuple[BlockGrounding, int]:
    """The block's grounding, and the characters of its unsupported runs that count towards ``ungrounded``."""
    aligned = sum(len(key) for key, support in zip(words.keys, words.support, strict=True) if support)
    unsupported, counted = _unsupported(block, words)
    bbox = union_of(evidence.box(place) for support in words.support for place in support)
    cells = _cell_boxes(block, words, evidence)
    grounding = BlockGrounding(
        block.id, bbox, aligned / words.chars, aligned, words.chars, unsupported, cells, _whole(block, words)
    )
    return grounding, counted


def _unsupported(block: GroundedText, words: BlockWords) -> tuple[tuple[Span, ...], int]:
    """Every run of the block's unaligned words as a span of its ``plain``, and the characters of those that count
    towards ``ungrounded`` (MIN_UNSUPPORTED_*)."""
    unsupported, counted = [], 0
    for run in words.runs(by_cell=False):
        start, end = words.spans[run[0]][0], words.spans[run[-1]][1]
        chars = sum(len(words.keys[index]) for index in run)
        counts = len(run) >= MIN_UNSUPPORTED_WORDS or chars >= MIN_UNSUPPORTED_CHARS
        unsupported.append(Span(start, end, block.plain[start:end], counts))
        counted += chars if counts else 0
    return tuple(unsupported), counted


def _cell_boxes(block: GroundedText, words: BlockWords, evidence: Evidence) -> tuple[tuple[int, int, Box | None], ...]:
    """A table's cells: (row, col, the union of the boxes of the cell's aligned words)."""
    return tuple(
        (
            cell.row,
            cell.col,
            union_of(
                evidence.box(place)
                for support, at in zip(words.support, words.cells, strict=True)
                if at == index
                for place in support
            ),
        )
        for index, cell in enumerate(block.cells)
    )


def _whole(block: GroundedText, words: BlockWords) -> tuple[WholeUnsupported, ...]:
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


def missed_regions(evidence: Evidence) -> tuple[list[MissedRegion], int]:
    """The runs of evidence words no block took, and the characters of those that count towards ``missed_text``."""
    regions, counted = [], 0
    for run in _untaken_runs(evidence):
        chars = sum(chars for _, chars in run)
        box = union_of(word.box for word, _ in run)
        assert box is not None  # a run has a word
        counts = len(run) >= MIN_MISSED_WORDS
        regions.append(MissedRegion(" ".join(word.text for word, _ in run), box, chars, counts))
        counted += chars if counts else 0
    return regions, counted


def _untaken_runs(evidence: Evidence) -> Iterator[list[tuple[EvidenceWord, int]]]:
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
