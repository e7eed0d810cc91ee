"""The contract suite runs every test on three stores: PostgreSQL, the same over the RDS Data API, and the in-memory
twin."""

from __future__ import annotations

from collections.abc import Iterator

import boto3
import pytest
from pagescribe.store.ports import Store
from pagescribe.store.postgres import DataApi, DataApiDatabase, Database

from tests.fakes.data_api_server import FakeDataApi
from tests.support.memory_store import MemoryStore


@pytest.fixture
def data_api_db(db: Database, database_url: str) -> Iterator[DataApiDatabase]:
    """``Database`` over the Data API: a local endpoint of its wire format on ``db``'s emptied database."""
    fake = FakeDataApi(database_url.replace("postgresql+psycopg://", "postgresql://")).start()
    client = boto3.client(
        "rds-data",
        endpoint_url=fake.endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    api = DataApi(
        client,
        cluster_arn="arn:aws:rds:us-east-1:123456789012:cluster:pagescribe",
        secret_arn="arn:aws:secretsmanager:us-east-1:123456789012:secret:db",
        database="pagescribe",
    )
    yield DataApiDatabase(api)
    fake.stop()


@pytest.fixture(params=["postgres", "dataapi", "memory"])
def store(request: pytest.FixtureRequest) -> Store:
    if request.param == "memory":
        return MemoryStore()
    fixture = "data_api_db" if request.param == "dataapi" else "db"
    db: Store = request.getfixturevalue(fixture)
    return db
