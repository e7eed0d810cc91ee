"""Scoring a page against its ground truth: normalisation, bit-parallel edit distances checked against a plain DP,
CER, WER, word recall and precision, page splitting and percentiles."""

from __future__ import annotations

import random
from collections.abc import Hashable, Sequence

import pytest
from pagescribe_local.scoring import (
    cer,
    edit_distance,
    normalize,
    percentile,
    plain,
    recall_precision,
    split_pages,
    substring_distances,
    table_shapes,
    wer,
    words,
)

SEEDS = range(5)
ALPHABETS = ["ab", "abcd", "aéü漢字😀 \n", "abcdefghijklmnopqrstuvwxyz0123456789"]
VOCABULARY = ["the", "page", "table", "3.5", "Ünïcode", "漢字", "", "end."]
TEXT = (
    "# Annual report\n\nThe committee met on 3 March and approved the budget of 3.5 million. "
    "Every department submitted its plan; the board reviewed them in **two** sessions.\n\n"
    "| Item | Cost |\n| --- | --- |\n| Rent | 1,200 |\n| Staff | 9,800 |\n\nThe next meeting is in June."
)


def dp_distance(a: Sequence[Hashable], b: Sequence[Hashable]) -> int:
    """Reference Levenshtein distance: the textbook O(len(a) * len(b)) dynamic programme."""
    previous = list(range(len(b) + 1))
    for i, x in enumerate(a, start=1):
        current = [i]
        for j, y in enumerate(b, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (x != y)))
        previous = current
    return previous[-1]


def dp_substring_distances(pattern: Sequence[Hashable], text: Sequence[Hashable]) -> list[int]:
    """Reference approximate matching: the same DP with a free start (a first row of zeros)."""
    previous = [0] * (len(text) + 1)
    for i, x in enumerate(pattern, start=1):
        current = [i]
        for j, y in enumerate(text, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (x != y)))
        previous = current
    return previous[1:]


def random_text(rng: random.Random, alphabet: str, length: int) -> str:
    return "".join(rng.choice(alphabet) for _ in range(length))


def damaged(rng: random.Random, text: str, edits: int) -> str:
    """``text`` after ``edits`` random single-character insertions, deletions and substitutions."""
    chars = list(text)
    for _ in range(edits):
        position = rng.randrange(len(chars) + 1)
        operation = rng.randrange(3)
        if operation == 0:
            chars.insert(position, rng.choice("xyz"))
        elif chars and position < len(chars):
            if operation == 1:
                del chars[position]
            else:
                chars[position] = rng.choice("xyz")
    return "".join(chars)


# --- edit distance --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("alphabet", ALPHABETS)
def test_edit_distance_agrees_with_dp_on_random_strings(seed: int, alphabet: str) -> None:
    # Given random strings from empty to past one 64-bit word, some related by a few edits, some unrelated
    rng = random.Random(seed)
    pairs = [("", ""), ("", "abc"), ("abc", "")]
    for _ in range(60):
        a = random_text(rng, alphabet, rng.choice([0, 1, 2, 5, 63, 64, 65, rng.randrange(150)]))
        pairs.append((a, damaged(rng, a, rng.randrange(8)) if rng.random() < 0.5 else random_text(rng, alphabet, 70)))
    for a, b in pairs:
        # When their distance is computed bit-parallel, either way round
        # Then it is the DP's
        assert edit_distance(a, b) == dp_distance(a, b), (a, b)
        assert edit_distance(b, a) == dp_distance(a, b), (b, a)


@pytest.mark.parametrize("seed", SEEDS)
def test_edit_distance_agrees_with_dp_on_token_lists(seed: int) -> None:
    # Given random lists of words (tokens are the symbols), lengths 0 to past 64
    rng = random.Random(seed)
    for _ in range(40):
        a = [rng.choice(VOCABULARY) for _ in range(rng.randrange(100))]
        b = [token for token in a if rng.random() < 0.8] + [rng.choice(VOCABULARY) for _ in range(rng.randrange(5))]
        if rng.random() < 0.3:
            rng.shuffle(b)
        # When / Then the distance in tokens is the DP's
        assert edit_distance(a, b) == dp_distance(a, b)
        assert edit_distance(tuple(a), tuple(b)) == dp_distance(a, b)


def test_edit_distance_agrees_with_dp_past_a_thousand_symbols() -> None:
    # Given strings of 1,200 and 1,150 characters, related, and an unrelated pair over a large alphabet
    rng = random.Random(7)
    a = random_text(rng, "abcdefgh ", 1200)
    b = damaged(rng, a, 80)
    c = random_text(rng, ALPHABETS[3], 1100)
    # When / Then the bit-parallel distance is the DP's
    assert edit_distance(a, b) == dp_distance(a, b)
    assert edit_distance(a, c) == dp_distance(a, c)


def test_edit_distance_with_a_pattern_smaller_than_the_alphabet() -> None:
    # Given a two-symbol string against a long one over 36 symbols, most of which the short one lacks
    rng = random.Random(3)
    long = random_text(rng, ALPHABETS[3], 300)
    for short in ("ab", "a", "z9", "é"):
        # When / Then
        assert edit_distance(short, long) == dp_distance(short, long)
        assert edit_distance(long, short) == dp_distance(short, long)


def test_edit_distance_on_page_sized_texts_counts_the_deletions() -> None:
    # Given a 5,000-character page and the same page with 40 characters deleted here and there
    rng = random.Random(11)
    page = random_text(rng, "abcdefghijklmnopqrstuvwxyz     ", 5000)
    deleted = set(rng.sample(range(5000), 40))
    shorter = "".join(char for index, char in enumerate(page) if index not in deleted)
    # When the distance is computed (a plain DP would take seconds here)
    distance = edit_distance(page, shorter)
    # Then it is exactly 40: at least the length difference, at most the deletions made
    assert distance == 40


@pytest.mark.parametrize("seed", SEEDS)
def test_substring_distances_agree_with_a_free_start_dp(seed: int) -> None:
    # Given patterns (short, and past 64 symbols) and texts that contain damaged copies of them
    rng = random.Random(seed)
    for _ in range(30):
        pattern = random_text(rng, "abcdé", rng.choice([1, 3, 10, 70]))
        text = random_text(rng, "abcdé", rng.randrange(40)) + damaged(rng, pattern, 2) + random_text(rng, "abc", 20)
        # When / Then the best match ending at each position is the DP's
        assert substring_distances(pattern, text) == dp_substring_distances(pattern, text)
    assert substring_distances("", "abc") == [0, 0, 0]
    assert substring_distances("abc", "") == []


# --- normalisation and tokens ---------------------------------------------------------------------------------------


def test_normalize_removes_markers_comments_non_characters_and_extra_whitespace() -> None:
    # Given a page with our marker, a comment, NFKC-foldable characters, non-characters and odd whitespace
    text = "<!-- page 3 of 7 (openai gpt) -->\n\n  The ﬁrst\u00a0line\ufffe\f\n<!-- a\nnote -->second\tline\uffff  "
    # When it is normalised / Then only the words and single spaces remain
    assert normalize(text) == "The first line second line"
    assert normalize("<!-- page 2 -->") == ""


def test_words_strip_markdown_and_punctuation_at_token_edges() -> None:
    # Given markdown: a heading, bold, a table row, a quote, inline code, HTML, numbers
    # When it is tokenised / Then the syntax and edge punctuation go, inner characters and case-folded words stay
    assert words("| a | b |") == ["a", "b"]
    assert words("|a|b|") == ["a", "b"]
    assert words("**Bold**") == ["bold"]
    assert words("the end.") == ["the", "end"]
    assert words("3.5") == ["3.5"]
    assert words("# Title\n> *quoted* `code` -- don't e-mail (1999),") == [
        "title",
        "quoted",
        "code",
        "don't",
        "e-mail",
        "1999",
    ]
    assert words("<table><tr><td>Cell</td></tr></table> <!-- page 1 -->") == ["cell"]
    assert words("") == []


# --- CER and WER ----------------------------------------------------------------------------------------------------


def test_identical_texts_score_zero() -> None:
    # Given a page and its exact copy / When scored / Then no error at all
    assert cer(TEXT, TEXT) == 0.0
    assert wer(TEXT, TEXT) == 0.0
    assert recall_precision(TEXT, TEXT) == (1.0, 1.0)


def test_markers_comments_and_whitespace_do_not_count() -> None:
    # Given the ground truth, and a transcript with our page marker, a comment and different line breaks and spacing
    transcript = "<!-- page 1 of 1 (fake model) -->\n\n" + TEXT.replace(" ", "  ").replace("\n\n", "\n\f\n")
    transcript = transcript.replace("The next", "<!-- seen twice -->The next")
    # When scored / Then nothing counts against it
    assert cer(TEXT, transcript) == 0.0
    assert wer(TEXT, transcript) == 0.0


def test_word_scores_ignore_case_and_edge_punctuation_where_characters_do_not() -> None:
    # Given the same words with other case, emphasis and punctuation
    reference, hypothesis = "**The** end.", "the end"
    # When scored / Then WER forgives it, CER does not
    assert wer(reference, hypothesis) == 0.0
    assert cer(reference, hypothesis) > 0.0


def test_a_damaged_text_scores_strictly_worse() -> None:
    # Given the ground truth, a lightly damaged copy (a word deleted, two characters swapped), and a worse one
    light = TEXT.replace("approved ", "").replace("budget", "bugdet")
    heavy = light.replace("Every department submitted its plan; ", "").replace("committee", "comittee")
    # When each is scored
    # Then the damage shows, and more damage scores worse, by characters and by words
    assert 0.0 < cer(TEXT, light) < cer(TEXT, heavy)
    assert 0.0 < wer(TEXT, light) < wer(TEXT, heavy)
    assert wer(TEXT, light) == pytest.approx(2 / len(words(TEXT)))  # one word deleted, one misspelt


def test_empty_reference_and_hypothesis() -> None:
    # Given empty texts (or only a marker) / When scored / Then 0.0 for nothing against nothing, else 1.0 or more
    assert cer("", "") == 0.0
    assert wer("<!-- page 1 -->", " \n ") == 0.0
    assert cer("", "text") == 1.0
    assert wer("", "some words") == 1.0
    assert cer("text", "") == 1.0
    assert wer("two words", "") == 1.0


# --- recall and precision -------------------------------------------------------------------------------------------


def test_recall_and_precision_ignore_word_order() -> None:
    # Given the ground truth's words shuffled
    shuffled = words(TEXT)
    random.Random(5).shuffle(shuffled)
    # When scored order-insensitively / Then everything is recalled, and nothing is extra
    assert recall_precision(TEXT, " ".join(shuffled)) == (1.0, 1.0)


def test_recall_halves_when_half_the_words_are_dropped() -> None:
    # Given every other word of the ground truth
    tokens = words(TEXT)
    half = tokens[::2]
    # When scored / Then recall is about a half, and what is there is all right
    recall, precision = recall_precision(TEXT, " ".join(half))
    assert recall == pytest.approx(0.5, abs=0.02)
    assert precision == 1.0


def test_recall_and_precision_count_repeated_words_once_each() -> None:
    # Given a hypothesis that repeats a word the reference has once, and adds one
    # When scored / Then the multiset intersection counts "a" once: 2 of 2 recalled, 2 of 4 precise
    assert recall_precision("a b", "a a b c") == (1.0, 0.5)


def test_recall_and_precision_of_empty_texts() -> None:
    # Given empty references and hypotheses / When scored / Then as documented
    assert recall_precision("", "") == (1.0, 1.0)
    assert recall_precision("", "extra words") == (1.0, 0.0)
    assert recall_precision("expected words", "") == (0.0, 0.0)


# --- pages ------------------------------------------------------------------------------------------------------------


def test_split_pages_on_form_feeds() -> None:
    # Given pdftotext-style output: each page ends with a form feed, and one page is blank
    text = "Page one\n\fPage two\n\f\f"
    # When split / Then three pages (the trailing empty piece is not a page), stripped
    assert split_pages(text) == ["Page one", "Page two", ""]
    assert split_pages("one\ftwo") == ["one", "two"]


def test_split_pages_on_plain_page_markers() -> None:
    # Given a ground truth with <!-- page N --> lines and nothing before the first
    text = "\n<!-- page 1 -->\nFirst page.\n<!-- page 2 -->\nSecond page,\n\nwith two paragraphs.\n"
    # When split / Then two pages without their markers
    assert split_pages(text) == ["First page.", "Second page,\n\nwith two paragraphs."]


def test_split_pages_on_our_own_transcript_markers() -> None:
    # Given one of our transcripts: a document comment, then a marker per page, one of them failed
    text = (
        "<!-- pagescribe document d-1: in/report.pdf -->\n\n"
        "<!-- page 1 of 3 (openai gpt-4o) -->\n\nIntro\n\n"
        "<!-- page 2 of 3: FAILED: unreadable page -->\n\n"
        "<!-- page 3 of 3 (openai gpt-4o) -->\n\nEnd, see <!-- page 9 --> inline\n"
    )
    # When split / Then three pages; the blank (comment-only) preamble is dropped; an inline comment is not a marker
    assert split_pages(text) == ["Intro", "", "End, see <!-- page 9 --> inline"]


def test_split_pages_keeps_text_before_the_first_marker() -> None:
    # Given words before the first marker / When split / Then they are a page of their own
    assert split_pages("Cover\n<!-- page 1 -->\nBody") == ["Cover", "Body"]


def test_split_pages_without_separators_is_one_page() -> None:
    # Given text with neither form feeds nor marker lines / When split / Then it is a single page
    assert split_pages("Just one page\n\nof text.\n") == ["Just one page\n\nof text."]
    assert split_pages("") == [""]


# --- percentiles ----------------------------------------------------------------------------------------------------


def test_percentile_interpolates_linearly() -> None:
    # Given latencies / When summarised / Then the median and p95 interpolate between ranks, as numpy's default does
    values = [4.0, 1.0, 3.0, 2.0]
    assert percentile(values, 50) == 2.5
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile(values, 95) == pytest.approx(3.85)
    assert percentile(values, 0) == 1.0
    assert percentile(values, 100) == 4.0
    assert percentile([7.0], 95) == 7.0


def test_percentile_refuses_no_values_and_out_of_range_q() -> None:
    # Given no values, or q outside [0, 100] / When summarised / Then ValueError
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)
    with pytest.raises(ValueError, match="not in"):
        percentile([1.0], 101)


def test_markdown_block_markup_does_not_count_but_a_misread_word_does() -> None:
    # Given a page's plain text, and a transcript of it with a heading, list items and a table
    reference = "Results\nThe runs:\n• first run\n• second run\nName Score\nAlpha 0.93\nBeta 0.81"
    markdown = "# Results\n\nThe runs:\n- first run\n- second run\n\n"
    markdown += "| Name | Score |\n| --- | --- |\n| Alpha | 0.93 |\n| Beta | 0.81 |"

    # When they are scored
    # Then the markup costs nothing, and the same transcript with one word misread costs that word
    assert plain("## Title\n* item\n| a \\| b | c |\n|:---|---:|") == "Title\nitem\n  a | b   c  \n"
    assert cer(reference, markdown) == 0.0
    assert wer(reference, markdown) == 0.0
    assert cer(reference, markdown.replace("Alpha", "Alpah")) > 0.0


def test_table_shapes_are_counted_by_rows_and_columns() -> None:
    # Given a text with a table of a header and two rows by three columns, a paragraph, and a one-row table
    text = "Intro\n\n| a | b | c |\n| --- | --- | --- |\n| 1 | 2 | 3 |\n| 4 | 5 | 6 |\n\nText\n| x | y |\n| --- | --- |"
    # When its tables are counted
    # Then each is its rows (the rule not counted) by its columns, in order
    assert table_shapes(text) == [(3, 3), (1, 2)]
    assert table_shapes("no table | here") == []


def test_html_tables_are_counted_with_their_spans_and_read_as_their_text() -> None:
    # Given a markdown table, then an HTML table whose header spans two columns, its cells escaped
    text = (
        '| a | b |\n| --- | --- |\n| 1 | 2 |\n\n<table>\n<tr><th>Name</th><th colspan="2">Scores</th></tr>\n'
        "<tr><td>R&amp;D</td><td>0.93</td><td>&lt;0.5</td></tr>\n</table>\nAfter it"
    )
    # When its tables are counted, and the HTML table is scored against the text it holds
    # Then each is its rows by its columns (a span counting as the columns it spans), in order
    assert table_shapes(text) == [(2, 2), (2, 3)]
    assert table_shapes("<table><tr><td>x</td><td>y</td></tr></table>") == [(1, 2)]
    # ... and its tags cost nothing, its entities read as their characters
    assert cer("Name Scores R&D 0.93 <0.5 After it", text.split("\n\n")[1]) == 0.0
    assert cer("Name Scores R&D 0.93 <0.5", "<table><tr><td>Name Scores R&D 0.93 <0.5</td></tr></table>") == 0.0
