"""Downloaded source documents, on local disk across warm invocations, for the pages that read them."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator
from pathlib import Path

from pagescribe.aws import ObjectStore
from pagescribe.domain import DocumentRecord


class SourceCache:
    """Downloaded source documents, kept on local disk across warm invocations (a batch's pages usually
    share one document). Bounded by entry count, but a file a page is reading is never evicted; one
    download per document at a time, which every page waiting for it sees end at once."""

    def __init__(self, objects: ObjectStore, *, max_entries: int = 4) -> None:
        self._objects = objects
        self._max_entries = max_entries
        self._root = Path(tempfile.mkdtemp(prefix="pagescribe-sources-"))
        self._entries: OrderedDict[str, Path] = OrderedDict()
        self._fetching: dict[str, asyncio.Future[Path]] = {}
        self._in_use: Counter[str] = Counter()

    @staticmethod
    def _key(document: DocumentRecord) -> str:
        return f"{document.document_id}-{document.etag}-{document.version_id}"

    @contextlib.asynccontextmanager
    async def use(self, document: DocumentRecord) -> AsyncIterator[Path]:
        """The document's local copy, kept on disk until the block ends (pages of more documents than the
        cache holds run concurrently in one batch: evicting a file another page reads would fail that page)."""
        key = self._key(document)
        self._in_use[key] += 1
        try:
            yield await self.path_for(document)
        finally:
            self._in_use[key] -= 1
            if self._in_use[key] <= 0:
                del self._in_use[key]
            self._evict()

    def _evict(self) -> None:
        idle = [key for key in self._entries if key not in self._in_use]
        for key in idle[: max(0, len(self._entries) - self._max_entries)]:
            self._entries.pop(key).unlink(missing_ok=True)

    async def path_for(self, document: DocumentRecord) -> Path:
        key = self._key(document)
        cached = self._entries.get(key)
        if cached is not None and cached.exists():
            self._entries.move_to_end(key)
            return cached
        fetching = self._fetching.get(key)
        if fetching is None:  # the first page to ask downloads it; the others wait for that download, not in turn
            fetching = asyncio.ensure_future(self._download(document, key))
            self._fetching[key] = fetching
            fetching.add_done_callback(lambda _: self._fetching.pop(key, None))
        return await asyncio.shield(fetching)  # a page cancelled meanwhile does not cancel the others' download

    async def _download(self, document: DocumentRecord, key: str) -> Path:
        path = self._root / f"{len(self._entries)}-{document.document_id}"
        await asyncio.to_thread(
            self._objects.download,
            document.bucket,
            document.object_key,
            path,
            version_id=document.version_id or None,
            etag=document.etag or None,
        )
        self._entries[key] = path
        self._evict()
        return path

    def close(self) -> None:
        shutil.rmtree(self._root, ignore_errors=True)
