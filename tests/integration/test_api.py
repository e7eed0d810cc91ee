"""The REST API through real API Gateway proxy events, against moto (over HTTP) and PostgreSQL."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from pagescribe.handlers import api as api_app
from pagescribe.handlers.api.routes import openapi_json
from pagescribe.runtime import shutdown_runtime
from pagescribe.settings import get_settings
from pagescribe.store.postgres import Database
from pagescribe.webpage import ASSETS
from sqlalchemy import text

from tests.fakes.chat_server import FakeChatServer, Ok, Status
from tests.support.aws_events import LambdaContext, api_event, s3_put_event
from tests.support.pipeline import Pipeline

pytestmark = pytest.mark.integration

API_KEY = "test-api-key-0123456789"
CALLBACK_SECRET = "callback-secret"


def call(method: str, path: str, *, body: Any = None, key: str | None = API_KEY, **kw: Any) -> tuple[int, Any]:
    headers = {"x-api-key": key} if key is not None else {}
    raw = body if isinstance(body, str) or body is None else json.dumps(body)
    response = api_app.handler(api_event(method, path, body=raw, headers=headers, **kw), LambdaContext(29))
    text = response["body"]
    try:
        return response["statusCode"], json.loads(text)
    except json.JSONDecodeError:
        return response["statusCode"], text


@pytest.fixture
def api(pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch) -> Pipeline:
    monkeypatch.setenv("API_KEY", API_KEY)
    monkeypatch.setenv("CALLBACK_SECRET", CALLBACK_SECRET)
    monkeypatch.setenv("CALLBACK_ALLOW_PRIVATE_NETWORKS", "true")  # the receiver listens on 127.0.0.1
    shutdown_runtime()
    get_settings.cache_clear()
    return pipeline


def upload_through_presigned_url(api: Pipeline, created: dict[str, Any], data: bytes) -> dict[str, Any]:
    """PUT the file to the presigned URL over HTTP (as a client would), then deliver the S3 notification."""
    put = httpx.put(created["upload_url"], content=data, headers=created["upload_headers"])
    assert put.status_code == 200, put.text
    key = httpx.URL(created["upload_url"]).path.split("/", 2)[2]
    head = api.s3.head_object(Bucket=api.bucket, Key=key)
    event = s3_put_event(api.bucket, key, size=head["ContentLength"], etag=head["ETag"].strip('"'))
    from pagescribe.handlers import upload as upload_app

    return dict(upload_app.handler(event, LambdaContext(120)))


def test_the_full_flow_create_upload_transcribe_status_transcript_retry(
    api: Pipeline, db: Database, fake_provider: FakeChatServer, corpus: Path, callback_receiver: Any
) -> None:
    url, receiver = callback_receiver
    # Given a document created through the API, for pages 1, 2 and 4, with a callback
    code, created = call(
        "POST",
        "/documents",
        body={"filename": "report q3.pdf", "content_type": "application/pdf", "pages": "1-2,4", "callback_url": url},
    )
    assert code == 201 and created["status"] == "AWAITING_UPLOAD"
    document_id = created["document_id"]
    assert call("GET", f"/documents/{document_id}")[1]["status"] == "AWAITING_UPLOAD"
    # When the file is PUT to the presigned URL and S3 notifies the upload function
    [doc] = upload_through_presigned_url(api, created, (corpus / "pdflatex-4-pages.pdf").read_bytes())["documents"]
    assert doc["document_id"] == document_id and doc["pages"] == 3
    # Then the transcript is not ready yet (409 with the status)
    code, body = call("GET", f"/documents/{document_id}/transcript")
    assert code == 409 and body["status"] == "PROCESSING"
    # When one page fails for good (the provider refuses it) and the other two complete
    fake_provider.script(Ok(), Ok())
    fake_provider.set_default(Status(400, "unreadable page"))
    api.run_until_idle()
    code, status = call("GET", f"/documents/{document_id}")
    assert code == 200 and status["status"] == "PARTIAL"
    assert status["pages"] == {"QUEUED": 0, "PROCESSING": 0, "COMPLETED": 2, "FAILED": 1, "SKIPPED": 0}
    assert status["progress"] == 1.0 and status["cost"] > 0 and status["prompt_tokens"] == 2000
    [page_error] = status["page_errors"]
    failed_page = page_error["page"]
    assert failed_page in (1, 2, 4) and page_error["status"] == "FAILED"
    assert "unreadable page" in page_error["error"]
    # And the transcript is served as markdown and as JSON
    code, markdown = call("GET", f"/documents/{document_id}/transcript")
    # (each marker counts the file's own pages, 4, not the 3 asked for)
    assert code == 200 and f"<!-- page {failed_page} of 4: FAILED: " in markdown and "unreadable page" in markdown
    for page in {1, 2, 4} - {failed_page}:  # which page the provider refused depends on which rendered last
        assert f"<!-- page {page} of 4 (" in markdown
    code, as_json = call("GET", f"/documents/{document_id}/transcript", query={"format": "json"})
    assert code == 200 and [p["page"] for p in as_json["pages"]] == [1, 2, 4]
    # And its callback was not sent by the invocation that finished the document: it is due, for the sweeper's round
    finished = db.get_document(document_id)
    assert receiver.received == [] and finished is not None and finished.callback_status == "PENDING"
    api.sweep()
    # And the signed callback arrived once
    [(headers, raw)] = receiver.received
    signed = f"{headers['X-Pagescribe-Timestamp']}.{headers['X-Pagescribe-Delivery']}.".encode() + raw
    expected = "sha256=" + hmac.new(CALLBACK_SECRET.encode(), signed, hashlib.sha256).hexdigest()
    assert headers["X-Pagescribe-Signature"] == expected
    assert abs(int(headers["X-Pagescribe-Timestamp"]) - time.time()) < 600
    assert json.loads(raw)["status"] == "PARTIAL" and json.loads(raw)["document_id"] == document_id
    # When the failed page is retried and the provider has recovered
    fake_provider.set_default(Ok())
    code, retried = call("POST", f"/documents/{document_id}/retry")
    assert code == 202 and retried["pages_requeued"] == [failed_page]
    api.run_until_idle()
    api.sweep()
    # Then the document completes, and its callback is sent again
    code, status = call("GET", f"/documents/{document_id}")
    assert status["status"] == "COMPLETED" and status["pages"]["COMPLETED"] == 3
    assert call("POST", f"/documents/{document_id}/retry")[0] == 409
    assert len(receiver.received) == 2


def test_a_failed_callback_never_fails_the_document_and_is_retried(
    api: Pipeline, db: Database, fake_provider: FakeChatServer, corpus: Path, callback_receiver: Any
) -> None:
    url, receiver = callback_receiver
    receiver.answers.extend([500])
    _, created = call(
        "POST", "/documents", body={"filename": "a.png", "content_type": "image/png", "callback_url": url}
    )
    upload_through_presigned_url(api, created, (corpus / "smile.png").read_bytes())
    api.run_until_idle()
    api.sweep()
    document = db.get_document(created["document_id"])
    assert document is not None and document.status.value == "COMPLETED"
    assert document.callback_status == "PENDING" and document.callback_error == "HTTP 500"
    assert len(receiver.received) == 1


def test_callbacks_to_non_public_addresses_are_refused_by_default(
    api: Pipeline,
    db: Database,
    corpus: Path,
    callback_receiver: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given the default policy: no callbacks into loopback, private or link-local networks
    monkeypatch.delenv("CALLBACK_ALLOW_PRIVATE_NETWORKS")
    shutdown_runtime()
    get_settings.cache_clear()
    url, receiver = callback_receiver
    body = {"filename": "a.png", "content_type": "image/png", "callback_url": url}
    _, created = call("POST", "/documents", body=body)
    # When the document finishes
    upload_through_presigned_url(api, created, (corpus / "smile.png").read_bytes())
    api.run_until_idle()
    api.sweep()
    # Then the document completes, the callback is refused once with the reason, and nothing was sent
    document = db.get_document(created["document_id"])
    assert document is not None and document.status.value == "COMPLETED"
    assert document.callback_status == "FAILED" and "not a public address" in (document.callback_error or "")
    assert receiver.received == []


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"content_type": "application/pdf"}, "filename"),
        ({"filename": "a.pdf", "content_type": "text/plain"}, "content_type"),
        ({"filename": "a.pdf", "content_type": "application/pdf", "pages": "3-1"}, "pages"),
        ({"filename": "a.pdf", "content_type": "application/pdf", "pages": "one"}, "pages"),
        ({"filename": "a.pdf", "content_type": "application/pdf", "pages": "2147483648"}, "pages"),
        ({"filename": "a.pdf", "content_type": "application/pdf", "pages": "2147483600-2147483648"}, "pages"),
        ({"filename": "a.pdf", "content_type": "application/pdf", "pages": "\u00b2"}, "pages"),
        ({"filename": "a.pdf", "content_type": "application/pdf", "pages": "9" * 5000}, "pages"),
        ({"filename": "a.pdf", "content_type": "application/pdf", "callback_url": "ftp://x"}, "callback_url"),
        ({"filename": "a.pdf", "content_type": "application/pdf", "surprise": 1}, "surprise"),
    ],
)
def test_malformed_bodies_get_422_naming_the_field(api: Pipeline, body: dict[str, Any], field: str) -> None:
    code, answer = call("POST", "/documents", body=body)
    assert code == 422
    assert field in json.dumps(answer)


def test_a_body_that_is_not_json_gets_422(api: Pipeline) -> None:
    code, answer = call("POST", "/documents", body="{not json")
    assert code == 422 and "Traceback" not in json.dumps(answer)


def test_the_api_key_is_required_except_for_health(api: Pipeline) -> None:
    assert call("GET", "/health", key=None) == (200, {"status": "ok"})
    assert call("GET", "/documents/00000000-0000-0000-0000-000000000000", key=None)[0] == 401
    assert call("GET", "/documents/00000000-0000-0000-0000-000000000000", key="wrong")[0] == 403


def test_the_review_page_and_its_files_need_no_key_and_allow_only_the_api_and_the_bucket(
    api: Pipeline, moto_endpoint: str
) -> None:
    # When the review page and each of its files are asked for without a key
    answers = {
        path: api_app.handler(api_event("GET", path), LambdaContext(29))
        for path in ("/review", *[f"/review/{name}" for name in ASSETS])
    }
    # Then each is served, with a policy naming the bucket's origin (where presigned URLs point) beside the API's own
    assert {path: answer["statusCode"] for path, answer in answers.items()} == dict.fromkeys(answers, 200)
    page = answers["/review"]
    headers = {name.lower(): values[0] for name, values in page["multiValueHeaders"].items()}
    assert headers["content-type"] == "text/html; charset=utf-8"
    assert '<script type="module" src="review/review.js"></script>' in page["body"]
    assert (
        f"img-src 'self' {moto_endpoint} blob: data:; connect-src 'self' {moto_endpoint};"
        in headers["content-security-policy"]
    )
    assert headers["cache-control"] == "no-cache" and headers["x-content-type-options"] == "nosniff"
    # And a file off the allow-list is not found, even one in the folder
    for path in ("/review/index.html", "/review/LICENSE-marked", "/review/vendor", "/review/.."):
        assert call("GET", path, key=None) == (404, {"message": "no such file"}), path


@pytest.mark.parametrize("document_id", ["00000000-0000-0000-0000-000000000000", "1' OR '1'='1", "..%2F..%2Fetc"])
def test_unknown_and_sql_looking_ids_get_404(api: Pipeline, document_id: str) -> None:
    for method, suffix in (("GET", ""), ("GET", "/transcript"), ("POST", "/retry")):
        code, answer = call(method, f"/documents/{document_id}{suffix}")
        assert code == 404, (method, suffix, answer)
        assert answer == {"message": "no document with this id"}


def test_an_oversized_body_gets_413(api: Pipeline) -> None:
    body = {"filename": "a.pdf", "content_type": "application/pdf", "prompt": "x" * 70_000}
    code, answer = call("POST", "/documents", body=body)
    assert code == 413 and "exceeds" in answer["message"]


def test_the_key_is_checked_before_the_body_is_looked_at(api: Pipeline) -> None:
    code, answer = call("POST", "/documents", body="{not json", key=None)
    assert code == 401 and answer == {"message": "missing API key: send it in the x-api-key header"}


def test_the_committed_openapi_document_matches_the_code() -> None:
    committed = (Path(__file__).resolve().parents[2] / "docs" / "openapi.json").read_text()
    assert json.loads(committed) == json.loads(openapi_json()), (
        "docs/openapi.json is stale: regenerate it with "
        "`.venv/bin/python -m pagescribe.handlers.api > docs/openapi.json`"
    )


def test_a_presigned_url_makes_one_document_and_a_second_put_never_swaps_its_file(
    api: Pipeline, db: Database, fake_provider: FakeChatServer, corpus: Path
) -> None:
    # Given a document created through the API and its file PUT to the presigned URL
    code, created = call("POST", "/documents", body={"filename": "a.pdf", "content_type": "application/pdf"})
    assert code == 201
    [first] = upload_through_presigned_url(api, created, (corpus / "pdflatex-4-pages.pdf").read_bytes())["documents"]
    assert first["status"] == "PROCESSING"

    # When the same URL is used again, twice, with other files, before the pages are transcribed
    again = [
        upload_through_presigned_url(api, created, (corpus / name).read_bytes())["documents"][0]
        for name in ("multicolumn.pdf", "minimal-document.pdf")
    ]

    # Then neither PUT becomes a document: each is refused, naming the document that owns the prefix
    assert [doc["status"] for doc in again] == ["REFUSED", "REFUSED"]
    assert {doc["document_id"] for doc in again} == {created["document_id"]}
    with db.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM documents")).scalar_one() == 1
    # And the recorded document is never transcribed from the file that replaced its own: its pages fail, saying so
    api.run_until_idle()
    status = call("GET", f"/documents/{created['document_id']}")[1]
    assert status["status"] == "FAILED" and status["pages"]["FAILED"] == 4, status
    assert "was replaced after it was uploaded" in json.dumps(status)
    assert fake_provider.calls == 0


@pytest.mark.parametrize(
    ("field", "model"),
    [("model", "anthropic/claude-opus-4"), ("escalation_model", "openai/o3-pro")],
)
def test_a_caller_cannot_name_a_model_the_operator_did_not_allow(api: Pipeline, field: str, model: str) -> None:
    # Given a stack with its configured model (test/vision-model) and no ALLOWED_MODELS
    # When a caller names another model on the operator's provider account
    code, answer = call(
        "POST", "/documents", body={"filename": "a.pdf", "content_type": "application/pdf", field: model}
    )

    # Then the request is refused, naming the field, the model and what is allowed; nothing is recorded
    assert code == 422, answer
    assert field in json.dumps(answer) and model in json.dumps(answer) and "test/vision-model" in json.dumps(answer)


def test_models_the_operator_allows_may_be_named(api: Pipeline, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given ALLOWED_MODELS naming a second model
    monkeypatch.setenv("ALLOWED_MODELS", "test/vision-model, test/bigger-model")
    shutdown_runtime()
    get_settings.cache_clear()

    # When a caller names it
    body = {"filename": "a.pdf", "content_type": "application/pdf", "model": "test/bigger-model"}
    code, created = call("POST", "/documents", body=body)

    # Then the document is created
    assert code == 201, created


def test_a_document_is_retried_at_most_max_document_retries_times(
    api: Pipeline, db: Database, fake_provider: FakeChatServer, corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a stack allowing two retries per document, and a page the provider always refuses
    monkeypatch.setenv("MAX_DOCUMENT_RETRIES", "2")
    shutdown_runtime()
    get_settings.cache_clear()
    fake_provider.set_default(Status(400, "unreadable page"))
    code, created = call("POST", "/documents", body={"filename": "a.png", "content_type": "image/png"})
    assert code == 201
    upload_through_presigned_url(api, created, (corpus / "smile.png").read_bytes())
    api.run_until_idle()
    document_id = created["document_id"]

    # When the caller retries it again and again
    answers = []
    for _ in range(3):
        answers.append(call("POST", f"/documents/{document_id}/retry"))
        api.run_until_idle()

    # Then the first two are accepted, the third refused with 429 naming the limit, and no more model calls follow
    assert [code for code, _ in answers] == [202, 202, 429]
    assert "MAX_DOCUMENT_RETRIES=2" in answers[2][1]["message"]
    assert fake_provider.calls == 3  # the first delivery and two retries, each one attempt (a 400 is not retried)
    document = db.get_document(document_id)
    assert document is not None and document.retries == 2
