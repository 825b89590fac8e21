"""Benchmark simdb's core paths against their peers, side by side in one run.

For N random 64-bit fingerprints (default 1M) with planted neighbours, it measures:

* ingest: ``Index.add_fingerprinted`` (the real archive path: staging COPY, block-key
  join, popcount verify, INSERT ... SELECT) beside a raw binary COPY of the same rows
  into an identically indexed documents table, and beside the PyPI ``simhash``
  package's in-memory ``SimhashIndex(k=3)``;
* single query: p50/p99 of ``Index.query_fingerprint`` beside a plain SQL full scan
  (``WHERE bit_count((simhash # q)::bit(64)) <= 3``), numpy brute force
  (``np.bitwise_count`` over the uint64 array) and ``SimhashIndex.get_near_dups``;
* batch query: ``Index.query_fingerprints`` of all queries at once, in queries/s;
* recall: every planted neighbour must come back (checked against numpy brute force).

It only prints (progress to stderr, the table to stdout) and asserts nothing about
timings. It works in its own schemas (``simdb_bench``, ``simdb_bench_raw``), dropped
at the start and at the end, so it leaves no state behind.

Run::

    .venv/bin/python scripts/bench_core.py --markdown

Without ``--database-url`` it uses ``SIMDB_DATABASE_URL`` or
postgresql://postgres@127.0.0.1:5432/test, and if nothing answers there it starts an
embedded PostgreSQL (pgserver) in a temporary directory.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass

import numpy as np
import sqlalchemy as sa

import simdb
from simdb.bits import to_signed, to_signed_array
from simdb.database import postgres_url, start_embedded
from simdb.ingest import FingerprintedBatch

SCHEMA, RAW_SCHEMA = "simdb_bench", "simdb_bench_raw"
DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/test"
STARTED = time.perf_counter()


def log(message: str) -> None:
    print(f"[{time.perf_counter() - STARTED:6.1f} s] {message}", file=sys.stderr, flush=True)


# -- data ----------------------------------------------------------------------------------------

@dataclass
class Data:
    fingerprints: np.ndarray   # uint64, in storage order
    batch: FingerprintedBatch  # the same rows, ready for the database
    queries: np.ndarray        # uint64; the first `planted` have neighbours planted at distances 0..k
    planted: int
    truth: list[set[int]]      # per query: positions within distance k (numpy brute force)
    numpy_seconds: list[float]  # per query: time of that brute force
    duplicates: int            # stored rows with an earlier stored row within distance k (among planted rows)


def random_u64(rng: np.random.Generator, n: int) -> np.ndarray:
    return np.frombuffer(rng.bytes(8 * n), dtype=np.uint64).copy()


def make_data(documents: int, queries: int, k: int, seed: int) -> Data:
    """Random fingerprints plus, for half the queries, one stored copy at every distance 0..k."""
    rng = np.random.default_rng(seed)
    planted = min(max(queries // 2, 1), documents // (k + 1))
    query_fps = random_u64(rng, queries)
    near = []
    for q in query_fps[:planted].tolist():
        for distance in range(k + 1):
            mask = sum(1 << int(b) for b in rng.choice(64, distance, replace=False))
            near.append(q ^ mask)
    fps = np.concatenate([random_u64(rng, documents - len(near)), np.array(near, dtype=np.uint64)])
    fps = fps[rng.permutation(documents)]

    ids = [f"doc-{i:07d}" for i in range(documents)]
    digests = rng.bytes(16 * documents)
    batch = FingerprintedBatch(
        external_ids=ids, simhashes=fps.tolist(),
        content_hashes=[digests[16 * i:16 * i + 16] for i in range(documents)],
        lengths=rng.integers(200, 5000, documents).tolist(), metadata=[{}] * documents, origins=ids)

    truth, seconds = [], []
    for q in query_fps:
        start = time.perf_counter()
        hits = np.flatnonzero(np.bitwise_count(fps ^ q) <= k)
        seconds.append(time.perf_counter() - start)
        truth.append(set(hits.tolist()))
    return Data(fps, batch, query_fps, planted, truth, seconds, expected_duplicates(fps, truth, k))


def expected_duplicates(fps: np.ndarray, truth: list[set[int]], k: int) -> int:
    """Rows within k of an earlier row, among the planted ones (random pairs within k are ~1e-3 likely at 1M)."""
    positions = np.array(sorted(set().union(*truth)), dtype=np.int64)
    near = np.bitwise_count(fps[positions][:, None] ^ fps[positions][None, :]) <= k
    return int(np.tril(near, -1).any(axis=1).sum())


def recall(data: Data, found: list[set[str]], limit: int | None = None) -> tuple[int, int, int]:
    """(planted neighbours expected, found, unexpected results) over the given queries."""
    expected = hit = extra = 0
    for i, ids in enumerate(found):
        truth = {data.batch.external_ids[p] for p in data.truth[i] if limit is None or p < limit}
        expected += len(truth)
        hit += len(truth & ids)
        extra += len(ids - truth)
    return expected, hit, extra


# -- database ------------------------------------------------------------------------------------

def resolve_database(explicit: str | None) -> tuple[str, object | None, str | None]:
    """(url, embedded server or None, its temporary directory or None)."""
    url = explicit or os.environ.get("SIMDB_DATABASE_URL") or DEFAULT_URL
    engine = sa.create_engine(postgres_url(url), connect_args={"connect_timeout": 3})
    try:
        with engine.connect():
            return url, None, None
    except sa.exc.OperationalError:
        if explicit:
            raise
        log(f"nothing answers at {url}; starting an embedded PostgreSQL")
    finally:
        engine.dispose()
    directory = tempfile.mkdtemp(prefix="simdb-bench-")
    server = start_embedded(os.path.join(directory, "pgdata"))
    return server.get_uri(), server, directory


def drop_schemas(admin: sa.Engine) -> None:
    with admin.connect() as c:
        for schema in (SCHEMA, RAW_SCHEMA):
            c.exec_driver_sql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def checkpoint(admin: sa.Engine) -> None:
    """Flush dirty pages so one measurement does not pay for the previous one's writes."""
    try:
        with admin.connect() as c:
            c.exec_driver_sql("CHECKPOINT")
    except sa.exc.DBAPIError:
        pass  # not a superuser: measure without it


def raw_copy(url: str, data: Data, blocks: int, k: int) -> float:
    """Seconds to binary-COPY the rows into an identically indexed documents table (one transaction)."""
    with simdb.Index.create(url, schema=RAW_SCHEMA, blocks=blocks, max_distance=k) as raw:
        layout, batch = raw.layout, data.batch
        columns = ["external_id", "batch_id", "simhash", *layout.key_columns, "content_hash", "length", "metadata"]
        types = ["text", "int4", "int8", *["int8"] * len(layout.key_columns), "bytea", "int4", "jsonb"]
        with raw.database.engine.begin() as connection:
            batch_id = connection.execute(sa.text(
                "INSERT INTO batches (name, source, status, started_at, documents) "
                "VALUES ('raw', 'bench', 'complete', now(), :n) RETURNING id"), {"n": len(batch)}).scalar_one()
            start = time.perf_counter()
            keys, signed = layout.block_keys_array(data.fingerprints).tolist(), to_signed_array(data.fingerprints).tolist()
            cursor = connection.connection.dbapi_connection.cursor()
            with cursor.copy(f"COPY documents ({', '.join(columns)}) FROM STDIN (FORMAT BINARY)") as copy:
                copy.set_types(types)
                for i in range(len(batch)):
                    copy.write_row((batch.external_ids[i], batch_id, signed[i], *keys[i],
                                    batch.content_hashes[i], batch.lengths[i], batch.metadata[i]))
        return time.perf_counter() - start


def full_scan(admin: sa.Engine, queries: list[int], k: int) -> tuple[list[set[str]], list[float]]:
    sql = sa.text(f"SELECT external_id FROM {SCHEMA}.documents "
                  "WHERE bit_count((simhash # CAST(:q AS bigint))::bit(64)) <= :k")
    found, seconds = [], []
    with admin.connect() as c:
        c.execute(sql, {"q": to_signed(queries[-1]), "k": k}).all()  # warm-up
        for q in queries:
            start = time.perf_counter()
            found.append(set(c.execute(sql, {"q": to_signed(q), "k": k}).scalars()))
            seconds.append(time.perf_counter() - start)
    return found, seconds


# -- measurements --------------------------------------------------------------------------------

def timed_each(function, items) -> tuple[list, list[float]]:
    results, seconds = [], []
    for item in items:
        start = time.perf_counter()
        results.append(function(item))
        seconds.append(time.perf_counter() - start)
    return results, seconds


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def simhash_peer(data: Data, limit: int, k: int) -> dict:
    """Build the PyPI ``SimhashIndex`` from the first ``limit`` fingerprints and query it."""
    from simhash import Simhash, SimhashIndex

    before = rss_bytes()
    start = time.perf_counter()
    index = SimhashIndex([], k=k)
    for position, value in enumerate(data.fingerprints[:limit].tolist()):
        index.add(data.batch.external_ids[position], Simhash(value))
    build = time.perf_counter() - start
    memory = rss_bytes() - before
    found, seconds = timed_each(lambda q: set(index.get_near_dups(Simhash(q))), data.queries.tolist())
    return {"documents": limit, "build": build, "memory": memory, "found": found, "seconds": seconds}


def pct(seconds: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(seconds), q))


# -- report --------------------------------------------------------------------------------------

def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def rate(count: float, seconds: float, unit: str) -> str:
    return f"{count / seconds:,.0f} {unit}/s"


def ratio(x: float) -> str:
    return f"{x:,.1f}x" if x >= 10 else f"{x:.2f}x"


def print_table(header: list[str], rows: list[tuple[str, str, str, str]], markdown: bool) -> None:
    names = ("operation", "simdb", "peer", "ratio (simdb advantage)")
    if markdown:
        for line in header:
            print(f"- {line}")
        print()
        print("| " + " | ".join(names) + " |")
        print("|---|---:|---|---:|")
        for row in rows:
            print("| " + " | ".join(row) + " |")
        return
    for line in header:
        print(line)
    widths = [max(len(str(r[i])) for r in [names, *rows]) for i in range(4)]
    for row in [names, *rows]:
        print("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", help="PostgreSQL URL (default: $SIMDB_DATABASE_URL, else "
                        f"{DEFAULT_URL}, else an embedded server)")
    parser.add_argument("--documents", type=int, default=1_000_000)
    parser.add_argument("--queries", type=int, default=1000, help="half with planted neighbours, half random")
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--max-distance", type=int, default=3)
    parser.add_argument("--scan-queries", type=int, default=10, help="queries for the SQL full scan")
    parser.add_argument("--peer-documents", type=int, default=None,
                        help="build the PyPI simhash index from only this many fingerprints (default: all)")
    parser.add_argument("--seed", type=int, default=20240601)
    parser.add_argument("--markdown", action="store_true", help="print a GitHub markdown table")
    args = parser.parse_args(argv)
    k, n = args.max_distance, args.documents

    url, server, directory = resolve_database(args.database_url)
    admin = sa.create_engine(postgres_url(url), isolation_level="AUTOCOMMIT")
    index = None
    try:
        drop_schemas(admin)
        log(f"generating {n:,} fingerprints and {args.queries:,} queries (numpy brute-force ground truth)")
        data = make_data(n, args.queries, k, args.seed)

        log("raw binary COPY into an indexed documents table")
        checkpoint(admin)
        raw_seconds = raw_copy(url, data, args.blocks, k)
        drop_schemas(admin)

        log("simdb ingest (add_fingerprinted)")
        checkpoint(admin)
        index = simdb.Index.create(url, schema=SCHEMA, blocks=args.blocks, max_distance=k)
        start = time.perf_counter()
        summary = index.add_fingerprinted(data.batch, batch="bench")
        ingest_seconds = time.perf_counter() - start
        log(f"{summary}; VACUUM ANALYZE")
        with admin.connect() as c:
            c.exec_driver_sql(f"VACUUM ANALYZE {SCHEMA}.documents")
            version = c.exec_driver_sql("SHOW server_version").scalar_one()

        queries = data.queries.tolist()
        log(f"{len(queries):,} single queries")
        timed_each(index.query_fingerprint, queries[-10:])  # warm-up: pool connection, plan cache
        matches, single = timed_each(index.query_fingerprint, queries)
        single_found = [{m.external_id for m in ms_} for ms_ in matches]

        log(f"batch query of {len(queries):,}")
        index.query_fingerprints(queries[-10:])
        start = time.perf_counter()
        batch_matches = index.query_fingerprints(queries)
        batch_seconds = time.perf_counter() - start
        batch_found = [{m.external_id for m in ms_} for ms_ in batch_matches]

        scan_count = min(args.scan_queries, len(queries))
        scan_picks = sorted(set(range(scan_count // 2)) | set(range(len(queries) - (scan_count - scan_count // 2),
                                                                         len(queries))))
        log(f"SQL full scan with bit_count, {len(scan_picks)} queries")
        scan_found, scan = full_scan(admin, [queries[i] for i in scan_picks], k)
    finally:
        if index is not None:
            index.close()
        drop_schemas(admin)
        admin.dispose()
        if server is not None:
            server.cleanup()
            shutil.rmtree(directory, ignore_errors=True)

    peer_n = min(args.peer_documents or n, n)
    log(f"PyPI simhash SimhashIndex(k={k}) over {peer_n:,} fingerprints")
    peer = simhash_peer(data, peer_n, k)
    log("done")

    def recall_text(found, picks=None, limit=None) -> str:
        sub = data if picks is None else Data(data.fingerprints, data.batch, data.queries[picks], 0,
                                              [data.truth[i] for i in picks], [], 0)
        expected, hit, extra = recall(sub, found, limit)
        return f"{100.0 * hit / max(expected, 1):.1f}% ({hit:,}/{expected:,}, {extra} extra)"

    p50, p99 = pct(single, 50), pct(single, 99)
    numpy_p50, scan_p50, peer_p50 = pct(data.numpy_seconds, 50), pct(scan, 50), pct(peer["seconds"], 50)
    peer_note = "" if peer_n == n else f" (built on {peer_n:,} of the {n:,})"
    planted = data.planted
    rows = [
        (f"ingest {n:,} fingerprinted rows, one batch", rate(n, ingest_seconds, "rows"),
         f"raw binary COPY into the same indexed table: {rate(n, raw_seconds, 'rows')}",
         ratio(raw_seconds / ingest_seconds)),
        ("ingest", rate(n, ingest_seconds, "rows"),
         f"PyPI simhash SimhashIndex(k={k}).add, in memory{peer_note}: {rate(peer_n, peer['build'], 'rows')}, "
         f"+{peer['memory'] / 2**20:,.0f} MB RSS", ratio(n / ingest_seconds / (peer_n / peer["build"]))),
        ("single query p50", ms(p50), f"SQL full scan `bit_count(...) <= {k}` p50 ({len(scan)} queries): "
         f"{ms(scan_p50)}", ratio(scan_p50 / p50)),
        ("single query p99", ms(p99), f"SQL full scan p99: {ms(pct(scan, 99))}", ratio(pct(scan, 99) / p99)),
        ("single query p50", ms(p50), f"numpy brute force (np.bitwise_count over {n:,} uint64) p50: "
         f"{ms(numpy_p50)}", ratio(numpy_p50 / p50)),
        ("single query p50", ms(p50), f"PyPI simhash get_near_dups p50{peer_note}: {ms(peer_p50)}",
         ratio(peer_p50 / p50)),
        (f"batch query ({len(queries):,} fingerprints, one call)", rate(len(queries), batch_seconds, "queries"),
         f"PyPI simhash, one by one: {rate(len(queries), sum(peer['seconds']), 'queries')}",
         ratio(sum(peer["seconds"]) / batch_seconds)),
        ("batch query", rate(len(queries), batch_seconds, "queries"),
         f"numpy brute force, one by one: {rate(len(queries), sum(data.numpy_seconds), 'queries')}",
         ratio(sum(data.numpy_seconds) / batch_seconds)),
        ("recall of planted neighbours, single / batch", f"{recall_text(single_found)} / {recall_text(batch_found)}",
         f"full scan: {recall_text(scan_found, scan_picks)}; simhash: {recall_text(peer['found'], limit=peer_n)}",
         ""),
    ]
    header = [
        f"machine: {os.cpu_count()} cores, {os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE') / 2**30:.0f} GiB"
        f"; simdb {simdb.__version__} ({os.path.dirname(simdb.__file__)}); PostgreSQL {version}{' (embedded)' if server is not None else ''}; Python {sys.version.split()[0]}",
        f"documents: {n:,} random 64-bit fingerprints; {len(queries):,} queries, {planted:,} of them with "
        f"{k + 1} planted neighbours (distances 0..{k}), the rest random",
        f"layout: {index.layout.describe()}",
        f"ingest found {summary.near_duplicates + summary.exact_duplicates:,} duplicates "
        f"(numpy expects {data.duplicates:,}); ratio column: >1 means simdb is faster; total run {time.perf_counter() - STARTED:.0f} s",
        "command: " + " ".join([".venv/bin/python", "scripts/bench_core.py", *sys.argv[1:]]),
    ]
    print_table(header, rows, args.markdown)


if __name__ == "__main__":
    main()
