"""Time the SQL recipes of docs/sql.md on an archive of a million documents.

The archive: the quickstart corpus (real text, so the recipes' example ids
exist) in batch ``archive``, then 1M synthetic documents whose fingerprints
are random with near-duplicate clusters planted (about 10% of documents are
copies, up to 3 bits from their original), ingested through the real archive
path in chunks, the last 100k as batch ``new``; metadata carries a ``source``, which the index counts by
(``field_counts``; an archive kept without it gets it with ``count-by add`` when it is reused).
Each recipe is read from docs/sql.md, run once to warm up, then timed (median
of 3). It works in its own schema, dropped at the end.

    .venv/bin/python scripts/bench_sql.py --markdown
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import sqlalchemy as sa

from bench_common import DATABASE_HELP, Server, load_average, log

from simdb import Index
from simdb.ingest import FingerprintedBatch
from simdb.samples import corpus

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = "simdb_bench_sql"


def recipes() -> list[tuple[str, str]]:
    """(the sentence before it, the SQL) for every ```sql block of the recipes in docs/sql.md."""
    text = (ROOT / "docs" / "sql.md").read_text(encoding="utf-8")
    section = text[text.index("## Querying with SQL"):]
    section = section[:section.index("\n## ", 5)]
    found = []
    for match in re.finditer(r"((?:[^\n]+\n)+)\n```sql\n(.*?)```", section, flags=re.S):
        title = " ".join(match.group(1).split())
        found.append((title, match.group(2)))
    return found


#: Questions the issue timed through the views and from the tables: each view query and its peer on the tables
#: run in the same session, so that the table shows what the views cost.
PEERS = [
    ("which earlier batches batch `new` duplicated, through the view",
     "SELECT a_batch, count(*) FROM simdb.near_duplicate_pairs WHERE b_batch = 'new' GROUP BY a_batch"),
    ("the same, from the tables",
     "SELECT ab.name, count(*) FROM simdb.near_duplicates p JOIN simdb.batches nb ON nb.id = p.batch_id "
     "JOIN simdb.documents a ON a.id = p.a_id JOIN simdb.batches ab ON ab.id = a.batch_id WHERE nb.name = 'new' "
     "GROUP BY ab.name"),
    ("the similarity histogram, through the view",
     "SELECT similarity, count(*) FROM simdb.near_duplicate_pairs GROUP BY similarity ORDER BY similarity"),
    ("the distance histogram, from the table",
     "SELECT distance, count(*) FROM simdb.near_duplicates GROUP BY distance ORDER BY distance"),
    ("every pair of batch `new` from both sides, through document_neighbours",
     "SELECT count(*) FROM simdb.document_neighbours WHERE batch = 'new'"),
    # the recipes as they were before what they read was kept (migrations 0015 and 0017)
    ("the documents of batch `new` with their earlier duplicates as it was: from the documents",
     "SELECT d.external_id, o.external_id AS duplicate_of, d.duplicate_distance, ob.name AS first_seen_in "
     "FROM simdb.documents d JOIN simdb.batches b ON b.id = d.batch_id JOIN simdb.documents o ON o.id = d.duplicate_of "
     "JOIN simdb.batches ob ON ob.id = o.batch_id WHERE b.name = 'new' AND o.batch_id <> d.batch_id ORDER BY d.id"),
    ("the deduplicated count as it was: count(*) of documents",
     "SELECT d.documents, d.documents - coalesce(c.duplicates, 0) AS clusters "
     "FROM (SELECT count(*) AS documents FROM simdb.documents) d, "
     "(SELECT sum(size - 1) AS duplicates FROM simdb.clusters) c"),
    ("clusters that have spread as it was: every member compared with its canonical document",
     "SELECT canonical_id, cluster_size, min(similarity_to_canonical) AS least_similar_member "
     "FROM simdb.cluster_members GROUP BY canonical_id, cluster_size "
     "ORDER BY least_similar_member, canonical_id LIMIT 10"),
]


def synthetic_fingerprints(documents: int, seed: int = 7) -> np.ndarray:
    """Random fingerprints; about 10% are copies (0-3 bits flipped) of a random earlier one."""
    rng = np.random.default_rng(seed)
    fingerprints = np.frombuffer(rng.bytes(8 * documents), dtype=np.uint64).copy()
    for i in np.flatnonzero(rng.random(documents) < 0.1):
        if i:
            flips = rng.choice(64, int(rng.integers(0, 4)), replace=False)
            fingerprints[i] = fingerprints[rng.integers(0, i)] ^ np.uint64(sum(1 << int(b) for b in flips))
    return fingerprints


def batch_of(fingerprints: np.ndarray, start: int) -> FingerprintedBatch:
    batch = FingerprintedBatch()
    digests = np.random.default_rng(start).bytes(16 * len(fingerprints))
    for i, fp in enumerate(fingerprints.tolist()):
        batch.append(f"syn-{start + i:08d}", fp, digests[16 * i:16 * i + 16], 1000,
                     {"source": f"feed-{(start + i) % 7}:item"}, f"syn-{start + i}")
    return batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", help=DATABASE_HELP)
    parser.add_argument("--documents", type=int, default=1_000_000)
    parser.add_argument("--chunk", type=int, default=100_000)
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--schema", default=SCHEMA, help="the schema it works in (dropped at the end)")
    parser.add_argument("--keep", action="store_true", help="keep the archive (its schema) to query it")
    parser.add_argument("--reuse", action="store_true", help="time the recipes on the archive --keep kept")
    parser.add_argument("--analyze", action=argparse.BooleanOptionalAction, default=True,
                        help="VACUUM ANALYZE before timing (--no-analyze: time what ingest left)")
    args = parser.parse_args()
    load_at_start = load_average()
    schema = args.schema
    server = Server(args.database_url)
    args.database_url, admin = server.url, server.admin
    if not args.reuse:
        with admin.connect() as connection:
            connection.exec_driver_sql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    try:
        with (Index.open(args.database_url, schema=schema) if args.reuse else
              Index.create(args.database_url, schema=schema, count_by=["source"])) as index:
            if not args.reuse:
                index.add_many(corpus(), batch="archive")
            elif "source" not in index.settings.count_by:  # an archive kept before field_counts: filled here
                started = time.perf_counter()
                values = index.count_by("source")
                log(f"count-by add source: {values:,} values in {time.perf_counter() - started:.1f} s")
            fingerprints = synthetic_fingerprints(args.documents)
            for start in range(0, 0 if args.reuse else args.documents, args.chunk):
                size = min(args.chunk, args.documents - start)
                name = "new" if start + size >= args.documents else f"synthetic-{start // args.chunk:03d}"
                summary = index.add_fingerprinted(batch_of(fingerprints[start:start + size], start), batch=name)
                log(str(summary))
        with admin.connect() as connection:
            if args.analyze:
                connection.exec_driver_sql(f"VACUUM ANALYZE {schema}.documents")
                connection.exec_driver_sql(f"VACUUM ANALYZE {schema}.near_duplicates")
            total = connection.exec_driver_sql(f"SELECT count(*) FROM {schema}.documents").scalar_one()
            rows = []
            for title, sql in recipes() + [(f"(peer) {title}", sql) for title, sql in PEERS]:
                query = sa.text(sql.replace("simdb.", f"{schema}."))
                answer = connection.execute(query).all()
                seconds = []
                for _ in range(3):
                    start = time.perf_counter()
                    connection.execute(query).all()
                    seconds.append(time.perf_counter() - start)
                rows.append((title, len(answer), statistics.median(seconds) * 1e3))
                log(f"{rows[-1][2]:9.1f} ms  {title}")
    finally:
        if not args.keep:
            server.drop_schemas(schema)
        server.close()
    print(f"{total:,} documents; each recipe timed as the median of 3 runs after one warm-up; load average "
          f"(1, 5, 15 min) {load_at_start} at start, {load_average()} at end; "
          f"command: .venv/bin/python scripts/bench_sql.py {' '.join(sys.argv[1:])}\n")
    if args.markdown:
        print("| recipe | rows | ms |\n|---|---:|---:|")
        for title, count, ms in rows:
            print(f"| {title} | {count:,} | {ms:,.1f} |")
    else:
        for title, count, ms in rows:
            print(f"{ms:9.1f} ms  {count:>8,} rows  {title}")


if __name__ == "__main__":
    main()
