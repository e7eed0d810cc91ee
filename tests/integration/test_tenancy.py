"""Tenants: each key names its tenant, and a tenant reads, retries and is called back about its own documents only.

Through the real API handler (API Gateway proxy events), the upload handler, moto's S3, PostgreSQL and the `pagescribe
keys` command run as a user runs it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import boto3
import pytest
from pagescribe.handlers import api as api_app
from pagescribe.runtime import get_runtime, shutdown_runtime
from pagescribe.settings import Settings, get_settings
from pagescribe.store.postgres import Database
from pagescribe.tenancy import KeyRefused, KeyRing, create_key, key_hash
from sqlalchemy import text

from tests.fakes.chat_server import FakeChatServer, Ok
from tests.support.aws_events import LambdaContext, api_event
from tests.support.commands import command_environment, pagescribe
from tests.support.pipeline import REPO, Pipeline

pytestmark = pytest.mark.integration

OPERATOR_KEY = "operator-key-0123456789"


def call(method: str, path: str, key: str | None, body: Any = None) -> tuple[int, Any]:
    headers = {"x-api-key": key} if key is not None else {}
    raw = None if body is None else json.dumps(body)
    response = api_app.handler(api_event(method, path, body=raw, headers=headers), LambdaContext(29))
    try:
        return response["statusCode"], json.loads(response["body"])
    except json.JSONDecodeError:  # a markdown transcript
        return response["statusCode"], response["body"]


@pytest.fixture
def tenants(pipeline: Pipeline, db: Database, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The operator's API_KEY, and a key each for tenants acme and globex (looked up afresh on every request)."""
    monkeypatch.setenv("API_KEY", OPERATOR_KEY)
    monkeypatch.setenv("API_KEY_CACHE_SECONDS", "0")
    monkeypatch.setenv("CALLBACK_ALLOW_PRIVATE_NETWORKS", "true")
    shutdown_runtime()
    get_settings.cache_clear()
    return {tenant: create_key(db, tenant)[1] for tenant in ("acme", "globex")}


def upload(pipeline: Pipeline, created: dict[str, Any], data: bytes) -> dict[str, Any]:
    import httpx

    from tests.support.aws_events import s3_put_event

    assert httpx.put(created["upload_url"], content=data, headers=created["upload_headers"]).status_code == 200
    key = httpx.URL(created["upload_url"]).path.split("/", 2)[2]
    head = pipeline.s3.head_object(Bucket=pipeline.bucket, Key=key)
    event = s3_put_event(pipeline.bucket, key, size=head["ContentLength"], etag=head["ETag"].strip('"'))
    from pagescribe.handlers import upload as upload_app

    [document] = upload_app.handler(event, LambdaContext(120))["documents"]
    return dict(document)


def test_a_tenant_cannot_read_retry_or_see_another_tenants_documents(
    pipeline: Pipeline, db: Database, tenants: dict[str, str], corpus: Path
) -> None:
    # Given a document of acme's, uploaded and transcribed, under acme's own prefix
    code, created = call("POST", "/documents", tenants["acme"], {"filename": "a.png", "content_type": "image/png"})
    assert code == 201 and f"/uploads/acme/{created['document_id']}/a.png" in created["upload_url"]
    assert upload(pipeline, created, (corpus / "smile.png").read_bytes())["status"] == "PROCESSING"
    pipeline.run_until_idle()
    document_id = created["document_id"]

    # When globex asks for it, its transcript, a retry, a page's image or figures, a page re-run or a page correction;
    # and asks for an id that does not exist
    theirs = [
        call("GET", f"/documents/{document_id}", tenants["globex"]),
        call("GET", f"/documents/{document_id}/transcript", tenants["globex"]),
        call("POST", f"/documents/{document_id}/retry", tenants["globex"]),
        call("GET", f"/documents/{document_id}/pages/1/image", tenants["globex"]),
        call("GET", f"/documents/{document_id}/pages/1/figures", tenants["globex"]),
        call("POST", f"/documents/{document_id}/pages/1/rerun", tenants["globex"], {}),
        call("PUT", f"/documents/{document_id}/pages/1/correction", tenants["globex"], {"markdown": "globex was here"}),
    ]
    unknown = call("GET", "/documents/00000000-0000-0000-0000-000000000000", tenants["globex"])

    # Then each answers exactly as for an unknown id: 404, nothing said of the document, and nothing changed
    assert [code for code, _ in theirs] == [404] * 7
    assert all(body == unknown[1] for _, body in theirs) and unknown[0] == 404
    # And acme (and nobody else, not even the operator's key) reads it
    assert call("GET", f"/documents/{document_id}", tenants["acme"])[0] == 200
    assert call("GET", f"/documents/{document_id}/transcript", tenants["acme"])[0] == 200
    assert call("GET", f"/documents/{document_id}", OPERATOR_KEY)[0] == 404
    document = db.get_document(document_id)
    assert document is not None and document.tenant_id == "acme"
    assert document.status.value == "COMPLETED" and document.retries == 0
    _, transcript = call("GET", f"/documents/{document_id}/transcript?format=json", tenants["acme"])
    assert "globex was here" not in json.dumps(transcript)


def test_an_idempotency_key_is_the_tenants_own(pipeline: Pipeline, tenants: dict[str, str]) -> None:
    # Given acme's document created with an Idempotency-Key
    body = json.dumps({"filename": "a.png", "content_type": "image/png"})

    def create(tenant: str) -> tuple[int, Any]:
        event = api_event(
            "POST", "/documents", body=body, headers={"x-api-key": tenants[tenant], "Idempotency-Key": "order-1"}
        )
        response = api_app.handler(event, LambdaContext(29))
        return response["statusCode"], json.loads(response["body"])

    code, acmes = create("acme")
    assert code == 201
    # When globex sends the same request with the same key
    code, globexs = create("globex")
    # Then globex gets a document of its own, not acme's id or upload URL; and acme's retry still gets acme's
    assert code == 201 and globexs["document_id"] != acmes["document_id"]
    assert "/uploads/globex/" in globexs["upload_url"] and "/uploads/acme/" not in globexs["upload_url"]
    assert create("acme")[1]["document_id"] == acmes["document_id"]


def test_a_revoked_key_is_refused_and_keys_are_stored_only_hashed(
    pipeline: Pipeline,
    db: Database,
    tenants: dict[str, str],
    database_url: str,
    tmp_path: Path,
    fake_provider: FakeChatServer,
) -> None:
    # Given acme's key, which works
    assert (
        call("POST", "/documents", tenants["acme"], {"filename": "a.pdf", "content_type": "application/pdf"})[0] == 201
    )

    # When the operator lists the keys and revokes acme's by its label, with the command
    env = command_environment(database_url, fake_provider)
    listed = pagescribe("keys", "list", env=env, cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    [acme_line] = [line for line in listed.stdout.splitlines() if line.startswith("acme\t")]
    label = acme_line.split("\t")[1]
    revoked = pagescribe("keys", "revoke", label, "--tenant", "acme", env=env, cwd=tmp_path)
    assert revoked.returncode == 0, revoked.stderr

    # Then the key is refused, saying so, and globex's still works
    assert call("POST", "/documents", tenants["acme"], {"filename": "a.pdf", "content_type": "application/pdf"}) == (
        403,
        {"message": "revoked API key"},
    )
    assert call("GET", "/documents/00000000-0000-0000-0000-000000000000", tenants["globex"])[0] == 404
    # And neither key is anywhere in the database: only their hashes and labels
    with db.engine.connect() as conn:
        dump = json.dumps([list(map(str, row)) for row in conn.execute(text("SELECT * FROM api_keys"))])
    assert all(key not in dump and key[12:] not in dump for key in tenants.values())
    assert listed.stdout.count("\t") and all(key not in listed.stdout for key in tenants.values())


def test_keys_create_shows_the_key_once_and_adds_it_to_the_usage_plan(
    pipeline: Pipeline, db: Database, database_url: str, tmp_path: Path, fake_provider: FakeChatServer
) -> None:
    # Given the stack's API Gateway usage plan (moto's)
    gateway = boto3.client("apigateway")
    plan = gateway.create_usage_plan(name="pagescribe")["id"]
    env = {**command_environment(database_url, fake_provider), **_aws_env()}

    # When the operator makes a key for a new tenant with the command
    made = pagescribe("keys", "create", "--tenant", "initech", "--usage-plan", plan, env=env, cwd=tmp_path)

    # Then it prints the key once, the database knows its hash as initech's, and the usage plan has the same key
    assert made.returncode == 0, made.stderr
    printed = json.loads(made.stdout)
    assert printed["tenant"] == "initech" and printed["api_key"].startswith("psk_")
    assert db.find_api_key(key_hash(printed["api_key"])) == ("initech", False)
    keys = gateway.get_usage_plan_keys(usagePlanId=plan)["items"]
    assert [k["value"] for k in keys] == [printed["api_key"]]
    # And a tenant id that is not one is refused, naming it
    bad = pagescribe("keys", "create", "--tenant", "Not A Tenant", env=env, cwd=tmp_path)
    assert bad.returncode == 2 and "invalid tenant 'Not A Tenant'" in bad.stderr


def test_the_deploy_guides_recipe_gives_each_client_its_own_documents_and_refuses_keys_that_are_no_tenants(
    pipeline: Pipeline,
    db: Database,
    database_url: str,
    tmp_path: Path,
    fake_provider: FakeChatServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a stack deployed with the template's defaults (no API_KEY; TenantKeysOnly as the template sets it), whose
    # one client so far uses the key SAM made for the stack (API Gateway checked it; it is no tenant's)
    template = (REPO / "template.yaml").read_text()
    default = re.search(r"^  TenantKeysOnly:\n(?:    .*\n)*?    Default: \"(\w+)\"", template, re.MULTILINE)
    assert default is not None
    monkeypatch.delenv("API_KEY", raising=False)
    monkeypatch.setenv("TENANT_KEYS_ONLY", default.group(1))
    monkeypatch.setenv("API_KEY_CACHE_SECONDS", "0")
    shutdown_runtime()
    get_settings.cache_clear()
    stack_key = "the-key-sam-made-for-the-stack-0123456789"
    body = {"filename": "a.png", "content_type": "image/png"}
    assert call("POST", "/documents", stack_key, body)[0] == 201

    # When the operator gives two clients a key each, as docs/deploy.md says: made with the command, in the usage plan
    recipe = "pagescribe keys create --tenant"
    assert recipe in (REPO / "docs" / "deploy.md").read_text()
    plan = boto3.client("apigateway").create_usage_plan(name="pagescribe")["id"]
    env = {**command_environment(database_url, fake_provider), **_aws_env()}
    keys = {}
    for client in ("client1", "client2"):
        made = pagescribe("keys", "create", "--tenant", client, "--usage-plan", plan, env=env, cwd=tmp_path)
        assert made.returncode == 0, made.stderr
        keys[client] = json.loads(made.stdout)["api_key"]

    # Then client 1's document is client 1's alone: client 2 is told it does not exist
    code, created = call("POST", "/documents", keys["client1"], body)
    assert code == 201
    assert call("GET", f"/documents/{created['document_id']}", keys["client1"])[0] == 200
    assert call("GET", f"/documents/{created['document_id']}", keys["client2"])[0] == 404
    # And the stack's own key, no tenant's, is refused now that clients have theirs (it would read as anyone's)
    code, refused = call("GET", "/documents", stack_key)
    assert code == 403 and refused["message"] == "invalid API key"


def test_with_tenant_keys_only_false_a_key_that_is_no_tenants_stays_the_default_tenants(db: Database) -> None:
    # Given a single-client stack that set TENANT_KEYS_ONLY=false, where a tenant holds a key all the same
    create_key(db, "acme")
    ring = KeyRing(Settings(api_key=None, api_key_cache_seconds=0, tenant_keys_only="false"), db)
    # Then a key API Gateway let in that is no tenant's is the default tenant's, as the operator chose
    assert ring.tenant_for("the-key-sam-made-for-the-stack-0123456789") == "default"


@pytest.mark.parametrize(
    ("key", "tenant"),
    [
        ("uploads/acme/reports/q3.pdf", "acme"),
        ("uploads/q3.pdf", "default"),
        ("uploads/nobody/q3.pdf", "default"),
    ],
)
def test_a_file_put_straight_into_the_bucket_belongs_to_the_tenant_its_prefix_names(
    pipeline: Pipeline, db: Database, tenants: dict[str, str], corpus: Path, key: str, tenant: str
) -> None:
    [document] = pipeline.upload(key, corpus / "smile.png")["documents"]
    record = db.get_document(document["document_id"])
    assert record is not None and record.tenant_id == tenant


class _Receiver(BaseHTTPRequestHandler):
    received: ClassVar[list[tuple[dict[str, str], bytes]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).received.append((dict(self.headers), body))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        return


@pytest.fixture
def receiver() -> Iterator[tuple[str, type[_Receiver]]]:
    handler = type("Receiver", (_Receiver,), {"received": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook", handler
    server.shutdown()


def test_callbacks_are_signed_with_the_tenants_own_rotatable_secret(
    pipeline: Pipeline,
    db: Database,
    tenants: dict[str, str],
    corpus: Path,
    receiver: tuple[str, type[_Receiver]],
    database_url: str,
    tmp_path: Path,
    fake_provider: FakeChatServer,
) -> None:
    # Given acme's own callback secret, made with the command (the stack has none)
    env = command_environment(database_url, fake_provider)
    made = pagescribe("tenants", "callback-secret", "--tenant", "acme", env=env, cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    secret = json.loads(made.stdout)["callback_secret"]
    url, handler = receiver

    # When acme's document with a callback finishes
    body = {"filename": "a.png", "content_type": "image/png", "callback_url": url}
    code, created = call("POST", "/documents", tenants["acme"], body)
    assert code == 201, created
    upload(pipeline, created, (corpus / "smile.png").read_bytes())
    pipeline.run_until_idle()
    pipeline.sweep()

    # Then the callback verifies under acme's secret
    [(headers, raw)] = handler.received
    signed = f"{headers['X-Pagescribe-Timestamp']}.{headers['X-Pagescribe-Delivery']}.".encode() + raw
    assert (
        headers["X-Pagescribe-Signature"] == "sha256=" + hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
    )
    # And globex, with no secret of its own and none on the stack, cannot ask for unsigned callbacks
    code, refused = call("POST", "/documents", tenants["globex"], body)
    assert code == 422 and "callback_url" in json.dumps(refused)


def test_a_revoked_key_is_refused_once_its_cached_answer_runs_out(db: Database) -> None:
    # Given a warm environment that looked a key up a moment ago and keeps answers 30 s
    now = [1000.0]
    ring = KeyRing(Settings(api_key_cache_seconds=30, tenant_keys_only="true"), db, clock=lambda: now[0])
    key_id, key = create_key(db, "acme")
    assert ring.tenant_for(key) == "acme"

    # When the key is revoked
    db.revoke_api_key(key_id)

    # Then the environment refuses it once the 30 s are up, and never an unknown or missing key
    now[0] += 31
    with pytest.raises(KeyRefused, match="revoked API key"):
        ring.tenant_for(key)
    with pytest.raises(KeyRefused, match="invalid API key"):
        ring.tenant_for("psk_" + "x" * 43)
    with pytest.raises(KeyRefused, match="missing API key") as missing:
        ring.tenant_for(None)
    assert missing.value.missing


def _aws_env() -> dict[str, str]:
    import os

    return {name: value for name, value in os.environ.items() if name.startswith("AWS_")}


def test_an_estimate_comes_from_the_tenants_own_calls_and_tells_nothing_of_anothers(
    pipeline: Pipeline, tenants: dict[str, str], corpus: Path, fake_provider: FakeChatServer
) -> None:
    # Given acme's one-page document, transcribed by a call the provider priced
    fake_provider.set_default(Ok(cost=0.0004))
    body = {"filename": "a.png", "content_type": "image/png"}
    _, created = call("POST", "/documents", tenants["acme"], body)
    upload(pipeline, created, (corpus / "smile.png").read_bytes())
    pipeline.run_until_idle()
    # When acme and globex each ask for a document on the same model
    _, acmes = call("POST", "/documents", tenants["acme"], body)
    _, globexs = call("POST", "/documents", tenants["globex"], body)
    # Then acme's estimate is its own call's price, and globex's says it has no history: nothing of acme's volume or
    # price reaches it
    assert acmes["estimate"]["cost_per_page_usd"] == pytest.approx(0.0004)
    assert "your latest 1 calls" in acmes["estimate"]["basis"]
    assert globexs["estimate"]["cost_per_page_usd"] is None and "unknown" in globexs["estimate"]["basis"]


def test_the_stacks_callback_secret_signs_only_the_default_tenants_callbacks(
    pipeline: Pipeline, db: Database, tenants: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a stack with its own callback secret, and tenants without secrets of their own
    monkeypatch.setenv("CALLBACK_SECRET", "the-stacks-callback-secret-0123456789")
    shutdown_runtime()
    get_settings.cache_clear()
    body = {"filename": "a.png", "content_type": "image/png", "callback_url": "https://hooks.example/pagescribe"}
    # When the operator (the default tenant) and globex each ask for a callback
    operator = call("POST", "/documents", OPERATOR_KEY, body)
    code, refused = call("POST", "/documents", tenants["globex"], body)
    # Then the operator's is taken, signed by the stack; globex's is refused, naming the command that gives it its own
    assert operator[0] == 201
    assert code == 422 and refused["field"] == "callback_url"
    assert "pagescribe tenants callback-secret --tenant globex" in refused["message"]
    # And a callback of globex's stored before this rule is never signed with the stack's secret: it fails, saying why
    document_id = call("POST", "/documents", tenants["globex"], {k: v for k, v in body.items() if k != "callback_url"})
    with db.engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE documents SET callback_url = :url, callback_status = 'PENDING', callback_attempts = 0, "
                "callback_next_at = now(), status = 'COMPLETED', finished_at = now() WHERE id = :id"
            ),
            {"url": body["callback_url"], "id": document_id[1]["document_id"]},
        )
    get_runtime().notifier.deliver_due()
    with db.engine.connect() as conn:
        status, error = conn.execute(
            text("SELECT callback_status, callback_error FROM documents WHERE id = :id"),
            {"id": document_id[1]["document_id"]},
        ).one()
    assert status == "FAILED" and "tenant 'globex' has no callback secret of its own" in error
