"""Tables across pages in real documents nobody here wrote (tests/data/tables, see SOURCES.md), through the API: the
California WARN report (one table over 16 pages, its header on the first only) and tabula-py's data.pdf (a table of
its own on each page, the columns different)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pagescribe.runtime import shutdown_runtime
from pagescribe.settings import CLEAN_PROMPT, DEFAULT_PROMPT, get_settings

from tests.fakes.chat_server import FakeChatServer
from tests.integration.test_api import API_KEY, call, upload_through_presigned_url
from tests.support.pipeline import Pipeline
from tests.unit.test_tables import _tables

pytestmark = pytest.mark.integration

TABLES = Path(__file__).resolve().parents[1] / "data" / "tables"
WARN = TABLES / "WARN-Report-for-7-1-2015-to-03-25-2016.pdf"


def _transcribed(stack: Pipeline, path: Path, **options: Any) -> tuple[str, dict[str, Any]]:
    body = {"filename": path.name, "content_type": "application/pdf", **options}
    _, created = call("POST", "/documents", body=body)
    upload_through_presigned_url(stack, created, path.read_bytes())
    stack.run_until_idle()
    document_id = created["document_id"]
    code, markdown = call("GET", f"/documents/{document_id}/transcript")
    assert code == 200, markdown
    return markdown, call("GET", f"/documents/{document_id}/transcript", query={"format": "json"})[1]


def test_the_warn_reports_table_over_three_pages_is_one_table_in_the_markdown_and_the_json(
    text_layer_api: Pipeline,
) -> None:
    # Given the report's first three pages as each page's own table (merge_tables off)
    apart, _ = _transcribed(text_layer_api, WARN, pages="1-3", merge_tables=False)
    per_page = _tables(apart)
    assert len(per_page) == 3
    # When they are transcribed with the tables joined (the default)
    markdown, transcript = _transcribed(text_layer_api, WARN, pages="1-3", reuse=False)
    # Then the markdown holds one table with every row: page 1's, and pages 2 and 3's, whose first rows a page read
    # alone takes for a header
    assert _tables(markdown) == [sum(per_page) + 2]
    assert markdown.count("<!-- table continued from page 1: its rows here are in the table there -->") == 2
    # And in the JSON the table where it starts names its pages and holds every row, each with its page
    assert transcript["merge_tables"] is True
    [joined] = transcript["tables_joined"]
    assert joined["pages"] == [1, 2, 3]
    head = next(b for p in transcript["pages"] for b in p["blocks"] if b["id"] == joined["table"])
    pages_of_rows: dict[int, set[int]] = {}
    for cell in head["cells"]:
        pages_of_rows.setdefault(cell["row"], set()).add(cell["page"])
    assert all(len(pages) == 1 for pages in pages_of_rows.values()) and len(pages_of_rows) == sum(per_page) + 3
    on_page = [sum(pages == {n} for pages in pages_of_rows.values()) for n in (1, 2, 3)]
    assert on_page == [per_page[0] + 1, per_page[1] + 1, per_page[2] + 1]  # each page's rows (page 1: the header)
    # And each continuation names the table it continues
    continued = [b for p in transcript["pages"][1:] for b in p["blocks"] if b["type"] == "table"]
    assert [b["continued_from"] for b in continued] == [joined["table"]] * 2


def test_tables_on_consecutive_pages_whose_columns_differ_stay_apart(text_layer_api: Pipeline) -> None:
    # Given tabula-py's data.pdf: mtcars, iris and ToothGrowth, one a page, each with its own header
    path = TABLES / "tabula-data.pdf"
    apart, _ = _transcribed(text_layer_api, path, merge_tables=False)
    # When it is transcribed with tables joined
    markdown, transcript = _transcribed(text_layer_api, path, reuse=False)
    # Then its tables are as many as each page's own, the same, and no join is recorded
    assert _tables(markdown) == _tables(apart) and len(_tables(markdown)) >= 3
    assert "table continued" not in markdown and transcript["tables_joined"] == []


def test_a_document_that_asks_for_its_furniture_dropped_gets_a_markdown_without_it_and_a_json_with_it(
    text_layer_api: Pipeline,
) -> None:
    # Given a real four-page form headed "CUI (when filled in)" on every page, created asking for furniture=drop
    form = TABLES.parent / "documents" / "form_dd0293.pdf"
    markdown, transcript = _transcribed(text_layer_api, form, furniture="drop")
    # Then the markdown does not have the header, as a line or a comment, and the JSON has it on every page
    assert "CUI (when filled in)" not in markdown.splitlines() and "running header" not in markdown
    assert transcript["furniture"] == "drop"
    headed = [page for page in transcript["pages"] if any(r["kind"] == "running header" for r in page["running"])]
    assert len(headed) >= 3  # (the fourth page's laid-out text runs its header into a heading)
    assert all(any(b["type"] == "page_header" and "CUI" in b["text"] for b in page["blocks"]) for page in headed)
    # And a bad choice is refused, naming the field
    code, refused = call("POST", "/documents", body={"filename": "f.pdf", "content_type": "application/pdf",
                                                     "furniture": "hide"})  # fmt: skip
    assert code == 422 and "furniture" in str(refused)


@pytest.mark.parametrize(("options", "furniture"), [({}, "drop"), ({"furniture": "keep"}, "keep")])
def test_the_clean_profile_asks_the_model_for_a_clean_page_and_drops_the_furniture(
    pipeline: Pipeline,
    fake_provider: FakeChatServer,
    monkeypatch: pytest.MonkeyPatch,
    options: dict[str, str],
    furniture: str,
) -> None:
    # Given a scan (no text layer: the model reads it), created with the clean profile
    monkeypatch.setenv("API_KEY", API_KEY)
    shutdown_runtime()
    get_settings.cache_clear()
    body = {"filename": "scan.png", "content_type": "image/png", "profile": "clean", **options}
    _, created = call("POST", "/documents", body=body)
    upload_through_presigned_url(pipeline, created, (TABLES.parent / "corpus" / "smile.png").read_bytes())
    pipeline.run_until_idle()
    # Then the model was asked with the clean prompt, and the document's furniture is dropped unless it said otherwise
    [request] = fake_provider.requests
    said = " ".join(part.get("text", "") for part in request["messages"][0]["content"])
    assert CLEAN_PROMPT in said and DEFAULT_PROMPT not in said
    transcript = call("GET", f"/documents/{created['document_id']}/transcript", query={"format": "json"})[1]
    assert transcript["furniture"] == furniture
