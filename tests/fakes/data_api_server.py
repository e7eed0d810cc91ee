"""A local RDS Data API: the rds-data REST JSON wire format, executed on the real PostgreSQL.

POST /Execute, /BeginTransaction, /CommitTransaction, /RollbackTransaction, as botocore's rds-data model sends them.
Each open transaction holds its own psycopg connection; a statement outside one runs autocommitted on a fresh
connection. Parameters are bound as the service binds them: a stringValue as varchar unless its typeHint says
UUID/TIMESTAMP/JSON/DECIMAL/DATE; results come back as typed ``records`` with ``columnMetadata`` (typeName), a
timestamptz as a UTC string without zone, a uuid/numeric/json as a string, an array as arrayValue. An SQL error is a
400 BadRequestException whose message ends with ``SQLState: xxxxx``. ``pause(n)`` makes the next n requests answer
DatabaseResumingException, as a paused Aurora cluster does while it resumes.
"""

from __future__ import annotations

import base64
import json
import re
import threading
import uuid
from datetime import UTC, date, datetime
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import psycopg

_NAMED = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")
_CASTS = {
    "UUID": "uuid",
    "TIMESTAMP": "timestamp",
    "JSON": "jsonb",
    "DECIMAL": "numeric",
    "DATE": "date",
    "TIME": "time",
}


class DataApiError(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def _bind(sql: str, parameters: list[dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    values: dict[str, Any] = {}
    casts: dict[str, str] = {}
    for parameter in parameters:
        name, field = parameter["name"], parameter["value"]
        if field.get("isNull"):
            values[name], casts[name] = None, ""
        elif "stringValue" in field:
            values[name] = field["stringValue"]
            casts[name] = _CASTS.get(parameter.get("typeHint", ""), "varchar")
        elif "blobValue" in field:
            values[name], casts[name] = base64.b64decode(field["blobValue"]), ""
        else:
            values[name], casts[name] = next(iter(field.values())), ""

    def placeholder(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in values:
            raise DataApiError("BadRequestException", f"No value specified for parameter: {name}")
        return f"CAST(%({name})s AS {casts[name]})" if casts[name] else f"%({name})s"

    return _NAMED.sub(placeholder, sql.replace("%", "%%")), values


def _field(value: Any) -> dict[str, Any]:
    if value is None:
        return {"isNull": True}
    if isinstance(value, bool):
        return {"booleanValue": value}
    if isinstance(value, int):
        return {"longValue": value}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, bytes):
        return {"blobValue": base64.b64encode(value).decode()}
    if isinstance(value, datetime):
        moment = value.astimezone(UTC).replace(tzinfo=None) if value.tzinfo else value
        return {"stringValue": moment.isoformat(sep=" ")}
    if isinstance(value, list):
        return {"arrayValue": _array(value)}
    if isinstance(value, dict | Decimal | uuid.UUID | date):
        return {"stringValue": json.dumps(value) if isinstance(value, dict) else str(value)}
    return {"stringValue": str(value)}


def _array(values: list[Any]) -> dict[str, Any]:
    if values and isinstance(values[0], list):
        return {"arrayValues": [_array(v) for v in values]}
    if values and isinstance(values[0], bool):
        return {"booleanValues": values}
    if values and isinstance(values[0], int):
        return {"longValues": values}
    if values and isinstance(values[0], float):
        return {"doubleValues": values}
    return {"stringValues": [str(v) for v in values]}


class FakeDataApi:
    """The server, its open transactions and its pause."""

    def __init__(self, database_url: str) -> None:
        self.database_url = database_url
        self.transactions: dict[str, psycopg.Connection[Any]] = {}
        self.paused_requests = 0
        self.requests = 0
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                try:
                    status, answer = 200, fake.handle(self.path, body)
                except DataApiError as exc:
                    status, answer = 400, {"__type": exc.kind, "message": str(exc)}
                payload = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                if status != 200:
                    self.send_header("x-amzn-ErrorType", answer["__type"])
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *_: object) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> FakeDataApi:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        for connection in self.transactions.values():
            connection.close()

    def pause(self, requests: int) -> None:
        """The next ``requests`` requests find the cluster resuming."""
        with self.lock:
            self.paused_requests = requests

    def handle(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            self.requests += 1
            if self.paused_requests > 0:
                self.paused_requests -= 1
                raise DataApiError("DatabaseResumingException", "The database is resuming after being auto-paused.")
        if path == "/BeginTransaction":
            transaction_id = base64.b64encode(uuid.uuid4().bytes).decode()
            self.transactions[transaction_id] = psycopg.connect(self.database_url, autocommit=False)
            return {"transactionId": transaction_id}
        if path in ("/CommitTransaction", "/RollbackTransaction"):
            return self._finish(path, body)
        if path == "/Execute":
            return self._execute(body)
        raise DataApiError("BadRequestException", f"unknown operation {path}")

    def _finish(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        connection = self.transactions.pop(body.get("transactionId", ""), None)
        if connection is None:
            raise DataApiError("NotFoundException", "Transaction is not found")
        with connection:
            if path == "/CommitTransaction":
                connection.commit()
                return {"transactionStatus": "Transaction Committed"}
            connection.rollback()
            return {"transactionStatus": "Rollback Complete"}

    def _execute(self, body: dict[str, Any]) -> dict[str, Any]:
        transaction_id = body.get("transactionId")
        if transaction_id and transaction_id not in self.transactions:
            raise DataApiError("BadRequestException", "Transaction is not found")
        sql, values = _bind(body["sql"], body.get("parameters", []))
        if transaction_id:
            return self._run(self.transactions[transaction_id], sql, values, body)
        with psycopg.connect(self.database_url, autocommit=True) as connection:
            return self._run(connection, sql, values, body)

    @staticmethod
    def _run(
        connection: psycopg.Connection[Any], sql: str, values: dict[str, Any], body: dict[str, Any]
    ) -> dict[str, Any]:
        try:
            with connection.cursor() as cursor:
                cursor.execute(sql, values, prepare=False)
                if cursor.description is None:
                    return {"numberOfRecordsUpdated": max(cursor.rowcount, 0)}
                types = connection.adapters.types
                columns = []
                for column in cursor.description:
                    info = types.get(column.type_code)
                    columns.append({"name": column.name, "label": column.name, "typeName": info.name if info else ""})
                json_columns = [c["typeName"] in ("json", "jsonb") for c in columns]
                records = [
                    [
                        {"stringValue": json.dumps(v)} if j and v is not None else _field(v)
                        for j, v in zip(json_columns, row, strict=True)
                    ]
                    for row in cursor.fetchall()
                ]
        except psycopg.Error as exc:
            raise DataApiError(
                "BadRequestException", f"ERROR: {exc.diag.message_primary}; SQLState: {exc.sqlstate}"
            ) from exc
        answer: dict[str, Any] = {"records": records, "numberOfRecordsUpdated": 0}
        if body.get("includeResultMetadata"):
            answer["columnMetadata"] = columns
        return answer
