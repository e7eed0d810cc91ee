"""Page layout from positioned text: lines in reading order, columns read one after the other, as text.

The offline OCR engine gives positioned boxes of text (:mod:`pagescribe.layout.boxes`); so does a PDF's text layer.
Both are laid out here the same way. The text is the lines in reading order, top to bottom and left to right, with a
blank line where the gap between two lines is large; a page with no text reads :data:`BLANK_PAGE`, as the vision
prompt asks (:mod:`pagescribe.layout.markdown`, with :mod:`~pagescribe.layout.tables` and
:mod:`~pagescribe.layout.headings`).
Columns of running text are read one after the other (:mod:`pagescribe.layout.columns`): a column section is found
by its gutter, a band of white through many consecutive lines with prose on both sides (in the manner of
whitespace-gutter and recursive X-Y cut page segmentation), and the rows above and below it keep their place.
Anything else side by side at the same height (table cells, form fields, a figure's labels beside text) is joined on
one line, as is a short column section (fewer than COLUMN_MIN_ROWS lines).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

from pagescribe.layout.boxes import Figure, TextBox, latin_punctuation, rows_of
from pagescribe.layout.columns import reading_order
from pagescribe.layout.markdown import PageNumbers, markdown


def boxes_to_text(
    boxes: Iterable[TextBox], *, page_numbers: PageNumbers = "mark", figures: Sequence[Figure] = ()
) -> str:
    """The boxes as markdown, their lines in reading order (:func:`~pagescribe.layout.markdown.markdown`), with a
    :data:`~pagescribe.layout.boxes.FIGURE` line where each of ``figures`` falls in that order."""
    boxes = [replace(box, text=latin_punctuation(box.text)) for box in boxes]
    lines = reading_order(boxes) if all(box.right is not None for box in boxes) else rows_of(boxes)
    return markdown(lines, page_numbers, figures)
