"""simdb: a persistent near-duplicate index for text archives, built on PostgreSQL.

The pipeline, one layer a folder::

    text (normalize, tokenize) -> methods (SimHash fingerprint or MinHash signature -> keys)
        -> pg (candidate joins in SQL) -> verified matches -> ingest / index / cli / report
"""

__version__ = "0.1.0"

from .bits import format_fingerprint, hamming, parse_fingerprint, to_signed, to_unsigned
from .errors import (BatchError, DatabaseUnavailable, IncompatibleIndex, IndexNotFound, InputError, OutputError,
                     PermissionDenied, SimdbError)
from .index import Index, Match, Pair
from .ingest import BatchSummary
from .inputs import Document, read_documents
from .methods import Method, MinHash, SimHash
from .methods.simhash.blocks import BlockLayout
from .methods.simhash.fingerprint import FingerprintSettings, fingerprint
from .settings import IndexSettings
from .verdicts import Verdict

__all__ = [
    "BatchError", "BatchSummary", "BlockLayout", "DatabaseUnavailable", "Document", "FingerprintSettings",
    "IncompatibleIndex", "Index", "IndexNotFound", "IndexSettings", "InputError", "Match", "Method", "MinHash",
    "OutputError", "Pair", "PermissionDenied", "SimHash", "SimdbError", "fingerprint", "format_fingerprint", "hamming",
    "parse_fingerprint", "read_documents", "to_signed", "to_unsigned", "Verdict", "__version__",
]
