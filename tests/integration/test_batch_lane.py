"""The batch lane end to end on the deployed shape: the API, the upload, transcribe and sweeper handlers, PostgreSQL,
S3 and SQS in a moto server, and the fake batch server (each dialect) fetching the page images through their
presigned URLs."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from pagescribe.runtime import shutdown_runtime
from pagescribe.settings import get_settings
from pagescribe.store.postgres import Database

from tests.fakes.batch_server import Expire, FakeBatchServer
from tests.fakes.chat_server import FakeChatServer
from tests.integration.test_api import API_KEY, call, upload_through_presigned_url
from tests.support.pipeline import Pipeline


@pytest.fixture
def fake_batches() -> Iterator[FakeBatchServer]:
    with FakeBatchServer() as fake:
        yield fake


def _stack(pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch, fake: FakeBatchServer, dialect: str) -> Pipeline:
    for name, value in {
        "API_KEY": API_KEY,
        "PROVIDER_API_KEY": "sk-test",
        "BATCH_DIALECT": dialect,
        "BATCH_BASE_URL": fake.base_url,
        "TEXT_LAYER": "off",
        "SECOND_READ": "off",
    }.items():
        monkeypatch.setenv(name, value)
    shutdown_runtime()
    get_settings.cache_clear()
    return pipeline


@pytest.mark.parametrize("dialect", ["openai", "openrouter"])
def test_a_document_in_the_batch_lane_is_parked_sent_collected_and_finished_by_the_sweeper(
    dialect: str,
    pipeline: Pipeline,
    db: Database,
    fake_provider: FakeChatServer,
    fake_batches: FakeBatchServer,
    corpus: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    api = _stack(pipeline, monkeypatch, fake_batches, dialect)
    # Given a 4-page document created through the API in the batch lane, with a deadline days away
    deadline = (datetime.now(UTC) + timedelta(days=2)).isoformat()
    body = {"filename": "a.pdf", "content_type": "application/pdf", "lane": "batch", "deadline": deadline}
    code, created = call("POST", "/documents", body=body)
    assert code == 201 and created["estimate"]["lane"] == "batch", created
    document_id = created["document_id"]
    upload_through_presigned_url(api, created, (corpus / "pdflatex-4-pages.pdf").read_bytes())
    # When the transcribe function takes its messages: each page is rendered, its image kept, and parked, no call made
    api.run_until_idle()
    code, status = call("GET", f"/documents/{document_id}")
    assert (status["lane"], status["batch_pages_waiting"], status["pages"]["PROCESSING"]) == ("batch", 4, 4)
    assert fake_provider.calls == 0
    # And the sweeper sends them in one batch, whose provider answers only two before the batch expires
    fake_batches.script(Expire(answered=2))
    assert api.sweep()["batch_pages_submitted"] == 4
    # Then the next sweep collects the two answers and sends the two others again; the one after collects them
    second = api.sweep()
    assert (second["batch_pages_answered"], second["batch_pages_submitted"]) == (2, 2)
    third = api.sweep()
    assert (third["batch_pages_answered"], third["batch_pages_waiting"]) == (2, 0)
    # And the document is COMPLETED, every page answered once by the batch and paid at its price
    code, status = call("GET", f"/documents/{document_id}")
    assert status["status"] == "COMPLETED" and status["batch_pages_waiting"] == 0, status
    attempts = db.load_attempts(document_id)
    assert Counter(a.outcome for a in attempts) == {"KEPT": 4}
    assert {a.provider.split(":")[0] for a in attempts} == {f"{dialect}-batch"}  # type: ignore[union-attr]
    assert status["cost"] == pytest.approx(4 * fake_batches.cost())
    assert fake_batches.fetches == 4 and fake_provider.calls == 0
    markdown = call("GET", f"/documents/{document_id}/transcript")[1]
    assert markdown.count("Transcribed page image") == 4


def test_post_documents_refuses_an_unknown_lane_and_a_deadline_in_the_past_or_without_its_offset(
    pipeline: Pipeline, fake_batches: FakeBatchServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    _stack(pipeline, monkeypatch, fake_batches, "openai")
    base = {"filename": "a.pdf", "content_type": "application/pdf"}
    code, refused = call("POST", "/documents", body={**base, "lane": "overnight"})
    assert code == 422 and "lane" in str(refused), refused
    past = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
    code, refused = call("POST", "/documents", body={**base, "lane": "batch", "deadline": past})
    assert code == 422 and "deadline" in str(refused) and "future" in str(refused), refused
    code, refused = call("POST", "/documents", body={**base, "deadline": "2099-01-01T00:00:00"})
    assert code == 422 and "offset" in str(refused), refused
