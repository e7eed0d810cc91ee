"""Real pages rewritten the way other producers write them: the same page to the eye, drawn in another order."""

from __future__ import annotations

from pathlib import Path

import pypdfium2 as pdfium
import pypdfium2.raw as pdfium_c


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
