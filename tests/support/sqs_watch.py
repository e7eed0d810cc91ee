"""A relay in front of the AWS endpoint that looks at every page-job message as it is sent.

For each SQS SendMessage or SendMessageBatch it asks PostgreSQL, over a connection of its own and before passing the
request on, which of the jobs the messages name are visible: a job that is not was sent before its transaction
committed (or was never committed). The sender waits for the relay's answer, so what it sees is what a consumer
receiving the message at once would see, deterministically.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

import httpx
import psycopg


@dataclass(frozen=True)
class Send:
    action: str
    job_ids: tuple[str, ...]
    visible: frozenset[str]  # the job ids that a separate connection saw committed when the send arrived


@dataclass
class SqsSendWatch:
    upstream: str
    database_url: str  # a libpq URL
    sends: list[Send] = field(default_factory=list)

    def __enter__(self) -> SqsSendWatch:
        watch = self

        class Relay(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _relay(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                target = self.headers.get("X-Amz-Target", "")
                if target in ("AmazonSQS.SendMessage", "AmazonSQS.SendMessageBatch"):
                    watch._observe(target.split(".", 1)[1], json.loads(body))
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
                answer = httpx.request(self.command, watch.upstream + self.path, content=body, headers=headers)
                self.send_response(answer.status_code)
                for name, value in answer.headers.items():
                    if name.lower() not in ("content-length", "transfer-encoding", "connection", "content-encoding"):
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(answer.content)))
                self.end_headers()
                self.wfile.write(answer.content)

            do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _relay

            def log_message(self, *args: Any) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Relay)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def _observe(self, action: str, request: dict[str, Any]) -> None:
        bodies = [entry["MessageBody"] for entry in request.get("Entries", [])] or [request.get("MessageBody", "{}")]
        job_ids = tuple(str(json.loads(body)["job_id"]) for body in bodies)
        with psycopg.connect(self.database_url, autocommit=True) as connection:
            rows = connection.execute("SELECT id::text FROM jobs WHERE id = ANY(%s::uuid[])", [list(job_ids)])
            visible = frozenset(row[0] for row in rows)
        self.sends.append(Send(action, job_ids, visible))

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
