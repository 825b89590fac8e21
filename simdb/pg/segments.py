"""Segments: ``documents`` is partitioned by id ranges, so that ingest writes only small indexes.

A segment is a plain table ``documents_<first id>`` attached to ``documents`` for one range of ids.
Ids only grow, so new documents always land in the newest segment (the *active* one) or in segments
created for them; older segments are *sealed*: they are read by lookups and candidate joins, and
written only by the rare relabel of a cluster or a removal. The active segment's indexes stay small
and in memory however large the archive grows.

Segments are created as ids advance (:func:`ensure_segments`, under the ingest lock), each spanning
``size`` ids. A chunk of at least ``bulk_chunk`` documents gets a segment of its own instead
(:func:`place_chunk`): it is inserted into a bare table, indexed afterwards and attached, in the
chunk's transaction. Building a B-tree by sorting costs a fraction of maintaining it row by row
(100k documents with 16 indexes: 1.45 s against 5.2 s), and the write no longer touches the active
segment's indexes at all.

Segments are merged by :func:`compact`: sealed segments of a similar size are copied, in id order,
into one new table that is indexed before it replaces them in a single transaction, so an
interrupted merge leaves the old segments as they were. The policy is size-tiered by documents (the
planner's estimate, which ANALYZE keeps exact for sealed segments): with ``unit = min(size,
bulk_chunk)``, tier ``t`` holds segments of ``unit * factor**t`` up to ``unit * factor**(t+1)``
documents; ``factor`` adjacent sealed segments of one tier merge into one of the next. The number of
segments then stays below ``(factor - 1) * log_factor(n / unit) + 2`` and each document is
rewritten about ``log_factor(n / unit)`` times in its life. Ingest merges between its chunks, so a
long batch of bulk chunks does not pile up segments that every later chunk must probe.

The settings row ``segments`` holds ``size``, ``merge_factor`` and ``bulk_chunk``.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass

import numpy as np
import sqlalchemy as sa

from ..errors import SimdbError
from ..methods import Method
from ..settings import SegmentPolicy
from . import prewarm
from . import probes as probes_module
from .citus import distribute_like_documents
from .database import LOCK_POLL, lock, try_lock
from .in_memory import MemoryProbes, segment_pairs_in_memory, spread_reads, worth_reading
from .methods import sql_of
from .probes import Lookup
from .spread import default_connections, spread_lookups

_BOUNDS = re.compile(r"FROM \('?(-?\d+|MINVALUE)'?\) TO \('?(-?\d+|MAXVALUE)'?\)")


def segment_name(first_id: int) -> str:
    return f"documents_{first_id:012d}"


@dataclass(frozen=True)
class Segment:
    name: str
    first_id: int  #: the first id of its range
    end_id: int  #: one past the last id of its range
    active: bool  #: the newest segment, which receives new documents
    estimated: int | None = None  #: documents, as the planner estimates them (None until analyzed)
    documents: int | None = None  #: exact count, when asked for
    bytes: int | None = None  #: table, TOAST and indexes

    @property
    def width(self) -> int:
        return self.end_id - self.first_id

    @property
    def size(self) -> int:
        """Its documents as the merge policy counts them: the planner's estimate, or its width."""
        return self.width if self.estimated is None else self.estimated

    def to_json(self) -> dict:
        return asdict(self)


def load_policy(connection: sa.Connection) -> SegmentPolicy:
    row = connection.execute(sa.text("SELECT value FROM settings WHERE name = 'segments'")).scalar()
    return SegmentPolicy.from_row(row)


def save_policy(connection: sa.Connection, policy: SegmentPolicy) -> None:
    connection.execute(sa.text(
        "INSERT INTO settings (name, value) VALUES ('segments', CAST(:value AS jsonb)) "
        "ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value"), {"value": json.dumps(policy.to_row())})


#: Listings of the segments tried while a concurrent merge drops one (see :func:`list_segments`).
LISTING_ATTEMPTS = 5


def list_segments(connection: sa.Connection, *, distributed: bool, counts: bool = False) -> list[Segment]:
    """The segments in id order (of a ``distributed`` index or not); with ``counts``, their exact document
    counts and sizes on disk."""
    for _ in range(LISTING_ATTEMPTS):
        rows = connection.execute(sa.text(
            "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid), c.reltuples FROM pg_inherits i "
            "JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = CAST('documents' AS regclass) "
            # a table another transaction is attaching or detaching right now shows no bound yet: not ours to list
            "AND c.relpartbound IS NOT NULL")).all()
        # A bound that reads as NULL belongs to a segment a merge dropped after this statement's snapshot was
        # taken (pg_get_expr reads the catalog as it is now): a reader without the ingest lock (compact's
        # listing before it merges, stats) lists again, and a new statement sees the merge's result.
        gone = [name for name, bound, _ in rows if bound is None]
        if not gone:
            break
    else:
        raise SimdbError(f"segment {gone[0]} of documents was dropped while it was being listed (a merge committed "
                         "at the same time); run the command again")
    bounds = []
    for name, bound, estimate in rows:
        match = _BOUNDS.search(bound or "")
        if match is None:
            raise SimdbError(f"segment {name} of documents has the partition bound {bound!r}, which simdb did not "
                             "create; detach it")
        low, high = match.groups()
        first, end = 0 if low == "MINVALUE" else int(low), 2 ** 63 - 1 if high == "MAXVALUE" else int(high)
        bounds.append((name, first, end, int(estimate) if estimate >= 0 else None))
    bounds.sort(key=lambda row: row[1])
    # a distributed segment's rows are on the workers: the coordinator's estimate is none, so the policy takes
    # its width, and its size on disk is its shards'
    if distributed:
        bounds = [(name, first, end, None) for name, first, end, _ in bounds]
    size_function = "citus_total_relation_size" if distributed else "pg_total_relation_size"
    segments = []
    for position, (name, first, end, estimate) in enumerate(bounds):
        documents = size = None
        if counts:
            # through documents (pruned to the segment), which a read-only role may read
            documents = connection.execute(sa.text(
                "SELECT count(*) FROM documents WHERE id >= :first AND id < :end"), {"first": first, "end": end}
            ).scalar_one()
            size = connection.execute(sa.text(f"SELECT {size_function}(CAST(:n AS regclass))"),
                                      {"n": name}).scalar_one()
        segments.append(Segment(name, first, end, position == len(bounds) - 1, estimate, documents, size))
    return segments


def place_chunk(connection: sa.Connection, count: int, *, distributed: bool
                ) -> tuple[np.ndarray, str | None, list[Segment]]:
    """Under the ingest lock: ``count`` new document ids (in order, above every stored id), the bulk
    segment that takes them if any, and the segments the chunk seals (to :func:`seal` once it is stored).

    A chunk of at least the policy's ``bulk_chunk`` documents starts where the last segment ends (the
    ids it skips are never used) and gets a new bare table of exactly its width, returned to be filled,
    then given to :func:`index_bare` and :func:`attach_indexed`. A smaller one goes to the active
    segment, and to new ones when its ids pass the active segment's end.
    """
    policy = load_policy(connection)
    sequence = int(connection.execute(sa.text(
        "SELECT CAST(pg_get_serial_sequence('documents', 'id') AS regclass)::oid")).scalar_one())
    before = list_segments(connection, distributed=distributed)
    last = before[-1] if before else None
    # (a last segment open to the top of the ids, which simdb never makes, keeps every document)
    bulk = count >= policy.bulk_chunk and (last is None or last.end_id < 2 ** 63 - 1)
    if bulk and last is not None:
        connection.execute(sa.text(  # so that the next id is the last segment's end
            f"SELECT setval({sequence}::oid::regclass, :end - 1) WHERE coalesce("
            f"pg_sequence_last_value({sequence}::oid::regclass), "
            f"(SELECT seqstart - 1 FROM pg_sequence WHERE seqrelid = {sequence}::oid)) < :end - 1"),
            {"end": last.end_id})
    ids = np.array(connection.execute(sa.text(
        f"SELECT nextval({sequence}::oid::regclass) FROM generate_series(1, :count)"), {"count": count}
    ).scalars().all(), dtype=np.int64)
    if not count:
        return ids, None, []
    first, end = int(ids[0]), int(ids[-1]) + 1
    if bulk and end - first == count and (last is None or first >= last.end_id):
        return ids, _create_segment(connection, first, end, attach=False, distributed=distributed), [last] if last else []
    created = ensure_segments(connection, policy, before, first, end - 1)
    # sealed by this chunk: the active segment it runs past, and each new one but the last
    passed = [last] if created and last is not None else []
    return ids, None, passed + created[:-1]


#: A sealed segment whose planner estimate is within this share of its width is full, and was analyzed when it
#: was built: ANALYZE reads a sample of 30,000 pages, so a bulk-loaded or merged segment larger than that never
#: estimates exactly its width (2,999,939 documents for 3M), and every bulk chunk that came after it analyzed it
#: again (1.6 s at 3M, a cost that grew with the archive).
FULL_WITHIN = 0.01


def seal(connection: sa.Connection, sealed: list[Segment]) -> None:
    """Planner statistics for segments that take no more documents, which the merge policy sizes by;
    a full one (a bulk-loaded or merged segment: its estimate within :data:`FULL_WITHIN` of its width) was
    analyzed when it was built. A segment that another session holds is skipped, not waited for (autovacuum
    analyzes it later; until then the policy takes its width): a relayout's CREATE INDEX CONCURRENTLY holds
    it while it waits for this transaction."""
    for segment in sealed:
        if segment.estimated is None or segment.estimated < (1 - FULL_WITHIN) * segment.width:
            connection.exec_driver_sql(f'ANALYZE (SKIP_LOCKED) "{segment.name}"')


def ensure_segments(connection: sa.Connection, policy: SegmentPolicy, segments: list[Segment], first_id: int,
                    last_id: int) -> list[Segment]:
    """Under the ingest lock, with the index's ``policy`` and its ``segments`` as they stand: make sure
    segments cover ids ``first_id..last_id`` (newly allocated, so above every stored id); returns the
    segments created. A new segment starts where the last one ends, or at ``first_id`` when the ids
    skipped past a whole segment's width."""
    end = segments[-1].end_id if segments else 1
    created = []
    while end <= last_id:
        start = end if first_id - end < policy.size else first_id
        created.append(Segment(_create_segment(connection, start, start + policy.size), start, start + policy.size,
                               active=False))
        end = start + policy.size
    return created


def add_segment(connection: sa.Connection, first_id: int, end_id: int) -> None:
    """An empty segment for ids ``first_id..end_id - 1``, attached (as a copied index's segments are made)."""
    _create_segment(connection, first_id, end_id)


def _create_segment(connection: sa.Connection, first_id: int, end_id: int, name: str | None = None,
                    attach: bool = True, distributed: bool = False) -> str:
    """A new empty segment table; attached (a SHARE UPDATE EXCLUSIVE lock on ``documents``: readers and
    writers go on) unless ``attach`` is false, and then sharded when the index is ``distributed``."""
    name = name or segment_name(first_id)
    connection.exec_driver_sql(f'CREATE TABLE "{name}" (LIKE documents INCLUDING DEFAULTS INCLUDING CONSTRAINTS '
                               "INCLUDING STORAGE INCLUDING COMPRESSION)")
    if attach:
        connection.exec_driver_sql(f'ALTER TABLE documents ATTACH PARTITION "{name}" '
                                   f"FOR VALUES FROM ({int(first_id)}) TO ({int(end_id)})")
    elif distributed:  # sharded before it is filled: a local table would keep its rows on the
        distribute_like_documents(connection, name)  # coordinator when Citus distributes it at ATTACH
    return name


def segment_pairs(connection: sa.Connection, method: Method, probe: str, probes: int, max_distance: int,
                  below: int, *, distributed: bool, probe_rows: Callable[[], Iterable[tuple]] | None = None,
                  memory_probes: Callable[[], MemoryProbes] | None = None,
                  connections: int | None = None) -> Iterator[np.ndarray]:
    """Verified ``(probe id, document id, distance)`` rows of the ``probes`` rows of ``probe`` against every
    stored document, one segment at a time: index lookups into a segment that may hold more documents than
    there are probes, the planner's join otherwise (always on Citus, where a join runs on every worker).
    Only under the ingest lock, with ``below`` the first id the chunk was given: the segments do not change between the statements, and every stored id is below
    ``below`` (so a segment at or above it, created for the chunk, is skipped, and one that it cuts holds
    at most ``below - first_id`` documents). With ``probe_rows`` (the probes as rows: id, sketch, key
    columns) and at least :data:`~simdb.pg.probes.SHARED_PROBES` probes, the index lookups are spread over
    ``connections`` connections (default: :func:`~simdb.pg.spread.default_connections`; see
    :func:`~simdb.pg.spread.spread_lookups`). With ``memory_probes`` (the probes in
    memory), a segment of few documents per probe is read and joined in memory instead, on one server
    (:mod:`simdb.pg.in_memory`); from ``SHARED_PROBES`` probes on, its slices are spread over the connections
    as the lookups are (:func:`~simdb.pg.in_memory.spread_reads`)."""
    by_index = not distributed  # Citus plans no LATERAL probe; its join runs on every worker
    lookups, read = [], []
    for segment in list_segments(connection, distributed=distributed):
        capacity = min(segment.end_id, below) - segment.first_id
        if capacity <= 0:
            continue
        if memory_probes is not None and by_index and worth_reading(_documents_at_most(
                connection, segment, capacity, probes), probes):
            read.append((segment.name, segment.first_id, segment.first_id + capacity))
        else:
            lookups.append(Lookup(segment.name, by_index and capacity > probes))
    if read and probes >= probes_module.SHARED_PROBES:  # the reads over several connections, as the lookups
        yield from spread_reads(connection, method, read, memory_probes(), max_distance,
                                connections or default_connections(connection))
    elif read:
        in_memory = memory_probes()
        for name, first, end in read:
            yield from segment_pairs_in_memory(connection, method, name, first, end, in_memory, max_distance)
    wide = any(lookup.index_probes for lookup in lookups)
    if probe_rows is not None and wide and probes >= probes_module.SHARED_PROBES:
        yield from spread_lookups(connection, sql_of(method), probe, lookups, max_distance, probe_rows,
                                  connections or default_connections(connection))
        return
    for lookup in lookups:
        yield from sql_of(method).candidate_pairs(connection, probe, f'"{lookup.target}"', max_distance,
                                                  index_probes=lookup.index_probes)


def _documents_at_most(connection: sa.Connection, segment: Segment, capacity: int, probes: int) -> int:
    """About how many documents the first ``capacity`` ids of ``segment`` hold, for :func:`worth_reading`: the
    planner's estimate, where it has one; else, when the width alone is too large, what its largest id
    leaves room for (ids grow within a segment: one descent of its primary key). A segment filled by small
    chunks and not analyzed yet has the width of a whole segment and a fraction of its documents."""
    documents = capacity if segment.estimated is None else min(capacity, segment.estimated)
    if segment.estimated is None and not worth_reading(documents, probes):
        last = connection.execute(sa.text(f'SELECT max(id) FROM "{segment.name}" WHERE id < :end'),
                                  {"end": segment.first_id + capacity}).scalar()
        documents = 0 if last is None else min(documents, last - segment.first_id + 1)
    return documents


# -- merging ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CompactionSummary:
    merged: list[dict]  #: one per new segment: its name, range, documents, the segments it replaced, seconds, ready
    segments_before: int
    segments_after: int

    def to_json(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        if not self.merged:
            return f"nothing to merge: {self.segments_before} segment(s) as the policy wants them"
        documents = sum(m["documents"] for m in self.merged)
        seconds = sum(m["seconds"] for m in self.merged)
        return (f"merged {sum(len(m['replaced']) for m in self.merged)} segments into {len(self.merged)} "
                f"({documents:,} documents in {seconds:.1f} s); {self.segments_before} -> {self.segments_after} "
                "segments")


def _index_statements(connection: sa.Connection, table: str) -> list[str]:
    """CREATE INDEX statements for every index of ``documents`` (its partitioned indexes), on ``table``."""
    definitions = connection.execute(sa.text(
        "SELECT i.relname, pg_get_indexdef(i.oid) FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid "
        "WHERE x.indrelid = CAST('documents' AS regclass) AND NOT x.indisprimary ORDER BY i.relname")).all()
    statements = []
    for name, definition in definitions:
        body = re.sub(r"^CREATE (UNIQUE )?INDEX \S+ ON ONLY (\S+\.)?documents ",
                      lambda m: f'CREATE {m.group(1) or ""}INDEX "{table}_{name.removeprefix("ix_documents_")}" '
                                f'ON "{table}" ', definition)
        if body == definition:
            raise SimdbError(f"cannot copy the definition of index {name} to a segment: {definition}")
        statements.append(body)
    return statements


def index_bare(connection: sa.Connection, table: str, first_id: int, end_id: int) -> None:
    """Give a filled, unattached segment table ``documents``' primary key and indexes (its own index
    definitions, so that ATTACH adopts them instead of building its own), a CHECK proving its id range (so
    that ATTACH need not scan it), and planner statistics."""
    connection.exec_driver_sql(f'ALTER TABLE "{table}" ADD CONSTRAINT "{table}_pkey" PRIMARY KEY (id)')
    for statement in _index_statements(connection, table):
        connection.exec_driver_sql(statement)
    connection.exec_driver_sql(f'ALTER TABLE "{table}" ADD CONSTRAINT "{table}_range" '
                               f"CHECK (id >= {int(first_id)} AND id < {int(end_id)})")
    connection.exec_driver_sql(f'ANALYZE "{table}"')


def attach_indexed(connection: sa.Connection, table: str, first_id: int, end_id: int) -> None:
    """Attach a table prepared by :func:`index_bare` as the segment for ids ``first_id..end_id - 1``."""
    connection.exec_driver_sql(f'ALTER TABLE documents ATTACH PARTITION "{table}" '
                               f"FOR VALUES FROM ({int(first_id)}) TO ({int(end_id)})")
    connection.exec_driver_sql(f'ALTER TABLE "{table}" DROP CONSTRAINT "{table}_range"')


def merge(connection: sa.Connection, run: list[Segment], lock_attempts: int = 24, *, distributed: bool) -> dict:
    """Replace adjacent sealed segments by one, inside the caller's transaction (which holds the migrate
    and ingest locks): copy in id order, index, then detach and drop the old ones and attach the new.

    Adjacent means that no other segment lies between them, not that their ranges meet: ids that were
    never stored leave gaps between segments (a failed bulk chunk used up its ids, since a sequence does
    not roll back; a chunk that skipped past a whole segment's width). The new segment's range runs from
    the first one's start to the last one's end, gaps included: no id in a gap is ever given again (ids
    only grow), and lookups and removals go by id and by the planner's estimate of the documents, never
    by a segment's width once it is analyzed, as a merged one is."""
    started = time.perf_counter()
    first, end = run[0].first_id, run[-1].end_id
    names = {segment.name for segment in run}
    between = [s.name for s in list_segments(connection, distributed=distributed) if s.first_id < end and s.end_id > first
               and s.name not in names]
    if between:
        raise SimdbError(f"segment(s) {', '.join(between)} lie between {run[0].name} and {run[-1].name}; "
                         "cannot merge them")
    staging = segment_name(first) + "_merged"
    _create_segment(connection, first, end, staging, attach=False, distributed=distributed)
    connection.exec_driver_sql(f'ALTER TABLE "{staging}" SET (autovacuum_enabled = false)')
    columns = ", ".join(f'"{c}"' for c in connection.execute(sa.text(
        "SELECT attname FROM pg_attribute WHERE attrelid = CAST('documents' AS regclass) AND attnum > 0 "
        "AND NOT attisdropped ORDER BY attnum")).scalars())
    documents = 0
    for segment in run:
        documents += connection.exec_driver_sql(
            f'INSERT INTO "{staging}" ({columns}) SELECT {columns} FROM "{segment.name}" ORDER BY id').rowcount
    index_bare(connection, staging, first, end)
    _lock_documents(connection, lock_attempts)
    for segment in run:
        connection.exec_driver_sql(f'ALTER TABLE documents DETACH PARTITION "{segment.name}"')
        connection.exec_driver_sql(f'DROP TABLE "{segment.name}"')
    attach_indexed(connection, staging, first, end)
    name = segment_name(first)
    connection.exec_driver_sql(f'ALTER TABLE "{staging}" RENAME TO "{name}"')
    connection.exec_driver_sql(f'ALTER TABLE "{name}" RESET (autovacuum_enabled)')
    for index in connection.execute(sa.text(
            "SELECT i.relname FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid "
            "WHERE x.indrelid = CAST(:t AS regclass)"), {"t": name}).scalars():
        connection.exec_driver_sql(f'ALTER INDEX "{index}" RENAME TO "{index.replace(staging, name, 1)}"')
    return {"name": name, "first_id": first, "end_id": end, "documents": documents,
            "replaced": [segment.name for segment in run], "seconds": round(time.perf_counter() - started, 3)}


def _lock_documents(connection: sa.Connection, attempts: int = 24, wait: str = "5s") -> None:
    """ACCESS EXCLUSIVE on ``documents`` (to detach segments), without queueing every new query behind a
    long-running one: each attempt gives up after ``wait`` and lets the queries through before the next."""
    for attempt in range(attempts):
        try:
            with connection.begin_nested():
                connection.exec_driver_sql(f"SET LOCAL lock_timeout = '{wait}'")
                connection.exec_driver_sql("LOCK TABLE documents IN ACCESS EXCLUSIVE MODE")
                connection.exec_driver_sql("SET LOCAL lock_timeout = 0")
            return
        except sa.exc.OperationalError as exc:
            if getattr(exc.orig, "sqlstate", None) != "55P03" or attempt == attempts - 1:
                raise
            time.sleep(1)


def compact(engine: sa.Engine, schema: str, *, distributed: bool, full: bool = False,
            progress: Callable[[str], None] | None = None, merged: list | None = None,
            lock_attempts: int = 24, wait: bool = True, key_columns: Sequence[str] = ()) -> CompactionSummary:
    """Merge sealed segments as the policy says (or all of them, ``full``), one merge per transaction.

    Each merge holds the ingest lock (ingests wait for it) and, for its last moments, an ACCESS
    EXCLUSIVE lock on ``documents`` to detach the old segments (queries wait for that), tried
    ``lock_attempts`` times for 5 s each while a long query holds ``documents``. While a relayout
    builds its indexes (it holds the migrate lock) a merge waits for it, ``wait``, outside any
    transaction (see :func:`simdb.pg.database.lock`), or merges nothing more now. Each merge's summary
    is appended to ``merged`` (a new list by default) as it commits, so that a caller still knows the
    merges made before one fails. Each merged segment is then vacuumed and its indexes of ``key_columns`` (none:
    the VACUUM alone) read into shared buffers (:func:`simdb.pg.prewarm.ready`, whose account its summary keeps as ``ready``; not on
    Citus, whose segments are the workers' shards).
    """
    say = progress or (lambda message: None)
    with engine.connect() as connection:
        before = list_segments(connection, distributed=distributed)
    merged, waiting = [] if merged is None else merged, False
    while True:
        with engine.begin() as connection:
            free = try_lock(connection, schema, "migrate")
            if free:
                lock(connection, schema, "ingest")
            run = _next_run(connection, full, distributed) if free else None
            if run:
                say(f"merging {len(run)} segments ({run[0].name} .. {run[-1].name})")
                summary = merge(connection, run, lock_attempts, distributed=distributed)
        if run:
            merged.append(summary)  # committed
            say(f"merged into {summary['name']}: {summary['documents']:,} documents in {summary['seconds']} s")
            if not distributed:
                try:  # the merge is stored: a failure here (a dropped connection) leaves the probes slower for a while
                    summary["ready"] = prewarm.ready(engine, summary["name"], key_columns, say)
                except sa.exc.DBAPIError as error:
                    say(f"{summary['name']} was not vacuumed and read into shared buffers: {error.orig}")
        elif free or not wait:
            break
        else:
            if not waiting:
                say("waiting for the relayout (or schema upgrade) of the index to finish")
                waiting = True
            time.sleep(LOCK_POLL)
    with engine.connect() as connection:
        after = list_segments(connection, distributed=distributed)
    return CompactionSummary(merged=merged, segments_before=len(before), segments_after=len(after))


def _next_run(connection: sa.Connection, full: bool, distributed: bool) -> list[Segment] | None:
    """The sealed segments the policy (or ``full``) merges next, or None."""
    sealed = [s for s in list_segments(connection, distributed=distributed) if not s.active]
    runs = load_policy(connection).plan([s.size for s in sealed], full=full)
    return [sealed[i] for i in runs[0]] if runs else None
