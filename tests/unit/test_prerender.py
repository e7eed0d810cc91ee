"""Pages rendered ahead (pagescribe.transcription.prerender), with real render processes on a real PDF."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pagescribe.domain import DocumentRecord, DocumentStatus
from pagescribe.rendering import RenderPool
from pagescribe.settings import Settings
from pagescribe.sources.documents import DocumentKind, InvalidDocumentError
from pagescribe.transcription.prerender import PageImages, following_pages, page_key

from tests.support import CORPUS

FOUR_PAGES = CORPUS / "pdflatex-4-pages.pdf"


class CountingPool(RenderPool):
    """A real render pool that counts the renders pages asked for themselves (not those done in spare time)."""

    def __init__(self) -> None:
        super().__init__(workers=2, memory_limit_mb=1024, timeout_seconds=60)
        self.page_renders: list[int] = []

    async def render(self, path: Path, kind: DocumentKind, page_number: int, **params: Any) -> Any:
        self.page_renders.append(page_number)
        return await super().render(path, kind, page_number, **params)


@pytest.fixture
def pool() -> Iterator[CountingPool]:
    pool = CountingPool()
    yield pool
    pool.close()


def _document(pages: int, requested: tuple[int, ...] | None = None) -> DocumentRecord:
    return DocumentRecord(
        "doc-1", "bucket", "uploads/four.pdf", "etag-1", "", 1, "pdf", pages, DocumentStatus.PROCESSING, None,
        "small/model", None, 0, 0, None, datetime.now(UTC), None, requested_pages=requested,
    )  # fmt: skip


def _settle(images: PageImages) -> None:
    """Wait until every page wanted ahead is rendered (the threads finish them: an event, not a guess of time)."""
    futures = list(images._entries.values())
    _done, not_done = concurrent.futures.wait(futures, timeout=120)
    assert not not_done, "the pages wanted ahead were never rendered"


def _waiting_for_the_calls(images: PageImages) -> bool:
    """Whether a render-ahead thread waits for the batch's calls to be sent (it waits a second at a time)."""
    deadline = time.monotonic() + 60  # a bound on a failing run only
    while not images._all_sent._waiters:  # type: ignore[attr-defined]
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_following_pages_are_the_next_pages_asked_for() -> None:
    # Given documents of ten pages, all or some asked for
    # When the pages after a batch's are listed
    # Then they are the next ones asked for, at most as many as kept, never past the end
    assert following_pages(_document(10), [1, 3, 2], 4) == [4, 5, 6, 7]
    assert following_pages(_document(10), [8], 4) == [9, 10]
    assert following_pages(_document(4, requested=(1, 2, 5, 9)), [2], 4) == [5, 9]
    assert following_pages(_document(10), [10], 4) == []
    # And pages a batch skipped within its range come first: the queue holds them still, the next batch likely too
    assert following_pages(_document(50), [21, *range(31, 40)], 10) == [*range(22, 31), 40]
    assert following_pages(_document(10, requested=(1, 3, 5, 7, 9)), [1, 5], 2) == [3, 7]


def test_the_pages_after_a_batch_are_rendered_ahead_and_served_to_their_claims(pool: CountingPool) -> None:
    # Given a four-page PDF whose pages are always rendered (TEXT_LAYER=off) and page 1 claimed here
    settings = Settings(text_layer="off", render_ahead_pages=10)
    images = PageImages(settings, pool)
    document = _document(4)
    images.follow(document, FOUR_PAGES, [1])
    _settle(images)

    async def claims() -> list[bytes]:
        return [(await images.render(document, FOUR_PAGES, DocumentKind.PDF, page)).data for page in (2, 3, 4)]

    # When pages 2 to 4 are claimed later
    ahead = asyncio.run(claims())
    # Then none of them waited for a render of its own, and each image is the one its own render makes
    assert pool.page_renders == []

    async def rendered_now() -> list[bytes]:
        return [(await images.render(document, FOUR_PAGES, DocumentKind.PDF, page)).data for page in (2, 3, 4)]

    assert asyncio.run(rendered_now()) == ahead
    assert pool.page_renders == [2, 3, 4]  # taken once: a second claim of a page renders it itself


def test_at_most_render_ahead_pages_are_kept(pool: CountingPool) -> None:
    # Given RENDER_AHEAD_PAGES=2 and a six-page document
    settings = Settings(text_layer="off", render_ahead_pages=2)
    images = PageImages(settings, pool)
    document = _document(6)
    # When page 1 is claimed here, Then only the next two pages are rendered ahead
    images.follow(document, FOUR_PAGES, [1])
    _settle(images)
    assert sorted(key[3] for key in images._entries) == [2, 3]
    # And when page 2 is claimed next, the page after the next two is wanted too, and every claim finds its image
    images.follow(document, FOUR_PAGES, [2])
    _settle(images)

    async def claim(page: int) -> None:
        await images.render(document, FOUR_PAGES, DocumentKind.PDF, page)

    for page in (2, 3, 4):
        asyncio.run(claim(page))
    assert pool.page_renders == []
    assert len(images._entries) == 0


def test_a_text_layer_read_ahead_serves_the_claims_text_check_and_no_image_is_rendered(pool: CountingPool) -> None:
    # Given TEXT_LAYER=auto and a born-digital PDF whose pages have usable text
    settings = Settings(text_layer="auto", render_ahead_pages=10)
    images = PageImages(settings, pool)
    document = _document(4)
    images.follow(document, FOUR_PAGES, [1])
    _settle(images)

    async def text(page: int) -> str:
        return (await images.text_layer(document, FOUR_PAGES, page)).text

    # When page 2's claim reads its text layer
    ahead = asyncio.run(text(2))
    # Then it is the page's own text, read ahead, and its image was never rendered (the text stands in for it)
    assert ahead == asyncio.run(pool.text_layer(FOUR_PAGES, 2)).text
    prepared = images._entries[("doc-1", "etag-1", "", 2)].result()
    assert prepared.rendered is None


def test_a_page_whose_ahead_render_failed_is_rendered_by_its_claim_which_meets_the_failure(
    pool: CountingPool, tmp_path: Path
) -> None:
    # Given a source that is gone by the time its pages are rendered ahead
    settings = Settings(text_layer="off", render_ahead_pages=10)
    images = PageImages(settings, pool)
    document = _document(4)
    images.follow(document, tmp_path / "gone.pdf", [1])
    _settle(images)

    async def claim() -> None:
        await images.render(document, tmp_path / "gone.pdf", DocumentKind.PDF, 2)

    # When page 2 is claimed, Then its claim renders it itself and the failure is its own render's
    with pytest.raises(InvalidDocumentError, match="the PDF could not be read"):
        asyncio.run(claim())
    assert pool.page_renders == [2]


def test_with_other_environments_at_work_the_pages_ahead_skip_what_they_will_take() -> None:
    # Given a 100-page document, RENDER_AHEAD_PAGES=10, and no render process free yet (nothing starts: the pool is
    # closed, so the test sees only what is wanted)
    closed = RenderPool(workers=1, memory_limit_mb=1024, timeout_seconds=60)
    closed.close()
    images = PageImages(Settings(text_layer="off", render_ahead_pages=10), closed)
    document = _document(100)
    # When this environment gets pages 1-10 (every page of the batch asks), then pages 41-50 (three other
    # environments took 11-40 meanwhile)
    for _ in range(10):
        images.follow(document, FOUR_PAGES, range(1, 11))
    first = sorted(key[3] for key in images._entries)
    images.follow(document, FOUR_PAGES, range(41, 51))
    # Then first the next ten pages are wanted (as if it were alone), then the ten its next batch will likely hold
    assert first == list(range(11, 21))
    assert sorted(key[3] for key in images._entries)[-10:] == list(range(81, 91))
    assert following_pages(_document(100), range(41, 51), 10, skip=30) == list(range(81, 91))


def test_the_pages_of_a_batch_rendered_ahead_are_kept_for_its_claims_while_newer_pages_are_wanted(
    pool: CountingPool,
) -> None:
    # Given RENDER_AHEAD_PAGES=2 and pages 2 and 3 rendered ahead of the batch that then claims them
    images = PageImages(Settings(text_layer="off", render_ahead_pages=2), pool)
    document = _document(6)
    images.follow(document, FOUR_PAGES, [1])
    _settle(images)
    # When a page of that batch asks for the pages after it before the other page of the batch took its image
    images.follow(document, FOUR_PAGES, [2, 3])

    async def claim(page: int) -> None:
        await images.render(document, FOUR_PAGES, DocumentKind.PDF, page)

    asyncio.run(claim(3))
    _settle(images)
    asyncio.run(claim(2))
    # Then pages 2 and 3 were served from what was rendered ahead, and the next two pages are wanted as well
    assert pool.page_renders == []
    assert sorted(key[3] for key in images._entries) == [4, 5]


def test_nothing_is_rendered_ahead_until_every_page_of_the_batch_has_sent_its_call(pool: CountingPool) -> None:
    # Given a batch of pages 1 and 2 claimed here, and the pages after them wanted once page 1 is rendered
    settings = Settings(text_layer="off", render_ahead_pages=2)
    images = PageImages(settings, pool)
    document = _document(4)
    images.hold([page_key(document, 1), page_key(document, 2)])
    images.follow(document, FOUR_PAGES, [1, 2])
    # When page 1 has sent its call and page 2 has not
    images.sent(page_key(document, 1))
    # Then the render-ahead thread waits for it, and nothing is rendered ahead
    assert _waiting_for_the_calls(images), "no render-ahead thread waited for the batch's calls"
    assert not any(future.running() or future.done() for future in images._entries.values())
    # And once page 2 has sent its call (or ended without one), pages 3 and 4 are rendered ahead
    images.sent(page_key(document, 2))
    _settle(images)
    assert sorted(key[3] for key in images._entries) == [3, 4]
    assert pool.page_renders == []
