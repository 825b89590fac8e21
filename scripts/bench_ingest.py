"""Benchmark simdb's ingest path against its peers, side by side in one run.

It measures, on this machine, in one run:

* fingerprinting with jieba on real Chinese text (``--zh``, default the devset's
  ``long-zh.jsonl``, repeated so that each measurement lasts ``--min-seconds``):
  ``simdb.parallel.fingerprint_stream`` on one worker and on all cores, beside plain
  ``jieba.lcut(text, HMM=False)`` on one core and on all cores (a warm ``spawn`` pool,
  jieba loaded once per worker), in docs/s and MB/s (UTF-8); and the target
  0.8 x (single-core jieba x cores);
* the archive path without tokenization: precomputed random fingerprints (1 % of them
  near copies of stored ones) through ``Index.add_fingerprinted``, one transaction per
  chunk: ``--documents`` (1M) into an empty archive, and ``--added`` (100k) into an
  archive of ``--archive`` (10M) rows. The big archive is built as one segment by a
  binary ``COPY ... FREEZE`` into the bare segment table, indexed from simdb's own
  definitions, attached, and ``VACUUM ANALYZE``d (``bench_common.bulk_load``); its
  layout is ``BlockLayout.for_size(k, archive)`` (k = 4, simdb's default: 6 blocks at 10M;
  ``--max-distance 3``: 5 blocks), and the smallest layout for k (``BlockLayout(max_distance=k)``)
  is measured the same way unless ``--no-default-layout``;
* the naive path: ``--naive`` documents, each with one SELECT on the block keys,
  popcount in Python and one INSERT through SQLAlchemy Core, one commit per document,
  into the same big archive;
* the PyPI ``simhash`` package's in-memory ``SimhashIndex(k)``: insert and query
  rates and RSS growth for ``--peer-documents`` (1M) ``Simhash(int)`` objects;
* end to end: the ``simdb ingest`` CLI in a subprocess (``--workers`` = all cores) on
  ``--text-documents`` (100k) documents of real text (devset sentences recombined,
  2 % near copies) into an empty archive; and its peak memory on ``--memory-documents``
  (200k and 1M) short documents, sampled with psutil while it runs (the CLI process, each
  fingerprint worker, and the sum over the process tree).

Each part lives in a module of its own, which also runs it alone, with the same options:
``bench_ingest_fingerprint.py`` (fingerprinting), ``bench_ingest_archive.py`` (the archive
path, the naive path, the PyPI peer) and ``bench_ingest_cli.py`` (end to end); this script runs
them side by side and prints one table. The inputs they share are in ``bench_corpus.py``, the
sampling of the CLI's process tree in ``bench_process.py``.

The script only prints (progress on stderr, the table on stdout) and asserts nothing
about timings. It works in its own schemas (``simdb_bench_ingest_<pid>_*``: a run of one of its parts
at the same time does not collide), dropped at the start and at the end, and in a temporary directory
removed at the end.

Run (about 25 minutes at 10M on 2 cores; ``--archive 1000000 --quick`` takes a few)::

    .venv/bin/python scripts/bench_ingest.py --markdown

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
from pathlib import Path

import numpy as np

from bench_common import DATABASE_HELP, SMOKE_HELP, Server, load_average, log, mb, print_table, rate, ratio, smoke
from bench_corpus import NEAR_FRACTION
from bench_ingest_archive import Archive, EmptyArchive, PeerIndex, ingest_empty, measure_archive, simhash_peer
from bench_ingest_cli import CliIngest, CliRuns, measure_cli
from bench_ingest_fingerprint import Fingerprinting, fingerprint_rows, header_line, load_texts, measure_fingerprinting
from bench_process import SAMPLING, quarters

import simdb
from simdb.ingest import DEFAULT_CHUNK_SIZE
from simdb.methods.simhash.blocks import DEFAULT_MAX_DISTANCE
from simdb.parallel import default_workers

PREFIX = f"simdb_bench_ingest_{os.getpid()}"  # two runs at once (bench_ingest and a part of it) do not collide
SCHEMAS = {name: f"{PREFIX}_{name}" for name in ("empty", "archive", "archive_default", "text", "small", "large")}
REPO = Path(__file__).resolve().parent.parent
DEFAULT_ZH = Path(os.environ.get("SIMDB_DEVSET", REPO.parent / "shared" / "devset")) / "docs" / "long-zh.jsonl"
SETTINGS = ("server_version", "shared_buffers", "max_wal_size", "checkpoint_timeout", "synchronous_commit",
            "autovacuum")
#: the parts of the run, each measured by one of the bench_ingest_* modules
PARTS = ("fingerprint", "empty", "archive", "peer", "cli")
STARTED_AT = time.perf_counter()


def docs_and_mb(documents: int, size: int, seconds: float) -> str:
    return f"{documents / seconds:,.0f} docs/s, {size / seconds / 1e6:.2f} MB/s"


def drop_schemas(admin) -> None:
    with admin.connect() as c:
        for schema in SCHEMAS.values():
            c.exec_driver_sql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


# -- report --------------------------------------------------------------------------------------

def table_rows(f: Fingerprinting | None, e: EmptyArchive | None, a: Archive | None, peer: PeerIndex | None,
               c: CliRuns | None, args) -> list[tuple[str, str, str, str]]:
    k = args.max_distance
    rows = fingerprint_rows(f) if f else []
    big = a.sized if a else None
    if e:
        simdb_rate = e.documents / e.seconds
        chunks = e.chunk_rates
        rows.append((f"archive path: {e.documents:,} docs into an empty archive "
                     f"({len(chunks)} x `add_fingerprinted` of {args.chunk:,}; {e.layout.blocks} blocks)",
                     f"{simdb_rate:,.0f} docs/s (first chunk {chunks[0]:,.0f}, last {chunks[-1]:,.0f})",
                     f"PyPI simhash `SimhashIndex(k={k}).add`, in memory, {peer.documents:,}: "
                     f"{rate(peer.documents, peer.build, 'inserts')}, +{mb(peer.memory)} RSS"
                     if peer else "", ratio(simdb_rate / (peer.documents / peer.build)) if peer else ""))
    if big:
        simdb_rate = big.documents / big.seconds
        rows.append((f"archive path: {big.documents:,} docs into an archive of {args.archive:,} "
                     f"({big.layout.blocks} blocks, one `add_fingerprinted`)", f"{simdb_rate:,.0f} docs/s",
                     "target 30,000 docs/s", ratio(simdb_rate / 30_000)))
        if a.naive:
            naive = a.naive
            rows.append((f"the same, naive: per doc one SELECT on the {len(big.layout.key_columns)} keys, "
                         "popcount in Python, one INSERT (SQLAlchemy Core, commit per doc)",
                         f"{simdb_rate:,.0f} docs/s",
                         f"naive, {naive.documents:,} docs into the same archive: "
                         f"{rate(naive.documents, naive.seconds, 'docs')} (100k would take "
                         f"{100_000 * naive.seconds / naive.documents / 60:,.0f} min); target 20x",
                         ratio(simdb_rate / (naive.documents / naive.seconds))))
        default = a.default
        if default:
            default_rate = default.documents / default.seconds
            rows.append((f"archive path: {default.documents:,} docs into {args.archive:,}, default "
                         f"{default.layout.blocks}-block layout", f"{default_rate:,.0f} docs/s",
                         f"{big.layout.blocks}-block layout (above): {simdb_rate:,.0f} docs/s",
                         ratio(default_rate / simdb_rate)))
        if peer:
            rows.append((f"per-document near-duplicate lookup (simdb: lookup + insert, at {args.archive:,})",
                         f"{simdb_rate:,.0f} docs/s",
                         f"PyPI simhash `get_near_dups`, {peer.documents:,} in memory: "
                         f"{rate(peer.queries, peer.query_seconds, 'queries')}, p50 {peer.p50 * 1e3:.2f} ms",
                         ratio(simdb_rate / (peer.queries / peer.query_seconds))))
    elif peer:
        rows.append(("PyPI simhash `SimhashIndex` queries", "",
                     f"`get_near_dups`: {rate(peer.queries, peer.query_seconds, 'queries')}", ""))
    if c and c.text:
        t = c.text
        peer_text = ""
        value = ""
        if f:
            jieba_all = f.jieba_all
            peer_text = (f"plain `jieba.lcut` on {f.workers} cores (warm pool, devset docs): "
                         f"{jieba_all.docs_and_mb()}")
            value = ratio(t.bytes / t.run.seconds / (jieba_all.bytes / jieba_all.seconds))
        rows.append((f"end to end: `simdb ingest --workers {args.workers}`, {t.documents:,} real zh docs "
                     f"({t.bytes / t.documents / 1e3:.1f} KB avg) into an empty archive",
                     f"{docs_and_mb(t.documents, t.bytes, t.run.seconds)} (CPU: CLI process "
                     f"{t.run.cpu_main:.0f} s, workers {t.run.cpu_children:.0f} s, in {t.run.seconds:.0f} s)",
                     peer_text, value))
    if c and c.large:
        small, large = c.small, c.large

        def cell(ingest: CliIngest) -> str:
            run = ingest.run
            pairs = f", {ingest.pairs:,} pairs" if ingest.pairs is not None else ""
            return (f"{ingest.documents:,} short docs ({ingest.duplicates:,} duplicates{pairs}): CLI "
                    f"{mb(run.main)} (by quarter of the run: {quarters(run)}), largest worker {mb(run.worker)}, "
                    f"tree {mb(run.tree)}; {rate(ingest.documents, run.seconds, 'docs')}")

        rows.append(("peak RSS of `simdb ingest` (CLI process; its fingerprint workers; sum over the tree)",
                     cell(large), cell(small), f"{large.run.main / small.run.main:.2f}x"))
        if peer:
            rows.append(("memory: `simdb ingest` process against an in-memory index",
                         f"{mb(large.run.main)} peak for {large.documents:,} docs",
                         f"PyPI simhash, {peer.documents:,} fingerprints: +{mb(peer.memory)} RSS",
                         ratio(peer.memory / large.run.main)))
    return rows


def header_lines(f: Fingerprinting | None, e: EmptyArchive | None, a: Archive | None, peer: PeerIndex | None,
                 c: CliRuns | None, args, server: dict, embedded: bool, load_start: str, zh_note: str) -> list[str]:
    k = args.max_distance
    memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30
    settings = ", ".join(f"{name} {value}" for name, value in server.items() if name != "server_version")
    lines = [
        f"machine: {os.cpu_count()} cores, {memory:.0f} GiB; PostgreSQL {server['server_version']}"
        f"{' (embedded)' if embedded else ''} ({settings}); simdb {simdb.__version__} "
        f"({os.path.dirname(simdb.__file__)}); Python {sys.version.split()[0]}; "
        f"load average at start {load_start}, at end {load_average()}",
    ]
    lines.append(header_line(f, zh_note) if f else f"fingerprinting: skipped ({zh_note})")
    if e or a:
        lines.append(f"archive path (no tokenization): random 64-bit fingerprints, {NEAR_FRACTION:.0%} of each batch "
                     f"near copies (1..{k} bits) of stored ones, each batch one `Index.add_fingerprinted` call "
                     "(one transaction: staging COPY, key joins, popcount, INSERT ... SELECT)")
    if e:
        lines.append(f"empty archive: layout {e.layout.describe()} (BlockLayout.for_size({k}, {args.documents:,})); "
                     f"marked {e.duplicates:,} duplicates, planted {e.planted:,}")
    if a:
        for r in (a.sized, a.default):
            if r:
                b = r.build
                lines.append(
                    f"archive of {args.archive:,} ({r.layout.describe()}): built as one segment by binary COPY FREEZE "
                    f"into the bare segment table ({b['copy']:.0f} s), simdb's own indexes and constraints from their "
                    f"definitions and ATTACH ({b['indexes']:.0f} s), VACUUM ANALYZE "
                    f"({b['vacuum']:.0f} s): {mb(b['bytes'])}; then CHECKPOINT; the {r.documents:,} marked "
                    f"{r.duplicates:,} duplicates (planted {r.planted:,}); WAL meanwhile (whole server) "
                    f"{mb(r.wal_bytes)}, {r.wal_full_pages:,} full-page images; slowest statements: "
                    + "; ".join(f"{s.seconds:.1f} s `{s.sql[:40]}`" for s in r.statements[:2])
                    + f" (SQL statements {r.sql_seconds:.1f} s of {r.seconds:.1f} s; COPYs and Python the rest)")
    if peer:
        lines.append(f"PyPI simhash: {peer.documents:,} random fingerprints as `Simhash(int)`; "
                     f"{peer.queries:,} queries, half near copies ({peer.found:,} found something)")
    if c:
        what = "real text" if c.text else "no real text"
        lines.append(f"end to end: the `simdb ingest` CLI in a subprocess, `--workers {args.workers} --chunk-size "
                     f"{args.cli_chunk_size:,}`, into a new empty archive (default 4 blocks), timed from start to exit "
                     f"(imports, jieba load, connection included); {what}: documents composed of random sentences "
                     "of the devset texts (lengths as in the devset; short docs 60-200 characters), 2 % of them "
                     "copies with 1-3 characters changed")
        lines.append(f"peak RSS: {SAMPLING}; PostgreSQL's own memory not counted; "
                     "ratio = larger input / smaller input (1.00x = flat)")
    lines.append("ratio: >1 means simdb is faster (or, for targets, meets it); "
                 f"total run {time.perf_counter() - STARTED_AT:.0f} s")
    lines.append("command: " + " ".join([".venv/bin/python", f"scripts/{Path(sys.argv[0]).name}", *sys.argv[1:]]))
    return lines


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", help=DATABASE_HELP)
    parser.add_argument("--zh", type=Path, default=DEFAULT_ZH, help="JSONL of real Chinese text ({id, text} lines)")
    parser.add_argument("--workers", type=int, default=default_workers(), help="cores to use (default: all)")
    parser.add_argument("--min-seconds", type=float, help="per fingerprinting measurement (default 10; quick 3)")
    parser.add_argument("--documents", type=int, help="into the empty archive (default 1,000,000; quick 200,000)")
    parser.add_argument("--chunk", type=int, default=DEFAULT_CHUNK_SIZE, help="documents per add_fingerprinted call")
    parser.add_argument("--archive", type=int, help="rows of the big archive (default 10,000,000)")
    parser.add_argument("--added", type=int, default=100_000, help="documents ingested into the big archive")
    parser.add_argument("--naive", type=int, help="documents through the naive path (default 5,000; quick 1,000)")
    parser.add_argument("--default-layout", action=argparse.BooleanOptionalAction, default=True,
                        help="also measure the big archive in the smallest layout for k (k + 1 blocks)")
    parser.add_argument("--peer-documents", type=int, help="PyPI simhash index size (default 1,000,000; quick 200,000)")
    parser.add_argument("--text-documents", type=int,
                        help="real-text documents for the end-to-end CLI run (default 100,000; quick 5,000)")
    parser.add_argument("--memory-documents", help="two sizes of short-document inputs for peak memory "
                        "(default 200000,1000000; quick 20000,100000)")
    parser.add_argument("--cli-chunk-size", type=int, help=f"--chunk-size of the CLI runs (default simdb's "
                        f"{DEFAULT_CHUNK_SIZE:,}; quick 10,000)")
    parser.add_argument("--skip", default="", help=f"comma-separated parts to leave out: {','.join(PARTS)}")
    parser.add_argument("--quick", action="store_true", help="smaller defaults: a few minutes with --archive 1000000")
    parser.add_argument("--max-distance", type=int, default=DEFAULT_MAX_DISTANCE,
                        help="k of every index measured (default: simdb's)")
    parser.add_argument("--seed", type=int, default=20240601)
    parser.add_argument("--markdown", action="store_true", help="print a GitHub markdown table")
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args(argv)
    smoke(args.smoke)
    defaults = {"min_seconds": (10.0, 3.0), "documents": (1_000_000, 200_000), "archive": (10_000_000, 10_000_000),
                "naive": (5_000, 1_000), "peer_documents": (1_000_000, 200_000), "text_documents": (100_000, 5_000),
                "memory_documents": ("200000,1000000", "20000,100000"),
                "cli_chunk_size": (DEFAULT_CHUNK_SIZE, 10_000)}
    for name, (full, quick) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    args.memory_documents = [int(x) for x in str(args.memory_documents).split(",") if x.strip()]
    if len(args.memory_documents) not in (0, 2):
        parser.error("--memory-documents takes two sizes, like 200000,1000000 (or an empty string)")
    args.skip = {part.strip() for part in args.skip.split(",") if part.strip()}
    unknown = args.skip - set(PARTS)
    if unknown:
        parser.error(f"--skip: no part named {', '.join(sorted(unknown))}; the parts are {','.join(PARTS)}")
    return args


def main(argv: list[str] | None = None, parts: set[str] | None = None) -> None:
    """Run every part not skipped (of ``parts`` only, when a bench_ingest_* module runs its own) and print the
    table."""
    args = parse_args(argv)
    if parts is not None:
        args.skip |= set(PARTS) - parts
    load_start = load_average()
    texts, zh_note = None, f"{args.zh} is missing"
    if args.zh.is_file():
        texts, zh_note = load_texts(args.zh), f"{args.zh.name}"
    else:
        log(f"{args.zh} is missing: skipping the jieba rows and the real-text end-to-end run "
            "(the memory runs use random Han text)")
    rng = np.random.default_rng(args.seed)

    f = None
    if texts and "fingerprint" not in args.skip:
        f = measure_fingerprinting(texts, args.workers, args.min_seconds)
    peer = None
    if "peer" not in args.skip and args.peer_documents:
        log(f"PyPI simhash SimhashIndex(k={args.max_distance}) over {args.peer_documents:,} fingerprints")
        peer = simhash_peer(args.peer_documents, 1000, args.max_distance, rng)

    server = Server(args.database_url)
    url, admin = server.url, server.admin
    work = tempfile.mkdtemp(prefix="simdb-bench-ingest-")
    e = a = c = None
    try:
        with admin.connect() as connection:
            server_settings = {name: connection.exec_driver_sql(f"SHOW {name}").scalar_one() for name in SETTINGS}
        if server_settings["autovacuum"] != "on":
            log(f"note: autovacuum is {server_settings['autovacuum']} on this server")
        drop_schemas(admin)
        if "empty" not in args.skip and args.documents:
            log(f"archive path: {args.documents:,} fingerprints into an empty archive")
            e = ingest_empty(url, admin, SCHEMAS["empty"], args, rng)
        if "archive" not in args.skip and args.archive:
            a = measure_archive(url, admin, SCHEMAS, args, rng)
        if "cli" not in args.skip:
            c = measure_cli(url, admin, SCHEMAS, texts, args, work)
    finally:
        drop_schemas(admin)
        server.close()
        shutil.rmtree(work, ignore_errors=True)
    log("done")
    header = header_lines(f, e, a, peer, c, args, server_settings, server.embedded, load_start, zh_note)
    print_table(header, table_rows(f, e, a, peer, c, args), args.markdown)


if __name__ == "__main__":
    main()
