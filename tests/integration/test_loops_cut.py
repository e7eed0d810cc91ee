"""Loops cut as they stream: through the real handlers, moto, PostgreSQL and the fake chat-completions server, a model
that would write a loop up to MAX_OUTPUT_TOKENS is stopped at the first loop its answer shows, billed that far (as
the server counts it), recorded LOOP_CUT with its tokens and cost, and the page escalates or fails on the loop."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pagescribe.handlers import api as api_app
from pagescribe.runtime import shutdown_runtime
from pagescribe.settings import get_settings
from pagescribe.store.postgres import Database
from sqlalchemy import text

from tests.fakes.chat_server import PROMPT_TOKENS, FakeChatServer, Loop
from tests.support.aws_events import LambdaContext, api_event
from tests.support.database import page_rows
from tests.support.pipeline import Pipeline

pytestmark = pytest.mark.integration

PRIMARY = "test/vision-model"  # the pipeline fixture's MODEL
STRONG = "test/strong-model"
COST = 0.00012  # what the fake reports per answer it completes


def _configure(monkeypatch: pytest.MonkeyPatch, **env: str) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    shutdown_runtime()
    get_settings.cache_clear()


def _attempts(db: Database, document_id: str) -> list[dict[str, Any]]:
    with db.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT model, outcome, finish_reason, prompt_tokens, completion_tokens, cost, cost_estimated "
                "FROM attempts WHERE document_id = :id ORDER BY id"
            ),
            {"id": document_id},
        ).mappings()
        return [{**row, "cost": float(row["cost"]) if row["cost"] is not None else None} for row in rows]


def _status(document_id: str) -> dict[str, Any]:
    response = api_app.handler(api_event("GET", f"/documents/{document_id}"), LambdaContext(29))
    assert response["statusCode"] == 200, response
    return dict(json.loads(response["body"]))


def _loops_on(model: str) -> Any:
    return lambda body, image: Loop() if body["model"] == model else None


def test_a_looping_page_is_cut_early_billed_that_far_and_escalated(
    pipeline: Pipeline, db: Database, fake_provider: FakeChatServer, corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _configure(monkeypatch, ESCALATION_MODEL=STRONG)
    limit = get_settings().max_output_tokens
    # Given the tenant's earlier call of the model, answered whole with the cost its provider reported
    [earlier] = pipeline.upload("uploads/earlier.png", corpus / "smile.png")["documents"]
    pipeline.run_until_idle()
    [history] = _attempts(db, earlier["document_id"])
    # And a model that now loops on a page until it is stopped, streamed
    fake_provider.route(_loops_on(PRIMARY))
    [doc] = pipeline.upload("uploads/looping.jpg", corpus / "smile.jpg")["documents"]
    # When the queue is drained
    pipeline.run_until_idle()
    # Then the provider (the fake, counting what it sent before the client closed) billed the loop at most 10 % of
    # the output limit: three answers, the earlier page's, the loop, the escalation's
    billed = fake_provider.wait_billed(3)
    looped = max(billed)
    assert 0 < looped <= limit // 10
    # And the cut call is recorded as cut, with the tokens received and a cost estimated at the tenant's own price
    # (the usage comes in the last event, which a cut call never gets); the escalation model's answer is kept
    cut, kept = _attempts(db, doc["document_id"])
    assert (cut["model"], cut["outcome"], cut["finish_reason"]) == (PRIMARY, "LOOP_CUT", "loop")
    assert 0 < cut["completion_tokens"] <= looped
    assert cut["cost_estimated"] is True and cut["prompt_tokens"] == PROMPT_TOKENS
    per_token = history["cost"] / (history["prompt_tokens"] + history["completion_tokens"])  # one call, one price
    # (stored as numeric(14, 8))
    assert cut["cost"] == pytest.approx(per_token * (PROMPT_TOKENS + cut["completion_tokens"]), abs=1e-8)
    assert (kept["model"], kept["outcome"], kept["cost"], kept["cost_estimated"]) == (STRONG, "KEPT", COST, False)
    [job] = page_rows(db, doc["document_id"])
    assert (job["status"], job["model"], job["escalation"]) == ("COMPLETED", STRONG, "DONE")
    # And the document's cost is the sum of what its calls were billed, the cut one's included
    status = _status(doc["document_id"])
    assert status["model_calls"] == 2
    assert status["cost"] == pytest.approx(cut["cost"] + kept["cost"])
    # And the JSON lists the cut call with its outcome and its estimated cost, and the loop among the page's flags
    _, js = pipeline.transcript(doc["document_id"])
    assert js["cost"] == pytest.approx(cut["cost"] + kept["cost"])
    [page] = js["pages"]
    assert [(a["outcome"], a.get("cost_estimated", False)) for a in page["attempts"]] == [
        ("LOOP_CUT", True),
        ("KEPT", False),
    ]
    assert page["escalated"] is True and page["flags"][0]["flag"] == "repetition"


def test_without_an_escalation_model_a_looping_page_fails_naming_the_loop(
    pipeline: Pipeline, db: Database, fake_provider: FakeChatServer, corpus: Path
) -> None:
    limit = get_settings().max_output_tokens
    # Given a model that loops on a page until it is stopped, streamed, and no escalation model (nor any earlier call
    # of the model to price a call by)
    fake_provider.route(_loops_on(PRIMARY))
    [doc] = pipeline.upload("uploads/looping.png", corpus / "smile.png")["documents"]
    # When the queue is drained
    pipeline.run_until_idle()
    # Then the loop was cut early, and the page failed naming it, keeping the text received
    [looped] = fake_provider.wait_billed(1)
    assert 0 < looped <= limit // 10
    [job] = page_rows(db, doc["document_id"])
    assert job["status"] == "FAILED"
    assert "repetition=" in job["error"] and "repeats itself in a loop" in job["error"]
    assert job["finish_reason"] == "loop" and "The same line once more." in job["result_text"]
    # And the call is recorded as cut with the tokens received; with no price to go by, no cost is made up
    [cut] = _attempts(db, doc["document_id"])
    assert (cut["outcome"], cut["cost"], cut["cost_estimated"]) == ("LOOP_CUT", None, False)
    assert 0 < cut["completion_tokens"] <= looped
    assert _status(doc["document_id"])["status"] == "FAILED"
