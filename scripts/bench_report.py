"""Time ``simdb report`` on an archive of a million documents: the page, its clusters CSV, and each read.

The archive is bench_sql.py's: the quickstart corpus (real text, kept) in batch ``archive``, then 1M
synthetic documents whose fingerprints are random with near-duplicate clusters planted (about 10% are
copies, up to 3 bits from their original), ingested through the real archive path in chunks, the last
100k as batch ``new``; metadata carries a ``source`` (7 values). The report is written with
``--by source`` and ``--clusters-csv``, for the whole archive and for batch ``new``; each of its reads
is timed alone too (median of 3 after one warm-up). It works in its own schema, dropped at the end
unless ``--keep`` (a later run with ``--keep`` reuses it).

    .venv/bin/python scripts/bench_report.py --markdown
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import time

import sqlalchemy as sa

from bench_common import DATABASE_HELP, Server, log
from bench_sql import batch_of, synthetic_fingerprints

from simdb import Index
from simdb.pg import reads
from simdb.report import (BY_VALUES, CSV_TEXT_CHARS, LARGEST_CLUSTERS, MEMBERS_SHOWN, PAIRS_SHOWN, SAMPLE_SIZE,
                          SAMPLE_TEXT_CHARS, TEXT_CHARS, build_report)
from simdb.samples import corpus

SCHEMA = "simdb_bench_report"


def build(url: str, documents: int, chunk: int) -> None:
    with Index.create(url, schema=SCHEMA, store_text=True) as index:
        index.add_many(corpus(), batch="archive")
        fingerprints = synthetic_fingerprints(documents)
        for start in range(0, documents, chunk):
            size = min(chunk, documents - start)
            name = "new" if start + size >= documents else f"synthetic-{start // chunk:03d}"
            log(str(index.add_fingerprinted(batch_of(fingerprints[start:start + size], start), batch=name)))


def median_seconds(call, runs: int = 3) -> float:
    call()
    seconds = []
    for _ in range(runs):
        start = time.perf_counter()
        call()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", help=DATABASE_HELP)
    parser.add_argument("--documents", type=int, default=1_000_000)
    parser.add_argument("--chunk", type=int, default=100_000)
    parser.add_argument("--keep", action="store_true", help="keep the archive (and reuse a kept one)")
    parser.add_argument("--runs", type=int, default=3,
                        help="timed runs of each read, after one warm-up (default 3; the tests' run takes 1)")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error(f"--runs {args.runs}: give 1 or more")
    server = Server(args.database_url)
    rows = []
    try:
        with server.admin.connect() as connection:
            kept = connection.execute(sa.text("SELECT to_regclass(:t)"), {"t": f"{SCHEMA}.settings"}).scalar()
        if kept is None or not args.keep:
            server.drop_schemas(SCHEMA)
            build(server.url, args.documents, args.chunk)
        with server.admin.connect() as connection:
            connection.exec_driver_sql(f"VACUUM ANALYZE {SCHEMA}.documents")
            connection.exec_driver_sql(f"VACUUM ANALYZE {SCHEMA}.near_duplicates")
        with Index.open(server.url, schema=SCHEMA) as index:
            method = index.settings.method
            with index.database.engine.connect() as connection:
                total = reads.document_count(connection)
                new = reads.batch_id(connection, "new")
            for batch in (None, "new"):
                clusters = io.BytesIO()
                start = time.perf_counter()
                page = build_report(index, batch, by="source", clusters_csv=clusters, clusters_link="clusters.csv")
                rows.append((f"the page and its clusters CSV{' (--batch new)' if batch else ''}",
                             f"{len(page) / 1024:,.0f} KB + {len(clusters.getvalue()) / 2**20:,.1f} MiB",
                             time.perf_counter() - start))
                log(f"{rows[-1][2]:7.2f} s  {rows[-1][0]}")
            start = time.perf_counter()
            rows.append(("the page alone", f"{len(build_report(index, by='source')) / 1024:,.0f} KB",
                         time.perf_counter() - start))
            timed = {
                "report_data: everything the page reads": lambda c: reads.report_data(
                    c, index.context, None, sample_size=SAMPLE_SIZE, clusters=LARGEST_CLUSTERS, members=MEMBERS_SHOWN,
                    pairs=PAIRS_SHOWN, text_chars=TEXT_CHARS, sample_chars=SAMPLE_TEXT_CHARS, by="source",
                    by_values=BY_VALUES),
                "duplicates by source": lambda c: reads.metadata_breakdown(c, "source", None, BY_VALUES),
                "duplicates by source, batch new": lambda c: reads.metadata_breakdown(c, "source", new, BY_VALUES),
                "where each batch's duplicates come from": reads.batch_sources,
                "stored pairs by distance": lambda c: reads.pair_distances(c, None),
                "pairs whose texts differ": lambda c: reads.differing_pairs(c, None, PAIRS_SHOWN, TEXT_CHARS),
                "every cluster member (the CSV)": lambda c: sum(len(chunk) for chunk in reads.cluster_members_csv(
                    c, method, None, CSV_TEXT_CHARS)),
            }
            for title, read in timed.items():
                def call(read=read):
                    with index.database.engine.begin() as connection:
                        reads.read_only_snapshot(connection)
                        return read(connection)
                rows.append((title, "", median_seconds(call, args.runs)))
                log(f"{rows[-1][2]:7.2f} s  {title}")
    finally:
        if not args.keep:
            server.drop_schemas(SCHEMA)
        server.close()
    print(f"{total:,} documents; each read the median of {args.runs} runs after one warm-up; "
          f"command: .venv/bin/python scripts/bench_report.py {' '.join(sys.argv[1:])}\n")
    if args.markdown:
        print("| what | size | s |\n|---|---:|---:|")
        for title, size, seconds in rows:
            print(f"| {title} | {size} | {seconds:,.2f} |")
    else:
        for title, size, seconds in rows:
            print(f"{seconds:8.2f} s  {size:>24}  {title}")


if __name__ == "__main__":
    main()
