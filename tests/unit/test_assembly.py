"""Transcript assembly: running headers and footers are found across a document's pages and marked.

The pages are the text layers of real documents nobody here wrote (a US government form, LaTeX documents), as a
model or the offline engine would return them, page by page.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pagescribe.assembly import render_markdown, running_furniture, transcript_json
from pagescribe.domain import DocumentRecord, DocumentStatus, JobStatus, PageCorrection, PageRecord
from pagescribe.sources.textlayer import extract_text_layer

from tests.support import CORPUS

DOCUMENTS = Path(__file__).resolve().parents[1] / "data" / "documents"
FORM = DOCUMENTS / "form_dd0293.pdf"  # four pages, each headed "CUI (when filled in)"


def pages_of(path: Path, count: int) -> list[PageRecord]:
    return [
        PageRecord(
            page_number=number,
            status=JobStatus.COMPLETED,
            attempts=1,
            text=extract_text_layer(path, number),
            finish_reason="stop",
            error=None,
            prompt_tokens=None,
            completion_tokens=None,
            cost=0.0,
            model="m",
            provider="p",
            provider_request_id=None,
        )
        for number in range(1, count + 1)
    ]


def document(pages: int) -> DocumentRecord:
    return DocumentRecord(
        document_id="doc-1",
        bucket="b",
        object_key="uploads/form.pdf",
        etag="e",
        version_id="",
        size_bytes=1,
        kind="pdf",
        page_count=pages,
        status=DocumentStatus.COMPLETED,
        error=None,
        model="m",
        prompt=None,
        pages_completed=pages,
        pages_failed=0,
        transcript_key=None,
        created_at=datetime.now(UTC),
        finished_at=None,
    )


def test_a_header_on_every_page_of_a_real_form_is_marked_as_a_running_header() -> None:
    # Given the four pages of a form whose first line on each is "CUI (when filled in)"
    pages = pages_of(FORM, 4)

    # When the transcript is assembled
    markdown = render_markdown(document(4), pages)
    data = transcript_json(document(4), DocumentStatus.COMPLETED, pages, [])

    # Then that line is a running header on each page, in the markdown and in the JSON, and the body is untouched
    assert markdown.count("<!-- running header: CUI (when filled in) -->") == 4, markdown
    assert {"kind": "running header", "text": "CUI (when filled in)"} in data["pages"][0]["running"]
    assert "INTIMATE PARTNER VIOLENCE/" in markdown.splitlines()
    assert data["pages"][0]["text"] == pages[0].text  # the page's own text stays as the model gave it


@pytest.mark.parametrize("furniture", ["drop", "keep"])
def test_a_real_forms_running_header_is_dropped_from_the_markdown_or_kept_as_text_and_the_json_keeps_it(
    furniture: str,
) -> None:
    # Given the four pages of the form, each headed "CUI (when filled in)", and a document asking for its furniture
    # dropped, or kept as text
    pages = pages_of(FORM, 4)
    record = document(4)._replace(furniture=furniture)

    # When the transcript is assembled
    markdown = render_markdown(record, pages)
    data = transcript_json(record, DocumentStatus.COMPLETED, pages, [])

    # Then the markdown has no comment for it, and the header four times as text (keep) or not at all (drop)
    assert "running header" not in markdown
    assert markdown.splitlines().count("CUI (when filled in)") == (4 if furniture == "keep" else 0)
    assert "INTIMATE PARTNER VIOLENCE/" in markdown.splitlines() and "\n\n\n" not in markdown
    # And the JSON keeps it on every page, as the running header and a page_header block
    assert data["furniture"] == furniture
    for page in data["pages"]:
        assert {"kind": "running header", "text": "CUI (when filled in)"} in page["running"]
        assert any(b["type"] == "page_header" and "CUI" in b["text"] for b in page["blocks"])


def test_the_offline_engines_furniture_comments_follow_the_documents_choice_too() -> None:
    text = "<!-- running header: ACME Ltd -->\n\nBody text of the page.\n\n<!-- page number: 7 -->"
    pages = [pages_of(FORM, 1)[0]._replace(text=text)]
    assert "<!-- page number: 7 -->" in render_markdown(document(1), pages)
    dropped = render_markdown(document(1)._replace(furniture="drop"), pages)
    assert "ACME" not in dropped and "7" not in dropped.split("-->", 2)[2] and "Body text of the page." in dropped
    kept = render_markdown(document(1)._replace(furniture="keep"), pages).splitlines()
    assert "ACME Ltd" in kept and "7" in kept and not any("running header" in line for line in kept)


def test_a_footer_whose_page_number_changes_is_one_running_footer() -> None:
    # Given pages whose last line is the same but for its page number, above bodies of their own
    bodies = ["Alpha opens here\nand goes on", "Beta starts there\nthen stops", "Gamma comes last\nto end it"]
    texts = [f"{body}\n\nReport 2026 - page {n} of 3" for n, body in enumerate(bodies, start=1)]

    # When the running lines are found
    found = running_furniture(texts)

    # Then the footer is one on every page, and nothing of the body is
    assert found == [{3: "running footer"}] * 3


def test_page_numbers_and_one_off_lines_are_not_running_headers() -> None:
    # Given the text layers of a four-page LaTeX document: body text and a page number at each page's end
    texts = [page.text for page in pages_of(CORPUS / "pdflatex-4-pages.pdf", 4)]

    # When the running lines are found
    found = running_furniture(texts)

    # Then only the page numbers are found, as page numbers
    assert [set(page.values()) for page in found] == [{"page number"}] * 4
    assert all((texts[at] or "").splitlines()[line] == str(at + 1) for at, page in enumerate(found) for line in page)


def test_a_single_page_has_no_running_lines() -> None:
    # Given a document of one page
    # When the running lines are found
    # Then there are none: nothing can recur
    assert running_furniture([extract_text_layer(FORM, 1)]) == [{}]


@pytest.mark.parametrize(
    "key", ["uploads/a-->b.pdf", "uploads/evil--->x.pdf", "uploads/x--!>y.pdf", "uploads/x\n-->.pdf"]
)
def test_a_key_that_would_close_the_documents_comment_stays_inside_it(key: str) -> None:
    # Given a document whose object key holds a comment's end
    record = document(1)._replace(object_key=key)

    # When its markdown is written
    first = render_markdown(record, pages_of(FORM, 1)).splitlines()[0]

    # Then the document's marker is one comment that ends where it should
    assert first.startswith("<!-- pagescribe document doc-1: uploads/") and first.endswith(" -->"), first
    assert first.count("-->") == 1 and "--!>" not in first, first


CORRECTED_AT = datetime(2026, 3, 1, 9, 30, tzinfo=UTC)


def corrected(page: PageRecord, markdown: str, revision: int = 1) -> PageRecord:
    return page._replace(correction=PageCorrection(revision, markdown, CORRECTED_AT))


def test_a_corrected_page_shows_its_correction_and_keeps_the_models_answer() -> None:
    # Given the four pages of the form, page 2 corrected by a person (revision 2) and the others as the model gave them
    pages = pages_of(FORM, 4)
    pages[1] = corrected(pages[1], "# Corrected\n\nThe text a person typed.", revision=2)

    # When the transcript is assembled
    markdown = render_markdown(document(4), pages)
    data = transcript_json(document(4), DocumentStatus.COMPLETED, pages, [])

    # Then the JSON gives page 2 the corrected text, and the model's answer as the correction's original text
    assert data["pages"][1]["text"] == "# Corrected\n\nThe text a person typed."
    assert data["pages"][1]["corrected"] is True
    assert data["pages"][1]["correction"] == {
        "revision": 2,
        "corrected_at": "2026-03-01T09:30:00+00:00",
        "original_text": pages[1].text,
    }
    # And the other pages are the model's, not corrected
    assert [(p["corrected"], p["correction"]) for p in data["pages"][::2]] == [(False, None)] * 2
    assert data["pages"][0]["text"] == pages[0].text
    # And the markdown shows the corrected text under a marker that says so, and not the model's answer of page 2
    page_two = markdown.split("<!-- page 2 of 4")[1].split("<!-- page 3 of 4")[0]
    assert (
        page_two
        == " (p m) corrected (revision 2, 2026-03-01T09:30:00+00:00) -->\n\n# Corrected\n\nThe text a person typed.\n\n"
    )
    assert markdown.count(" corrected (") == 1


def test_a_correction_to_no_text_leaves_the_page_empty_but_marked() -> None:
    # Given a one-page document whose page a person corrected to no text at all
    pages = [corrected(pages_of(FORM, 1)[0], "")]

    # When the transcript is assembled
    markdown = render_markdown(document(1), pages)
    data = transcript_json(document(1), DocumentStatus.COMPLETED, pages, [])

    # Then the page is there, marked corrected, with nothing under its marker; the model's answer is kept in the JSON
    assert markdown.endswith("<!-- page 1 of 1 (p m) corrected (revision 1, 2026-03-01T09:30:00+00:00) -->\n")
    assert data["pages"][0]["text"] == "" and data["pages"][0]["running"] == []
    assert data["pages"][0]["correction"]["original_text"] == pages[0].text


def test_a_page_marker_written_in_a_pages_text_is_shown_as_the_pages_and_splits_nothing() -> None:
    # Given a two-page document whose first page's answer forges the second page's marker and the document's
    pages = pages_of(FORM, 2)
    forged = "<!-- page 2 of 2 (p m) -->\n\nIBAN DE99 ATTACKER\n\n<!--pagescribe document doc-2: x -->"
    pages[0] = pages[0]._replace(text=f"{pages[0].text}\n\n{forged}")
    # When its markdown is written
    markdown = render_markdown(document(2), pages)
    # Then the file holds one document marker and one marker per page, its own; the forged ones are the page's text
    assert re.findall(r"^<!-- page (\d+) of 2", markdown, re.MULTILINE) == ["1", "2"]
    assert len(re.findall(r"<!--\s*pagescribe document", markdown)) == 1
    assert "<!-- in the page's text: page 2 of 2 (p m) -->" in markdown
    assert "<!-- in the page's text:pagescribe document doc-2: x -->" in markdown
    assert markdown.index("IBAN DE99 ATTACKER") < markdown.index("<!-- page 2 of 2 (p m) -->")
