"""``pagescribe mcp``'s server, driven by the mcp package's own client in-process, against ``pagescribe serve``: its
tools listed, a document transcribed from a path and from a URL, read back, and what it refuses."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import shutil
import signal
import sys
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, StdioServerParameters
from mcp.types import CallToolResult, TextContent
from pagescribe.client import AsyncPagescribeClient
from pagescribe_local.mcp_server import build_server

from tests.fakes.chat_server import FakeChatServer
from tests.support.commands import start_serve
from tests.support.database import fresh_database

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("mcp")]

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


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory, corpus: Path) -> Iterator[tuple[Path, str]]:
    """A folder with the 4-page PDF, an HTML page (one named .pdf) and a large PDF-looking file, and a web server
    serving it (``/unsized/<name>``: without a Content-Length, the body ended by closing the connection)."""
    folder = tmp_path_factory.mktemp("web")
    shutil.copy(corpus / "pdflatex-4-pages.pdf", folder / "four.pdf")
    (folder / "page.html").write_text("<html><body>not a document</body></html>")
    (folder / "disguised.pdf").write_text("<html><body>an error page, named as a document</body></html>")
    (folder / "large.pdf").write_bytes(b"%PDF-1.7\n" + b"0" * 4096)
    web = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(folder)))
    threading.Thread(target=web.serve_forever, daemon=True).start()
    try:
        yield folder, f"http://127.0.0.1:{web.server_address[1]}"
    finally:
        web.shutdown()
        web.server_close()


class _Quiet(SimpleHTTPRequestHandler):
    def do_GET(self) -> None:
        if not self.path.startswith("/unsized/"):
            super().do_GET()
            return
        body = (Path(self.directory) / self.path.removeprefix("/unsized/")).read_bytes()
        self.send_response(200)
        self.send_header("Content-Type", "application/pdf")
        self.end_headers()
        self.wfile.write(body)  # HTTP/1.0: the body ends when the connection closes

    def log_message(self, format: str, *args: Any) -> None:
        pass


def _texts(result: CallToolResult) -> list[str]:
    return [block.text for block in result.content if isinstance(block, TextContent)]


def _call(
    api: str,
    *calls: tuple[str, dict[str, Any]],
    max_bytes: int = 1 << 20,
    reported: list[tuple[float, float | None, str | None]] | None = None,
) -> list[CallToolResult]:
    """The tools' answers to ``calls``, made in turn over one in-process MCP session; the progress they reported
    appended to ``reported``."""

    async def record(progress: float, total: float | None, message: str | None) -> None:
        if reported is not None:
            reported.append((progress, total, message))

    async def run() -> list[CallToolResult]:
        async with AsyncPagescribeClient(api, KEY) as client, Client(build_server(client, max_bytes=max_bytes)) as mcp:
            return [await mcp.call_tool(name, arguments, progress_callback=record) for name, arguments in calls]

    return asyncio.run(run())


def test_the_server_lists_its_tools(api: str) -> None:
    async def run() -> dict[str, Any]:
        async with AsyncPagescribeClient(api, KEY) as client, Client(build_server(client)) as mcp:
            return {tool.name: tool.input_schema for tool in (await mcp.list_tools()).tools}

    tools = asyncio.run(run())
    assert set(tools) == {"transcribe", "status", "transcript", "list_documents"}
    assert set(tools["transcribe"]["properties"]) == {"source", "pages", "model", "format", "wait_seconds"}
    # The API key is no tool's argument: it comes from the environment
    assert not any("key" in name for schema in tools.values() for name in schema.get("properties", {}))


def test_a_document_is_transcribed_from_a_path_and_read_back(api: str, files: tuple[Path, str]) -> None:
    folder, _ = files
    progress: list[tuple[float, float | None, str | None]] = []
    [transcribed] = _call(api, ("transcribe", {"source": str(folder / "four.pdf")}), reported=progress)
    assert not transcribed.is_error, transcribed
    assert progress[-1] == (4, 4, "COMPLETED: 4 pages finished"), progress
    summary, markdown = _texts(transcribed)
    document_id = summary.split()[1]
    assert "COMPLETED, 4 pages" in summary, summary
    assert markdown.count("Transcribed page image") == 4, markdown  # the fake model's answer, a page each
    status, as_json, chunks, listed = _call(
        api,
        ("status", {"document_id": document_id}),
        ("transcript", {"document_id": document_id, "format": "json"}),
        ("transcript", {"document_id": document_id, "format": "chunks"}),
        ("list_documents", {"limit": 100}),
    )
    assert status.structured_content["status"] == "COMPLETED", status
    assert [page["page"] for page in json.loads(_texts(as_json)[0])["pages"]] == [1, 2, 3, 4]
    assert json.loads(_texts(chunks)[0])["chunks"], chunks
    assert document_id in {d["document_id"] for d in listed.structured_content["documents"]}


def test_a_document_is_transcribed_from_a_url(api: str, files: tuple[Path, str]) -> None:
    _, web = files
    [transcribed] = _call(api, ("transcribe", {"source": f"{web}/four.pdf", "pages": "2-3", "format": "json"}))
    assert not transcribed.is_error, transcribed
    summary, document = _texts(transcribed)
    assert "(four.pdf): COMPLETED, 2 pages" in summary, summary
    assert [page["page"] for page in json.loads(document)["pages"]] == [2, 3]


def test_what_the_server_refuses_it_says_why(api: str, files: tuple[Path, str]) -> None:
    folder, web = files
    html, disguised, large, unsized, missing, scheme, unknown = _call(
        api,
        ("transcribe", {"source": f"{web}/page.html"}),
        ("transcribe", {"source": f"{web}/disguised.pdf"}),
        ("transcribe", {"source": f"{web}/large.pdf"}),
        ("transcribe", {"source": f"{web}/unsized/large.pdf"}),
        ("transcribe", {"source": str(folder / "absent.pdf")}),
        ("transcribe", {"source": "file:///etc/passwd"}),
        ("status", {"document_id": "no-such-document"}),
        max_bytes=2048,
    )
    assert all(result.is_error for result in (html, disguised, large, unsized, missing, scheme, unknown))
    assert "is not a PDF or an image the API takes" in _texts(html)[0], html
    assert f"{web}/disguised.pdf is not a PDF or an image the API takes" in _texts(disguised)[0], disguised
    assert f"{web}/large.pdf is 4105 bytes, over the limit of 2048" in _texts(large)[0], large
    assert f"{web}/unsized/large.pdf is over the limit of 2048 bytes" in _texts(unsized)[0], unsized
    assert "no file at" in _texts(missing)[0], missing
    assert "a local path or an http(s) URL, not a file: URL" in _texts(scheme)[0], scheme
    assert "404: no document with this id" in _texts(unknown)[0], unknown  # the API's own message


def test_pagescribe_mcp_serves_over_stdio_with_the_key_from_its_environment(api: str) -> None:
    # Given `pagescribe mcp` started by an MCP client as Claude Desktop starts it: a command and its environment
    def started(key: str) -> StdioServerParameters:
        env = {"PATH": os.environ.get("PATH", ""), "PAGESCRIBE_URL": api, "PAGESCRIBE_API_KEY": key}
        return StdioServerParameters(command=sys.executable, args=["-m", "pagescribe_local.cli", "mcp"], env=env)

    async def documents(key: str) -> CallToolResult:
        async with Client(started(key)) as mcp:
            return await mcp.call_tool("list_documents", {"limit": 5})

    # When it lists documents with the stack's key, and with a key the stack does not know
    listed, refused = asyncio.run(documents(KEY)), asyncio.run(documents("not-a-key"))
    # Then the first is the tenant's list, and the second the API's refusal of the key
    assert not listed.is_error and "documents" in listed.structured_content, listed
    assert refused.is_error and _texts(refused)[0].startswith("Error executing tool list_documents: 403"), refused
