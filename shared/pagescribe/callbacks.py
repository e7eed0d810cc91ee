"""Completion callbacks: a signed JSON summary POSTed to the document's callback_url, retried with backoff.

Each delivery carries ``X-Pagescribe-Timestamp`` (Unix seconds) and ``X-Pagescribe-Delivery`` (an id unique to the
attempt), and ``X-Pagescribe-Signature: sha256=<hex>``, the HMAC-SHA256 of ``<timestamp>.<delivery id>.<body>``
under the document's tenant's callback secret (``pagescribe tenants callback-secret``), or for the default tenant
the stack's: a receiver
checks the signature, refuses a timestamp more than a few minutes old and a delivery id it has seen
(docs/security.md has the check). A callback that keeps failing is recorded as FAILED on the document; it never
changes the document's own status.

What a receiver can do to the sender is bounded: the host is resolved once, checked (no loopback, private,
link-local or transition addresses that embed them, unless CALLBACK_ALLOW_PRIVATE_NETWORKS), and the connection goes
to the address that was checked; the answer is read up to MAX_ANSWER_BYTES and the connection dropped; the whole
delivery, from resolving to the last byte read, has CALLBACK_DEADLINE_SECONDS; the deliveries of a round run
concurrently, CALLBACK_CONCURRENCY at a time, so a slow receiver delays nobody else's, and each is recorded as it ends;
a round takes at most a tenant's share of each tenant's callbacks, and starts none it could not finish in its time;
and a callback is tried at most CALLBACK_MAX_ATTEMPTS times, even when the process delivering it dies.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import hmac
import ipaddress
import json
import logging
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import httpx

from pagescribe.domain import CALLBACK_PORTS, CallbackStatus, DueCallback, callback_port_allowed
from pagescribe.settings import Settings
from pagescribe.status import describe_document
from pagescribe.store.ports import Store

log = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-Pagescribe-Signature"
TIMESTAMP_HEADER = "X-Pagescribe-Timestamp"
DELIVERY_HEADER = "X-Pagescribe-Delivery"
RETRY_BASE_SECONDS = 30.0
MAX_ANSWER_BYTES = 64 * 1024  # of a receiver's answer, read before the connection is dropped
# IPv6 forms that carry an IPv4 address or reach one through a gateway: NAT64 (well-known and local-use prefixes),
# IPv4-compatible (deprecated), IPv4-mapped, IPv4-translated (SIIT), 6to4 and Teredo. A callback to any of them could
# reach an internal IPv4 address however public the IPv6 address looks. And site-local addresses (fec0::/10,
# deprecated but still routed inside some networks), which Python's is_global counts as global.
_NOT_PUBLIC_IPV6 = tuple(
    ipaddress.IPv6Network(network)
    for network in (
        "64:ff9b::/96",
        "64:ff9b:1::/48",
        "::/96",
        "::ffff:0:0/96",
        "::ffff:0:0:0/96",
        "2002::/16",
        "2001::/32",
        "fec0::/10",
    )
)

Resolver = Callable[[str, int], Awaitable[list[str]]]


def sign(secret: bytes, timestamp: str, delivery: str, body: bytes) -> str:
    """The signature header's value: HMAC-SHA256 of ``<timestamp>.<delivery id>.<body>``."""
    message = timestamp.encode() + b"." + delivery.encode() + b"." + body
    return "sha256=" + hmac.new(secret, message, hashlib.sha256).hexdigest()


def public_address(address: str) -> bool:
    """The address is on the public internet: global, no IPv6 transition form that embeds an IPv4 one, not
    site-local."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and any(ip in network for network in _NOT_PUBLIC_IPV6):
        return False
    return ip.is_global


async def resolve(host: str, port: int) -> list[str]:
    """The host's addresses (an address given as the host is itself), once."""
    try:
        return [str(ipaddress.ip_address(host))]
    except ValueError:
        pass
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


@dataclass(frozen=True)
class _Delivery:
    callback: DueCallback
    body: bytes
    headers: dict[str, str]
    refused: str | None = None  # why it may not be sent at all


@dataclass(frozen=True)
class _Outcome:
    error: str | None  # None: delivered
    final: bool = False  # trying again cannot help (a refused address)


class CallbackNotifier:
    def __init__(self, settings: Settings, db: Store, secret: bytes | None, *, resolver: Resolver = resolve) -> None:
        self._settings = settings
        self._db = db
        self._secret = secret
        self._resolve = resolver

    def deliver_due(self, *, limit: int = 50, seconds: float | None = None) -> int:
        """Deliver the callbacks that are due, concurrently, each outcome recorded as it comes; return how many were
        delivered. Callbacks taken CALLBACK_MAX_ATTEMPTS times and never recorded (their deliverer died) end FAILED
        first, and each tenant has at most its share of the round (tenant_share). With ``seconds``, the time the
        round may take: a delivery that could not be over by then is not started, and its callback is given back for
        the next round."""
        settings = self._settings
        self._db.abandon_callbacks(max_attempts=settings.callback_max_attempts)
        due = self._db.take_due_callbacks(
            limit=limit, max_attempts=settings.callback_max_attempts, per_tenant=tenant_share(settings)
        )
        deliveries = [delivery for delivery in map(self._prepare, due) if delivery is not None]
        if not deliveries:
            return 0
        outcomes = _run(self._deliver_all(deliveries, seconds))
        return sum(outcome is not None and outcome.error is None for outcome in outcomes)

    def _prepare(self, callback: DueCallback) -> _Delivery | None:
        document = self._db.get_document(callback.document_id)
        if document is None:
            return None
        body = json.dumps(
            {"event": "document.finished", **describe_document(self._db, document).callback_fields()},
            ensure_ascii=False,
        ).encode("utf-8")
        timestamp, delivery = str(int(time.time())), str(uuid.uuid4())
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "pagescribe-callback",
            TIMESTAMP_HEADER: timestamp,
            DELIVERY_HEADER: delivery,
        }
        # A tenant's callbacks are signed with its own secret; the stack's signs only the default tenant's, so that no
        # tenant can make a callback another tenant's receiver would take for its own
        tenant_secret = self._db.callback_secret(document.tenant_id)
        own = document.tenant_id == self._settings.default_tenant
        secret = tenant_secret.encode() if tenant_secret else (self._secret if own else None)
        if secret is None and self._secret is not None:
            why = (
                f"tenant {document.tenant_id!r} has no callback secret of its own, and the stack's signs only the "
                f"default tenant's callbacks: pagescribe tenants callback-secret --tenant {document.tenant_id}"
            )
            return _Delivery(callback, body, headers, refused=why)
        if secret is not None:
            headers[SIGNATURE_HEADER] = sign(secret, timestamp, delivery, body)
        return _Delivery(callback, body, headers)

    async def _deliver_all(self, deliveries: Sequence[_Delivery], seconds: float | None) -> list[_Outcome | None]:
        """Each delivery, CALLBACK_CONCURRENCY at a time, recorded as soon as it is over (a round that runs out of
        time loses no outcome it had); None for one not started in the round's time, given back instead."""
        settings = self._settings
        loop = asyncio.get_running_loop()
        ends = None if seconds is None else loop.time() + seconds
        slots = asyncio.Semaphore(settings.callback_concurrency)
        timeout = httpx.Timeout(settings.callback_timeout_seconds)
        async with httpx.AsyncClient(follow_redirects=False, timeout=timeout, trust_env=False) as client:

            async def one(delivery: _Delivery) -> _Outcome | None:
                async with slots:
                    if ends is not None and loop.time() + settings.callback_deadline_seconds > ends:
                        await asyncio.to_thread(self._db.release_callback, delivery.callback.document_id)
                        return None
                    outcome = await self._attempt(client, delivery)
                await asyncio.to_thread(self._record, delivery.callback, outcome)
                return outcome

            return list(await asyncio.gather(*(one(delivery) for delivery in deliveries)))

    async def _attempt(self, client: httpx.AsyncClient, delivery: _Delivery) -> _Outcome:
        """One delivery within CALLBACK_DEADLINE_SECONDS, or why there was none."""
        if delivery.refused is not None:
            return _Outcome(delivery.refused, final=True)
        deadline = self._settings.callback_deadline_seconds
        try:
            async with asyncio.timeout(deadline):
                return await self._deliver(client, delivery)
        except TimeoutError:
            return _Outcome(f"no complete answer within CALLBACK_DEADLINE_SECONDS={deadline:g}")

    async def _deliver(self, client: httpx.AsyncClient, delivery: _Delivery) -> _Outcome:
        url = httpx.URL(delivery.callback.url)
        host = url.host
        port = url.port or (443 if url.scheme == "https" else 80)
        if not callback_port_allowed(port):
            return _Outcome(f"callback port {port} is not allowed: {CALLBACK_PORTS}", final=True)
        try:
            addresses = await self._resolve(host, port)
        except OSError as exc:
            return _Outcome(f"callback host {host!r} cannot be resolved: {exc}")
        if not addresses:
            return _Outcome(f"callback host {host!r} has no address")
        refused = self._private_address(host, addresses)
        if refused is not None:
            return refused
        # The connection goes to the address just checked: resolving the name again could answer otherwise.
        pinned = url.copy_with(host=addresses[0])
        headers = {**delivery.headers, "Host": url.netloc.decode("ascii")}
        extensions = {"sni_hostname": host} if url.scheme == "https" else {}
        try:
            async with client.stream(
                "POST", pinned, content=delivery.body, headers=headers, extensions=extensions
            ) as response:
                read = 0
                async for chunk in response.aiter_raw():
                    read += len(chunk)
                    if read >= MAX_ANSWER_BYTES:
                        break  # leaving the block drops the connection: the rest is never read
        except httpx.HTTPError as exc:
            return _Outcome(f"{type(exc).__name__}: {exc}")
        return _Outcome(None if response.is_success else f"HTTP {response.status_code}")

    def _private_address(self, host: str, addresses: list[str]) -> _Outcome | None:
        """Why the host may not be called, when one of its addresses is not public (unless private networks are
        allowed)."""
        if self._settings.callback_allow_private_networks:
            return None
        for address in addresses:
            if not public_address(address):
                return _Outcome(
                    f"callback host {host!r} resolves to {address}, which is not a public address; "
                    "set CALLBACK_ALLOW_PRIVATE_NETWORKS=true to allow it",
                    final=True,
                )
        return None

    def _record(self, callback: DueCallback, outcome: _Outcome) -> None:
        extra = {"document_id": callback.document_id, "attempt": callback.attempts}
        if outcome.error is None:
            self._db.record_callback(callback.document_id, status=CallbackStatus.DELIVERED, error=None)
            log.info("callback delivered", extra=extra)
        elif outcome.final or callback.attempts >= self._settings.callback_max_attempts:
            self._db.record_callback(callback.document_id, status=CallbackStatus.FAILED, error=outcome.error)
            log.warning("callback given up after %d attempts: %s", callback.attempts, outcome.error, extra=extra)
        else:
            retry_in = RETRY_BASE_SECONDS * 2.0 ** (callback.attempts - 1)
            self._db.record_callback(
                callback.document_id, status=CallbackStatus.PENDING, error=outcome.error, retry_in_seconds=retry_in
            )
            log.warning("callback failed, retrying in %.0f s: %s", retry_in, outcome.error, extra=extra)


def tenant_share(settings: Settings) -> int:
    """How many of one tenant's callbacks a round takes: half the round's concurrency (at least one), so that a
    tenant whose receivers all stall leaves the other half to every other tenant."""
    return max(1, settings.callback_concurrency // 2)


def _run(work: Awaitable[list[_Outcome | None]]) -> list[_Outcome | None]:
    """Run the round on an event loop of its own: in a thread of its own when this one already runs a loop."""

    async def wrapped() -> list[_Outcome | None]:
        return await work

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(wrapped())
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as executor:
        return executor.submit(asyncio.run, wrapped()).result()
