"""Where one bulk chunk's seconds go: into a kept archive against into an empty one, step by step.

Ingests ``--added`` new random fingerprints (1 % near copies) through ``Index.add_fingerprinted`` (one
bulk chunk) into the archive that ``bench_segments.py --connections ... --reuse`` kept (with ``--reuse``; without,
one bulk-loaded here and dropped at the end), and the same
number into an empty index of the same layout, in turn (empty, archive, archive, empty, ...), and
prints the seconds of each step of :func:`simdb.pg.chunks.store_chunk` (its helpers timed in place)
and of the slowest SQL statements (timed around the driver's execute, every connection, so the lookups
spread over other connections are counted there too, in parallel). The chunk's batches are removed
from the archive afterwards.

With ``--method minhash`` (threshold 0.8, 128 permutations, as ``bench_segments.py --method minhash``): random
signatures, 1 % of them copies of stored ones with 10 positions changed; with ``--reuse`` the MinHash archive
kept in ``simdb_profile_chunk_kept_ARCHIVE_minhash``, bulk-loaded there and kept by the first such run.
``--cprofile N`` adds the N functions of most own time in the archive's chunks (``cProfile``).

    .venv/bin/python scripts/profile_chunk.py --archive 3000000 --added 100000 --rounds 2 --reuse \\
        --database-url postgresql://postgres@127.0.0.1:5541/postgres
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import cProfile
import io
import os
import pstats
import re
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import DATABASE_HELP, SMOKE_HELP, Server, bulk_load, load_average, log, smoke  # noqa: E402
from bench_segments import (batch_of, drop_empty_segments, kept_fingerprints, minhash_batch,  # noqa: E402
                            new_fingerprints, remove_added_batches)

import bench_segments  # noqa: E402
import simdb  # noqa: E402
from simdb import decisions  # noqa: E402
from simdb.methods.base import Method  # noqa: E402
from simdb.methods.simhash.blocks import DEFAULT_MAX_DISTANCE, BlockLayout  # noqa: E402
from simdb.pg import chunks, in_memory, segments  # noqa: E402
from simdb.pg.copy import copy_out  # noqa: E402

STEPS = ("lock", "check_layout", "record_segmenter", "open_batch", "place_chunk", "create_staging", "_stored_ids",
         "segment_pairs", "decide_chunk", "merge_clusters", "copy_in", "chunk_or_stored", "index_bare",
         "attach_indexed", "merge_cluster_rows", "seal", "count_chunk", "refresh_statistics")
#: Helpers inside the steps, timed in place as well (their seconds are part of the step that calls them):
#: (module or class, function name, whether it returns a generator)
INNER = ((segments, "spread_lookups", False), (in_memory, "_read", False),
         (in_memory, "key_matches", True), (in_memory, "_verified", False), (Method, "pairs_within", False),
         (decisions, "distinct", False))
#: MinHash as bench_segments.py --method minhash measures it
MINHASH = {"method": "minhash", "threshold": 0.8, "num_perm": 128}
#: Stored signatures read back from a kept MinHash archive, to copy from
KEPT_SIGNATURES = 200_000

steps: collections.Counter = collections.Counter()
statements: collections.Counter = collections.Counter()
local = threading.local()


outermost: collections.Counter = collections.Counter()  # the steps' seconds less those inside another step


def timed(name, function, generator: bool = False):
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        depth = getattr(local, "depth", 0)
        local.depth = depth + 1
        try:
            result = function(*args, **kwargs)
            if generator or name == "segment_pairs":  # a generator: its time is its consumption's
                result = list(result)
            return result
        finally:
            local.depth = depth
            seconds = time.perf_counter() - start
            steps[name] += seconds
            # chunk_or_stored also runs inside decide_chunk: counted once in "the rest"; a helper connection's
            # thread (spread reads and lookups) runs inside segment_pairs
            if depth == 0 and threading.current_thread() is threading.main_thread():
                outermost[name] += seconds
    return wrapper


def shape(statement: str) -> str:
    text = re.sub(r"\s+", " ", statement)
    text = re.sub(r"\b\d+\b", "N", text)
    text = re.sub(r'"documents_N\w*"|documents_N\w*', "SEG", text)
    return text[:110]


def before(conn, cursor, statement, parameters, context, executemany):
    conn.info.setdefault("started", []).append(time.perf_counter())


def after(conn, cursor, statement, parameters, context, executemany):
    statements[shape(statement)] += time.perf_counter() - conn.info["started"].pop()


def archive_for(server: Server, archive: int, max_distance: int, rng: np.random.Generator, reuse: bool,
                minhash: bool = False) -> tuple[str, np.ndarray, bool]:
    """(schema, its fingerprints, made here): with ``reuse``, the archive ``bench_segments.py --reuse`` kept (an
    error where none is), else one bulk-loaded into a schema of this process's (for the caller to drop): never
    another run's archive unasked, which a concurrent ``bench_segments.py --reuse`` may be checking or dropping.
    ``minhash``: see :func:`minhash_archive`."""
    if minhash:
        return minhash_archive(server, archive, rng, reuse)
    kept = f"simdb_bench_segments_kept_{archive}_k{max_distance}"
    if reuse:
        with server.admin.connect() as c:
            if c.exec_driver_sql(f"SELECT to_regclass('{kept}.batches')").scalar() is None:
                raise SystemExit(f"no archive of {archive:,} kept in {kept}: run bench_segments.py --connections ... "
                                 "--reuse first, or leave out --reuse to bulk-load one here")
        bench_segments.SCHEMA = kept
        drop_empty_segments(server)
        return kept, kept_fingerprints(server), False
    bench_segments.SCHEMA = f"simdb_profile_archive_{os.getpid()}"
    log(f"bulk-loading an archive of {archive:,} into {bench_segments.SCHEMA} (--reuse takes a kept one)")
    layout = BlockLayout.for_size(max_distance, archive)
    return bench_segments.SCHEMA, bulk_load(server.url, server.admin, bench_segments.SCHEMA, layout, archive, rng,
                                            max_distance)[0], True


@contextlib.contextmanager
def archive_in_use(server: Server, args, rng: np.random.Generator) -> Iterator[tuple[str, np.ndarray]]:
    """(schema, its fingerprints) of :func:`archive_for` (``args.archive``, ``args.max_distance``, ``args.reuse``)
    for the ``with`` block; an archive made here is dropped after it, a kept one left as it is."""
    schema, stored, made = archive_for(server, args.archive, args.max_distance, rng, args.reuse)
    try:
        yield schema, stored
    finally:
        if made:
            server.drop_schemas(schema)


def minhash_archive(server: Server, archive: int, rng: np.random.Generator, reuse: bool
                    ) -> tuple[str, np.ndarray, bool]:
    """(schema, its first stored signatures, made here) of a MinHash archive: with ``reuse``, the one kept in
    ``simdb_profile_chunk_kept_ARCHIVE_minhash`` when it holds the archive's batch alone (else bulk-loaded there and
    kept); without, one bulk-loaded into a schema of this process's, for the caller to drop."""
    if not reuse:
        bench_segments.SCHEMA = f"simdb_profile_archive_{os.getpid()}"
        log(f"bulk-loading a MinHash archive of {archive:,} into {bench_segments.SCHEMA}")
        return bench_segments.SCHEMA, bulk_load(server.url, server.admin, bench_segments.SCHEMA, None, archive, rng,
                                                options=MINHASH)[0], True
    kept = bench_segments.SCHEMA = f"simdb_profile_chunk_kept_{archive}_minhash"
    with server.admin.connect() as c:
        found = c.exec_driver_sql(f"SELECT to_regclass('{kept}.batches')").scalar() is not None
    if found:
        remove_added_batches(server)  # an interrupted run's
        with server.admin.connect() as c:
            batches = [tuple(row) for row in c.exec_driver_sql(f"SELECT name, documents FROM {kept}.batches")]
        found = batches == [("archive", archive)]
    if not found:
        server.drop_schemas(kept)
        log(f"bulk-loading a MinHash archive of {archive:,} into {kept}, kept for the next run (--reuse)")
        bulk_load(server.url, server.admin, kept, None, archive, rng, options=MINHASH)
    else:
        log(f"reusing the MinHash archive of {archive:,} kept in {kept}")
    with server.admin.connect() as c:
        rows = np.concatenate([part["value0"] for part in copy_out(
            c, f"SELECT signature FROM {kept}.{segments.segment_name(1)} ORDER BY id LIMIT {KEPT_SIGNATURES}",
            [4 * MINHASH["num_perm"]])])
    return kept, np.frombuffer(rows.tobytes(), dtype="<u4").reshape(len(rows), MINHASH["num_perm"]), False


def reuse_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--reuse", action="store_true",
                        help="profile the archive bench_segments.py --reuse kept (else bulk-load one, dropped at the end)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", help=DATABASE_HELP)
    parser.add_argument("--archive", type=int, default=3_000_000)
    parser.add_argument("--added", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--connections", type=int, default=None)
    parser.add_argument("--max-distance", type=int, default=DEFAULT_MAX_DISTANCE)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--top", type=int, default=14)
    parser.add_argument("--method", choices=["simhash", "minhash"], default="simhash",
                        help="minhash: threshold 0.8, 128 permutations (as bench_segments.py --method minhash)")
    parser.add_argument("--cprofile", type=int, metavar="N", default=0,
                        help="also the N functions of most own time in the archive's chunks (cProfile)")
    parser.add_argument("--rows-per-probe", type=float, metavar="R",
                        help=f"read a segment into memory when it holds at most R documents per probe (default "
                             f"{in_memory.ROWS_PER_PROBE}; 0: look every segment up by index)")
    reuse_option(parser)
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args()
    smoke(args.smoke)
    if args.rows_per_probe is not None:
        in_memory.ROWS_PER_PROBE = args.rows_per_probe
    empty = f"simdb_profile_chunk_empty_{os.getpid()}"
    minhash = args.method == "minhash"
    layout = BlockLayout.for_size(args.max_distance, args.archive)
    for name in STEPS:
        setattr(chunks, name, timed(name, getattr(chunks, name)))
    for owner, name, generator in INNER:
        if hasattr(owner, name):  # (a tree before or after a change may lack one)
            setattr(owner, name, timed(name, getattr(owner, name), generator))
    profiler = cProfile.Profile() if args.cprofile else None
    sa.event.listen(sa.engine.Engine, "before_cursor_execute", before)
    sa.event.listen(sa.engine.Engine, "after_cursor_execute", after)
    rng = np.random.default_rng(args.seed)
    results = []
    with Server(args.database_url) as server:
        kept, stored, made = archive_for(server, args.archive, args.max_distance, rng, args.reuse, minhash)
        try:
            for round_ in range(args.rounds):
                for target in (("empty", "archive") if round_ % 2 == 0 else ("archive", "empty")):
                    schema = kept if target == "archive" else empty
                    if target == "empty":
                        server.drop_schemas(empty)
                        simdb.Index.create(server.url, schema=empty, **(MINHASH if minhash else {
                            "blocks": layout.blocks, "max_distance": args.max_distance})).close()
                    if minhash:
                        batch = minhash_batch(rng, args.added, stored if target == "archive" else None,
                                              f"profile{round_}{target}")
                    else:
                        fps = new_fingerprints(rng, args.added,
                                               stored if target == "archive" else np.empty(0, np.uint64))
                        batch = batch_of(rng, fps, f"profile{round_}{target}")
                    server.checkpoint()
                    steps.clear()
                    outermost.clear()
                    statements.clear()
                    load = load_average()
                    with simdb.Index.open(server.url, schema=schema) as index:
                        if profiler is not None and target == "archive":
                            profiler.enable()
                        try:
                            summary = index.add_fingerprinted(batch, batch=f"profile{round_}{target}",
                                                              connections=args.connections)
                        finally:
                            if profiler is not None:
                                profiler.disable()
                    results.append((target, load, summary.seconds, dict(steps), dict(statements),
                                    sum(outermost.values())))
                    log(f"{target} (load {load}): {summary.seconds:.2f} s")
        finally:
            server.drop_schemas(empty)
            if made:
                server.drop_schemas(kept)
            else:  # archive_for set bench_segments.SCHEMA to the kept archive
                remove_added_batches(server)
    print("\n| step | " + " | ".join(f"{t} ({load.split()[0]})" for t, load, *_ in results) + " |")
    print("|---|" + "---:|" * len(results))
    print("| whole chunk (add_fingerprinted) | " + " | ".join(f"{r[2]:.2f}" for r in results) + " |")
    for name in STEPS:
        print(f"| {name} | " + " | ".join(f"{r[3].get(name, 0):.2f}" for r in results) + " |")
    for _, name, _ in INNER:
        print(f"| (inside) {name} | " + " | ".join(f"{r[3].get(name, 0):.2f}" for r in results) + " |")
    print("| the rest (Python between the steps, COPY into staging) | "
          + " | ".join(f"{r[2] - r[5]:.2f}" for r in results) + " |")
    tops = collections.Counter()
    for r in results:
        tops.update(r[4])
    print("\n| statement (all connections) | " + " | ".join(t for t, *_ in results) + " |")
    print("|---|" + "---:|" * len(results))
    for text, _ in tops.most_common(args.top):
        print(f"| `{text}` | " + " | ".join(f"{r[4].get(text, 0):.2f}" for r in results) + " |")
    if profiler is not None:
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(args.cprofile)
        print("\ncProfile of the archive's chunks, by own time:\n```\n" + out.getvalue().strip() + "\n```")


if __name__ == "__main__":
    main()
