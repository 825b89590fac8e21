"""bench_ingest's archive path, without tokenization: precomputed random fingerprints through
``Index.add_fingerprinted`` into an empty archive and into a big bulk-loaded one; the naive path (a SELECT
and an INSERT per document) into the same big archive; and the PyPI ``simhash`` package's in-memory index.

Run through bench_ingest (``--skip fingerprint,cli`` for this part alone), or on its own::

    .venv/bin/python scripts/bench_ingest_archive.py --markdown

which takes bench_ingest's options and leaves its other parts out.
"""

from __future__ import annotations

import gc
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import sqlalchemy as sa

from bench_common import bulk_load, checkpoint, log, mb, random_u64, rss_bytes, wal_counters_settle
from bench_corpus import NEAR_FRACTION, fingerprinted_batch, near_copies, new_fingerprints

import simdb
from simdb.methods.simhash.blocks import BlockLayout
from simdb.pg import segments

PARTS = {"empty", "archive", "peer"}


@dataclass(frozen=True)
class EmptyArchive:
    """Fingerprints into an empty archive, chunk by chunk."""

    layout: BlockLayout
    documents: int
    seconds: float
    chunk_rates: list[float]  # docs/s of each add_fingerprinted call
    duplicates: int  # marked
    planted: int


@dataclass(frozen=True)
class Statement:
    sql: str  # whitespace collapsed, cut at 70 characters
    seconds: float


@dataclass(frozen=True)
class BulkIngest:
    """One add_fingerprinted into a bulk-loaded archive."""

    layout: BlockLayout
    build: dict  # bench_common.bulk_load's timings and size
    documents: int
    seconds: float
    planted: int
    duplicates: int
    statements: list[Statement]  # the slowest SQL statements
    sql_seconds: float  # of all SQL statements run through SQLAlchemy
    wal_bytes: int  # written by the whole server meanwhile
    wal_full_pages: int


class WalMark(NamedTuple):
    """Where the server's WAL stood."""

    lsn: str
    full_pages: int  # full-page images written since the statistics were reset


class NaiveMatch(NamedTuple):
    """A stored document the naive path found within k bits."""

    id: int
    distance: int
    row: sa.Row


@dataclass(frozen=True)
class NaiveIngest:
    documents: int
    seconds: float
    duplicates: int


@dataclass(frozen=True)
class Archive:
    """The big archive in the for_size layout (with the naive path) and, unless left out, the default layout."""

    sized: BulkIngest | None = None
    default: BulkIngest | None = None
    naive: NaiveIngest | None = None


@dataclass(frozen=True)
class PeerIndex:
    """PyPI simhash's in-memory SimhashIndex."""

    documents: int
    build: float  # seconds to add them all
    memory: int  # RSS growth, bytes
    queries: int
    found: int  # queries that found something
    query_seconds: float
    p50: float  # median seconds per query


class StatementTimer:
    """Seconds per SQL statement run through SQLAlchemy on ``engine`` (COPYs on the raw cursor are not seen)."""

    def __init__(self, engine: sa.Engine) -> None:
        self.engine, self.seconds, self.started = engine, defaultdict(float), {}

    def _before(self, conn, cursor, statement, parameters, context, executemany):
        self.started[id(cursor)] = time.perf_counter()

    def _after(self, conn, cursor, statement, parameters, context, executemany):
        key = " ".join(statement.split())[:70]
        self.seconds[key] += time.perf_counter() - self.started.pop(id(cursor), time.perf_counter())

    def __enter__(self) -> "StatementTimer":
        sa.event.listen(self.engine, "before_cursor_execute", self._before)
        sa.event.listen(self.engine, "after_cursor_execute", self._after)
        return self

    def __exit__(self, *exc_info) -> None:
        sa.event.remove(self.engine, "before_cursor_execute", self._before)
        sa.event.remove(self.engine, "after_cursor_execute", self._after)

    def top(self, count: int = 4) -> list[Statement]:
        slowest = sorted(self.seconds.items(), key=lambda item: -item[1])[:count]
        return [Statement(sql, seconds) for sql, seconds in slowest]


def drop_schema(admin: sa.Engine, schema: str) -> None:
    with admin.connect() as c:
        c.exec_driver_sql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


# -- into an empty archive -----------------------------------------------------------------------

def ingest_empty(url: str, admin: sa.Engine, schema: str, args, rng: np.random.Generator) -> EmptyArchive:
    """``args.documents`` fingerprints into an empty archive, ``args.chunk`` per add_fingerprinted call."""
    k = args.max_distance
    layout = BlockLayout.for_size(k, args.documents)
    documents, seconds, chunk_rates, duplicates, planted = 0, 0.0, [], 0, 0
    stored = np.empty(0, dtype=np.uint64)
    checkpoint(admin)
    with simdb.Index.create(url, schema=schema, blocks=layout.blocks, max_distance=k) as index:
        for number, first in enumerate(range(0, args.documents, args.chunk)):
            count = min(args.chunk, args.documents - first)
            fps = new_fingerprints(rng, count, stored, k)
            batch = fingerprinted_batch(rng, fps, f"e{number:03d}")
            summary = index.add_fingerprinted(batch, batch=f"empty-{number}")
            log(f"  {summary} ({count / summary.seconds:,.0f} docs/s)")
            documents += count
            seconds += summary.seconds
            chunk_rates.append(count / summary.seconds)
            duplicates += summary.near_duplicates + summary.exact_duplicates
            planted += int(count * NEAR_FRACTION)
            stored = np.concatenate([stored, fps])
            del batch
    drop_schema(admin, schema)
    return EmptyArchive(layout=layout, documents=documents, seconds=seconds, chunk_rates=chunk_rates,
                        duplicates=duplicates, planted=planted)


# -- the big archive: bulk load, then the same add_fingerprinted ----------------------------------

def ingest_into(url: str, admin: sa.Engine, schema: str, layout: BlockLayout, build: dict, stored: np.ndarray,
                count: int, prefix: str, k: int, rng: np.random.Generator) -> BulkIngest:
    """Time one add_fingerprinted of ``count`` new fingerprints into the archive in ``schema``."""
    fps = new_fingerprints(rng, count, stored, k)
    batch = fingerprinted_batch(rng, fps, prefix)
    checkpoint(admin)  # the bulk load's dirty pages are flushed now, not during the timed ingest
    before = wal_position(admin)
    with simdb.Index.open(url, schema=schema) as index:
        with StatementTimer(index.database.engine) as timer:
            summary = index.add_fingerprinted(batch, batch=prefix)
    wal_bytes, wal_full_pages = wal_since(admin, before)
    log(f"  {summary} ({count / summary.seconds:,.0f} docs/s); WAL written meanwhile (whole server): "
        f"{mb(wal_bytes)}, {wal_full_pages:,} full-page images")
    for statement in timer.top():
        log(f"    {statement.seconds:6.2f} s  {statement.sql}")
    return BulkIngest(layout=layout, build=build, documents=count, seconds=summary.seconds,
                      planted=int(count * NEAR_FRACTION),
                      duplicates=summary.near_duplicates + summary.exact_duplicates, statements=timer.top(),
                      sql_seconds=sum(timer.seconds.values()), wal_bytes=wal_bytes, wal_full_pages=wal_full_pages)


def wal_position(admin: sa.Engine) -> WalMark:
    with admin.connect() as c:
        return WalMark(c.exec_driver_sql("SELECT pg_current_wal_lsn()::text").scalar_one(),
                       c.exec_driver_sql("SELECT wal_fpi FROM pg_stat_wal").scalar_one())


def wal_since(admin: sa.Engine, before: WalMark) -> tuple[int, int]:
    """(WAL bytes, full-page images) written by the whole server since ``before``."""
    wal_counters_settle()
    with admin.connect() as c:
        written = c.execute(sa.text("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), CAST(:lsn AS pg_lsn))"),
                            {"lsn": before.lsn}).scalar_one()
        return int(written), c.exec_driver_sql("SELECT wal_fpi FROM pg_stat_wal").scalar_one() - before.full_pages


def naive_ingest(url: str, schema: str, layout: BlockLayout, stored: np.ndarray, count: int, k: int,
                 rng: np.random.Generator) -> NaiveIngest:
    """Per document: one SELECT on the block keys, popcount in Python, one INSERT; a commit per document.

    The tables are reflected from the database, so that the rows are complete whatever the schema
    revision: with ``cluster_id`` (revision 0003) the new id comes from the sequence first and a
    duplicate joins its earliest match's cluster; with ``near_duplicates`` every match is stored as a pair.
    """
    fps = new_fingerprints(rng, count, stored, k)
    digests = rng.bytes(16 * count)
    duplicates = 0
    with simdb.Index.open(url, schema=schema) as index:
        engine = index.database.engine
        metadata = sa.MetaData()
        with engine.connect() as c:
            documents = sa.Table("documents", metadata, schema=schema, autoload_with=c)
            batches = sa.Table("batches", metadata, schema=schema, autoload_with=c)
            pairs = (sa.Table("near_duplicates", metadata, schema=schema, autoload_with=c)
                     if sa.inspect(c).has_table("near_duplicates", schema=schema) else None)
        clustered = "cluster_id" in documents.c
        lookup = sa.select(documents.c.id, documents.c.simhash, *([documents.c.cluster_id] if clustered else [])).where(
            sa.or_(*(documents.c[column] == sa.bindparam(column) for column in layout.key_columns)))
        next_id = sa.select(sa.func.nextval(sa.func.pg_get_serial_sequence(f"{schema}.documents", "id")))
        insert = documents.insert()
        with engine.begin() as c:
            batch_id = c.execute(batches.insert().values(name="naive", source="bench", status="running",
                                                         started_at=sa.func.now()).returning(batches.c.id)).scalar_one()
            first = c.execute(sa.text("SELECT last_value + 1 FROM documents_id_seq")).scalar_one()
            stored_segments = segments.list_segments(c, distributed=index.context.distributed)
            segments.ensure_segments(c, segments.load_policy(c), stored_segments, first,
                                     first + count - 1)  # the naive client's rows need a segment too
        start = time.perf_counter()
        for i, fp in enumerate(fps.tolist()):
            keys = dict(zip(layout.key_columns, layout.block_keys(fp)))
            with engine.begin() as c:
                rows = c.execute(lookup, keys).all()
                found = sorted(NaiveMatch(row.id, ((row.simhash & 0xFFFF_FFFF_FFFF_FFFF) ^ fp).bit_count(), row)
                               for row in rows)
                found = [match for match in found if match.distance <= k]
                duplicates += bool(found)
                row = {"external_id": f"naive-{i:09d}", "batch_id": batch_id,
                       "simhash": fp - (1 << 64) if fp >> 63 else fp, **keys,
                       "content_hash": digests[16 * i:16 * i + 16], "length": 1000, "metadata": {},
                       "duplicate_of": found[0].id if found else None,
                       "duplicate_distance": found[0].distance if found else None}
                if clustered or (pairs is not None and found):
                    row["id"] = c.execute(next_id).scalar_one()
                if clustered:
                    row["cluster_id"] = found[0].row.cluster_id if found else row["id"]
                c.execute(insert, row)
                if pairs is not None and found:
                    c.execute(pairs.insert(), [{"a_id": match.id, "b_id": row["id"], "distance": match.distance,
                                                "batch_id": batch_id} for match in found])
        seconds = time.perf_counter() - start
    log(f"  naive: {count:,} documents in {seconds:.1f} s ({count / seconds:,.0f} docs/s), "
        f"{duplicates:,} near-duplicates (planted {int(count * NEAR_FRACTION):,})")
    return NaiveIngest(documents=count, seconds=seconds, duplicates=duplicates)


def measure_archive(url: str, admin: sa.Engine, schemas: dict[str, str], args, rng: np.random.Generator) -> Archive:
    """The big archive in the for_size layout (plus the naive path), then in the default layout."""
    k, found = args.max_distance, {}
    layouts = [("archive", BlockLayout.for_size(k, args.archive))]
    if args.default_layout and layouts[0][1] != BlockLayout(max_distance=k, blocks=k + 1):
        layouts.append(("archive_default", BlockLayout(max_distance=k, blocks=k + 1)))
    for name, layout in layouts:
        schema = schemas[name]
        log(f"building an archive of {args.archive:,} rows ({layout.describe()})")
        stored, build = bulk_load(url, admin, schema, layout, args.archive, rng, k)
        log(f"add_fingerprinted of {args.added:,} into {args.archive:,}")
        found[name] = ingest_into(url, admin, schema, layout, build, stored, args.added, "added", k, rng)
        if name == "archive" and args.naive:
            log(f"naive ingest of {args.naive:,} documents through SQLAlchemy Core into the same archive")
            found["naive"] = naive_ingest(url, schema, layout, stored, args.naive, k, rng)
        del stored
        drop_schema(admin, schema)
    return Archive(sized=found.get("archive"), default=found.get("archive_default"), naive=found.get("naive"))


# -- the in-memory peer --------------------------------------------------------------------------

def simhash_peer(count: int, queries: int, k: int, rng: np.random.Generator) -> PeerIndex:
    """PyPI ``SimhashIndex(k)``: ``add`` of ``count`` ``Simhash(int)``, then ``get_near_dups``."""
    from simhash import Simhash, SimhashIndex

    fps = random_u64(rng, count)
    probes = np.concatenate([near_copies(rng, fps, queries // 2, k), random_u64(rng, queries - queries // 2)]).tolist()
    ids = [f"p{i}" for i in range(count)]
    gc.collect()
    before, start = rss_bytes(), time.perf_counter()
    index = SimhashIndex([], k=k)
    for external_id, value in zip(ids, fps.tolist()):
        index.add(external_id, Simhash(value))
    build, memory = time.perf_counter() - start, rss_bytes() - before
    seconds, found = [], 0
    for q in probes:
        start = time.perf_counter()
        found += bool(index.get_near_dups(Simhash(q)))
        seconds.append(time.perf_counter() - start)
    del index
    gc.collect()
    return PeerIndex(documents=count, build=build, memory=memory, queries=len(probes), found=found,
                     query_seconds=sum(seconds), p50=float(np.percentile(seconds, 50)))


if __name__ == "__main__":
    import bench_ingest

    bench_ingest.main(sys.argv[1:], parts=PARTS)
