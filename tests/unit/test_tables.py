"""Tables that cross pages (pagescribe.tables), joined by the finish pass in the markdown and the JSON transcript.

The pages here are made for these tests: a parts list that runs over pages as a model would transcribe it, page by
page (the real WARN report is in tests/integration/test_tables.py).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from markdown_it import MarkdownIt
from pagescribe.assembly import render_markdown, transcript_json
from pagescribe.blocks.parsing import parse_blocks
from pagescribe.chunking import chunk_transcript
from pagescribe.domain import DocumentRecord, DocumentStatus, JobStatus, PageRecord
from pagescribe.tables import table_joins

HEADER = "| Part | Qty | Price |\n| --- | --- | --- |"
INTRO = "# Parts list\n\nThe parts ordered this year."


def _rows(first: int, last: int) -> str:
    return "\n".join(f"| part {n} | {n} | {n * 3}.00 |" for n in range(first, last + 1))


def _page(number: int, text: str, grounding: dict[str, Any] | None = None) -> PageRecord:
    return PageRecord(
        number, JobStatus.COMPLETED, 1, text, "stop", None, 10, 5, 0.0, "m", "p", None, grounding=grounding
    )


def _document(pages: int, *, merge_tables: bool = True) -> DocumentRecord:
    return DocumentRecord(
        "00000000-0000-0000-0000-000000000001", "b", "uploads/parts.pdf", "e", "", 1, "pdf", pages,
        DocumentStatus.COMPLETED, None, "m", None, pages, 0, None, datetime.now(UTC), None, merge_tables=merge_tables,
    )  # fmt: skip


def _joins(*texts: str) -> list[tuple[int, str, int, str, bool]]:
    pages = [(number, parse_blocks(text)) for number, text in enumerate(texts, 1)]
    return [(j.head_page, j.head, j.page, j.block, j.header_repeated) for j in table_joins(pages)]


def _tables(markdown: str) -> list[int]:
    """The number of body rows of each table in the markdown, as a CommonMark reader with tables sees it."""
    tokens = MarkdownIt("commonmark").enable("table").parse(markdown)
    counts: list[int] = []
    inside = False
    for token in tokens:
        if token.type == "tbody_open":
            counts.append(0)
            inside = True
        elif token.type == "tbody_close":
            inside = False
        elif token.type == "tr_open" and inside:
            counts[-1] += 1
    return counts


def test_a_table_that_runs_on_repeating_its_header_is_joined_and_the_repeat_dropped() -> None:
    assert _joins(f"{INTRO}\n\n{HEADER}\n{_rows(1, 5)}", f"{HEADER}\n{_rows(6, 9)}\n\nTotal: 9 parts.") == [
        (1, "b3", 2, "b1", True)
    ]


def test_a_page_that_opens_mid_table_joins_with_its_first_row_kept_as_a_row() -> None:
    # (a model writes the first row it sees as the header, as a markdown table must have one)
    second = f"| part 6 | 6 | 18.00 |\n| --- | --- | --- |\n{_rows(7, 9)}"
    assert _joins(f"{HEADER}\n{_rows(1, 5)}", second) == [(1, "b1", 2, "b1", False)]


@pytest.mark.parametrize(
    ("first", "second"),
    [
        # the columns differ
        (f"{HEADER}\n{_rows(1, 3)}", "| Name | Town |\n| --- | --- |\n| Ann | Ely |"),
        # the first page goes on after its table
        (f"{HEADER}\n{_rows(1, 3)}\n\nPrices exclude tax.", f"{HEADER}\n{_rows(4, 6)}"),
        # the next page opens with something else
        (f"{HEADER}\n{_rows(1, 3)}", f"## Suppliers\n\n{HEADER}\n{_rows(4, 6)}"),
        # HTML tables
        ("<table><tr><td>a</td><td>b</td></tr></table>", "<table><tr><td>c</td><td>d</td></tr></table>"),
    ],
)
def test_tables_whose_columns_differ_or_that_do_not_meet_at_the_page_break_stay_apart(first: str, second: str) -> None:
    assert _joins(first, second) == []


def test_a_table_over_three_pages_is_joined_to_where_it_starts_and_furniture_between_is_no_obstacle() -> None:
    pages = [
        f"{INTRO}\n\n{HEADER}\n{_rows(1, 3)}\n\n<!-- page number: 1 -->",
        f"<!-- running header: ACME Ltd -->\n\n{HEADER}\n{_rows(4, 6)}",
        f"{HEADER}\n{_rows(7, 8)}\n\nEnd of list.",
    ]
    assert _joins(*pages) == [(1, "b3", 2, "b2", True), (1, "b3", 3, "b1", True)]


def test_the_markdown_and_the_json_show_one_table_whose_rows_keep_their_pages_and_boxes() -> None:
    # Given a parts list over two pages, the second page's table grounded with a box for each cell
    boxes = {"blocks": {"b1": {"bbox": [0, 0, 90, 60], "cells": [[r, c, [c * 30, r * 10, c * 30 + 20, r * 10 + 8]]
                                                                  for r in range(5) for c in range(3)]}},
             "source": "text_layer", "image": {"points_per_pixel": 0.5, "width": 100, "height": 100},
             "grounding": 1.0, "ungrounded": 0.0, "missed_text": 0.0, "missed": []}  # fmt: skip
    pages = [_page(1, f"{INTRO}\n\n{HEADER}\n{_rows(1, 5)}"), _page(2, f"{HEADER}\n{_rows(6, 9)}\n\nEnd.", boxes)]

    # When the transcript is assembled
    markdown = render_markdown(_document(2), pages)
    transcript = transcript_json(_document(2), DocumentStatus.COMPLETED, pages, [])

    # Then the markdown holds one table of nine rows, and page 2 says where its rows went
    assert _tables(markdown) == [9]
    assert "<!-- table continued from page 1: its rows here are in the table there -->" in markdown
    assert markdown.index("| part 9 | 9 | 27.00 |") < markdown.index("<!-- page 2 of 2")
    # And the JSON's table where it starts holds every row, each cell with its page, page 2's with their boxes
    [head] = [b for b in transcript["pages"][0]["blocks"] if b["type"] == "table"]
    assert head["pages"] == [1, 2] and transcript["tables_joined"] == [{"table": "p1-b3", "pages": [1, 2]}]
    rows = sorted({(cell["row"], cell["page"]) for cell in head["cells"]})
    assert rows == [(0, 1)] + [(n, 1) for n in range(1, 6)] + [(n, 2) for n in range(6, 10)]
    moved = [cell for cell in head["cells"] if cell["page"] == 2]
    assert moved[0]["text"] == "part 6" and moved[0]["bbox"] == {"pixels": [0, 10, 20, 18], "points": [0, 5, 10, 9]}
    assert not any(cell["header"] for cell in moved)
    # And the continuation on page 2 names it, keeping its own page's cells
    [continuation] = [b for b in transcript["pages"][1]["blocks"] if b["type"] == "table"]
    assert continuation["continued_from"] == "p1-b3" and len(continuation["cells"]) == 15
    # And chunks take the table once, each row on its page
    chunks = chunk_transcript(transcript, tenant_id="t", max_tokens=64, overlap=0)
    held = [row for c in chunks for b in c["blocks"] if b["id"] == "p1-b3" for row in b["rows"]]
    assert sorted(set(held)) == list(range(10)) and not any(b["id"] == "p2-b1" for c in chunks for b in c["blocks"])
    assert any(c["pages"] == [1, 2] for c in chunks)


def test_with_merge_tables_off_each_page_keeps_its_own_table() -> None:
    pages = [_page(1, f"{HEADER}\n{_rows(1, 5)}"), _page(2, f"{HEADER}\n{_rows(6, 9)}")]
    document = _document(2, merge_tables=False)
    assert _tables(render_markdown(document, pages)) == [5, 4]
    transcript = transcript_json(document, DocumentStatus.COMPLETED, pages, [])
    assert transcript["tables_joined"] == [] and transcript["merge_tables"] is False
    assert not any("continued_from" in b or "pages" in b for p in transcript["pages"] for b in p["blocks"])
