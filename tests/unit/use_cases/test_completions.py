"""Pages' completions written together (``Completions``), on the in-memory store: what waits for a write goes with the
next one, a document's pages apart from another's, and a page whose write fails alone fails alone."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

import pytest
from pagescribe.domain import ClaimedJob, DocumentProgress, NewDocument, PageEnd, PageOutcome
from pagescribe.transcription.completions import Completions

from tests.support.memory_store import MemoryStore

ANSWER = PageOutcome("text", "stop", 1000, 100, 0.01, "test/model", "fake", "gen-1", 50)


class HeldStore(MemoryStore):
    """Holds its first write until ``release`` is set, and notes the pages of every write."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.release = threading.Event()
        self.writes: list[list[int]] = []

    def complete_jobs(self, ends: Sequence[PageEnd]) -> list[DocumentProgress | None]:
        self.writes.append([end.job.page_number for end in ends])
        if len(self.writes) == 1:
            self.entered.set()
            assert self.release.wait(30), "the test never released the first write"
        return super().complete_jobs(ends)


class RefusingStore(MemoryStore):
    """Refuses any write that holds page ``refused``, as PostgreSQL refuses a whole transaction for one statement."""

    def __init__(self, refused: int) -> None:
        super().__init__()
        self.refused = refused
        self.writes: list[list[int]] = []

    def complete_jobs(self, ends: Sequence[PageEnd]) -> list[DocumentProgress | None]:
        self.writes.append([end.job.page_number for end in ends])
        if any(end.job.page_number == self.refused for end in ends):
            raise RuntimeError(f"page {self.refused}: value out of range")
        return super().complete_jobs(ends)


def _claimed(store: MemoryStore, pages: int) -> list[ClaimedJob]:
    new = NewDocument("bucket", f"uploads/{pages}.pdf", "etag", "", 10, "test/model")
    created = store.create_document(new, kind="pdf", pages=range(1, pages + 1))
    return list(store.claim_jobs(created.job_ids, lease_seconds=300, max_attempts=3).claimed.values())


def test_completions_made_while_one_is_written_go_together_a_document_at_a_time() -> None:
    # Given a store that holds its first write, four claimed pages of a document and one of another
    store = HeldStore()
    first, *rest = _claimed(store, 4)
    [other] = _claimed(store, 1)
    completions = Completions(store)

    async def run() -> list[DocumentProgress | None]:
        # When a page completes, and the others complete while its write is held
        writing = asyncio.create_task(completions.complete(PageEnd(first, ANSWER)))
        assert await asyncio.to_thread(store.entered.wait, 30)
        waiting = [asyncio.create_task(completions.complete(PageEnd(job, ANSWER))) for job in [*rest, other]]
        await asyncio.sleep(0)  # each has asked for its write
        store.release.set()
        return list(await asyncio.gather(writing, *waiting))

    written = asyncio.run(run())
    # Then the first went alone, the document's other three together in page order, the other document's apart
    assert store.writes == [[1], [2, 3, 4], [1]]
    assert [(p.document_id, p.pages_completed) if p else None for p in written] == [
        (first.document_id, 1),
        (first.document_id, 2),
        (first.document_id, 3),
        (first.document_id, 4),
        (other.document_id, 1),
    ]


def test_a_write_of_several_that_fails_is_made_again_page_by_page_and_fails_only_its_own_page() -> None:
    # Given a store that refuses page 3, and four pages of a document completed at once
    store = RefusingStore(refused=3)
    jobs = _claimed(store, 4)
    completions = Completions(store)

    async def run() -> list[DocumentProgress | BaseException | None]:
        tasks = [asyncio.create_task(completions.complete(PageEnd(job, ANSWER))) for job in jobs]
        return list(await asyncio.gather(*tasks, return_exceptions=True))

    written = asyncio.run(run())
    # Then the four went together, then again one by one: page 3 alone failed, the others were written
    assert store.writes == [[1, 2, 3, 4], [1], [2], [3], [4]]
    assert [p.pages_completed if isinstance(p, DocumentProgress) else p for p in written[:2]] == [1, 2]
    assert isinstance(written[2], RuntimeError) and "page 3" in str(written[2])
    assert isinstance(written[3], DocumentProgress) and written[3].pages_completed == 3


@pytest.mark.parametrize("pages", [1, 3])
def test_a_lost_lease_among_completions_is_none_for_its_page_only(pages: int) -> None:
    store = MemoryStore()
    jobs = _claimed(store, pages)
    lost = jobs[-1]._replace(lease_token="a lease that is not the page's")
    completions = Completions(store)

    async def run() -> list[DocumentProgress | None]:
        ends = [PageEnd(job, ANSWER) for job in [*jobs[:-1], lost]]
        return list(await asyncio.gather(*(completions.complete(end) for end in ends)))

    written = asyncio.run(run())
    assert [p.pages_completed if p else None for p in written] == [*range(1, pages), None]
