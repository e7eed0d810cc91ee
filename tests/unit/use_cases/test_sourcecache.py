"""The source cache: a batch's pages share one download of their document."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from pagescribe.aws import ObjectStore
from pagescribe.domain import DocumentRecord, DocumentStatus
from pagescribe.transcription.sourcecache import SourceCache

from tests.support import CORPUS
from tests.unit.use_cases.conftest import BUCKET


class CountedObjects(ObjectStore):
    """S3 (moto, in process) with its downloads counted."""

    downloads = 0

    def download(self, bucket: str, key: str, destination: Path, **kwargs: Any) -> None:
        self.downloads += 1
        super().download(bucket, key, destination, **kwargs)


def _record(key: str, size: int) -> DocumentRecord:
    return DocumentRecord(
        "doc-1", BUCKET, key, "", "", size, "pdf", 4, DocumentStatus.PROCESSING, None, "m", None, 0, 0, None,
        None,  # type: ignore[arg-type]
        None,
    )  # fmt: skip


def test_pages_asking_for_a_document_at_once_share_one_download_and_all_get_it_together(objects: ObjectStore) -> None:
    # Given a PDF in the bucket and the cache of an environment
    body = (CORPUS / "pdflatex-4-pages.pdf").read_bytes()
    objects.put_bytes(BUCKET, "uploads/four.pdf", body, content_type="application/pdf")
    counted = CountedObjects(objects._client)
    cache = SourceCache(counted)
    document = _record("uploads/four.pdf", len(body))
    events: list[str] = []

    async def page(number: int) -> Path:
        async with cache.use(document) as path:
            events.append(f"page {number} has it")
            await asyncio.sleep(0)  # a page yields once it has the file: a page after it must not wait for that
            events.append(f"page {number} goes on")
            return path

    async def batch() -> list[Path]:
        return list(await asyncio.gather(*(page(n) for n in range(1, 5))))

    # When four pages ask for it at once
    try:
        paths = asyncio.run(batch())
        # Then it was downloaded once, every page read the same file, whole, and every page had it before any
        # page went on past its first yield (they were all woken by the one download's end, not one after another)
        assert counted.downloads == 1
        assert len(set(paths)) == 1 and paths[0].read_bytes() == body
        has, goes_on = [f"page {n} has it" for n in range(1, 5)], [f"page {n} goes on" for n in range(1, 5)]
        assert events == has + goes_on
    finally:
        cache.close()
