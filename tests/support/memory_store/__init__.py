"""An in-memory twin of the PostgreSQL stores: every port of ``pagescribe.store.ports``, held to the same contract
(``tests/contract``), so that use cases are tested without a database. Not shipped: the Lambda layer runs on
PostgreSQL only.

What it cannot show is what only PostgreSQL shows: row locks, SKIP LOCKED between processes, a connection lost
mid-statement. Those stay in the integration tests. One lock serialises its methods: each is one transaction.
"""

from __future__ import annotations

from tests.support.memory_store.batches import MemoryBatches
from tests.support.memory_store.documents import MemoryCorrections, MemoryDocuments, MemoryPages
from tests.support.memory_store.money import MemorySpend
from tests.support.memory_store.state import MemoryState
from tests.support.memory_store.tenants import MemoryCallbacks, MemoryTenants
from tests.support.memory_store.work import MemoryClaims, MemoryLedger


class MemoryStore(
    MemoryDocuments,
    MemoryPages,
    MemoryClaims,
    MemoryLedger,
    MemorySpend,
    MemoryTenants,
    MemoryCallbacks,
    MemoryCorrections,
    MemoryBatches,
):
    def __init__(self) -> None:
        self.state = MemoryState()
