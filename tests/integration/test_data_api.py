"""The Data API adapter when the cluster is paused: bounded waiting, logged, then a clear error; and its wire format."""

from __future__ import annotations

import logging
import uuid

import pytest
from alembic.script import ScriptDirectory
from pagescribe.domain import NewDocument
from pagescribe.migrate import alembic_config, upgrade_through_data_api
from pagescribe.runtime import Runtime
from pagescribe.settings import ConfigurationError, Settings
from pagescribe.store.postgres import DataApiDatabase, Database
from pagescribe.store.postgres.dataapi import DatabaseResumingError, data_api_sql

from tests.conftest import data_api, data_api_server
from tests.support.database import fresh_empty_database

pytestmark = pytest.mark.integration


def _new(key: str) -> NewDocument:
    return NewDocument(bucket="bucket", object_key=key, etag="etag", version_id="", size_bytes=10, model="test/model")


def test_a_paused_cluster_is_waited_for_and_the_transaction_then_runs(
    db: Database, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    with data_api_server(database_url) as fake:
        store = DataApiDatabase(data_api(fake, first_pause=0.01))
        # Given a cluster that answers its next three requests with DatabaseResumingException
        fake.pause(3)
        # When a document is recorded (a transaction: begin, statements, commit)
        with caplog.at_level(logging.WARNING):
            created = store.create_document(_new("uploads/paused.pdf"), kind="pdf", pages=[1, 2])
        # Then it was recorded once the cluster answered, each wait logged
        assert [p.page_number for p in db.load_pages(created.document_id)] == [1, 2]
        assert sum("resuming" in r.getMessage() for r in caplog.records) == 3


def test_a_cluster_that_does_not_resume_in_time_is_a_clear_error_and_nothing_is_written(
    db: Database, database_url: str
) -> None:
    with data_api_server(database_url) as fake:
        store = DataApiDatabase(data_api(fake, resume_timeout=0.1, first_pause=0.01))
        # Given a cluster that stays paused
        fake.pause(1_000_000)
        new = _new("uploads/never.pdf")
        # When a document is recorded, Then the wait ends with an error saying to try again later
        with pytest.raises(DatabaseResumingError, match=r"still resuming.*try again later"):
            store.create_document(new, kind="pdf", pages=[1])
        # And nothing was written (the SQS message is retried later)
        assert db.find_document(new) is None


def test_placeholders_become_named_parameters_and_casts_and_percent_signs_stay() -> None:
    statement = "SELECT %(a)s::text, CAST(%(b)s AS uuid[]) WHERE x LIKE 'a%%' AND y = %(a)s"
    assert data_api_sql(statement) == "SELECT :a::text, CAST(:b AS uuid[]) WHERE x LIKE 'a%' AND y = :a"


def test_data_api_access_builds_the_database_over_the_data_api_from_the_settings(
    db: Database, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with data_api_server(database_url) as fake:
        # Given the settings of the data-api profile, the rds-data endpoint being the local one
        monkeypatch.setenv("AWS_ENDPOINT_URL_RDS_DATA", fake.endpoint)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        settings = Settings(
            database_access="data-api",
            database_cluster_arn="arn:aws:rds:us-east-1:123456789012:cluster:pagescribe",
            database_secret_arn="arn:aws:secretsmanager:us-east-1:123456789012:secret:db",
        )
        runtime = Runtime(settings)
        # When the composition root builds its database and a document is recorded through it
        created = runtime.db.create_document(_new("uploads/runtime.pdf"), kind="pdf", pages=[1])
        runtime.close()
        # Then the statements went over the Data API to the real database
        assert isinstance(runtime.db, DataApiDatabase) and fake.requests > 0
        assert [p.page_number for p in db.load_pages(created.document_id)] == [1]


def test_data_api_access_without_a_cluster_is_refused_naming_what_is_missing() -> None:
    settings = Settings(database_access="data-api", database_secret_arn="arn:aws:secretsmanager:::secret:db")
    with pytest.raises(ConfigurationError, match="DATABASE_CLUSTER_ARN"):
        Runtime(settings).db  # noqa: B018 - building it is the act under test


def test_the_schema_is_created_through_the_data_api_and_a_second_run_changes_nothing() -> None:
    with fresh_empty_database() as url, data_api_server(url) as fake:
        api = data_api(fake)
        # Given an empty database, When it is migrated through the Data API
        upgrade_through_data_api(api)
        # Then it is at head, with the tables the stores use (a document is recorded through the Data API)
        store = DataApiDatabase(api)
        created = store.create_document(_new("uploads/migrated.pdf"), kind="pdf", pages=[1])
        assert [p.page_number for p in store.load_pages(created.document_id)] == [1]
        [version] = api.execute("SELECT version_num FROM alembic_version", {})
        assert version.version_num == ScriptDirectory.from_config(alembic_config(url)).get_current_head()
        # And a second migration runs no statement but finds the head
        requests = fake.requests
        upgrade_through_data_api(api)
        assert fake.requests - requests == 5  # begin, lock, is there a version table, which version, commit


def test_a_text_value_that_looks_like_a_uuid_is_sent_as_text(data_api_db: DataApiDatabase) -> None:
    # Given a tenant whose id is written as a UUID (tenants.id is text)
    tenant_id = str(uuid.uuid4())
    data_api_db.ensure_tenant(tenant_id)
    # When it is looked up through the Data API, Then it is found (not compared as a uuid with a text column)
    assert data_api_db.tenant_exists(tenant_id)
