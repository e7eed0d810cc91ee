"""Every answer checked: cleaning and each flag, on real captured answers and real documents' own text.

Captured answers are verbatim quotations of models' output from public threads (tests/data/answers, sources in its
index.json); the documents are the corpus and tests/data/documents (sources in its SOURCES.md). The negative controls
are real pages' own text: a check that fired on them would fail good pages."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from pagescribe.checks import (
    BLANK_PAGE,
    HARD_FLAGS,
    RETIRED_FLAGS,
    Answer,
    Flag,
    PageEvidence,
    PageFlag,
    Thresholds,
    check_answer,
    clean_answer,
    ground,
    merge_flags,
    refusal_share,
    remove_non_characters,
    repetition,
)
from pagescribe.settings import Settings
from pagescribe.sources.documents import DocumentKind
from pagescribe.sources.pages import render_page
from pagescribe.sources.textlayer import extract_text_layer, read_text_layer, text_layer_words
from pagescribe.transcription.outcomes import thresholds as configured_thresholds
from pagescribe_local.scoring import recall_precision

from tests.support import CORPUS
from tests.support.answers import captured, captured_file, index
from tests.support.pages import DOCUMENTS, pdf_text_layers

DEFAULTS = Thresholds()
BLANK_BELOW = Settings().flag_blank_render_threshold
INKED = PageEvidence(ink=0.05)


def _real_pages() -> list[tuple[str, str]]:
    """(name, text) of every page with a text layer in the corpus and the gathered documents, and the scans' truth."""
    pages = [(f"{path.name}:{number}", text) for path, number, text in pdf_text_layers() if text]
    pages += [(path.name, path.read_text(encoding="utf-8")) for path in sorted(DOCUMENTS.glob("*.txt"))]
    return pages


REAL_PAGES = _real_pages()


def _flags(text: str, evidence: PageEvidence = INKED, **answer: object) -> list[Flag]:
    return [f.flag for f in check_answer(Answer(text, "stop", **answer), evidence, DEFAULTS, max_output_tokens=8192)]  # type: ignore[arg-type]


def test_there_are_real_pages_to_check_against() -> None:
    assert len(REAL_PAGES) >= 40


# --- cleaning ---------------------------------------------------------------------------------------------------------


WRAPPED = {
    # file: (the start of what the page said, the start of the wrapper that must go)
    "wrapped-monkey-notes-qwen2-vl-sure-fenced.md": ("[] CR\n- NAO", "Sure, here is the text"),
    "wrapped-monkey-notes-qwen2-vl-text-in-image-is.md": ("n'éions des espoirs ?", "The text in the image is"),
    "wrapped-ollama-ocr-colab-granite-doc-tags.md": ("Portable Document Format (PDF)", "<doc>"),
}


@pytest.mark.parametrize(("name", "expected"), WRAPPED.items())
def test_wrapper_text_around_a_captured_answer_is_removed(name: str, expected: tuple[str, str]) -> None:
    # Given a real answer wrapped in a preamble, a fence, quotes or a tag
    answer = captured_file(name)
    start, wrapper = expected
    assert answer.startswith(wrapper)
    # When it is cleaned
    cleaned = clean_answer(answer)
    # Then it starts with what the page said, and no fence, tag or quote is left around it
    assert cleaned.startswith(start)
    assert "```" not in cleaned and "<doc>" not in cleaned and not cleaned.endswith(('"', "</doc>"))


def test_every_wrapped_capture_is_checked_or_named_as_a_limit() -> None:
    # A trailing summary paragraph the model added after the page cannot be told from the page's own last paragraph
    assert {entry["file"] for entry in index() if entry["mode"] == "wrapped"} == {
        *WRAPPED,
        "wrapped-ollama-ocr-notebook-invoice.md",
    }
    invoice = captured_file("wrapped-ollama-ocr-notebook-invoice.md")
    assert clean_answer(invoice) == invoice.strip()


def test_a_fence_with_a_remark_after_it_loses_both() -> None:
    # the shape of the captured fence above, with the closing offer that threads describe after it
    answer = "Here is the transcription:\n\n```markdown\n# Title\n\nBody\n```\n\nLet me know if you need more."
    assert clean_answer(answer) == "# Title\n\nBody"


@pytest.mark.parametrize(("name", "text"), REAL_PAGES, ids=[name for name, _ in REAL_PAGES])
def test_cleaning_leaves_a_real_pages_text_as_it_is(name: str, text: str) -> None:
    assert clean_answer(text) == remove_non_characters(text).strip()


def test_a_code_block_that_is_the_page_is_kept() -> None:
    assert clean_answer("```python\nprint('hello')\n```") == "```python\nprint('hello')\n```"


def test_a_closing_remark_alone_may_be_the_pages_own_last_line() -> None:
    letter = "Dear Ms Smith,\n\nThe meeting moves to Friday.\n\nLet me know if you can attend."
    assert clean_answer(letter) == letter


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ("Ex\ufffeisting", "Existing"),  # pdfium's hyphenation mark in a page's whole text
        ("adip\x02iscing elit", "adipiscing elit"),  # and in the text of an area
        ("applica\ufffe\r\ntions", "applications"),
        ("a\ufffftext\x00 with\x07 controls", "atext with controls"),
        ("\U0010fffe\ufdd0keep\tTabs\nand\x0cpages", "keep\tTabs\nand\x0cpages"),
    ],
)
def test_non_characters_and_controls_are_removed(raw: str, clean: str) -> None:
    assert remove_non_characters(raw) == clean


def test_a_real_pages_hyphenation_marks_are_removed_and_the_words_joined() -> None:
    # Given a real two-column document whose hyphenated words pdfium marks (16 on page 1)
    text = extract_text_layer(CORPUS / "multicolumn.pdf", 1)
    # Then the text layer has none of the marks, and the words are whole
    assert "\ufffe" not in text and "\x02" not in text
    assert "adipiscing" in text


def test_the_text_layer_holds_only_the_text_on_the_visible_page() -> None:
    # Given a real Beamer slide whose not-yet-shown bullets are drawn far outside the page
    path = DOCUMENTS / "sommerakademie-2016-slides.pdf"
    # When its text layer is read (what the checks use), and laid out (what --text-layer auto and the blank-render
    # fallback use)
    text = extract_text_layer(path, 1)
    laid_out = read_text_layer(path, 1).laid_out
    # Then it is what the slide shows, without the bullets off the page
    assert text == "Wissenschaftliche Aussage\nDeep Learning ist der Goldstandard für Bilderkennung"
    assert "Was ist" not in text and "Was ist" not in laid_out
    assert all(line in laid_out for line in text.splitlines())


# --- repetition -------------------------------------------------------------------------------------------------------


# Captured repetitions below any threshold that would not also fail real pages (these pass as they are; a loop that
# goes on runs into the output limit and is flagged truncated).
REPETITION_LIMITS = {
    "repetition-mineru-3312-duplicate-paragraph.md",  # the page's last sentence written once more: 2 copies
    "repetition-monkeyocr-210-dosage-loop.md",  # one clause 5 times within a paragraph
    "repetition-qwen-vl-1611-ascii-diagram.md",  # a line of "|" and spaces: as a blank table's rows are
}
LOOPS = [entry["file"] for entry in index() if entry["mode"] == "repetition" and entry["file"] not in REPETITION_LIMITS]


@pytest.mark.parametrize("name", LOOPS)
def test_a_captured_loop_is_flagged_repetition(name: str) -> None:
    # Given a real loop (exact, or lines that drift from copy to copy), cleaned as it would be
    answer = clean_answer(captured_file(name))
    # Then it repeats past the threshold and is flagged
    assert repetition(answer, DEFAULTS.repetition) >= DEFAULTS.repetition
    assert Flag.REPETITION in _flags(answer)


@pytest.mark.parametrize("name", sorted(REPETITION_LIMITS))
def test_a_short_repetition_is_not_flagged(name: str) -> None:
    assert Flag.REPETITION not in _flags(clean_answer(captured_file(name)))


@pytest.mark.parametrize(("name", "text"), REAL_PAGES, ids=[name for name, _ in REAL_PAGES])
def test_a_real_page_is_not_a_loop(name: str, text: str) -> None:
    # Given a real page's own text as the answer: below the threshold even alone, and nothing beyond its text layer
    assert repetition(text, DEFAULTS.repetition) < DEFAULTS.repetition
    assert repetition(text, DEFAULTS.repetition, reference=text) == 0


def test_a_table_of_zeros_is_no_loop_in_html_as_in_markdown_while_a_looping_html_row_is() -> None:
    # Given a table whose rows are mostly zeros, in markdown and in HTML (as the prompt asks for spanning cells and the
    # offline engine writes one), and an answer that writes one HTML row again and again
    rows = [["Alabama", *["0"] * 20], ["Alaska", *["0"] * 20], ["Arizona", "3", *["0"] * 19]] * 5
    markdown = "\n".join("| " + " | ".join(row) + " |" for row in rows)
    html = "<table>\n" + "\n".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    looping = "<table>\n" + "<tr><td>Total of the state</td><td>12</td></tr>" * 40 + "\n</table>"
    # When their repetition is measured / Then the zeros are no loop either way, and the looping row is one
    assert repetition(markdown, DEFAULTS.repetition) < DEFAULTS.repetition
    assert repetition(html + "\n</table>", DEFAULTS.repetition) < DEFAULTS.repetition
    assert repetition(looping, DEFAULTS.repetition) >= DEFAULTS.repetition


def test_a_page_that_repeats_itself_is_not_a_loop_when_its_text_layer_does_too() -> None:
    # Given a real page whose own text repeats a paragraph seven times, answered faithfully
    text = extract_text_layer(CORPUS / "pdflatex-4-pages.pdf", 3)
    doubled = text + "\n" + text
    # Then the answer repeats nothing beyond the page; twice the page would be a loop of 14 copies, 7 beyond it
    assert repetition(text, DEFAULTS.repetition, reference=text) == 0
    assert repetition(doubled, DEFAULTS.repetition) == 14 and repetition(doubled, 8, reference=text) == 7


@pytest.mark.parametrize("answer", captured("clean") + captured("invented"), ids=lambda text: text[:30])
def test_a_captured_answer_that_is_no_loop_or_refusal_raises_no_hard_flag(answer: str) -> None:
    # Good answers with repetitive content (a table's repeated cells, an invoice's repeated labels), and answers that
    # describe the page instead of transcribing it (no check here claims to catch those without a text layer)
    assert not [flag for flag in _flags(clean_answer(answer)) if flag in HARD_FLAGS]


def test_the_flag_carries_the_copies_and_the_threshold() -> None:
    [flag] = check_answer(
        Answer("Total 0.00 USD\n" * 25, "stop"), INKED, Thresholds(repetition=12), max_output_tokens=8192
    )
    assert flag == PageFlag(Flag.REPETITION, 25.0, 12.0) and flag.describe() == "repetition=25 (threshold 12)"


# --- refusal ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("answer", captured("refusal"), ids=lambda text: text[:40])
def test_a_captured_refusal_is_flagged_refusal(answer: str) -> None:
    # Given a real refusal, apology or answer redacted for privacy: most of its words refuse
    assert refusal_share(clean_answer(answer)) >= DEFAULTS.refusal
    assert Flag.REFUSAL in _flags(clean_answer(answer))


@pytest.mark.parametrize(("name", "text"), REAL_PAGES, ids=[name for name, _ in REAL_PAGES])
def test_a_real_page_is_not_a_refusal(name: str, text: str) -> None:
    assert refusal_share(text) < DEFAULTS.refusal


def test_an_apology_the_page_itself_contains_is_not_a_refusal() -> None:
    # Given a page whose own text is an apology (a letter), and an answer that transcribes it
    letter = "I'm sorry, but I can't attend the meeting on Friday."
    # Then with the text layer to compare against it is the document speaking; without, it reads as a refusal
    assert refusal_share(letter, text_layer=f"Dear Sir,\n{letter}\nYours") == 0
    assert refusal_share(letter) == 1.0


# --- empty, blank render ----------------------------------------------------------------------------------------------


def test_no_text_from_a_page_with_ink_is_empty() -> None:
    # Given a real page with ink, answered with the blank-page marker, with nothing, or with markup only
    page = render_page(CORPUS / "pdflatex-4-pages.pdf", DocumentKind.PDF, 1)
    evidence = PageEvidence(ink=page.ink, text_layer=page.text_layer)
    for answer in (BLANK_PAGE, "", "```markdown\n```", "| | |\n|---|---|"):
        # Then each is flagged empty, with the page's ink as the value
        flags = check_answer(Answer(clean_answer(answer), "stop"), evidence, DEFAULTS, max_output_tokens=8192)
        assert flags[0] == PageFlag(Flag.EMPTY, round(page.ink, 6), DEFAULTS.ink)


def test_the_blank_page_marker_for_a_blank_page_is_not_flagged() -> None:
    assert _flags(BLANK_PAGE, PageEvidence(ink=0.0)) == []


def test_a_pdf_whose_font_is_not_embedded_renders_blank_and_says_it_draws_text() -> None:
    # Given a real PDF whose Japanese font is not embedded (this machine, like Lambda, has no CJK fonts)
    page = render_page(DOCUMENTS / "jo.pdf", DocumentKind.PDF, 1, blank_below=BLANK_BELOW)
    # Then its render is blank although it draws text, and its own text layer has the words
    assert page.marked < BLANK_BELOW and page.draws
    assert "みんなのおのおの" in page.text_layer


def test_a_page_that_draws_nothing_is_not_a_blank_render() -> None:
    # Given a page that renders with ink: it is not examined as blank
    page = render_page(CORPUS / "minimal-document.pdf", DocumentKind.PDF, 1, blank_below=BLANK_BELOW)
    assert page.marked > BLANK_BELOW and not page.draws


# --- grounding: invented and dropped text -------------------------------------------------------------------------


def _grounded_flags(answer: str, path: Path, page: int) -> list[PageFlag]:
    """The flags of ``answer`` for a real born-digital page, grounded to the page's own words."""
    words = text_layer_words(path, page)
    evidence = PageEvidence(ink=0.1, text_layer=extract_text_layer(path, page), words=words)
    grounding = ground(answer, words)
    return check_answer(Answer(answer, "stop"), evidence, DEFAULTS, max_output_tokens=8192, grounding=grounding)


def test_the_pages_own_text_in_its_reading_order_raises_no_grounding_flag() -> None:
    # Given a real two-column paper page, answered with its own text laid out (columns one after the other)
    paper = DOCUMENTS / "hasyv2-paper.pdf"
    # Then nothing is unsupported and nothing missed
    assert _grounded_flags(read_text_layer(paper, 1).laid_out, paper, 1) == []


def test_an_answer_that_drops_most_of_the_page_misses_text_and_is_hard() -> None:
    # Given a real page answered with only its first quarter (a dropped region)
    paper = DOCUMENTS / "hasyv2-paper.pdf"
    laid_out = read_text_layer(paper, 1).laid_out
    # When it is checked
    [flag] = _grounded_flags(laid_out[: len(laid_out) // 4], paper, 1)
    # Then about three quarters of the page's text is missed, and the flag is hard
    assert flag.flag is Flag.MISSED_TEXT and 0.6 < flag.value < 0.85 and flag.hard


def test_an_invented_sentence_is_ungrounded_and_hard() -> None:
    # Given a real page answered faithfully, but with a sentence that is nowhere on the page
    page = CORPUS / "pdflatex-4-pages.pdf"
    laid_out = read_text_layer(page, 1).laid_out
    invented = "The committee approved an additional budget of forty million dollars for the new facility."
    paragraphs = laid_out.split("\n\n")
    answer = "\n\n".join([paragraphs[0], invented, *paragraphs[1:]])
    # When it is checked
    [flag] = _grounded_flags(answer, page, 1)
    # Then the invented sentence's share of the answer is measured, over the threshold, and the flag is hard
    share = len("".join(ch for ch in invented if ch.isalnum())) / len("".join(ch for ch in answer if ch.isalnum()))
    assert flag.flag is Flag.UNGROUNDED and flag.value == pytest.approx(share, abs=0.01) and flag.hard


def test_an_invented_sentence_on_a_dense_page_is_ungrounded_as_a_whole_block_under_the_share() -> None:
    # Given the densest real form page answered faithfully, with an invented sentence as a paragraph of its own: a
    # share of its answer under the threshold (measured: 0.0157 of 4,855 letters and digits)
    form = DOCUMENTS / "form_dd0293.pdf"
    laid_out = read_text_layer(form, 3).laid_out
    invented = "All samples were stored at minus twenty degrees and analysed within one week of collection."
    paragraphs = laid_out.split("\n\n")
    middle = len(paragraphs) // 2
    answer = "\n\n".join([*paragraphs[:middle], invented, *paragraphs[middle:]])
    # When it is checked
    [flag] = _grounded_flags(answer, form, 3)
    # Then ungrounded is raised, hard, by the block nothing on the page supports, and says so with its share
    assert flag.flag is Flag.UNGROUNDED and flag.hard and flag.value < DEFAULTS.ungrounded
    assert flag.detail.startswith("a block of 76 letters and digits nothing on the page supports: 'All samples were")
    assert flag.describe().startswith(f"ungrounded={flag.value} (threshold 0.02; a block of 76 letters")
    assert PageFlag.from_dict(flag.as_dict()) == flag
    # And with whole blocks not counted (FLAG_UNGROUNDED_BLOCK_CHARS=0), or counted only from 80 letters, it is not
    words = text_layer_words(form, 3)
    evidence = PageEvidence(ink=0.1, words=words)
    for thresholds in (replace(DEFAULTS, ungrounded_block_chars=0), replace(DEFAULTS, ungrounded_block_chars=80)):
        assert (
            check_answer(
                Answer(answer, "stop"), evidence, thresholds, max_output_tokens=8192, grounding=ground(answer, words)
            )
            == []
        )


def test_a_flag_without_a_detail_is_stored_as_before() -> None:
    flag = PageFlag(Flag.UNGROUNDED, 0.4, 0.02)
    assert flag.as_dict() == {"flag": "ungrounded", "value": 0.4, "threshold": 0.02}
    assert PageFlag.from_dict(flag.as_dict()) == flag and flag.describe() == "ungrounded=0.4 (threshold 0.02)"


def test_word_recall_ignores_order_case_and_markdown() -> None:
    assert recall_precision("The HASYv2 dataset, 2017", "## the **hasyv2** DATASET 2017") == (1.0, 1.0)


# --- the rest ---------------------------------------------------------------------------------------------------------


def test_a_truncated_answer_is_flagged_with_its_tokens_and_the_limit() -> None:
    flags = check_answer(Answer("partial", "length", completion_tokens=4096), INKED, DEFAULTS, max_output_tokens=4096)
    assert flags == [PageFlag(Flag.TRUNCATED, 4096.0, 4096.0)] and flags[0].hard


def test_low_confidence_is_soft_and_only_for_an_engine_that_reports_confidence() -> None:
    assert _flags("Some text here", confidence=0.61) == [Flag.LOW_CONFIDENCE]
    assert _flags("Some text here", confidence=0.95) == [] == _flags("Some text here")


def test_a_rotated_page_is_reported_as_information() -> None:
    [flag] = check_answer(Answer("Text", "stop"), PageEvidence(ink=0.1, rotation=90), DEFAULTS, max_output_tokens=10)
    assert flag == PageFlag(Flag.ROTATED, 90.0, 0.0) and not flag.hard


def test_flags_merge_one_per_name_the_later_value_winning_hard_ones_first() -> None:
    earlier = [PageFlag(Flag.REPETITION, 57, 10), PageFlag(Flag.ROTATED, 90, 0)]
    later = [PageFlag(Flag.ROTATED, 90, 0), PageFlag(Flag.UNGROUNDED, 0.4, 0.02)]
    assert merge_flags(earlier, later) == [earlier[0], later[1], later[0]]


def test_every_flag_is_documented_with_its_hardness() -> None:
    hard = {
        Flag.REPETITION,
        Flag.REFUSAL,
        Flag.EMPTY,
        Flag.BLANK_RENDER,
        Flag.TRUNCATED,
        Flag.UNGROUNDED,
        Flag.MISSED_TEXT,
    }
    assert hard == HARD_FLAGS
    assert PageFlag.from_dict(PageFlag(Flag.REFUSAL, 1.0, 0.5).as_dict()) == PageFlag(Flag.REFUSAL, 1.0, 0.5)
    # And a retired flag is still read in older pages' flags, and is not hard
    old = {"flag": "text_layer_mismatch", "value": 0.4, "threshold": 0.5}
    assert (
        PageFlag.from_dict(old) == PageFlag(Flag.TEXT_LAYER_MISMATCH, 0.4, 0.5)
        and Flag.TEXT_LAYER_MISMATCH in RETIRED_FLAGS
    )


def test_a_single_small_mark_is_counted_on_a_page_whose_ink_is_sampled(tmp_path: Path) -> None:
    from PIL import Image

    # Given a white page with one dark pixel, off the grid of pixels that the ink estimate samples
    path = tmp_path / "dot.png"
    page = Image.new("L", (1000, 1000), 255)
    page.putpixel((1, 1), 0)
    page.save(path)
    # When it is rendered
    rendered = render_page(path, DocumentKind.PNG, 1, image_format="png")
    # Then the mark is counted (the page is counted whole when the sample finds nothing): it is not blank
    assert rendered.marked == pytest.approx(1 / 1_000_000)


@pytest.mark.parametrize("threshold", [3, 5, 8])
def test_the_configured_repetition_threshold_is_the_number_of_copies_that_flags_a_loop(threshold: int) -> None:
    # Given the checks as a stack configured with FLAG_REPETITION_THRESHOLD sets them
    configured = configured_thresholds(Settings(flag_repetition_threshold=threshold))
    sentence = "The committee approved the annual budget for the new research facility."

    def flagged(copies: int) -> bool:
        answer = Answer("# Minutes\n\n" + " ".join([sentence] * copies), "stop")
        return Flag.REPETITION in [f.flag for f in check_answer(answer, INKED, configured, max_output_tokens=8192)]

    # Then an answer with that many copies of a sentence back to back is a loop, and one copy fewer is not
    assert flagged(threshold) and not flagged(threshold - 1)
