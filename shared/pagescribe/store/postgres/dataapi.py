"""The same statements over the RDS Data API (boto3 ``rds-data``): the executor of the scale-to-zero profile.

``DataApiConnected`` replaces ``Connected``'s two primitives and nothing else, so every concern's SQL runs unchanged:
``_rows`` is one ExecuteStatement (autocommitted), and ``_with_connection`` hands ``work`` a small connection-like
object whose ``transaction()`` is BeginTransaction … CommitTransaction (RollbackTransaction on an exception) and whose
cursor's ``execute`` is ExecuteStatement with the transaction's id.

Translation, both ways:
- psycopg's ``%(name)s`` becomes the Data API's ``:name`` (``%%`` becomes ``%``); each value a typed SqlParameter:
  str, int, float, bool, None, bytes as themselves; a UUID with the UUID type hint (a str only under one of the
  names in ``UUID_PARAMETERS``); a datetime with
  the TIMESTAMP hint (in UTC); ``Jsonb`` with the JSON hint; a list as PostgreSQL's array literal (every array
  parameter here is written ``CAST(%(x)s AS type[])``).
- results come back typed (``records`` with ``columnMetadata``) and are read by the column's type name into what
  psycopg returns: datetime with its time zone, dict/list for json, Decimal for numeric; uuids as str.
- an SQL error comes back as BadRequestException whose message ends with ``SQLState: xxxxx``: it is raised as
  psycopg's exception class of that SQLSTATE, so that code catching e.g. ``LockNotAvailable`` is unchanged.

A paused cluster answers DatabaseResumingException while Aurora resumes (seconds to tens of seconds): the request is
sent again after a growing pause, logged, until ``resume_timeout`` seconds have passed; then
``DatabaseResumingError`` is raised and the SQS message that led here is retried later (nothing is lost).
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from collections import namedtuple
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any, TypeVar

import psycopg
from botocore.exceptions import ClientError
from psycopg.types.json import Jsonb

log = logging.getLogger(__name__)

T = TypeVar("T")

_PLACEHOLDER = re.compile(r"%\((\w+)\)s|%%")
_UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
_SQLSTATE = re.compile(r"SQLState: (\w{5})")
# The parameters the statements compare with or write to uuid columns: a str of these is sent with the UUID type
# hint. By name, not by look: a text value (a tenant id, a provider's request id) may look like a UUID too.
UUID_PARAMETERS = frozenset({"id", "document_id", "donor_id", "job_id", "lease_token", "before_id", "batch_id"})


class DatabaseResumingError(RuntimeError):
    """The paused Aurora cluster did not resume within the wait allowed: try again later."""


def data_api_sql(statement: str) -> str:
    """psycopg's ``%(name)s`` placeholders as the Data API's ``:name``."""
    return _PLACEHOLDER.sub(lambda m: f":{m.group(1)}" if m.group(1) else "%", statement)


def _array_literal(values: list[Any]) -> str:
    def item(value: Any) -> str:
        if value is None:
            return "NULL"
        text = str(value).replace("\\", "\\\\").replace('"', '\\"')
        return f'"{text}"'

    return "{" + ",".join(item(v) for v in values) + "}"


def sql_parameter(name: str, value: Any) -> dict[str, Any]:  # noqa: C901 - one branch per Python type
    """One psycopg parameter as a Data API SqlParameter."""
    if value is None:
        return {"name": name, "value": {"isNull": True}}
    if isinstance(value, bool):
        return {"name": name, "value": {"booleanValue": value}}
    if isinstance(value, int):
        return {"name": name, "value": {"longValue": value}}
    if isinstance(value, float):
        return {"name": name, "value": {"doubleValue": value}}
    if isinstance(value, Decimal):
        return {"name": name, "value": {"stringValue": str(value)}, "typeHint": "DECIMAL"}
    if isinstance(value, bytes):
        return {"name": name, "value": {"blobValue": value}}
    if isinstance(value, Jsonb):
        return {"name": name, "value": {"stringValue": json.dumps(value.obj)}, "typeHint": "JSON"}
    if isinstance(value, datetime):
        moment = value.astimezone(UTC) if value.tzinfo else value
        return {
            "name": name,
            "value": {"stringValue": moment.strftime("%Y-%m-%d %H:%M:%S.%f")},
            "typeHint": "TIMESTAMP",
        }
    if isinstance(value, list | tuple):
        return {"name": name, "value": {"stringValue": _array_literal(list(value))}}
    if isinstance(value, uuid.UUID) or (name in UUID_PARAMETERS and isinstance(value, str) and _UUID.match(value)):
        return {"name": name, "value": {"stringValue": str(value)}, "typeHint": "UUID"}
    return {"name": name, "value": {"stringValue": str(value)}}


def _timestamp(text: str, zone: bool) -> datetime:
    moment = datetime.fromisoformat(text)
    return moment.replace(tzinfo=UTC) if zone and moment.tzinfo is None else moment


def _scalar(type_name: str, field: dict[str, Any]) -> Any:
    if field.get("isNull"):
        return None
    if "arrayValue" in field:
        return _array(field["arrayValue"])
    if "stringValue" not in field:
        return next(iter(field.values()))
    text: str = field["stringValue"]
    if type_name in ("json", "jsonb"):
        return json.loads(text)
    if type_name == "numeric":
        return Decimal(text)
    if type_name in ("timestamptz", "timestamp"):
        return _timestamp(text, type_name == "timestamptz")
    if type_name == "date":
        return date.fromisoformat(text)
    return text


def _array(value: dict[str, Any]) -> list[Any]:
    if "arrayValues" in value:
        return [_array(v) for v in value["arrayValues"]]
    return list(next(iter(value.values()), []))


def result_rows(response: dict[str, Any]) -> list[Any]:
    """ExecuteStatement's typed records as namedtuple rows, like psycopg's ``namedtuple_row``."""
    columns = response.get("columnMetadata") or []
    if not columns:
        return []
    Row = namedtuple("Row", [c.get("label") or c["name"] for c in columns], rename=True)  # type: ignore[misc]
    types = [c.get("typeName", "") for c in columns]
    return [Row(*(_scalar(t, f) for t, f in zip(types, record, strict=True))) for record in response.get("records", [])]


class DataApi:
    """The rds-data client and the cluster it speaks to; every call waits out a resuming cluster."""

    def __init__(
        self,
        client: Any,
        *,
        cluster_arn: str,
        secret_arn: str,
        database: str,
        resume_timeout: float = 60.0,
        first_pause: float = 0.5,
    ) -> None:
        self.client = client
        self.target = {"resourceArn": cluster_arn, "secretArn": secret_arn}
        self.database = database
        self.resume_timeout = resume_timeout
        self.first_pause = first_pause

    def call(self, operation: str, **request: Any) -> dict[str, Any]:
        send = getattr(self.client, operation)
        deadline = time.monotonic() + self.resume_timeout
        pause = self.first_pause
        while True:
            try:
                response: dict[str, Any] = send(**self.target, **request)
                return response
            except ClientError as exc:
                code = exc.response.get("Error", {}).get("Code", "")
                message = str(exc.response.get("Error", {}).get("Message", exc))
                if code == "DatabaseResumingException":
                    if time.monotonic() + pause > deadline:
                        raise DatabaseResumingError(
                            f"the Aurora cluster is still resuming after {self.resume_timeout:.0f} s; try again later"
                        ) from exc
                    log.warning("the database is resuming from a pause; asking again in %.1f s", pause)
                    time.sleep(pause)
                    pause = min(pause * 2, 8.0)
                    continue
                state = _SQLSTATE.search(message)
                if code == "BadRequestException" and state:
                    raise psycopg.errors.lookup(state.group(1))(message) from exc
                raise

    def execute(self, statement: str, params: dict[str, Any], transaction_id: str | None = None) -> list[Any]:
        request: dict[str, Any] = {
            "sql": data_api_sql(statement),
            "parameters": [sql_parameter(k, v) for k, v in params.items()],
            "includeResultMetadata": True,
            "database": self.database,
        }
        if transaction_id:
            request["transactionId"] = transaction_id
        return result_rows(self.call("execute_statement", **request))


class DataApiCursor:
    """What the stores use of a psycopg cursor: ``execute`` (chainable), ``fetchone``, ``fetchall``."""

    def __init__(self, connection: DataApiConnection) -> None:
        self.connection = connection
        self._rows: list[Any] = []

    def __enter__(self) -> DataApiCursor:
        return self

    def __exit__(self, *_: object) -> None:
        return None

    def execute(self, statement: str, params: dict[str, Any] | None = None) -> DataApiCursor:
        self._rows = self.connection.api.execute(statement, params or {}, self.connection.transaction_id)
        return self

    def fetchone(self) -> Any | None:
        return self._rows[0] if self._rows else None

    def fetchall(self) -> list[Any]:
        return list(self._rows)


class DataApiConnection:
    """What the stores use of a psycopg connection: ``transaction()``, ``cursor()``, ``execute``."""

    def __init__(self, api: DataApi) -> None:
        self.api = api
        self.transaction_id: str | None = None

    @contextmanager
    def transaction(self) -> Iterator[None]:
        begun = self.api.call("begin_transaction", database=self.api.database)
        self.transaction_id = str(begun["transactionId"])
        try:
            yield
        except BaseException:
            self.api.call("rollback_transaction", transactionId=self.transaction_id)
            raise
        else:
            self.api.call("commit_transaction", transactionId=self.transaction_id)
        finally:
            self.transaction_id = None

    def cursor(self, **_: Any) -> DataApiCursor:
        return DataApiCursor(self)

    def execute(self, statement: str, params: dict[str, Any] | None = None) -> DataApiCursor:
        return self.cursor().execute(statement, params)


class DataApiConnected:
    """``Connected``'s two primitives over the Data API (``DataApiDatabase`` mixes this in before ``Database``)."""

    def __init__(self, api: DataApi) -> None:
        self.api = api

    def _with_connection(self, work: Callable[[Any], T]) -> T:
        return work(DataApiConnection(self.api))

    def _rows(self, statement: str, params: dict[str, Any]) -> list[Any]:
        return self.api.execute(statement, params)

    def _row(self, statement: str, params: dict[str, Any]) -> Any | None:
        rows = self._rows(statement, params)
        return rows[0] if rows else None

    def _each_in_one_transaction(self, runs: Sequence[tuple[str, dict[str, Any]]]) -> list[list[Any]]:
        """Each statement with its own parameters, in one transaction, one request each (the Data API runs one statement
        a request): each one's rows."""
        connection = DataApiConnection(self.api)
        with connection.transaction():
            return [self.api.execute(statement, params, connection.transaction_id) for statement, params in runs]
