"""The answers of a page's tiles stitched into one, in reading order, the text their overlap repeats kept once.

Tiles are horizontal bands, top to bottom, each overlapping the next (:mod:`pagescribe.transcription.tileplan`), so
the last lines of one band's answer are the first lines of the next one's, read twice and never quite alike (a model
reads a line cut at a band's edge partly or not at all; OCR noise differs; one tile may answer a table in HTML, the
next in markdown). The overlap between two answers is found by aligning their lines of text: each line of the end of
the upper answer is compared with each line of the start of the lower one (rapidfuzz's ratio on the lines normalised:
lower case; HTML tags, dot leaders, markdown markup and runs of spaces removed; lines left with fewer than
MIN_MATCH_CHARS characters, such as a blank line, a delimiter row or a closing tag, take no part). The overlap is
the chain of matched lines (each after the one before in both answers: a line one answer splits in two or leaves out
shifts the rest, and is still one overlap) that holds the most characters, among those that reach the end of the upper
answer and the start of the lower one but for a line cut at each edge (MAX_CUT_LINES; a single matched line must be
the very last and first: a line that merely recurs, such as a table's header, is no overlap).

The stitched text is the upper answer up to the overlap, then each line read twice from the copy that holds more of
it (keep the longer copy: a line is read worse near a band's edge), the lines between two matched ones from the
answer with more text there, then the lower answer from the overlap on; the lines beyond the overlap at the edges
(cut) are dropped. Two answers with no overlap found (it was blank, or read too differently) are joined as they are.

Tables across a seam: an HTML table whose ``<table>`` or ``</table>`` fell with the cut lines is opened and closed
again, once. A markdown table that runs across a seam: the lower tile shows rows without the table's header, and a
model makes the first row it sees the header, with a delimiter row (``| --- |``) under it. A delimiter row inside a
table (not under its first row) is dropped, so that row stays a row of the one table; and when that row repeats the
table's header, it is dropped too (no header twice).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

MATCH_RATIO = 82.0  # two lines are the same line read twice at this rapidfuzz ratio (0..100) or above
MIN_MATCH_CHARS = 4  # shorter lines (a lone number, a rule) are too common to place a seam by
MAX_CUT_LINES = 1  # lines of an answer beyond the overlap, cut at its band's edge, that a seam may drop
_TAGS = re.compile(r"<[^>]*>")  # an HTML table's tags: one tile may answer a table in HTML, the next in markdown
_LEADERS = re.compile(r"[.\u2026\u00b7]{2,}")  # dot leaders: their length is where the band cut them
_MARKUP = re.compile(r"[#*_`|>\-=:]+")
_SPACES = re.compile(r"\s+")
_DELIMITER = re.compile(r"^\s*\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*$")


def _normal(line: str) -> str:
    return _SPACES.sub(" ", _MARKUP.sub(" ", _LEADERS.sub(" ", _TAGS.sub(" ", line.lower())))).strip()


@dataclass(frozen=True)
class _Match:
    """A line of the upper answer read again in the lower: their indices among all lines (``i``, ``j``) and among
    the lines of text (``at``, ``bt``), and the characters it holds."""

    i: int
    j: int
    at: int
    bt: int
    chars: int


def _text_lines(lines: Sequence[str], indices: range) -> list[tuple[int, str]]:
    """The lines at ``indices`` that hold text enough to be matched (MIN_MATCH_CHARS, normalised), with their index:
    the seam is aligned on these alone, so that a table's tags, a delimiter row or a blank line one tile has and the
    other has not shift nothing."""
    normal = ((index, _normal(lines[index])) for index in indices)
    return [(index, text) for index, text in normal if len(text) >= MIN_MATCH_CHARS]


def _overlap(upper: Sequence[str], lower: Sequence[str], window: int) -> list[_Match]:
    """The lines of the end of ``upper`` (its last ``window``) read again at the start of ``lower`` (its first
    ``window``), in order: the chain of matched lines holding the most characters that reaches both edges (see the
    module's docstring); none when there is none."""
    from rapidfuzz import fuzz

    tail = _text_lines(upper, range(max(0, len(upper) - window), len(upper)))
    head = _text_lines(lower, range(min(window, len(lower))))
    matches = [
        _Match(i, j, at, bt, min(len(a), len(b)))
        for at, (i, a) in enumerate(tail)
        for bt, (j, b) in enumerate(head)
        if fuzz.ratio(a, b) >= MATCH_RATIO
    ]
    chains = _chains(matches)
    return max((chain for chain in chains if _reaches_the_edges(chain, len(tail))), key=_weight, default=[])


def _weight(chain: list[_Match]) -> int:
    return sum(match.chars for match in chain)


def _chains(matches: list[_Match]) -> list[list[_Match]]:
    """For each match, the heaviest chain of matches ending in it, each line after the one before in both answers
    (a line one answer splits in two, or leaves out, shifts the rest of the overlap: it is still one overlap). A
    chain starts only where the lower answer's cut lines end (MAX_CUT_LINES)."""
    best: list[list[_Match]] = []
    for match in matches:  # in the upper answer's order, then the lower's
        before = [chain for chain in best if chain[-1].at < match.at and chain[-1].bt < match.bt]
        if before:
            best.append([*max(before, key=_weight), match])
        elif match.bt <= MAX_CUT_LINES:
            best.append([match])
    return best


def _reaches_the_edges(run: list[_Match], tail: int) -> bool:
    """At most MAX_CUT_LINES lines of text after the run in the upper answer and before it in the lower one (the lines
    cut at the bands' edges), and none for a run of one line: an overlap, not a line that merely recurs."""
    after, before = tail - 1 - run[-1].at, run[0].bt
    allowed = MAX_CUT_LINES if len(run) > 1 else 0
    return after <= allowed and before <= allowed


def _text(lines: Sequence[str]) -> int:
    return sum(len(_normal(line)) for line in lines)


def _merged(upper: Sequence[str], lower: Sequence[str], run: list[_Match]) -> list[str]:
    """The two answers as one: the upper up to the overlap, then each line read twice from the copy that holds more
    of it (a line is read worse near a band's edge), the lines between two of them from the answer that has more text
    there, then the lower from the overlap on. The lines beyond the overlap at the edges (cut) are dropped."""
    lines = list(upper[: run[0].i])
    for match, following in zip(run, [*run[1:], None], strict=True):
        mine, theirs = upper[match.i], lower[match.j]
        lines.append(mine if _text([mine]) >= _text([theirs]) else theirs)
        if following is not None:
            gap_upper, gap_lower = upper[match.i + 1 : following.i], lower[match.j + 1 : following.j]
            lines += gap_upper if _text(gap_upper) >= _text(gap_lower) else gap_lower
    return lines + list(lower[run[-1].j + 1 :])


def _table_row(line: str) -> bool:
    return line.strip().startswith("|")


def _cells(line: str) -> list[str]:
    return [_normal(cell) for cell in line.strip().strip("|").split("|")]


def _one_header(lines: list[str]) -> list[str]:
    """The lines without the header a model made of the first row of a markdown table it saw in the lower tile: a
    delimiter row inside a table (not under its first row) is dropped, and the row above it too when it repeats the
    table's header (see the module's docstring)."""
    out: list[str] = []
    header: str | None = None  # the first row of the table the lines are in
    for line in lines:
        row = _table_row(line)
        if not row:
            header = None
        elif header is None:
            header = line
        if _DELIMITER.match(line) and len(out) >= 2 and _table_row(out[-1]) and _table_row(out[-2]):
            if header is not None and _cells(out[-1]) == _cells(header):
                out.pop()
            continue
        out.append(line)
    return out


_ROW_TAGS = ("<tr", "<td", "<th")


def _html_tables_closed(lines: list[str]) -> list[str]:
    """The lines with every HTML table opened and closed once: a seam may fall inside a table one tile answered in
    HTML, dropping its ``</table>`` with the upper tile's cut lines or its ``<table>`` with the lower's. A table left
    open closes before the next line of text that is no markup, or at the end."""
    out: list[str] = []
    inside = False
    for line in lines:
        emitted, inside = _table_line(line, inside)
        out += emitted
    return [*out, "</table>"] if inside else out


def _table_line(line: str, inside: bool) -> tuple[list[str], bool]:
    """A line as :func:`_html_tables_closed` writes it (with a tag added before it, or dropped), and whether a
    table is open after it."""
    low = line.lower().strip()
    opens, closes = "<table" in low, "</table>" in low
    before: list[str] = []
    if inside and (opens or (low and "<" not in low)):  # a table again, or text after the table
        before, inside = ["</table>"], False
    if not inside and not opens and low.startswith(_ROW_TAGS):
        before, inside = [*before, "<table>"], True
    if not inside and closes and not opens:  # a closing tag with nothing open
        return before, False
    return [*before, line], (inside or opens) and not (closes and low.rfind("</table>") > low.rfind("<table"))


def stitch(answers: Sequence[str], *, window: int | None = None) -> tuple[str, list[int]]:
    """The tiles' answers, top to bottom, as one text, and how many lines each seam found read twice (0: no overlap
    found), one seam between each two answers that have text.
    ``window``: how many lines at each end of an answer the overlap is looked for in (default: half the lines of the
    longer, at least 8)."""
    lines: list[str] = []
    seams: list[int] = []
    for answer in answers:
        lower = answer.strip("\n").split("\n") if answer.strip() else []
        if not lower or not lines:
            lines = lines or lower
            continue
        run = _overlap(lines, lower, window if window is not None else max(8, max(len(lines), len(lower)) // 2))
        seams.append(len(run))
        lines = _merged(lines, lower, run) if run else lines + lower
    return "\n".join(_one_header(_html_tables_closed(lines))).strip(), seams
