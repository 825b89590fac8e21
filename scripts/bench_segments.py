"""Ingest at archive scale: segments against one big table, raw COPY and an empty archive, in one run.

It measures, on this machine, in one run, without tokenization (precomputed random 64-bit
fingerprints, 1 % of them near copies of stored ones, through ``Index.add_fingerprinted``):

* an archive of ``--archive`` (10M) documents, built once by a bulk load into one sealed segment
  (COPY FREEZE into the bare segment table, simdb's own index definitions, ATTACH), in the layout
  ``--expected-size`` would pick for it;
* ``--added`` (100k) documents into it, segmented: through a new, small active segment's indexes,
  and as a bulk chunk (a segment of its own, indexed after it is filled; simdb's default for a chunk
  this large), each twice in turn, the second pair reported (the first reads the big segment's
  indexes cold after the bulk load); and unsegmented (the big segment re-attached with an open range,
  so they go into its 10M-row indexes, as before segments); each ingest's WAL bytes and full-page
  images;
* the same ``--added`` into an empty archive (the flat-rate reference) and a raw binary COPY of the
  same rows into a bare table (the floor);
* lookups at the archive's size: ``Index.query_fingerprint`` p50/p99 and ``simdb_near`` p50 over
  ``--lookups`` probes (half near copies), and one ``query_fingerprints`` batch of 1,000 (after one
  warm-up batch);
* lookup cost against the number of segments: 1, 3, 7, 15 and 31 more segments of ``--curve-segment``
  (1,000) documents each (``--plot`` draws it)
  (p50 of ``--curve-probes`` (300) random probes through ``Index.query_fingerprint`` and ``simdb_near``);
* a full merge (``simdb compact --full``) of the whole archive, beside the bulk load's rate.

With ``--connections 1,2`` it measures only how a chunk's lookups into the archive spread over that many
database connections (:mod:`simdb.pg.spread`): the empty archive and raw COPY as above, then the same
``--added`` as a bulk chunk into the archive at each count in turn, after one cold warm-up, in the order
1, 2, 2, 1 (so that drift in the machine's load falls on both alike), each ingest's rate and the seconds
of its lookups into the archive (``spread_lookups``) reported, the load average beside them; then the
same ``--added`` through the active segment's indexes, and the lookups as above (the batch of 1,000 cold:
the index's first, of probes nothing has read; warm: new probes after it; and the warm batch repeated).
``--reuse`` keeps the bulk-loaded archive for the next such run (and uses one kept whole by an earlier run).

Server settings are reported in the header, with the ones simdb recommends for this machine;
run it once on a server with defaults and once on one with the recommended settings (give its
``--database-url``).

Run (about 15 minutes at 10M on 2 cores)::

    .venv/bin/python scripts/bench_segments.py --markdown
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import (DATABASE_HELP, SMOKE_HELP, Server, bulk_load, busy_seconds, command_line,  # noqa: E402
                          load_average, log, machine, print_table, random_u64, smoke, wal_counters_settle)

import simdb  # noqa: E402
from simdb.bits import to_signed_array  # noqa: E402
from simdb.ingest import FingerprintedBatch  # noqa: E402
from simdb.methods.simhash.blocks import DEFAULT_MAX_DISTANCE, BlockLayout  # noqa: E402
from simdb.pg import reads, segments  # noqa: E402
from simdb.pg.copy import copy_in  # noqa: E402
from simdb.pg.database import postgres_url  # noqa: E402
from simdb.pg.server import current, recommended, wal_compressions  # noqa: E402
from simdb.settings import DEFAULT_BULK_CHUNK  # noqa: E402

NEAR_FRACTION = 0.01
#: More segments at each point of the lookup cost curve; ``--smoke`` takes the first three points
CURVE = (0, 1, 3, 7, 15, 31)
SMOKE_CURVE = CURVE[:3]
# its own schemas, by process: two runs at once (the tests run it twice) do not collide
SCHEMA, EMPTY = f"simdb_bench_segments_{os.getpid()}", f"simdb_bench_segments_empty_{os.getpid()}"


def new_fingerprints(rng: np.random.Generator, count: int, stored: np.ndarray) -> np.ndarray:
    fps = random_u64(rng, count)
    near = int(count * NEAR_FRACTION)
    sources = stored[rng.integers(0, len(stored), near)] if len(stored) else random_u64(rng, near)
    flips = rng.integers(0, 64, (near, 2)).astype(np.uint64)
    fps[:near] = sources ^ (np.uint64(1) << flips[:, 0]) ^ (np.uint64(1) << flips[:, 1])
    return fps


def batch_of(rng: np.random.Generator, fps: np.ndarray, prefix: str) -> FingerprintedBatch:
    batch = FingerprintedBatch()
    hashes = rng.bytes(16 * len(fps))
    for i, fp in enumerate(fps.tolist()):
        batch.append(f"{prefix}-{i:08d}", fp, hashes[16 * i:16 * i + 16], 1000, {}, f"{prefix}:{i + 1}")
    return batch


def ingest_pairs(server: Server, make_batch: Callable[[str], FingerprintedBatch]) -> tuple[dict, dict]:
    """(active, bulk): a batch through the active segment's indexes (bulk loading off), then one as a bulk
    chunk, twice in turn; the first pair after the bulk load reads the big segment's key indexes cold, the
    second counts."""
    for turn in ("warm-up", ""):
        batch = make_batch(f"active{turn}")
        set_policy(server, segments.SegmentPolicy(bulk_chunk=len(batch) + 1))
        active = timed_ingest(server, SCHEMA, None, f"active{turn}", None, batch=batch)
        set_policy(server, segments.SegmentPolicy(bulk_chunk=min(len(batch), DEFAULT_BULK_CHUNK)))
        bulk = timed_ingest(server, SCHEMA, None, f"segmented{turn}", None, batch=make_batch(f"segmented{turn}"))
    return active, bulk


def pair_rows(label: str, bulk: dict, active: dict, empty: dict) -> list[tuple[str, str, str, str]]:
    return [(f"{label} (bulk chunk)", f"{bulk['rate']:,.0f} docs/s",
             f"{empty['rate']:,.0f} docs/s into an empty archive", f"{bulk['rate'] / empty['rate']:.2f}x"),
            (f"{label}: bulk chunk against the active segment's indexes", f"{bulk['rate']:,.0f} docs/s",
             f"{active['rate']:,.0f} docs/s", f"{bulk['rate'] / active['rate']:.2f}x")]


def minhash_batch(rng: np.random.Generator, count: int, stored: np.ndarray | None, prefix: str,
                  num_perm: int = 128) -> FingerprintedBatch:
    """``count`` random MinHash signatures, 1 % of them copies of stored ones with 10 of 128 positions changed
    (similarity 0.92: near-duplicates at 0.8); with no ``stored`` (an empty archive), copies of as many other
    documents of the batch, so that it has as many pairs. (The empty archive's batch once copied one signature
    1,000 times: 499,500 pairs within the batch, which its rate measured more than the chunk.)"""
    num_perm = num_perm if stored is None else stored.shape[1]
    signatures = rng.integers(0, 2 ** 32, (count, num_perm), dtype=np.uint32)
    near = int(count * NEAR_FRACTION)
    if stored is None:
        signatures[:near] = signatures[near + rng.choice(count - near, near, replace=False)]
    else:
        signatures[:near] = stored[rng.integers(0, len(stored), near)]
    for row in range(near):
        signatures[row, rng.choice(num_perm, 10, replace=False)] = rng.integers(0, 2 ** 32, 10)
    batch = FingerprintedBatch()
    hashes = rng.bytes(16 * count)
    for i, signature in enumerate(signatures):
        batch.append(f"{prefix}-{i:08d}", signature.tobytes(), hashes[16 * i:16 * i + 16], 1000, {}, f"{prefix}:{i + 1}")
    return batch


def minhash_run(server: Server, args, rng: np.random.Generator) -> None:
    """MinHash (0.8, 128): 100k into an empty archive, then into a bulk-loaded one, through the active
    segment's indexes and as a bulk chunk, in warmed pairs."""
    options = {"method": "minhash", "threshold": 0.8, "num_perm": 128}
    try:
        log(f"MinHash, empty archive: {args.added:,} documents")
        simdb.Index.create(server.url, schema=EMPTY, **options).close()
        empty = timed_ingest(server, EMPTY, None, "empty", rng,
                             batch=minhash_batch(rng, args.added, None, "empty"))
        server.drop_schemas(EMPTY)
        log(f"bulk-loading a MinHash archive of {args.archive:,}")
        stored, build = bulk_load(server.url, server.admin, SCHEMA, None, args.archive, rng, options=options)
        active, bulk = ingest_pairs(server, lambda prefix: minhash_batch(rng, args.added, stored, prefix))
    finally:
        server.drop_schemas(SCHEMA, EMPTY)
    rows = [
        *pair_rows(f"MinHash: {args.added:,} into {args.archive:,}", bulk, active, empty),
        ("MinHash: WAL per document (bulk chunk / active segment)", f"{bulk['wal'] / args.added:,.0f} B",
         f"{active['wal'] / args.added:,.0f} B", ""),
        (f"MinHash: bulk load of {args.archive:,}", f"{args.archive / build['total']:,.0f} docs/s",
         f"{build['bytes'] / 2**30:.1f} GiB, indexes built in {build['indexes']:.0f} s", ""),
    ]
    header = [machine(server.version(), server.embedded), command_line("bench_segments.py"),
              "MinHash threshold 0.8, 128 permutations, 1 % near copies (10 of 128 positions changed)"]
    print_table(header, rows, args.markdown)


def connections_run(server: Server, args, rng: np.random.Generator, counts: list[int]) -> None:
    """The bulk chunk into the archive with its lookups spread over each of ``counts`` connections in turn
    (ABBA order after a cold warm-up), beside the empty archive and raw COPY of the same run."""
    layout = BlockLayout.for_size(args.max_distance, args.archive)
    lookups_seconds: list[float] = []
    lookups_cpu: list[float] = []
    real = segments.spread_lookups

    def timed_lookups(*arguments):
        start, busy = time.perf_counter(), busy_seconds()
        try:
            return real(*arguments)
        finally:
            lookups_seconds.append(time.perf_counter() - start)
            lookups_cpu.append(busy_seconds() - busy)

    segments.spread_lookups = timed_lookups
    loads = [load_average()]
    measured: dict[int, list[dict]] = {count: [] for count in counts}
    try:
        log(f"empty archive, {layout.describe()}: {args.added:,} documents (load {loads[-1]})")
        simdb.Index.create(server.url, schema=EMPTY, blocks=layout.blocks, max_distance=args.max_distance).close()
        empty = timed_ingest(server, EMPTY, new_fingerprints(rng, args.added, np.empty(0, np.uint64)), "empty", rng)
        server.drop_schemas(EMPTY)
        copy_seconds = raw_copy(server, layout, random_u64(rng, args.added), rng)
        log(f"  raw COPY of {args.added:,}: {args.added / copy_seconds:,.0f} rows/s")
        stored = archive(server, args, layout, rng)
        # what follows draws from a generator of its own: a kept archive was not drawn from this run's, whose
        # next fingerprints would be the archive's own first ones
        rng = np.random.default_rng([args.seed, 1])
        set_policy(server, segments.SegmentPolicy(bulk_chunk=min(args.added, DEFAULT_BULK_CHUNK)))
        order = ["warm-up", *counts, *([] if args.smoke else reversed(counts))]  # ABBA: drift falls on both alike
        for turn, count in enumerate(order):
            connections = max(counts) if count == "warm-up" else count
            loads.append(load_average())
            log(f"  {count} connection(s), load {loads[-1]}")
            lookups_seconds.clear()
            lookups_cpu.clear()
            result = timed_ingest(server, SCHEMA, new_fingerprints(rng, args.added, stored), f"spread{turn}", rng,
                                  connections=connections)
            result["lookups"], result["lookups_cpu"] = sum(lookups_seconds), sum(lookups_cpu)
            log(f"    lookups into the archive: {result['lookups']:.2f} s")
            if count != "warm-up":
                measured[count].append(result)
        loads.append(load_average())
        # after bulk chunks: every segment sealed and analyzed
        found = lookups(server, stored, args.lookups, rng, tuple(counts))
        log(f"  lookups (load {loads[-1]}): p50 {found['p50'] * 1e3:.2f} ms, simdb_near p50 "
            f"{found['near_p50'] * 1e3:.2f} ms")
        loads.append(load_average())
        log(f"  through the active segment, load {loads[-1]}")
        set_policy(server, segments.SegmentPolicy(bulk_chunk=args.added + 1))
        active = timed_ingest(server, SCHEMA, new_fingerprints(rng, args.added, stored), "active", rng)
        loads.append(load_average())
    finally:
        segments.spread_lookups = real
        set_policy(server, segments.SegmentPolicy())
        leave_archive(server, args)
    base = measured[counts[0]]
    rows = [(f"{args.added:,} into an empty archive", f"{empty['rate']:,.0f} docs/s", "", ""),
            ("raw binary COPY of the same rows into a bare table", f"{args.added / copy_seconds:,.0f} rows/s", "",
             f"empty archive / COPY {empty['rate'] * copy_seconds / args.added:.2f}x")]
    for count in counts:
        runs = measured[count]
        rates = [r["rate"] for r in runs]
        rows.append((f"{args.added:,} into {args.archive:,} (bulk chunk), lookups over {count} connection(s)",
                     " / ".join(f"{r:,.0f}" for r in rates) + " docs/s",
                     " / ".join(f"{r['lookups']:.2f}" for r in runs) + " s of lookups",
                     f"{statistics.mean(rates) / empty['rate']:.2f}x the empty archive; lookups "
                     f"{statistics.mean(r['lookups'] for r in base) / max(statistics.mean(r['lookups'] for r in runs), 1e-9):.2f}x"
                     f" faster than {counts[0]}"))
        rows.append(("the same: CPU seconds of each chunk, the whole machine's (client and server) / of its lookups",
                     " / ".join(f"{r['cpu']:.2f}" for r in runs) + " s",
                     " / ".join(f"{r['lookups_cpu']:.2f}" for r in runs) + " s",
                     f"the empty archive's chunk {empty['cpu']:.2f} s"))
    bulk_rate = statistics.mean(r["rate"] for runs in measured.values() for r in runs)
    rows += [(f"{args.added:,} into {args.archive:,} through the active segment's indexes", f"{active['rate']:,.0f} docs/s",
              "", f"{active['rate'] / empty['rate']:.2f}x the empty archive; bulk chunks (mean) "
              f"{bulk_rate / active['rate']:.2f}x"),
             *lookup_rows(args.archive, found)]
    header = [machine(server.version(), server.embedded), command_line("bench_segments.py"),
              f"layout: {layout.describe()}; {os.cpu_count()} cores; load average (1, 5, 15 min) before each "
              f"step: {' | '.join(loads)}",
              "columns: what | rate of each run (in run order) | seconds of the chunk's lookups into the archive "
              "(spread_lookups) | against the peers"]
    print_table(header, rows, args.markdown)


def kept_lookups(server: Server, args, rng: np.random.Generator, counts: list[int]) -> None:
    """``--lookups-only``: the lookups of :func:`lookups` on the kept archive, ``args.lookups_only`` rounds in one
    process (new probes every time), the load average before each."""
    with server.admin.connect() as c:
        found = c.exec_driver_sql(f"SELECT name, documents FROM {SCHEMA}.batches ORDER BY id").all() \
            if c.exec_driver_sql(f"SELECT to_regclass('{SCHEMA}.batches')").scalar() is not None else []
    if [tuple(row) for row in found] != [("archive", args.archive)]:
        raise SystemExit(f"no archive of {args.archive:,} kept in {SCHEMA}: run with --connections --reuse first")
    stored = kept_fingerprints(server)
    rows = []
    for round_ in range(args.lookups_only):
        load = load_average()
        result = lookups(server, stored, args.lookups, rng, tuple(counts))
        rows += [(f"round {round_ + 1} (load {load}): {what}", value, peer, ratio)
                 for what, value, peer, ratio in lookup_rows(args.archive, result)]
    header = [machine(server.version(), server.embedded), command_line("bench_segments.py"),
              f"the kept archive of {args.archive:,} in {SCHEMA}; {os.cpu_count()} cores; load at the end {load_average()}"]
    print_table(header, rows, args.markdown)


def archive(server: Server, args, layout: BlockLayout, rng: np.random.Generator) -> np.ndarray:
    """The archive's fingerprints: bulk-loaded into ``SCHEMA``; with ``--reuse``, the one kept there by an
    earlier run when it holds ``--archive`` documents and nothing else (else loaded and kept)."""
    if args.reuse:
        found = []
        with server.admin.connect() as c:
            if c.exec_driver_sql(f"SELECT to_regclass('{SCHEMA}.batches')").scalar() is not None:
                found = c.exec_driver_sql(f"SELECT name, documents FROM {SCHEMA}.batches ORDER BY id").all()
        if [tuple(row) for row in found] == [("archive", args.archive)]:
            log(f"reusing the archive of {args.archive:,} kept in {SCHEMA}")
            drop_empty_segments(server)
            return kept_fingerprints(server)
        server.drop_schemas(SCHEMA)
    log(f"bulk-loading an archive of {args.archive:,}")
    return bulk_load(server.url, server.admin, SCHEMA, layout, args.archive, rng, args.max_distance)[0]


def kept_fingerprints(server: Server) -> np.ndarray:
    """The fingerprints of the kept archive's bulk-loaded segment, in id order, read by one binary COPY."""
    raw = bytearray()
    with server.admin.connect() as c:
        cursor = c.connection.dbapi_connection.cursor()
        with cursor.copy(f"COPY (SELECT simhash FROM {SCHEMA}.{segments.segment_name(1)} ORDER BY id) "
                         "TO STDOUT (FORMAT binary)") as copy:
            for block in copy:
                raw += block
    rows = np.frombuffer(bytes(raw[19:-2]), dtype=[("fields", ">i2"), ("size", ">i4"), ("value", ">i8")])
    return rows["value"].astype(np.int64).view(np.uint64)


def drop_empty_segments(server: Server) -> None:
    """The segments the last run's ingests left empty when it removed their batches, gone: a lookup reads every
    segment, so each would cost this run's lookups what it did not cost the first run's."""
    with server.admin.connect() as c:
        c.exec_driver_sql(f"SET search_path TO {SCHEMA}")
        for segment in segments.list_segments(c, distributed=False)[1:]:
            if c.exec_driver_sql(f"SELECT NOT EXISTS (SELECT FROM {segment.name})").scalar_one():
                c.exec_driver_sql(f"ALTER TABLE documents DETACH PARTITION {segment.name}")
                c.exec_driver_sql(f"DROP TABLE {segment.name}")


def leave_archive(server: Server, args) -> None:
    """Drop the run's schemas; with ``--reuse``, keep the archive, less the batches this run added."""
    server.drop_schemas(EMPTY)
    if not args.reuse:
        server.drop_schemas(SCHEMA)
        return
    added = remove_added_batches(server)
    log(f"kept the archive in {SCHEMA} (--reuse), less this run's {len(added)} batches")


def remove_added_batches(server: Server) -> list[str]:
    """Remove every batch of the kept archive in ``SCHEMA`` but the archive's own, and the segments left empty:
    what a run added, whether or not it lived to note it. The names removed."""
    with simdb.Index.open(server.url, schema=SCHEMA) as index:
        with index.database.engine.connect() as c:
            added = c.exec_driver_sql("SELECT name FROM batches WHERE name <> 'archive'").scalars().all()
        for name in added:
            index.remove(batch=name)
    drop_empty_segments(server)
    return added


def wal(admin: sa.Engine) -> tuple[str, int]:
    with admin.connect() as c:
        return (c.exec_driver_sql("SELECT pg_current_wal_lsn()::text").scalar_one(),
                c.exec_driver_sql("SELECT wal_fpi FROM pg_stat_wal").scalar_one())


def wal_since(admin: sa.Engine, before: tuple[str, int]) -> tuple[int, int]:
    wal_counters_settle()
    with admin.connect() as c:
        written = c.execute(sa.text("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), CAST(:l AS pg_lsn))"),
                            {"l": before[0]}).scalar_one()
        return int(written), c.exec_driver_sql("SELECT wal_fpi FROM pg_stat_wal").scalar_one() - before[1]


def reopen_big_segment(server: Server, end: int) -> None:
    """Re-attach the first segment with the range [1, end): new documents go into its big indexes."""
    name = segments.segment_name(1)
    with server.admin.connect() as c:
        c.exec_driver_sql(f"SET search_path TO {SCHEMA}")
        for segment in segments.list_segments(c, distributed=False)[1:]:  # a local archive
            count = c.exec_driver_sql(f"SELECT count(*) FROM {segment.name}").scalar_one()
            if count:
                raise RuntimeError(f"segment {segment.name} is not empty")
            c.exec_driver_sql(f"ALTER TABLE documents DETACH PARTITION {segment.name}")
            c.exec_driver_sql(f"DROP TABLE {segment.name}")
        c.exec_driver_sql(f"ALTER TABLE documents DETACH PARTITION {name}")
        c.exec_driver_sql(f"ALTER TABLE documents ATTACH PARTITION {name} FOR VALUES FROM (1) TO ({end})")


def set_policy(server: Server, policy: segments.SegmentPolicy) -> None:
    with server.admin.begin() as c:
        c.exec_driver_sql(f"SET LOCAL search_path TO {SCHEMA}")
        segments.save_policy(c, policy)


def timed_ingest(server: Server, schema: str, fps: np.ndarray | None, prefix: str, rng,
                 batch: FingerprintedBatch | None = None, connections: int | None = None) -> dict:
    batch = batch if batch is not None else batch_of(rng, fps, prefix)
    server.checkpoint()
    before = wal(server.admin)
    with simdb.Index.open(server.url, schema=schema) as index:
        busy = busy_seconds()
        summary = index.add_fingerprinted(batch, batch=prefix, connections=connections)
        cpu = busy_seconds() - busy
    written, images = wal_since(server.admin, before)
    log(f"  {prefix}: {summary} ({len(batch) / summary.seconds:,.0f} docs/s); WAL {written / 2**20:,.0f} MB, "
        f"{images:,} full-page images; {cpu:.2f} CPU seconds (the machine's)")
    return {"seconds": summary.seconds, "rate": len(batch) / summary.seconds, "wal": written, "fpi": images,
            "duplicates": summary.near_duplicates + summary.exact_duplicates, "documents": len(batch), "cpu": cpu}


def raw_copy(server: Server, layout: BlockLayout, fps: np.ndarray, rng) -> float:
    columns = ["id", "external_id", "simhash", *layout.key_columns, "content_hash", "length", "metadata"]
    types = ["int8", "text", "int8", *["int8"] * len(layout.key_columns), "bytea", "int4", "jsonb"]
    keys, signed, hashes = layout.block_keys_array(fps).tolist(), to_signed_array(fps).tolist(), rng.bytes(16 * len(fps))
    rows = [(i, f"raw-{i}", signed[i], *keys[i], hashes[16 * i:16 * i + 16], 1000, {}) for i in range(len(fps))]
    engine = sa.create_engine(postgres_url(server.url))
    try:
        with engine.begin() as c:
            c.exec_driver_sql("CREATE TEMPORARY TABLE raw (" + ", ".join(f"{n} {t}" for n, t in zip(columns, types))
                              + ") ON COMMIT DROP")
            start = time.perf_counter()
            copy_in(c, f"raw ({', '.join(columns)})", types, rows)
            return time.perf_counter() - start
    finally:
        engine.dispose()


def near_and_random(stored: np.ndarray, count: int, rng) -> np.ndarray:
    """``count`` probes: half near copies (1 bit) of stored fingerprints, half random."""
    return np.concatenate([stored[rng.integers(0, len(stored), count // 2)] ^ np.uint64(1),
                           random_u64(rng, count - count // 2)])


def lookups(server: Server, stored: np.ndarray, count: int, rng, connections: tuple[int | None, ...] = (None,)
            ) -> dict:
    """Lookup p50/p99 and simdb_near p50 over ``count`` probes, and for each of ``connections`` (None: the
    library's default), three 1,000-query batches on a newly opened index: cold (its first batch, of probes no
    lookup has read), warm (new probes after it) and the warm batch repeated."""
    batches: dict = {}
    for spread_over in connections:
        options = {} if spread_over is None else {"connections": spread_over}
        cold, warm = near_and_random(stored, 1000, rng).tolist(), near_and_random(stored, 1000, rng).tolist()
        with simdb.Index.open(server.url, schema=SCHEMA) as index:
            for name, batch in (("cold", cold), ("warm", warm), ("repeat", warm)):
                start = time.perf_counter()
                index.query_fingerprints(batch, **options)
                batches[spread_over, name] = 1000 / (time.perf_counter() - start)
        log(f"  batches of 1,000 over {spread_over or 'the default'} connection(s): cold "
            f"{batches[spread_over, 'cold']:,.0f}, warm {batches[spread_over, 'warm']:,.0f}, repeated "
            f"{batches[spread_over, 'repeat']:,.0f} q/s")
    probes = near_and_random(stored, count, rng)
    signed = to_signed_array(near_and_random(stored, count, rng)).tolist()  # probes of its own: none read before
    with simdb.Index.open(server.url, schema=SCHEMA) as index:
        index.query_fingerprint(int(probes[0]))
        times = []
        for fp in probes.tolist():
            start = time.perf_counter()
            index.query_fingerprint(fp)
            times.append(time.perf_counter() - start)
        near = []
        with index.database.engine.connect() as c:
            for fp in signed:
                start = time.perf_counter()
                c.execute(sa.text("SELECT * FROM simdb_near(:fp)"), {"fp": fp}).all()
                near.append(time.perf_counter() - start)
    times.sort()
    near.sort()
    return {"p50": statistics.median(times), "p99": times[int(len(times) * 0.99)], "near_p50": statistics.median(near),
            "batches": batches, "batch_rate": batches[connections[0], "warm"]}


def lookup_rows(archive_size: int, found: dict) -> list[tuple[str, str, str, str]]:
    counts = sorted({spread_over for spread_over, _ in found["batches"]}, key=lambda n: n or 0)
    return [(f"lookup p50 / p99 at {archive_size:,} (Index.query_fingerprint)",
             f"{found['p50'] * 1e3:.2f} / {found['p99'] * 1e3:.2f} ms", "", ""),
            ("simdb_near p50", f"{found['near_p50'] * 1e3:.2f} ms", "", ""),
            *((f"1,000-query batch (query_fingerprints) over {spread_over or 'the default'} connection(s): cold "
               "(a new index's first batch, new probes) / warm (new probes after it) / the warm batch repeated",
               " / ".join(f"{found['batches'][spread_over, name]:,.0f}" for name in ("cold", "warm", "repeat"))
               + " q/s", "", "") for spread_over in counts)]


def segment_curve(server: Server, stored: np.ndarray, rng, size: int = 1000, probe_count: int = 300,
                  points: tuple[int, ...] = CURVE) -> list[tuple[int, float, float]]:
    """(segments, lookup p50, simdb_near p50) as the extra documents are split into more segments of ``size``
    (``points``: how many more at each point)."""
    curve = []
    probes = random_u64(rng, probe_count)
    with simdb.Index.open(server.url, schema=SCHEMA) as index:
        for extra in points:
            if extra:  # extra small segments, each of ``size`` documents (ids moved past the active segment)
                with index.database.engine.begin() as c:
                    segments.save_policy(c, segments.SegmentPolicy(size=size, merge_factor=64))
                    last = segments.list_segments(c, distributed=index.context.distributed)[-1]
                    c.execute(sa.text("SELECT setval('documents_id_seq', :v)"), {"v": last.end_id - 1})
                for number in range(extra):
                    index.add_fingerprinted(batch_of(rng, random_u64(rng, size), f"curve{len(curve)}-{number}"),
                                            batch=f"curve{len(curve)}-{number}")
            with index.database.engine.connect() as c:
                total = len(segments.list_segments(c, distributed=index.context.distributed))
            times, near = [], []
            for fp in probes.tolist():
                start = time.perf_counter()
                index.query_fingerprint(fp)
                times.append(time.perf_counter() - start)
            with index.database.engine.connect() as c:
                for fp in to_signed_array(probes).tolist():
                    start = time.perf_counter()
                    c.execute(sa.text("SELECT * FROM simdb_near(:fp)"), {"fp": fp}).all()
                    near.append(time.perf_counter() - start)
            curve.append((total, statistics.median(times), statistics.median(near)))
            log(f"  {total} segments: lookup p50 {curve[-1][1] * 1e3:.2f} ms, simdb_near p50 {curve[-1][2] * 1e3:.2f} ms")
    return curve


def plot_curve(curve: list[tuple[int, float, float]], path: str, title: str) -> None:
    """The lookup cost against the number of segments, as a PNG for the docs."""
    from simdb.charts import chart_style, new_figure

    with chart_style():
        figure = new_figure(6.4, 3.6)
        axes = figure.add_subplot()
        counts = [n for n, _, _ in curve]
        axes.plot(counts, [a * 1e3 for _, a, _ in curve], marker="o", label="Index.query_fingerprint (Python)")
        axes.plot(counts, [b * 1e3 for _, _, b in curve], marker="s", label="simdb_near (SQL)")
        axes.set(xlabel="segments", ylabel="lookup p50 (ms)", title=title, ylim=(0, None))
        axes.grid(alpha=0.3)
        axes.legend()
        figure.savefig(path)


def main(argv: list[str] | None = None) -> None:
    global SCHEMA
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", help=DATABASE_HELP)
    parser.add_argument("--archive", type=int, default=10_000_000)
    parser.add_argument("--added", type=int, default=100_000)
    parser.add_argument("--lookups", type=int, default=2000)
    parser.add_argument("--curve-segment", type=int, default=1000,
                        help="documents in each extra segment of the lookup cost curve (default 1,000)")
    parser.add_argument("--curve-probes", type=int, default=300,
                        help="random probes per point of the lookup cost curve (default 300)")
    parser.add_argument("--seed", type=int, default=20261123)
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--plot", metavar="PNG", help="draw the lookup cost against the number of segments")
    parser.add_argument("--max-distance", type=int, default=DEFAULT_MAX_DISTANCE,
                        help=f"SimHash k, in the layout --expected-size would pick for the archive (default {DEFAULT_MAX_DISTANCE})")
    parser.add_argument("--method", choices=["simhash", "minhash"], default="simhash",
                        help="minhash: only the ingests (empty archive, active segment, bulk chunk) at MinHash 0.8/128")
    parser.add_argument("--connections", metavar="LIST",
                        help="only the bulk chunk into the archive, its lookups over each number of connections "
                             "in this comma-separated list (e.g. 1,2), with the empty archive and raw COPY as peers")
    parser.add_argument("--reuse", action="store_true",
                        help="with --connections: keep the bulk-loaded archive (schema simdb_bench_segments_kept_"
                             "ARCHIVE_kK) for the next run, and use the one kept there when it is whole")
    parser.add_argument("--lookups-only", type=int, metavar="ROUNDS",
                        help="with --connections and --reuse: only the lookups (p50, simdb_near, the batches over "
                             "each number of connections) on the archive an earlier run kept, ROUNDS times")
    parser.add_argument("--smoke", action="store_true",
                        help=SMOKE_HELP + f"; the lookup cost curve's first {len(SMOKE_CURVE)} points only; with "
                             "--connections, each count once (1, 2, not 1, 2, 2, 1)")
    args = parser.parse_args(argv)
    smoke(args.smoke)
    if args.lookups_only is not None and args.lookups_only < 1:
        parser.error(f"--lookups-only {args.lookups_only}: give the number of rounds, 1 or more")
    if args.lookups_only is not None and not (args.reuse and args.connections):
        parser.error("--lookups-only measures the archive kept by an earlier --connections --reuse run: give both")
    if args.reuse and not args.connections:
        parser.error("--reuse works with --connections (the full run merges and reopens the archive it measures)")
    rng = np.random.default_rng(args.seed)
    if args.connections:
        counts = [int(count) for count in args.connections.split(",")]
        if args.reuse:
            SCHEMA = f"simdb_bench_segments_kept_{args.archive}_k{args.max_distance}"
        with Server(args.database_url) as server:
            if args.lookups_only is not None:
                kept_lookups(server, args, rng, counts)
                return
            server.drop_schemas(EMPTY, *([] if args.reuse else [SCHEMA]))
            connections_run(server, args, rng, counts)
        return
    if args.method == "minhash":
        with Server(args.database_url) as server:
            server.drop_schemas(SCHEMA, EMPTY)
            minhash_run(server, args, rng)
        return
    k = args.max_distance
    layout = BlockLayout.for_size(k, args.archive)
    with Server(args.database_url) as server:
        server.drop_schemas(SCHEMA, EMPTY)
        with server.admin.connect() as c:
            settings = {name: value for name, (value, _) in current(c).items()}
            advice = recommended(compressions=wal_compressions(c))
        log(f"server settings: {settings}")
        try:
            log(f"empty archive, {layout.describe()}: {args.added:,} documents")
            simdb.Index.create(server.url, schema=EMPTY, blocks=layout.blocks, max_distance=k).close()
            empty = timed_ingest(server, EMPTY, new_fingerprints(rng, args.added, np.empty(0, np.uint64)), "empty",
                                 rng)
            server.drop_schemas(EMPTY)
            copy_seconds = raw_copy(server, layout, random_u64(rng, args.added), rng)
            log(f"  raw COPY of {args.added:,}: {args.added / copy_seconds:,.0f} rows/s")

            log(f"bulk-loading an archive of {args.archive:,}")
            stored, build = bulk_load(server.url, server.admin, SCHEMA, layout, args.archive, rng, k)
            active, segmented = ingest_pairs(
                server, lambda prefix: batch_of(rng, new_fingerprints(rng, args.added, stored), prefix))
            found = lookups(server, stored, args.lookups, rng)
            log(f"  lookups: p50 {found['p50'] * 1e3:.2f} ms, simdb_near p50 {found['near_p50'] * 1e3:.2f} ms, "
                f"batch {found['batch_rate']:,.0f} q/s")
            stats = {}
            with simdb.Index.open(server.url, schema=SCHEMA) as index:
                for exact in (False, True):
                    start = time.perf_counter()
                    measured = index.stats(exact=exact)["measured_candidates_per_lookup"]
                    stats[exact] = (time.perf_counter() - start, measured)
            log(f"  stats: {stats[False][0]:.1f} s sampled, {stats[True][0]:.1f} s exact")
            curve = segment_curve(server, stored, rng, args.curve_segment, args.curve_probes,
                                  SMOKE_CURVE if args.smoke else CURVE)
            if args.plot:
                plot_curve(curve, args.plot, f"lookups at {args.archive:,} documents, "
                                             f"shared_buffers {int(settings['shared_buffers']) * 8 // 1024:,} MB")
            with simdb.Index.open(server.url, schema=SCHEMA) as index:
                with index.database.engine.begin() as c:
                    segments.save_policy(c, segments.SegmentPolicy())
                    batches = c.exec_driver_sql("SELECT name FROM batches WHERE name <> 'archive'").scalars().all()
                for name in batches:
                    index.remove(batch=name)  # back to the bulk-loaded archive: the ingests and the curve's
                start = time.perf_counter()
                merged = index.compact(full=True)
                merge_seconds = time.perf_counter() - start
                log(f"  {merged}")
                with index.database.engine.connect() as c:
                    documents = c.exec_driver_sql("SELECT count(*) FROM documents").scalar_one()
                    end = c.exec_driver_sql("SELECT last_value + 1 FROM documents_id_seq").scalar_one()
            log("unsegmented: the big segment takes the new documents")
            reopen_big_segment(server, end + 10 * args.added)
            set_policy(server, segments.SegmentPolicy(bulk_chunk=args.added + 1))  # into it, not beside it
            unsegmented = timed_ingest(server, SCHEMA, new_fingerprints(rng, args.added, stored), "unsegmented", rng)
        finally:
            server.drop_schemas(SCHEMA, EMPTY)
        rows = [
            *pair_rows(f"{args.added:,} into {args.archive:,}", segmented, active, empty),
            (f"{args.added:,} into {args.archive:,} (unsegmented, as before)", f"{segmented['rate']:,.0f} docs/s",
             f"{unsegmented['rate']:,.0f} docs/s", f"{segmented['rate'] / unsegmented['rate']:.2f}x"),
            ("raw binary COPY of the same rows into a bare table", f"{segmented['rate']:,.0f} docs/s",
             f"{args.added / copy_seconds:,.0f} rows/s", f"{segmented['rate'] * copy_seconds / args.added:.2f}x"),
            ("WAL per document (segmented / unsegmented)", f"{segmented['wal'] / args.added:,.0f} B, "
             f"{segmented['fpi']:,} FPI", f"{unsegmented['wal'] / args.added:,.0f} B, {unsegmented['fpi']:,} FPI",
             f"{unsegmented['wal'] / max(segmented['wal'], 1):.1f}x less"),
            *lookup_rows(args.archive, found),
            (f"simdb stats: key buckets from {reads.STATS_SAMPLE:,} sampled documents, against all",
             f"{stats[False][0]:.1f} s ({stats[False][1]} candidates per lookup)",
             f"{stats[True][0]:.1f} s ({stats[True][1]})", f"{stats[True][0] / stats[False][0]:.0f}x faster"),
            (f"merge of every segment ({documents:,} documents)", f"{documents / merge_seconds:,.0f} docs/s",
             f"bulk load {args.archive / build['total']:,.0f} docs/s",
             f"{(documents / merge_seconds) / (args.archive / build['total']):.2f}x"),
            *((f"lookup with {n} segments (p50, simdb_near p50)", f"{a * 1e3:.2f} ms, {b * 1e3:.2f} ms",
               f"{curve[0][1] * 1e3:.2f} ms with {curve[0][0]}", f"{a / curve[0][1]:.2f}x") for n, a, b in curve[1:]),
        ]
        header = [machine(server.version(), server.embedded), command_line("bench_segments.py"),
                  f"layout: {layout.describe()}; server: " + ", ".join(f"{k}={v}" for k, v in sorted(settings.items())),
                  "recommended for this machine: " + ", ".join(f"{k}={v}" for k, v in advice.items())]
        print_table(header, rows, args.markdown)


if __name__ == "__main__":
    main()
