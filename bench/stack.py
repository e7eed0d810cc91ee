"""The local pipeline of pagescribe_local.cli.local_stack (moto + the real handlers), instrumented from outside.

Each benchmark that needs AWS gets its own stack, hence a fresh moto server with fresh queues: moto's SQS
costs grow with queue depth, so figures are only compared at equal depth."""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import boto3
import psycopg
from pagescribe_local.cli import LocalStack, local_stack
from pagescribe_local.stack import LambdaService, ServerProcess

from bench.common import QUIET, SYNTHETIC_ANSWERS, CorrectnessError, environment, plain_url
from tests.fakes.chat_server import FakeChatServer

Handler = Callable[[dict[str, Any], Any], Any]


@dataclass(frozen=True)
class Seen:
    """What a fake provider in a process of its own received: its calls, the connections it accepted, the requests'
    bodies."""

    calls: int
    connections: int
    requests: list[dict[str, Any]]


class ChatServerProcess:
    """``FakeChatServer`` answering every call after ``delay`` seconds, in a process of its own: reading and decoding
    each request (a page image of ~0.5 MB, in JSON) happens beside the pipeline, as a remote provider's does, not on
    the pipeline's interpreter."""

    def __init__(self, delay: float) -> None:
        self._process = ServerProcess("fake provider", _serve_chat, delay, start_seconds=60.0)
        self.base_url = ""

    def __enter__(self) -> ChatServerProcess:
        self.base_url = self._process.start()
        return self

    def seen(self) -> Seen:
        return Seen(*self._process.ask("seen"))

    def __exit__(self, *exc: object) -> None:
        self._process.stop()


def _serve_chat(delay: float, connection: Connection) -> None:
    with FakeChatServer(default_delay=delay) as fake:
        connection.send(fake.base_url)
        with contextlib.suppress(EOFError):
            while connection.recv() == "seen":
                connection.send((fake.calls, fake.connections_opened, fake.requests))


@dataclass
class Invocation:
    function: str
    started_at: float  # wall clock (time.time()), comparable with the database's now()
    seconds: float
    job_ids: list[str]
    response: Any


@dataclass
class Pipeline:
    stack: LocalStack
    lambdas: LambdaService
    database_url: str
    s3: Any
    sqs: Any
    invocations: list[Invocation] = field(default_factory=list)
    after_invocation: list[Callable[[Invocation], None]] = field(default_factory=list)
    _watcher: psycopg.Connection[Any] | None = None

    @property
    def bucket(self) -> str:
        return self.stack.resources.bucket

    def put(self, key: str, path: Path) -> None:
        self.s3.put_object(Bucket=self.bucket, Key=key, Body=path.read_bytes())

    def deliver_upload(self) -> Invocation:
        """Deliver the S3 notification of the object just put to the upload function."""
        before = len(self.invocations)
        deadline = time.monotonic() + 30
        while len(self.invocations) == before:
            self.lambdas.deliver_uploads()
            if time.monotonic() > deadline:
                raise CorrectnessError("no S3 notification reached the upload function within 30 s")
        upload = self.invocations[-1]
        assert upload.function == "upload"
        return upload

    def document_id(self, upload: Invocation) -> str:
        [document] = upload.response["documents"]
        if document["status"] != "PROCESSING":
            raise CorrectnessError(f"the upload function did not accept the document: {document}")
        return str(document["document_id"])

    def finished(self, document_id: str) -> bool:
        if self._watcher is None:
            self._watcher = psycopg.connect(plain_url(self.database_url), autocommit=True)
        row = self._watcher.execute("SELECT finished_at IS NOT NULL FROM documents WHERE id = %s", (document_id,))
        found = row.fetchone()
        return bool(found and found[0])

    def close(self) -> None:
        if self._watcher is not None:
            self._watcher.close()

    def run_until_finished(self, document_id: str, *, timeout: float) -> None:
        """Deliver job batches of ten, one at a time (one execution environment), until the document is done."""
        deadline = time.monotonic() + timeout
        while not self.finished(document_id):
            if time.monotonic() > deadline:
                raise CorrectnessError(f"document {document_id} did not finish within {timeout:.0f} s")
            if not self.lambdas.deliver_jobs(0):
                time.sleep(0.005)

    def pages(self, document_id: str) -> list[dict[str, Any]]:
        """Each page's job as the table has it, times as epoch seconds."""
        with psycopg.connect(plain_url(self.database_url), autocommit=True) as conn:
            cur = conn.execute(
                """
                SELECT id::text, page_number, status, attempts, latency_ms,
                       extract(epoch FROM started_at)::float8, extract(epoch FROM completed_at)::float8
                FROM jobs WHERE document_id = %s ORDER BY page_number
                """,
                (document_id,),
            )
            names = ["job_id", "page", "status", "attempts", "latency_ms", "started_at", "completed_at"]
            return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    def check_all_completed(self, document_id: str, pages: int) -> list[dict[str, Any]]:
        rows = self.pages(document_id)
        bad = [r for r in rows if r["status"] != "COMPLETED" or r["attempts"] != 1]
        if len(rows) != pages or bad:
            raise CorrectnessError(f"{len(rows)} of {pages} pages recorded; not completed at first attempt: {bad[:3]}")
        key = f"{self.stack.runtime.settings.transcript_prefix}{document_id}.md"
        self.s3.head_object(Bucket=self.bucket, Key=key)  # the transcript was written
        return rows


def _job_ids(event: dict[str, Any]) -> list[str]:
    ids: list[str] = []
    for record in event.get("Records", []):
        if record.get("eventSource") == "aws:sqs":
            ids.append(str(json.loads(record["body"])["job_id"]))
    return ids


def _instrumented(pipeline_ref: list[Pipeline], function: str, handler: Handler) -> Handler:
    def invoke(event: dict[str, Any], context: Any) -> Any:
        started_at, started = time.time(), time.perf_counter()
        with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):  # the EMF metrics lines
            response = handler(event, context)
        invocation = Invocation(function, started_at, time.perf_counter() - started, _job_ids(event), response)
        pipeline = pipeline_ref[0]
        pipeline.invocations.append(invocation)
        for hook in pipeline.after_invocation:
            hook(invocation)
        return response

    return invoke


@contextmanager
def local_pipeline(database_url: str, *, aws_apart: bool = False, **settings: str) -> Iterator[Pipeline]:
    """The local stack on ``database_url`` with the given settings, its handlers timed per invocation. With
    ``aws_apart``, what stands in for AWS works apart from the handlers' interpreter, as AWS does: moto in a process
    of its own, and the event source's receives and deletes on a thread of their own, ahead of the handler."""
    values = {**QUIET, **SYNTHETIC_ANSWERS, "DATABASE_URL": database_url, "MODEL": "bench/vision-model", **settings}
    with (
        environment(**values),
        tempfile.TemporaryDirectory(prefix="bench-stack-") as scratch,
        local_stack(data_dir=Path(scratch), aws_port=0, sweep_every=3600.0, aws_own_process=aws_apart) as stack,
    ):
        ref: list[Pipeline] = []
        handlers = {
            name: importlib.import_module(f"pagescribe.handlers.{name}").handler for name in ("upload", "transcribe")
        }
        sweeper = importlib.import_module("pagescribe.handlers.sweeper").handler
        lambdas = LambdaService(
            stack.resources,
            upload=_instrumented(ref, "upload", handlers["upload"]),
            transcribe=_instrumented(ref, "transcribe", handlers["transcribe"]),
            sweeper=sweeper,
            transcribe_timeout=stack.runtime.settings.function_timeout_seconds,
            sweep_every=3600.0,
            receive_ahead=aws_apart,
        )
        pipeline = Pipeline(stack, lambdas, database_url, boto3.client("s3"), boto3.client("sqs"))
        ref.append(pipeline)
        try:
            yield pipeline
        finally:
            lambdas.close()
            pipeline.close()
