"""Pages' completions written together: the answers of a batch come back within milliseconds of each other, and each
page's write waited for the one before it (a round trip and a commit each, the event loop held meanwhile)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from pagescribe.domain import DocumentProgress, PageEnd
from pagescribe.store.ports import Store

log = logging.getLogger(__name__)


@dataclass
class _Waiting:
    end: PageEnd
    written: asyncio.Future[DocumentProgress | None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class Completions:
    """Writes pages' completions, off the event loop: a completion made while none is being written goes at once;
    those made while one is being written wait for it, then go together, a document's in one transaction
    (``Store.complete_jobs``). When a write of several fails, each is written again on its own, so that one page's
    failure stays its own."""

    def __init__(self, db: Store) -> None:
        self._db = db
        self._waiting: list[_Waiting] = []
        self._writer: asyncio.Task[None] | None = None

    async def complete(self, end: PageEnd) -> DocumentProgress | None:
        """The page's completion written under its lease: its document's progress, or None when the lease was lost."""
        waiting = _Waiting(end)
        self._waiting.append(waiting)
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write())
        return await asyncio.shield(waiting.written)  # a page let go of still has its write, as it would alone

    async def _write(self) -> None:
        while self._waiting:
            group = self._next_group()
            try:
                progress = await asyncio.to_thread(self._db.complete_jobs, [waiting.end for waiting in group])
            except Exception as exc:
                await self._write_apart(group, exc)
            else:
                for waiting, written in zip(group, progress, strict=True):
                    waiting.written.set_result(written)

    def _next_group(self) -> list[_Waiting]:
        """The waiting completions of the first one's document, in the order they came; the others wait on."""
        document_id = self._waiting[0].end.job.document_id
        group = [waiting for waiting in self._waiting if waiting.end.job.document_id == document_id]
        self._waiting = [waiting for waiting in self._waiting if waiting.end.job.document_id != document_id]
        return group

    async def _write_apart(self, group: list[_Waiting], exc: Exception) -> None:
        """After a failed write: a page written alone has its error; several are written again, each on its own."""
        if len(group) == 1:
            group[0].written.set_exception(exc)
            return
        ids = {"document_id": group[0].end.job.document_id, "job_ids": [waiting.end.job.job_id for waiting in group]}
        log.warning("%d completions written together failed (%s); writing each on its own", len(group), exc, extra=ids)
        for waiting in group:
            await self._write_one(waiting)

    async def _write_one(self, waiting: _Waiting) -> None:
        try:
            [written] = await asyncio.to_thread(self._db.complete_jobs, [waiting.end])
        except Exception as exc:
            waiting.written.set_exception(exc)
        else:
            waiting.written.set_result(written)
