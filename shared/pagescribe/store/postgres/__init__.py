"""The data-access layer on PostgreSQL: one store per concern, each statement whole beside the method that runs it.

``Database`` is all of them on one engine: what a function holds in module scope and hands to its use cases, which
see only the ports (``pagescribe.store.ports``) they need.
"""

from __future__ import annotations

from pagescribe.store.postgres.batches import PgBatches
from pagescribe.store.postgres.callbacks import PgCallbacks
from pagescribe.store.postgres.claims import PgClaims
from pagescribe.store.postgres.connection import create_database_engine
from pagescribe.store.postgres.corrections import PgCorrections
from pagescribe.store.postgres.dataapi import DataApi, DataApiConnected
from pagescribe.store.postgres.documents import PgDocuments
from pagescribe.store.postgres.ledger import PgLedger
from pagescribe.store.postgres.pages import PgPages
from pagescribe.store.postgres.spend import PgSpend
from pagescribe.store.postgres.tenants import PgTenants

__all__ = ["DataApi", "DataApiDatabase", "Database", "create_database_engine"]


class Database(PgDocuments, PgPages, PgClaims, PgLedger, PgSpend, PgTenants, PgCallbacks, PgCorrections, PgBatches):
    """Every store on one engine (``Connected.__init__``): a statement runs on the pool's connection, autocommitted,
    or in one short transaction; none is open while a model call runs."""


class DataApiDatabase(DataApiConnected, Database):
    """Every store over the RDS Data API (the scale-to-zero profile): the same statements, sent over HTTPS."""
