"""Chinese word segmentation: jieba's dictionary and algorithm, run by jieba-rs where it can be.

jieba (the Python package) is the reference. With its HMM off (simdb's default), ``rjieba`` --
the Python binding of jieba-rs, which ships the same dictionary and implements the same
dictionary-DAG segmentation in Rust -- yields the same tokens about 14 times faster; the tests
compare the two over the devset and over generated text. jieba's HMM has no identical twin in
jieba-rs, so with ``--jieba-hmm``, on a platform without rjieba wheels, or with
``SIMDB_SEGMENTER=jieba`` in the environment, jieba itself segments.

Which segmenter wrote an index's fingerprints is recorded with it (:func:`segmenter_name`).
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
import re
from collections.abc import Callable

#: ``auto`` (rjieba where it gives jieba's tokens, else jieba) or ``jieba`` (always the reference).
SEGMENTER_ENV = "SIMDB_SEGMENTER"
SEGMENTERS = ("auto", "jieba")


def _choice() -> str:
    choice = os.environ.get(SEGMENTER_ENV, "auto").strip().lower() or "auto"
    if choice not in SEGMENTERS:
        raise ValueError(f"{SEGMENTER_ENV}={choice!r} is not a segmenter: use one of {', '.join(SEGMENTERS)}")
    return choice


@functools.cache
def _jieba():
    """One jieba tokenizer per process, dictionary loaded on first use (~1.4 s)."""
    import jieba

    jieba.setLogLevel(logging.WARNING)
    tokenizer = jieba.Tokenizer()
    tokenizer.initialize()
    return tokenizer


@functools.cache
def _rjieba_installed() -> bool:
    """Whether rjieba is installed, asked without importing it: the import loads its dictionary (~0.15 s), which
    only a text with Han characters needs, not every command that fingerprints."""
    return importlib.util.find_spec("rjieba") is not None


@functools.cache
def _rjieba():
    """The rjieba module, imported on first use."""
    import rjieba

    return rjieba


def _uses_rjieba(hmm: bool, choice: str) -> bool:
    return not hmm and choice == "auto" and _rjieba_installed()


#: Characters jieba-rs segments as Han but jieba does not (CJK Extension A, U+9FD6-U+9FFF, the
#: compatibility ideographs, the astral planes' ideographs). They join the neighbouring Han run into one
#: block for jieba-rs and end it for jieba, so the two DAG searches sum their log-probabilities over
#: different spans; where two segmentations score equally (``一一一``: 一一+一 or 一+一一) the rounding of
#: those sums decides, and the two picked differently ('一一一丵丁㐀1号店'). jieba segments such texts.
BLOCKS_DIFFER = re.compile("[\u3400-\u4dbf\u9fd6-\u9fff\uf900-\ufaff\U00020000-\U0003ffff]")


@functools.cache
def _cutter(hmm: bool, choice: str) -> Callable[[str, bool | None], list[str]]:
    if _uses_rjieba(hmm, choice):  # jieba's dictionary loads only if a text needs it (~1.4 s per process)
        differ = BLOCKS_DIFFER.search

        def cut_fast(text: str, differs: bool | None) -> list[str]:
            fast = _rjieba().cut
            if differs is None:
                differs = differ(text) is not None
            return _cut_apart(text, fast) if differs else fast(text, False)
        return cut_fast
    tokenizer = _jieba()
    return lambda text, differs: tokenizer.lcut(text, HMM=hmm)


def _cut_apart(text: str, fast: Callable[[str, bool], list[str]]) -> list[str]:
    """jieba's tokens of a text holding characters where jieba-rs and jieba disagree: jieba cuts at every
    space (each space a token, each piece between two segmented on its own), so only the pieces holding such
    a character go to jieba, and the rest to jieba-rs in one call. A text of many Han runs (the tokenizers
    join them with spaces) with one such character costs one slow piece, not the whole text."""
    tokens: list[str] = []
    group: list[str] = []
    for piece in text.split(" "):
        if BLOCKS_DIFFER.search(piece):
            if group:
                tokens.extend(fast(" ".join(group), False))
                tokens.append(" ")
                group = []
            tokens.extend(_jieba().lcut(piece, HMM=False))
            tokens.append(" ")
        else:
            group.append(piece)
    if group:
        tokens.extend(fast(" ".join(group), False))
    else:
        tokens.pop()  # the space after the last piece
    return tokens


def cut(text: str, hmm: bool = False, differs: bool | None = None) -> list[str]:
    """jieba's segmentation of ``text`` (HMM for unknown words on or off), by the segmenter chosen above.
    ``differs``, where the caller knows it, says whether ``text`` holds a character of
    :data:`BLOCKS_DIFFER` (a search of the text otherwise)."""
    return _cutter(hmm, _choice())(text, differs)


def cutter(hmm: bool = False) -> Callable[[str, bool | None], list[str]]:
    """:func:`cut` with ``hmm`` as it is now, as a function of ``(text, differs)``: for a batch of texts,
    which then reads the environment's choice once, not once a text (``os.environ.get`` of an unset
    variable raises and catches a ``KeyError``: about 1 us, a tenth of a short text's segmentation)."""
    return _cutter(hmm, _choice())


def _version(package: str) -> str:
    import importlib.metadata  # here: it loads the email package, which a fingerprint never needs

    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def segmenter_name(hmm: bool = False) -> str:
    """Which segmenter :func:`cut` uses here, with its version: ``rjieba 0.2.2`` or ``jieba 0.42.1``."""
    return f"rjieba {_version('rjieba')}" if _uses_rjieba(hmm, _choice()) else f"jieba {_version('jieba')}"
