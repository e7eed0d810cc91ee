"""Page orientation on real pages: the corpus and the real scans in tests/data/documents, upright and turned.

A page "turned by a" below is the upright page turned a degrees anticlockwise, as a scanner would deliver a sheet fed
that way: it needs a degrees clockwise to read upright, so a is the answer expected from detect_orientation.
"""

from __future__ import annotations

import functools
import io
from pathlib import Path

import pytest
from pagescribe.orientation import Orientation, detect_orientation, upright
from pagescribe.sources.documents import DocumentKind, inspect_document
from pagescribe.sources.pages import render_page
from PIL import Image

from tests.support import CORPUS, CORPUS_NOTES

DOCUMENTS = Path(__file__).resolve().parents[1] / "data" / "documents"
LIMITS = {"max_pages": 500, "max_image_pixels": 60_000_000}
TURNS = (90, 180, 270)
ANTICLOCKWISE = {90: Image.Transpose.ROTATE_90, 180: Image.Transpose.ROTATE_180, 270: Image.Transpose.ROTATE_270}

# Corpus pages with lines of text: each is detected when turned by 90, 180 or 270 degrees.
CORPUS_TEXT = [
    ("002-trivial-libre-office-writer.pdf", 1),
    ("google-doc-document.pdf", 1),
    ("minimal-document.pdf", 1),
    ("multicolumn.pdf", 1),
    ("multicolumn.pdf", 2),
    ("pdflatex-4-pages.pdf", 1),
    ("pdflatex-4-pages.pdf", 2),
    ("pdflatex-4-pages.pdf", 3),
    ("pdflatex-4-pages.pdf", 4),
    ("pdflatex-outline.pdf", 2),
    ("pdflatex-outline.pdf", 3),
    ("pdflatex-outline.pdf", 4),
]
# Corpus pages without clear lines of text (a photo, the smiles, a table of contents, a table, a figure with little
# text): turned, they may stay as they are, but are never turned the wrong way.
CORPUS_OTHER = [
    ("grayscale-image.pdf", 1),
    ("multicolumn.pdf", 3),
    ("pdflatex-image.pdf", 1),
    ("pdflatex-outline.pdf", 1),
    ("smile.png", 1),
    ("smile.jpg", 1),
    ("smile.tiff", 1),
]
# Real pages in tests/data/documents that are upright (see SOURCES.md there).
DOCUMENTS_UPRIGHT = [
    ("SF424_page2.pdf", 1),
    ("cardinal.pdf", 1),
    ("congress.pdf", 1),
    ("eurotext.tif", 1),
    *[("form_dd0293.pdf", n) for n in range(1, 5)],
    *[("hasyv2-paper.pdf", n) for n in range(1, 9)],
    ("jo.pdf", 1),
    ("nics-background-checks-2015-11.pdf", 1),
    ("phototest.tif", 1),
    *[("sommerakademie-2016-slides.pdf", n) for n in range(1, 14)],
]
# Of those, the pages of running text, detected when turned by 90, 180 or 270 degrees.
DOCUMENTS_TEXT = [("cardinal.pdf", 1), *[("hasyv2-paper.pdf", n) for n in range(1, 6)], ("form_dd0293.pdf", 2)]
# Real scans whose pages are already turned: (file, page, the clockwise turn that makes them upright).
DOCUMENTS_TURNED = [
    ("cardinal.pdf", 2, 270),
    ("cardinal.pdf", 3, 180),
    ("cardinal.pdf", 4, 90),
    ("phototest-rotated-R.png", 1, 270),
]


@functools.cache
def page(path: Path, number: int) -> Image.Image:
    """The page as the pipeline renders it (150 dpi, long edge at most 1568 px), before any turn."""
    info = inspect_document(path, **LIMITS)
    rendered = render_page(path, info.kind, number, orient=False, image_format="png")
    with Image.open(io.BytesIO(rendered.data)) as image:
        return image.convert("RGB")


def corpus_page(name: str, number: int) -> Image.Image:
    return page(CORPUS / name, number)


def document_page(name: str, number: int) -> Image.Image:
    return page(DOCUMENTS / name, number)


def turned(image: Image.Image, angle: int) -> Image.Image:
    """``image`` turned ``angle`` degrees anticlockwise (Pillow's ROTATE_* turn anticlockwise)."""
    return image.transpose(ANTICLOCKWISE[angle])


def corpus_pages() -> list[tuple[str, int]]:
    pages = []
    for path in sorted(CORPUS.iterdir()):
        if path.name in CORPUS_NOTES or path.name == "libreoffice-writer-password.pdf":
            continue
        pages += [(path.name, n) for n in range(1, inspect_document(path, **LIMITS).page_count + 1)]
    return pages


@pytest.mark.parametrize(("name", "number"), corpus_pages())
def test_every_upright_corpus_page_is_left_upright(name: str, number: int) -> None:
    # Given an upright page of the corpus (text, tables, a photo, drawings)
    image = corpus_page(name, number)
    # When its orientation is detected
    found = detect_orientation(image)
    # Then it is left as it is
    assert found.angle == 0


@pytest.mark.parametrize(("name", "number"), CORPUS_TEXT)
@pytest.mark.parametrize("angle", TURNS)
def test_a_corpus_text_page_turned_is_turned_back(name: str, number: int, angle: int) -> None:
    # Given a page of running text turned by a quarter or half turn
    image = turned(corpus_page(name, number), angle)
    # When its orientation is detected
    found = detect_orientation(image)
    # Then the clockwise turn that undoes it is found, with more than half of the evidence for it
    assert found.angle == angle
    assert 0.5 < found.confidence <= 1


@pytest.mark.parametrize(("name", "number"), CORPUS_OTHER)
@pytest.mark.parametrize("angle", TURNS)
def test_a_corpus_page_without_running_text_turned_is_never_turned_the_wrong_way(
    name: str, number: int, angle: int
) -> None:
    # Given a turned page with little or no running text
    image = turned(corpus_page(name, number), angle)
    # When its orientation is detected
    found = detect_orientation(image)
    # Then it is left as it is or turned back, never turned another way
    assert found.angle in (0, angle)


@pytest.mark.parametrize("name", ["grayscale-image.pdf", "smile.png", "smile.jpg", "smile.tiff"])
@pytest.mark.parametrize("angle", (0, *TURNS))
def test_pictures_without_text_are_left_as_they_are(name: str, angle: int) -> None:
    # Given a photo or a drawing without text, upright or turned
    image = corpus_page(name, 1)
    image = turned(image, angle) if angle else image
    # When its orientation is detected
    found = detect_orientation(image)
    # Then nothing is turned
    assert found.angle == 0


@pytest.mark.parametrize(("name", "number"), DOCUMENTS_UPRIGHT)
def test_every_upright_real_document_page_is_left_upright(name: str, number: int) -> None:
    # Given an upright page of a real document: scans, forms, a dense table, slides, a paper, a vertical Japanese page
    image = document_page(name, number)
    # When its orientation is detected
    found = detect_orientation(image)
    # Then it is left as it is
    assert found.angle == 0


@pytest.mark.parametrize(("name", "number"), DOCUMENTS_UPRIGHT)
@pytest.mark.parametrize("angle", TURNS)
def test_a_real_document_page_turned_is_never_turned_the_wrong_way(name: str, number: int, angle: int) -> None:
    # Given a real page turned by a quarter or half turn
    image = turned(document_page(name, number), angle)
    # When its orientation is detected
    found = detect_orientation(image)
    # Then it is turned back or left as it is (a slide of a few words), never turned another way
    assert found.angle in (0, angle)


@pytest.mark.parametrize(("name", "number"), DOCUMENTS_TEXT)
@pytest.mark.parametrize("angle", TURNS)
def test_a_real_text_page_turned_is_turned_back(name: str, number: int, angle: int) -> None:
    # Given a scanned brochure page, a page of a two-column paper or of a form, turned
    image = turned(document_page(name, number), angle)
    # When its orientation is detected
    found = detect_orientation(image)
    # Then the turn that undoes it is found
    assert found.angle == angle


@pytest.mark.parametrize(("name", "number", "angle"), DOCUMENTS_TURNED)
def test_a_scan_delivered_turned_is_turned_upright(name: str, number: int, angle: int) -> None:
    # Given a real scan whose page is turned in the file itself (ocrmypdf's cardinal.pdf, tesseract's phototest)
    image = document_page(name, number)
    # When its orientation is detected and the page turned by the answer
    found = detect_orientation(image)
    fixed = upright(image, found.angle)
    # Then the answer is the turn that makes it upright, and the turned page reads upright
    assert found.angle == angle
    assert detect_orientation(fixed).angle == 0


@pytest.mark.parametrize(("name", "number", "skew"), [("hasyv2-paper.pdf", 1, -4.0), ("form_dd0293.pdf", 2, 3.0)])
@pytest.mark.parametrize("angle", (0, *TURNS))
def test_a_skewed_page_is_levelled_before_its_lines_vote(name: str, number: int, skew: float, angle: int) -> None:
    # Given a real page fed a few degrees askew (too far for its lines to vote as they are), upright or turned
    image = document_page(name, number).rotate(skew, resample=Image.Resampling.BICUBIC, fillcolor="white")
    image = turned(image, angle) if angle else image
    # When its orientation is detected
    found = detect_orientation(image)
    # Then the quarter turn is found as on the straight page
    assert found.angle == angle


def test_a_blank_page_is_left_as_it_is_without_evidence() -> None:
    # Given blank pages: white, and a flat grey (a blank sheet scanned dark)
    pages = [Image.new("L", (1240, 1754), 255), Image.new("RGB", (1240, 1754), (200, 200, 200))]
    # When their orientation is detected
    found = [detect_orientation(image) for image in pages]
    # Then nothing is turned, and there was no evidence either way
    assert found == [Orientation(0, 0.0), Orientation(0, 0.0)]


@pytest.mark.parametrize("angle", (0, *TURNS))
def test_a_page_of_a_couple_of_words_is_never_turned_the_wrong_way(angle: int) -> None:
    # Given a page holding only the two words of a real heading ("Example document", cut from a corpus page)
    source = corpus_page("google-doc-document.pdf", 1)
    box = (0, 0, source.width, source.height // 8)
    heading = source.crop(box).convert("L").point(lambda level: 255 if level < 128 else 0).getbbox()
    assert heading is not None
    image = Image.new("RGB", source.size, "white")
    image.paste(source.crop(heading), heading[:2])
    image = turned(image, angle) if angle else image
    # When its orientation is detected
    found = detect_orientation(image)
    # Then it is left as it is or turned back, never turned another way
    assert found.angle in (0, angle)


@pytest.mark.parametrize("angle", TURNS)
def test_upright_undoes_a_known_turn_pixel_for_pixel(angle: int) -> None:
    # Given a real page turned anticlockwise by a known angle
    original = corpus_page("multicolumn.pdf", 1)
    image = turned(original, angle)
    # When upright turns it back by that angle
    restored = upright(image, angle)
    # Then every pixel is where it was
    assert (restored.mode, restored.size) == (original.mode, original.size)
    assert restored.tobytes() == original.tobytes()


def test_upright_by_zero_is_an_equal_copy_and_other_angles_are_refused() -> None:
    # Given a real page
    original = corpus_page("minimal-document.pdf", 1)
    # When it is turned by 0, and by an angle that is not a quarter turn
    copy = upright(original, 0)
    # Then the first is an equal but separate image, and the second is refused
    assert copy is not original
    assert copy.tobytes() == original.tobytes()
    with pytest.raises(ValueError, match="0, 90, 180 or 270"):
        upright(original, 45)


@pytest.mark.parametrize("mode", ["RGB", "L", "1", "RGBA", "P"])
def test_the_answer_does_not_depend_on_the_image_mode(mode: str) -> None:
    # Given a page of ocrmypdf's cardinal.pdf (a scan turned 90 degrees clockwise) in another image mode
    image = document_page("cardinal.pdf", 2).convert(mode)
    # When its orientation is detected
    found = detect_orientation(image)
    # Then the answer is the same as for the RGB render
    assert found.angle == 270


def test_a_large_render_is_reduced_and_detected_alike() -> None:
    # Given a corpus page rendered at 300 dpi (long edge about 3500 px) and turned by 180 degrees
    path = CORPUS / "pdflatex-4-pages.pdf"
    rendered = render_page(path, DocumentKind.PDF, 2, dpi=300, max_long_edge=4000, orient=False, image_format="png")
    with Image.open(io.BytesIO(rendered.data)) as image:
        large = turned(image.convert("L"), 180)
    # When its orientation is detected
    found = detect_orientation(large)
    # Then it is found as on the pipeline's 1568 px render
    assert max(large.size) > 3000
    assert found.angle == 180
