"""Where each block of an answer truly is on a born-digital PDF page: its box from the page's own text layer, found
independently of the alignment (:mod:`pagescribe.grounding`) and of :func:`pagescribe.sources.text_layer_words`, to
measure the boxes the alignment gives (``pagescribe eval``, tests/unit/test_grounding.py).

pdfium's text is cut at its own line breaks; each line of LINE_CHARS letters and digits or more is given to a block
whose text has it after what the block's lines so far took (of several, the first from the block the line before
went to: a page that repeats a text reads it in order), or else to the one block that has it at all. A block's box is
the union of its lines' characters' boxes (loose, as pdfium gives them), put into the image's pixels by pdfium itself
(``FPDF_PageToDevice``).

What it cannot see: a line of fewer than LINE_CHARS letters and digits is no evidence of its block (a slide's URL
line, a figure's axis numbers), and a line the answer does not have letter for letter (a misread word) is given to no
block, so a true box is made of the lines the block has verbatim.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from pathlib import Path

import pypdfium2 as pdfium
import pypdfium2.raw as pdfium_c
from pagescribe.grounding import Box

LINE_CHARS = 8  # a line of pdfium's with fewer letters and digits than this is no evidence of its block


def squashed(text: str) -> str:
    """The text's letters and digits only, NFKC, casefolded, without diacritics: as the alignment compares words."""
    folded = unicodedata.normalize("NFKD", unicodedata.normalize("NFKC", text).casefold())
    return "".join(char for char in folded if char.isalnum())


def true_boxes(
    path: Path, page_number: int, blocks: Sequence[tuple[str, str]], size: tuple[int, int]
) -> dict[str, Box]:
    """Each block's true box (see the module's docstring) by its id, in pixels of a render ``size`` (width, height)
    of the page; ``blocks``: (id, plain text) in the answer's order. A block no line is given to has none."""
    texts = {block_id: squashed(plain) for block_id, plain in blocks}
    ids = list(texts)
    pdf = pdfium.PdfDocument(path)
    try:
        page = pdf[page_number - 1]
        boxes: dict[str, Box] = {}
        read = dict.fromkeys(texts, 0)  # how far into each block's text the lines given to it go
        at = 0  # the block the line before went to
        for line, rects in _lines(page.get_textpage()):
            owner = _owner(line, texts, read, at)
            if owner is None:
                continue
            block = ids[owner]
            found = texts[block].find(line, read[block])
            read[block], at = (found if found >= 0 else texts[block].find(line)) + len(line), owner
            for rect in rects:
                box = _pixel_box(page, rect, size)
                boxes[block] = boxes[block].union(box) if block in boxes else box
        return boxes
    finally:
        pdf.close()


def _lines(textpage: pdfium.PdfTextPage) -> list[tuple[str, list[tuple[float, float, float, float]]]]:
    """pdfium's text cut at its line breaks: each line's letters and digits (squashed) of LINE_CHARS or more, with
    the loose boxes of its characters that have any."""
    lines: list[tuple[str, list[tuple[float, float, float, float]]]] = [("", [])]
    for index in range(textpage.count_chars()):
        char = chr(pdfium_c.FPDFText_GetUnicode(textpage, index))
        if char == "\n":
            lines.append(("", []))
        elif squashed(char):
            lines[-1] = (lines[-1][0] + char, [*lines[-1][1], textpage.get_charbox(index, loose=True)])
    return [(squashed(text), rects) for text, rects in lines if len(squashed(text)) >= LINE_CHARS]


def _owner(line: str, texts: dict[str, str], read: dict[str, int], at: int) -> int | None:
    """The index of the block a line goes to: of the blocks that have it after what their lines so far took, the
    first from ``at`` on (else the first of them); else the one block that has it anywhere; else None."""
    ahead = [i for i, (block, text) in enumerate(texts.items()) if line in text[read[block] :]]
    owner = next((i for i in ahead if i >= at), ahead[0] if ahead else None)
    if owner is None:
        anywhere = [i for i, text in enumerate(texts.values()) if line in text]
        owner = anywhere[0] if len(anywhere) == 1 else None
    return owner


def _pixel_box(page: pdfium.PdfPage, rect: tuple[float, float, float, float], size: tuple[int, int]) -> Box:
    """A rectangle in PDF user space as a box in pixels of a render of ``size``, by pdfium (the page's /Rotate
    applied)."""
    corners = []
    for x, y in ((rect[0], rect[1]), (rect[2], rect[3])):
        device_x, device_y = pdfium_c.c_int(), pdfium_c.c_int()
        pdfium_c.FPDF_PageToDevice(page, 0, 0, size[0], size[1], 0, x, y, device_x, device_y)
        corners.append((device_x.value, device_y.value))
    (x0, y0), (x1, y1) = corners
    return Box(min(x0, x1), min(y0, y1), max(x0, x1), max(y0, y1))
