"""POST /documents/{id}/pages/{n}/rerun: one finished page queued again, optionally on another model, its earlier
attempts and costs kept and the transcript written again. Real API events and handlers, PostgreSQL, moto, the fake
provider."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pagescribe.database import Database
from pagescribe.handlers import api as api_app
from pagescribe.runtime import shutdown_runtime
from pagescribe.settings import get_settings
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
