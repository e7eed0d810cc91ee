"""The fault-injection set of ``pagescribe eval --faults``: how well the two grounding checks (``ungrounded`` and
``missed_text``, :mod:`pagescribe.checks`) find what a model gets wrong, measured on real pages whose truth is known.

The pages: every page of the documents evaluated that has a truth and evidence to hold an answer against.

- A born-digital PDF page (a usable text layer): its truth is its text layer laid out in reading order
  (``read_text_layer(...).laid_out``: the markdown the offline layout makes of it, tables included), its evidence
  the text layer's positioned words (``text_layer_words``), as the pipeline grounds an answer on such a page.
- A scan (an image, or a PDF page without a usable text layer) with a truth file: its truth is that page of the truth
  file, its evidence the offline engine's second read of the page as the pipeline renders it (``render_page`` with
  the run's settings, then ``read_lines``), as the pipeline grounds a vision model's answer on a scan.

A page with neither is left out, saying why. Each page's truth is then replayed as the model's answer, clean and
with a fault injected (:data:`FAULTS`); each answer is cleaned, grounded and checked as the pipeline does it
(``clean_answer``, ``ground``, ``check_answer`` with the default ``Thresholds()``). Two answers are no fault and
must raise neither flag: the clean truth, and the truth with its blocks in another order (:func:`reordered`).

Everything is deterministic: the invented text is a fixed set, picked by the page's place in the set.
"""

from __future__ import annotations

import random
import re
import statistics
import zlib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pagescribe.blocks import BlockType
from pagescribe.blocks.parsing import parse_blocks
from pagescribe.checks import (
    Answer,
    Flag,
    PageEvidence,
    Thresholds,
    check_answer,
    clean_answer,
    ground,
    has_text,
    usable_text_layer,
)
from pagescribe.grounding import GroundingSource, PageGrounding, PageText, words_from_boxes
from pagescribe.settings import ConfigurationError, Settings
from pagescribe.sources.documents import DocumentKind, InvalidDocumentError, detect_kind, inspect_document
from pagescribe.sources.pages import render_page
from pagescribe.sources.textlayer import read_text_layer, text_layer_words

from pagescribe_local.evaluation import MISSED_SWEEP, UNGROUNDED_SWEEP, EvalDocument
from pagescribe_local.true_boxes import squashed, true_boxes

CLEAN = "clean"
INVENTED_SENTENCE = "invented_sentence"
DROPPED_PARAGRAPH = "dropped_paragraph"
INVENTED_ROW = "invented_row"
NEIGHBOUR = "neighbour"
REORDERED = "reordered"
FAULTS = (INVENTED_SENTENCE, DROPPED_PARAGRAPH, INVENTED_ROW, NEIGHBOUR)
NOT_FAULTS = (CLEAN, REORDERED)
ANSWERS = (CLEAN, *FAULTS, REORDERED)
# The flags that find each fault: either of them finds the neighbouring page's text.
EXPECTED = {
    INVENTED_SENTENCE: frozenset({Flag.UNGROUNDED.value}),
    DROPPED_PARAGRAPH: frozenset({Flag.MISSED_TEXT.value}),
    INVENTED_ROW: frozenset({Flag.UNGROUNDED.value}),
    NEIGHBOUR: frozenset({Flag.UNGROUNDED.value, Flag.MISSED_TEXT.value}),
}
CHECKS = (Flag.UNGROUNDED.value, Flag.MISSED_TEXT.value)
MIN_DROPPED_WORDS = 25  # the paragraph dropped has at least this many words
DESCRIPTIONS = {
    CLEAN: "the page's truth as it is",
    INVENTED_SENTENCE: "the truth with an invented sentence as a paragraph of its own, after its middle block",
    DROPPED_PARAGRAPH: f"the truth without its longest paragraph of {MIN_DROPPED_WORDS} words or more",
    INVENTED_ROW: "the truth with an invented row in the middle of its longest markdown table",
    NEIGHBOUR: "the neighbouring page's truth (the same document's next page; the last page's: the one before)",
    REORDERED: "the truth's blocks in another order: its second half first (a right column read before the left)",
}
TARGETS = {  # the issue's: grounding of true text, box IoU, detection and false flags
    "grounded_born_digital": 0.98,
    "grounded_scan": 0.90,
    "box_iou_median": 0.8,
    "detected": 0.95,
    "false_flags_clean": 0.02,
}

# Sentences a model might invent: plausible in a report, a form or a paper, and on no page of the corpus or
# tests/data (tests/unit/test_eval_faults.py checks it).
INVENTED_SENTENCES = (
    "The committee approved an additional budget of forty million dollars for the new facility.",
    "Participants who completed the survey reported a median waiting time of eleven days.",
    "All samples were stored at minus twenty degrees and analysed within one week of collection.",
    "The agreement is renewed automatically unless either party objects in writing before the end of March.",
    "Revenue in the northern region grew by seven percent compared with the previous quarter.",
)
# The cells of an invented table row that are not numbers: labels a table might have, on no page of the corpus.
ROW_LABELS = (
    "Harbour district",
    "Reserve account",
    "Northern annex",
    "Pending transfer",
    "Lakeview office",
    "Granite works",
    "Orchard lane",
    "Summit branch",
)
_CHUNK_BREAK = re.compile(r"\n[ \t]*\n")
_PIPE = re.compile(r"(?<!\\)\|")
_RULE = re.compile(r"[|\s:-]+")
_DIGITS = re.compile(r"\d+")
_TRIES = 20  # an invented number is drawn again at most this many times while it is on the page


class NotApplicable(ValueError):
    """The fault cannot be injected into this page's truth; the message says why."""


@dataclass(frozen=True)
class FaultPage:
    """A real page with a truth: what is replayed as the answer, and the evidence it is grounded to."""

    document: str
    page: int
    truth: str
    evidence: PageText
    path: Path
    born_digital: bool  # a usable text layer: truth and evidence from it; else a scan and its second read


@dataclass(frozen=True)
class LeftOut:
    document: str
    page: int  # 0: the whole document
    why: str


@dataclass(frozen=True)
class Checked:
    """One answer grounded and checked: its shares, and which of the two checks' flags it raised."""

    grounded: float
    ungrounded: float
    missed_text: float
    chars: int  # the answer's letters and digits that carry page text (what ``grounded`` is a share of)
    aligned: int
    flags: tuple[str, ...]
    whole_chars: int = 0  # the largest block or table row nothing on the page supports as a whole (0: none)


@dataclass(frozen=True)
class PageFaults:
    """Every answer of a page checked (by its name in :data:`ANSWERS`), and why the others could not be made."""

    document: str
    page: int
    evidence: str  # the grounding source: text_layer or second_read
    words: int  # the evidence's words
    checked: dict[str, Checked]
    not_applicable: dict[str, str]
    box_ious: list[float] = field(default_factory=list)  # born-digital: each block's box against its true box


# --- the pages --------------------------------------------------------------------------------------------------------


def build_pages(documents: Sequence[EvalDocument], settings: Settings) -> tuple[list[FaultPage], list[LeftOut]]:
    """The fault set's pages of the documents evaluated, and the pages left out (see the module's docstring)."""
    pages: list[FaultPage] = []
    left_out: list[LeftOut] = []
    for document in documents:
        try:
            with document.path.open("rb") as handle:
                kind = detect_kind(handle.read(1024))
            count = inspect_document(
                document.path, max_pages=settings.max_pages, max_image_pixels=settings.max_image_pixels
            ).page_count
        except (OSError, InvalidDocumentError) as exc:
            left_out.append(LeftOut(document.name, 0, f"it cannot be read: {_reason(exc)}"))
            continue
        for number in document.pages or range(1, count + 1):
            try:
                found = _page(document, kind, number, settings)
            except (InvalidDocumentError, ConfigurationError, NotApplicable) as exc:
                left_out.append(LeftOut(document.name, number, _reason(exc)))
                continue
            pages.append(found)
    return pages, left_out


def _reason(exc: Exception) -> str:
    return exc.reason if isinstance(exc, InvalidDocumentError) else str(exc)


def _page(document: EvalDocument, kind: DocumentKind, number: int, settings: Settings) -> FaultPage:
    """A page of the set: born-digital (a usable text layer), or a scan with a truth file's page."""
    if kind is DocumentKind.PDF:
        layer = read_text_layer(document.path, number)
        if usable_text_layer(layer.text):
            evidence = text_layer_words(
                document.path, number, dpi=settings.render_dpi, max_long_edge=settings.render_max_long_edge
            )
            return FaultPage(document.name, number, layer.laid_out, evidence, document.path, born_digital=True)
    truth = document.truth.get(number) if document.truth_source.startswith("truth file") else None
    if not truth or not has_text(truth):
        what = "no usable text layer and no truth file" if kind is DocumentKind.PDF else "no truth file"
        raise NotApplicable(f"{what}: nothing to hold an answer against honestly")
    evidence = second_read(document.path, kind, number, settings)
    return FaultPage(document.name, number, truth, evidence, document.path, born_digital=False)


def second_read(path: Path, kind: DocumentKind, number: int, settings: Settings) -> PageText:
    """The page as the pipeline renders it, read by the offline engine: the evidence a vision model's answer on a
    scan is grounded to. ConfigurationError when the engine is not installed."""
    from pagescribe.providers.offline import read_lines

    rendered = render_page(
        path,
        kind,
        number,
        dpi=settings.render_dpi,
        max_long_edge=settings.render_max_long_edge,
        image_format=settings.render_format,
        max_image_pixels=settings.max_image_pixels,
        orient=settings.detect_orientation,
    )
    lines = read_lines(rendered.data, settings.ocr_language)
    words = tuple(words_from_boxes(lines))
    return PageText(GroundingSource.SECOND_READ, words, rendered.width, rendered.height, rendered.points_per_pixel)


# --- the answers ------------------------------------------------------------------------------------------------------


def chunks(text: str) -> list[str]:
    """The text's blocks as markdown writes them: the runs of lines between blank lines."""
    return [chunk.strip("\n") for chunk in _CHUNK_BREAK.split(text.strip()) if chunk.strip()]


def with_invented_sentence(truth: str, sentence: str) -> str:
    """The truth with ``sentence`` as a paragraph of its own after its middle block (after the first half of its
    blocks, rounded up)."""
    parts = chunks(truth)
    at = (len(parts) + 1) // 2
    return "\n\n".join([*parts[:at], sentence, *parts[at:]])


def without_longest_paragraph(truth: str) -> str:
    """The truth without its longest paragraph (the most words) of MIN_DROPPED_WORDS words or more; NotApplicable
    when it has none, or when that paragraph is all its text (an empty answer is the ``empty`` check's case)."""
    paragraphs = [
        block
        for block in parse_blocks(truth)
        if block.type is BlockType.PARAGRAPH and len(block.plain.split()) >= MIN_DROPPED_WORDS
    ]
    if not paragraphs:
        raise NotApplicable(f"no paragraph of {MIN_DROPPED_WORDS} words or more")
    target = max(paragraphs, key=lambda block: len(block.plain.split()))
    rest = "\n\n".join(chunks(truth[: target.start]) + chunks(truth[target.end :]))
    if not has_text(rest):
        raise NotApplicable("its one paragraph is all its text: the answer would be empty (the empty check's case)")
    return rest


def with_invented_row(truth: str, seed: int, page_words: frozenset[str]) -> str:
    """The truth with an invented row in the middle of its markdown table with the most rows, shaped like the row
    above it: each cell with letters an invented label (:data:`ROW_LABELS`, none with a word of ``page_words``: the
    page's, squashed), each run of digits other digits (the same count, punctuation kept; a number of four digits or
    more not on the page), an empty cell empty. NotApplicable when the truth has no markdown table."""
    tables = [block for block in parse_blocks(truth) if block.type is BlockType.TABLE and block.text.startswith("|")]
    if not tables:
        raise NotApplicable("no markdown table")
    table = max(tables, key=lambda block: len(block.text.splitlines()))
    lines = table.text.splitlines()
    body = [at for at, line in enumerate(lines) if at > 0 and not _RULE.fullmatch(line)]
    at = body[(len(body) - 1) // 2] if body else len(lines) - 1  # the row the invented one follows
    shuffler = random.Random(seed)  # noqa: S311 (invented cells, reproducible: no secret)
    labels = [label for label in ROW_LABELS if not any(squashed(word) in page_words for word in label.split())]
    labels = shuffler.sample(labels, len(labels))
    row = [_invented_cell(cell, labels, shuffler, page_words) for cell in _cells(lines[at if body else 0])]
    text = "\n".join([*lines[: at + 1], "| " + " | ".join(row) + " |", *lines[at + 1 :]])
    return truth[: table.start] + text + truth[table.end :]


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in _PIPE.split(line.strip().strip("|"))]


def _invented_cell(template: str, labels: list[str], shuffler: random.Random, page_words: frozenset[str]) -> str:
    """A cell shaped like ``template``: a label (the next of ``labels``) where it has letters, else its digits
    replaced (a number of four digits or more not on the page, in a few tries)."""
    if any(char.isalpha() for char in template):
        return labels.pop() if labels else "Reserve"
    value = template
    for _ in range(_TRIES):
        value = _DIGITS.sub(lambda digits: _other_digits(digits.group(), shuffler), template)
        if not any(len(key) >= 4 and key in page_words for key in map(squashed, value.split())):
            break
    return value


def _other_digits(digits: str, shuffler: random.Random) -> str:
    first = str(shuffler.randrange(1, 10)) if len(digits) > 1 else str(shuffler.randrange(10))
    return first + "".join(str(shuffler.randrange(10)) for _ in digits[1:])


def reordered(truth: str) -> str:
    """The truth's blocks in another order: the second half of them first (a right column read before the left). A
    truth of one block is cut in two at its middle line, the second half first. NotApplicable for one line."""
    parts = chunks(truth)
    if len(parts) < 2:
        lines = truth.strip().splitlines()
        if len(lines) < 2:
            raise NotApplicable("one line: nothing to reorder")
        parts = ["\n".join(lines[: len(lines) // 2]), "\n".join(lines[len(lines) // 2 :])]
    at = len(parts) // 2
    return "\n\n".join(parts[at:] + parts[:at])


def answers(page: FaultPage, neighbour: FaultPage | None, index: int) -> dict[str, str | NotApplicable]:
    """Every answer replayed for a page (its place ``index`` in the set picks the invented text), or why it could
    not be made."""
    page_words = frozenset(squashed(word.text) for word in page.evidence.words)
    makers: dict[str, Callable[[], str]] = {
        CLEAN: lambda: page.truth,
        INVENTED_SENTENCE: lambda: with_invented_sentence(page.truth, _sentence(index)),
        DROPPED_PARAGRAPH: lambda: without_longest_paragraph(page.truth),
        INVENTED_ROW: lambda: with_invented_row(
            page.truth, zlib.crc32(f"{page.document}:{page.page}".encode()), page_words
        ),
        NEIGHBOUR: lambda: _neighbours(neighbour),
        REORDERED: lambda: reordered(page.truth),
    }
    made: dict[str, str | NotApplicable] = {}
    for name, make in makers.items():
        try:
            made[name] = make()
        except NotApplicable as exc:
            made[name] = exc
    return made


def _sentence(index: int) -> str:
    return INVENTED_SENTENCES[index % len(INVENTED_SENTENCES)]


def _neighbours(neighbour: FaultPage | None) -> str:
    if neighbour is None:
        raise NotApplicable("no other page of its document in the set")
    return neighbour.truth


def neighbour_of(pages: Sequence[FaultPage], index: int) -> FaultPage | None:
    """The same document's next page in the set, or for its last page the one before; None for a page alone."""
    page = pages[index]
    same = [other for other in pages if other.document == page.document and other.page != page.page]
    after = [other for other in same if other.page > page.page]
    if after:
        return min(after, key=lambda other: other.page)
    return max(same, key=lambda other: other.page) if same else None


# --- checking ---------------------------------------------------------------------------------------------------------


def check(answer: str, evidence: PageText, thresholds: Thresholds) -> tuple[Checked, PageGrounding]:
    """The answer cleaned, grounded and checked as the pipeline does it (a model that stopped on its own)."""
    text = clean_answer(answer)
    grounding = ground(text, evidence)
    flags = check_answer(
        Answer(text, "stop", None, None),
        PageEvidence(ink=1.0, words=evidence),
        thresholds,
        max_output_tokens=1 << 20,
        grounding=grounding,
    )
    chars = sum(block.chars for block in grounding.blocks)
    aligned = sum(block.aligned_chars for block in grounding.blocks)
    raised = tuple(flag.flag.value for flag in flags if flag.flag.value in CHECKS)
    checked = Checked(
        round(grounding.grounding, 4),
        round(grounding.ungrounded, 4),
        round(grounding.missed_text, 4),
        chars,
        aligned,
        raised,
        max((unit.chars for unit in grounding.whole), default=0),
    )
    return checked, grounding


def measure(pages: Sequence[FaultPage], thresholds: Thresholds | None = None) -> list[PageFaults]:
    """Every page's answers checked, and on a born-digital page the clean answer's block boxes measured against
    their true boxes."""
    thresholds = thresholds or Thresholds()
    results = []
    for index, page in enumerate(pages):
        checked: dict[str, Checked] = {}
        not_applicable: dict[str, str] = {}
        ious: list[float] = []
        for name, answer in answers(page, neighbour_of(pages, index), index).items():
            if isinstance(answer, NotApplicable):
                not_applicable[name] = str(answer)
                continue
            checked[name], grounding = check(answer, page.evidence, thresholds)
            if name == CLEAN and page.born_digital:
                ious = clean_box_ious(page, answer, grounding)
        source = page.evidence.source.value
        results.append(
            PageFaults(page.document, page.page, source, len(page.evidence.words), checked, not_applicable, ious)
        )
    return results


def clean_box_ious(page: FaultPage, answer: str, grounding: PageGrounding) -> list[float]:
    """Each block's box (as the alignment gives it) against its true box (:mod:`pagescribe_local.true_boxes`), for
    the blocks that have both."""
    blocks = parse_blocks(clean_answer(answer))
    truth = true_boxes(
        page.path, page.page, [(block.id, block.plain) for block in blocks], (page.evidence.width, page.evidence.height)
    )
    return [
        round(found.bbox.iou(truth[found.block_id]), 4)
        for found in grounding.blocks
        if found.bbox is not None and found.block_id in truth
    ]


# --- the figures ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FaultRun:
    """The fault set measured: every page's answers checked, the pages left out, and the figures."""

    pages: list[PageFaults]
    left_out: list[LeftOut]
    thresholds: Thresholds

    def summary(self) -> dict[str, Any]:
        born = [page for page in self.pages if page.evidence == GroundingSource.TEXT_LAYER.value]
        scans = [page for page in self.pages if page.evidence != GroundingSource.TEXT_LAYER.value]
        ious = [iou for page in born for iou in page.box_ious]
        return {
            "thresholds": {"ungrounded": self.thresholds.ungrounded, "missed_text": self.thresholds.missed_text},
            "pages": {"born_digital": len(born), "scans": len(scans)},
            "left_out": len(self.left_out),
            "grounded": {"born_digital": _coverage(born), "scans": _coverage(scans)},
            "box_iou": {
                "blocks": len(ious),
                "median": round(statistics.median(ious), 4) if ious else None,
                "at_least_0_8": round(sum(iou >= 0.8 for iou in ious) / len(ious), 4) if ious else None,
            },
            "faults": {name: _detection(self.pages, name) for name in FAULTS},
            "false_flags": {name: _false_flags(self.pages, name) for name in NOT_FAULTS},
        }

    def as_json(self) -> dict[str, Any]:
        return {
            "summary": self.summary(),
            "targets": [asdict(target) for target in targets(self.summary())],
            "sweep": sweep(self.pages),
            "pages": [asdict(page) for page in self.pages],
            "left_out": [asdict(left) for left in self.left_out],
        }


def run(documents: Sequence[EvalDocument], settings: Settings, thresholds: Thresholds | None = None) -> FaultRun:
    """The fault set of the documents evaluated, built and measured."""
    pages, left_out = build_pages(documents, settings)
    thresholds = thresholds or Thresholds()
    return FaultRun(measure(pages, thresholds), left_out, thresholds)


def _name(page: PageFaults) -> str:
    return f"{page.document}:{page.page}"


def _coverage(pages: Sequence[PageFaults]) -> dict[str, Any]:
    """How much of the clean answers the evidence grounds: over all their characters, and page by page."""
    clean = [(page, page.checked[CLEAN]) for page in pages if CLEAN in page.checked]
    if not clean:
        return {"pages": 0, "pooled": None, "median": None, "worst": None, "worst_page": None}
    chars = sum(checked.chars for _, checked in clean)
    worst_page, worst = min(clean, key=lambda item: item[1].grounded)
    return {
        "pages": len(clean),
        "pooled": round(sum(checked.aligned for _, checked in clean) / chars, 4) if chars else None,
        "median": round(statistics.median(checked.grounded for _, checked in clean), 4),
        "worst": worst.grounded,
        "worst_page": _name(worst_page),
    }


def _detection(pages: Sequence[PageFaults], fault: str) -> dict[str, Any]:
    """On how many pages the fault raised the flag that finds it, by the evidence's source; the pages it did not,
    and why the others were not counted."""
    counted = [page for page in pages if fault in page.checked]
    found = [page for page in counted if EXPECTED[fault] & set(page.checked[fault].flags)]
    by_source: dict[str, dict[str, int]] = {}
    for page in counted:
        entry = by_source.setdefault(page.evidence, {"pages": 0, "detected": 0})
        entry["pages"] += 1
        entry["detected"] += page in found
    reasons = Counter(page.not_applicable[fault] for page in pages if fault in page.not_applicable)
    return {
        "pages": len(counted),
        "detected": len(found),
        "rate": round(len(found) / len(counted), 4) if counted else None,
        "by_flag": {flag: sum(flag in page.checked[fault].flags for page in counted) for flag in CHECKS},
        "by_source": by_source,
        "missed": [_name(page) for page in counted if page not in found],
        "not_counted": dict(reasons),
    }


def _false_flags(pages: Sequence[PageFaults], answer: str) -> dict[str, Any]:
    """On how many pages an answer that is no fault raised either flag."""
    counted = [page for page in pages if answer in page.checked]
    flagged = [page for page in counted if page.checked[answer].flags]
    reasons = Counter(page.not_applicable[answer] for page in pages if answer in page.not_applicable)
    return {
        "pages": len(counted),
        "flagged": len(flagged),
        "rate": round(len(flagged) / len(counted), 4) if counted else None,
        "by_flag": {flag: sum(flag in page.checked[answer].flags for page in counted) for flag in CHECKS},
        "flagged_pages": [_name(page) for page in flagged],
        "not_counted": dict(reasons),
    }


@dataclass(frozen=True)
class Target:
    what: str
    target: str
    measured: str
    met: bool | None  # None: nothing to measure it on


def targets(summary: dict[str, Any]) -> list[Target]:
    """The issue's targets, each with what was measured and whether it is met."""
    grounded, iou = summary["grounded"], summary["box_iou"]
    found, false = summary["faults"], summary["false_flags"]
    result = [
        _at_least(
            "born-digital pages: share of the true text's characters grounded (all pages' characters together)",
            grounded["born_digital"]["pooled"],
            TARGETS["grounded_born_digital"],
            f"least grounded page {grounded['born_digital']['worst_page']}: {_pct(grounded['born_digital']['worst'])}",
        ),
        _at_least(
            "born-digital pages: median IoU of a block's box (true text) against its true box",
            iou["median"],
            TARGETS["box_iou_median"],
            f"{iou['blocks']} blocks, {_pct(iou['at_least_0_8'])} of them 0.8 or more",
            percent=False,
        ),
        _at_least(
            "scans, grounded to the second read: share of the true text's characters grounded",
            grounded["scans"]["pooled"],
            TARGETS["grounded_scan"],
            f"least grounded page {grounded['scans']['worst_page']}: {_pct(grounded['scans']['worst'])}",
        ),
    ]
    for fault in (INVENTED_SENTENCE, INVENTED_ROW, DROPPED_PARAGRAPH):
        entry = found[fault]
        result.append(
            _at_least(
                f"{_LABELS[fault]} detected",
                entry["rate"],
                TARGETS["detected"],
                f"{entry['detected']} of {entry['pages']} pages",
            )
        )
    clean, moved = false[CLEAN], false[REORDERED]
    result.append(
        Target(
            "false flags on clean answers",
            f"<= {_pct(TARGETS['false_flags_clean'])}",
            f"{_pct(clean['rate'])} ({clean['flagged']} of {clean['pages']} pages)",
            None if clean["rate"] is None else clean["rate"] <= TARGETS["false_flags_clean"],
        )
    )
    result.append(
        Target(
            "a reordered but complete answer is not flagged",
            "no page flagged",
            f"{moved['flagged']} of {moved['pages']} pages flagged",
            None if not moved["pages"] else moved["flagged"] == 0,
        )
    )
    return result


def _at_least(what: str, value: float | None, target: float, detail: str, *, percent: bool = True) -> Target:
    shown = _pct(value) if percent else _fmt(value)
    goal = f">= {_pct(target) if percent else _fmt(target)}"
    return Target(what, goal, f"{shown} ({detail})", None if value is None else value >= target)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f} %"


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


_LABELS = {
    CLEAN: "clean answer",
    INVENTED_SENTENCE: "an invented sentence",
    DROPPED_PARAGRAPH: "a dropped paragraph",
    INVENTED_ROW: "an invented table row",
    NEIGHBOUR: "the neighbouring page's text",
    REORDERED: "blocks reordered (no fault)",
}


def sweep(pages: Sequence[PageFaults]) -> dict[str, list[dict[str, Any]]]:
    """For information: what each threshold of the two checks would detect and falsely flag on the same answers
    (a flag is raised above its threshold). ``ungrounded``: the invented sentence and row, and the clean and
    reordered answers; ``missed_text``: the dropped paragraph, and the clean and reordered answers."""

    def share(answer: str, measure_of: Callable[[Checked], float], threshold: float) -> dict[str, Any]:
        values = [measure_of(page.checked[answer]) for page in pages if answer in page.checked]
        above = sum(value > threshold for value in values)
        return {"flagged": above, "pages": len(values)}

    def ungrounded(checked: Checked) -> float:  # a whole block or row raises the flag whatever the share
        return 1.0 if checked.whole_chars >= Thresholds().ungrounded_block_chars else checked.ungrounded

    def missed(checked: Checked) -> float:
        return checked.missed_text

    return {
        Flag.UNGROUNDED.value: [
            {
                "threshold": threshold,
                **{
                    answer: share(answer, ungrounded, threshold)
                    for answer in (INVENTED_SENTENCE, INVENTED_ROW, CLEAN, REORDERED)
                },
            }
            for threshold in UNGROUNDED_SWEEP
        ],
        Flag.MISSED_TEXT.value: [
            {
                "threshold": threshold,
                **{answer: share(answer, missed, threshold) for answer in (DROPPED_PARAGRAPH, CLEAN, REORDERED)},
            }
            for threshold in MISSED_SWEEP
        ],
    }


# --- markdown ---------------------------------------------------------------------------------------------------------


def markdown(fault_run: FaultRun) -> str:
    """The fault set's figures as a markdown section (its headings are level 3: it goes inside the report's
    grounding section)."""
    summary = fault_run.summary()
    limits = summary["thresholds"]
    pages = summary["pages"]
    return f"""### Injected faults: the two checks on real pages whose truth is known

The set: {_count(pages["born_digital"], "born-digital page")} (truth: the text layer laid out,
`read_text_layer(...).laid_out`; evidence: its positioned words, `text_layer_words`) and
{_count(pages["scans"], "scan")} with a truth file (evidence: the offline engine's second read of the page as the
pipeline renders it). Each page's truth is replayed as the model's answer,
clean and with one fault injected, then cleaned, grounded and checked as the pipeline does it, with the default
thresholds (`ungrounded` above {limits["ungrounded"]}, `missed_text` above {limits["missed_text"]}). The answers:

{_descriptions()}

{_left_out(fault_run.left_out)}

#### Targets

{_targets_list(summary)}

#### Grounding of the clean answers

{_coverage_table(summary)}

#### Faults found

{_faults_table(summary)}

{_missed_paragraph(fault_run)}

#### False flags

{_false_flags_table(summary)}

#### At other thresholds (information)

`ungrounded` at other thresholds of its share, a block or table row unsupported as a whole (of
{Thresholds().ungrounded_block_chars} letters and digits or more) flagged at every one, as the pipeline does:

{_sweep_tables(sweep(fault_run.pages))}

#### What these figures mean

{_meaning(fault_run, summary)}

#### By page

{_pages_table(fault_run.pages)}
"""


def _meaning(fault_run: FaultRun, summary: dict[str, Any]) -> str:
    """One paragraph on what the figures measure and where they stop: built from the run, so that it stays true."""
    pages, limits = summary["pages"], summary["thresholds"]
    documents = len({page.document for page in fault_run.pages})
    rows = summary["faults"][INVENTED_ROW]["pages"]
    invented = [
        page.checked[fault]
        for fault in (INVENTED_SENTENCE, INVENTED_ROW)
        for page in fault_run.pages
        if fault in page.checked and not EXPECTED[fault] & set(page.checked[fault].flags)
    ]
    sizes = sorted(checked.chars for checked in invented)
    shares = sorted(checked.ungrounded for checked in invented)
    misses = (
        f"The invented text that went unflagged was in answers of {sizes[0]:,} to {sizes[-1]:,} letters and "
        f"digits, where it measured {shares[0]:.4f} to {shares[-1]:.4f}, under the threshold of "
        f"{limits['ungrounded']}, and was not a block or row of its own that nothing supports."
        if invented
        else "Every invented sentence and row was flagged."
    )
    return (
        "Both checks measure shares: `ungrounded` is the unsupported text's share of the answer's letters and digits, "
        "`missed_text` the left-out text's share of the page's. A fault of a fixed size (one sentence of about 90 "
        "letters, one table row) is therefore a smaller share of a denser page: that is why `ungrounded` is also "
        "raised by a block or table row that nothing on the page supports as a whole, whatever its share (on the "
        f"densest pages here an invented sentence is 0.015 of the answer). {misses} The answers are the pages' "
        "true text replayed, not a model's: a real answer also differs where it misreads, paraphrases or leaves out a "
        "word, which raises both shares on a faithful answer (the pipeline's own answers above show by how much), so "
        "the false-flag rates here are a floor, and a lower threshold that looks free here is not free on real "
        f"answers. The set is small: {_count(pages['born_digital'], 'born-digital page')} and "
        f"{_count(pages['scans'], 'scan')} of {_count(documents, 'document')}; {_rows(rows)}; the scans are clean "
        "test images the engine reads almost without error, so their grounding through the second read says little "
        "about a noisy scan, and image-only PDFs without a truth file have no truth to build answers from."
    )


def _count(count: int, thing: str) -> str:
    return f"{count} {thing}{'' if count == 1 else 's'}"


def _rows(pages: int) -> str:
    if not pages:
        return "no page's truth has a markdown table, so invented rows were not measured"
    return (
        f"invented rows could be put in only the {_count(pages, 'page')} whose truth has a markdown table (one page "
        f"moves that rate by {_pct(1 / pages)})"
    )


def summary_tables(fault_run: FaultRun) -> str:
    """What ``pagescribe eval --faults`` prints: the targets, the faults found and the false flags."""
    summary = fault_run.summary()
    return "\n\n".join([_targets_list(summary), _faults_table(summary), _false_flags_table(summary)])


def _descriptions() -> str:
    return "\n".join(f"- **{_LABELS[name]}**: {DESCRIPTIONS[name]}" for name in ANSWERS)


def _left_out(left_out: Sequence[LeftOut]) -> str:
    if not left_out:
        return "No page of the documents evaluated was left out."
    items = "; ".join(f"{left.document}{f' p. {left.page}' if left.page else ''}: {left.why}" for left in left_out)
    return f"Left out ({len(left_out)}): {items}."


def _targets_list(summary: dict[str, Any]) -> str:
    lines = []
    for target in targets(summary):
        verdict = "nothing to measure" if target.met is None else ("met" if target.met else "**missed**")
        lines.append(f"- {target.what}: {target.measured}; target {target.target}: {verdict}")
    return "\n".join(lines)


def _coverage_table(summary: dict[str, Any]) -> str:
    rows = ["| pages | evidence | count | grounded, all characters | median page | least grounded page |"]
    rows.append("| --- | --- | ---: | ---: | ---: | --- |")
    for kind, evidence in (("born_digital", "text layer"), ("scans", "second read")):
        entry = summary["grounded"][kind]
        rows.append(
            f"| {kind.replace('_', '-')} | {evidence} | {entry['pages']} | {_pct(entry['pooled'])} "
            f"| {_pct(entry['median'])} | {entry['worst_page'] or '-'} ({_pct(entry['worst'])}) |"
        )
    iou = summary["box_iou"]
    return (
        "\n".join(rows)
        + f"\n\nBlock boxes of the clean answers on born-digital pages against their true boxes: {iou['blocks']} "
        f"blocks, median IoU {_fmt(iou['median'])}, {_pct(iou['at_least_0_8'])} of them 0.8 or more."
    )


def _faults_table(summary: dict[str, Any]) -> str:
    rows = [
        "| fault | flag that finds it | pages | detected | rate | born-digital | scans | ungrounded raised "
        "| missed_text raised | not counted |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for fault in FAULTS:
        entry = summary["faults"][fault]
        born = entry["by_source"].get(GroundingSource.TEXT_LAYER.value, {"pages": 0, "detected": 0})
        scans = entry["by_source"].get(GroundingSource.SECOND_READ.value, {"pages": 0, "detected": 0})
        rows.append(
            f"| {_LABELS[fault]} | {' or '.join(sorted(EXPECTED[fault]))} | {entry['pages']} | {entry['detected']} "
            f"| {_pct(entry['rate'])} | {born['detected']}/{born['pages']} | {scans['detected']}/{scans['pages']} "
            f"| {entry['by_flag'][CHECKS[0]]} | {entry['by_flag'][CHECKS[1]]} | {_reasons(entry['not_counted'])} |"
        )
    return "\n".join(rows)


def _reasons(reasons: dict[str, int]) -> str:
    return "; ".join(f"{count}: {why}" for why, count in reasons.items()) or "-"


def _missed_paragraph(fault_run: FaultRun) -> str:
    """Which pages a fault went unflagged on, with the share it measured and the answer's size."""
    missed = [
        f"{_LABELS[fault]} on {_name(page)} ({_measure(fault, page.checked[fault])}, of an answer of "
        f"{page.checked[fault].chars:,} letters and digits)"
        for fault in FAULTS
        for page in fault_run.pages
        if fault in page.checked and not EXPECTED[fault] & set(page.checked[fault].flags)
    ]
    if not missed:
        return "Every fault counted raised its flag."
    return f"Not flagged ({len(missed)}): " + "; ".join(missed) + "."


def _measure(fault: str, checked: Checked) -> str:
    if fault == DROPPED_PARAGRAPH:
        return f"missed_text {checked.missed_text:.4f}"
    if fault == NEIGHBOUR:
        return f"ungrounded {checked.ungrounded:.4f}, missed_text {checked.missed_text:.4f}"
    return f"ungrounded {checked.ungrounded:.4f}"


def _false_flags_table(summary: dict[str, Any]) -> str:
    rows = [
        "| answer (no fault) | pages | flagged | rate | ungrounded raised | missed_text raised | flagged pages "
        "| not counted |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    for answer in NOT_FAULTS:
        entry = summary["false_flags"][answer]
        rows.append(
            f"| {_LABELS[answer]} | {entry['pages']} | {entry['flagged']} | {_pct(entry['rate'])} "
            f"| {entry['by_flag'][CHECKS[0]]} | {entry['by_flag'][CHECKS[1]]} "
            f"| {', '.join(entry['flagged_pages']) or '-'} | {_reasons(entry['not_counted'])} |"
        )
    return "\n".join(rows)


def _sweep_tables(table: dict[str, list[dict[str, Any]]]) -> str:
    def cell(entry: dict[str, Any]) -> str:
        return f"{entry['flagged']}/{entry['pages']}"

    ungrounded = [
        "| `ungrounded` above | invented sentence flagged | invented row flagged | clean flagged | reordered flagged |",
        "| ---: | ---: | ---: | ---: | ---: |",
        *(
            f"| {row['threshold']} | {cell(row[INVENTED_SENTENCE])} | {cell(row[INVENTED_ROW])} | {cell(row[CLEAN])} "
            f"| {cell(row[REORDERED])} |"
            for row in table[Flag.UNGROUNDED.value]
        ),
    ]
    missed = [
        "| `missed_text` above | dropped paragraph flagged | clean flagged | reordered flagged |",
        "| ---: | ---: | ---: | ---: |",
        *(
            f"| {row['threshold']} | {cell(row[DROPPED_PARAGRAPH])} | {cell(row[CLEAN])} | {cell(row[REORDERED])} |"
            for row in table[Flag.MISSED_TEXT.value]
        ),
    ]
    return "\n".join(ungrounded) + "\n\n" + "\n".join(missed)


def _pages_table(pages: Sequence[PageFaults]) -> str:
    rows = [
        "| document | page | evidence | words | clean: grounded | box IoU median (blocks) | clean | invented sentence "
        "| dropped paragraph | invented row | neighbour | reordered |",
        "| --- | ---: | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for page in pages:
        clean = page.checked.get(CLEAN)
        ious = f"{statistics.median(page.box_ious):.3f} ({len(page.box_ious)})" if page.box_ious else "-"
        cells = [_fault_cell(page, fault) for fault in FAULTS]
        rows.append(
            f"| {page.document} | {page.page} | {page.evidence} | {page.words} "
            f"| {_fmt(clean.grounded if clean else None)} | {ious} | {_flags_cell(page, CLEAN)} | {' | '.join(cells)} "
            f"| {_flags_cell(page, REORDERED)} |"
        )
    return "\n".join(rows)


def _fault_cell(page: PageFaults, fault: str) -> str:
    """The share that finds the fault (both for the neighbour's text), and whether its flag was raised."""
    checked = page.checked.get(fault)
    if checked is None:
        return "n/a"
    found = bool(EXPECTED[fault] & set(checked.flags))
    if fault == DROPPED_PARAGRAPH:
        value = f"m {checked.missed_text:.3f}"
    elif fault == NEIGHBOUR:
        value = f"u {checked.ungrounded:.3f}, m {checked.missed_text:.3f}"
    else:
        value = f"u {checked.ungrounded:.3f}"
    return f"{value} {'yes' if found else '**no**'}"


def _flags_cell(page: PageFaults, answer: str) -> str:
    checked = page.checked.get(answer)
    if checked is None:
        return "n/a"
    return ", ".join(f"**{flag}**" for flag in checked.flags) or "no flag"
