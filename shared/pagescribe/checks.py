"""Every answer checked: cleaned before it is stored, then flagged with what was measured.

Provider-agnostic and cheap: no model call, only the answer, the call's evidence (finish reason, token counts, the
offline engine's confidence), what the renderer saw of the page (ink, the PDF's own text layer, a rotation) and the
answer's grounding: the answer aligned to the page's own positioned text (the text layer's words, or a second read of
the image by the offline engine; :mod:`pagescribe.grounding`).

The flags are a fixed vocabulary. Each is stored with the value measured and the threshold that raised it:

==================== ==== =============================================================================================
flag                 hard value (threshold)
==================== ==== =============================================================================================
repetition           yes  copies of the most repeated unit, back to back or as most of the lines, beyond the page's own
                          text layer's: a loop (``FLAG_REPETITION_THRESHOLD``)
refusal              yes  share of the answer's words in apology or refusal sentences (``FLAG_REFUSAL_THRESHOLD``)
empty                yes  the page's ink when the answer has no text (``FLAG_INK_THRESHOLD``: a page with ink)
blank_render         yes  the render's share of non-white pixels although the PDF page draws text or paths
                          (``FLAG_BLANK_RENDER_THRESHOLD``)
truncated            yes  completion tokens when the model stopped at the output limit (``MAX_OUTPUT_TOKENS``)
ungrounded           yes  share of the answer's characters in runs of words nothing on the page supports: invented
                          text (``FLAG_UNGROUNDED_THRESHOLD``); also raised, whatever that share, by a block or a
                          table's row of ``FLAG_UNGROUNDED_BLOCK_CHARS`` letters and digits or more that nothing on
                          the page supports as a whole (its ``detail`` names it)
missed_text          yes  share of the page's own text (text layer or second read) in runs of words the answer does not
                          contain: dropped regions (``FLAG_MISSED_TEXT_THRESHOLD``)
low_confidence       no   the offline engine's mean recognition confidence (``FLAG_LOW_CONFIDENCE_THRESHOLD``)
rotated              no   degrees the page was turned clockwise to read upright (threshold 0: any turn is reported)
==================== ==== =============================================================================================

A hard flag means the answer is not accepted as it is: the page is escalated once to a stronger model, and fails with
the flag as its reason if the answer is still hard-flagged. Soft flags leave the page completed, with the flags shown.

``text_layer_mismatch`` (the answer's word recall against the text layer, a soft flag) is retired: ``ungrounded`` and
``missed_text`` measure the same thing in place, on scans too. It is still read in the flags of pages transcribed
before, and never raised.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # grounding (markdown-it, rapidfuzz) is loaded by the first answer grounded: ground()
    from pagescribe.grounding import PageGrounding, PageText

BLANK_PAGE = "(blank page)"  # what the default prompt asks for, and what the offline engine answers, on a blank page


class Flag(StrEnum):
    REPETITION = "repetition"
    REFUSAL = "refusal"
    EMPTY = "empty"
    BLANK_RENDER = "blank_render"
    TRUNCATED = "truncated"
    UNGROUNDED = "ungrounded"
    MISSED_TEXT = "missed_text"
    TEXT_LAYER_MISMATCH = "text_layer_mismatch"  # retired: read in older pages' flags, never raised
    LOW_CONFIDENCE = "low_confidence"
    ROTATED = "rotated"


HARD_FLAGS = frozenset(
    {Flag.REPETITION, Flag.REFUSAL, Flag.EMPTY, Flag.BLANK_RENDER, Flag.TRUNCATED, Flag.UNGROUNDED, Flag.MISSED_TEXT}
)
RETIRED_FLAGS = frozenset({Flag.TEXT_LAYER_MISMATCH})


@dataclass(frozen=True)
class PageFlag:
    """One check that fired: what it measured and the threshold it measured against."""

    flag: Flag
    value: float
    threshold: float
    detail: str = ""  # what raised it besides its value, where something else can (``ungrounded``: a whole block)

    @property
    def hard(self) -> bool:
        return self.flag in HARD_FLAGS

    def as_dict(self) -> dict[str, Any]:
        found = {"flag": self.flag.value, "value": self.value, "threshold": self.threshold}
        return found | {"detail": self.detail} if self.detail else found

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PageFlag:
        return cls(Flag(data["flag"]), float(data["value"]), float(data["threshold"]), str(data.get("detail", "")))

    def describe(self) -> str:
        """``repetition=57 (threshold 10)``; ``ungrounded=0.015 (threshold 0.02; a table row ...)``."""
        detail = f"; {self.detail}" if self.detail else ""
        return f"{self.flag.value}={_number(self.value)} (threshold {_number(self.threshold)}{detail})"


def _number(value: float) -> str:
    return f"{value:.4g}" if value != int(value) else str(int(value))


def describe_flags(flags: tuple[PageFlag, ...] | list[PageFlag]) -> str:
    return ", ".join(flag.describe() for flag in flags)


@dataclass(frozen=True)
class Thresholds:
    """The thresholds of the checks (settings ``FLAG_*``)."""

    repetition: int = 8
    refusal: float = 0.5
    ink: float = 0.002
    ungrounded: float = 0.02
    ungrounded_block_chars: int = 12  # 0: a block unsupported as a whole raises ungrounded only by its share
    missed_text: float = 0.05
    low_confidence: float = 0.8


@dataclass(frozen=True)
class PageEvidence:
    """What the renderer saw of the page the answer is for."""

    ink: float  # share of dark pixels: a page with ink has something to transcribe
    text_layer: str = ""  # a PDF page's own visible text, cleaned; empty for images and scans
    rotation: int = 0  # degrees the page image was turned clockwise before it was sent
    words: PageText | None = None  # the page's own positioned text, to ground the answer to (None: nothing to)


# --- cleaning ---------------------------------------------------------------------------------------------------------

# Non-characters (U+FDD0..U+FDEF and the last two code points of every plane) and control characters other than tab,
# line breaks and form feed never belong in text. pdfium marks a hyphen it took out at a line break with U+FFFE in a
# page's whole text and with U+0002 in the text of an area ("Ex\ufffeisting"): removing the mark, with any line break
# after it, joins the word again.
_HYPHENATION_MARK = re.compile("[\ufffe\x02](?:\r?\n)?")
_NON_CHARACTERS = re.compile(
    "[\x00-\x08\x0b\x0e-\x1f\x7f\ufdd0-\ufdef\ufffe\uffff"
    + "".join(f"{chr(plane << 16 | 0xFFFE)}{chr(plane << 16 | 0xFFFF)}" for plane in range(1, 17))
    + "]"
)
_FENCE = re.compile(r"^```[ \t]*(?P<lang>[\w+-]*)[ \t]*\n(?P<body>.*?)(?:\n[ \t]*```[ \t]*)?$", re.S)
_FENCE_LANGUAGES = frozenset({"", "markdown", "md", "text", "txt", "plaintext", "plain"})
_TAG = re.compile(
    r"^<(?P<tag>doc|document|text|transcription|transcript|markdown|md|output|answer|page|ocr)>"
    r"(?P<body>.*?)</(?P=tag)>$",
    re.S | re.I,
)
_PREAMBLE = re.compile(
    r"^(?:(?:sure|certainly|of course|okay|ok)\b[^\n]{0,40}?[.!,]\s*)?"
    r"(?:(?:here\s+is|here's|here\s+are|below\s+is|the\s+following\s+is)\b[^\n]{0,160}?"
    r"\b(?:transcri\w*|markdown|text|content|conversion|extract\w*|ocr|output)\b[^\n]{0,80}?"
    r"|(?:the\s+)?text\s+(?:in|on|from|of)\s+(?:the|this)\s+(?:image|page|document|picture)\s+(?:is|reads|says))"
    r":[ \t]*(?:\n|$)",
    re.I,
)
_CLOSING = re.compile(
    r"\n\s*(?:let me know\b|i hope (?:this|that) helps|feel free to\b|if you (?:need|have|would like|want)\b"
    r"|please let me know\b|is there anything else\b)[^\n]{0,300}$",
    re.I,
)
_QUOTED_LINE = re.compile(r'^(["\u201c])([^\n]*)["\u201d]$')


def remove_non_characters(text: str) -> str:
    """Text without non-characters and control characters; pdfium's line-end hyphenation marks join their word."""
    return _NON_CHARACTERS.sub("", _HYPHENATION_MARK.sub("", text))


def clean_answer(text: str) -> str:
    """The page's text without what a model wraps around it, and without non-characters: a preamble ("Here is the
    transcription of the page:", "The text in the image is:"), a code fence around the whole answer (```markdown …
    ```, with any remark after the closing fence), a tag around it (``<doc>…</doc>``), and after a preamble a closing
    offer ("Let me know if …") or quotes around a one-line answer. A closing remark or quotes alone are kept: they may
    be the page's own."""
    text = remove_non_characters(text).strip()
    preamble = _PREAMBLE.match(text)
    if preamble is not None:
        text = text[preamble.end() :].strip()
    fence = _FENCE.match(text)
    if fence is not None and fence.group("lang").lower() in _FENCE_LANGUAGES:
        text = _fenced_body(fence.group("body"))
    tag = _TAG.match(text)
    if tag is not None:
        text = tag.group("body").strip()
    if preamble is not None:
        text = _CLOSING.sub("", text).strip()
        text = _QUOTED_LINE.sub(r"\2", text)
    return text.strip()


def _fenced_body(body: str) -> str:
    """What a fence around the whole answer holds, without a short remark the model wrote after the closing fence
    (```` ``` ```` then "Let me know …")."""
    closing = body.rfind("\n```")
    if closing != -1 and len(body) - closing < 400 and "```" not in body[closing + 4 :]:
        tail = body[closing + 4 :].strip()
        if not tail.startswith(("`", "|", "#")) and "\n\n" not in tail:
            body = body[:closing]
    return body.strip()


# --- measures ---------------------------------------------------------------------------------------------------------

# A loop: the same unit (a word, a line, a table row, a sentence, a short paragraph; or a few characters with no space
# between them, "0.0.0.0.") written again and again back to back, whatever the line breaks between the copies; or a
# few lines, slightly changed from copy to copy ("Hakate Toolbox", "Hakete Toolbox"), that make up most of the answer.
_MAX_UNIT_WORDS = 64
_MAX_UNIT_CHARS = 16
_MIN_LOOP_CHARS = 30  # "1000000000" is a number, and "no no no" a phrase, not a loop
_MIN_LINE_CHARS = 4  # a line counts towards a loop with this many letters and digits, two of them letters
_ALNUM = re.compile(r"\w")
_LETTER = re.compile(r"[^\W\d_]")
_TABLE_TAG = re.compile(r"</?(?:table|thead|tbody|tfoot|tr|td|th|caption|br)\b[^<>]*/?>", re.IGNORECASE)


def _loop(max_unit: int, more: int) -> str:
    """A unit of 1 to ``max_unit`` symbols followed by at least ``more`` copies of itself."""
    return rf"(.{{1,{max_unit}}}?)\1{{{more},}}"


def _back_to_back(text: str, min_copies: int) -> list[tuple[int, str]]:
    """(copies, unit) of each unit with a letter in it (or digits, in one unbroken run) written at least
    ``min_copies`` times back to back over at least 30 characters (a table's row of zeros is not a loop). A unit is
    as it reads in the text with its whitespace collapsed, a unit of words with the space after it.

    Units of whole words are found on the text coded one character per distinct word, so a regular expression scans
    a few thousand symbols rather than every character with every unit length; units of a few characters on the
    text itself."""
    words = text.split()
    codes: dict[str, int] = {}
    coded = "".join(chr(0x100 + codes.setdefault(word, len(codes))) for word in words)
    more = max(1, min_copies - 1)
    found = []
    for match in re.finditer(_loop(_MAX_UNIT_WORDS, more), coded, re.S):
        size = len(match.group(1))
        unit = words[match.start() : match.start() + size]
        copies = len(match.group(0)) // size
        if copies * sum(map(len, unit)) >= _MIN_LOOP_CHARS and any(_LETTER.search(word) for word in unit):
            found.append((copies, " ".join(unit) + " "))
    for match in re.finditer(_loop(_MAX_UNIT_CHARS, more), " ".join(words), re.S):
        run, piece = match.group(0), match.group(1)
        # digits count in one unbroken run ("1111…", "0.0.0.…"), not spaced out like a table's row of zeros
        if len(run) >= _MIN_LOOP_CHARS and (_LETTER.search(piece) or (_ALNUM.search(piece) and " " not in run)):
            found.append((len(run) // len(piece), piece))
    return found


def _most_copies_in_a_row(text: str, unit: str) -> int:
    """The most copies of ``unit`` back to back in ``text`` (whitespace collapsed, with a space at the end)."""
    runs = re.findall(f"(?:{re.escape(unit)})+", " ".join(text.split()) + " ")
    return max((len(run) // len(unit) for run in runs), default=0)


def _line_keys(text: str) -> list[str]:
    """The lines that can make a loop, each as its letters and digits, case-folded."""
    return [
        key
        for line in text.splitlines()
        if len(key := "".join(ch for ch in line.casefold() if ch.isalnum())) >= _MIN_LINE_CHARS
        and sum(ch.isalpha() for ch in key) >= 2
    ]


def _dominant_line(text: str) -> tuple[int, str] | None:
    """(occurrences, line key) of the most frequent line when most of the answer's lines repeat an earlier one; a
    form that repeats a label among other lines is not this."""
    lines = _line_keys(text)
    counts = Counter(lines)
    if not lines or 2 * (len(lines) - len(counts)) < len(lines):
        return None
    key, occurrences = counts.most_common(1)[0]
    return occurrences, key


def repetition(text: str, min_copies: int, reference: str = "") -> int:
    """Copies of the answer's most repeated unit (back to back from ``min_copies`` up, or a line making up most of the
    answer) beyond the copies of that same unit in the page's own text ``reference``: a page that itself repeats a
    paragraph is transcribed faithfully when the answer repeats it too. An HTML table's tags are read as the white
    between its cells, as a markdown table's pipes are: ``<td>0</td><td>0</td>`` is a row of zeros, not a loop."""
    text = _TABLE_TAG.sub(" ", text)
    best = 0
    for copies, unit in _back_to_back(text, min_copies):
        best = max(best, copies - (_most_copies_in_a_row(reference, unit) if reference else 0))
    dominant = _dominant_line(text)
    if dominant is not None:
        occurrences, key = dominant
        best = max(best, occurrences - (_line_keys(reference).count(key) if reference else 0))
    return best


# Apologies and refusals: a sentence that says the model will not or cannot do the job, or has no image to do it on.
_REFUSAL = re.compile(
    r"(?:\b(?:i\s*(?:['\u2019]m|am)\s+(?:sorry|afraid)|sorry|i\s+apologi[sz]e|unfortunately)\b[^.!?\n]{0,120}"
    r"\b(?:can(?:no|['\u2019])t|could\s*n[o'\u2019]t|unable|not\s+able|won['\u2019]t|will\s+not|do\s+not\s+have|don['\u2019]t\s+have)\b"
    r"|\bi\s*(?:can(?:no|['\u2019])t|could\s*n[o'\u2019]t|am\s+unable\s+to|['\u2019]m\s+unable\s+to|am\s+not\s+able\s+to|['\u2019]m\s+not\s+able\s+to"
    r"|am\s+not\s+capable\s+of|['\u2019]m\s+not\s+capable\s+of|won['\u2019]t|will\s+not)\s+(?:help|assist|transcrib\w*|process\w*"
    r"|read\w*|view\w*|see|access\w*|provid\w*|comply|fulfill?|complet\w*|extract\w*|convert\w*|identify\w*"
    r"|do\s+that)\b"
    r"|\[[^\]\n]{0,40}\bredacted\]|\bredacted\s+(?:to|for)\s+(?:protect|privacy)"
    r"|\bas\s+an\s+ai\b"
    r"|\b(?:no|not\s+an?)\s+(?:image|document|file|attachment)\s+(?:was|has\s+been|is)\s+(?:provided|attached|"
    r"uploaded|included)\b"
    r"|\b(?:the\s+)?(?:image|page|document)\s+(?:is|appears\s+to\s+be)\s+(?:too\s+)?(?:blurry|unreadable|illegible"
    r"|too\s+small|too\s+low)\b)",
    re.I,
)
_SENTENCE = re.compile(r"[^.!?\n]+[.!?]*")


def refusal_share(text: str, text_layer: str = "") -> float:
    """The share of the answer's words that are in refusal sentences (0 when there are none). A sentence that the page's
    own text layer contains is the document speaking, not the model."""
    total = len(text.split())
    if total == 0:
        return 0.0
    layer = " ".join(text_layer.casefold().split())
    refused = 0
    for sentence in _SENTENCE.findall(text):
        if _REFUSAL.search(sentence) and not (layer and " ".join(sentence.casefold().split()) in layer):
            refused += len(sentence.split())
    return refused / total


def has_text(answer: str) -> bool:
    """The answer transcribes something: it has a letter or digit and is not the blank-page marker."""
    return bool(_ALNUM.search(answer)) and answer.strip().casefold() != BLANK_PAGE


def usable_text_layer(text: str) -> bool:
    """Enough real text to stand for the page (a scanned page has none, or a few stray characters)."""
    visible = "".join(text.split())
    return len(visible) >= 30 and sum(map(str.isprintable, visible)) >= 0.95 * len(visible)


# --- the check --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    """A model's answer, cleaned, with the evidence of the call that matters to the checks."""

    text: str
    finish_reason: str
    completion_tokens: int | None = None
    confidence: float | None = None  # the offline engine's mean recognition confidence


def check_answer(
    answer: Answer,
    page: PageEvidence,
    thresholds: Thresholds,
    *,
    max_output_tokens: int,
    grounding: PageGrounding | None = None,
) -> list[PageFlag]:
    """Every flag the answer raises, hard ones first, in the vocabulary's order. ``grounding``: the answer aligned to
    the page's own text (:func:`ground`), where the page has some."""
    flags: list[PageFlag] = []
    if answer.finish_reason == "length":
        flags.append(
            PageFlag(Flag.TRUNCATED, float(answer.completion_tokens or max_output_tokens), float(max_output_tokens))
        )
    copies = repetition(answer.text, thresholds.repetition, page.text_layer)
    if copies >= thresholds.repetition:
        flags.append(PageFlag(Flag.REPETITION, float(copies), float(thresholds.repetition)))
    refused = refusal_share(answer.text, page.text_layer)
    if refused >= thresholds.refusal:
        flags.append(PageFlag(Flag.REFUSAL, round(refused, 4), thresholds.refusal))
    if not has_text(answer.text) and page.ink >= thresholds.ink:
        flags.append(PageFlag(Flag.EMPTY, round(page.ink, 6), thresholds.ink))
    if grounding is not None and has_text(answer.text):
        flags += _grounding_flags(grounding, thresholds)
    if answer.confidence is not None and answer.confidence < thresholds.low_confidence:
        flags.append(PageFlag(Flag.LOW_CONFIDENCE, round(answer.confidence, 4), thresholds.low_confidence))
    if page.rotation:
        flags.append(rotated(page.rotation))
    return merge_flags([], flags)


def _grounding_flags(grounding: PageGrounding, thresholds: Thresholds) -> list[PageFlag]:
    """What the answer's grounding raises: ``ungrounded`` (by its share, or by a block or row invented as a whole) and
    ``missed_text``."""
    flags = []
    whole = _invented(grounding, thresholds.ungrounded_block_chars)
    if grounding.ungrounded > thresholds.ungrounded or whole:
        flags.append(PageFlag(Flag.UNGROUNDED, round(grounding.ungrounded, 4), thresholds.ungrounded, whole))
    if grounding.missed_text > thresholds.missed_text:
        flags.append(PageFlag(Flag.MISSED_TEXT, round(grounding.missed_text, 4), thresholds.missed_text))
    return flags


def _invented(grounding: PageGrounding, min_chars: int) -> str:
    """The largest block or table row (of ``min_chars`` letters and digits or more; 0: none) that nothing on the page
    supports as a whole, said in a few words; empty when there is none."""
    found = [unit for unit in grounding.whole if min_chars and unit.chars >= min_chars]
    if not found:
        return ""
    unit = max(found, key=lambda unit: unit.chars)
    what = "a block" if unit.row is None else "a table row"
    text = unit.text if len(unit.text) <= 40 else unit.text[:39].rstrip() + "\u2026"
    more = f" and {len(found) - 1} more" if len(found) > 1 else ""
    return f"{what} of {unit.chars} letters and digits nothing on the page supports: {text!r}{more}"


def ground(answer: str, page: PageText) -> PageGrounding:
    """The answer's blocks aligned to the page's own positioned text: each block's box, the unsupported and missed
    text that ``ungrounded`` and ``missed_text`` measure."""
    from pagescribe.blocks.parsing import parse_blocks
    from pagescribe.grounding.alignment import align

    return align(parse_blocks(answer), page)


def rotated(angle: int) -> PageFlag:
    return PageFlag(Flag.ROTATED, float(angle), 0.0)


def merge_flags(earlier: list[PageFlag], later: list[PageFlag]) -> list[PageFlag]:
    """A page's flags across its answers (the answer it escalated from, then the kept one): one per flag, the later
    answer's value where both raised it."""
    merged = {flag.flag: flag for flag in earlier} | {flag.flag: flag for flag in later}
    return sorted(merged.values(), key=lambda flag: (not flag.hard, list(Flag).index(flag.flag)))


def hard_flags(flags: list[PageFlag] | tuple[PageFlag, ...]) -> list[PageFlag]:
    return [flag for flag in flags if flag.hard]
