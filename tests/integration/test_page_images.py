"""Page images kept: the image each page was sent to the model as, stored under the transcript's prefix, and a
short-lived link to it from the API. Real handlers, moto over HTTP, PostgreSQL, the fake provider."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import httpx
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


def call(path: str, *, key: str = API_KEY) -> tuple[int, Any]:
    response = api_app.handler(api_event("GET", path, headers={"x-api-key": key}), LambdaContext(29))
    return response["statusCode"], json.loads(response["body"])


def configure(monkeypatch: pytest.MonkeyPatch, **settings: str) -> None:
    monkeypatch.setenv("API_KEY", API_KEY)
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    shutdown_runtime()
    get_settings.cache_clear()


def sent_images(provider: FakeChatServer) -> list[bytes]:
    """The images the model was sent, decoded from the requests' data URLs."""
    images = []
    for body in provider.requests:
        url = body["messages"][0]["content"][1]["image_url"]["url"]
        images.append(base64.b64decode(url.split(",", 1)[1]))
    return images


def image_keys(db: Database, document_id: str) -> dict[int, str | None]:
    with db.engine.connect() as conn:
        rows = conn.execute(
            text("SELECT page_number, image_key FROM jobs WHERE document_id = :id ORDER BY page_number"),
            {"id": document_id},
        )
        return {row.page_number: row.image_key for row in rows}


def transcribe(pipeline: Pipeline, corpus: Path, name: str) -> str:
    [document] = pipeline.upload(f"uploads/{name}", corpus / name)["documents"]
    pipeline.run_until_idle()
    return str(document["document_id"])


def test_each_page_keeps_the_image_it_was_sent_as_and_the_api_links_to_it(
    pipeline: Pipeline, db: Database, fake_provider: FakeChatServer, corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given the stack's defaults (page images kept)
    configure(monkeypatch)
    # When a 4-page PDF is uploaded and transcribed
    document_id = transcribe(pipeline, corpus, "pdflatex-4-pages.pdf")
    # Then each page notes the key of its image, beside the transcript
    keys = image_keys(db, document_id)
    assert keys == {page: f"transcripts/{document_id}/pages/{page:04d}.jpg" for page in range(1, 5)}
    # And the four images in the bucket are the very bytes the model was sent
    kept = [pipeline.s3.get_object(Bucket=pipeline.bucket, Key=key)["Body"].read() for key in keys.values()]
    assert sorted(kept) == sorted(sent_images(fake_provider)) and len(set(kept)) == 4
    # When the API is asked for page 2's image
    code, answer = call(f"/documents/{document_id}/pages/2/image")
    # Then it answers a link that reads that image as a JPEG, with no API key, for the configured time
    assert code == 200 and answer["page_number"] == 2 and answer["expires_in"] == 300
    fetched = httpx.get(answer["url"])
    assert fetched.status_code == 200 and fetched.headers["content-type"] == "image/jpeg"
    assert fetched.content == pipeline.s3.get_object(Bucket=pipeline.bucket, Key=keys[2])["Body"].read()


def test_the_image_link_is_refused_clearly_for_bad_pages_and_other_tenants(
    pipeline: Pipeline, db: Database, fake_provider: FakeChatServer, corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a transcribed document of the default tenant, and another tenant's key
    configure(monkeypatch)
    document_id = transcribe(pipeline, corpus, "pdflatex-4-pages.pdf")
    _, other_key = create_key(db, "globex")
    # Then a page that is not a number, and a page the document does not have, are refused naming the value
    code, body = call(f"/documents/{document_id}/pages/two/image")
    assert code == 400 and "not 'two'" in body["message"]
    code, body = call(f"/documents/{document_id}/pages/9/image")
    assert code == 404 and body["message"] == "the document has no page 9"
    # And another tenant's key finds no such document, exactly as for an unknown id
    assert call(f"/documents/{document_id}/pages/1/image", key=other_key) == (
        404,
        {"message": "no document with this id"},
    )
    unknown = "00000000-0000-4000-8000-000000000000"
    assert call(f"/documents/{unknown}/pages/1/image") == (404, {"message": "no document with this id"})


def test_with_keeping_off_no_image_is_stored_and_the_api_says_so(
    pipeline: Pipeline, db: Database, fake_provider: FakeChatServer, corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given KEEP_PAGE_IMAGES=false
    configure(monkeypatch, KEEP_PAGE_IMAGES="false")
    # When a document is transcribed
    document_id = transcribe(pipeline, corpus, "pdflatex-4-pages.pdf")
    # Then its pages were sent to the model, but nothing was stored under its pages/ prefix
    assert fake_provider.calls == 4
    listed = pipeline.s3.list_objects_v2(Bucket=pipeline.bucket, Prefix=f"transcripts/{document_id}/")
    assert listed.get("KeyCount") == 0
    assert set(image_keys(db, document_id).values()) == {None}
    # And the API says why there is no image
    code, body = call(f"/documents/{document_id}/pages/1/image")
    assert code == 404 and body["message"] == "page 1 has no image kept: KEEP_PAGE_IMAGES is off"


def test_a_page_read_from_its_text_layer_has_no_image_and_the_api_says_why(
    pipeline: Pipeline, db: Database, fake_provider: FakeChatServer, corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given TEXT_LAYER=auto, under which a PDF page with a usable text layer is never rendered
    configure(monkeypatch, TEXT_LAYER="auto")
    # When the 4-page PDF (text on every page) is transcribed
    document_id = transcribe(pipeline, corpus, "pdflatex-4-pages.pdf")
    # Then no page was rendered or sent, and no image was kept
    assert fake_provider.calls == 0
    assert set(image_keys(db, document_id).values()) == {None}
    code, body = call(f"/documents/{document_id}/pages/3/image")
    assert code == 404 and "it was not rendered (read from its text layer" in body["message"]
