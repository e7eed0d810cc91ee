"""The render pool: real worker processes rendering the real corpus, and hostile pages that must fail one page only,
with a reason naming the limit, while the calling process stays small."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, Literal

import pytest
from pagescribe.render_worker import WARM_UP_TEXT, warm_up
from pagescribe.rendering import RenderPool, RenderWorkerError
from pagescribe.runtime import READ_NICENESS, Runtime
from pagescribe.settings import Settings
from pagescribe.sources.documents import DocumentKind, InvalidDocumentError, inspect_document
from pagescribe.sources.pages import RenderedPage, render_page
from pagescribe.sources.textlayer import extract_text_layer, read_text_layer

from tests.support import CORPUS, CORPUS_NOTES
from tests.support.hostile import bilevel_png, decompression_bomb, page_with_contents

FIRST_PAGE = CORPUS / "minimal-document.pdf"
PASSWORD = CORPUS / "libreoffice-writer-password.pdf"
GENEROUS_TIMEOUT = 120.0  # long enough never to fire where a test is not about timeouts


def corpus_pages() -> list[tuple[Path, DocumentKind, int]]:
    pages = []
    for path in sorted(CORPUS.iterdir()):
        if path.name in CORPUS_NOTES or path == PASSWORD:
            continue
        info = inspect_document(path, max_pages=500, max_image_pixels=60_000_000)
        pages += [(path, info.kind, number) for number in range(1, info.page_count + 1)]
    return pages


PAGES = corpus_pages()


# Hostile PDFs, built in a fraction of a second


def slow_page(fills: int) -> bytes:
    """A page that fills the whole page ``fills`` times: a few KB of content, little memory, about 1.5 ms of
    rasterising per fill at 150 DPI (20,000 fills is half a minute)."""
    content = b"0 0 612 792 re f\n" * fills
    stream = b"<< /Length %d >>\nstream\n%s\nendstream" % (len(content), content)
    return page_with_contents(b"4 0 R", stream)


# Processes


def process_exists(pid: int) -> bool:
    """True while ``pid`` is running or is a zombie nobody reaped."""
    return Path(f"/proc/{pid}").exists()


def started_workers(pool: RenderPool) -> tuple[int, ...]:
    """Block until the pool lists a worker: it does once the worker has started, just before it is sent a page."""
    for _ in range(3000):
        if pool.pids:
            return pool.pids
        time.sleep(0.01)
    raise AssertionError("no render worker started")


def wait_until_dead(pid: int) -> None:
    """Block until a signalled child has stopped running (it stays a zombie until the pool reaps it)."""
    for _ in range(1000):
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return
        if state in {"Z", "X"}:
            return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} is still running after SIGKILL")


async def pooled(pool: RenderPool, path: Path, kind: DocumentKind, page: int) -> RenderedPage:
    return await pool.render(
        path, kind, page, dpi=150, max_long_edge=1568, image_format="jpeg", max_image_pixels=60_000_000
    )


def render(pool: RenderPool, path: Path, kind: DocumentKind, page: int) -> RenderedPage:
    return asyncio.run(pooled(pool, path, kind, page))


def local(path: Path, kind: DocumentKind, page: int) -> RenderedPage:
    """The page as the pool renders it, made in this process: its render, with the size of its print where it has a
    usable text layer."""
    return render_page(path, kind, page, dpi=150, max_long_edge=1568, image_format="jpeg", max_image_pixels=60_000_000)


@pytest.fixture(scope="module")
def pool() -> Iterator[RenderPool]:
    """One pool for the tests that do not break workers: each test runs its own event loop, as an invocation may."""
    shared = RenderPool(workers=2, memory_limit_mb=1024, timeout_seconds=GENEROUS_TIMEOUT)
    yield shared
    shared.close()


@pytest.fixture
def own_pool() -> Iterator[RenderPool]:
    fresh = RenderPool(workers=1, memory_limit_mb=1024, timeout_seconds=GENEROUS_TIMEOUT)
    yield fresh
    fresh.close()


# The corpus, through the pool


@pytest.mark.parametrize(("path", "kind", "page"), PAGES, ids=[f"{path.name}-p{page}" for path, _, page in PAGES])
def test_every_corpus_page_renders_in_the_pool_exactly_as_in_process(
    pool: RenderPool, path: Path, kind: DocumentKind, page: int
) -> None:
    # Given a corpus page and the default memory limit
    # When it is rendered by a worker and in this process
    in_worker = render(pool, path, kind, page)
    in_process = local(path, kind, page)
    # Then the worker's page is the same image, byte for byte
    assert (in_worker.media_type, in_worker.width, in_worker.height) == (
        in_process.media_type,
        in_process.width,
        in_process.height,
    )
    assert in_worker == in_process


@pytest.mark.parametrize(("path", "page"), [(path, page) for path, kind, page in PAGES if kind is DocumentKind.PDF][:6])
def test_the_text_layer_read_in_the_pool_is_the_in_process_text(pool: RenderPool, path: Path, page: int) -> None:
    # Given a born-digital corpus page
    # When its text layer is read by a worker
    layer = asyncio.run(pool.text_layer(path, page))
    # Then it is the text read in this process, as pdfium reads it and laid out
    assert layer == read_text_layer(path, page)
    assert layer.text == extract_text_layer(path, page)


def test_a_blank_render_comes_from_the_pool_with_its_text_layer_laid_out(pool: RenderPool) -> None:
    # Given a real PDF whose Japanese font is not embedded: it renders blank here, as in Lambda
    jo = Path(__file__).resolve().parents[1] / "data" / "documents" / "jo.pdf"
    options: dict[str, Any] = {"dpi": 150, "max_long_edge": 1568, "image_format": "jpeg", "blank_below": 0.00001}
    # When a worker renders it
    in_worker = asyncio.run(pool.render(jo, DocumentKind.PDF, 1, max_image_pixels=60_000_000, **options))
    # Then it says what it says in this process, its laid-out text layer too
    assert in_worker.draws and "みんなのおのおの" in in_worker.laid_out_text
    rendered = render_page(jo, DocumentKind.PDF, 1, **options)
    assert in_worker == rendered


def test_many_tasks_share_the_workers_concurrently(pool: RenderPool) -> None:
    # Given every corpus page, twice over: more pages than workers
    pages = PAGES * 2

    async def render_all() -> list[RenderedPage]:
        return await asyncio.gather(*(pooled(pool, path, kind, page) for path, kind, page in pages))

    # When they are all rendered at once from one event loop
    rendered = asyncio.run(render_all())
    # Then each page is right, and no more workers than configured ever ran
    assert rendered == [local(path, kind, page) for path, kind, page in pages]
    assert 1 <= len(pool.pids) <= 2


@pytest.mark.parametrize(
    ("through_pool", "in_process"),
    [
        pytest.param(
            lambda pool: pooled(pool, PASSWORD, DocumentKind.PDF, 1),
            lambda: local(PASSWORD, DocumentKind.PDF, 1),
            id="password-protected",
        ),
        pytest.param(
            lambda pool: pooled(pool, FIRST_PAGE, DocumentKind.PDF, 9),
            lambda: local(FIRST_PAGE, DocumentKind.PDF, 9),
            id="no-such-page",
        ),
        pytest.param(
            lambda pool: pool.text_layer(CORPUS / "smile.png", 1),
            lambda: extract_text_layer(CORPUS / "smile.png", 1),
            id="text-of-an-image",
        ),
    ],
)
def test_a_document_error_in_a_worker_carries_the_in_process_reason(
    pool: RenderPool,
    through_pool: Callable[[RenderPool], Coroutine[Any, Any, object]],
    in_process: Callable[[], object],
) -> None:
    # Given a request that sources.py refuses (a password, a page that does not exist, the text of an image)
    render(pool, FIRST_PAGE, DocumentKind.PDF, 1)
    workers = pool.pids
    # When it is made through the pool and in this process
    with pytest.raises(InvalidDocumentError) as refused:
        asyncio.run(through_pool(pool))
    with pytest.raises(InvalidDocumentError) as expected:
        in_process()
    # Then the reason is exactly the in-process one, and the worker stays (the document was bad, not the worker)
    assert refused.value.reason == expected.value.reason
    assert set(workers) <= set(pool.pids)


# Lifecycle


def test_a_worker_whose_parent_is_gone_before_it_is_ready_ends_quietly() -> None:
    # Given the pipe a worker replies on, its reading end already closed (the pool that started it closed at once)
    read_end, write_end = os.pipe()
    os.close(read_end)
    # When the worker starts and says it is ready
    worker = subprocess.run(
        [sys.executable, "-P", "-m", "pagescribe.render_worker", str(write_end), "1024"],
        pass_fds=(write_end,),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=120,
        check=False,
    )
    os.close(write_end)
    # Then it ends with nothing to say: no BrokenPipeError's traceback on the test's or the function's output
    assert (worker.returncode, worker.stderr.decode()) == (0, "")


def test_workers_start_on_first_use_and_are_reused(own_pool: RenderPool) -> None:
    # Given a new pool: no worker yet (a cold start pays nothing until a page is rendered)
    assert own_pool.pids == ()
    # When two pages are rendered one after the other
    render(own_pool, FIRST_PAGE, DocumentKind.PDF, 1)
    first = own_pool.pids
    render(own_pool, CORPUS / "smile.png", DocumentKind.PNG, 1)
    # Then one worker started and served both
    assert len(first) == 1 and own_pool.pids == first


def test_a_prestarted_worker_serves_the_first_request(own_pool: RenderPool) -> None:
    # Given a new pool told to start its worker in the background (the upload function's cold start)
    own_pool.prestart()
    deadline = time.monotonic() + 60
    while not own_pool.pids and time.monotonic() < deadline:  # until the worker is up (or a generous bound)
        time.sleep(0.01)
    started = own_pool.pids
    # When the first document is opened
    info = own_pool.inspect(FIRST_PAGE, max_pages=500, max_image_pixels=60_000_000)
    # Then the worker started beforehand opened it: no other was started
    assert len(started) == 1 and own_pool.pids == started and info.page_count >= 1


def test_a_worker_warmed_up_at_its_start_serves_the_first_page_as_a_fresh_one_would(own_pool: RenderPool) -> None:
    # Given a new pool told to start its worker warmed up (the transcribe function's cold start), and waited for
    for starting in own_pool.prestart(warm=True):
        starting.join(timeout=60)
    started = own_pool.pids
    # When the first page is rendered
    page = render(own_pool, FIRST_PAGE, DocumentKind.PDF, 1)
    # Then the worker that warmed up rendered it, and the page is what a fresh worker makes of it
    assert len(started) == 1 and own_pool.pids == started
    assert page == local(FIRST_PAGE, DocumentKind.PDF, 1)


@pytest.mark.parametrize(("mode", "below"), [("auto", READ_NICENESS), ("always", 0)])
def test_the_reading_process_runs_below_the_function_unless_every_page_waits_for_its_read(
    mode: Literal["auto", "always"], below: int
) -> None:
    # Given an environment whose pages are read a second time by the mode
    runtime = Runtime(Settings(second_read=mode))
    try:
        # When its reading process starts
        for starting in runtime.reading_pool.prestart():
            starting.join(timeout=60)
        [pid] = runtime.reading_pool.pids
        # Then it runs that far below the function's own priority: auto's reads take only the CPU left idle; always's
        # are part of every page's work, which other work on the machine must not starve past the page's deadline
        assert os.getpriority(os.PRIO_PROCESS, pid) - os.getpriority(os.PRIO_PROCESS, 0) == below
    finally:
        runtime.close()


def test_the_warm_up_renders_and_reads_back_a_page_of_text_of_its_own_and_leaves_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a temporary directory of the worker's own
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    # When a worker warms up
    text = warm_up()
    # Then the page it made has text (so that placing words and reading the text layer ran on it) and is gone
    assert text == WARM_UP_TEXT and list(tmp_path.iterdir()) == []


def test_a_worker_killed_while_idle_is_replaced_without_failing_a_page(own_pool: RenderPool) -> None:
    # Given a pool whose worker was killed by the kernel between pages
    render(own_pool, FIRST_PAGE, DocumentKind.PDF, 1)
    [victim] = own_pool.pids
    os.kill(victim, signal.SIGKILL)
    wait_until_dead(victim)
    # When the next page is rendered
    page = render(own_pool, FIRST_PAGE, DocumentKind.PDF, 1)
    # Then it renders on a new worker, and the dead one was reaped
    assert page == local(FIRST_PAGE, DocumentKind.PDF, 1)
    assert own_pool.pids != (victim,) and len(own_pool.pids) == 1
    assert not process_exists(victim)


def test_a_worker_killed_mid_page_fails_that_page_only(own_pool: RenderPool, tmp_path: Path) -> None:
    # Given a page that takes half a minute to render, rendering in the pool's only worker
    slow = tmp_path / "slow.pdf"
    slow.write_bytes(slow_page(20_000))

    async def kill_while_rendering() -> None:
        rendering = asyncio.create_task(pooled(own_pool, slow, DocumentKind.PDF, 1))
        [victim] = await asyncio.to_thread(started_workers, own_pool)
        # When the worker is killed (as the kernel's OOM killer would)
        os.kill(victim, signal.SIGKILL)
        await rendering

    # Then that page fails with a reason naming the limit and the signal
    with pytest.raises(InvalidDocumentError) as failed:
        asyncio.run(kill_while_rendering())
    assert failed.value.reason == (
        "page 1 could not be rendered within RENDER_MEMORY_LIMIT_MB=1024 "
        "(the renderer ran out of memory or crashed: killed by signal 9 (SIGKILL))"
    )
    # And the next page renders on a new worker
    assert render(own_pool, FIRST_PAGE, DocumentKind.PDF, 1).media_type == "image/jpeg"
    assert len(own_pool.pids) == 1


def test_a_page_over_the_time_limit_fails_and_its_worker_is_replaced(tmp_path: Path) -> None:
    # Given a page that takes half a minute to render, and a pool allowing one second per page
    slow = tmp_path / "slow.pdf"
    slow.write_bytes(slow_page(20_000))
    pool = RenderPool(workers=1, memory_limit_mb=1024, timeout_seconds=1)
    try:
        render(pool, FIRST_PAGE, DocumentKind.PDF, 1)
        [stuck] = pool.pids
        # When it is rendered
        with pytest.raises(InvalidDocumentError) as failed:
            render(pool, slow, DocumentKind.PDF, 1)
        # Then it fails naming the setting, the stuck worker is gone, and the next page renders on a new one
        assert failed.value.reason == "page 1 could not be rendered: it took longer than RENDER_TIMEOUT_SECONDS=1"
        assert not process_exists(stuck)
        assert render(pool, FIRST_PAGE, DocumentKind.PDF, 1).width > 0
        assert pool.pids != (stuck,)
    finally:
        pool.close()


def test_close_stops_and_reaps_every_worker() -> None:
    # Given a pool with two running workers
    pool = RenderPool(workers=2, memory_limit_mb=1024, timeout_seconds=GENEROUS_TIMEOUT)

    async def two_at_once() -> None:
        await asyncio.gather(*(pooled(pool, FIRST_PAGE, DocumentKind.PDF, 1) for _ in range(4)))

    asyncio.run(two_at_once())
    workers = pool.pids
    assert workers
    # When it is closed, twice
    pool.close()
    pool.close()
    # Then no worker process is left, not even as a zombie, and the pool refuses more work
    assert pool.pids == ()
    assert [pid for pid in workers if process_exists(pid)] == []
    with pytest.raises(RenderWorkerError, match="closed"):
        render(pool, FIRST_PAGE, DocumentKind.PDF, 1)


def test_settings_out_of_range_are_refused_by_name() -> None:
    # Given settings no pool can work with
    # When a pool is made with them
    # Then each is refused with the setting named
    with pytest.raises(ValueError, match="RENDER_WORKERS"):
        RenderPool(workers=0, memory_limit_mb=1024, timeout_seconds=60)
    with pytest.raises(ValueError, match="RENDER_MEMORY_LIMIT_MB"):
        RenderPool(workers=1, memory_limit_mb=16, timeout_seconds=60)
    with pytest.raises(ValueError, match="RENDER_TIMEOUT_SECONDS"):
        RenderPool(workers=1, memory_limit_mb=1024, timeout_seconds=0)


# Memory bombs


def test_an_image_too_big_for_the_limit_fails_with_the_limit_named(tmp_path: Path) -> None:
    # Given a 60-megapixel bilevel PNG (60 MB decoded, more to flatten) and workers allowed only 128 MiB
    big = tmp_path / "big.png"
    big.write_bytes(bilevel_png(7745, 7745))
    pool = RenderPool(workers=1, memory_limit_mb=128, timeout_seconds=GENEROUS_TIMEOUT)
    try:
        # When it is rendered
        with pytest.raises(InvalidDocumentError) as failed:
            render(pool, big, DocumentKind.PNG, 1)
        # Then Pillow's MemoryError in the worker becomes a reason naming the limit, and the pool carries on
        assert failed.value.reason == (
            "page 1 could not be rendered within RENDER_MEMORY_LIMIT_MB=128 (the renderer ran out of memory)"
        )
        assert render(pool, CORPUS / "smile.png", DocumentKind.PNG, 1).media_type == "image/jpeg"
    finally:
        pool.close()


BOMB_SCENARIO = """
import asyncio, json, sys
from pathlib import Path
from typing import Any
from pagescribe.sources.documents import DocumentKind, InvalidDocumentError
from pagescribe.rendering import RenderPool

async def main(bomb, page):
    pool = RenderPool(workers=1, memory_limit_mb=512, timeout_seconds=120)
    settings = dict(dpi=150, max_long_edge=1568, image_format="jpeg", max_image_pixels=60_000_000)
    reasons = []
    for name in ("render", "text"):
        try:
            if name == "render":
                await pool.render(bomb, DocumentKind.PDF, 1, **settings)
            else:
                await pool.text_layer(bomb, 1)
        except InvalidDocumentError as exc:
            reasons.append(exc.reason)
    after = await pool.render(page, DocumentKind.PDF, 1, **settings)
    pool.close()
    return reasons, after.width

reasons, width = asyncio.run(main(Path(sys.argv[1]), Path(sys.argv[2])))
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
print(json.dumps({"reasons": reasons, "width": width, "peak_rss_kb": int(status["VmHWM"].split()[0])}))
"""


def test_a_decompression_bomb_fails_in_its_worker_while_the_caller_stays_small(tmp_path: Path) -> None:
    # Given a 66 KB PDF whose one page inflates to 2.5 GiB of content (about 2.7 GB of peak memory in-process)
    bomb = tmp_path / "bomb.pdf"
    bomb.write_bytes(decompression_bomb(stream_mib=64, references=40))
    # When a process renders it and reads its text through a pool limited to 512 MiB per worker, then renders a page
    run = subprocess.run(
        [sys.executable, "-c", BOMB_SCENARIO, str(bomb), str(FIRST_PAGE)], capture_output=True, text=True, check=True
    )
    result = json.loads(run.stdout)
    # Then both fail with the limit named, the next page renders, and the calling process never grew near the bomb
    assert result["reasons"] == [
        "page 1 could not be rendered within RENDER_MEMORY_LIMIT_MB=512 "
        "(the renderer ran out of memory or crashed: killed by signal 6 (SIGABRT))",
        "the text of page 1 could not be read within RENDER_MEMORY_LIMIT_MB=512 "
        "(the renderer ran out of memory or crashed: killed by signal 6 (SIGABRT))",
    ]
    assert result["width"] > 0
    assert result["peak_rss_kb"] < 256 * 1024


def test_the_same_construction_under_the_limit_renders(tmp_path: Path) -> None:
    # Given the bomb's construction at a harmless size (4 x 1 MiB of content)
    small = tmp_path / "small.pdf"
    small.write_bytes(decompression_bomb(stream_mib=1, references=4))
    pool = RenderPool(workers=1, memory_limit_mb=512, timeout_seconds=GENEROUS_TIMEOUT)
    try:
        # When it is rendered through the same 512 MiB pool
        page = render(pool, small, DocumentKind.PDF, 1)
    finally:
        pool.close()
    # Then it is a valid (blank) page: it is the bomb's size, not its form, that the limit stops
    assert page == local(small, DocumentKind.PDF, 1)
