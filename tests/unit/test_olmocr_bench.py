"""olmOCR-bench test files read, and their present / absent / order / table rules checked against page texts.

The JSONL lines are in olmOCR-bench's own format: field names and shapes as in allenai/olmocr's
``olmocr/bench/sample_data/dataset.jsonl`` (e.g. ``{"pdf": "multi_column_miss.pdf", "page": 1, "id":
"multi_column_miss_02", "type": "present", "text": "...", "max_diffs": 2}``, ``{"pdf": "olmo2-pg4.pdf", "page": 1,
"id": "olmo2-pg4_table01", "type": "table", "cell": "3.32T", "left": "3.71T"}``, the headers_footers lines with
``"last_n": 20``, ``"checked": "verified"``, ``"case_sensitive": false``) and ``olmocr/bench/miners/mine_old_scans.py``
(``"first_n": null, "last_n": null``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pagescribe_local.olmocr_bench import (
    SUPPORTED_TYPES,
    BenchTest,
    RuleResult,
    bench_score,
    check,
    load_tests,
    pass_rates,
    with_baselines,
)
from pagescribe_local.olmocr_math import KatexRenderer, equations_in

PAGE = """<!-- page 2 of 9 (openai gpt-4o) -->

# Corporate social responsibility and the tobacco industry: hope or hype?

The term “corporate social responsibility” is in vogue at the moment but as a concept it is vague and means
different things to different people.

Over the past three decades increasing pressure from **non-governmental** organisations has grown.

Downloaded from tobaccocontrol.bmj.com on 12 May 2004

17"""

MARKDOWN_TABLE = """Table 1 Composition of the pretraining data for OLMo 2.

| Source | Type | Tokens | Words |
|--------|------|--------|-------|
| DCLM | Web pages | 3.71T | 3.32T |
| arXiv | Papers | 20.8B | 12.2B |
| OpenWebMath | Math | 12.2B | 11.8B |
| Algebraic Stack | Code | 11.8B | 3.7B |

Notes follow."""

HTML_TABLE = """<table>
  <thead>
    <tr><th rowspan="2">Category</th><th colspan="2">Quarterly sales</th></tr>
    <tr><th>Q1</th><th>Q2</th></tr>
  </thead>
  <tbody>
    <tr><td rowspan="2">Electronics</td><td>245</td><td>278</td></tr>
    <tr><td>187</td><td>192<br>(revised)</td></tr>
    <tr><td>Furniture</td><td>112</td><td>128</td></tr>
  </tbody>
</table>"""


def rule(type_: str, **fields: Any) -> BenchTest:
    return BenchTest(id=f"doc_{type_}_00", pdf="doc.pdf", page=1, type=type_, fields=fields)


def passes(test: BenchTest, page: str) -> bool | None:
    return check(test, page).passed


def write_jsonl(path: Path, lines: list[dict[str, Any] | str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


# --- loading ----------------------------------------------------------------------------------------------------------


def test_load_tests_reads_every_jsonl_file_but_those_under_pdfs(tmp_path: Path) -> None:
    # Given a benchmark directory: two test files (one in a sub-folder), a blank line, and a JSONL file among the PDFs
    write_jsonl(
        tmp_path / "multi_column.jsonl",
        [
            {
                "pdf": "multi_column_miss.pdf",
                "page": 1,
                "id": "multi_column_miss_02",
                "type": "present",
                "text": "The term “corporate social responsibility” is in vogue",
                "max_diffs": 2,
            },
            "",
            {
                "pdf": "multi_column_miss.pdf",
                "page": 1,
                "id": "multi_column_miss_10",
                "type": "order",
                "before": "Corporate social responsibility and the tobacco industry: hope or hype?",
                "after": "Over the past three decades",
                "max_diffs": 2,
            },
        ],
    )
    write_jsonl(
        tmp_path / "more" / "headers_footers.jsonl",
        [
            {
                "pdf": "headers_footers/ff0f0b22c55d8b90dd77d153f48e144fc9db_pg2.pdf",
                "page": 1,
                "id": "ff0f0b22c55d8b90dd77d153f48e144fc9db_02c",
                "type": "absent",
                "text": "1",
                "last_n": 20,
                "checked": "verified",
            },
            {"pdf": "math.pdf", "page": 3, "id": "math_00", "type": "math", "math": "x^2"},
        ],
    )
    write_jsonl(tmp_path / "pdfs" / "stray.jsonl", ["not a test at all"])
    # When the tests are loaded
    tests = load_tests(tmp_path)
    # Then all four are there in file order, with their own fields kept apart from the common ones, and the file they
    # came from as their category
    assert [test.id for test in tests] == [
        "ff0f0b22c55d8b90dd77d153f48e144fc9db_02c",
        "math_00",
        "multi_column_miss_02",
        "multi_column_miss_10",
    ]
    assert tests[0] == BenchTest(
        id="ff0f0b22c55d8b90dd77d153f48e144fc9db_02c",
        pdf="headers_footers/ff0f0b22c55d8b90dd77d153f48e144fc9db_pg2.pdf",
        page=1,
        type="absent",
        fields={"text": "1", "last_n": 20, "checked": "verified"},
        category="more/headers_footers",
    )
    assert tests[1].page == 3 and tests[1].fields == {"math": "x^2"}


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"pdf": "a.pdf", "page": 1, "id": "a_00", "type": "present", "text": "x"', "Expecting"),
        ('["a list"]', "JSON object"),
        ('{"pdf": "a.pdf", "id": "a_00", "type": "present", "text": "x"}', "missing page"),
        ('{"pdf": "a.pdf", "page": 0, "id": "a_00", "type": "present", "text": "x"}', "'page' must be"),
        ('{"pdf": "a.pdf", "page": 1, "id": "a_00", "type": "present", "text": "x", "max_diffs": -1}', "max_diffs"),
        ('{"pdf": "a.pdf", "page": 1, "id": "a_00", "type": "absent", "text": "  "}', "'text' is blank"),
        ('{"pdf": "a.pdf", "page": 1, "id": "a_00", "type": "table", "up": "x"}', "needs a string 'cell'"),
        (
            '{"pdf": "a.pdf", "page": 1, "id": "a_00", "type": "order", "before": "ab", "after": "cd", "max_diffs": 2}',
            "half",
        ),
        ('{"pdf": "a.pdf", "page": 1, "id": "a_01", "type": "present", "text": "x"}', "duplicate test id 'a_01'"),
    ],
)
def test_a_malformed_line_is_a_value_error_naming_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    # Given a test file whose third line (after a good one and a blank one) is malformed
    good = {"pdf": "a.pdf", "page": 1, "id": "a_01", "type": "present", "text": "fine"}
    path = write_jsonl(tmp_path / "tests.jsonl", [good, "", line])
    # When it is loaded / Then the error names the file, the line, and what is wrong
    with pytest.raises(ValueError, match=message) as raised:
        load_tests(tmp_path)
    assert f"{path}, line 3: " in str(raised.value)


def test_no_test_files_load_as_no_tests_and_a_missing_directory_is_an_error(tmp_path: Path) -> None:
    # Given a directory with PDFs only / When loaded / Then there is nothing to check
    (tmp_path / "pdfs").mkdir()
    assert load_tests(tmp_path) == []
    # Given a path that is not there / When loaded / Then it says so rather than finding no tests
    with pytest.raises(NotADirectoryError, match="not found"):
        load_tests(tmp_path / "missing")


# --- present and absent -----------------------------------------------------------------------------------------------


def test_present_passes_on_text_the_page_has_and_fails_on_text_it_lacks() -> None:
    # Given the page, with markdown emphasis and typographic quotes, and rules written in plain ASCII
    # When checked / Then found text passes (emphasis and quote styles ignored), missing text fails with the reason
    assert passes(rule("present", text='The term "corporate social responsibility" is in vogue'), PAGE)
    assert passes(rule("present", text="pressure from non-governmental organisations"), PAGE)
    missing = check(rule("present", text="Philip Morris some 803 600 smokers"), PAGE)
    assert missing.passed is False and "not found" in missing.explanation


def test_absent_passes_on_text_the_page_lacks_and_fails_on_text_it_has() -> None:
    # Given the page / When checked / Then a footer line that is there fails, one that is not passes
    found = check(rule("absent", text="Downloaded from tobaccocontrol.bmj.com"), PAGE)
    assert found.passed is False and "found" in found.explanation
    assert passes(rule("absent", text="Downloaded from http://tobaccocontrol.bmj.com/"), PAGE)


def test_fuzzy_matching_within_and_beyond_max_diffs() -> None:
    # Given the page with two misreadings: one substitution, one deletion
    page = PAGE.replace("increasing", "increasinq").replace("pressure", "presure")
    text = "increasing pressure from non-governmental"
    # When checked with a budget of edits
    # Then two edits are within max_diffs 2 and not within 1; absent mirrors present
    assert passes(rule("present", text=text, max_diffs=3), page)
    assert passes(rule("present", text=text, max_diffs=2), page)
    assert not passes(rule("present", text=text, max_diffs=1), page)
    assert not passes(rule("absent", text=text, max_diffs=2), page)
    assert passes(rule("absent", text=text, max_diffs=1), page)
    # And a swap of two characters costs two edits
    assert not passes(rule("present", text="incraesing pressure", max_diffs=1), PAGE)


def test_case_sensitivity() -> None:
    # Given text that is on the page in another case
    text = "OVER THE PAST THREE DECADES"
    # When checked / Then it is missing by default (case-sensitive) and found with case_sensitive false
    assert not passes(rule("present", text=text), PAGE)
    assert passes(rule("present", text=text, case_sensitive=False), PAGE)
    assert passes(rule("absent", text=text, case_sensitive=True), PAGE)
    assert not passes(rule("absent", text=text, case_sensitive=False), PAGE)


def test_first_n_and_last_n_limit_where_text_is_looked_for() -> None:
    # Given a page that ends in its page number 17, and opens (after our marker) with its heading
    # When the header/footer rules look only at the first or last characters
    # Then the number is there in the last 20 but not in the first 20, and the marker's digits never count
    assert not passes(rule("absent", text="17", last_n=20), PAGE)
    assert passes(rule("absent", text="17", first_n=20), PAGE)
    assert passes(rule("absent", text="2", first_n=20), PAGE)  # "<!-- page 2 of 9 ... -->" is not page text
    assert passes(rule("present", text="# Corporate", first_n=20, last_n=20), PAGE)
    assert passes(rule("present", text="2004 17", first_n=20, last_n=20), PAGE)
    assert not passes(rule("present", text="three decades", first_n=20, last_n=20), PAGE)
    assert passes(rule("present", text="three decades", first_n=None, last_n=None), PAGE)


# --- order ------------------------------------------------------------------------------------------------------------


def test_order_passes_when_before_comes_first() -> None:
    # Given the heading, then the first paragraph
    before = "Corporate social responsibility and the tobacco industry: hope or hype?"
    after = "The term"
    # When checked either way round / Then only the page's order passes
    assert passes(rule("order", before=before, after=after), PAGE)
    reversed_order = check(rule("order", before=after, after=before), PAGE)
    assert reversed_order.passed is False and "does not appear before" in reversed_order.explanation


def test_order_fails_when_a_text_is_missing_and_matches_fuzzily() -> None:
    # Given a page whose heading is misspelt once
    page = PAGE.replace("industry", "industy")
    before, after = "the tobacco industry", "Over the past three decades"
    # When checked / Then the misspelt text is missing exactly, found within max_diffs 1
    missing = check(rule("order", before=before, after=after), page)
    assert missing.passed is False and "'before' text" in missing.explanation
    assert passes(rule("order", before=before, after=after, max_diffs=1), page)


def test_order_with_repeated_texts_uses_any_pair_of_occurrences() -> None:
    # Given "A B A B": each text before the other somewhere / When checked / Then both orders pass
    assert passes(rule("order", before="B", after="A"), "A B A B")
    assert passes(rule("order", before="A", after="B"), "A B A B")
    # And the same text twice is in order with itself; once only, it is not
    assert passes(rule("order", before="target", after="target"), "target and then target again")
    assert not passes(rule("order", before="target", after="target", max_diffs=2), "one target only")


# --- table ------------------------------------------------------------------------------------------------------------


def test_markdown_table_cell_and_its_neighbours() -> None:
    # Given the OLMo 2 composition table in markdown (cell 12.2B appears twice: Words of arXiv, Tokens of OpenWebMath)
    # When table rules name a cell and what should be next to it
    # Then the neighbours up, down, left and right, and the headings of its column and row, are checked
    assert passes(rule("table", cell="3.32T", left="3.71T"), MARKDOWN_TABLE)
    assert passes(rule("table", cell="11.8B", up="12.2B", down="3.7B"), MARKDOWN_TABLE)
    assert passes(rule("table", cell="Papers", right="20.8B"), MARKDOWN_TABLE)
    assert passes(rule("table", cell="3.32T", top_heading="Words"), MARKDOWN_TABLE)
    assert passes(rule("table", cell="Math", left_heading="OpenWebMath"), MARKDOWN_TABLE)
    assert passes(rule("table", cell="12.2B", top_heading="Tokens", left_heading="OpenWebMath"), MARKDOWN_TABLE)
    wrong = check(rule("table", cell="3.32T", left="20.8B"), MARKDOWN_TABLE)
    assert wrong.passed is False and "left is not '20.8B'" in wrong.explanation
    assert not passes(rule("table", cell="12.2B", top_heading="Words", left_heading="OpenWebMath"), MARKDOWN_TABLE)


def test_html_table_with_spans_and_header_rows() -> None:
    # Given an HTML table with a two-row thead (a colspan over Q1 and Q2) and a rowspan in the body
    # When table rules are checked
    # Then spans give several neighbours, thead cells are headings, and <br> is a line break inside a cell
    assert passes(rule("table", cell="Electronics", right="245"), HTML_TABLE)
    assert passes(rule("table", cell="Electronics", right="187"), HTML_TABLE)
    assert passes(rule("table", cell="187", left="Electronics", up="245", down="112"), HTML_TABLE)
    assert passes(rule("table", cell="Q2", up="Quarterly sales"), HTML_TABLE)
    assert passes(rule("table", cell="Quarterly sales", down="Q1"), HTML_TABLE)
    assert passes(rule("table", cell="128", top_heading="Q2"), HTML_TABLE)
    assert passes(rule("table", cell="128", top_heading="Quarterly sales"), HTML_TABLE)
    assert passes(rule("table", cell="192 (revised)", up="278", left_heading="Electronics"), HTML_TABLE)
    assert not passes(rule("table", cell="128", top_heading="Q1"), HTML_TABLE)
    assert not passes(rule("table", cell="Furniture", up="Category"), HTML_TABLE)


def test_table_fuzzy_matching_within_and_beyond_max_diffs() -> None:
    # Given the table with a cell misread ("Algebraic Stack" as "Algebrak Stack")
    page = MARKDOWN_TABLE.replace("Algebraic", "Algebrak")
    # When a rule names the right text / Then only a max_diffs allowance lets it match
    assert not passes(rule("table", cell="Algebraic Stack", right="Code"), page)
    assert passes(rule("table", cell="Algebraic Stack", right="Code", max_diffs=2), page)
    assert passes(rule("table", cell="3.7B", left_heading="Algebraic Stack", max_diffs=2), page)
    assert not passes(rule("table", cell="3.7B", left_heading="Alg St", max_diffs=2), page)


def test_table_rule_fails_without_a_table_or_a_matching_cell() -> None:
    # Given a page with no table, and the table page / When a cell is looked for / Then each fails saying why
    no_table = check(rule("table", cell="3.32T"), PAGE)
    assert no_table.passed is False and no_table.explanation == "no table found on the page"
    no_cell = check(rule("table", cell="9.99T"), MARKDOWN_TABLE + "\n\n" + HTML_TABLE)
    assert no_cell.passed is False and "no cell matches '9.99T' in 2 table(s)" in no_cell.explanation


def test_ignore_table_shapes_looks_at_html_tables_only() -> None:
    # Given both kinds of table on one page / When markdown tables are ignored / Then only the HTML one counts
    page = MARKDOWN_TABLE + "\n\n" + HTML_TABLE
    assert passes(rule("table", cell="245", up="Q1", ignore_table_shapes=True), page)
    assert not passes(rule("table", cell="3.32T", ignore_table_shapes=True), page)


# --- unsupported types and pass rates ---------------------------------------------------------------------------------


def test_unsupported_types_are_reported_not_scored() -> None:
    # Given a rule of a type olmOCR-bench does not define
    rule = BenchTest(id="odd_00", pdf="arxiv.pdf", page=1, type="handwriting", fields={"text": "x"})
    # When checked / Then it neither passes nor fails, and the explanation says so
    result = check(rule, PAGE)
    assert result == RuleResult(rule.id, rule.type, None, result.explanation)
    assert "unsupported rule type" in result.explanation
    assert {"present", "absent", "order", "table", "baseline", "format", "footnote", "math"} == SUPPORTED_TYPES


def test_a_math_rule_passes_where_the_page_writes_the_equation_so_that_it_renders_alike() -> None:
    # Given a math rule, and pages that write its equation otherwise, a different one, or none
    rule = BenchTest(id="arxiv_00", pdf="arxiv.pdf", page=1, type="math", fields={"math": r"\frac{a}{b} = x^{2}"})
    # When checked (KaTeX in headless Chromium)
    # Then the same equation written with other spacing and braces passes, wherever its delimiters, others fail
    assert check(rule, r"We have \(\frac{a}{b}=x^2\) here.").passed is True
    assert check(rule, r"We have $$ \frac{a}{b} = x^2 $$ here.").passed is True
    assert check(rule, r"We have \(\frac{b}{a}=x^2\) here.").passed is False
    assert check(rule, r"We have \(a/b = x^2\) here.").passed is False
    assert check(rule, "No equation at all.").passed is False
    # ... and dollars are not delimiters when the rule says to ignore them
    ignoring = BenchTest(
        rule.id, rule.pdf, 1, "math", {"math": r"\frac{a}{b} = x^{2}", "ignore_dollar_delimited": True}
    )
    assert check(ignoring, r"We have $$ \frac{a}{b} = x^2 $$ here.").passed is False


def test_a_math_rule_where_no_chromium_runs_is_reported_unsupported_saying_why(tmp_path: Path) -> None:
    # Given a math rule and a renderer pointed at a Chromium that is not there
    rule = BenchTest(id="arxiv_00", pdf="arxiv.pdf", page=1, type="math", fields={"math": "x^2"})
    renderer = KatexRenderer(chromium=str(tmp_path / "chromium"))
    # When checked
    result = check(rule, r"We have \(x^3\).", renderer)
    # Then it is not scored, and the explanation names Chromium
    assert result.passed is None
    assert "Chromium did not render" in result.explanation


def test_equations_are_found_delimiter_by_delimiter() -> None:
    page = r"a \(x\) b \[ y \] c $$z$$ d $w$ e"
    assert equations_in(page) == ["x", "y", "z", "w"]
    assert equations_in(page, ignore_dollar_delimited=True) == ["x", "y"]
    assert equations_in(r"price $5 and $10") == ["5 and"]  # dollars pair up as olmocr's pattern pairs them


def _rule(kind: str, **fields: Any) -> BenchTest:
    return BenchTest(id=f"{kind}_00", pdf="doc.pdf", page=1, type=kind, fields=fields)


# Cases from olmocr's own unit tests of these rules (tests/test_tests.py at f7cfe4c2: TestBaselineTest,
# TestFormatTest, TestFootnoteTest), with the outcome their implementation asserts
BASELINE_CASES = [
    ({}, "This is some normal content", True),
    ({}, "   \n\t  ", False),
    ({"max_repeats": 2}, "abc" * 10, False),
    ({}, "This has Chinese characters: \u4f60\u597d", False),
    ({}, "This has emoji: \U0001f60a", False),
    ({}, "asdfasdfas\u7dad\u57fa\u767e\u79d1/\u4e2d\u6587asdfw", False),
    ({}, "This is some normal content with proper English letters and no suspicious repetition.", True),
    ({"max_length": 10, "max_length_skips_image_alt_tags": True}, "Hello ![Diagram 100, 101, 102](p.png) World", True),
    ({"max_length": 10}, "Hello ![Diagram 100, 101, 102](p.png) World", False),
]
FORMAT_CASES = [
    ({"text": "Chapter One", "format": "heading"}, "# Chapter One\nSome text here", True),
    ({"text": "Chapter One", "format": "heading"}, "### Chapter One\nSome text here", True),
    ({"text": "Chapter One", "format": "heading"}, "<h3>Chapter One</h3>\nSome text here", True),
    ({"text": "important", "format": "bold"}, "This is **important** text", True),
    ({"text": "important", "format": "bold"}, "This is __important__ text", True),
    ({"text": "important", "format": "bold"}, "This is important text", False),
    ({"text": "important", "format": "bold"}, "This is <strong>important</strong> text", True),
    ({"text": "emphasis", "format": "italic"}, "This has *emphasis* here", True),
    ({"text": "emphasis", "format": "italic"}, "This has **emphasis** here", False),
    ({"text": "emphasis", "format": "italic"}, "This has <em>emphasis</em> here", True),
    ({"text": "Chapter One", "format": "heading", "case_sensitive": False}, "# CHAPTER ONE", True),
    ({"text": "Chapter One", "format": "heading"}, "# CHAPTER ONE", False),
]
FOOTNOTE_CASES = [
    ({"marker": "2"}, "This is some text[^2] with a footnote.\n\n[^2]: This is the footnote text.", True),
    ({"marker": "2"}, "This is some text<sup>2</sup> with a footnote.", True),
    ({"marker": "2"}, "This is some text\u00b2 with a footnote.", True),
    ({"marker": "2"}, "This text has no footnote markers.", False),
    ({"marker": "1", "appears_before_marker": "important fact"}, "This is an important fact[^1] in it.", True),
    ({"marker": "1", "appears_before_marker": "important fact"}, "This is an important fact\t[^1] in it.", True),
    ({"marker": "1", "appears_before_marker": "important fact"}, "Something else[^1] important fact later.", False),
    ({"marker": "3", "appears_after_marker": "that needs citation"}, "A statement \u00b3that needs citation.", True),
    (
        {"marker": "3", "appears_after_marker": "that needs citation"},
        "This is a statement that needs citation before [^3] the marker.",
        False,
    ),
    (
        {"marker": "1", "appears_before_marker": "important fact", "appears_after_marker": "documented here"},
        "This is an important fact[^1] and also[^1] documented here.",
        True,
    ),
    (
        {"marker": "1", "appears_before_marker": "important fact", "appears_after_marker": "documented here"},
        "This is something else[^1] documented here.",
        False,
    ),
]


@pytest.mark.parametrize(
    ("kind", "fields", "page", "passes"),
    [("baseline", *case) for case in BASELINE_CASES]
    + [("format", *case) for case in FORMAT_CASES]
    + [("footnote", *case) for case in FOOTNOTE_CASES],
)
def test_baseline_format_and_footnote_rules_give_olmocrs_own_outcomes(
    kind: str, fields: dict[str, Any], page: str, passes: bool
) -> None:
    result = check(_rule(kind, **fields), page)
    assert result.passed is passes, result.explanation
    assert bool(result.explanation) is not passes  # a failure says why


def test_baseline_ignores_page_markers_and_a_bad_field_is_refused_naming_it() -> None:
    # Given a page that is nothing but our markers
    assert check(_rule("baseline"), "<!-- page 1 of 2 (fake m) -->\n\n").passed is False
    # And fields olmocr would refuse
    for kind, fields, named in (
        ("format", {"text": "x", "format": "underline"}, "'format'"),
        ("footnote", {"marker": "1 2"}, "'marker'"),
        ("baseline", {"max_repeats": -1}, "'max_repeats'"),
    ):
        with pytest.raises(ValueError, match=named):
            _rule(kind, **fields)


def test_pass_rates_count_passed_and_scored_per_type() -> None:
    # Given results of several types, one of them unsupported
    results = [
        RuleResult("p1", "present", True, ""),
        RuleResult("p2", "present", False, "missing"),
        RuleResult("p3", "present", True, ""),
        RuleResult("t1", "table", False, "no table"),
        RuleResult("m1", "math", None, "unsupported"),
    ]
    # When summarised / Then each type gets (passed, scored), and the unsupported one is listed with none scored
    assert pass_rates(results) == {"math": (0, 0), "present": (2, 3), "table": (0, 1)}
    assert pass_rates([]) == {}


def test_a_baseline_test_is_added_for_each_pdf_without_one_as_the_benchmark_does() -> None:
    tests = [
        _rule("present", text="x"),
        BenchTest("b", "other.pdf", 2, "baseline", {}),
        BenchTest("c", "third.pdf", 3, "order", {"before": "a", "after": "b"}),
    ]
    added = with_baselines(tests)[3:]
    assert [(t.id, t.pdf, t.page, t.type, t.category) for t in added] == [
        ("doc.pdf_baseline", "doc.pdf", 1, "baseline", "baseline"),
        ("third.pdf_baseline", "third.pdf", 1, "baseline", "baseline"),
    ]


def test_the_benchmark_score_is_the_mean_of_its_categories_rates_with_a_bootstrap_interval() -> None:
    # Given results in two categories: 1 of 4 passed in one, 3 of 3 in the other, and an unsupported one
    results = [RuleResult(f"a{n}", "present", n == 0, "", "arxiv") for n in range(4)]
    results += [RuleResult(f"b{n}", "table", True, "", "tables") for n in range(3)]
    results += [RuleResult("m", "math", None, "no Chromium", "arxiv")]
    # When scored as olmOCR-bench scores a run
    score = bench_score(results)
    # Then each category is its rate, the overall score their mean (not the 4 of 7 over all tests), and the
    # interval lies around it, repeatably
    assert score is not None
    assert score.categories == {"arxiv": (1, 4), "tables": (3, 3)}
    assert score.overall == (0.25 + 1.0) / 2
    assert 0.5 <= score.interval[0] < score.overall < score.interval[1] <= 1.0
    assert bench_score(results) == score
    assert bench_score([RuleResult("m", "math", None, "", "x")]) is None
