"""The page's words as keyed tokens, and where among them a block's words may be (step 2: anchors and clusters)."""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from rapidfuzz import fuzz, process

from pagescribe.grounding import Box, PageText
from pagescribe.grounding.keys import FUZZY, FUZZY_MIN_CHARS, WORD, key_of

RARE = 4  # a word with at most this many untaken occurrences on the page votes for where its block is
CLUSTERS = 4  # a block is looked for in at most this many places,
DIAGONAL = 0.5  # ... those where its anchors agree on where it starts, when one holds this share of their weight
AMBIGUOUS = 0.75  # ... and the page repeats it when another place has this share of the best one's weight
_UNKNOWN = -2  # the code of an answer key that no evidence word has
_TAKEN = -1  # the code an evidence token shows once an answer word has taken it


class Evidence:
    """The page's words as keyed tokens in the evidence's order (a word may be several: a CJK line), where each key
    occurs, and which tokens an answer word has taken."""

    def __init__(self, page: PageText) -> None:
        self.page = page
        self.keys: list[str] = []
        self.word: list[int] = []  # the index of the evidence word each token is part of
        for index, word in enumerate(page.words):
            for piece in WORD.findall(word.text):
                if key := key_of(piece):
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

    def edge(self, cluster: Cluster) -> float:
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
    ) -> list[Cluster]:
        """Where the words (their ``keys`` and ``codes``) may be, ``within`` a stretch or anywhere: the clusters of
        the untaken places of their rare words, or with ``common``, when none of them is rare, of any of them, or
        when none of them is on the page as it is, of the tokens most like them (:meth:`_alike_anchors`); most
        weight first; none when none of them is there."""
        anchors = self._anchors(codes, within, RARE)
        if not anchors and common:
            anchors = self._anchors(codes, within, None) or self._alike_anchors(keys, within)
        bottom, top = within or (0, self.size)
        slack = slack_for(len(codes))
        return [
            Cluster(weight, first, (max(first - slack, bottom, 0), min(last + len(codes) + slack, top, self.size)))
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


def slack_for(words: int) -> int:
    """Tokens of evidence looked at beyond the ends of where ``words`` words seem to be."""
    return 4 + words // 8


@dataclass(frozen=True)
class Cluster:
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
    slack = slack_for(words)
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


def choose(clusters: Sequence[Cluster], prefer: Callable[[Cluster], float] | None, *, wait: bool) -> Cluster | None:
    """The cluster to align with: the heaviest, unless others come close to it (AMBIGUOUS of its weight: a text
    repeated on the page); then of those the one ``prefer`` puts first, and None (the block waits for its
    neighbours) when ``wait`` and there is no ``prefer``."""
    rivals = [cluster for cluster in clusters if cluster.weight >= AMBIGUOUS * clusters[0].weight]
    if len(rivals) == 1 or (prefer is None and not wait):
        return clusters[0]
    return None if prefer is None else min(rivals, key=prefer)


def towards(place: int | None) -> Callable[[Cluster], float] | None:
    """Clusters nearest a place of the evidence first."""
    return None if place is None else lambda cluster: abs(cluster.start - place)
