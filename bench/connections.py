"""Benchmark 2: provider connections over 10 warm invocations of the transcribe function (100 pages; a smoke run:
2 invocations, 20 pages)."""

from __future__ import annotations

import time
from pathlib import Path

from bench.common import Mode, Result, fresh_database
from bench.pdfs import build_pdf
from bench.stack import Invocation, local_pipeline
from tests.fakes.chat_server import FakeChatServer

# pages: batches of ten, one warm invocation each. SMOKE: two, the fewest in which a second invocation reuses the
# first one's connections, every page still checked completed at its first attempt.
PAGES = {Mode.FULL: 100, Mode.QUICK: 100, Mode.SMOKE: 20}
PAGE_CONCURRENCY = 10
DELAY = 0.25  # long enough that the ten pages of a batch are in flight together


def run(mode: Mode, *, scratch: Path) -> Result:
    pages = PAGES[mode]
    started = time.perf_counter()
    pdf = build_pdf(pages, scratch)
    with (
        fresh_database("connections") as url,
        FakeChatServer(default_delay=DELAY) as fake,
        local_pipeline(url, PROVIDER_BASE_URL=fake.base_url, PAGE_CONCURRENCY=str(PAGE_CONCURRENCY)) as pipeline,
    ):
        opened: list[int] = []

        def count_connections(invocation: Invocation) -> None:
            if invocation.function == "transcribe":
                opened.append(fake.connections_opened)

        pipeline.after_invocation.append(count_connections)
        pipeline.put(f"uploads/bench-{pages}-pages.pdf", pdf)
        document_id = pipeline.document_id(pipeline.deliver_upload())
        pipeline.run_until_finished(document_id, timeout=180)
        pipeline.check_all_completed(document_id, pages)
        connections, calls = fake.connections_opened, fake.calls
    invocations = len(opened)
    per_invocation = [b - a for a, b in zip([0, *opened], opened, strict=False)]
    return Result(
        key="connections",
        title=f"Connection reuse ({pages} pages, {invocations} warm invocations of 10 messages)",
        ratio_label="connections opened / PAGE_CONCURRENCY",
        ratio=connections / PAGE_CONCURRENCY,
        target=1.0,
        direction="<=",
        summary=(
            f"{connections} TCP connections to the provider for {calls} calls "
            f"(target <= {PAGE_CONCURRENCY}; a client per page would open {pages})"
        ),
        rows=[
            ("provider calls (pages transcribed)", f"{calls}"),
            ("**TCP connections opened to the provider** (FakeChatServer.connections_opened)", f"**{connections}**"),
            ("PAGE_CONCURRENCY (the client's pool size)", f"{PAGE_CONCURRENCY}"),
            ("new connections per invocation", ", ".join(map(str, per_invocation))),
            ("transcribe invocations", f"{invocations}"),
        ],
        notes=[f"The fake provider answers after {DELAY} s so that a batch's ten calls overlap."],
        seconds=time.perf_counter() - started,
    )
