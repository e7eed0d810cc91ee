"""olmOCR-bench's sample data (tests/data/olmocr-bench) through ``pagescribe eval``, in the benchmark's own form.

    .venv/bin/python -m bench.olmocr_sample                              # the offline engine (about ten minutes)
    .venv/bin/python -m bench.olmocr_sample --markdown docs/accuracy.md  # also write the section into that file
    PROVIDER=openai-compatible PROVIDER_API_KEY=... .venv/bin/python -m bench.olmocr_sample   # a vision model

Runs ``pagescribe eval --olmocr-bench tests/data/olmocr-bench`` (the provider from the environment, the offline
engine by default) and writes what it scored: every category (JSONL file, and the baseline tests the benchmark adds
to each PDF) with the overall score and its bootstrap interval, and every rule type. Measured, not asserted: the
exit status is non-zero only when the run crashes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.common import REPO
from bench.report import _git_head, publish_section

HEADING = "## olmOCR-bench: its sample, every rule, and where pagescribe and olmocr differ"
SAMPLE = REPO / "tests" / "data" / "olmocr-bench"


def run_eval(scratch: Path) -> dict[str, Any]:
    """``pagescribe eval --olmocr-bench`` on the sample; its JSON (summary and pages)."""
    out = scratch / "olmocr-bench.json"
    command = [str(Path(sys.executable).with_name("pagescribe")), "eval", "--olmocr-bench", str(SAMPLE)]
    environment = {**os.environ, "PROVIDER": os.environ.get("PROVIDER", "offline")}
    subprocess.run(  # noqa: S603 - our own CLI; its table goes unprinted, the JSON holds it all
        [*command, "--json", str(out)], check=True, env=environment, cwd=scratch, stdout=subprocess.DEVNULL
    )
    result: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    return result


def _rate(passed: int, scored: int) -> str:
    return f"{100 * passed / scored:.1f} % ({passed}/{scored})" if scored else "not scored"


def section(result: dict[str, Any]) -> str:
    """The markdown section of a run."""
    summary = result["summary"]
    score = summary["olmocr_bench_score"]
    low, high = score["interval"]
    lines = [
        HEADING,
        "",
        f"Written by `.venv/bin/python -m bench.olmocr_sample` on {datetime.now(UTC):%Y-%m-%d %H:%M UTC}, commit "
        f"{_git_head()}; provider `{result['provider']}`, model `{result['model']}`. It runs "
        "`pagescribe eval --olmocr-bench tests/data/olmocr-bench`: olmOCR-bench's "
        "own sample (100 tests over 20 one-page PDFs, from allenai/olmocr, Apache-2.0; `tests/data/olmocr-bench/"
        "SOURCES.md`), every page sent to the engine as an image, every rule scored. A user with a key runs the same "
        "command with `PROVIDER=openai-compatible` to score a vision model.",
        "",
        "| category (JSONL file) | passed |",
        "| --- | --- |",
        *(f"| {name} | {_rate(c['passed'], c['scored'])} |" for name, c in score["categories"].items()),
        f"| **average score (of the categories)** | **{100 * score['overall']:.1f} %** "
        f"({100 * score['level']:.0f} % CI: [{100 * low:.1f} %, {100 * high:.1f} %]) |",
        "",
        "The overall score is the benchmark's: the mean of its categories' pass rates, its interval a bootstrap drawn "
        "within each category. On this sample the categories are its two files and the baseline tests the "
        "benchmark's runner adds to each PDF, so the baselines (a page that is not empty, repeats nothing, holds no "
        "stray script) weigh two thirds; the rules below say more.",
        "",
        "| rule | passed |",
        "| --- | --- |",
        *(f"| {kind} | {_rate(c['passed'], c['scored'])} |" for kind, c in summary["olmocr_bench"].items()),
        "",
        "### Where pagescribe and olmocr differ",
        "",
        "`tests/unit/test_olmocr_parity.py` runs olmocr's own scoring code (olmocr 0.4.27, its latest release, "
        "installed without its model dependencies) beside pagescribe's:",
        "",
        "- on olmocr's own transcripts of this sample, all 100 tests get the same verdict from both, `math` included;",
        "- on 300 generated pages (prose, markdown and HTML tables, repeats, CJK), every exact `present`, `absent`, "
        "`order`, `table` and `baseline` rule agrees;",
        "- a fuzzy `present`/`absent` rule (`max_diffs` above 0) differs only where olmocr's `partial_ratio` equals "
        "its threshold exactly: a float comparison decides olmocr's verdict there, an edit distance pagescribe's;",
        "- equations: olmocr's comparison of two renders and its `MathTest` agree with pagescribe's on every case; "
        "olmocr renders with Playwright's own Chromium, pagescribe with Debian's (the same KaTeX files, page and "
        "viewport), so the test gives olmocr's code pagescribe's renders;",
        "- the overall score's interval agrees with olmocr's `calculate_bootstrap_ci` within a point (the random "
        "generators differ).",
        "",
        "Every other difference is listed, with the lines of olmocr it concerns, in the docstring of "
        "`local/pagescribe_local/olmocr_bench.py`: among them, olmocr's release reads tables the older way (a "
        "relation of a cell on the table's edge is not checked; no spans), where pagescribe follows olmocr's "
        "repository, so the parity test draws its table rules from cells inside their table.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.olmocr_sample", description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", type=Path, metavar="FILE", help=f"write the section into FILE ({HEADING!r})")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-olmocr-") as directory:
        publish_section(section(run_eval(Path(directory))), HEADING, args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
