"""Hostile files built in a fraction of a second, shared by the rendering and hostile-input tests."""

from __future__ import annotations

import io
import struct
import zlib


def pdf_of(*objects: bytes) -> bytes:
    """A syntactically valid PDF from numbered objects (1 is the catalog), with a correct xref table."""
    out = io.BytesIO()
    out.write(b"%PDF-1.7\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(out.tell())
        out.write(b"%d 0 obj\n%s\nendobj\n" % (number, body))
    xref = out.tell()
    out.write(b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1))
    out.write(b"".join(b"%010d 00000 n \n" % offset for offset in offsets))
    out.write(b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref))
    return out.getvalue()


CATALOG = b"<< /Type /Catalog /Pages 2 0 R >>"


def one_page_pdf(page: bytes) -> bytes:
    return pdf_of(CATALOG, b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>", page)


def page_with_contents(contents: bytes, *streams: bytes) -> bytes:
    """A one-page Letter PDF whose /Contents is ``contents``; ``streams`` are objects 4, 5, …"""
    return pdf_of(
        CATALOG,
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents %s >>" % contents,
        *streams,
    )


def decompression_bomb(stream_mib: int, references: int) -> bytes:
    """One page whose content is a Flate stream of ``stream_mib`` MiB of spaces, listed ``references`` times in the
    page's /Contents array. pdfium inflates every entry and joins them into one buffer, so 64 MiB x 40 (a 66 KB
    file) takes about 2.7 GB of memory to load the page in-process."""
    compressor = zlib.compressobj(9)
    chunk = b" " * (1 << 20)
    data = b"".join(compressor.compress(chunk) for _ in range(stream_mib)) + compressor.flush()
    stream = b"<< /Length %d /Filter /FlateDecode >>\nstream\n%s\nendstream" % (len(data), data)
    return page_with_contents(b"[" + b"4 0 R " * references + b"]", stream)


def png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def bilevel_png(width: int, height: int) -> bytes:
    """A white 1-bit PNG of any size, streamed row by row: 20,000 x 20,000 is 50 KB on disk, never 400 MB in
    memory, until something decodes it."""
    compressor = zlib.compressobj(9)
    row = b"\x00" + b"\xff" * ((width + 7) // 8)  # filter byte "none", then the packed pixels
    idat = b"".join(compressor.compress(row) for _ in range(height)) + compressor.flush()
    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", header) + png_chunk(b"IDAT", idat) + png_chunk(b"IEND", b"")
