"""simdb: a persistent near-duplicate index for text archives, built on PostgreSQL.

The pipeline, one layer a folder::

    text (normalize, tokenize) -> methods (SimHash fingerprint or MinHash signature -> keys)
        -> pg (candidate joins in SQL) -> verified matches -> ingest / index / cli / report
"""

import importlib

__all__ = [
    "BatchError", "BatchSummary", "BlockLayout", "ConnectionLost", "DatabaseUnavailable", "Document",
    "FingerprintSettings", "IncompatibleIndex", "Index", "IndexNotFound", "IndexSettings", "InputError", "Match",
    "Method", "MinHash", "NotFound", "OutputError", "Pair", "PermissionDenied", "SimHash", "SimdbError",
    "fingerprint", "format_fingerprint", "hamming", "parse_fingerprint", "read_documents", "to_signed",
    "to_unsigned", "Verdict", "__version__",
]

#: Where each public name lives. None is imported with the package (PEP 562): ``import simdb`` costs nothing,
#: and a command loads only what it uses (``simdb --help`` and ``simdb fingerprint`` no database layer:
#: SQLAlchemy, alembic, psycopg; ``Index`` loads it on first use).
_WHERE = {
    **dict.fromkeys(["format_fingerprint", "hamming", "parse_fingerprint", "to_signed", "to_unsigned"], ".bits"),
    **dict.fromkeys(["BatchError", "ConnectionLost", "DatabaseUnavailable", "IncompatibleIndex", "IndexNotFound",
                     "InputError", "NotFound", "OutputError", "PermissionDenied", "SimdbError"], ".errors"),
    **dict.fromkeys(["Document", "read_documents"], ".inputs"),
    **dict.fromkeys(["Method", "MinHash", "SimHash"], ".methods"),
    "BlockLayout": ".methods.simhash.blocks",
    **dict.fromkeys(["FingerprintSettings", "fingerprint"], ".methods.simhash.fingerprint"),
    "IndexSettings": ".settings",
    "Verdict": ".verdicts",
    **dict.fromkeys(["Index", "Match", "Pair"], ".index"),
    "BatchSummary": ".ingest",
    "__version__": ".version",
}


def __getattr__(name: str):
    if name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name], __name__), name)
        globals()[name] = value
        return value
    if not name.startswith("_"):  # a submodule (``simdb.errors``), bound by the package's import as it was before
        try:
            return importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError as error:
            if error.name != f"{__name__}.{name}":
                raise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})
