"""A page's answer parsed into typed blocks: types, offsets into the answer, plain text and its runs, table grids.

The answers are real ones where there are (tests/data/answers: verbatim quotations of models' output, sources in its
index.json; the text layers of real documents; a page laid out as the offline engine lays it out), and short written
ones where a rule needs its own case.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from pagescribe.assembly import running_furniture
from pagescribe.blocks import BLANK_PAGE, Block, BlockType, Cell
from pagescribe.blocks.parsing import parse_blocks
from pagescribe.checks import BLANK_PAGE as CHECKS_BLANK_PAGE
from pagescribe.layout import boxes_to_text
from pagescribe.layout.boxes import FIGURE, Figure, TextBox
from pagescribe.sources.textlayer import extract_text_layer

from tests.support import CORPUS
from tests.support.answers import ANSWERS, captured_file, index

DOCUMENTS = Path(__file__).resolve().parents[1] / "data" / "documents"


def line(text: str, left: float, top: float, *, height: float = 20) -> TextBox:
    """A box as the engine reports a line of text ``height`` pixels tall, about half a height wide per character."""
    return TextBox(text, left=left, top=top, bottom=top + height, right=left + height * len(text) / 2)


def laid_out_page() -> str:
    """A page as the offline engine writes it: a title, body text, bullets, a table, a figure, a page number."""
    boxes = [line("A Title of the Page", 100, 40, height=40)]
    boxes += [line(f"A line of the running text {row}", 100, 120 + 24 * row) for row in range(3)]
    boxes += [line("• first item", 100, 200), line("• second item", 100, 224)]
    rows = [("Name", "Size", "Cost"), ("Alpha", "1", "4"), ("Beta", "2", "5"), ("Gamma", "3", "6")]
    boxes += [
        line(c, left, 320 + 24 * i)
        for i, cells in enumerate(rows)
        for c, left in zip(cells, (100, 300, 500), strict=True)
    ]
    boxes += [line(f"More running text after the table {row}", 100, 700 + 24 * row) for row in range(3)]
    boxes.append(line("- 12 -", 300, 1000))
    return boxes_to_text(boxes, figures=[Figure(left=100, top=500, right=600, bottom=680)])


def types(blocks: list[Block]) -> list[BlockType]:
    return [block.type for block in blocks]


def only(blocks: list[Block], kind: BlockType) -> Block:
    [block] = [block for block in blocks if block.type is kind]
    return block


def assert_well_placed(answer: str, blocks: list[Block]) -> None:
    """Every block is its own stretch of the answer, in order, and every run of its plain text stands verbatim there."""
    assert [block.id for block in blocks] == [f"b{number}" for number in range(1, len(blocks) + 1)]
    for before, after in itertools.pairwise(blocks):
        assert before.end <= after.start, (before, after)
    for block in blocks:
        assert answer[block.start : block.end] == block.text
        assert block.text == block.text.strip(" \t\r\n") and block.text
        previous = (0, block.start)
        for plain_at, answer_at, length in block.runs:
            assert length > 0 and plain_at >= previous[0] and answer_at >= previous[1], block
            assert answer[answer_at : answer_at + length] == block.plain[plain_at : plain_at + length], block
            assert block.start <= answer_at and answer_at + length <= block.end, block
            previous = (plain_at + length, answer_at + length)


ANSWER_FILES = sorted(entry["file"] for entry in index())


def test_every_captured_answer_is_in_the_index() -> None:
    on_disk = sorted(path.name for path in ANSWERS.glob("*.md") if path.name != "README.md")
    assert on_disk == ANSWER_FILES


@pytest.mark.parametrize("name", ANSWER_FILES)
def test_every_block_of_a_real_answer_stands_at_its_offsets_and_its_runs_map_its_plain_text(name: str) -> None:
    # Given a real model answer
    answer = captured_file(name)

    # When it is parsed
    blocks = parse_blocks(answer)

    # Then there are blocks, each the answer's text at its offsets, and each run of plain text is the answer's
    assert blocks
    assert_well_placed(answer, blocks)


def test_a_laid_out_offline_page_is_blocks_of_its_layout() -> None:
    # Given a page laid out as the offline engine lays it out
    answer = laid_out_page()

    # When it is parsed
    blocks = parse_blocks(answer)

    # Then each line of the layout is the block it was written as, at its offsets
    assert_well_placed(answer, blocks)
    assert types(blocks) == [
        BlockType.HEADING,
        BlockType.PARAGRAPH,
        BlockType.LIST_ITEM,
        BlockType.LIST_ITEM,
        BlockType.TABLE,
        BlockType.FIGURE,
        BlockType.CAPTION,  # a short paragraph right after a figure: the rule cannot tell it from a caption
        BlockType.PAGE_NUMBER,
    ]
    assert [block.plain for block in blocks[2:4]] == ["first item", "second item"]
    assert blocks[-1].plain == "- 12 -" and blocks[-1].text == "<!-- page number: - 12 - -->"
    assert blocks[5].text == FIGURE


def test_a_real_invoice_is_headings_paragraphs_and_a_table_with_its_header_row() -> None:
    # Given a real answer for an invoice: headings, lines with hard breaks, a table with an empty row of cells
    answer = captured_file("clean-zerox-readme-invoice.md")

    # When it is parsed
    blocks = parse_blocks(answer)

    # Then the headings have their levels and no markup, the hard breaks are line breaks
    assert [(block.level, block.plain) for block in blocks if block.type is BlockType.HEADING][:3] == [
        (1, "INVOICE # 36258"),
        (2, "Bill To:"),
        (2, "Ship To:"),
    ]
    assert blocks[1].plain == "Date: Mar 06 2012\nShip Mode: First Class\nBalance Due: $50.10"
    # And the table's cells stand in its grid, the first row its header, its plain text the non-empty cells
    table = only(blocks, BlockType.TABLE)
    assert [(cell.row, cell.col, cell.text, cell.header) for cell in table.cells[:5]] == [
        (0, 0, "Item", True),
        (0, 1, "Quantity", True),
        (0, 2, "Rate", True),
        (0, 3, "Amount", True),
        (1, 0, "Global Push Button Manager's Chair, Indigo", False),
    ]
    assert len(table.cells) == 12 and table.cells[-1] == Cell(2, 3, "")
    assert table.plain.splitlines() == [
        "Item Quantity Rate Amount",
        "Global Push Button Manager's Chair, Indigo 1 $48.71 $48.71",
        "Chairs, Furniture, FUR-CH-4421",
    ]


def test_a_real_page_has_a_table_its_caption_a_heading_code_and_a_quote() -> None:
    # Given a real answer for a textbook page: a table, its caption, a numbered heading, code, a quoted footnote
    answer = captured_file("clean-zerox-readme-cs101-azure-gpt-4o-mini.md")

    # When it is parsed
    blocks = parse_blocks(answer)

    # Then each is the block it reads as; the quote's paragraph is a paragraph of its own, without its marker
    assert types(blocks) == [
        BlockType.TABLE,
        BlockType.CAPTION,
        BlockType.HEADING,
        BlockType.PARAGRAPH,
        BlockType.CODE,
        BlockType.PARAGRAPH,
        BlockType.PARAGRAPH,
        BlockType.PARAGRAPH,
    ]
    assert blocks[1].plain == "Table 26.2.: Primitive types in Java"
    assert (blocks[2].level, blocks[2].plain) == (3, "26.3.1. Declaration & Assignment")
    assert blocks[4].plain == "int numUnits;\ndouble costPerUnit;\nchar firstInitial;\nboolean isStudent;"
    assert blocks[-1].text.startswith("> 2 Instance") and blocks[-1].plain.startswith("2 Instance variables")
    assert "`null`" in blocks[-1].text and "`" not in blocks[-1].plain
    assert len(only(blocks, BlockType.TABLE).cells) == 27


def test_nested_list_items_are_blocks_of_their_own_one_level_deeper() -> None:
    # Given a real answer with a list item nested in another, and a bracketed "[Name Redacted]" in both
    answer = captured_file("refusal-ollama-ocr-1-redacted-passport.md")

    # When it is parsed
    blocks = parse_blocks(answer)

    # Then each item is a block of its own words, at its depth, its marker no part of its plain text
    items = [(block.level, block.plain) for block in blocks if block.type is BlockType.LIST_ITEM]
    assert items[:3] == [
        (1, "Name: [Name Redacted]"),
        (2, "Father's Name: [Name Redacted]"),
        (1, "Birth Date: [Date Redacted]"),
    ]
    assert blocks[2].text == "- **Father's Name**: [Name Redacted]"
    # And an item holds its own words, not its nested item's
    assert blocks[1].text == "- **Name**: [Name Redacted]"
    assert BlockType.FIGURE not in types(blocks)


def test_a_loose_item_is_its_paragraphs_and_what_follows_its_nested_list_is_a_paragraph() -> None:
    # Given an ordered list whose first item has two paragraphs, a nested list, then one more paragraph
    answer = (
        "1. First item\n\n   its second paragraph\n\n   - nested\n     - deeper\n\n   after the nested list\n2. Second"
    )

    # When it is parsed
    blocks = parse_blocks(answer)

    # Then the item is its two paragraphs, the nested items are one and two levels deeper
    assert_well_placed(answer, blocks)
    assert [(block.type, block.level, block.plain) for block in blocks] == [
        (BlockType.LIST_ITEM, 1, "First item\nits second paragraph"),
        (BlockType.LIST_ITEM, 2, "nested"),
        (BlockType.LIST_ITEM, 3, "deeper"),
        (BlockType.PARAGRAPH, None, "after the nested list"),
        (BlockType.LIST_ITEM, 1, "Second"),
    ]


def test_an_html_table_with_merged_cells_is_a_grid_of_its_spans() -> None:
    # Given an HTML table whose header cell spans two columns and whose first column has a cell across two rows
    answer = (
        "<table>\n"
        '  <thead><tr><th rowspan="2">Region</th><th colspan="2">Sales &amp; costs</th></tr>\n'
        "  <tr><th>2024</th><th>2025</th></tr></thead>\n"
        '  <tr><td rowspan="2">North</td><td>1</td><td>2</td></tr>\n'
        "  <tr><td>3</td><td>4<br>more</td></tr>\n"
        '  <tr><td colspan="3">Total 10</td></tr>\n'
        "</table>"
    )

    # When it is parsed
    [table] = parse_blocks(answer)

    # Then every cell stands at its grid place, past the places the spans above and before it cover
    assert table.type is BlockType.TABLE and table.text == answer
    assert table.cells == (
        Cell(0, 0, "Region", rowspan=2, header=True),
        Cell(0, 1, "Sales & costs", colspan=2, header=True),
        Cell(1, 1, "2024", header=True),
        Cell(1, 2, "2025", header=True),
        Cell(2, 0, "North", rowspan=2),
        Cell(2, 1, "1"),
        Cell(2, 2, "2"),
        Cell(3, 1, "3"),
        Cell(3, 2, "4 more"),
        Cell(4, 0, "Total 10", colspan=3),
    )
    assert table.plain == "Region Sales & costs\n2024 2025\nNorth 1 2\n3 4 more\nTotal 10"
    # And the decoded entity is in no run, the words around it are
    assert_well_placed(answer, [table])
    covered = "".join(table.plain[at : at + length] for at, _, length in table.runs)
    assert "&" not in covered and "Sales " in covered and " costs" in covered


def test_an_html_table_cut_by_a_blank_line_is_one_table() -> None:
    # Given an HTML table with a blank line between its rows (CommonMark ends an HTML block there)
    answer = "<table>\n<tr><td>a</td><td>b</td></tr>\n\n<tr><td>c</td><td>d</td></tr>\n</table>\n\nAfter."

    # When it is parsed
    blocks = parse_blocks(answer)

    # Then it is one table of both rows, and the paragraph after it is a paragraph
    assert types(blocks) == [BlockType.TABLE, BlockType.PARAGRAPH]
    assert blocks[0].plain == "a b\nc d" and blocks[0].text.endswith("</table>")
    assert [(cell.row, cell.col) for cell in blocks[0].cells] == [(0, 0), (0, 1), (1, 0), (1, 1)]


@pytest.mark.parametrize(
    ("answer", "description"),
    [
        ("[figure]", "figure"),
        ("[Figure: a bar chart of sales by region]", "Figure: a bar chart of sales by region"),
        ("[Image: the company's logo]", "Image: the company's logo"),
        ("[Photo of a bridge over a river]", "Photo of a bridge over a river"),
        (
            "[A diagram showing the pipeline\nfrom upload to transcript]",
            "A diagram showing the pipeline from upload to transcript",
        ),
        ("[Chart]", "Chart"),
        ("[Logo]", "Logo"),
        ("![A map of the site](site.png)", "A map of the site"),
    ],
)
def test_a_bracketed_description_or_an_image_alone_is_a_figure_saying_its_description(
    answer: str, description: str
) -> None:
    # Given a paragraph that only describes a figure, in brackets as the prompt asks, or only shows an image
    # When it is parsed
    [block] = parse_blocks(answer)

    # Then it is a figure whose plain text is the description (the model's words, not the page's)
    assert block.type is BlockType.FIGURE
    assert block.plain == description
    assert_well_placed(answer, [block])


@pytest.mark.parametrize(
    "answer",
    ["[1] Smith et al. A study of tables. 2020.", "[Name Redacted]", "[1] Smith, [2] Jones", "[Redacted] Photo"],
)
def test_a_bracketed_sentence_that_describes_no_figure_is_a_paragraph(answer: str) -> None:
    assert types(parse_blocks(answer)) == [BlockType.PARAGRAPH]


def test_a_reference_list_stays_list_items_and_a_reference_is_no_definition() -> None:
    # Given references numbered in brackets, as items and as lines that read like link reference definitions
    answer = "- [1] Smith et al. 2020.\n- [2] Jones 2021.\n\n[3]: Miller 2019"

    # When it is parsed
    blocks = parse_blocks(answer)

    # Then they are list items and a paragraph: no line of the page vanishes
    assert [(block.type, block.plain) for block in blocks] == [
        (BlockType.LIST_ITEM, "[1] Smith et al. 2020."),
        (BlockType.LIST_ITEM, "[2] Jones 2021."),
        (BlockType.PARAGRAPH, "[3]: Miller 2019"),
    ]


@pytest.mark.parametrize(
    "caption",
    [
        "Figure 3: Sales by region.",
        "Fig. 2. The pipeline.",
        "Table 26.2.: Primitive types in Java",
        "Abbildung 4 Umsatz nach Region",
        "Tabelle IV: Kosten",
        "*Figure 1: emphasised*",
    ],
)
def test_a_paragraph_opening_with_a_figure_or_table_number_is_a_caption(caption: str) -> None:
    assert types(parse_blocks(caption)) == [BlockType.CAPTION]


def test_a_short_paragraph_beside_a_figure_is_its_caption_and_a_long_one_or_a_number_less_one_is_not() -> None:
    # Given a short line before a figure, a short one after it, a long paragraph after that, and a sentence
    # mentioning a table without its number
    answer = "Sales by region\n\n[figure]\n\nSource: annual report\n\n" + "Long text. " * 40 + "\n\nTable shows."

    # When it is parsed
    blocks = parse_blocks(answer)

    # Then the short lines beside the figure are captions; the long paragraph and the sentence are paragraphs
    assert types(blocks) == [
        BlockType.CAPTION,
        BlockType.FIGURE,
        BlockType.CAPTION,
        BlockType.PARAGRAPH,
        BlockType.PARAGRAPH,
    ]


def test_footnote_definitions_are_footnotes_with_their_number() -> None:
    # Given a paragraph with footnote references and the two footnotes' definitions, one over two lines
    answer = "Instance variables[^2] have defaults[^note].\n\n[^2]: For objects, `null`.\n\n[^note]: Named\n    note."

    # When it is parsed
    blocks = parse_blocks(answer)

    # Then the definitions are footnotes in place; a numbered mark is in plain text as the page prints it
    assert types(blocks) == [BlockType.PARAGRAPH, BlockType.FOOTNOTE, BlockType.FOOTNOTE]
    assert [block.plain for block in blocks] == [
        "Instance variables2 have defaults.",
        "2 For objects, null.",
        "Named note.",
    ]
    assert blocks[1].text == "[^2]: For objects, `null`."
    assert_well_placed(answer, blocks)


def test_display_math_is_a_formula_of_its_latex() -> None:
    # Given display math between $$ (on its own lines, and on one), between \[ \], and money in a sentence
    answer = "$$\n\\frac{a}{b} = c\n$$\n\n$$E = mc^2$$\n\n\\[\n\\sum_{i=1}^{n} x_i\n\\]\n\nIt costs $5 and $10."

    # When it is parsed
    blocks = parse_blocks(answer)

    # Then each formula is its LaTeX, as written; the money stays a paragraph's words
    assert [(block.type, block.plain) for block in blocks] == [
        (BlockType.FORMULA, "\\frac{a}{b} = c"),
        (BlockType.FORMULA, "E = mc^2"),
        (BlockType.FORMULA, "\\sum_{i=1}^{n} x_i"),
        (BlockType.PARAGRAPH, "It costs $5 and $10."),
    ]
    assert_well_placed(answer, blocks)
    assert all(sum(length for _, _, length in block.runs) == len(block.plain) for block in blocks)


def test_a_fenced_or_indented_code_block_is_code_of_its_content() -> None:
    # Given a real answer whose page number the model put in a bare fence, after a fenced Java snippet
    answer = captured_file("clean-zerox-assets-cs101.md")

    # When it is parsed
    blocks = parse_blocks(answer)

    # Then the fences are code blocks whose plain text is their content, each line at its place
    code = [block for block in blocks if block.type is BlockType.CODE]
    assert len(code) == 3 and code[1].plain.startswith("2Instance variables")
    assert code[0].plain == "int numUnits;\ndouble costPerUnit;\nchar firstInitial;\nboolean isStudent;"
    assert (code[-1].text, code[-1].plain) == ("```\n391\n```", "391")
    assert all(sum(length for _, _, length in block.runs) == len(block.plain) for block in code)
    # And an indented block, and a fence whose language is also its first line, map their lines exactly
    indented = "Text.\n\n    x = 1\n    y = 2\n\n```python\npython\n```"
    blocks = parse_blocks(indented)
    assert [(block.type, block.plain) for block in blocks[1:]] == [
        (BlockType.CODE, "x = 1\ny = 2"),
        (BlockType.CODE, "python"),
    ]
    assert blocks[2].runs == ((0, indented.rindex("python"), 6),)


def test_a_blank_page_or_an_empty_answer_has_no_blocks() -> None:
    assert BLANK_PAGE == CHECKS_BLANK_PAGE
    assert parse_blocks(BLANK_PAGE) == []
    assert parse_blocks("(blank page)\n") == []
    assert parse_blocks("") == []
    assert parse_blocks(" \n\n") == []


def test_running_furniture_found_across_a_real_forms_pages_types_its_blocks() -> None:
    # Given the text layers of a real four-page form, each headed "CUI (when filled in)" over two lines that run on
    # into the page's first paragraph, and the running headers found across them
    texts = [extract_text_layer(DOCUMENTS / "form_dd0293.pdf", page) for page in range(1, 5)]
    furniture = running_furniture(texts)
    assert furniture[1] == {0: "running header", 1: "running header"}

    # When the second page is parsed with them
    blocks = parse_blocks(texts[1], furniture[1])

    # Then the header's lines are a page header of their own, and the rest of the paragraph is a paragraph
    assert types(blocks) == [BlockType.PAGE_HEADER, BlockType.PARAGRAPH]
    assert blocks[0].text == "\n".join(texts[1].splitlines()[:2])
    assert blocks[1].plain.startswith("PREVIOUS EDITION IS OBSOLETE.")
    assert_well_placed(texts[1], blocks)


def test_a_page_number_at_the_end_of_a_real_pages_last_paragraph_is_a_page_number_of_its_own() -> None:
    # Given the text layers of a real LaTeX document, whose page numbers end their pages' last paragraphs
    texts = [extract_text_layer(CORPUS / "pdflatex-4-pages.pdf", page) for page in range(1, 5)]
    furniture = running_furniture(texts)

    for text, lines in zip(texts, furniture, strict=True):
        # When each page is parsed with its page number
        blocks = parse_blocks(text, lines)

        # Then the number is the page's last block, a page number, and the paragraph before it ends before it
        [(at, kind)] = lines.items()
        assert kind == "page number" and blocks[-1].type is BlockType.PAGE_NUMBER
        assert blocks[-1].plain == text.splitlines()[at].strip()
        assert blocks[-2].type is BlockType.PARAGRAPH and not blocks[-2].plain.endswith(blocks[-1].plain)
        assert_well_placed(text, blocks)


def test_a_block_on_a_furniture_line_takes_its_type_whatever_it_parsed_as() -> None:
    # Given a heading, a list item and a paragraph on lines the mapping names as a header, a footer and a number
    answer = "# ACME Corp\n\nBody text.\n\n- Confidential\n\n7"

    # When it is parsed with the mapping
    blocks = parse_blocks(answer, {0: "running header", 4: "running footer", 6: "page number"})

    # Then those blocks are page furniture, keeping their plain text and no level
    assert [(block.type, block.plain, block.level) for block in blocks] == [
        (BlockType.PAGE_HEADER, "ACME Corp", None),
        (BlockType.PARAGRAPH, "Body text.", None),
        (BlockType.PAGE_FOOTER, "Confidential", None),
        (BlockType.PAGE_NUMBER, "7", None),
    ]
    with pytest.raises(ValueError, match="not a kind of running furniture"):
        parse_blocks(answer, {0: "running title"})


def test_furniture_lines_count_as_splitlines_counts_them() -> None:
    # Given an answer with Windows line breaks and a line separator inside a line (splitlines breaks there too)
    answer = "Intro\u2028words\r\n\r\nBody text.\r\n\r\nFooter line"

    # When it is parsed with the footer's index in answer.splitlines()
    assert answer.splitlines()[5] == "Footer line"
    blocks = parse_blocks(answer, {5: "running footer"})

    # Then the footer is the block on that line, and every block stands at its offsets
    assert types(blocks) == [BlockType.PARAGRAPH, BlockType.PARAGRAPH, BlockType.PAGE_FOOTER]
    assert_well_placed(answer, blocks)


def test_furniture_comments_are_blocks_and_other_comments_are_none() -> None:
    # Given the comments the offline engine and assembly write, another comment, and an HTML block of text
    answer = (
        "<!-- running header: CUI (when filled in) -->\n\n<!-- a note to nobody -->\n\n"
        '<div align="center"><b>Annual</b> report</div>\n\nBody.\n\n<!-- running footer: Page - 2 -->\n\n'
        "<!-- page number: 7 -->"
    )

    # When it is parsed
    blocks = parse_blocks(answer)

    # Then the furniture comments are furniture saying their text, the HTML block a paragraph of its text
    assert [(block.type, block.plain) for block in blocks] == [
        (BlockType.PAGE_HEADER, "CUI (when filled in)"),
        (BlockType.PARAGRAPH, "Annual report"),
        (BlockType.PARAGRAPH, "Body."),
        (BlockType.PAGE_FOOTER, "Page - 2"),
        (BlockType.PAGE_NUMBER, "7"),
    ]
    assert_well_placed(answer, blocks)


def test_escapes_and_entities_are_decoded_in_plain_text_and_left_out_of_runs() -> None:
    # Given the offline engine's escaped hash, an entity, emphasis, a link and inline code
    answer = "\\# not a heading &amp; *more* [a link](https://example.org) and `code`"

    # When it is parsed
    [block] = parse_blocks(answer)

    # Then plain text is what a reader sees; the escaped character maps to itself, the entity to nothing
    assert block.plain == "# not a heading & more a link and code"
    assert_well_placed(answer, [block])
    assert block.runs[0] == (0, 1, 16)
    assert all(not (at <= block.plain.index("&") < at + length) for at, _, length in block.runs)


def test_a_plain_stretch_maps_back_to_the_answer() -> None:
    # Given a paragraph over two lines with emphasis
    answer = "Intro\n\nThe **total** is\ndue now."
    block = parse_blocks(answer)[1]

    # When stretches of its plain text are mapped to the answer
    # Then a stretch inside runs maps exactly; one across markup or a line break covers it
    assert block.plain == "The total is due now."
    assert answer[slice(*block.answer_span(4, 9))] == "total"
    assert answer[slice(*block.answer_span(0, 9))] == "The **total"
    assert answer[slice(*block.answer_span(10, 16))] == "is\ndue"
    assert answer[slice(*block.answer_span(12, 13))] == "\n"  # the soft break's space is the line break
    assert block.answer_span(0, len(block.plain)) == (block.start, block.end)


def test_a_figures_description_maps_back_inside_its_brackets() -> None:
    [block] = parse_blocks("[Figure: a chart]")
    assert block.runs == ((0, 1, 15),)
    assert block.answer_span(0, len(block.plain)) == (1, 16)
