"""Source files (what was uploaded) on local disk: :mod:`.documents` detects the type from the bytes and counts pages,
:mod:`.pages` renders one page to an image, :mod:`.textlayer` reads a PDF page's text layer (as text, and as words
placed on the rendered image, for grounding).

The functions run this code in render worker processes (:mod:`pagescribe.rendering`), one page at a time each; it is
also called in-process (tests, ``pagescribe transcribe --estimate``), possibly from several threads, and pdfium is not
thread-safe, so every pypdfium2 call holds one lock (:func:`.documents.open_pdf`).

pagescribe.checks, pagescribe.grounding, pagescribe.layout and pagescribe.orientation are imported where a page is
rendered or its text read: the upload function only inspects documents, and keeps them (and their compiled patterns)
out of its cold start.
"""
