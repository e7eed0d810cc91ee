"""Figures on a page image: the regions of ink that no recognised text accounts for.

Pillow only, as in :mod:`pagescribe.orientation`. The recognised text boxes are painted over with the page's ground
(its commonest grey: white paper, a scan's tint, a dark slide), the rest of the page is binarised (ink differs from
the ground by more than INK_CONTRAST) and cut into square cells about 1/GRID_CELLS of the long edge wide, each holding
the share of its pixels that are ink. Inked cells are grouped with their neighbours up to JOIN_CELLS cells away (the
panels of a figure, the bars of a chart), and a group is a figure when its extent is at least FIGURE_MIN_WIDTH of the
page's width and FIGURE_MIN_HEIGHT of its height, no more than FIGURE_MAX_ASPECT times as long one way as the other,
and SOLID_SHARE of the cells of that extent or more are solidly inked (SOLID_INK of their pixels or more). The rules
and frames of tables and forms, underlines, coloured bars and the odd symbols the recognition did not read are thin,
narrow or small, and are no figure.
"""

from __future__ import annotations

from collections.abc import Iterable

from PIL import Image, ImageDraw

from pagescribe.layout.boxes import Figure, TextBox

INK_CONTRAST = 55  # a pixel this much darker or lighter than the page's ground (of 255) is ink
GRID_CELLS = 160  # the long edge is cut into about this many cells
JOIN_CELLS = 2  # inked cells at most this many cells apart are one group
FIGURE_MIN_WIDTH = 0.12  # a figure spans at least this share of the page's width,
FIGURE_MIN_HEIGHT = 0.06  # ... this share of its height,
FIGURE_MAX_ASPECT = 5.0  # ... is at most this many times as wide as it is tall, or as tall as it is wide (a bar),
SOLID_INK = 0.3  # ... and a cell with at least this share of its pixels inked is solid;
SOLID_SHARE = 0.12  # ... at least this share of the cells of a figure's extent are (not a form's or a scan's frame)
TEXT_MARGIN = 0.25  # a text box is painted over with this many of its heights around it


_Cell = tuple[int, int]  # a cell of the grid: its column and its row


def find_figures(image: Image.Image, boxes: Iterable[TextBox]) -> list[Figure]:
    """The figures of the page image whose text was recognised in ``boxes``, top to bottom."""
    gray, ground = _text_painted_over(image, boxes)
    cell = max(2, round(max(gray.size) / GRID_CELLS))
    columns, rows = max(1, gray.width // cell), max(1, gray.height // cell)
    binary = gray.point(lambda value: 255 if abs(value - ground) > INK_CONTRAST else 0)
    shares = binary.resize((columns, rows), Image.Resampling.BOX).tobytes()
    inked = {(at % columns, at // columns) for at, share in enumerate(shares) if share}
    figures: list[Figure] = []
    while inked:
        group = _group(inked)
        xs, ys = [x for x, _ in group], [y for _, y in group]
        width, height = max(xs) - min(xs) + 1, max(ys) - min(ys) + 1
        solid = sum(shares[y * columns + x] >= SOLID_INK * 255 for x, y in group)
        if (
            width >= FIGURE_MIN_WIDTH * columns
            and height >= FIGURE_MIN_HEIGHT * rows
            and max(width / height, height / width) <= FIGURE_MAX_ASPECT
            and solid >= SOLID_SHARE * width * height
        ):
            figures.append(Figure(min(xs) * cell, min(ys) * cell, (max(xs) + 1) * cell, (max(ys) + 1) * cell))
    return sorted(figures, key=lambda figure: (figure.top, figure.left))


def _text_painted_over(image: Image.Image, boxes: Iterable[TextBox]) -> tuple[Image.Image, int]:
    """The page in grey with each text box (and TEXT_MARGIN of its height around it) painted over with the page's
    ground, and that ground: its commonest grey."""
    gray = image.convert("L")
    histogram = gray.histogram()
    ground = histogram.index(max(histogram))
    draw = ImageDraw.Draw(gray)
    for box in boxes:
        margin = TEXT_MARGIN * (box.bottom - box.top)
        right = box.right if box.right is not None else gray.width
        draw.rectangle((box.left - margin, box.top - margin, right + margin, box.bottom + margin), fill=ground)
    return gray, ground


def _group(inked: set[_Cell]) -> list[_Cell]:
    """One of the inked cells with all those joined to it (at most JOIN_CELLS apart, one after another), taken out of
    ``inked``."""
    group = [inked.pop()]
    reach = range(-JOIN_CELLS, JOIN_CELLS + 1)
    for x, y in group:  # the list grows while it is walked: a breadth-first search
        for other in [(x + dx, y + dy) for dx in reach for dy in reach]:
            if other in inked:
                inked.remove(other)
                group.append(other)
    return group
