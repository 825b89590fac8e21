"""What the library reads from an archive: batches, matches, pairs, exports, statistics.

Every function takes an open connection (whose ``search_path`` starts with the index's schema)
and the method where the answer depends on it; long results are streamed.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Sequence
from typing import NamedTuple

import numpy as np
import sqlalchemy as sa
from psycopg.rows import namedtuple_row

from ..bits import to_unsigned_array
from ..errors import NotFound
from ..matches import distinct
from ..methods import Method
from . import keyed as keyed_layout
from . import spread
from .context import IndexContext
from .copy import copy_in, int8_array
from .methods import sql_of
from .probes import Lookup, without_jit


def read_only_snapshot(connection: sa.Connection) -> None:
    """Make the connection's (new) transaction one read-only snapshot: every later read sees the same archive."""
    connection.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")


def batch_id(connection: sa.Connection, name: str) -> int:
    found = connection.execute(sa.text("SELECT id FROM batches WHERE name = :name"), {"name": name}).scalar()
    if found is None:
        raise NotFound(f"no batch named {name!r}; `simdb stats` lists the batches")
    return found


def batch_row(connection: sa.Connection, name: str) -> sa.Row:
    return connection.execute(sa.text("SELECT * FROM batches WHERE name = :name"), {"name": name}).one()


def batches(connection: sa.Connection) -> list[sa.Row]:
    return connection.execute(sa.text(
        "SELECT name, documents, new, exact_duplicates, near_duplicates, already_stored, rejected, status, "
        "position, finished_at FROM batches ORDER BY id")).all()


def document_count(connection: sa.Connection) -> int:
    return connection.execute(sa.text("SELECT count(*) FROM documents")).scalar_one()


def records(connection: sa.Connection, batch: str, *, after: int = 0, upto: int | None = None,
            status: str | None = None) -> Iterator[sa.Row]:
    """The records of a batch at input positions in ``(after, upto]`` (and of one ``status``), in input order,
    with the external id of the document each duplicated when it arrived (kept with the record: the document
    may have been removed since); read 10,000 at a time."""
    batch_id = connection.execute(sa.text("SELECT id FROM batches WHERE name = :batch"), {"batch": batch}).scalar()
    while batch_id is not None:
        part = connection.execute(sa.text(
            "SELECT r.position, r.status, r.external_id, r.distance, r.duplicate_of_external_id, r.path, r.line, "
            "r.reason, r.hint FROM records r WHERE r.batch_id = :batch AND r.position > :after "
            "AND (CAST(:upto AS bigint) IS NULL OR r.position <= :upto) "
            "AND (CAST(:status AS text) IS NULL OR r.status = :status) ORDER BY r.position LIMIT 10000"),
            {"batch": batch_id, "after": after, "upto": upto, "status": status}).all()
        yield from (Record(*row) for row in part)
        if len(part) < 10000:
            return
        after = part[-1].position


class Record(NamedTuple):
    """One input record's outcome, as :func:`records` reads it."""
    position: int
    status: str
    external_id: str | None
    distance: int | None
    duplicate_of_id: str | None  #: the external id of the stored document it duplicates
    path: str | None
    line: int | None
    reason: str | None
    hint: str | None


def external_ids(connection: sa.Connection, ids: Iterable[int]) -> dict[int, str]:
    """{document id: external id} of those of ``ids`` that are stored."""
    ids = sorted(ids)
    if not ids:
        return {}
    return dict(connection.execute(sa.text("SELECT id, external_id FROM documents WHERE id = ANY(:ids)"),
                                   {"ids": ids}).all())


def documents(connection: sa.Connection, method: Method, ids: Sequence[int], *, keyed: bool = False,
              connections: int | None = 1) -> dict[int, sa.Row]:
    """{id: row} of stored documents (:func:`simdb.pg.keyed.document_columns`). On the keyed layout,
    many ids are read shard by shard (:func:`simdb.pg.keyed.by_shard`, the statements sent in a pipeline on each
    of ``connections`` coordinator connections: :func:`simdb.pg.keyed.routed_rows`): one ``= ANY`` over all of
    them makes every shard of every segment look up every id."""
    if not ids:
        return {}
    columns = keyed_layout.document_columns(method)
    if not keyed or len(ids) < keyed_layout.SHARD_BY_SHARD:
        return {row.id: row for row in connection.execute(
            sa.text(f"SELECT {columns} FROM documents WHERE id = ANY(:ids)"), {"ids": int8_array(ids)})}
    rows = keyed_layout.routed_rows(
        connection, f"SELECT {columns} FROM documents WHERE id = ANY(CAST(%(ids)s AS bigint[]))", "ids",
        keyed_layout.by_shard(connection, "documents", np.asarray(ids, dtype=np.int64)), namedtuple_row,
        connections)
    return {row.id: row for row in rows}


def stored_document(connection: sa.Connection, method: Method, external_id: str) -> sa.Row:
    """One stored document by its external id: its row, with its batch's name, the external ids of its
    cluster's canonical document and of its earliest near-duplicate, and its sketch."""
    row = connection.execute(sa.text(
        f"SELECT d.id, d.external_id, d.{sql_of(method).sketch_column[0]} AS sketch, d.text, d.metadata, d.length, "
        "d.created_at, b.name AS batch, d.cluster_id, d.duplicate_of, d.duplicate_distance "
        "FROM documents d JOIN batches b ON b.id = d.batch_id WHERE d.external_id = :external_id"),
        {"external_id": external_id}).first()
    if row is None:
        raise NotFound(f"no document with id {external_id!r} in the index; `simdb export` lists them")
    # the other two documents by id (joins of documents with itself on other columns are not co-located)
    names = external_ids(connection, {row.cluster_id, *([row.duplicate_of] if row.duplicate_of else [])})
    return StoredRow(row.id, row.external_id, row.sketch, row.text, row.metadata, row.length, row.created_at,
                     row.batch, names[row.cluster_id], names.get(row.duplicate_of), row.duplicate_distance)


class StoredRow(NamedTuple):
    """One stored document as :func:`stored_document` reads it."""
    id: int
    external_id: str
    sketch: object
    text: str | None
    metadata: dict
    length: int
    created_at: object
    batch: str
    cluster: str  #: the external id of its cluster's canonical (earliest) document
    duplicate_of: str | None  #: the external id of its earliest near-duplicate
    duplicate_distance: int | None


#: Ids per statement of :func:`texts`.
TEXTS_PER_STATEMENT = 10_000


def texts(connection: sa.Connection, ids: Iterable[int], unstored: Sequence[str] = ()) -> dict[int, str | None]:
    """{id: text} of stored documents (None where the index keeps no text), and of texts not stored, named
    -1, -2, ... for ``unstored[0]``, ``unstored[1]``, ...: the queries or input records compared with stored
    candidates, by lookups and ``simdb check`` (read-only: no temporary table; the ids go in arrays of
    bounded length)."""
    ids = [int(i) for i in ids]
    found: dict[int, str | None] = {i: unstored[-i - 1] for i in ids if i < 0}
    stored = [i for i in ids if i >= 0]
    for start in range(0, len(stored), TEXTS_PER_STATEMENT):  # an array of bounded length in each statement
        found.update(connection.execute(sa.text("SELECT id, text FROM documents WHERE id = ANY(:ids)"),
                                        {"ids": stored[start:start + TEXTS_PER_STATEMENT]}).all())
    return found


@functools.lru_cache(maxsize=64)
def _compiled(sql: str, dialect: sa.Dialect) -> sa.sql.compiler.Compiled:
    """``sql`` (with ``:name`` parameters) in the driver's own parameter style, compiled once."""
    return sa.text(sql).compile(dialect=dialect)


def lookup(connection: sa.Connection, method: Method, sketch, max_distance: int, *, keyed: bool = False
           ) -> list[tuple[tuple, int]]:
    """(document, distance) of every stored document within ``max_distance`` of one sketch, in one statement
    through the method's lookup (the analysts' function where it has one), verified by the method; on the keyed
    distributed layout, routed through its ``keys`` table (:func:`simdb.pg.keyed.lookup`)."""
    if keyed:
        return keyed_layout.lookup(connection, method, sketch, max_distance)
    candidates, params = sql_of(method).lookup_sql(sketch, max_distance)
    statement = _compiled(f"SELECT d.id, d.external_id, d.{sql_of(method).sketch_column[0]} AS sketch, d.metadata "
                          f"FROM ({candidates}) c JOIN documents d ON d.id = c.document_id", connection.dialect)
    # the driver's cursor, the statement prepared from its first run: a lookup is planned once per connection
    # (planning it took 1.9 of 2.6 ms at 10M documents in 6 segments), and the rows skip SQLAlchemy's layer;
    # a connection told to prepare nothing (prepare_threshold=None, as behind PgBouncer) is left so
    driver = connection.connection.driver_connection
    prepare = True if driver.prepare_threshold is not None else None
    rows = driver.cursor(row_factory=namedtuple_row).execute(
        statement.string, statement.construct_params(params), prepare=prepare).fetchall()
    distances = method.distances(sketch, [row.sketch for row in rows])
    return [(row, int(distance)) for row, distance in zip(rows, distances.tolist()) if distance <= max_distance]


def match_many(connection: sa.Connection, index: IndexContext, sketches: Sequence, max_distance: int, *,
               connections: int | None = None) -> list[dict[int, int]]:
    """For each sketch, {document id: distance} of the stored documents within ``max_distance``: per key column,
    one set-based statement that looks every probe's key up in the column's index, in key order
    (:mod:`simdb.pg.probes`), verified by popcount in SQL and again in numpy. The probes go to a temporary table
    with statistics (the key columns' statements shared out over ``connections`` connections reading this
    one's snapshot, each with its copy of the probes, as an ingest's chunk spreads its lookups: see
    :func:`spread_over`), or as arrays where the transaction is read-only (the reader role), which may not
    create even a temporary table (:func:`probe_arrays`)."""
    method = index.method
    found: list[dict[int, int]] = [{} for _ in sketches]
    if not index.keyed:  # the keyed layout reads keys and documents by routed statements, no segment by its keys
        hold_segments(connection)
    if index.keyed or connection.exec_driver_sql("SHOW transaction_read_only").scalar_one() == "on":
        pairs = probe_arrays(connection, index, sketches, max_distance, connections=connections)  # JIT off there
    else:
        without_jit(connection)
        keys, values = method.keys(sketches).tolist(), method.stored(sketches)
        columns = [("id", "int8"), index.sql.sketch_column, *((c, "int8") for c in method.key_columns)]

        def rows() -> Iterator[tuple]:
            return ((i, value, *key_row) for i, (value, key_row) in enumerate(zip(values, keys)))

        copy_in(connection, f"probes ({', '.join(name for name, _ in columns)})", [t for _, t in columns], rows(),
                create=True)
        connection.exec_driver_sql("ANALYZE probes")
        pairs = distinct(spread.spread_lookups(
            connection, index.sql, "probes", [Lookup("documents", not index.distributed)], max_distance, rows,
            spread_over(connection, index, len(sketches), connections))).tolist()
    for probe, document, distance in pairs:
        found[probe][document] = distance
    return found


def keyed_matches(connection: sa.Connection, index: IndexContext, sketches: Sequence, max_distance: int, *,
                  connections: int | None = None) -> tuple[list[dict[int, int]], dict[int, sa.Row]]:
    """On the keyed layout, outside a transaction block: (for each sketch, {document id: distance} of the stored
    documents within ``max_distance``; {id: row} of those documents, :func:`documents`). The probe of ``keys``
    and the read of the rows are statements of their own, each in its own snapshot of each worker: a removal, or
    ``sync``'s replacement of a document under its external id, that commits between them leaves matches whose
    rows are gone, and the new document unprobed. The sketches with such a match are looked up again (probe and
    rows) up to :data:`simdb.pg.keyed.READ_AGAIN` times, until every match found has its row; one still without
    it was being removed, and the caller leaves it out (as if the removal came first)."""
    method = index.method
    found = match_many(connection, index, sketches, max_distance, connections=connections)
    rows = documents(connection, method, sorted({d for distances in found for d in distances}), keyed=True,
                     connections=connections)
    for _ in range(keyed_layout.READ_AGAIN):
        again = [i for i, distances in enumerate(found) if any(d not in rows for d in distances)]
        if not again:
            break
        refound = match_many(connection, index, [sketches[i] for i in again], max_distance, connections=connections)
        rows.update(documents(connection, method, sorted({d for distances in refound for d in distances} - rows.keys()),
                              keyed=True, connections=connections))
        for i, distances in zip(again, refound):
            found[i] = distances
    return found, rows


def hold_segments(connection: sa.Connection) -> None:
    """Keep the segments as they are until ``connection``'s transaction ends, before its first statement takes
    its snapshot: in REPEATABLE READ a merge that committed between the snapshot and the first lookup (which
    locked the segments only then) gave the lookups its new segment, whose rows the merge wrote after the
    snapshot, and every document of the merged segments went missing. A lock takes no snapshot; a merge waits
    for the batch (the reader role may take it)."""
    connection.exec_driver_sql("LOCK TABLE documents IN ACCESS SHARE MODE")


def spread_over(connection: sa.Connection, index: IndexContext, queries: int, connections: int | None) -> int:
    """How many connections a batch of ``queries`` lookups is spread over: ``connections`` where given, else one
    below :data:`SPREAD_QUERIES` queries and :func:`simdb.pg.spread.default_connections` from there; one on a
    distributed index (Citus plans no LATERAL probe) or where ``connection`` cannot share its snapshot."""
    if index.distributed or not spread.can_share(connection):
        return 1
    if connections is not None:
        return connections
    return spread.default_connections(connection) if queries >= SPREAD_QUERIES else 1


#: Queries from which a batch's lookups are spread over several connections by default: a helper costs a few
#: round trips (a connection, its transaction, the snapshot), about what a hundred queries' lookups cost.
SPREAD_QUERIES = 200


def probe_arrays(connection: sa.Connection, index: IndexContext, sketches: Sequence, max_distance: int,
                 keys: np.ndarray | list[list[int]] | None = None, *, connections: int | None = None
                 ) -> Iterator[tuple[int, int, int]]:
    """``(sketch index, document id, distance)`` of the stored documents within ``max_distance`` of each sketch
    (``keys``: their key values, when the caller has them): per key column, one statement whose probes, the
    sketches with that column's keys, are sent as arrays and each looks its key up in the column's index, in
    key order (:func:`simdb.pg.probes.lateral_probe`), verified by popcount in SQL and again by the method. It
    writes nothing, not even a temporary table, so it runs in a read-only transaction.

    The key columns are shared out over connections (:func:`spread_over`), each reading ``connection``'s
    snapshot (:func:`simdb.pg.spread.on_shared_snapshot`), as an ingest's chunk spreads its lookups. A pair may come more than once. On the keyed distributed layout, routed by key
    through its ``keys`` table (:func:`simdb.pg.keyed.probe`), its statements spread over ``connections``
    coordinator connections (None: :func:`simdb.pg.keyed.coordinator_connections`)."""
    method = index.method
    if index.keyed:  # routed statements (each planned by its worker for its one shard's index probes)
        if not connection.connection.driver_connection.autocommit:  # check's later reads, as before
            without_jit(connection)
        yield from keyed_layout.probe(connection, method, sketches, max_distance, keys, connections=connections)
        return
    without_jit(connection)
    if not len(sketches):
        return
    keys = np.asarray(method.keys(sketches) if keys is None else keys, dtype=np.int64).reshape(len(sketches), -1)
    ids, stored = list(range(len(sketches))), method.stored(sketches)
    connections = spread_over(connection, index, len(sketches), connections)
    at = {column: i for i, column in enumerate(method.key_columns)}

    def share_pairs(columns: tuple[str, ...], on: sa.Connection) -> list[np.ndarray]:
        probe, params = _array_probe(method, ids, stored, {column: keys[:, at[column]] for column in columns})
        return list(index.sql.candidate_pairs(on, probe, "documents", max_distance, params=params,
                                              index_probes=not index.distributed, columns=columns))

    runs = spread.column_runs(method.key_columns, connections)
    found = spread.on_shared_snapshot(
        connection, functools.partial(share_pairs, runs[0], connection),
        [(functools.partial(share_pairs, run), functools.partial(share_pairs, run, connection)) for run in runs[1:]])
    for share in found:
        for chunk in share:
            yield from chunk.tolist()


def _array_probe(method: Method, ids: list[int], stored: list, keys: dict[str, np.ndarray]) -> tuple[str, dict]:
    """Probes (``ids``, their sketches as ``method`` stores them, and their values of the key columns ``keys``
    names) as a derived table of arrays sent as parameters, and those parameters: it needs no table, and Citus
    joins it with a distributed table on any column (each shard gets the arrays)."""
    sketch, kind = sql_of(method).sketch_column
    columns = [("id", "int8"), (sketch, kind), *((c, "int8") for c in keys)]
    arrays = ", ".join(f"CAST(%(p_{name})s AS {'bigint' if kind == 'int8' else kind}[])" for name, kind in columns)
    probe = f"(SELECT * FROM unnest({arrays}) AS probe({', '.join(name for name, _ in columns)}))"
    return probe, {"p_id": int8_array(ids), f"p_{sketch}": int8_array(stored) if kind == "int8" else stored,
                   **{f"p_{column}": int8_array(values) for column, values in keys.items()}}


def stored_ids(connection: sa.Connection, external_ids: Sequence[str]) -> dict[str, sa.Row]:
    """{external id: (content_hash, batch name)} of those of ``external_ids`` that are stored."""
    if not external_ids:
        return {}
    return {row.external_id: row for row in connection.execute(sa.text(
        "SELECT d.external_id, d.content_hash, b.name AS batch FROM documents d JOIN batches b ON b.id = d.batch_id "
        "WHERE d.external_id = ANY(:ids)"), {"ids": list(external_ids)})}


def content_hashes(connection: sa.Connection, ids: Sequence[int]) -> dict[int, bytes]:
    """{id: content hash} of those of the stored documents ``ids`` (read-only: the ids go in an array)."""
    if not len(ids):
        return {}
    return dict(connection.execute(sa.text("SELECT id, content_hash FROM documents WHERE id = ANY(:ids)"),
                                   {"ids": [int(i) for i in ids]}).all())


def pairs(connection: sa.Connection, max_distance: int, batch: int | None = None) -> Iterator[sa.Row]:
    """Stored pairs ``(a, b, distance)`` (external ids, a stored first) within ``max_distance``, of which one
    document at least is of ``batch`` (its id) when given, streamed."""
    in_batch = " AND (a.batch_id = :batch OR b.batch_id = :batch)" if batch is not None else ""
    yield from connection.execution_options(yield_per=10_000).execute(sa.text(
        "SELECT a.external_id AS a, b.external_id AS b, p.distance FROM near_duplicates p "
        "JOIN documents a ON a.id = p.a_id JOIN documents b ON b.id = p.b_id "
        f"WHERE p.distance <= :limit{in_batch} ORDER BY p.a_id, p.b_id"), {"limit": max_distance, "batch": batch})


def export(connection: sa.Connection, method: Method, *, batch: int | None = None, unique: bool = False,
           canonical: bool = False) -> Iterator[sa.Row]:
    """Documents' ``(external_id, sketch, metadata, batch)`` in the order stored, streamed: all of them, or those
    of one batch; with ``unique`` those whose verdict was ``new`` when they arrived (they duplicated nothing
    stored before them), with ``canonical`` the earliest of each cluster as the archive stands (``id =
    cluster_id``).

    A verdict is history: the record's status, which no later batch or removal changes (``duplicate_of`` is
    re-pointed, or cleared, when the document it names is removed). Documents stored before verdicts were
    kept (revision 0005) have no record; they are unique when they point at no earlier document. Ids only
    grow, so they all come before the first document with a record, and the two parts are read in turn.
    """
    select = (f"SELECT d.external_id, d.{sql_of(method).sketch_column[0]} AS sketch, d.metadata, b.name AS batch "
              "FROM documents d JOIN batches b ON b.id = d.batch_id WHERE ")
    scope = ["d.batch_id = :batch"] if batch is not None else []
    in_batch = " AND batch_id = :batch" if batch is not None else ""
    params = {"batch": batch}
    parts = [[*scope, *(["d.id = d.cluster_id"] if canonical else [])]]
    if unique:
        params["first"] = connection.execute(sa.text(  # the first document stored with a record
            f"SELECT min(document_id) FROM records WHERE status IN ('new', 'exact', 'near'){in_batch}"),
            params).scalar()
        parts = [[*scope, "d.duplicate_of IS NULL", *(["d.id < :first"] if params["first"] is not None else [])]]
        if params["first"] is not None:  # a subquery, not a join: records and documents are not co-located on Citus
            parts.append([*scope, f"d.id IN (SELECT document_id FROM records WHERE status = 'new'{in_batch})"])
    for conditions in parts:
        yield from connection.execution_options(yield_per=10_000).execute(sa.text(
            select + (" AND ".join(conditions) or "true") + " ORDER BY d.id"), params)


#: Documents ``stats`` samples to measure the key buckets of a large archive; an archive of at most 50 times
#: as many is measured whole (one aggregation per key: about 5 s per key at 10M documents).
STATS_SAMPLE = 2_000


def statistics(connection: sa.Connection, method: Method, *, sample: int | None = STATS_SAMPLE,
               keyed: bool = False) -> dict:
    """Counts, batches, size, and the key buckets: the mean number of other documents sharing a document's
    key (summed over the keys: the candidates a lookup of a stored document meets) and the largest buckets.

    Above ``50 * sample`` documents (``sample`` None: never) the buckets are those of a seeded random
    sample of documents, each counted through the key's indexes: the mean over the sample estimates the
    mean over the archive without bias, and the largest buckets are the largest the sample meets
    (a bucket holding a share *s* of the archive is met with probability ``1 - (1 - s) ** sample``).
    """
    counts = connection.execute(sa.text(
        "SELECT count(*) AS documents, count(duplicate_of) AS duplicates FROM documents")).one()
    size = connection.execute(sa.text(  # a partitioned table has no storage of its own: its segments do
        "SELECT coalesce(sum(pg_total_relation_size(inhrelid)), 0)::int8 FROM pg_inherits "
        "WHERE inhparent = CAST('documents' AS regclass)")).scalar_one()
    sampled = sample is not None and counts.documents > 50 * sample
    if keyed:  # counted in its keys table (documents has no key columns there)
        means, largest, measured = _keyed_buckets(connection, method, counts.documents, sample if sampled else None)
        return {"documents": counts.documents, "duplicates": counts.duplicates, "batches": batches(connection),
                "table_bytes": size, "measured": sum(means), "largest": sorted(largest, reverse=True)[:5],
                "sampled": measured}
    rows = _sampled_keys(connection, method, counts.documents, sample) if sampled else None
    means, largest = [], []
    for i, column in enumerate(method.key_columns):
        if sampled:
            values = [row[i] for row in rows]
            buckets = dict(connection.execute(sa.text(
                f"SELECT {column}, count(*) FROM documents WHERE {column} = ANY(CAST(:values AS bigint[])) "
                f"GROUP BY {column}"),
                {"values": sorted(set(values))}).all())
            means.append(sum(buckets[value] - 1 for value in values) / max(len(values), 1))
            largest += [(n, column, value) for value, n in sorted(buckets.items(), key=lambda b: -b[1])[:3]]
            continue
        found = connection.execute(sa.text(  # one pass over the archive per key
            f"WITH b AS MATERIALIZED (SELECT {column} AS value, count(*) AS n FROM documents GROUP BY {column}) "
            "SELECT m.mean, t.value, t.n FROM (SELECT coalesce(sum(n * (n - 1))::float8 / nullif(sum(n), 0), 0) "
            "AS mean FROM b) m "  # the other documents in a document's bucket, on average
            "LEFT JOIN LATERAL (SELECT value, n FROM b ORDER BY n DESC LIMIT 3) t ON true")).all()
        means.append(found[0].mean)
        largest += [(row.n, column, row.value) for row in found if row.n is not None]
    return {"documents": counts.documents, "duplicates": counts.duplicates, "batches": batches(connection),
            "table_bytes": size, "measured": sum(means), "largest": sorted(largest, reverse=True)[:5],
            "sampled": len(rows) if sampled else None}


def _keyed_buckets(connection: sa.Connection, method: Method, population: int, sample: int | None
                   ) -> tuple[list[float], list[tuple[int, str, int]], int | None]:
    """:func:`statistics`'s buckets on the keyed layout, from its keys table (``documents`` has no key columns
    there): (the mean bucket of each key, the largest buckets as (size, key column, value), documents sampled
    or None). A stored key folds its key number into its low bits (:func:`simdb.pg.keyed.fold`)."""
    keys, columns, bits = keyed_layout.table(method), method.key_columns, keyed_layout.KEY_NUMBER_BITS
    mask = (1 << bits) - 1
    if sample is not None:
        stored = [row[0] for row in random_rows(connection, [sql_of(method).sketch_column[0]], population, sample,
                                                "SYSTEM")]
        return (*keyed_sample_buckets(connection, method, stored), len(stored))
    per_key = dict(connection.exec_driver_sql(  # one pass over the keys table, each key's bucket on its shard
        f"SELECT key & {mask}, coalesce(sum(n * (n - 1))::float8 / nullif(sum(n), 0), 0) "
        f"FROM (SELECT key, count(*) AS n FROM {keys} GROUP BY key) b GROUP BY 1").all())
    top = connection.exec_driver_sql(
        f"SELECT key & {mask}, key >> {bits}, count(*) AS n FROM {keys} GROUP BY key ORDER BY n DESC, key LIMIT 5"
    ).all()
    return ([per_key.get(i, 0.0) for i in range(len(columns))],
            [(n, columns[number], value) for number, value, n in top], None)


def keyed_sample_buckets(connection: sa.Connection, method: Method, stored: list
                         ) -> tuple[list[float], list[tuple[int, str, int]]]:
    """:func:`_keyed_buckets` of a sample of stored sketches: their stored keys computed from them, counted where
    they are stored (one ``key = ANY(...)``)."""
    columns, bits = method.key_columns, keyed_layout.KEY_NUMBER_BITS
    key_rows = np.asarray(method.stored_keys(np.asarray(stored, dtype=np.int64)), dtype=np.int64)
    folded = keyed_layout.fold(key_rows).reshape(-1, len(columns))
    buckets = dict(connection.exec_driver_sql(
        f"SELECT key, count(*) FROM {keyed_layout.table(method)} WHERE key = ANY(CAST(%(keys)s AS bigint[])) "
        "GROUP BY key", {"keys": int8_array(np.unique(folded))}).all())
    means, largest = [], []
    for i, column in enumerate(columns):
        values = folded[:, i].tolist()
        means.append(sum(buckets.get(value, 1) - 1 for value in values) / max(len(values), 1))
        seen = sorted({value: buckets.get(value, 0) for value in values}.items(), key=lambda b: -b[1])[:3]
        largest += [(n, column, value >> bits) for value, n in seen]
    return means, largest


def _sampled_keys(connection: sa.Connection, method: Method, population: int, size: int) -> list[tuple]:
    """The key values of a seeded random sample of ``size`` documents (pages sampled first: reads a few
    hundred pages, not the table)."""
    return [tuple(row) for row in random_rows(connection, method.key_columns, population, size, "SYSTEM")]


def random_rows(connection: sa.Connection, columns: list[str], population: int, size: int, sampling: str,
                where: str = "", params: dict | None = None) -> list:
    """``columns`` of a seeded random sample of ``size`` of the ``population`` documents (those matching
    ``where``): ``TABLESAMPLE sampling`` (``SYSTEM``: pages; ``BERNOULLI``: rows) of three times as many,
    then rows at random from them; the same rows on every call while the table is unchanged."""
    percent = 100.0 * 3 * size / max(population, 1)
    tablesample = f"TABLESAMPLE {sampling} ({percent:.6f}) REPEATABLE (2007) " if percent < 100 else ""
    connection.execute(sa.text("SELECT setseed(0.2007)"))
    return connection.execute(sa.text(
        f"SELECT {', '.join(columns)} FROM documents {tablesample}" + (f"WHERE {where} " if where else "")
        + f"ORDER BY random() LIMIT {int(size)}"), params or {}).all()


def _distance_sample(connection: sa.Connection, index: IndexContext, batch: int | None, population: int,
                     size: int) -> tuple[list[int], int]:
    """(candidate pairs at each distance 0..max, documents sampled) for a seeded random sample of documents."""
    method = index.method
    ids = [row.id for row in random_rows(connection, ["id"], population, size, "BERNOULLI",
                                         "batch_id = :batch" if batch is not None else "", {"batch": batch})]
    if index.keyed:  # its keys table, probed by the sample's sketches (documents has no key columns there)
        rows = connection.execute(sa.text(f"SELECT id, {index.sql.sketch_column[0]} FROM documents "
                                          "WHERE id = ANY(:ids) ORDER BY id"), {"ids": ids}).all()
        own = [row[0] for row in rows]
        found = {(own[at], document, distance) for at, document, distance in keyed_layout.probe(
            connection, method, to_unsigned_array(np.asarray([row[1] for row in rows], dtype=np.int64)).tolist(),
            method.max_possible_distance)
            if document != own[at]}
        counts = [0] * (method.max_possible_distance + 1)
        for _, _, distance in found:
            counts[distance] += 1
        return counts, len(ids)
    columns = ", ".join(["id", index.sql.sketch_column[0], *method.key_columns])
    rows = connection.execute(sa.text(f"SELECT {columns} FROM documents WHERE id = ANY(:ids) ORDER BY id"),
                              {"ids": ids}).all()
    # arrays, not a temporary table: the report reads in a read-only transaction
    sample, params = _array_probe(method, [row[0] for row in rows], [row[1] for row in rows],
                                  {column: [row[2 + i] for row in rows] for i, column in enumerate(method.key_columns)})
    found = distinct(index.sql.candidate_pairs(connection, sample, "documents", method.max_possible_distance,
                                               where="t.id <> p.id", params=params, index_probes=not index.distributed))
    counts = [0] * (method.max_possible_distance + 1)
    for distance in found[:, 2].tolist():
        counts[distance] += 1
    return counts, len(ids)


def report_data(connection: sa.Connection, index: IndexContext, batch: str | None, *, sample_size: int, clusters: int,
                members: int, pairs: int = 0, text_chars: int = 0, sample_chars: int = 0, by: str | None = None,
                by_values: int = 20) -> dict:
    """Everything ``simdb report`` shows, read in one read-only snapshot; with ``pairs``, that many stored pairs
    whose texts differ, least similar first, with their texts' first ``text_chars`` characters (and cluster
    members with their first ``sample_chars``); with ``by``, the duplicate rate by that metadata field."""
    read_only_snapshot(connection)
    chosen = batch_id(connection, batch) if batch is not None else None
    data = {"stored": document_count(connection),
            "batches": connection.execute(sa.text(
                "SELECT s.*, coalesce(d.stored, 0) AS stored, coalesce(d.duplicates, 0) AS duplicates "
                "FROM batch_summary s LEFT JOIN (SELECT batch_id, count(*) AS stored, count(duplicate_of) AS "
                "duplicates FROM documents GROUP BY batch_id) d USING (batch_id) ORDER BY s.batch_id")).all()}
    if not data["stored"]:
        return data
    if chosen is None:
        scope, params, population = "", {}, data["stored"]
        singletons = f"SELECT {int(population)} - coalesce(sum(size), 0) FROM clusters"  # the rest are alone
    else:
        scope = "WHERE cluster_id IN (SELECT cluster_id FROM documents WHERE batch_id = :batch)"
        params = {"batch": chosen}
        population = next(row.stored for row in data["batches"] if row.batch_id == chosen)
        # the batch's documents less those in a cluster of two or more (the clusters table's)
        singletons = (f"SELECT {int(population)} - count(*) FROM documents d JOIN clusters c "
                      "ON c.cluster_id = d.cluster_id WHERE d.batch_id = :batch")
    data["sources"] = batch_sources(connection)
    data["pair_distances"] = pair_distances(connection, chosen)
    data["by"] = metadata_breakdown(connection, by, chosen, by_values) if by is not None else None
    data["counts"], data["sampled"] = _distance_sample(connection, index, chosen, population, sample_size)
    data["sizes"] = connection.execute(sa.text(
        f"SELECT size, count(*) FROM clusters {scope} GROUP BY size ORDER BY size"), params).all()
    data["singletons"] = connection.execute(sa.text(singletons), params).scalar_one()
    data["clusters"] = connection.execute(sa.text(
        f"SELECT * FROM duplicate_clusters {scope} ORDER BY size DESC, cluster_id LIMIT {int(clusters)}"),
        params).all()
    data["members"] = shown = {}
    for row in connection.execute(sa.text(  # the canonical document first, then the batch's, then the earliest
            "SELECT * FROM (SELECT d.cluster_id, d.external_id, d.metadata, d.duplicate_distance, b.name AS batch, "
            f"left(d.text, {int(sample_chars)}) AS text, "
            "row_number() OVER (PARTITION BY d.cluster_id ORDER BY d.id <> d.cluster_id, "
            "d.batch_id IS DISTINCT FROM :batch, d.id) AS n FROM documents d JOIN batches b ON b.id = d.batch_id "
            f"WHERE d.cluster_id = ANY(:clusters)) m WHERE n <= {int(members)} ORDER BY cluster_id, n"),
            {"clusters": [c.cluster_id for c in data["clusters"]], "batch": chosen}):
        shown.setdefault(row.cluster_id, []).append(row)
    data["pairs"] = differing_pairs(connection, chosen, pairs, text_chars) if pairs else []
    return data


class ShownPair(NamedTuple):
    """A pair as the report shows it."""
    a_external_id: str
    b_external_id: str
    distance: int
    a_text: str | None
    b_text: str | None


def differing_pairs(connection: sa.Connection, batch: int | None, limit: int, text_chars: int) -> list[ShownPair]:
    """The ``limit`` least similar stored pairs whose texts differ (content hashes: a pair at distance 0 may
    differ by a character), of those found when batch ``batch`` was ingested (None: all), with their texts'
    first ``text_chars`` characters."""
    chosen = connection.execute(sa.text(
        "SELECT p.a_id, p.b_id, p.distance FROM near_duplicates p JOIN documents a ON a.id = p.a_id "
        "JOIN documents b ON b.id = p.b_id WHERE a.content_hash <> b.content_hash "
        + ("AND p.batch_id = :batch " if batch is not None else "")
        + f"ORDER BY p.distance DESC, p.a_id, p.b_id LIMIT {int(limit)}"), {"batch": batch}).all()
    # their documents by id (a join of a pair with both its documents' texts is not co-located when distributed)
    shown = {row.id: row for row in connection.execute(sa.text(
        f"SELECT id, external_id, left(text, {int(text_chars)}) AS text FROM documents WHERE id = ANY(:ids)"),
        {"ids": sorted({i for pair in chosen for i in pair[:2]})})} if chosen else {}
    return [ShownPair(shown[a].external_id, shown[b].external_id, distance, shown[a].text, shown[b].text)
            for a, b, distance in chosen]


def batch_sources(connection: sa.Connection) -> list[sa.Row]:
    """``(batch_id, source_id, documents)``: how many of each batch's stored documents have their earliest
    near-duplicate (``duplicate_of``) in each batch, the batch itself included."""
    return connection.execute(sa.text(
        "SELECT d.batch_id, o.batch_id AS source_id, count(*) AS documents FROM documents d "
        "JOIN documents o ON o.id = d.duplicate_of GROUP BY d.batch_id, o.batch_id ORDER BY 1, 2")).all()


def pair_distances(connection: sa.Connection, batch: int | None) -> list[sa.Row]:
    """``(distance, pairs)`` of the stored pairs (those found when batch ``batch`` was ingested; None: all)."""
    return connection.execute(sa.text(
        "SELECT distance, count(*) AS pairs FROM near_duplicates "
        + ("WHERE batch_id = :batch " if batch is not None else "") + "GROUP BY distance ORDER BY distance"),
        {"batch": batch}).all()


class Breakdown(NamedTuple):
    """One row of the duplicate rate by a metadata field: a value (``kind`` "value"), the documents without
    the field or with null (``kind`` "none"), or the values beyond the most frequent ones together
    (``kind`` "other", ``values`` of them)."""
    kind: str
    value: str | None
    documents: int
    duplicates: int
    values: int


def metadata_breakdown(connection: sa.Connection, field: str, batch: int | None, top: int) -> list[Breakdown]:
    """Documents, and those with an earlier near-duplicate, for each value of the metadata field ``field`` (as
    text), the ``top`` most frequent values first, then the rest as one row, then the documents without it."""
    rows = connection.execute(sa.text(
        "WITH g AS MATERIALIZED (SELECT metadata ->> :field AS value, count(*) AS documents, "
        "count(duplicate_of) AS duplicates FROM documents "
        + ("WHERE batch_id = :batch " if batch is not None else "") + "GROUP BY 1), "
        "r AS (SELECT *, row_number() OVER (ORDER BY documents DESC, value) AS rank FROM g WHERE value IS NOT NULL) "
        "SELECT * FROM (SELECT 'value' AS kind, value, documents, duplicates, 1 AS values, rank FROM r "
        "WHERE rank <= :top UNION ALL SELECT 'other', NULL, sum(documents), sum(duplicates), count(*), :top + 1 "
        "FROM r WHERE rank > :top HAVING count(*) > 0 UNION ALL SELECT 'none', NULL, documents, duplicates, 1, "
        ":top + 2 FROM g WHERE value IS NULL) t ORDER BY rank"), {"field": field, "batch": batch, "top": top}).all()
    return [Breakdown(row.kind, row.value, int(row.documents), int(row.duplicates), int(row.values)) for row in rows]


def metadata_fields(connection: sa.Connection, sample: int = 1000) -> list[str]:
    """The metadata fields of the first ``sample`` stored documents, sorted (to say which exist)."""
    return list(connection.execute(sa.text(
        "SELECT DISTINCT jsonb_object_keys(metadata) FROM (SELECT metadata FROM documents "
        f"WHERE jsonb_typeof(metadata) = 'object' LIMIT {int(sample)}) s ORDER BY 1")).scalars())


def cluster_members_csv(connection: sa.Connection, method: Method, batch: str | None,
                        text_chars: int) -> Iterator[bytes]:
    """Every member of every cluster of two or more (those that include a document of ``batch``) as CSV with
    a header, made by the server and streamed: largest cluster first, each cluster's members in the order
    stored. Columns: the cluster's size and canonical (earliest) document, the member's id, batch, time
    stored (UTC), its earliest near-duplicate with their distance and similarity, its metadata (JSON) and
    its text's first ``text_chars`` characters, whitespace collapsed (where the index keeps texts).

    The members and the external ids they name are read first, each as a whole (a distributed index
    joins documents with clusters on ``cluster_id`` only so: neither is its distribution column)."""
    chosen = None
    if batch is not None:  # the batch's clusters by id: Citus joins no subquery of documents with the members
        chosen = list(connection.execute(sa.text(
            "SELECT DISTINCT k.cluster_id FROM clusters k JOIN documents d ON d.cluster_id = k.cluster_id "
            "WHERE d.batch_id = :batch"), {"batch": batch_id(connection, batch)}).scalars())
    similarity = sql_of(method).similarity_sql("m.duplicate_distance")
    sql = (
        "WITH members AS MATERIALIZED (SELECT k.size, k.cluster_id, d.id, d.external_id, d.batch_id, d.created_at, "
        f"d.duplicate_of, d.duplicate_distance, d.metadata, left(d.text, {int(text_chars)}) AS text FROM clusters k "
        "JOIN documents d ON d.cluster_id = k.cluster_id"
        + (" WHERE k.cluster_id = ANY(CAST(%(clusters)s AS bigint[]))" if chosen is not None else "") + "), "
        "names AS MATERIALIZED (SELECT id, external_id FROM documents "
        "WHERE id IN (SELECT cluster_id FROM members UNION SELECT duplicate_of FROM members)) "
        "SELECT m.size AS cluster_size, c.external_id AS canonical_id, m.external_id AS id, b.name AS batch, "
        "to_char(m.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"') AS stored_at, "
        "o.external_id AS duplicate_of, m.duplicate_distance AS distance, "
        f"round(CAST({similarity} AS numeric), 4) AS similarity, m.metadata, "
        "btrim(regexp_replace(m.text, '\\s+', ' ', 'g')) AS text FROM members m JOIN batches b ON b.id = m.batch_id "
        "JOIN names c ON c.id = m.cluster_id LEFT JOIN names o ON o.id = m.duplicate_of "
        "ORDER BY m.size DESC, m.cluster_id, m.id")
    cursor = connection.connection.dbapi_connection.cursor()
    with cursor.copy(f"COPY ({sql}) TO STDOUT (FORMAT csv, HEADER)",
                     {"clusters": chosen} if chosen is not None else None) as copy:
        yield from copy
