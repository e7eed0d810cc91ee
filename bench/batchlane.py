"""Benchmark: the same pages through the batch lane and through the sync lane, at the fakes' prices.

One PDF (200 pages; 50 with --quick, 10 in a smoke run) is transcribed twice on the local stack (PostgreSQL, moto,
the real handlers): once in the sync lane, a call per page to the fake chat server, and once in the batch lane, its
pages parked by the transcribe function and sent by the sweeper to the fake batch server (the OpenAI-style flow),
which fetches each page's image through its presigned URL and answers at its batch price (half the chat fake's per
token, as providers price batches). The figure is what the batch lane's document cost against the sync lane's, from
the ledger (every call recorded with its cost); each page must be kept once in each lane, with no answer not kept."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import httpx
from pagescribe.domain import DEFAULT_TENANT
from pagescribe.service import NewUpload

from bench.common import CorrectnessError, Mode, Result, connect, fresh_database
from bench.pdfs import build_pdf
from bench.stack import Pipeline, local_pipeline
from tests.fakes.batch_server import SYNC_PRICE_PER_CALL, FakeBatchServer
from tests.fakes.chat_server import FakeChatServer, Ok

PAGES = {Mode.FULL: 200, Mode.QUICK: 50, Mode.SMOKE: 10}
TIMEOUT = 600.0

LEDGER = """
SELECT d.id::text, d.status,
       (SELECT count(*) FROM attempts a WHERE a.document_id = d.id AND a.outcome = 'KEPT') AS kept,
       (SELECT count(*) FROM attempts a WHERE a.document_id = d.id) AS calls,
       (SELECT coalesce(sum(cost), 0) FROM attempts a WHERE a.document_id = d.id) AS spent,
       (SELECT count(DISTINCT a.job_id) FROM attempts a WHERE a.document_id = d.id AND a.outcome = 'KEPT') AS pages
FROM documents d WHERE d.id = ANY(%s::uuid[])
"""


def _create(pipeline: Pipeline, pdf: Path, lane: str) -> str:
    runtime = pipeline.stack.runtime
    upload = NewUpload(filename=f"{lane}.pdf", content_type="application/pdf", lane=lane, reuse=False)
    created = runtime.documents.create(upload, DEFAULT_TENANT)
    httpx.put(created.upload_url, content=pdf.read_bytes(), headers={"Content-Type": "application/pdf"})
    pipeline.deliver_upload()
    return created.document_id


def _until_finished(pipeline: Pipeline, document_ids: list[str]) -> float:
    """Deliver the job messages, then sweep (the batch lane's sends and collections), until both are finished."""
    started, deadline = time.perf_counter(), time.monotonic() + TIMEOUT
    while not all(pipeline.finished(document_id) for document_id in document_ids):
        if time.monotonic() > deadline:
            raise CorrectnessError(f"the documents did not finish within {TIMEOUT:.0f} s")
        while pipeline.lambdas.deliver_jobs(0):
            pass
        with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):  # the sweeper's EMF metrics lines
            pipeline.lambdas.sweep_if_due(force=True)
    return time.perf_counter() - started


def run(mode: Mode, *, scratch: Path) -> Result:
    started = time.perf_counter()
    pages = PAGES[mode]
    pdf = build_pdf(pages, scratch)
    with (
        fresh_database("batchlane") as url,
        FakeChatServer() as chat,
        FakeBatchServer() as batches,
        local_pipeline(
            url,
            PROVIDER_BASE_URL=chat.base_url,
            PROVIDER_API_KEY="bench-key",
            BATCH_BASE_URL=batches.base_url,
            BATCH_DIALECT="openai",
            TEXT_LAYER="off",
            SECOND_READ="off",
        ) as pipeline,
    ):
        chat.set_default(Ok(cost=SYNC_PRICE_PER_CALL))
        lanes = {lane: _create(pipeline, pdf, lane) for lane in ("sync", "batch")}
        wall = _until_finished(pipeline, list(lanes.values()))
        with connect(url) as conn:
            figures = {row[0]: row[1:] for row in conn.execute(LEDGER, (list(lanes.values()),)).fetchall()}
    spent = {}
    for lane, document_id in lanes.items():
        status, kept, calls, cost, distinct = figures[document_id]
        if (status, kept, calls, distinct) != ("COMPLETED", pages, pages, pages):
            raise CorrectnessError(f"the {lane} lane's document ended {status}: {kept} kept of {calls} calls")
        spent[lane] = float(cost)
    if chat.calls != pages or len(batches.answered_ids()) != pages:
        raise CorrectnessError(f"{chat.calls} sync calls and {len(batches.answered_ids())} batch answers")
    ratio = spent["batch"] / spent["sync"]
    return Result(
        key="batchlane",
        title=f"The batch lane against the sync lane ({pages} pages, each lane, at the fakes' prices)",
        ratio_label="batch lane cost / sync lane cost",
        ratio=ratio,
        target=0.55,
        direction="<=",
        summary=f"${spent['batch']:.6f} in the batch lane, ${spent['sync']:.6f} in the sync lane",
        rows=[
            ("pages, each lane", str(pages)),
            ("sync lane: calls / kept / cost", f"{pages} / {pages} / ${spent['sync']:.6f}"),
            ("batch lane: answers / kept / cost", f"{pages} / {pages} / ${spent['batch']:.6f}"),
            ("batches sent", str(len(batches.batches))),
            ("**batch cost / sync cost**", f"**{ratio:.3f}**"),
            ("wall time, both lanes", f"{wall:.1f} s"),
        ],
        notes=[
            f"The chat fake reports ${SYNC_PRICE_PER_CALL} per call; the batch fake reports usage.cost at half its "
            "per-token price. Each batch page's image is fetched by the fake through its presigned URL.",
        ],
        seconds=time.perf_counter() - started,
    )
