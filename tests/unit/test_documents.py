"""Type detection, page counting and rendering on the real corpus and on hostile inputs."""

from __future__ import annotations

import io
from pathlib import Path

import pypdfium2 as pdfium
import pytest
from pagescribe.documents import (
    DocumentKind,
    InvalidDocumentError,
    detect_kind,
    extract_text_layer,
    inspect_document,
    render_page,
)
from PIL import Image

CORPUS = Path(__file__).resolve().parents[2].parent / "shared" / "corpus"
LIMITS = {"max_pages": 500, "max_image_pixels": 60_000_000}


@pytest.mark.parametrize(
    ("head", "kind"),
    [
        (b"%PDF-1.7\n", DocumentKind.PDF),
        (b"\x00junk before the header %PDF-1.4\n", DocumentKind.PDF),
        (b"\x89PNG\r\n\x1a\n....", DocumentKind.PNG),
        (b"\xff\xd8\xff\xe0..JFIF", DocumentKind.JPEG),
        (b"II*\x00\x08\x00", DocumentKind.TIFF),
        (b"MM\x00*\x00\x08", DocumentKind.TIFF),
        (b"RIFF\x10\x00\x00\x00WEBPVP8 ", DocumentKind.WEBP),
    ],
)
def test_the_type_comes_from_the_bytes(head: bytes, kind: DocumentKind) -> None:
    assert detect_kind(head) is kind


def test_text_named_pdf_is_refused_by_its_content(tmp_path: Path) -> None:
    path = tmp_path / "report.pdf"
    path.write_text("hello world, I am not a PDF")
    with pytest.raises(InvalidDocumentError, match="unsupported file type") as raised:
        inspect_document(path, **LIMITS)
    assert "hello wo" in raised.value.reason


@pytest.mark.parametrize(
    ("name", "kind", "pages"),
    [
        ("pdflatex-4-pages.pdf", DocumentKind.PDF, 4),
        ("multicolumn.pdf", DocumentKind.PDF, 3),
        ("minimal-document.pdf", DocumentKind.PDF, 1),
        ("smile.png", DocumentKind.PNG, 1),
        ("smile.jpg", DocumentKind.JPEG, 1),
        ("smile.tiff", DocumentKind.TIFF, 1),
    ],
)
def test_pages_are_counted(name: str, kind: DocumentKind, pages: int) -> None:
    info = inspect_document(CORPUS / name, **LIMITS)
    assert (info.kind, info.page_count) == (kind, pages)


def test_a_multi_frame_tiff_has_one_page_per_frame(tmp_path: Path) -> None:
    path = tmp_path / "scan.tif"
    frames = [Image.new("L", (40, 60), shade) for shade in (0, 128, 255)]
    frames[0].save(path, save_all=True, append_images=frames[1:])
    assert inspect_document(path, **LIMITS).page_count == 3
    third = render_page(path, DocumentKind.TIFF, 3)
    assert Image.open(io.BytesIO(third.data)).getpixel((5, 5)) == (255, 255, 255)


def test_a_password_protected_pdf_says_so() -> None:
    with pytest.raises(InvalidDocumentError, match="password"):
        inspect_document(CORPUS / "libreoffice-writer-password.pdf", **LIMITS)


def test_an_empty_file_says_so(tmp_path: Path) -> None:
    path = tmp_path / "empty.pdf"
    path.write_bytes(b"")
    with pytest.raises(InvalidDocumentError, match="empty"):
        inspect_document(path, **LIMITS)


def test_a_truncated_pdf_is_unreadable(tmp_path: Path) -> None:
    whole = (CORPUS / "pdflatex-4-pages.pdf").read_bytes()
    path = tmp_path / "cut.pdf"
    path.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(InvalidDocumentError, match="could not be read"):
        inspect_document(path, **LIMITS)


def test_too_many_pages_names_the_count_and_the_limit() -> None:
    with pytest.raises(InvalidDocumentError) as raised:
        inspect_document(CORPUS / "pdflatex-4-pages.pdf", max_pages=2, max_image_pixels=60_000_000)
    assert "4 pages" in raised.value.reason and "MAX_PAGES=2" in raised.value.reason


def test_a_huge_image_is_refused_from_its_header(tmp_path: Path) -> None:
    # Given a 20,000 x 20,000 bilevel PNG (small on disk, 400 megapixels decoded)
    path = tmp_path / "huge.png"
    Image.new("1", (20_000, 20_000), 1).save(path)
    # Then it is refused without being decoded, naming its size and the limit
    with pytest.raises(InvalidDocumentError) as raised:
        inspect_document(path, **LIMITS)
    assert "20000 x 20000" in raised.value.reason and "MAX_IMAGE_PIXELS=60000000" in raised.value.reason


def test_a_pdf_page_renders_within_the_long_edge() -> None:
    page = render_page(CORPUS / "pdflatex-4-pages.pdf", DocumentKind.PDF, 2, dpi=150, max_long_edge=1568)
    assert page.data.startswith(b"\xff\xd8\xff") and page.media_type == "image/jpeg"
    image = Image.open(io.BytesIO(page.data))
    assert max(image.size) <= 1568 and image.size == (page.width, page.height)


def test_a_giant_pdf_page_still_renders_small(tmp_path: Path) -> None:
    # Given a PDF whose page is 200 x 200 inches
    pdf = pdfium.PdfDocument.new()
    pdf.new_page(14_400, 14_400)
    path = tmp_path / "giant.pdf"
    pdf.save(path)
    pdf.close()
    page = render_page(path, DocumentKind.PDF, 1, dpi=300, max_long_edge=1568)
    assert (page.width, page.height) == (1568, 1568)


def test_png_output_and_image_downscaling(tmp_path: Path) -> None:
    path = tmp_path / "wide.png"
    Image.new("RGBA", (4000, 1000), (10, 20, 30, 0)).save(path)
    page = render_page(path, DocumentKind.PNG, 1, max_long_edge=1000, image_format="png")
    image = Image.open(io.BytesIO(page.data))
    assert image.format == "PNG" and image.size == (1000, 250) and image.mode == "RGB"
    assert image.getpixel((0, 0)) == (255, 255, 255)  # transparency composited on white


def test_a_page_out_of_range_is_refused() -> None:
    with pytest.raises(InvalidDocumentError, match="page 5 does not exist"):
        render_page(CORPUS / "pdflatex-4-pages.pdf", DocumentKind.PDF, 5)


def test_the_text_layer_of_a_born_digital_pdf() -> None:
    assert len(extract_text_layer(CORPUS / "pdflatex-4-pages.pdf", 1)) > 50
    with pytest.raises(InvalidDocumentError, match="only a PDF"):
        extract_text_layer(CORPUS / "smile.png", 1)
