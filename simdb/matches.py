"""Verified matches: ``(probe id, target id, distance)`` rows as the methods return them.

A pair that shared several keys comes back once per key; :func:`distinct` keeps it once, and
:func:`earliest` keeps each probe's earliest match (the one ``duplicate_of`` points at).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np


def distinct(chunks: Iterable[np.ndarray], columns: int = 3) -> np.ndarray:
    """All rows of a chunked result, each distinct row once, sorted."""
    parts = list(chunks)
    return np.unique(np.concatenate(parts), axis=0) if parts else np.empty((0, columns), dtype=np.int64)


def earliest(pairs: np.ndarray) -> np.ndarray:
    """``(probe, match, distance)`` rows -> one ``(probe, earliest match, its distance)`` per probe."""
    if not len(pairs):
        return np.empty((0, 3), dtype=np.int64)
    order = np.lexsort((pairs[:, 1], pairs[:, 0]))
    ordered = pairs[order]
    first = np.ones(len(ordered), dtype=bool)
    first[1:] = ordered[1:, 0] != ordered[:-1, 0]
    return ordered[first]
