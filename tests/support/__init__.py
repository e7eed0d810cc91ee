"""Helpers shared by the test suites."""

from pathlib import Path

CORPUS = Path(__file__).resolve().parents[1] / "data" / "corpus"  # tests/data/corpus (SOURCES.md)
CORPUS_NOTES = frozenset({"LICENSE", "SOURCES.md"})  # the corpus's licence and sources, beside its documents
