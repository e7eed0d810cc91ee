"""Deployed configuration: migrations as a CloudFormation custom resource, secrets from Secrets Manager/SSM."""

from __future__ import annotations

import json
import secrets
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import boto3
import psycopg
import pytest
from pagescribe.handlers import migrate as migrate_app
from pagescribe.runtime import shutdown_runtime
from pagescribe.settings import get_settings
from pagescribe.store.postgres import Database
from sqlalchemy import create_engine, inspect

from tests.fakes.chat_server import FakeChatServer
from tests.support.aws_events import LambdaContext
from tests.support.database import ADMIN_URL
from tests.support.pipeline import Pipeline

pytestmark = pytest.mark.integration


class _CloudFormation(BaseHTTPRequestHandler):
    answers: list[dict[str, Any]]

    def do_PUT(self) -> None:
        self.answers.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        return


@pytest.fixture
def cloudformation() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    responses: list[dict[str, Any]] = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), type("CFN", (_CloudFormation,), {"answers": responses}))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/cloudformation-response", responses
    server.shutdown()


@pytest.fixture
def empty_database() -> Iterator[str]:
    name = f"pagescribe_deploy_{secrets.token_hex(4)}"
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    yield f"{ADMIN_URL.rsplit('/', 1)[0]}/{name}"
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _custom_resource_event(request_type: str, response_url: str) -> dict[str, Any]:
    return {
        "RequestType": request_type,
        "ServiceToken": "arn:aws:lambda:us-east-1:123456789012:function:pagescribe-MigrateFunction",
        "ResponseURL": response_url,
        "StackId": "arn:aws:cloudformation:us-east-1:123456789012:stack/pagescribe/6a1f0b5e",
        "RequestId": "8d3b7c1e-0f3a-4c55-9d1b-2c7e5b8f4a10",
        "LogicalResourceId": "DatabaseMigration",
        "ResourceType": "Custom::DatabaseMigration",
        "ResourceProperties": {"ServiceToken": "arn:…", "LayerVersion": "arn:aws:lambda:…:layer:shared:7"},
    }


def _reconfigure(monkeypatch: pytest.MonkeyPatch, **env: str | None) -> None:
    for name, value in env.items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    shutdown_runtime()
    get_settings.cache_clear()


def test_a_fresh_stack_gets_its_schema_and_a_second_deploy_is_a_no_op(
    cloudformation: tuple[str, list[dict[str, Any]]], empty_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, responses = cloudformation
    _reconfigure(monkeypatch, DATABASE_URL=empty_database)
    for request_type in ("Create", "Update"):
        migrate_app.handler(_custom_resource_event(request_type, url), LambdaContext(300))
    assert [r["Status"] for r in responses] == ["SUCCESS", "SUCCESS"]
    assert responses[0]["LogicalResourceId"] == "DatabaseMigration" and responses[0]["PhysicalResourceId"]
    engine = create_engine(empty_database.replace("postgresql://", "postgresql+psycopg://"))
    assert {"documents", "jobs", "alembic_version"} <= set(inspect(engine).get_table_names())
    engine.dispose()
    _reconfigure(monkeypatch)


def test_a_failed_migration_is_reported_with_its_reason_not_left_hanging(
    cloudformation: tuple[str, list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, responses = cloudformation
    _reconfigure(monkeypatch, DATABASE_URL="postgresql://postgres@127.0.0.1:5432/no_such_database_here")
    migrate_app.handler(_custom_resource_event("Create", url), LambdaContext(300))
    [response] = responses
    assert response["Status"] == "FAILED" and "no_such_database_here" in response["Reason"]
    _reconfigure(monkeypatch)


def test_deleting_the_stack_keeps_the_data(
    cloudformation: tuple[str, list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, responses = cloudformation
    _reconfigure(monkeypatch, DATABASE_URL="postgresql://postgres@127.0.0.1:5432/no_such_database_here")
    migrate_app.handler(_custom_resource_event("Delete", url), LambdaContext(300))
    assert responses[0]["Status"] == "SUCCESS"
    _reconfigure(monkeypatch)


def test_the_database_and_provider_key_come_from_secrets_manager_and_ssm(
    pipeline: Pipeline, db: Database, corpus: Path, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given the connection in a Secrets Manager secret and the provider key in an SSM SecureString, and a
    # provider that refuses requests without that key
    arn = boto3.client("secretsmanager").create_secret(
        Name="pagescribe/database", SecretString=json.dumps({"url": database_url})
    )["ARN"]
    boto3.client("ssm").put_parameter(Name="/pagescribe/provider-api-key", Value="sk-from-ssm", Type="SecureString")
    with FakeChatServer(require_api_key="sk-from-ssm") as provider:
        _reconfigure(
            monkeypatch,
            DATABASE_URL=None,
            DATABASE_SECRET_ARN=arn,
            PROVIDER_API_KEY_PARAMETER="/pagescribe/provider-api-key",
            PROVIDER_BASE_URL=provider.base_url,
        )
        # When a document goes through the pipeline
        [doc] = pipeline.upload("uploads/secret.png", corpus / "smile.png")["documents"]
        pipeline.run_until_idle()
        # Then it was recorded in that database and transcribed with that key
        _, js = pipeline.transcript(doc["document_id"])
        assert js["status"] == "COMPLETED" and provider.calls == 1
        assert provider.received[0].headers["authorization"] == "Bearer sk-from-ssm"
