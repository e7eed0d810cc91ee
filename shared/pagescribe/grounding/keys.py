"""Words and keys (step 1): how the answer and the evidence are cut into words, and how two words are compared."""

from __future__ import annotations

import functools
import re
import unicodedata

FUZZY = 0.75  # a word is aligned with evidence at least this alike (2 x matched characters over both lengths),
FUZZY_MIN_CHARS = 4  # ... when it has this many characters; a shorter word only when it matches exactly

# A word: a CJK character alone (Han, kana, hangul), or a run of anything else but whitespace.
_CJK = "\u2e80-\u2fdf\u3040-\u312f\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
WORD = re.compile(f"[{_CJK}]|[^\\s{_CJK}]+")


@functools.lru_cache(maxsize=1 << 16)
def key_of(word: str) -> str:
    """A word as it is matched: NFKC, casefolded, without diacritics, its letters and digits only."""
    folded = unicodedata.normalize("NFKD", unicodedata.normalize("NFKC", word).casefold())
    return "".join(char for char in folded if char.isalnum())


def similar(length: int, similarity: float) -> bool:
    """A word of ``length`` characters this alike (fuzz.ratio's measure, 0 to 1) is aligned: FUZZY for a word of
    FUZZY_MIN_CHARS or more, exactly for a shorter one."""
    return similarity >= FUZZY if length >= FUZZY_MIN_CHARS else similarity >= 1 - 1e-9
