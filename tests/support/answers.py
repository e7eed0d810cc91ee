"""Real model answers captured from public threads (tests/data/answers/, sources in its index.json)."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

ANSWERS = Path(__file__).resolve().parents[1] / "data" / "answers"


@cache
def index() -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = json.loads((ANSWERS / "index.json").read_text(encoding="utf-8"))
    return entries


def captured(mode: str) -> list[str]:
    """The texts of the captured answers of one mode (repetition, refusal, wrapped, invented, clean), in index order."""
    return [(ANSWERS / entry["file"]).read_text(encoding="utf-8") for entry in index() if entry["mode"] == mode]


def captured_file(name: str) -> str:
    """One captured answer by its file name."""
    assert any(entry["file"] == name for entry in index()), f"{name} is not in tests/data/answers/index.json"
    return (ANSWERS / name).read_text(encoding="utf-8")
