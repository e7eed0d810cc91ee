"""Nothing paid twice: the same bytes for the same request reuse a finished transcript; an Idempotency-Key of POST
/documents gives its first answer again. Through the real handlers, moto, PostgreSQL and the fake provider."""

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


def call(method: str, path: str, body: Any, headers: dict[str, str]) -> tuple[int, Any]:
    response = api_app.handler(api_event(method, path, body=json.dumps(body), headers=headers), LambdaContext(29))
    return response["statusCode"], json.loads(response["body"])


def documents(db: Database) -> int:
    with db.engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM documents")).scalar_one())


def test_the_same_bytes_uploaded_again_reuse_the_transcript_without_a_model_call(
    pipeline: Pipeline, db: Database, fake_provider: FakeChatServer, corpus: Path
) -> None:
    # Given a 4-page PDF transcribed once
    source = corpus / "pdflatex-4-pages.pdf"
    [first] = pipeline.upload("uploads/report.pdf", source)["documents"]
    pipeline.run_until_idle()
    assert fake_provider.calls == 4

    # When the same bytes are uploaded again under another name
    [second] = pipeline.upload("uploads/copy of report.pdf", source)["documents"]

    # Then the document is COMPLETED at once, with the first one's pages, no job queued and no model call
    assert (second["status"], second["pages"], second["messages_sent"]) == ("COMPLETED", 4, 0)
    assert pipeline.receive_all() == [] and fake_provider.calls == 4
    _, first_json = pipeline.transcript(first["document_id"])
    markdown, second_json = pipeline.transcript(second["document_id"])
    assert [p["text"] for p in second_json["pages"]] == [p["text"] for p in first_json["pages"]]
    assert second_json["reused_from"] == first["document_id"] and second_json["cost"] == 0
    assert all(page["attempts"] == [] for page in second_json["pages"]) and markdown.count("<!-- page ") == 4


def test_a_changed_request_or_an_opt_out_transcribes_again(
    pipeline: Pipeline, db: Database, fake_provider: FakeChatServer, corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a page transcribed once by the stack's model, and callers who may name another
    monkeypatch.setenv("ALLOWED_MODELS", "test/vision-model,test/other-model")
    shutdown_runtime()
    get_settings.cache_clear()
    image = (corpus / "smile.png").read_bytes()
    pipeline.upload("uploads/once.png", image)
    pipeline.run_until_idle()
    assert fake_provider.calls == 1

    # When the same bytes come through the API for another model, another prompt, and with reuse turned off
    for body in ({"model": "test/other-model"}, {"prompt": "Only the headings."}, {"reuse": False}):
        code, created = call("POST", "/documents", {"filename": "again.png", "content_type": "image/png", **body}, {})
        assert code == 201, created
        key = created["upload_url"].split(f"/{pipeline.bucket}/", 1)[1].split("?", 1)[0]
        from urllib.parse import unquote

        pipeline.upload(unquote(key), image)
        pipeline.run_until_idle()

    # Then each was transcribed again
    assert fake_provider.calls == 4


def test_another_tenants_identical_file_is_not_reused(
    pipeline: Pipeline, db: Database, fake_provider: FakeChatServer, corpus: Path
) -> None:
    # Given a file transcribed for tenant acme
    create_key(db, "acme")
    image = (corpus / "smile.png").read_bytes()
    pipeline.upload("uploads/acme/scan.png", image)
    pipeline.run_until_idle()

    # When the same bytes arrive for the default tenant
    [other] = pipeline.upload("uploads/scan.png", image)["documents"]
    pipeline.run_until_idle()

    # Then they are transcribed for it: one tenant's transcript never answers another's upload
    assert other["status"] == "PROCESSING" and fake_provider.calls == 2


def test_an_idempotency_key_gives_its_first_answer_again(pipeline: Pipeline, db: Database) -> None:
    # Given a client that sends POST /documents, times out, and sends it again with the same Idempotency-Key
    body = {"filename": "a.pdf", "content_type": "application/pdf", "pages": "1-2"}
    first = call("POST", "/documents", body, {"Idempotency-Key": "order-42"})
    again = call("POST", "/documents", body, {"idempotency-key": "order-42"})

    # Then both answers are the first one, and there is one document
    assert first[0] == again[0] == 201 and first[1] == again[1]
    assert documents(db) == 1
    # And the same key with another request is refused, naming the header; a new key makes a new document
    changed = call("POST", "/documents", {**body, "pages": "3"}, {"Idempotency-Key": "order-42"})
    assert changed[0] == 422 and "Idempotency-Key" in json.dumps(changed[1])
    assert (
        call("POST", "/documents", body, {"Idempotency-Key": "order-43"})[1]["document_id"] != first[1]["document_id"]
    )
    assert documents(db) == 2
