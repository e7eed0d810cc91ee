"""Source documents on disk: their type from the bytes, opened under pdfium's lock or Pillow's guard, their pages
counted against the limits."""

from __future__ import annotations

import math
import os
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import pypdfium2 as pdfium
import pypdfium2.raw as pdfium_c
from PIL import Image, TiffImagePlugin

_PDFIUM_LOCK = threading.Lock()
_PILLOW_GUARD_LOCK = threading.Lock()
_SNIFF_BYTES = 1024
_PDF_LOAD_ERRORS = {
    pdfium_c.FPDF_ERR_FILE: "the file could not be opened",
    pdfium_c.FPDF_ERR_FORMAT: "it is damaged, truncated or not a PDF",
    pdfium_c.FPDF_ERR_SECURITY: "it is encrypted with an unsupported security handler",
}
DEFAULT_MAX_IMAGE_PIXELS = 60_000_000
# A TIFF's frames are counted at most this far, even when a page selection lets the document run past MAX_PAGES:
# walking them costs more than linear time (2,000 took 0.13 s, 10,000 took 1.4 s, 100,000 took 51 s).
MAX_TIFF_FRAMES = 2_000
# What Pillow raises for a malformed file: Image.open turns the last four into UnidentifiedImageError (an OSError),
# but seeking to a TIFF frame or decoding pixels lets them through.
_MALFORMED_IMAGE = (OSError, ValueError, EOFError, SyntaxError, IndexError, TypeError, struct.error)


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


def read_head(path: Path) -> bytes:
    with path.open("rb") as handle:
        return handle.read(_SNIFF_BYTES)


def _pages(count: int) -> str:
    return f"{count} page" if count == 1 else f"{count} pages"


def check_page_number(page_number: int, pages: int) -> None:
    if not 1 <= page_number <= pages:
        raise InvalidDocumentError(f"page {page_number} does not exist; the document has {_pages(pages)}")


def _check_page_count(pages: int, max_pages: int) -> None:
    if pages > max_pages:
        raise InvalidDocumentError(f"the document has {_pages(pages)}; the limit is MAX_PAGES={max_pages}")


@contextmanager
def open_pdf(path: Path) -> Iterator[pdfium.PdfDocument]:
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
def open_image(path: Path, kind: DocumentKind) -> Iterator[Image.Image]:
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


def frame_count(image: Image.Image, limit: int) -> int | None:
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


def check_pixels(image: Image.Image, max_pixels: int) -> None:
    """Refuse the current frame from its header if it is over ``max_pixels``."""
    width, height = image.size
    if width * height > max_pixels:
        raise InvalidDocumentError(
            f"the image is {width} x {height} pixels ({width * height / 1e6:.1f} megapixels); "
            f"the limit is MAX_IMAGE_PIXELS={max_pixels}"
        )


def inspect_document(path: Path, *, max_pages: int, max_image_pixels: int) -> DocumentInfo:
    """Type and page count, from the headers; InvalidDocumentError says what is wrong and any limit it breaks."""
    kind = detect_kind(read_head(path))
    if kind is DocumentKind.PDF:
        with open_pdf(path) as pdf:
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
        with open_image(path, kind) as image:
            limit = min(max_pages, MAX_TIFF_FRAMES)
            frames = frame_count(image, limit)
            if frames is None:
                raise InvalidDocumentError(
                    f"the document has more than {_pages(limit)}; the limit is "
                    + (f"MAX_PAGES={max_pages}" if limit == max_pages else f"{MAX_TIFF_FRAMES} frames in a TIFF")
                )
            pages = frames
            _check_page_count(pages, max_pages)
            for frame in range(pages):
                image.seek(frame)
                check_pixels(image, max_image_pixels)
    return DocumentInfo(kind, pages)


def pdf_scale(size_pt: tuple[float, float], dpi: int, max_long_edge: int) -> float:
    """Pixels per point: ``dpi``, unless the long edge would pass ``max_long_edge`` pixels (pdfium rounds up)."""
    longest = max(*size_pt, 1.0)
    scale = min(dpi / 72, max_long_edge / longest)
    while math.ceil(longest * scale) > max_long_edge:  # the division can land one ulp high
        scale = math.nextafter(scale, 0)
    return scale
