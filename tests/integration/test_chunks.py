"""Chunks for retrieval of a real 8-page paper (tests/data/documents/hasyv2-paper.pdf, see SOURCES.md), through the
API's ?format=chunks and the CLI's --format chunks, checked against the paper's own text layer."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from pagescribe.chunking import estimate_tokens
from pagescribe.runtime import shutdown_runtime
from pagescribe.settings import get_settings
from pagescribe.sources.textlayer import extract_text_layer

from tests.fakes.chat_server import FakeChatServer
from tests.integration.test_api import call, upload_through_presigned_url
from tests.support.commands import command_environment, pagescribe
from tests.support.pipeline import Pipeline

pytestmark = pytest.mark.integration

PAPER = Path(__file__).resolve().parents[1] / "data" / "documents" / "hasyv2-paper.pdf"
_FURNITURE = {"page_header", "page_footer", "page_number"}


def _words(text: str) -> set[str]:
    return set(re.findall(r"\w{4,}", text.lower()))


def _headings_above(transcript: dict[str, Any]) -> dict[str, list[str]]:
    """Each content block's id and the titles of the headings above it, each heading closing those of its level and
    below."""
    above: dict[str, list[str]] = {}
    path: list[tuple[int, str]] = []
    for page in transcript["pages"]:
        for block in page["blocks"]:
            if block["type"] == "heading":
                title = block["text"].lstrip("#").strip()
                path = [(level, t) for level, t in path if level < block["level"]] + [(block["level"], title)]
            above[block["id"]] = [t for _, t in path]
    return above


def test_the_chunks_of_a_real_paper_keep_rows_whole_within_their_bound_on_the_pages_they_name(
    text_layer_api: Pipeline, fake_provider: FakeChatServer
) -> None:
    # Given the paper transcribed, each page read off its own text layer (no model call)
    _, created = call("POST", "/documents", body={"filename": "hasyv2.pdf", "content_type": "application/pdf"})
    upload_through_presigned_url(text_layer_api, created, PAPER.read_bytes())
    text_layer_api.run_until_idle()
    document_id = created["document_id"]
    code, transcript = call("GET", f"/documents/{document_id}/transcript", query={"format": "json"})
    assert code == 200 and transcript["status"] == "COMPLETED" and fake_provider.calls == 0

    # When its chunks are asked for twice, at most 200 tokens each with 40 carried over
    query = {"format": "chunks", "max_tokens": "200", "overlap": "40"}
    code, answer = call("GET", f"/documents/{document_id}/transcript", query=query)
    assert code == 200, answer
    again = call("GET", f"/documents/{document_id}/transcript", query=query)[1]
    chunks = answer["chunks"]

    # And a bound the chunks cannot be cut to is refused, naming it
    for bad, field in (
        ({"max_tokens": "5"}, "max_tokens"),
        ({"overlap": "300"}, "overlap"),
        ({"max_tokens": "x"}, "max_tokens"),
    ):
        code, refused = call("GET", f"/documents/{document_id}/transcript", query={**query, **bad})
        assert code == 422 and refused["field"] == field, refused

    # Then the ids are the same both times, and every chunk is the document's and the tenant's, within its bound
    assert [c["id"] for c in chunks] == [c["id"] for c in again["chunks"]] and len(chunks) > 10
    assert (answer["max_tokens"], answer["overlap"]) == (200, 40)
    assert all(c["document_id"] == document_id and c["tenant_id"] == "default" for c in chunks)
    assert all(estimate_tokens(c["text"]) == c["tokens"] <= 200 for c in chunks)
    # And no table row is split: each row of each table stands whole in a chunk that names it
    blocks = {b["id"]: b for page in transcript["pages"] for b in page["blocks"]}
    tables = [b for b in blocks.values() if b["type"] == "table"]
    assert tables
    for table in tables:
        for row in {cell["row"] for cell in table["cells"]}:
            line = "| " + " | ".join(
                c["text"] for c in sorted(table["cells"], key=lambda c: c["col"]) if c["row"] == row
            )
            holding = [c for c in chunks for b in c["blocks"] if b["id"] == table["id"] and row in b["rows"]]
            assert holding and all(line + " |" in c["text"].split("\n") for c in holding), (table["id"], row)
    # And each chunk's pages are those of its blocks, whose words are on those pages of the paper itself
    layers = {page: _words(extract_text_layer(PAPER, page)) for page in range(1, 9)}
    above = _headings_above(transcript)
    for chunk in chunks:
        pieces = chunk["text"].split("\n\n")
        assert len(pieces) == len(chunk["blocks"]) and chunk["pages"] == sorted({b["page"] for b in chunk["blocks"]})
        for piece, block in zip(pieces, chunk["blocks"], strict=True):
            assert block["type"] not in _FURNITURE and block["bbox"] == blocks[block["id"]]["bbox"]
            words = _words(piece)
            assert len(words & layers[block["page"]]) >= 0.9 * len(words), (block["id"], piece)
            # And its heading path is the headings above each of its blocks
            assert chunk["heading_path"] == above[block["id"]]


def test_the_cli_writes_the_chunks_beside_the_transcript_one_json_object_a_line(
    database_url: str, fake_provider: FakeChatServer, tmp_path: Path
) -> None:
    env = command_environment(database_url, fake_provider)
    # Given a bound the chunks cannot be cut to, the command refuses it before transcribing, naming it
    refused = pagescribe("transcribe", str(PAPER), "--format", "chunks", "--overlap", "300", env=env, cwd=tmp_path)
    assert refused.returncode == 2 and "--overlap: overlap must be" in refused.stderr and "not 300" in refused.stderr
    # When the paper is transcribed with --format chunks (its text layer standing in for the model)
    done = pagescribe(
        "transcribe", str(PAPER), "--text-layer", "auto", "--format", "chunks", "--max-tokens", "300", "--out", "out",
        env=env, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    # Then <name>.chunks.jsonl holds the chunks, a line each, in order, within the bound, beside the markdown
    lines = (tmp_path / "out" / "hasyv2-paper.chunks.jsonl").read_text(encoding="utf-8").splitlines()
    chunks = [json.loads(line) for line in lines]
    assert [c["index"] for c in chunks] == list(range(len(chunks))) and len(chunks) > 5
    assert all(c["tokens"] <= 300 for c in chunks) and (tmp_path / "out" / "hasyv2-paper.md").is_file()
    assert "hasyv2-paper.chunks.jsonl" in done.stderr and fake_provider.calls == 0


def test_chunks_asked_for_are_written_beside_the_transcript_and_named_in_its_status_and_callback(
    text_layer_api: Pipeline, monkeypatch: pytest.MonkeyPatch, callback_receiver: Any
) -> None:
    # Given the stack's chunks at 300 tokens, 30 carried over, a callback receiver, and one document that asks for
    # chunks and one that does not
    stack = {"CHUNK_MAX_TOKENS": "300", "CHUNK_OVERLAP": "30", "CALLBACK_SECRET": "s"}
    for name, value in {**stack, "CALLBACK_ALLOW_PRIVATE_NETWORKS": "true"}.items():
        monkeypatch.setenv(name, value)
    shutdown_runtime()
    get_settings.cache_clear()
    url, receiver = callback_receiver
    body = {"filename": "hasyv2.pdf", "content_type": "application/pdf", "pages": "1-3", "callback_url": url}
    _, asked = call("POST", "/documents", body={**body, "chunks": True})
    _, plain = call("POST", "/documents", body={**body, "reuse": False})
    # When both are transcribed and the sweeper's round sends their callbacks
    for created in (asked, plain):
        upload_through_presigned_url(text_layer_api, created, PAPER.read_bytes())
    text_layer_api.run_until_idle()
    text_layer_api.sweep()

    # Then the one that asked has <transcript>.chunks.jsonl: the chunks ?format=chunks gives at the stack's bounds
    code, status = call("GET", f"/documents/{asked['document_id']}")
    assert code == 200 and status["chunks_key"] == f"transcripts/{asked['document_id']}.chunks.jsonl"
    stored = (
        text_layer_api.s3.get_object(Bucket=text_layer_api.bucket, Key=status["chunks_key"])["Body"]
        .read()
        .decode("utf-8")
    )
    query = {"format": "chunks", "max_tokens": "300", "overlap": "30"}
    served = call("GET", f"/documents/{asked['document_id']}/transcript", query=query)[1]["chunks"]
    assert [json.loads(line) for line in stored.splitlines()] == served and served
    # And its callback names them; the other document has none, and says so
    payloads = {json.loads(raw)["document_id"]: json.loads(raw) for _, raw in receiver.received}
    assert payloads[asked["document_id"]]["chunks_key"] == status["chunks_key"]
    assert payloads[plain["document_id"]]["chunks_key"] is None
    assert call("GET", f"/documents/{plain['document_id']}")[1]["chunks_key"] is None
    listed = text_layer_api.s3.list_objects_v2(
        Bucket=text_layer_api.bucket, Prefix=f"transcripts/{plain['document_id']}"
    )
    assert not [o["Key"] for o in listed.get("Contents", []) if o["Key"].endswith(".chunks.jsonl")]
