"""Markdown structure of a laid-out page: headings, lists, tables, joined hyphenation, Latin punctuation, figures.

The synthetic cases pin each rule; the real pages (documents nobody here wrote, rendered and read by the offline
engine) show the rules on what the engine really returns.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from pagescribe.layout import boxes_to_text
from pagescribe.layout.boxes import FIGURE, Figure, TextBox, latin_punctuation
from pagescribe.providers.base import PageImage, TranscriptionRequest
from pagescribe.sources.documents import DocumentKind
from pagescribe.sources.pages import render_page
from pagescribe_local.scoring import table_shapes

from tests.support import CORPUS
from tests.support.offline import offline

DOCUMENTS = Path(__file__).resolve().parents[1] / "data" / "documents"


def line(text: str, left: float, top: float, *, height: float = 20, right: float | None = None) -> TextBox:
    """A box as the engine reports a line of text ``height`` pixels tall, about half a height wide per character."""
    return TextBox(
        text, left=left, top=top, bottom=top + height, right=left + height * len(text) / 2 if right is None else right
    )


def body(top: float, rows: int, words: str = "A line of the running text") -> list[TextBox]:
    return [line(f"{words} {row}", 100, top + 24 * row) for row in range(rows)]


def test_a_tall_short_line_is_a_heading_by_its_size_on_the_page() -> None:
    # Given a title twice as tall as the text, a section heading half again as tall, and a line of body text
    boxes = [
        line("A Title of the Page", 100, 40, height=40),
        line("Section one", 100, 120, height=30),
        *body(170, 3),
        line("Section two", 100, 280, height=30),
        *body(330, 3),
    ]

    # When they are laid out
    text = boxes_to_text(boxes)

    # Then the tallest is a first-level heading, the next size a second-level one, each a block of its own
    assert text.splitlines() == [
        "# A Title of the Page",
        "",
        "## Section one",
        "",
        *(f"A line of the running text {row}" for row in range(3)),
        "",
        "## Section two",
        "",
        *(f"A line of the running text {row}" for row in range(3)),
    ]


def test_a_heading_wrapped_over_two_lines_is_one_heading() -> None:
    # Given a title set large over two lines, above body text
    boxes = [line("A Rather Long Title", 100, 40, height=40), line("Over Two Lines", 100, 84, height=40), *body(160, 3)]

    # When they are laid out
    lines = boxes_to_text(boxes).splitlines()

    # Then it is one heading
    assert lines[0] == "# A Rather Long Title Over Two Lines"
    assert lines[1] == ""


def test_a_tall_long_line_or_one_on_a_page_of_one_size_is_no_heading() -> None:
    # Given a long line set large (a pull quote), and a page whose lines are all of one size
    quote = [line("a long line of large type that runs on and on well past the words of a heading", 100, 40, height=40)]

    # When they are laid out
    # Then neither has a heading
    assert not boxes_to_text([*quote, *body(160, 3)]).startswith("#")
    assert "#" not in boxes_to_text(body(100, 5))


def test_a_bulleted_line_is_a_list_item_and_a_line_opening_with_a_hash_is_escaped() -> None:
    # Given lines opening with bullets (glued to the text, or a box of their own) and a code comment line
    boxes = [
        line("Items:", 100, 100),
        line("• first item", 100, 124),
        line("●", 100, 150, height=12, right=110),
        line("second item", 130, 148),
        line("# This file is a comment", 100, 172),
    ]

    # When they are laid out
    lines = boxes_to_text(boxes).splitlines()

    # Then the bullets are markdown list markers and the comment does not turn into a heading
    assert lines == ["Items:", "- first item", "- second item", "\\# This file is a comment"]


def test_a_word_hyphenated_at_a_line_end_is_joined_within_its_paragraph() -> None:
    # Given a paragraph whose first line ends in a broken word, and a line ending in a dash before a capital
    boxes = [
        line("the dataset describes applica-", 100, 100),
        line("tions of the method and its", 100, 124),
        line("results of the pre-", 100, 148),
        line("Processing step", 100, 172),
    ]

    # When they are laid out
    lines = boxes_to_text(boxes).splitlines()

    # Then the broken word is whole again; a hyphen before a capital is kept
    assert lines == [
        "the dataset describes applications of the method and its",
        "results of the pre-",
        "Processing step",
    ]


def test_cjk_punctuation_in_latin_text_becomes_latin_and_cjk_text_keeps_its_own() -> None:
    assert latin_punctuation("1。 Installation") == "1. Installation"
    assert latin_punctuation("Hinweis\uff1asiehe\uff08unten\uff09\uff01") == "Hinweis:siehe(unten)!"
    assert latin_punctuation("宮沢賢治、春と修羅。") == "宮沢賢治、春と修羅。"
    assert latin_punctuation("12\uff0c5") == "12\uff0c5"  # no letter: nothing says which script it is


def test_a_table_with_a_merged_cell_keeps_its_columns() -> None:
    # Given a table of four columns whose second row has one cell across the last three
    rows = [("", "Alpha", "Beta", "Gamma"), ("Kind", "x", "y", "z"), ("Size", "1", "2", "3"), ("Cost", "4", "5", "6")]
    boxes = [
        line(cell, left, 100 + 24 * index)
        for index, cells in enumerate(rows)
        for cell, left in zip(cells, (100, 300, 500, 700), strict=True)
        if cell
    ]
    boxes.append(line("across three columns", 560, 100 + 24 * 4, right=760))
    boxes.append(line("Note", 100, 100 + 24 * 4))

    # When it is laid out
    lines = boxes_to_text(boxes).splitlines()

    # Then it keeps four columns, and the wide cell goes to the column nearest to its middle
    assert lines[:2] == ["|  | Alpha | Beta | Gamma |", "| --- | --- | --- | --- |"]
    assert lines[-1] == "| Note |  |  | across three columns |"
    assert all(row.count(" | ") == 3 for row in lines)


def test_a_bulleted_list_is_no_table() -> None:
    # Given list items whose bullets the engine read as boxes of their own, beside the items' text
    boxes = [
        box
        for row in range(5)
        for box in (line("•", 100, 100 + 24 * row, right=110), line(f"item {row}", 130, 100 + 24 * row))
    ]

    # When they are laid out
    # Then they are list items, not a table of bullets
    assert boxes_to_text(boxes).splitlines() == [f"- item {row}" for row in range(5)]


@pytest.fixture(scope="module")
def read() -> Iterator[object]:
    """Reads a page of a real document with the offline engine, as the pipeline renders it."""
    provider = offline()
    loop = asyncio.new_event_loop()

    def read_page(path: Path, page_number: int) -> str:
        page = render_page(path, DocumentKind.PDF, page_number)
        request = TranscriptionRequest(
            image=PageImage(data=page.data, media_type=page.media_type),
            prompt="",
            model="",
            max_output_tokens=4096,
            document_id="doc",
            page_number=page_number,
        )
        return loop.run_until_complete(provider.transcribe(request, call_seconds=300)).text

    yield read_page
    loop.run_until_complete(provider.aclose())
    loop.close()


@pytest.mark.offline_ocr
def test_a_real_table_reads_as_a_markdown_table_of_its_rows_and_columns(read) -> None:
    # Given a Google Docs export with a table of four countries' facts: a header row and four rows, six columns
    # When the page is read
    text = read(CORPUS / "google-doc-document.pdf", 1)

    # Then the table is a markdown table of five rows (and its rule) and six columns
    table = [row for row in text.splitlines() if row.startswith("|")]
    assert len(table) == 6, text
    assert {row.count("|") for row in table} == {7}, text
    assert "| Capital | Jakarta | Berlin | Vienna | Paris | Vatican City |" in table
    assert text.startswith("# Example document\n"), text


@pytest.mark.offline_ocr
def test_a_real_slide_reads_with_its_title_as_a_heading(read) -> None:
    # Given a Beamer slide (in German) with a title above a list
    # When it is read
    lines = read(DOCUMENTS / "sommerakademie-2016-slides.pdf", 10).splitlines()

    # Then the title is a heading
    assert lines[0] == "# ImageNet / ILSVRC 2014"


@pytest.mark.offline_ocr
def test_a_real_paper_joins_hyphenated_words_and_lists_its_bullets(read) -> None:
    # Given the first page of a two-column paper whose text layer breaks "applications" over two lines
    # When it is read
    text = read(DOCUMENTS / "hasyv2-paper.pdf", 1)

    # Then the word is whole, and the bulleted items of its list are markdown list items
    assert "develop applications" in text
    assert "applica-" not in text
    assert "- Two different symbols can have the same glyph. For" in text.splitlines()


def test_a_page_number_set_off_at_the_bottom_is_marked_or_dropped() -> None:
    # Given a page of body text with its number alone, well below it
    boxes = [*body(100, 5), line("- 12 -", 500, 400)]

    # When it is laid out with page numbers marked, and with them dropped
    marked = boxes_to_text(boxes).splitlines()
    dropped = boxes_to_text(boxes, page_numbers="drop").splitlines()

    # Then the number is an HTML comment, or gone; the body is the same either way
    assert marked[-1] == "<!-- page number: - 12 - -->"
    assert dropped == [f"A line of the running text {row}" for row in range(5)]
    assert marked[:5] == dropped


def test_a_cell_whose_text_runs_across_the_white_between_columns_makes_an_html_table_with_its_span() -> None:
    # Given a table of a name and two figures per row, whose header "Test accuracy & more" runs across the white
    # between the two columns of figures
    rows = [line("Classifier", 100, 124), line("Test accuracy & more", 400, 124, right=760), *_classifiers(148)]

    # When it is laid out
    lines = boxes_to_text(rows).splitlines()

    # Then it is an HTML table, the header's cell spanning the two columns it runs across, its text escaped
    assert lines == [
        "<table>",
        '<tr><th>Classifier</th><th colspan="2">Test accuracy &amp; more</th></tr>',
        "<tr><td>Forest</td><td>96.4</td><td>62.4</td></tr>",
        "<tr><td>Tree</td><td>65.4</td><td>11.0</td></tr>",
        "<tr><td>LDA</td><td>86.4</td><td>46.8</td></tr>",
        "</table>",
    ]


def test_a_header_within_its_column_keeps_the_table_in_markdown() -> None:
    # Given the same table, its header "Test" short enough to stand within the first column of figures
    rows = [line("Classifier", 100, 100), line("Test", 400, 100), line("Other", 700, 100), *_classifiers(124)]

    # When it is laid out
    # Then it is a markdown table
    assert boxes_to_text(rows).splitlines()[:3] == [
        "| Classifier | Test | Other |",
        "| --- | --- | --- |",
        "| Forest | 96.4 | 62.4 |",
    ]


def _classifiers(top: float) -> list[TextBox]:
    """Three rows of a name and two figures, in columns at 100, 400 and 700 pixels, the first at ``top``."""
    rows = (("Forest", "96.4", "62.4"), ("Tree", "65.4", "11.0"), ("LDA", "86.4", "46.8"))
    return [
        line(text, left, top + 24 * index)
        for index, row in enumerate(rows)
        for text, left in zip(row, (100, 400, 700), strict=True)
    ]


def test_a_number_in_the_text_or_a_last_line_close_to_it_is_no_page_number() -> None:
    # Given a page whose last line is a number right below the text, and one whose last line is words set off
    close = [*body(100, 5), line("12", 100, 100 + 24 * 5)]
    words = [*body(100, 5), line("Thank you for reading", 100, 400)]

    # When they are laid out
    # Then neither has a page number
    assert "<!--" not in boxes_to_text(close)
    assert boxes_to_text(words).splitlines()[-1] == "Thank you for reading"


@pytest.mark.offline_ocr
def test_a_real_papers_tables_read_with_their_rows_and_columns(read) -> None:
    # Given page 3 of a two-column paper: Table II (4 columns; 2 header lines and 10 classifiers) in the left column,
    # Table III (5 columns; 2 header lines and 4 networks) in the right one
    # When the page is read
    text = read(DOCUMENTS / "hasyv2-paper.pdf", 3)

    # Then both are tables of those rows and columns, in reading order: Table II in HTML, its "Test Accuracy" running
    # across the white above two columns of figures; Table III in markdown
    assert [shape for shape in table_shapes(text) if shape[0] > 4] == [(12, 4), (6, 5)], text
    assert '<th colspan="2">Test Accuracy</th>' in text
    [forest] = [row for row in text.splitlines() if row.startswith("<tr><td>Random Forest</td>")]
    cells = re.findall(r"<td>([^<]*)</td>", forest)
    assert [cell.replace(" ", "") for cell in cells][1:] == ["96.41%", "62.4%", "62.1%-62.8%"]


def test_a_figure_is_a_placeholder_line_where_it_stands_in_reading_order() -> None:
    # Given two columns of running text, with a figure at the top of the right column above its text
    left = [line(f"The left column runs on with its words {row}", 100, 100 + 24 * row, right=480) for row in range(8)]
    right = [line(f"The right column runs on with its words {row}", 520, 400 + 24 * row, right=900) for row in range(8)]
    figure = Figure(left=520, top=100, right=900, bottom=380)

    # When the page is laid out with the figure
    lines = boxes_to_text([*left, *right], figures=[figure]).splitlines()

    # Then the figure is a line of its own between the left column and the right one
    at = lines.index(FIGURE)
    assert lines[at - 2 : at + 3] == [left[-1].text, "", "[figure]", "", right[0].text], lines
    assert lines.count(FIGURE) == 1


def test_a_page_of_a_figure_and_no_text_reads_as_the_figure_not_as_blank() -> None:
    # Given a page with a picture and no text
    # When it is laid out
    # Then it reads as the figure's placeholder
    assert boxes_to_text([], figures=[Figure(10, 10, 500, 700)]) == "[figure]"


def test_a_figure_inside_a_table_goes_before_the_table() -> None:
    # Given a table of three rows whose middle row stands level with a small figure in its last column
    rows = [[line(f"name {row}", 100, 100 + 30 * row), line(f"{row}.5", 400, 100 + 30 * row)] for row in range(3)]
    figure = Figure(left=380, top=125, right=460, bottom=160)

    # When it is laid out
    lines = boxes_to_text([box for row in rows for box in row], figures=[figure]).splitlines()

    # Then the table stays whole and the figure's line comes before it
    assert lines[:2] == [FIGURE, ""], lines
    assert [row for row in lines if row.startswith("|")] == lines[2:], lines


@pytest.mark.offline_ocr
def test_a_real_papers_figures_are_placeholders_in_its_reading_order(read) -> None:
    # Given page 2 of a two-column paper: a histogram at the top of the right column and a heat map at its bottom
    # When the page is read
    lines = read(DOCUMENTS / "hasyv2-paper.pdf", 2).splitlines()

    # Then each figure is a placeholder line: the first after the left column's last line, the second after the
    # right column's paragraph above the heat map
    assert lines.count(FIGURE) == 2, lines
    first, second = (at for at, text in enumerate(lines) if text == FIGURE)
    assert "The block-like structure" in lines[first - 2], lines
    assert any("corner are likely" in text for text in lines[second - 4 : second]), lines


@pytest.mark.offline_ocr
def test_a_real_pictures_are_figures_and_a_real_forms_rules_are_not(read) -> None:
    # Given a page of a picture only, a Google Docs page with a small drawing beside its text, and a form of ruled
    # boxes, shaded bars and a frame
    picture = read(CORPUS / "grayscale-image.pdf", 1)
    drawing = read(CORPUS / "google-doc-document.pdf", 1)
    form = read(DOCUMENTS / "SF424_page2.pdf", 1)

    # When they are read
    # Then the picture and the drawing are a figure each, and the form has none
    assert picture == FIGURE
    assert drawing.count(FIGURE) == 1, drawing
    assert FIGURE not in form, form
