"""Test documents built from the corpus: long PDFs made by importing the pages of a short one again and again."""

from __future__ import annotations

from pathlib import Path

import pypdfium2 as pdfium

from bench.common import CORPUS

SOURCE = CORPUS / "pdflatex-4-pages.pdf"


def build_pdf(pages: int, directory: Path) -> Path:
    """A ``pages``-page PDF of the 4-page corpus document repeated (PdfDocument.new + import_pages)."""
    path = directory / f"bench-{pages}-pages.pdf"
    if path.exists():
        return path
    source = pdfium.PdfDocument(SOURCE)
    target = pdfium.PdfDocument.new()
    try:
        while len(target) < pages:
            take = min(len(source), pages - len(target))
            target.import_pages(source, pages=list(range(take)))
        target.save(path)
    finally:
        target.close()
        source.close()
    return path
