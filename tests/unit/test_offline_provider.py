"""The offline RapidOCR provider on real images, with the models bundled in the rapidocr wheel (no mocks).

The OCR tests need the 'offline' extra; CI installs it. The one real page takes about 10 CPU-seconds: some 5 s on
two idle cores, longer when they are shared.
"""

from __future__ import annotations

import asyncio
import io
import sys
from pathlib import Path

import pytest
from pagescribe.checks import BLANK_PAGE
from pagescribe.documents import DocumentKind, extract_text_layer, render_page
from pagescribe.providers.base import PageImage, ProviderError, Transcription, TranscriptionRequest
from pagescribe.providers.offline import RapidOcrProvider, TextBox, boxes_to_text
from pagescribe.settings import ConfigurationError
from PIL import Image

pytest.importorskip("rapidocr")  # only a guard for machines without the extra: CI installs it

PDF = Path(__file__).resolve().parents[3] / "shared" / "corpus" / "pdflatex-4-pages.pdf"
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


async def transcribe_all(provider: RapidOcrProvider, *images: PageImage, budget: float = 120.0) -> list[Transcription]:
    try:
        return [await provider.transcribe(page_request(image), budget_seconds=budget) for image in images]
    finally:
        await provider.aclose()


@pytest.mark.offline_ocr
def test_a_real_page_reads_its_words_in_lines() -> None:
    page = render_page(PDF, DocumentKind.PDF, 1)
    layer = extract_text_layer(PDF, 1)
    assert all(word in layer for word in WORDS)  # the words are really on the page

    provider = RapidOcrProvider()
    [result] = asyncio.run(transcribe_all(provider, PageImage(data=page.data, media_type=page.media_type)))

    text = result.text.lower()
    assert all(word.lower() in text for word in WORDS), result.text
    assert len(result.text.splitlines()) >= 20  # the page has 45 lines of text and a page number
    assert "\n\n" in result.text  # the page number, far below the text, is its own paragraph
    assert result.model.startswith("rapidocr-")
    assert result.finish_reason == "stop"
    assert result.cost == 0.0
    assert result.http_attempts == 1
    assert 0 < result.latency_seconds < 120
    assert provider.name == "offline:rapidocr"


@pytest.mark.offline_ocr
def test_a_blank_page_reads_blank_page() -> None:
    [result] = asyncio.run(transcribe_all(RapidOcrProvider(), blank_image()))

    assert result.text == BLANK_PAGE == "(blank page)"


@pytest.mark.offline_ocr
def test_a_page_over_budget_raises_a_retryable_error() -> None:
    provider = RapidOcrProvider()  # its engine is not built yet: that alone takes longer than the budget

    with pytest.raises(ProviderError) as caught:
        asyncio.run(transcribe_all(provider, blank_image(), budget=0.01))

    assert caught.value.retryable
    assert "budget" in caught.value.message


@pytest.mark.offline_ocr
def test_the_engine_is_built_once_and_reused() -> None:
    provider = RapidOcrProvider()
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


def test_without_the_extra_construction_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "rapidocr", None)  # makes "import rapidocr" fail as if not installed

    with pytest.raises(ConfigurationError, match=r"pip install 'pagescribe\[offline\]'"):
        RapidOcrProvider()
