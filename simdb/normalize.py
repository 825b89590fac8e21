"""Text -> normalized text.

Unicode NFKC (which also folds full-width forms to half-width), case folding,
punctuation and symbols turned into spaces, runs of whitespace collapsed. The
result is what the tokenizers see; the exact-content hash is taken of the raw
text, not of this.
"""

from __future__ import annotations

import functools
import re
import sys
import unicodedata

_WHITESPACE = re.compile(r"\s+")


@functools.cache
def _punctuation_table() -> dict[int, str]:
    """Every punctuation (P*) and symbol (S*) code point -> a space.

    Built once per process (about 0.2 s); ``str.translate`` with it is far
    faster than a per-character category lookup.
    """
    return {cp: " " for cp in range(sys.maxunicode + 1)
            if unicodedata.category(chr(cp))[0] in "PS"}


def fold(text: str) -> str:
    """NFKC and case folding only: width, compatibility forms and case vanish."""
    return unicodedata.normalize("NFKC", text).casefold()


def normalize(text: str) -> str:
    """Fold, drop punctuation and symbols, collapse whitespace, strip."""
    text = fold(text).translate(_punctuation_table())
    return _WHITESPACE.sub(" ", text).strip()
