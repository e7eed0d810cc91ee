"""PUT /documents/{id}/pages/{n}/correction: a person's text for one page, saved as the page's next revision beside the
model's answer (which is kept), and the transcript files written again to show it. Real API events and handlers,
PostgreSQL, moto, the fake provider."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from datetime import datetime
from http import HTTPStatus
from pathlib import Path
from typing import Any

import pytest
from pagescribe.assembly import TranscriptWriter
from pagescribe.aws import ObjectStore, s3_client
from pagescribe.domain import PageCorrection
from pagescribe.handlers import api as api_app
from pagescribe.runtime import get_runtime, shutdown_runtime
from pagescribe.service import DocumentService, Refused
from pagescribe.settings import get_settings
from pagescribe.store.postgres import Database
from pagescribe.tenancy import create_key
from sqlalchemy import text

from tests.fakes.chat_server import FakeChatServer, Ok
from tests.support.aws_events import LambdaContext, api_event
from tests.support.pipeline import Pipeline

pytestmark = pytest.mark.integration

API_KEY = "test-api-key-0123456789"
CORRECTED = "# Results\n\nThe corrected text of page 2, as the reviewer typed it."


def call(method: str, path: str, body: Any = None, *, key: str = API_KEY, **query: str) -> tuple[int, Any]:
    event = api_event(
        method,
        path,
        headers={"x-api-key": key},
        body=None if body is None or isinstance(body, str) else json.dumps(body),
        query=query or None,
    )
    if isinstance(body, str):
        event["body"] = body
    response = api_app.handler(event, LambdaContext(29))
    try:
        return response["statusCode"], json.loads(response["body"])
    except json.JSONDecodeError:  # a markdown transcript
        return response["statusCode"], response["body"]


def correct(document_id: str, page: int | str, markdown: str, *, key: str = API_KEY) -> tuple[int, Any]:
    return call("PUT", f"/documents/{document_id}/pages/{page}/correction", {"markdown": markdown}, key=key)


@pytest.fixture
def transcribed(pipeline: Pipeline, corpus: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A 4-page PDF transcribed on the stack's model; tenant keys are looked up afresh on every request."""
    monkeypatch.setenv("API_KEY", API_KEY)
    monkeypatch.setenv("API_KEY_CACHE_SECONDS", "0")
    shutdown_runtime()
    get_settings.cache_clear()
    [document] = pipeline.upload("uploads/report.pdf", corpus / "pdflatex-4-pages.pdf")["documents"]
    pipeline.run_until_idle()
    return str(document["document_id"])


def page_record(db: Database, document_id: str, page: int) -> tuple[str, int, list[tuple[str, str]]]:
    """The page's stored model answer, its attempts counter and its calls (outcome, model)."""
    with db.engine.connect() as conn:
        job = conn.execute(
            text("SELECT id, result_text, attempts FROM jobs WHERE document_id = :id AND page_number = :page"),
            {"id": document_id, "page": page},
        ).one()
        calls = conn.execute(
            text("SELECT outcome, model FROM attempts WHERE job_id = :job ORDER BY id"), {"job": job.id}
        ).all()
    return job.result_text, job.attempts, [(row.outcome, row.model) for row in calls]


def revisions(db: Database, document_id: str, page: int) -> list[tuple[int, str]]:
    with db.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT revision, markdown FROM page_corrections WHERE document_id = :id AND page_number = :page "
                "ORDER BY revision"
            ),
            {"id": document_id, "page": page},
        )
        return [(row.revision, row.markdown) for row in rows]


def page_section(markdown: str, page: int, pages: int = 4) -> str:
    """The markdown from page ``page``'s marker up to the next page's marker."""
    after = markdown.split(f"<!-- page {page} of {pages}", 1)[1]
    return f"<!-- page {page} of {pages}" + after.split(f"<!-- page {page + 1} of {pages}", 1)[0]


def test_a_saved_correction_shows_in_both_transcripts_and_the_models_answer_is_kept(
    pipeline: Pipeline, db: Database, transcribed: str
) -> None:
    # Given a finished document, its page 2 answered once by the model
    document_id = transcribed
    answer, counted, calls = page_record(db, document_id, 2)
    assert calls == [("KEPT", "test/vision-model")]
    before = call("GET", f"/documents/{document_id}")[1]
    # When a reviewer saves a correction of page 2
    code, saved = correct(document_id, 2, CORRECTED)
    # Then it is revision 1 of page 2
    assert code == 200, saved
    assert {k: saved[k] for k in ("document_id", "page_number", "revision")} == {
        "document_id": document_id,
        "page_number": 2,
        "revision": 1,
    }
    # And the JSON transcript gives page 2 the corrected text, and the model's answer as its original text
    code, transcript = call("GET", f"/documents/{document_id}/transcript", format="json")
    assert code == 200
    page = transcript["pages"][1]
    assert page["text"] == CORRECTED and page["corrected"] is True
    correction = page["correction"]
    assert (correction["revision"], correction["original_text"]) == (1, answer)
    assert datetime.fromisoformat(correction["corrected_at"]) == datetime.fromisoformat(saved["corrected_at"])
    assert [p["corrected"] for p in transcript["pages"]] == [False, True, False, False]
    # And the markdown shows the corrected text under a marker that says so, instead of the model's answer
    code, markdown = call("GET", f"/documents/{document_id}/transcript")
    assert code == 200
    section = page_section(markdown, 2)
    marker = section.splitlines()[0]
    assert " test/vision-model) corrected (revision 1, " in marker and marker.endswith(" -->"), marker
    assert section.split(" -->\n\n", 1)[1].strip() == CORRECTED
    assert answer not in markdown
    # And the bucket's files are those the API served
    assert pipeline.transcript(document_id) == (markdown, transcript)
    # And the model's answer and the page's attempts are untouched, and the document's status and finish are too
    assert page_record(db, document_id, 2) == (answer, counted, calls)
    after = call("GET", f"/documents/{document_id}")[1]
    assert before["status"] == after["status"] == "COMPLETED"
    assert after["finished_at"] == before["finished_at"]
    # And the status counts one corrected page where it counted none
    assert (before["corrected_pages"], after["corrected_pages"]) == (0, 1)


def test_a_second_correction_is_revision_2_and_wins_and_an_empty_one_is_allowed(
    pipeline: Pipeline, db: Database, transcribed: str
) -> None:
    # Given page 3 corrected once
    document_id = transcribed
    assert correct(document_id, 3, "first try")[1]["revision"] == 1
    # When it is corrected again, to no text at all (the page is blank)
    code, saved = correct(document_id, 3, "")
    # Then that is revision 2, both revisions are kept, and the transcripts show the latest: no text
    assert (code, saved["revision"]) == (200, 2)
    assert revisions(db, document_id, 3) == [(1, "first try"), (2, "")]
    markdown, transcript = pipeline.transcript(document_id)
    assert transcript["pages"][2]["text"] == "" and transcript["pages"][2]["correction"]["revision"] == 2
    section = page_section(markdown, 3)
    assert "corrected (revision 2, " in section and section.rstrip().endswith(" -->")
    assert "first try" not in markdown


def test_a_rerun_after_a_correction_supersedes_it_and_keeps_it_as_history(
    pipeline: Pipeline, db: Database, fake_provider: FakeChatServer, transcribed: str
) -> None:
    # Given pages 1 and 2 corrected
    document_id = transcribed
    assert correct(document_id, 1, "page one, corrected")[0] == 200
    assert correct(document_id, 2, CORRECTED)[0] == 200
    # When page 2 is re-run and the model gives a new answer
    fake_provider.script(Ok(text="The model's second answer for page 2"))
    assert call("POST", f"/documents/{document_id}/pages/2/rerun", {})[0] == 202
    pipeline.run_until_idle()
    # Then page 2 shows the new answer, not corrected, and page 1 keeps its correction
    markdown, transcript = pipeline.transcript(document_id)
    assert transcript["pages"][1]["text"] == "The model's second answer for page 2"
    assert (transcript["pages"][1]["corrected"], transcript["pages"][1]["correction"]) == (False, None)
    assert transcript["pages"][0]["text"] == "page one, corrected" and transcript["pages"][0]["corrected"] is True
    assert CORRECTED not in markdown and "corrected (revision" not in page_section(markdown, 2)
    # And the superseded correction stays in the table as history; only page 1 counts as corrected
    assert revisions(db, document_id, 2) == [(1, CORRECTED)]
    assert call("GET", f"/documents/{document_id}")[1]["corrected_pages"] == 1
    # When page 2 is corrected again, after the new answer
    code, saved = correct(document_id, 2, "corrected after the re-run")
    # Then it is revision 2 and it shows, with the new answer as its original text
    assert (code, saved["revision"]) == (200, 2)
    page = pipeline.transcript(document_id)[1]["pages"][1]
    assert page["text"] == "corrected after the re-run"
    assert page["correction"]["original_text"] == "The model's second answer for page 2"


def test_a_correction_is_refused_clearly_when_it_cannot_be_saved(
    pipeline: Pipeline, db: Database, transcribed: str
) -> None:
    document_id = transcribed
    # A page the document does not have, and a page that is not a page number
    code, body = correct(document_id, 7, "text")
    assert (code, body["message"]) == (404, "the document has no page 7")
    for page in ("x", "0", "-1", "²"):
        code, body = correct(document_id, page, "text")
        assert code == 400 and page in body["message"], (page, body)
    # An unknown document
    code, body = correct("00000000-0000-0000-0000-000000000000", 1, "text")
    assert (code, body["message"]) == (404, "no document with this id")
    # Bodies that are not {"markdown": text}: NUL, too long, extra or missing fields, not a string, not JSON
    path = f"/documents/{document_id}/pages/1/correction"
    for bad in (
        {"markdown": "a\x00b"},
        {"markdown": "x" * 60_001},
        {"markdown": "x", "revision": 9},
        {},
        {"markdown": 12},
        {"markdown": None},
        "not json",
    ):
        code, body = call("PUT", path, bad)
        assert code == 422, (str(bad)[:40], body)
    assert call("PUT", path, {"markdown": "x" * 60_000})[0] == 200
    # A document still transcribing: a page re-run reopens it, and a save names its status
    assert call("POST", f"/documents/{document_id}/pages/3/rerun", {})[0] == 202
    code, body = correct(document_id, 2, "text")
    assert code == 409 and body["message"] == (
        "the document is PROCESSING: only a finished document's pages are corrected"
    )
    # A document awaiting its upload
    _, created = call("POST", "/documents", {"filename": "a.pdf", "content_type": "application/pdf"})
    code, body = correct(created["document_id"], 1, "text")
    assert code == 409 and "AWAITING_UPLOAD" in body["message"]
    # And nothing was saved but the one valid correction
    assert revisions(db, document_id, 1) == [(1, "x" * 60_000)]
    assert revisions(db, document_id, 2) == []


def test_another_tenant_cannot_correct_the_document(pipeline: Pipeline, db: Database, transcribed: str) -> None:
    # Given a document of the operator's tenant, and a key of another tenant
    document_id = transcribed
    _, other_key = create_key(db, "acme")
    # When the other tenant saves a correction of it
    code, body = correct(document_id, 1, "not yours", key=other_key)
    # Then it is a 404, as for an unknown id, and nothing is saved or written
    assert (code, body["message"]) == (404, "no document with this id")
    assert revisions(db, document_id, 1) == []
    assert pipeline.transcript(document_id)[1]["pages"][0]["corrected"] is False


def documents_service(db: Database, objects: ObjectStore) -> DocumentService:
    """The service as the runtime builds it, on ``db`` and writing through ``objects``."""
    runtime = get_runtime()
    writer = TranscriptWriter(runtime.settings, db, objects)
    return DocumentService(runtime.settings, db, objects, runtime.queue, writer.rewrite, callbacks_signed=False)


class SaveDuringFirstPut(ObjectStore):
    """The bucket, where another reviewer's save lands, whole, while the first transcript file of a rewrite is being
    PUT: the rewrite's files are then older than the database."""

    def __init__(self, other_save: Callable[[], None]) -> None:
        super().__init__(s3_client())
        self._other_save: Callable[[], None] | None = other_save

    def put_text(self, bucket: str, key: str, body: str, *, content_type: str) -> None:
        other_save, self._other_save = self._other_save, None
        if other_save is not None:
            other_save()
        super().put_text(bucket, key, body, content_type=content_type)


def test_a_save_that_lands_while_a_rewrite_writes_is_not_hidden_by_it(
    pipeline: Pipeline, db: Database, transcribed: str
) -> None:
    # Given a reviewer whose rewrite, having read revision 1, is writing its files when a second reviewer's save
    # (revision 2, its files written too) lands; the first save holds no lock meanwhile, or the second would wait
    document_id = transcribed
    other = documents_service(db, get_runtime().objects)
    second: list[PageCorrection] = []
    bucket = SaveDuringFirstPut(lambda: second.append(other.correct_page(document_id, 1, "second", "default")))
    first = documents_service(db, bucket).correct_page(document_id, 1, "first", "default")
    # Then the saves are revisions 1 and 2
    assert [answer.revision for answer in (first, *second)] == [1, 2]
    # And the files end showing revision 2: the first rewrite saw the document change and wrote again
    markdown, transcript = pipeline.transcript(document_id)
    assert (transcript["pages"][0]["text"], transcript["pages"][0]["correction"]["revision"]) == ("second", 2)
    assert "corrected (revision 2, " in page_section(markdown, 1) and "first" not in page_section(markdown, 1)


def test_concurrent_saves_get_distinct_revisions_and_the_files_show_the_highest(
    pipeline: Pipeline, db: Database, transcribed: str
) -> None:
    # Given the service as the API builds it, on a pool wide enough for every save to run at once
    document_id = transcribed
    service = documents_service(db, get_runtime().objects)
    savers = 8
    barrier = threading.Barrier(savers)
    answers: dict[int, PageCorrection] = {}

    def save(n: int) -> None:
        barrier.wait()
        answers[n] = service.correct_page(document_id, 4, f"text of saver {n}", "default")

    # When eight reviewers save a correction of page 4 at the same moment
    threads = [threading.Thread(target=save, args=(n,)) for n in range(savers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    # Then each got its own revision, 1 to 8, and all eight are stored
    by_revision = {correction.revision: n for n, correction in answers.items()}
    assert sorted(by_revision) == list(range(1, savers + 1))
    assert [revision for revision, _ in revisions(db, document_id, 4)] == list(range(1, savers + 1))
    # And both files show revision 8, the text its saver sent
    markdown, transcript = pipeline.transcript(document_id)
    page = transcript["pages"][3]
    assert (page["correction"]["revision"], page["text"]) == (savers, f"text of saver {by_revision[savers]}")
    assert f"corrected (revision {savers}, " in page_section(markdown, 4)
    assert markdown.rstrip().endswith(f"text of saver {by_revision[savers]}")


def test_a_page_takes_at_most_max_page_revisions_corrections_even_when_saved_at_once(
    pipeline: Pipeline, db: Database, transcribed: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a stack allowing 3 corrections per page, and page 2 corrected twice
    document_id = transcribed
    monkeypatch.setenv("MAX_PAGE_REVISIONS", "3")
    shutdown_runtime()
    get_settings.cache_clear()
    for n in range(2):
        assert call("PUT", f"/documents/{document_id}/pages/2/correction", {"markdown": f"pass {n}"})[0] == 200
    service = documents_service(db, get_runtime().objects)
    barrier = threading.Barrier(4)
    outcomes: list[str] = []

    def save(n: int) -> None:
        barrier.wait()
        try:
            service.correct_page(document_id, 2, f"at once {n}", "default")
            outcomes.append("saved")
        except Refused as refused:
            outcomes.append("limit" if refused.code is HTTPStatus.TOO_MANY_REQUESTS else "refused")

    # When four reviewers save a correction of it at the same moment
    threads = [threading.Thread(target=save, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # Then one more is saved and the other three are refused: the page has 3 revisions, no more
    assert sorted(outcomes) == ["limit", "limit", "limit", "saved"]
    assert [revision for revision, _ in revisions(db, document_id, 2)] == [1, 2, 3]
    # And over the API a fourth is a 429 naming the limit, while another page still takes its own
    code, body = call("PUT", f"/documents/{document_id}/pages/2/correction", {"markdown": "one more"})
    assert code == 429 and body["message"] == "page 2 has 3 corrections; the limit is MAX_PAGE_REVISIONS=3"
    assert call("PUT", f"/documents/{document_id}/pages/3/correction", {"markdown": "page three"})[0] == 200
