"""Render pages in a pool of worker processes, each under a memory limit and a time limit.

Why processes: pdfium allocates whatever a page asks for. A content stream that inflates from a few MB to gigabytes
(a decompression bomb) would take the whole function down with it, over and over on every redelivery; and pdfium is not
thread-safe, so in one process pages render one at a time. A worker here is a long-lived ``python -m
pagescribe.render_worker`` whose address space is capped with ``RLIMIT_AS``: a hostile page makes *it* fail (pdfium
aborts when an allocation fails, Python raises MemoryError), the parent turns that into an InvalidDocumentError naming
the limit, and the next page gets a fresh worker. Each worker has its own pdfium, so the pool renders in parallel.

Why not multiprocessing: its queues and locks need POSIX semaphores in /dev/shm, which AWS Lambda does not have. The
protocol is plain pipes instead: requests on the worker's stdin, replies on a pipe of their own (the worker's stdout
goes to the parent's stderr, so a stray print can never corrupt a reply). A frame is two big-endian lengths, then a
JSON object, then raw bytes (the encoded image): :mod:`pagescribe.render_worker` writes and reads both ends' frames.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pagescribe.render_worker import FRAME_HEADER, SEEN_FIELDS, encode_frame
from pagescribe.sources.documents import DocumentInfo, DocumentKind, InvalidDocumentError
from pagescribe.sources.pages import Band, RenderedPage
from pagescribe.sources.textlayer import PrintSize, TextLayer

if TYPE_CHECKING:  # layout (and the checks it uses) loads with the first second read, not with the upload function
    from pagescribe.grounding import PageText
    from pagescribe.layout.boxes import TextBox

# The pool's sizes and limits come from the settings (RENDER_WORKERS, RENDER_MEMORY_LIMIT_MB, RENDER_TIMEOUT_SECONDS),
# their only source of defaults.
MIN_RENDER_MEMORY_LIMIT_MB = 128  # below this an idle worker has too little room left to render anything
_STARTUP_TIMEOUT_SECONDS = 30.0
_MAX_META_BYTES = 16 << 20
_MAX_BLOB_BYTES = 1 << 30


@dataclass(frozen=True)
class SecondRead:
    """What the offline engine read of a page image in a render process."""

    lines: tuple[TextBox, ...]  # in pixels of the image
    confidence: float | None  # the lines' mean recognition confidence
    cpu_seconds: float  # the read's CPU time


def _evidence(words: dict[str, Any] | None) -> PageText | None:
    if words is None:
        return None
    from pagescribe.grounding import evidence_from_json

    return evidence_from_json(words)


class RenderWorkerError(RuntimeError):
    """The pool could not do the work for reasons that are not the document's (a worker would not start, the pool is
    closed, an unexpected error in the worker): retrying may help."""


class _WorkerGone(Exception):
    """The worker closed its reply pipe: it exited or was killed."""


class _WorkerTimedOut(Exception):
    """No complete reply before the deadline."""


def _describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "it stopped answering"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            return f"killed by signal {-returncode}"
        return f"killed by signal {-returncode} ({name})"
    return f"exited with status {returncode}"


def _child_path() -> str:
    """The parent's import path, so a worker imports exactly the pagescribe, pypdfium2 and Pillow the parent does
    (in Lambda the code and its dependencies live in /var/task and layers, not in the interpreter's site-packages)."""
    entries = [os.path.abspath(entry) for entry in sys.path if entry]
    return os.pathsep.join(dict.fromkeys(entries))


def _child_stdout() -> int:
    """Where a worker's stray output goes: the parent's stderr (logged in Lambda), never the parent's stdout (which
    may carry a transcript, as in ``pagescribe transcribe --out -``)."""
    try:
        os.fstat(2)
    except OSError:
        return subprocess.DEVNULL
    return 2


class _Worker:
    """One worker process and its pipes. Only the thread holding it reads or writes; ``kill`` may come from any."""

    def __init__(self, memory_limit_mb: int, niceness: int = 0) -> None:
        reply_read, reply_write = os.pipe()
        try:
            env = {**os.environ, "PYTHONPATH": _child_path()}
            self.process = subprocess.Popen(  # noqa: S603 (our own interpreter and module; no shell, no user input)
                [sys.executable, "-P", "-m", "pagescribe.render_worker", str(reply_write), str(memory_limit_mb)]
                + ([str(niceness)] if niceness else []),
                stdin=subprocess.PIPE,
                stdout=_child_stdout(),
                pass_fds=(reply_write,),
                env=env,
                bufsize=0,
            )
        except BaseException:
            os.close(reply_read)
            raise
        finally:
            os.close(reply_write)
        self.pid = self.process.pid
        self._replies = reply_read
        self._selector = selectors.DefaultSelector()
        self._selector.register(reply_read, selectors.EVENT_READ)
        self._buffer = bytearray()
        self._kill_lock = threading.Lock()
        self._closed = False

    def alive(self) -> bool:
        return self.process.poll() is None

    def send(self, request: dict[str, Any], blob: bytes = b"") -> None:
        assert self.process.stdin is not None
        try:
            # a request is a few hundred bytes, or an image the idle worker reads at once: it never blocks for long
            self.process.stdin.write(encode_frame(request, blob))
        except (BrokenPipeError, ValueError) as exc:
            raise _WorkerGone from exc

    def _read(self, size: int, deadline: float) -> bytes:
        while len(self._buffer) < size:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self._selector.select(remaining):
                raise _WorkerTimedOut
            chunk = os.read(self._replies, max(size - len(self._buffer), 1 << 16))
            if not chunk:
                raise _WorkerGone
            self._buffer += chunk
        data = bytes(self._buffer[:size])
        del self._buffer[:size]
        return data

    def receive(self, deadline: float) -> tuple[dict[str, Any], bytes]:
        meta_size, blob_size = FRAME_HEADER.unpack(self._read(FRAME_HEADER.size, deadline))
        if meta_size > _MAX_META_BYTES or blob_size > _MAX_BLOB_BYTES:
            raise _WorkerGone  # not a frame this protocol writes: treat the worker as broken
        meta: dict[str, Any] = json.loads(self._read(meta_size, deadline))
        return meta, self._read(blob_size, deadline) if blob_size else b""

    def kill(self) -> int | None:
        """Kill the process (if it still runs) and reap it; its exit status, as Popen reports it."""
        with self._kill_lock:
            if self.process.poll() is None:
                self.process.kill()
            try:
                return self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:  # unkillable (stuck in the kernel): nothing more we can do
                return None

    def close(self) -> int | None:
        """Kill and reap the process and close the parent's ends of its pipes. Only for the thread holding it."""
        returncode = self.kill()
        if not self._closed:
            self._closed = True
            self._selector.close()
            os.close(self._replies)
            if self.process.stdin is not None:
                self.process.stdin.close()
        return returncode


def _render_request(
    path: Path,
    kind: DocumentKind,
    page_number: int,
    *,
    dpi: int,
    max_long_edge: int,
    image_format: Literal["jpeg", "png"],
    max_image_pixels: int,
    jpeg_quality: int = 85,
    orient: bool = True,
    blank_below: float = 0.0,
    words: bool = False,
) -> dict[str, Any]:
    """A render request (see ``RenderPool.render``)."""
    return {
        "op": "render",
        "path": os.fspath(path),
        "kind": DocumentKind(kind).value,
        "page_number": page_number,
        "dpi": dpi,
        "max_long_edge": max_long_edge,
        "image_format": image_format,
        "jpeg_quality": jpeg_quality,
        "max_image_pixels": max_image_pixels,
        "orient": orient,
        "blank_below": blank_below,
        "words": words,
    }


def _rendered(result: dict[str, Any], data: bytes) -> RenderedPage:
    """A render request's reply as the page it describes."""
    return RenderedPage(
        data,
        str(result["media_type"]),
        int(result["width"]),
        int(result["height"]),
        **{field: result[field] for field in SEEN_FIELDS if field != "figures"},
        figures=tuple((box[0], box[1], box[2], box[3]) for box in result["figures"]),
        words=_evidence(result.get("words")),
        print_size=PrintSize(*result["print"]) if result.get("print") else None,
    )


def _close_all(workers: set[_Worker]) -> None:
    """At interpreter exit, or when a pool is collected without close(): no process outlives its pool."""
    for worker in list(workers):
        worker.close()
    workers.clear()


class RenderPool:
    """A few long-lived render workers shared by every page of an invocation (and by later warm invocations).

    ``render`` and ``text_layer`` may be awaited concurrently from many tasks: a page waits (without blocking the event
    loop) for a free worker. Workers start on first use, not at import. A worker that dies, runs out of memory or
    overruns ``timeout_seconds`` is killed and replaced, and that page fails with an InvalidDocumentError naming the
    limit; any other page is unaffected.
    """

    def __init__(
        self,
        workers: int,
        memory_limit_mb: int,
        timeout_seconds: float,
        *,
        startup_timeout_seconds: float = _STARTUP_TIMEOUT_SECONDS,
        niceness: int = 0,
    ) -> None:
        if workers < 1:
            raise ValueError(f"RENDER_WORKERS must be at least 1, not {workers}")
        if memory_limit_mb < MIN_RENDER_MEMORY_LIMIT_MB:
            raise ValueError(
                f"RENDER_MEMORY_LIMIT_MB must be at least {MIN_RENDER_MEMORY_LIMIT_MB}, not {memory_limit_mb}"
            )
        if not timeout_seconds > 0:
            raise ValueError(f"RENDER_TIMEOUT_SECONDS must be positive, not {timeout_seconds}")
        self.workers = workers
        self.memory_limit_mb = memory_limit_mb
        self.timeout_seconds = timeout_seconds
        self.niceness = niceness  # the workers' lower priority (the second read's: it must not slow the pages down)
        self._startup_timeout = startup_timeout_seconds
        self._changed = threading.Condition()
        self._idle: list[_Worker] = []
        self._all: set[_Worker] = set()
        self._starting = 0
        self._pending = 0  # pages' requests waiting for a worker or holding one (spare-time work waits for none)
        self._closed = False
        self._slots: asyncio.Semaphore | None = None
        self._slots_loop: asyncio.AbstractEventLoop | None = None
        self._finalizer = weakref.finalize(self, _close_all, self._all)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def pids(self) -> tuple[int, ...]:
        """The process ids of the running workers (for logs, metrics and tests)."""
        with self._changed:
            return tuple(sorted(worker.pid for worker in self._all))

    async def render(
        self,
        path: Path,
        kind: DocumentKind,
        page_number: int,
        *,
        dpi: int,
        max_long_edge: int,
        image_format: Literal["jpeg", "png"],
        max_image_pixels: int,
        jpeg_quality: int = 85,
        orient: bool = True,
        blank_below: float = 0.0,
        words: bool = False,
    ) -> RenderedPage:
        """sources.render_page in a worker; InvalidDocumentError for a page that can never render. A page with a usable
        text layer comes with the size of its print (``print_size``) and, with ``words``, its words placed on the
        image (the evidence to ground to; see ``words``)."""
        request = _render_request(
            path,
            kind,
            page_number,
            dpi=dpi,
            max_long_edge=max_long_edge,
            image_format=image_format,
            max_image_pixels=max_image_pixels,
            jpeg_quality=jpeg_quality,
            orient=orient,
            blank_below=blank_below,
            words=words,
        )
        return _rendered(*await self._request(request, f"page {page_number} could not be rendered"))

    async def words(self, path: Path, page_number: int, *, dpi: int, max_long_edge: int) -> PageText:
        """sources.text_layer_words in a worker: a PDF page's words placed on its render at ``dpi`` and
        ``max_long_edge``, for a page rendered without them."""
        request = {
            "op": "words",
            "path": os.fspath(path),
            "page_number": page_number,
            "dpi": dpi,
            "max_long_edge": max_long_edge,
        }
        result, _ = await self._request(request, f"the words of page {page_number} could not be placed")
        from pagescribe.grounding import evidence_from_json

        return evidence_from_json(result["words"])

    async def render_band(
        self,
        path: Path,
        kind: DocumentKind,
        page_number: int,
        band: Band,
        *,
        zoom: float,
        dpi: int,
        max_long_edge: int,
        image_format: Literal["jpeg", "png"],
        max_image_pixels: int,
        jpeg_quality: int = 85,
    ) -> RenderedPage:
        """sources.render_band in a worker: a band of the page, ``zoom`` times the scale the whole page renders at."""
        request = {
            "op": "band",
            "path": os.fspath(path),
            "kind": DocumentKind(kind).value,
            "page_number": page_number,
            "top": band.top,
            "bottom": band.bottom,
            "zoom": zoom,
            "dpi": dpi,
            "max_long_edge": max_long_edge,
            "image_format": image_format,
            "jpeg_quality": jpeg_quality,
            "max_image_pixels": max_image_pixels,
        }
        result, data = await self._request(request, f"a tile of page {page_number} could not be rendered")
        size = (int(result["width"]), int(result["height"]))
        return RenderedPage(data, str(result["media_type"]), *size, ink=result["ink"], marked=result["marked"])

    def busy(self) -> bool:
        """Every worker is taken (by a request of this loop, or one it let go of that a worker still works on), and
        no other may start: a new request would wait."""
        with self._changed:
            return not self._idle and len(self._all) + self._starting >= self.workers

    async def second_read(self, image: bytes, *, language: str, timeout_seconds: float) -> SecondRead:
        """The offline engine's read of a page image in a worker (the engine loads on a worker's first read),
        within ``timeout_seconds`` (the worker's deadline: a process cannot be cancelled, it is killed);
        InvalidDocumentError when it runs out of time or memory."""
        from pagescribe.layout.boxes import TextBox

        request = {"op": "read", "language": language}
        result, _ = await self._request(request, "the second read failed", blob=image, limit_seconds=timeout_seconds)
        lines = tuple(
            TextBox(text, left=left, top=top, bottom=bottom, score=score, right=right)
            for text, left, top, right, bottom, score in result["lines"]
        )
        return SecondRead(lines, result["confidence"], float(result["cpu_seconds"]))

    async def text_layer(self, path: Path, page_number: int) -> TextLayer:
        """sources.read_text_layer in a worker (loading a page parses its content, so it can be a bomb too)."""
        request = {"op": "text", "path": os.fspath(path), "page_number": page_number}
        result, _ = await self._request(request, f"the text of page {page_number} could not be read")
        return TextLayer(str(result["text"]), str(result["laid_out"]))

    def wait_spare(self, timeout: float) -> bool:
        """Wait, at most ``timeout`` seconds, until no page's request waits for a worker or holds one and a worker is
        free (or may start): True then; False at the timeout or once the pool is closed. For work done in spare time
        (rendering ahead), which must never make a page wait for a worker."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not self._closed and (self._pending or not self._spare()):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._changed.wait(remaining)
            return not self._closed

    def spare_render(self, path: Path, kind: DocumentKind, page_number: int, **params: Any) -> RenderedPage:
        """``render`` from a thread, in spare time (see ``wait_spare``): not counted as a page's request."""
        request = _render_request(path, kind, page_number, **params)
        return _rendered(*self._exchange(request, f"page {page_number} could not be rendered"))

    def spare_text_layer(self, path: Path, page_number: int) -> TextLayer:
        """``text_layer`` from a thread, in spare time (see ``wait_spare``)."""
        request = {"op": "text", "path": os.fspath(path), "page_number": page_number}
        result, _ = self._exchange(request, f"the text of page {page_number} could not be read")
        return TextLayer(str(result["text"]), str(result["laid_out"]))

    def inspect(self, path: Path, *, max_pages: int, max_image_pixels: int) -> DocumentInfo:
        """sources.inspect_document in a worker, from a synchronous caller (the upload function): opening a file
        to count its pages inflates whatever its cross-reference, object streams or page tree say, so a bomb fails
        here under the pool's limits with the limit named, never in the caller's process."""
        request = {
            "op": "inspect",
            "path": os.fspath(path),
            "max_pages": max_pages,
            "max_image_pixels": max_image_pixels,
        }
        result, _ = self._exchange(request, "the document could not be opened")
        return DocumentInfo(DocumentKind(result["kind"]), int(result["page_count"]))

    def prestart(self, count: int = 1, *, warm: bool = False) -> list[threading.Thread]:
        """Start ``count`` workers (at most the pool's size) in the background, so that the first requests do not wait
        for their start (a function's cold start calls this; the init phase ends without waiting); with ``warm``, each
        is warmed up too (render_worker's ``warm``: what a worker does first for a page, done on a page of its own). A
        worker that cannot start is reported by the first request that needs it. The threads that start them are
        returned, for a caller that must not go on before the workers are up."""

        def start() -> None:
            # the pool was closed meanwhile, or a worker cannot start: the first request says so
            with contextlib.suppress(RenderWorkerError, InvalidDocumentError):
                if warm:
                    self._exchange({"op": "warm"}, "a render worker could not warm up")
                else:
                    self._checkin(self._checkout())

        threads = [
            threading.Thread(target=start, name=f"render-prestart-{number}", daemon=True)
            for number in range(min(count, self.workers))
        ]
        for thread in threads:
            thread.start()
        return threads

    def close(self) -> None:
        """Stop every worker and reap it. Idempotent; a request in flight fails with RenderWorkerError."""
        with self._changed:
            if self._closed:
                return
            self._closed = True
            idle, self._idle = self._idle, []
            busy = self._all - set(idle)
            self._all.clear()
            self._changed.notify_all()
        for worker in idle:
            worker.close()
        for worker in busy:  # their threads close the pipes when they see the worker gone
            worker.kill()
        self._finalizer.detach()

    # Internals

    def _slot(self) -> asyncio.Semaphore:
        """At most ``workers`` requests of this loop are in threads at once; the rest wait on the loop, not in threads
        of the default executor (which the rest of the function needs). A pool outlives an event loop when a caller
        runs ``asyncio.run`` per invocation, so the semaphore belongs to the loop that is running now."""
        loop = asyncio.get_running_loop()
        if self._slots is None or self._slots_loop is not loop:
            self._slots, self._slots_loop = asyncio.Semaphore(self.workers), loop
        return self._slots

    async def _request(
        self, request: dict[str, Any], failure: str, *, blob: bytes = b"", limit_seconds: float | None = None
    ) -> tuple[dict[str, Any], bytes]:
        """The worker's reply, within ``limit_seconds`` (at most the pool's own limit): the worker is a process, so
        the limit is the reply's deadline, and a worker that misses it is killed."""
        with self._changed:
            self._pending += 1
        try:
            async with self._slot():
                return await asyncio.to_thread(self._exchange, request, failure, blob, limit_seconds)
        finally:
            with self._changed:
                self._pending -= 1
                self._changed.notify_all()

    def _exchange(
        self, request: dict[str, Any], failure: str, blob: bytes = b"", limit_seconds: float | None = None
    ) -> tuple[dict[str, Any], bytes]:
        if "path" in request:  # the worker's working directory may differ
            request = {**request, "path": os.path.abspath(request["path"])}
        limit = self.timeout_seconds if limit_seconds is None else min(limit_seconds, self.timeout_seconds)
        worker = self._checkout()
        try:
            worker.send(request, blob)
            reply, data = worker.receive(time.monotonic() + limit)
        except _WorkerTimedOut:
            self._discard(worker)
            named = f"RENDER_TIMEOUT_SECONDS={limit:g}" if limit == self.timeout_seconds else f"the {limit:g} s left"
            raise InvalidDocumentError(f"{failure}: it took longer than {named}") from None
        except _WorkerGone:
            returncode = self._discard(worker)
            if self._closed:
                raise RenderWorkerError("the render pool was closed while the page was rendering") from None
            raise InvalidDocumentError(
                f"{failure} within RENDER_MEMORY_LIMIT_MB={self.memory_limit_mb} "
                f"(the renderer ran out of memory or crashed: {_describe_exit(returncode)})"
            ) from None
        except BaseException:
            self._discard(worker)
            raise
        if "memory" in reply:  # a worker that hit MemoryError is not trusted again
            self._discard(worker)
            raise InvalidDocumentError(
                f"{failure} within RENDER_MEMORY_LIMIT_MB={self.memory_limit_mb} (the renderer ran out of memory)"
            )
        if "error" in reply:  # a worker whose library failed unexpectedly (onnxruntime's bad_alloc) is not trusted
            self._discard(worker)
            raise RenderWorkerError(f"{failure}: the renderer failed unexpectedly: {reply['error']}")
        self._checkin(worker)
        if "invalid" in reply:
            raise InvalidDocumentError(str(reply["invalid"]))
        result: dict[str, Any] = reply["ok"]
        return result, data

    def _spare(self) -> bool:
        """A worker is idle, or one more may start (under ``_changed``)."""
        return bool(self._idle) or len(self._all) + self._starting < self.workers

    def _checkout(self) -> _Worker:
        with self._changed:
            while True:
                if self._closed:
                    raise RenderWorkerError("the render pool is closed")
                while self._idle:
                    worker = self._idle.pop()
                    if worker.alive():
                        return worker
                    self._all.discard(worker)  # died while idle (killed from outside): replace it quietly
                    worker.close()
                if len(self._all) + self._starting < self.workers:
                    self._starting += 1
                    break
                self._changed.wait()
        try:
            worker = self._start()
        finally:
            with self._changed:
                self._starting -= 1
                self._changed.notify_all()
        with self._changed:
            if not self._closed:
                self._all.add(worker)
                return worker
        worker.close()
        raise RenderWorkerError("the render pool is closed")

    def _start(self) -> _Worker:
        try:
            worker = _Worker(self.memory_limit_mb, self.niceness)
        except OSError as exc:
            raise RenderWorkerError(f"a render worker could not be started: {exc}") from exc
        try:
            hello, _ = worker.receive(time.monotonic() + self._startup_timeout)
        except _WorkerTimedOut:
            worker.close()
            raise RenderWorkerError(
                f"a render worker did not start within {self._startup_timeout:g} s; see its stderr"
            ) from None
        except _WorkerGone:
            returncode = worker.close()
            raise RenderWorkerError(
                f"a render worker stopped before it was ready ({_describe_exit(returncode)}); see its stderr"
            ) from None
        if "ready" not in hello:
            worker.close()
            raise RenderWorkerError(f"a render worker could not start: {hello.get('startup_error', hello)}")
        return worker

    def _checkin(self, worker: _Worker) -> None:
        with self._changed:
            if not self._closed:
                self._idle.append(worker)
                self._changed.notify_all()
                return
        worker.close()

    def _discard(self, worker: _Worker) -> int | None:
        with self._changed:
            self._all.discard(worker)
            self._changed.notify_all()
        return worker.close()
