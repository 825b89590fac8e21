"""A chunk's probes into one large segment: the ways of asking PostgreSQL for its candidates, side by side.

An archive of ``--archive`` random SimHash fingerprints (k = 4, fifteen 20-22-bit key columns) is bulk
loaded as one sealed segment the way a merge or a restore builds one (binary COPY FREEZE, simdb's own
covering key indexes ``(key) INCLUDE (simhash, id)`` built after the load, VACUUM ANALYZE: the visibility
map is set). A chunk of ``--chunk`` new fingerprints (5 % near copies of stored ones at 1-5 bits, 1 %
repeats of other probes, so that keys repeat) is staged as an ingest stages it, and its candidates in
the segment are found by:

* **today**: the statement the library runs (:func:`simdb.pg.methods.simhash.candidate_sql` with
  ``index_probes``: a ``LATERAL ... OFFSET 0`` nested loop per key column over the probes in key order,
  ``UNION ALL`` of the fifteen, the distance checked in SQL, a binary COPY out), on one connection and as
  ingest runs it for a large chunk (half of the key columns on a second connection);
* **= ANY, per column**: one statement per key column, ``WHERE key = ANY($1)`` with the chunk's distinct
  keys sorted as an array (index-only scans), the rows (id, fingerprint) matched back to the probes in
  numpy and verified by popcount;
* **= ANY, one statement**: the fifteen of those in one ``UNION ALL`` statement, its rows matched back
  as :mod:`simdb.pg.in_memory` matches a segment read whole (hash tables of the probes' keys);
* **JOIN unnest**: the probes as arrays (key, fingerprint, id) joined to each key column, the distance
  checked in SQL, the planner's choice of join;
* on one key column: the planner's join against the staging table and each join forced (hash, merge,
  nested loop); heap visits against index-only scans (a copy of the column's rows without the visibility
  map, then vacuumed, and a plain index on the key alone); prepared against unprepared statements.

Every way's verified pairs must be the same set, and equal, for a sample of the probes (every planted
near copy and ``--oracle`` random others), to a numpy brute force over the whole segment (popcount of
xor <= k). Reported: the median of ``--repeat`` runs (after one warm-up), ms per chunk and µs per probe
(a probe is one probe's lookup in one key column).

With ``--staging ROWS``, also the per-row work beside the probes (issue 36): a binary COPY of ``{}``
metadata (psycopg dumps it to JSON) against NULL, and an ``INSERT ... SELECT`` into a table shaped like
``records`` with and without its foreign key to a batches table.

Run::

    .venv/bin/python scripts/bench_probes.py --archive 1000000 3000000 --chunk 50000
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import psycopg
import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import DATABASE_HELP, Server, bulk_load, command_line, load_average, log, machine  # noqa: E402

import simdb  # noqa: E402
from simdb.bits import hamming_array, to_signed_array, to_unsigned_array  # noqa: E402
from simdb.matches import ProbeKeys, key_matches  # noqa: E402
from simdb.methods.simhash.blocks import BlockLayout  # noqa: E402
from simdb.pg.methods.simhash import candidate_sql, verified_pairs  # noqa: E402
from simdb.pg import probes as probes_module  # noqa: E402
from simdb.pg.copy import copy_in  # noqa: E402
from simdb.pg.database import postgres_url  # noqa: E402
from simdb.pg.in_memory import MemoryProbes, segment_pairs_in_memory  # noqa: E402
from simdb.pg.segments import segment_name  # noqa: E402
from simdb.pg.spread import spread_lookups  # noqa: E402

MAX_DISTANCE = 4
SCHEMA = "simdb_bench_probes"
NEAR, REPEATS = 0.05, 0.01


def chunk_of(rng: np.random.Generator, count: int, stored: np.ndarray) -> np.ndarray:
    """``count`` new fingerprints: 5 % near copies of stored ones (1-5 bits flipped), 1 % repeats."""
    fps = np.frombuffer(rng.bytes(8 * count), dtype=np.uint64).copy()
    near, repeats = int(count * NEAR), int(count * REPEATS)
    for i in range(near):
        bits = rng.choice(64, int(rng.integers(1, MAX_DISTANCE + 2)), replace=False)
        fps[i] = stored[rng.integers(0, len(stored))] ^ np.uint64(sum(1 << int(b) for b in bits))
    if count > near + repeats:
        fps[near:near + repeats] = fps[rng.integers(0, count, repeats)]
    return fps


def brute_force(stored: np.ndarray, fps: np.ndarray, ids: np.ndarray, sample: np.ndarray) -> set:
    """(probe id, document id) within MAX_DISTANCE for the ``sample`` rows of ``fps``, by popcount over all."""
    found = set()
    for row in sample.tolist():
        hits = np.flatnonzero(hamming_array(stored, int(fps[row])) <= MAX_DISTANCE)
        found.update((int(ids[row]), int(hit) + 1) for hit in hits)  # stored ids are 1..n
    return found


def pair_set(arrays) -> set:
    rows = np.concatenate([np.asarray(a).reshape(-1, 3)[:, :2] for a in arrays] or [np.empty((0, 2), np.int64)])
    return set(map(tuple, np.unique(rows, axis=0).tolist()))


class Chunk:
    def __init__(self, layout: BlockLayout, ids: np.ndarray, fps: np.ndarray) -> None:
        self.layout, self.ids, self.fps = layout, ids, fps
        self.stored = to_signed_array(fps)
        self.keys = layout.block_keys_array(fps)

    def rows(self):
        return zip(self.ids.tolist(), self.stored.tolist(), *self.keys.T.tolist())


def fetch_bytes(cursor, sql: str, params, prepare: bool | None = None) -> np.ndarray:
    cursor.execute(sql, params, prepare=prepare)
    data = cursor.fetchone()[0]
    return np.frombuffer(data or b"", dtype=">i8").astype(np.int64)


def verify(chunk: Chunk, probe_rows: np.ndarray, ids: np.ndarray, fps: np.ndarray) -> np.ndarray:
    distances = hamming_array(chunk.fps[probe_rows], to_unsigned_array(fps))
    keep = distances <= MAX_DISTANCE
    return np.stack([chunk.ids[probe_rows[keep]], ids[keep], distances[keep].astype(np.int64)], axis=1)


def any_per_column(cursor, chunk: Chunk, target: str, columns: list[int], forced: bool = False,
                   generic: bool = False) -> tuple[list, int]:
    """One ``= ANY(sorted distinct keys)`` statement per key column; rows matched back by binary search."""
    index_only(cursor, forced)
    cursor.execute(f"SET LOCAL plan_cache_mode = {'force_generic_plan' if generic else 'auto'}")
    found, shipped = [], 0
    for i in columns:
        column = chunk.keys[:, i]
        order = np.argsort(column, kind="stable")
        ordered = column[order]
        rows = fetch_bytes(cursor, f"SELECT string_agg(int8send(key_{i}) || int8send(id) || int8send(simhash), "
                                   f"''::bytea) FROM {target} WHERE key_{i} = ANY(%s::bigint[])",
                           (np.unique(column).tolist(),), prepare=generic or None).reshape(-1, 3)
        shipped += len(rows)
        first, last = np.searchsorted(ordered, rows[:, 0], "left"), np.searchsorted(ordered, rows[:, 0], "right")
        counts = last - first
        at = np.repeat(first, counts) + np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
        row = np.repeat(np.arange(len(rows)), counts)
        found.append(verify(chunk, order[at], rows[row, 1], rows[row, 2]))
    return found, shipped


def index_only(cursor, on: bool) -> None:
    """Leave the planner only index scans (``= ANY`` over a large array is priced as a scan of the table)."""
    for setting in ("seqscan", "bitmapscan"):
        cursor.execute(f"SET LOCAL enable_{setting} = off" if on else f"RESET enable_{setting}")


def any_one_statement(cursor, chunk: Chunk, target: str, columns: list[int],
                      prepare: bool | None = None, forced: bool = False, generic: bool = False) -> tuple[list, int]:
    """The ``= ANY`` lookups of every key column in one ``UNION ALL`` statement; the rows (deduplicated by
    id) joined to the probes' keys in hash tables, as :mod:`simdb.pg.in_memory` does. ``generic``: planned
    once for any array (a custom plan estimates every element of a 50k array against the statistics)."""
    index_only(cursor, forced)
    cursor.execute(f"SET LOCAL plan_cache_mode = {'force_generic_plan' if generic else 'auto'}")
    selects = " UNION ALL ".join(f"SELECT id, simhash FROM {target} WHERE key_{i} = ANY(%s::bigint[])"
                                 for i in columns)
    rows = fetch_bytes(cursor, f"SELECT string_agg(int8send(id) || int8send(simhash), ''::bytea) FROM ({selects}) r",
                       [np.unique(chunk.keys[:, i]).tolist() for i in columns], prepare).reshape(-1, 2)
    shipped = len(rows)
    ids, first = np.unique(rows[:, 0], return_index=True)
    fps = rows[first, 1]
    probe_keys = ProbeKeys(chunk.keys[:, columns])
    found = [verify(chunk, pairs[:, 0], ids[pairs[:, 1]], fps[pairs[:, 1]])
             for pairs in key_matches(probe_keys, chunk.layout.block_keys_array(to_unsigned_array(fps))[:, columns])]
    return found, shipped


def join_unnest(cursor, chunk: Chunk, target: str, columns: list[int]) -> tuple[list, int]:
    """The probes as arrays joined to each key column, the distance in SQL; the planner's join."""
    selects = " UNION ALL ".join(
        f"SELECT p.id, t.id, bit_count((p.simhash # t.simhash)::bit(64)) FROM unnest(%s::bigint[], %s::bigint[], "
        f"%s::bigint[]) p(key, simhash, id) JOIN {target} t ON t.key_{i} = p.key "
        f"WHERE bit_count((p.simhash # t.simhash)::bit(64)) <= {MAX_DISTANCE}" for i in columns)
    params = []
    for i in columns:
        order = np.argsort(chunk.keys[:, i], kind="stable")
        params += [chunk.keys[order, i].tolist(), chunk.stored[order].tolist(), chunk.ids[order].tolist()]
    cursor.execute(selects, params)
    rows = np.asarray(cursor.fetchall(), dtype=np.int64).reshape(-1, 3)
    return [rows], len(rows)


def today(connection: sa.Connection, chunk: Chunk, target: str, columns: list[int],
          index_probes: bool = True) -> tuple[list, int]:
    sql = candidate_sql(chunk.layout, "staging", target, MAX_DISTANCE, index_probes=index_probes,
                        columns=[f"key_{i}" for i in columns])
    found = list(verified_pairs(connection, sql, MAX_DISTANCE))
    return found, sum(len(f) for f in found)


class Method:
    """What :func:`simdb.pg.spread.spread_lookups` asks of a method, for the bench's own segment table."""

    def __init__(self, layout: BlockLayout) -> None:
        self.layout, self.key_columns, self.sketch_column = layout, layout.key_columns, ("simhash", "int8")

    def candidate_pairs(self, connection, probe, target, max_distance, *, index_probes=False, columns=None):
        return verified_pairs(connection, candidate_sql(self.layout, probe, target, max_distance,
                                                        index_probes=index_probes, columns=columns), max_distance)


def explain(cursor, sql: str, params=None) -> dict:
    """Planning and execution ms, heap fetches and shared buffers of ``sql`` (EXPLAIN ANALYZE, BUFFERS)."""
    cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS, TIMING OFF) {sql}", params)
    text = "\n".join(row[0] for row in cursor.fetchall())
    buffers = re.search(r"Buffers: shared( hit=(\d+))?( read=(\d+))?", text)
    joins = sorted(set(re.findall(r"(Hash Join|Merge Join|Nested Loop|Index Only Scan|Index Scan|Bitmap Heap Scan"
                                  r"|Seq Scan|Memoize)", text)))
    return {"planning": float(re.search(r"Planning Time: ([\d.]+)", text).group(1)),
            "execution": float(re.search(r"Execution Time: ([\d.]+)", text).group(1)),
            "heap": sum(int(n) for n in re.findall(r"Heap Fetches: (\d+)", text)),
            "hit": int(buffers.group(2) or 0) if buffers else 0, "read": int(buffers.group(4) or 0) if buffers else 0,
            "nodes": ", ".join(joins)}


def timed(runs: list[tuple[str, Callable[[], tuple[list, int]]]], repeat: int,
          reset: Callable[[], None]) -> dict[str, tuple[float, set, int]]:
    """Each run's median seconds, pairs and rows shipped: one warm-up each, then ``repeat`` rounds that run
    every one in turn (the load of a shared machine drifts over minutes: a round meets the same load)."""
    times: dict[str, list[float]] = {name: [] for name, _ in runs}
    found: dict[str, tuple[set, int]] = {}
    for round_number in range(repeat + 1):
        for name, run in runs:
            reset()
            started = time.perf_counter()
            pairs, shipped = run()
            if round_number:
                times[name].append(time.perf_counter() - started)
            found[name] = (pair_set(pairs), shipped)
    return {name: (statistics.median(times[name]), *found[name]) for name, _ in runs}


def measure(server: Server, size: int, chunk_size: int, repeat: int, oracle: int, seed: int) -> list[tuple]:
    rng = np.random.default_rng(seed)
    layout = BlockLayout(max_distance=MAX_DISTANCE, blocks=6)
    server.drop_schemas(SCHEMA)
    stored, timings = bulk_load(server.url, server.admin, SCHEMA, layout, size, rng, MAX_DISTANCE)
    with server.admin.connect() as c:
        c.exec_driver_sql(f"VACUUM ANALYZE {SCHEMA}.{segment_name(1)}")
    target = f'{SCHEMA}."{segment_name(1)}"'
    fps = chunk_of(rng, chunk_size, stored)
    chunk = Chunk(layout, np.arange(size + 1, size + 1 + chunk_size, dtype=np.int64), fps)
    sample = np.unique(np.concatenate([np.arange(int(chunk_size * NEAR)),
                                       rng.integers(0, chunk_size, oracle)]))
    started = time.perf_counter()
    oracle_pairs = brute_force(stored, fps, chunk.ids, sample)
    log(f"  brute force over {size:,} for {len(sample):,} probes: {len(oracle_pairs):,} pairs, "
        f"{time.perf_counter() - started:.1f} s")
    sampled = set(chunk.ids[sample].tolist())
    all_columns = list(range(len(layout.keys)))
    results, sets = [], {}
    engine = sa.create_engine(postgres_url(server.url), connect_args={"options": f"-csearch_path={SCHEMA}"})
    try:
        with engine.connect() as connection, connection.begin():
            connection.exec_driver_sql(f"SET search_path TO {SCHEMA}")
            columns = [("id", "int8"), ("simhash", "int8"), *((name, "int8") for name in layout.key_columns)]
            copy_in(connection, f"staging ({', '.join(n for n, _ in columns)})", [t for _, t in columns],
                    chunk.rows(), create=True)
            connection.exec_driver_sql("ANALYZE staging")
            cursor = connection.connection.dbapi_connection.cursor()

            pending: list[tuple[str, list[int], Callable[[], tuple[list, int]]]] = []

            def add(name: str, cols: list[int], run: Callable[[], tuple[list, int]]) -> None:
                pending.append((name, cols, run))

            def reset() -> None:
                index_only(cursor, False)
                cursor.execute("RESET plan_cache_mode")

            def flush() -> dict[str, float]:
                """Run the pending ways, interleaved; their rows go to the table."""
                measured = timed([(name, run) for name, _, run in pending], repeat, reset)
                for name, cols, _ in pending:
                    seconds, found, shipped = measured[name]
                    sets[name] = (cols == all_columns, found)
                    results.append((size, name, len(cols), seconds * 1000, seconds * 1e6 / (chunk_size * len(cols)),
                                    shipped))
                    log(f"  {name}: {seconds * 1000:,.0f} ms, {shipped:,} rows")
                pending.clear()
                return {name: measured[0] for name, measured in measured.items()}

            add("(a) today: LATERAL per column, UNION ALL, 1 connection", all_columns,
                       lambda: today(connection, chunk, target, all_columns))
            lookups = [probes_module.Lookup(segment_name(1), True)]
            add("(a) today as ingest runs it: 2 connections", all_columns,
                lambda: (spread_lookups(connection, Method(layout), "staging", lookups, MAX_DISTANCE,
                                        chunk.rows, 2), 0))
            add("(b) = ANY(sorted keys), one statement per column", all_columns,
                lambda: any_per_column(cursor, chunk, target, all_columns))
            add("(c) = ANY, all columns in one UNION ALL statement", all_columns,
                lambda: any_one_statement(cursor, chunk, target, all_columns))
            add("(b) same, index scans forced", all_columns,
                lambda: any_per_column(cursor, chunk, target, all_columns, forced=True))
            add("(c) same, index scans forced", all_columns,
                lambda: any_one_statement(cursor, chunk, target, all_columns, forced=True))
            add("(c) same, forced and prepared (psycopg prepare=True)", all_columns,
                lambda: any_one_statement(cursor, chunk, target, all_columns, prepare=True, forced=True))
            add("(b) = ANY per column, prepared, generic plan", all_columns,
                lambda: any_per_column(cursor, chunk, target, all_columns, generic=True))
            add("(c) = ANY one statement, prepared, generic plan", all_columns,
                lambda: any_one_statement(cursor, chunk, target, all_columns, prepare=True, generic=True))
            add("(c) = ANY one statement, prepared, generic plan, index scans forced", all_columns,
                lambda: any_one_statement(cursor, chunk, target, all_columns, prepare=True, generic=True,
                                          forced=True))
            index = simdb.Index.open(server.url, schema=SCHEMA)
            method = index.settings.method
            index.close()
            memory = MemoryProbes.of(method, chunk.ids, chunk.stored, chunk.keys)
            add("(g) the segment read whole into memory (simdb.pg.in_memory)", all_columns,
                lambda: (list(segment_pairs_in_memory(connection, method, segment_name(1), 1, size + 1, memory,
                                                      MAX_DISTANCE)), size))
            base = flush()["(a) today: LATERAL per column, UNION ALL, 1 connection"]
            for name, (_, found) in sets.items():
                got = {pair for pair in found if pair[0] in sampled}
                assert got == oracle_pairs, f"{name}: {len(got ^ oracle_pairs)} pairs differ from the brute force"
            reference = sets["(a) today: LATERAL per column, UNION ALL, 1 connection"][1]
            for name, (_, found) in sets.items():
                assert found == reference, f"{name}: {len(found ^ reference)} pairs differ from today's"
            chunk_pairs = len(reference)

            one = [0]
            sets.clear()
            add("(a) today, key_0 only", one, lambda: today(connection, chunk, target, one))
            add("(b) = ANY, key_0 only", one, lambda: any_per_column(cursor, chunk, target, one))
            add("(b) = ANY, key_0 only, index scans forced", one,
                lambda: any_per_column(cursor, chunk, target, one, forced=True))
            add("(f) JOIN unnest(probe arrays), distance in SQL, key_0 only", one,
                lambda: join_unnest(cursor, chunk, target, one))
            for plan, off in (("planner's choice", ()), ("hash join", ("mergejoin", "nestloop")),
                              ("merge join", ("hashjoin", "nestloop")), ("nested loop", ("hashjoin", "mergejoin"))):
                def run(off=off):
                    for setting in ("hashjoin", "mergejoin", "nestloop"):
                        connection.exec_driver_sql(f"SET LOCAL enable_{setting} = {'off' if setting in off else 'on'}")
                    try:
                        return today(connection, chunk, target, one, index_probes=False)
                    finally:
                        connection.exec_driver_sql("RESET enable_hashjoin; RESET enable_mergejoin; "
                                                   "RESET enable_nestloop")
                add(f"(f) JOIN staging, {plan}, key_0 only", one, run)
            flush()
            reference = sets["(a) today, key_0 only"][1]
            for name, (_, found) in sets.items():
                assert found == reference, f"{name}: {len(found ^ reference)} pairs differ from today's on key_0"

            # EXPLAIN of the contenders over all columns
            keys_params = [np.unique(chunk.keys[:, i]).tolist() for i in all_columns]
            union = " UNION ALL ".join(f"SELECT id, simhash FROM {target} WHERE key_{i} = ANY(%s::bigint[])"
                                       for i in all_columns)
            plans = [("(a) today", explain(cursor, candidate_sql(layout, "staging", target, MAX_DISTANCE,
                                                                 index_probes=True))),
                     ("(c) = ANY one statement", explain(cursor, f"SELECT count(*) FROM ({union}) r", keys_params))]
            cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
            cursor.execute("PREPARE probe_all AS SELECT count(*) FROM (" + " UNION ALL ".join(
                f"SELECT id, simhash FROM {target} WHERE key_{i} = ANY(${i + 1}::bigint[])" for i in all_columns)
                + ") r")
            plans.append(("(c) = ANY one statement, generic plan", explain(  # parameters of EXECUTE: bound here
                psycopg.ClientCursor(cursor.connection), "EXECUTE probe_all (" + ", ".join(["%s"] * len(all_columns)) + ")", keys_params)))
            cursor.execute("DEALLOCATE probe_all")
            cursor.execute("RESET plan_cache_mode")
            index_only(cursor, True)
            plans.append(("(c) = ANY one statement, index scans forced",
                          explain(cursor, f"SELECT count(*) FROM ({union}) r", keys_params)))
            index_only(cursor, False)
            for plan, off in (("hash", "mergejoin, nestloop"), ("merge", "hashjoin, nestloop"),
                              ("nested loop", "hashjoin, mergejoin"), ("planner", "")):
                for setting in off.split(", ") if off else ():
                    connection.exec_driver_sql(f"SET LOCAL enable_{setting} = off")
                plans.append((f"(f) JOIN staging, {plan}, key_0", explain(cursor, candidate_sql(
                    layout, "staging", target, MAX_DISTANCE, columns=["key_0"]))))
                connection.exec_driver_sql("RESET enable_hashjoin; RESET enable_mergejoin; RESET enable_nestloop")

        # (d) heap visits: key_0's rows copied into a table without its visibility map, then vacuumed
        with engine.connect() as connection:
            connection.exec_driver_sql(f"SET search_path TO {SCHEMA}")
            connection.exec_driver_sql("CREATE TABLE heap_copy WITH (autovacuum_enabled = false) AS "
                                       f"SELECT id, simhash, key_0 FROM {target}")
            connection.exec_driver_sql("CREATE INDEX heap_copy_key_0 ON heap_copy (key_0) INCLUDE (simhash, id)")
            connection.exec_driver_sql("ANALYZE heap_copy")
            connection.commit()
            cursor = connection.connection.dbapi_connection.cursor()
            sets.clear()

            def heap_case(name: str) -> None:
                add(f"(d) = ANY, key_0, {name}", one, lambda: any_per_column(cursor, chunk, "heap_copy", one, forced=True))
                flush()
                index_only(cursor, True)
                plans.append((f"(d) = ANY, key_0, {name}", explain(
                    cursor, "SELECT max(id), max(simhash) FROM heap_copy WHERE key_0 = ANY(%s::bigint[])",
                    keys_params[:1])))

            heap_case("covering index, visibility map unset")
            connection.commit()
        with server.admin.connect() as c:
            c.exec_driver_sql(f"VACUUM ANALYZE {SCHEMA}.heap_copy")
        with engine.connect() as connection, connection.begin():
            connection.exec_driver_sql(f"SET search_path TO {SCHEMA}")
            cursor = connection.connection.dbapi_connection.cursor()
            heap_case("covering index, vacuumed")
            connection.exec_driver_sql("DROP INDEX heap_copy_key_0")
            connection.exec_driver_sql("CREATE INDEX ON heap_copy (key_0)")
            heap_case("plain index (key_0): heap visits")
            for name, (_, found) in sets.items():
                assert found == reference, f"{name}: {len(found ^ reference)} pairs differ from today's on key_0"
            connection.exec_driver_sql("DROP TABLE heap_copy")
    finally:
        engine.dispose()
        server.drop_schemas(SCHEMA)
    log(f"  {size:,}: all ways give the same {chunk_pairs:,} pairs; the brute force agrees on "
        f"{len(sample):,} probes ({len(oracle_pairs):,} pairs)")
    return [(*row, base) for row in results], plans, timings


def staging_costs(server: Server, rows: int, repeat: int) -> list[tuple[str, float]]:
    """Seconds per 100k rows of the per-row work a chunk's staging and records did (issue 36): psycopg's
    JSON dumping of ``{}`` against NULL in a binary COPY, and an ``INSERT ... SELECT`` into a table shaped
    like ``records`` with and without its foreign key to a batches table (checked row by row)."""
    schema = f"{SCHEMA}_staging"
    server.drop_schemas(schema)
    found: dict[str, list[float]] = {}
    with server.admin.connect() as c:
        cursor = c.connection.dbapi_connection.cursor()
        cursor.execute(f"CREATE SCHEMA {schema}; SET search_path TO {schema}; "
                       "CREATE TABLE staged (id int8, metadata jsonb); "
                       "CREATE TABLE batches (id serial PRIMARY KEY); INSERT INTO batches DEFAULT VALUES; "
                       "CREATE TABLE keyed (batch_id int4 REFERENCES batches (id) ON DELETE CASCADE, position int8, "
                       "PRIMARY KEY (batch_id, position)); "
                       "CREATE TABLE unkeyed (batch_id int4, position int8, PRIMARY KEY (batch_id, position)); "
                       f"CREATE TABLE positions AS SELECT g AS position FROM generate_series(1, {int(rows)}) g")
        for _ in range(repeat):
            for name, value in (("staging COPY, metadata {} (JSON dumped)", {}), ("staging COPY, metadata NULL", None)):
                cursor.execute("TRUNCATE staged")
                started = time.perf_counter()
                with cursor.copy("COPY staged (id, metadata) FROM STDIN (FORMAT BINARY)") as copy:
                    copy.set_types(["int8", "jsonb"])
                    for i in range(rows):
                        copy.write_row((i, value))
                found.setdefault(name, []).append(time.perf_counter() - started)
            for name, table in (("records INSERT, foreign key to batches", "keyed"),
                                ("records INSERT, no foreign key", "unkeyed")):
                cursor.execute(f"TRUNCATE {table}")
                started = time.perf_counter()
                cursor.execute(f"INSERT INTO {table} SELECT 1, position FROM positions")
                found.setdefault(name, []).append(time.perf_counter() - started)
    server.drop_schemas(schema)
    return [(name, statistics.median(times) * 100_000 / rows) for name, times in found.items()]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", help=DATABASE_HELP)
    parser.add_argument("--archive", type=int, nargs="+", default=[1_000_000, 3_000_000])
    parser.add_argument("--chunk", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--oracle", type=int, default=500, help="random probes checked by brute force (besides "
                        "every planted near copy)")
    parser.add_argument("--seed", type=int, default=20261126)
    parser.add_argument("--staging", type=int, metavar="ROWS", default=0,
                        help="also time the staging COPY's JSON dumping and the records foreign key on ROWS rows")
    args = parser.parse_args(argv)
    print(command_line("bench_probes.py"))
    print(f"load at start: {load_average()}")
    with Server(args.database_url) as server:
        print(machine(server.version(), server.embedded))
        tables = []
        for size in args.archive:
            log(f"archive of {size:,}, chunk of {args.chunk:,}")
            tables.append((size, *measure(server, size, args.chunk, args.repeat, args.oracle, args.seed)))
        staging = staging_costs(server, args.staging, args.repeat) if args.staging else []
    print(f"load at end: {load_average()}")
    if staging:
        print(f"\n### Per-row work of a chunk's staging and records ({args.staging:,} rows, median of {args.repeat})\n")
        print("| what | s per 100k rows |\n|---|---:|")
        for name, seconds in staging:
            print(f"| {name} | {seconds:.2f} |")
    for size, rows, plans, timings in tables:
        print(f"\n### {size:,} documents, chunk of {args.chunk:,}, k = {MAX_DISTANCE} (15 key columns); "
              f"bulk load: COPY {timings['copy']:.0f} s, indexes {timings['indexes']:.0f} s\n")
        print("| way | key columns | ms per chunk | µs per probe | rows shipped | vs (a) today |")
        print("|---|---:|---:|---:|---:|---:|")
        for _, name, columns, ms, us, shipped, base in rows:
            versus = f"{base * 1000 / ms:.2f}x" if columns > 1 else ""
            print(f"| {name} | {columns} | {ms:,.0f} | {us:.2f} | {shipped:,} | {versus} |")
        print("\n| EXPLAIN (ANALYZE, BUFFERS) | planning ms | execution ms | heap fetches | shared hit / read | nodes |")
        print("|---|---:|---:|---:|---:|---|")
        for name, plan in plans:
            print(f"| {name} | {plan['planning']:.1f} | {plan['execution']:,.0f} | {plan['heap']:,} | "
                  f"{plan['hit']:,} / {plan['read']:,} | {plan['nodes']} |")


if __name__ == "__main__":
    main()
