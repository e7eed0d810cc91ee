"""Assemble a finished document's pages into transcripts/<id>.md and .json in the bucket."""

from __future__ import annotations

import json
import logging
import re
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from pagescribe.aws import ObjectStore
from pagescribe.checks import PageFlag, describe_flags
from pagescribe.chunking import chunk_transcript
from pagescribe.domain import AttemptRecord, DocumentRecord, DocumentStatus, JobStatus, PageRecord
from pagescribe.layout.markdown import is_page_number
from pagescribe.settings import Settings
from pagescribe.status import chunks_key
from pagescribe.store.ports import Store

if TYPE_CHECKING:
    from pagescribe.blocks import Block, Cell

log = logging.getLogger(__name__)

RUNNING_EDGE = 2  # running headers and footers are among a page's first and last this many lines of text
_HEADING_MARK = re.compile(r"^#{1,6}\s+")
_NUMBER = re.compile(r"\d+")
# A comment in a page's text that reads as one of this file's own markers (a page's, or the document's): a page can
# make a model write one, and a reader splitting the file at markers would take it for a page of its own
_FORGED_MARKER = re.compile(r"<!--(?=\s*(?:page\s+\d+\s+of\s+\d+|pagescribe\s+document)\b)", re.IGNORECASE)
FORGED_MARKER_SHOWN = "<!-- in the page's text:"
_DOUBLE_HYPHEN = re.compile(r"-(?=-)")
_BLANK_LINES = re.compile(r"\n[ \t]*\n(?:[ \t]*\n)+")  # three line breaks or more with only blanks between
# The offline engine's comment for a page's furniture, as pagescribe.blocks reads it
_FURNITURE_COMMENT = re.compile(r"<!--\s*(page number|running header|running footer)\s*:\s*(.*?)\s*-->")
_WHITESPACE = re.compile(r"\s+")


def _comment_safe(text: str) -> str:
    """Text that cannot end the HTML comment it is written in: no two hyphens side by side (``-->`` and ``--!>``
    end a comment, and replacing ``--`` once leaves ``--->`` as ``- -->``), nor a line break (a marker is one line)."""
    return _DOUBLE_HYPHEN.sub("- ", _WHITESPACE.sub(" ", text))


def _page_marker(page: PageRecord, page_count: int) -> str:
    """``<!-- page 2 of 7 (provider model) flags: rotated=90 (threshold 0) -->``; a page that failed says why, and a
    page a person corrected says so: ``<!-- page 2 of 7 (provider model) corrected (revision 1, <when>) -->`` (the
    flags are the model's answer's)."""
    if page.status is JobStatus.COMPLETED:
        escalated = "; escalated" if page.escalation else ""
        said = f" ({page.provider} {page.model}{escalated})"
    else:
        said = f": {page.status.value}: {page.error or 'no reason'}"
    if page.correction is not None:
        said += f" corrected (revision {page.correction.revision}, {page.correction.corrected_at.isoformat()})"
    if page.flags:
        said += " flags: " + describe_flags([PageFlag.from_dict(flag) for flag in page.flags])
    return f"<!-- page {page.page_number} of {page_count}{_comment_safe(said)} -->"


def _running_key(line: str) -> str:
    """What a line has in common with itself on other pages: no heading marker, numbers as ``#`` (``Page 2 of 4``),
    whitespace collapsed, case folded."""
    return _NUMBER.sub("#", " ".join(_HEADING_MARK.sub("", line).split())).casefold()


def _edges(text: str) -> list[tuple[int, str]]:
    """The page's first and last RUNNING_EDGE lines of text (no blank, comment or table line: a table's header
    repeated on the next page stays the table's), by index and place."""
    found = [at for at, line in enumerate(text.splitlines()) if line.strip() and line.lstrip()[:1] not in ("<", "|")]
    return [(at, "header") for at in found[:RUNNING_EDGE]] + [
        (at, "footer") for at in found[-RUNNING_EDGE:] if at not in found[:RUNNING_EDGE]
    ]


def running_furniture(texts: Sequence[str | None]) -> list[dict[int, str]]:
    """Each page's running headers and footers: the index of the line to ``running header`` or ``running footer``
    (``page number`` for a line that reads as one alone).

    A line is one when, with its numbers taken as any number, it stands among the first (or last) RUNNING_EDGE lines
    of text of two pages or more and of at least half of the document's pages with text: the pages are transcribed
    one by one, and only the document shows what comes back on each of them."""
    edges = [_edges(text or "") for text in texts]
    lines = [(text or "").splitlines() for text in texts]
    counts: Counter[tuple[str, str]] = Counter()
    for page, page_edges in zip(lines, edges, strict=True):
        counts.update({(place, _running_key(page[at])) for at, place in page_edges})
    with_text = sum(bool(page_edges) for page_edges in edges)
    return [
        {
            at: "page number" if is_page_number(page[at]) else f"running {place}"
            for at, place in page_edges
            if counts[place, _running_key(page[at])] >= 2 and 2 * counts[place, _running_key(page[at])] >= with_text
        }
        for page, page_edges in zip(lines, edges, strict=True)
    ]


def _furnished(text: str, furniture: dict[int, str], mode: str) -> list[str]:
    """The text's lines with its running headers, footers and page numbers (those the document shows, and the
    offline engine's comments saying one) as ``mode`` asks: ``mark``, as comments (``<!-- running header: CUI -->``);
    ``drop``, gone (a blank line in their place); ``keep``, as text. Line for line, so that offsets into the text
    still find their lines."""
    lines = text.splitlines()
    for at, line in enumerate(lines):
        said = _FURNITURE_COMMENT.fullmatch(line.strip())
        if said:
            lines[at] = _said_furniture(line, said, mode)
        elif at in furniture:
            lines[at] = _found_furniture(line, furniture[at], mode)
    return lines


def _said_furniture(line: str, said: re.Match[str], mode: str) -> str:
    """A comment saying what furniture its words are (the offline engine's) as ``mode`` asks: left as it is to mark
    it, gone to drop it, its words to keep them."""
    if mode == "mark":
        return line
    return "" if mode == "drop" else said.group(2)


def _found_furniture(line: str, kind: str, mode: str) -> str:
    """A line of furniture of the ``kind`` found in the document as ``mode`` asks: a comment holding its words (a
    heading's marks taken off) to mark it, gone to drop it, as it is to keep it."""
    if mode == "mark":
        return f"<!-- {kind}: {_comment_safe(_HEADING_MARK.sub('', line).strip())} -->"
    return "" if mode == "drop" else line


class Read(NamedTuple):
    """What the finish reads of a document's pages once, for both transcripts: each page's running furniture (by
    page, as :func:`running_furniture` gives it) and its blocks (by page number)."""

    running: list[dict[int, str]]
    blocks: dict[int, list[Block]]


def read_pages(pages: Sequence[PageRecord]) -> Read:
    running = running_furniture([page.current_text or "" for page in pages])
    return Read(running, _parsed(pages, running))


def render_markdown(document: DocumentRecord, pages: list[PageRecord], read: Read | None = None) -> str:
    """Pages in order, each opened by a marker that counts the file's own pages and names the page's flags; a page
    that failed says why (its text, if any, is kept). A corrected page shows its correction's text. Running headers,
    footers and page numbers (:func:`running_furniture`) are marked as comments, dropped or kept as text, as the
    document asks (``furniture``). A comment in a page's text that reads as a marker
    is shown as the page's own (FORGED_MARKER_SHOWN), so that the file's markers are only its own."""
    parts = [f"<!-- pagescribe document {document.document_id}: {_comment_safe(document.object_key)} -->"]
    page_count = document.source_page_count or document.page_count
    texts = [page.current_text or "" for page in pages]
    read = read or read_pages(pages)
    running = read.running
    lines = [_furnished(text, furniture, document.furniture) for text, furniture in zip(texts, running, strict=True)]
    parsed = read.blocks
    for page, page_lines in zip(pages, lines, strict=True):
        if page.figures:
            _place_figures(page, page_lines, parsed[page.page_number])
    if document.merge_tables:
        _join_tables(pages, lines, parsed)
    for page, page_lines in zip(pages, lines, strict=True):
        body = _FORGED_MARKER.sub(FORGED_MARKER_SHOWN, "\n".join(page_lines))
        body = (_BLANK_LINES.sub("\n\n", body) if document.furniture == "drop" else body).strip()
        parts.append(_page_marker(page, page_count) + ("\n\n" + body if body else ""))
    return "\n\n".join(parts) + "\n"


def figure_links(page: PageRecord, blocks: Sequence[Block]) -> list[tuple[dict[str, Any], Block | None, Block | None]]:
    """Each figure kept from the page (top to bottom) with the figure block it stands for (the page's figure blocks
    in order, as far as they go) and that block's caption (the caption block right after it, or right before)."""
    figures = [block for block in blocks if block.type.value == "figure"]
    linked = []
    for at, kept in enumerate(page.figures):
        block = figures[at] if at < len(figures) else None
        caption = None
        if block is not None:
            index = blocks.index(block)
            near = [blocks[i] for i in (index + 1, index - 1) if 0 <= i < len(blocks)]
            caption = next((other for other in near if other.type.value == "caption"), None)
        linked.append((kept, block, caption))
    return linked


def _figure_line(kept: dict[str, Any], block: Block | None, caption: Block | None) -> str:
    """The markdown image of a kept figure, its alt text the caption or the model's description, its link relative
    to the transcript (``<document id>/figures/...``)."""
    said = (caption.plain if caption is not None else "") or (block.plain if block is not None else "") or "figure"
    alt = _WHITESPACE.sub(" ", said).replace("[", "(").replace("]", ")").strip()
    key = str(kept["key"])
    relative = "/".join(key.split("/")[-3:])  # <document id>/figures/<name>, beside <document id>.md
    return f"![{alt}]({relative})"


def _place_figures(page: PageRecord, lines: list[str], blocks: Sequence[Block]) -> None:
    """Each kept figure shown in the page's lines: in place of the figure block it stands for (line for line, the
    block's other lines left blank), or after the page's text where the answer has no figure block left for it."""
    text = page.current_text or ""
    extra = []
    for kept, block, caption in figure_links(page, blocks):
        if block is None:
            extra.append(_figure_line(kept, None, None))
            continue
        first, last = _line_of(text, block.start), _line_of(text, block.end - 1)
        lines[first : last + 1] = [_figure_line(kept, block, caption)] + [""] * (last - first)
    lines.extend(["", *extra] if extra else [])


def _parsed(pages: Sequence[PageRecord], running: Sequence[dict[int, str]]) -> dict[int, list[Block]]:
    """Each page's blocks (:func:`pagescribe.blocks.parse_blocks`), by page number."""
    from pagescribe.blocks.parsing import parse_blocks

    return {
        page.page_number: parse_blocks(page.current_text or "", furniture)
        for page, furniture in zip(pages, running, strict=True)
    }


def _line_of(text: str, offset: int) -> int:
    """The index of the line (in ``text.splitlines()``) that holds ``offset``."""
    return len((text[:offset] + "x").splitlines()) - 1


def _join_tables(pages: Sequence[PageRecord], lines: list[list[str]], parsed: dict[int, list[Block]]) -> None:
    """Each table that crosses pages made one in the pages' lines (:mod:`pagescribe.tables`): the rows of each
    continuation go at the end of the table where it starts, and a comment stands in its place."""
    from pagescribe.tables import continued_rows, table_joins

    index = {page.page_number: at for at, page in enumerate(pages)}
    texts = {page.page_number: page.current_text or "" for page in pages}
    by_id = {(number, block.id): block for number, blocks in parsed.items() for block in blocks}
    edits: dict[int, list[tuple[int, int, list[str]]]] = {}  # page index: (first line, lines replaced, new lines)
    for join in table_joins(sorted(parsed.items())):
        head, table = by_id[join.head_page, join.head], by_id[join.page, join.block]
        end = _line_of(texts[join.head_page], head.end - 1) + 1
        edits.setdefault(index[join.head_page], []).append((end, 0, continued_rows(table, join.header_repeated)))
        first, last = _line_of(texts[join.page], table.start), _line_of(texts[join.page], table.end - 1)
        said = f"<!-- table continued from page {join.head_page}: its rows here are in the table there -->"
        edits.setdefault(index[join.page], []).append((first, last - first + 1, [said]))
    for at, page_edits in edits.items():
        for first, replaced, new in sorted(page_edits, key=lambda edit: edit[0], reverse=True):
            lines[at][first : first + replaced] = new


def _attempt(attempt: AttemptRecord) -> dict[str, Any]:
    read = attempt.second_read
    return {
        "model": attempt.model,
        "provider": attempt.provider,
        "outcome": attempt.outcome,
        "finish_reason": attempt.finish_reason,
        "prompt_tokens": attempt.prompt_tokens,
        "completion_tokens": attempt.completion_tokens,
        "cost": attempt.cost,
        **({"cost_estimated": True} if attempt.cost_estimated else {}),  # a call cut at a loop; none reported
        "latency_ms": attempt.latency_ms,
        "provider_request_id": attempt.provider_request_id,
        "confidence": attempt.confidence,
        "flags": attempt.flags,
        **({"status_code": attempt.status_code, "error": attempt.error} if attempt.error is not None else {}),
        # what the offline engine read of the page during the call: its lines ([text, x0, y0, x1, y1, score], in the
        # page image's pixels), confidence and CPU time; or why it did not
        **({"second_read": read} if read is not None else {}),
        # the tile of the page the call read ("2/4"), when the page was read in tiles
        **({"tile": attempt.tile} if attempt.tile is not None else {}),
    }


def _correction(page: PageRecord) -> dict[str, Any] | None:
    if page.correction is None:
        return None
    return {
        "revision": page.correction.revision,
        "corrected_at": page.correction.corrected_at.isoformat(),
        "original_text": page.text,
    }


def _box(pixels: list[float] | None, points_per_pixel: float | None) -> dict[str, Any] | None:
    """A box in the page image's pixels and, for a PDF page, in points; both from the top left corner, y downwards."""
    if pixels is None:
        return None
    points = [round(value * points_per_pixel, 2) for value in pixels] if points_per_pixel else None
    return {"pixels": pixels, "points": points}


def _grounded(page: PageRecord) -> tuple[dict[str, Any], float | None]:
    """The page's blocks as grounded (by page-local block id) and the page image's points per pixel; none for a
    person's correction (it was not read off the page) or an answer nothing grounded."""
    grounded = page.grounding if page.correction is None and page.grounding and page.grounding.get("source") else None
    return (grounded["blocks"], grounded["image"]["points_per_pixel"]) if grounded else ({}, None)


def page_blocks(page: PageRecord, parsed: Sequence[Block]) -> list[dict[str, Any]]:
    """The page's text as blocks (:mod:`pagescribe.blocks`), each with its box on the page image and its grounding
    where the kept answer was grounded; a person's correction has blocks without either (it was not read off the
    page). Unsupported runs are given as offsets in the page's ``text``."""
    text = page.current_text or ""
    by_id, scale = _grounded(page)
    blocks = []
    for block in parsed:
        found = by_id.get(block.id, {})
        spans = [block.answer_span(start, end) for start, end in found.get("unsupported", ())]
        cells = {(row, col): box for row, col, box in found.get("cells", ())}
        entry: dict[str, Any] = {
            "id": f"p{page.page_number}-{block.id}",
            "type": block.type.value,
            "text": block.text,
            "start": block.start,
            "end": block.end,
            "bbox": _box(found.get("bbox"), scale),
            "grounding": found.get("grounding"),
            "unsupported": [{"start": a, "end": b, "text": text[a:b]} for a, b in spans],
        }
        if block.level is not None:
            entry["level"] = block.level
        if block.cells:
            entry["cells"] = [
                {**_cell(cell), "bbox": _box(cells.get((cell.row, cell.col)), scale)} for cell in block.cells
            ]
        blocks.append(entry)
    return blocks


def _figures_json(page: PageRecord, blocks: Sequence[Block]) -> list[dict[str, Any]]:
    """The figures kept from the page: each its key in the bucket, its box on the page image (and in points), and
    the ids of the figure block it stands for and of that block's caption."""
    return [
        {
            "key": kept["key"],
            "bbox": _box(kept["bbox"], kept.get("points_per_pixel")),
            "block": f"p{page.page_number}-{block.id}" if block is not None else None,
            "caption": f"p{page.page_number}-{caption.id}" if caption is not None else None,
        }
        for kept, block, caption in figure_links(page, blocks)
    ]


def _joined_tables(parsed: dict[int, list[Block]], blocks: dict[int, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Each table that crosses pages made one in the JSON blocks: the block where it starts holds every row, each
    cell with its page (and its box on that page), and names its ``pages``; each continuation says which block it
    is ``continued_from`` and keeps its own page's cells. The joins, as recorded at the document's top."""
    from pagescribe.tables import table_joins

    by_id = {block["id"]: block for listed in blocks.values() for block in listed}
    heads: dict[str, dict[str, Any]] = {}
    for join in table_joins(sorted(parsed.items())):
        head_id, table_id = f"p{join.head_page}-{join.head}", f"p{join.page}-{join.block}"
        head, table = by_id[head_id], by_id[table_id]
        if head_id not in heads:
            head["cells"] = [{**cell, "page": join.head_page} for cell in head["cells"]]
            head["pages"] = [join.head_page]
            heads[head_id] = {"table": head_id, "pages": head["pages"]}
        offset = 1 + max(cell["row"] for cell in head["cells"]) - (1 if join.header_repeated else 0)
        head["cells"] += [
            {**cell, "row": cell["row"] + offset, "header": False, "page": join.page}
            for cell in table["cells"]
            if not (join.header_repeated and cell["row"] == 0)
        ]
        head["pages"].append(join.page)
        table["continued_from"] = head_id
    return list(heads.values())


def _cell(cell: Cell) -> dict[str, Any]:
    return {
        "row": cell.row,
        "col": cell.col,
        "text": cell.text,
        "rowspan": cell.rowspan,
        "colspan": cell.colspan,
        "header": cell.header,
    }


def page_grounding(page: PageRecord) -> dict[str, Any] | None:
    """How the page's kept answer lines up with the page: its source (``text_layer``, ``second_read``, ``engine``),
    the share of its characters grounded, the ``ungrounded`` and ``missed_text`` shares and the missed regions with
    their boxes; or why it could not be grounded; None where nothing grounded it (a page read off its own text
    layer, a blank render)."""
    grounded = page.grounding
    if grounded is None:
        return None
    if page.correction is not None:
        return {"source": None, "skipped": "the page shows a person's correction, not the answer that was grounded"}
    if not grounded.get("source"):
        return grounded
    scale = grounded["image"]["points_per_pixel"]
    return {
        "source": grounded["source"],
        "grounded": grounded["grounding"],
        "ungrounded": grounded["ungrounded"],
        "missed_text": grounded["missed_text"],
        "image": {"width": grounded["image"]["width"], "height": grounded["image"]["height"]},
        "missed": [
            {"text": region["text"], "chars": region["chars"], "bbox": _box(region["bbox"], scale)}
            for region in grounded["missed"]
        ],
    }


def transcript_json(
    document: DocumentRecord,
    status: DocumentStatus,
    pages: list[PageRecord],
    attempts: list[AttemptRecord],
    read: Read | None = None,
) -> dict[str, Any]:
    """The document, its pages (the kept answer's text, or a person's correction of it, with the answer kept as
    ``correction.original_text``; model, flags and running headers and footers) and, per page, every paid call: the
    document's tokens and cost are the sums over all of them, kept or not."""
    by_page: dict[int, list[AttemptRecord]] = {}
    read = read or read_pages(pages)
    running = dict(zip((p.page_number for p in pages), read.running, strict=True))
    parsed = read.blocks
    blocks = {p.page_number: page_blocks(p, parsed[p.page_number]) for p in pages}
    joined = _joined_tables(parsed, blocks) if document.merge_tables else []
    for attempt in attempts:
        by_page.setdefault(attempt.page_number, []).append(attempt)

    def total(calls: list[AttemptRecord], field: str) -> Any:
        return sum(getattr(call, field) or 0 for call in calls)

    return {
        "document_id": document.document_id,
        "source": {
            "bucket": document.bucket,
            "key": document.object_key,
            "kind": document.kind,
            "page_count": document.source_page_count,
        },
        "status": status.value,
        "reused_from": document.reused_from,
        "page_count": document.page_count,
        "flagged_pages": sum(bool(p.flags) for p in pages),
        "model": document.model,
        "escalation_model": document.escalation_model,
        "prompt_tokens": total(attempts, "prompt_tokens"),
        "completion_tokens": total(attempts, "completion_tokens"),
        "cost": round(total(attempts, "cost"), 8),
        "merge_tables": document.merge_tables,
        "furniture": document.furniture,
        "tables_joined": joined,
        "pages": [
            {
                "page": p.page_number,
                "status": p.status.value,
                "text": p.current_text,
                "corrected": p.correction is not None,
                "correction": _correction(p),
                "error": p.error,
                "flags": p.flags,
                "running": [
                    {"kind": kind, "text": _HEADING_MARK.sub("", (p.current_text or "").splitlines()[at]).strip()}
                    for at, kind in running[p.page_number].items()
                ],
                "grounding": page_grounding(p),
                "blocks": blocks[p.page_number],
                "figures": _figures_json(p, parsed[p.page_number]),
                "model": p.model,
                "provider": p.provider,
                "escalated": p.escalation is not None,
                "finish_reason": p.finish_reason,
                "confidence": p.confidence,
                "provider_request_id": p.provider_request_id,
                "prompt_tokens": total(by_page.get(p.page_number, []), "prompt_tokens"),
                "completion_tokens": total(by_page.get(p.page_number, []), "completion_tokens"),
                "cost": round(total(by_page.get(p.page_number, []), "cost"), 8),
                "attempts": [_attempt(a) for a in by_page.get(p.page_number, [])],
            }
            for p in pages
        ],
    }


def _final_status(pages: list[PageRecord]) -> tuple[DocumentStatus, str | None]:
    """COMPLETED; FAILED when every page failed; otherwise PARTIAL, saying how many pages failed and how many were
    skipped, and why (a cap or budget: the first skipped page's reason)."""
    failed = sum(p.status is JobStatus.FAILED for p in pages)
    skipped = [p for p in pages if p.status is JobStatus.SKIPPED]
    if failed == 0 and not skipped:
        return DocumentStatus.COMPLETED, None
    status = DocumentStatus.FAILED if failed == len(pages) else DocumentStatus.PARTIAL
    said = [f"{failed} of {len(pages)} pages failed"] if failed else []
    if skipped:
        said.append(f"{len(skipped)} of {len(pages)} pages skipped, not started: {skipped[0].error}")
    return status, "; ".join(said)


REWRITE_ROUNDS = 5  # writes of one rewrite before it leaves the files to the next save (each round is two S3 PUTs)
_IMAGE_SUFFIXES = {"image/jpeg": "jpg", "image/png": "png"}


class TranscriptWriter:
    def __init__(self, settings: Settings, db: Store, objects: ObjectStore) -> None:
        self._settings = settings
        self._db = db
        self._objects = objects

    def transcript_key(self, document_id: str, suffix: str) -> str:
        return f"{self._settings.transcript_prefix}{document_id}.{suffix}"

    def keep_page_image(self, document: DocumentRecord, page_number: int, data: bytes, media_type: str) -> str:
        """Store the image a page is sent to the model as beside the transcript, under
        ``<transcript prefix><document id>/pages/<page>.<jpg|png>``; its key. Storing it again overwrites it."""
        suffix = _IMAGE_SUFFIXES.get(media_type, "img")
        key = f"{self._settings.transcript_prefix}{document.document_id}/pages/{page_number:04d}.{suffix}"
        self._objects.put_bytes(document.bucket, key, data, content_type=media_type)
        return key

    def keep_figure(self, document: DocumentRecord, page_number: int, number: int, data: bytes) -> str:
        """Store a figure cropped from a page beside the transcript, under
        ``<transcript prefix><document id>/figures/p<page>-<n>.png``; its key. Storing it again overwrites it."""
        key = f"{self._settings.transcript_prefix}{document.document_id}/figures/p{page_number:04d}-{number}.png"
        self._objects.put_bytes(document.bucket, key, data, content_type="image/png")
        return key

    def finish(self, document_id: str) -> DocumentStatus | None:
        """Write the transcript files, then mark the document finished. Writing is idempotent, so the
        sweeper may finish a document whose finishing invocation died; None if it was already finished. Its callback,
        if it has one, is due from then on and left to the sweeper's next round: no receiver holds the invocation
        that finishes a document."""
        document = self._db.get_document(document_id)
        if document is None or document.finished_at is not None:
            return None
        pages = self._db.load_pages(document_id)
        status, error = _final_status(pages)
        markdown_key = self._write(document, status, pages, self._db.load_attempts(document_id))
        if not self._db.finish_document(document_id, status=status, error=error, transcript_key=markdown_key):
            return None
        log.info("document finished", extra={"document_id": document_id, "status": status.value})
        return status

    def rewrite(self, document_id: str) -> bool:
        """Write a finished document's transcript files again from the database (after a correction); its status and
        finished_at stay as they are. False when it is not finished (the finish that ends its re-run writes them) or
        when the files could not be brought up to date in REWRITE_ROUNDS rounds (the next save writes them).

        Two saves of one document rewrite at once, and S3 keeps the last PUT, so each writer reads the document at
        one moment (``Store.transcript_state``: a share lock of the document's row held for the short read only,
        never across the PUTs), writes, then reads the version again: if a save, re-run or finish landed meanwhile,
        its files may be older than the database, so it writes again. The last PUT is always followed by a version
        read that found nothing new, so the files end showing the latest revision. One gap remains: a re-run that
        reopens, transcribes and re-finishes the document entirely between a writer's read and its PUT, and whose
        finish wrote its files before that PUT but is marked finished only after the writer's check, leaves the
        writer's older files; the next correction or re-run writes them again."""
        for _ in range(REWRITE_ROUNDS):
            state = self._db.transcript_state(document_id)
            if state is None:
                return False
            self._write(state.document, state.document.status, state.pages, state.attempts)
            if self._db.transcript_version(document_id) == state.version:
                return True
        log.warning(
            "transcript files not brought up to date: the document kept changing while they were written",
            extra={"document_id": document_id, "rounds": REWRITE_ROUNDS},
        )
        return False

    def _write(
        self, document: DocumentRecord, status: DocumentStatus, pages: list[PageRecord], attempts: list[AttemptRecord]
    ) -> str:
        """Put the JSON transcript, the chunks cut from it when the document asked for them, then the markdown
        transcript; the markdown's key."""
        markdown_key = self.transcript_key(document.document_id, "md")
        read = read_pages(pages)
        transcript = transcript_json(document, status, pages, attempts, read)
        self._objects.put_text(
            document.bucket,
            self.transcript_key(document.document_id, "json"),
            json.dumps(transcript, ensure_ascii=False, indent=2),
            content_type="application/json",
        )
        if document.chunks:
            settings = self._settings
            chunks = chunk_transcript(
                transcript,
                tenant_id=document.tenant_id,
                max_tokens=settings.chunk_max_tokens,
                overlap=settings.chunk_overlap,
            )
            self._objects.put_text(
                document.bucket,
                chunks_key(markdown_key),
                "".join(json.dumps(chunk, ensure_ascii=False) + "\n" for chunk in chunks),
                content_type="application/x-ndjson; charset=utf-8",
            )
        self._objects.put_text(
            document.bucket,
            markdown_key,
            render_markdown(document, pages, read),
            content_type="text/markdown; charset=utf-8",
        )
        return markdown_key
