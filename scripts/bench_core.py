"""Benchmark simdb's core paths against their peers, side by side in one run.

For N random 64-bit fingerprints (default 1M) with planted neighbours, it measures:

* ingest: ``Index.add_fingerprinted`` (the real archive path: staging COPY, block-key
  join, popcount verify, INSERT ... SELECT; no text tokenization) beside a raw binary
  COPY of the same rows into an identically indexed documents table, and beside the
  PyPI ``simhash`` package's in-memory ``SimhashIndex(k=3)``;
* single query: p50/p99 of ``Index.query_fingerprint`` beside a plain SQL full scan
  (``WHERE bit_count((simhash # q)::bit(64)) <= 3``), numpy brute force
  (``np.bitwise_count`` over the uint64 array) and ``SimhashIndex.get_near_dups``;
* batch query: one ``Index.query_fingerprints`` call for all queries, in queries/s;
* recall: every planted neighbour must come back (checked against numpy brute force).

Half the queries have one stored copy planted at every distance 0..k, the other half
are random. The script only prints (progress on stderr, the table on stdout) and
asserts nothing about timings. It works in its own schemas (``simdb_bench``,
``simdb_bench_raw``), dropped at the start and at the end, so it leaves no state.

Run (about 3 minutes at 1M on 2 cores)::

    .venv/bin/python scripts/bench_core.py --markdown

Without ``--database-url`` it uses ``SIMDB_DATABASE_URL`` or
postgresql://postgres@127.0.0.1:5432/test, and if nothing answers there it starts an
embedded PostgreSQL (pgserver) in a temporary directory (``bench_common.Server``).
"""

from __future__ import annotations

import argparse
import gc
import time
from dataclasses import dataclass

import numpy as np
import sqlalchemy as sa
from bench_common import (DATABASE_HELP, SMOKE_HELP, STARTED, Server, command_line, log, machine, print_table,
                          random_u64, rate, ratio, rss_bytes, smoke)

import simdb
from simdb.bits import to_signed, to_signed_array
from simdb.ingest import FingerprintedBatch
from simdb.pg import segments
from simdb.pg.copy import copy_in

SCHEMA, RAW_SCHEMA = "simdb_bench", "simdb_bench_raw"


def timed_each(function, items) -> tuple[list, list[float]]:
    results, seconds = [], []
    for item in items:
        start = time.perf_counter()
        results.append(function(item))
        seconds.append(time.perf_counter() - start)
    return results, seconds


def pct(seconds: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(seconds), q))


# -- data ----------------------------------------------------------------------------------------

@dataclass
class Data:
    fingerprints: np.ndarray    # uint64, in storage order
    batch: FingerprintedBatch   # the same rows, ready for the database
    queries: list[int]          # the first `planted` have a stored copy at every distance 0..k
    planted: int
    truth: list[set[int]]       # per query: stored positions within k (numpy brute force)
    numpy_seconds: list[float]  # per query: the time of that brute force
    duplicates: int             # stored rows within k of an earlier stored row

    def recall(self, found: list[set[str]], picks: list[int] | None = None, limit: int | None = None) -> str:
        """Found / expected neighbours of the picked queries (stored positions below ``limit`` only)."""
        picks = range(len(found)) if picks is None else picks
        expected = hit = extra = 0
        for ids, query in zip(found, picks):
            truth = {self.batch.external_ids[p] for p in self.truth[query] if limit is None or p < limit}
            expected, hit, extra = expected + len(truth), hit + len(truth & ids), extra + len(ids - truth)
        return f"{100.0 * hit / max(expected, 1):.1f}% ({hit:,}/{expected:,}, {extra} extra)"


def make_data(documents: int, queries: int, k: int, seed: int) -> Data:
    rng = np.random.default_rng(seed)
    planted = min(max(queries // 2, 1), documents // (k + 1))
    query_fps = random_u64(rng, queries)
    near = [q ^ sum(1 << int(b) for b in rng.choice(64, distance, replace=False))
            for q in query_fps[:planted].tolist() for distance in range(k + 1)]
    fps = np.concatenate([random_u64(rng, documents - len(near)), np.array(near, dtype=np.uint64)])
    fps = fps[rng.permutation(documents)]

    ids = [f"doc-{i:07d}" for i in range(documents)]
    digests = rng.bytes(16 * documents)
    batch = FingerprintedBatch(
        external_ids=ids, sketches=fps.tolist(),
        content_hashes=[digests[16 * i:16 * i + 16] for i in range(documents)],
        lengths=rng.integers(200, 5000, documents).tolist(), metadata=[{}] * documents, origins=ids)

    truth, seconds = [], []
    for q in query_fps:
        start = time.perf_counter()
        hits = np.flatnonzero(np.bitwise_count(fps ^ q) <= k)
        seconds.append(time.perf_counter() - start)
        truth.append(set(hits.tolist()))
    return Data(fps, batch, query_fps.tolist(), planted, truth, seconds, expected_duplicates(fps, truth, k))


def expected_duplicates(fps: np.ndarray, truth: list[set[int]], k: int) -> int:
    """Rows within k of an earlier row, among the planted ones (a random pair within k is ~1e-3 likely at 1M)."""
    positions = np.array(sorted(set().union(*truth)), dtype=np.int64)
    near = np.bitwise_count(fps[positions][:, None] ^ fps[positions][None, :]) <= k
    return int(np.tril(near, -1).any(axis=1).sum())


def slices(batch: FingerprintedBatch, size: int):
    for start in range(0, len(batch), size):
        part = slice(start, start + size)
        yield start, FingerprintedBatch(batch.external_ids[part], batch.sketches[part], batch.content_hashes[part],
                                        batch.lengths[part], batch.metadata[part], batch.origins[part])


# -- database ------------------------------------------------------------------------------------

def raw_copy(url: str, data: Data, blocks: int, k: int) -> float:
    """Seconds to binary-COPY the rows into an identically indexed documents table, in one transaction."""
    with simdb.Index.create(url, schema=RAW_SCHEMA, blocks=blocks, max_distance=k) as raw:
        layout, batch = raw.layout, data.batch
        columns = ["id", "external_id", "batch_id", "simhash", *layout.key_columns, "content_hash", "length",
                   "metadata", "cluster_id"]
        types = ["int8", "text", "int4", "int8", *["int8"] * len(layout.key_columns), "bytea", "int4", "jsonb", "int8"]
        with raw.database.engine.begin() as connection:
            batch_id = connection.execute(sa.text(
                "INSERT INTO batches (name, source, status, started_at, documents) "
                "VALUES ('raw', 'bench', 'complete', now(), :n) RETURNING id"), {"n": len(batch)}).scalar_one()
            stored = segments.list_segments(connection, distributed=raw.context.distributed)
            segments.ensure_segments(connection, segments.load_policy(connection), stored,
                                     1, len(batch))  # the segments the rows' ids go to
            start = time.perf_counter()
            keys = layout.block_keys_array(data.fingerprints).tolist()
            signed = to_signed_array(data.fingerprints).tolist()
            copy_in(connection, f"documents ({', '.join(columns)})", types,
                    ((i + 1, batch.external_ids[i], batch_id, signed[i], *keys[i], batch.content_hashes[i],
                      batch.lengths[i], batch.metadata[i], i + 1) for i in range(len(batch))))
        return time.perf_counter() - start  # including the commit


def full_scan(admin: sa.Engine, queries: list[int], k: int) -> tuple[list[set[str]], list[float]]:
    sql = sa.text(f"SELECT external_id FROM {SCHEMA}.documents "
                  "WHERE bit_count((simhash # CAST(:q AS bigint))::bit(64)) <= :k")
    with admin.connect() as c:
        c.execute(sql, {"q": to_signed(queries[-1]), "k": k}).all()  # warm-up
        return timed_each(lambda q: set(c.execute(sql, {"q": to_signed(q), "k": k}).scalars()), queries)


def measure_simdb(server: Server, data: Data, args) -> dict:
    """Everything measured in PostgreSQL; the schemas are gone when it returns."""
    k, m, url, admin = args.max_distance, {}, server.url, server.admin
    try:
        server.drop_schemas(SCHEMA, RAW_SCHEMA)
        log("raw binary COPY into an indexed documents table")
        server.checkpoint()
        m["raw"] = raw_copy(url, data, args.blocks, k)
        server.drop_schemas(SCHEMA, RAW_SCHEMA)

        log("simdb ingest (add_fingerprinted)")
        server.checkpoint()
        with simdb.Index.create(url, schema=SCHEMA, blocks=args.blocks, max_distance=k) as index:
            m["layout"], m["duplicates"], start = index.layout.describe(), 0, time.perf_counter()
            for first, part in slices(data.batch, args.batch_size or len(data.batch)):
                summary = index.add_fingerprinted(part, batch=f"bench-{first}")
                m["duplicates"] += summary.exact_duplicates + summary.near_duplicates
                log(str(summary))
            m["ingest"] = time.perf_counter() - start
            with admin.connect() as c:
                c.exec_driver_sql(f"VACUUM ANALYZE {SCHEMA}.documents")
            m["version"] = server.version()
            server.checkpoint()  # the ingest's dirty pages are flushed now, not during the timed queries

            queries = data.queries
            log(f"{len(queries):,} single queries")
            timed_each(index.query_fingerprint, queries[-10:])  # warm-up: pool connection, caches
            matches, m["single"] = timed_each(index.query_fingerprint, queries)
            m["single_found"] = [{match.external_id for match in found} for found in matches]

            log(f"batch query of {len(queries):,}")
            index.query_fingerprints(queries[-10:])
            start = time.perf_counter()
            matches = index.query_fingerprints(queries)
            m["batch"] = time.perf_counter() - start
            m["batch_found"] = [{match.external_id for match in found} for found in matches]

            half = min(args.scan_queries, len(queries)) // 2  # planted and random queries alike
            m["scan_picks"] = sorted({*range(half), *range(len(queries) - half, len(queries))})
            log(f"SQL full scan with bit_count, {len(m['scan_picks'])} queries")
            m["scan_found"], m["scan"] = full_scan(admin, [queries[i] for i in m["scan_picks"]], k)
    finally:
        server.drop_schemas(SCHEMA, RAW_SCHEMA)
    return m


# -- the in-memory peer --------------------------------------------------------------------------

def simhash_peer(data: Data, limit: int, k: int) -> dict:
    """Build the PyPI ``SimhashIndex`` from the first ``limit`` fingerprints (``Simhash(int)`` + ``add``) and query it."""
    from simhash import Simhash, SimhashIndex

    before, start = rss_bytes(), time.perf_counter()
    index = SimhashIndex([], k=k)
    for position, value in enumerate(data.fingerprints[:limit].tolist()):
        index.add(data.batch.external_ids[position], Simhash(value))
    build, memory = time.perf_counter() - start, rss_bytes() - before
    found, seconds = timed_each(lambda q: set(index.get_near_dups(Simhash(q))), data.queries)
    return {"documents": limit, "build": build, "memory": memory, "found": found, "seconds": seconds}


# -- report --------------------------------------------------------------------------------------

def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def table_rows(data: Data, m: dict, peer: dict, k: int) -> list[tuple[str, str, str, str]]:
    n, nq, peer_n = len(data.batch), len(data.queries), peer["documents"]
    p50, p99, scan = pct(m["single"], 50), pct(m["single"], 99), m["scan"]
    peer_p50, numpy_p50 = pct(peer["seconds"], 50), pct(data.numpy_seconds, 50)
    subset = "" if peer_n == n else f", built on {peer_n:,} of the {n:,}"
    ingest = rate(n, m["ingest"], "rows")
    batch = rate(nq, m["batch"], "queries")
    return [
        (f"ingest {n:,} rows (add_fingerprinted)", ingest,
         f"raw binary COPY into the same indexed table: {rate(n, m['raw'], 'rows')}", ratio(m["raw"] / m["ingest"])),
        ("ingest", ingest, f"PyPI simhash `SimhashIndex(k={k}).add`, in memory{subset}: "
         f"{rate(peer_n, peer['build'], 'rows')}, +{peer['memory'] / 2**20:,.0f} MB RSS",
         ratio(n / m["ingest"] / (peer_n / peer["build"]))),
        ("single query p50", ms(p50), f"SQL full scan `bit_count((simhash # q)::bit(64)) <= {k}` p50 "
         f"({len(scan)} queries): {ms(pct(scan, 50))}", ratio(pct(scan, 50) / p50)),
        ("single query p99", ms(p99), f"SQL full scan p99: {ms(pct(scan, 99))}", ratio(pct(scan, 99) / p99)),
        ("single query p50", ms(p50), f"numpy brute force (`np.bitwise_count`, {n:,} uint64) p50: {ms(numpy_p50)}",
         ratio(numpy_p50 / p50)),
        ("single query p50", ms(p50), f"PyPI simhash `get_near_dups` p50{subset}: {ms(peer_p50)}",
         ratio(peer_p50 / p50)),
        (f"batch query ({nq:,} in one call)", batch,
         f"PyPI simhash, one by one: {rate(nq, sum(peer['seconds']), 'queries')}",
         ratio(sum(peer["seconds"]) / m["batch"])),
        ("batch query", batch, f"numpy brute force, one by one: {rate(nq, sum(data.numpy_seconds), 'queries')}",
         ratio(sum(data.numpy_seconds) / m["batch"])),
        ("recall of planted neighbours: single / batch query",
         f"{data.recall(m['single_found'])} / {data.recall(m['batch_found'])}",
         f"full scan: {data.recall(m['scan_found'], m['scan_picks'])}; "
         f"PyPI simhash: {data.recall(peer['found'], limit=peer_n)}", ""),
    ]


def header_lines(data: Data, m: dict, args, embedded: bool) -> list[str]:
    n, k = len(data.batch), args.max_distance
    size = args.batch_size or n
    return [
        machine(m["version"], embedded),
        f"documents: {n:,} random 64-bit fingerprints in {-(-n // size)} batch(es) of up to {size:,}; "
        f"{len(data.queries):,} queries, {data.planted:,} of them with {k + 1} planted neighbours "
        f"(distances 0..{k}), the rest random",
        f"layout: {m['layout']}",
        f"ingest marked {m['duplicates']:,} near-duplicates (numpy expects {data.duplicates:,}); "
        f"ratio: >1 means simdb is faster; total run {time.perf_counter() - STARTED:.0f} s",
        command_line("bench_core.py"),
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", help=DATABASE_HELP)
    parser.add_argument("--documents", type=int, default=1_000_000)
    parser.add_argument("--queries", type=int, default=1000, help="half with planted neighbours, half random")
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--max-distance", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=0, help="ingest in batches of this size (default: one)")
    parser.add_argument("--scan-queries", type=int, default=10, help="queries for the SQL full scan")
    parser.add_argument("--peer-documents", type=int, default=0,
                        help="build the PyPI simhash index from only this many fingerprints (default: all)")
    parser.add_argument("--seed", type=int, default=20240601)
    parser.add_argument("--markdown", action="store_true", help="print a GitHub markdown table")
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args(argv)
    smoke(args.smoke)
    n, k = args.documents, args.max_distance

    log(f"generating {n:,} fingerprints and {args.queries:,} queries (with numpy brute-force ground truth)")
    data = make_data(n, args.queries, k, args.seed)
    gc.freeze()  # the millions of row objects above would otherwise slow every GC pass in the timed loops
    with Server(args.database_url) as server:
        m = measure_simdb(server, data, args)

    peer_n = min(args.peer_documents or n, n)
    log(f"PyPI simhash SimhashIndex(k={k}) over {peer_n:,} fingerprints")
    peer = simhash_peer(data, peer_n, k)
    log("done")
    print_table(header_lines(data, m, args, server.embedded), table_rows(data, m, peer, k), args.markdown)


if __name__ == "__main__":
    main()
