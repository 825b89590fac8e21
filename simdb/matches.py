"""Verified matches: ``(probe id, target id, distance)`` rows as the methods return them.

A pair that shared several keys comes back once per key; :func:`distinct` keeps it once, and
:func:`earliest` keeps each probe's earliest match (the one ``duplicate_of`` points at).
:func:`shared_key_pairs` finds the candidates among sketches held in memory (a chunk's own),
where a self-join in SQL would ship every candidate's two sketches out of the server, and
:func:`key_matches` those between a chunk's probes (:class:`ProbeKeys`) and a small segment's rows
read into memory (:mod:`simdb.pg.in_memory`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator

import numpy as np


def distinct(chunks: Iterable[np.ndarray], columns: int = 3) -> np.ndarray:
    """All rows of a chunked result, each distinct row once, sorted (as ``np.unique(rows, axis=0)`` gives them,
    which sorts the rows as opaque byte strings: 17.6 s for the 6M candidate rows of a chunk holding 1,000 copies
    of one MinHash signature, and 26 ms of a batch of 1,000 lookups at 3M documents). Where the columns' ranges multiply to less than 2**63 (ids of an archive up to
    about 10**7 beside a distance), each row is one int64 code and a plain sort does it; otherwise the rows are
    sorted column by column."""
    parts = list(chunks)
    if not parts:
        return np.empty((0, columns), dtype=np.int64)
    rows = np.concatenate(parts).astype(np.int64, copy=False)
    if len(rows) < 2:
        return rows.copy()
    low, high = rows.min(axis=0), rows.max(axis=0)
    spans = [int(h) - int(l) + 1 for l, h in zip(low.tolist(), high.tolist())]
    if math.prod(spans) < 2**63:
        codes = np.zeros(len(rows), dtype=np.int64)
        for column, span in enumerate(spans):
            codes = codes * span + (rows[:, column] - low[column])
        codes = np.sort(codes)  # not np.unique, whose hashing took 17 s for 6M codes (see _distinct_rows)
        codes = codes[np.r_[True, codes[1:] != codes[:-1]]]
        out = np.empty((len(codes), rows.shape[1]), dtype=np.int64)
        for column in range(rows.shape[1] - 1, -1, -1):
            codes, out[:, column] = np.divmod(codes, spans[column])
            out[:, column] += low[column]
        return out
    rows = rows[np.lexsort(rows.T[::-1])]  # by the first column, then the second, ...
    return rows[np.r_[True, (rows[1:] != rows[:-1]).any(axis=1)]]


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
    at least one key column, each pair once, sorted (all of :func:`shared_key_candidates`, deduplicated)."""
    found = list(shared_key_candidates(keys))
    if not found:
        return np.empty((0, 2), dtype=np.int64)
    return _distinct_rows(np.concatenate(found), len(keys))


#: Candidate pairs per batch of :func:`shared_key_candidates` (about 16 bytes each, and as much again to verify).
CANDIDATE_BATCH = 1 << 20


def shared_key_candidates(keys: np.ndarray, batch: int = CANDIDATE_BATCH) -> Iterator[np.ndarray]:
    """``(later, earlier)`` row numbers of every two rows of ``keys`` that agree on at least one key column,
    in batches of about ``batch`` pairs (a pair sharing several keys comes once per key), for the caller to
    verify one batch at a time: a chunk's candidates all at once took 230 MB more of a 100k-document ingest.

    Rows with the same keys in every column (copies of one text) form a class whose pairs are made once,
    not once per column; the classes' representatives are paired column by column (sort by the key, then
    pair each row of a run of equal keys with each later one), and each pair of classes expands into its
    members' pairs. All of it vectorised: many equal keys cost their pairs, and no Python loop but one
    per batch. A batch holds whole runs of equal keys, so one run of n rows is at least n(n-1)/2 pairs.
    """
    rows = len(keys)
    if rows < 2:
        return
    classes, inverse, sizes = np.unique(keys, axis=0, return_inverse=True, return_counts=True)
    inverse = inverse.reshape(-1)
    members = np.argsort(inverse)  # rows grouped by class
    starts = np.cumsum(sizes) - sizes
    for left, right in _run_position_batches(starts, rows, batch):  # within a class
        yield _later_first(members[left], members[right])
    for column in classes.T:
        order = np.argsort(column)
        ordered = column[order]
        runs = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
        for left, right in _run_position_batches(runs, len(classes), batch):
            a, b = order[left], order[right]  # two classes sharing this key: every member of one with the other's
            counts = sizes[a] * sizes[b]
            for part in _slices(counts, batch):
                a_part, b_part, counts_part = a[part], b[part], counts[part]
                t = np.arange(int(counts_part.sum())) - np.repeat(np.cumsum(counts_part) - counts_part, counts_part)
                width = np.repeat(sizes[b_part], counts_part)
                yield _later_first(members[np.repeat(starts[a_part], counts_part) + t // width],
                                   members[np.repeat(starts[b_part], counts_part) + t % width])


#: The largest hash table :class:`ProbeKeys` builds per key column: 2**22 bucket starts (16 MB as int32).
MAX_TABLE_BITS = 22


class ProbeKeys:
    """One side of a join on key columns, a hash table per column: the probes of a chunk, met with the rows
    of several segments in turn by :func:`key_matches`. A key's bucket is its low bits (SimHash keys are
    block bits, MinHash band keys MD5 bits: uniform either way), about 8 buckets per probe; per column,
    the probe rows in bucket order and where each bucket starts."""

    def __init__(self, keys: np.ndarray, table_bits: int | None = None) -> None:
        keys = np.asarray(keys, dtype=np.int64)
        bits = table_bits or min(MAX_TABLE_BITS, max(8, (8 * len(keys)).bit_length()))
        self.mask = np.int64((1 << bits) - 1)
        self.orders, self.sorted, self.starts = [], [], []
        for column in keys.T:
            buckets = column & self.mask
            order = np.argsort(buckets, kind="stable")
            starts = np.zeros((1 << bits) + 1, dtype=np.int32 if len(keys) < 2**31 else np.int64)
            np.cumsum(np.bincount(buckets, minlength=1 << bits), out=starts[1:])
            self.orders.append(order)
            self.sorted.append(column[order])
            self.starts.append(starts)


def key_matches(probes: ProbeKeys, keys: np.ndarray, batch: int = CANDIDATE_BATCH) -> Iterator[np.ndarray]:
    """``(probe row, row of keys)`` of every probe and row of ``keys`` (one column per key, the probes'
    columns) that agree on a key column, a pair once per column it agrees on, in batches of about
    ``batch`` candidates: each row's bucket read from the probes' table (a gather, so the cost is linear in
    the rows; a binary search among the sorted probes cost 4-9 µs a row at 15 keys), the probes that share
    it kept where their key is the row's."""
    for column, (order, ordered, starts) in enumerate(zip(probes.orders, probes.sorted, probes.starts)):
        values = keys[:, column]
        buckets = values & probes.mask
        first = starts[buckets]
        counts = starts[buckets + 1] - first
        rows = np.flatnonzero(counts)
        for part in _slices(counts[rows], batch):
            part_rows, part_counts = rows[part], counts[rows[part]]
            offsets = np.arange(int(part_counts.sum())) - np.repeat(np.cumsum(part_counts) - part_counts, part_counts)
            at = np.repeat(first[part_rows].astype(np.int64), part_counts) + offsets
            row = np.repeat(part_rows, part_counts)
            same = ordered[at] == values[row]
            if same.any():
                yield np.stack([order[at[same]], row[same]], axis=1).astype(np.int64)


def _later_first(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.stack([np.maximum(a, b), np.minimum(a, b)], axis=1).astype(np.int64)


def _slices(weights: np.ndarray, batch: int) -> list[slice]:
    """Consecutive slices of ``weights`` whose sums are about ``batch`` (one item heavier than that alone)."""
    if not len(weights):
        return []
    before = np.cumsum(weights) - weights
    cuts = np.flatnonzero(np.diff(before // max(batch, 1))) + 1
    edges = [0, *cuts.tolist(), len(weights)]
    return [slice(start, end) for start, end in zip(edges, edges[1:])]


def _run_position_batches(starts: np.ndarray, length: int, batch: int
                          ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """:func:`_run_positions` of the runs of ``range(length)`` starting at ``starts``, a batch of whole runs
    (about ``batch`` pairs) at a time."""
    sizes = np.diff(np.r_[starts, length])
    for part in _slices(sizes * (sizes - 1) // 2, batch):
        first = int(starts[part.start])
        end = int(starts[part.stop]) if part.stop < len(starts) else length
        left, right = _run_positions(starts[part] - first, end - first)
        if len(left):
            yield left + first, right + first


def _run_positions(starts: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray]:
    """Every two positions ``(i, j)``, ``i < j``, of the same run, the runs of ``range(length)`` starting at
    ``starts``."""
    ends = np.repeat(np.r_[starts[1:], length], np.diff(np.r_[starts, length]))
    partners = ends - np.arange(length) - 1  # later positions in each position's run
    left = np.repeat(np.arange(length), partners)
    offsets = np.arange(int(partners.sum())) - np.repeat(np.cumsum(partners) - partners, partners)
    return left, left + 1 + offsets


def _distinct_rows(pairs: np.ndarray, bound: int) -> np.ndarray:
    """The distinct rows of ``(a, b)`` pairs of numbers below ``bound``, sorted (by sorting codes: numpy's
    hashing ``unique`` took 12 s for 12M)."""
    codes = np.sort(pairs[:, 0].astype(np.int64) * bound + pairs[:, 1])
    codes = codes[np.r_[True, codes[1:] != codes[:-1]]] if len(codes) else codes
    return np.stack([codes // bound, codes % bound], axis=1)
