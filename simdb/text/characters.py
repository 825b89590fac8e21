"""Character tables of the text layer: which characters are punctuation, what NFKC makes of each, which
class of run each belongs to. Built once per process from ``unicodedata`` and the one definition of scripts
(:mod:`.scripts`); the Python paths use them as regexes, the compiled ones (:mod:`simdb.native`) as tables,
which are also kept in a cache file (:func:`native_tables`): building them took 0.6 s of every command.
"""

from __future__ import annotations

import functools
import hashlib
import marshal
import os
import re
import sys
import tempfile
import unicodedata
from pathlib import Path

import numpy as np

from .scripts import HAN, OTHER_WITHOUT_SPACES, character_class, expand
from .segment import BLOCKS_DIFFER

#: Class bits of :func:`character_classes`, as ``simdb/csrc/`` reads them.
HAN_BIT, NOSPACE_BIT, WORD_BIT, DIFFERS_BIT = 1, 2, 4, 8
BMP = 0x10000


@functools.cache
def punctuation_and_symbols() -> frozenset[int]:
    """Every punctuation (P*) and symbol (S*) code point (built once per process, about 0.2 s)."""
    return frozenset(cp for cp in range(sys.maxunicode + 1) if unicodedata.category(chr(cp))[0] in "PS")


@functools.cache
def compatibility_forms() -> tuple[dict[str, str], re.Pattern]:
    """Every character of the Basic Multilingual Plane that NFKC changes -> its NFKC form, and a pattern
    that splits a text around them (built once per process, about 0.1 s)."""
    forms = {}
    for cp in range(0x10000):
        if not 0xD800 <= cp < 0xE000:
            form = unicodedata.normalize("NFKC", chr(cp))
            if form != chr(cp):
                forms[chr(cp)] = form
    return forms, re.compile(f"([{character_class(forms)}])")


@functools.cache
def bmp_punctuation() -> frozenset[str]:
    """The punctuation and symbols of the Basic Multilingual Plane (the fast paths' classes)."""
    return frozenset(chr(cp) for cp in punctuation_and_symbols() if cp <= 0xFFFF)


@functools.cache
def punctuated_runs() -> tuple[re.Pattern, re.Pattern, re.Pattern]:
    """The runs of :data:`_RUNS`, read out of text whose punctuation and symbols are still in (they separate
    runs as the spaces normalization makes of them would), one kind at a time: what is not Han (to be
    replaced by a space), runs of the other scripts without spaces, words. The classes hold characters of
    the Basic Multilingual Plane only, which ``re`` matches by table lookup (with a single astral range in a
    class it tests every range in turn): :func:`count_punctuated` sends other text the plain way."""
    separators = bmp_punctuation()
    han_characters = [c for c in expand(HAN) if c <= "\uffff"]
    assert not separators.intersection(han_characters), "a Han character is punctuation"
    han = character_class(han_characters)
    nospace = character_class(c for c in expand(OTHER_WITHOUT_SPACES) if c not in separators)
    return (re.compile(f"[^{han}]+"), re.compile(f"[{nospace}]+"),
            re.compile(rf"[^\s{han}{character_class(expand(OTHER_WITHOUT_SPACES))}{character_class(separators)}]+"))


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
    """Each BMP character's class bits, read off the very regexes of the Python path: :data:`HAN_BIT` for what
    ``[^Han]+`` does not match, :data:`NOSPACE_BIT` and :data:`WORD_BIT` for the runs of the other scripts without
    spaces and of words, :data:`DIFFERS_BIT` for the Han characters jieba-rs and jieba segment differently."""
    not_han, nospace, word = punctuated_runs()
    characters = "".join(map(chr, range(BMP)))
    classes = np.full(BMP, HAN_BIT, dtype=np.uint8)
    for match in not_han.finditer(characters):
        classes[match.start():match.end()] = 0
    for pattern, bit in ((nospace, NOSPACE_BIT), (word, WORD_BIT), (BLOCKS_DIFFER, DIFFERS_BIT)):
        for match in pattern.finditer(characters):
            classes[match.start():match.end()] |= bit
    return classes.tobytes()


#: The modules whose definitions decide the tables: a change to any of them makes a new cache file.
_DEFINITIONS = ("characters.py", "scripts.py", "segment.py")


def native_tables() -> tuple[dict[int, str], bytes, bytes]:
    """:func:`fold_tables` and :func:`character_classes`, as :mod:`simdb.native` takes them: read from the cache
    file an earlier process wrote (``$XDG_CACHE_HOME/simdb``, else ``~/.cache/simdb``), else built and written
    there. The file's name holds what decides them (this Python's Unicode version, the definitions' source), so
    a stale one is never read; one that cannot be read or written is built again, as without a cache."""
    path = _cache_path()
    try:
        folds, unsafe, classes = marshal.loads(path.read_bytes())
        if isinstance(folds, dict) and len(unsafe) == len(classes) == BMP:
            return folds, unsafe, classes
    except (OSError, ValueError, EOFError, TypeError):
        pass
    tables = (*fold_tables(), character_classes())
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=path.name, delete=False) as file:
            file.write(marshal.dumps(tables))
        os.replace(file.name, path)  # whole or not at all: a reader never meets half a file
    except OSError:
        pass
    return tables


def _cache_path() -> Path:
    here = Path(__file__).parent
    key = hashlib.sha256(f"{unicodedata.unidata_version} {sys.maxunicode} {sys.version_info[:2]}".encode())
    for name in _DEFINITIONS:
        key.update((here / name).read_bytes())
    return cache_directory() / f"characters-{key.hexdigest()[:16]}.marshal"


def cache_directory() -> Path:
    """Where simdb keeps what it derives from its definitions and installed packages: ``$XDG_CACHE_HOME/simdb``,
    else ``~/.cache/simdb``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "simdb"
