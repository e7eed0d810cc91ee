"""A corpus of hostile input through the real upload and transcribe handlers (moto S3/SQS, PostgreSQL, the fake
provider): each ends with a clear reason (a FAILED document, or a FAILED page), within bounded memory, without
crashing a function or poisoning the queue."""

from __future__ import annotations

import base64
import io
import json
import os
import struct
import threading
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pypdfium2 as pdfium
import pytest
from pagescribe.handlers import upload as upload_app
from pagescribe.runtime import shutdown_runtime
from pagescribe.settings import get_settings
from pagescribe.store.postgres import Database
from PIL import Image, TiffImagePlugin
from sqlalchemy import text

from tests.fakes.chat_server import FakeChatServer
from tests.support import CORPUS
from tests.support.aws_events import LambdaContext, sqs_event
from tests.support.database import page_rows
from tests.support.hostile import (
    CATALOG,
    bilevel_png,
    decompression_bomb,
    lying_count_pdf,
    many_frame_tiff,
    object_stream_bomb,
    one_page_pdf,
    pdf_of,
    png_chunk,
    xref_stream_bomb,
)
from tests.support.pipeline import Pipeline

pytestmark = pytest.mark.integration

MEMORY_BOUND_KB = 1536 * 1024  # 1.5 GiB of peak RSS for a whole handler process
LONG_EDGE = 1568  # RENDER_MAX_LONG_EDGE's default


# Building hostile files cheaply


def page_tree_bomb(count: int) -> bytes:
    """100,000 pages in 600 KB: the page tree lists one page object ``count`` times."""
    kids = b"3 0 R " * count
    return pdf_of(
        CATALOG,
        b"<< /Type /Pages /Kids [%s] /Count %d >>" % (kids, count),
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] >>",
    )


def blank_pdf(pages: int) -> bytes:
    document = pdfium.PdfDocument.new()
    for _ in range(pages):
        document.new_page(612, 792)
    buffer = io.BytesIO()
    document.save(buffer)
    document.close()
    return buffer.getvalue()


def png_with_corrupt_pixels() -> bytes:
    """A valid PNG header (64 x 48, RGB) whose compressed pixel data is garbage."""
    header = struct.pack(">IIBBBBB", 64, 48, 8, 2, 0, 0, 0)
    garbage = bytes((i * 73 + 11) % 256 for i in range(400))
    return b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", header) + png_chunk(b"IDAT", garbage) + png_chunk(b"IEND", b"")


def jpeg_with_corrupt_body(*, truncate: bool) -> bytes:
    """The corpus JPEG with its headers intact and its entropy-coded data cut off or replaced by garbage."""
    whole = (CORPUS / "smile.jpg").read_bytes()
    scan = whole.index(b"\xff\xda")  # start of scan: everything before it is the valid header
    if truncate:
        return whole[: scan + 20]
    garbage = bytes((i * 37) % 256 for i in range(len(whole) - scan - 16))
    return whole[: scan + 14] + garbage + b"\xff\xd9"


def tiff_frames(*, break_frame: int | None = None, cut: bool = False) -> bytes:
    """A 3-frame deflate TIFF; ``break_frame`` (0-based) gets garbage for its pixel data, ``cut`` truncates the
    file in the middle of that frame's data."""
    frames = [Image.new("L", (64, 48), shade) for shade in (30, 120, 220)]
    buffer = io.BytesIO()
    frames[0].save(buffer, "TIFF", save_all=True, append_images=frames[1:], compression="tiff_adobe_deflate")
    data = bytearray(buffer.getvalue())
    if break_frame is None:
        return bytes(data)
    with Image.open(io.BytesIO(bytes(data))) as image:
        assert isinstance(image, TiffImagePlugin.TiffImageFile)
        image.seek(break_frame)
        (offset,), (length,) = image.tag_v2[273], image.tag_v2[279]  # StripOffsets, StripByteCounts
    if cut:
        return bytes(data[: offset + length // 2])
    data[offset : offset + length] = bytes((i * 91 + 7) % 256 for i in range(length))
    return bytes(data)


def zip_archive() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("word/document.xml", "<w:document/>")
    return buffer.getvalue()


def _cut(keep: float | int) -> Callable[[], bytes]:
    """A real 4-page PDF cut short: ``keep`` is a fraction of it, a byte count, or (negative) bytes from the end."""

    def build() -> bytes:
        whole = (CORPUS / "pdflatex-4-pages.pdf").read_bytes()
        end = int(len(whole) * keep) if isinstance(keep, float) else keep % len(whole)
        return whole[:end]

    return build


def _corpus(name: str) -> Callable[[], bytes]:
    return lambda: (CORPUS / name).read_bytes()


def _document(db: Database, document_id: str) -> dict[str, Any]:
    with db.engine.connect() as conn:
        row = conn.execute(text("SELECT * FROM documents WHERE id = :id"), {"id": document_id}).mappings().one()
        return dict(row)


def assert_queue_drained(pipeline: Pipeline) -> None:
    """Nothing visible, in flight or delayed: no message keeps coming back."""
    names = [
        "ApproximateNumberOfMessages",
        "ApproximateNumberOfMessagesNotVisible",
        "ApproximateNumberOfMessagesDelayed",
    ]
    got = pipeline.sqs.get_queue_attributes(QueueUrl=pipeline.queue_url, AttributeNames=names)["Attributes"]
    assert {k: int(v) for k, v in got.items()} == dict.fromkeys(names, 0)


def drain(pipeline: Pipeline) -> None:
    """Deliver every message to the transcribe function; a hopeless page must never be handed back for redelivery
    (the queue would hold it until its DLQ), so every batch is acknowledged in full."""
    responses = pipeline.run_until_idle()
    assert [f for r in responses for f in r["batchItemFailures"]] == []
    assert_queue_drained(pipeline)


@dataclass(frozen=True)
class Invoked:
    """An invocation in a process of its own: the handler's response, and the peak RSS (KiB) of that process and of
    the render processes it ended (its own, not any other test's: ``wait4`` reports the one process tree)."""

    response: dict[str, Any]
    peak_rss_kb: int


def invoke_in_own_process(pipeline: Pipeline, function: str, event: dict[str, Any]) -> Invoked:
    """Run one invocation in a fresh process (a new execution environment), so that its memory can be measured."""
    process = pipeline.start_in_new_environment(function, event, timeout=60)
    assert process.stdout is not None
    guard = threading.Timer(120, process.kill)  # a hung process fails the test, it does not hang it
    guard.start()
    try:
        output = process.stdout.read()
        _, status, usage = os.wait4(process.pid, 0)
    finally:
        guard.cancel()
    process.returncode = os.waitstatus_to_exitcode(status)
    assert process.returncode == 0, output[-2000:]
    return Invoked(json.loads(output.strip().splitlines()[-1]), usage.ru_maxrss)  # ru_maxrss: KiB on Linux


# Upload: hopeless documents fail at once, with the reason


HOPELESS: list[Any] = [
    pytest.param("empty.pdf", lambda: b"", "the file is empty (0 bytes)", id="zero-bytes"),
    pytest.param("cut.pdf", _cut(9), "could not be read", id="pdf-cut-after-the-header"),
    pytest.param("cut.pdf", _cut(0.01), "could not be read", id="pdf-cut-at-1pc"),
    pytest.param("cut.pdf", _cut(0.25), "could not be read", id="pdf-cut-at-25pc"),
    pytest.param("cut.pdf", _cut(0.5), "could not be read", id="pdf-cut-at-50pc"),
    pytest.param("cut.pdf", _cut(0.9), "could not be read", id="pdf-cut-at-90pc"),
    pytest.param("cut.pdf", _cut(-40), "could not be read", id="pdf-cut-in-its-trailer"),
    pytest.param(
        "notes.pdf", lambda: b"Meeting notes, definitely a PDF\n" * 40, "unsupported file type", id="text-renamed-pdf"
    ),
    pytest.param(
        "page.pdf",
        lambda: b"<!DOCTYPE html><html><body><h1>Login</h1></body></html>",
        "unsupported file type",
        id="html",
    ),
    pytest.param(
        "page.pdf",
        lambda: b"<html><body>Get %PDF-1.7 files here</body></html>",
        "could not be read",
        id="html-mentioning-pdf-header",
    ),
    pytest.param("archive.pdf", zip_archive, "unsupported file type", id="zip"),
    pytest.param("scan.png", lambda: b"\x7fELF\x02\x01\x01\x00" + b"\x00" * 4096, "unsupported file type", id="elf"),
    pytest.param("locked.pdf", _corpus("libreoffice-writer-password.pdf"), "password-protected", id="encrypted-pdf"),
    pytest.param(
        "bad.png",
        lambda: b"\x89PNG\r\n\x1a\n" + b"garbage" * 10,
        "the image could not be read",
        id="png-signature-then-garbage",
    ),
    pytest.param(
        "bad.webp",
        lambda: b"RIFF\x10\x00\x00\x00WEBPVP8 " + b"\x00" * 20,
        "the image could not be read",
        id="webp-header-then-garbage",
    ),
    pytest.param(
        "cut.tiff",
        lambda: tiff_frames(break_frame=1, cut=True),
        "the image could not be read",
        id="tiff-cut-in-frame-2",
    ),
    pytest.param(
        "none.pdf",
        lambda: pdf_of(CATALOG, b"<< /Type /Pages /Kids [] /Count 0 >>"),
        "the PDF has no pages",
        id="pdf-without-pages",
    ),
    pytest.param(
        "loop.pdf",
        lambda: pdf_of(CATALOG, b"<< /Type /Pages /Kids [2 0 R] /Count 1 >>"),
        "the PDF has no pages that load (it claims 1)",
        id="pdf-page-tree-that-contains-itself",
    ),
    pytest.param(
        "lying.pdf",
        lambda: lying_count_pdf(400),
        "the PDF's page tree claims 400 pages but only 1 loads: it is damaged or crafted",
        id="one-page-pdf-whose-count-says-400",
    ),
    pytest.param(
        "dangling.pdf",
        lambda: pdf_of(
            CATALOG,
            b"<< /Type /Pages /Kids [3 0 R 9 0 R] /Count 2 >>",
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] >>",
        ),
        "the PDF's page tree claims 2 pages but only 1 loads",
        id="pdf-whose-last-page-dangles",
    ),
    pytest.param(
        "blank.pdf",
        lambda: blank_pdf(2000),
        "the document has 2000 pages; the limit is MAX_PAGES=500",
        id="2000-blank-pages",
    ),
    pytest.param(
        "bomb.pdf",
        lambda: page_tree_bomb(100_000),
        "the document has 100000 pages; the limit is MAX_PAGES=500",
        id="100000-page-tree",
    ),
    pytest.param(
        "huge.png",
        lambda: bilevel_png(20_000, 20_000),
        "20000 x 20000 pixels (400.0 megapixels); the limit is MAX_IMAGE_PIXELS=60000000",
        id="20000x20000-png",
    ),
]


@pytest.mark.parametrize(("name", "build", "reason"), HOPELESS)
@pytest.mark.filterwarnings("ignore:Corrupt EXIF data:UserWarning")  # Pillow, reading the cut TIFF's tags
def test_a_hopeless_upload_fails_the_document_with_a_clear_reason(
    pipeline: Pipeline,
    db: Database,
    fake_provider: FakeChatServer,
    name: str,
    build: Callable[[], bytes],
    reason: str,
) -> None:
    # Given a hostile file dropped into uploads/
    data = build()
    # When the upload function receives its S3 notification (it returns normally: S3 would retry a raise)
    [doc] = pipeline.upload(f"uploads/{name}", data)["documents"]
    # Then the document is FAILED with a reason that says what is wrong (and any limit, by its setting)
    assert doc["status"] == "FAILED" and reason in doc["error"]
    row = _document(db, doc["document_id"])
    assert (row["status"], row["error"], row["page_count"]) == ("FAILED", doc["error"], 0)
    # And there is no job, no message, no model call: nothing that could loop
    assert page_rows(db, doc["document_id"]) == []
    assert pipeline.receive_all() == []
    assert fake_provider.calls == 0


def test_the_same_hostile_object_delivered_again_is_recognised_not_reprocessed(
    pipeline: Pipeline, db: Database
) -> None:
    # Given a hostile upload already rejected
    event = pipeline.put("uploads/again.pdf", _cut(0.5)())
    [first] = upload_app.handler(event, LambdaContext(60))["documents"]
    # When S3 delivers the notification again
    [second] = upload_app.handler(event, LambdaContext(60))["documents"]
    # Then it is a duplicate of the FAILED document, not a second document
    assert (first["status"], second["status"], second["document_id"]) == ("FAILED", "DUPLICATE", first["document_id"])
    with db.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM documents")).scalar_one() == 1


# Bombs, measured in their own process


@pytest.mark.parametrize(
    ("name", "build", "reason"),
    [
        pytest.param(
            "huge.png", lambda: bilevel_png(20_000, 20_000), "MAX_IMAGE_PIXELS=60000000", id="20000x20000-png"
        ),
        pytest.param("bomb.pdf", lambda: page_tree_bomb(100_000), "MAX_PAGES=500", id="100000-page-tree"),
        pytest.param(
            "objects.pdf",
            lambda: object_stream_bomb(1536),
            "could not be opened within RENDER_MEMORY_LIMIT_MB=",
            id="page-tree-in-an-object-stream-of-1.5-GiB",
        ),
        pytest.param(
            "xref.pdf",
            lambda: xref_stream_bomb(1536),
            "could not be opened within RENDER_MEMORY_LIMIT_MB=",
            id="cross-reference-stream-of-1.5-GiB",
        ),
        pytest.param(
            "frames.tiff",
            lambda: many_frame_tiff(100_000),
            "the document has more than 500 pages; the limit is MAX_PAGES=500",
            id="100000-frame-tiff",
        ),
    ],
)
def test_an_upload_bomb_is_refused_within_bounded_memory(
    pipeline: Pipeline, db: Database, name: str, build: Callable[[], bytes], reason: str
) -> None:
    # Given a bomb in uploads/ (400 megapixels in 50 KB; 100,000 pages in 600 KB; a page tree in an object stream, or
    # a cross-reference stream, inflating to 1.5 GiB from 1.5 MB; 100,000 TIFF frames in 10 MB)
    event = pipeline.put(f"uploads/{name}", build())
    # When the upload function handles it in its own execution environment
    invoked = invoke_in_own_process(pipeline, "upload", event)
    [doc] = invoked.response["documents"]
    # Then the document is refused with the limit named, and the process never came near the bomb's size
    assert doc["status"] == "FAILED" and reason in doc["error"]
    assert invoked.peak_rss_kb < MEMORY_BOUND_KB
    assert pipeline.receive_all() == []


@pytest.mark.parametrize(
    ("name", "build"),
    [
        pytest.param(
            "wide.pdf",
            lambda: one_page_pdf(b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 14400 14400] >>"),
            id="14400pt-square-page",
        ),
        pytest.param(
            "unit.pdf",
            lambda: one_page_pdf(b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 14400 14400] /UserUnit 75000 >>"),
            id="page-with-a-huge-user-unit",
        ),
        pytest.param(
            "box.pdf",
            lambda: one_page_pdf(b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 1e30 1e30] >>"),
            id="absurd-media-box",
        ),
        pytest.param("big.png", lambda: bilevel_png(7745, 7745), id="60-megapixel-png-just-under-the-limit"),
    ],
)
def test_a_huge_page_renders_bounded_to_the_long_edge_cap(
    pipeline: Pipeline, db: Database, fake_provider: FakeChatServer, name: str, build: Callable[[], bytes]
) -> None:
    # Given a page that would be gigapixels at the render DPI, accepted at upload
    [doc] = pipeline.upload(f"uploads/{name}", build())["documents"]
    assert doc["status"] == "PROCESSING" and doc["pages"] == 1
    [message] = pipeline.receive_all()
    # When the transcribe function handles the page in its own execution environment
    invoked = invoke_in_own_process(pipeline, "transcribe", sqs_event([message], pipeline.queue_arn))
    response = invoked.response
    # Then the page is COMPLETED from an image no larger than the long-edge cap, in bounded memory
    assert response["batchItemFailures"] == []
    [page] = page_rows(db, doc["document_id"])
    assert page["status"] == "COMPLETED" and page["result_text"]
    [request] = fake_provider.requests
    url = request["messages"][0]["content"][1]["image_url"]["url"]
    with Image.open(io.BytesIO(base64.b64decode(url.partition(",")[2]))) as image:
        assert 0 < max(image.size) <= LONG_EDGE
    assert invoked.peak_rss_kb < MEMORY_BOUND_KB


def test_the_transcribe_function_checks_the_pixel_limit_again_before_decoding(
    pipeline: Pipeline, db: Database, fake_provider: FakeChatServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a 400-megapixel PNG accepted while the limit was higher, and the limit since lowered to the default
    monkeypatch.setenv("MAX_IMAGE_PIXELS", "500000000")
    get_settings.cache_clear()
    shutdown_runtime()
    [doc] = pipeline.upload("uploads/accepted-bomb.png", bilevel_png(20_000, 20_000))["documents"]
    assert doc["status"] == "PROCESSING"
    [message] = pipeline.receive_all()
    monkeypatch.delenv("MAX_IMAGE_PIXELS")
    get_settings.cache_clear()
    shutdown_runtime()
    # When the transcribe function handles the page in its own execution environment
    invoked = invoke_in_own_process(pipeline, "transcribe", sqs_event([message], pipeline.queue_arn))
    response = invoked.response
    # Then the page FAILED from the image's header, naming the limit, without decoding it or calling the model
    assert response["batchItemFailures"] == []
    [page] = page_rows(db, doc["document_id"])
    assert (page["status"], page["attempts"]) == ("FAILED", 1)
    assert "20000 x 20000 pixels" in page["error"] and "MAX_IMAGE_PIXELS=60000000" in page["error"]
    assert fake_provider.calls == 0
    assert invoked.peak_rss_kb < MEMORY_BOUND_KB


def test_a_decompression_bomb_page_fails_with_the_memory_limit_named_and_the_batch_goes_on(
    pipeline: Pipeline, db: Database, fake_provider: FakeChatServer, monkeypatch: pytest.MonkeyPatch, corpus: Path
) -> None:
    # Given a 66 KB PDF whose one page inflates to 2.5 GB of content (fine at upload: its headers are valid), and
    # a normal document, in one batch, with the render processes limited to 512 MB each
    monkeypatch.setenv("RENDER_MEMORY_LIMIT_MB", "512")
    get_settings.cache_clear()
    shutdown_runtime()
    [bomb] = pipeline.upload("uploads/content-bomb.pdf", decompression_bomb(stream_mib=64, references=40))["documents"]
    [fine] = pipeline.upload("uploads/fine.pdf", (corpus / "pdflatex-4-pages.pdf").read_bytes())["documents"]
    assert (bomb["status"], fine["status"]) == ("PROCESSING", "PROCESSING")
    messages = pipeline.receive_all()
    assert len(messages) == 5
    # When the transcribe function handles the batch in its own execution environment
    invoked = invoke_in_own_process(pipeline, "transcribe", sqs_event(messages, pipeline.queue_arn))
    response = invoked.response
    # Then the function lived and reported nothing for redelivery: the bomb's page FAILED once, naming the limit
    assert response["batchItemFailures"] == []
    [page] = page_rows(db, bomb["document_id"])
    assert (page["status"], page["attempts"]) == ("FAILED", 1)
    assert "could not be rendered within RENDER_MEMORY_LIMIT_MB=512" in page["error"], page["error"]
    assert _document(db, bomb["document_id"])["status"] == "FAILED"
    # And the other document's pages were transcribed, the bomb never reaching the model
    assert [p["status"] for p in page_rows(db, fine["document_id"])] == ["COMPLETED"] * 4
    assert fake_provider.calls == 4
    # And no process of the environment came near the bomb's size (the render process stopped at its limit)
    assert invoked.peak_rss_kb < MEMORY_BOUND_KB


# Accepted at upload (the headers are fine), hopeless at transcription: the page fails, once, with the reason

PAGE_FAILURES: list[Any] = [
    pytest.param(
        "body.jpg",
        lambda: jpeg_with_corrupt_body(truncate=False),
        ["the image could not be read"],
        id="jpeg-with-a-garbage-body",
    ),
    pytest.param(
        "cut.jpg",
        lambda: jpeg_with_corrupt_body(truncate=True),
        ["the image could not be read: image file is truncated"],
        id="jpeg-cut-after-its-header",
    ),
    pytest.param(
        "pixels.png", png_with_corrupt_pixels, ["the image could not be read"], id="png-with-garbage-pixel-data"
    ),
    pytest.param(
        "frames.tiff",
        lambda: tiff_frames(break_frame=1),
        [None, "the image could not be read", None],
        id="tiff-with-a-broken-second-frame",
    ),
    pytest.param(
        "dangling.pdf",
        lambda: pdf_of(
            CATALOG,
            b"<< /Type /Pages /Kids [9 0 R 3 0 R] /Count 2 >>",
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] >>",
        ),
        ["page 1 could not be rendered", None],
        id="pdf-whose-first-page-dangles",
    ),
]


@pytest.mark.parametrize(("name", "build", "page_reasons"), PAGE_FAILURES)
def test_a_page_that_cannot_be_rendered_fails_with_a_reason_and_does_not_loop(
    pipeline: Pipeline,
    db: Database,
    fake_provider: FakeChatServer,
    name: str,
    build: Callable[[], bytes],
    page_reasons: list[str | None],
) -> None:
    # Given a file whose headers are valid (the upload accepts it) but whose page data is broken
    [doc] = pipeline.upload(f"uploads/{name}", build())["documents"]
    assert doc["status"] == "PROCESSING" and doc["pages"] == len(page_reasons)
    # When the queue is drained through the transcribe function
    drain(pipeline)
    # Then each broken page is FAILED on its first attempt, saying it could not be rendered and why;
    # the others are COMPLETED; the model was only asked about pages that rendered
    pages = page_rows(db, doc["document_id"])
    for page, reason in zip(pages, page_reasons, strict=True):
        if reason is None:
            assert page["status"] == "COMPLETED" and page["result_text"]
        else:
            assert (page["status"], page["attempts"]) == ("FAILED", 1)
            assert page["error"].startswith("the page could not be rendered: ") and reason in page["error"]
    assert fake_provider.calls == page_reasons.count(None)
    # And the document is finished, PARTIAL or FAILED, with a transcript that names the failures
    markdown, js = pipeline.transcript(doc["document_id"])
    assert js["status"] == ("PARTIAL" if None in page_reasons else "FAILED")
    assert "could not be rendered" in markdown


def test_an_object_deleted_before_the_upload_function_runs_fails_the_document(pipeline: Pipeline, db: Database) -> None:
    # Given an S3 notification for an object that was deleted before the upload function got to it
    event = pipeline.put("uploads/gone.pdf", CORPUS / "minimal-document.pdf")
    pipeline.s3.delete_object(Bucket=pipeline.bucket, Key="uploads/gone.pdf")
    # When the upload function handles the notification
    [doc] = upload_app.handler(event, LambdaContext(60))["documents"]
    # Then it returns normally with a FAILED document that says the object is missing, and queues nothing
    assert doc["status"] == "FAILED" and doc["error"].endswith("/uploads/gone.pdf no longer exists")
    assert page_rows(db, doc["document_id"]) == [] and pipeline.receive_all() == []


def test_a_source_deleted_before_transcription_fails_its_pages_without_looping(
    pipeline: Pipeline, db: Database, fake_provider: FakeChatServer
) -> None:
    # Given an accepted 4-page document whose object is then deleted from the bucket
    [doc] = pipeline.upload("uploads/vanishing.pdf", CORPUS / "pdflatex-4-pages.pdf")["documents"]
    pipeline.s3.delete_object(Bucket=pipeline.bucket, Key="uploads/vanishing.pdf")
    # When the queue is drained
    drain(pipeline)
    # Then every page is FAILED once, saying the source is gone, and no model call was made
    pages = page_rows(db, doc["document_id"])
    assert [(p["status"], p["attempts"]) for p in pages] == [("FAILED", 1)] * 4
    assert all(p["error"].startswith("the source document is gone") for p in pages)
    assert fake_provider.calls == 0


def test_a_source_overwritten_with_junk_fails_its_pages_without_looping(
    pipeline: Pipeline, db: Database, fake_provider: FakeChatServer
) -> None:
    # Given an accepted PDF whose object is then replaced by HTML (the bucket is not versioned)
    [doc] = pipeline.upload("uploads/swapped.pdf", CORPUS / "pdflatex-4-pages.pdf")["documents"]
    pipeline.s3.put_object(Bucket=pipeline.bucket, Key="uploads/swapped.pdf", Body=b"<html>gotcha</html>")
    # When the queue is drained
    drain(pipeline)
    # Then every page is FAILED once, saying that its file was replaced: the junk is never read as the document
    pages = page_rows(db, doc["document_id"])
    assert [(p["status"], p["attempts"]) for p in pages] == [("FAILED", 1)] * 4
    assert all(p["error"].endswith("uploads/swapped.pdf was replaced after it was uploaded") for p in pages), pages
    assert fake_provider.calls == 0


# Keys as people name files (S3 URL-encodes them in the event, spaces as '+')


@pytest.mark.parametrize(
    "key",
    [
        "uploads/résumé 2024 \u2013 final.pdf",
        "uploads/📄 scan 🔥 (2).pdf",
        "uploads/a+b=c&d.pdf",
        "uploads/100% real; [copy] {1}.pdf",
        "uploads/  spaced   out  .pdf",
        "uploads/日本語/サブ フォルダ/ファイル.pdf",
        "uploads/~!@#$^*()_-'.pdf",
        "uploads/%2B%20already-encoded%2F.pdf",
    ],
)
def test_keys_with_spaces_unicode_and_plus_go_end_to_end(
    pipeline: Pipeline, db: Database, fake_provider: FakeChatServer, key: str
) -> None:
    # Given a one-page PDF under a key people actually produce
    [doc] = pipeline.upload(key, CORPUS / "minimal-document.pdf")["documents"]
    # Then the upload function decoded the key exactly and accepted the document
    assert (doc["status"], doc["key"], doc["pages"]) == ("PROCESSING", key, 1)
    assert _document(db, doc["document_id"])["object_key"] == key
    # When the queue is drained
    drain(pipeline)
    # Then the page was read from that very object and transcribed, and the transcript written
    [page] = page_rows(db, doc["document_id"])
    assert page["status"] == "COMPLETED" and page["result_text"]
    _, js = pipeline.transcript(doc["document_id"])
    assert js["status"] == "COMPLETED"
