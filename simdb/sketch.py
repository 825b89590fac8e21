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

import xxhash

from . import minhash
from .bits import format_fingerprint
from .errors import InputError
from .fingerprint import FingerprintSettings, fingerprint

Recipe = FingerprintSettings | minhash.MinHashSettings


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
