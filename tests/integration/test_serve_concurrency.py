"""``pagescribe serve`` under concurrent clients of two tenants: every request gets its own answer, for its own tenant.

The API handler keeps per-request state in its module (Powertools' resolver: the current event, ``app.context``),
as Lambda allows, since one environment runs one invocation at a time. The local bridge takes many requests at once,
so these tests fire mixed requests from many threads and check every status, body and tenant."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from pagescribe.store.postgres import Database, create_database_engine
from pagescribe.tenancy import create_key
from sqlalchemy import text

from tests.fakes.chat_server import FakeChatServer
from tests.support.commands import start_serve
from tests.support.database import fresh_database

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("serve-concurrency")]  # one serve, on one worker

CLIENTS = 8
REQUESTS_PER_CLIENT = 40
MODEL = "test/vision-model"  # command_environment's MODEL
FINISHED = {"COMPLETED", "PARTIAL", "FAILED"}


@dataclass
class Tenant:
    name: str
    key: str
    rerun_doc: str = ""  # a finished 4-page document whose pages are re-run
    corrected_doc: str = ""  # a finished 1-page document whose page is corrected
    created: set[str] = field(default_factory=set)  # documents created during the run
    listed: set[str] = field(default_factory=set)  # every document any list answer named
    revisions: list[int] = field(default_factory=list)  # the revision numbers of the corrections saved

    @property
    def headers(self) -> dict[str, str]:
        return {"x-api-key": self.key}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Database]]:
    """``pagescribe serve`` with the fake provider, and the database it uses: one of its own, so that another test's
    documents (of tenants with the same names) are not in its lists."""
    with fresh_database() as database_url, FakeChatServer() as provider:
        # re-runs limited far above what the run makes: each tenant re-runs its document's pages a few dozen times
        limits = {"MAX_DOCUMENT_RETRIES": "100", "MAX_PAGE_RERUNS": "100"}
        server, endpoints = start_serve(database_url, provider, tmp_path_factory.mktemp("serve"), settings=limits)
        engine = create_database_engine(database_url)
        try:
            yield endpoints["api"], Database(engine)
        finally:
            engine.dispose()
            server.send_signal(signal.SIGINT)
            assert server.wait(timeout=60) == 0


def _finished_document(api: str, tenant: Tenant, source: Path, name: str) -> str:
    created = httpx.post(
        f"{api}/documents", json={"filename": name, "content_type": "application/pdf"}, headers=tenant.headers
    ).json()
    httpx.put(created["upload_url"], content=source.read_bytes(), headers=created["upload_headers"]).raise_for_status()
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        status = httpx.get(f"{api}/documents/{created['document_id']}", headers=tenant.headers).json()
        if status["status"] in FINISHED:
            assert status["status"] == "COMPLETED", status
            return str(created["document_id"])
        time.sleep(0.2)
    raise AssertionError(f"{name} did not finish in 180 s")


def _expect(response: httpx.Response, status: int, what: str) -> dict[str, Any]:
    assert response.status_code == status, f"{what}: {response.status_code} {response.text[:300]}"
    body: dict[str, Any] = response.json()
    return body


def _request(client: httpx.Client, api: str, me: Tenant, other: Tenant, n: int) -> None:
    """The client's ``n``-th request, a kind in turn, and the check of its answer."""
    kind = n % 6
    if kind == 0:
        name = f"{me.name}-{n}.pdf"
        body = _expect(
            client.post(
                f"{api}/documents", json={"filename": name, "content_type": "application/pdf"}, headers=me.headers
            ),
            201,
            "create",
        )
        assert body["status"] == "AWAITING_UPLOAD", body
        assert f"/uploads/{me.name}/{body['document_id']}/{name}?" in body["upload_url"], body
        me.created.add(body["document_id"])
    elif kind == 1:
        body = _expect(client.get(f"{api}/documents/{me.corrected_doc}", headers=me.headers), 200, "read")
        assert (body["document_id"], body["filename"], body["status"]) == (
            me.corrected_doc,
            f"{me.name}-corrected.pdf",
            "COMPLETED",
        ), body
    elif kind == 2:
        body = _expect(client.get(f"{api}/documents/{other.corrected_doc}", headers=me.headers), 404, "foreign read")
        assert body == {"message": "no document with this id"}, body
    elif kind == 3:
        body = _expect(client.get(f"{api}/documents", params={"limit": 100}, headers=me.headers), 200, "list")
        me.listed |= {d["document_id"] for d in body["documents"]}
        assert me.rerun_doc in me.listed and me.corrected_doc in me.listed, body
    elif kind == 4:
        page = 1 + n % 4
        response = client.post(f"{api}/documents/{me.rerun_doc}/pages/{page}/rerun", json={}, headers=me.headers)
        if response.status_code == 409:  # an earlier re-run of the page is still queued or being transcribed
            assert response.json()["message"].startswith(f"page {page} is "), response.text
        else:
            body = _expect(response, 202, "re-run")
            assert body == {"document_id": me.rerun_doc, "page_number": page, "model": MODEL}, body
    else:
        text = f"{me.name}'s correction {n}"
        response = client.put(
            f"{api}/documents/{me.corrected_doc}/pages/1/correction", json={"markdown": text}, headers=me.headers
        )
        body = _expect(response, 200, "correction")
        assert (body["document_id"], body["page_number"]) == (me.corrected_doc, 1), body
        me.revisions.append(body["revision"])


def test_mixed_concurrent_requests_of_two_tenants_each_get_their_own_answer(
    served: tuple[str, Database], corpus: Path
) -> None:
    api, db = served
    # Given two tenants, each with its key, a finished 4-page document and a finished 1-page one
    acme, globex = (Tenant(name, create_key(db, name)[1]) for name in ("acme", "globex"))
    for tenant in (acme, globex):
        tenant.rerun_doc = _finished_document(api, tenant, corpus / "pdflatex-4-pages.pdf", f"{tenant.name}-rerun.pdf")
        tenant.corrected_doc = _finished_document(
            api, tenant, corpus / "minimal-document.pdf", f"{tenant.name}-corrected.pdf"
        )

    # When eight clients, four of each tenant, send forty mixed requests each at the same time (create, read, read
    # another tenant's document, list, re-run a page, correct a page)
    start = threading.Barrier(CLIENTS)
    failures: list[str] = []

    def client(number: int) -> None:
        me, other = (acme, globex) if number % 2 == 0 else (globex, acme)
        with httpx.Client(timeout=60) as http:
            start.wait()
            for n in range(REQUESTS_PER_CLIENT):
                try:
                    _request(http, api, me, other, number + n)
                except AssertionError as exc:
                    failures.append(f"client {number}, request {n}: {exc}")

    threads = [threading.Thread(target=client, args=(number,)) for number in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    # Then every answer had the status and body its own request asked for
    assert not failures, f"{len(failures)} wrong answers of {CLIENTS * REQUESTS_PER_CLIENT}:\n" + "\n".join(
        failures[:20]
    )
    for me, other in ((acme, globex), (globex, acme)):
        # And a list named only the tenant's own documents
        assert me.listed <= {me.rerun_doc, me.corrected_doc} | me.created
        assert not me.listed & ({other.rerun_doc, other.corrected_doc} | other.created)
        # And every correction of the tenant's landed on its own page, as the next revision
        assert sorted(me.revisions) == list(range(1, len(me.revisions) + 1)), me.revisions
        assert _scalars(
            db, "SELECT page_number FROM page_corrections WHERE document_id = CAST(:id AS uuid)", id=me.corrected_doc
        ) == [1] * len(me.revisions)
        # And every document created was recorded under the tenant of the key that created it
        tenants = _scalars(db, "SELECT tenant_id FROM documents WHERE id::text = ANY(:ids)", ids=sorted(me.created))
        assert tenants == [me.name] * len(me.created)


def _scalars(db: Database, sql: str, **params: Any) -> list[Any]:
    with db.engine.connect() as conn:
        return list(conn.execute(text(sql), params).scalars())


def test_methods_no_route_takes_are_answered_as_api_gateway_answers_them(served: tuple[str, Database]) -> None:
    api, _ = served
    # When a client sends HEAD, DELETE, PATCH or OPTIONS to a route that exists for GET
    for method in ("HEAD", "DELETE", "PATCH", "OPTIONS"):
        response = httpx.request(method, f"{api}/health")
        # Then API Gateway's own answer comes back (no route takes the method), with no body for a HEAD
        assert response.status_code == 403, (method, response.status_code)
        assert response.headers["x-amzn-ErrorType"] == "MissingAuthenticationTokenException"
        assert response.content == (b"" if method == "HEAD" else b'{"message": "Missing Authentication Token"}')
    # And the route itself still answers GET
    assert httpx.get(f"{api}/health").status_code == 200
