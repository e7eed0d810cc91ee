"""Tenants, their API keys, callback secrets and idempotent answers."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from pagescribe.domain import (
    ApiKeyRecord,
)
from pagescribe.store.postgres.connection import Connected


class PgTenants(Connected):
    """Tenants and their keys: API keys (hashes only), callback secrets, and the first answer of each
    Idempotency-Key."""

    ENSURE_TENANT = "INSERT INTO tenants (id) VALUES (%(tenant_id)s) ON CONFLICT (id) DO NOTHING"

    def ensure_tenant(self, tenant_id: str) -> None:
        self._rows(self.ENSURE_TENANT, {"tenant_id": tenant_id})

    TENANT_EXISTS = "SELECT 1 FROM tenants WHERE id = %(tenant_id)s"

    def tenant_exists(self, tenant_id: str) -> bool:
        return self._row(self.TENANT_EXISTS, {"tenant_id": tenant_id}) is not None

    INSERT_API_KEY = """
    INSERT INTO api_keys (id, tenant_id, key_hash, label) VALUES (%(id)s, %(tenant_id)s, %(key_hash)s, %(label)s)
    """

    def add_api_key(self, tenant_id: str, key_hash: bytes, label: str) -> str:
        key_id = str(uuid.uuid4())

        def record(connection: psycopg.Connection[Any]) -> None:
            with connection.transaction():
                connection.execute(self.ENSURE_TENANT, {"tenant_id": tenant_id})
                connection.execute(
                    self.INSERT_API_KEY, {"id": key_id, "tenant_id": tenant_id, "key_hash": key_hash, "label": label}
                )

        self._with_connection(record)
        return key_id

    LIST_API_KEYS = """
    SELECT id, tenant_id, label, created_at, revoked_at FROM api_keys
    WHERE CAST(%(tenant_id)s AS text) IS NULL OR tenant_id = CAST(%(tenant_id)s AS text)
    ORDER BY tenant_id, created_at
    """

    def list_api_keys(self, tenant_id: str | None = None) -> list[ApiKeyRecord]:
        return [
            ApiKeyRecord(str(r.id), r.tenant_id, r.label, r.created_at, r.revoked_at)
            for r in self._rows(self.LIST_API_KEYS, {"tenant_id": tenant_id})
        ]

    # By the key's id or its label (the first characters of the key, as listed), within the tenant when one is named.
    REVOKE_API_KEY = """
    UPDATE api_keys SET revoked_at = now()
    WHERE (id::text = %(key)s OR label = %(key)s) AND revoked_at IS NULL
      AND (CAST(%(tenant_id)s AS text) IS NULL OR tenant_id = CAST(%(tenant_id)s AS text))
    RETURNING id, tenant_id, label
    """

    def revoke_api_key(self, key: str, tenant_id: str | None = None) -> list[ApiKeyRecord]:
        rows = self._rows(self.REVOKE_API_KEY, {"key": key, "tenant_id": tenant_id})
        return [ApiKeyRecord(str(r.id), r.tenant_id, r.label, None, None) for r in rows]

    # The unique index on key_hash serves it.
    FIND_API_KEY = "SELECT tenant_id, revoked_at FROM api_keys WHERE key_hash = %(key_hash)s"

    def find_api_key(self, key_hash: bytes) -> tuple[str, bool] | None:
        row = self._row(self.FIND_API_KEY, {"key_hash": key_hash})
        return None if row is None else (row.tenant_id, row.revoked_at is not None)

    # Does any tenant hold a key that is not revoked? (TENANT_KEYS_ONLY=auto: then only such keys are accepted.)
    ANY_TENANT_KEY = "SELECT EXISTS (SELECT 1 FROM api_keys WHERE revoked_at IS NULL) AS found"

    def any_tenant_key(self) -> bool:
        row = self._row(self.ANY_TENANT_KEY, {})
        return bool(row is not None and row.found)

    SET_TENANT_CALLBACK_KEY = "UPDATE tenants SET callback_secret = %(secret)s WHERE id = %(tenant_id)s RETURNING id"

    def set_callback_secret(self, tenant_id: str, secret: str) -> bool:
        return self._row(self.SET_TENANT_CALLBACK_KEY, {"tenant_id": tenant_id, "secret": secret}) is not None

    GET_TENANT_CALLBACK_KEY = "SELECT callback_secret FROM tenants WHERE id = %(tenant_id)s"

    def callback_secret(self, tenant_id: str) -> str | None:
        row = self._row(self.GET_TENANT_CALLBACK_KEY, {"tenant_id": tenant_id})
        return None if row is None else row.callback_secret

    IDEMPOTENT_ANSWER = """
    SELECT request, answer FROM idempotency_keys WHERE tenant_id = %(tenant_id)s AND key = %(key)s
    """

    def idempotent_answer(self, tenant_id: str, key: str) -> tuple[bytes, dict[str, Any]] | None:
        row = self._row(self.IDEMPOTENT_ANSWER, {"tenant_id": tenant_id, "key": key})
        return None if row is None else (bytes(row.request), dict(row.answer))

    # The first answer stands: a concurrent request with the same key finds it and returns it instead of its own.
    REMEMBER_ANSWER = """
    INSERT INTO idempotency_keys (tenant_id, key, request, document_id, answer)
    VALUES (%(tenant_id)s, %(key)s, %(request)s, %(document_id)s, %(answer)s)
    ON CONFLICT (tenant_id, key) DO NOTHING
    RETURNING key
    """

    def remember_answer(
        self, tenant_id: str, key: str, request: bytes, document_id: str, answer: dict[str, Any]
    ) -> bool:
        params = {
            "tenant_id": tenant_id,
            "key": key,
            "request": request,
            "document_id": document_id,
            "answer": Jsonb(answer),
        }
        return self._row(self.REMEMBER_ANSWER, params) is not None
