"""A chunk's candidate join spread over several connections: every core the server gives, not one.

PostgreSQL runs a statement on one core, and the lookups of a chunk's keys into the archive's large
segments (:func:`simdb.pg.probes.lateral_probe`, about ``probes x keys`` B-tree descents) are most of
a chunk's time at archive scale. :func:`spread_lookups` cuts them by key column into ``connections``
shares: the chunk's own connection runs the first, and each other share runs at the same time on a
connection of its own (a thread each, a connection from the engine's pool), with its own copy of the
probes (a temporary table is private to its session).

What each helper reads is exactly what the chunk's connection reads: the chunk exports its snapshot
(``pg_export_snapshot()``, taken under the ingest lock, so it holds every chunk, removal and merge
committed before this chunk took the lock) and each helper imports it (``SET TRANSACTION SNAPSHOT`` in
a ``REPEATABLE READ`` transaction). Every writer of a stored segment holds the ingest lock, so nothing
the helpers could read changes before the chunk commits; the snapshot makes that exact rather than
argued. The chunk's own uncommitted rows (its staging table, a bulk segment made for it) are not in it,
and the lookups never read them: they read only segments below the chunk's first id. Nor are changes its
transaction made to stored segments before the lookups (a sync run removing the rows it replaces): such a
chunk keeps to its own connection (``connections=1``, :func:`simdb.ingest.ingest`).

A helper waits for no lock longer than :data:`LOCK_WAIT`: a statement queued for an exclusive lock on a
segment (``ALTER TABLE documents`` by a relayout) waits for the chunk's transaction, and the helper's
lookups would queue behind it while the chunk waits for them, a cycle PostgreSQL cannot see. A helper
that fails in a way the database reports (that lock timeout, no connection to be had) leaves its share
to the chunk's connection, which runs it after its own; any other error is raised in the caller.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, TypeVar

import numpy as np
import psycopg
import sqlalchemy as sa

from .copy import copy_in
from .probes import Lookup

if TYPE_CHECKING:
    from .methods.base import MethodSQL

R = TypeVar("R")

#: How long a helper connection waits for a lock before it leaves its share to the chunk's connection.
LOCK_WAIT = "2s"
#: The most connections a chunk's join is spread over by default: the engine's pool holds 15
#: (:data:`simdb.settings.MAX_CONNECTIONS`, the most a caller may ask for), and past 8 the helpers' copies of
#: the probes (each a full COPY of the chunk's ids and sketches) eat the gain.
DEFAULT_CAP = 8
#: A helper's errors that leave its share to the chunk's connection: what the database reports (COPY raises
#: psycopg's own), and no connection free in the engine's pool.
GIVES_WAY = (sa.exc.DBAPIError, psycopg.Error, sa.exc.TimeoutError)


def default_connections(connection: sa.Connection) -> int:
    """How many connections a chunk's candidate join uses when not told: the cores this machine has,
    no more than the server lets parallel queries use (``max_parallel_workers``, the administrator's word
    on how many cores a query may take) plus the statement's own, and at most :data:`DEFAULT_CAP`."""
    workers = connection.exec_driver_sql("SELECT current_setting('max_parallel_workers')::int").scalar_one()
    return max(1, min(os.cpu_count() or 1, workers + 1, DEFAULT_CAP))


def column_runs(key_columns: Sequence[str], connections: int) -> list[tuple[str, ...]]:
    """``key_columns`` cut into ``connections`` contiguous runs (fewer when there are fewer columns)."""
    shares = max(1, min(connections, len(key_columns)))
    bounds = [round(i * len(key_columns) / shares) for i in range(shares + 1)]
    return [tuple(key_columns[start:end]) for start, end in zip(bounds, bounds[1:])]


def split(lookups: Sequence[Lookup], key_columns: Sequence[str], connections: int) -> list[list[Lookup]]:
    """``lookups`` in ``connections`` shares (fewer when there are fewer key columns), the first the chunk's
    connection's: each lookup by index probes cut into contiguous runs of its key columns, one per share; a
    join the planner chooses stays whole, in the first."""
    runs = column_runs(key_columns, connections)
    split_lookups: list[list[Lookup]] = [[] for _ in runs]
    for lookup in lookups:
        if lookup.index_probes and len(runs) > 1:
            for share, run in enumerate(runs):
                split_lookups[share].append(Lookup(lookup.target, True, run))
        else:
            split_lookups[0].append(lookup)
    return split_lookups


def _pairs_of(method: MethodSQL, connection: sa.Connection, probe: str, share: Sequence[Lookup],
              max_distance: int) -> list[np.ndarray]:
    return [pairs for lookup in share for pairs in method.candidate_pairs(
        connection, probe, f'"{lookup.target}"', max_distance, index_probes=lookup.index_probes,
        columns=lookup.columns)]


def can_share(connection: sa.Connection) -> bool:
    """Whether other connections can read exactly what ``connection`` reads: it is in a transaction (whose
    snapshot outlives the export) and not inside a savepoint (PostgreSQL exports no snapshot from there)."""
    return connection.in_transaction() and not connection.in_nested_transaction()


def on_shared_snapshot(connection: sa.Connection, here: Callable[[], R],
                       elsewhere: Sequence[tuple[Callable[[sa.Connection], R], Callable[[], R]]]) -> list[R]:
    """``[here(), *(each of elsewhere)]``: ``here`` on ``connection``; each ``(helper, instead)`` of ``elsewhere``
    at the same time, ``helper`` given a connection of its own from the engine's pool that reads
    ``connection``'s snapshot, with its ``jit`` setting (a thread each), or ``instead()`` on ``connection`` after ``here`` where the helper
    failed in a way the database reports (:data:`GIVES_WAY`); any other error of a helper is raised here.
    The caller checked :func:`can_share`."""
    if not elsewhere:
        return [here()]
    snapshot, jit = connection.exec_driver_sql("SELECT pg_export_snapshot(), current_setting('jit')").one()
    found: list = [None] * len(elsewhere)
    failed: list[BaseException | None] = [None] * len(elsewhere)

    def run(number: int) -> None:
        try:
            with connection.engine.connect() as other:
                other = other.execution_options(isolation_level="REPEATABLE READ")
                with other.begin():
                    other.exec_driver_sql(f"SET TRANSACTION SNAPSHOT '{snapshot}'")  # first: the caller's view
                    other.exec_driver_sql(f"SET LOCAL lock_timeout = '{LOCK_WAIT}'")
                    other.exec_driver_sql("SELECT set_config('jit', %(jit)s, true)", {"jit": jit})  # as the caller
                    found[number] = (elsewhere[number][0](other),)
        except BaseException as error:  # noqa: BLE001 - raised again (or its share redone) in the caller's thread
            failed[number] = error

    helpers = [threading.Thread(target=run, args=(number,), name=f"simdb-spread-{number + 1}", daemon=True)
               for number in range(len(elsewhere))]
    for helper in helpers:
        helper.start()
    try:
        results = [here()]
    finally:
        for helper in helpers:
            helper.join()
    for error in failed:
        if error is not None and not isinstance(error, GIVES_WAY):
            raise error
    for (_, instead), result in zip(elsewhere, found):
        # a lock it would not wait for, or no connection: the caller's connection runs its share
        results.append(result[0] if result is not None else instead())
    return results


def spread_lookups(connection: sa.Connection, method: MethodSQL, probe: str, lookups: Sequence[Lookup],
                   max_distance: int, probe_rows: Callable[[], Iterable[tuple]], connections: int
                   ) -> list[np.ndarray]:
    """Verified pairs of ``lookups`` of ``probe``'s rows (``probe_rows()``: the same rows, id, sketch and key
    columns as ``method`` stores them, for the helpers' copies), the index lookups spread over
    ``connections`` connections of the caller's engine, all reading the caller's snapshot. The caller holds
    the ingest lock. A pair may come more than once (from two key columns), as from one connection."""
    shares = split(lookups, method.key_columns, connections if can_share(connection) else 1)
    columns = [("id", "int8"), method.sketch_column, *((name, "int8") for name in method.key_columns)]

    def helper(number: int) -> Callable[[sa.Connection], list[np.ndarray]]:
        share = shares[number]
        wanted = {column for lookup in share for column in lookup.columns or method.key_columns}
        kept = [at for at, (name, _) in enumerate(columns) if at < 2 or name in wanted]  # id, sketch, its keys
        table = f"spread_probes_{number}"

        def run(other: sa.Connection) -> list[np.ndarray]:
            copy_in(other, f"{table} ({', '.join(columns[at][0] for at in kept)})", [columns[at][1] for at in kept],
                    (tuple(row[at] for at in kept) for row in probe_rows()), create=True)
            other.exec_driver_sql(f"ANALYZE {table}")
            return _pairs_of(method, other, table, share, max_distance)
        return run

    found = on_shared_snapshot(
        connection, lambda: _pairs_of(method, connection, probe, shares[0], max_distance),
        [(helper(number), functools.partial(_pairs_of, method, connection, probe, shares[number], max_distance))
         for number in range(1, len(shares))])
    return [pairs for share in found for pairs in share]
