"""POST /documents/{id}/pages/{n}/rerun: one finished page queued again, optionally on another model, its earlier
attempts and costs kept and the transcript written again. Real API events and handlers, PostgreSQL, moto, the fake
provider."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from http import HTTPStatus
from pathlib import Path
from typing import Any

import pytest
from pagescribe.domain import DEFAULT_TENANT
from pagescribe.handlers import api as api_app
from pagescribe.runtime import get_runtime, shutdown_runtime
from pagescribe.service import Refused
from pagescribe.settings import get_settings
from pagescribe.store.postgres import Database
from sqlalchemy import text

from tests.fakes.chat_server import FakeChatServer
from tests.support.aws_events import LambdaContext, api_event
from tests.support.pipeline import Pipeline

pytestmark = pytest.mark.integration

API_KEY = "test-api-key-0123456789"
OTHER_MODEL = "test/other-vision-model"


def call(method: str, path: str, body: Any = None, **query: str) -> tuple[int, Any]:
    event = api_event(
        method,
        path,
        headers={"x-api-key": API_KEY},
        body=None if body is None else json.dumps(body),
        query=query or None,
    )
    response = api_app.handler(event, LambdaContext(29))
    return response["statusCode"], json.loads(response["body"])


@pytest.fixture
def transcribed(pipeline: Pipeline, corpus: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A 4-page PDF transcribed on the stack's model, with another model allowed."""
    monkeypatch.setenv("API_KEY", API_KEY)
    monkeypatch.setenv("ALLOWED_MODELS", f"test/vision-model,{OTHER_MODEL}")
    shutdown_runtime()
    get_settings.cache_clear()
    [document] = pipeline.upload("uploads/report.pdf", corpus / "pdflatex-4-pages.pdf")["documents"]
    pipeline.run_until_idle()
    return str(document["document_id"])


def attempts(db: Database, document_id: str, page: int) -> list[tuple[str, str, float | None]]:
    with db.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT a.outcome, a.model, a.cost FROM attempts a JOIN jobs j ON j.id = a.job_id "
                "WHERE j.document_id = :id AND j.page_number = :page ORDER BY a.id"
            ),
            {"id": document_id, "page": page},
        )
        return [(row.outcome, row.model, row.cost) for row in rows]


def test_a_page_rerun_on_another_model_keeps_its_first_attempt_and_rewrites_the_transcript(
    pipeline: Pipeline, db: Database, fake_provider: FakeChatServer, transcribed: str
) -> None:
    # Given a finished document whose page 2 was answered once by the stack's model
    document_id = transcribed
    [first] = attempts(db, document_id, 2)
    assert first[:2] == ("KEPT", "test/vision-model")
    calls = fake_provider.calls
    # When page 2 is re-run on another allowed model
    code, answer = call("POST", f"/documents/{document_id}/pages/2/rerun", {"model": OTHER_MODEL})
    # Then it is queued on that model and its document is processing again
    assert code == 202 and answer == {"document_id": document_id, "page_number": 2, "model": OTHER_MODEL}
    assert call("GET", f"/documents/{document_id}")[1]["status"] == "PROCESSING"
    # When the queue is delivered
    pipeline.run_until_idle()
    # Then exactly one more call was made, to that model, and both attempts are kept with their costs
    assert fake_provider.calls == calls + 1 and fake_provider.requests[-1]["model"] == OTHER_MODEL
    assert [(outcome, model) for outcome, model, _ in attempts(db, document_id, 2)] == [
        ("KEPT", "test/vision-model"),
        ("KEPT", OTHER_MODEL),
    ]
    # And the document is COMPLETED again, its transcript written again with page 2's new answer
    code, status = call("GET", f"/documents/{document_id}")
    assert status["status"] == "COMPLETED" and status["pages"]["COMPLETED"] == 4
    code, transcript = call("GET", f"/documents/{document_id}/transcript", format="json")
    assert code == 200
    assert [page["model"] for page in transcript["pages"]] == [
        "test/vision-model",
        OTHER_MODEL,
        "test/vision-model",
        "test/vision-model",
    ]


def test_a_rerun_is_refused_clearly_when_it_cannot_be_done(
    pipeline: Pipeline, db: Database, fake_provider: FakeChatServer, transcribed: str
) -> None:
    document_id = transcribed
    # A model that is not allowed is refused naming it, and nothing is queued
    code, body = call("POST", f"/documents/{document_id}/pages/1/rerun", {"model": "vendor/expensive"})
    assert code == 422 and "'vendor/expensive' is not allowed" in body["message"]
    # A page the document does not have, and one that is not a number
    code, body = call("POST", f"/documents/{document_id}/pages/7/rerun", {})
    assert code == 404 and body["message"] == "the document has no page 7"
    assert call("POST", f"/documents/{document_id}/pages/x/rerun", {})[0] == 400
    # A page queued again is not re-run a second time before it is done
    assert call("POST", f"/documents/{document_id}/pages/3/rerun", {})[0] == 202
    code, body = call("POST", f"/documents/{document_id}/pages/3/rerun", {})
    assert code == 409 and body["message"] == "page 3 is QUEUED: only a finished page is re-run"
    # And without a model the document's own model answers it
    calls = fake_provider.calls
    pipeline.run_until_idle()
    assert fake_provider.calls == calls + 1 and fake_provider.requests[-1]["model"] == "test/vision-model"


def _reconfigure(monkeypatch: pytest.MonkeyPatch, **settings: str) -> None:
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    shutdown_runtime()
    get_settings.cache_clear()


def _queued(db: Database, document_id: str) -> int:
    with db.engine.connect() as conn:
        query = "SELECT count(*) FROM jobs WHERE document_id = :id AND status = 'QUEUED'"
        return int(conn.execute(text(query), {"id": document_id}).scalar_one())


def test_reruns_count_against_the_documents_retries_and_each_page_has_its_own_limit(
    pipeline: Pipeline, db: Database, fake_provider: FakeChatServer, transcribed: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a finished document, a stack allowing 3 retries per document and 2 re-runs per page
    document_id = transcribed
    _reconfigure(monkeypatch, MAX_DOCUMENT_RETRIES="3", MAX_PAGE_RERUNS="2")
    calls = fake_provider.calls
    # When page 1 is re-run twice, each run finishing
    for _ in range(2):
        assert call("POST", f"/documents/{document_id}/pages/1/rerun", {})[0] == 202
        pipeline.run_until_idle()
    # Then a third re-run of page 1 is refused naming the page's limit, and nothing is queued
    code, body = call("POST", f"/documents/{document_id}/pages/1/rerun", {})
    assert code == 429 and body["message"] == "page 1 was re-run 2 times; the limit is MAX_PAGE_RERUNS=2"
    assert _queued(db, document_id) == 0
    # When page 2 is re-run once: the document's third time queued again
    assert call("POST", f"/documents/{document_id}/pages/2/rerun", {})[0] == 202
    pipeline.run_until_idle()
    # Then no page of it is re-run any more, nor are its failed pages retried: re-runs and retries share the limit
    code, body = call("POST", f"/documents/{document_id}/pages/3/rerun", {})
    assert code == 429 and "MAX_DOCUMENT_RETRIES=3" in body["message"] and "3 times" in body["message"]
    code, body = call("POST", f"/documents/{document_id}/retry")
    assert code == 429 and "MAX_DOCUMENT_RETRIES=3" in body["message"]
    # And the three re-runs cost three model calls, no more
    assert fake_provider.calls == calls + 3 and _queued(db, document_id) == 0


def test_a_page_that_failed_on_a_render_limit_is_re_run_only_once_that_limit_is_raised(
    pipeline: Pipeline, db: Database, fake_provider: FakeChatServer, corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a transcribed image whose page, re-run under a pixel limit it is over, failed on that limit
    _reconfigure(monkeypatch, API_KEY=API_KEY)
    [document] = pipeline.upload("uploads/smile.png", corpus / "smile.png")["documents"]
    document_id = str(document["document_id"])
    pipeline.run_until_idle()
    _reconfigure(monkeypatch, MAX_IMAGE_PIXELS="100")
    assert call("POST", f"/documents/{document_id}/pages/1/rerun", {})[0] == 202
    pipeline.run_until_idle()
    _, status = call("GET", f"/documents/{document_id}")
    assert status["status"] == "FAILED"
    calls = fake_provider.calls
    # When it is re-run with the limit unchanged
    code, body = call("POST", f"/documents/{document_id}/pages/1/rerun", {})
    # Then it is refused, naming the limit and why, and nothing is queued
    assert code == 409 and body["message"].startswith("page 1 failed on MAX_IMAGE_PIXELS=100 (")
    assert "once the operator has raised that limit" in body["message"] and _queued(db, document_id) == 0
    # When the operator raises the limit, it is re-run, rendered and transcribed
    _reconfigure(monkeypatch, MAX_IMAGE_PIXELS="60000000")
    assert call("POST", f"/documents/{document_id}/pages/1/rerun", {})[0] == 202
    pipeline.run_until_idle()
    _, status = call("GET", f"/documents/{document_id}")
    assert status["status"] == "COMPLETED" and fake_provider.calls == calls + 1


def test_reruns_of_every_page_at_once_are_counted_under_the_documents_lock(
    pipeline: Pipeline, db: Database, transcribed: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a finished 4-page document on a stack allowing 2 retries per document
    document_id = transcribed
    _reconfigure(monkeypatch, MAX_DOCUMENT_RETRIES="2")
    documents = get_runtime().documents
    start = threading.Barrier(4)

    def rerun(page: int) -> str:
        start.wait()
        try:
            documents.rerun_page(document_id, page, DEFAULT_TENANT, model=None)
        except Refused as refused:
            return "limit" if refused.code is HTTPStatus.TOO_MANY_REQUESTS else "refused"
        return "queued"

    # When each of its pages is re-run at the same moment
    with ThreadPoolExecutor(max_workers=4) as pool:
        outcomes = list(pool.map(rerun, [1, 2, 3, 4]))
    # Then exactly two were queued, the others refused on the document's limit, and its count says two
    assert sorted(outcomes) == ["limit", "limit", "queued", "queued"]
    assert _queued(db, document_id) == 2
    with db.engine.connect() as conn:
        retries = conn.execute(text("SELECT retries FROM documents WHERE id = :id"), {"id": document_id}).scalar_one()
    assert retries == 2
