"""Verified matches: ``(probe id, target id, distance)`` rows as the methods return them.

A pair that shared several keys comes back once per key; :func:`distinct` keeps it once, and
:func:`earliest` keeps each probe's earliest match (the one ``duplicate_of`` points at).
:func:`shared_key_pairs` finds the candidates among sketches held in memory (a chunk's own),
where a self-join in SQL would ship every candidate's two sketches out of the server.
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


def shared_key_pairs(keys: np.ndarray) -> np.ndarray:
    """``(later, earlier)`` row numbers of every two rows of ``keys`` (one column per key) that agree on
    at least one key column, each pair once, sorted.

    Rows with the same keys in every column (copies of one text) form a class whose pairs are made once,
    not once per column; the classes' representatives are paired column by column (sort by the key, then
    pair each row of a run of equal keys with each later one), and each pair of classes expands into its
    members' pairs. All of it vectorised: many equal keys cost their pairs, and no Python loop.
    """
    rows = len(keys)
    if rows < 2:
        return np.empty((0, 2), dtype=np.int64)
    classes, inverse, sizes = np.unique(keys, axis=0, return_inverse=True, return_counts=True)
    inverse = inverse.reshape(-1)
    members = np.argsort(inverse)  # rows grouped by class
    starts = np.cumsum(sizes) - sizes
    parts = [_run_pairs(members, starts, rows)]  # within a class
    between = []
    for column in classes.T:
        order = np.argsort(column)
        ordered = column[order]
        between.append(_run_pairs(order, np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]]), len(classes)))
    pairs = _distinct_rows(np.sort(np.concatenate(between), axis=1), len(classes))
    if len(pairs):
        a, b = pairs[:, 0], pairs[:, 1]
        counts = sizes[a] * sizes[b]
        t = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
        width = np.repeat(sizes[b], counts)
        parts.append(np.stack([members[np.repeat(starts[a], counts) + t // width],
                               members[np.repeat(starts[b], counts) + t % width]], axis=1))
    found = np.concatenate(parts)
    codes = np.sort(np.maximum(found[:, 0], found[:, 1]).astype(np.int64) * rows
                    + np.minimum(found[:, 0], found[:, 1]))  # distinct already: sorting is enough
    return np.stack([codes // rows, codes % rows], axis=1)


def _run_positions(starts: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray]:
    """Every two positions ``(i, j)``, ``i < j``, of the same run, the runs of ``range(length)`` starting at
    ``starts``."""
    ends = np.repeat(np.r_[starts[1:], length], np.diff(np.r_[starts, length]))
    partners = ends - np.arange(length) - 1  # later positions in each position's run
    left = np.repeat(np.arange(length), partners)
    offsets = np.arange(int(partners.sum())) - np.repeat(np.cumsum(partners) - partners, partners)
    return left, left + 1 + offsets


def _run_pairs(members: np.ndarray, starts: np.ndarray, length: int) -> np.ndarray:
    left, right = _run_positions(starts, length)
    return np.stack([members[left], members[right]], axis=1)


def _distinct_rows(pairs: np.ndarray, bound: int) -> np.ndarray:
    """The distinct rows of ``(a, b)`` pairs of numbers below ``bound``, sorted (by sorting codes: numpy's
    hashing ``unique`` took 12 s for 12M)."""
    codes = np.sort(pairs[:, 0].astype(np.int64) * bound + pairs[:, 1])
    codes = codes[np.r_[True, codes[1:] != codes[:-1]]] if len(codes) else codes
    return np.stack([codes // bound, codes % bound], axis=1)
