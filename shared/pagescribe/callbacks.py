"""Completion callbacks: a signed JSON summary POSTed to the document's callback_url, retried with backoff.

The body is signed with HMAC-SHA256 under the configured secret; the hex digest travels in
``X-Pagescribe-Signature: sha256=<hex>``. A callback that keeps failing is recorded as FAILED on the
document; it never changes the document's own status.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import logging
import socket

import httpx

from pagescribe.settings import Settings
from pagescribe.status import describe_document
from pagescribe.storage import DueCallback, Storage

log = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-Pagescribe-Signature"
RETRY_BASE_SECONDS = 30.0


def sign(secret: bytes, body: bytes) -> str:
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


class CallbackNotifier:
    def __init__(self, settings: Settings, storage: Storage, secret: bytes | None, client: httpx.Client) -> None:
        self._settings = settings
        self._storage = storage
        self._secret = secret
        self._client = client

    def deliver_due(self, *, document_id: str | None = None, limit: int = 50) -> int:
        """Deliver the callbacks that are due (or just this document's); return how many were delivered."""
        due = self._storage.claim_due_callbacks(limit=limit, document_id=document_id)
        return sum(self._deliver(callback) for callback in due)

    def _deliver(self, callback: DueCallback) -> bool:
        document = self._storage.get_document(callback.document_id)
        if document is None:
            return False
        body = json.dumps(
            {"event": "document.finished", **describe_document(self._storage, document)}, ensure_ascii=False
        ).encode("utf-8")
        headers = {"Content-Type": "application/json", "User-Agent": "pagescribe-callback"}
        if self._secret is not None:
            headers[SIGNATURE_HEADER] = sign(self._secret, body)
        extra = {"document_id": callback.document_id, "attempt": callback.attempts}
        refused = self._refusal(callback.url)
        if refused is not None:  # the same answer on every attempt: give up at once
            self._storage.record_callback(callback.document_id, status="FAILED", error=refused)
            log.warning("callback refused: %s", refused, extra=extra)
            return False
        error = self._post(callback.url, body, headers)
        if error is None:
            self._storage.record_callback(callback.document_id, status="DELIVERED", error=None)
            log.info("callback delivered", extra=extra)
            return True
        if callback.attempts >= self._settings.callback_max_attempts:
            self._storage.record_callback(callback.document_id, status="FAILED", error=error)
            log.warning("callback abandoned after %d attempts: %s", callback.attempts, error, extra=extra)
        else:
            retry_in = RETRY_BASE_SECONDS * 2.0 ** (callback.attempts - 1)
            self._storage.record_callback(
                callback.document_id, status="PENDING", error=error, retry_in_seconds=retry_in
            )
            log.warning("callback failed, retrying in %.0f s: %s", retry_in, error, extra=extra)
        return False

    def close(self) -> None:
        self._client.close()

    def _refusal(self, url: str) -> str | None:
        """Why this URL must not be called: a host that resolves to a non-public address (loopback, private,
        link-local such as the instance metadata service) unless CALLBACK_ALLOW_PRIVATE_NETWORKS is set."""
        if self._settings.callback_allow_private_networks:
            return None
        host = httpx.URL(url).host
        try:
            addresses = {str(info[4][0]) for info in socket.getaddrinfo(host, None)}
        except OSError as exc:
            return f"callback host {host!r} cannot be resolved: {exc}"
        for address in sorted(addresses):
            if not ipaddress.ip_address(address.split("%", 1)[0]).is_global:
                return (
                    f"callback host {host!r} resolves to {address}, which is not a public address; "
                    "set CALLBACK_ALLOW_PRIVATE_NETWORKS=true to allow it"
                )
        return None

    def _post(self, url: str, body: bytes, headers: dict[str, str]) -> str | None:
        try:
            response = self._client.post(
                url, content=body, headers=headers, timeout=self._settings.callback_timeout_seconds
            )
        except httpx.HTTPError as exc:
            return f"{type(exc).__name__}: {exc}"
        if response.is_success:
            return None
        return f"HTTP {response.status_code}"
