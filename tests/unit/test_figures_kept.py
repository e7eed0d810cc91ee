"""Figures found in a PDF page's render (its pictures), bounded in number and size, cropped to be kept."""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

import pypdfium2 as pdfium
from pagescribe.sources.documents import DocumentKind
from pagescribe.sources.pages import FIGURE_MAX_EDGE, MAX_FIGURES_PER_PAGE, crop_figures, render_page
from PIL import Image

from tests.support import CORPUS

DOCUMENTS = CORPUS.parent / "documents"


def _pictures(path: Path, sizes: Sequence[tuple[float, float, float, float]]) -> Path:
    """A one-page PDF (600 x 800 pt) drawing a black picture at each (x, y, width, height), in points."""
    pdf = pdfium.PdfDocument.new()
    page = pdf.new_page(600, 800)
    for x, y, width, height in sizes:
        picture = pdfium.PdfImage.new(pdf)
        picture.set_bitmap(pdfium.PdfBitmap.from_pil(Image.new("RGB", (8, 8), "black")))
        picture.set_matrix(pdfium.PdfMatrix().scale(width, height).translate(x, y))
        page.insert_obj(picture)
    page.gen_content()
    pdf.save(path)
    return path


def test_a_real_pages_picture_is_its_figure_and_a_scanned_page_has_none() -> None:
    # Given pdfTeX's sample page with one picture, and a page that is a scan
    [figure] = render_page(CORPUS / "pdflatex-image.pdf", DocumentKind.PDF, 1).figures
    assert render_page(DOCUMENTS / "congress.pdf", DocumentKind.PDF, 1).figures == ()
    # Then the picture's box is where it is drawn: 300 x 200 pt from (147.6, 229.3) from the top left
    rendered = render_page(CORPUS / "pdflatex-image.pdf", DocumentKind.PDF, 1)
    scale = 1 / (rendered.points_per_pixel or 1)
    assert figure == (round(147.638 * scale), round(229.314 * scale), round(447.638 * scale), round(429.314 * scale))


def test_five_hundred_tiny_drawings_are_no_figure_and_many_pictures_keep_only_the_largest(tmp_path: Path) -> None:
    # Given a page of 500 pictures of 4 pt, and one of 20 pictures of 100 x 60 pt and one larger
    tiny = [(10 + (n % 25) * 22, 10 + (n // 25) * 36, 4, 4) for n in range(500)]
    many = [(20 + (n % 4) * 140, 20 + (n // 4) * 130, 100, 60) for n in range(20)] + [(100, 700, 300, 90)]
    tiny_page = render_page(_pictures(tmp_path / "tiny.pdf", tiny), DocumentKind.PDF, 1)
    many_page = render_page(_pictures(tmp_path / "many.pdf", many), DocumentKind.PDF, 1)
    # Then the tiny ones are no figure, and of the many at most the bound are kept, the largest among them, top first
    assert tiny_page.figures == ()
    assert len(many_page.figures) == MAX_FIGURES_PER_PAGE
    widths = sorted(right - left for left, _, right, _ in many_page.figures)
    assert widths[-1] > 2 * widths[0]  # the larger one is kept
    assert [top for _, top, _, _ in many_page.figures] == sorted(top for _, top, _, _ in many_page.figures)


def test_a_figures_crop_is_a_png_no_larger_than_the_bound() -> None:
    # Given a page image and a box as wide as the whole of it
    buffer = io.BytesIO()
    Image.new("RGB", (3000, 1500), "white").save(buffer, format="JPEG")
    [crop] = crop_figures(buffer.getvalue(), [(0, 0, 3000, 1500)])
    # Then the crop is a PNG within FIGURE_MAX_EDGE on its long edge, its shape kept
    with Image.open(io.BytesIO(crop)) as image:
        assert image.format == "PNG" and image.size == (FIGURE_MAX_EDGE, FIGURE_MAX_EDGE // 2)
