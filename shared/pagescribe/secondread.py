"""The second read: the offline engine reads a page image while the page's model call is in flight.

A page without a usable text layer (a scan, an image) has nothing of its own to hold the model's answer against, so
invented text on it passes every other check. The offline engine (RapidOCR, on the CPU that sits idle while the call
waits on the network) reads the very image the model was sent into positioned lines: the evidence the answer is
grounded to (:mod:`pagescribe.grounding`). It runs in a render process of its own, under the render processes' memory
and time limits, so a heavy page never takes the function down and never holds up another page's render.

It never delays the call (the call starts first) and never makes the page miss its deadline. ``SECOND_READ``
(or the document's ``second_read``):

- ``auto``: the read starts only when the reading process is free as the call starts (otherwise the CPU is busy with
  another page's read), and once the answer is in, the page waits for it at most a tenth of the call's own time;
- ``always``: the read waits for the reading process, and the page waits for it as long as its deadline allows;
- ``off``: no read.

A page that goes without says why, in what is stored with its call (``attempts.second_read``) and with its answer
(``jobs.grounding``): not in time, the process busy, the engine not installed, the read failed.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pagescribe.sources.documents import InvalidDocumentError

if TYPE_CHECKING:
    from pagescribe.grounding import PageText
    from pagescribe.layout.boxes import TextBox
    from pagescribe.rendering import RenderPool, SecondRead
    from pagescribe.sources.pages import RenderedPage

log = logging.getLogger(__name__)

AUTO_WAIT_SHARE = 0.1  # auto: after the answer, a page waits for its read at most this share of the call's own time
MIN_READ_SECONDS = 5.0  # a read (seconds of CPU on a dense page) is not started with less time than this left
NOT_INSTALLED = "the offline engine is not installed (the 'offline' extra: pip install 'pagescribe[offline]')"


@dataclass(frozen=True)
class Evidence:
    """What the second read gave a page: its words (None without a read), and what is stored with the call."""

    words: PageText | None
    record: dict[str, Any]  # the lines, boxes, confidence and CPU time; or {"skipped": why}


class PendingRead:
    """A page's second read, started as its model call starts; awaited once the answer is in."""

    def __init__(
        self, task: asyncio.Task[SecondRead] | None, rendered: RenderedPage, skipped: str | None = None
    ) -> None:
        self._task = task
        self._rendered = rendered
        self._skipped = skipped
        self._evidence: Evidence | None = None
        if task is not None:
            task.add_done_callback(quiet)

    async def close(self) -> None:
        """The page is done with its read: one still running is let go (its render process finishes it, and takes
        the next read only then)."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def evidence(self, *, wait_seconds: float) -> Evidence:
        """The read's evidence, waiting for it at most ``wait_seconds``; the same on every later call (an escalation
        is grounded to the same read)."""
        if self._evidence is None:
            self._evidence = await self._gather(wait_seconds)
        return self._evidence

    async def _gather(self, wait_seconds: float) -> Evidence:
        if self._task is None:
            return Evidence(None, {"skipped": self._skipped or "not started"})
        try:
            read = await asyncio.wait_for(asyncio.shield(self._task), timeout=max(wait_seconds, 0.0))
        except TimeoutError:
            await self.close()
            return Evidence(None, {"skipped": f"it did not finish within {wait_seconds:.1f} s of the answer"})
        except InvalidDocumentError as exc:
            return Evidence(None, {"skipped": f"the read failed: {exc.reason}"})
        except Exception as exc:  # the page goes on without it, whatever went wrong in the reading process
            log.warning("the second read failed: %s", exc)
            return Evidence(None, {"skipped": f"the read failed: {type(exc).__name__}: {exc}"})
        return _evidence(read, self._rendered)


def quiet(task: asyncio.Task[Any]) -> None:
    """A task a page stopped waiting for (a read, words being placed) may still fail: its error is reported where the
    page awaits it (a read's in its record), or the page has no use for it; not by asyncio."""
    if not task.cancelled():
        task.exception()


def _evidence(read: SecondRead, rendered: RenderedPage) -> Evidence:
    from pagescribe.grounding import GroundingSource, PageText, words_from_boxes

    words = PageText(
        GroundingSource.SECOND_READ,
        tuple(words_from_boxes(read.lines)),
        rendered.width,
        rendered.height,
        rendered.points_per_pixel,
    )
    record = {
        "lines": [[line.text, *_box(line), round(line.score, 4)] for line in read.lines],
        "confidence": round(read.confidence, 4) if read.confidence is not None else None,
        "cpu_seconds": read.cpu_seconds,
    }
    return Evidence(words, record)


def _box(line: TextBox) -> list[float]:
    right = line.right if line.right is not None else line.left
    return [round(value, 1) for value in (line.left, line.top, right, line.bottom)]


class SecondReader:
    """Starts pages' second reads in its own render process (built on the first read), by the policy asked for."""

    def __init__(self, pool: Callable[[], RenderPool], *, language: str) -> None:
        self._pool = pool
        self._language = language
        self._installed = importlib.util.find_spec("rapidocr") is not None

    def start(self, rendered: RenderedPage, *, mode: str, seconds_left: float) -> PendingRead | None:
        """The page's read, started now unless the policy, the time left or the engine rule it out (then a read that
        says why); None when reads are off. ``seconds_left``: until the page's result must be written."""
        if mode == "off":
            return None
        if not self._installed:
            return PendingRead(None, rendered, NOT_INSTALLED)
        if seconds_left < MIN_READ_SECONDS:
            why = f"only {max(seconds_left, 0.0):.1f} s left before the result must be written"
            return PendingRead(None, rendered, why)
        pool = self._pool()
        if mode == "auto" and pool.busy():
            return PendingRead(None, rendered, "the reading process was busy with another page as the call started")
        read = pool.second_read(rendered.data, language=self._language, timeout_seconds=seconds_left)
        return PendingRead(asyncio.ensure_future(read), rendered)

    @staticmethod
    def wait_seconds(mode: str, *, call_seconds: float, seconds_left: float) -> float:
        """How long a page waits for its read once the answer is in: a tenth of the call's time (auto), or all of
        ``seconds_left`` before its result must be written (always)."""
        return min(seconds_left, AUTO_WAIT_SHARE * call_seconds) if mode == "auto" else seconds_left
