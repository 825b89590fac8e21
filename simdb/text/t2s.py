"""Traditional -> simplified Chinese: OpenCC's ``t2s`` conversion, and the characters at which it can change a text.

OpenCC converts by dictionary: at each position, the longest key of its dictionaries that starts there is
replaced by that key's first value, and a character that starts no key is copied (``Conversion::Convert``:
``MatchPrefix``, ``GetDefault``). A conversion chain runs such steps in turn, each on the previous step's
output. So a text changes only where it holds a *changing key* -- one whose first value differs from it --
and then it holds, at one of the positions where key and value differ, the key's character there (any of
the key's characters where the two differ in length). A text with none of those characters passes every
step unchanged, and the first step's output is the text itself, so the next step sees it too.

:func:`changing_characters` reads the set from the very dictionaries the converter loads (through the
``opencc_dict`` tool shipped with the ``opencc`` package). A phrase holding a character that changes
alone needs nothing more (a text holding the phrase holds that character), so the set is the changing
single characters and the differing characters of the few phrases left: 5,127 characters for OpenCC
1.4's ``t2s``, which leave about three in four long Chinese texts of the devset, and nine in ten short
ones, to skip the converter (about 30 us a long text). Where the dictionaries cannot be read, every text
with a Han character is converted, as before; the tests convert every character outside the set, alone and
in the phrases of the dictionaries, and every devset text the set lets pass.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)

#: The OpenCC configuration simdb simplifies by (stored with every index through the canaries it changes).
CONFIG = "t2s.json"
#: Characters of the Basic Multilingual Plane, as bits of :func:`marks`.
BMP = 0x10000


@functools.cache
def converter():
    """OpenCC's traditional -> simplified converter, loaded once per process."""
    import opencc

    return opencc.OpenCC(CONFIG)


def convert(text: str) -> str:
    """``text`` through OpenCC's ``t2s``."""
    return converter().convert(text)


def _dictionary_specs(node) -> Iterator[dict]:
    """Every dictionary a configuration names (in its normalization, segmentation and conversion steps, and
    inside groups): reading them all can only add characters to the set."""
    if isinstance(node, dict):
        if "file" in node and "type" in node:
            yield node
        for value in node.values():
            yield from _dictionary_specs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _dictionary_specs(value)


def _tool() -> str | None:
    """The ``opencc_dict`` the ``opencc`` package ships (else one on ``PATH``): it reads the binary
    dictionaries."""
    import opencc

    shipped = Path(opencc.__file__).parent / "clib" / "bin" / "opencc_dict"
    return str(shipped) if shipped.is_file() else shutil.which("opencc_dict")


def _entries(spec: dict, directory: Path, tool: str | None) -> Iterator[tuple[str, str]]:
    """``(key, first value)`` of every entry of one dictionary (``ValueError`` where it cannot be read)."""
    path = directory / spec["file"]
    if spec["type"] == "text":
        lines = path.read_text(encoding="utf-8").splitlines()
    elif spec["type"] in ("ocd2", "ocd") and tool is not None:
        with tempfile.TemporaryDirectory(prefix="simdb-opencc-") as scratch:
            out = Path(scratch) / "dictionary.txt"
            subprocess.run([tool, "-i", str(path), "-o", str(out), "-f", spec["type"], "-t", "text"],
                           check=True, capture_output=True, timeout=60)
            lines = out.read_text(encoding="utf-8").splitlines()
    else:
        raise ValueError(f"cannot read a dictionary of type {spec['type']!r} ({path})")
    for number, line in enumerate(lines, 1):
        key, tab, values = line.partition("\t")
        if not tab or not key:
            raise ValueError(f"{path}, entry {number}: not 'key<TAB>values': {line!r}")
        yield key, values.split(" ")[0] if values else key


def _differing(key: str, value: str) -> str:
    """The characters of ``key`` that its conversion to ``value`` replaces."""
    if len(key) != len(value):
        return key
    return "".join(a for a, b in zip(key, value) if a != b)


def dictionary_entries() -> list[tuple[str, str]]:
    """``(key, first value)`` of every entry of every dictionary the converter loads; an error (``OSError``,
    ``ValueError``, ``KeyError``, ``AttributeError``, ``SubprocessError``, ``UnicodeDecodeError``) where they
    cannot be read here."""
    config_path = Path(converter().config)
    specs = list(_dictionary_specs(json.loads(config_path.read_text(encoding="utf-8"))))
    if not specs:
        raise ValueError(f"{config_path} names no dictionary")
    tool = _tool()
    return [entry for spec in specs for entry in _entries(spec, config_path.parent, tool)]


@functools.cache
def changing_characters() -> frozenset[str] | None:
    """The characters at which ``t2s`` can change a text (see the module's text), or None where its
    dictionaries cannot be read here (then every text with a Han character is converted): no
    ``opencc_dict``, a dictionary type or entry it does not know, a converter that names no configuration
    file."""
    try:
        changing = [(key, value) for key, value in dictionary_entries() if key != value]
    except (OSError, ValueError, KeyError, AttributeError, subprocess.SubprocessError, UnicodeDecodeError) as exc:
        log.info("OpenCC's t2s dictionaries could not be read (%s): every Han text is converted", exc)
        return None
    alone = {key for key, value in changing if len(key) == 1}
    characters = set(alone)
    for key, value in changing:
        if len(key) > 1 and alone.isdisjoint(key):  # else a text holding the key holds a changing character
            characters.update(_differing(key, value))
    return frozenset(characters)


@functools.cache
def marks() -> bytes | None:
    """:func:`changing_characters` as a bit set over the Basic Multilingual Plane (bit ``c % 8`` of byte
    ``c // 8``), for the compiled check; None where the set is unknown.

    Kept in a cache file beside the character tables' (:func:`simdb.text.characters.cache_directory`): reading
    the dictionaries runs ``opencc_dict`` on each binary one, 60 ms of a ``simdb fingerprint``. The file's name
    holds what decides the set (this module's source, the configuration, the tool, each dictionary's path,
    size and modification time), so a stale one is never read; one that cannot be read or written is built
    again, as without a cache."""
    path = _marks_cache_path()
    if path is not None:
        with contextlib.suppress(OSError):
            cached = path.read_bytes()
            if len(cached) == BMP // 8:
                return cached
    characters = changing_characters()
    if characters is None:
        return None
    bits = bytearray(BMP // 8)
    for character in characters:
        point = ord(character)
        if point < BMP:
            bits[point >> 3] |= 1 << (point & 7)
    if path is not None:
        with contextlib.suppress(OSError):
            path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=path.parent, prefix=path.name, delete=False) as file:
                file.write(bits)
            os.replace(file.name, path)  # whole or not at all: a reader never meets half a file
    return bytes(bits)


def _marks_cache_path() -> Path | None:
    """The cache file of :func:`marks` for the dictionaries the converter loads now, or None where they cannot be
    named (then nothing is cached)."""
    from .characters import cache_directory

    try:
        config_path = Path(converter().config)
        config = config_path.read_bytes()
        key = hashlib.sha256(Path(__file__).read_bytes())
        key.update(f"{config_path}\0{_tool()}\0".encode() + config)
        for spec in _dictionary_specs(json.loads(config)):
            state = (config_path.parent / spec["file"]).stat()
            key.update(f"\0{spec['type']}\0{spec['file']}\0{state.st_size}\0{state.st_mtime_ns}".encode())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return cache_directory() / f"t2s-marks-{key.hexdigest()[:16]}.bin"


def may_change(text: str) -> bool:
    """Whether ``t2s`` may change ``text``: it holds a character of :func:`changing_characters` or one beyond
    the Basic Multilingual Plane (the compiled twin decides those without a lookup). True where the set is
    unknown."""
    characters = changing_characters()
    if characters is None:
        return True
    return not characters.isdisjoint(text) or (not text.isascii() and any(ord(c) >= BMP for c in text))
