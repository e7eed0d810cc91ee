"""Benchmark 8: cost caps under 3x duplicate delivery to 8 concurrent environments.

Ten 10-page documents (4 with --quick, 2 in a smoke run), each capped so that its cap is reached at page k
(k = 0..9): ``max_cost_usd`` = (k + 0.5) x the price the fake provider reports per call. Every job message is sent
three times (SQS delivers at least once), and eight environments transcribe concurrently. Each document must spend
exactly what the provider reported for its k pages done, and no call may start once its cap is reached."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
from pagescribe.aws import JobMessage
from pagescribe.domain import DEFAULT_TENANT
from pagescribe.service import NewUpload

from bench.common import CorrectnessError, Mode, Result, connect, fresh_database
from bench.governor import ENVIRONMENTS, Environment, run_environments
from bench.pdfs import build_pdf
from bench.stack import local_pipeline
from tests.fakes.chat_server import FakeChatServer, Ok

PRICE = 0.0004  # USD the fake provider reports per call
PAGES = 10
COPIES = 3


# capped documents, k = 0 .. documents - 1. SMOKE: two, a cap reached before any page (k = 0) and one after a page
# (k = 1), each page's message still delivered three times to eight environments and every document's spend checked.
DOCUMENTS = {Mode.FULL: 10, Mode.QUICK: 4, Mode.SMOKE: 2}


def run(mode: Mode, *, scratch: Path) -> Result:
    started = time.perf_counter()
    documents = DOCUMENTS[mode]
    pdf = build_pdf(PAGES, scratch)
    with (
        fresh_database("caps") as url,
        FakeChatServer() as fake,
        local_pipeline(url, PROVIDER_BASE_URL=fake.base_url, PROVIDER_TIMEOUT_SECONDS="60") as pipeline,
    ):
        fake.set_default(Ok(cost=PRICE))
        runtime = pipeline.stack.runtime
        # the model's price, known from one earlier page (before its first call a capped document calls one at a time)
        pipeline.put("uploads/seed.pdf", build_pdf(1, scratch))
        seed = pipeline.document_id(pipeline.deliver_upload())
        stop = threading.Event()
        run_environments(pipeline, [seed], [Environment(runtime.settings.require("queue_url"), stop)], stop, timeout=60)
        seed_calls = fake.calls

        capped: dict[str, int] = {}  # document id -> k, the pages its cap pays for
        for k in range(documents):
            created = runtime.documents.create(
                NewUpload(filename=f"capped-{k}.pdf", content_type="application/pdf", max_cost_usd=(k + 0.5) * PRICE),
                DEFAULT_TENANT,
            )
            httpx.put(created.upload_url, content=pdf.read_bytes(), headers={"Content-Type": "application/pdf"})
            pipeline.deliver_upload()
            capped[created.document_id] = k
        with connect(url) as conn:
            jobs = conn.execute(
                "SELECT id::text, document_id::text, page_number FROM jobs WHERE document_id = ANY(%s::uuid[])",
                (list(capped),),
            ).fetchall()
        for _ in range(COPIES - 1):  # each message twice more: three deliveries of every page
            runtime.queue.send([JobMessage(job_id, document_id, page) for job_id, document_id, page in jobs])

        stop = threading.Event()
        environments = [Environment(runtime.settings.require("queue_url"), stop) for _ in range(ENVIRONMENTS)]
        wall = run_environments(pipeline, list(capped), environments, stop, timeout=300)

        with connect(url) as conn:
            figures = conn.execute(
                """
                SELECT d.id::text, d.status,
                       (SELECT count(*) FROM attempts a WHERE a.document_id = d.id) AS calls,
                       (SELECT coalesce(sum(cost), 0) FROM attempts a WHERE a.document_id = d.id) AS spent,
                       (SELECT count(*) FROM jobs j WHERE j.document_id = d.id AND j.status = 'COMPLETED') AS done,
                       (SELECT count(*) FROM jobs j WHERE j.document_id = d.id AND j.status = 'SKIPPED') AS skipped
                FROM documents d WHERE d.id = ANY(%s::uuid[])
                """,
                (list(capped),),
            ).fetchall()
    made = fake.calls - seed_calls
    recorded = sum(row[2] for row in figures)
    if made != recorded:
        raise CorrectnessError(f"the provider received {made} calls for the capped documents, {recorded} recorded")
    exact = beyond = 0
    for document_id, status, calls, spent, done, skipped in figures:
        k = capped[document_id]
        if done + skipped != PAGES or status != "PARTIAL":
            raise CorrectnessError(f"document {document_id} (cap at page {k}) ended {status}, {done}/{skipped}")
        exact += done == k and calls == k and float(spent) == round(k * PRICE, 8)
        beyond += max(0, calls - k)
    ratio = exact / len(capped)
    return Result(
        key="caps",
        title=f"Cost caps ({len(capped)} documents of {PAGES} pages, every message delivered {COPIES}x, "
        f"{ENVIRONMENTS} environments)",
        ratio_label="documents spending exactly the provider-reported cost of their pages done",
        ratio=ratio,
        target=1.0,
        direction=">=",
        summary=f"{exact} of {len(capped)} exact; calls started after a cap was reached: {beyond}",
        rows=[
            ("documents, cap reached at page k = 0 ..", f"{len(capped)} (k = 0..{len(capped) - 1})"),
            ("job messages delivered (each page's message sent 3 times)", str(len(jobs) * COPIES)),
            ("calls the provider received / calls recorded", f"{made} / {recorded}"),
            ("pages done = k, calls = k, spend = k x the reported price", f"**{exact} of {len(capped)}**"),
            ("**calls started after a cap was reached**", f"**{beyond}**"),
            ("wall time, 8 environments", f"{wall:.1f} s"),
        ],
        notes=[
            f"The provider reports ${PRICE} per call; the gate prices a call at the model's mean over its latest calls "
            "and holds it against the cap while the call runs, under the document's row lock.",
        ],
        seconds=time.perf_counter() - started,
    )
