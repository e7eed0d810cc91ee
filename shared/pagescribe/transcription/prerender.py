"""Page images for the model calls, rendered ahead: while a batch's calls are in flight, the render processes it no
longer needs render the pages that follow the batch in its documents, so that the next batch this environment gets
finds its images ready and starts its calls at once.

Rendering ahead is spare-time work and best effort. It runs in threads (the invocation's event loop ends with the
invocation; the images wait for the next one), only once every page of the batch has sent its call or ended without
one (``hold``/``sent``: the render processes' CPU would otherwise slow the sending of those calls), only while no page
waits for a render process or holds one (``RenderPool.wait_spare``), and at most ``RENDER_AHEAD_PAGES`` pages are
kept. A page that comes to be claimed here takes its image if it is ready, waits for it if it is being rendered, and
otherwise renders it itself; a page rendered ahead that fails is simply rendered again by its own claim, which meets
the failure and handles it as it would have.
A page claimed by another environment is never claimed here: its image is dropped when newer pages need the room.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
from collections import OrderedDict, deque
from collections.abc import Collection, Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pagescribe.checks import usable_text_layer
from pagescribe.domain import DocumentRecord
from pagescribe.rendering import RenderPool
from pagescribe.settings import Settings
from pagescribe.sources.documents import DocumentKind
from pagescribe.sources.pages import RenderedPage
from pagescribe.sources.textlayer import TextLayer

if TYPE_CHECKING:
    from pagescribe.grounding import PageText

log = logging.getLogger(__name__)

_SPARE_WAIT_SECONDS = 1.0  # how long a thread waits for spare time before it looks at what is wanted again
_DOCUMENTS_TRACKED = 64  # documents whose last batch here is remembered (for the stride between batches)

PageKey = tuple[str, str, str, int]  # the document's id, etag and version, and the page number


@dataclass(frozen=True)
class Prepared:
    """What a page's claim needs before its call: a PDF's text layer when TEXT_LAYER=auto reads it first (``None``
    otherwise), and its image (``None`` when that text layer is usable: the page is answered from it, unrendered)."""

    text: TextLayer | None
    rendered: RenderedPage | None


@dataclass(frozen=True)
class _Wanted:
    key: PageKey
    path: Path
    kind: DocumentKind
    page_number: int


def page_key(document: DocumentRecord, page_number: int) -> PageKey:
    return document.document_id, document.etag, document.version_id, page_number


def following_pages(document: DocumentRecord, claimed: Collection[int], count: int, *, skip: int = 0) -> list[int]:
    """The ``count`` pages of the document asked for after the first of ``claimed`` and not among them, less the
    first ``skip`` of them, in order. A standard queue keeps page order only roughly: a batch of pages 21 and 31-39
    leaves 22-30 in the queue, and the next batch likely holds them, not 40-49."""
    first, taken = min(claimed), set(claimed)
    asked = sorted(document.requested_pages) if document.requested_pages is not None else None
    following = (page for page in (asked or range(first + 1, document.page_count + 1)) if page > first)
    return list(itertools.islice((page for page in following if page not in taken), skip, skip + count))


class PageImages:
    """Renders the pages of claimed jobs, and the pages after them ahead of their claims (see the module's text)."""

    def __init__(self, settings: Settings, renderer: RenderPool) -> None:
        self._renderer = renderer
        self._ahead = settings.render_ahead_pages
        self._reads_text = settings.text_layer == "auto"
        self._params: dict[str, Any] = {
            "dpi": settings.render_dpi,
            "max_long_edge": settings.render_max_long_edge,
            "image_format": settings.render_format,
            "max_image_pixels": settings.max_image_pixels,
            "orient": settings.detect_orientation,
            "blank_below": settings.flag_blank_render_threshold,
        }
        self._lock = threading.Lock()
        self._held: set[PageKey] = set()  # the batch's pages that have not sent their call yet
        self._all_sent = threading.Condition(self._lock)
        self._calls_out: asyncio.Event | None = None  # the same, for the batch's event loop (see after_calls)
        self._entries: OrderedDict[PageKey, Future[Prepared]] = OrderedDict()
        self._wanted: deque[_Wanted] = deque()
        self._threads = 0
        self._strides: OrderedDict[str, tuple[int, int]] = (
            OrderedDict()
        )  # a document's last batch here: first page, skip

    async def text_layer(self, document: DocumentRecord, source: Path, page_number: int) -> TextLayer:
        """The page's text layer: read ahead with its image, or read now."""
        prepared = await self._ready(page_key(document, page_number), keep=True)
        if prepared is not None and prepared.text is not None:
            return prepared.text
        return await self._renderer.text_layer(source, page_number)

    async def render(
        self, document: DocumentRecord, source: Path, kind: DocumentKind, page_number: int
    ) -> RenderedPage:
        """The page's image: rendered ahead (with its words, where it has a text layer), or rendered now, without them:
        placing them is most of a render's time, and the page's call need not wait for it (``words``)."""
        prepared = await self._ready(page_key(document, page_number), keep=False)
        if prepared is not None and prepared.rendered is not None:
            return prepared.rendered
        return await self._renderer.render(source, kind, page_number, **self._params)

    async def words(self, source: Path, page_number: int) -> PageText:
        """The words of a page rendered now (``render``) placed on its image: the evidence its answer is grounded to."""
        scale = {"dpi": self._params["dpi"], "max_long_edge": self._params["max_long_edge"]}
        return await self._renderer.words(source, page_number, **scale)

    def hold(self, pages: Iterable[PageKey]) -> None:
        """A new batch's pages (on the batch's event loop): nothing is rendered ahead until each has sent its call or
        ended (``sent``), and no page image is stored (``after_calls``)."""
        with self._lock:
            self._held = set(pages)
            self._calls_out = asyncio.Event()
            if not self._held:
                self._calls_out.set()

    def sent(self, page: PageKey) -> None:
        """The page's call is on its way, or the page ended without one (on the batch's event loop)."""
        with self._lock:
            self._held.discard(page)
            if not self._held:
                self._all_sent.notify_all()
                if self._calls_out is not None:
                    self._calls_out.set()

    async def after_calls(self, calls_over: asyncio.Event) -> None:
        """Wait until every page of the batch has sent its call or ended, so that work that can wait for the model's
        answers (storing the page images) does not slow the sending of the calls; or until ``calls_over`` is set: a
        page whose own calls are over stores its image at once, as pages that wait for it (behind PAGE_CONCURRENCY,
        or a provider that never says its call was sent) may not have sent theirs."""
        calls_out = self._calls_out
        if calls_out is None or calls_out.is_set():
            return
        waits = [asyncio.ensure_future(calls_out.wait()), asyncio.ensure_future(calls_over.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()

    def follow(self, document: DocumentRecord, source: Path, claimed: Collection[int]) -> None:
        """Render, in spare time, the pages of ``document`` that follow the pages ``claimed`` here (its pages in this
        batch), from its local copy ``source``."""
        if not self._ahead or not claimed or document.kind is None:
            return
        kind = DocumentKind(document.kind)
        pages = following_pages(document, claimed, self._ahead, skip=self._skip(document.document_id, claimed))
        with self._lock:
            fresh = [page for page in pages if page_key(document, page) not in self._entries]
            for page in fresh:
                key = page_key(document, page)
                self._entries[key] = Future()
                self._wanted.append(_Wanted(key, source, kind, page))
            self._make_room(protected={page_key(document, page) for page in claimed})
            start = min(len(self._wanted), self._renderer.workers) - self._threads
            self._threads += max(0, start)
        for _ in range(start):
            threading.Thread(target=self._render_wanted, name="render-ahead", daemon=True).start()

    def _skip(self, document_id: str, claimed: Collection[int]) -> int:
        """How many pages after this batch's the next batch here will likely skip: the pages the other environments
        take meanwhile. Messages are received roughly in page order, so with n environments at work on a document
        this environment's batches start n batches apart; the stride between its last two batches measures that
        (none yet: as if it were the only one). Every page of a batch asks; the batch's first answer stands."""
        first = min(claimed)
        with self._lock:
            previous = self._strides.pop(document_id, None)
            if previous is not None and previous[0] == first:
                skip = previous[1]
            else:
                stride = first - previous[0] if previous is not None and first > previous[0] else len(claimed)
                skip = max(0, stride - len(claimed))
            self._strides[document_id] = (first, skip)
            while len(self._strides) > _DOCUMENTS_TRACKED:
                self._strides.popitem(last=False)
        return skip

    async def _ready(self, key: PageKey, *, keep: bool) -> Prepared | None:
        """What was prepared of the page ahead, ready or awaited while a thread prepares it; None when nothing was, or
        when it failed (the claim then does the work itself and meets the failure there). Unless ``keep``, the entry
        is taken, and cancelled if no thread has started on it."""
        with self._lock:
            future = self._entries.get(key) if keep else self._entries.pop(key, None)
            if future is None or future.cancel() or not (future.running() or future.done()):
                return None  # a started future cannot be cancelled: awaiting it below never raises CancelledError
        try:
            return await asyncio.wrap_future(future)
        except Exception:  # the claim renders the page itself and meets the failure there
            return None

    def _make_room(self, protected: set[PageKey]) -> None:
        """Drop the oldest pages no thread is rendering while more than RENDER_AHEAD_PAGES are kept besides those
        ``protected`` (the batch's own, whose claims are about to take them), never these (under the lock)."""
        excess = len(self._entries) - len(protected.intersection(self._entries)) - self._ahead
        droppable = [key for key, future in self._entries.items() if key not in protected and not future.running()]
        for key in droppable[: max(0, excess)]:
            self._entries.pop(key).cancel()

    def _render_wanted(self) -> None:
        """A thread's loop: each wanted page not taken meanwhile, in spare time, until none is left."""
        while True:
            with self._lock:
                wanted = self._next_wanted()
                if wanted is None:
                    self._threads -= 1
                    return
            if not self._spare():
                with self._lock:
                    self._wanted.appendleft(wanted)  # still wanted: looked at again (a closed pool ends the loop)
                    if self._renderer.closed:
                        self._wanted.clear()
                continue
            self._prepare(wanted)

    def _spare(self) -> bool:
        """Whether it is spare time: every page of the batch has sent its call, and no page waits for a render process
        or holds one (False after waiting a while for it)."""
        with self._lock:
            if not self._all_sent.wait_for(lambda: not self._held, timeout=_SPARE_WAIT_SECONDS):
                return False
        return self._renderer.wait_spare(_SPARE_WAIT_SECONDS)

    def _next_wanted(self) -> _Wanted | None:
        """The first wanted page still waiting for its render (under the lock)."""
        while self._wanted:
            wanted = self._wanted.popleft()
            future = self._entries.get(wanted.key)
            if future is not None and not future.done() and not future.running():
                return wanted
        return None

    def _prepare(self, wanted: _Wanted) -> None:
        with self._lock:
            future = self._entries.get(wanted.key)
            if future is None or not future.set_running_or_notify_cancel():
                return  # taken by its claim, or dropped, meanwhile
        try:
            future.set_result(self._prepared(wanted))
        except Exception as exc:  # kept for the claim, which renders the page itself
            log.debug("page %d not rendered ahead: %s", wanted.page_number, exc)
            future.set_exception(exc)

    def _prepared(self, wanted: _Wanted) -> Prepared:
        text = None
        if self._reads_text and wanted.kind is DocumentKind.PDF:
            text = self._renderer.spare_text_layer(wanted.path, wanted.page_number)
            if usable_text_layer(text.text):
                return Prepared(text, None)
        rendered = self._renderer.spare_render(wanted.path, wanted.kind, wanted.page_number, words=True, **self._params)
        return Prepared(text, rendered)
