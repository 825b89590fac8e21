"""One entry point for both ways of summarising a text.

An index is built either with SimHash (:mod:`simdb.fingerprint`: a 64-bit
fingerprint, near-duplicate = few differing bits) or with MinHash
(:mod:`simdb.minhash`: a signature of ``num_perm`` values, near-duplicate =
estimated Jaccard similarity at or above a threshold). The rest of simdb
handles either through these functions, dispatching on the recipe stored with
the index: a :class:`~simdb.fingerprint.FingerprintSettings` or a
:class:`~simdb.minhash.MinHashSettings`.

A *sketch* is what is stored per document: the unsigned fingerprint (``int``)
or the signature's bytes (``bytes``). Distances are comparable across the two:
bits that differ, or signature positions that differ.
"""

from __future__ import annotations

import numpy as np
import xxhash

from . import minhash
from .bits import format_fingerprint, to_signed_array
from .blocks import BlockLayout
from .errors import InputError
from .fingerprint import FingerprintSettings, fingerprint

#: What turns a text into a sketch.
Recipe = FingerprintSettings | minhash.MinHashSettings
#: What turns a sketch into key columns (for MinHash, the same MinHashSettings object).
Layout = BlockLayout | minhash.MinHashSettings


def sketch(text: str, recipe: Recipe) -> int | bytes:
    """Text -> fingerprint (SimHash) or signature bytes (MinHash)."""
    if isinstance(recipe, minhash.MinHashSettings):
        return minhash.to_bytes(minhash.signature(text, recipe))
    return fingerprint(text, recipe)


def sketch_many(texts: list[str], recipe: Recipe) -> list[int | bytes | InputError]:
    """Sketches of many texts; a text that has none gives its :class:`InputError` in its place.

    MinHash signatures of the whole list are computed in one vectorised pass.
    """
    if not isinstance(recipe, minhash.MinHashSettings):
        results: list = []
        for text in texts:
            try:
                results.append(fingerprint(text, recipe))
            except InputError as exc:
                results.append(exc)
        return results
    hashes, results = [], []
    for text in texts:
        try:
            hashes.append(minhash.shingle_hashes(text, recipe))
            results.append(None)
        except InputError as exc:
            results.append(exc)
    rows = iter(minhash.signatures(hashes, recipe))
    return [minhash.to_bytes(next(rows)) if result is None else result for result in results]


def digest(value: int | bytes) -> str:
    """A short, stable name for a sketch (canaries): the fingerprint, or a hash of the signature."""
    return xxhash.xxh3_64_hexdigest(value) if isinstance(value, bytes) else format_fingerprint(value)


def sketch_column(layout: Layout) -> tuple[str, str]:
    """The documents column (and its type) that holds the sketch: ``simhash`` or ``signature``."""
    return ("signature", "bytea") if isinstance(layout, minhash.MinHashSettings) else ("simhash", "int8")


def keys_and_values(layout: Layout, sketches: list[int | bytes]) -> tuple[np.ndarray, list]:
    """``(keys (n, key columns) int64, the sketches as stored)`` for a list of sketches."""
    if isinstance(layout, minhash.MinHashSettings):
        rows = np.frombuffer(b"".join(sketches), dtype="<u4").reshape(len(sketches), layout.num_perm)
        return minhash.band_keys_array(rows, layout), list(sketches)
    fingerprints = np.array(sketches, dtype=np.uint64)
    return layout.block_keys_array(fingerprints), to_signed_array(fingerprints).tolist()
