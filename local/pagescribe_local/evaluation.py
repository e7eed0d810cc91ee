"""``pagescribe eval``: run documents that have a ground truth through the pipeline and score every page.

The truth of a document, in this order:

1. a truth file: ``<name>.md`` or ``<name>.txt`` in ``--truth DIR``, else beside the input; pages split by form feed or
   ``<!-- page N -->`` markers (:func:`pagescribe_local.scoring.split_pages`);
2. for a born-digital PDF without one, its own text layer, page by page where it is usable (the pipeline then sends
   the page to the model as an image only: the model is what is measured);
3. with ``--olmocr-bench DIR``, olmOCR-bench's own JSONL tests, for the PDFs and pages they name.

A page without truth is transcribed and reported, not scored. Scores are those of :mod:`pagescribe_local.scoring`,
and the olmOCR-bench rule pass rates of :mod:`pagescribe_local.olmocr_bench`.

Every page is also reported as the pipeline grounded its answer (the JSON transcript's ``grounding``): its source
(``text_layer``, ``second_read``, ``engine``) and the share of the answer's characters grounded; on a born-digital PDF
page (grounded to its text layer), each text block's box (``blocks[].bbox.pixels``) against its true box from the
text layer (:mod:`pagescribe_local.true_boxes`), as intersection over union. ``--faults`` adds the fault-injection
set (:mod:`pagescribe_local.faults`).
"""

from __future__ import annotations

import platform
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from pagescribe.assembly import running_furniture
from pagescribe.blocks import BlockType
from pagescribe.blocks.parsing import parse_blocks
from pagescribe.checks import usable_text_layer
from pagescribe.grounding import Box, GroundingSource
from pagescribe.sources.documents import DocumentKind, InvalidDocumentError, detect_kind
from pagescribe.sources.textlayer import extract_text_layer

from pagescribe_local.olmocr_bench import (
    SUPPORTED_TYPES,
    BenchTest,
    RuleResult,
    bench_score,
    check,
    load_tests,
    pass_rates,
    with_baselines,
)
from pagescribe_local.scoring import cer, percentile, recall_precision, split_pages, wer
from pagescribe_local.true_boxes import true_boxes

TRUTH_SUFFIXES = (".md", ".txt")
UNGROUNDED_SWEEP = (0.005, 0.0075, 0.01, 0.015, 0.02)  # thresholds whose effect is shown for information
MISSED_SWEEP = (0.01, 0.02, 0.03, 0.05)
INPUT_SUFFIXES = frozenset({".pdf", ".png", ".jpg", ".jpeg", ".tif", ".tiff", ".webp"})


class EvaluationError(ValueError):
    """The evaluation cannot run as asked (no input, a truth file that cannot be read, a bad benchmark)."""


@dataclass(frozen=True)
class EvalDocument:
    """A document to run: its truth per page, where the truth came from, the pages to transcribe (None: all)."""

    path: Path
    truth: dict[int, str]
    truth_source: str
    pages: tuple[int, ...] | None = None
    rules: tuple[BenchTest, ...] = ()
    label: str = ""  # how tables name it: its file name, or its path where two inputs share a name

    @property
    def name(self) -> str:
        return self.label or self.path.name


@dataclass(frozen=True)
class PageScore:
    """One transcribed page: what it scored (None without truth), its flags, what it cost and how long it took."""

    document: str
    page: int  # 0: the document failed before it had pages
    status: str
    truth_source: str
    cer: float | None
    wer: float | None
    recall: float | None
    precision: float | None
    flags: list[str]
    model: str | None
    model_calls: int
    prompt_tokens: int
    completion_tokens: int
    cost: float
    latency_ms: int
    rules: list[RuleResult] = field(default_factory=list)
    grounding_source: str | None = None  # text_layer, second_read or engine; None: the answer was not grounded
    grounded: float | None = None  # the share of the answer's characters the page's own text supports
    ungrounded: float | None = None  # what the ungrounded and missed_text checks measured
    missed_text: float | None = None
    grounding_skipped: str | None = None  # why the answer was not grounded, where the pipeline says
    box_ious: dict[str, float] = field(default_factory=dict)  # born-digital: block id -> IoU with its true box


# --- what to run ------------------------------------------------------------------------------------------------------


def collect_inputs(paths: Sequence[Path]) -> list[Path]:
    """The documents named: files as given, and the documents in directories (recursively, sorted); truth files
    beside them are not inputs."""
    inputs: list[Path] = []
    for path in paths:
        if path.is_dir():
            inputs += sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in INPUT_SUFFIXES)
        elif path.is_file():
            inputs.append(path)
        else:
            raise EvaluationError(f"no such file or directory: {path}")
    return inputs


def truth_file(path: Path, truth_dir: Path | None) -> Path | None:
    """``<stem>.md`` or ``<stem>.txt`` in ``truth_dir``, else beside the document."""
    for directory in (truth_dir, path.parent):
        for suffix in TRUTH_SUFFIXES if directory is not None else ():
            candidate = directory / f"{path.stem}{suffix}"  # type: ignore[operator]
            if candidate.is_file():
                return candidate
    return None


def _is_pdf(path: Path) -> bool:
    try:
        with path.open("rb") as handle:
            return detect_kind(handle.read(1024)) is DocumentKind.PDF
    except (OSError, InvalidDocumentError):
        return False


def text_layer_truth(path: Path) -> dict[int, str]:
    """A born-digital PDF's own text, page by page, where it is usable; empty for anything else."""
    if not _is_pdf(path):
        return {}
    truth: dict[int, str] = {}
    page = 1
    while True:
        try:
            text = extract_text_layer(path, page)
        except InvalidDocumentError:  # past the last page, or unreadable (password, damage): no more truth
            return truth
        if usable_text_layer(text):
            truth[page] = text
        page += 1


def plan(
    paths: Sequence[Path], *, truth_dir: Path | None = None, olmocr_bench: Path | None = None
) -> list[EvalDocument]:
    """The documents to run and the truth of each."""
    documents = [_document(path, truth_dir) for path in collect_inputs(paths)]
    if olmocr_bench is not None:
        documents += _olmocr_documents(olmocr_bench)
    if not documents:
        raise EvaluationError("nothing to evaluate: name documents (files or directories) or --olmocr-bench DIR")
    names = Counter(document.path.name for document in documents)
    return [replace(d, label=str(d.path)) if names[d.path.name] > 1 else d for d in documents]


def _document(path: Path, truth_dir: Path | None) -> EvalDocument:
    """A document named as input, with the truth of its truth file, else of its own text layer (if any)."""
    found = truth_file(path, truth_dir)
    if found is None:
        layer = text_layer_truth(path)
        return EvalDocument(path, layer, "text layer" if layer else "none")
    try:
        pages = split_pages(found.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise EvaluationError(f"the truth file {found} cannot be read: {exc}") from exc
    return EvalDocument(path, dict(enumerate(pages, start=1)), f"truth file {found.name}")


def _olmocr_documents(bench: Path) -> list[EvalDocument]:
    if not bench.is_dir():
        raise EvaluationError(f"--olmocr-bench {bench} is not a directory")
    try:
        tests = with_baselines(load_tests(bench))
    except ValueError as exc:
        raise EvaluationError(str(exc)) from exc
    by_pdf: dict[str, list[BenchTest]] = {}
    for test in tests:
        by_pdf.setdefault(test.pdf, []).append(test)
    documents = []
    for pdf, rules in sorted(by_pdf.items()):
        path = bench / "pdfs" / pdf
        if not path.is_file():
            raise EvaluationError(f"olmOCR-bench test {rules[0].id} names {pdf}, which is not in {bench / 'pdfs'}")
        pages = tuple(sorted({rule.page for rule in rules}))
        documents.append(EvalDocument(path, {}, "olmocr-bench", pages=pages, rules=tuple(rules)))
    return documents


# --- scoring ----------------------------------------------------------------------------------------------------------


def score_document(document: EvalDocument, transcript: dict[str, Any] | None, error: str | None) -> list[PageScore]:
    """Every page of a finished document (its JSON transcript), scored where it has truth. A document that failed
    before it had pages (``transcript`` None, ``error`` saying why) fails every page it has truth or rules for."""
    name = document.name
    if transcript is None:
        failed = f"the document failed: {error or 'no transcript'}"
        pages = sorted(set(document.truth) | {rule.page for rule in document.rules}) or [0]  # 0: the whole file
        return [
            PageScore(
                name,
                page,
                "FAILED",
                document.truth_source,
                *_scores(document.truth.get(page), ""),
                flags=[],
                model=None,
                model_calls=0,
                prompt_tokens=0,
                completion_tokens=0,
                cost=0.0,
                latency_ms=0,
                rules=[
                    RuleResult(
                        rule.id, rule.type, False if rule.type in SUPPORTED_TYPES else None, failed, rule.category
                    )
                    for rule in document.rules
                    if rule.page == page
                ],
            )
            for page in pages
        ]
    scores = []
    furniture = running_furniture([page.get("text") for page in transcript["pages"]])
    for page, running in zip(transcript["pages"], furniture, strict=True):
        number, text = int(page["page"]), page.get("text") or ""
        truth = document.truth.get(number)
        calls = page.get("attempts", [])
        cer_, wer_, recall, precision = _scores(truth, text)
        scores.append(
            PageScore(
                document=name,
                page=number,
                status=page["status"],
                truth_source=document.truth_source if truth is not None or document.rules else "none",
                cer=cer_,
                wer=wer_,
                recall=recall,
                precision=precision,
                flags=[flag["flag"] for flag in page.get("flags", [])],
                model=page.get("model"),
                model_calls=len(calls),
                prompt_tokens=sum(call.get("prompt_tokens") or 0 for call in calls),
                completion_tokens=sum(call.get("completion_tokens") or 0 for call in calls),
                cost=sum(call.get("cost") or 0.0 for call in calls),
                latency_ms=sum(call.get("latency_ms") or 0 for call in calls),
                rules=[check(rule, text) for rule in document.rules if rule.page == number],
                **page_grounding(document.path, page, running),
            )
        )
    return scores


def page_grounding(path: Path, page: dict[str, Any], furniture: dict[int, str]) -> dict[str, Any]:
    """What a transcript's page says of its answer's grounding, and on a page grounded to its PDF's text layer each
    text block's box against its true box (a block that has a true box but no box of its own counts 0)."""
    grounding = page.get("grounding")
    if not grounding:
        return {}
    if not grounding.get("source"):
        return {"grounding_skipped": grounding.get("skipped")}
    found: dict[str, Any] = {
        "grounding_source": grounding["source"],
        "grounded": grounding.get("grounded"),
        "ungrounded": grounding.get("ungrounded"),
        "missed_text": grounding.get("missed_text"),
    }
    if grounding["source"] == GroundingSource.TEXT_LAYER.value and _is_pdf(path):
        found["box_ious"] = block_box_ious(path, page, furniture)
    return found


def block_box_ious(path: Path, page: dict[str, Any], furniture: dict[int, str]) -> dict[str, float]:
    """Each text block's box (``blocks[].bbox.pixels``) against its true box from the page's text layer, by the
    block's id in the transcript; figures (their text is a description) are not measured."""
    number, image = int(page["page"]), page["grounding"]["image"]
    blocks = [block for block in parse_blocks(page.get("text") or "", furniture) if block.type is not BlockType.FIGURE]
    truth = true_boxes(
        path, number, [(f"p{number}-{block.id}", block.plain) for block in blocks], (image["width"], image["height"])
    )
    boxes: dict[str, list[float]] = {
        block["id"]: block["bbox"]["pixels"] for block in page.get("blocks", []) if block.get("bbox")
    }
    return {
        block_id: round(Box(*boxes[block_id]).iou(true), 4) if block_id in boxes else 0.0
        for block_id, true in truth.items()
    }


def _scores(truth: str | None, text: str) -> tuple[float | None, float | None, float | None, float | None]:
    if truth is None:
        return None, None, None, None
    recall, precision = recall_precision(truth, text)
    return cer(truth, text), wer(truth, text), recall, precision


# --- summary ----------------------------------------------------------------------------------------------------------


def _stats(values: Sequence[float]) -> dict[str, float | None]:
    if not values:
        return {"median": None, "mean": None, "worst": None}
    return {"median": percentile(values, 50), "mean": sum(values) / len(values), "worst": max(values)}


def summarize(scores: Sequence[PageScore]) -> dict[str, Any]:
    """The figures of a run: error rates over scored pages, flags, spend, latency, olmOCR-bench pass rates, and how
    the answers were grounded."""
    scored = [s for s in scores if s.cer is not None]
    rules = [rule for s in scores for rule in s.rules]
    return {
        "documents": len({s.document for s in scores}),
        "pages": len(scores),
        "pages_scored": len(scored),
        "pages_failed": sum(s.status == "FAILED" for s in scores),
        **_error_rates(scored),
        "flags": dict(sorted(Counter(flag for s in scores for flag in s.flags).items())),
        "pages_flagged": sum(bool(s.flags) for s in scores),
        **_spend(scores),
        "olmocr_bench": {kind: {"passed": p, "scored": n} for kind, (p, n) in pass_rates(rules).items()},
        "olmocr_bench_score": _bench_score(rules),
        "grounding": grounding_summary(scores),
    }


def _error_rates(scored: Sequence[PageScore]) -> dict[str, Any]:
    """The scored pages' character and word error rates, and their word recall and precision."""
    return {
        "cer": _stats([s.cer for s in scored if s.cer is not None]),
        "wer": _stats([s.wer for s in scored if s.wer is not None]),
        "recall_mean": _mean([s.recall for s in scored if s.recall is not None]),
        "precision_mean": _mean([s.precision for s in scored if s.precision is not None]),
    }


def _spend(scores: Sequence[PageScore]) -> dict[str, Any]:
    """What the run's model calls took: calls, tokens, cost (in all and per 1,000 pages) and latency."""
    latencies = [float(s.latency_ms) for s in scores if s.model_calls]
    cost = sum(s.cost for s in scores)
    return {
        "model_calls": sum(s.model_calls for s in scores),
        "prompt_tokens": sum(s.prompt_tokens for s in scores),
        "completion_tokens": sum(s.completion_tokens for s in scores),
        "cost": round(cost, 8),
        "cost_per_1000_pages": round(cost / len(scores) * 1000, 6) if scores else None,
        "latency_ms_p50": percentile(latencies, 50) if latencies else None,
        "latency_ms_p95": percentile(latencies, 95) if latencies else None,
    }


def _bench_score(rules: Sequence[RuleResult]) -> dict[str, Any] | None:
    """olmOCR-bench's own figures of the run (:func:`pagescribe_local.olmocr_bench.bench_score`); None without it."""
    score = bench_score(rules)
    if score is None:
        return None
    return {
        "categories": {name: {"passed": p, "scored": n} for name, (p, n) in score.categories.items()},
        "overall": round(score.overall, 6),
        "interval": [round(score.interval[0], 6), round(score.interval[1], 6)],
        "level": score.level,
    }


def grounding_summary(scores: Sequence[PageScore]) -> dict[str, Any]:
    """By grounding source: the pages and the share of their answers grounded (median, mean, least); the pages not
    grounded; and the block boxes of the born-digital pages against their true boxes."""
    return {
        "by_source": _by_source(scores),
        "pages_not_grounded": sum(s.grounding_source is None for s in scores),
        "why_not_grounded": dict(Counter(s.grounding_skipped for s in scores if s.grounding_skipped)),
        "box_iou": _box_iou(scores),
    }


def _by_source(scores: Sequence[PageScore]) -> dict[str, dict[str, Any]]:
    """Per grounding source, in order of first use: its pages and the shares of their answers grounded."""
    by_source: dict[str, dict[str, Any]] = {}
    for source in dict.fromkeys(s.grounding_source for s in scores if s.grounding_source):
        shares = [s.grounded for s in scores if s.grounding_source == source and s.grounded is not None]
        by_source[source] = {"pages": len(shares), **_shares(shares)}
    return by_source


def _box_iou(scores: Sequence[PageScore]) -> dict[str, Any]:
    """The born-digital pages' block boxes against their true boxes: how many, the median IoU, the share at 0.8 or
    more and how many at 0."""
    ious = [iou for s in scores for iou in s.box_ious.values()]
    return {
        "pages": sum(bool(s.box_ious) for s in scores),
        "blocks": len(ious),
        "median": percentile(ious, 50) if ious else None,
        "at_least_0_8": sum(iou >= 0.8 for iou in ious) / len(ious) if ious else None,
        "zero": sum(iou == 0.0 for iou in ious),  # no box, or a box that misses its true one
    }


def _shares(values: Sequence[float]) -> dict[str, float | None]:
    if not values:
        return {"median": None, "mean": None, "least": None}
    return {"median": percentile(values, 50), "mean": sum(values) / len(values), "least": min(values)}


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def as_json(
    summary: dict[str, Any],
    scores: Iterable[PageScore],
    context: dict[str, Any],
    faults: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Every figure of the run; ``faults``: the fault-injection set's (``--faults``)."""
    return {
        **context,
        "summary": summary,
        "pages": [asdict(score) for score in scores],
        **({"faults": faults} if faults is not None else {}),
    }


# --- tables -----------------------------------------------------------------------------------------------------------


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def summary_table(summary: dict[str, Any]) -> str:
    """The run's figures as a markdown table."""
    cer_, wer_ = summary["cer"], summary["wer"]
    flags = ", ".join(f"{name} {count}" for name, count in summary["flags"].items()) or "none"
    rows = [
        (
            "documents / pages / scored / failed",
            f"{summary['documents']} / {summary['pages']} / {summary['pages_scored']} / {summary['pages_failed']}",
        ),
        ("CER median / mean / worst", f"{_fmt(cer_['median'])} / {_fmt(cer_['mean'])} / {_fmt(cer_['worst'])}"),
        ("WER median / mean / worst", f"{_fmt(wer_['median'])} / {_fmt(wer_['mean'])} / {_fmt(wer_['worst'])}"),
        ("word recall / precision (mean)", f"{_fmt(summary['recall_mean'])} / {_fmt(summary['precision_mean'])}"),
        ("pages flagged", f"{summary['pages_flagged']} ({flags})"),
        (
            "model calls / prompt tokens / completion tokens",
            f"{summary['model_calls']} / {summary['prompt_tokens']} / {summary['completion_tokens']}",
        ),
        ("cost / per 1,000 pages (USD)", f"{summary['cost']:.6f} / {_fmt(summary['cost_per_1000_pages'], 4)}"),
        (
            "model latency p50 / p95 (ms)",
            f"{_fmt(summary['latency_ms_p50'], 0)} / {_fmt(summary['latency_ms_p95'], 0)}",
        ),
    ]
    for kind, counts in summary["olmocr_bench"].items():
        rate = f"{counts['passed']}/{counts['scored']}" if counts["scored"] else "unsupported"
        rows.append((f"olmOCR-bench {kind}", rate))
    rows += _bench_rows(summary["olmocr_bench_score"])
    rows += grounding_rows(summary["grounding"])
    lines = ["| measure | value |", "| --- | --- |", *(f"| {name} | {value} |" for name, value in rows)]
    return "\n".join(lines)


def _bench_rows(score: dict[str, Any] | None) -> list[tuple[str, str]]:
    """olmOCR-bench's categories and overall score with its interval, in the form its own runner prints them."""
    if score is None:
        return []
    rows = [
        (f"olmOCR-bench category {name}", f"{100 * c['passed'] / c['scored']:.1f}% ({c['passed']}/{c['scored']})")
        for name, c in score["categories"].items()
    ]
    low, high = score["interval"]
    overall = f"{100 * score['overall']:.1f}% ({100 * score['level']:.0f}% CI: [{100 * low:.1f}%, {100 * high:.1f}%])"
    return [*rows, ("olmOCR-bench average score (of the categories)", overall)]


def grounding_rows(grounding: dict[str, Any]) -> list[tuple[str, str]]:
    """The summary table's rows of how the answers were grounded."""
    rows = [
        (
            f"grounded, {source} ({entry['pages']} pages): median / mean / least",
            f"{_fmt(entry['median'])} / {_fmt(entry['mean'])} / {_fmt(entry['least'])}",
        )
        for source, entry in grounding["by_source"].items()
    ]
    rows.append(("pages not grounded", str(grounding["pages_not_grounded"])))
    iou = grounding["box_iou"]
    share = "-" if iou["at_least_0_8"] is None else f"{100 * iou['at_least_0_8']:.1f} %"
    rows.append(
        (
            "block box IoU against the text layer: median / 0.8 or more / blocks (pages)",
            f"{_fmt(iou['median'])} / {share} / {iou['blocks']} ({iou['pages']})",
        )
    )
    return rows


def pages_table(scores: Sequence[PageScore]) -> str:
    """One row per page."""
    lines = [
        "| document | page | status | truth | CER | WER | recall | precision | grounded | box IoU (blocks) | flags "
        "| latency ms |",
        "| --- | ---: | --- | --- | ---: | ---: | ---: | ---: | --- | ---: | --- | ---: |",
    ]
    for s in scores:
        truth = s.truth_source
        if s.rules:
            truth += f" rules {sum(r.passed is True for r in s.rules)}/{sum(r.passed is not None for r in s.rules)}"
        lines.append(
            f"| {s.document} | {s.page or '-'} | {s.status} | {truth} | {_fmt(s.cer)} | {_fmt(s.wer)} "
            f"| {_fmt(s.recall)} | {_fmt(s.precision)} | {_grounded(s)} | {_ious(s)} | {', '.join(s.flags) or '-'} "
            f"| {s.latency_ms if s.model_calls else '-'} |"
        )
    return "\n".join(lines)


def _grounded(score: PageScore) -> str:
    return f"{score.grounding_source} {_fmt(score.grounded)}" if score.grounding_source else "-"


def _ious(score: PageScore) -> str:
    if not score.box_ious:
        return "-"
    return f"{percentile(list(score.box_ious.values()), 50):.3f} ({len(score.box_ious)})"


def machine() -> str:
    return f"{platform.system()} {platform.machine()}, Python {platform.python_version()}"


def documents_table(scores: Sequence[PageScore]) -> str:
    """One row per document: pages, pages scored, CER median / mean / worst, flags raised."""
    lines = [
        "| document | pages | scored | CER median | CER mean | CER worst | flags |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for name in dict.fromkeys(s.document for s in scores):
        pages = [s for s in scores if s.document == name]
        cers = _stats([s.cer for s in pages if s.cer is not None])
        flags = Counter(flag for s in pages for flag in s.flags)
        lines.append(
            f"| {name} | {len(pages)} | {sum(s.cer is not None for s in pages)} | {_fmt(cers['median'])} "
            f"| {_fmt(cers['mean'])} | {_fmt(cers['worst'])} "
            f"| {', '.join(f'{flag} {n}' for flag, n in sorted(flags.items())) or '-'} |"
        )
    return "\n".join(lines)


def sources(paths: Iterable[Path]) -> list[str]:
    """Where the documents' provenance is written down: a SOURCES.md, README or LICENSE in their directories."""
    found: list[str] = []
    for directory in dict.fromkeys(path.parent for path in paths):
        for name in ("SOURCES.md", "README.md", "LICENSE"):
            if (directory / name).is_file():
                found.append(str(directory / name))
                break
        else:
            found.append(f"{directory} (no SOURCES.md, README.md or LICENSE beside the documents)")
    return found


def grounding_section(
    summary: dict[str, Any], scores: Sequence[PageScore], context: dict[str, Any], faults: str | None
) -> str:
    """How the run's answers were grounded, and the fault-injection set when it was run."""
    grounding = summary["grounding"]
    rows = ["| grounded to | pages | grounded median | mean | least |", "| --- | ---: | ---: | ---: | ---: |"]
    rows += [
        f"| {source} | {entry['pages']} | {_fmt(entry['median'])} | {_fmt(entry['mean'])} | {_fmt(entry['least'])} |"
        for source, entry in grounding["by_source"].items()
    ]
    iou = grounding["box_iou"]
    share = "-" if iou["at_least_0_8"] is None else f"{100 * iou['at_least_0_8']:.1f} %"
    worst = min(
        (s for s in scores if s.box_ious), key=lambda s: percentile(list(s.box_ious.values()), 50), default=None
    )
    least = f"; the page with the lowest median, {worst.document} p. {worst.page}: {_ious(worst)}" if worst else ""
    command = context["command"]
    extra = (
        faults
        if faults is not None
        else "The fault-injection set was not run: add `--faults` to the command to measure the two checks on it."
    )
    return f"""## Grounding: coverage, block boxes and the two checks

Written by `{command}` on {context["date"]} ({context["machine"]}); provider `{context["provider"]}`, model
`{context["model"]}`.

### The answers of this run

Each answer of the run above was grounded by the pipeline to the page's own text (README, *Grounded transcripts*):
a born-digital page's text layer, a scan's second read by the offline engine, or, when the offline engine wrote the
answer, the engine's own boxes. "Grounded" is the share of the answer's letters and digits that text supports.

{chr(10).join(rows)}

Pages whose answer was not grounded: {grounding["pages_not_grounded"]}{_why_not(grounding)}. Block boxes on
born-digital pages (each text block's `bbox.pixels` against its true box from the text layer,
`pagescribe_local.true_boxes`; a block with a true box but no box counts 0): {iou["blocks"]} blocks on
{iou["pages"]} pages, median IoU {_fmt(iou["median"])}, {share} of them 0.8 or more, {iou["zero"]} at 0{least}.

The same answers at other thresholds of the two checks (information: how many would be flagged by their shares
alone; a page is flagged above a threshold, and `ungrounded` also by a block or table row unsupported as a whole,
which the flags above include):

{thresholds_table(scores)}

What these figures say: grounding to a text layer holds the answer against the page's own characters, so it is
evidence of fidelity; grounding to the engine's own boxes (the offline provider on a scan) holds the engine's answer
against its own read, so there it only shows that the layout kept what the engine read, not that the engine read it
right. A block's true box is made of the text layer's lines of 8 letters and digits or more that the answer has letter
for letter: a misread line, or a block of short lines (a table of contents' "1 Foo 2"), gives a smaller true box or
none, so a low IoU can be the true box's fault as well as the alignment's.

{extra}"""


def thresholds_table(scores: Sequence[PageScore]) -> str:
    """How many of the run's grounded answers each threshold of the two checks would flag, by grounding source."""
    sources = list(dict.fromkeys(s.grounding_source for s in scores if s.grounding_source))
    rows = [f"| check above | {' | '.join(sources)} |", f"| --- | {' | '.join('---:' for _ in sources)} |"]
    for name, thresholds in (("ungrounded", UNGROUNDED_SWEEP), ("missed_text", MISSED_SWEEP)):
        for threshold in thresholds:
            cells = []
            for source in sources:
                values = [getattr(s, name) for s in scores if s.grounding_source == source]
                cells.append(f"{sum(value is not None and value > threshold for value in values)}/{len(values)}")
            rows.append(f"| `{name}` {threshold} | {' | '.join(cells)} |")
    return "\n".join(rows)


def _why_not(grounding: dict[str, Any]) -> str:
    """Why pages were not grounded, where the pipeline said (a page that failed, or rendered blank, says nothing)."""
    reasons = grounding["why_not_grounded"]
    return f" ({'; '.join(f'{count}: {why}' for why, count in reasons.items())})" if reasons else ""


def report(
    summary: dict[str, Any],
    scores: Sequence[PageScore],
    context: dict[str, Any],
    paths: Sequence[Path],
    faults: str | None = None,
) -> str:
    """The whole run as a markdown document (docs/accuracy.md); ``faults``: the fault-injection set's section
    (:func:`pagescribe_local.faults.markdown`), when it was run."""
    provenance = "\n".join(f"- `{source}`" for source in sources(paths))
    return f"""# Accuracy

Written by `{context["command"]}` on {context["date"]} ({context["machine"]}); provider `{context["provider"]}`, model
`{context["model"]}`. Run the same command to regenerate it; every figure below comes from that run.

Each page went through the same pipeline as `pagescribe transcribe` (upload, render, model call, checks), sent to the
model as an image only. Its truth is a truth file beside the document where there is one (the source's own ground
truth), else the PDF's own text layer. CER and WER are computed on NFKC, whitespace-normalised text with page markers,
comments and markdown block markup (heading markers, list bullets, table rules and pipes) removed; recall and
precision are order-insensitive word overlaps. A page without truth is listed, not scored.

## Summary

{summary_table(summary)}

## By document

{documents_table(scores)}

## By page

{pages_table(scores)}

{grounding_section(summary, scores, context, faults)}

## Where the documents come from

{provenance}
"""
