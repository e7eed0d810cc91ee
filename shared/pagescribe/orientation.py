"""Page orientation from the pixels alone: the quarter turn that makes a page's text read upright.

No model and no OCR, Pillow and the standard library only: every pass over the pixels runs in Pillow's C code
(convert, point, reduce, resize to one-pixel-wide profiles, an affine shear); Python only reads the profiles. On a
binarised copy of the page (Otsu's threshold; a page without clear ink is left alone) four cues are measured:

1. Axis. The page is cut into square cells. In a cell of horizontal text lines the row profile (ink per row)
   alternates between lines and the gaps between them while the column profile is flat; vertical lines do the
   opposite. Each cell votes for the profile that varies clearly more.
2. Ascenders. With the lines turned horizontal (and levelled, when they drift more than half a degree: the drift is
   the median shift of the same line from one strip to the next), the page is cut into strips 64 px wide and each
   text line in a strip is split into its dense core (the x-height band) and the ink above and below it. Latin
   ascenders (b d f h k l t, capitals, digits, i dots and accents) outnumber descenders (g j p q y) about three to
   one, so a line votes "up" when clearly more of that ink lies above its core, "down" when more lies below.
3. Reach. The same lines vote again on which side their ink reaches further from the core: ascenders are taller
   than descenders are deep.
4. Line starts. Left-to-right text starts its lines at shared left edges and ends them raggedly (paragraph ends,
   ragged-right setting); turned by 180 degrees the shared edges are on the right.

Policy, because a wrong turn of an upright page is far worse than a missed one. The axis needs three in four of the
cells' votes. A sideways page (the axis alone shows it is turned) is turned by 90 or 270 degrees when the ascender
votes clear a sign test (20 votes, z >= 4, 70 % agreeing; z >= 3 and 65 % when the line starts agree) and the line
starts do not contradict them. A page with horizontal lines is turned by 180 degrees only when the ascender votes
clear a high bar (40 votes, z >= 5, 75 % down), the reach votes agree and the line starts do not contradict. Anything
else is 0, including a sideways page whose direction is unclear: a guess would turn it upside down half the time,
and its lines may be vertical by design. Blank pages, photographs, drawings and pages of a few words stay at 0.

Limitations. The direction cues are those of Latin script (Cyrillic and Greek, tried on rendered text, showed no
lean either way and stay at 0). Hebrew with vowel points has more ink below its lines than above, as upside-down
Latin does, and the right-aligned lines of any right-to-left script look like upside-down left-to-right text: on
small or blurred pointed Hebrew the detector can turn an upright page by 180 degrees, and a sideways Hebrew page may
be turned the wrong way. Vertical East Asian text, tables, forms, charts and maps mostly stay at 0; so do text lines
skewed by more than about six degrees, text with an x-height under 4 px and light text on a dark ground.
"""

from __future__ import annotations

import bisect
import itertools
import math
import re
import statistics
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

from PIL import Image

_WORK_EDGE = 1600  # px: larger pages are reduced to about this long edge first
_MIN_CONTRAST = 64  # grey levels between mean ink and mean paper; less is a blank or flat page
_CELLS_PER_EDGE = 12  # axis cells are about long edge / 12 px (of the half-size copy), within _CELL_RANGE
_CELL_RANGE = (24, 80)
_CELL_INK = (0.01, 0.5)  # share of inked pixels for a cell to vote on the axis
_CELL_CONTRAST = 1.5  # a cell votes when one profile's coefficient of variation is this many times the other's
_CELL_COVER = 0.6  # ... and ink reaches this share of the profile along the lines (lines of text span the cell)
_AXIS_MIN_CELLS = 6
_AXIS_SHARE = 0.75  # share of the axis votes the axis needs
_STRIP = 64  # px: width of the strips whose lines vote on ascenders
_SKEW = 0.009  # lines drifting more than this (about half a degree) are levelled before they vote
_CORE = 0.5  # a line's core: its rows with at least this share of the ink of the line's upper-quartile row
_MIN_CORE = 4  # px: a smaller core is too small to tell ascenders from it
_LINE_MARGIN = 0.2  # a line votes when (above - below) / (above + below) is beyond +-this
_REACH_INK = 0.08  # a row outside the core counts as reached when it has this share of the core's mean ink per row
_REACH_MARGIN = 0.15  # core heights by which one side must reach further than the other for a line to vote
_ALIGN_MIN = 6  # rows by which one edge must be better aligned than the other for the line starts to count
_ALIGN_MARGIN = 0.25  # the same as a share of the aligned rows
# Stretches of ink along a row of the alignment copy (bins of half an x-height): gaps up to two x-heights join words
# into a line, and a line shorter than eight x-heights is too short to say where lines start.
_ROW_STRETCH = re.compile(rb"[^\x00]+(?:\x00{1,4}[^\x00]+)*")
_MIN_STRETCH = 16
_INKED_ROWS = re.compile(rb"[\x02-\xff]+")  # runs of rows of a strip profile with any ink
_SQUARES = [value * value for value in range(256)]


@dataclass(frozen=True)
class Orientation:
    """How to turn a page image so that its text reads upright.

    ``angle`` is 0, 90, 180 or 270, degrees clockwise: the argument for :func:`upright`. ``confidence`` (0 to 1) is
    the share of the evidence that supports that angle: the share of the axis votes for its axis times the share of
    the line votes for its direction. 0.0 with angle 0 means there was no evidence that the page is upright (a blank
    page, a picture, too few lines, or lines found sideways whose direction was unclear); a low confidence with
    angle 0 means the page may be turned but the evidence was not clear enough to turn it.
    """

    angle: int
    confidence: float


@dataclass(frozen=True)
class _Evidence:
    """Votes measured on a page; ``up`` to ``right`` are read with the lines turned horizontal if they were not."""

    horizontal: int  # axis cells whose lines run across the image as given
    vertical: int  # axis cells whose lines run up and down it
    up: int  # lines with clearly more ink above their core than below
    down: int  # lines with clearly more ink below their core than above
    reach_up: int  # lines whose ink reaches clearly further above their core than below
    reach_down: int  # lines whose ink reaches clearly further below their core than above
    left: int  # rows whose line starts at a commonly shared left edge
    right: int  # rows whose line ends at a commonly shared right edge


@dataclass(frozen=True)
class _Bar:
    """What the line votes need to decide a direction: how many, the sign test's z, the share that agrees."""

    votes: int
    z: float
    share: float


_SIDEWAYS = _Bar(votes=20, z=4.0, share=0.7)  # the axis already shows the page is turned: only which way
_SIDEWAYS_ALIGNED = _Bar(votes=20, z=3.0, share=0.65)  # the same when the line starts agree
_UPSIDE_DOWN = _Bar(votes=40, z=5.0, share=0.75)  # turning a page that may be upright needs more
_REACH_DOWN = _Bar(votes=20, z=3.0, share=0.7)  # ... and the reach votes to agree


def upright(image: Image.Image, angle: int) -> Image.Image:
    """``image`` turned clockwise by ``angle`` degrees (0, 90, 180 or 270), losslessly; a copy when 0."""
    turns = {90: Image.Transpose.ROTATE_270, 180: Image.Transpose.ROTATE_180, 270: Image.Transpose.ROTATE_90}
    if angle == 0:
        return image.copy()
    if angle not in turns:
        raise ValueError(f"angle must be 0, 90, 180 or 270, not {angle}")
    return image.transpose(turns[angle])


def detect_orientation(image: Image.Image) -> Orientation:
    """The clockwise quarter turn that makes the page's text read upright: 0 unless the evidence is clear."""
    ink = _ink(image)
    return Orientation(0, 0.0) if ink is None else _decide(_evidence(ink))


def _decide(ev: _Evidence) -> Orientation:
    """The answer the votes support under the module's policy."""
    axis_votes, line_votes = ev.horizontal + ev.vertical, ev.up + ev.down
    if axis_votes == 0 or line_votes == 0:
        return Orientation(0, 0.0)
    clear = max(_AXIS_MIN_CELLS, _AXIS_SHARE * axis_votes)
    if ev.vertical >= clear and (lean := _direction(ev, _SIDEWAYS, _SIDEWAYS_ALIGNED)):
        # the lines were read after a quarter turn anticlockwise: upright there is 270 degrees clockwise from the image
        angle, axis, agree = (270, ev.vertical, ev.up) if lean > 0 else (90, ev.vertical, ev.down)
    elif ev.horizontal >= clear and _upside_down(ev):
        angle, axis, agree = 180, ev.horizontal, ev.down
    else:  # lines read sideways say nothing of whether the page is upright
        angle, axis, agree = 0, ev.horizontal, ev.up if ev.horizontal >= ev.vertical else 0
    return Orientation(angle, round(axis / axis_votes * agree / line_votes, 3))


def _upside_down(ev: _Evidence) -> bool:
    """The horizontal lines read upside down beyond doubt: the ink votes clear the high bar, the reach votes agree
    and the line starts do not contradict them."""
    return _direction(ev, _UPSIDE_DOWN) < 0 and _sign_test(ev.reach_up, ev.reach_down, _REACH_DOWN) < 0


def _direction(ev: _Evidence, bar: _Bar, aligned_bar: _Bar | None = None) -> int:
    """+1 when the lines read upright as measured, -1 when upside down, 0 when unclear.

    The ink votes must clear ``bar``, or ``aligned_bar`` when the line starts agree; never against the line starts.
    """
    aligned = _aligned(ev)
    lean = _sign_test(ev.up, ev.down, bar)
    if not lean and aligned_bar and _sign_test(ev.up, ev.down, aligned_bar) == aligned:
        lean = aligned
    return 0 if lean * aligned < 0 else lean


def _sign_test(up: int, down: int, bar: _Bar) -> int:
    """+1 when the up votes clear ``bar``, -1 when the down votes do, else 0."""
    votes, lead = up + down, up - down
    if votes < bar.votes or abs(lead) < bar.z * math.sqrt(votes) or max(up, down) < bar.share * votes:
        return 0
    return 1 if lead > 0 else -1


def _aligned(ev: _Evidence) -> int:
    """+1 when clearly more line starts share a left edge than line ends a right edge (left-to-right text as
    measured), -1 for the opposite, 0 when neither (justified text, no text)."""
    lead = ev.left - ev.right
    if abs(lead) < max(_ALIGN_MIN, _ALIGN_MARGIN * (ev.left + ev.right)):
        return 0
    return 1 if lead > 0 else -1


def _ink(image: Image.Image) -> Image.Image | None:
    """The page reduced to about ``_WORK_EDGE`` px, ink 255 and paper 0; None when it has no clear ink."""
    if image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info:
        rgba = image.convert("RGBA")
        image = Image.alpha_composite(Image.new("RGBA", rgba.size, "white"), rgba)
    grey = image.convert("L")
    factor = math.ceil(max(grey.size) / _WORK_EDGE)
    if factor > 1:
        grey = grey.reduce(factor)
    threshold = _otsu(grey.histogram())
    if threshold is None:
        return None
    return grey.point([255 if level <= threshold else 0 for level in range(256)])


def _otsu(histogram: list[int]) -> int | None:
    """The grey level that best splits ink from paper (Otsu's method); None when the two are too close in tone."""
    total = sum(histogram)
    weighted = sum(level * count for level, count in enumerate(histogram))
    best, threshold, contrast = 0.0, None, 0.0
    dark = dark_weighted = 0
    for level, count in enumerate(histogram[:-1]):
        dark += count
        dark_weighted += level * count
        light = total - dark
        if dark == 0 or light == 0:
            continue
        gap = (weighted - dark_weighted) / light - dark_weighted / dark
        spread = dark * light * gap * gap
        if spread > best:
            best, threshold, contrast = spread, level, gap
    return threshold if contrast >= _MIN_CONTRAST else None


def _profiles(ink: Image.Image, width: int) -> list[bytes]:
    """The image cut into vertical strips about ``width`` px wide: for each, the mean ink of every row (0-255)."""
    strips = max(1, round(ink.width / width))
    data = ink.resize((strips, ink.height), Image.Resampling.BOX).tobytes()
    return [data[strip::strips] for strip in range(strips)]


def _column_profiles(ink: Image.Image, height: int) -> list[bytes]:
    """The image cut into horizontal strips about ``height`` px high: for each, the mean ink of every column."""
    strips = max(1, round(ink.height / height))
    data = ink.resize((ink.width, strips), Image.Resampling.BOX).tobytes()
    return [data[strip * ink.width : (strip + 1) * ink.width] for strip in range(strips)]


def _variation(values: bytes) -> float:
    """Coefficient of variation: standard deviation over mean; 0 without ink."""
    mean = sum(values) / len(values)
    if mean == 0:
        return 0.0
    square = sum(map(_SQUARES.__getitem__, values)) / len(values)
    return math.sqrt(max(0.0, square - mean * mean)) / mean


def _covered(profile: bytes) -> bool:
    """Ink reaches most of the profile: lines of text run right across a cell, a column of figures does not."""
    return len(profile) - profile.count(0) >= _CELL_COVER * len(profile)


def _axis_votes(ink: Image.Image) -> tuple[int, int]:
    """Cells voting for horizontal lines and cells voting for vertical lines."""
    cell = max(_CELL_RANGE[0], min(_CELL_RANGE[1], max(ink.size) // _CELLS_PER_EDGE))
    rows, columns = _profiles(ink, cell), _column_profiles(ink, cell)
    cell_width, cell_height = ink.width / len(rows), ink.height / len(columns)
    horizontal = vertical = 0
    for i, row_profile in enumerate(rows):
        x0, x1 = int(i * cell_width), int((i + 1) * cell_width)
        for j, column_profile in enumerate(columns):
            y0, y1 = int(j * cell_height), int((j + 1) * cell_height)
            per_row, per_column = row_profile[y0:y1], column_profile[x0:x1]
            if not _CELL_INK[0] * 255 <= sum(per_row) / len(per_row) <= _CELL_INK[1] * 255:
                continue
            row_variation, column_variation = _variation(per_row), _variation(per_column)
            if row_variation > _CELL_CONTRAST * column_variation and _covered(per_column):
                horizontal += 1
            elif column_variation > _CELL_CONTRAST * row_variation and _covered(per_row):
                vertical += 1
    return horizontal, vertical


def _lines(profile: bytes) -> Iterator[tuple[int, int, int, int]]:
    """Text lines in a row profile: (top, core top, core bottom, bottom), core bottom inclusive, bottom exclusive.

    A run of inked rows holds one line or several touching ones, one per dense core; the least inked rows between two
    cores belong to neither line, which keeps the split the same when the page is upside down.
    """
    for inked in _INKED_ROWS.finditer(profile):
        start, run = inked.start(), inked.group()
        if len(run) < 4 or max(run) < 16:
            continue
        cores = _cores(run)
        top = 0
        for k, (core_top, core_bottom) in enumerate(cores):
            bottom = next_top = len(run)
            if k + 1 < len(cores):
                bottom, next_top = _least_inked(run, core_bottom + 1, cores[k + 1][0])
            yield start + top, start + core_top, start + core_bottom, start + bottom
            top = next_top


def _cores(run: bytes) -> list[list[int]]:
    """The dense cores of a run of inked rows (first and last row, inclusive): rows with _CORE of the ink of the
    run's upper-quartile row or more, at most 3 rows apart."""
    dense = _CORE * sorted(run)[(3 * len(run) - 3) // 4]
    cores: list[list[int]] = []
    for i, value in enumerate(run):
        if value < dense:
            continue
        if cores and i - cores[-1][1] <= 3:
            cores[-1][1] = i
        else:
            cores.append([i, i])
    return cores


def _least_inked(run: bytes, start: int, stop: int) -> tuple[int, int]:
    """The first and the last row (exclusive) of the least inked rows of the run between ``start`` and ``stop``."""
    between = run[start:stop]
    least = min(between)
    lowest = [start + i for i, value in enumerate(between) if value == least]
    return lowest[0], lowest[-1] + 1


def _text_lines(profile: bytes, smallest: int) -> list[tuple[int, int, int, int]]:
    """The lines of a row profile (see :func:`_lines`) whose core is at least ``smallest`` px high and at most twice
    the median core: smaller ones cannot show ascenders, larger ones are not lines of text."""
    lines = list(_lines(profile))
    if not lines:
        return []
    typical = statistics.median(core_bottom - core_top + 1 for _, core_top, core_bottom, _ in lines)
    return [line for line in lines if smallest <= line[2] - line[1] + 1 <= 2 * typical]


def _line_votes(frame: Image.Image) -> tuple[int, int, int, int, float]:
    """Votes of the text lines in every strip of a frame of horizontal lines, and their median core height (the
    x-height, px). Two votes per line: where more of its ink outside the core lies (up, down), and which side that
    ink reaches further from the core (reach up, reach down)."""
    up = down = reach_up = reach_down = 0
    cores: list[int] = []
    for profile in _profiles(frame, _STRIP):
        for top, core_top, core_bottom, bottom in _text_lines(profile, _MIN_CORE):
            height = core_bottom - core_top + 1
            core = sum(profile[core_top : core_bottom + 1])
            above, below = sum(profile[top:core_top]), sum(profile[core_bottom + 1 : bottom])
            if above + below < 0.05 * core:
                continue
            cores.append(height)
            lean = (above - below) / (above + below)
            up, down = up + (lean > _LINE_MARGIN), down + (lean < -_LINE_MARGIN)
            faint = max(2.0, _REACH_INK * core / height)
            higher = next((core_top - y for y in range(top, core_top) if profile[y] >= faint), 0)
            lower = next((y - core_bottom for y in range(bottom - 1, core_bottom, -1) if profile[y] >= faint), 0)
            reach_up += higher > lower + _REACH_MARGIN * height
            reach_down += lower > higher + _REACH_MARGIN * height
    return up, down, reach_up, reach_down, statistics.median(cores) if cores else 0.0


def _slope(half: Image.Image) -> float:
    """How far the text lines drift down per px across, measured on a half-size frame: the median shift of a line's
    core from one strip to the next, each core paired with the nearest one in the next strip if it is less than a
    core height away; 0 with fewer than ten pairs."""
    profiles = _profiles(half, _STRIP)
    lines = [_text_lines(profile, _MIN_CORE // 2) for profile in profiles]
    heights = [core_bottom - core_top + 1 for strip in lines for _, core_top, core_bottom, _ in strip]
    if not heights:
        return 0.0
    window = statistics.median(heights)
    shifts = []
    for here, there in itertools.pairwise([[(line[1] + line[2]) / 2 for line in strip] for strip in lines]):
        for centre in here:
            i = bisect.bisect_left(there, centre)
            nearest = min(there[max(0, i - 1) : i + 1], key=lambda other: abs(other - centre), default=None)
            if nearest is not None and abs(nearest - centre) <= window:
                shifts.append(nearest - centre)
    return statistics.median(shifts) / (half.width / len(profiles)) if len(shifts) >= 10 else 0.0


def _level(frame: Image.Image, slope: float) -> Image.Image:
    """``frame`` sheared vertically so that lines drifting down by ``slope`` px per px across run level."""
    rise = abs(slope) * frame.width
    size = (frame.width, frame.height + math.ceil(rise))
    shear = (1, 0, 0, slope, 1, -rise if slope > 0 else 0)
    return frame.transform(size, Image.Transform.AFFINE, shear, Image.Resampling.NEAREST)


def _alignment(frame: Image.Image, x_height: float, slope: float) -> tuple[int, int]:
    """Rows whose line starts at a left edge shared with other rows, and rows whose line ends at a shared right edge.

    The frame (horizontal lines) is reduced to bins of half an x-height across and one x-height down; along each row
    the stretches of ink are the lines. An edge is shared when at least a tenth of all the stretches (and six) start
    (end) within a bin of it. On a skewed page the edges lean by ``slope`` (the lines' drift) the other way, which is
    taken back before the edges are compared.
    """
    across = max(1, min(frame.width, round(x_height / 2)))
    down = max(1, min(frame.height, round(x_height)))
    small = frame.reduce((across, down)).point([0] * 26 + [255] * 230)
    width, data = small.width, small.tobytes()
    starts: Counter[int] = Counter()
    ends: Counter[int] = Counter()
    for y in range(small.height):
        lean = round(slope * y * down / across) - y * width
        for stretch in _ROW_STRETCH.finditer(data, y * width, (y + 1) * width):
            if stretch.end() - stretch.start() >= _MIN_STRETCH:
                starts[stretch.start() + lean] += 1
                ends[stretch.end() + lean] += 1
    shared = max(6.0, 0.1 * starts.total())

    def on_shared_edge(edges: Counter[int]) -> int:
        return sum(count for x, count in edges.items() if edges[x - 1] + count + edges[x + 1] >= shared)

    return on_shared_edge(starts), on_shared_edge(ends)


def _evidence(ink: Image.Image) -> _Evidence:
    """Every vote on a binarised page."""
    half = ink.reduce(2)
    horizontal, vertical = _axis_votes(half)
    frame, half_frame = ink, half
    if vertical > horizontal:
        frame, half_frame = ink.transpose(Image.Transpose.ROTATE_90), half.transpose(Image.Transpose.ROTATE_90)
    slope = _slope(half_frame)
    if abs(slope) > _SKEW:
        frame = _level(frame, slope)
    up, down, reach_up, reach_down, x_height = _line_votes(frame)
    left, right = _alignment(frame, x_height, slope) if x_height else (0, 0)
    return _Evidence(horizontal, vertical, up, down, reach_up, reach_down, left, right)
