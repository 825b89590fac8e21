"""A merged segment made ready for probes as its merge commits: its visibility map set, its key indexes read
into shared buffers where they fit.

A merge (:func:`simdb.pg.segments.merge`) fills its segment by INSERT, which sets no visibility-map bit, and
builds the indexes with CREATE INDEX, which writes them past shared buffers. Until autovacuum comes by (a minute
or more later, throttled, and only once no transaction older than the merge is left), each index-only probe of
a chunk visits the heap for every entry it finds (``Heap Fetches``), and the first probe into each index page
reads it from the operating system's page cache at best. :func:`ready` runs a VACUUM at once (outside the
merge's transaction: VACUUM cannot run inside one), then reads the segment's key indexes into shared buffers:
with ``pg_prewarm`` where the database has that extension (a superuser must install it: simdb does not assume
it), else by an index-only scan of each whole index, which reads its pages through shared buffers and, once the
visibility map is set, none of the heap's.

Measured (2 cores, load 2-6, 6 GB of shared buffers): a chunk's 100k probes of one key index of a 3M segment took
235-258 ms with the visibility map unset (71,244 heap fetches) against 141-151 ms vacuumed; reading 3M's 15 key
indexes (1.7 GB) took 1.9-4.6 s with pg_prewarm and 7.6-10.1 s by index-only scans, 10M's 11 that fit (4.3 GB)
6.6-19 s and 14-30 s. Batches of new lookups after a restart ran 1.2-1.3x faster with 10M's indexes read in,
still below the same batch repeated: the operating system's page cache served the rest.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import sqlalchemy as sa

#: The share of shared buffers a segment's key indexes may fill when they are read in: the rest is left to the
#: pages every chunk writes and reads besides (the active segment, the staging tables, the heap). Indexes past
#: it are left to be read by the probes that need them (reading more would evict the ones read first).
WARM_SHARE = 0.75
#: Below this share of its pages marked all-visible, a segment is not scanned to warm it (without
#: ``pg_prewarm``): each entry would visit the heap. VACUUM leaves the map unset while a transaction older than
#: the merge is still open in the database (a long analyst's query, another ingest's chunk).
ALL_VISIBLE = 0.9


def ready(engine: sa.Engine, segment: str, key_columns: Sequence[str],
          say: Callable[[str], None] = lambda message: None) -> dict:
    """VACUUM ``segment`` (a committed, attached segment table), then read the indexes of its ``key_columns`` into
    shared buffers, as many as fit in :data:`WARM_SHARE` of them, in key order; what was done is returned and
    said. A failure here is the caller's to swallow: the segment is stored either way."""
    started = time.perf_counter()
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.exec_driver_sql(f'VACUUM "{segment}"')
        vacuumed = time.perf_counter() - started
        if not key_columns:  # an ingest's merges between chunks: the VACUUM only (reading indexes holds it up)
            say(f"{segment}: VACUUM {vacuumed:.1f} s")
            return {"segment": segment, "vacuum_seconds": round(vacuumed, 3), "warmed": 0,
                    "seconds": round(time.perf_counter() - started, 3)}
        pages, visible = connection.execute(sa.text(
            "SELECT relpages, relallvisible FROM pg_class WHERE oid = CAST(:t AS regclass)"), {"t": segment}).one()
        indexes = connection.execute(sa.text(
            "SELECT a.attname, i.relname, pg_relation_size(i.oid) FROM pg_index x "
            "JOIN pg_class i ON i.oid = x.indexrelid "
            "JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = x.indkey[0] "
            "WHERE x.indrelid = CAST(:t AS regclass) AND a.attname = ANY(:keys)"),
            {"t": segment, "keys": list(key_columns)}).all()
        indexes.sort(key=lambda row: list(key_columns).index(row[0]))
        buffers = connection.execute(sa.text(
            "SELECT setting::bigint * current_setting('block_size')::bigint FROM pg_settings "
            "WHERE name = 'shared_buffers'")).scalar_one()
        prewarm = connection.execute(sa.text(
            "SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace "
            "WHERE e.extname = 'pg_prewarm'")).scalar()
        fit, total = [], 0
        for column, index, size in indexes:
            if total + size > WARM_SHARE * buffers:
                break
            fit.append((column, index))
            total += size
        way, fitting = "pg_prewarm" if prewarm else "index-only scans", len(fit)
        if not prewarm and visible < ALL_VISIBLE * pages:
            fit, total, way = [], 0, f"nothing read: {visible:,} of its {pages:,} pages all-visible after VACUUM"
    with engine.begin() as connection:  # SET LOCAL: a transaction (the VACUUM's connection has none)
        if not prewarm:
            connection.exec_driver_sql("SET LOCAL enable_seqscan = off")
            connection.exec_driver_sql("SET LOCAL enable_bitmapscan = off")
            connection.exec_driver_sql("SET LOCAL max_parallel_workers_per_gather = 0")
        for column, index in fit:
            if prewarm:
                connection.execute(sa.text(f'SELECT "{prewarm}".pg_prewarm(CAST(:i AS regclass))'), {"i": index})
            else:
                connection.exec_driver_sql(
                    f'SELECT count(*) FROM (SELECT "{column}" FROM "{segment}" ORDER BY "{column}") s')
        if prewarm and fit:  # the map each index-only probe reads (an index-only scan read it already)
            connection.execute(sa.text(f"SELECT \"{prewarm}\".pg_prewarm(CAST(:t AS regclass), 'buffer', 'vm')"),
                               {"t": segment})
    done = {"segment": segment, "vacuum_seconds": round(vacuumed, 3), "all_visible": [visible, pages],
            "warmed": len(fit), "key_indexes": len(indexes), "bytes": total, "shared_buffers": buffers, "way": way,
            "seconds": round(time.perf_counter() - started, 3)}
    left = f", {len(indexes) - fitting} left: more than {WARM_SHARE:.0%} of shared buffers " \
           f"({buffers / 2**20:,.0f} MB)" if fitting < len(indexes) else ""
    say(f"{segment}: VACUUM {vacuumed:.1f} s; {len(fit)} of {len(indexes)} key indexes ({total / 2**20:,.0f} MB) "
        f"read into shared buffers ({way}){left} in {done['seconds']:.1f} s")
    return done
