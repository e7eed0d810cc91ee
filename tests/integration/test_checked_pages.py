"""Every answer checked, hard-flagged pages escalated once, every paid call counted: through the real handlers, moto,
PostgreSQL and the fake chat-completions server answering some pages with real captured loops and refusals."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pagescribe.checks import clean_answer
from pagescribe.handlers import api as api_app
from pagescribe.runtime import shutdown_runtime
from pagescribe.settings import get_settings
from pagescribe.sources.documents import DocumentKind
from pagescribe.sources.pages import render_page
from pagescribe.sources.textlayer import extract_text_layer, read_text_layer
from pagescribe.store.postgres import Database

from tests.fakes.chat_server import PROMPT_TOKENS, Behaviour, FakeChatServer, Ok
from tests.support.answers import captured
from tests.support.aws_events import LambdaContext, api_event, sqs_event, sqs_record_for_body
from tests.support.commands import NOT_GROUNDED
from tests.support.database import page_rows
from tests.support.pages import drawn_row_by_row
from tests.support.pipeline import Pipeline

pytestmark = pytest.mark.integration

PRIMARY = "test/vision-model"  # the pipeline fixture's MODEL
STRONG = "test/strong-model"
COST = 0.00012  # what the fake charges per answer
LOOP = captured("repetition")[0]
REFUSAL = captured("refusal")[0]


@pytest.fixture(autouse=True)
def _answers_come_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """The answers here come whole, as from an endpoint that does not stream: checked once they are in, the loops
    paid in full. Streamed, a loop is cut as it comes: tests/integration/test_loops_cut.py."""
    monkeypatch.setenv("PROVIDER_STREAM", "off")


def _digest(image: bytes) -> str:
    return hashlib.sha256(image).hexdigest()


def _page_images(path: Path, pages: int) -> dict[str, int]:
    """The digest of each page image the pipeline sends, by page."""
    settings = get_settings()
    return {
        _digest(
            render_page(
                path,
                DocumentKind.PDF,
                n,
                dpi=settings.render_dpi,
                max_long_edge=settings.render_max_long_edge,
                image_format=settings.render_format,
            ).data
        ): n
        for n in range(1, pages + 1)
    }


def _image_of(body: dict[str, Any]) -> bytes:
    url = next(part["image_url"]["url"] for part in body["messages"][0]["content"] if part.get("type") == "image_url")
    return base64.b64decode(url.partition(",")[2])


def _calls(fake: FakeChatServer, pages: dict[str, int]) -> Counter[tuple[str, int]]:
    """Model calls by (model, page)."""
    return Counter((body["model"], pages[_digest(_image_of(body))]) for body in fake.requests)


@pytest.fixture
def grounded(pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch) -> Pipeline:
    """The pipeline with the grounding checks at their defaults: the good answers here are the pages' own text."""
    for name in NOT_GROUNDED:
        monkeypatch.delenv(name)
    shutdown_runtime()
    get_settings.cache_clear()
    return pipeline


def _weak_answers_on_pages_2_and_3(fake: FakeChatServer, path: Path, pages: dict[str, int]) -> None:
    """The primary model loops on page 2 and refuses page 3; every other answer is the page's own text, as a good
    model would give it."""
    words = {n: extract_text_layer(path, n) for n in pages.values()}

    def rule(body: dict[str, Any], image: bytes) -> Ok:
        page = pages[_digest(image)]
        if body["model"] == PRIMARY and page in (2, 3):
            return Ok(text=LOOP if page == 2 else REFUSAL)
        return Ok(text=words[page])

    fake.route(rule)


def _status(document_id: str) -> dict[str, Any]:
    response = api_app.handler(api_event("GET", f"/documents/{document_id}"), LambdaContext(29))
    assert response["statusCode"] == 200, response
    return dict(json.loads(response["body"]))


def _configure(monkeypatch: pytest.MonkeyPatch, **env: str) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    shutdown_runtime()
    get_settings.cache_clear()


def _escalating_with_weak_pages(monkeypatch: pytest.MonkeyPatch, fake: FakeChatServer, path: Path) -> dict[str, int]:
    """ESCALATION_MODEL set, and the fake's weak answers on pages 2 and 3 of ``path``: the pages by image digest."""
    _configure(monkeypatch, ESCALATION_MODEL=STRONG)
    pages = _page_images(path, 4)
    _weak_answers_on_pages_2_and_3(fake, path, pages)
    return pages


@pytest.fixture
def four_pages(corpus: Path) -> Path:
    return corpus / "pdflatex-4-pages.pdf"


def test_hard_flagged_pages_are_escalated_once_and_keep_the_escalation_models_answer(
    grounded: Pipeline,
    db: Database,
    fake_provider: FakeChatServer,
    four_pages: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pipeline = grounded
    # Given an escalation model, and a primary model that loops on page 2 and refuses page 3
    pages = _escalating_with_weak_pages(monkeypatch, fake_provider, four_pages)
    [doc] = pipeline.upload("uploads/four.pdf", four_pages)["documents"]
    # When the queue is drained
    pipeline.run_until_idle()
    # Then pages 2 and 3 were asked once more, on the escalation model, and nothing else was
    assert _calls(fake_provider, pages) == Counter(
        {(PRIMARY, 1): 1, (PRIMARY, 2): 1, (PRIMARY, 3): 1, (PRIMARY, 4): 1, (STRONG, 2): 1, (STRONG, 3): 1}
    )
    # And the kept answers of those pages come from it, and every page completed
    jobs = page_rows(db, doc["document_id"])
    assert [j["status"] for j in jobs] == ["COMPLETED"] * 4
    assert [j["model"] for j in jobs] == [PRIMARY, STRONG, STRONG, PRIMARY]
    assert [j["result_text"] for j in jobs] == [extract_text_layer(four_pages, n) for n in range(1, 5)]
    # And the status counts every paid call in the cost, and lists the flags that sent the pages on
    status = _status(doc["document_id"])
    assert status["model_calls"] == 6 and status["cost"] == pytest.approx(6 * COST)
    assert status["prompt_tokens"] == 6 * PROMPT_TOKENS
    assert status["flagged_pages"] == 2
    assert [(p["page"], p["status"], [f["flag"] for f in p["flags"]]) for p in status["page_flags"]] == [
        (2, "COMPLETED", ["repetition", "ungrounded", "missed_text"]),
        (3, "COMPLETED", ["refusal", "ungrounded", "missed_text"]),
    ]
    # And the JSON names the kept answer's model and lists each attempt with its model, tokens, cost and flags
    markdown, js = pipeline.transcript(doc["document_id"])
    assert js["cost"] == pytest.approx(6 * COST) and js["flagged_pages"] == 2
    page2 = js["pages"][1]
    assert page2["model"] == STRONG and page2["escalated"] is True
    # (the loop's own flags: it repeats, nothing on the page supports it, and it leaves out the page's text)
    assert [(a["model"], a["outcome"], [f["flag"] for f in a["flags"]]) for a in page2["attempts"]] == [
        (PRIMARY, "ESCALATED", ["repetition", "ungrounded", "missed_text"]),
        (STRONG, "KEPT", []),
    ]
    assert all(a["cost"] == pytest.approx(COST) and a["prompt_tokens"] == PROMPT_TOKENS for a in page2["attempts"])
    assert page2["cost"] == pytest.approx(2 * COST)
    repetition = page2["flags"][0]
    assert repetition["flag"] == "repetition" and repetition["value"] >= repetition["threshold"] == 8
    assert [f["flag"] for f in js["pages"][2]["flags"]] == ["refusal", "ungrounded", "missed_text"]
    assert js["pages"][0]["flags"] == [] and js["pages"][0]["attempts"][0]["outcome"] == "KEPT"
    # And the markdown page markers name the flags
    assert f"{STRONG}; escalated) flags: repetition=" in markdown
    assert f"{STRONG}; escalated) flags: refusal=" in markdown


def test_without_an_escalation_model_hard_flagged_pages_fail_with_the_flag_as_reason(
    grounded: Pipeline, db: Database, fake_provider: FakeChatServer, four_pages: Path
) -> None:
    pipeline = grounded
    # Given no escalation model, and a primary model that loops on page 2 and refuses page 3
    pages = _page_images(four_pages, 4)
    _weak_answers_on_pages_2_and_3(fake_provider, four_pages, pages)
    [doc] = pipeline.upload("uploads/four.pdf", four_pages)["documents"]
    # When the queue is drained
    pipeline.run_until_idle()
    # Then each page was asked once, and the two weak pages failed, naming the flag and its value, keeping their text
    assert fake_provider.calls == 4
    jobs = page_rows(db, doc["document_id"])
    assert [j["status"] for j in jobs] == ["COMPLETED", "FAILED", "FAILED", "COMPLETED"]
    assert "repetition=" in jobs[1]["error"] and "(threshold 8)" in jobs[1]["error"]
    assert "refusal=" in jobs[2]["error"] and "(threshold 0.5)" in jobs[2]["error"]
    assert jobs[1]["result_text"] == clean_answer(LOOP) and jobs[2]["result_text"] == clean_answer(REFUSAL)
    # And the document is PARTIAL; its status, JSON and markdown show the flags; every call is in its cost
    status = _status(doc["document_id"])
    assert status["status"] == "PARTIAL" and status["flagged_pages"] == 2
    assert status["cost"] == pytest.approx(4 * COST)
    assert {e["page"] for e in status["page_errors"]} == {2, 3}
    markdown, js = pipeline.transcript(doc["document_id"])
    assert [a["outcome"] for a in js["pages"][1]["attempts"]] == ["REJECTED"]
    assert js["pages"][1]["escalated"] is False
    assert [f["flag"] for f in js["pages"][1]["flags"]] == ["repetition", "ungrounded", "missed_text"]
    assert "<!-- page 2 of 4: FAILED: the answer was not accepted: repetition=" in markdown
    assert "flags: refusal=" in markdown


def test_under_triple_duplicate_delivery_each_page_is_escalated_at_most_once(
    pipeline: Pipeline,
    db: Database,
    fake_provider: FakeChatServer,
    four_pages: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given an escalation model, weak answers on pages 2 and 3, and every message delivered to three environments
    pages = _escalating_with_weak_pages(monkeypatch, fake_provider, four_pages)
    [doc] = pipeline.upload("uploads/dups.pdf", four_pages)["documents"]
    messages = pipeline.receive_all()
    fake_provider.default_delay = 1.5  # long enough for the three environments to overlap
    event = sqs_event(messages, pipeline.queue_arn)
    # When three execution environments (separate processes) receive the same batch at once
    responses = pipeline.invoke_in_new_environments("transcribe", event, 3)
    assert all(r["batchItemFailures"] == [] for r in responses)
    # And the same messages come again, late
    late = pipeline.invoke_transcribe(
        {"Records": [sqs_record_for_body(m["Body"], pipeline.queue_arn) for m in messages * 3]}
    )
    assert late["batchItemFailures"] == []
    # Then each page was asked once, and pages 2 and 3 were escalated exactly once
    assert _calls(fake_provider, pages) == Counter(
        {(PRIMARY, 1): 1, (PRIMARY, 2): 1, (PRIMARY, 3): 1, (PRIMARY, 4): 1, (STRONG, 2): 1, (STRONG, 3): 1}
    )
    jobs = page_rows(db, doc["document_id"])
    assert [(j["status"], j["escalation"]) for j in jobs] == [
        ("COMPLETED", None),
        ("COMPLETED", "DONE"),
        ("COMPLETED", "DONE"),
        ("COMPLETED", None),
    ]
    assert _status(doc["document_id"])["model_calls"] == 6


def _first_delivery_out_of_time(
    pipeline: Pipeline,
    fake_provider: FakeChatServer,
    monkeypatch: pytest.MonkeyPatch,
    source: Path,
    escalation_answer: Behaviour,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A one-page document whose primary model loops slowly (6 s) and whose escalation model answers as given, first
    delivered to an invocation with 15 s left: too little, after the loop, for the escalation's call. The document and
    that invocation's response."""
    _configure(monkeypatch, ESCALATION_MODEL=STRONG)
    fake_provider.route(lambda body, image: Ok(text=LOOP, delay=6.0) if body["model"] == PRIMARY else escalation_answer)
    [doc] = pipeline.upload("uploads/one.pdf", source)["documents"]
    [message] = pipeline.receive_all()
    _configure(monkeypatch, MIN_CALL_BUDGET_SECONDS="5")
    return doc, pipeline.invoke_transcribe(sqs_event([message], pipeline.queue_arn), timeout=15)


def test_an_escalation_that_cannot_get_its_budget_is_requeued_and_goes_straight_to_the_escalation_model(
    pipeline: Pipeline,
    db: Database,
    fake_provider: FakeChatServer,
    corpus: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given an escalation model and a primary model that loops slowly on a one-page document
    source = corpus / "minimal-document.pdf"
    pages = _page_images(source, 1)
    # When an invocation with 15 s left (10 s for a call, after the 5 s reserve) spends 6 s on the looping answer,
    # leaving less than the 5 s minimum a call must get
    faithful = Ok(extract_text_layer(source, 1))
    doc, first = _first_delivery_out_of_time(pipeline, fake_provider, monkeypatch, source, faithful)
    # Then the page was not half-called: it is back in the queue, escalated, with the loop's answer kept meanwhile
    assert first["batchItemFailures"] == []
    [job] = page_rows(db, doc["document_id"])
    assert (job["status"], job["escalation"], job["attempts"]) == ("QUEUED", "PENDING", 1)
    assert "only" in job["error"] and STRONG in job["error"]
    assert _calls(fake_provider, pages) == Counter({(PRIMARY, 1): 1})
    # And when the page is delivered again it goes straight to the escalation model, whose answer is kept
    pipeline.run_until_idle()
    assert _calls(fake_provider, pages) == Counter({(PRIMARY, 1): 1, (STRONG, 1): 1})
    [job] = page_rows(db, doc["document_id"])
    assert (job["status"], job["model"], job["escalation"]) == ("COMPLETED", STRONG, "DONE")
    assert [f["flag"] for f in job["flags"]] == ["repetition"]
    assert _status(doc["document_id"])["cost"] == pytest.approx(2 * COST)


def test_a_page_redelivered_to_its_escalation_model_that_answers_badly_too_fails_with_the_flag_and_is_not_paid_again(
    pipeline: Pipeline,
    db: Database,
    fake_provider: FakeChatServer,
    corpus: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a page escalated by a first delivery that had no time left for the escalation call (as above), and an
    # escalation model that loops as well
    source = corpus / "minimal-document.pdf"
    pages = _page_images(source, 1)
    doc, first = _first_delivery_out_of_time(pipeline, fake_provider, monkeypatch, source, Ok(text=LOOP))
    assert first["batchItemFailures"] == []
    [job] = page_rows(db, doc["document_id"])
    assert (job["status"], job["escalation"]) == ("QUEUED", "PENDING")
    # When it is delivered again and the escalation model's answer is a loop too
    pipeline.run_until_idle()
    # Then the page FAILED with the flag, saying the escalation model was asked, after one call to each model: it was
    # not escalated again (a second paid call on every claim, until its attempts ran out)
    assert _calls(fake_provider, pages) == Counter({(PRIMARY, 1): 1, (STRONG, 1): 1})
    [job] = page_rows(db, doc["document_id"])
    assert job["status"] == "FAILED" and [f["flag"] for f in job["flags"]] == ["repetition"]
    assert f"also from the escalation model {STRONG}" in job["error"]


@pytest.mark.parametrize(("text_layer", "status"), [("fallback", "COMPLETED"), ("off", "FAILED")])
def test_a_page_that_renders_blank_is_not_sent_to_the_model(
    pipeline: Pipeline,
    db: Database,
    fake_provider: FakeChatServer,
    monkeypatch: pytest.MonkeyPatch,
    text_layer: str,
    status: str,
) -> None:
    # Given a real PDF whose Japanese font is not embedded: it renders blank here, as in Lambda (no CJK fonts)
    _configure(monkeypatch, TEXT_LAYER=text_layer)
    source = Path(__file__).resolve().parents[1] / "data" / "documents" / "jo.pdf"
    [doc] = pipeline.upload("uploads/jo.pdf", source)["documents"]
    # When the queue is drained
    pipeline.run_until_idle()
    # Then no model was asked to read a blank image, and the page is flagged blank_render
    assert fake_provider.calls == 0
    [job] = page_rows(db, doc["document_id"])
    assert job["status"] == status and [f["flag"] for f in job["flags"]] == ["blank_render"]
    markdown, js = pipeline.transcript(doc["document_id"])
    assert "flags: blank_render=0 (threshold 1e-05)" in markdown and js["cost"] == 0
    if status == "COMPLETED":  # its own text layer stands in for it
        assert job["provider"] == "pdf-text-layer" and "みんなのおのおの" in job["result_text"]
    else:  # TEXT_LAYER=off: nothing may stand in, and the reason says so
        assert "blank_render=0" in job["error"]
        assert "with TEXT_LAYER=off its text layer may not stand in" in job["error"]


def _jo_cut_to_its_first_lines(lines: int) -> bytes:
    """tests/data/documents/jo.pdf with its page cut to the first ``lines`` text runs of its content stream: the same
    fonts (Ryumin-Light, not embedded), the same placement, a new page and cross-reference table around them."""
    jo = (Path(__file__).resolve().parents[1] / "data" / "documents" / "jo.pdf").read_bytes()
    fonts = {n: re.search(rb"\n%d 0 obj\n(.*?)endobj" % n, jo, re.S) for n in (7, 8, 9)}
    stream = re.search(rb"stream\n(.*?)endstream", jo[jo.index(b"\n11 0 obj") :], re.S)
    assert stream is not None and all(fonts.values())
    text, end = zlib.decompress(stream.group(1)), 0
    for _ in range(lines):
        end = text.index(b"TJ", end) + 2
    content = b"1 0 0 1 72 540 cm " + text[:end] + b" ET"
    objects = {
        1: b"<< /Type /Catalog /Pages 2 0 R >>\n",
        2: b"<< /Type /Pages /Kids [3 0 R] /Count 1 /MediaBox [0 0 792 612] >>\n",
        3: b"<< /Type /Page /Parent 2 0 R /Resources << /Font << /F1 9 0 R >> >> /Contents 4 0 R >>\n",
        4: b"<< /Length %d >>\nstream\n%b\nendstream\n" % (len(content), content),
        **{n: match.group(1) for n, match in fonts.items() if match is not None},
    }
    pdf, offsets = bytearray(b"%PDF-1.3\n"), {}
    for n, body in sorted(objects.items()):
        offsets[n] = len(pdf)
        pdf += b"%d 0 obj\n%bendobj\n" % (n, body)
    xref, size = len(pdf), max(objects) + 1
    pdf += b"xref\n0 %d\n0000000000 65535 f \n" % size
    pdf += b"".join(
        b"%010d 00000 n \n" % offsets[n] if n in offsets else b"0000000000 65535 f \n" for n in range(1, size)
    )
    pdf += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (size, xref)
    return bytes(pdf)


@pytest.mark.parametrize("text_layer", ["fallback", "auto"])
def test_a_page_that_renders_blank_without_a_usable_text_layer_fails_with_no_call(
    pipeline: Pipeline,
    db: Database,
    fake_provider: FakeChatServer,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    text_layer: str,
) -> None:
    # Given jo.pdf cut to its first five lines: they render blank here (no CJK fonts), and its text layer reads one of
    # them, too little to stand for the page
    _configure(monkeypatch, TEXT_LAYER=text_layer)
    cut = tmp_path / "jo-five-lines.pdf"
    cut.write_bytes(_jo_cut_to_its_first_lines(5))
    layer = extract_text_layer(cut, 1)
    assert "あらゆる透明な幽霊の複合体" in layer and len(layer) < 30
    [doc] = pipeline.upload("uploads/jo-five-lines.pdf", cut)["documents"]
    # When the queue is drained
    pipeline.run_until_idle()
    # Then the page failed, flagged blank_render and saying why, with no model call and no text: neither a blank
    # image nor a stray line of its text layer was taken for the page
    assert fake_provider.calls == 0
    [job] = page_rows(db, doc["document_id"])
    assert job["status"] == "FAILED" and [f["flag"] for f in job["flags"]] == ["blank_render"]
    assert "it has no usable text layer, and no model was asked to read a blank image" in job["error"]
    assert job["result_text"] is None
    _, transcript = pipeline.transcript(doc["document_id"])
    assert transcript["status"] == "FAILED" and transcript["cost"] == 0


def test_with_text_layer_auto_a_two_column_page_stands_in_laid_out_column_by_column(
    pipeline: Pipeline,
    db: Database,
    fake_provider: FakeChatServer,
    corpus: Path,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    # Given TEXT_LAYER=auto, and a real two-column page drawn row by row: pdfium's own text interleaves the columns
    _configure(monkeypatch, TEXT_LAYER="auto")
    source = drawn_row_by_row(corpus / "multicolumn.pdf", 1, tmp_path / "rows.pdf")
    [doc] = pipeline.upload("uploads/rows.pdf", source)["documents"]
    # When the queue is drained
    pipeline.run_until_idle()
    # Then no model was asked, and the page's text is its text layer laid out: the left column, then the right one
    assert fake_provider.calls == 0
    [job] = page_rows(db, doc["document_id"])
    assert (job["status"], job["provider"]) == ("COMPLETED", "pdf-text-layer")
    assert job["result_text"] == read_text_layer(source, 1).laid_out != extract_text_layer(source, 1)
    text = " ".join(job["result_text"].split())
    assert text.index("with Lorem Ipsum text.") < text.index("Donec nonummy") < text.index("pellentesque ante.")
