"""GET /documents: a tenant's documents, newest first, a page at a time, with status, pages, flags and cost. Real API
events, PostgreSQL, moto and the fake provider."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pagescribe.handlers import api as api_app
from pagescribe.runtime import shutdown_runtime
from pagescribe.settings import get_settings
from pagescribe.store.postgres import Database
from pagescribe.tenancy import create_key
from sqlalchemy import text

from tests.fakes.chat_server import FakeChatServer
from tests.support.aws_events import LambdaContext, api_event
from tests.support.pipeline import Pipeline

pytestmark = pytest.mark.integration

API_KEY = "test-api-key-0123456789"


def call(method: str, path: str, *, key: str = API_KEY, body: Any = None, **query: str) -> tuple[int, Any]:
    event = api_event(
        method, path, headers={"x-api-key": key}, body=None if body is None else json.dumps(body), query=query or None
    )
    response = api_app.handler(event, LambdaContext(29))
    return response["statusCode"], json.loads(response["body"])


@pytest.fixture
def api(pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch) -> Pipeline:
    monkeypatch.setenv("API_KEY", API_KEY)
    shutdown_runtime()
    get_settings.cache_clear()
    return pipeline


def create(name: str, key: str = API_KEY) -> str:
    code, created = call("POST", "/documents", key=key, body={"filename": name, "content_type": "application/pdf"})
    assert code == 201, created
    return str(created["document_id"])


def test_the_list_pages_through_the_tenants_documents_newest_first(api: Pipeline, db: Database) -> None:
    # Given five documents of the default tenant, created one after the other, and one of another tenant
    ids = [create(f"report-{n}.pdf") for n in range(5)]
    _, other_key = create_key(db, "globex")
    other = create("theirs.pdf", key=other_key)
    # When the default tenant lists them two at a time, following next_cursor
    seen: list[str] = []
    cursor: str | None = None
    pages = 0
    while True:
        code, listed = call("GET", "/documents", limit="2", **({"cursor": cursor} if cursor else {}))
        assert code == 200, listed
        seen += [d["document_id"] for d in listed["documents"]]
        pages += 1
        cursor = listed["next_cursor"]
        if cursor is None:
            break
    # Then it sees its own five, newest first, in three pages, and never the other tenant's
    assert seen == ids[::-1] and pages == 3
    # And the other tenant sees only its own
    code, theirs = call("GET", "/documents", key=other_key)
    assert code == 200 and [d["document_id"] for d in theirs["documents"]] == [other]
    assert theirs["documents"][0]["filename"] == "theirs.pdf" and theirs["documents"][0]["status"] == "AWAITING_UPLOAD"


def test_a_listed_document_shows_its_pages_flags_and_cost(
    api: Pipeline, db: Database, fake_provider: FakeChatServer, corpus: Path
) -> None:
    # Given a 4-page PDF uploaded and transcribed
    [uploaded] = api.upload("uploads/pdflatex-4-pages.pdf", corpus / "pdflatex-4-pages.pdf")["documents"]
    api.run_until_idle()
    # When the documents are listed
    code, listed = call("GET", "/documents")
    # Then it shows its status, its pages, how many are flagged and what its calls cost, as the database has them
    assert code == 200
    [document] = listed["documents"]
    with db.engine.connect() as conn:
        flagged = conn.execute(
            text("SELECT count(*) FROM jobs WHERE document_id = :id AND flags <> '[]'::jsonb"),
            {"id": uploaded["document_id"]},
        ).scalar()
        cost = conn.execute(
            text("SELECT sum(cost) FROM attempts WHERE document_id = :id"), {"id": uploaded["document_id"]}
        ).scalar()
    assert document["document_id"] == uploaded["document_id"] and document["status"] == "COMPLETED"
    assert (document["page_count"], document["pages_completed"], document["pages_failed"]) == (4, 4, 0)
    assert document["flagged"] == flagged
    assert cost is not None and document["cost"] == pytest.approx(float(cost)) and document["cost"] > 0
    assert document["finished_at"] is not None


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ({"limit": "0"}, "limit"),
        ({"limit": "101"}, "limit"),
        ({"cursor": "not-a-cursor"}, "cursor 'not-a-cursor' is not one this API gave"),
    ],
)
def test_a_bad_limit_or_cursor_is_refused_naming_it(api: Pipeline, query: dict[str, str], message: str) -> None:
    code, body = call("GET", "/documents", **query)
    assert code == 422 and message in json.dumps(body)
