"""Callbacks against hostile receivers: real sockets on this machine, the real notifier and PostgreSQL.

Each attack once held a delivery (or the sweeper) for as long as the receiver liked, filled memory, reached an
address that had not been checked, or was replayable; each must now end within the delivery's bounds with the
reason recorded on the document, and never delay another document's callback.
"""

from __future__ import annotations

import hashlib
import hmac
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest
from pagescribe.callbacks import MAX_ANSWER_BYTES, CallbackNotifier, public_address
from pagescribe.domain import NewDocument
from pagescribe.settings import Settings
from pagescribe.store.postgres import Database
from sqlalchemy import text

from tests.reliability.support import wait_until

pytestmark = pytest.mark.integration

SECRET = b"receiver-shared-secret"


@dataclass
class RawReceiver:
    """A TCP server that reads one request per connection, then answers as ``answer`` says."""

    # "ok", "huge" (200 and 800 MiB of body, sent until the client goes), "trickle" (a byte a second), "stall" (no
    # answer at all, until the client goes)
    answer: str
    requests: list[bytes] = field(default_factory=list)
    body_bytes_sent: int = 0
    stop: threading.Event = field(default_factory=threading.Event)
    journal: list[str] | None = None  # shared by receivers: "ok" when an ok one answers, "cut" when a stall is dropped

    def serve(self) -> tuple[str, int]:
        listener = socket.create_server(("127.0.0.1", 0))
        listener.settimeout(0.2)
        threading.Thread(target=self._loop, args=(listener,), daemon=True).start()
        host, port = listener.getsockname()[:2]
        return str(host), int(port)

    def _loop(self, listener: socket.socket) -> None:
        with listener:
            while not self.stop.is_set():
                try:
                    connection, _ = listener.accept()
                except TimeoutError:
                    continue
                threading.Thread(target=self._answer, args=(connection,), daemon=True).start()

    def _answer(self, connection: socket.socket) -> None:
        with connection:
            self.requests.append(_read_request(connection))
            respond = {"ok": self._ok, "stall": self._stall, "huge": self._huge}.get(self.answer, self._trickle)
            try:
                respond(connection)
            except OSError:  # the client dropped the connection
                return

    def _ok(self, connection: socket.socket) -> None:
        connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        self._note("ok")

    def _stall(self, connection: socket.socket) -> None:
        connection.settimeout(0.2)
        while not self.stop.is_set():
            try:
                if connection.recv(1) == b"":
                    break
            except TimeoutError:
                continue
        self._note("cut")

    def _huge(self, connection: socket.socket) -> None:
        connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (800 << 20))
        chunk = b"\0" * (1 << 20)
        while self.body_bytes_sent < 800 << 20 and not self.stop.is_set():
            connection.sendall(chunk)
            self.body_bytes_sent += len(chunk)

    def _trickle(self, connection: socket.socket) -> None:
        for byte in b"HTTP/1.1 200 OK\r\n" * 1000:
            if self.stop.wait(1.0):
                return
            connection.sendall(bytes([byte]))

    def _note(self, event: str) -> None:
        if self.journal is not None:
            self.journal.append(event)


def _read_request(connection: socket.socket) -> bytes:
    """One HTTP request, its head and its body (by Content-Length)."""
    request = b""
    while b"\r\n\r\n" not in request:
        request += connection.recv(65536)
    head, _, body = request.partition(b"\r\n\r\n")
    length = int(
        next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
    )
    while len(body) < length:
        body += connection.recv(65536)
    return head + b"\r\n\r\n" + body


@pytest.fixture
def receivers() -> Iterator[list[RawReceiver]]:
    made: list[RawReceiver] = []
    yield made
    for receiver in made:
        receiver.stop.set()


def start(receivers: list[RawReceiver], answer: str, journal: list[str] | None = None) -> tuple[RawReceiver, str]:
    receiver = RawReceiver(answer, journal=journal)
    receivers.append(receiver)
    host, port = receiver.serve()
    return receiver, f"http://{host}:{port}/hooks/pagescribe"


def document_awaiting_callback(db: Database, url: str) -> str:
    """A finished document whose callback to ``url`` is due."""
    created = db.create_document(
        NewDocument(bucket="b", object_key=f"uploads/{uuid.uuid4()}", etag="e", version_id="", size_bytes=1, model="m"),
        kind=None,
        pages=[],
        error="the file is empty (0 bytes)",
    )
    with db.engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE documents SET callback_url = :url, callback_status = 'PENDING', callback_attempts = 0, "
                "callback_next_at = now() WHERE id = :id"
            ),
            {"url": url, "id": created.document_id},
        )
    return created.document_id


def callback_state(db: Database, document_id: str) -> tuple[str, str | None]:
    document = db.get_document(document_id)
    assert document is not None
    return document.callback_status or "", document.callback_error


def notifier(db: Database, **settings: object) -> CallbackNotifier:
    return CallbackNotifier(
        Settings(callback_allow_private_networks=True, **settings),  # type: ignore[arg-type]
        db,
        SECRET,
    )


def test_a_huge_answer_is_read_to_64_kib_and_the_connection_dropped(db: Database, receivers: list[RawReceiver]) -> None:
    # Given a receiver that answers 200 with an 800 MiB body
    receiver, url = start(receivers, "huge")
    document_id = document_awaiting_callback(db, url)

    # When the callback is delivered
    delivered = notifier(db).deliver_due()

    # Then it counts as delivered, and the receiver could send only what the socket buffers held before the
    # connection was dropped, a sliver of its 800 MiB
    assert delivered == 1 and callback_state(db, document_id) == ("DELIVERED", None)
    receiver.stop.set()
    assert receiver.body_bytes_sent < 64 << 20, receiver.body_bytes_sent
    assert MAX_ANSWER_BYTES == 64 * 1024


def test_a_trickling_receiver_is_cut_off_at_the_deadline_and_delays_no_one_else(
    db: Database, receivers: list[RawReceiver]
) -> None:
    # Given a receiver that answers a byte a second, for ever (each read is within the per-step timeout), and
    # another document whose receiver answers at once
    _, slow_url = start(receivers, "trickle")
    fast, fast_url = start(receivers, "ok")
    slow_document = document_awaiting_callback(db, slow_url)
    fast_document = document_awaiting_callback(db, fast_url)

    # When one round delivers both
    delivered = notifier(db, callback_deadline_seconds=3.0, callback_timeout_seconds=5.0).deliver_due()

    # Then the trickle is cut at the delivery's deadline, to be retried later, and the other was delivered
    assert delivered == 1
    status, error = callback_state(db, slow_document)
    assert status == "PENDING" and error == "no complete answer within CALLBACK_DEADLINE_SECONDS=3", error
    assert callback_state(db, fast_document) == ("DELIVERED", None)
    assert len(fast.requests) == 1


def test_the_connection_goes_to_the_address_that_was_checked(db: Database, receivers: list[RawReceiver]) -> None:
    # Given a name whose first answer is this machine and every later one another address (DNS rebinding)
    receiver, url = start(receivers, "ok")
    port = url.split(":")[2].split("/")[0]
    answers: list[str] = []

    async def rebinding(host: str, port: int) -> list[str]:
        answers.append(host)
        return ["127.0.0.1"] if len(answers) == 1 else ["10.255.255.1"]

    document_id = document_awaiting_callback(db, f"http://callbacks.example:{port}/hooks/pagescribe")
    notifier_ = CallbackNotifier(Settings(callback_allow_private_networks=True), db, SECRET, resolver=rebinding)

    # When the callback is delivered
    assert notifier_.deliver_due() == 1

    # Then the name was resolved once, and the POST reached the address of that answer, naming the host
    assert answers == ["callbacks.example"]
    assert callback_state(db, document_id) == ("DELIVERED", None)
    [request] = receiver.requests
    assert f"host: callbacks.example:{port}".encode() in request.lower()


@pytest.mark.parametrize(
    "address",
    [
        "64:ff9b::7f00:1",  # NAT64 of 127.0.0.1
        "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254, the instance metadata service
        "64:ff9b:1::a00:1",  # local-use NAT64 of 10.0.0.1
        "::7f00:1",  # IPv4-compatible ::127.0.0.1
        "::a9fe:a9fe",  # IPv4-compatible ::169.254.169.254
        "::ffff:7f00:1",  # IPv4-mapped ::ffff:127.0.0.1
        "2002:7f00:1::1",  # 6to4 of 127.0.0.1
        "2001:0:4136:e378:8000:63bf:3fff:fdd2",  # Teredo
        "::ffff:0:7f00:1",  # IPv4-translated (SIIT) ::ffff:0:127.0.0.1
        "::ffff:0:a9fe:a9fe",  # IPv4-translated ::ffff:0:169.254.169.254
        "fec0::1",  # site-local (deprecated; Python counts it global)
        "fd00::1",
        "169.254.169.254",
        "100.64.0.1",  # shared address space (carrier-grade NAT): not private, not global either
    ],
)
def test_transition_and_private_addresses_are_not_public(address: str) -> None:
    assert not public_address(address)


@pytest.mark.parametrize("address", ["8.8.8.8", "2606:4700:4700::1111", "2a00:1450:4001:82b::200e"])
def test_public_addresses_are_public(address: str) -> None:
    assert public_address(address)


def test_a_callback_to_a_nat64_literal_is_refused_without_a_connection(db: Database) -> None:
    # Given the default policy and a callback URL naming the metadata service through NAT64
    document_id = document_awaiting_callback(db, "http://[64:ff9b::a9fe:a9fe]/latest/meta-data/")

    # When it is due
    CallbackNotifier(Settings(), db, SECRET).deliver_due()

    # Then it is refused for good, naming the address
    status, error = callback_state(db, document_id)
    assert status == "FAILED" and "64:ff9b::a9fe:a9fe, which is not a public address" in (error or ""), error


@pytest.mark.parametrize("port", [22, 25, 111, 1023])
def test_a_callback_to_a_privileged_port_other_than_http_and_https_is_refused_without_a_connection(
    db: Database, port: int
) -> None:
    # Given a callback URL (stored before the rule, or written by hand) naming a host's SSH, SMTP or RPC port
    document_id = document_awaiting_callback(db, f"http://callbacks.example:{port}/hooks")
    resolved: list[str] = []

    async def resolver(host: str, port: int) -> list[str]:
        resolved.append(host)
        return ["8.8.8.8"]

    # When it is due
    CallbackNotifier(Settings(), db, SECRET, resolver=resolver).deliver_due()

    # Then it is refused for good, naming the port and what is allowed, without even a lookup
    status, error = callback_state(db, document_id)
    assert status == "FAILED" and f"callback port {port} is not allowed: 80, 443, or 1024 and above" in (error or "")
    assert resolved == []


def test_the_signature_covers_a_timestamp_and_a_delivery_id_so_a_receiver_can_refuse_replays(
    db: Database, receivers: list[RawReceiver]
) -> None:
    # Given two documents' callbacks to one receiver
    receiver, url = start(receivers, "ok")
    for _ in range(2):
        document_awaiting_callback(db, url)

    # When they are delivered
    assert notifier(db).deliver_due() == 2

    # Then each carries a fresh timestamp and its own delivery id, and the signature verifies over both and the body
    # as docs/security.md tells a receiver to check it; changing any of the three breaks it
    seen: set[str] = set()
    for request in receiver.requests:
        head, _, body = request.partition(b"\r\n\r\n")
        headers = {
            name.strip().lower(): value.strip()
            for name, _, value in (line.decode().partition(":") for line in head.split(b"\r\n")[1:])
        }
        timestamp, delivery = headers["x-pagescribe-timestamp"], headers["x-pagescribe-delivery"]
        assert abs(int(timestamp) - time.time()) < 300 and delivery not in seen
        seen.add(delivery)
        signed = f"{timestamp}.{delivery}.".encode() + body
        assert headers["x-pagescribe-signature"] == "sha256=" + hmac.new(SECRET, signed, hashlib.sha256).hexdigest()
        replayed = f"{int(timestamp) + 1}.{delivery}.".encode() + body
        assert headers["x-pagescribe-signature"] != "sha256=" + hmac.new(SECRET, replayed, hashlib.sha256).hexdigest()


def test_a_callback_whose_deliverer_keeps_dying_is_given_up_after_its_attempts(db: Database) -> None:
    # Given a callback claimed CALLBACK_MAX_ATTEMPTS times whose deliverer died each time (never recorded)
    document_id = document_awaiting_callback(db, "http://127.0.0.1:9/never")
    with db.engine.begin() as conn:
        conn.execute(
            text("UPDATE documents SET callback_attempts = 5, callback_next_at = now() WHERE id = :id"),
            {"id": document_id},
        )

    # When the next round comes
    delivered = notifier(db, callback_max_attempts=5).deliver_due()

    # Then it is not claimed again but given up, saying why
    assert delivered == 0
    status, error = callback_state(db, document_id)
    assert status == "FAILED" and (error or "").startswith("no delivery recorded after 5 attempts"), error


def _in_thread(work: Callable[[], object]) -> threading.Thread:
    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    return thread


def test_each_outcome_is_recorded_as_it_comes_not_when_the_round_ends(
    db: Database, receivers: list[RawReceiver]
) -> None:
    # Given a round of two callbacks: one receiver that trickles (until it is stopped), one that answers at once
    slow, slow_url = start(receivers, "trickle")
    _, fast_url = start(receivers, "ok")
    slow_document = document_awaiting_callback(db, slow_url)
    fast_document = document_awaiting_callback(db, fast_url)
    # When the round runs, with a deadline far beyond this test
    round_ = _in_thread(lambda: notifier(db, callback_deadline_seconds=120.0).deliver_due())
    try:
        # Then the fast one is recorded delivered while the trickle is still being read: a round cut short (its
        # invocation timed out) would not lose it and send it again
        deadline = time.monotonic() + 60
        while callback_state(db, fast_document)[0] != "DELIVERED" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert callback_state(db, fast_document) == ("DELIVERED", None)
        assert round_.is_alive() and callback_state(db, slow_document)[0] == "PENDING"
    finally:
        slow.stop.set()  # the trickle ends; its delivery fails and is recorded to be tried again
        round_.join(timeout=60)
    assert not round_.is_alive() and callback_state(db, slow_document)[0] == "PENDING"


def _tenant_of(db: Database, document_id: str, tenant: str) -> None:
    with db.engine.begin() as conn:
        conn.execute(text("INSERT INTO tenants (id) VALUES (:t) ON CONFLICT DO NOTHING"), {"t": tenant})
        conn.execute(text("UPDATE documents SET tenant_id = :t WHERE id = :id"), {"t": tenant, "id": document_id})


def _attempts(db: Database, document_ids: list[str]) -> list[int]:
    with db.engine.connect() as conn:
        rows = conn.execute(
            text("SELECT callback_attempts FROM documents WHERE id = ANY(CAST(:ids AS uuid[])) ORDER BY id"),
            {"ids": document_ids},
        )
        return sorted(int(row.callback_attempts) for row in rows)


def test_a_tenant_whose_receivers_all_stall_takes_only_its_share_of_a_round(
    db: Database, receivers: list[RawReceiver]
) -> None:
    # Given a round of 4 at once (a tenant's share: 2), five callbacks of a tenant whose receivers trickle, and one of
    # another tenant's
    stalling = [document_awaiting_callback(db, start(receivers, "trickle")[1]) for _ in range(5)]
    for document_id in stalling:
        _tenant_of(db, document_id, "stalls")
    other, other_url = start(receivers, "ok")
    others = document_awaiting_callback(db, other_url)
    _tenant_of(db, others, "prompt")
    settings = Settings(callback_allow_private_networks=True, callback_concurrency=4, callback_deadline_seconds=2.0)
    # When one round runs (no stack secret: unsigned, as on a local stack)
    delivered = CallbackNotifier(settings, db, None).deliver_due()
    # Then the other tenant's callback was delivered, and only two of the stalling tenant's were tried
    assert delivered == 1 and callback_state(db, others) == ("DELIVERED", None)
    assert len(other.requests) == 1
    assert _attempts(db, stalling) == [0, 0, 0, 1, 1]


def test_a_round_starts_no_delivery_it_could_not_finish_in_its_time_and_gives_it_back(
    db: Database, receivers: list[RawReceiver]
) -> None:
    # Given a due callback, and a round with less time than one delivery's deadline (15 s)
    receiver, url = start(receivers, "ok")
    document_id = document_awaiting_callback(db, url)
    # When the round runs in 5 s
    delivered = notifier(db, callback_deadline_seconds=15.0).deliver_due(seconds=5.0)
    # Then nothing was sent, and the callback is due again with its attempt given back
    assert delivered == 0 and receiver.requests == []
    assert callback_state(db, document_id) == ("PENDING", None) and _attempts(db, [document_id]) == [0]
    # And the next round with time enough delivers it
    assert notifier(db, callback_deadline_seconds=15.0).deliver_due(seconds=60.0) == 1


def test_a_hundred_stalling_receivers_of_one_tenant_delay_no_other_tenants_callback_past_one_deadline(
    db: Database, receivers: list[RawReceiver]
) -> None:
    # Given a hundred callbacks of one tenant, due first, each to a receiver that never answers
    journal: list[str] = []
    stalling = [document_awaiting_callback(db, start(receivers, "stall", journal)[1]) for _ in range(100)]
    for document_id in stalling:
        _tenant_of(db, document_id, "stalls")
    with db.engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE documents SET callback_next_at = now() - interval '1 minute'"
                " WHERE id = ANY(CAST(:ids AS uuid[]))"
            ),
            {"ids": stalling},
        )
    # (a deadline of 5 s: an accepting receiver answers within it even on a machine loaded by other tests)
    settings = Settings(callback_allow_private_networks=True, callback_concurrency=8, callback_deadline_seconds=5.0)
    accepted: list[str] = []
    for round_number in range(3):
        # ... and, before each of three sweeper rounds, callbacks of other tenants whose receivers accept at once
        fresh = []
        for tenant in (f"client-{round_number}-a", f"client-{round_number}-b"):
            document_id = document_awaiting_callback(db, start(receivers, "ok", journal)[1])
            _tenant_of(db, document_id, tenant)
            fresh.append(document_id)
        accepted += fresh
        journal.clear()

        # When the round runs, with time for a few deadlines
        CallbackNotifier(settings, db, None).deliver_due(seconds=15.0)

        # Then every other tenant's callback was answered before the first stalled delivery was cut off, i.e. within
        # one deadline of the round's start, and is recorded delivered, tried once (a stalling receiver notes its cut
        # when it sees the connection dropped, which may be after the round has returned)
        wait_until(lambda: "cut" in journal, timeout=60.0, what="a stalled delivery cut off")
        assert journal.count("ok") == len(fresh)
        assert journal.index("cut") > max(i for i, event in enumerate(journal) if event == "ok")
        assert all(callback_state(db, document_id) == ("DELIVERED", None) for document_id in fresh)
        assert _attempts(db, fresh) == [1, 1]
        # And the stalling tenant was tried for its share of the round only (4 of 8)
        assert journal.count("cut") <= 4

    # And after the three rounds no callback is abandoned: each accepted one delivered once, the stalled ones tried
    # a share a round, pending, waiting to be tried again
    assert all(callback_state(db, document_id) == ("DELIVERED", None) for document_id in accepted)
    assert _attempts(db, accepted) == [1] * len(accepted)
    assert sorted(_attempts(db, stalling)) == [0] * 88 + [1] * 12
    assert all(callback_state(db, document_id)[0] == "PENDING" for document_id in stalling)
