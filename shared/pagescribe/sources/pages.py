"""One page of a source document rendered to an image, with what the renderer saw of it: how much is inked, whether
a blank PDF page draws something, how it was turned upright, and its pictures' boxes."""

from __future__ import annotations

import ctypes
import io
import math
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import pypdfium2 as pdfium
import pypdfium2.raw as pdfium_c
from PIL import Image, ImageOps

from pagescribe.sources.documents import (
    DEFAULT_MAX_IMAGE_PIXELS,
    DocumentKind,
    InvalidDocumentError,
    check_page_number,
    check_pixels,
    frame_count,
    open_image,
    open_pdf,
    pdf_scale,
)
from pagescribe.sources.textlayer import PrintSize, laid_out_text, page_print, visible_text

if TYPE_CHECKING:
    from pagescribe.grounding import PageText

_HIGH_BIT_GREY = frozenset({"I", "I;16", "I;16B", "I;16L", "I;16N"})


@dataclass(frozen=True)
class RenderedPage:
    """A page image and what the renderer saw of the page: how much of it is inked, whether a PDF page draws something
    that should show, its own text, and how it was turned to read upright."""

    data: bytes
    media_type: str
    width: int
    height: int
    ink: float = 0.0  # share of dark pixels (luminance below 128): the page has something on it
    marked: float = 0.0  # share of pixels that are not white (luminance below 245): zero for a blank render
    draws: bool = False  # PDF: it has visible text or painted paths (examined only when the render is blank)
    text_layer: str = ""  # PDF: the text on the visible page (its crop box), non-characters removed
    rotation: int = 0  # degrees the image was turned clockwise to read upright
    laid_out_text: str = ""  # PDF, when it draws but renders blank: its text layer in reading order, to stand in for it
    words: PageText | None = None  # PDF, when asked for and usable: its text layer's words placed on the image
    print_size: PrintSize | None = None  # PDF, when its text layer is usable: how large its print is on the image
    points_per_pixel: float | None = None  # PDF, not turned: the page's points per pixel of the image (for boxes)
    figures: tuple[tuple[int, int, int, int], ...] = ()  # PDF, not turned: its pictures' boxes (pixels), see below


@contextmanager
def _pdf_page_image(
    pdf: pdfium.PdfDocument, page_number: int, dpi: int, max_long_edge: int
) -> Iterator[tuple[pdfium.PdfPage, Image.Image]]:
    """The page, and its render in RGB (in grey, one byte a pixel, for a page drawn in grey alone: see
    :func:`_drawn_in_grey`) as an image sharing pdfium's bitmap: valid only inside the block, which saves copying the
    pixels out (a fresh 5 MB buffer per page costs about as much as the render itself)."""
    try:
        page = pdf[page_number - 1]
        scale = pdf_scale(page.get_size(), dpi, max_long_edge)
        if _drawn_in_grey(page):
            bitmap = page.render(scale=scale, force_bitmap_format=pdfium_c.FPDFBitmap_Gray)
        else:  # rev_byteorder: pdfium writes RGB rather than its native BGR, so Pillow takes the pixels as they are
            bitmap = page.render(scale=scale, rev_byteorder=True)
    except (pdfium.PdfiumError, ValueError) as exc:
        raise InvalidDocumentError(f"page {page_number} could not be rendered: {exc}") from exc
    try:
        view = bitmap.to_pil()
        yield page, view if view.mode in {"RGB", "L"} else view.convert("RGB")
    finally:
        bitmap.close()


_GREY_SPACES = frozenset({pdfium_c.FPDF_COLORSPACE_DEVICEGRAY, pdfium_c.FPDF_COLORSPACE_CALGRAY})


def _drawn_in_grey(page: pdfium.PdfPage) -> bool:
    """The page draws images in shades of grey and nothing else (no text, paths, annotations or colour): a scan in
    black and white or in grey. Its render in grey shows what the one in RGB does, with a third of the bytes to
    scale, blend, turn and encode (a bilevel letter-size scan: 8-19 ms of 82-103 less a page here); its image is
    a grey JPEG."""
    count = pdfium_c.FPDFPage_CountObjects(page.raw)
    if count == 0 or pdfium_c.FPDFPage_GetAnnotCount(page.raw):
        return False
    metadata = pdfium_c.FPDF_IMAGEOBJ_METADATA()
    for index in range(count):
        drawn = pdfium_c.FPDFPage_GetObject(page.raw, index)
        if pdfium_c.FPDFPageObj_GetType(drawn) != pdfium_c.FPDF_PAGEOBJ_IMAGE:
            return False
        if not pdfium_c.FPDFImageObj_GetImageMetadata(drawn, page.raw, metadata):
            return False
        if metadata.colorspace not in _GREY_SPACES:
            return False
    return True


def _flatten(image: Image.Image) -> Image.Image:
    """8-bit grey or RGB with any transparency composited on white.

    Resampling needs this first: Pillow resizes bilevel and palette images by nearest neighbour, dropping thin strokes.
    """
    if image.mode in _HIGH_BIT_GREY:  # scale 16 bits down to 8 rather than clip
        return image.convert("I").point(lambda value: value / 256, "L")
    if image.has_transparency_data:
        rgba = image.convert("RGBA")
        flat = Image.new("RGB", rgba.size, "white")
        flat.paste(rgba, mask=rgba.getchannel("A"))
        return flat
    if image.mode in {"L", "RGB"}:
        return image
    return image.convert("L" if image.mode == "1" else "RGB")


def _fit_image(source: Image.Image, max_long_edge: int) -> Image.Image:
    """The current frame, upright, as a new RGB image whose long edge is at most ``max_long_edge``."""
    ratio = max_long_edge / max(source.size)
    if ratio < 1:  # JPEG only (a no-op otherwise): decode at 1/2, 1/4 or 1/8 scale, no smaller than the target
        source.draft(None, (math.ceil(source.width * ratio), math.ceil(source.height * ratio)))
    ImageOps.exif_transpose(source, in_place=True)
    image = _flatten(source)
    image.thumbnail((max_long_edge, max_long_edge), Image.Resampling.LANCZOS, reducing_gap=3.0)
    return image.convert("RGB")


@dataclass(frozen=True)
class PageSeen:
    """What a page's render shows, besides its pixels (see :class:`RenderedPage`)."""

    ink: float
    marked: float
    rotation: int = 0
    draws: bool = False
    text_layer: str = ""
    laid_out_text: str = ""
    print_size: PrintSize | None = None
    points_per_pixel: float | None = None
    figures: tuple[tuple[int, int, int, int], ...] = ()


_INK_SAMPLE = 4  # ink is estimated from every 4th pixel of every 4th row; a page with none there is counted whole


def _shares(grey: Image.Image) -> tuple[float, float]:
    """The shares of dark (below 128) and of marked (below 245) pixels of a grey image."""
    histogram = grey.histogram()
    pixels = max(1, grey.width * grey.height)
    return sum(histogram[:128]) / pixels, sum(histogram[:245]) / pixels


def _look(image: Image.Image, *, orient: bool) -> tuple[Image.Image, PageSeen]:
    """The page upright (when ``orient`` and its text reads clearly turned) and how much of it is inked.

    The shares are estimated on a sample of the pixels (nearest neighbour: their values, not a blur of them), a
    sixteenth of the work; a page whose sample has no marked pixel at all is counted whole, so that a page with a
    single small mark is never taken for a blank render."""
    from pagescribe.orientation import detect_orientation, upright

    width, height = max(1, image.width // _INK_SAMPLE), max(1, image.height // _INK_SAMPLE)
    ink, marked = _shares(image.resize((width, height), Image.Resampling.NEAREST).convert("L"))
    grey = image.convert("L") if orient or marked == 0 else None
    if grey is not None and marked == 0:
        ink, marked = _shares(grey)
    seen = PageSeen(ink=ink, marked=marked)
    if orient and grey is not None and ink > 0:
        angle = detect_orientation(grey).angle
        if angle:
            return upright(image, angle), replace(seen, rotation=angle)
    return image, seen


def _encode(
    image: Image.Image, image_format: Literal["jpeg", "png"], jpeg_quality: int, seen: PageSeen
) -> RenderedPage:
    buffer = io.BytesIO()
    if image_format == "jpeg":
        image.save(buffer, format="JPEG", quality=jpeg_quality)
    else:
        image.save(buffer, format="PNG", compress_level=3)
    return RenderedPage(
        buffer.getvalue(),
        f"image/{image_format}",
        image.width,
        image.height,
        ink=seen.ink,
        marked=seen.marked,
        draws=seen.draws,
        text_layer=seen.text_layer,
        rotation=seen.rotation,
        laid_out_text=seen.laid_out_text,
        print_size=seen.print_size,
        points_per_pixel=seen.points_per_pixel,
        figures=seen.figures,
    )


_WHITE = (255, 255, 255)


def _painted(getter: Any, obj: Any) -> bool:
    """The fill or stroke colour ``getter`` reads from a page object is set, not white and not transparent."""
    r, g, b, a = (ctypes.c_uint(), ctypes.c_uint(), ctypes.c_uint(), ctypes.c_uint())
    if not getter(obj, r, g, b, a):
        return False
    return a.value > 0 and (r.value, g.value, b.value) != _WHITE


def _draws_visibly(page: pdfium.PdfPage) -> bool:
    """The page has a text object that is not invisible (render mode 3) or white, or a path that fills or strokes in
    a colour: a render of it should not be blank. Images do not count: a white scan renders blank too."""
    return any(_shows(obj) for obj in page.get_objects(max_depth=4))


def _shows(obj: pdfium.PdfObject) -> bool:
    """The page object is text or a path that should show in a render (see :func:`_draws_visibly`)."""
    if obj.type == pdfium_c.FPDF_PAGEOBJ_TEXT:
        return _text_shows(obj.raw)
    if obj.type == pdfium_c.FPDF_PAGEOBJ_PATH:
        return _path_shows(obj.raw)
    return False


def _text_shows(raw: Any) -> bool:
    """A text object that is not invisible (render mode 3) and is filled in a colour."""
    invisible = pdfium_c.FPDFTextObj_GetTextRenderMode(raw) == pdfium_c.FPDF_TEXTRENDERMODE_INVISIBLE
    return not invisible and _painted(pdfium_c.FPDFPageObj_GetFillColor, raw)


def _path_shows(raw: Any) -> bool:
    """A path that fills or strokes in a colour."""
    fill_mode, stroke = ctypes.c_int(), ctypes.c_int()
    if not pdfium_c.FPDFPath_GetDrawMode(raw, fill_mode, stroke):
        return False
    filled = bool(fill_mode.value) and _painted(pdfium_c.FPDFPageObj_GetFillColor, raw)
    return filled or (bool(stroke.value) and _painted(pdfium_c.FPDFPageObj_GetStrokeColor, raw))


def _usable(text: str) -> bool:
    from pagescribe.checks import usable_text_layer

    return usable_text_layer(text)


MAX_FIGURES_PER_PAGE = 8  # the largest pictures of a page kept as figures
FIGURE_MIN_SHARE = 0.01  # a picture covers at least this share of the page to be a figure (no icon, rule or dot)
FIGURE_MAX_SHARE = 0.9  # ... and at most this share (a page-sized picture is a scan of the page, not a figure in it)


def figure_regions(
    page: pdfium.PdfPage, points_per_pixel: float, size: tuple[int, int]
) -> tuple[tuple[int, int, int, int], ...]:
    """The boxes (pixels of the page image, top left origin) of the page's pictures that are figures: each image
    object's visible extent covering FIGURE_MIN_SHARE to FIGURE_MAX_SHARE of the page, the MAX_FIGURES_PER_PAGE
    largest, top to bottom. Drawings made of paths are not found (a chart drawn with lines stays the model's to
    describe)."""
    left, bottom, right, top = page.get_bbox()
    area = max((right - left) * (top - bottom), 1.0)
    found: list[tuple[float, tuple[int, int, int, int]]] = []
    for picture in page.get_objects(filter=[pdfium_c.FPDF_PAGEOBJ_IMAGE], max_depth=15):
        x0, y0, x1, y1 = picture.get_bounds()
        x0, y0, x1, y1 = max(x0, left), max(y0, bottom), min(x1, right), min(y1, top)
        share = (x1 - x0) * (y1 - y0) / area if x1 > x0 and y1 > y0 else 0.0
        if FIGURE_MIN_SHARE <= share <= FIGURE_MAX_SHARE:
            box = (
                max(0, round((x0 - left) / points_per_pixel)),
                max(0, round((top - y1) / points_per_pixel)),
                min(size[0], round((x1 - left) / points_per_pixel)),
                min(size[1], round((top - y0) / points_per_pixel)),
            )
            found.append((share, box))
    largest = [box for _, box in sorted(found, key=lambda item: -item[0])[:MAX_FIGURES_PER_PAGE]]
    return tuple(sorted(largest, key=lambda box: (box[1], box[0])))


FIGURE_MAX_EDGE = 1024  # a figure's crop is stored at most this many pixels on its long edge


def crop_figures(image: bytes, boxes: Iterable[tuple[int, int, int, int]]) -> list[bytes]:
    """Each box cut from the page image, at most FIGURE_MAX_EDGE pixels on its long edge, as PNG."""
    crops = []
    with Image.open(io.BytesIO(image)) as page:
        for box in boxes:
            crop = page.crop(box)
            crop.thumbnail((FIGURE_MAX_EDGE, FIGURE_MAX_EDGE))
            buffer = io.BytesIO()
            crop.convert("RGB").save(buffer, format="PNG", compress_level=3)
            crops.append(buffer.getvalue())
    return crops


def render_page(
    path: Path,
    kind: DocumentKind,
    page_number: int,
    *,
    dpi: int = 150,
    max_long_edge: int = 1568,
    image_format: Literal["jpeg", "png"] = "jpeg",
    jpeg_quality: int = 85,
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
    orient: bool = True,
    blank_below: float = 0.0,
) -> RenderedPage:
    """Render one page (1-based) at ``dpi``, never larger than ``max_long_edge`` pixels on its long edge, turned
    upright when ``orient``, the page is an image (a scan, or a PDF page without a usable text layer) and its text
    clearly reads turned.

    An image page is checked against ``max_image_pixels`` from its header again before it is decoded. A PDF page
    comes with its visible text layer, and where that is usable with the size of its print on the image (measured on
    the page and text pdfium has loaded for the render); when less than ``blank_below`` of its render is marked, with
    whether it draws something that should have shown.
    """
    if kind is DocumentKind.PDF:
        with open_pdf(path) as pdf:
            check_page_number(page_number, len(pdf))
            with _pdf_page_image(pdf, page_number, dpi, max_long_edge) as (page, rendered):
                textpage = page.get_textpage()
                text = visible_text(page, textpage)
                born_digital = _usable(text)
                # a born-digital page (a usable text layer) is laid out upright: only scans are looked at
                image, seen = _look(rendered, orient=orient and not born_digital)
                draws = seen.marked < blank_below and _draws_visibly(page)
                laid_out = laid_out_text(page) if draws else ""
                points = None if seen.rotation else 1 / pdf_scale(page.get_size(), dpi, max_long_edge)
                figures = figure_regions(page, points, image.size) if points else ()
                printed = page_print(page, dpi, max_long_edge, textpage) if born_digital else None
                seen = replace(
                    seen,
                    text_layer=text,
                    draws=draws,
                    laid_out_text=laid_out,
                    print_size=printed,
                    points_per_pixel=points,
                    figures=figures,
                )
                return _encode(image, image_format, jpeg_quality, seen)
    with open_image(path, kind) as source:
        frames = frame_count(source, max(page_number, 1))  # walked only as far as the page: None when past it
        check_page_number(page_number, page_number if frames is None else frames)
        source.seek(page_number - 1)
        check_pixels(source, max_image_pixels)
        image, seen = _look(_fit_image(source, max_long_edge), orient=orient)
    return _encode(image, image_format, jpeg_quality, seen)


@dataclass(frozen=True)
class Band:
    """A horizontal band of a page, full width: ``top`` to ``bottom`` as fractions of the page's height."""

    top: float
    bottom: float


def render_band(
    path: Path,
    kind: DocumentKind,
    page_number: int,
    band: Band,
    *,
    zoom: float,
    dpi: int = 150,
    max_long_edge: int = 1568,
    image_format: Literal["jpeg", "png"] = "jpeg",
    jpeg_quality: int = 85,
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
) -> RenderedPage:
    """A band of a page rendered ``zoom`` times as large as :func:`render_page` renders the whole page at ``dpi`` and
    ``max_long_edge``: a tile to read small print in. A PDF page is drawn again at the higher scale, so its text gains
    detail; an image is cut from its own pixels, at most at their native resolution (upscaling a scan adds no detail:
    a scan is read at its native resolution in tiles instead of downscaled whole). Never turned: only pages that read
    upright as they are are tiled."""
    if kind is DocumentKind.PDF:
        image = _pdf_band(path, page_number, band, pdf_zoom=zoom, dpi=dpi, max_long_edge=max_long_edge)
    else:
        with open_image(path, kind) as source:
            frames = frame_count(source, max(page_number, 1))
            check_page_number(page_number, page_number if frames is None else frames)
            source.seek(page_number - 1)
            check_pixels(source, max_image_pixels)
            image = _image_band(source, band, zoom * min(1.0, max_long_edge / max(source.size)))
    ink, marked = _shares(image.convert("L"))
    return _encode(image, image_format, jpeg_quality, PageSeen(ink=ink, marked=marked))


def _pdf_band(
    path: Path, page_number: int, band: Band, *, pdf_zoom: float, dpi: int, max_long_edge: int
) -> Image.Image:
    with open_pdf(path) as pdf:
        check_page_number(page_number, len(pdf))
        page = pdf[page_number - 1]
        width, height = page.get_size()
        scale = pdf_scale((width, height), dpi, max_long_edge) * pdf_zoom
        crop = (0.0, (1 - band.bottom) * height, 0.0, band.top * height)  # points cut off: left, bottom, right, top
        try:
            bitmap = page.render(scale=scale, crop=crop, rev_byteorder=True)
        except (pdfium.PdfiumError, ValueError) as exc:
            raise InvalidDocumentError(f"page {page_number} could not be rendered: {exc}") from exc
        try:
            image: Image.Image = bitmap.to_pil().convert("RGB")
            return image
        finally:
            bitmap.close()


def _image_band(source: Image.Image, band: Band, ratio: float) -> Image.Image:
    """The band cut from the image's own pixels (upright by its EXIF orientation), scaled by ``ratio`` but never
    beyond its native resolution."""
    ImageOps.exif_transpose(source, in_place=True)
    native = _flatten(source)
    crop = native.crop((0, math.floor(band.top * native.height), native.width, math.ceil(band.bottom * native.height)))
    if ratio < 1.0:  # never past its native resolution
        crop = crop.resize(
            (max(1, round(crop.width * ratio)), max(1, round(crop.height * ratio))), Image.Resampling.LANCZOS
        )
    return crop.convert("RGB")
