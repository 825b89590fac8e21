"""Character-level differences between two texts, for people: ``simdb show A B`` and the report's pairs.

Near-duplicates are mostly the same text, so the diff is computed in two passes with
:class:`difflib.SequenceMatcher`: over sentences and lines first, then over the characters of each
changed run of them. Characters, not words, because Chinese has no spaces to cut words at;
``autojunk`` is off, since its heuristic (a character in more than 1% of a long text is junk) would
treat every common Chinese character as noise and match nothing. A changed run that shares little
with its counterpart (a moved paragraph), or that is too long to compare character by character in
good time, is shown removed and added whole.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from difflib import SequenceMatcher
from typing import Literal, NamedTuple

Kind = Literal["same", "removed", "added"]

#: Changed runs whose characters match less than this are shown as removed and added whole: a character
#: diff of unrelated text is confetti of one-letter matches.
MIN_CHARACTER_RATIO = 0.5
#: Changed runs longer than this (characters, on either side) are not compared character by character:
#: SequenceMatcher is quadratic in the worst case.
MAX_CHARACTER_RUN = 20_000
#: Where the first pass cuts: after a line break or a sentence's end (Chinese and Western punctuation).
_UNITS = re.compile(r"(?<=[\n。！？；!?;])|(?<=[.] )")


def _merged(pieces: Iterator[tuple[Kind, str]]) -> list[tuple[Kind, str]]:
    out: list[tuple[Kind, str]] = []
    for kind, text in pieces:
        if not text:
            continue
        if out and out[-1][0] == kind:
            out[-1] = (kind, out[-1][1] + text)
        else:
            out.append((kind, text))
    return out


def _characters(a: str, b: str) -> Iterator[tuple[Kind, str]]:
    if max(len(a), len(b)) > MAX_CHARACTER_RUN:
        yield "removed", a
        yield "added", b
        return
    matcher = SequenceMatcher(None, a, b, autojunk=False)
    if a and b and matcher.ratio() < MIN_CHARACTER_RATIO:
        yield "removed", a
        yield "added", b
        return
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            yield "same", a[i1:i2]
        else:
            yield "removed", a[i1:i2]
            yield "added", b[j1:j2]


def diff(a: str, b: str) -> list[tuple[Kind, str]]:
    """``(kind, text)`` runs that turn ``a`` into ``b``: the ``same`` and ``removed`` runs spell ``a``, the
    ``same`` and ``added`` runs spell ``b``."""
    units_a, units_b = _UNITS.split(a), _UNITS.split(b)
    pieces: list[tuple[Kind, str]] = []
    for tag, i1, i2, j1, j2 in SequenceMatcher(None, units_a, units_b, autojunk=False).get_opcodes():
        if tag == "equal":
            pieces.append(("same", "".join(units_a[i1:i2])))
        else:
            pieces.extend(_characters("".join(units_a[i1:i2]), "".join(units_b[j1:j2])))
    return _merged(iter(pieces))


def changed_characters(runs: list[tuple[Kind, str]]) -> tuple[int, int]:
    """(characters removed, characters added)."""
    return (sum(len(text) for kind, text in runs if kind == "removed"),
            sum(len(text) for kind, text in runs if kind == "added"))


def elided(runs: list[tuple[Kind, str]], context: int = 80) -> list[tuple[Kind, str]]:
    """The runs with long unchanged stretches cut to ``context`` characters on each side of a change."""
    out: list[tuple[Kind, str]] = []
    for i, (kind, text) in enumerate(runs):
        if kind == "same" and len(text) > 2 * context + 5:
            head = text[:context] if i > 0 else ""
            tail = text[len(text) - context:] if i < len(runs) - 1 else ""
            out.append(("same", f"{head} … {tail}" if i > 0 or i < len(runs) - 1 else text[:2 * context] + " …"))
        else:
            out.append((kind, text))
    return out


class Change(NamedTuple):
    """One change between two texts, where it is and what surrounds it: offsets count characters from 0,
    lines from 1; ``before`` and ``after`` are the unchanged characters around it (``context`` at most)."""
    a_offset: int
    b_offset: int
    a_line: int
    b_line: int
    removed: str
    added: str
    before: str
    after: str


def changes(runs: list[tuple[Kind, str]], context: int = 40, join: int = 0) -> list[Change]:
    """The changes of ``runs`` (as :func:`diff` gives them), in order, each with its position in both texts
    and the unchanged text around it. A removal and an addition next to each other are one change, and so
    are two changes at most ``join`` unchanged characters apart (those characters removed and added again:
    ``functi[-on-]{+no+}`` reads better than two changes a character apart)."""
    found: list[Change] = []
    a_offset = b_offset = 0
    a_line = b_line = 1
    removed = added = ""
    start = None  # (a_offset, b_offset, a_line, b_line, before) where the open change began
    previous = ""
    for i, (kind, text) in enumerate(runs):
        bridges = (kind == "same" and start is not None and len(text) <= join and i + 1 < len(runs))
        if kind == "same" and not bridges:
            if start is not None:
                found.append(Change(*start[:4], removed, added, start[4], text[:context]))
                start, removed, added = None, "", ""
            previous = text
        elif start is None:
            start = (a_offset, b_offset, a_line, b_line, previous[max(0, len(previous) - context):])
        if kind != "added":
            removed += text if kind != "same" or bridges else ""
            a_offset, a_line = a_offset + len(text), a_line + text.count("\n")
        if kind != "removed":
            added += text if kind != "same" or bridges else ""
            b_offset, b_line = b_offset + len(text), b_line + text.count("\n")
    if start is not None:
        found.append(Change(*start[:4], removed, added, start[4], ""))
    return found
