"""A PDF page's text layer on the visible page: as pdfium reads it, laid out in reading order, and as words placed
on the page's rendered image (the evidence an answer is grounded to)."""

from __future__ import annotations

import ctypes
import functools
import math
import re
import statistics
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, TypeVar

import pypdfium2 as pdfium
import pypdfium2.raw as pdfium_c

from pagescribe.sources.documents import (
    DocumentKind,
    InvalidDocumentError,
    check_page_number,
    detect_kind,
    open_pdf,
    pdf_scale,
    read_head,
)

if TYPE_CHECKING:
    from pagescribe.grounding import PageText
    from pagescribe.layout.boxes import TextBox

RUN_GAP = 0.5  # text drawn by two text objects on one line is one box when at most this many line heights apart
LAYOUT_MAX_BOXES = 5_000  # a page with more runs of text than this keeps pdfium's order (see laid_out_text)
_HYPHENATION_MARKS = frozenset("\ufffe\x02")  # pdfium's mark for a hyphen that breaks a word at a line's end
_HYPHENATION_BREAK = re.compile("[\ufffe\x02]\\s*")  # ... and the line break after it, in laid-out text
_CJK_CHARACTER = re.compile("[\u2e80-\u2fdf\u3040-\u312f\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]")
_T = TypeVar("_T")


@dataclass(frozen=True)
class TextLayer:
    """A PDF page's visible text: as pdfium reads it (the evidence the checks compare answers with), and laid out in
    reading order like the offline engine's boxes (what stands in for the page as its transcript)."""

    text: str
    laid_out: str


def visible_text(page: pdfium.PdfPage, textpage: pdfium.PdfTextPage | None = None) -> str:
    """The text on the visible part of the page (not outside its crop box: printers' marks, proofing notes), with
    pdfium's hyphenation marks and other non-characters removed. ``textpage``: the page's, when one is loaded."""
    from pagescribe.checks import remove_non_characters

    text = (textpage or page.get_textpage()).get_text_bounded()
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
    # pdfium's own functions on the raw handle, one box reused: the loop runs once per character of the page
    handle, box = textpage.raw, pdfium_c.FS_RECTF()
    space = broken = False
    previous = -1  # the index of the last character yielded
    for index in range(textpage.count_chars()):
        char = chr(pdfium_c.FPDFText_GetUnicode(handle, index))
        if char.isspace():
            broken, space = broken or char in "\r\n", space or char not in "\r\n"
            continue
        if not _kept(char):
            continue
        rect = _loose_box(handle, index, box)  # the font's full height: a line's boxes line up
        if not _overlaps(rect, bbox):
            yield None
        else:
            if broken and previous >= 0 and _baseline(handle, index) != _baseline(handle, previous):
                space = True
            source = ctypes.cast(pdfium_c.FPDFText_GetTextObject(handle, index), ctypes.c_void_p).value
            yield char, rect, source, space
            previous = index
        space = broken = False


@functools.lru_cache(maxsize=4096)
def _kept(char: str) -> bool:
    """pdfium's hyphenation mark, or a character pdfium's own text keeps: neither a non-character nor a lone
    surrogate (of a broken ToUnicode map). Decided once per character: it is asked for every character of a page."""
    from pagescribe.checks import remove_non_characters

    return char in _HYPHENATION_MARKS or (bool(remove_non_characters(char)) and not "\ud800" <= char <= "\udfff")


def _loose_box(handle: pdfium_c.FPDF_TEXTPAGE, index: int, box: pdfium_c.FS_RECTF) -> _Rect:
    """The character's box at the font's full height, read into ``box``."""
    if not pdfium_c.FPDFText_GetLooseCharBox(handle, index, box):
        raise pdfium.PdfiumError(f"the box of character {index} could not be read")
    return box.left, box.bottom, box.right, box.top


def _overlaps(rect: _Rect, bbox: _Rect) -> bool:
    """The character's box touches the visible page."""
    left, bottom, right, top = bbox
    return rect[0] <= right and rect[2] >= left and rect[1] <= top and rect[3] >= bottom


def _baseline(handle: pdfium_c.FPDF_TEXTPAGE, index: int) -> float:
    x, y = ctypes.c_double(), ctypes.c_double()
    pdfium_c.FPDFText_GetCharOrigin(handle, index, x, y)
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


def laid_out_text(page: pdfium.PdfPage) -> str:
    """The text on the visible page laid out in reading order as the offline engine's boxes are (columns one after
    the other), hyphenated words joined; empty where there is none. A page of more than LAYOUT_MAX_BOXES runs of
    text keeps pdfium's order: the layout's time grows with the square of the runs (8,800 took 2.8 s), and a page
    must never run out of its render time for it."""
    from pagescribe.layout import boxes_to_text

    boxes = _text_boxes(page)
    if len(boxes) > LAYOUT_MAX_BOXES:
        return visible_text(page)
    return _HYPHENATION_BREAK.sub("", boxes_to_text(boxes)).strip() if boxes else ""


def extract_text_layer(path: Path, page_number: int) -> str:
    """The embedded text of a PDF page (born-digital documents) that lies on the visible page, in pdfium's order,
    non-characters removed, stripped; empty where there is none."""
    return _read_text(path, page_number, visible_text)


def read_text_layer(path: Path, page_number: int) -> TextLayer:
    """The embedded text of a PDF page that lies on the visible page, as pdfium reads it and laid out."""
    return _read_text(path, page_number, lambda page: TextLayer(visible_text(page), laid_out_text(page)))


def _read_text(path: Path, page_number: int, read: Callable[[pdfium.PdfPage], _T]) -> _T:
    """What ``read`` makes of a PDF page; InvalidDocumentError for anything but an existing PDF page."""
    if detect_kind(read_head(path)) is not DocumentKind.PDF:
        raise InvalidDocumentError("only a PDF has a text layer")
    with open_pdf(path) as pdf:
        check_page_number(page_number, len(pdf))
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

    scale = pdf_scale(page.get_size(), dpi, max_long_edge)
    place = _Placement.of(page, scale)
    words = tuple(
        EvidenceWord(text, Box(*place.pixels(rect)), line)
        for text, rect, line in _words(_characters(page.get_textpage(), page.get_bbox()))
    )
    return PageText(GroundingSource.TEXT_LAYER, words, place.width, place.height, 1 / scale)


class PrintSize(NamedTuple):
    """How large a PDF page's print is on its render: the median height in pixels of its words that have a letter or a
    digit, and how many there are (few words are no measure of a page's print)."""

    px: float
    words: int


def text_layer_print(path: Path, page_number: int, *, dpi: int = 150, max_long_edge: int = 1568) -> PrintSize | None:
    """The size of a PDF page's print on the image :func:`render_page` makes of it at the same ``dpi`` and
    ``max_long_edge`` (None: no such word on the visible page): what decides, before any call, whether the page is
    read in tiles. A word is a run of characters between spaces (a CJK character one of its own), measured by its
    first letter or digit at the font's full height, as :func:`text_layer_words` boxes a word: a fraction of the cost
    of placing the words, which reads every character's box, baseline and text object and joins them."""
    return _read_text(path, page_number, lambda page: page_print(page, dpi, max_long_edge))


def page_print(
    page: pdfium.PdfPage, dpi: int, max_long_edge: int, textpage: pdfium.PdfTextPage | None = None
) -> PrintSize | None:
    """:func:`text_layer_print` of an open page (``textpage``: the page's, when one is loaded)."""
    textpage = textpage or page.get_textpage()
    handle, box, bbox = textpage.raw, pdfium_c.FS_RECTF(), page.get_bbox()
    place = _Placement.of(page, pdf_scale(page.get_size(), dpi, max_long_edge))
    heights: list[float] = []
    in_word = False  # a letter or a digit of the word was measured
    for index, char in enumerate(_characters_of(textpage)):
        if char.isspace():
            in_word = False
        elif char.isalnum() and (not in_word or _cjk(char)):
            in_word = not _cjk(char)
            rect = _loose_box(handle, index, box)
            _, top, _, bottom = place.pixels(rect)
            if _overlaps(rect, bbox) and bottom > top:
                heights.append(bottom - top)
    return PrintSize(statistics.median(heights), len(heights)) if heights else None


def _characters_of(textpage: pdfium.PdfTextPage) -> str:
    """Every character of the text page, index for index, for telling letters, digits and spaces apart: pdfium's text
    read in one call (one call per character costs about 2 ms a page), where it has one code point per character.
    Where it has not (a character pdfium leaves out of its text), the characters one by one. The one difference
    between the two, pdfium's hyphenation mark (U+0002 one by one, U+FFFE in its text), is neither a letter, a digit
    nor a space either way."""
    count = textpage.count_chars()
    buffer = ctypes.create_string_buffer((count + 1) * 2)  # UTF-16 code units and the terminator
    written = pdfium_c.FPDFText_GetText(textpage.raw, 0, count, ctypes.cast(buffer, ctypes.POINTER(ctypes.c_ushort)))
    text = buffer.raw[: max(0, written - 1) * 2].decode("utf-16-le", errors="surrogatepass")
    if len(text) == count:
        return text
    return "".join(chr(pdfium_c.FPDFText_GetUnicode(textpage.raw, index)) for index in range(count))


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
    if _cjk(char) and _cjk(word.text[-1]) and _level(word.last, rect, axis=0):
        return rect[3] <= word.last[3]
    return _level(word.last, rect) and rect[0] >= word.last[0]


def _goes_on(word: _Word, char: str, rect: _Rect, space: bool) -> bool:
    """The character goes on the word: the word is hyphenated at a line's end, or no space comes between them and
    the character is level with the word's last or stacked on it (pdfium runs some lines together); a CJK character
    is a word of its own."""
    if _cjk(char) or _cjk(word.text[-1]):
        return False
    return word.hyphenated or (not space and (_level(word.last, rect) or _level(word.last, rect, axis=0)))


def _cjk(char: str) -> bool:
    """A CJK character (the check before the pattern: most text is well below its first block)."""
    return char >= "\u2e80" and _CJK_CHARACTER.match(char) is not None


def _level(before: _Rect, after: _Rect, axis: int = 1) -> bool:
    """The two characters' heights overlap by at least half the smaller one (with ``axis`` 0: their widths, stacked
    as in a turned label). Half, because a font's full height is taller than a line's pitch in tight leading."""
    low, high = axis, axis + 2
    overlap = min(before[high], after[high]) - max(before[low], after[low])
    return overlap >= 0.5 * min(before[high] - before[low], after[high] - after[low])
