"""Helpers shared by the test suites."""

from pathlib import Path

CORPUS = Path(__file__).resolve().parents[2].parent / "shared" / "corpus"  # ../shared/corpus beside the checkout
