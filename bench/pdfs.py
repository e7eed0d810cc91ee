"""Test documents built by importing pages again and again: long PDFs from the corpus, and a PDF of real scans."""

from __future__ import annotations

from pathlib import Path

import pypdfium2 as pdfium

from bench.common import CORPUS, REPO

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


SCANS = (REPO / "tests" / "data" / "documents" / "congress.pdf", REPO / "tests" / "data" / "documents" / "cardinal.pdf")


def build_scan_pdf(pages: int, directory: Path) -> Path:
    """A ``pages``-page image-only PDF of real scans: the pages of congress.pdf (1) and cardinal.pdf (4), in turn and
    again (PdfDocument.new + import_pages), none with a text layer."""
    path = directory / f"bench-scans-{pages}-pages.pdf"
    if path.exists():
        return path
    sources = [pdfium.PdfDocument(scan) for scan in SCANS]
    order = [(source, index) for source in sources for index in range(len(source))]
    target = pdfium.PdfDocument.new()
    try:
        for number in range(pages):
            source, index = order[number % len(order)]
            target.import_pages(source, pages=[index])
        target.save(path)
    finally:
        target.close()
        for source in sources:
            source.close()
    return path
