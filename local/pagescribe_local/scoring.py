"""Page scoring against a ground truth: text normalisation, edit distances, CER, WER, word recall and precision.

Pure standard library. The evaluation, olmOCR-bench and the benchmarks score with it; the Lambda layer does not ship
it. Edit distances use the bit-parallel algorithm of Myers (1999) in Hyyrö's (2003) formulation, with Python ints as
bit vectors of any length: one int per symbol of the alphabet is that symbol's match mask over the pattern, and each
symbol of the other sequence costs a dozen big-int operations, so two 5,000-character pages compare in milliseconds.
"""

from __future__ import annotations

import html
import math
import re
import unicodedata
from collections import Counter, deque
from collections.abc import Hashable, Iterator, Sequence

_HTML_COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
_MARKDOWN_PREFIX = re.compile(r"^[ \t]{0,3}(?:#{1,6}[ \t]+|[-*+\u2022][ \t]+)", re.MULTILINE)  # heading, list item
_TABLE_RULE = re.compile(r"^[ \t]*\|?(?:[ \t]*:?-{3,}:?[ \t]*\|)+[ \t]*:?-*:?[ \t]*$", re.MULTILINE)
_TABLE_PIPE = re.compile(r"(?<!\\)\|")
_MARKDOWN_ESCAPE = re.compile(r"\\([\\`*_{}\[\]()#+\-.!|])")
_WHITESPACE = re.compile(r"\s+")
_HTML_TAG = re.compile(r"</?[A-Za-z][A-Za-z0-9]*(?:\s[^<>]*)?/?>")
_TOKEN_SEPARATOR = re.compile(r"[\s|]+")
_TOKEN_EDGES = re.compile(r"^[\W_]+|[\W_]+$")
_HTML_ROW = re.compile(r"<tr\b[^>]*>", re.IGNORECASE)
_HTML_CELL = re.compile(r"<t[dh]\b([^>]*)>", re.IGNORECASE)
_COLSPAN = re.compile(r"colspan\s*=\s*[\"']?(\d+)", re.IGNORECASE)
_HTML_TABLE = re.compile(r"<table\b.*?</table>", re.IGNORECASE | re.DOTALL)
_TABLE_MARKUP = re.compile(r"</?(?:table|thead|tbody|tfoot|tr|td|th|caption|br)\b[^<>]*/?>", re.IGNORECASE)
_PAGE_MARKER = re.compile(
    r"^[ \t]*<!--[ \t]*page[ \t]+\d+(?:[ \t]+of[ \t]+\d+[^\n]*?)?[ \t]*-->[ \t]*$", re.MULTILINE | re.IGNORECASE
)


def _is_noncharacter(char: str) -> bool:
    code = ord(char)
    return 0xFDD0 <= code <= 0xFDEF or (code & 0xFFFE) == 0xFFFE


def plain(text: str) -> str:
    """The text without markdown's block markup, which is no part of what a page says: heading markers, list
    bullets (``-``, ``*``, ``+``, ``•``) at a line's start, a table's rule line and its cell pipes, backslash escapes,
    an HTML table's tags (its entities read as the characters they stand for). Emphasis is kept (``*`` and ``_``
    inside words are too often text)."""
    text = _HTML_TABLE.sub(lambda table: " " + html.unescape(_TABLE_MARKUP.sub(" ", table.group())) + " ", text)
    text = _TABLE_RULE.sub("", _MARKDOWN_PREFIX.sub("", text))
    return _MARKDOWN_ESCAPE.sub(r"\1", _TABLE_PIPE.sub(" ", text))


def normalize(text: str) -> str:
    """NFKC, HTML comments (so page markers) removed, markdown block markup removed (:func:`plain`), Unicode
    non-characters (U+FFFE, U+FFFF, ...) removed, every run of whitespace (form feeds and newlines included)
    collapsed to one space, stripped."""
    text = plain(_HTML_COMMENT.sub(" ", unicodedata.normalize("NFKC", text)))
    text = "".join(char for char in text if not _is_noncharacter(char))
    return _WHITESPACE.sub(" ", text).strip()


def words(text: str) -> list[str]:
    """Word tokens in order: ``normalize``d, HTML tags dropped, casefolded, split on whitespace and ``|``, and each
    token stripped of leading and trailing characters that are neither letters nor digits (punctuation and markdown
    syntax: ``# * _ | ` > - [ ] ( )``, quotes, ``%``, ``$``...); tokens left empty are dropped. Inner characters stay:
    ``"3.5"``, ``"don't"`` and ``"e-mail"`` are one token each."""
    text = _HTML_TAG.sub(" ", normalize(text)).casefold()
    return [token for raw in _TOKEN_SEPARATOR.split(text) if (token := _TOKEN_EDGES.sub("", raw))]


def _last_row(pattern: Sequence[Hashable], text: Sequence[Hashable], *, anywhere: bool) -> Iterator[int]:
    """After each symbol of ``text``, the edit distance between ``pattern`` and the text read so far (the whole of
    it, or with ``anywhere`` its best-matching suffix, i.e. a match may start anywhere). ``pattern`` is not empty."""
    full = (1 << len(pattern)) - 1
    last = 1 << (len(pattern) - 1)
    masks: dict[Hashable, int] = {}
    for index, symbol in enumerate(pattern):
        masks[symbol] = masks.get(symbol, 0) | 1 << index
    carry = 0 if anywhere else 1  # the first row is 0, 0, 0... for a search, 0, 1, 2... for a global distance
    positive, negative, score = full, 0, len(pattern)  # vertical deltas +1 / -1 in the current column
    for symbol in text:
        match = masks.get(symbol, 0)
        vertical = match | negative
        horizontal = (((match & positive) + positive) ^ positive) | match
        up = negative | (~(horizontal | positive) & full)
        down = positive & horizontal
        if up & last:
            score += 1
        elif down & last:
            score -= 1
        up = (up << 1 | carry) & full
        down = (down << 1) & full
        positive = down | (~(vertical | up) & full)
        negative = up & vertical
        yield score


def edit_distance(a: Sequence[Hashable] | str, b: Sequence[Hashable] | str) -> int:
    """Levenshtein distance (unit costs) between two strings (of characters) or two sequences of tokens."""
    if len(a) < len(b):
        a, b = b, a  # the longer one is the bit vector, the shorter one is looped over
    if not b:
        return len(a)
    return deque(_last_row(a, b, anywhere=False), maxlen=1)[0]  # the last column's score


def substring_distances(pattern: Sequence[Hashable] | str, text: Sequence[Hashable] | str) -> list[int]:
    """For each end ``i`` in 1..len(text), the least edit distance between ``pattern`` and a substring ``text[j:i]``
    (approximate matching: ``pattern`` occurs ending at ``i`` with at most k edits iff the value is <= k)."""
    if not pattern:
        return [0] * len(text)
    return list(_last_row(pattern, text, anywhere=True))


def _error_rate(reference: Sequence[str] | str, hypothesis: Sequence[str] | str) -> float:
    if not reference:
        return 0.0 if not hypothesis else 1.0
    return edit_distance(reference, hypothesis) / len(reference)


def cer(reference: str, hypothesis: str) -> float:
    """Character error rate: edit distance between the ``normalize``d texts over the normalised reference's length
    (case and punctuation count). An empty reference scores 0.0 against an empty hypothesis, else 1.0."""
    return _error_rate(normalize(reference), normalize(hypothesis))


def wer(reference: str, hypothesis: str) -> float:
    """Word error rate: the same on ``words`` tokens, so case and punctuation at word edges do not count
    ("**The** end." and "the end" score 0.0), while any other difference inside a word makes it a whole error."""
    return _error_rate(words(reference), words(hypothesis))


def recall_precision(reference: str, hypothesis: str) -> tuple[float, float]:
    """Order-insensitive word overlap: the multiset intersection of the ``words`` over the reference's count (recall)
    and over the hypothesis's count (precision). An empty reference gives recall 1.0; an empty hypothesis gives
    precision 1.0 if the reference is empty too, else 0.0 (nothing was produced of what was expected)."""
    expected, produced = Counter(words(reference)), Counter(words(hypothesis))
    common = (expected & produced).total()
    recall = common / expected.total() if expected else 1.0
    if produced:
        return recall, common / produced.total()
    return recall, 0.0 if expected else 1.0


def split_pages(text: str) -> list[str]:
    """A ground-truth file's pages, each stripped. Form feeds split pages when there are any (one trailing blank
    page, as ``pdftotext`` leaves after its last form feed, is dropped). Otherwise lines that are page markers,
    ``<!-- page N -->`` or ours ``<!-- page N of M ... -->``, split them, and the text before the first marker is
    dropped when blank once comments are removed (our transcripts open with a comment). Otherwise one page."""
    if "\f" in text:
        pages = text.split("\f")
        if len(pages) > 1 and not pages[-1].strip():
            pages.pop()
    else:
        pages = _PAGE_MARKER.split(text)
        if len(pages) > 1 and not normalize(pages[0]):
            pages.pop(0)
    return [page.strip() for page in pages]


def table_shapes(text: str) -> list[tuple[int, int]]:
    """(rows, columns) of each table in the text, in order. A markdown table is a run of lines opening with ``|``, the
    rule line not counted as a row, its columns those of the first line; an HTML table runs from a line opening with
    ``<table`` to the one holding ``</table>``, its rows its ``<tr>`` tags, its columns its first row's cells with
    their ``colspan``."""
    shapes: list[tuple[int, int]] = []
    markdown: list[str] = []
    html_rows: list[str] | None = None  # the lines of the HTML table being read
    for line in [*text.splitlines(), ""]:
        if html_rows is not None:
            html_rows.append(line)
            if "</table>" in line.lower():
                shapes.append(_html_shape("\n".join(html_rows)))
                html_rows = None
            continue
        if line.startswith("|"):
            markdown.append(line)
            continue
        if markdown:
            shapes.append((len(markdown) - 1, markdown[0].count("|") - 1))
            markdown = []
        if line.lstrip().lower().startswith("<table"):
            html_rows = [line]
            if "</table>" in line.lower():
                shapes.append(_html_shape(line))
                html_rows = None
    return shapes


def _html_shape(table: str) -> tuple[int, int]:
    rows = _HTML_ROW.split(table)[1:]
    first = _HTML_CELL.findall(rows[0]) if rows else []
    return len(rows), sum(int(span.group(1)) if (span := _COLSPAN.search(cell)) else 1 for cell in first)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (q in [0, 100]) with linear interpolation between the two nearest ranks (numpy's
    default): ``percentile(v, 50)`` is the median. Raises ValueError on no values or q out of range."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is not in [0, 100]")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return float(ordered[low] + (ordered[high] - ordered[low]) * (rank - low))
