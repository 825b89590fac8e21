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

import functools
import json
import logging
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
    ``c // 8``), for the compiled check; None where the set is unknown."""
    characters = changing_characters()
    if characters is None:
        return None
    bits = bytearray(BMP // 8)
    for character in characters:
        point = ord(character)
        if point < BMP:
            bits[point >> 3] |= 1 << (point & 7)
    return bytes(bits)


def may_change(text: str) -> bool:
    """Whether ``t2s`` may change ``text``: it holds a character of :func:`changing_characters` or one beyond
    the Basic Multilingual Plane (the compiled twin decides those without a lookup). True where the set is
    unknown."""
    characters = changing_characters()
    if characters is None:
        return True
    return not characters.isdisjoint(text) or (not text.isascii() and any(ord(c) >= BMP for c in text))
