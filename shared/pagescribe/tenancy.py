"""Tenants and their API keys: who is calling, from the key they present.

A key is ``psk_`` and 43 URL-safe characters (256 random bits), shown once when it is made and stored only as its
SHA-256 (a hash of that much randomness needs no slow hashing to resist guessing). API_KEY, when set, is the
operator's own key: its caller is DEFAULT_TENANT. Any other key is looked up by its hash in PostgreSQL, and the answer
kept in this environment for API_KEY_CACHE_SECONDS, so a warm API function looks a key up about once in that time
and a revoked key is refused within it. A key that is unknown is refused when API_KEY is set, with
TENANT_KEYS_ONLY=true, and with TENANT_KEYS_ONLY=auto (the default) once any tenant holds a key: per-client keys that
are no tenant's would all be the default tenant's, and read each other's documents. Otherwise (a local stack with no
key configured, or a single-client stack whose key API Gateway already checked) the caller is DEFAULT_TENANT.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import threading
import time
from collections.abc import Callable

from pagescribe.settings import Settings
from pagescribe.store.ports import TenantStore

KEY_PREFIX = "psk_"
LABEL_LENGTH = 12  # the key's first characters, listed to tell keys apart
CACHE_ENTRIES = 4096  # keys remembered per environment (the cache starts afresh when full)
TENANT_ID = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")


class KeyRefused(Exception):
    """The request's key does not name a caller: missing, unknown or revoked."""

    def __init__(self, reason: str, *, missing: bool = False) -> None:
        super().__init__(reason)
        self.missing = missing


def check_tenant_id(value: str) -> str:
    """The tenant id, or ValueError naming it: lower-case letters, digits, ``-`` and ``_``, up to 63."""
    if not TENANT_ID.fullmatch(value):
        raise ValueError(
            f"invalid tenant {value!r}: use 1 to 63 lower-case letters, digits, '-' and '_', starting with a "
            "letter or digit"
        )
    return value


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def key_hash(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


def key_label(key: str) -> str:
    return key[:LABEL_LENGTH]


def create_key(db: TenantStore, tenant_id: str) -> tuple[str, str]:
    """A new key for the tenant (created if new): (its id, the key itself, which is not stored)."""
    key = new_key()
    return db.add_api_key(check_tenant_id(tenant_id), key_hash(key), key_label(key)), key


def new_callback_secret() -> str:
    return secrets.token_urlsafe(32)


class KeyRing:
    """Which tenant a presented key belongs to, looked up once per API_KEY_CACHE_SECONDS in this environment."""

    def __init__(self, settings: Settings, db: TenantStore, clock: Callable[[], float] = time.monotonic) -> None:
        self._settings = settings
        self._db = db
        self._clock = clock
        self._lock = threading.Lock()
        self._cache: dict[bytes, tuple[float, tuple[str, bool] | None]] = {}
        self._tenant_keys: tuple[float, bool] | None = None  # (until when, whether any tenant holds a key)

    def tenant_for(self, key: str | None) -> str:
        """The caller's tenant; KeyRefused when the key is missing, unknown or revoked where keys are required."""
        settings = self._settings
        operator = settings.api_key.get_secret_value() if settings.api_key is not None else None
        if key and operator is not None and hmac.compare_digest(key.encode(), operator.encode()):
            return settings.default_tenant
        if key:
            found = self._lookup(key)
            if found is not None:
                tenant, revoked = found
                if revoked:
                    raise KeyRefused("revoked API key")
                return tenant
        if operator is not None or self._tenant_keys_only():
            if not key:
                raise KeyRefused("missing API key: send it in the x-api-key header", missing=True)
            raise KeyRefused("invalid API key")
        return settings.default_tenant

    def _tenant_keys_only(self) -> bool:
        """Are keys that are no tenant's refused? With TENANT_KEYS_ONLY=auto, once any tenant holds a key (looked up
        once per API_KEY_CACHE_SECONDS)."""
        mode = self._settings.tenant_keys_only
        if mode != "auto":
            return mode == "true"
        now = self._clock()
        with self._lock:
            known = self._tenant_keys
        if known is not None and known[0] > now:
            return known[1]
        found = self._db.any_tenant_key()
        with self._lock:
            self._tenant_keys = (now + self._settings.api_key_cache_seconds, found)
        return found

    def _lookup(self, key: str) -> tuple[str, bool] | None:
        digest = key_hash(key)
        now = self._clock()
        with self._lock:
            cached = self._cache.get(digest)
        if cached is not None and cached[0] > now:
            return cached[1]
        found = self._db.find_api_key(digest)
        with self._lock:
            if len(self._cache) >= CACHE_ENTRIES:
                self._cache.clear()
            self._cache[digest] = (now + self._settings.api_key_cache_seconds, found)
        return found
