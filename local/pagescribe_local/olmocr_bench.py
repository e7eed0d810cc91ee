"""olmOCR-bench rules (allenai/olmocr, ``olmocr/bench/``, Apache-2.0) read and checked against a page's text.

A benchmark directory holds JSONL files, one test a line, and the PDFs under ``pdfs/``. Each test names a ``pdf``
(relative to ``pdfs/``), a 1-based ``page``, an ``id`` and a ``type``; the other keys are the type's fields. This is a
reimplementation of the semantics of ``olmocr/bench/tests.py`` and ``olmocr/bench/table_parsing.py`` (read at commit
f7cfe4c2), with the standard library and, where olmocr thresholds rapidfuzz's ``partial_ratio``
(``format``, ``footnote``), rapidfuzz.

Normalisation (theirs: ``normalize_text``, tests.py lines 47-80), applied to the page and to every text a rule names:
``<br>`` becomes a space; ``<b>``/``<i>`` tags and paired ``**``/``__``/``*``/``_`` emphasis on one line are removed
(keeping the text: so ``snake_case_name`` loses its underscores, on both sides alike); whitespace runs become one
space; NFC; typographic quotes, dashes and the minus sign become ASCII ``'`` ``"`` ``-``, the micro sign becomes mu.

Rules:

* ``present`` / ``absent`` (``TextPresenceTest``, lines 128-182): fields ``text``, ``max_diffs`` (default 0),
  ``case_sensitive`` (default true; false lowercases both sides), ``first_n`` / ``last_n`` (only the first / last N
  characters of the normalised page are searched; 0 or null means no limit). The text is found when some substring
  of the searched page is within ``max_diffs`` edits (Levenshtein) of it; ``present`` passes when found, ``absent``
  when not.
* ``order`` (``TextOrderTest``, lines 185-226): fields ``before``, ``after``, ``max_diffs``; always case-sensitive.
  Passes when both are found (within ``max_diffs`` edits) and some occurrence of ``before`` starts before some
  occurrence of ``after``. Loading refuses ``max_diffs`` above half the length of either text, as olmocr does.
* ``table`` (``TableTest``, lines 341-480): fields ``cell`` and optionally ``up``, ``down``, ``left``, ``right``,
  ``top_heading``, ``left_heading`` (empty or null: not checked), ``max_diffs``, ``ignore_table_shapes``.
  Tables are markdown pipe tables (2+ consecutive lines containing ``|``; rows made only of ``- : |`` dropped; the
  first row and the first column are headings) and HTML ``<table>`` elements (``th`` cells and cells in ``thead``
  are headings; ``rowspan``/``colspan`` occupy the grid; ``<br>`` is a newline; ``rowspan="0"`` runs to the last
  row). Texts match when rapidfuzz's ``ratio`` (1 - indel distance / total length) is at least
  ``max(0.5, 1 - max_diffs / len(expected))``, computed exactly in integers: with ``max_diffs`` 0 only equal texts
  match. Passes when, in some table, some cell matches ``cell`` and every relation named is met: ``up`` etc. by one of
  the nearest cells in that direction (several when spans differ), ``top_heading`` / ``left_heading`` by one of the
  heading cells met walking up / left from the cell, or when there are none, by one of the cells where the walk
  ends (``TableData._walk_heading_relations``, table_parsing.py lines 36-67).
* ``baseline`` (``BaselineTest``, lines 484-546; ``olmocr/repeatdetect.py``): fields ``max_length`` (a blank-page
  check: passes when the page's letters and digits number at most that, and nothing else is checked),
  ``max_length_skips_image_alt_tags`` (markdown images left out of that count), ``max_repeats`` (default 30),
  ``check_disallowed_characters`` (default true). Otherwise fails on a page without a letter or digit, on one whose end
  repeats an n-gram of 1 to 5 characters (whitespace runs as one space) more than ``max_repeats`` times, and, when
  checked, on CJK ideographs, kana and emoji.
* ``format`` (``FormatTest``, lines 230-339): fields ``text``, ``format`` (``heading``, ``bold`` or ``italic``),
  ``case_sensitive`` (default true), ``max_diffs``. The texts the page writes in that format (markdown ``#`` headings
  and ``<h1>``-``<h6>``; ``**``/``__`` and ``<b>``/``<strong>``; single ``*``/``_`` and ``<i>``/``<em>``) are found
  by olmocr's own patterns on the page as written and normalised; passes when one matches ``text`` by rapidfuzz's
  ``partial_ratio`` at ``1 - max_diffs / len(text)``, as theirs.
* ``footnote`` (``FootnoteTest``, lines 617-763): fields ``marker`` (no whitespace), ``appears_before_marker``,
  ``appears_after_marker``, ``max_diffs``. The marker is found as ``[^marker]`` (not a definition),
  ``<sup>marker</sup>`` or, for digits, in Unicode superscript digits; the texts, compared as letters and digits only,
  lower case, must end the 200 characters before (begin the 200 after) one of its occurrences by ``partial_ratio``
  against a window twice the text's length, as theirs.
* ``math`` (``MathTest``, lines 549-614): fields ``math``, ``ignore_dollar_delimited``. Rendered with KaTeX in headless
  Chromium and compared as rendered: :mod:`pagescribe_local.olmocr_math`. Where no Chromium runs it is reported
  unsupported, not scored.

Deviations from olmocr:

* Fuzzy ``present``/``absent`` use "a substring within ``max_diffs`` edits" where olmocr uses rapidfuzz
  ``partial_ratio >= 1 - max_diffs / len(text)`` (tests.py lines 167-182): a window of the text's length sharing all
  but ``max_diffs`` characters, in order, with it. Equal at ``max_diffs`` 0 (an exact substring); with more, a match
  within k edits passes theirs too, but theirs also accepts, e.g., a transposition for one diff where an edit distance
  counts two: ``present`` is harder here, ``absent`` easier. Except that olmocr compares floats at the threshold, where
  rounding fails some windows that exactly meet it (in a trial, 1 text in 8 exactly k substitutions away); here
  every comparison is exact.
* rapidfuzz's ``partial_ratio`` aligns the shorter string inside the longer: a page (or a ``first_n``/``last_n``
  window) shorter than the text passes ``present`` when it is a piece of the text. Here the text must be in the page.
* With both ``first_n`` and ``last_n``, the two windows are searched separately; olmocr concatenates them, so a match
  could straddle the join (and the windows overlap on short pages).
* ``order`` occurrences: fuzzysearch keeps one best match per group of overlapping matches (tests.py line 214); here
  each run of adjacent start positions within ``max_diffs`` counts once, at its best (then leftmost) start. The two
  can differ only where matches of ``before`` and ``after`` overlap.
* HTML comments (our page markers ``<!-- page 3 of 7 ... -->``) are removed from the page before any rule, and the
  normalised page is stripped, so markers neither count towards ``first_n``/``last_n`` nor lend their digits.
  ``<br>`` is matched as ``<br\\s*/?>`` in any case (olmocr: ``<br/?>``).
* HTML tables: parsed with ``html.parser``. A new ``td``/``th``/``tr`` closes the open cell/row (HTML's implied end
  tags; BeautifulSoup's html.parser nests them instead); a nested table is a table of its own whose text also counts in
  the enclosing cell, and its rows are not rows of the enclosing table (olmocr's ``find_all("tr")`` makes them so);
  ``rowspan`` is capped at the rows left in the table (olmocr adds rows) and ``colspan`` at 1000 (HTML's limits).
* ``math``: olmocr renders each equation in a new Playwright page of its own Chromium and keeps renders in a cache
  under ``~/.cache``; here Debian's Chromium renders a batch of equations one after another in one page (the same
  HTML, KaTeX files and 800 x 400 viewport), its renders kept for the run. olmocr leaves out a span that is a
  zero-width space alone; so does this, before its characters are shared out.
* olmocr's latest release (0.4.27, the one installable, which ``tests/unit/test_olmocr_parity.py`` runs) reads tables
  the older way: a relation (``up``, ``left``...) of a cell on the table's edge, where there is no such neighbour, is
  not checked (it passes), a cell has one neighbour each way (no spans), and headings are sought in its parser's
  header rows and columns. The repository (f7cfe4c2), which this follows, checks every relation named and walks the
  grid with its spans. The parity test therefore draws its table rules from cells inside their table, whose text no
  other cell of the page has; there both agree.
* Loading: every ``*.jsonl`` under the directory is read, recursively except under ``pdfs/`` (olmocr's benchmark:
  the top level only); a test id used twice in any of the files is an error (olmocr: within one file). Unknown types
  are loaded and reported unsupported (olmocr refuses them). As olmocr's benchmark does, a ``baseline`` test of page 1
  is added for each PDF that has none (:func:`with_baselines`).
* The overall score and its interval (:func:`bench_score`) are olmocr's: the mean of the categories' (JSONL files')
  pass rates, and a bootstrap within each category; olmocr draws with numpy's unseeded generator, this with a seeded
  one, so the interval repeats from run to run here and varies slightly there.
"""

from __future__ import annotations

import functools
import json
import random
import re
import unicodedata
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any, NamedTuple

from rapidfuzz import fuzz

from pagescribe_local.olmocr_math import KatexRenderer, MathUnavailableError, check_math
from pagescribe_local.scoring import percentile, substring_distances

SUPPORTED_TYPES = frozenset({"present", "absent", "order", "table", "baseline", "format", "footnote", "math"})

_TEXT_FIELDS = {
    "present": ("text",),
    "absent": ("text",),
    "order": ("before", "after"),
    "table": ("cell",),
    "format": ("text", "format"),
    "footnote": ("marker",),
    "baseline": (),
    "math": ("math",),
}
_RELATIONS = ("up", "down", "left", "right", "top_heading", "left_heading")
_MAX_COLSPAN = 1000

_HTML_COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
_NORMALISATION = (
    (re.compile(r"<br\s*/?>", re.IGNORECASE), " "),
    (re.compile(r"\*\*(.*?)\*\*"), r"\1"),
    (re.compile(r"__(.*?)__"), r"\1"),
    (re.compile(r"</?[bi]>"), ""),
    (re.compile(r"(\*\*|__)(.*?)\1"), r"\2"),
    (re.compile(r"([*_])(.*?)\1"), r"\2"),
    (re.compile(r"\s+"), " "),
)
_TO_ASCII = str.maketrans(
    {
        "\u2018": "'",
        "\u2019": "'",
        "\u201a": "'",
        "\u201c": '"',
        "\u201d": '"',
        "\u201e": '"',
        "\uff3f": "_",
        "\u2013": "-",
        "\u2014": "-",
        "\u2011": "-",
        "\u2012": "-",
        "\u2212": "-",
        "\u00b5": "\u03bc",
    }
)

Cell = tuple[int, int]  # (row, column) of a cell's top-left slot


@dataclass(frozen=True)
class BenchTest:
    """One olmOCR-bench test; ``fields`` holds the type's own keys. Validated on creation (ValueError)."""

    id: str
    pdf: str
    page: int
    type: str
    fields: dict[str, Any]
    category: str = ""  # the JSONL file it came from (its stem), as olmOCR-bench groups its scores

    def __post_init__(self) -> None:
        for name in ("id", "pdf", "type"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ValueError(f"{name!r} must be a non-empty string, not {value!r}")
        if not _is_int(self.page) or self.page < 1:
            raise ValueError(f"'page' must be an integer >= 1, not {self.page!r}")
        if self.type in SUPPORTED_TYPES:
            _validate_fields(self.type, self.fields)


@dataclass(frozen=True)
class RuleResult:
    """A test checked on a page; ``passed`` is None when the rule type is not supported (not scored)."""

    test_id: str
    type: str
    passed: bool | None
    explanation: str
    category: str = ""


def load_tests(bench_dir: Path) -> list[BenchTest]:
    """Every test in every ``*.jsonl`` file under ``bench_dir`` (recursively, not under ``pdfs/``), files in path
    order, blank lines skipped. Raises ValueError naming the file and line of a line that is not a valid test, or of a
    test id seen before, and NotADirectoryError when ``bench_dir`` is not a directory."""
    if not bench_dir.is_dir():
        raise NotADirectoryError(f"olmOCR-bench directory not found: {bench_dir}")
    tests: list[BenchTest] = []
    first_seen: dict[str, str] = {}
    for path in sorted(bench_dir.rglob("*.jsonl")):
        if path.is_relative_to(bench_dir / "pdfs"):
            continue
        for number, line in enumerate(path.read_bytes().splitlines(), start=1):
            if not line.strip():
                continue
            where = f"{path}, line {number}"
            try:
                test = _parse_test(
                    json.loads(line.decode("utf-8")), path.relative_to(bench_dir).with_suffix("").as_posix()
                )
            except ValueError as error:  # bad UTF-8 and bad JSON are ValueErrors too
                raise ValueError(f"{where}: {error}") from error
            if test.id in first_seen:
                raise ValueError(f"{where}: duplicate test id {test.id!r}, first at {first_seen[test.id]}")
            first_seen[test.id] = where
            tests.append(test)
    return tests


def check(test: BenchTest, page_text: str, renderer: KatexRenderer | None = None) -> RuleResult:
    """Check one test against the text produced for its page; an unsupported type gives ``passed`` None, as does a
    ``math`` test where no Chromium renders (``renderer``, else one found on this machine)."""
    if test.type not in SUPPORTED_TYPES:
        supported = ", ".join(sorted(SUPPORTED_TYPES))
        explanation = f"unsupported rule type {test.type!r} (supported: {supported})"
        return RuleResult(test.id, test.type, None, explanation, test.category)
    page = _HTML_COMMENT.sub(" ", page_text)
    if test.type == "math":
        try:
            passed, explanation = check_math(test.fields, page_text, renderer or _katex())
        except MathUnavailableError as exc:
            return RuleResult(test.id, test.type, None, str(exc), test.category)
    elif test.type in _ON_THE_PAGE_AS_WRITTEN:
        passed, explanation = _ON_THE_PAGE_AS_WRITTEN[test.type](test.fields, page)
    elif test.type == "order":
        passed, explanation = _check_order(test.fields, _normalise(page).strip())
    else:
        passed, explanation = _check_presence(test.type == "present", test.fields, _normalise(page).strip())
    return RuleResult(test.id, test.type, passed, explanation, test.category)


@functools.cache
def _katex() -> KatexRenderer:
    """One renderer for the process, its renders remembered (a benchmark names the same equations again)."""
    return KatexRenderer()


def pass_rates(results: Iterable[RuleResult]) -> dict[str, tuple[int, int]]:
    """Per rule type (sorted): (passed, scored); an unsupported type is listed with (0, 0)."""
    counts: dict[str, tuple[int, int]] = {}
    for result in results:
        passed, scored = counts.get(result.type, (0, 0))
        if result.passed is not None:
            passed, scored = passed + result.passed, scored + 1
        counts[result.type] = (passed, scored)
    return dict(sorted(counts.items()))


def with_baselines(tests: Sequence[BenchTest]) -> list[BenchTest]:
    """The tests and, as olmOCR-bench's runner adds them, a ``baseline`` test of page 1 of each PDF that has none
    (id ``<pdf>_baseline``, category ``baseline``)."""
    has = {test.pdf for test in tests if test.type == "baseline"}
    added = [
        BenchTest(f"{pdf}_baseline", pdf, 1, "baseline", {}, "baseline")
        for pdf in dict.fromkeys(test.pdf for test in tests)
        if pdf not in has
    ]
    return [*tests, *added]


@dataclass(frozen=True)
class BenchScore:
    """olmOCR-bench's figures of a run: each category's pass rate (its JSONL file's tests that passed), the overall
    score (the mean of the categories' rates) and its bootstrap confidence interval."""

    categories: dict[str, tuple[int, int]]  # (passed, scored) by category
    overall: float
    interval: tuple[float, float]
    level: float


def bench_score(
    results: Iterable[RuleResult], *, samples: int = 1000, level: float = 0.95, seed: int = 0
) -> BenchScore | None:
    """The benchmark's own figures (olmocr ``benchmark.py``, ``utils.calculate_bootstrap_ci``): the overall score is
    the mean of the categories' pass rates, and its interval the ``level`` percentiles (numpy's linear
    interpolation) of that mean over ``samples`` resamplings, each category's tests drawn with replacement within it
    (a seeded generator, so a run repeats its interval). Tests not scored (unsupported) are left out; None when no
    test was scored."""
    by_category: dict[str, list[float]] = {}
    for result in results:
        if result.passed is not None:
            by_category.setdefault(result.category or "tests", []).append(1.0 if result.passed else 0.0)
    if not by_category:
        return None
    groups = list(by_category.values())
    rng = random.Random(seed)  # noqa: S311 - a bootstrap, not a secret
    means = []
    for _ in range(samples):
        drawn = [sum(rng.choices(group, k=len(group))) / len(group) for group in groups]
        means.append(sum(drawn) / len(drawn))
    tail = (1 - level) / 2 * 100
    return BenchScore(
        {name: (int(sum(scores)), len(scores)) for name, scores in sorted(by_category.items())},
        sum(sum(group) / len(group) for group in groups) / len(groups),
        (percentile(means, tail), percentile(means, 100 - tail)),
        level,
    )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _parse_test(data: object, category: str) -> BenchTest:
    if not isinstance(data, dict):
        raise ValueError(f"a test must be a JSON object, not {type(data).__name__}")
    fields = dict(data)
    missing = [name for name in ("id", "pdf", "page", "type") if name not in fields]
    if missing:
        raise ValueError(f"missing {', '.join(missing)}")
    return BenchTest(
        id=fields.pop("id"),
        pdf=fields.pop("pdf"),
        page=fields.pop("page"),
        type=fields.pop("type"),
        fields=fields,
        category=category,
    )


def _validate_fields(rule: str, fields: dict[str, Any]) -> None:
    max_diffs = fields.get("max_diffs", 0)
    if not _is_int(max_diffs) or max_diffs < 0:
        raise ValueError(f"'max_diffs' must be an integer >= 0, not {max_diffs!r}")
    for name in _TEXT_FIELDS[rule]:
        value = fields.get(name)
        if not isinstance(value, str):
            raise ValueError(f"a {rule} test needs a string {name!r}, not {value!r}")
        if rule not in ("table", "footnote") and not _normalise(value).strip():
            raise ValueError(f"{name!r} is blank")
    if rule in _VALIDATORS:
        _VALIDATORS[rule](fields)
    elif rule in ("present", "absent"):
        _validate_presence(fields)
    elif rule == "order":
        shortest = min(len(_normalise(fields["before"])), len(_normalise(fields["after"])))
        if max_diffs > shortest // 2:
            raise ValueError(f"'max_diffs' {max_diffs} is more than half the length of 'before' or 'after'")
    else:
        _validate_table(fields)


def _validate_presence(fields: dict[str, Any]) -> None:
    if not isinstance(fields.get("case_sensitive", True), bool):
        raise ValueError(f"'case_sensitive' must be true or false, not {fields['case_sensitive']!r}")
    for name in ("first_n", "last_n"):
        value = fields.get(name)
        if value is not None and (not _is_int(value) or value < 0):
            raise ValueError(f"{name!r} must be an integer >= 0 or null, not {value!r}")


def _validate_table(fields: dict[str, Any]) -> None:
    for name in _RELATIONS:
        value = fields.get(name)
        if value is not None and not isinstance(value, str):
            raise ValueError(f"{name!r} must be a string or null, not {value!r}")
    if not isinstance(fields.get("ignore_table_shapes", False), bool):
        raise ValueError(f"'ignore_table_shapes' must be true or false, not {fields['ignore_table_shapes']!r}")


def _normalise(text: str) -> str:
    for pattern, replacement in _NORMALISATION:
        text = pattern.sub(replacement, text)
    return unicodedata.normalize("NFC", text).translate(_TO_ASCII)


def _quote(text: str) -> str:
    return repr(text if len(text) <= 60 else text[:57] + "...")


# --- present, absent, order ---------------------------------------------------------------------------------------


def _closest(text: str, windows: list[str]) -> int:
    """The least edit distance between ``text`` and a substring of one of the windows."""
    return min(min(substring_distances(text, window), default=len(text)) for window in windows)


def _check_presence(present: bool, fields: dict[str, Any], page: str) -> tuple[bool, str]:
    text, max_diffs = _normalise(fields["text"]), fields.get("max_diffs", 0)
    if not fields.get("case_sensitive", True):
        text, page = text.lower(), page.lower()
    first_n, last_n = fields.get("first_n"), fields.get("last_n")
    limits = [(page[:first_n], f"the first {first_n} characters")] if first_n else []
    if last_n:
        limits.append((page[-last_n:], f"the last {last_n} characters"))
    distance = _closest(text, [window for window, _ in limits] or [page])
    if (distance <= max_diffs) == present:
        return True, ""
    scope = " in " + " and ".join(where for _, where in limits) if limits else ""
    if present:
        return False, f"{_quote(text)} not found{scope} within {max_diffs} edit(s); the closest is {distance} away"
    return False, f"{_quote(text)} found{scope} {distance} edit(s) away (max_diffs {max_diffs})"


def _occurrences(text: str, page: str, max_diffs: int) -> list[int]:
    """Start positions of ``text`` in ``page`` within ``max_diffs`` edits, one per run of adjacent starts (its best)."""
    distances = substring_distances(text[::-1], page[::-1])[::-1]  # by start position: best match starting there
    starts: list[int] = []
    best: int | None = None
    for start, distance in enumerate([*distances, max_diffs + 1]):  # the sentinel closes the last run
        if distance <= max_diffs:
            if best is None or distance < distances[best]:
                best = start
        elif best is not None:
            starts.append(best)
            best = None
    return starts


def _check_order(fields: dict[str, Any], page: str) -> tuple[bool, str]:
    before, after, max_diffs = _normalise(fields["before"]), _normalise(fields["after"]), fields.get("max_diffs", 0)
    before_starts = _occurrences(before, page, max_diffs)
    after_starts = _occurrences(after, page, max_diffs)
    for name, text, starts in (("before", before, before_starts), ("after", after, after_starts)):
        if not starts:
            return False, f"{name!r} text {_quote(text)} not found within {max_diffs} edit(s)"
    if before_starts[0] < after_starts[-1]:
        return True, ""
    return False, f"{_quote(before)} does not appear before {_quote(after)}"


# --- table ------------------------------------------------------------------------------------------------------------


class _Spec(NamedTuple):
    text: str
    rowspan: int
    colspan: int
    heading: bool


@dataclass(frozen=True)
class _Table:
    text: dict[Cell, str]
    headings: set[Cell]
    neighbours: dict[str, dict[Cell, set[Cell]]]  # "up", "down", "left", "right": the nearest other cells


def _build_table(rows: list[list[_Spec]]) -> _Table | None:
    """Lay the cells out on a grid (each takes the first free slot of its row) and find their neighbours."""
    owner, placed = _lay_out(rows)
    if not placed:
        return None
    height = max(row for row, _ in owner) + 1
    width = max(column for _, column in owner) + 1
    neighbours: dict[str, dict[Cell, set[Cell]]] = {name: {} for name in ("up", "down", "left", "right")}
    for cell, spec in placed.items():
        for name, slot_lines in _outward_lines(cell, spec, height, width).items():
            neighbours[name][cell] = _nearest_others(cell, slot_lines, owner)
    text = {cell: spec.text for cell, spec in placed.items()}
    return _Table(text, {cell for cell, spec in placed.items() if spec.heading}, neighbours)


def _lay_out(rows: list[list[_Spec]]) -> tuple[dict[Cell, Cell], dict[Cell, _Spec]]:
    """Which cell owns each slot of the grid, and each cell (its top-left slot) with its spec, in reading order."""
    owner: dict[Cell, Cell] = {}
    placed: dict[Cell, _Spec] = {}
    for row, specs in enumerate(rows):
        column = 0
        for spec in specs:
            while (row, column) in owner:
                column += 1
            cell = (row, column)
            placed[cell] = spec
            owner.update(dict.fromkeys(_slots(cell, spec), cell))
            column += spec.colspan
    return owner, placed


def _slots(cell: Cell, spec: _Spec) -> list[Cell]:
    """The slots a cell placed at ``cell`` covers, row by row."""
    row, column = cell
    return [(r, c) for r in range(row, row + spec.rowspan) for c in range(column, column + spec.colspan)]


def _outward_lines(cell: Cell, spec: _Spec, height: int, width: int) -> dict[str, list[list[Cell]]]:
    """Per row or column the cell spans, the slots outwards from it in each direction, nearest first."""
    first_row, first_column = cell
    last_row, last_column = first_row + spec.rowspan - 1, first_column + spec.colspan - 1
    rows_spanned, columns_spanned = range(first_row, last_row + 1), range(first_column, last_column + 1)
    return {
        "up": [[(r, c) for r in range(first_row - 1, -1, -1)] for c in columns_spanned],
        "down": [[(r, c) for r in range(last_row + 1, height)] for c in columns_spanned],
        "left": [[(r, c) for c in range(first_column - 1, -1, -1)] for r in rows_spanned],
        "right": [[(r, c) for c in range(last_column + 1, width)] for r in rows_spanned],
    }


def _nearest_others(cell: Cell, slot_lines: list[list[Cell]], owner: dict[Cell, Cell]) -> set[Cell]:
    """Along each line of slots, the first cell other than ``cell`` met (none where the line meets none)."""
    nearest = (next((owner[s] for s in slots if owner.get(s, cell) != cell), None) for slots in slot_lines)
    return {other for other in nearest if other is not None}


def _heading_walk(table: _Table, start: Cell, direction: str) -> set[Cell]:
    """The heading cells met walking from ``start`` in ``direction`` (up or left), or else the cells where it ends."""
    relation = table.neighbours[direction]
    seen, to_visit = {start}, [start]
    headings: set[Cell] = set()
    ends: set[Cell] = set()
    while to_visit:
        cell = to_visit.pop()
        if cell != start:
            if cell in table.headings:
                headings.add(cell)
            if not relation[cell]:
                ends.add(cell)
        for other in relation[cell] - seen:
            seen.add(other)
            to_visit.append(other)
    return headings or ends


def _related(table: _Table, cell: Cell, relation: str) -> set[Cell]:
    if relation == "top_heading":
        return _heading_walk(table, cell, "up")
    if relation == "left_heading":
        return _heading_walk(table, cell, "left")
    return table.neighbours[relation][cell]


def _table_shapes(page: str) -> list[_Table]:
    """The page's markdown pipe tables."""
    return [table for block in _pipe_blocks(page) if (table := _markdown_table(block))]


def _pipe_blocks(page: str) -> Iterator[list[str]]:
    """The page's runs of two or more consecutive lines containing ``|``."""
    block: list[str] = []
    for line in [*page.strip().split("\n"), ""]:  # the blank sentinel closes a table at the end
        if "|" in line:
            block.append(line)
            continue
        if len(block) >= 2:
            yield block
        block = []


def _markdown_table(block: list[str]) -> _Table | None:
    """A pipe table's cells, its first row and first column the headings; delimiter rows dropped."""
    rows = [
        _pipe_cells(body)
        for line in block
        if not set(body := line.strip()) <= set("-:| \t")  # the delimiter row, or a row of nothing
    ]
    specs = [[_Spec(text, 1, 1, r == 0 or c == 0) for c, text in enumerate(row)] for r, row in enumerate(rows)]
    return _build_table(specs)


def _pipe_cells(body: str) -> list[str]:
    """A pipe table row's cell texts, without the empty ones its leading and trailing pipes would make."""
    cells = [cell.strip() for cell in body.split("|")]
    if cells[0] == "":  # the leading pipe
        cells.pop(0)
    if cells and cells[-1] == "":  # the trailing pipe
        cells.pop()
    return cells


@dataclass
class _OpenCell:
    parts: list[str]
    rowspan: str | None
    colspan: str | None
    heading: bool


@dataclass
class _OpenTable:
    rows: list[list[_OpenCell]] = field(default_factory=list)
    in_head: bool = False
    in_row: bool = False
    cell: _OpenCell | None = None


def _span(value: str | None, limit: int, zero: int) -> int:
    """An HTML rowspan/colspan: 1 unless a positive integer (0 means ``zero``), at most ``limit``."""
    try:
        span = int(value) if value is not None else 1
    except ValueError:
        return 1
    return max(1, min(zero if span == 0 else span, limit))


class _HtmlTables(HTMLParser):
    """Collects the ``<table>`` elements of a page as ``_Table``s."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tables: list[_Table] = []
        self._open: list[_OpenTable] = []  # nested tables, innermost last

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table":
            self._open.append(_OpenTable())
        elif tag == "br":
            self.handle_data("\n")
        elif self._open:
            table = self._open[-1]
            if tag == "thead":
                table.in_head = True
            elif tag in ("tbody", "tfoot"):
                table.in_head = False
            elif tag == "tr":
                table.rows.append([])
                table.in_row, table.cell = True, None
            elif tag in ("td", "th"):
                if not table.in_row:
                    table.rows.append([])
                    table.in_row = True
                values = dict(attrs)
                table.cell = _OpenCell([], values.get("rowspan"), values.get("colspan"), tag == "th" or table.in_head)
                table.rows[-1].append(table.cell)

    def handle_endtag(self, tag: str) -> None:
        if not self._open:
            return
        table = self._open[-1]
        if tag == "table":
            self._finish()
        elif tag == "thead":
            table.in_head = False
        elif tag == "tr":
            table.in_row, table.cell = False, None
        elif tag in ("td", "th"):
            table.cell = None

    def handle_data(self, data: str) -> None:
        for table in self._open:  # a nested table's text is also its enclosing cell's text
            if table.cell is not None:
                table.cell.parts.append(data)

    def close(self) -> None:
        super().close()
        while self._open:
            self._finish()

    def _finish(self) -> None:
        rows = self._open.pop().rows
        specs = [
            [
                _Spec(
                    "".join(cell.parts).strip(),
                    _span(cell.rowspan, limit=len(rows) - index, zero=len(rows) - index),
                    _span(cell.colspan, limit=_MAX_COLSPAN, zero=1),
                    cell.heading,
                )
                for cell in row
            ]
            for index, row in enumerate(rows)
        ]
        if table := _build_table(specs):
            self.tables.append(table)


def _html_tables(page: str) -> list[_Table]:
    parser = _HtmlTables()
    parser.feed(page)
    parser.close()
    return parser.tables


def _lcs_length(a: str, b: str) -> int:
    """Longest common subsequence, bit-parallel (Allison-Dix / Hyyrö): zero bits of ``v`` mark matched characters."""
    if not a or not b:
        return 0
    masks: dict[str, int] = {}
    for index, char in enumerate(a):
        masks[char] = masks.get(char, 0) | 1 << index
    full = (1 << len(a)) - 1
    v = full
    for char in b:
        u = v & masks.get(char, 0)
        v = ((v + u) | (v - u)) & full
    return len(a) - v.bit_count()


def _similar(expected: str, actual: str, max_diffs: int) -> bool:
    """rapidfuzz ``ratio`` (1 - indel / total length) >= max(0.5, 1 - max_diffs / len(expected)), in integers."""
    total = len(expected) + len(actual)
    indel = total - 2 * _lcs_length(expected, actual)
    return 2 * indel <= total and indel * max(len(expected), 1) <= max_diffs * total


def _check_table(fields: dict[str, Any], page: str) -> tuple[bool, str]:
    cell_text, max_diffs = _normalise(fields["cell"]), fields.get("max_diffs", 0)
    relations = {name: expected for name in _RELATIONS if (expected := _normalise(fields.get(name) or ""))}
    tables = ([] if fields.get("ignore_table_shapes", False) else _table_shapes(page)) + _html_tables(page)
    if not tables:
        return False, "no table found on the page"
    failures: list[str] = []
    for number, table in enumerate(tables, start=1):
        for cell, text in table.text.items():
            if not _similar(cell_text, _normalise(text), max_diffs):
                continue
            unmet = _unmet_relations(table, cell, relations, max_diffs)
            if not unmet:
                return True, ""
            failures.append(f"table {number} row {cell[0] + 1} column {cell[1] + 1}: {', '.join(unmet)}")
    if not failures:
        return False, f"no cell matches {_quote(cell_text)} in {len(tables)} table(s)"
    return False, f"cells match {_quote(cell_text)} but not their neighbours: {'; '.join(failures[:3])}"


def _unmet_relations(table: _Table, cell: Cell, relations: dict[str, str], max_diffs: int) -> list[str]:
    """The relations (``up``, ``top_heading``...) of a cell that none of its related cells meets, said as such."""
    return [
        f"{name} is not {_quote(expected)}"
        for name, expected in relations.items()
        if not any(
            _similar(expected, _normalise(table.text[other]), max_diffs) for other in _related(table, cell, name)
        )
    ]


# --- baseline, format, footnote ---------------------------------------------------------------------------------------

_DISALLOWED = re.compile(
    "[\u4e00-\u9fff\u3040-\u309f\u30a0-\u30ff\U0001f600-\U0001f64f\U0001f300-\U0001f5ff\U0001f680-\U0001f6ff"
    "\U0001f1e0-\U0001f1ff]"
)  # CJK ideographs, hiragana, katakana, emoji (olmocr's BaselineTest)
_IMAGE = re.compile(r"!\[.*?\]\(.*?\)")
_FORMATS = {
    "heading": ((r"^#{1,6}\s+(.+?)$", re.MULTILINE), (r"<h[1-6][^>]*>(.*?)</h[1-6]>", re.IGNORECASE | re.DOTALL)),
    "bold": (
        (r"\*\*(.*?)\*\*", re.DOTALL),
        (r"__(.*?)__", re.DOTALL),
        (r"<b[^>]*>(.*?)</b>", re.IGNORECASE | re.DOTALL),
        (r"<strong[^>]*>(.*?)</strong>", re.IGNORECASE | re.DOTALL),
    ),
    "italic": (
        (r"(?<!\*)\*(?!\*)(.*?)(?<!\*)\*(?!\*)", re.DOTALL),
        (r"(?<!_)_(?!_)(.*?)(?<!_)_(?!_)", re.DOTALL),
        (r"<i[^>]*>(.*?)</i>", re.IGNORECASE | re.DOTALL),
        (r"<em[^>]*>(.*?)</em>", re.IGNORECASE | re.DOTALL),
    ),
}
_SUPERSCRIPT = str.maketrans("0123456789", "\u2070\u00b9\u00b2\u00b3\u2074\u2075\u2076\u2077\u2078\u2079")
_FOOTNOTE_REACH = 200  # characters looked at before and after a marker


def _alnum_count(text: str) -> int:
    return sum(char.isalnum() for char in text)


def ngram_repeats(text: str, max_size: int = 5) -> list[int]:
    """For each n from 1 to ``max_size``: how many times the text's last n characters repeat back to back at its end
    (whitespace runs counted as one space), as olmocr's RepeatDetector counts them."""
    text = re.sub(r"\s+", " ", text)
    counts = [0] * max_size
    for size in range(1, max_size + 1):
        if len(text) < size:
            continue
        target, at = text[-size:], len(text) - size
        while at >= 0 and text[at : at + size] == target:
            counts[size - 1] += 1
            at -= size
    return counts


def _check_baseline(fields: dict[str, Any], page: str) -> tuple[bool, str]:
    max_length = fields.get("max_length")
    if max_length is not None:
        counted = _IMAGE.sub("", page) if fields.get("max_length_skips_image_alt_tags", False) else page
        length = _alnum_count(counted)
        if length > max_length:
            return False, f"{length} characters were output for a page expected to be blank (max_length {max_length})"
        return True, ""
    if not _alnum_count(page):
        return False, "the text has no letter or digit"
    limit = fields.get("max_repeats", 30)
    for size, repeats in enumerate(ngram_repeats(page), start=1):
        if repeats > limit:
            return False, f"the text ends with {repeats} repeats of a {size}-character n-gram (max_repeats {limit})"
    found = _DISALLOWED.findall(page)
    if fields.get("check_disallowed_characters", True) and found:
        return False, f"the text has disallowed characters: {''.join(found[:10])!r}"
    return True, ""


def _check_format(fields: dict[str, Any], page: str) -> tuple[bool, str]:
    text, kind, max_diffs = _normalise(fields["text"]), fields["format"], fields.get("max_diffs", 0)
    found = [_normalise(match) for pattern, flags in _FORMATS[kind] for match in re.findall(pattern, page, flags)]
    if not fields.get("case_sensitive", True):
        text, found = text.lower(), [candidate.lower() for candidate in found]
    threshold = 1.0 - max_diffs / (len(text) or 1)
    if any(fuzz.partial_ratio(text, candidate) / 100.0 >= threshold for candidate in found):
        return True, ""
    return False, f"{_quote(text)} not found as {kind} text ({len(found)} {kind} text(s) on the page)"


def _footnote_markers(marker: str, page: str) -> list[tuple[int, int]]:
    spans = [m.span() for m in re.finditer(rf"\[\^{re.escape(marker)}\](?!:)", page)]
    spans += [m.span() for m in re.finditer(rf"<sup[^>]*>{re.escape(marker)}</sup>", page, re.IGNORECASE)]
    if marker.isascii() and marker.isdigit():
        spans += [m.span() for m in re.finditer(re.escape(marker.translate(_SUPERSCRIPT)), page)]
    return spans


def _letters(text: str) -> str:
    return "".join(char for char in _normalise(text) if char.isalnum()).lower()


def _next_to(target: str, texts: Iterable[str], max_diffs: int, *, before: bool) -> bool:
    """Some text (cleaned to letters and digits) has ``target`` at its end (``before``) or start, as olmocr checks it:
    partial_ratio against a window twice the target's length."""
    wanted = _letters(target)
    threshold = 1.0 - max_diffs / (len(target) or 1)
    for text in map(_letters, texts):
        if text:
            length = min(len(text), 2 * len(wanted))
            window = text[-length:] if before else text[:length]
            if fuzz.partial_ratio(wanted, window) / 100.0 >= threshold:
                return True
    return False


def _check_footnote(fields: dict[str, Any], page: str) -> tuple[bool, str]:
    marker, max_diffs = fields["marker"], fields.get("max_diffs", 0)
    spans = _footnote_markers(marker, page)
    if not spans:
        return False, f"footnote marker {marker!r} not found as [^{marker}], <sup>{marker}</sup> or superscript"
    failures = []
    before, after = fields.get("appears_before_marker"), fields.get("appears_after_marker")
    if before and not _next_to(
        before, (page[max(0, a - _FOOTNOTE_REACH) : a] for a, _ in spans), max_diffs, before=True
    ):
        failures.append(f"{_quote(before)} not found before marker {marker!r}")
    if after and not _next_to(after, (page[b : b + _FOOTNOTE_REACH] for _, b in spans), max_diffs, before=False):
        failures.append(f"{_quote(after)} not found after marker {marker!r}")
    return not failures, "; ".join(failures)


def _validate_baseline(fields: dict[str, Any]) -> None:
    for name in ("max_length", "max_repeats"):
        value = fields.get(name)
        if value is not None and (not _is_int(value) or value < 0):
            raise ValueError(f"{name!r} must be an integer >= 0 or null, not {value!r}")
    for name in ("max_length_skips_image_alt_tags", "check_disallowed_characters"):
        if not isinstance(fields.get(name, False), bool):
            raise ValueError(f"{name!r} must be true or false, not {fields[name]!r}")


def _validate_format(fields: dict[str, Any]) -> None:
    if fields["format"] not in _FORMATS:
        raise ValueError(f"'format' must be heading, bold or italic, not {fields['format']!r}")
    if not isinstance(fields.get("case_sensitive", True), bool):
        raise ValueError(f"'case_sensitive' must be true or false, not {fields['case_sensitive']!r}")


def _validate_footnote(fields: dict[str, Any]) -> None:
    if not fields["marker"] or " " in fields["marker"]:
        raise ValueError(f"'marker' must be non-empty and hold no space, not {fields['marker']!r}")
    for name in ("appears_before_marker", "appears_after_marker"):
        value = fields.get(name)
        if value is not None and (not isinstance(value, str) or (value and not _normalise(value).strip())):
            raise ValueError(f"{name!r} must be a string with text, or null, not {value!r}")


def _validate_math(fields: dict[str, Any]) -> None:
    flag = fields.get("ignore_dollar_delimited", False)
    if not isinstance(flag, bool):
        raise ValueError(f"'ignore_dollar_delimited' must be true or false, not {flag!r}")


_ON_THE_PAGE_AS_WRITTEN = {
    "table": _check_table,
    "baseline": _check_baseline,
    "format": _check_format,
    "footnote": _check_footnote,
}  # the rules that read the page as written (comments removed), not normalised first
_VALIDATORS = {
    "baseline": _validate_baseline,
    "format": _validate_format,
    "footnote": _validate_footnote,
    "math": _validate_math,
}
