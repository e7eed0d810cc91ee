"""Documents on local disk: detect the type from the bytes, count pages, render one page to an image.

pdfium is not thread-safe, and pages render in worker threads, so every pypdfium2 call holds one lock.
"""

from __future__ import annotations

import io
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Literal

import pypdfium2 as pdfium
import pypdfium2.raw as pdfium_c
from PIL import Image, ImageOps, TiffImagePlugin, UnidentifiedImageError

_PDFIUM_LOCK = threading.Lock()
_SNIFF_BYTES = 1024
DEFAULT_MAX_IMAGE_PIXELS = 60_000_000

# Every image is opened through _open_image, which refuses one over the configured MAX_IMAGE_PIXELS from its
# header, naming the setting; Pillow's own process-wide guard would refuse first with a message that does not.
Image.MAX_IMAGE_PIXELS = None


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
    data: bytes
    media_type: str
    width: int
    height: int


def detect_kind(head: bytes) -> DocumentKind:
    """The document type, from its first bytes only (never the file name)."""
    if not head:
        raise InvalidDocumentError("the file is empty (0 bytes)")
    if b"%PDF-" in head[:_SNIFF_BYTES]:
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
        f"unsupported file type: the content is not PDF, PNG, JPEG, TIFF or WebP (it starts with {head[:12]!r})"
    )


@contextmanager
def _open_pdf(path: Path) -> Iterator[pdfium.PdfDocument]:
    """Open a PDF under the pdfium lock, translating load failures into user-facing reasons."""
    with _PDFIUM_LOCK:
        try:
            pdf = pdfium.PdfDocument(path)
        except pdfium.PdfiumError as exc:
            if exc.err_code == pdfium_c.FPDF_ERR_PASSWORD:
                raise InvalidDocumentError("the PDF is password-protected; upload it without a password") from exc
            raise InvalidDocumentError(f"the PDF could not be read: {exc}") from exc
        try:
            yield pdf
        finally:
            pdf.close()


@contextmanager
def _open_image(path: Path, max_pixels: int) -> Iterator[Image.Image]:
    """Open an image lazily (header only); refuse one over ``max_pixels`` before any pixel is decoded."""
    try:
        image = Image.open(path)
    except (UnidentifiedImageError, OSError) as exc:
        raise InvalidDocumentError(f"the image could not be read: {exc}") from exc
    try:
        try:
            _check_pixels(image, max_pixels)
        except InvalidDocumentError:
            raise
        except (OSError, ValueError, EOFError) as exc:
            raise InvalidDocumentError(f"the image could not be read: {exc}") from exc
        yield image
    finally:
        image.close()


def _frame_count(image: Image.Image) -> int:
    """Pages in an image file: a TIFF's frames; any other image is one page."""
    return image.n_frames if isinstance(image, TiffImagePlugin.TiffImageFile) else 1


def _check_pixels(image: Image.Image, max_pixels: int) -> None:
    frames = _frame_count(image)
    for frame in range(frames):
        if frames > 1:
            image.seek(frame)
        width, height = image.size
        if width * height > max_pixels:
            raise InvalidDocumentError(
                f"the image is {width} x {height} pixels ({width * height / 1e6:.1f} megapixels); "
                f"the limit is MAX_IMAGE_PIXELS={max_pixels}"
            )
    if frames > 1:
        image.seek(0)


def _read_head(path: Path) -> bytes:
    with path.open("rb") as handle:
        return handle.read(_SNIFF_BYTES)


def inspect_document(path: Path, *, max_pages: int, max_image_pixels: int) -> DocumentInfo:
    """Type and page count of a document, or InvalidDocumentError saying what is wrong and the limit."""
    kind = detect_kind(_read_head(path))
    if kind is DocumentKind.PDF:
        with _open_pdf(path) as pdf:
            pages = len(pdf)
        if pages == 0:
            raise InvalidDocumentError("the PDF has no pages")
    else:
        with _open_image(path, max_image_pixels) as image:
            pages = _frame_count(image)
    if pages > max_pages:
        raise InvalidDocumentError(f"the document has {pages} pages; the limit is MAX_PAGES={max_pages}")
    return DocumentInfo(kind, pages)


def _encode(image: Image.Image, image_format: Literal["jpeg", "png"], jpeg_quality: int) -> RenderedPage:
    buffer = io.BytesIO()
    if image_format == "jpeg":
        image.save(buffer, format="JPEG", quality=jpeg_quality, optimize=False)
    else:
        image.save(buffer, format="PNG", compress_level=3)
    return RenderedPage(buffer.getvalue(), f"image/{image_format}", image.width, image.height)


def _to_rgb(image: Image.Image) -> Image.Image:
    """RGB on white, whatever the source mode (palette, alpha, CMYK, 16-bit grey, bilevel)."""
    if image.mode == "RGB":
        return image
    if image.mode in {"I;16", "I;16B", "I;16L", "I"}:
        image = image.point(lambda v: v / 256).convert("L")
    if image.mode in {"RGBA", "LA", "PA"} or (image.mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")
        background = Image.new("RGB", rgba.size, (255, 255, 255))
        background.paste(rgba, mask=rgba.getchannel("A"))
        return background
    return image.convert("RGB")


def _check_page_number(page_number: int, pages: int) -> None:
    if not 1 <= page_number <= pages:
        raise InvalidDocumentError(f"page {page_number} does not exist; the document has {pages} pages")


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
) -> RenderedPage:
    """Render one page (1-based) at ``dpi``, never larger than ``max_long_edge`` pixels on its long edge."""
    if kind is DocumentKind.PDF:
        with _open_pdf(path) as pdf:
            _check_page_number(page_number, len(pdf))
            page = pdf[page_number - 1]
            try:
                width_pt, height_pt = page.get_size()
                longest_pt = max(width_pt, height_pt, 1.0)
                scale = min(dpi / 72, max_long_edge / longest_pt)
                bitmap = page.render(scale=scale, may_draw_forms=True)
                try:
                    image = bitmap.to_pil().convert("RGB")
                finally:
                    bitmap.close()
            except pdfium.PdfiumError as exc:
                raise InvalidDocumentError(f"page {page_number} could not be rendered: {exc}") from exc
            finally:
                page.close()
        return _encode(image, image_format, jpeg_quality)

    with _open_image(path, max_image_pixels) as source:
        frames = _frame_count(source)
        _check_page_number(page_number, frames)
        try:
            if frames > 1:
                source.seek(page_number - 1)
            source.draft("RGB", (max_long_edge, max_long_edge))  # JPEG decodes at a reduced scale
            image = ImageOps.exif_transpose(source)
            image.thumbnail((max_long_edge, max_long_edge), Image.Resampling.LANCZOS, reducing_gap=3.0)
            image = _to_rgb(image)
        except (OSError, ValueError, EOFError) as exc:
            raise InvalidDocumentError(f"page {page_number} could not be decoded: {exc}") from exc
    return _encode(image, image_format, jpeg_quality)


def extract_text_layer(path: Path, page_number: int) -> str:
    """The embedded text of a PDF page (born-digital documents), stripped; empty where there is none."""
    if detect_kind(_read_head(path)) is not DocumentKind.PDF:
        raise InvalidDocumentError("only a PDF has a text layer")
    with _open_pdf(path) as pdf:
        _check_page_number(page_number, len(pdf))
        page = pdf[page_number - 1]
        textpage = page.get_textpage()
        try:
            return str(textpage.get_text_range()).strip()
        finally:
            textpage.close()
            page.close()
