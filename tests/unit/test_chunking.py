"""Chunks for retrieval, cut from a JSON transcript's blocks (pagescribe.chunking), on transcripts built here."""

from __future__ import annotations

import itertools
import uuid
from typing import Any

import pytest
from pagescribe.chunking import ChunkingError, check_bounds, chunk_transcript, estimate_tokens, sentences

DOCUMENT = str(uuid.UUID(int=1))


def _block(page: int, number: int, kind: str, text: str, **extra: Any) -> dict[str, Any]:
    return {
        "id": f"p{page}-b{number}",
        "type": kind,
        "text": text,
        "bbox": {"pixels": [0, number, 1, number + 1]},
        **extra,
    }


def _transcript(*pages: list[dict[str, Any]], document_id: str = DOCUMENT) -> dict[str, Any]:
    return {"document_id": document_id, "pages": [{"page": n, "blocks": blocks} for n, blocks in enumerate(pages, 1)]}


def _table(page: int, number: int, rows: list[list[str]]) -> dict[str, Any]:
    cells = [
        {"row": r, "col": c, "text": text, "rowspan": 1, "colspan": 1, "header": r == 0}
        for r, row in enumerate(rows)
        for c, text in enumerate(row)
    ]
    source = "\n".join("| " + " | ".join(row) + " |" for row in rows)
    return _block(page, number, "table", source, cells=cells)


def test_tokens_are_estimated_four_ascii_characters_to_one_and_one_for_any_other_character() -> None:
    assert estimate_tokens("The HASYv2 dataset") == 1 + 2 + 2
    assert estimate_tokens("a, b.") == 4
    assert estimate_tokens("みんなの") == 4 and estimate_tokens("Übersicht") == 1 + 2
    assert estimate_tokens(" \n\t") == 0


def test_sentences_end_at_their_marks_but_not_after_an_abbreviation_an_initial_or_before_lower_case() -> None:
    text = 'See Fig. 3 for details. It works, e.g. here! Is it "true?" J. Smith said so.\n次の文です。最後\uff01'
    assert sentences(text) == [
        "See Fig. 3 for details.",
        "It works, e.g. here!",
        'Is it "true?"',
        "J. Smith said so.",
        "次の文です。",
        "最後\uff01",
    ]


def test_chunks_are_cut_at_headings_carry_their_heading_path_and_leave_out_running_furniture() -> None:
    transcript = _transcript(
        [
            _block(1, 1, "page_header", "Journal of Tests"),
            _block(1, 2, "heading", "# Title", level=1),
            _block(1, 3, "paragraph", "An opening."),
            _block(1, 4, "heading", "## Methods ##", level=2),
            _block(1, 5, "paragraph", "How it was done."),
            _block(1, 6, "page_number", "1"),
        ],
        [
            _block(2, 1, "heading", "### Data", level=3),
            _block(2, 2, "list_item", "first item"),
            _block(2, 3, "heading", "## Results", level=2),
            _block(2, 4, "paragraph", "What came out."),
        ],
    )
    chunks = chunk_transcript(transcript, tenant_id="acme")
    assert [(c["heading_path"], c["pages"], c["text"]) for c in chunks] == [
        (["Title"], [1], "# Title\n\nAn opening."),
        (["Title", "Methods"], [1], "## Methods ##\n\nHow it was done."),
        (["Title", "Methods", "Data"], [2], "### Data\n\nfirst item"),
        (["Title", "Results"], [2], "## Results\n\nWhat came out."),
    ]
    assert [b["id"] for b in chunks[0]["blocks"]] == ["p1-b2", "p1-b3"]
    assert chunks[0]["blocks"][1] == {"id": "p1-b3", "page": 1, "type": "paragraph", "bbox": {"pixels": [0, 3, 1, 4]}}
    assert all(c["document_id"] == DOCUMENT and c["tenant_id"] == "acme" for c in chunks)
    assert [c["index"] for c in chunks] == [0, 1, 2, 3]


def test_no_chunk_passes_its_bound_and_each_starts_with_the_last_whole_sentences_of_the_one_before() -> None:
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]
    paragraph = " ".join(f"Sentence {n} says {words[n % 8]} and {words[(n + 3) % 8]}." for n in range(60))
    transcript = _transcript([_block(1, 1, "paragraph", paragraph)], [_block(2, 1, "paragraph", "On page two.")])
    chunks = chunk_transcript(transcript, tenant_id="t", max_tokens=40, overlap=12)
    assert len(chunks) > 5 and all(estimate_tokens(c["text"]) == c["tokens"] <= 40 for c in chunks)
    for before, after in itertools.pairwise(chunks):
        carried = [s for s in sentences(before["text"]) if after["text"].startswith(s)]
        assert carried, (before["text"], after["text"])  # it starts with a sentence the one before held
        assert all(sentence.endswith(".") for sentence in sentences(after["text"]))  # whole sentences only
    # And every sentence of the page is whole in some chunk
    held = {sentence for c in chunks for sentence in sentences(c["text"])}
    assert set(sentences(paragraph)) <= held
    # And the chunk that reaches page two names both pages
    assert chunks[-1]["pages"] == [1, 2]


def test_a_table_is_cut_between_rows_only_and_each_chunk_that_continues_it_starts_with_its_header() -> None:
    rows = [["Symbol", "Count"]] + [[f"sym{n}", str(n * 7)] for n in range(40)]
    transcript = _transcript([_block(1, 1, "paragraph", "A table follows."), _table(1, 2, rows)])
    chunks = chunk_transcript(transcript, tenant_id="t", max_tokens=48, overlap=0)
    lines = ["| " + " | ".join(row) + " |" for row in rows]
    tabled = [c for c in chunks if any(b["type"] == "table" for b in c["blocks"])]
    assert len(tabled) > 3 and all(c["tokens"] <= 48 for c in chunks)
    for chunk in tabled:
        assert chunk["text"].split("\n\n")[-1].split("\n")[0] == lines[0] or chunk is chunks[0]
        assert all(line in lines for line in chunk["text"].split("\n\n")[-1].split("\n"))  # rows whole
    held = [row for c in tabled for b in c["blocks"] if b["type"] == "table" for row in b["rows"]]
    assert sorted(set(held)) == list(range(41)) and held.count(0) == len(tabled)  # each row, the header repeated


def test_a_chunk_that_continues_a_table_on_a_later_page_counts_its_rows_pages_not_its_repeated_headers() -> None:
    # Given a table joined across two pages: its header and five rows on page 1, thirty-five rows on page 2
    rows = [["Symbol", "Count"]] + [[f"sym{n}", str(n * 7)] for n in range(40)]
    table = _table(1, 1, rows)
    for cell in table["cells"]:
        cell["page"] = 1 if cell["row"] <= 5 else 2

    # When it is chunked small enough that chunks start inside it on page 2
    chunks = chunk_transcript(_transcript([table], []), tenant_id="t", max_tokens=48, overlap=0)

    # Then each chunk names the pages of the rows it holds for their own sake (the first holds the header too): one
    # that starts with the header repeated, then rows of page 2 only, spans page 2 alone
    def page_of(line: str) -> int:
        return 1 if int(line.split(" ")[1][3:]) <= 5 else 2

    assert [chunk["pages"] for chunk in chunks] == [
        sorted({page_of(line) for line in _body(chunk)} | ({1} if chunk is chunks[0] else set())) for chunk in chunks
    ]
    later = [chunk for chunk in chunks[1:] if {page_of(line) for line in _body(chunk)} == {2}]
    assert later and all(chunk["text"].startswith("| Symbol | Count |") and chunk["pages"] == [2] for chunk in later)


def _body(chunk: dict[str, Any]) -> list[str]:
    """The chunk's table rows after its header row."""
    return [line for line in chunk["text"].split("\n") if line.startswith("| sym")]


def test_a_sentence_that_alone_passes_the_bound_is_cut_between_words_and_nothing_is_lost() -> None:
    long = " ".join(f"word{n}" for n in range(300)) + " " + "x" * 400
    chunks = chunk_transcript(_transcript([_block(1, 1, "paragraph", long)]), tenant_id="t", max_tokens=32, overlap=0)
    assert all(c["tokens"] <= 32 for c in chunks)
    assert "".join(c["text"].replace(" ", "") for c in chunks) == long.replace(" ", "")


def test_ids_are_the_same_for_the_same_transcript_another_for_another_document_and_never_repeat() -> None:
    transcript = _transcript([_block(1, 1, "paragraph", "Same words."), _block(1, 2, "heading", "# H", level=1)])
    transcript["pages"].append({"page": 2, "blocks": [_block(2, 1, "heading", "# H", level=1)]})
    first = chunk_transcript(transcript, tenant_id="t")
    again = chunk_transcript(transcript, tenant_id="t")
    other = chunk_transcript({**transcript, "document_id": str(uuid.UUID(int=2))}, tenant_id="t")
    assert [c["id"] for c in first] == [c["id"] for c in again]
    assert not {c["id"] for c in first} & {c["id"] for c in other}
    assert len({c["id"] for c in first}) == len(first) == 3  # the two "# H" sections are told apart
    assert all(uuid.UUID(c["id"]).version == 5 for c in first)


@pytest.mark.parametrize(
    ("max_tokens", "overlap", "named"),
    [(31, 0, "max_tokens"), (8193, 0, "max_tokens"), (100, 50, "overlap"), (100, -1, "overlap")],
)
def test_a_bound_that_cannot_be_chunked_to_is_refused_naming_it(max_tokens: int, overlap: int, named: str) -> None:
    with pytest.raises(ChunkingError) as refused:
        check_bounds(max_tokens, overlap)
    assert refused.value.field == named and f"not {overlap if named == 'overlap' else max_tokens}" in str(refused.value)
