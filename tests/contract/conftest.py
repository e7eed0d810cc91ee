"""The contract suite runs every test on three stores: PostgreSQL, the same over the RDS Data API, and the in-memory
twin."""

from __future__ import annotations

import pytest
from pagescribe.store.ports import Store

from tests.support.memory_store import MemoryStore


@pytest.fixture(params=["postgres", "dataapi", "memory"])
def store(request: pytest.FixtureRequest) -> Store:
    if request.param == "memory":
        return MemoryStore()
    fixture = "data_api_db" if request.param == "dataapi" else "db"
    db: Store = request.getfixturevalue(fixture)
    return db
