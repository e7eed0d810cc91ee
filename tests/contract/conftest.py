"""The contract suite runs every test on both stores: PostgreSQL and the in-memory twin."""

from __future__ import annotations

import pytest
from pagescribe.store.ports import Store

from tests.support.memory_store import MemoryStore


@pytest.fixture(params=["postgres", "memory"])
def store(request: pytest.FixtureRequest) -> Store:
    if request.param == "memory":
        return MemoryStore()
    db: Store = request.getfixturevalue("db")
    return db
