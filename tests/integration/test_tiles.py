"""Pages read in tiles end to end: moto SQS/S3, PostgreSQL and a real local chat-completions server."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from pagescribe.runtime import shutdown_runtime
from pagescribe.settings import get_settings
from pagescribe.sources.documents import DocumentKind
from pagescribe.sources.pages import render_band, render_page
from pagescribe.sources.textlayer import text_layer_words
from pagescribe.status import describe_document
from pagescribe.store.postgres import Database
from pagescribe.transcription.tileplan import TileLimits, plan_tiles, text_height
from PIL import Image
from sqlalchemy import text

from tests.fakes.chat_server import FakeChatServer, Ok, Truncated, expected_text
from tests.support.database import page_rows
from tests.support.pipeline import Pipeline

pytestmark = pytest.mark.integration


def _attempts(db: Database, document_id: str) -> list[dict[str, Any]]:
    with db.engine.connect() as conn:
        rows = conn.execute(
            text("SELECT outcome, tile, finish_reason, cost FROM attempts WHERE document_id = :id ORDER BY id"),
            {"id": document_id},
        ).mappings()
        return [dict(row) for row in rows]


def _configure(monkeypatch: pytest.MonkeyPatch, **values: str) -> None:
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    shutdown_runtime()
    get_settings.cache_clear()


@pytest.mark.parametrize(("max_tiles", "tiles"), [(6, 3), (2, 2)])
def test_a_truncated_page_is_read_in_tiles_and_completes(
    pipeline: Pipeline,
    db: Database,
    fake_provider: FakeChatServer,
    corpus: Path,
    monkeypatch: pytest.MonkeyPatch,
    max_tiles: int,
    tiles: int,
) -> None:
    # Given a page whose whole answer is cut at the output limit, and whose tiles' answers are not
    _configure(monkeypatch, TILE_MAX_TILES=str(max_tiles))
    [doc] = pipeline.upload("uploads/long.png", corpus / "smile.png")["documents"]
    fake_provider.script(Truncated("the first half of the pa"))
    # When the queue is drained
    pipeline.run_until_idle()
    # Then the page completed from its tiles: bands of the page, top to bottom, as many as TILE_MAX_TILES allows
    [page] = page_rows(db, doc["document_id"])
    whole, *received = fake_provider.images()
    assert fake_provider.calls == 1 + tiles and len(received) == tiles
    settings = get_settings()
    width, height = Image.open(io.BytesIO(whole)).size
    plan = plan_tiles(width, height, text_px=None, truncated=True, limits=TileLimits.of(settings))
    assert plan is not None and len(plan.bands) == tiles
    bands = [
        render_band(
            corpus / "smile.png",
            DocumentKind.PNG,
            1,
            band,
            zoom=plan.zoom,
            dpi=settings.render_dpi,
            max_long_edge=settings.render_max_long_edge,
            image_format=settings.render_format,
        ).data
        for band in plan.bands
    ]
    assert sorted(received) == sorted(bands)  # the calls ran at once: in no set order
    assert all(Image.open(io.BytesIO(band)).size[1] < height for band in bands)
    assert page["status"] == "COMPLETED" and page["finish_reason"] == "stop"
    assert page["result_text"] == "\n".join(expected_text(band) for band in bands)  # in the bands' order
    # And every call is in the ledger: the truncated one, then one per tile, the page's cost their sum
    attempts = _attempts(db, doc["document_id"])
    assert (attempts[0]["outcome"], attempts[0]["tile"]) == ("TILED", None)
    assert sorted((a["outcome"], a["tile"]) for a in attempts[1:]) == [  # recorded as each answered
        ("TILE", f"{n}/{tiles}") for n in range(1, tiles + 1)
    ]
    assert attempts[0]["finish_reason"] == "length"
    assert float(page["cost"]) == pytest.approx(sum(float(a["cost"]) for a in attempts))
    assert float(page["cost"]) == pytest.approx(0.00012 * (1 + tiles))
    # And the document's status (GET /documents/{id}) counts the page read in tiles and its tile calls
    record = db.get_document(doc["document_id"])
    assert record is not None
    summary = describe_document(db, record)
    assert (summary.model_calls, summary.pages_tiled, summary.tile_calls) == (1 + tiles, 1, tiles)
    # And the transcript lists each call with its tile
    _, js = pipeline.transcript(doc["document_id"])
    assert sorted(call.get("tile") or "" for call in js["pages"][0]["attempts"]) == [
        "",
        *(f"{n}/{tiles}" for n in range(1, 1 + tiles)),
    ]


def test_tiles_whose_answers_are_truncated_too_fail_the_page_truncated(
    pipeline: Pipeline, db: Database, fake_provider: FakeChatServer, corpus: Path
) -> None:
    # Given a model whose every answer is cut at the output limit
    [doc] = pipeline.upload("uploads/long.png", corpus / "smile.png")["documents"]
    fake_provider.set_default(Truncated("the first half of the pa"))
    # When the queue is drained
    pipeline.run_until_idle()
    # Then the page was read in tiles once (never tiles of tiles) and failed truncated, keeping the stitched text
    [page] = page_rows(db, doc["document_id"])
    assert fake_provider.calls == 4
    assert page["status"] == "FAILED" and "truncated" in page["error"] and page["finish_reason"] == "length"
    assert page["result_text"] == "the first half of the pa"  # the same line read in each tile, kept once


def test_with_tiles_off_a_truncated_page_is_not_read_again(
    pipeline: Pipeline, db: Database, fake_provider: FakeChatServer, corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _configure(monkeypatch, TILES="off")
    [doc] = pipeline.upload("uploads/long.png", corpus / "smile.png")["documents"]
    fake_provider.script(Truncated("the first half of the pa"), Ok("never asked"))
    pipeline.run_until_idle()
    [page] = page_rows(db, doc["document_id"])
    assert fake_provider.calls == 1 and page["status"] == "FAILED" and "truncated" in page["error"]
    assert [a["outcome"] for a in _attempts(db, doc["document_id"])] == ["REJECTED"]


def test_a_born_digital_page_in_small_print_goes_straight_to_tiles(
    pipeline: Pipeline, db: Database, fake_provider: FakeChatServer
) -> None:
    # Given a statistical table set in 6 pt (its words under TILE_MIN_TEXT_PX at the default render)
    source = Path(__file__).resolve().parents[1] / "data" / "documents" / "nics-background-checks-2015-11.pdf"
    [doc] = pipeline.upload("uploads/nics.pdf", source)["documents"]
    # When the queue is drained
    pipeline.run_until_idle()
    # Then its text layer said it was dense before any call: no whole-page call, only its tiles', in the ledger
    settings = get_settings()
    whole = render_page(
        source, DocumentKind.PDF, 1, dpi=settings.render_dpi, max_long_edge=settings.render_max_long_edge
    )
    words = text_layer_words(source, 1, dpi=settings.render_dpi, max_long_edge=settings.render_max_long_edge)
    plan = plan_tiles(
        whole.width, whole.height, text_px=text_height(words), truncated=False, limits=TileLimits.of(settings)
    )
    assert plan is not None and plan.zoom > 1
    assert fake_provider.calls == len(plan.bands) and all(
        Image.open(io.BytesIO(image)).size[0] > whole.width for image in fake_provider.images()
    )
    attempts = _attempts(db, doc["document_id"])
    assert sorted((a["outcome"], a["tile"]) for a in attempts) == [  # recorded as each answered
        ("TILE", f"{n}/{len(plan.bands)}") for n in range(1, len(plan.bands) + 1)
    ]
    [page] = page_rows(db, doc["document_id"])
    assert page["status"] == "COMPLETED" and len(page["result_text"].split("\n")) == len(plan.bands)
