"""simdb: a persistent near-duplicate index for text archives, built on PostgreSQL.

The pipeline, one module a step::

    normalize -> tokenize -> fingerprint -> blocks -> matching (SQL) -> verified matches
"""

__version__ = "0.1.0"

from .bits import format_fingerprint, hamming, parse_fingerprint, to_signed, to_unsigned
from .blocks import BlockLayout
from .errors import (BatchError, DatabaseUnavailable, IncompatibleIndex, IndexNotFound, InputError,
                     SimdbError)
from .fingerprint import FingerprintSettings, fingerprint
from .index import Index, Match, Pair
from .ingest import BatchSummary
from .inputs import Document, read_documents
from .settings import IndexSettings

__all__ = [
    "BatchError", "BatchSummary", "BlockLayout", "DatabaseUnavailable", "Document", "FingerprintSettings",
    "IncompatibleIndex", "Index", "IndexNotFound", "IndexSettings", "InputError", "Match", "Pair",
    "SimdbError", "fingerprint", "format_fingerprint", "hamming", "parse_fingerprint", "read_documents",
    "to_signed", "to_unsigned", "__version__",
]
