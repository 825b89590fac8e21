"""How a set of probes meets the archive's key indexes: one index lookup per probe and key, in key order.

A candidate join of a chunk (or a batch of queries) against a large segment must look each probe's
key up in the segment's key index: about ``probes x keys`` index descents, a few microseconds each.
PostgreSQL's planner does not always see it so. Its cost model prices those descents as random reads
and, with a stale row estimate for a segment (one that lost documents to a removal, or was just
filled), it preferred a hash join fed by a full scan of a 10M-row segment's key index: 34 s for
100k probes where the lookups take about 4 s. :func:`lateral_probe` leaves it no choice: the probes,
sorted by the key so that neighbouring lookups read the same index pages, drive a ``LATERAL``
subquery that ``OFFSET 0`` keeps from being flattened into a join the planner may reorder.

:func:`simdb.pg.segments.segment_pairs` runs a method's candidate join against each segment on its
own, under the ingest lock (which every writer of segments holds): index lookups into segments wider
than the probe set, the planner's join (a hash join, usually) for smaller ones, unless they are read into
memory (:mod:`simdb.pg.in_memory`). PostgreSQL runs a
statement on one core, so for a large chunk :func:`shared_lookups` gives half of the key columns'
lookups to a second connection, which runs them at the same time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import psycopg
import sqlalchemy as sa

from .copy import copy_in

if TYPE_CHECKING:
    from .methods.base import MethodSQL

#: How long the second connection of :func:`shared_lookups` waits for a lock.
LOCK_WAIT = "2s"


def lateral_probe(probe: str, target: str, column: str, probe_columns: Sequence[str],
                  target_columns: Sequence[str], conditions: Sequence[str]) -> str:
    """``p`` (``probe_columns`` of ``probe``'s rows, in ``column`` order) each looking up ``t`` (``target_columns``
    of the rows of ``target`` meeting ``conditions``, SQL over ``p`` and ``t`` whose first is the key
    equality), through the index on ``column``."""
    selected = ", ".join(f"t.{name}" for name in target_columns)
    return (f"(SELECT {', '.join(probe_columns)} FROM {probe} p0 ORDER BY {column}) p CROSS JOIN LATERAL "
            f"(SELECT {selected} FROM {target} t WHERE {' AND '.join(conditions)} OFFSET 0) t")


# -- sharing a chunk's lookups with a second connection ------------------------------------------------

#: Probes from which a chunk shares its lookups into large segments with a second connection: below it the
#: second connection's copy of the probes costs more than the lookups it takes over.
SHARED_PROBES = 20_000


@dataclass(frozen=True)
class Lookup:
    """One statement of a chunk's candidate join: ``columns`` (None: every key column) of ``target``."""
    target: str
    index_probes: bool
    columns: tuple[str, ...] | None = None


def split(lookups: Sequence[Lookup], key_columns: Sequence[str]) -> tuple[list[Lookup], list[Lookup]]:
    """The lookups by index probes, each cut in two halves of the key columns, the second halves apart:
    (this connection's, the second connection's). A join the planner chooses stays whole and here."""
    mine, theirs = [], []
    half = (len(key_columns) + 1) // 2
    for lookup in lookups:
        if lookup.index_probes and len(key_columns) > 1:
            mine.append(Lookup(lookup.target, True, tuple(key_columns[:half])))
            theirs.append(Lookup(lookup.target, True, tuple(key_columns[half:])))
        else:
            mine.append(lookup)
    return mine, theirs


def shared_lookups(connection: sa.Connection, method: MethodSQL, probe: str, lookups: Sequence[Lookup],
                   max_distance: int, probe_rows: Callable[[], Iterable[tuple]]) -> list[np.ndarray]:
    """Verified pairs of ``lookups`` of ``probe``'s rows, half of the index lookups run on a second
    connection of the same engine at the same time (PostgreSQL runs one statement on one core).

    The second connection gets its own copy of the probes (``probe_rows()``: id, sketch, key columns, as
    ``method`` stores them), since a temporary table is private to its session, and reads only
    committed segments: the caller holds the ingest lock, which every writer of a stored segment holds,
    so the two connections see the same documents. It waits for no lock longer than ``LOCK_WAIT``: a
    statement queued on a segment between the two (``ALTER TABLE documents`` by a relayout) could
    otherwise wait for this transaction while this transaction waits for it, a cycle PostgreSQL
    cannot see; its lookups then run here, as they do when it fails in any way the database reports
    (no connection to be had, for one).
    """
    mine, theirs = split(lookups, method.key_columns)
    found: list[np.ndarray] = []
    failed: list[BaseException] = []

    def run_theirs() -> None:
        try:
            with connection.engine.connect() as other, other.begin():
                other.exec_driver_sql(f"SET LOCAL lock_timeout = '{LOCK_WAIT}'")
                columns = [("id", "int8"), method.sketch_column, *((name, "int8") for name in method.key_columns)]
                copy_in(other, f"shared_probes ({', '.join(name for name, _ in columns)})",
                        [kind for _, kind in columns], probe_rows(), create=True)
                other.exec_driver_sql("ANALYZE shared_probes")
                for lookup in theirs:
                    found.extend(method.candidate_pairs(other, "shared_probes", f'"{lookup.target}"', max_distance,
                                                        index_probes=True, columns=lookup.columns))
        except BaseException as error:  # noqa: BLE001 - raised again in the caller's thread
            failed.append(error)

    helper = threading.Thread(target=run_theirs, name="simdb-shared-lookups", daemon=True)
    helper.start()
    try:
        here = [pairs for lookup in mine for pairs in method.candidate_pairs(
            connection, probe, f'"{lookup.target}"', max_distance, index_probes=lookup.index_probes,
            columns=lookup.columns)]
    finally:
        helper.join()
    if failed:  # a lock it would not wait for, or no connection to be had: this one does it all, as without
        if not isinstance(failed[0], (sa.exc.DBAPIError, psycopg.Error)):  # COPY raises psycopg's own
            raise failed[0]
        found = [pairs for lookup in theirs for pairs in method.candidate_pairs(
            connection, probe, f'"{lookup.target}"', max_distance, index_probes=True, columns=lookup.columns)]
    return here + found
