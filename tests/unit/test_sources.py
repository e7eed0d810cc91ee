"""Type detection, page counting, rendering and text layers, on the real corpus and on hostile inputs."""

from __future__ import annotations

import io
import re
import struct
import time
import warnings
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pypdfium2 as pdfium
import pytest
from pagescribe.sources.documents import (
    DocumentInfo,
    DocumentKind,
    InvalidDocumentError,
    detect_kind,
    inspect_document,
    pdf_scale,
)
from pagescribe.sources.pages import RenderedPage, render_page
from pagescribe.sources.textlayer import extract_text_layer, read_text_layer
from pagescribe_local.scoring import recall_precision
from PIL import Image, ImageChops, ImageDraw, ImageStat, TiffImagePlugin

from tests.support import CORPUS
from tests.support.pages import drawn_row_by_row

FOUR_PAGES = CORPUS / "pdflatex-4-pages.pdf"
DOCUMENTS = Path(__file__).resolve().parents[1] / "data" / "documents"
LIMITS = {"max_pages": 500, "max_image_pixels": 60_000_000}


def saved(path: Path, image: Image.Image, **options: Any) -> Path:
    image.save(path, **options)
    return path


def blank_pdf(path: Path, width_pt: float, height_pt: float, pages: int = 1) -> Path:
    pdf = pdfium.PdfDocument.new()
    try:
        for _ in range(pages):
            pdf.new_page(width_pt, height_pt)
        pdf.save(path)
    finally:
        pdf.close()
    return path


def png_declaring(path: Path, width: int, height: int) -> Path:
    """A 1 x 1 PNG whose header (CRC fixed up) declares ``width`` x ``height``: instant to make, and undecodable."""
    buffer = io.BytesIO()
    Image.new("L", (1, 1)).save(buffer, format="PNG")
    data = bytearray(buffer.getvalue())
    data[16:24] = struct.pack(">II", width, height)  # IHDR: signature (8), length (4), type (4), then the size
    data[29:33] = struct.pack(">I", zlib.crc32(data[12:29]))
    path.write_bytes(bytes(data))
    return path


def opened(page: RenderedPage) -> Image.Image:
    image = Image.open(io.BytesIO(page.data))
    assert image.size == (page.width, page.height)
    return image


# Detection


@pytest.mark.parametrize(
    ("head", "kind"),
    [
        (b"%PDF-1.7\n", DocumentKind.PDF),
        (b"\x00junk before the header %PDF-1.4\n", DocumentKind.PDF),
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", DocumentKind.PNG),
        (b"\xff\xd8\xff\xe0\x00\x10JFIF", DocumentKind.JPEG),
        (b"II*\x00\x08\x00\x00\x00", DocumentKind.TIFF),
        (b"MM\x00*\x00\x00\x00\x08", DocumentKind.TIFF),
        (b"RIFF\x10\x00\x00\x00WEBPVP8 ", DocumentKind.WEBP),
    ],
)
def test_the_type_comes_from_the_magic_bytes(head: bytes, kind: DocumentKind) -> None:
    assert detect_kind(head) is kind


@pytest.mark.parametrize(
    ("kind", "media_type"),
    [
        (DocumentKind.PDF, "application/pdf"),
        (DocumentKind.PNG, "image/png"),
        (DocumentKind.JPEG, "image/jpeg"),
        (DocumentKind.TIFF, "image/tiff"),
        (DocumentKind.WEBP, "image/webp"),
    ],
)
def test_each_kind_has_its_media_type(kind: DocumentKind, media_type: str) -> None:
    assert kind.media_type == media_type


def test_a_pdf_header_past_the_first_kilobyte_is_not_a_pdf() -> None:
    with pytest.raises(InvalidDocumentError, match="unsupported file type"):
        detect_kind(b" " * 1024 + b"%PDF-1.7")


def test_no_bytes_and_unknown_bytes_are_refused() -> None:
    with pytest.raises(InvalidDocumentError, match=r"^the file is empty \(0 bytes\)$"):
        detect_kind(b"")
    with pytest.raises(InvalidDocumentError) as raised:
        detect_kind(b"GIF89a\x01\x00\x01\x00")
    assert raised.value.reason == (
        "unsupported file type: the content is not PDF, PNG, JPEG, TIFF or WebP (starts with b'GIF89a\\x01\\x00')"
    )


def test_a_text_file_named_pdf_is_refused_by_its_content(tmp_path: Path) -> None:
    # Given a text file with a .pdf name
    path = tmp_path / "report.pdf"
    path.write_text("hello world, I am not a PDF")
    # Then the name does not matter: the content is refused, and the reason shows it
    with pytest.raises(InvalidDocumentError, match="unsupported file type") as raised:
        inspect_document(path, **LIMITS)
    assert "b'hello wo'" in raised.value.reason
    assert str(raised.value) == raised.value.reason


def test_an_empty_file_says_so(tmp_path: Path) -> None:
    path = tmp_path / "empty.pdf"
    path.write_bytes(b"")
    with pytest.raises(InvalidDocumentError, match="empty"):
        inspect_document(path, **LIMITS)


# Page counts and limits


@pytest.mark.parametrize(
    ("name", "kind", "pages"),
    [
        ("pdflatex-4-pages.pdf", DocumentKind.PDF, 4),
        ("pdflatex-outline.pdf", DocumentKind.PDF, 4),
        ("multicolumn.pdf", DocumentKind.PDF, 3),
        ("002-trivial-libre-office-writer.pdf", DocumentKind.PDF, 1),
        ("google-doc-document.pdf", DocumentKind.PDF, 1),
        ("grayscale-image.pdf", DocumentKind.PDF, 1),
        ("minimal-document.pdf", DocumentKind.PDF, 1),
        ("pdflatex-image.pdf", DocumentKind.PDF, 1),
        ("smile.png", DocumentKind.PNG, 1),
        ("smile.jpg", DocumentKind.JPEG, 1),
    ],
)
def test_pages_are_counted(name: str, kind: DocumentKind, pages: int) -> None:
    assert inspect_document(CORPUS / name, **LIMITS) == DocumentInfo(kind, pages)


def test_a_tiff_has_one_page_per_frame_as_pillow_counts_them(tmp_path: Path) -> None:
    # Given the corpus TIFF, which Pillow reads as a single frame
    with Image.open(CORPUS / "smile.tiff") as tiff:
        assert isinstance(tiff, TiffImagePlugin.TiffImageFile) and tiff.n_frames == 1
    assert inspect_document(CORPUS / "smile.tiff", **LIMITS) == DocumentInfo(DocumentKind.TIFF, 1)
    # And a three-frame scan whose frames are black, grey and white
    frames = [Image.new("L", (40, 60), shade) for shade in (0, 128, 255)]
    scan = saved(tmp_path / "scan.tif", frames[0], save_all=True, append_images=frames[1:])
    # Then each frame is a page, and rendering page 3 renders the third frame
    assert inspect_document(scan, **LIMITS) == DocumentInfo(DocumentKind.TIFF, 3)
    assert opened(render_page(scan, DocumentKind.TIFF, 3)).getpixel((5, 5)) == (255, 255, 255)
    assert opened(render_page(scan, DocumentKind.TIFF, 1)).getpixel((5, 5)) == (0, 0, 0)


def test_a_webp_is_one_page(tmp_path: Path) -> None:
    path = saved(tmp_path / "photo.webp", Image.new("RGB", (30, 20), "red"), lossless=True)
    assert inspect_document(path, **LIMITS) == DocumentInfo(DocumentKind.WEBP, 1)
    assert opened(render_page(path, DocumentKind.WEBP, 1, image_format="png")).getpixel((0, 0)) == (255, 0, 0)


def test_a_password_protected_pdf_says_so() -> None:
    with pytest.raises(InvalidDocumentError) as raised:
        inspect_document(CORPUS / "libreoffice-writer-password.pdf", **LIMITS)
    assert raised.value.reason == "the PDF is password-protected; upload it without a password"


def test_a_truncated_pdf_is_unreadable(tmp_path: Path) -> None:
    # Given the first half of a real PDF
    whole = FOUR_PAGES.read_bytes()
    path = tmp_path / "cut.pdf"
    path.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(InvalidDocumentError, match=r"^the PDF could not be read: "):
        inspect_document(path, **LIMITS)


def test_a_pdf_without_pages_says_so(tmp_path: Path) -> None:
    path = blank_pdf(tmp_path / "none.pdf", 612, 792, pages=0)
    with pytest.raises(InvalidDocumentError, match=r"^the PDF has no pages$"):
        inspect_document(path, **LIMITS)


def test_too_many_pages_names_the_count_and_the_limit(tmp_path: Path) -> None:
    with pytest.raises(InvalidDocumentError) as raised:
        inspect_document(FOUR_PAGES, max_pages=2, max_image_pixels=60_000_000)
    assert raised.value.reason == "the document has 4 pages; the limit is MAX_PAGES=2"
    frames = [Image.new("L", (8, 8))] * 3
    scan = saved(tmp_path / "scan.tif", frames[0], save_all=True, append_images=frames[1:])
    with pytest.raises(InvalidDocumentError, match="has more than 2 pages; the limit is MAX_PAGES=2"):
        inspect_document(scan, max_pages=2, max_image_pixels=60_000_000)


def test_a_huge_image_is_refused_from_its_header(tmp_path: Path) -> None:
    # Given a PNG whose header claims 20,000 x 20,000 pixels (decoding it would fail: it holds one pixel)
    path = png_declaring(tmp_path / "huge.png", 20_000, 20_000)
    started = time.monotonic()
    # Then inspecting and rendering both refuse it by its size, naming the limit, without decoding it
    expected = "the image is 20000 x 20000 pixels (400.0 megapixels); the limit is MAX_IMAGE_PIXELS=60000000"
    with pytest.raises(InvalidDocumentError) as inspected:
        inspect_document(path, **LIMITS)
    assert inspected.value.reason == expected
    with pytest.raises(InvalidDocumentError) as rendered:
        render_page(path, DocumentKind.PNG, 1, max_image_pixels=60_000_000)
    assert rendered.value.reason == expected
    assert time.monotonic() - started < 1


def test_any_tiff_frame_over_the_pixel_limit_is_refused(tmp_path: Path) -> None:
    small, large = Image.new("L", (10, 10)), Image.new("1", (2000, 1000))
    scan = saved(tmp_path / "scan.tif", small, save_all=True, append_images=[large])
    with pytest.raises(InvalidDocumentError, match=r"is 2000 x 1000 pixels \(2\.0 megapixels\)"):
        inspect_document(scan, max_pages=10, max_image_pixels=1_000_000)


def test_pillows_own_bomb_guard_neither_fires_nor_changes(tmp_path: Path) -> None:
    # Given a configured limit far above Pillow's process-wide guard (which errors beyond ~179 megapixels)
    path = png_declaring(tmp_path / "huge.png", 20_000, 20_000)
    guard = Image.MAX_IMAGE_PIXELS
    # When the 400-megapixel image is inspected with every warning an error
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        info = inspect_document(path, max_pages=1, max_image_pixels=1_000_000_000)
    # Then the configured limit alone decides, and Pillow's guard is as it was
    assert info == DocumentInfo(DocumentKind.PNG, 1)
    assert Image.MAX_IMAGE_PIXELS == guard is not None


def test_a_corrupt_image_is_unreadable(tmp_path: Path) -> None:
    path = tmp_path / "broken.png"
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 64)
    with pytest.raises(InvalidDocumentError, match=r"^the image could not be read: "):
        inspect_document(path, **LIMITS)


def test_an_image_whose_pixel_data_is_cut_short_fails_to_render(tmp_path: Path) -> None:
    # Given a PNG whose header is intact but whose pixel data stops halfway
    whole = io.BytesIO()
    Image.effect_noise((300, 300), 64).save(whole, format="PNG")
    path = tmp_path / "cut.png"
    path.write_bytes(whole.getvalue()[: len(whole.getvalue()) // 2])
    # Then the header passes inspection, but rendering says the image could not be read
    assert inspect_document(path, **LIMITS).page_count == 1
    with pytest.raises(InvalidDocumentError, match=r"^the image could not be read: "):
        render_page(path, DocumentKind.PNG, 1)


# Rendering


def test_a_pdf_page_renders_as_a_jpeg_within_the_long_edge() -> None:
    page = render_page(FOUR_PAGES, DocumentKind.PDF, 2, dpi=150, max_long_edge=1568)
    assert page.data.startswith(b"\xff\xd8\xff") and page.media_type == "image/jpeg"
    image = opened(page)
    assert image.format == "JPEG" and image.mode == "RGB"
    # A4 at 150 dpi is 1240 x 1754: the long edge is capped, the aspect ratio kept
    assert (image.width, image.height) == (1109, 1568)


@pytest.mark.parametrize(("name", "mode"), [("cardinal.pdf", "L"), ("congress.pdf", "RGB")])
def test_a_scan_drawn_in_grey_renders_in_grey_as_its_colour_render_shows_it(name: str, mode: str) -> None:
    # Given a real bilevel scan (JBIG2 images in DeviceGray) and a real colour one (a JPEG in RGB)
    path = DOCUMENTS / name
    # When its first page (upright) is rendered
    rendered = render_page(path, DocumentKind.PDF, 1, dpi=150, max_long_edge=1568)
    # Then the grey scan's image is grey (one byte a pixel), the colour one's stays in colour
    image = opened(rendered)
    assert image.format == "JPEG" and image.mode == mode
    # and either shows the luminance of pdfium's colour render of the page, within JPEG's error
    with pdfium.PdfDocument(path) as pdf:
        page = pdf[0]
        scale = pdf_scale(page.get_size(), 150, 1568)
        colour = page.render(scale=scale, rev_byteorder=True).to_pil().convert("L")
    assert colour.size == image.size and rendered.ink > 0.01
    assert ImageStat.Stat(ImageChops.difference(image.convert("L"), colour)).mean[0] < 3.0  # quality 85


def test_a_pdf_page_renders_at_the_requested_dpi() -> None:
    # Given an A4 page (595.3 x 841.9 pt) and no effective cap: 72 dpi is one pixel per point, rounded up
    page = render_page(FOUR_PAGES, DocumentKind.PDF, 2, dpi=72, max_long_edge=10_000)
    assert (page.width, page.height) == (596, 842)


def test_a_giant_pdf_page_still_renders_small_and_fast(tmp_path: Path) -> None:
    # Given a PDF whose page is 200 x 200 inches (40,000 x 40,000 pixels at 200 dpi)
    path = blank_pdf(tmp_path / "giant.pdf", 14_400, 14_400)
    started = time.monotonic()
    page = render_page(path, DocumentKind.PDF, 1, dpi=200, max_long_edge=1568)
    assert time.monotonic() - started < 5
    assert (page.width, page.height) == (1568, 1568)


def test_the_long_edge_cap_survives_floating_point_rounding(tmp_path: Path) -> None:
    # Given a page width w for which w * (1568 / w) comes out a hair above 1568, and pdfium rounds sizes up
    path = blank_pdf(tmp_path / "wide.pdf", 2070, 1000)
    page = render_page(path, DocumentKind.PDF, 1, max_long_edge=1568)
    assert page.width == 1568


def test_png_output_composites_transparency_on_white_and_downscales(tmp_path: Path) -> None:
    path = saved(tmp_path / "wide.png", Image.new("RGBA", (4000, 1000), (10, 20, 30, 0)))
    page = render_page(path, DocumentKind.PNG, 1, max_long_edge=1000, image_format="png")
    assert page.media_type == "image/png" and page.data.startswith(b"\x89PNG\r\n\x1a\n")
    image = opened(page)
    assert image.format == "PNG" and image.mode == "RGB" and image.size == (1000, 250)
    assert image.getpixel((0, 0)) == (255, 255, 255)


def test_a_large_jpeg_is_downscaled(tmp_path: Path) -> None:
    path = saved(tmp_path / "photo.jpg", Image.linear_gradient("L").resize((4000, 3000)).convert("CMYK"))
    image = opened(render_page(path, DocumentKind.JPEG, 1, max_long_edge=1000))
    assert image.size == (1000, 750) and image.mode == "RGB"


def test_thin_strokes_in_a_bilevel_scan_survive_downscaling(tmp_path: Path) -> None:
    # Given a bilevel scan of 1-pixel black lines every 4 pixels (nearest-neighbour downscaling by 4 misses them all)
    scan = Image.new("1", (400, 400), 1)
    draw = ImageDraw.Draw(scan)
    for x in range(0, 400, 4):
        draw.line([(x, 0), (x, 399)], fill=0)
    path = saved(tmp_path / "fax.tif", scan, compression="group4")
    # When it is rendered at a quarter of its size
    image = opened(render_page(path, DocumentKind.TIFF, 1, max_long_edge=100, image_format="png"))
    # Then the lines blend to grey rather than vanish to white
    assert image.size == (100, 100)
    assert 150 < ImageStat.Stat(image.convert("L")).mean[0] < 230


def test_sixteen_bit_grey_is_scaled_not_clipped(tmp_path: Path) -> None:
    path = saved(tmp_path / "deep.png", Image.new("I;16", (20, 20), 50_000))
    image = opened(render_page(path, DocumentKind.PNG, 1, image_format="png"))
    assert image.getpixel((0, 0)) == (195, 195, 195)  # 50000 / 256; clipping would give white


def test_an_exif_rotated_photo_renders_upright(tmp_path: Path) -> None:
    # Given a 60 x 20 JPEG whose EXIF orientation says "rotate 90 degrees clockwise to display"
    exif = Image.Exif()
    exif[0x0112] = 6
    path = saved(tmp_path / "phone.jpg", Image.new("RGB", (60, 20), "blue"), exif=exif.tobytes())
    assert opened(render_page(path, DocumentKind.JPEG, 1)).size == (20, 60)


@pytest.mark.parametrize(
    ("path", "kind", "page_number", "reason"),
    [
        (FOUR_PAGES, DocumentKind.PDF, 5, "page 5 does not exist; the document has 4 pages"),
        (FOUR_PAGES, DocumentKind.PDF, 0, "page 0 does not exist; the document has 4 pages"),
        (CORPUS / "smile.png", DocumentKind.PNG, 2, "page 2 does not exist; the document has 1 page"),
    ],
)
def test_a_page_out_of_range_is_refused(path: Path, kind: DocumentKind, page_number: int, reason: str) -> None:
    with pytest.raises(InvalidDocumentError) as raised:
        render_page(path, kind, page_number)
    assert raised.value.reason == reason


def test_an_image_is_rendered_only_as_the_kind_it_was_detected_as() -> None:
    with pytest.raises(InvalidDocumentError, match=r"^the image could not be read: "):
        render_page(CORPUS / "smile.png", DocumentKind.JPEG, 1)


def test_pages_render_the_same_from_many_threads_at_once() -> None:
    # Given every page of five PDFs, each rendered (small, to be quick) and its text read one at a time
    names = (
        "pdflatex-4-pages.pdf",
        "pdflatex-outline.pdf",
        "multicolumn.pdf",
        "pdflatex-image.pdf",
        "google-doc-document.pdf",
    )
    pages = [
        (CORPUS / name, number)
        for name in names
        for number in range(1, inspect_document(CORPUS / name, **LIMITS).page_count + 1)
    ]

    def page_and_text(page: tuple[Path, int]) -> tuple[bytes, str]:
        path, number = page
        return render_page(path, DocumentKind.PDF, number, max_long_edge=400).data, extract_text_layer(path, number)

    expected = {page: page_and_text(page) for page in pages}
    # When each is done thirty times over in sixteen threads at once (pdfium itself is not thread-safe)
    with ThreadPoolExecutor(max_workers=16) as pool:
        results = list(pool.map(page_and_text, pages * 30))
    # Then every page comes out exactly as it did alone
    assert results == [expected[page] for page in pages * 30]


# Text layer


def test_the_text_layer_of_a_born_digital_pdf() -> None:
    text = extract_text_layer(FOUR_PAGES, 1)
    assert text.startswith("Hello, here is some text without a meaning.")
    assert "\r" not in text and text == text.strip()


def test_an_image_only_pdf_has_no_text_layer() -> None:
    assert extract_text_layer(CORPUS / "grayscale-image.pdf", 1) == ""


def test_only_an_existing_pdf_page_has_a_text_layer() -> None:
    with pytest.raises(InvalidDocumentError, match=r"^only a PDF has a text layer$"):
        extract_text_layer(CORPUS / "smile.png", 1)
    with pytest.raises(InvalidDocumentError, match=r"^page 5 does not exist; the document has 4 pages$"):
        extract_text_layer(FOUR_PAGES, 5)
    with pytest.raises(InvalidDocumentError, match=r"^page 5 does not exist; the document has 4 pages$"):
        read_text_layer(FOUR_PAGES, 5)


def _flat(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize(
    ("path", "page", "in_order"),
    [
        pytest.param(
            CORPUS / "multicolumn.pdf",
            1,
            [
                "This is a sample document with two columns filled",  # the abstract, atop the left column
                "Vivamus viverra fermentum felis. Donec nonummy",  # the left column's last line
                "pellentesque ante. Phasellus adipiscing semper elit.",  # the right column's first
            ],
            id="multicolumn",
        ),
        pytest.param(
            DOCUMENTS / "hasyv2-paper.pdf",
            1,
            [
                "I. INTRODUCTION",  # the left column's sections
                "II. TERMINOLOGY",
                "represent the small Greek letter “phi”, but they exist in",  # its last line of running text
                "two different variants. Hence \\varphi and \\phi are",  # the right column's first, going on from it
                "III. HOW HASY WAS CREATED",
            ],
            id="hasyv2-paper",
        ),
    ],
)
def test_the_laid_out_text_layer_of_a_real_two_column_page_reads_the_left_column_before_the_right_one(
    path: Path, page: int, in_order: list[str]
) -> None:
    # Given a real two-column page
    # When its text layer is laid out
    text = _flat(read_text_layer(path, page).laid_out)
    # Then its sentences come in reading order: all of the left column, then the right one
    positions = [text.index(sentence) for sentence in in_order]
    assert positions == sorted(positions)


def test_a_page_whose_text_pdfium_reads_across_its_columns_is_laid_out_column_by_column(tmp_path: Path) -> None:
    # Given a real two-column page drawn row by row across its columns: it looks the same, but pdfium's own text
    # interleaves the columns' lines and joins hyphenated words across them
    source = CORPUS / "multicolumn.pdf"
    rows = drawn_row_by_row(source, 1, tmp_path / "rows.pdf")
    assert render_page(rows, DocumentKind.PDF, 1).data == render_page(source, DocumentKind.PDF, 1).data
    raw = _flat(extract_text_layer(rows, 1))
    assert "Abstract pellentesque ante. Phasellus" in raw and "Maecewith Lorem Ipsum text." in raw
    # When its text layer is laid out
    layer = read_text_layer(rows, 1)
    # Then it reads the left column, then the right one, as the page drawn column by column does
    assert layer.laid_out == read_text_layer(source, 1).laid_out
    text = _flat(layer.laid_out)
    assert text.index("with Lorem Ipsum text.") < text.index("Donec nonummy") < text.index("pellentesque ante.")
    assert "Maecenas lacinia" in text
    # And the text layer the checks compare answers with stays pdfium's own
    assert layer.text == extract_text_layer(rows, 1)


@pytest.mark.parametrize(
    ("path", "page", "word", "line"),
    [
        # every character is a text object of its own: pdfium's text rectangles hold one character each
        (CORPUS / "google-doc-document.pdf", 1, "Example", "Example document"),
        # a line drawn in pieces, one of which ends inside a word
        (DOCUMENTS / "hasyv2-paper.pdf", 1, "of handwritten", "This paper describes the HASY dataset of handwritten"),
    ],
    ids=["a-rectangle-a-character", "a-word-in-two-rectangles"],
)
def test_a_word_drawn_in_pieces_is_laid_out_whole(path: Path, page: int, word: str, line: str) -> None:
    # Given a real page on which pdfium's text rectangles split a word
    pdf = pdfium.PdfDocument(path)
    try:
        textpage = pdf[page - 1].get_textpage()
        pieces = [textpage.get_text_bounded(*textpage.get_rect(index)) for index in range(textpage.count_rects())]
    finally:
        pdf.close()
    assert not any(word in piece for piece in pieces)
    # When its text layer is laid out
    text = read_text_layer(path, page).laid_out
    # Then the word is whole, in its line
    assert line in text


_UNCOMMENTED = re.compile(r"<!--[^:>]*:|<!--|-->")  # an HTML comment's markers and label, not its text


def _text_pages() -> list[tuple[Path, int]]:
    """Every page of the real PDFs with a text layer, but the vertical Japanese one (its lines have no spaces)."""
    paths = sorted(DOCUMENTS.glob("*.pdf")) + sorted(CORPUS.glob("*.pdf"))
    pages = []
    for path in paths:
        if path.name in {"libreoffice-writer-password.pdf", "jo.pdf"}:
            continue
        pages += [(path, n) for n in range(1, inspect_document(path, **LIMITS).page_count + 1)]
    return pages


@pytest.mark.parametrize(("path", "page"), _text_pages(), ids=lambda value: getattr(value, "stem", str(value)))
def test_the_laid_out_text_layer_keeps_every_word_of_the_page(path: Path, page: int) -> None:
    # Given a real page
    layer = read_text_layer(path, page)
    # Then its laid-out text has the words of pdfium's own text, in whatever order, and nothing else; the few it
    # splits are those pdfium runs together (a footnote mark and its number, a link over two lines), and running
    # heads and page numbers count wherever the layout puts them (in an HTML comment too, without its label)
    recall, precision = recall_precision(layer.text, _UNCOMMENTED.sub(" ", layer.laid_out))
    assert recall >= 0.98 and precision >= 0.95
    assert bool(layer.laid_out) == bool(layer.text)


def test_a_page_that_renders_blank_comes_with_its_text_layer_laid_out() -> None:
    # Given a real page of vertical Japanese whose font is not embedded: it renders blank here, as in Lambda
    page = render_page(DOCUMENTS / "jo.pdf", DocumentKind.PDF, 1, blank_below=0.00001)
    assert page.draws
    # Then it comes with its text laid out, to stand in for it: every character, each vertical line whole
    assert "みんなのおのおののなかのすべてですから" in page.laid_out_text
    assert sorted("".join(page.laid_out_text.split())) == sorted("".join(page.text_layer.split()))
    # And a page that renders is not laid out
    assert render_page(FOUR_PAGES, DocumentKind.PDF, 1, blank_below=0.00001).laid_out_text == ""


def test_a_page_of_more_runs_of_text_than_the_layout_takes_keeps_pdfiums_order(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a layout limit below the runs of text of a real two-column page
    import pagescribe.sources.textlayer

    monkeypatch.setattr(pagescribe.sources.textlayer, "LAYOUT_MAX_BOXES", 10)
    # When its text layer is read
    layer = read_text_layer(CORPUS / "multicolumn.pdf", 1)
    # Then the text that stands in for the page is pdfium's own, not laid out (its time would grow past the render's)
    assert layer.laid_out == layer.text
