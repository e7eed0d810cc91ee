"""The offline RapidOCR provider on real images, with the models bundled in the rapidocr wheel (no mocks), and its
layout of detected boxes into lines in reading order.

The OCR tests need the 'offline' extra; CI installs it. Each of the three real pages takes about 10 CPU-seconds: some
5 s on two idle cores, longer when they are shared.
"""

from __future__ import annotations

import asyncio
import io
import sys
from pathlib import Path
from typing import Any, cast

import pytest
from pagescribe.checks import BLANK_PAGE, Answer, Flag, PageEvidence, Thresholds, check_answer
from pagescribe.layout import boxes_to_text
from pagescribe.layout.boxes import TextBox
from pagescribe.providers.base import PageImage, ProviderError, Transcription, TranscriptionRequest
from pagescribe.providers.offline import RapidOcrProvider, _engine_params, _import_rapidocr, _read_upright
from pagescribe.settings import ConfigurationError
from pagescribe.sources.documents import DocumentKind
from pagescribe.sources.pages import render_page
from pagescribe.sources.textlayer import extract_text_layer
from pagescribe_local.scoring import recall_precision
from PIL import Image

from tests.support import CORPUS
from tests.support.offline import offline

pytest.importorskip("rapidocr")  # only a guard for machines without the extra: CI installs it

PDF = CORPUS / "pdflatex-4-pages.pdf"
TWO_COLUMNS = CORPUS / "multicolumn.pdf"  # a LaTeX article in two columns, with a narrow gutter
PAPER = Path(__file__).resolve().parents[1] / "data" / "documents" / "hasyv2-paper.pdf"  # page 6 is a table
SLIDES = PAPER.with_name("sommerakademie-2016-slides.pdf")  # a Beamer talk; slide 10: a title above a list
NICS = PAPER.with_name("nics-background-checks-2015-11.pdf")  # a statistical table in small type
# Words of page 1's embedded text layer (a blind text) that OCR reads reliably.
WORDS = ("Huardest", "gefburn", "Kjift", "alphabet", "nonsense")


def page_request(image: PageImage) -> TranscriptionRequest:
    return TranscriptionRequest(
        image=image,
        prompt="ignored by OCR",
        model="ignored by OCR",
        max_output_tokens=4096,
        document_id="doc-1",
        page_number=1,
    )


def blank_image(width: int = 1100, height: int = 1500) -> PageImage:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), "white").save(buffer, format="PNG")
    return PageImage(data=buffer.getvalue(), media_type="image/png")


async def transcribe_all(provider: RapidOcrProvider, *images: PageImage, seconds: float = 120.0) -> list[Transcription]:
    try:
        return [await provider.transcribe(page_request(image), call_seconds=seconds) for image in images]
    finally:
        await provider.aclose()


@pytest.mark.offline_ocr
def test_a_real_page_reads_its_words_in_lines() -> None:
    page = render_page(PDF, DocumentKind.PDF, 1)
    layer = extract_text_layer(PDF, 1)
    assert all(word in layer for word in WORDS)  # the words are really on the page

    provider = offline()
    [result] = asyncio.run(transcribe_all(provider, PageImage(data=page.data, media_type=page.media_type)))

    text = result.text.lower()
    assert all(word.lower() in text for word in WORDS), result.text
    assert len(result.text.splitlines()) >= 20  # the page has 45 lines of text and a page number
    assert "\n\n" in result.text  # the page number, far below the text, is its own paragraph
    assert result.model.startswith("rapidocr-")
    assert result.finish_reason == "stop"
    assert result.cost == 0.0
    assert result.failed_attempts == ()
    assert 0 < result.latency_seconds < 120
    assert provider.name == "offline:rapidocr"


@pytest.mark.offline_ocr
def test_a_blank_page_reads_blank_page() -> None:
    [result] = asyncio.run(transcribe_all(offline(), blank_image()))

    assert result.text == BLANK_PAGE == "(blank page)"


@pytest.mark.offline_ocr
def test_a_page_over_its_time_raises_a_retryable_error() -> None:
    provider = offline()  # its engine is not built yet: that alone takes longer than the call's time

    with pytest.raises(ProviderError) as caught:
        asyncio.run(transcribe_all(provider, blank_image(), seconds=0.01))

    assert caught.value.retryable
    assert "within the call's 0.01 s" in caught.value.message


@pytest.mark.offline_ocr
def test_the_engine_is_built_once_and_reused() -> None:
    provider = offline()
    assert provider.engine_loads == 0  # built lazily, on the first page

    results = asyncio.run(transcribe_all(provider, blank_image(), blank_image(400, 300)))

    assert [result.text for result in results] == [BLANK_PAGE, BLANK_PAGE]
    assert provider.engine_loads == 1


def test_boxes_become_lines_in_reading_order_with_a_blank_line_at_a_large_gap() -> None:
    boxes = [
        TextBox("after a gap", left=10, top=200, bottom=220),
        TextBox("world", left=200, top=102, bottom=122),
        TextBox("second line", left=10, top=125, bottom=145),
        TextBox("Hello", left=10, top=100, bottom=120),
    ]

    assert boxes_to_text(boxes) == "Hello world\nsecond line\n\nafter a gap"
    assert boxes_to_text([]) == BLANK_PAGE


def text_line(text: str, left: float, right: float, top: float) -> TextBox:
    """A box as RapidOCR reports a line of 20-pixel text."""
    return TextBox(text, left=left, top=top, bottom=top + 20, right=right)


def column(side: str, left: float, right: float, rows: int, top: float = 120) -> list[TextBox]:
    """A column of running text, one full-width line every 24 pixels."""
    return [text_line(f"{side} line {row} of the running text", left, right, top + 24 * row) for row in range(rows)]


@pytest.mark.offline_ocr
def test_a_real_two_column_page_reads_the_left_column_before_the_right_one() -> None:
    page = render_page(TWO_COLUMNS, DocumentKind.PDF, 1)

    [result] = asyncio.run(transcribe_all(offline(), PageImage(data=page.data, media_type=page.media_type)))

    lines = result.text.splitlines()
    assert lines[0] == "# Two-Column Document with Lorem Ipsum"
    abstract = next(index for index, line in enumerate(lines) if line.endswith("Abstract"))
    assert lines[abstract].startswith("#")  # a heading, of the title's size or smaller
    assert {"Your Name", "January 3, 2024"} <= {line.lstrip("# ") for line in lines[1:abstract]}
    text = " ".join(result.text.split())
    left_ends = text.index("Vivamus viverra fermentum felis. Donec nonummy")  # the left column's last line
    right_begins = text.index("pellentesque ante. Phasellus adipiscing semper elit.")  # the right one's first
    assert left_ends < right_begins
    assert text.index("This is a sample document with two columns") < left_ends  # the abstract, in the left column
    assert result.text.splitlines()[-1] == "<!-- page number: 1 -->"  # below both columns, last, marked


@pytest.mark.offline_ocr
@pytest.mark.offline_ocr
def test_a_dense_table_in_small_type_reads_from_its_title_down_and_nearly_every_word() -> None:
    # Given the NICS page: a statistical table of 55 states by 23 columns in 6-point type, some 1,300 lines of text
    page = render_page(NICS, DocumentKind.PDF, 1)
    layer = extract_text_layer(NICS, 1)

    # When the offline engine reads it (half a minute on two idle cores; the suite shares them among four workers)
    image = PageImage(data=page.data, media_type=page.media_type)
    [result] = asyncio.run(transcribe_all(offline(), image, seconds=900.0))

    # Then its title and first rows are there (the engine's cap of 1,000 candidate lines, taken from the bottom up,
    # dropped the top third of the page: 59 % of its words), and nine words in ten at least (the lone digits of its
    # small type were missed at the size sent: 76 %; read again enlarged, 95 %)
    assert "NICS Firearm Background Checks" in result.text
    assert "Alabama" in result.text and "Alaska" in result.text
    recall, precision = recall_precision(layer, result.text)
    assert recall >= 0.9, result.text
    assert precision >= 0.9, result.text


@pytest.mark.offline_ocr
def test_a_sideways_page_of_small_type_is_turned_at_the_size_sent_and_read_enlarged_once() -> None:
    # Given the top of the NICS table (6-point type) turned a quarter, and the engine, each call of it counted
    page = render_page(NICS, DocumentKind.PDF, 1)
    with Image.open(io.BytesIO(page.data)) as full:
        top = full.convert("RGB").crop((0, 0, full.width, full.height // 3)).rotate(90, expand=True)
    engine = _Counted(_import_rapidocr()(params=_engine_params("ch", threads=2)))

    # When it is read upright
    boxes, rotation = _read_upright(cast(Any, engine), top)  # the real engine, behind a counter

    # Then it was turned back, and read four times: as sent, a quarter each way (finding the way up needs no small
    # type read well), and once enlarged, the way up; enlarging each reading took six, and more than the page's
    # time on a loaded machine
    assert rotation == 90
    assert len(engine.sizes) == 4
    assert engine.sizes[-1][0] > top.height and engine.sizes[-1][1] > top.width  # the last, enlarged and upright
    text = " ".join(box.text for box in boxes)
    assert "Alabama" in text and "Arkansas" in text


class _Counted:
    """The engine, the size of each image it is given recorded."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine
        self.sizes: list[tuple[int, int]] = []

    def __call__(self, image: Image.Image) -> Any:
        self.sizes.append(image.size)
        return self._engine(image)


def test_a_real_table_keeps_its_rows_on_one_line_each() -> None:
    page = render_page(PAPER, DocumentKind.PDF, 6)  # a table of LaTeX commands in four columns, two by two

    [result] = asyncio.run(transcribe_all(offline(), PageImage(data=page.data, media_type=page.media_type)))

    lines = result.text.splitlines()
    assert any("\\aleph" in line and "\\oiint" in line for line in lines), result.text
    assert any("\\Vdash" in line and "\\odot" in line for line in lines), result.text


def test_two_columns_read_one_after_the_other_between_a_full_width_title_and_a_footer() -> None:
    # Given a centred title, two columns of eight lines with a 20-pixel gutter, and a footer under the left column
    title = text_line("Two Columns of Running Text", 350, 750, 40)
    footer = text_line("Page 7", 100, 160, 400)
    boxes = [title, *column("left", 100, 540, 8), *column("right", 560, 1000, 8), footer]

    # When they are laid out
    text = boxes_to_text(boxes)

    # Then the left column is read, then the right one, and the title and the footer (marked a page number) keep
    # their places
    assert text.splitlines() == [
        "Two Columns of Running Text",
        "",
        *(f"left line {row} of the running text" for row in range(8)),
        *(f"right line {row} of the running text" for row in range(8)),
        "",
        "<!-- page number: Page 7 -->",
    ]


def test_three_columns_read_one_after_another() -> None:
    # Given three columns of running text side by side
    boxes = [*column("left", 100, 400, 6), *column("middle", 420, 720, 6), *column("right", 740, 1040, 6)]

    # When they are laid out
    lines = boxes_to_text(boxes).splitlines()

    # Then each column is read whole, from left to right
    assert [line.split()[0] for line in lines] == ["left"] * 6 + ["middle"] * 6 + ["right"] * 6


def test_the_longer_left_column_of_a_last_page_is_read_to_its_end_before_the_right_one() -> None:
    # Given a left column of nine lines beside a right column of five
    boxes = [*column("left", 100, 540, 9), *column("right", 560, 1000, 5)]

    # When they are laid out
    lines = boxes_to_text(boxes).splitlines()

    # Then the left column's last lines, beside nothing, still come before the right column
    assert [line.split()[0] for line in lines] == ["left"] * 9 + ["right"] * 5


def test_two_columns_lines_read_as_one_box_across_a_narrow_gutter_are_cut_at_the_gutter() -> None:
    # Given two columns whose last two lines the engine read as one box each, across the gutter
    across = [
        text_line(
            f"left line {row} of the running text right line {row} of the running text", 100, 1000, 120 + 24 * row
        )
        for row in (6, 7)
    ]
    boxes = [*column("left", 100, 540, 6), *column("right", 560, 1000, 6), *across]

    # When they are laid out
    lines = boxes_to_text(boxes).splitlines()

    # Then each is cut in two at the gutter, and its halves end their columns
    assert lines == [
        *(f"left line {row} of the running text" for row in range(8)),
        *(f"right line {row} of the running text" for row in range(8)),
    ]


def test_a_table_becomes_a_markdown_table_with_a_row_per_line() -> None:
    # Given a table: a name and three figures in each row, its columns lined up with white between them
    rows = [("Random Forest", "96.41 %", "62.4 %", "62.1 % - 62.8 %"), ("Decision Tree", "65.40 %", "11.0 %", "10.4 %")]
    rows += [(f"Classifier number {index}", f"{90 - index}.5 %", f"{50 - index}.1 %", "n/a") for index in range(8)]
    boxes = [
        text_line(cell, left, left + 20 * len(cell) / 2, 100 + 24 * index)
        for index, cells in enumerate(rows)
        for cell, left in zip(cells, (100, 400, 600, 800), strict=True)
    ]

    # When it is laid out
    lines = boxes_to_text(boxes).splitlines()

    # Then it is a markdown table: every row one line, its cells left to right in their columns
    assert lines == [
        "| " + " | ".join(rows[0]) + " |",
        "| --- | --- | --- | --- |",
        *("| " + " | ".join(cells) + " |" for cells in rows[1:]),
    ]


def test_two_lists_side_by_side_keep_their_rows_together() -> None:
    # Given a form's two lists of check boxes side by side, items of a few words each
    rows = [
        ("Screening of Access report", "Attempted or successful reunification"),
        ("Protective plan implemented", "Referral to services"),
        ("Initial assessment conducted", "Transportation assistance"),
        ("Safety plan implemented", "Collaboration with law enforcement"),
        ("Temporary physical custody of child", "Collaboration with medical professionals"),
        ("Petitioned for court order / CHIPS (child in need of", "Supervised visitation"),
        ("protection or services)", "Case remains open for services"),
        ("Placement into foster home", "Case closed by agency"),
    ]
    boxes = [
        text_line(item, left, left + 8 * len(item), 100 + 24 * index)
        for index, items in enumerate(rows)
        for item, left in zip(items, (100, 560), strict=True)
    ]

    # When they are laid out
    lines = boxes_to_text(boxes).splitlines()

    # Then the items do not fill their columns as lines of prose do: each row stays whole, a row of a table
    assert lines == [
        "| " + " | ".join(rows[0]) + " |",
        "| --- | --- |",
        *("| " + " | ".join(items) + " |" for items in rows[1:]),
    ]


def test_a_single_column_reads_as_lines_top_to_bottom() -> None:
    # Given one column of running text, with a paragraph's short last line and a gap before the next paragraph
    boxes = [
        *column("first", 100, 1000, 5),
        text_line("the end of it.", 100, 300, 240),
        *column("second", 100, 1000, 3, 300),
    ]

    # When it is laid out
    text = boxes_to_text(boxes)

    # Then it reads line by line, a blank line at the gap, as without columns
    assert text.splitlines() == [
        *(f"first line {row} of the running text" for row in range(5)),
        "the end of it.",
        "",
        *(f"second line {row} of the running text" for row in range(3)),
    ]


def test_without_the_extra_construction_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "rapidocr", None)  # makes "import rapidocr" fail as if not installed

    with pytest.raises(ConfigurationError, match=r"pip install 'pagescribe\[offline\]'"):
        offline()


@pytest.mark.offline_ocr
@pytest.mark.parametrize(("counter_clockwise", "turned_back"), [(90, 90), (180, 180), (270, 270)])
def test_a_page_sent_turned_is_read_upright_and_says_how_far_it_was_turned(
    counter_clockwise: int, turned_back: int
) -> None:
    # Given a real slide turned, as a scan the renderer's orientation detection did not turn would arrive (its few
    # lines leave that detection unsure)
    page = render_page(SLIDES, DocumentKind.PDF, 10)
    with Image.open(io.BytesIO(page.data)) as upright:
        buffer = io.BytesIO()
        upright.rotate(counter_clockwise, expand=True).save(buffer, format="PNG")

    # When the offline engine reads it, and the upright page
    turned, straight = asyncio.run(
        transcribe_all(
            offline(),
            PageImage(data=buffer.getvalue(), media_type="image/png"),
            PageImage(data=page.data, media_type=page.media_type),
        )
    )

    # Then the turned page is read upright, as the upright one is, and the turn back (clockwise) is reported
    assert (turned.rotation, straight.rotation) == (turned_back, 0)
    assert turned.text.splitlines()[0] == "# ImageNet / ILSVRC 2014"
    assert turned.text == straight.text
    assert turned.confidence is not None and turned.confidence > 0.9


@pytest.mark.offline_ocr
def test_a_language_whose_model_does_not_ship_is_refused_naming_those_that_do() -> None:
    with pytest.raises(ConfigurationError, match=r"language 'latin'.*never downloads models.*ship: ch$"):
        offline(language="latin")


@pytest.mark.offline_ocr
@pytest.mark.parametrize(("page_number", "turned"), [(3, 180), (4, 90)])
def test_a_turned_scan_read_as_it_is_has_low_confidence_and_turned_it_reads_upright(
    page_number: int, turned: int
) -> None:
    # Given a real scan whose page is turned (cardinal.pdf: the same brochure page at 0, 90, 180 and 270 degrees),
    # rendered as it is
    scan = Path(__file__).resolve().parents[1] / "data" / "documents" / "cardinal.pdf"
    as_it_is = render_page(scan, DocumentKind.PDF, page_number, orient=False)
    image = PageImage(as_it_is.data, as_it_is.media_type)
    # When the offline engine reads it as it is (DETECT_ORIENTATION=false), and turning it where it must
    [sideways] = asyncio.run(transcribe_all(offline(orient=False), image))
    [straight] = asyncio.run(transcribe_all(offline(), image))
    thresholds = Thresholds()

    def flags(result: Transcription) -> list[Flag]:
        answer = Answer(result.text, result.finish_reason, confidence=result.confidence)
        evidence = PageEvidence(ink=0.1, rotation=result.rotation)
        return [flag.flag for flag in check_answer(answer, evidence, thresholds, max_output_tokens=4096)]

    # Then the turned page's scrambled reading is flagged low_confidence; turned upright it is read with
    # confidence, and flagged only as rotated, by the turn the renderer would have made
    assert sideways.rotation == 0
    assert sideways.confidence is not None and sideways.confidence < thresholds.low_confidence
    assert flags(sideways) == [Flag.LOW_CONFIDENCE]
    assert straight.rotation == turned == render_page(scan, DocumentKind.PDF, page_number).rotation
    assert straight.confidence is not None and straight.confidence > 0.95
    assert flags(straight) == [Flag.ROTATED]
