"""The answers of a page's tiles stitched into one, in reading order, the text their overlap repeats kept once.

Tiles are horizontal bands, top to bottom, each overlapping the next (:mod:`pagescribe.transcription.tileplan`), so
the last lines of one band's answer are the first lines of the next one's, read twice and never quite alike (a model
reads a line cut at a band's edge partly or not at all; OCR noise differs). The seam between two answers is found by
aligning lines: each line of the end of the upper answer is compared with each line of the start of the lower one
(rapidfuzz's ratio on the lines normalised: lower case, markdown markup and runs of spaces removed). The lines that
match lie on one diagonal (the same shift between the two answers); the overlap is the diagonal whose matched lines
hold the most characters, among those that reach the end of the upper answer and the start of the lower one but for
a line cut at each edge (MAX_CUT_LINES). The stitched text keeps the upper answer up to the middle of the overlap and
the lower one from there on (the middle line itself from the copy that has more of it): each repeated line is taken
from the tile in which it lies farther from the edge, and the lines cut at an edge (the upper answer's last one, the
lower's first one, outside the matched run) are dropped. Two answers with no overlap found (it was blank, or read too
differently) are joined as they are.

A markdown table that runs across a seam: the lower tile shows rows without the table's header, and a model makes the
first row it sees the header, with a delimiter row (``|---|``) under it. When the upper part ends in a table row and
the lower part starts with a row and a delimiter, the delimiter is dropped (the row stays a row of the one table); and
when that first row repeats the upper table's header, it is dropped too (no header twice).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

MATCH_RATIO = 82.0  # two lines are the same line read twice at this rapidfuzz ratio (0..100) or above
MIN_MATCH_CHARS = 4  # shorter lines (a lone number, a rule) are too common to place a seam by
MAX_CUT_LINES = 1  # lines of an answer beyond the overlap, cut at its band's edge, that a seam may drop
_MARKUP = re.compile(r"[#*_`|>\-=:]+")
_SPACES = re.compile(r"\s+")
_DELIMITER = re.compile(r"^\s*\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*$")


def _normal(line: str) -> str:
    return _SPACES.sub(" ", _MARKUP.sub(" ", line.lower())).strip()


@dataclass(frozen=True)
class Seam:
    """Where two answers are joined: the upper answer's lines before ``upper_end`` and the lower answer's lines from
    ``lower_start`` on; ``matched`` lines were found read twice (0: no overlap found, the answers joined whole)."""

    upper_end: int
    lower_start: int
    matched: int


def find_seam(upper: Sequence[str], lower: Sequence[str], *, window: int) -> Seam:
    """The seam between two consecutive tiles' answers, as lines: the overlap looked for in the last ``window``
    lines of ``upper`` and the first ``window`` of ``lower``."""
    from rapidfuzz import fuzz

    first = max(0, len(upper) - window)
    tail = [(i, _normal(upper[i])) for i in range(first, len(upper))]
    head = [(j, _normal(lower[j])) for j in range(min(window, len(lower)))]
    diagonals: dict[int, list[tuple[int, int, int]]] = {}
    for i, a in tail:
        if len(a) < MIN_MATCH_CHARS:
            continue
        for j, b in head:
            if len(b) >= MIN_MATCH_CHARS and fuzz.ratio(a, b) >= MATCH_RATIO:
                diagonals.setdefault(i - j, []).append((i, j, min(len(a), len(b))))
    runs = [run for run in diagonals.values() if _at_the_edges(upper, lower, run)]
    if not runs:
        return Seam(len(upper), 0, 0)
    best = max(runs, key=lambda run: sum(chars for _, _, chars in run))
    i, j, _ = best[len(best) // 2]
    if len(_normal(upper[i])) >= len(_normal(lower[j])):  # the seam's own line from the copy that has more of it
        return Seam(i + 1, j + 1, len(best))
    return Seam(i, j, len(best))


def _at_the_edges(upper: Sequence[str], lower: Sequence[str], run: list[tuple[int, int, int]]) -> bool:
    """The matched lines reach the end of the upper answer and the start of the lower one, but for at most
    MAX_CUT_LINES lines cut at each edge: an overlap, not a line that merely recurs (a table's header)."""
    last = max(i for i, _, _ in run)
    first = min(j for _, j, _ in run)
    after = sum(bool(line.strip()) for line in upper[last + 1 :])
    before = sum(bool(line.strip()) for line in lower[:first])
    return after <= MAX_CUT_LINES and before <= MAX_CUT_LINES


def _table_row(line: str) -> bool:
    return line.strip().startswith("|")


def _cells(line: str) -> list[str]:
    return [_normal(cell) for cell in line.strip().strip("|").split("|")]


def _join_tables(kept: list[str], lower: list[str]) -> list[str]:
    """The lower part without the header a model made of a table's first visible row (see the module's docstring)."""
    above = [line for line in kept if line.strip()]
    if not above or not _table_row(above[-1]):
        return lower
    start = next((k for k, line in enumerate(lower) if line.strip()), len(lower))
    if start + 1 >= len(lower) or not _table_row(lower[start]) or not _DELIMITER.match(lower[start + 1]):
        return lower
    header = next((above[k - 1] for k in range(len(above) - 1, 0, -1) if _DELIMITER.match(above[k])), None)
    if header is not None and _cells(header) == _cells(lower[start]):
        return lower[:start] + lower[start + 2 :]
    return lower[: start + 1] + lower[start + 2 :]


def stitch(answers: Sequence[str], *, window: int | None = None) -> tuple[str, list[Seam]]:
    """The tiles' answers, top to bottom, as one text, with the seam found between each two answers that
    have text. ``window``:
    how many lines at each end of an answer the overlap is looked for in (default: half its lines, at least 8)."""
    lines: list[str] = []
    seams: list[Seam] = []
    for answer in answers:
        lower = answer.strip("\n").split("\n") if answer.strip() else []
        if not lower or not lines:
            lines = lines or lower
            continue
        span = window if window is not None else max(8, max(len(lines), len(lower)) // 2)
        seam = find_seam(lines, lower, window=span)
        seams.append(seam)
        kept = lines[: seam.upper_end]
        lines = kept + _join_tables(kept, lower[seam.lower_start :])
    return "\n".join(lines).strip(), seams
