"""The answer's blocks placed on the page: each where its words are, its unaligned runs looked for again (step 4)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pagescribe.grounding import BlockGrounding, GroundedText, PageGrounding, PageText
from pagescribe.grounding.evidence import Cluster, Evidence, choose, towards
from pagescribe.grounding.keys import FUZZY_MIN_CHARS
from pagescribe.grounding.matching import DISTINCT_CHARS, kept_matches, match_stretch
from pagescribe.grounding.measures import block_grounding, missed_regions
from pagescribe.grounding.words import BlockWords

PASSES = 3  # a block's unaligned runs are looked for again at most this many times
_FURNITURE = frozenset({"page_header", "page_footer", "page_number"})  # looked for at the page's top and bottom


def align(blocks: Sequence[GroundedText], evidence: PageText) -> PageGrounding:
    """The answer's blocks (in the answer's order) aligned to the page's own positioned words (see
    :mod:`pagescribe.grounding`)."""
    page = Evidence(evidence)
    words = {index: BlockWords.of(block, page) for index, block in enumerate(blocks) if block.type != "figure"}
    placed = {index: found for index, found in words.items() if found.keys}
    longest_first = sorted(placed, key=lambda index: -placed[index].chars)
    waiting = [index for index in longest_first if not _place(page, placed[index], None)]
    for index in sorted(waiting):  # the blocks of a text the page repeats, in the answer's order
        furniture = blocks[index].type in _FURNITURE
        _place(page, placed[index], page.edge if furniture else towards(_after(placed, index)))
    results: list[BlockGrounding] = []
    counted = 0
    for index, block in enumerate(blocks):
        if index in placed:
            result, unsupported_chars = block_grounding(block, placed[index], page)
            counted += unsupported_chars
        else:
            result = BlockGrounding(block.id, None, None, 0, 0, ())
        results.append(result)
    chars = sum(result.chars for result in results)
    aligned = sum(result.aligned_chars for result in results)
    missed, missed_chars = missed_regions(page)
    evidence_chars = sum(map(len, page.keys))
    return PageGrounding(
        evidence.source,
        tuple(results),
        grounding=aligned / chars if chars else 1.0,
        ungrounded=counted / chars if chars else 0.0,
        missed_text=missed_chars / evidence_chars if evidence_chars else 0.0,
        missed=tuple(missed),
    )


def _after(placed: dict[int, BlockWords], index: int) -> int:
    """The evidence place after the last one the block before ``index`` in the answer (that is aligned) took."""
    for before in range(index - 1, -1, -1):
        if before in placed and (after := placed[before].after(len(placed[before].keys))) is not None:
            return after
    return 0


def _place(evidence: Evidence, words: BlockWords, prefer: Callable[[Cluster], float] | None) -> bool:
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


def _again(evidence: Evidence, words: BlockWords, everything: list[int]) -> int:
    """Look for a block's unaligned runs again: where their rare words are within the stretch the block's aligned
    words cover (a word or a cell read in another order), then, with DISTINCT_CHARS, anywhere (a piece of the block
    the evidence has elsewhere), then between the places of the aligned words on either side (a misread word). How
    many words that aligned."""
    aligned = 0
    stretch = words.stretch()
    for run in list(words.runs(by_cell=True)):
        aligned += _try(evidence, words, run, stretch, prefer=towards(words.near(run))) or 0
    for run in list(words.runs(by_cell=True)):
        if run != everything and sum(len(words.keys[index]) for index in run) >= DISTINCT_CHARS:
            aligned += _try(evidence, words, run, None, prefer=towards(words.near(run)), common=False) or 0
    for run in list(words.runs(by_cell=True)):
        aligned += _align_at(evidence, words, run, words.between(run))
    return aligned


def _try(
    evidence: Evidence,
    words: BlockWords,
    members: list[int],
    within: tuple[int, int] | None,
    *,
    prefer: Callable[[Cluster], float] | None,
    primary: bool = False,
    common: bool = True,
) -> int | None:
    """Align the words ``members`` (indices, in order) where their rare words are, ``within`` a stretch or
    anywhere (of several places, the one :func:`choose` picks, then the others until one keeps something): how
    many aligned, None when they wait for their neighbours. The ``primary`` placement, the whole block's, waits when
    the page repeats the block and there is no ``prefer``, and the stretch it aligns in is the block's region."""
    codes = [words.codes[index] for index in members]
    clusters = evidence.regions([words.keys[index] for index in members], codes, within, common=common)
    chosen = choose(clusters, prefer, wait=primary) if clusters else None
    if chosen is None:
        return None if clusters else 0
    for cluster in [chosen, *(cluster for cluster in clusters if cluster is not chosen)]:
        if aligned := _align_at(evidence, words, members, cluster.stretch):
            if primary:
                words.region = cluster.stretch
            return aligned
    return 0


def _align_at(evidence: Evidence, words: BlockWords, members: list[int], stretch: tuple[int, int] | None) -> int:
    """Align the words ``members`` with a stretch of evidence, keeping what :func:`kept_matches` keeps: how many
    aligned."""
    if stretch is None:
        return 0
    keys = [words.keys[index] for index in members]
    codes = [words.codes[index] for index in members]
    matches = kept_matches(keys, match_stretch(evidence, keys, codes, stretch, words.ends(members)))
    for index, places in matches.items():
        words.support[members[index]] = places
        evidence.take(places)
    return len(matches)
