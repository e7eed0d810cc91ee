"""A block's words being aligned: their keys, where they stand in the block and its cells, and what they took."""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pagescribe.grounding.evidence import slack_for
from pagescribe.grounding.keys import WORD, key_of

if TYPE_CHECKING:
    from pagescribe.grounding import GroundedText
    from pagescribe.grounding.evidence import Evidence


@dataclass
class BlockWords:
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
    def of(cls, block: GroundedText, evidence: Evidence) -> BlockWords:
        keys, spans = [], []
        for word in WORD.finditer(block.plain):
            if key := key_of(word.group()):
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
        slack = slack_for(len(self.keys))
        return max(min(places) - slack, 0), max(places) + 1 + slack

    def after(self, index: int) -> int | None:
        """The evidence place after the last one the words before ``index`` are aligned with; None for none."""
        places = [place for support in self.support[:index] for place in support]
        return max(places) + 1 if places else None

    def between(self, run: list[int]) -> tuple[int, int] | None:
        """The stretch of evidence between the places of the aligned words on either side of a run, with slack, when
        the run would about fit in it (a gap, not two pieces of the block read apart); None otherwise."""
        before, after = self.ends(run)
        if not before or not after or not 0 <= min(after) - max(before) <= len(run) + 2 * slack_for(len(run)):
            return None
        return max(before) + 1 - slack_for(len(run)), min(after) + slack_for(len(run))

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
