"""The compiled fast paths (``simdb/_native.c``): the per-character and per-token loops of a fingerprint,
and the per-shingle loop of a MinHash signature.

Each compiled function has a Python twin that is the definition, and gives the same result; the tests hold
the two equal over the devset and over generated text:

=========================  ==================================================================
``_native.fold``           :func:`simdb.text.normalize.fold`
``_native.any_marked``     :func:`simdb.text.t2s.may_change`, with :func:`simdb.text.t2s.marks`
``_native.auto_runs``      ``fold``, ``any_marked`` and ``runs``, one text after another
``_native.runs``           the regexes of :func:`simdb.text.tokenize._punctuated_parts_in_python`
``_native.token_ids``      :meth:`simdb.methods.simhash.fingerprint._Vocabulary.lookup`
``_native.simhashes``      :func:`simdb.methods.simhash.fingerprint.simhashes_of_tokens`
``_native.minhashes``      :func:`simdb.methods.minhash.signature._signatures_in_numpy`
=========================  ==================================================================

The module is built with simdb where a C compiler is at hand (``hatch_build.py``); without it, or with
``SIMDB_NATIVE=0`` in the environment, simdb runs the Python twins: the same fingerprints, slower. Its
tables (what each character folds to, which class of run it belongs to) are set here, once per process,
from the same definitions the Python twins use (:mod:`simdb.text.characters`, which caches them in a file).
"""

from __future__ import annotations

import functools
import os

try:
    from . import _native as _compiled
except ImportError:  # not built here: the Python twins do the work
    _compiled = None

#: ``0`` turns the compiled paths off (for a comparison, or to rule them out).
NATIVE_ENV = "SIMDB_NATIVE"


def available() -> bool:
    """Whether this installation has the compiled module."""
    return _compiled is not None


def description() -> str:
    """For ``simdb --version``: whether fingerprints take the compiled paths here."""
    if _compiled is None:
        return "not built; pure Python gives the same fingerprints, slower"
    return "off, SIMDB_NATIVE=0" if os.environ.get(NATIVE_ENV, "").strip() == "0" else "on"


@functools.cache
def _loaded():
    if _compiled is None or os.environ.get(NATIVE_ENV, "").strip() == "0":
        return None
    from .text.characters import native_tables

    _compiled.set_tables(*native_tables())
    return _compiled


def module():
    """The compiled module with its tables set, or None where the Python twins must run."""
    return _loaded()
