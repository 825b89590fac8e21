"""simdb: a persistent near-duplicate index for text archives, built on PostgreSQL.

The pipeline, one layer a folder::

    text (normalize, tokenize) -> methods (SimHash fingerprint or MinHash signature -> keys)
        -> pg (candidate joins in SQL) -> verified matches -> ingest / index / cli / report
"""

import importlib

from .bits import format_fingerprint, hamming, parse_fingerprint, to_signed, to_unsigned
from .errors import (BatchError, ConnectionLost, DatabaseUnavailable, IncompatibleIndex, IndexNotFound, InputError,
                     NotFound, OutputError, PermissionDenied, SimdbError)
from .inputs import Document, read_documents
from .methods import Method, MinHash, SimHash
from .methods.simhash.blocks import BlockLayout
from .methods.simhash.fingerprint import FingerprintSettings, fingerprint
from .settings import IndexSettings
from .verdicts import Verdict
from .version import __version__

__all__ = [
    "BatchError", "BatchSummary", "BlockLayout", "ConnectionLost", "DatabaseUnavailable", "Document",
    "FingerprintSettings", "IncompatibleIndex", "Index", "IndexNotFound", "IndexSettings", "InputError", "Match",
    "Method", "MinHash", "NotFound", "OutputError", "Pair", "PermissionDenied", "SimHash", "SimdbError",
    "fingerprint", "format_fingerprint", "hamming", "parse_fingerprint", "read_documents", "to_signed",
    "to_unsigned", "Verdict", "__version__",
]

#: Names whose modules load the database layer (SQLAlchemy, alembic, psycopg): imported on first use (PEP 562),
#: so that ``import simdb.cli`` (and ``simdb --help``, ``simdb fingerprint``) start without it.
_DATABASE_NAMES = {"Index": ".index", "Match": ".index", "Pair": ".index", "BatchSummary": ".ingest"}


def __getattr__(name: str):
    if name in _DATABASE_NAMES:
        value = getattr(importlib.import_module(_DATABASE_NAMES[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_DATABASE_NAMES])
