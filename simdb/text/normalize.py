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

from ..errors import InputError
from .scripts import HAN_CHARACTER

_WHITESPACE = re.compile(r"\s+")


@functools.cache
def _t2s():
    """OpenCC's traditional -> simplified converter, loaded once per process."""
    import opencc

    return opencc.OpenCC("t2s.json")


def simplify(text: str) -> str:
    """Traditional Chinese -> simplified (OpenCC ``t2s``); text without Han characters is returned as is."""
    return _t2s().convert(text) if HAN_CHARACTER.search(text) else text


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


def normalized_or_folded(text: str, simplify_script: bool = True) -> tuple[str, bool]:
    """``(normalized text, False)``; for a text that normalization empties (only punctuation or symbols,
    say), ``(its folded characters, single-spaced, True)``, so that it still has a sketch.

    A text of nothing but whitespace has none: :class:`InputError`.
    """
    normalized = normalize(text, simplify_script)
    if normalized:
        return normalized, False
    folded = " ".join(fold(text).split())
    if not folded:
        raise InputError("the text is empty or only whitespace", hint="give every document some text")
    return folded, True
