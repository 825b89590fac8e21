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
import unicodedata
from collections.abc import Iterator

from .. import native
from ..errors import InputError
from . import t2s
from .characters import bmp_punctuation, compatibility_forms, punctuation_and_symbols  # noqa: F401 -- and re-exported
from .scripts import ASTRAL_CHARACTER, HAN_CHARACTER, character_class


def simplify(text: str) -> str:
    """Traditional Chinese -> simplified (OpenCC ``t2s``). A text that holds none of the characters at which
    the conversion can change it (:mod:`.t2s`; compiled: one bit lookup per character), or no Han character
    at all, is returned as is."""
    marks = t2s.marks()
    if marks is not None:
        return t2s.convert(text) if native.any_marked(text, marks) else text
    return t2s.convert(text) if HAN_CHARACTER.search(text) else text


@functools.cache
def _punctuation_table() -> dict[int, str]:
    """Every punctuation and symbol code point -> a space: ``str.translate`` with it is far faster than a
    per-character category lookup."""
    return dict.fromkeys(punctuation_and_symbols(), " ")


def fold(text: str) -> str:
    """NFKC and case folding only: width, compatibility forms and case vanish (:func:`fold_in_python` defines
    it; the compiled twin, where built, takes a text of the Basic Multilingual Plane that needs no composing
    in one pass of table lookups)."""
    if text.isascii():
        return text.casefold()
    folded = native.fold(text)
    return folded if folded is not None else fold_in_python(text)


def fold_in_python(text: str) -> str:
    """:func:`fold`, in Python.

    ``unicodedata.normalize`` rebuilds a whole text that fails its quick check, and Chinese text always
    does (its punctuation is full-width): about 0.1 us per character. Replacing each character by its own
    NFKC form first leaves the text's NFKD, hence its NFKC, unchanged, and usually leaves nothing for NFKC
    to do, which its quick check then sees; text that still needs composing (a letter and a combining mark,
    Hangul jamo) or has characters beyond the Basic Multilingual Plane goes through ``normalize`` whole.
    """
    if text.isascii():
        return text.casefold()
    if ASTRAL_CHARACTER.search(text) is None:
        forms, pattern = compatibility_forms()
        parts = pattern.split(text)
        if len(parts) > 1:
            parts[1::2] = map(forms.__getitem__, parts[1::2])
            text = "".join(parts)
        if unicodedata.is_normalized("NFKC", text):
            return text.casefold()
    return unicodedata.normalize("NFKC", text).casefold()


def fold_and_simplify(text: str, simplify_script: bool = True) -> str:
    """Fold, then simplify unless ``simplify_script`` is off (as for ``simhash64-v1`` indexes); a long text a
    piece at a time (:func:`text_pieces`: the same text)."""
    if len(text) > PIECE_CHARACTERS:
        return "".join(_fold_and_simplify(piece, simplify_script) for piece in text_pieces(text, PIECE_CHARACTERS))
    return _fold_and_simplify(text, simplify_script)


def _fold_and_simplify(text: str, simplify_script: bool) -> str:
    text = fold(text)
    return simplify(text) if simplify_script else text


@functools.cache
def _separators() -> re.Pattern:
    """Runs of whitespace and of the Basic Multilingual Plane's punctuation and symbols
    (:func:`strip_punctuation` translates the astral ones first)."""
    return re.compile(rf"[\s{character_class(bmp_punctuation())}]+")


def strip_punctuation(text: str) -> str:
    """Punctuation and symbols -> spaces, runs of whitespace collapsed, the ends stripped."""
    if ASTRAL_CHARACTER.search(text):
        text = text.translate(_punctuation_table())
    return _separators().sub(" ", text).strip()


#: ASCII punctuation and symbols -> a space (``str.translate`` has a fast path for ASCII -> ASCII tables).
_ASCII_SEPARATORS = str.maketrans({chr(cp): " " for cp in range(128) if unicodedata.category(chr(cp))[0] in "PS"})


def ascii_words(text: str) -> list[str]:
    """``strip_punctuation(text).split()`` for ASCII ``text``, a third of the time: one ``translate``."""
    return ascii_spaced(text).split()


def ascii_spaced(text: str) -> str:
    """ASCII ``text`` with its punctuation and symbols turned into spaces (the words of :func:`ascii_words`)."""
    return text.translate(_ASCII_SEPARATORS)


def normalize(text: str, simplify_script: bool = True) -> str:
    """Fold, simplify (unless ``simplify_script`` is off), drop punctuation and symbols, collapse whitespace,
    strip."""
    return strip_punctuation(fold_and_simplify(text, simplify_script))


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


#: A text longer than this many characters is folded, simplified and tokenized a piece at a time
#: (:func:`text_pieces`): folding a whole text of millions of characters built lists of its parts and OpenCC's
#: copies of it, and its tokens as Python strings take about 100 bytes each.
PIECE_CHARACTERS = 1 << 16


#: Where a long text may be cut into pieces that are read one at a time (:func:`text_pieces`): characters that
#: every step of the text path treats as a separator, alone. Each is its own NFKC and case fold, composes with
#: no neighbour (so folding the pieces apart folds the whole), is in no key of OpenCC's t2s dictionaries (so
#: no conversion spans two pieces), and ends every run and word of the tokenizers; tests/test_memory.py
#: checks each of these against unicodedata and the dictionaries.
PIECE_BOUNDARIES = " \n\u3002"


def text_pieces(text: str, size: int) -> Iterator[str]:
    """``text`` cut into pieces of about ``size`` characters, each ending just after a character of
    :data:`PIECE_BOUNDARIES` (or at the end), one at a time: ``"".join(text_pieces(text, size)) == text``, and
    every step from text to tokens gives, piece after piece, what it gives the whole text. A stretch without
    any such character stays whole."""
    boundary, start = _piece_boundary(), 0
    while len(text) - start > size:
        found = boundary.search(text, start + size - 1)
        if found is None:
            break
        yield text[start:found.end()]
        start = found.end()
    yield text[start:] if start else text


@functools.cache
def _piece_boundary() -> re.Pattern:
    return re.compile(f"[{re.escape(PIECE_BOUNDARIES)}]")
