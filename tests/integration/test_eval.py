"""``pagescribe eval`` as a user runs it: a real subprocess, PostgreSQL, and the fake provider answering chosen pages
with chosen text, so that what the scores must be is known."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from pagescribe.sources.documents import DocumentKind
from pagescribe.sources.pages import render_page
from pagescribe.sources.textlayer import extract_text_layer, read_text_layer

from tests.fakes.chat_server import FakeChatServer, Ok
from tests.support.commands import command_environment, pagescribe

pytestmark = pytest.mark.integration


def _eval(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return pagescribe("eval", *args, env=env, cwd=cwd)


def _answer_pages_with(fake: FakeChatServer, path: Path, kind: DocumentKind, answers: dict[int, str]) -> None:
    """The fake answers the image of page n of ``path`` with ``answers[n]``."""
    by_image = {hashlib.sha256(render_page(path, kind, n).data).hexdigest(): text for n, text in answers.items()}
    fake.route(
        lambda body, image: (
            Ok(text=by_image[digest]) if (digest := hashlib.sha256(image).hexdigest()) in by_image else None
        )
    )


def _damaged(text: str) -> str:
    """Every third word dropped and two letters swapped in every other one."""
    words = text.split()
    kept = [w[1] + w[0] + w[2:] if i % 2 and len(w) > 2 else w for i, w in enumerate(words) if i % 3]
    return " ".join(kept)


def test_a_pdfs_own_text_layer_scored_against_itself_is_cer_zero_and_a_damaged_answer_scores_worse(
    database_url: str, fake_provider: FakeChatServer, corpus: Path, tmp_path: Path
) -> None:
    # Given two copies of a born-digital PDF with no truth file: its text layer is the truth
    exact, damaged = tmp_path / "exact.pdf", tmp_path / "damaged.pdf"
    shutil.copy(corpus / "pdflatex-4-pages.pdf", exact)
    shutil.copy(corpus / "pdflatex-4-pages.pdf", damaged)
    layers = {n: extract_text_layer(exact, n) for n in range(1, 5)}
    # And a model that answers every page with exactly its text
    _answer_pages_with(fake_provider, exact, DocumentKind.PDF, layers)
    # When the user runs pagescribe eval on the first, with JSON out
    result = _eval(
        str(exact), "--json", "exact.json", env=command_environment(database_url, fake_provider), cwd=tmp_path
    )
    # Then it prints the table and every page scores CER 0, WER 0, recall and precision 1, with no flags
    assert result.returncode == 0, result.stderr
    assert "| CER median / mean / worst | 0.000 / 0.000 / 0.000 |" in result.stdout
    report: dict[str, Any] = json.loads((tmp_path / "exact.json").read_text())
    assert [(p["page"], p["truth_source"], p["cer"], p["wer"]) for p in report["pages"]] == [
        (n, "text layer", 0.0, 0.0) for n in range(1, 5)
    ]
    assert all(p["recall"] == 1.0 and p["precision"] == 1.0 and p["flags"] == [] for p in report["pages"])
    assert report["summary"]["pages_scored"] == 4 and report["summary"]["model_calls"] == 4
    # And the pages went to the model as images, not through the text layer
    assert fake_provider.calls == 4
    # When another model answers a damaged transcript of every page of the second copy instead
    with FakeChatServer() as weaker:
        _answer_pages_with(weaker, damaged, DocumentKind.PDF, {n: _damaged(text) for n, text in layers.items()})
        worse = _eval(
            str(damaged), "--json", "damaged.json", env=command_environment(database_url, weaker), cwd=tmp_path
        )
    # Then every page scores strictly worse
    assert worse.returncode == 0, worse.stderr
    pages = json.loads((tmp_path / "damaged.json").read_text())["pages"]
    assert all(p["cer"] > 0.1 and p["wer"] > 0.3 and p["recall"] < 0.8 for p in pages)


def test_a_truth_file_is_split_into_pages_and_a_report_is_written(
    database_url: str, fake_provider: FakeChatServer, corpus: Path, tmp_path: Path
) -> None:
    # Given a two-page document and a truth file in --truth DIR, its pages split by <!-- page N --> markers
    source = tmp_path / "doc.pdf"
    shutil.copy(corpus / "pdflatex-outline.pdf", source)
    truths = tmp_path / "truth"
    truths.mkdir()
    (truths / "doc.md").write_text("<!-- page 1 -->\nAlpha beta gamma\n<!-- page 2 -->\nDelta epsilon\n")
    _answer_pages_with(fake_provider, source, DocumentKind.PDF, {1: "Alpha beta gamma", 2: "Delta epsilon zeta"})
    # When the user runs pagescribe eval with --truth and --report
    result = _eval(
        str(source),
        "--truth",
        str(truths),
        "--report",
        "accuracy.md",
        env=command_environment(database_url, fake_provider),
        cwd=tmp_path,
    )
    # Then pages 1 and 2 are scored against the truth file (page 1 exactly, page 2 with one extra word), the other
    # pages of the document are transcribed but not scored
    assert result.returncode == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if line.startswith("| doc.pdf |")]
    assert rows[0].startswith("| doc.pdf | 1 | COMPLETED | truth file doc.md | 0.000 | 0.000 | 1.000 | 1.000 |")
    assert rows[1].startswith("| doc.pdf | 2 | COMPLETED | truth file doc.md | 0.")
    assert all("| none | - | - | - | - |" in row for row in rows[2:]) and len(rows) == 4
    # And the report holds the command that wrote it and the same figures
    report = (tmp_path / "accuracy.md").read_text()
    assert report.startswith("# Accuracy") and "`pagescribe eval " in report and "--report accuracy.md" in report
    assert "| doc.pdf | 4 | 2 |" in report


def test_olmocr_bench_rules_are_run_on_the_pages_they_name(
    database_url: str, fake_provider: FakeChatServer, corpus: Path, tmp_path: Path
) -> None:
    # Given an olmOCR-bench directory (its JSONL tests and pdfs/) naming page 2 of a document
    bench = tmp_path / "bench"
    (bench / "pdfs").mkdir(parents=True)
    shutil.copy(corpus / "pdflatex-4-pages.pdf", bench / "pdfs" / "four.pdf")
    tests = [
        {"pdf": "four.pdf", "page": 2, "id": "four_present", "type": "present", "text": "Lorem ipsum"},
        {"pdf": "four.pdf", "page": 2, "id": "four_absent", "type": "absent", "text": "Page 2"},
        {"pdf": "four.pdf", "page": 2, "id": "four_order", "type": "order", "before": "Lorem", "after": "dolor"},
        {"pdf": "four.pdf", "page": 2, "id": "four_math", "type": "math", "math": "x^2"},
        {"pdf": "four.pdf", "page": 2, "id": "four_odd", "type": "handwriting", "text": "Lorem"},
    ]
    (bench / "tests.jsonl").write_text("".join(json.dumps(test) + "\n" for test in tests))
    answers = {1: "A first page of text.", 2: r"Lorem ipsum dolor sit \(x^{2}\)"}
    _answer_pages_with(fake_provider, bench / "pdfs" / "four.pdf", DocumentKind.PDF, answers)
    # When the user runs the benchmark
    result = _eval(
        "--olmocr-bench",
        str(bench),
        "--json",
        "bench.json",
        env=command_environment(database_url, fake_provider),
        cwd=tmp_path,
    )
    # Then page 2 was transcribed, and page 1 for the baseline test the benchmark adds to each PDF that has none; the
    # rules passed (the equation rendered alike), the unsupported one reported as such
    assert result.returncode == 0, result.stderr
    assert fake_provider.calls == 2
    summary = json.loads((tmp_path / "bench.json").read_text())["summary"]
    assert summary["olmocr_bench"] == {
        "absent": {"passed": 1, "scored": 1},
        "baseline": {"passed": 1, "scored": 1},
        "handwriting": {"passed": 0, "scored": 0},
        "math": {"passed": 1, "scored": 1},
        "order": {"passed": 1, "scored": 1},
        "present": {"passed": 1, "scored": 1},
    }
    assert "| olmOCR-bench handwriting | unsupported |" in result.stdout
    # ... and the benchmark's own figures: each category (JSONL file) and the mean of their rates, with its interval
    score = json.loads((tmp_path / "bench.json").read_text())["summary"]["olmocr_bench_score"]
    assert score["categories"] == {"baseline": {"passed": 1, "scored": 1}, "tests": {"passed": 4, "scored": 4}}
    assert score["overall"] == 1.0 and score["interval"] == [1.0, 1.0]
    assert "| olmOCR-bench category tests | 100.0% (4/4) |" in result.stdout
    assert "| olmOCR-bench average score (of the categories) | 100.0% (95% CI: [100.0%, 100.0%]) |" in result.stdout


def test_each_pages_grounding_and_block_boxes_are_reported_and_faults_adds_the_fault_set(
    database_url: str, fake_provider: FakeChatServer, corpus: Path, tmp_path: Path
) -> None:
    # Given a born-digital PDF whose pages a model answers with their own text laid out
    source = tmp_path / "four.pdf"
    shutil.copy(corpus / "pdflatex-4-pages.pdf", source)
    _answer_pages_with(
        fake_provider, source, DocumentKind.PDF, {n: read_text_layer(source, n).laid_out for n in range(1, 5)}
    )
    # When the user runs pagescribe eval with --faults, JSON out and a report
    result = _eval(
        str(source),
        "--faults",
        "--json",
        "out.json",
        "--report",
        "accuracy.md",
        env=command_environment(database_url, fake_provider),
        cwd=tmp_path,
    )
    # Then every page's answer is grounded in full to its text layer, and its blocks' boxes are where the text layer
    # puts them, in the JSON and in the table
    assert result.returncode == 0, result.stderr
    figures: dict[str, Any] = json.loads((tmp_path / "out.json").read_text())
    pages = figures["pages"]
    assert [(p["grounding_source"], p["grounded"], p["ungrounded"], p["missed_text"]) for p in pages] == [
        ("text_layer", 1.0, 0.0, 0.0)
    ] * 4
    assert all(p["box_ious"] and min(p["box_ious"].values()) >= 0.8 for p in pages)
    grounding = figures["summary"]["grounding"]
    assert grounding["by_source"] == {"text_layer": {"pages": 4, "median": 1.0, "mean": 1.0, "least": 1.0}}
    assert grounding["box_iou"]["blocks"] >= 4 and grounding["box_iou"]["median"] >= 0.9
    rows = [line for line in result.stdout.splitlines() if line.startswith("| four.pdf |")]
    assert len(rows) == 4 and all("| text_layer 1.000 | 0.9" in row for row in rows)
    # And the fault set built from the same pages finds each fault it could inject, and flags neither the clean nor
    # the reordered answers
    faults = figures["faults"]["summary"]
    assert faults["pages"] == {"born_digital": 4, "scans": 0}
    assert [faults["faults"][name]["detected"] for name in ("invented_sentence", "dropped_paragraph")] == [4, 4]
    assert faults["faults"]["invented_row"]["pages"] == 0
    assert faults["false_flags"]["clean"]["flagged"] == faults["false_flags"]["reordered"]["flagged"] == 0
    assert "a reordered but complete answer is not flagged: 0 of 4 pages flagged" in result.stdout
    # And the report holds both in its grounding section
    report = (tmp_path / "accuracy.md").read_text()
    assert "## Grounding: coverage, block boxes and the two checks" in report
    assert "### Injected faults: the two checks on real pages whose truth is known" in report
    assert "| `ungrounded` 0.02 | 0/4 |" in report and "| `missed_text` 0.05 | 0/4 |" in report


def test_eval_names_what_is_missing(database_url: str, fake_provider: FakeChatServer, tmp_path: Path) -> None:
    result = _eval("nope.pdf", env=command_environment(database_url, fake_provider), cwd=tmp_path)
    assert result.returncode == 2 and "no such file or directory: nope.pdf" in result.stderr
    result = _eval(env=command_environment(database_url, fake_provider), cwd=tmp_path)
    assert result.returncode == 2 and "nothing to evaluate" in result.stderr
