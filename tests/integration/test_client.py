"""pagescribe.client against ``pagescribe serve``: a 4-page document transcribed sync and async, a create whose
answer was lost retried into one document, the API's refusals raised with its message, Retry-After honoured."""

from __future__ import annotations

import asyncio
import itertools
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from pagescribe.api_schemas import DocumentStatusResponse
from pagescribe.client import AsyncPagescribeClient, PagescribeClient, PagescribeError, Transcript, WaitTimeout

from tests.fakes.chat_server import FakeChatServer
from tests.support.commands import start_serve
from tests.support.database import fresh_database

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("client")]

KEY = "local-key"  # start_serve's API key


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``pagescribe serve`` with the fake provider as the model: its API's URL."""
    with fresh_database() as database_url, FakeChatServer() as provider:
        server, endpoints = start_serve(database_url, provider, tmp_path_factory.mktemp("serve"))
        try:
            yield str(endpoints["api"])
        finally:
            server.send_signal(signal.SIGINT)
            assert server.wait(timeout=60) == 0


@pytest.fixture
def four_pages(corpus: Path) -> Path:
    return corpus / "pdflatex-4-pages.pdf"


def _assert_four_pages(transcript: Transcript, progress: list[DocumentStatusResponse]) -> None:
    assert transcript.status.status == "COMPLETED", transcript.status
    assert [page.page for page in transcript.pages] == [1, 2, 3, 4]
    for page in transcript.pages:
        assert page.status == "COMPLETED" and page.text, page
        assert [block.text for block in page.blocks] == [page.text], page  # the fake answers one paragraph a page
        assert page.text in transcript.markdown
    assert transcript.chunks, "chunks were asked for"
    assert {n for chunk in transcript.chunks for n in chunk.pages} == {1, 2, 3, 4}
    assert progress and progress[-1].status == "COMPLETED"
    assert all(status.document_id == transcript.document_id for status in progress)


def test_the_sync_client_transcribes_a_four_page_document(api: str, four_pages: Path) -> None:
    progress: list[DocumentStatusResponse] = []
    with PagescribeClient(api, KEY) as client:
        transcript = client.transcribe(four_pages, chunks=True, on_progress=progress.append, reuse=False)
        listed = client.list_documents(limit=100)
    _assert_four_pages(transcript, progress)
    assert transcript.document_id in {d.document_id for d in listed.documents}


def test_the_async_client_transcribes_a_four_page_document(api: str, four_pages: Path) -> None:
    progress: list[DocumentStatusResponse] = []
    source = four_pages.read_bytes()

    async def run() -> Transcript:
        async with AsyncPagescribeClient(api, KEY) as client:
            return await client.transcribe(
                source, filename="async.pdf", chunks=True, on_progress=progress.append, reuse=False
            )

    transcript = asyncio.run(run())
    _assert_four_pages(transcript, progress)
    assert transcript.status.filename == "async.pdf"


class LosesTheFirstCreatesAnswer(httpx.BaseTransport):
    """A real transport that sends the first POST /documents to the server and then fails as a dropped connection
    does, so the server made the document and the client never heard; the keys of every create it saw."""

    def __init__(self) -> None:
        self._inner = httpx.HTTPTransport()
        self.create_keys: list[str | None] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self._inner.handle_request(request)
        if request.method == "POST" and request.url.path == "/documents":
            self.create_keys.append(request.headers.get("Idempotency-Key"))
            if len(self.create_keys) == 1:
                response.read()
                response.close()
                raise httpx.ReadError("connection reset after the request was sent", request=request)
        return response

    def close(self) -> None:
        self._inner.close()


def test_a_retried_create_makes_one_document(api: str, corpus: Path) -> None:
    # Given a connection that loses the answer to the first create, after the server made the document
    lossy = LosesTheFirstCreatesAnswer()
    name = f"retried-{uuid.uuid4().hex[:8]}.pdf"
    source = (corpus / "pdflatex-4-pages.pdf").read_bytes()
    with PagescribeClient(api, KEY, transport=lossy) as client:
        # When the client transcribes through it
        transcript = client.transcribe(source, filename=name)
        # Then the create was sent again with the same key, and one document has the name
        assert len(lossy.create_keys) == 2 and lossy.create_keys[0] == lossy.create_keys[1] is not None
        named = [d for d in client.list_documents(limit=100).documents if d.filename == name]
        assert [d.document_id for d in named] == [transcript.document_id]
        # And a submit with the same key, made again, gives the same document, not uploaded a second time
        again = client.submit(source, filename=name, idempotency_key=lossy.create_keys[0])
        assert again.document_id == transcript.document_id and again.status == "COMPLETED"
        assert len([d for d in client.list_documents(limit=100).documents if d.filename == name]) == 1


def test_the_apis_refusals_are_raised_with_its_message(api: str, corpus: Path) -> None:
    with PagescribeClient(api, KEY) as client:
        with pytest.raises(PagescribeError) as missing:
            client.status("no-such-document")
        assert (missing.value.status_code, missing.value.message) == (404, "no document with this id")
        source = corpus / "pdflatex-4-pages.pdf"
        with pytest.raises(PagescribeError) as bad_pages:  # refused by the API
            client.transcribe(source, pages="3-1")
        assert (bad_pages.value.status_code, bad_pages.value.field) == (422, "pages"), bad_pages.value
        assert "3-1" in bad_pages.value.message, bad_pages.value
        with pytest.raises(
            PagescribeError
        ) as bad_cap:  # refused by the API's model before it is sent, as the API would
            client.transcribe(source, max_cost_usd=-1)
        direct = httpx.post(
            f"{api}/documents",
            json={"filename": "x.pdf", "content_type": "application/pdf", "max_cost_usd": -1},
            headers={"x-api-key": KEY},
        )
        assert direct.status_code == bad_cap.value.status_code == 422
        assert (bad_cap.value.message, bad_cap.value.field) == (direct.json()["message"], direct.json()["field"])
        done = client.transcribe(corpus / "pdflatex-4-pages.pdf", pages="1")
        with pytest.raises(PagescribeError) as refused:
            client.retry(done.document_id)
        assert refused.value.status_code == 409 and "failed" in refused.value.message.lower(), refused.value
        with pytest.raises(PagescribeError) as too_far:
            client.rerun(done.document_id, 7)
        assert too_far.value.status_code == 404 and "page" in too_far.value.message, too_far.value
        corrected = client.correct(done.document_id, 1, "A person's text")
        assert corrected.revision == 1
        assert client.transcript_text(done.document_id).count("A person's text") == 1
        rerun = client.rerun(done.document_id, 1)
        assert (rerun.document_id, rerun.page_number, rerun.model) == (done.document_id, 1, "test/vision-model")
    with PagescribeClient(api, "not-a-key") as stranger, pytest.raises(PagescribeError) as forbidden:
        stranger.list_documents()
    assert forbidden.value.status_code == 403 and forbidden.value.message, forbidden.value


class BusyOnce(httpx.BaseTransport):
    """A gateway in front of the API that answers the first status read 503 with a Retry-After, as a throttled
    gateway does; when each status read came."""

    def __init__(self, retry_after: int) -> None:
        self._inner = httpx.HTTPTransport()
        self._retry_after = retry_after
        self.status_reads: list[float] = []
        self._lock = threading.Lock()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if request.method == "GET" and request.url.path.count("/") == 2:  # /documents/<id>
            with self._lock:
                self.status_reads.append(time.monotonic())
                if len(self.status_reads) == 1:
                    headers = {"Retry-After": str(self._retry_after), "Content-Type": "application/json"}
                    return httpx.Response(503, headers=headers, content=b'{"message": "slow down"}', request=request)
        return self._inner.handle_request(request)

    def close(self) -> None:
        self._inner.close()


def test_retry_after_is_honoured(api: str, corpus: Path) -> None:
    # Given a gateway that asks the client to come back in 2 s (its own first backoff is 0.5 s)
    busy = BusyOnce(retry_after=2)
    with PagescribeClient(api, KEY, transport=busy) as client:
        transcript = client.transcribe(corpus / "pdflatex-4-pages.pdf", pages="2")
    # Then it came back no sooner, and went on to the transcript
    assert transcript.status.status == "COMPLETED"
    assert busy.status_reads[1] - busy.status_reads[0] >= 2.0


class PacedStatus(httpx.BaseTransport):
    """A proxy in front of the API that adds ``Retry-After`` to every status answer, as a server pacing its pollers
    does."""

    def __init__(self, retry_after: int) -> None:
        self._inner = httpx.HTTPTransport()
        self._retry_after = retry_after

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self._inner.handle_request(request)
        if request.method == "GET" and request.url.path.count("/") == 2:  # /documents/<id>
            response.headers["Retry-After"] = str(self._retry_after)
        return response

    def close(self) -> None:
        self._inner.close()


def test_polling_waits_as_long_as_the_status_answers_retry_after_says(api: str, corpus: Path) -> None:
    # Given status answers that say to come back in 2 s (the client's own first poll interval is 0.5 s)
    polled: list[float] = []
    with PagescribeClient(api, KEY, transport=PacedStatus(retry_after=2)) as client:
        # When a document is transcribed (its upload is read asynchronously: the first poll finds it unfinished)
        transcript = client.transcribe(
            corpus / "pdflatex-4-pages.pdf",
            pages="3",
            reuse=False,
            on_progress=lambda _: polled.append(time.monotonic()),
        )
    # Then each poll came no sooner than the one before it asked
    assert transcript.status.status == "COMPLETED" and len(polled) >= 2, polled
    assert all(later - earlier >= 2.0 for earlier, later in itertools.pairwise(polled)), polled


def test_a_wait_ends_at_its_deadline_while_the_document_goes_on(api: str) -> None:
    # Given a document created and never uploaded: it stays AWAITING_UPLOAD
    created = httpx.post(
        f"{api}/documents",
        json={"filename": "never.pdf", "content_type": "application/pdf"},
        headers={"x-api-key": KEY},
    ).json()
    polled: list[str] = []
    with PagescribeClient(api, KEY) as client:
        # When it is waited for 3 s
        with pytest.raises(WaitTimeout) as timed_out:
            client.wait(created["document_id"], wait_seconds=3.0, on_progress=lambda s: polled.append(s.status))
        # Then the wait ends saying so, after polling it until then, and the document is still there to wait for
        assert f"document {created['document_id']} was not finished after 3 s" == str(timed_out.value)
        assert len(polled) >= 2 and set(polled) == {"AWAITING_UPLOAD"}, polled
        assert client.status(created["document_id"]).status == "AWAITING_UPLOAD"
