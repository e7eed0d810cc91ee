"""The fault-injection set of ``pagescribe eval --faults`` (pagescribe_local.faults), on real pages: the faults are
what they say they are, the answers that are no fault keep every word, and the two checks are run on them as the
pipeline runs them."""

from __future__ import annotations

import functools
from collections import Counter
from pathlib import Path

import pytest
from pagescribe.blocks import BlockType
from pagescribe.blocks.parsing import parse_blocks
from pagescribe.checks import Thresholds, usable_text_layer
from pagescribe.grounding import GroundingSource, PageText
from pagescribe.settings import Settings
from pagescribe.sources.textlayer import read_text_layer, text_layer_words
from pagescribe_local import faults
from pagescribe_local.evaluation import EvalDocument, plan
from pagescribe_local.scoring import words
from pagescribe_local.true_boxes import squashed

from tests.support import CORPUS
from tests.support.pages import pdf_text_layers

DOCUMENTS = Path(__file__).resolve().parents[1] / "data" / "documents"


@functools.cache
def real_page(path: Path, number: int) -> faults.FaultPage:
    """A born-digital page as the fault set takes it: its text layer laid out, and its positioned words."""
    truth = read_text_layer(path, number).laid_out
    return faults.FaultPage(path.name, number, truth, text_layer_words(path, number), path, born_digital=True)


def page_words(page: faults.FaultPage) -> frozenset[str]:
    return frozenset(squashed(word.text) for word in page.evidence.words)


def test_the_invented_sentence_is_a_paragraph_of_its_own_and_is_flagged() -> None:
    # Given a real two-column page (the HASYv2 paper's first) and its true text
    page = real_page(DOCUMENTS / "hasyv2-paper.pdf", 1)
    sentence = faults.INVENTED_SENTENCES[1]
    # When the sentence is put into it
    answer = faults.with_invented_sentence(page.truth, sentence)
    # Then it stands as a paragraph of its own, after the first half of the truth's blocks, and the truth is all there
    blocks = faults.chunks(answer)
    assert blocks.index(sentence) == (len(faults.chunks(page.truth)) + 1) // 2
    assert [block for block in blocks if block != sentence] == faults.chunks(page.truth)
    assert sentence in {block.plain for block in parse_blocks(answer) if block.type is BlockType.PARAGRAPH}
    # And checked as the pipeline checks an answer, it raises ungrounded and nothing else
    checked, _ = faults.check(answer, page.evidence, Thresholds())
    assert checked.flags == ("ungrounded",)


def test_the_dropped_paragraph_is_not_in_the_answer_and_is_flagged() -> None:
    # Given the same page's true text, when its longest paragraph of 25 words or more is dropped
    page = real_page(DOCUMENTS / "hasyv2-paper.pdf", 1)
    answer = faults.without_longest_paragraph(page.truth)
    # Then that paragraph's words are gone and every other paragraph is there
    paragraphs = [block for block in parse_blocks(page.truth) if block.type is BlockType.PARAGRAPH]
    longest = max(paragraphs, key=lambda block: len(block.plain.split()))
    assert len(longest.plain.split()) >= faults.MIN_DROPPED_WORDS
    assert longest.text not in answer
    assert all(block.text in answer for block in paragraphs if block is not longest)
    assert Counter(words(page.truth)) - Counter(words(answer)) == Counter(words(longest.text))
    # And checked, it raises missed_text and nothing else
    checked, _ = faults.check(answer, page.evidence, Thresholds())
    assert checked.flags == ("missed_text",)


def test_the_invented_row_is_one_more_row_of_the_table_with_nothing_from_the_page() -> None:
    # Given a real page with a table of six columns (the Google Docs export's countries)
    page = real_page(CORPUS / "google-doc-document.pdf", 1)
    # When a row is invented in it
    answer = faults.with_invented_row(page.truth, seed=7, page_words=page_words(page))
    # Then the table has one more row of six cells, shaped like the row above it, whose words are on no page
    before, after = (
        next(block for block in parse_blocks(text) if block.type is BlockType.TABLE) for text in (page.truth, answer)
    )
    rows = {cell.row for cell in after.cells}
    assert len(rows) == len({cell.row for cell in before.cells}) + 1
    added = [line for line in answer.splitlines() if line not in page.truth.splitlines()]
    assert len(added) == 1 and added[0].count("|") == 7
    assert not any(len(squashed(word)) >= 4 and squashed(word) in page_words(page) for word in added[0].split())
    # And checked, it raises ungrounded
    checked, _ = faults.check(answer, page.evidence, Thresholds())
    assert checked.flags == ("ungrounded",)


def test_the_reordered_answer_has_the_same_words_and_raises_no_flag() -> None:
    # Given a real two-column page's true text, when its blocks are put in another order
    page = real_page(CORPUS / "multicolumn.pdf", 1)
    answer = faults.reordered(page.truth)
    # Then it has the same words, in another order
    assert Counter(words(answer)) == Counter(words(page.truth))
    assert faults.chunks(answer)[0] != faults.chunks(page.truth)[0]
    # And checked, it raises neither flag, and is grounded as much as the truth
    checked, _ = faults.check(answer, page.evidence, Thresholds())
    clean, _ = faults.check(page.truth, page.evidence, Thresholds())
    assert checked.flags == () and clean.flags == ()
    assert checked.grounded == clean.grounded


def test_a_page_of_one_block_is_reordered_at_its_middle_line() -> None:
    truth = "one two three\nfour five six\nseven eight nine\nten eleven"
    assert faults.reordered(truth) == "seven eight nine\nten eleven\n\none two three\nfour five six"
    with pytest.raises(faults.NotApplicable, match="one line"):
        faults.reordered("one line only")


def test_a_fault_that_a_page_cannot_have_says_why() -> None:
    # Given a slide of a few words, no table and no long paragraph, and a page of one long paragraph
    slide = real_page(DOCUMENTS / "sommerakademie-2016-slides.pdf", 1)
    single = "\n".join(["word " * 10] * 3)
    # Then neither a dropped paragraph nor an invented row can be made of the slide, nor a dropped paragraph of a
    # page that is all one paragraph (its answer would be empty)
    with pytest.raises(faults.NotApplicable, match="no paragraph of 25 words"):
        faults.without_longest_paragraph(slide.truth)
    with pytest.raises(faults.NotApplicable, match="no markdown table"):
        faults.with_invented_row(slide.truth, seed=1, page_words=page_words(slide))
    with pytest.raises(faults.NotApplicable, match="answer would be empty"):
        faults.without_longest_paragraph(single)


def every_page_text() -> list[str]:
    """The text of every page of the corpus and tests/data/documents: text layers and truth files."""
    texts = [path.read_text(encoding="utf-8") for path in DOCUMENTS.glob("*.txt")]
    return texts + [text for _, _, text in pdf_text_layers()]


def test_the_invented_text_is_on_no_page() -> None:
    # Given every page's text, squashed as the alignment compares words
    pages = [squashed(text) for text in every_page_text()]
    assert len(pages) >= 45
    # Then no invented sentence and no row label is on any of them
    for invented in [*faults.INVENTED_SENTENCES, *faults.ROW_LABELS]:
        assert not any(squashed(invented) in page for page in pages), invented


def stub(document: str, number: int) -> faults.FaultPage:
    evidence = PageText(GroundingSource.TEXT_LAYER, (), 100, 100, None)
    return faults.FaultPage(document, number, f"{document} {number}", evidence, Path(document), born_digital=True)


def test_the_neighbour_is_the_next_page_of_the_same_document_or_the_one_before_the_last() -> None:
    pages = [stub("a.pdf", 1), stub("a.pdf", 2), stub("a.pdf", 4), stub("b.pdf", 1)]
    assert [faults.neighbour_of(pages, index) for index in range(4)] == [pages[1], pages[2], pages[1], None]


def test_a_documents_pages_measured_give_each_faults_detection_and_the_false_flags() -> None:
    # Given the four real pages of a born-digital document, when the fault set is measured on them
    pages = [real_page(CORPUS / "pdflatex-4-pages.pdf", number) for number in range(1, 5)]
    run = faults.FaultRun(faults.measure(pages), [], Thresholds())
    summary = run.summary()
    # Then each fault counted is detected on each page, the answers that are no fault are not flagged, and the clean
    # answers are grounded in full with their block boxes where their true boxes are
    assert summary["pages"] == {"born_digital": 4, "scans": 0}
    for fault in (faults.INVENTED_SENTENCE, faults.DROPPED_PARAGRAPH, faults.NEIGHBOUR):
        assert (summary["faults"][fault]["pages"], summary["faults"][fault]["detected"]) == (4, 4), fault
    assert summary["faults"][faults.INVENTED_ROW]["not_counted"] == {"no markdown table": 4}
    assert all(summary["false_flags"][name]["flagged"] == 0 for name in faults.NOT_FAULTS)
    assert summary["grounded"]["born_digital"]["pooled"] == 1.0
    assert summary["box_iou"]["blocks"] == 4 and summary["box_iou"]["median"] >= 0.95
    # And the report says so, target by target
    markdown = faults.markdown(run)
    assert "- a dropped paragraph detected: 100.0 % (4 of 4 pages); target >= 95.0 %: met" in markdown
    assert "an invented table row detected: - (0 of 0 pages); target >= 95.0 %: nothing to measure" in markdown
    assert run.as_json()["sweep"]["ungrounded"][-1]["threshold"] == Thresholds().ungrounded


@pytest.mark.offline_ocr
def test_the_set_takes_born_digital_pages_and_scans_with_a_truth_and_says_what_it_left_out() -> None:
    # Given a born-digital page, a scan with a truth file and an image without one, as eval plans them
    documents: list[EvalDocument] = plan(
        [CORPUS / "minimal-document.pdf", DOCUMENTS / "phototest.tif", CORPUS / "smile.png"]
    )
    # When the fault set is built of them (the scan is read by the offline engine: about a second)
    pages, left_out = faults.build_pages(documents, Settings())
    # Then the born-digital page is held against its text layer, the scan against its second read, which grounds
    # its truth, and the image without a truth is left out, saying why
    assert [(page.document, page.evidence.source) for page in pages] == [
        ("minimal-document.pdf", GroundingSource.TEXT_LAYER),
        ("phototest.tif", GroundingSource.SECOND_READ),
    ]
    assert usable_text_layer(pages[0].truth) and pages[1].truth == (DOCUMENTS / "phototest.txt").read_text().strip()
    assert [(left.document, left.page) for left in left_out] == [("smile.png", 1)]
    assert "no truth file" in left_out[0].why
    checked, _ = faults.check(pages[1].truth, pages[1].evidence, Thresholds())
    assert checked.grounded >= 0.9 and checked.flags == ()
