"""Dense pages read in tiles: which pages, how they are cut, the bands rendered, and the answers stitched."""

from __future__ import annotations

import io
from pathlib import Path

import pypdfium2 as pdfium
import pypdfium2.raw as pdfium_c
import pytest
from pagescribe.checks import usable_text_layer
from pagescribe.grounding import Box, EvidenceWord, GroundingSource, PageText
from pagescribe.sources.documents import DocumentKind
from pagescribe.sources.pages import Band, render_band, render_page
from pagescribe.sources.textlayer import _characters_of, text_layer_print, text_layer_words
from pagescribe.transcription.stitching import stitch
from pagescribe.transcription.tileplan import MIN_WORDS, TileLimits, plan_tiles, print_height, text_height
from PIL import Image

LIMITS = TileLimits(min_text_px=11.0, max_tiles=6, max_pixels=1_600_000, max_long_edge=2048, overlap=0.15)
DOCUMENTS = Path(__file__).resolve().parents[1] / "data" / "documents"
NICS = DOCUMENTS / "nics-background-checks-2015-11.pdf"


def _words(heights: list[float]) -> PageText:
    words = tuple(EvidenceWord(f"w{n}", Box(0, 10 * n, 30, 10 * n + h), n) for n, h in enumerate(heights))
    return PageText(GroundingSource.TEXT_LAYER, words, 1000, 1000, None)


def test_text_height_is_the_median_of_the_words_and_unknown_with_too_few() -> None:
    assert text_height(_words([6.0] * 15 + [30.0] * 10)) == 6.0
    assert text_height(_words([6.0] * 19)) is None
    assert text_height(None) is None


def test_dot_leaders_and_rules_are_no_measure_of_the_print() -> None:
    words = _words([12.0] * 20 + [2.0] * 30)
    leaders = tuple(w if n < 20 else EvidenceWord("........", w.box, w.line) for n, w in enumerate(words.words))
    assert text_height(PageText(GroundingSource.TEXT_LAYER, leaders, 1000, 1000, None)) == 12.0


@pytest.mark.parametrize(("mark", "counted"), [("___", False), ("—·—", False), ("§", False), ("é", True), ("٣", True)])
def test_a_word_counts_by_a_letter_or_digit_of_any_script(mark: str, counted: bool) -> None:
    # Given 20 words of 12 px and 30 words of 2 px that are only the mark (an underscore rule, dashes and dots, a
    # section sign; an accented letter, an Arabic-Indic digit)
    words = _words([12.0] * 20 + [2.0] * 30)
    marked = tuple(w if n < 20 else EvidenceWord(mark, w.box, w.line) for n, w in enumerate(words.words))
    # Then the print is measured on the words with a letter or digit only
    assert text_height(PageText(GroundingSource.TEXT_LAYER, marked, 1000, 1000, None)) == (2.0 if counted else 12.0)


def test_a_page_with_small_print_is_cut_into_overlapping_bands_within_the_limits() -> None:
    plan = plan_tiles(1210, 1568, text_px=6.0, truncated=False, limits=LIMITS)
    assert plan is not None and "6.0 px" in plan.why
    assert 1.2 <= plan.zoom <= 2048 / 1210  # as much as a band's width allows, no more than the text needs
    assert 2 <= len(plan.bands) <= LIMITS.max_tiles
    assert plan.bands[0].top == 0.0 and plan.bands[-1].bottom == pytest.approx(1.0)
    for upper, lower in zip(plan.bands, plan.bands[1:], strict=False):
        shared = upper.bottom - lower.top
        assert shared == pytest.approx(LIMITS.overlap * (upper.bottom - upper.top), rel=1e-3)
    for band in plan.bands:
        pixels = 1210 * plan.zoom * 1568 * (band.bottom - band.top) * plan.zoom
        assert pixels <= LIMITS.max_pixels * 1.001 and 1210 * plan.zoom <= LIMITS.max_long_edge + 1


def test_the_zoom_is_no_more_than_the_text_needs() -> None:
    plan = plan_tiles(600, 800, text_px=8.0, truncated=False, limits=LIMITS)
    assert plan is not None and plan.zoom == pytest.approx(2 * 11.0 / 8.0)


def test_print_large_enough_or_a_zoom_that_cannot_help_is_not_tiled() -> None:
    assert plan_tiles(1210, 1568, text_px=14.0, truncated=False, limits=LIMITS) is None
    assert plan_tiles(1210, 1568, text_px=None, truncated=False, limits=LIMITS) is None
    assert plan_tiles(2000, 1400, text_px=6.0, truncated=False, limits=LIMITS) is None  # already as wide as allowed


def test_a_truncated_answer_is_read_in_smaller_parts_bounded_by_the_tile_limit() -> None:
    plan = plan_tiles(2000, 1400, text_px=None, truncated=True, limits=LIMITS)
    assert plan is not None and len(plan.bands) == 3 and plan.zoom <= 1.0
    small = TileLimits(11.0, 2, 1_600_000, 2048, 0.15)
    bounded = plan_tiles(1210, 1568, text_px=6.0, truncated=True, limits=small)
    assert bounded is not None and len(bounded.bands) == 2


def test_a_band_of_a_pdf_page_is_drawn_larger_and_an_image_band_never_past_its_pixels(tmp_path: Path) -> None:
    whole = render_page(NICS, DocumentKind.PDF, 1, dpi=150, max_long_edge=1024)
    band = render_band(NICS, DocumentKind.PDF, 1, Band(0.25, 0.75), zoom=2.0, dpi=150, max_long_edge=1024)
    assert band.width == pytest.approx(2 * whole.width, abs=2)
    assert band.height == pytest.approx(whole.height, abs=3)  # half the page at twice the scale
    assert band.ink > 0
    image = tmp_path / "page.png"
    Image.new("L", (400, 600), 255).save(image)
    cut = render_band(image, DocumentKind.PNG, 1, Band(0.5, 1.0), zoom=3.0, dpi=150, max_long_edge=300)
    assert (cut.width, cut.height) == (400, 300)  # its own pixels: not upscaled
    assert Image.open(io.BytesIO(cut.data)).size == (400, 300)


def test_the_nics_table_in_6_pt_is_dense_at_a_model_sized_input() -> None:
    whole = render_page(NICS, DocumentKind.PDF, 1, dpi=150, max_long_edge=1024)
    height = text_height(text_layer_words(NICS, 1, dpi=150, max_long_edge=1024))
    assert height is not None and height < LIMITS.min_text_px
    assert plan_tiles(whole.width, whole.height, text_px=height, truncated=False, limits=LIMITS) is not None


REAL_PDFS = sorted([*DOCUMENTS.glob("*.pdf"), *(DOCUMENTS.parent / "olmocr-bench" / "pdfs").rglob("*.pdf")])


def _pages(path: Path) -> range:
    with pdfium.PdfDocument(path) as pdf:
        return range(1, min(len(pdf), 12) + 1)


@pytest.mark.parametrize("path", REAL_PDFS, ids=[path.name for path in REAL_PDFS])
def test_the_print_measured_before_a_call_is_the_words_median_on_real_pages(path: Path) -> None:
    # Given real PDF pages (dense tables, papers, forms, slides, CJK)
    for page in _pages(path):
        # When a page's print is measured as its render comes back (each word by its first letter or digit)
        measured = print_height(text_layer_print(path, page, dpi=150, max_long_edge=1024))
        words = text_height(text_layer_words(path, page, dpi=150, max_long_edge=1024))
        # Then it is the median height of the words placed on the page, within a tenth (a word pdfium runs over a
        # line's end is one word there, two here), and the same pages are unmeasured (too few words) and dense
        assert (measured is None) == (words is None), f"{path.name} page {page}: {measured} vs {words}"
        if measured is not None and words is not None:
            assert measured == pytest.approx(words, rel=0.1), f"{path.name} page {page}"
            assert (measured < LIMITS.min_text_px) == (words < LIMITS.min_text_px), f"{path.name} page {page}"


def test_the_print_of_the_nics_table_is_measured_dense() -> None:
    printed = text_layer_print(NICS, 1, dpi=150, max_long_edge=1024)
    assert printed is not None and printed.words >= MIN_WORDS and printed.px < LIMITS.min_text_px


PARAGRAPH = [
    "Section 4. Eligibility and reporting",
    "Each applicant shall report the total number of background checks",
    "conducted during the reporting period, by state and by type of permit.",
    "Checks for handguns and long guns are counted separately; a check",
    "that covers more than one firearm counts once. Multiple checks on",
    "one day for the same person are counted as one check.",
    "States that issue permits report them in the permit column.",
    "Totals are given at the foot of the table for every column.",
]


def test_the_overlap_read_twice_is_kept_once_despite_ocr_noise() -> None:
    upper = "\n".join(
        [*PARAGRAPH[:5], "one day for the sarne person are counted as one check.", "States that issue pe"]
    )
    lower = "\n".join(
        [
            "at covers more than one flrearm counts once. Multiple checks on",  # cut at the band's top edge
            "one day for the same person are counted as one check.",
            "States that issue permits report them in the perrnit column.",
            *PARAGRAPH[7:],
        ]
    )
    text, [matched] = stitch([upper, lower])
    lines = text.split("\n")
    assert matched >= 2
    assert lines[:4] == PARAGRAPH[:4]
    assert len(lines) == len(PARAGRAPH)  # nothing repeated, nothing lost
    assert lines[-1] == PARAGRAPH[-1]
    assert "States that issue pe" not in lines  # the line cut at the upper band's bottom edge is dropped


def test_answers_without_an_overlap_are_joined_whole_in_order() -> None:
    text, seams = stitch(["First band, its own text.", "", "Second band, other words entirely."])
    assert text == "First band, its own text.\nSecond band, other words entirely."
    assert seams == [0]


def test_a_table_across_a_seam_keeps_one_header() -> None:
    upper = "| State | Permit | Handgun |\n| --- | --- | --- |\n| Alabama | 2,101 | 20,543 |\n| Alaska | 181 | 3,"
    lower = "| Alaska | 181 | 3,012 |\n| --- | --- | --- |\n| Arizona | 5,320 | 15,225 |\n| Arkansas | 3,001 | 8,821 |"
    text, _ = stitch([upper, lower])
    assert text.split("\n") == [
        "| State | Permit | Handgun |",
        "| --- | --- | --- |",
        "| Alabama | 2,101 | 20,543 |",
        "| Alaska | 181 | 3,012 |",
        "| Arizona | 5,320 | 15,225 |",
        "| Arkansas | 3,001 | 8,821 |",
    ]


def test_a_table_header_the_lower_tile_repeats_is_dropped() -> None:
    upper = "| State | Permit |\n| --- | --- |\n| Alabama | 2,101 |"
    lower = "| State | Permit |\n| --- | --- |\n| Arizona | 5,320 |"
    text, _ = stitch([upper, lower])
    assert text.count("| State | Permit |") == 1 and text.count("| --- | --- |") == 1
    assert text.endswith("| Alabama | 2,101 |\n| Arizona | 5,320 |")


def test_an_html_table_cut_at_a_seam_is_closed_once() -> None:
    rows = ["<tr><td>Alabama</td><td>2,101</td></tr>", "<tr><td>Alaska</td><td>181</td></tr>"]
    upper = "\n".join(["<table>", *rows, "<tr><td>Arizona</td><td>5,320</td></tr>", "</table>"])
    lower = "\n".join(["| Alaska | 181 |", "| --- | --- |", "| Arizona | 5,320 |", "", "Notes to the table"])
    text, [matched] = stitch([upper, lower])
    assert matched == 2
    assert text.count("<table>") == 1 and text.count("</table>") == 1 and "| --- |" not in text
    assert text.index("Arizona") < text.index("</table>") < text.index("Notes")  # closed where the table ends
    alone, _ = stitch(["Title\n<table>\n<tr><td>Alabama</td><td>2,101</td></tr>", ""])
    assert alone.endswith("</table>")  # an answer cut inside its table: closed


def test_an_overlap_with_a_line_one_answer_split_in_two_is_still_found() -> None:
    rows = [f"| {state} | {n},{n + 117} | {n + 3},{n * 7 % 1000:03} |" for n, state in enumerate(STATES, start=101)]
    upper = [*rows[:6], "| New Hampshire | 3,630 | 4,847 |", "| | 1 | 11 |", *rows[7:10]]
    lower = [rows[5], "| New Hampshire | 3,630 | 4,847 | 1 | 11 |", *rows[7:]]  # one line where upper has two
    text, [matched] = stitch(["\n".join(upper), "\n".join(lower)])
    assert matched >= 3
    lines = text.split("\n")
    assert [line for line in lines if line in rows] == rows[:6] + rows[7:]  # every row once, in order
    assert sum("New Hampshire" in line for line in lines) == 1


STATES = ["Maine", "Maryland", "Michigan", "Missouri", "Montana", "Nebraska", "Nevada", "New Jersey", "New Mexico",
          "New York", "Ohio", "Oregon"]  # fmt: skip


@pytest.mark.parametrize("path", REAL_PDFS, ids=[path.name for path in REAL_PDFS])
def test_a_born_digital_render_comes_with_its_print_measured_as_it_is_alone(path: Path) -> None:
    # Given real PDF pages, born-digital and scanned
    for page in _pages(path):
        # When a page is rendered (its print measured on the page and text the render loaded)
        rendered = render_page(path, DocumentKind.PDF, page, dpi=150, max_long_edge=1024)
        # Then a page with a usable text layer has the print measured alone, a page without one none
        alone = text_layer_print(path, page, dpi=150, max_long_edge=1024)
        assert rendered.print_size == (alone if usable_text_layer(rendered.text_layer) else None), f"page {page}"


@pytest.mark.parametrize("path", REAL_PDFS, ids=[path.name for path in REAL_PDFS])
def test_the_characters_read_at_once_are_pdfiums_one_by_one(path: Path) -> None:
    # Given real PDF pages, some with characters pdfium leaves out of its text and hyphenation marks
    with pdfium.PdfDocument(path) as pdf:
        for index in range(min(len(pdf), 12)):
            textpage = pdf[index].get_textpage()
            # When the page's characters are read at once for measuring its print
            read = _characters_of(textpage)
            # Then they are pdfium's characters one by one, index for index (its hyphenation mark U+0002 in its text
            # as U+FFFE: neither is a letter, a digit or a space)
            one_by_one = [chr(pdfium_c.FPDFText_GetUnicode(textpage.raw, i)) for i in range(textpage.count_chars())]
            assert list(read.replace("\ufffe", "\x02")) == one_by_one, f"page {index + 1}"
