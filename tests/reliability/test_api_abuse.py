"""Abuse of the REST API through the api handler, with real API Gateway (REST, proxy) events, against moto
and PostgreSQL: every bad request gets the right 4xx, never a 500, no answer leaks internals, and the tables
are intact afterwards."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest
from pagescribe.handlers import api as api_app
from pagescribe.runtime import shutdown_runtime
from pagescribe.settings import get_settings
from pagescribe.store.postgres import Database
from sqlalchemy import text

from tests.support.aws_events import LambdaContext, api_event
from tests.support.pipeline import Pipeline

pytestmark = pytest.mark.integration

API_KEY = "abuse-test-key-0123456789abcdef"
VALID = {"filename": "report.pdf", "content_type": "application/pdf"}
# What would betray the implementation: a stack trace, the database driver, source paths, SQL of our own.
LEAK_MARKERS = (
    "Traceback",
    'File "',
    ".py",
    "sqlalchemy",
    "psycopg",
    "postgres",
    "/work/",
    "site-packages",
    "SELECT ",
    "INSERT INTO",
    "UPDATE jobs",
    "FROM jobs",
    "FROM documents",
    "internal error",
)
SQL_LOOKING = ["' OR 1=1 --", "1; DROP TABLE jobs", "1' OR '1'='1", "'; DELETE FROM documents; --", "1 UNION SELECT 1"]
NOT_UUIDS = ["", "0", "null", "not-a-uuid", "00000000-0000-0000-0000-00000000000G", "x" * 5000, "%00", "..", "%2e%2e"]


@pytest.fixture
def api(pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch) -> Iterator[Pipeline]:
    monkeypatch.setenv("API_KEY", API_KEY)
    shutdown_runtime()
    get_settings.cache_clear()
    yield pipeline
    shutdown_runtime()


def send(event: dict[str, Any]) -> tuple[int, str]:
    """Invoke the API function; every answer, whatever the request, is a non-5xx JSON-or-text body without leaks."""
    response = api_app.handler(event, LambdaContext(29))
    status, body = int(response["statusCode"]), str(response["body"])
    assert status < 500, (status, body)
    leaked = [marker for marker in LEAK_MARKERS if marker.lower() in body.lower()]
    assert leaked == [], (leaked, body)
    return status, body


def call(
    method: str, path: str, *, body: Any = None, key: str | None = API_KEY, query: dict[str, str] | None = None
) -> tuple[int, Any]:
    headers = {"x-api-key": key} if key is not None else {}
    raw = body if isinstance(body, str) or body is None else json.dumps(body)
    status, answer = send(api_event(method, path, body=raw, headers=headers, query=query))
    try:
        return status, json.loads(answer)
    except json.JSONDecodeError:
        return status, answer


def _counts(db: Database) -> dict[str, int]:
    with db.engine.connect() as conn:
        tables = conn.execute(
            text("SELECT count(*) FROM pg_tables WHERE schemaname = 'public' AND tablename IN ('documents', 'jobs')")
        ).scalar_one()
        return {
            "tables": int(tables),
            "documents": int(conn.execute(text("SELECT count(*) FROM documents")).scalar_one()),
            "jobs": int(conn.execute(text("SELECT count(*) FROM jobs")).scalar_one()),
        }


# Authentication


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/documents"),
        ("GET", f"/documents/{uuid.UUID(int=1)}"),
        ("GET", f"/documents/{uuid.UUID(int=1)}/transcript"),
        ("POST", f"/documents/{uuid.UUID(int=1)}/retry"),
        ("PUT", f"/documents/{uuid.UUID(int=1)}/pages/1/correction"),
        ("GET", f"/documents/{uuid.UUID(int=1)}/pages/1/figures"),
        ("GET", "/no/such/route"),
        ("GET", "/review/vendor/purify.min.js"),  # the review page's files are one segment below /review
        ("GET", "/reviews"),
    ],
)
def test_every_route_but_health_wants_the_right_key(api: Pipeline, method: str, path: str) -> None:
    # Given API_KEY is set; When a request comes without a key, with an empty one, or with a wrong one
    missing = call(method, path, body=VALID, key=None)
    empty = call(method, path, body=VALID, key="")
    wrong = [
        call(method, path, body=VALID, key=bad)[0]
        for bad in ("wrong", API_KEY[:-1], API_KEY + "x", f" {API_KEY}", API_KEY.upper(), "ключ-🔑", "' OR 1=1 --")
    ]
    # Then it is refused before anything else happens: 401 without a key, 403 with a wrong one
    assert missing == (401, {"message": "missing API key: send it in the x-api-key header"})
    assert empty[0] == 401
    assert wrong == [403] * 7


def test_the_key_header_name_is_case_insensitive_and_health_needs_none(api: Pipeline) -> None:
    # Given the key sent under header names spelled as different clients spell them
    some_id = uuid.UUID(int=2)
    for name in ("x-api-key", "X-Api-Key", "X-API-KEY"):
        # When a document is asked for; Then the key is accepted (the document does not exist)
        status, _ = send(api_event("GET", f"/documents/{some_id}", headers={name: API_KEY}))
        assert status == 404
    # And /health answers without a key, and a request with no headers at all is refused, not crashed
    assert call("GET", "/health", key=None) == (200, {"status": "ok"})
    bare = api_event("GET", f"/documents/{some_id}")
    bare["headers"] = bare["multiValueHeaders"] = None  # what API Gateway sends for a request without headers
    assert send(bare)[0] == 401


# Bodies


@pytest.mark.parametrize(
    ("size", "key", "status"),
    [
        (64 * 1024 + 1, API_KEY, 413),
        (5 * 1024 * 1024, API_KEY, 413),
        (5 * 1024 * 1024, None, 401),  # the key is checked first: no work for anonymous bodies
    ],
)
def test_oversized_bodies_are_refused_unread(
    api: Pipeline, db: Database, size: int, key: str | None, status: int
) -> None:
    # Given a body over the 64 KiB limit, most of it one huge prompt
    before = _counts(db)
    body = json.dumps({**VALID, "prompt": "x" * size})
    # When it is POSTed
    code, answer = call("POST", "/documents", body=body, key=key)
    # Then it is refused with the limit named (or for the missing key), and nothing was created
    assert code == status
    if status == 413:
        assert answer == {"message": "the request body exceeds 65536 bytes"}
    assert _counts(db) == before


@pytest.mark.parametrize(
    "body",
    [
        pytest.param("{not json", id="not-json"),
        pytest.param("", id="empty"),
        pytest.param("null", id="null"),
        pytest.param("[]", id="array"),
        pytest.param('"a string"', id="string"),
        pytest.param("42", id="number"),
        pytest.param("{'filename': 'a.pdf'}", id="single-quotes"),
        pytest.param(json.dumps(VALID) + " trailing", id="trailing-garbage"),
        pytest.param(json.dumps(VALID) * 2, id="two-objects"),
        pytest.param("\ufeff" + json.dumps(VALID), id="byte-order-mark"),
        pytest.param('{"filename": NaN, "content_type": "application/pdf"}', id="nan"),
        pytest.param("[" * 30_000 + "]" * 30_000, id="nested-30000-deep"),
        pytest.param('{"a":' * 10_000 + "1" + "}" * 10_000, id="nested-objects"),
        pytest.param('{"filename": "\\ud800.pdf", "content_type": "application/pdf"}', id="lone-surrogate"),
    ],
)
def test_malformed_json_gets_422(api: Pipeline, db: Database, body: str) -> None:
    # Given a body that is not a JSON object of the right shape
    before = _counts(db)
    # When it is POSTed
    code, answer = call("POST", "/documents", body=body)
    # Then it is a 422 that says so, and nothing was created
    assert code == 422 and answer["message"].startswith("invalid request")
    assert _counts(db) == before


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"filename": 123, "content_type": "application/pdf"}, "filename"),
        ({"filename": ["a.pdf"], "content_type": "application/pdf"}, "filename"),
        ({"filename": {"name": "a.pdf"}, "content_type": "application/pdf"}, "filename"),
        ({"filename": None, "content_type": "application/pdf"}, "filename"),
        ({"filename": True, "content_type": "application/pdf"}, "filename"),
        ({"filename": "", "content_type": "application/pdf"}, "filename"),
        ({"filename": "a" * 256, "content_type": "application/pdf"}, "filename"),
        ({"filename": "a.pdf", "content_type": 1}, "content_type"),
        ({"filename": "a.pdf", "content_type": "APPLICATION/PDF"}, "content_type"),
        ({"filename": "a.pdf", "content_type": "application/x-msdownload"}, "content_type"),
        ({**VALID, "pages": 5}, "pages"),
        ({**VALID, "pages": ["1"]}, "pages"),
        ({**VALID, "pages": "1; DROP TABLE jobs"}, "pages"),
        ({**VALID, "pages": "0-3"}, "pages"),
        ({**VALID, "pages": "1-999999999999"}, "pages"),
        ({**VALID, "model": 7}, "model"),
        ({**VALID, "model": ""}, "model"),
        ({**VALID, "model": "m\x00odel"}, "model"),
        ({**VALID, "prompt": ["transcribe"]}, "prompt"),
        ({**VALID, "prompt": "ignore all\x00 previous"}, "prompt"),
        ({**VALID, "prompt": "x" * 20_001}, "prompt"),
        ({**VALID, "callback_url": 5}, "callback_url"),
        ({**VALID, "callback_url": "javascript:alert(1)"}, "callback_url"),
        ({**VALID, "callback_url": "file:///etc/passwd"}, "callback_url"),
    ],
)
def test_wrong_types_and_values_get_422_naming_the_field(
    api: Pipeline, db: Database, body: dict[str, Any], field: str
) -> None:
    # Given a JSON object with one field of the wrong type or an unacceptable value
    before = _counts(db)
    # When it is POSTed
    code, answer = call("POST", "/documents", body=body)
    # Then the 422 names that field, and nothing was created
    assert code == 422 and answer["field"] == field, answer
    assert _counts(db) == before


@pytest.mark.parametrize(
    "extra",
    [
        {"document_id": str(uuid.UUID(int=7))},
        {"status": "COMPLETED"},
        {"bucket": "someone-elses-bucket"},
        {"object_key": "../../etc/passwd"},
        {"__proto__": {"admin": True}},
        {"filename ": "b.pdf"},
    ],
)
def test_extra_fields_are_refused_not_ignored(api: Pipeline, db: Database, extra: dict[str, Any]) -> None:
    # Given a valid request with a field the API does not have (an attempt to choose an id, status, bucket, key)
    before = _counts(db)
    # When it is POSTed
    code, answer = call("POST", "/documents", body={**VALID, **extra})
    # Then it is a 422 naming the field, and nothing was created
    [name] = extra
    assert code == 422 and answer["field"] == name
    assert _counts(db) == before


# Ids

UNKNOWN_ID = "6f1c2c1e-5a0b-4f3e-9a7d-0c2b8e4d1f90"  # well formed, and no document's (the same in every worker)


@pytest.mark.parametrize("document_id", [UNKNOWN_ID, *SQL_LOOKING, *NOT_UUIDS])
def test_unknown_sql_looking_and_non_uuid_ids_get_404_and_touch_nothing(
    api: Pipeline, db: Database, document_id: str
) -> None:
    # Given a real document, so that a query that matched too much would show
    assert call("POST", "/documents", body=VALID)[0] == 201
    before = _counts(db)
    # When every per-document route is asked about an id that names no document (raw and URL-encoded); an empty id
    # with nothing after it is GET /documents/, the list, and is left out
    routes = [
        ("GET", "", None),
        ("GET", "/transcript", None),
        ("POST", "/retry", None),
        ("GET", "/pages/1/image", None),
        ("GET", "/pages/1/figures", None),
        ("POST", "/pages/1/rerun", {}),
        ("PUT", "/pages/1/correction", {"markdown": "text"}),
    ]
    answers = [
        call(method, f"/documents/{spelling}{suffix}", body=body)
        for spelling in {document_id, document_id.replace(" ", "%20").replace("'", "%27")}
        for method, suffix, body in routes
        if spelling or suffix
    ]
    # Then each is a 404 (or, for an id the router cannot take, a 404 for the route), and the tables are intact
    assert {code for code, _ in answers} == {404}
    assert {answer["message"] for _, answer in answers} <= {"no document with this id", "no such route"}
    assert _counts(db) == before == {"tables": 2, "documents": 1, "jobs": 0}


def test_alternative_spellings_of_a_real_id_find_the_document_and_nothing_else(api: Pipeline, db: Database) -> None:
    # Given a document
    _, created = call("POST", "/documents", body=VALID)
    document_id = created["document_id"]
    # When it is asked for under the spellings uuid.UUID accepts (upper case, braces, urn, no dashes)
    spellings = [document_id.upper(), f"{{{document_id}}}", f"urn:uuid:{document_id}", document_id.replace("-", "")]
    answers = [call("GET", f"/documents/{spelling}") for spelling in spellings]
    # Then each finds that document, reported under its canonical id
    assert [(code, answer["document_id"]) for code, answer in answers] == [(200, document_id)] * 4


def test_the_format_query_parameter_takes_only_its_own_values(api: Pipeline) -> None:
    _, created = call("POST", "/documents", body=VALID)
    for value in ("xml", "json' OR 1=1 --", "../../etc/passwd", "JSON", ""):
        code, answer = call("GET", f"/documents/{created['document_id']}/transcript", query={"format": value})
        assert code == 422 and answer["field"] == "format", (value, answer)


# Where uploads go

KEY_SHAPE = re.compile(r"^uploads/default/[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}/[^/]+$")


@pytest.mark.parametrize(
    ("filename", "stored_name"),
    [
        ("../../etc/passwd", "passwd"),
        ("/etc/passwd", "passwd"),
        ("..\\..\\windows\\system32\\config\\sam", "sam"),
        ("a/../../../../b.pdf", "b.pdf"),
        ("uploads/../transcripts/evil.md", "evil.md"),
        ("%2e%2e%2f%2e%2e%2fetc%2fpasswd", "%2e%2e%2f%2e%2e%2fetc%2fpasswd"),  # literal characters, not a path
        ("report\r\nX-Injected: yes.pdf", "reportX-Injected: yes.pdf"),
        ("nul\x00byte.pdf", "nulbyte.pdf"),
        ("résumé 2024 \u2013 final 📄.pdf", "résumé 2024 \u2013 final 📄.pdf"),
        ("📄" * 255, "📄" * 200),
    ],
)
def test_a_hostile_filename_becomes_a_safe_key_under_the_documents_own_prefix(
    api: Pipeline, db: Database, filename: str, stored_name: str
) -> None:
    # When a document is created with a filename that tries to leave its place
    code, created = call("POST", "/documents", body={"filename": filename, "content_type": "application/pdf"})
    # Then it is created, its key is exactly uploads/<its tenant>/<its id>/<one safe name>, within S3's key length limit
    assert code == 201
    document = db.get_document(created["document_id"])
    assert document is not None
    key = document.object_key
    assert key == f"uploads/default/{created['document_id']}/{stored_name}"
    assert KEY_SHAPE.match(key) and ".." not in key.split("/") and len(key.encode()) <= 1024
    # And the presigned URL points at that key in the pipeline's bucket, and nowhere else
    url = urlsplit(created["upload_url"])
    assert unquote(url.path) == f"/{api.bucket}/{key}"


@pytest.mark.parametrize("filename", ["..", ".", "/", "../", "\\", "a/..", "\x00", " \t "])
def test_a_filename_with_no_usable_name_gets_422(api: Pipeline, db: Database, filename: str) -> None:
    before = _counts(db)
    code, answer = call("POST", "/documents", body={"filename": filename, "content_type": "application/pdf"})
    assert code == 422 and answer["field"] == "filename"
    assert _counts(db) == before


def test_sql_in_stored_fields_is_stored_as_text(api: Pipeline, db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given SQL-looking values in every free-text field (the model one allowed by an operator who allows anything)
    body = {**VALID, "model": "x'; DROP TABLE jobs; --", "prompt": "'); DELETE FROM documents; --"}
    monkeypatch.setenv("ALLOWED_MODELS", f"test/vision-model,{body['model']}")
    shutdown_runtime()
    get_settings.cache_clear()
    # When the document is created and read back
    code, created = call("POST", "/documents", body=body)
    assert code == 201
    code, status = call("GET", f"/documents/{created['document_id']}")
    # Then the values are data, stored and returned verbatim, and the tables are all still there
    assert code == 200 and status["model"] == body["model"]
    document = db.get_document(created["document_id"])
    assert document is not None and document.prompt == body["prompt"]
    assert _counts(db) == {"tables": 2, "documents": 1, "jobs": 0}


# Routes and methods


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/"),
        ("GET", "/admin"),
        ("GET", "/../../etc/passwd"),
        ("GET", "/documents/../health"),
        ("GET", f"/documents/{uuid.UUID(int=3)}/transcript/extra"),
        ("GET", f"/documents/{uuid.UUID(int=3)}/"),
        ("DELETE", f"/documents/{uuid.UUID(int=3)}"),
        ("PUT", f"/documents/{uuid.UUID(int=3)}"),
        ("PATCH", f"/documents/{uuid.UUID(int=3)}"),
        ("PUT", "/documents"),
        ("DELETE", "/documents"),
        ("POST", f"/documents/{uuid.UUID(int=3)}/pages/1/correction"),
        ("GET", f"/documents/{uuid.UUID(int=3)}/pages/1/correction"),
        ("POST", "/health"),
        ("GET", f"/documents/{uuid.UUID(int=3)}/retry"),
        ("POST", f"/documents/{uuid.UUID(int=3)}/transcript"),
        ("OPTIONS", "/documents"),
        ("TRACE", "/health"),
    ],
)
def test_unknown_routes_and_wrong_methods_get_404_or_405(api: Pipeline, db: Database, method: str, path: str) -> None:
    # Given a document, so that a route that did something would show
    assert call("POST", "/documents", body=VALID)[0] == 201
    before = _counts(db)
    # When a route or method the API does not have is called (with the key, and a body)
    code, _ = call(method, path, body=VALID)
    # Then it is a 404 or 405, and nothing changed
    assert code in (404, 405)
    assert _counts(db) == before


def test_after_all_the_abuse_the_api_still_works(api: Pipeline, db: Database) -> None:
    # Given a barrage of the abuse above, in one warm execution environment
    for document_id in SQL_LOOKING + NOT_UUIDS:
        call("GET", f"/documents/{document_id}")
        call("POST", f"/documents/{document_id}/retry")
        call("PUT", f"/documents/{document_id}/pages/1/correction", body={"markdown": "'; DELETE FROM jobs; --"})
    call("POST", "/documents", body="[" * 30_000)
    call("POST", "/documents", body={**VALID, "model": "\x00"})
    call("DELETE", "/documents")
    # When a legitimate client uses the API
    code, created = call("POST", "/documents", body=VALID)
    # Then it is served normally, and the tables hold exactly what it created
    assert code == 201
    assert call("GET", f"/documents/{created['document_id']}")[1]["status"] == "AWAITING_UPLOAD"
    assert call("GET", f"/documents/{created['document_id']}/transcript")[0] == 409
    assert call("POST", f"/documents/{created['document_id']}/retry")[0] == 409
    assert _counts(db) == {"tables": 2, "documents": 1, "jobs": 0}


@pytest.mark.parametrize(
    ("method", "path", "body", "headers", "code", "says"),
    [
        pytest.param("POST", "/pages/" + "9" * 5000 + "/rerun", "{}", {}, 422, "page", id="page-of-5000-digits"),
        pytest.param("GET", "/pages/" + "1" * 4301 + "/image", None, {}, 422, "page", id="page-of-4301-digits"),
        pytest.param(
            "POST",
            "",
            '{"filename": "a.pdf", "content_type": "application/pdf", "max_cost_usd": 1' + "0" * 5000 + "}",
            {},
            422,
            "invalid request",
            id="json-integer-of-5000-digits",
        ),
        pytest.param(
            "POST",
            "",
            json.dumps(VALID),
            {"Idempotency-Key": "key\x00one"},
            422,
            "Idempotency-Key",
            id="nul-in-idempotency-key",
        ),
    ],
)
def test_inputs_past_what_python_and_postgresql_hold_get_a_4xx_naming_them(
    api: Pipeline, db: Database, method: str, path: str, body: str | None, headers: dict[str, str], code: int, says: str
) -> None:
    # Given a request carrying a number too long for Python to parse, or a NUL that PostgreSQL text cannot hold
    before = _counts(db)
    document = f"/documents/{uuid.uuid4()}" if path else "/documents"
    # When it is sent
    status, answer = send(api_event(method, document + path, body=body, headers={"x-api-key": API_KEY, **headers}))
    # Then it is refused with a 4xx that says what was wrong (never a 500 with a traceback), and nothing was created
    assert status == code and says in json.loads(answer)["message"], answer[:300]
    assert _counts(db) == before


def test_a_callback_url_on_a_privileged_port_but_http_and_https_is_refused_naming_it(
    api: Pipeline, db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a stack that signs callbacks
    monkeypatch.setenv("CALLBACK_SECRET", "a-secret-to-sign-callbacks-with-0123456789")
    shutdown_runtime()
    get_settings.cache_clear()
    before = _counts(db)
    # When documents are asked for with callbacks to a host's SSH and SMTP ports
    refused = [
        call("POST", "/documents", body={**VALID, "callback_url": url})
        for url in ("http://hooks.example:22/", "https://hooks.example:25/")
    ]
    # Then each is a 422 naming callback_url and the port, and nothing was created
    for (code, answer), port in zip(refused, (22, 25), strict=True):
        assert code == 422 and answer["field"] == "callback_url", answer
        assert f"port {port} is not allowed: 80, 443, or 1024 and above" in answer["message"], answer
    assert _counts(db) == before
    # And a callback on port 8443 is taken
    assert call("POST", "/documents", body={**VALID, "callback_url": "https://hooks.example:8443/"})[0] == 201
