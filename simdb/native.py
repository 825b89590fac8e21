"""The compiled fast paths (``simdb/_native.c``): the per-character and per-token loops of a fingerprint.

Each compiled function has a Python twin that is the definition, and gives the same result; the tests hold
the two equal over the devset and over generated text:

=========================  ==================================================================
``_native.fold``           :func:`simdb.text.normalize.fold`
``_native.runs``           the regexes of :func:`simdb.text.tokenize._punctuated_kinds`
``_native.token_ids``      :meth:`simdb.methods.simhash.fingerprint._Vocabulary.lookup`
``_native.simhashes``      :func:`simdb.methods.simhash.fingerprint.simhashes_of_tokens`
=========================  ==================================================================

The module is built with simdb where a C compiler is at hand (``hatch_build.py``); without it, or with
``SIMDB_NATIVE=0`` in the environment, simdb runs the Python twins: the same fingerprints, slower. Its
tables (what each character folds to, which class of run it belongs to) are built here, once per process,
from the same definitions the Python twins use.
"""

from __future__ import annotations

import functools
import os
import sys
import unicodedata

import numpy as np

try:
    from . import _native as _compiled
except ImportError:  # not built here: the Python twins do the work
    _compiled = None

#: ``0`` turns the compiled paths off (for a comparison, or to rule them out).
NATIVE_ENV = "SIMDB_NATIVE"

#: Class bits of :func:`character_classes`, as ``simdb/_native.c`` reads them.
HAN, NOSPACE, WORD, DIFFERS = 1, 2, 4, 8
BMP = 0x10000


def available() -> bool:
    """Whether this installation has the compiled module."""
    return _compiled is not None


def description() -> str:
    """For ``simdb version``: whether fingerprints take the compiled paths here."""
    if _compiled is None:
        return "not built; pure Python gives the same fingerprints, slower"
    return "off, SIMDB_NATIVE=0" if os.environ.get(NATIVE_ENV, "").strip() == "0" else "on"


@functools.cache
def _loaded():
    if _compiled is None or os.environ.get(NATIVE_ENV, "").strip() == "0":
        return None
    _compiled.set_tables(*fold_tables(), character_classes())
    return _compiled


def module():
    """The compiled module with its tables set, or None where the Python twins must run."""
    return _loaded()


@functools.cache
def composes_with_previous() -> frozenset[str]:
    """Characters of the Basic Multilingual Plane that canonical composition can join to the character before
    them: the second character of every two-character canonical decomposition, and the Hangul vowel and
    trailing jamo. A superset of those NFC/NFKC's quick check answers MAYBE for (composition exclusions
    included), which is all :func:`fold_tables` needs."""
    seconds = {chr(cp) for cp in range(0x1161, 0x1176)} | {chr(cp) for cp in range(0x11A8, 0x11C3)}
    for cp in range(sys.maxunicode + 1):
        decomposition = unicodedata.decomposition(chr(cp))
        if decomposition and not decomposition.startswith("<"):
            parts = decomposition.split()
            if len(parts) == 2 and int(parts[1], 16) < BMP:
                seconds.add(chr(int(parts[1], 16)))
    return frozenset(seconds)


def fold_tables() -> tuple[dict[int, str], bytes]:
    """What :func:`simdb.text.normalize.fold` makes of each BMP character, where it changes it, and which
    characters send a text to the Python path.

    ``fold`` replaces each character by its own NFKC form and, when the result passes NFKC's quick check,
    case-folds it (``str.casefold`` works character by character). The quick check passes for certain when
    no character of the result has a nonzero combining class or can compose with the one before it: a
    character whose NFKC form holds such a character is *unsafe*, and so is a lone surrogate."""
    from .text.normalize import compatibility_forms

    forms = compatibility_forms()[0]
    composing = composes_with_previous()
    folds: dict[int, str] = {}
    unsafe = bytearray(BMP)
    for cp in range(BMP):
        character = chr(cp)
        if 0xD800 <= cp < 0xE000:
            unsafe[cp] = 1
            continue
        form = forms.get(character, character)
        if any(unicodedata.combining(c) or c in composing for c in form):
            unsafe[cp] = 1
        folded = form.casefold()
        if folded != character:
            folds[cp] = folded
    return folds, bytes(unsafe)


def character_classes() -> bytes:
    """Each BMP character's class bits, read off the very regexes of the Python path: :data:`HAN` for what
    ``[^Han]+`` does not match, :data:`NOSPACE` and :data:`WORD` for the runs of the other scripts without
    spaces and of words, :data:`DIFFERS` for the Han characters jieba-rs and jieba segment differently."""
    from .text.segment import BLOCKS_DIFFER
    from .text.tokenize import punctuated_runs

    not_han, nospace, word = punctuated_runs()
    characters = "".join(map(chr, range(BMP)))
    classes = np.full(BMP, HAN, dtype=np.uint8)
    for match in not_han.finditer(characters):
        classes[match.start():match.end()] = 0
    for pattern, bit in ((nospace, NOSPACE), (word, WORD), (BLOCKS_DIFFER, DIFFERS)):
        for match in pattern.finditer(characters):
            classes[match.start():match.end()] |= bit
    return classes.tobytes()
