"""Benchmark 4: fan-out of a 1,000-page PDF (300 with --quick, 100 in a smoke run) by the upload function vs a bare
SendMessageBatch loop."""

from __future__ import annotations

import secrets
import time
import uuid
from pathlib import Path
from typing import Any

from pagescribe.aws import SQS_BATCH_LIMIT, JobMessage, sqs_client
from sqlalchemy import text

from bench.common import ApiCalls, CallTimer, CorrectnessError, Mode, Result, StorageTimer, fresh_database, median
from bench.pdfs import build_pdf
from bench.stack import local_pipeline


def _fresh_queue(sqs: Any, name: str) -> str:
    """A new queue shaped like the jobs queue (same visibility timeout), empty."""
    return str(
        sqs.create_queue(QueueName=f"{name}-{secrets.token_hex(4)}", Attributes={"VisibilityTimeout": "1800"})[
            "QueueUrl"
        ]
    )


def _bare_loop(sqs: Any, queue_url: str, count: int) -> tuple[float, list[float], ApiCalls]:
    """``count`` job messages (same bodies as the upload's) in batches of ten: total and per-call seconds."""
    calls = ApiCalls()
    calls.attach(sqs)
    messages = [JobMessage(str(uuid.uuid4()), str(uuid.uuid4()), page) for page in range(1, count + 1)]
    durations: list[float] = []
    started = time.perf_counter()
    for start in range(0, count, SQS_BATCH_LIMIT):
        chunk = messages[start : start + SQS_BATCH_LIMIT]
        entries = [{"Id": str(i), "MessageBody": m.to_json(), "DelaySeconds": 0} for i, m in enumerate(chunk)]
        call_started = time.perf_counter()
        response = sqs.send_message_batch(QueueUrl=queue_url, Entries=entries)
        durations.append(time.perf_counter() - call_started)
        assert len(response.get("Successful", [])) == len(chunk)
    return time.perf_counter() - started, durations, calls


def _depth(sqs: Any, queue_url: str) -> int:
    attributes = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["ApproximateNumberOfMessages"])
    return int(attributes["Attributes"]["ApproximateNumberOfMessages"])


# pages of the PDF: jobs and messages. SMOKE: ten SendMessageBatch calls each side, every message and job still
# counted (sent, in the queue, stamped enqueued).
PAGES = {Mode.FULL: 1000, Mode.QUICK: 300, Mode.SMOKE: 100}


def run(mode: Mode, *, scratch: Path) -> Result:
    pages = PAGES[mode]
    started = time.perf_counter()
    pdf = build_pdf(pages, scratch)
    with fresh_database("fanout") as url, local_pipeline(url, MAX_PAGES=str(pages)) as pipeline:
        runtime = pipeline.stack.runtime
        upload_calls = ApiCalls()
        upload_calls.attach(runtime.queue._client)  # the upload function's SQS client (private: a benchmark)
        upload_calls.attach(runtime.objects._client)
        db = StorageTimer()
        db.attach(runtime.db)
        sends, download = CallTimer(["send"]), CallTimer(["download"])
        sends.attach(runtime.queue)
        download.attach(runtime.objects)
        probe = sqs_client()
        _bare_loop(probe, _fresh_queue(probe, "bench-warmup"), 20)  # warm moto's SQS code paths, not counted

        pipeline.put(f"uploads/bench-{pages}-pages.pdf", pdf)
        upload = pipeline.deliver_upload()
        document_id = pipeline.document_id(upload)
        sent = upload.response["documents"][0]["messages_sent"]
        queue_depth = _depth(probe, pipeline.stack.resources.queue_url)
        with runtime.db.engine.connect() as conn:
            committed = conn.execute(
                text("SELECT count(*) FROM jobs WHERE document_id = :id AND enqueued_at IS NOT NULL"),
                {"id": document_id},
            ).scalar_one()

        bare_seconds, bare_calls_durations, bare_calls = _bare_loop(probe, _fresh_queue(probe, "bench-bare"), pages)
    if (sent, queue_depth, committed) != (pages, pages, pages):
        raise CorrectnessError(f"fan-out: {sent} sent, {queue_depth} in the queue, {committed} jobs stamped enqueued")
    ratio = upload.seconds / bare_seconds
    sqs_upload = upload_calls.count("sqs:")
    tenth = max(1, len(bare_calls_durations) // 10)
    first, last = bare_calls_durations[:tenth], bare_calls_durations[-tenth:]
    return Result(
        key="fanout",
        title=f"Fan-out ({pages:,}-page PDF: {pages:,} jobs and messages)",
        ratio_label="upload function / bare SendMessageBatch loop",
        ratio=ratio,
        target=None,
        direction="<=",
        summary=(
            f"upload {upload.seconds:.2f} s vs bare loop {bare_seconds:.2f} s (fresh queues); SQS calls "
            f"{sqs_upload} vs {bare_calls.count('sqs:')}; database {db.total_seconds * 1000:.0f} ms in "
            f"{db.total_calls} calls"
        ),
        rows=[
            ("upload function: S3 event -> jobs committed and messages sent (handler time)", f"{upload.seconds:.2f} s"),
            (f"bare SendMessageBatch loop, {pages:,} messages to a fresh queue", f"{bare_seconds:.2f} s"),
            ("upload / bare loop", f"{ratio:.2f}"),
            ("SQS API calls, upload function", f"{sqs_upload} ({upload_calls.describe('sqs:')})"),
            ("SQS API calls, bare loop", f"{bare_calls.count('sqs:')} ({bare_calls.describe('sqs:')})"),
            ("S3 API calls, upload function", f"{upload_calls.count('s3:')} ({upload_calls.describe('s3:')})"),
            ("database time of the upload (Database calls)", f"{db.total_seconds * 1000:.0f} ms: {db.describe()}"),
            ("upload: sending the messages (JobQueue.send)", f"{sends.total_seconds:.2f} s"),
            ("upload: downloading the PDF from S3", f"{download.total_seconds:.2f} s"),
            (
                "upload: the rest (page count, event parsing, logging)",
                f"{upload.seconds - db.total_seconds - sends.total_seconds - download.total_seconds:.2f} s",
            ),
            (
                "bare loop, one SendMessageBatch call: first tenth / last tenth of the queue (median)",
                f"{median(first) * 1000:.0f} ms / {median(last) * 1000:.0f} ms (moto recounts the queue per message)",
            ),
        ],
        notes=["Both phases send into a queue that starts empty (moto's cost per message grows with queue depth)."],
        seconds=time.perf_counter() - started,
    )
