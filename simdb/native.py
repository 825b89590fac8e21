"""The compiled fast paths (``simdb/csrc/``), chosen once, here, at import: the per-character and
per-token loops of a fingerprint, and the per-shingle loop of a MinHash signature.

No other module imports the compiled module or asks whether it is there: each calls the functions chosen
here (``native.fold(text)``), or, for a twin that lives with its caller, binds :func:`chosen` once at its
own import. Each compiled function has a Python twin that is the definition, and gives the same result; the
tests hold the two equal over the devset and over generated text:

=========================  ==================================================================
``_native.fold``           :func:`simdb.text.normalize.fold`
``_native.any_marked``     :func:`simdb.text.t2s.may_change`, with :func:`simdb.text.t2s.marks`
``_native.auto_runs``      ``fold``, ``any_marked`` and ``runs``, one text after another
``_native.runs``           the regexes of :func:`simdb.text.tokenize._punctuated_parts_in_python`
``_native.token_ids``      :meth:`simdb.methods.simhash.fingerprint._Vocabulary.lookup`
``_native.simhashes``      :func:`simdb.methods.simhash.fingerprint.simhashes_of_tokens`
``_native.minhashes``      :func:`simdb.methods.minhash.signature._signatures_in_numpy`
``_native.band_keys``      :func:`simdb.methods.minhash.signature._band_keys_in_python`
=========================  ==================================================================

``band_keys`` is compiled only where OpenSSL's libcrypto and its headers were at hand (``hatch_build.py``);
a module built without them runs its Python twin, unless ``SIMDB_NATIVE=required``, which then fails.

``SIMDB_NATIVE`` in the environment chooses: unset (or ``auto``), the compiled paths where the module was
built (``hatch_build.py``), else the Python twins (the same fingerprints, slower); ``required``, the
compiled paths or an ImportError that says how to build them (CI sets it: ``scripts/test``); ``off`` (or
``0``), the Python twins (for a comparison, or to rule the compiled paths out). Where the Python twins run,
the functions here that the compiled ones take a text from return None (or "may": True), leaving the text
to its caller's Python path. The compiled module's tables (what each character folds to, which class of run
it belongs to) are set at the first call that needs them, from the same definitions the Python twins use
(:mod:`simdb.text.characters`, which caches them in a file).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable

from .text.scripts import ASTRAL_CHARACTER, HAN_CHARACTER

__all__ = ["MODES", "NATIVE_ENV", "PYTHON_TWINS", "any_marked", "auto_runs", "chosen", "description", "enabled", "fold",
           "has_astral", "mode", "module", "runs"]

#: The environment variable that chooses (see above), and its values.
NATIVE_ENV = "SIMDB_NATIVE"
MODES = ("auto", "required", "off")
BUILD_HINT = ("build it with a C compiler, Python's and OpenSSL's headers at hand (Debian: apt-get install gcc "
              "python3-dev libssl-dev), then `pip install -e .` (-v shows the compile)")


def mode() -> str:
    """The ``SIMDB_NATIVE`` asked for: ``auto``, ``required`` or ``off``."""
    value = os.environ.get(NATIVE_ENV, "").strip().lower()
    value = {"": "auto", "0": "off"}.get(value, value)
    if value not in MODES:
        raise ImportError(f"{NATIVE_ENV}={value!r} in the environment: set it to one of {', '.join(MODES)} "
                          "(or unset it)")
    return value


def _load():
    asked = mode()
    if asked == "off":
        return None
    try:
        from . import _native
    except ImportError as exc:
        if asked == "required":
            raise ImportError(f"{NATIVE_ENV}=required, and simdb's compiled fast paths (simdb._native) cannot be "
                              f"imported ({exc}): {BUILD_HINT}; or unset {NATIVE_ENV} to run the pure-Python "
                              "paths") from exc
        return None
    return _native


_compiled = _load()


def enabled() -> bool:
    """Whether this process takes the compiled paths."""
    return _compiled is not None


def description() -> str:
    """For ``simdb --version``: whether fingerprints take the compiled paths here."""
    if _compiled is not None:
        if not hasattr(_compiled, "band_keys"):
            return "on; MinHash band keys in Python (built without libssl-dev)"
        return "on"
    if mode() == "off":
        return f"off, {NATIVE_ENV}=off"
    return "not built; pure Python gives the same fingerprints, slower"


def module():
    """The compiled module with its tables set, or None: for the tests that hold it to its twins and for the
    benchmarks, never for simdb's own code (which calls what was chosen here)."""
    if _compiled is None:
        return None
    _set_tables()
    return _compiled


def chosen(fast: str | Callable, twin: Callable) -> Callable:
    """For a twin that lives with its caller: the compiled function named ``fast`` (or ``fast`` itself, a
    Python function that takes the compiled module as its first argument) where the compiled paths are on,
    else ``twin``. Bound once, at the caller's import."""
    if _compiled is None:
        return twin
    if isinstance(fast, str) and not hasattr(_compiled, fast):  # built without what it needs (OpenSSL)
        if mode() == "required":
            raise ImportError(f"{NATIVE_ENV}=required, and simdb's compiled module lacks {fast} (built without "
                              f"what it needs): {BUILD_HINT}")
        return twin
    return getattr(_compiled, fast) if isinstance(fast, str) else functools.partial(fast, _compiled)


# The Python stand-ins for the text functions: nothing taken (the caller's Python path takes the text).
def _not_folded(text: str) -> None:
    return None


def _no_runs(folded: str) -> None:
    return None


def _has_astral_in_python(text: str) -> bool:
    return ASTRAL_CHARACTER.search(text) is not None


def _may_be_marked(text: str, marks: bytes) -> bool:
    """Whether OpenCC may change ``text`` (holds a Han character): the compiled check is exact, this one only
    never says no where OpenCC would change the text."""
    return HAN_CHARACTER.search(text) is not None


def _no_auto_runs(texts: list[str], marks: bytes | None) -> list[None]:
    return [None] * len(texts)


@functools.cache
def _set_tables() -> None:
    from .text.characters import native_tables

    _compiled.set_tables(*native_tables())


def _with_tables(name: str) -> Callable:
    """The compiled ``name``, whose first call sets the module's tables and then puts the compiled function
    itself in its place here (later calls go straight to C)."""
    def first_call(*args):
        _set_tables()
        function = getattr(_compiled, name)
        globals()[name] = function
        return function(*args)

    first_call.__name__ = name
    return first_call


#: ``fold(text)``: the folded text, or None where the caller's Python path must fold it.
fold: Callable[[str], str | None] = _with_tables("fold") if _compiled is not None else _not_folded
#: ``runs(folded)``: ``(han text, words, nospace runs, differs)``, or None (the caller's Python path).
runs: Callable[[str], tuple | None] = _with_tables("runs") if _compiled is not None else _no_runs
#: ``has_astral(text)``: whether ``text`` holds a character beyond the Basic Multilingual Plane.
has_astral: Callable[[str], bool] = _with_tables("has_astral") if _compiled is not None else _has_astral_in_python
#: ``any_marked(text, marks)``: whether OpenCC may change ``text`` (:func:`simdb.text.t2s.marks`).
any_marked: Callable[[str, bytes], bool] = _with_tables("any_marked") if _compiled is not None else _may_be_marked
#: ``auto_runs(texts, marks)``: per text its runs, its folded text where OpenCC may change it, or None.
auto_runs: Callable = _with_tables("auto_runs") if _compiled is not None else _no_auto_runs

#: What ``SIMDB_NATIVE=off`` binds each of the names above to.
PYTHON_TWINS: dict[str, Callable] = {"fold": _not_folded, "runs": _no_runs, "has_astral": _has_astral_in_python,
                                     "any_marked": _may_be_marked, "auto_runs": _no_auto_runs}
