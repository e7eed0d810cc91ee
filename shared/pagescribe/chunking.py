"""Chunks for retrieval, cut from a transcript's blocks: the JSON transcript is their one source.

A document is read block by block, page after page, without its running headers, footers and page numbers. A
heading starts a section, and no chunk holds two sections: each chunk carries the path of headings above it. Within
a section the blocks are taken apart into units that are never cut: a sentence of a paragraph (or caption, footnote),
a list item, a table row, a formula, a code block, a figure. Units are packed into a chunk while its estimate stays
within ``max_tokens``; the next chunk of the section starts again with the last whole units of the one before, up to
``overlap`` tokens, and a chunk that continues a table starts with the table's header row. The only unit ever cut is
one that alone passes ``max_tokens`` (a sentence of a thousand words): it is cut between words, or inside a word that
alone passes it.

Each chunk names the pages it spans (a table's header row repeated at its start is context, as its heading path is:
the header's page does not count) and the blocks it holds (their ids, pages, types and boxes on the page, and for a
table the rows it holds), its document and tenant. Its id is a UUID derived from the document's id and what the chunk
says (its heading path and text), so cutting the same transcript again gives the same ids, a chunk that a re-run did
not change keeps its id, and no two documents share one.

Tokens are estimated without a tokenizer (nothing to download at run time): a run of ASCII letters and digits counts
one token per four characters, rounded up; every other character that is not white space counts one (a letter of
another script, a mark of punctuation). For English prose this counts about as many tokens as the tokenizers of
OpenAI's models and for other scripts more, so a bound set a little under a model's limit holds.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

DEFAULT_MAX_TOKENS = 512
DEFAULT_OVERLAP = 64
MIN_MAX_TOKENS = 32
MAX_MAX_TOKENS = 8192

_FURNITURE = frozenset({"page_header", "page_footer", "page_number"})
_SENTENCES = frozenset({"paragraph", "caption", "footnote"})  # blocks of prose, taken apart sentence by sentence
_TOKEN = re.compile(r"[A-Za-z0-9]+|\S")
# A sentence ends at . ! or ? (and any closing quotes or brackets) before white space, or at a CJK full stop, ! or ?
_SENTENCE_END = re.compile(r"[.!?][\"'\u201d\u2019)\]]*(?=\s)|[\u3002\uff01\uff1f]")
# Words whose full stop ends no sentence: "Fig. 3", "et al. (2020)", "e.g. this"
_ABBREVIATIONS = frozenset(
    {"al", "cf", "dr", "e.g", "eq", "eqs", "etc", "fig", "figs", "i.e", "mr", "mrs", "ms", "no", "nos", "p", "pp"}
    | {"prof", "ref", "refs", "sec", "sect", "st", "tab", "vol", "vs", "approx", "ca", "resp", "ch"}
)
_HEADING_MARKS = re.compile(r"^\s{0,3}#{1,6}\s*|\s+#+\s*$")


class ChunkingError(ValueError):
    """A bound that cannot be chunked to: the message names the value, ``field`` the parameter."""

    def __init__(self, message: str, *, field: str) -> None:
        super().__init__(message)
        self.field = field


def estimate_tokens(text: str) -> int:
    """The module's token estimate of ``text`` (see the module's docstring)."""
    return sum(-(-len(piece) // 4) if piece[0].isascii() and piece[0].isalnum() else 1 for piece in _pieces(text))


def check_bounds(max_tokens: int, overlap: int) -> None:
    """Refuse a bound outside MIN_MAX_TOKENS..MAX_MAX_TOKENS, or an overlap that is negative or not under half of it."""
    if not MIN_MAX_TOKENS <= max_tokens <= MAX_MAX_TOKENS:
        raise ChunkingError(
            f"max_tokens must be between {MIN_MAX_TOKENS} and {MAX_MAX_TOKENS}, not {max_tokens}", field="max_tokens"
        )
    if not 0 <= overlap < max_tokens // 2:
        raise ChunkingError(
            f"overlap must be at least 0 and under half of max_tokens ({max_tokens}), not {overlap}", field="overlap"
        )


@dataclass(frozen=True)
class _Unit:
    """A piece of a block that no chunk cuts (but one that alone passes the bound)."""

    text: str
    tokens: int
    block: str  # the block's id ("p3-b5")
    page: int
    kind: str  # the block's type
    bbox: Any  # the block's box on its page, as the transcript has it
    joiner: str  # put between it and the unit before it, in the same block
    row: int | None = None  # a table row's place in its table's grid
    header: _Unit | None = None  # a table row's header row, repeated where a chunk starts inside the table
    repeated: bool = False  # this is such a repetition: context, like the heading path, so its page is not counted


def chunk_transcript(
    transcript: Mapping[str, Any],
    *,
    tenant_id: str,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    overlap: int = DEFAULT_OVERLAP,
) -> list[dict[str, Any]]:
    """The chunks of a JSON transcript (as :func:`pagescribe.assembly.transcript_json` makes it), in reading order."""
    check_bounds(max_tokens, overlap)
    document_id = str(transcript["document_id"])
    chunks: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    for path, units in _sections(transcript["pages"]):
        for packed in _pack(units, max_tokens, overlap):
            chunks.append(_chunk(document_id, tenant_id, len(chunks), path, packed, seen))
    return chunks


def _pieces(text: str) -> Iterator[str]:
    return (match.group() for match in _TOKEN.finditer(text))


def _sections(pages: Sequence[Mapping[str, Any]]) -> Iterator[tuple[list[str], list[_Unit]]]:
    """Each section's heading path and units, in reading order; a section with no unit is left out."""
    path: list[tuple[int, str]] = []
    units: list[_Unit] = []
    for block, page in _content(pages):
        if block["type"] == "heading":
            if units:
                yield [title for _, title in path], units
            level = int(block.get("level") or 1)
            path = [entry for entry in path if entry[0] < level] + [(level, _HEADING_MARKS.sub("", block["text"]))]
            units = []
        units.extend(_units(block, page))
    if units:
        yield [title for _, title in path], units


def _content(pages: Sequence[Mapping[str, Any]]) -> Iterator[tuple[Mapping[str, Any], int]]:
    """The pages' blocks in reading order, each with its page number, but for running furniture and continuations
    (a continuation's rows are its head's)."""
    for page in pages:
        for block in page.get("blocks") or ():
            if block["type"] not in _FURNITURE and not block.get("continued_from"):
                yield block, int(page["page"])


def _units(block: Mapping[str, Any], page: int) -> list[_Unit]:
    kind, text = block["type"], block["text"]

    def unit(piece: str, joiner: str, row: int | None = None, header: _Unit | None = None, on: int = page) -> _Unit:
        return _Unit(piece, estimate_tokens(piece), block["id"], on, kind, block.get("bbox"), joiner, row, header)

    if kind == "table" and block.get("cells"):
        rows = _rows(block["cells"], page)
        header = unit(rows[0].line, "\n", rows[0].row, on=rows[0].page) if rows[0].header else None
        body = rows[1:] if header is not None else rows
        return ([header] if header is not None else []) + [unit(r.line, "\n", r.row, header, r.page) for r in body]
    if kind in _SENTENCES:
        return [unit(sentence, " ") for sentence in sentences(text)]
    return [unit(text, "\n")]


class _Row(NamedTuple):
    row: int  # its place in the table's grid
    line: str  # its cells' text as a markdown row
    header: bool
    page: int  # where it stands: a table joined across pages keeps each row's page (pagescribe.tables)


def _rows(cells: Sequence[Mapping[str, Any]], page: int) -> list[_Row]:
    """A table's rows as markdown lines of their cells' text, each with its row, whether it is a header row and its
    page (its cells' own, else ``page``)."""
    by_row: dict[int, list[Mapping[str, Any]]] = {}
    for cell in cells:
        by_row.setdefault(int(cell["row"]), []).append(cell)
    return [
        _Row(
            row,
            "| " + " | ".join(str(cell["text"]) for cell in sorted(found, key=lambda c: int(c["col"]))) + " |",
            all(cell.get("header") for cell in found),
            int(found[0].get("page", page)),
        )
        for row, found in sorted(by_row.items())
    ]


def sentences(text: str) -> list[str]:
    """``text`` cut after each sentence's end (see _SENTENCE_END), but not after an abbreviation, an initial or a
    number, nor before a lower-case letter; each sentence stripped."""
    found, start = [], 0
    for match in _SENTENCE_END.finditer(text):
        end = match.end()
        if match.group()[0] == "." and not _ends_a_sentence(text[start : match.start()], text[end:]):
            continue
        found.append(text[start:end].strip())
        start = end
    found.append(text[start:].strip())
    return [sentence for sentence in found if sentence]


def _ends_a_sentence(before: str, after: str) -> bool:
    word = before.rsplit(None, 1)[-1].lstrip("([\"'") if before.strip() else ""
    following = after.lstrip()[:1]
    if following.islower() or not word:
        return False
    return word.lower() not in _ABBREVIATIONS and not (len(word) == 1 and word.isalpha()) and not word.isdigit()


def _pack(units: Sequence[_Unit], max_tokens: int, overlap: int) -> Iterator[list[_Unit]]:
    """The section's units packed into chunks of at most ``max_tokens``, each after the first starting with the last
    whole units of the one before (up to ``overlap`` tokens) and, inside a table, with its header row."""
    current: list[_Unit] = []
    for unit in (piece for whole in units for piece in _within(whole, max_tokens)):
        if current and _tokens(current) + unit.tokens > max_tokens:
            yield current
            current = _carried(current, unit, max_tokens, overlap)
        current.append(unit)
    if current:
        yield current


def _carried(previous: Sequence[_Unit], unit: _Unit, max_tokens: int, overlap: int) -> list[_Unit]:
    """What the chunk after ``previous`` starts with, before ``unit``: the header row of the table ``unit`` continues,
    then the last whole units of ``previous`` within ``overlap`` tokens (of that table only, after its header); as
    much of them as leaves room for ``unit``, the header kept longest."""
    kept: list[_Unit] = []
    for earlier in reversed(previous):
        if _tokens([earlier, *kept]) > overlap:
            break
        kept.insert(0, earlier)
    header = unit.header
    lead = [replace(header, repeated=True)] if header is not None and header not in kept else []
    if header is not None:
        kept = [earlier for earlier in kept if earlier.block == header.block]
    while kept and _tokens([*lead, *kept]) + unit.tokens > max_tokens:
        kept.pop(0)
    if _tokens(lead) + unit.tokens > max_tokens:
        lead = []
    return lead + kept


def _within(unit: _Unit, max_tokens: int) -> Iterator[_Unit]:
    """The unit, or where it alone passes the bound, its pieces cut between words (inside a word only where that
    word alone passes it)."""
    if unit.tokens <= max_tokens:
        yield unit
        return
    piece = ""
    for whole in re.findall(r"\S+\s*", unit.text):
        word = whole
        while estimate_tokens(word) > max_tokens:
            head, word = _cut_word(word, max_tokens)
            if piece.strip():
                yield _piece(unit, piece)
            yield _piece(unit, head)
            piece = ""
        if piece.strip() and estimate_tokens(piece + word) > max_tokens:
            yield _piece(unit, piece)
            piece = ""
        piece += word
    if piece.strip():
        yield _piece(unit, piece)


def _cut_word(word: str, bound: int) -> tuple[str, str]:
    """The longest head of ``word`` within ``bound`` tokens, and the rest."""
    low, high = 1, len(word)
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if estimate_tokens(word[:middle]) <= bound else (low, middle - 1)
    return word[:low], word[low:]


def _piece(unit: _Unit, text: str) -> _Unit:
    text = text.strip()
    return _Unit(text, estimate_tokens(text), unit.block, unit.page, unit.kind, unit.bbox, " ", unit.row, unit.header)


def _text(units: Sequence[_Unit]) -> str:
    parts: list[str] = []
    for before, unit in zip([None, *units], units, strict=False):
        if before is not None:
            parts.append(unit.joiner if before.block == unit.block else "\n\n")
        parts.append(unit.text)
    return "".join(parts)


def _tokens(units: Sequence[_Unit]) -> int:
    """The estimate of the units' text together: their own estimates' sum (they are joined by white space)."""
    return sum(unit.tokens for unit in units)


def _chunk(
    document_id: str, tenant_id: str, index: int, path: list[str], units: Sequence[_Unit], seen: dict[str, int]
) -> dict[str, Any]:
    text = _text(units)
    name = "\x1f".join([*path, text])
    seen[name] = seen.get(name, 0) + 1
    if seen[name] > 1:  # the same words under the same headings again: told apart by how many came before
        name += f"\x1f{seen[name]}"
    blocks: dict[str, dict[str, Any]] = {}
    for unit in units:
        entry = blocks.setdefault(
            unit.block, {"id": unit.block, "page": unit.page, "type": unit.kind, "bbox": unit.bbox}
        )
        if unit.row is not None and unit.row not in entry.setdefault("rows", []):
            entry["rows"].append(unit.row)
    return {
        "id": str(uuid.uuid5(uuid.UUID(document_id), name)),
        "document_id": document_id,
        "tenant_id": tenant_id,
        "index": index,
        "heading_path": path,
        "pages": sorted({unit.page for unit in units if not unit.repeated}),
        "tokens": estimate_tokens(text),
        "text": text,
        "blocks": list(blocks.values()),
    }
