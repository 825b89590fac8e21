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
statement on one core, so for a large chunk :func:`simdb.pg.spread.spread_lookups` spreads the key
columns' lookups over several connections, which run them at the same time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa


def lateral_probe(probe: str, target: str, column: str, probe_columns: Sequence[str],
                  target_columns: Sequence[str], conditions: Sequence[str]) -> str:
    """``p`` (``probe_columns`` of ``probe``'s rows, in ``column`` order) each looking up ``t`` (``target_columns``
    of the rows of ``target`` meeting ``conditions``, SQL over ``p`` and ``t`` whose first is the key
    equality), through the index on ``column``."""
    selected = ", ".join(f"t.{name}" for name in target_columns)
    return (f"(SELECT {', '.join(probe_columns)} FROM {probe} p0 ORDER BY {column}) p CROSS JOIN LATERAL "
            f"(SELECT {selected} FROM {target} t WHERE {' AND '.join(conditions)} OFFSET 0) t")


# -- what a chunk's candidate join is made of ---------------------------------------------------------------

#: Probes from which a chunk spreads its lookups into large segments over other connections
#: (:mod:`simdb.pg.spread`): below it a helper's copy of the probes costs more than the lookups it takes over.
SHARED_PROBES = 20_000


@dataclass(frozen=True)
class Lookup:
    """One statement of a chunk's candidate join: ``columns`` (None: every key column) of ``target``."""
    target: str
    index_probes: bool
    columns: tuple[str, ...] | None = None


def without_jit(connection: sa.Connection) -> None:
    """No JIT compilation for the rest of ``connection``'s transaction (and its helpers', which take its
    setting, :func:`simdb.pg.spread.on_shared_snapshot`). The index probes into a large segment are priced far
    above ``jit_above_cost`` and ``jit_inline_above_cost``: compiling a batch's candidate join took 70-150 ms of
    a 1,000-query batch at 10M documents (``EXPLAIN ANALYZE``), more than the whole batch may take at 10,000
    queries a second, and a chunk's external-id check against a 3M segment compiled and inlined for 1.2 s of
    its 2.2 s; probes and joins over a few columns gain nothing from compiled expressions. The cost grew with
    the archive (a small archive's plans stay below the thresholds)."""
    connection.exec_driver_sql("SET LOCAL jit = off")
