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


def padded_flate(prefix: bytes, unit: bytes, count: int) -> bytes:
    """A zlib stream of ``prefix``, then ``unit`` ``count`` times, built in milliseconds however large it inflates:
    each part is compressed after a full flush (which resets the compressor's window), so every unit's compressed
    block is the same bytes, written ``count`` times; the checksum is summed over the parts."""
    compressor = zlib.compressobj(9)
    head = compressor.compress(prefix) + compressor.flush(zlib.Z_FULL_FLUSH)
    block = compressor.compress(unit) + compressor.flush(zlib.Z_FULL_FLUSH)
    checksum = zlib.adler32(prefix)
    for _ in range(count):
        checksum = zlib.adler32(unit, checksum)
    last = zlib.compressobj(9)
    tail = last.flush()[2:-4]  # an empty final block, without its own zlib header and checksum
    return head + block * count + tail + struct.pack(">I", checksum)


def _xref_stream_pdf(objects: dict[int, bytes], compressed: dict[int, tuple[int, int]], padding_mib: int) -> bytes:
    """A PDF 1.5 whose cross-reference is a stream: ``objects`` are written whole, ``compressed`` maps an object
    number to (its object stream's number, its index there). The xref stream's entries are followed by
    ``padding_mib`` MiB of zeros in the same Flate stream."""
    out = io.BytesIO()
    out.write(b"%PDF-1.5\n")
    offsets: dict[int, int] = {}
    for number, body in sorted(objects.items()):
        offsets[number] = out.tell()
        out.write(b"%d 0 obj\n%s\nendobj\n" % (number, body))
    xref_number = max([*objects, *compressed]) + 1
    offsets[xref_number] = out.tell()
    rows = []
    for number in range(xref_number + 1):
        if number in offsets:
            rows.append(struct.pack(">BIH", 1, offsets[number], 0))
        elif number in compressed:
            rows.append(struct.pack(">BIH", 2, *compressed[number]))
        else:
            rows.append(struct.pack(">BIH", 0, 0, 0xFFFF))
    data = padded_flate(b"".join(rows), b"\x00" * (1 << 20), padding_mib)
    out.write(
        b"%d 0 obj\n<< /Type /XRef /Size %d /W [1 4 2] /Root 1 0 R /Filter /FlateDecode /Length %d >>\nstream\n"
        % (xref_number, xref_number + 1, len(data))
    )
    out.write(data + b"\nendstream\nendobj\n")
    out.write(b"startxref\n%d\n%%%%EOF\n" % offsets[xref_number])
    return out.getvalue()


def object_stream_bomb(inflated_mib: int) -> bytes:
    """A one-page PDF whose page tree lives in an object stream that inflates to ``inflated_mib`` MiB: pdfium inflates
    the whole stream to find the page tree when it counts the pages (1,536 MiB in about 1.5 MB)."""
    header = b"2 0 "
    tree = b"<< /Type /Pages /Kids [3 0 R] /Count 1 >> "
    data = padded_flate(header + tree, b" " * (1 << 20), inflated_mib)
    stream = b"<< /Type /ObjStm /N 1 /First %d /Filter /FlateDecode /Length %d >>\nstream\n%s\nendstream" % (
        len(header),
        len(data),
        data,
    )
    return _xref_stream_pdf(
        {1: CATALOG, 3: b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] >>", 4: stream}, {2: (4, 0)}, 0
    )


def xref_stream_bomb(inflated_mib: int) -> bytes:
    """A one-page PDF whose cross-reference stream inflates to ``inflated_mib`` MiB: pdfium inflates it whole to
    open the document."""
    return _xref_stream_pdf(
        {
            1: CATALOG,
            2: b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
            3: b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] >>",
        },
        {},
        inflated_mib,
    )


def lying_count_pdf(count: int) -> bytes:
    """One page whose page tree says it has ``count`` (a few hundred bytes)."""
    return pdf_of(
        CATALOG,
        b"<< /Type /Pages /Kids [3 0 R] /Count %d >>" % count,
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] >>",
    )


def many_frame_tiff(frames: int) -> bytes:
    """A little-endian TIFF of ``frames`` 1 x 1 white bilevel frames, about 100 bytes each (100,000 in 10 MB)."""
    tags = 8
    ifd_size = 2 + 12 * tags + 4
    out = bytearray(b"II*\x00" + struct.pack("<I", 8))
    pixel_offset = 8 + frames * ifd_size
    for frame in range(frames):
        next_ifd = 8 + (frame + 1) * ifd_size if frame + 1 < frames else 0
        entries = [
            (256, 3, 1, 1),  # ImageWidth
            (257, 3, 1, 1),  # ImageLength
            (258, 3, 1, 1),  # BitsPerSample
            (259, 3, 1, 1),  # Compression: none
            (262, 3, 1, 0),  # PhotometricInterpretation: white is zero
            (273, 4, 1, pixel_offset),  # StripOffsets
            (278, 3, 1, 1),  # RowsPerStrip
            (279, 4, 1, 1),  # StripByteCounts
        ]
        out += struct.pack("<H", tags)
        for tag, kind, count, value in entries:
            out += struct.pack("<HHII", tag, kind, count, value)
        out += struct.pack("<I", next_ifd)
    out += b"\x00"
    return bytes(out)
