"""Text -> normalized text.

Unicode NFKC (which also folds full-width forms to half-width), case folding,
traditional Chinese characters converted to simplified ones (OpenCC's ``t2s``
conversion, phrase-aware), punctuation and symbols turned into spaces, runs of
whitespace collapsed. The result is what the tokenizers and shinglers see; the
exact-content hash is taken of the raw text, not of this.
"""

from __future__ import annotations

import functools
import re
import sys
import unicodedata

_WHITESPACE = re.compile(r"\s+")
_HAN = re.compile("[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f]")


@functools.cache
def _t2s():
    """OpenCC's traditional -> simplified converter, loaded once per process."""
    import opencc

    return opencc.OpenCC("t2s.json")


def simplify(text: str) -> str:
    """Traditional Chinese -> simplified (OpenCC ``t2s``); text without Han characters is returned as is."""
    return _t2s().convert(text) if _HAN.search(text) else text


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


def normalize(text: str, simplify_script: bool = True) -> str:
    """Fold, simplify (unless ``simplify_script`` is off, as for ``simhash64-v1`` indexes), drop
    punctuation and symbols, collapse whitespace, strip."""
    text = fold(text)
    if simplify_script:
        text = simplify(text)
    text = text.translate(_punctuation_table())
    return _WHITESPACE.sub(" ", text).strip()
