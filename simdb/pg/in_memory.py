"""A chunk's probes against a small segment, joined in memory: the segment read once instead of probed.

An index lookup costs the same in every segment, whatever its size: a B-tree descent per probe and
key column, 1.5M of them for a chunk of 100k documents at 15 keys. At 10M documents under the
recommended settings, a chunk of 100k spent 3.2 s probing the 10M segment and 4.5 s probing three
segments of 100k-1M documents that the ingests before it had left (1.1-1.9 s each, a hash join no
cheaper): 13-32 µs of wall time per probe, with two connections sharing the lookups. Read into memory
(below), a row costs about 1.3 µs at 15 SimHash keys (read 0.34, keys 0.5, join 0.4), so a segment of at
most :data:`ROWS_PER_PROBE` documents per probe costs less read whole:

* its rows leave the server as one ``bytea`` per slice of ids, ``string_agg`` of ``int8send``
  (0.34 µs a row for an id and a fingerprint; a binary COPY spends about 1.4 µs a row on psycopg's
  per-row messages): ids and sketches where the method computes the keys from a stored sketch
  (:attr:`~simdb.pg.methods.MethodSQL.keys_from_stored`, SimHash), ids and key columns otherwise;
* each row's keys are looked up in hash tables of the probes' keys, built once per chunk
  (:class:`simdb.matches.ProbeKeys`, :func:`simdb.matches.key_matches`: numpy gathers);
* the candidates are verified by the method (:meth:`~simdb.methods.base.Method.pair_distances`), as
  every join's are; a method whose sketches were not read gets those of its candidates by id.

Only under the ingest lock, inside the chunk's transaction, where the segments do not change between
statements: the result is the segment's candidate join, pair for pair.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import sqlalchemy as sa

from ..matches import ProbeKeys, key_matches
from ..methods import Method
from .methods import sql_of
from .spread import can_share, on_shared_snapshot

#: A segment holding at most this many documents per probe is read into memory rather than probed: about
#: where the two cost the same for the cheapest probes measured (13 µs of wall time, 10 rows at 1.3 µs).
ROWS_PER_PROBE = 10
#: Ids read per statement at most: a slice of a segment in memory takes at most this many rows (about 140
#: bytes each at 15 SimHash keys, 180 at 21 MinHash bands).
SLICE_IDS = 1 << 18
#: Ids read per statement at least, however few the chunk's probes: a statement's own cost stays small.
MIN_SLICE_IDS = 1 << 14


def slice_ids(probes: int) -> int:
    """Ids read per statement for a chunk of ``probes``: no more than the chunk has probes (within
    :data:`MIN_SLICE_IDS` and :data:`SLICE_IDS`), so that what a slice holds is bounded by the chunk, not by
    the segment: slices of 262,144 ids for chunks of 10k grew an ingest's memory with the archive."""
    return min(SLICE_IDS, max(MIN_SLICE_IDS, probes))


@dataclass(frozen=True)
class MemoryProbes:
    """A chunk's probes as :func:`segment_pairs_in_memory` meets them: ids, stored sketches (an int64 array
    where the method computes keys from them, else a list), keys in a hash table per column."""
    ids: np.ndarray
    stored: np.ndarray | list
    keys: ProbeKeys

    @classmethod
    def of(cls, method: Method, ids: np.ndarray, stored: Sequence, keys: np.ndarray) -> "MemoryProbes":
        by_sketch = sql_of(method).keys_from_stored
        return cls(np.asarray(ids, dtype=np.int64), np.asarray(stored, dtype=np.int64) if by_sketch else list(stored),
                   ProbeKeys(keys))


def worth_reading(documents: int, probes: int) -> bool:
    """Whether a segment of ``documents`` is cheaper read into memory than probed ``probes`` times."""
    return documents <= ROWS_PER_PROBE * probes


def segment_pairs_in_memory(connection: sa.Connection, method: Method, table: str, first_id: int, end_id: int,
                            probes: MemoryProbes, max_distance: int) -> Iterator[np.ndarray]:
    """Verified ``(probe id, document id, distance)`` rows of ``probes`` against the documents of segment
    ``table`` with ids in ``[first_id, end_id)``, a slice of :func:`slice_ids` ids at a time."""
    step = slice_ids(len(probes.ids))
    for start in range(first_id, end_id, step):
        yield from _slice_pairs(connection, method, table, start, min(end_id, start + step), probes, max_distance)


def spread_reads(connection: sa.Connection, method: Method, read: Sequence[tuple[str, int, int]],
                 probes: MemoryProbes, max_distance: int, connections: int) -> list[np.ndarray]:
    """:func:`segment_pairs_in_memory` of every ``(table, first id, end id)`` of ``read``, their slices dealt in
    turn to ``connections`` connections that read the caller's snapshot (:func:`~simdb.pg.spread.on_shared_snapshot`),
    each reading and joining its own slices at the same time: a read is the server's work (21 MinHash band keys
    a row: 4.1 s of a 100k chunk's 13.1 s at 1M documents, load 1), on one core per statement. Each connection
    holds one slice at a time, so up to ``connections`` slices are in memory at once (about 17 MB each for 100k
    MinHash probes). Only where the caller's connection can share its snapshot
    (:func:`~simdb.pg.spread.can_share`), else on it alone."""
    step = slice_ids(len(probes.ids))
    slices = [(table, start, min(end, start + step)) for table, first, end in read for start in range(first, end, step)]
    shares = [slices[number::connections] for number in range(max(1, min(connections, len(slices))))] \
        if can_share(connection) else [slices]

    def pairs(share: list[tuple[str, int, int]], on: sa.Connection) -> list[np.ndarray]:
        return [found for table, start, end in share
                for found in _slice_pairs(on, method, table, start, end, probes, max_distance)]

    found = on_shared_snapshot(connection, functools.partial(pairs, shares[0], connection),
                               [(functools.partial(pairs, share), functools.partial(pairs, share, connection))
                                for share in shares[1:]])
    return [part for share in found for part in share]


def _slice_pairs(connection: sa.Connection, method: Method, table: str, start: int, end: int, probes: MemoryProbes,
                 max_distance: int) -> Iterator[np.ndarray]:
    """Verified pairs of ``probes`` against the documents of ``table`` with ids in ``[start, end)``, read at once."""
    ids, sketches, keys = _read(connection, method, table, start, end)
    for candidates in key_matches(probes.keys, keys):
        yield _verified(connection, method, table, probes, ids, sketches, candidates, max_distance)


def _read(connection: sa.Connection, method: Method, table: str, start: int, end: int
          ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """(ids, stored sketches or None, keys) of the segment's documents with ids in ``[start, end)``."""
    sql = sql_of(method)
    columns = ["id", sql.sketch_column[0]] if sql.keys_from_stored else ["id", *method.key_columns]
    data = connection.execute(sa.text(
        f"SELECT string_agg({' || '.join(f'int8send({c})' for c in columns)}, ''::bytea) FROM \"{table}\" "
        "WHERE id >= :start AND id < :end"), {"start": start, "end": end}).scalar()
    rows = np.frombuffer(data or b"", dtype=">i8").reshape(-1, len(columns)).astype(np.int64)
    if sql.keys_from_stored:
        return rows[:, 0], rows[:, 1], method.stored_keys(rows[:, 1])
    return rows[:, 0], None, rows[:, 1:]


def _verified(connection: sa.Connection, method: Method, table: str, probes: MemoryProbes, ids: np.ndarray,
              sketches: np.ndarray | None, candidates: np.ndarray, max_distance: int) -> np.ndarray:
    """The candidate ``(probe row, row)`` pairs within ``max_distance``, as ``(probe id, document id, distance)``."""
    probe_rows, rows = candidates[:, 0], candidates[:, 1]
    probe_set, left = np.unique(probe_rows, return_inverse=True)
    row_set, right = np.unique(rows, return_inverse=True)
    if sketches is not None:
        stored = np.concatenate([probes.stored[probe_set], sketches[row_set]])
    else:  # the candidates' sketches, by id
        wanted = ids[row_set].tolist()
        sketch = sql_of(method).sketch_column[0]
        found = dict(connection.execute(sa.text(f'SELECT id, {sketch} FROM "{table}" WHERE id = ANY(:ids)'),
                                        {"ids": wanted}).all())
        stored = [probes.stored[i] for i in probe_set.tolist()] + [found[i] for i in wanted]
    distances = np.asarray(method.pair_distances(stored, left.reshape(-1), len(probe_set) + right.reshape(-1)),
                           dtype=np.int64)
    keep = distances <= max_distance
    return np.stack([probes.ids[probe_rows[keep]], ids[rows[keep]], distances[keep]], axis=1).astype(np.int64)
