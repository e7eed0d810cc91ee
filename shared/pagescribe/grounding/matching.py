"""Lining a block's words up with a stretch of evidence (step 3): equal words, then alike ones, then nearer ones."""

from __future__ import annotations

import bisect
import functools
import itertools
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from rapidfuzz.distance import Indel

from pagescribe.grounding.keys import similar

if TYPE_CHECKING:
    from rapidfuzz.distance import Opcode

    from pagescribe.grounding.evidence import Evidence

KEEP_SHARE = 0.5  # a placement is kept whole when it aligns this share of its characters
DISTINCT_CHARS = 8  # words in a row with this many characters are looked for, and kept, on their own
NEARER = 0.5  # an aligned word moves to an equal token this much nearer its neighbours' (of the NEARER_PLACES
NEARER_PLACES = 8  # ... nearest on either side in the evidence's order)


def kept_matches(keys: Sequence[str], matches: dict[int, list[int]]) -> dict[int, list[int]]:
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


def match_stretch(
    evidence: Evidence,
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
        matches.update(_equal_words(ops, lo) if equal else _alike_words(evidence, keys, ops, lo))
    _nearer(evidence, matches, (lo, hi), ends)
    return matches


def _equal_words(ops: Sequence[Opcode], lo: int) -> Iterator[tuple[int, list[int]]]:
    """The words of a run of equal opcodes, each with the one token it equals (``lo``: where the window starts)."""
    for op in ops:
        for offset in range(op.src_end - op.src_start):
            yield op.src_start + offset, [lo + op.dest_start + offset]


def _alike_words(
    evidence: Evidence, keys: Sequence[str], ops: Sequence[Opcode], lo: int
) -> Iterator[tuple[int, list[int]]]:
    """The words between two runs of equal ones (a run of other opcodes) that line up with the untaken tokens
    between those runs by their characters (:func:`_alike`), each with the tokens it lines up with."""
    start, places = ops[0].src_start, [lo + j for j in range(ops[0].dest_start, ops[-1].dest_end)]
    places = [place for place in places if not evidence.taken[place]]
    for index, others in _alike(keys[start : ops[-1].src_end], [evidence.keys[place] for place in places]):
        yield start + index, [places[other] for other in others]


def _nearer(
    evidence: Evidence, matches: dict[int, list[int]], stretch: tuple[int, int], ends: tuple[list[int], list[int]]
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
        candidates = _equal_runs(evidence, first, len(piece), stretch, used)
        if not candidates:
            continue
        far = functools.partial(_far, evidence, len(piece), before, after)
        best = min(candidates, key=far)
        if far(best) < NEARER * far(first):
            used.difference_update(range(first, first + len(piece)))
            used.update(range(best, best + len(piece)))
            matches.update((index, [best + offset]) for offset, index in enumerate(piece))


def _equal_runs(evidence: Evidence, first: int, length: int, stretch: tuple[int, int], used: set[int]) -> list[int]:
    """Where a run of ``length`` tokens equal to those from ``first`` starts, within the stretch, with no token taken
    or ``used``: at one of the NEARER_PLACES occurrences of the token at ``first`` nearest it on either side."""
    codes = [evidence.codes[first + offset] for offset in range(length)]
    same = evidence.places[codes[0]]
    middle = bisect.bisect_left(same, first)
    return [
        start
        for start in same[max(middle - NEARER_PLACES, 0) : middle + NEARER_PLACES + 1]
        if stretch[0] <= start and start + length <= stretch[1] and _free(evidence, start, codes, used)
    ]


def _free(evidence: Evidence, start: int, codes: Sequence[int], used: set[int]) -> bool:
    """The tokens from ``start`` have the ``codes``, and none is taken or ``used``."""
    return all(
        evidence.codes[start + offset] == code and not evidence.taken[start + offset] and start + offset not in used
        for offset, code in enumerate(codes)
    )


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


def _far(evidence: Evidence, length: int, before: list[int], after: list[int], start: int) -> float:
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
        and similar(len(keys[word]), 2 * matched[word] / (len(keys[word]) + spread[word]))
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
