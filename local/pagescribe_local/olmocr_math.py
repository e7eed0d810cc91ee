"""olmOCR-bench's ``math`` rule: equations rendered with KaTeX in headless Chromium and compared as rendered.

The rule (olmocr ``MathTest``, ``olmocr/bench/tests.py``; ``olmocr/bench/katex/render.py``, Apache-2.0) names a
LaTeX equation, ``math``. The page passes when one of the equations it writes (``\\(...\\)``, ``\\[...\\]`` and, unless
``ignore_dollar_delimited``, ``$$...$$`` and ``$...$``, taken in that order, each kind removed before the next is
looked for) is the same text, or renders like it: KaTeX (display mode, 24 px, in an 800 x 400 page, as olmocr renders)
gives MathML and, for every innermost span with text, its box. Two renders are alike (:func:`rendered_alike`) when the
reference's MathML (the content of its ``<semantics>`` but the TeX annotation, white space removed) is a part of the
hypothesis's, or else when every character of the reference can be given its own character of the hypothesis, equal,
such that each character's nearest neighbour above, below, left and right (centres within 5 px of the same column or
row) maps to the hypothesis character's nearest neighbour in that direction, or when unmapped, to one with the same
text.

KaTeX 0.16.21 is vendored (``katex/``, MIT, the same files as olmocr's), without its fonts, as olmocr ships it: the
boxes are those of Chromium's fallback fonts. Chromium is Debian's (``chromium`` on the PATH, or ``CHROMIUM``), run
as ``chromium --headless --dump-dom`` on a page that renders a batch of equations one after the other in the same
container and writes their MathML and boxes into the page; nothing else is needed (olmocr drives Chromium with
Playwright). A page or an equation that KaTeX refuses renders as an error that matches nothing.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rapidfuzz import fuzz

KATEX = Path(__file__).with_name("katex")
NEIGHBOUR_TOLERANCE = 5.0  # pixels: centres this close in x share a column, in y a row
RENDER_SECONDS = 60.0  # one Chromium run, for a batch of equations
_RESULTS = re.compile(r'<pre id="results">(.*?)</pre>', re.DOTALL)
_SEMANTICS = re.compile(r"<semantics\b[^>]*>(.*)</semantics>", re.DOTALL)
_ANNOTATION = re.compile(r"<annotation\b.*?</annotation>", re.DOTALL)
_DELIMITED = (r"\\\((.+?)\\\)", r"\\\[(.+?)\\\]")  # \(...\), \[...\]
_DOLLARS = (r"\$\$(.+?)\$\$", r"\$(.+?)\$")  # $$...$$, $...$


class MathUnavailableError(RuntimeError):
    """The math rule cannot be checked here: no Chromium, or it did not render."""


@dataclass(frozen=True)
class Glyph:
    """One character of a rendered equation and its box in CSS pixels (a span's box shared out evenly)."""

    text: str
    x: float
    y: float
    width: float
    height: float

    @property
    def centre(self) -> tuple[float, float]:
        return self.x + self.width / 2, self.y + self.height / 2


@dataclass(frozen=True)
class Rendered:
    """An equation as KaTeX rendered it: its MathML and its characters, or the error KaTeX raised."""

    mathml: str
    glyphs: tuple[Glyph, ...]
    error: str | None = None


class KatexRenderer:
    """Renders equations with the vendored KaTeX in headless Chromium, remembering each equation's render."""

    def __init__(self, chromium: str | None = None) -> None:
        found = chromium or os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
        if not found:
            raise MathUnavailableError(
                "the math rule renders with Chromium: install it (Debian: apt-get install chromium)"
            )
        self._chromium = found
        self._seen: dict[str, Rendered] = {}

    def render(self, equations: Sequence[str]) -> list[Rendered]:
        """Each equation's render, those not seen before rendered in one Chromium run."""
        fresh = list(dict.fromkeys(equation for equation in equations if equation not in self._seen))
        if fresh:
            self._seen.update(zip(fresh, self._run(fresh), strict=True))
        return [self._seen[equation] for equation in equations]

    def _run(self, equations: list[str]) -> list[Rendered]:
        with tempfile.TemporaryDirectory(prefix="pagescribe-katex-") as directory:
            page = Path(directory) / "equations.html"
            page.write_text(_page(equations), encoding="utf-8")
            command = [
                self._chromium,
                "--headless",
                "--no-sandbox",  # CI runs as root
                "--disable-gpu",
                "--hide-scrollbars",
                f"--user-data-dir={Path(directory) / 'profile'}",
                "--window-size=800,400",  # olmocr's viewport
                "--dump-dom",
                page.as_uri(),
            ]
            try:
                done = subprocess.run(  # noqa: S603 - our own page, a browser found on this machine
                    command, capture_output=True, text=True, encoding="utf-8", timeout=RENDER_SECONDS, check=False
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise MathUnavailableError(f"Chromium did not render the equations: {exc}") from exc
        found = _RESULTS.search(done.stdout)
        if found is None:
            raise MathUnavailableError(f"Chromium did not render the equations: {done.stderr.strip()[-500:]}")
        return [_rendered(result) for result in json.loads(html.unescape(found.group(1)))]


def _page(equations: list[str]) -> str:
    """The page rendering ``equations`` in turn in olmocr's container, then writing the results into the page."""
    script = """
      const container = document.getElementById("equation-container");
      const results = [];
      for (const equation of EQUATIONS) {
        container.innerHTML = "";
        try {
          katex.render(equation, container, {displayMode: true, throwOnError: true});
        } catch (error) {
          results.push({error: String(error.message)});
          continue;
        }
        const spans = [];
        for (const span of document.querySelectorAll("span")) {
          if (span.children.length === 0 && /\\S/.test(span.textContent)) {
            const box = span.getBoundingClientRect();
            spans.push([span.textContent.trim(), box.x, box.y, box.width, box.height]);
          }
        }
        const math = document.querySelector(".katex-mathml math");
        results.push({mathml: math ? math.outerHTML : "", spans: spans});
      }
      container.innerHTML = "";
      const out = document.createElement("pre");
      out.id = "results";
      out.textContent = JSON.stringify(results);
      document.body.appendChild(out);
    """.replace("EQUATIONS", json.dumps(equations).replace("</", "<\\/"))
    return f"""<!DOCTYPE html>
<html><head>
<style>
  body {{ display: flex; justify-content: center; align-items: center; height: 100vh; margin: 0;
         background-color: white; color: black; }}
  #equation-container {{ padding: 0; font-size: 24px; }}
</style>
<link rel="stylesheet" href="{(KATEX / "katex.min.css").as_uri()}">
<script src="{(KATEX / "katex.min.js").as_uri()}"></script>
</head><body><div id="equation-container"></div><script>{script}</script></body></html>
"""


def _rendered(result: dict[str, Any]) -> Rendered:
    if "error" in result:
        return Rendered(str(result["error"]), (), str(result["error"]))
    glyphs: list[Glyph] = []
    for text, x, y, width, height in result["spans"]:
        if text != "\u200b":  # a zero-width space alone is no character to match (olmocr leaves such spans out)
            glyphs += [Glyph(c, x + width * at / len(text), y, width / len(text), height) for at, c in enumerate(text)]
    return Rendered(str(result["mathml"]), tuple(glyphs))


def equations_in(page: str, *, ignore_dollar_delimited: bool = False) -> list[str]:
    """The equations the page writes, stripped: ``\\(...\\)``, then ``\\[...\\]``, then (unless
    ``ignore_dollar_delimited``) ``$$...$$`` and ``$...$``, each kind taken out of the page before the next is looked
    for."""
    equations: list[str] = []
    for pattern in _DELIMITED + (() if ignore_dollar_delimited else _DOLLARS):
        equations += [found.strip() for found in re.findall(pattern, page, re.DOTALL)]
        page = re.sub(pattern, "", page, flags=re.DOTALL)
    return equations


def check_math(fields: dict[str, Any], page: str, renderer: KatexRenderer) -> tuple[bool, str]:
    """The ``math`` rule on a page: whether it passed, and why not."""
    expected = str(fields["math"])
    equations = equations_in(page, ignore_dollar_delimited=bool(fields.get("ignore_dollar_delimited")))
    if expected in equations:
        return True, ""
    if not equations:
        return False, f"no equation on the page to compare with {expected!r}"
    equations.sort(key=lambda equation: -fuzz.ratio(equation, expected))  # the likeliest first, as olmocr
    reference, *renders = renderer.render([expected, *equations])
    if any(rendered_alike(reference, hypothesis) for hypothesis in renders):
        return True, ""
    return False, f"no equation on the page renders like {expected!r} ({len(equations)} equations looked at)"


def mathml_content(mathml: str) -> str:
    """What the MathML says: the content of its ``<semantics>`` but the TeX annotation (the whole of it where it has
    none), white space removed."""
    found = _SEMANTICS.search(mathml)
    inner = _ANNOTATION.sub("", found.group(1)) if found else mathml
    return re.sub(r"\s+", "", inner)


def rendered_alike(reference: Rendered, hypothesis: Rendered) -> bool:
    """The hypothesis renders like the reference: its MathML holds the reference's, or the reference's characters
    map one to one onto its characters with their neighbours (see the module's description)."""
    if mathml_content(reference.mathml) in mathml_content(hypothesis.mathml):
        return True
    wanted, offered = reference.glyphs, hypothesis.glyphs
    candidates = [[at for at, glyph in enumerate(offered) if glyph.text == char.text] for char in wanted]
    if not all(candidates):
        return False
    return _Mapping(wanted, offered, candidates).complete(0)


_DIRECTIONS = ("up", "down", "left", "right")


def _neighbours(glyphs: Sequence[Glyph]) -> list[dict[str, int | None]]:
    """Each character's nearest character above, below, left and right: centres within NEIGHBOUR_TOLERANCE of its
    column (or row), the nearest by that distance, the first of equals."""
    return [_nearest_each_way(glyph, glyphs) for glyph in glyphs]


def _nearest_each_way(glyph: Glyph, glyphs: Sequence[Glyph]) -> dict[str, int | None]:
    """The index of ``glyph``'s nearest other character in each direction (see :func:`_neighbours`), or None."""
    centre = glyph.centre
    best: dict[str, tuple[float, int] | None] = dict.fromkeys(_DIRECTIONS)
    for at, other in enumerate(glyphs):
        if other is glyph:
            continue
        for direction, distance, aligned in _offsets(centre, other.centre):
            current = best[direction]
            if distance > 0 and aligned <= NEIGHBOUR_TOLERANCE and (current is None or distance < current[0]):
                best[direction] = (distance, at)
    return {direction: None if value is None else value[1] for direction, value in best.items()}


def _offsets(centre: tuple[float, float], other: tuple[float, float]) -> tuple[tuple[str, float, float], ...]:
    """How far ``other`` lies each way from ``centre`` (negative: the other way), and how far off that line."""
    (x, y), (ox, oy) = centre, other
    return (
        ("up", y - oy, abs(ox - x)),
        ("down", oy - y, abs(ox - x)),
        ("left", x - ox, abs(oy - y)),
        ("right", ox - x, abs(oy - y)),
    )


class _Mapping:
    """A search for a one-to-one map of the reference's characters onto the hypothesis's that keeps neighbours."""

    def __init__(self, wanted: Sequence[Glyph], offered: Sequence[Glyph], candidates: list[list[int]]) -> None:
        self._wanted, self._offered, self._candidates = wanted, offered, candidates
        self._near_wanted, self._near_offered = _neighbours(wanted), _neighbours(offered)
        self._map: dict[int, int] = {}
        self._used: set[int] = set()

    def complete(self, at: int) -> bool:
        """Whether the map of the first ``at`` characters extends to all of them."""
        if at == len(self._wanted):
            return True
        for candidate in self._candidates[at]:
            if candidate in self._used or not self._keeps_neighbours(at, candidate):
                continue
            self._map[at] = candidate
            self._used.add(candidate)
            if self.complete(at + 1):
                return True
            self._used.discard(candidate)
            del self._map[at]
        return False

    def _keeps_neighbours(self, at: int, candidate: int) -> bool:
        for direction in _DIRECTIONS:
            near = self._near_wanted[at][direction]
            if near is None:
                continue
            their = self._near_offered[candidate][direction]
            if their is None:
                return False
            if near in self._map:
                if self._map[near] != their:
                    return False
            elif self._offered[their].text != self._wanted[near].text:
                return False
        return True
