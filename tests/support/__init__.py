"""Helpers shared by the test suites."""

from pathlib import Path

CORPUS = Path(__file__).resolve().parents[1] / "data" / "corpus"  # tests/data/corpus (SOURCES.md)
