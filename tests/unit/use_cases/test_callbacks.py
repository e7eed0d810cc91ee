"""Callbacks on the in-memory store: a finished document's receiver is told once, signed, and a failure retried."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from pagescribe.callbacks import DELIVERY_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER, CallbackNotifier, sign
from pagescribe.domain import DocumentStatus, NewDocument, PendingDocument
from pagescribe.settings import Settings

from tests.support.memory_store import MemoryStore

SECRET = b"shared-with-the-receiver"
SETTINGS = Settings(callback_allow_private_networks=True, callback_max_attempts=2)


class Receiver(ThreadingHTTPServer):
    """A receiver on this machine that answers each callback with the next status it is given."""

    def __init__(self, statuses: list[int]) -> None:
        self.statuses, self.received = statuses, list[tuple[dict[str, str], bytes]]()
        super().__init__(("127.0.0.1", 0), _Answer)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/hook"


class _Answer(BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.received.append((dict(self.headers), body))
        self.send_response(self.server.statuses.pop(0))
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        """Quiet."""


@pytest.fixture
def receiver(request: pytest.FixtureRequest) -> Iterator[Receiver]:
    server = Receiver(list(request.param))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def _finished_document(store: MemoryStore, url: str) -> str:
    document_id = "0c1b0e7e-0000-4000-8000-000000000001"
    store.create_pending_document(PendingDocument(document_id, "b", "uploads/a", "a.pdf", "m", None, None, url))
    new = NewDocument("b", "uploads/a", "etag", "", 10, "m")
    [job_id] = store.create_document(new, kind="pdf", pages=[1], pending_id=document_id).job_ids
    [job] = store.claim_jobs([job_id], lease_seconds=60, max_attempts=3).claimed.values()
    store.fail_job(job, "broken page")
    store.finish_document(document_id, status=DocumentStatus.FAILED, error="1 of 1 pages failed", transcript_key="t")
    return document_id


@pytest.mark.parametrize("receiver", [[200]], indirect=True)
def test_a_finished_document_is_told_once_signed(store: MemoryStore, receiver: Receiver) -> None:
    # Given a finished document with a callback URL
    document_id = _finished_document(store, receiver.url)
    notifier = CallbackNotifier(SETTINGS, store, SECRET)
    # When the due callbacks are delivered twice
    delivered = [notifier.deliver_due(), notifier.deliver_due()]
    # Then the receiver heard once, a body it can verify, naming the document and its failed page
    assert delivered == [1, 0]
    [(headers, body)] = receiver.received
    expected = sign(SECRET, headers[TIMESTAMP_HEADER], headers[DELIVERY_HEADER], body)
    assert headers[SIGNATURE_HEADER] == expected
    message = json.loads(body)
    assert (message["event"], message["document_id"], message["status"]) == (
        "document.finished", document_id, "FAILED",
    )  # fmt: skip
    record = store.get_document(document_id)
    assert record is not None and (record.callback_status, record.callback_error) == ("DELIVERED", None)


@pytest.mark.parametrize("receiver", [[500, 200]], indirect=True)
def test_a_receivers_error_is_recorded_and_tried_again_when_due(store: MemoryStore, receiver: Receiver) -> None:
    document_id = _finished_document(store, receiver.url)
    notifier = CallbackNotifier(SETTINGS, store, SECRET)
    assert notifier.deliver_due() == 0
    record = store.get_document(document_id)
    assert record is not None and record.callback_status == "PENDING" and "500" in (record.callback_error or "")
    assert notifier.deliver_due() == 0  # not due yet: it waits its backoff
    store.state.clock.advance(3600)
    assert notifier.deliver_due() == 1 and len(receiver.received) == 2


@pytest.mark.parametrize("receiver", [[500, 500]], indirect=True)
def test_a_callback_failing_every_try_ends_failed_with_its_last_error(store: MemoryStore, receiver: Receiver) -> None:
    document_id = _finished_document(store, receiver.url)
    notifier = CallbackNotifier(SETTINGS, store, SECRET)
    for _ in range(3):
        notifier.deliver_due()
        store.state.clock.advance(3600)
    record = store.get_document(document_id)
    assert record is not None and record.callback_status == "FAILED" and "500" in (record.callback_error or "")
    assert len(receiver.received) == SETTINGS.callback_max_attempts
