"""Tenants, keys, idempotent answers and callbacks, in memory (TenantStore, CallbackStore)."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from pagescribe.domain import ApiKeyRecord, DueCallback

from tests.support.memory_store.state import DocumentRow, KeyRow, MemoryState, TenantRow

CALLBACK_HOLD = timedelta(minutes=5)  # a taken callback is nobody else's for this long


class MemoryTenants:
    state: MemoryState

    def ensure_tenant(self, tenant_id: str) -> None:
        with self.state.lock:
            self.state.tenants.setdefault(tenant_id, TenantRow(tenant_id))

    def tenant_exists(self, tenant_id: str) -> bool:
        return tenant_id in self.state.tenants

    def add_api_key(self, tenant_id: str, key_hash: bytes, label: str) -> str:
        with self.state.lock:
            if any(k.key_hash == key_hash for k in self.state.keys.values()):
                raise ValueError("a key with this hash exists (the unique index on key_hash)")
            self.ensure_tenant(tenant_id)
            key = KeyRow(str(uuid.uuid4()), tenant_id, key_hash, label, self.state.now())
            self.state.keys[key.id] = key
            return key.id

    def list_api_keys(self, tenant_id: str | None = None) -> list[ApiKeyRecord]:
        with self.state.lock:
            keys = [k for k in self.state.keys.values() if tenant_id is None or k.tenant_id == tenant_id]
            keys.sort(key=lambda k: (k.tenant_id, k.created_at))
            return [ApiKeyRecord(k.id, k.tenant_id, k.label, k.created_at, k.revoked_at) for k in keys]

    def revoke_api_key(self, key: str, tenant_id: str | None = None) -> list[ApiKeyRecord]:
        with self.state.lock:
            revoked = [
                k
                for k in self.state.keys.values()
                if key in (k.id, k.label) and k.revoked_at is None and tenant_id in (None, k.tenant_id)
            ]
            for k in revoked:
                k.revoked_at = self.state.now()
            return [ApiKeyRecord(k.id, k.tenant_id, k.label, None, None) for k in revoked]

    def find_api_key(self, key_hash: bytes) -> tuple[str, bool] | None:
        with self.state.lock:
            found = [k for k in self.state.keys.values() if k.key_hash == key_hash]
            return (found[0].tenant_id, found[0].revoked_at is not None) if found else None

    def any_tenant_key(self) -> bool:
        with self.state.lock:
            return any(k.revoked_at is None for k in self.state.keys.values())

    def set_callback_secret(self, tenant_id: str, secret: str) -> bool:
        with self.state.lock:
            tenant = self.state.tenants.get(tenant_id)
            if tenant is None:
                return False
            tenant.callback_secret = secret
            return True

    def callback_secret(self, tenant_id: str) -> str | None:
        tenant = self.state.tenants.get(tenant_id)
        return tenant.callback_secret if tenant else None

    def idempotent_answer(self, tenant_id: str, key: str) -> tuple[bytes, dict[str, Any]] | None:
        return self.state.answers.get((tenant_id, key))

    def remember_answer(
        self, tenant_id: str, key: str, request: bytes, document_id: str, answer: dict[str, Any]
    ) -> bool:
        with self.state.lock:
            if (tenant_id, key) in self.state.answers:
                return False
            self.state.answers[(tenant_id, key)] = (request, dict(answer))
            return True


class MemoryCallbacks:
    state: MemoryState

    def take_due_callbacks(self, *, limit: int, max_attempts: int, per_tenant: int) -> list[DueCallback]:
        with self.state.lock:
            now = self.state.now()
            due = sorted(
                (
                    d
                    for d in self.state.documents.values()
                    if d.callback_status == "PENDING"
                    and d.callback_next_at is not None
                    and d.callback_next_at <= now
                    and d.callback_attempts < max_attempts
                ),
                key=lambda d: (d.callback_next_at or now, d.id),
            )
            places: dict[str, int] = {}
            taken: list[DocumentRow] = []
            for d in due:
                places[d.tenant_id] = places.get(d.tenant_id, 0) + 1
                if places[d.tenant_id] <= per_tenant and len(taken) < limit:
                    taken.append(d)
            for d in taken:
                d.callback_attempts, d.callback_next_at = d.callback_attempts + 1, now + CALLBACK_HOLD
            return [DueCallback(d.id, d.callback_url or "", d.callback_attempts) for d in taken]

    def release_callback(self, document_id: str) -> None:
        with self.state.lock:
            d = self.state.documents.get(document_id)
            if d is not None and d.callback_status == "PENDING" and d.callback_attempts > 0:
                d.callback_attempts, d.callback_next_at = d.callback_attempts - 1, self.state.now()

    def abandon_callbacks(self, *, max_attempts: int) -> None:
        with self.state.lock:
            now = self.state.now()
            for d in self.state.documents.values():
                if d.callback_status != "PENDING" or d.callback_attempts < max_attempts:
                    continue
                if d.callback_next_at is not None and d.callback_next_at <= now:
                    given_up = f"no delivery recorded after {d.callback_attempts} attempts"
                    d.callback_status = "FAILED"
                    d.callback_error = f"{given_up}; last error: {d.callback_error}" if d.callback_error else given_up

    def record_callback(self, document_id: str, *, status: str, error: str | None, retry_in_seconds: float = 0) -> None:
        with self.state.lock:
            d = self.state.documents.get(document_id)
            if d is not None and d.callback_status == "PENDING":
                d.callback_status, d.callback_error = status, error
                d.callback_next_at = self.state.now() + timedelta(seconds=retry_in_seconds)
