"""Real pages: every readable PDF page of the corpus and tests/data/documents with its text layer, and pages rewritten
the way other producers write them (the same page to the eye, drawn in another order)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pypdfium2 as pdfium
import pypdfium2.raw as pdfium_c
from pagescribe.sources.textlayer import extract_text_layer

from tests.support import CORPUS

DOCUMENTS = CORPUS.parent / "documents"


def pdf_text_layers() -> Iterator[tuple[Path, int, str]]:
    """(path, page number, text layer) of every page of every PDF of the corpus and tests/data/documents that can be
    read without a password, in file order."""
    for path in sorted([*CORPUS.glob("*.pdf"), *DOCUMENTS.glob("*.pdf")]):
        if "password" in path.name:
            continue
        number = 1
        while True:
            try:
                text = extract_text_layer(path, number)
            except ValueError:
                break
            yield path, number, text
            number += 1


def drawn_row_by_row(source: Path, page_number: int, target: Path) -> Path:
    """A one-page PDF of the page with its text objects drawn row by row across its columns, top to bottom and left to
    right, as producers that write a page by position do: it renders the same, but pdfium's text reads the columns'
    lines interleaved."""
    pdf = pdfium.PdfDocument(source)
    try:
        for index in reversed(range(len(pdf))):
            if index != page_number - 1:
                pdf.del_page(index)
        page = pdf[0]
        texts = [obj for obj in page.get_objects(max_depth=1) if obj.type == pdfium_c.FPDF_PAGEOBJ_TEXT]
        by_row = sorted(texts, key=lambda obj: (-round(obj.get_bounds()[1] / 2), obj.get_bounds()[0]))
        for obj in texts:
            page.remove_obj(obj)
        for obj in by_row:
            page.insert_obj(obj)
        page.gen_content()
        pdf.save(target)
    finally:
        pdf.close()
    return target
