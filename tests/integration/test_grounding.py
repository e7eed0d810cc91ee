"""Grounded transcripts end to end: every answer's blocks traced to the page (the text layer's words, or a second read
of a scan by the offline engine during the model call), invented and dropped text flagged hard, and the
deadline kept (a page near its deadline goes without its second read and says why)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pagescribe.runtime import shutdown_runtime
from pagescribe.settings import get_settings
from pagescribe.sources.documents import DocumentKind
from pagescribe.sources.pages import render_page
from pagescribe.sources.textlayer import read_text_layer
from pagescribe.store.postgres import Database
from pagescribe_local.stack import sqs_event

from tests.fakes.chat_server import FakeChatServer, Ok
from tests.support.commands import NOT_GROUNDED
from tests.support.database import page_rows
from tests.support.pipeline import Pipeline

pytestmark = pytest.mark.integration

DOCUMENTS = Path(__file__).resolve().parents[1] / "data" / "documents"
INVENTED = "The committee approved an additional budget of forty million dollars for the new facility."


@pytest.fixture
def grounded(pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch) -> Iterator[Pipeline]:
    """The pipeline with the grounding checks at their defaults (the answers here are the pages' own text)."""
    for name in NOT_GROUNDED:
        monkeypatch.delenv(name)
    shutdown_runtime()
    get_settings.cache_clear()
    yield pipeline


def _answers_by_image(fake: FakeChatServer, answers: dict[bytes, str], model: str | None = None) -> None:
    by_digest = {hashlib.sha256(image).hexdigest(): text for image, text in answers.items()}

    def rule(body: dict[str, Any], image: bytes) -> Ok | None:
        if model is not None and body["model"] != model:
            return None
        text = by_digest.get(hashlib.sha256(image).hexdigest())
        return Ok(text=text) if text is not None else None

    fake.route(rule)


def test_a_born_digital_pages_blocks_come_with_boxes_in_pixels_and_points(
    grounded: Pipeline, db: Database, fake_provider: FakeChatServer, corpus: Path
) -> None:
    # Given a 4-page PDF whose pages a model answers with their own text, laid out in reading order
    source = corpus / "pdflatex-4-pages.pdf"
    images = {render_page(source, DocumentKind.PDF, n).data: read_text_layer(source, n).laid_out for n in range(1, 5)}
    _answers_by_image(fake_provider, images)
    # When it is transcribed
    [doc] = grounded.upload("uploads/four.pdf", source)["documents"]
    grounded.run_until_idle()
    # Then every page completed unflagged, grounded to its text layer, nothing unsupported and nothing missed
    _, js = grounded.transcript(doc["document_id"])
    assert [p["status"] for p in js["pages"]] == ["COMPLETED"] * 4
    assert all(p["flags"] == [] for p in js["pages"])
    for page in js["pages"]:
        grounding = page["grounding"]
        assert grounding["source"] == "text_layer" and grounding["grounded"] >= 0.98, grounding
        assert grounding["ungrounded"] == 0 and grounding["missed_text"] < 0.02 and grounding["missed"] == []
        assert (grounding["image"]["width"], grounding["image"]["height"]) == (1109, 1568)
        # And each block of text has its box on the page image, in pixels and in points (1.5 pixels a point at 150
        # dpi, up to the long edge's cap), within the image, its text at the offsets given
        text_blocks = [b for b in page["blocks"] if b["type"] != "figure"]
        assert text_blocks and all(b["grounding"] >= 0.98 for b in text_blocks), text_blocks
        for block in text_blocks:
            x0, y0, x1, y1 = block["bbox"]["pixels"]
            assert 0 <= x0 < x1 <= 1109 and 0 <= y0 < y1 <= 1568, block
            points = block["bbox"]["points"]
            assert points[2] == pytest.approx(x1 * 595.276 / 1109, abs=0.5), block
            assert page["text"][block["start"] : block["end"]] == block["text"]
            assert block["id"].startswith(f"p{page['page']}-b")
    # And blocks read down the page: each next paragraph stands lower than the one before
    tops = [b["bbox"]["pixels"][1] for b in js["pages"][0]["blocks"] if b["type"] == "paragraph"]
    assert tops == sorted(tops)
    # And the grounding is kept with the page
    assert all(row["grounding"]["source"] == "text_layer" for row in page_rows(db, doc["document_id"]))


def test_an_invented_sentence_is_ungrounded_and_the_page_escalates_to_a_faithful_answer(
    grounded: Pipeline, fake_provider: FakeChatServer, corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a model that adds a sentence nowhere on the page, and an escalation model that does not
    monkeypatch.setenv("ESCALATION_MODEL", "test/strong-model")
    get_settings.cache_clear()
    source = corpus / "minimal-document.pdf"
    image = render_page(source, DocumentKind.PDF, 1).data
    faithful = read_text_layer(source, 1).laid_out
    _answers_by_image(fake_provider, {image: f"{faithful}\n\n{INVENTED}"}, model="test/vision-model")
    _answers_by_image(fake_provider, {image: faithful}, model="test/strong-model")
    # When it is transcribed
    [doc] = grounded.upload("uploads/one.pdf", source)["documents"]
    grounded.run_until_idle()
    # Then the first answer was flagged ungrounded (a hard flag) with the invented sentence as its unsupported span,
    # and the page was asked once more and kept the faithful answer
    _, js = grounded.transcript(doc["document_id"])
    [page] = js["pages"]
    first, kept = page["attempts"]
    [flag] = first["flags"]
    assert (first["outcome"], flag["flag"]) == ("ESCALATED", "ungrounded") and flag["value"] > flag["threshold"]
    assert (kept["outcome"], kept["flags"], page["status"], page["text"]) == ("KEPT", [], "COMPLETED", faithful)
    assert page["grounding"]["ungrounded"] == 0


def test_a_dropped_paragraph_is_missed_text_with_its_place_on_the_page(
    grounded: Pipeline, fake_provider: FakeChatServer
) -> None:
    # Given a two-column paper page answered without its longest paragraph (no escalation model)
    source = DOCUMENTS / "hasyv2-paper.pdf"
    paragraphs = read_text_layer(source, 1).laid_out.split("\n\n")
    dropped = max(paragraphs, key=len)
    image = render_page(source, DocumentKind.PDF, 1).data
    _answers_by_image(fake_provider, {image: "\n\n".join(p for p in paragraphs if p != dropped)})
    # When it is transcribed
    [doc] = grounded.upload("uploads/paper.pdf", source.read_bytes())["documents"]
    grounded.run_until_idle()
    # Then the page failed on missed_text, and the missed region is listed with its text and its box
    _, js = grounded.transcript(doc["document_id"])
    page = js["pages"][0]
    assert page["status"] == "FAILED" and [f["flag"] for f in page["flags"]] == ["missed_text"]
    missed = page["grounding"]["missed"]
    assert missed and sum(region["chars"] for region in missed) >= 0.9 * sum(map(str.isalnum, dropped))
    assert all(region["bbox"]["pixels"] and region["bbox"]["points"] for region in missed)


@pytest.mark.offline_ocr
def test_a_scan_is_read_a_second_time_during_its_call_and_its_answer_grounded_to_that_read(
    grounded: Pipeline, fake_provider: FakeChatServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a scanned page (no text layer), which a model answers with the page's true text, and second reads on
    monkeypatch.setenv("SECOND_READ", "always")
    get_settings.cache_clear()
    scan = DOCUMENTS / "phototest.tif"
    truth = scan.with_suffix(".txt").read_text(encoding="utf-8")
    fake_provider.route(lambda body, image: Ok(text=truth))
    # When it is transcribed
    [doc] = grounded.upload("uploads/scan.tif", scan)["documents"]
    grounded.run_until_idle()
    # Then the answer was grounded to the offline engine's read of the same image, taken while the call was in flight
    _, js = grounded.transcript(doc["document_id"])
    [page] = js["pages"]
    assert page["status"] == "COMPLETED" and page["flags"] == []
    assert page["grounding"]["source"] == "second_read" and page["grounding"]["grounded"] >= 0.9, page["grounding"]
    assert all(b["bbox"]["pixels"] and b["bbox"]["points"] is None for b in page["blocks"])  # an image has no points
    # And the read is kept with the call: its lines and their boxes, confidence and CPU time
    [attempt] = page["attempts"]
    read = attempt["second_read"]
    assert read["lines"] and read["confidence"] > 0.8 and read["cpu_seconds"] > 0
    assert any("quick brown dog" in line[0] for line in read["lines"])


@pytest.mark.offline_ocr
def test_a_scan_near_its_deadline_goes_without_its_second_read_and_says_why(
    grounded: Pipeline, fake_provider: FakeChatServer, corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a scan whose model call can just get its time in what is left of the invocation, but not a second read
    monkeypatch.setenv("SECOND_READ", "always")
    get_settings.cache_clear()
    [doc] = grounded.upload("uploads/smile.png", corpus / "smile.png")["documents"]
    messages = grounded.receive_all()
    # When the function is invoked with 9 s left: 4 s for the call after the 5 s kept for writing its result
    response = grounded.invoke_transcribe(sqs_event(messages, grounded.queue_arn), timeout=9)
    # Then the page is done on its call alone, and its call and its grounding say why it had no second read
    assert response["batchItemFailures"] == []
    _, js = grounded.transcript(doc["document_id"])
    [page] = js["pages"]
    assert page["status"] == "COMPLETED"
    [attempt] = page["attempts"]
    assert attempt["second_read"]["skipped"].startswith("only ")
    assert page["grounding"] == {"source": None, "skipped": "no second read: " + attempt["second_read"]["skipped"]}
