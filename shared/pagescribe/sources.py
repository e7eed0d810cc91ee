"""Source files (what was uploaded) on local disk: detect the type from the bytes, count pages, render one page to
an image, read its text layer (as text, and as words placed on the rendered image, for grounding).

The functions run this code in render worker processes (``rendering.py``), one page at a time each; it is also called
in-process (tests, ``pagescribe transcribe --estimate``), possibly from several threads, and pdfium is not thread-safe,
so every pypdfium2 call holds one lock.
"""

from __future__ import annotations

import ctypes
import io
import math
import os
import re
import struct
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import pypdfium2 as pdfium
import pypdfium2.raw as pdfium_c
from PIL import Image, ImageOps, TiffImagePlugin

if TYPE_CHECKING:
    from pagescribe.grounding import PageText
    from pagescribe.layout.boxes import TextBox

# pagescribe.checks, pagescribe.grounding, pagescribe.layout and pagescribe.orientation are imported where a page is
# rendered or its text read: the upload function only inspects documents, and keeps them (and their compiled patterns)
# out of its cold start.

_PDFIUM_LOCK = threading.Lock()
_PILLOW_GUARD_LOCK = threading.Lock()
_SNIFF_BYTES = 1024
_PDF_LOAD_ERRORS = {
    pdfium_c.FPDF_ERR_FILE: "the file could not be opened",
    pdfium_c.FPDF_ERR_FORMAT: "it is damaged, truncated or not a PDF",
    pdfium_c.FPDF_ERR_SECURITY: "it is encrypted with an unsupported security handler",
}
_HIGH_BIT_GREY = frozenset({"I", "I;16", "I;16B", "I;16L", "I;16N"})
DEFAULT_MAX_IMAGE_PIXELS = 60_000_000
# A TIFF's frames are counted at most this far, even when a page selection lets the document run past MAX_PAGES:
# walking them costs more than linear time (2,000 took 0.13 s, 10,000 took 1.4 s, 100,000 took 51 s).
MAX_TIFF_FRAMES = 2_000
# What Pillow raises for a malformed file: Image.open turns the last four into UnidentifiedImageError (an OSError),
# but seeking to a TIFF frame or decoding pixels lets them through.
_MALFORMED_IMAGE = (OSError, ValueError, EOFError, SyntaxError, IndexError, TypeError, struct.error)
RUN_GAP = 0.5  # text drawn by two text objects on one line is one box when at most this many line heights apart
LAYOUT_MAX_BOXES = 5_000  # a page with more runs of text than this keeps pdfium's order (see _laid_out_text)
_HYPHENATION_MARKS = frozenset("\ufffe\x02")  # pdfium's mark for a hyphen that breaks a word at a line's end
_HYPHENATION_BREAK = re.compile("[\ufffe\x02]\\s*")  # ... and the line break after it, in laid-out text
_CJK_CHARACTER = re.compile("[\u2e80-\u2fdf\u3040-\u312f\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]")
_T = TypeVar("_T")


class DocumentKind(StrEnum):
    PDF = "pdf"
    PNG = "png"
    JPEG = "jpeg"
    TIFF = "tiff"
    WEBP = "webp"

    @property
    def media_type(self) -> str:
        return "application/pdf" if self is DocumentKind.PDF else f"image/{self.value}"


class InvalidDocumentError(ValueError):
    """The input can never be transcribed (retrying will not help); ``reason`` says why, for the user."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class DocumentInfo:
    kind: DocumentKind
    page_count: int


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
    points_per_pixel: float | None = None  # PDF, not turned: the page's points per pixel of the image (for boxes)
    figures: tuple[tuple[int, int, int, int], ...] = ()  # PDF, not turned: its pictures' boxes (pixels), see below


@dataclass(frozen=True)
class TextLayer:
    """A PDF page's visible text: as pdfium reads it (the evidence the checks compare answers with), and laid out in
    reading order like the offline engine's boxes (what stands in for the page as its transcript)."""

    text: str
    laid_out: str


def detect_kind(head: bytes) -> DocumentKind:
    """The document type, from its first bytes only (never the file name)."""
    if not head:
        raise InvalidDocumentError("the file is empty (0 bytes)")
    if b"%PDF-" in head[:_SNIFF_BYTES]:  # the PDF specification tolerates junk before the header
        return DocumentKind.PDF
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return DocumentKind.PNG
    if head.startswith(b"\xff\xd8\xff"):
        return DocumentKind.JPEG
    if head.startswith((b"II*\x00", b"MM\x00*")):
        return DocumentKind.TIFF
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return DocumentKind.WEBP
    raise InvalidDocumentError(
        f"unsupported file type: the content is not PDF, PNG, JPEG, TIFF or WebP (starts with {head[:8]!r})"
    )


def _read_head(path: Path) -> bytes:
    with path.open("rb") as handle:
        return handle.read(_SNIFF_BYTES)


def _pages(count: int) -> str:
    return f"{count} page" if count == 1 else f"{count} pages"


def _check_page_number(page_number: int, pages: int) -> None:
    if not 1 <= page_number <= pages:
        raise InvalidDocumentError(f"page {page_number} does not exist; the document has {_pages(pages)}")


def _check_page_count(pages: int, max_pages: int) -> None:
    if pages > max_pages:
        raise InvalidDocumentError(f"the document has {_pages(pages)}; the limit is MAX_PAGES={max_pages}")


@contextmanager
def _open_pdf(path: Path) -> Iterator[pdfium.PdfDocument]:
    """Open a PDF and hold the pdfium lock until it is closed; load failures become user-facing reasons.

    Loaded through pdfium directly: pypdfium2's PdfDocument(path) refuses a document with no pages without closing it,
    under whatever stale error code an earlier failed load left behind. Closing the document also closes the pages and
    text pages loaded from it (pypdfium2 tracks them as its kids).
    """
    with _PDFIUM_LOCK:
        raw = pdfium_c.FPDF_LoadDocument(os.fsencode(path) + b"\0", None)
        if not raw:
            error = pdfium_c.FPDF_GetLastError()
            if error == pdfium_c.FPDF_ERR_PASSWORD:
                raise InvalidDocumentError("the PDF is password-protected; upload it without a password")
            raise InvalidDocumentError(
                f"the PDF could not be read: {_PDF_LOAD_ERRORS.get(error, f'pdfium error {error}')}"
            )
        pdf = pdfium.PdfDocument(raw)
        try:
            yield pdf
        finally:
            pdf.close()


@contextmanager
def _open_image(path: Path, kind: DocumentKind) -> Iterator[Image.Image]:
    """Open an image of ``kind`` lazily (header only); Pillow failures in the block become user-facing reasons.

    Callers check every frame against the configured MAX_IMAGE_PIXELS before decoding it, with a reason naming the
    setting. Pillow's own process-wide bomb guard would fire first with a warning or an error naming neither, at open,
    at decode or at a TIFF frame, so it is off for this block only; the lock stops threads restoring each other's value.
    """
    with _PILLOW_GUARD_LOCK:
        guard = Image.MAX_IMAGE_PIXELS
        Image.MAX_IMAGE_PIXELS = None
        try:
            with Image.open(path, formats=[kind.name]) as image:  # the kind names are Pillow's format names
                yield image
        except InvalidDocumentError:
            raise
        except _MALFORMED_IMAGE as exc:
            raise InvalidDocumentError(f"the image could not be read: {exc}") from exc
        finally:
            Image.MAX_IMAGE_PIXELS = guard


def _frame_count(image: Image.Image, limit: int) -> int | None:
    """Pages in an image file: a TIFF's frames, None when it has more than ``limit``; any other image is one page
    (animation frames are not pages). The frames are walked one by one and no further than the limit: a TIFF says
    nowhere how many it has, and walking them costs more than linear time (Pillow's ``n_frames`` took 51 s over
    100,000 frames of 100 bytes each)."""
    if not isinstance(image, TiffImagePlugin.TiffImageFile):
        return 1
    frames = 0
    try:
        while frames <= limit:
            image.seek(frames)
            frames += 1
    except EOFError:
        return frames
    return None


def _loadable_pages(pdf: pdfium.PdfDocument, count: int) -> int:
    """How many of the ``count`` pages the page tree claims really load (pdfium takes /Count at its word: a one-page
    file can say 400, and each claimed page would be a job): the last page that loads, found by bisection."""

    def loads(index: int) -> bool:
        try:
            pdf.get_page_size(index)  # the page's dictionary only: its content is not parsed
        except pdfium.PdfiumError:
            return False
        return True

    if loads(count - 1):
        return count
    if not loads(0):
        return 0
    low, high = 0, count - 1  # page ``low`` loads, page ``high`` does not
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if loads(middle) else (low, middle)
    return high


def _check_pixels(image: Image.Image, max_pixels: int) -> None:
    """Refuse the current frame from its header if it is over ``max_pixels``."""
    width, height = image.size
    if width * height > max_pixels:
        raise InvalidDocumentError(
            f"the image is {width} x {height} pixels ({width * height / 1e6:.1f} megapixels); "
            f"the limit is MAX_IMAGE_PIXELS={max_pixels}"
        )


def inspect_document(path: Path, *, max_pages: int, max_image_pixels: int) -> DocumentInfo:
    """Type and page count, from the headers; InvalidDocumentError says what is wrong and any limit it breaks."""
    kind = detect_kind(_read_head(path))
    if kind is DocumentKind.PDF:
        with _open_pdf(path) as pdf:
            claimed = len(pdf)
            pages = _loadable_pages(pdf, claimed) if claimed else 0
        if pages == 0:
            claims = f" that load (it claims {claimed})" if claimed else ""
            raise InvalidDocumentError(f"the PDF has no pages{claims}")
        if pages < claimed:
            raise InvalidDocumentError(
                f"the PDF's page tree claims {_pages(claimed)} but only {pages} {'loads' if pages == 1 else 'load'}: "
                "it is damaged or crafted "
                "(repair it, e.g. with qpdf, and upload it again)"
            )
        _check_page_count(pages, max_pages)
    else:
        with _open_image(path, kind) as image:
            limit = min(max_pages, MAX_TIFF_FRAMES)
            frames = _frame_count(image, limit)
            if frames is None:
                raise InvalidDocumentError(
                    f"the document has more than {_pages(limit)}; the limit is "
                    + (f"MAX_PAGES={max_pages}" if limit == max_pages else f"{MAX_TIFF_FRAMES} frames in a TIFF")
                )
            pages = frames
            _check_page_count(pages, max_pages)
            for frame in range(pages):
                image.seek(frame)
                _check_pixels(image, max_image_pixels)
    return DocumentInfo(kind, pages)


def _pdf_scale(size_pt: tuple[float, float], dpi: int, max_long_edge: int) -> float:
    """Pixels per point: ``dpi``, unless the long edge would pass ``max_long_edge`` pixels (pdfium rounds up)."""
    longest = max(*size_pt, 1.0)
    scale = min(dpi / 72, max_long_edge / longest)
    while math.ceil(longest * scale) > max_long_edge:  # the division can land one ulp high
        scale = math.nextafter(scale, 0)
    return scale


@contextmanager
def _pdf_page_image(
    pdf: pdfium.PdfDocument, page_number: int, dpi: int, max_long_edge: int
) -> Iterator[tuple[pdfium.PdfPage, Image.Image]]:
    """The page, and its render in RGB as an image sharing pdfium's bitmap: valid only inside the block, which saves
    copying the pixels out (a fresh 5 MB buffer per page costs about as much as the render itself)."""
    try:
        page = pdf[page_number - 1]
        # rev_byteorder: pdfium writes RGB rather than its native BGR, so Pillow takes the pixels as they are
        bitmap = page.render(scale=_pdf_scale(page.get_size(), dpi, max_long_edge), rev_byteorder=True)
    except (pdfium.PdfiumError, ValueError) as exc:
        raise InvalidDocumentError(f"page {page_number} could not be rendered: {exc}") from exc
    try:
        view = bitmap.to_pil()
        yield page, view if view.mode == "RGB" else view.convert("RGB")
    finally:
        bitmap.close()


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
    for obj in page.get_objects(max_depth=4):
        raw = obj.raw
        if obj.type == pdfium_c.FPDF_PAGEOBJ_TEXT:
            if pdfium_c.FPDFTextObj_GetTextRenderMode(raw) != pdfium_c.FPDF_TEXTRENDERMODE_INVISIBLE and _painted(
                pdfium_c.FPDFPageObj_GetFillColor, raw
            ):
                return True
        elif obj.type == pdfium_c.FPDF_PAGEOBJ_PATH:
            fill_mode, stroke = ctypes.c_int(), ctypes.c_int()
            if not pdfium_c.FPDFPath_GetDrawMode(raw, fill_mode, stroke):
                continue
            if (fill_mode.value and _painted(pdfium_c.FPDFPageObj_GetFillColor, raw)) or (
                stroke.value and _painted(pdfium_c.FPDFPageObj_GetStrokeColor, raw)
            ):
                return True
    return False


def _usable(text: str) -> bool:
    from pagescribe.checks import usable_text_layer

    return usable_text_layer(text)


def _visible_text(page: pdfium.PdfPage) -> str:
    """The text on the visible part of the page (not outside its crop box: printers' marks, proofing notes), with
    pdfium's hyphenation marks and other non-characters removed."""
    from pagescribe.checks import remove_non_characters

    text = page.get_textpage().get_text_bounded()
    return remove_non_characters(str(text).replace("\r\n", "\n")).strip()


_Rect = tuple[float, float, float, float]  # left, bottom, right, top: PDF points, y upwards


@dataclass
class _Run:
    """Characters that read as one piece of a line, in pdfium's order, and where they are on the page."""

    text: str
    rect: _Rect
    last: _Rect  # the last character's box
    source: int | None  # the text object that draws the last character

    def goes_on(self, rect: _Rect, source: int | None) -> bool:
        """A character goes on the run when the same text object draws it (as pdfium's text rectangles run), or
        another one on the same line, at most RUN_GAP line heights from the run's end: a word drawn in pieces."""
        if source is not None and source == self.source:
            return True
        _, bottom, right, top = self.last
        height = max(top - bottom, rect[3] - rect[1])
        return rect[1] < top and bottom < rect[3] and abs(rect[0] - right) <= RUN_GAP * height

    def add(self, char: str, rect: _Rect, source: int | None, space: bool) -> None:
        self.text += f" {char}" if space else char
        left, bottom, right, top = self.rect
        self.rect = (min(left, rect[0]), min(bottom, rect[1]), max(right, rect[2]), max(top, rect[3]))
        self.last, self.source = rect, source


def _characters(textpage: pdfium.PdfTextPage, bbox: _Rect) -> Iterator[tuple[str, _Rect, int | None, bool] | None]:
    """pdfium's characters on the visible part of the page (``bbox``), in its order: each with its box, the text object
    that draws it, and whether a space comes before it, as in pdfium's own text (a space, or a line break where the
    baseline moves: pdfium breaks lines within a word too, as before a link's ".org"); None for one off the page.

    Non-characters and lone surrogates (of a broken ToUnicode map) are left out, as pdfium's own text leaves them;
    pdfium's hyphenation marks are kept.
    """
    from pagescribe.checks import remove_non_characters

    left, bottom, right, top = bbox
    space = broken = False
    previous = -1  # the index of the last character yielded
    for index in range(textpage.count_chars()):
        char = chr(pdfium_c.FPDFText_GetUnicode(textpage, index))
        if char.isspace():
            broken, space = broken or char in "\r\n", space or char not in "\r\n"
            continue
        if char not in _HYPHENATION_MARKS and (not remove_non_characters(char) or "\ud800" <= char <= "\udfff"):
            continue
        rect = textpage.get_charbox(index, loose=True)  # the font's full height: a line's boxes line up
        if not (rect[0] <= right and rect[2] >= left and rect[1] <= top and rect[3] >= bottom):
            yield None
        else:
            if broken and previous >= 0 and _baseline(textpage, index) != _baseline(textpage, previous):
                space = True
            source = ctypes.cast(pdfium_c.FPDFText_GetTextObject(textpage, index), ctypes.c_void_p).value
            yield char, rect, source, space
            previous = index
        space = broken = False


def _baseline(textpage: pdfium.PdfTextPage, index: int) -> float:
    x, y = ctypes.c_double(), ctypes.c_double()
    pdfium_c.FPDFText_GetCharOrigin(textpage, index, x, y)
    return y.value


def _text_boxes(page: pdfium.PdfPage) -> list[TextBox]:
    """The text on the visible page as boxes for the layout, in points from the crop box's top left (y downwards).

    A box is a run of characters in pdfium's order drawn by one text object, as pdfium's text rectangles are, with
    the runs of objects that follow on from each other on a line joined (a word or a line drawn in pieces). Its text
    is the characters themselves (:func:`_characters`): text read by rectangle would take in every character that
    touches the rectangle, its neighbours' too.
    """
    from pagescribe.layout.boxes import TextBox

    bbox = page.get_bbox()
    left, top = bbox[0], bbox[3]
    runs: list[_Run] = []
    run: _Run | None = None  # the run the next character may go on
    for character in _characters(page.get_textpage(), bbox):
        if character is None:
            run = None  # nothing runs on over text off the visible page
            continue
        char, rect, source, space = character
        if run is not None and run.goes_on(rect, source):
            run.add(char, rect, source, space)
        else:
            run = _Run(char, rect, rect, source)
            runs.append(run)
    return [TextBox(r.text, r.rect[0] - left, top - r.rect[3], top - r.rect[1], right=r.rect[2] - left) for r in runs]


def _laid_out_text(page: pdfium.PdfPage) -> str:
    """The text on the visible page laid out in reading order as the offline engine's boxes are (columns one after
    the other), hyphenated words joined; empty where there is none. A page of more than LAYOUT_MAX_BOXES runs of
    text keeps pdfium's order: the layout's time grows with the square of the runs (8,800 took 2.8 s), and a page
    must never run out of its render time for it."""
    from pagescribe.layout import boxes_to_text

    boxes = _text_boxes(page)
    if len(boxes) > LAYOUT_MAX_BOXES:
        return _visible_text(page)
    return _HYPHENATION_BREAK.sub("", boxes_to_text(boxes)).strip() if boxes else ""


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
    comes with its visible text layer; when less than ``blank_below`` of its render is marked, with whether it draws
    something that should have shown.
    """
    if kind is DocumentKind.PDF:
        with _open_pdf(path) as pdf:
            _check_page_number(page_number, len(pdf))
            with _pdf_page_image(pdf, page_number, dpi, max_long_edge) as (page, rendered):
                text = _visible_text(page)
                # a born-digital page (a usable text layer) is laid out upright: only scans are looked at
                image, seen = _look(rendered, orient=orient and not _usable(text))
                draws = seen.marked < blank_below and _draws_visibly(page)
                laid_out = _laid_out_text(page) if draws else ""
                points = None if seen.rotation else 1 / _pdf_scale(page.get_size(), dpi, max_long_edge)
                figures = figure_regions(page, points, image.size) if points else ()
                seen = replace(
                    seen, text_layer=text, draws=draws, laid_out_text=laid_out, points_per_pixel=points, figures=figures
                )
                return _encode(image, image_format, jpeg_quality, seen)
    with _open_image(path, kind) as source:
        frames = _frame_count(source, max(page_number, 1))  # walked only as far as the page: None when past it
        _check_page_number(page_number, page_number if frames is None else frames)
        source.seek(page_number - 1)
        _check_pixels(source, max_image_pixels)
        image, seen = _look(_fit_image(source, max_long_edge), orient=orient)
    return _encode(image, image_format, jpeg_quality, seen)


def extract_text_layer(path: Path, page_number: int) -> str:
    """The embedded text of a PDF page (born-digital documents) that lies on the visible page, in pdfium's order,
    non-characters removed, stripped; empty where there is none."""
    return _read_text(path, page_number, _visible_text)


def read_text_layer(path: Path, page_number: int) -> TextLayer:
    """The embedded text of a PDF page that lies on the visible page, as pdfium reads it and laid out."""
    return _read_text(path, page_number, lambda page: TextLayer(_visible_text(page), _laid_out_text(page)))


def _read_text(path: Path, page_number: int, read: Callable[[pdfium.PdfPage], _T]) -> _T:
    """What ``read`` makes of a PDF page; InvalidDocumentError for anything but an existing PDF page."""
    if detect_kind(_read_head(path)) is not DocumentKind.PDF:
        raise InvalidDocumentError("only a PDF has a text layer")
    with _open_pdf(path) as pdf:
        _check_page_number(page_number, len(pdf))
        try:
            return read(pdf[page_number - 1])
        except pdfium.PdfiumError as exc:
            raise InvalidDocumentError(f"the text of page {page_number} could not be read: {exc}") from exc


def text_layer_words(path: Path, page_number: int, *, dpi: int = 150, max_long_edge: int = 1568) -> PageText:
    """The words of a PDF page's text on the visible page (its crop box), with their boxes in pixels of the image
    :func:`render_page` makes of it at the same ``dpi`` and ``max_long_edge`` (the page's /Rotate applied, as pdfium
    renders it; a page with a usable text layer is never turned further): the evidence an answer is grounded to.

    A word is a run of characters between spaces or line breaks, as pdfium reads them (:func:`_characters`), and a CJK
    character is a word of its own; a word that pdfium's hyphenation mark breaks at a line's end is one word, its box
    the union of both parts. A mark standing alone (a glyph without Unicode) is no word.
    """
    return _read_text(path, page_number, lambda page: _page_words(page, dpi, max_long_edge))


def _page_words(page: pdfium.PdfPage, dpi: int, max_long_edge: int) -> PageText:
    from pagescribe.grounding import Box, EvidenceWord, GroundingSource, PageText

    scale = _pdf_scale(page.get_size(), dpi, max_long_edge)
    place = _Placement.of(page, scale)
    words = tuple(
        EvidenceWord(text, Box(*place.pixels(rect)), line)
        for text, rect, line in _words(_characters(page.get_textpage(), page.get_bbox()))
    )
    return PageText(GroundingSource.TEXT_LAYER, words, place.width, place.height, 1 / scale)


@dataclass(frozen=True)
class _Placement:
    """Where PDF user space lands in a page's render: the crop box, turned by the page's /Rotate and scaled to the
    bitmap pdfium draws (``width`` x ``height`` pixels, each side the page's rounded up, as pypdfium2 sizes it)."""

    bbox: _Rect
    rotation: int  # degrees clockwise
    size: tuple[float, float]  # the visible page in points, turned
    width: int
    height: int

    @classmethod
    def of(cls, page: pdfium.PdfPage, scale: float) -> _Placement:
        size = page.get_size()  # pdfium's size is the crop box's, turned
        return cls(page.get_bbox(), page.get_rotation(), size, math.ceil(size[0] * scale), math.ceil(size[1] * scale))

    def pixels(self, rect: _Rect) -> tuple[float, float, float, float]:
        """A rectangle of user space (left, bottom, right, top; y upwards) as x0, y0, x1, y1 in pixels (y downwards).

        pdfium puts the crop box's turned corner at the bitmap's origin (CPDF_Page's page matrix): a page turned 90
        degrees clockwise shows its bottom-left corner at the top left."""
        left, bottom, right, top = self.bbox
        x0, y0, x1, y1 = rect
        # the rectangle in points from the turned page's bottom-left corner, x to the right and y upwards
        x_span, y_span = {
            0: ((x0 - left, x1 - left), (y0 - bottom, y1 - bottom)),
            90: ((y0 - bottom, y1 - bottom), (right - x1, right - x0)),
            180: ((right - x1, right - x0), (top - y1, top - y0)),
            270: ((top - y1, top - y0), (x0 - left, x1 - left)),
        }[self.rotation]
        width, height = self.size
        x_scale, y_scale = self.width / width, self.height / height
        return (
            x_span[0] * x_scale,
            (height - y_span[1]) * y_scale,
            x_span[1] * x_scale,
            (height - y_span[0]) * y_scale,
        )


@dataclass
class _Word:
    """A word being read, character by character, and where it is in user space."""

    text: str
    rect: _Rect
    last: _Rect  # its last character's box
    line: int
    hyphenated: bool = False  # it ends in pdfium's hyphenation mark: the next character goes on it

    def add(self, char: str, rect: _Rect) -> None:
        left, bottom, right, top = self.rect
        self.rect = (min(left, rect[0]), min(bottom, rect[1]), max(right, rect[2]), max(top, rect[3]))
        if char not in _HYPHENATION_MARKS:
            self.text += char
            self.last = rect
        self.hyphenated = char in _HYPHENATION_MARKS


def _words(characters: Iterable[tuple[str, _Rect, int | None, bool] | None]) -> Iterator[tuple[str, _Rect, int]]:
    """(text, box in user space, line) of each word of :func:`_characters`, in its order, lines counted where a word
    starts off the line of the one before (:func:`_same_line`)."""
    word: _Word | None = None
    for character in characters:
        if character is None:  # nothing runs on over text off the visible page
            if word is not None:
                yield word.text, word.rect, word.line
            word = None
            continue
        char, rect, _, space = character
        if word is not None and _goes_on(word, char, rect, space):
            word.add(char, rect)
            continue
        if char in _HYPHENATION_MARKS:  # a mark after a space is a glyph without Unicode, not a broken word
            continue
        line = 0
        if word is not None:
            yield word.text, word.rect, word.line
            line = word.line + (not _same_line(word, char, rect))
        word = _Word(char, rect, rect, line)
    if word is not None:
        yield word.text, word.rect, word.line


def _same_line(word: _Word, char: str, rect: _Rect) -> bool:
    """The character is on the word's line: level with its last character and not back to the left of it, or for
    vertical CJK writing, stacked under it."""
    if _CJK_CHARACTER.match(char) and _CJK_CHARACTER.match(word.text[-1]) and _level(word.last, rect, axis=0):
        return rect[3] <= word.last[3]
    return _level(word.last, rect) and rect[0] >= word.last[0]


def _goes_on(word: _Word, char: str, rect: _Rect, space: bool) -> bool:
    """The character goes on the word: the word is hyphenated at a line's end, or no space comes between them and
    the character is level with the word's last or stacked on it (pdfium runs some lines together); a CJK character
    is a word of its own."""
    if _CJK_CHARACTER.match(char) or _CJK_CHARACTER.match(word.text[-1]):
        return False
    return word.hyphenated or (not space and (_level(word.last, rect) or _level(word.last, rect, axis=0)))


def _level(before: _Rect, after: _Rect, axis: int = 1) -> bool:
    """The two characters' heights overlap by at least half the smaller one (with ``axis`` 0: their widths, stacked
    as in a turned label). Half, because a font's full height is taller than a line's pitch in tight leading."""
    low, high = axis, axis + 2
    overlap = min(before[high], after[high]) - max(before[low], after[low])
    return overlap >= 0.5 * min(before[high] - before[low], after[high] - after[low])
