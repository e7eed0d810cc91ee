"""The render worker process (``python -m pagescribe.render_worker REPLY_FD MEMORY_LIMIT_MB [NICENESS]``), run by
:class:`pagescribe.rendering.RenderPool`, and the frames both ends exchange: two big-endian lengths, then a JSON
object, then raw bytes (the encoded image). Why processes, and why plain pipes, is told in :mod:`pagescribe.rendering`.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, BinaryIO

from pagescribe.sources.documents import DocumentKind, InvalidDocumentError, inspect_document
from pagescribe.sources.pages import Band, render_band, render_page
from pagescribe.sources.textlayer import read_text_layer, text_layer_print, text_layer_words

FRAME_HEADER = struct.Struct(">II")  # JSON length, then blob length
# what RenderedPage says of the page besides its pixels
SEEN_FIELDS = ("ink", "marked", "draws", "text_layer", "rotation", "laid_out_text", "points_per_pixel", "figures")


def encode_frame(meta: dict[str, Any], blob: bytes = b"") -> bytes:
    body = json.dumps(meta).encode()
    return FRAME_HEADER.pack(len(body), len(blob)) + body + blob


def _read_frame_blocking(stream: BinaryIO) -> tuple[dict[str, Any], bytes] | None:
    """The next frame from a blocking stream, or None at a clean end of stream (the parent closed the pipe)."""
    header = stream.read(FRAME_HEADER.size)
    if not header:
        return None
    if len(header) < FRAME_HEADER.size:
        raise EOFError("the request stream ended inside a frame header")
    meta_size, blob_size = FRAME_HEADER.unpack(header)
    body = stream.read(meta_size)
    blob = stream.read(blob_size) if blob_size else b""
    if len(body) < meta_size or len(blob) < blob_size:
        raise EOFError("the request stream ended inside a frame")
    meta: dict[str, Any] = json.loads(body)
    return meta, blob


def _limit_memory(memory_limit_mb: int) -> None:
    limit = memory_limit_mb << 20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    _, core_hard = resource.getrlimit(resource.RLIMIT_CORE)
    resource.setrlimit(resource.RLIMIT_CORE, (0, core_hard))  # an abort() under the limit must not dump a core


def _handle(request: dict[str, Any], blob: bytes) -> tuple[dict[str, Any], bytes]:
    if request["op"] == "read":
        return {"ok": _read(blob, request["language"])}, b""
    if request["op"] == "warm":
        return {"ok": {"text": warm_up()}}, b""
    path = Path(request["path"])
    if request["op"] == "render":
        page = render_page(
            path,
            DocumentKind(request["kind"]),
            request["page_number"],
            dpi=request["dpi"],
            max_long_edge=request["max_long_edge"],
            image_format=request["image_format"],
            jpeg_quality=request["jpeg_quality"],
            max_image_pixels=request["max_image_pixels"],
            orient=request["orient"],
            blank_below=request["blank_below"],
        )
        seen = {field: getattr(page, field) for field in SEEN_FIELDS}
        usable = _usable(page.text_layer)
        words = _words(path, request) if request.get("words") and usable else None
        size = {"media_type": page.media_type, "width": page.width, "height": page.height}
        return {"ok": {**size, **seen, "print": page.print_size, "words": words}}, page.data
    if request["op"] == "words":
        return {"ok": {"words": _words(path, request)}}, b""
    if request["op"] == "band":
        tile = render_band(
            path,
            DocumentKind(request["kind"]),
            request["page_number"],
            Band(request["top"], request["bottom"]),
            zoom=request["zoom"],
            dpi=request["dpi"],
            max_long_edge=request["max_long_edge"],
            image_format=request["image_format"],
            jpeg_quality=request["jpeg_quality"],
            max_image_pixels=request["max_image_pixels"],
        )
        size = {"media_type": tile.media_type, "width": tile.width, "height": tile.height}
        return {"ok": {**size, "ink": tile.ink, "marked": tile.marked}}, tile.data
    if request["op"] == "text":
        layer = read_text_layer(path, request["page_number"])
        return {"ok": {"text": layer.text, "laid_out": layer.laid_out}}, b""
    if request["op"] == "inspect":
        info = inspect_document(path, max_pages=request["max_pages"], max_image_pixels=request["max_image_pixels"])
        return {"ok": {"kind": info.kind.value, "page_count": info.page_count}}, b""
    raise ValueError(f"unknown request {request['op']!r}")


WARM_UP_TEXT = "Warm up 1."


def warm_up() -> str:
    """Everything a worker does first for a page, done once on a small page of text made here (a temporary file):
    pdfium's start and its standard font, the image encoders, and the modules that place and check words load before
    the first real page asks (about 100 ms of a first render, and as much of the first words placed). The text the
    page's render read back, which is WARM_UP_TEXT."""
    import pypdfium2 as pdfium
    import pypdfium2.raw as pdfium_c

    pdf = pdfium.PdfDocument.new()
    page = pdf.new_page(300, 200)
    text = pdfium_c.FPDFPageObj_NewTextObj(pdf.raw, b"Helvetica", 14.0)
    characters = ctypes.create_string_buffer(WARM_UP_TEXT.encode("utf-16-le") + b"\x00\x00")
    pdfium_c.FPDFText_SetText(text, ctypes.cast(characters, ctypes.POINTER(pdfium_c.FPDF_WCHAR)))
    pdfium_c.FPDFPageObj_Transform(text, 1, 0, 0, 1, 30, 100)
    pdfium_c.FPDFPage_InsertObject(page.raw, text)
    pdfium_c.FPDFPage_GenerateContent(page.raw)
    with tempfile.NamedTemporaryFile(suffix=".pdf") as file:
        pdf.save(file)
        file.flush()
        path = Path(file.name)
        inspect_document(path, max_pages=1, max_image_pixels=1 << 20)
        for image_format in ("png", "jpeg"):
            rendered = render_page(path, DocumentKind.PDF, 1, image_format=image_format)
        text_layer_print(path, 1)
        _words(path, {"page_number": 1, "dpi": 150, "max_long_edge": 1568})
        read_text_layer(path, 1)
    return rendered.text_layer


def _usable(text_layer: str) -> bool:
    from pagescribe.checks import usable_text_layer

    return usable_text_layer(text_layer)


def _words(path: Path, request: dict[str, Any]) -> dict[str, Any]:
    """A born-digital page's words placed on its render: the evidence its answer is grounded to."""
    from pagescribe.grounding import evidence_as_json

    words = text_layer_words(path, request["page_number"], **_scale(request))
    return evidence_as_json(words)


def _scale(request: dict[str, Any]) -> dict[str, int]:
    """The render's scale, which places the text layer on the image."""
    return {"dpi": request["dpi"], "max_long_edge": request["max_long_edge"]}


def _read(image: bytes, language: str) -> dict[str, Any]:
    """The second read of a page image by the offline engine: its lines (text, box, score), their mean confidence,
    and the CPU time it took (the whole process's: the engine's threads too)."""
    from pagescribe.layout.boxes import mean_confidence
    from pagescribe.providers.offline import read_lines

    started = time.process_time()
    lines = read_lines(image, language)
    return {
        "lines": [[line.text, line.left, line.top, line.right, line.bottom, line.score] for line in lines],
        "confidence": mean_confidence(lines),
        "cpu_seconds": round(time.process_time() - started, 3),
    }


def serve(reply_fd: int, memory_limit_mb: int, niceness: int = 0) -> int:
    """The worker loop: one request at a time from stdin, one reply each on ``reply_fd``, until stdin closes. A
    worker with a ``niceness`` runs at that lower priority: it takes only the CPU the rest of the function leaves. A
    worker whose parent is gone (its replies' pipe closed, even before it was ready) ends quietly: nobody is left to
    serve or to tell."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it closes or kills the workers
    if niceness:
        os.nice(niceness)
    try:
        with os.fdopen(reply_fd, "wb") as replies:
            return _serve(sys.stdin.buffer, replies, memory_limit_mb)
    except BrokenPipeError:
        return 0


def _serve(requests: BinaryIO, replies: BinaryIO, memory_limit_mb: int) -> int:
    try:
        _limit_memory(memory_limit_mb)
    except (ValueError, OSError) as exc:
        replies.write(encode_frame({"startup_error": f"RENDER_MEMORY_LIMIT_MB={memory_limit_mb}: {exc}"}))
        return 1
    replies.write(encode_frame({"ready": os.getpid()}))
    replies.flush()
    while (frame := _read_frame_blocking(requests)) is not None:
        try:
            reply = _handle(*frame)
        except InvalidDocumentError as exc:
            reply = {"invalid": exc.reason}, b""
        except MemoryError:
            reply = {"memory": True}, b""
        except Exception as exc:
            reply = {"error": f"{type(exc).__name__}: {exc}"}, b""
        replies.write(encode_frame(*reply))
        replies.flush()
    return 0


if __name__ == "__main__":
    sys.exit(serve(int(sys.argv[1]), int(sys.argv[2]), *(int(arg) for arg in sys.argv[3:4])))
