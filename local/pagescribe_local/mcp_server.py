"""``pagescribe mcp``: an MCP server (over stdio) for agents, in front of a deployed stack or ``pagescribe serve``.

Its tools: ``transcribe`` a file or an http(s) URL the agent names, ``status`` of a document, its ``transcript`` as
markdown, JSON or chunks, and ``list_documents``. They call the API through :mod:`pagescribe.client`. The API's URL
and key come from the environment (``PAGESCRIBE_URL``, ``PAGESCRIBE_API_KEY``), never from a tool's arguments, which
an agent's transcript would keep.

A file is taken as the API takes an upload: at most MAX_UPLOAD_BYTES (the stack's default, or ``--max-bytes``), and
only a PDF or an image of a type the API accepts, told by its first bytes; a URL's body is read no further than that
limit, so a page that is not a document (an error page, a cloud metadata answer) is never sent on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Literal, TypeVar
from urllib.parse import unquote, urlsplit

import httpx
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pagescribe.api_schemas import DocumentList, DocumentStatusResponse
from pagescribe.client import CONTENT_TYPES, AsyncPagescribeClient, PagescribeError, sniff_content_type
from pagescribe.settings import Settings

MAX_BYTES: int = Settings.model_fields["max_upload_bytes"].default  # the API's own limit, unless the stack sets one
MAX_REDIRECTS = 5
DOWNLOAD_TIMEOUT_SECONDS = 60.0
INSTRUCTIONS = (
    "pagescribe turns PDFs and page images into faithful page-by-page markdown with a vision model. transcribe takes "
    "a local path or an http(s) URL and waits for the transcript (documents of many pages take minutes); status, "
    "transcript and list_documents read documents transcribed before."
)
Format = Literal["markdown", "json", "chunks"]
T = TypeVar("T")


async def read_source(source: str, max_bytes: int, http: httpx.AsyncClient) -> tuple[bytes, str]:
    """The bytes of a local file or an http(s) URL, and its name; refused (ToolError) beyond ``max_bytes`` or when
    its first bytes are not a PDF or an image the API takes."""
    scheme = urlsplit(source).scheme.lower()
    if scheme in {"http", "https"}:
        content, name = await _download(source, max_bytes, http)
    elif scheme and len(scheme) > 1:  # not a Windows drive letter
        raise ToolError(f"a source is a local path or an http(s) URL, not a {scheme}: URL")
    else:
        content, name = await asyncio.to_thread(_read_file, source, max_bytes)
    if sniff_content_type(content) is None:
        raise ToolError(f"{source} is not a PDF or an image the API takes ({', '.join(CONTENT_TYPES)})")
    return content, name


def _read_file(source: str, max_bytes: int) -> tuple[bytes, str]:
    path = Path(source).expanduser()
    if not path.is_file():
        raise ToolError(f"no file at {path}")
    if path.stat().st_size > max_bytes:
        raise ToolError(f"{path} is {path.stat().st_size} bytes, over the limit of {max_bytes}")
    return path.read_bytes(), path.name


async def _download(url: str, max_bytes: int, http: httpx.AsyncClient) -> tuple[bytes, str]:
    try:
        async with http.stream("GET", url) as response:
            if response.is_error:
                raise ToolError(f"{url} answered {response.status_code} {response.reason_phrase}")
            declared = response.headers.get("content-length")
            if declared is not None and declared.isdigit() and int(declared) > max_bytes:
                raise ToolError(f"{url} is {declared} bytes, over the limit of {max_bytes}")
            body = bytearray()
            async for piece in response.aiter_bytes():
                body += piece
                if len(body) > max_bytes:
                    raise ToolError(f"{url} is over the limit of {max_bytes} bytes")
            name = unquote(response.url.path.rsplit("/", 1)[-1]) or "document"
    except httpx.HTTPError as exc:
        raise ToolError(f"{url} could not be read: {exc}") from exc
    return bytes(body), name[:255]


def _progress(ctx: Context[Any, Any]) -> Callable[[DocumentStatusResponse], Awaitable[None]]:
    """Each status polled, as the tool call's progress: pages finished of the document's pages."""

    async def report(status: DocumentStatusResponse) -> None:
        finished = status.pages_finished
        await ctx.report_progress(finished, status.page_count or None, f"{status.status}: {finished} pages finished")

    return report


def build_server(client: AsyncPagescribeClient, *, max_bytes: int = MAX_BYTES) -> MCPServer[Any]:
    """The MCP server whose tools call the API through ``client``."""
    server: MCPServer[Any] = MCPServer("pagescribe", instructions=INSTRUCTIONS)

    @server.tool(structured_output=False)
    async def transcribe(
        source: str,
        ctx: Context[Any, Any],
        pages: str | None = None,
        model: str | None = None,
        format: Format = "markdown",
        wait_seconds: float = 900.0,
    ) -> list[str]:
        """Transcribe a PDF or page image: a local path or an http(s) URL. pages: e.g. "1-3,7" (all by default);
        model: a model the stack allows (its default otherwise); format: markdown, json or chunks. Waits for the
        transcript and returns a line about the document (its id, status, pages, cost), then the transcript."""
        async with httpx.AsyncClient(
            follow_redirects=True, max_redirects=MAX_REDIRECTS, timeout=DOWNLOAD_TIMEOUT_SECONDS
        ) as downloads:
            content, name = await read_source(source, max_bytes, downloads)
        options = {key: value for key, value in {"pages": pages, "model": model}.items() if value is not None}
        submitted = await _called(client.submit(content, filename=name, **options))
        status = await _called(
            client.wait(submitted.document_id, wait_seconds=wait_seconds, on_progress=_progress(ctx))
        )
        if status.status == "FAILED":
            raise ToolError(_summary(status))
        return [_summary(status), await _called(client.transcript_text(status.document_id, format))]

    @server.tool()
    async def status(document_id: str) -> DocumentStatusResponse:
        """A document's status: progress, per-page errors and flags, tokens and cost."""
        return await _called(client.status(document_id))

    @server.tool(structured_output=False)
    async def transcript(document_id: str, format: Format = "markdown") -> str:
        """A finished document's transcript: markdown, json (pages, blocks with their boxes, flags, costs) or chunks
        (for retrieval)."""
        return await _called(client.transcript_text(document_id, format))

    @server.tool()
    async def list_documents(limit: int = 20, cursor: str | None = None) -> DocumentList:
        """The documents of the key's tenant, newest first; pass next_cursor as cursor for the next ones."""
        return await _called(client.list_documents(limit=limit, cursor=cursor))

    return server


async def _called(call: Awaitable[T]) -> T:
    """The call's answer; the API's refusal as the tool's error, its message kept for the agent to read."""
    try:
        return await call
    except PagescribeError as exc:
        raise ToolError(str(exc)) from exc


def _summary(status: DocumentStatusResponse) -> str:
    why = f" ({status.error})" if status.error else ""
    failed = f", page errors: {[e.model_dump() for e in status.page_errors]}" if status.page_errors else ""
    return (
        f"document {status.document_id} ({status.filename}): {status.status}, {status.page_count} pages, "
        f"{status.flagged_pages} flagged, cost ${status.cost:.4f}{why}{failed}"
    )


def serve_stdio(base_url: str | None, max_bytes: int | None) -> int:
    """Run the server over stdio until its client closes it; the key from PAGESCRIBE_API_KEY."""
    client = AsyncPagescribeClient(base_url)
    build_server(client, max_bytes=max_bytes or MAX_BYTES).run("stdio")
    return 0
