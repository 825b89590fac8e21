"""One ingest chunk, one transaction: stage, set aside stored ids, match, insert, record outcomes.

Under the ingest lock (so concurrent ingests into one index match one after another), the chunk
gets document ids in input order, is binary-COPY'd into a temporary staging table, and ids already
stored are set aside (the same text in another batch: a re-run; otherwise an error). The method's
candidate joins match the staging table against each segment of the archive (by index lookups in key
order, :mod:`simdb.pg.probes`, or, for a segment of few documents per probe, in memory,
:mod:`simdb.pg.in_memory`) and against the chunk's earlier
documents; the verified pairs give each document its earliest near-duplicate, its cluster and whether
its exact text is stored (:func:`simdb.decisions.decide_chunk`, as ``check`` decides), and one ``INSERT ... SELECT`` stores the chunk:
into the active segment, or, for a chunk of at least the policy's ``bulk_chunk`` documents, into a bare
segment of its own that is indexed and attached after it is filled (:func:`simdb.pg.segments.place_chunk`).
Every input record's outcome goes to ``records`` and the batch row is updated with the counts and how
many input records it has consumed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime

import numpy as np
import sqlalchemy as sa

from ..errors import BatchError, InputError, SimdbError
from ..inputs import checks
from ..decisions import decide_chunk
from ..methods import Method
from .catalog import check_layout, record_segmenter
from . import keyed as keyed_layout
from .clusters import merge_cluster_rows, merge_clusters
from .copy import copy_in, copy_in_columns, id_table
from .database import lock
from .field_counts import count_chunk
from .in_memory import MemoryProbes
from .methods import sql_of
from .probes import lateral_probe, without_jit
from .segments import attach_indexed, index_bare, list_segments, place_chunk, seal, segment_pairs

def create_staging(connection: sa.Connection, method: Method, texts: bool = False, *, keyed: bool = False
                   ) -> list[tuple[str, str]]:
    """The transaction's temporary staging table (with the documents' ``text`` when ``texts``; without key
    columns where ``documents`` has none, on the ``keyed`` layout); returns its (column, type) list. A
    document's ``metadata`` is NULL there when it has none (see :func:`_from_staging`)."""
    columns = ([("id", "int8"), ("external_id", "text"), sql_of(method).sketch_column]
               + [(name, "int8") for name in keyed_layout.document_key_columns(method, keyed)]
               + [("content_hash", "bytea"), ("length", "int4"), ("metadata", "jsonb")]
               + ([("text", "bytea")] if texts else []))  # UTF-8, decoded by the INSERT
    connection.exec_driver_sql(
        "CREATE TEMPORARY TABLE staging ("
        + ", ".join(f"{n} {t}{'' if n == 'metadata' else ' NOT NULL'}" for n, t in columns)
        + ", position int8) ON COMMIT DROP")  # position: the record's place in the batch's input
    return columns


class ConcurrentIngest(BatchError):
    """Another ingest (or resume) of the batch stored chunks since this one read where the batch stood."""


def open_batch(connection: sa.Connection, name: str, source: str, first: bool,
               started_at: datetime | None = None, stored_up_to: int | None = None) -> int:
    """The batch's id: a new batch when ``first`` (started at ``started_at``, when its reading began; default
    now), else the running batch of that name, which must have consumed ``stored_up_to`` input records
    (where this process's last chunk, or its resume, left it) unless that is None."""
    if first:
        batch_id = connection.execute(sa.text(
            "INSERT INTO batches (name, source, status, started_at) "
            "VALUES (:name, :source, 'running', coalesce(CAST(:started AS timestamptz), now())) "
            "ON CONFLICT (name) DO NOTHING RETURNING id"), {"name": name, "source": source, "started": started_at}
        ).scalar()
        if batch_id is None:
            raise BatchError(f"a batch named {name!r} already exists; choose another «batch» name "
                             "(or «resume» it if it was interrupted)")
        return batch_id
    row = connection.execute(sa.text(
        "SELECT id, position FROM batches WHERE name = :name AND status = 'running' FOR UPDATE"),
        {"name": name}).first()
    if row is None:
        raise BatchError(f"batch {name!r} was removed or completed by another process during this ingest")
    if stored_up_to is not None and row.position != stored_up_to:
        raise ConcurrentIngest(
            f"another ingest or resume of batch {name!r} stored its input records {stored_up_to + 1:,} to "
            f"{row.position:,} while this one was reading them, so this one stopped there; let the other finish, "
            "and «resume» the batch again only if it is still running after that")
    return row.id


@dataclass
class ChunkResult:
    rejected: list[tuple[int, InputError]]  # (position in the batch's input, error), in input order
    stored: int


def store_chunk(connection: sa.Connection, schema: str, method: Method, chunk, *,
                 name: str, source: str, first: bool, final: bool, position: int,
                 rejects: list[tuple[int, InputError]] = (), skip_errors: bool,
                 started_at: datetime | None = None, stored_up_to: int | None = None,
                 rereads: bool = False, distributed: bool, keyed: bool, connections: int | None = None
                 ) -> ChunkResult:
    """Match and insert one chunk inside the caller's transaction; record every input record's outcome
    (``rejects`` are the reader's, by position) and update the batch's counts. A chunk that is not the
    batch's first follows its records ``stored_up_to`` (checked: see :func:`open_batch`). ``rereads``: the
    reader rejects an id it reads twice itself (a sync run), so an id that an earlier chunk of the batch stored
    is a row an interrupted run stored and this run read again: it is handled as one of another batch.
    ``distributed``, ``keyed``: the index is, and has the keyed layout (its settings say so). ``connections``:
    how many connections the lookups into large segments are spread over (see
    :func:`simdb.pg.segments.segment_pairs`)."""
    lock(connection, schema, "ingest")
    without_jit(connection)  # its probes and joins into a large archive were priced into JIT's inlining
    check_layout(connection, method, keyed_layout=keyed)
    record_segmenter(connection, method)
    batch_id = open_batch(connection, name, source, first, started_at, stored_up_to)
    count = len(chunk)
    ids, bulk_segment, sealed = place_chunk(connection, count, distributed=distributed)
    keys, stored_sketches = chunk.key_rows(method), method.stored(chunk.sketches)
    texts = chunk.texts if count and len(chunk.texts) == count else None
    if texts is None and count and method.needs_texts:
        raise SimdbError("this index decides by the documents' texts, and the chunk came without them: ingest "
                         "texts (simdb ingest, Index.add_many), not fingerprints")

    columns = create_staging(connection, method, texts is not None, keyed=keyed)
    column_list = ", ".join(name for name, _ in columns)
    values = [ids, chunk.external_ids, stored_sketches, *([] if keyed else keys.T), chunk.content_hashes,
              chunk.lengths, [metadata or None for metadata in chunk.metadata], *([texts] if texts is not None else [])]
    copy_in_columns(connection, "staging", [*((name, kind, column) for (name, kind), column
                                              in zip(columns, values, strict=True)),
                                            ("position", "int8", chunk.positions)])

    errors, unstored, already = _stored_ids(connection, chunk, ids, None if rereads else batch_id, keyed=keyed,
                                          distributed=distributed)
    if errors and not skip_errors:
        raise errors[0][1]
    if unstored:
        connection.execute(sa.text("DELETE FROM staging WHERE id = ANY(:ids)"), {"ids": unstored})
    # on one server, statistics of the columns the planner joins staging by alone: the chunk meets the segments'
    # keys through lookups in key order or in memory, never a join it plans, and the statistics of 21 MinHash
    # band keys, a signature or texts cost 0.35 of ANALYZE's 0.44 s per 100k (load 1) and planned nothing
    connection.exec_driver_sql("ANALYZE staging" + ("" if distributed else " (id, external_id)"))

    wide = method.candidate_distance(method.max_distance)  # the distance itself unless the method decides by the texts
    staged = ~np.isin(ids, unstored)
    staged_ids, staged_sketches, staged_keys = ids[staged], _kept(stored_sketches, staged), keys[staged]
    if keyed:  # the probes go to the shards of their keys, joined there (simdb.pg.keyed)
        keyed_layout.stage_probes(connection, staged_ids, staged_sketches, staged_keys)
        archive_pairs = keyed_layout.chunk_pairs(connection, method, wide, below=int(ids[0]) if count else 1)
    else:
        archive_pairs = segment_pairs(connection, method, "staging", count - len(unstored), wide,
                                      below=int(ids[0]) if count else 1, distributed=distributed,
                                      probe_rows=lambda: _probe_rows(ids, stored_sketches, keys, set(unstored)),
                                      memory_probes=lambda: MemoryProbes.of(method, staged_ids, staged_sketches,
                                                                            staged_keys),
                                      connections=connections)
    decision = decide_chunk(  # the decision ``check`` reaches the same way
        method, archive_pairs,
        staged_ids, staged_sketches, staged_keys,
        lambda wanted: chunk_or_stored(connection, ids, wanted, "text",  # UTF-8 in the chunk
                                       None if texts is None else lambda at: texts[at].decode("utf-8")),
        lambda wanted: chunk_or_stored(connection, ids, np.asarray(wanted, dtype=np.int64), "content_hash",
                                       chunk.content_hashes.__getitem__))
    pairs, duplicates, exact = decision.pairs, decision.duplicates, decision.exact
    clusters = merge_clusters(connection, pairs, ids)
    copy_in(connection, "staging_exact (id)", ["int8"], ((i,) for i in exact), create=True)
    # the name and batch of each one's earliest near-duplicate, which its verdict keeps whatever is removed later
    earlier = chunk_or_stored(connection, ids, duplicates[:, 1], ("external_id", "batch_id"),
                              lambda at: (chunk.external_ids[at], batch_id))
    copy_in(connection, "staging_duplicates (id, duplicate_of, distance, duplicate_of_external_id, "
            "duplicate_of_batch_id)", ["int8", "int8", "int2", "text", "int4"],
            ((*row, *earlier[row[1]]) for row in duplicates.tolist()), create=True)
    # every new document a pair touches gets its merged cluster, including one that is only the earlier
    # side of its pairs (it has no duplicate_of, yet a later document may link it to another cluster)
    copy_in(connection, "staging_clusters (id, cluster_id)", ["int8", "int8"], clusters.items(), create=True)
    target = f'"{bulk_segment}"' if bulk_segment else "documents"
    connection.exec_driver_sql(
        f"INSERT INTO {target} ({column_list}, batch_id, duplicate_of, duplicate_distance, cluster_id) "
        f"SELECT {', '.join(_from_staging(n) for n, _ in columns)}, {int(batch_id)}, m.duplicate_of, m.distance, "
        f"coalesce(c.cluster_id, s.id) FROM staging s LEFT JOIN staging_duplicates m USING (id) "
        f"LEFT JOIN staging_clusters c USING (id) ORDER BY s.id")
    if bulk_segment:  # indexed by sorting, then attached: the chunk's documents join the archive here
        index_bare(connection, bulk_segment, int(ids[0]), int(ids[-1]) + 1)
        attach_indexed(connection, bulk_segment, int(ids[0]), int(ids[-1]) + 1)
    if keyed:  # the chunk's key rows join the archive's, on the shards they were staged on
        keyed_layout.store_staged(connection, method)
    if len(pairs):  # the clusters the chunk's documents made, joined or merged
        merge_cluster_rows(connection, batch_id, method, schema, distributed=distributed)
    seal(connection, sealed)
    copy_in(connection, "near_duplicates (b_id, a_id, distance, batch_id)", ["int8", "int8", "int2", "int4"],
            ((probe, match, distance, batch_id) for probe, match, distance in pairs.tolist()))
    within = connection.execute(sa.text(
        "SELECT count(*) FROM staging_duplicates WHERE duplicate_of_batch_id = :batch"),
        {"batch": batch_id}).scalar_one()

    # what became of every input record of the chunk, in the same transaction as the documents
    connection.exec_driver_sql(
        "INSERT INTO records (batch_id, position, status, external_id, document_id, duplicate_of, distance, "
        f"duplicate_of_external_id, duplicate_of_batch_id) SELECT {int(batch_id)}, s.position, CASE WHEN e.id IS "
        "NOT NULL THEN 'exact' WHEN m.id IS NOT NULL THEN 'near' ELSE 'new' END, s.external_id, s.id, m.duplicate_of, "
        "m.distance, m.duplicate_of_external_id, m.duplicate_of_batch_id FROM staging s "
        "LEFT JOIN staging_duplicates m USING (id) LEFT JOIN staging_exact e USING (id)")
    count_chunk(connection)  # the counts by the metadata fields the index counts by
    rejected = sorted([*rejects, *errors], key=lambda pair: pair[0])
    copy_in(connection, "records (batch_id, position, status, external_id, document_id, path, line, reason, hint)",
            ["int4", "int8", "text", "text", "int8", "text", "int8", "text", "text"],
            [*((batch_id, chunk.positions[i], "already_stored", chunk.external_ids[i], document, None, None, None,
                None) for i, document in already),
             *((batch_id, at, "rejected", error.external_id, None, error.path, error.line,
                error.reason, error.hint) for at, error in rejected)])

    stored = count - len(unstored)
    connection.execute(sa.text(
        "UPDATE batches SET documents = documents + :stored, new = new + :new, "
        "exact_duplicates = exact_duplicates + :exact, near_duplicates = near_duplicates + :near, "
        "within_batch = within_batch + :within, already_stored = already_stored + :already, "
        "rejected = rejected + :rejected, position = :position, "
        "status = CASE WHEN :final THEN 'complete' ELSE status END, "
        "finished_at = CAST(:finished AS timestamptz) WHERE id = :id"),
        {"stored": stored, "new": stored - len(duplicates), "exact": len(exact), "near": len(duplicates) - len(exact),
         "within": within, "already": len(already), "rejected": len(rejected), "position": position,
         "final": final, "id": batch_id,
         # the server's clock, read apart: Citus takes no volatile function in an UPDATE of a reference table
         "finished": connection.execute(sa.text("SELECT clock_timestamp()")).scalar_one() if final else None})
    if final and not distributed:  # shards are plain tables on the workers: their autovacuum
        refresh_statistics(connection)
    return ChunkResult(rejected=rejected, stored=stored)


#: At the end of a batch, the tables are analyzed when the documents outgrew their statistics by this share.
STALE_GROWTH = 0.2
#: The SQLSTATE of a lock that NOWAIT could not take.
LOCK_NOT_AVAILABLE = "55P03"


def refresh_statistics(connection: sa.Connection) -> list[str]:
    """ANALYZE the tables analysts' queries read (the tables analyzed) when one has no planner statistics, or
    when the documents outgrew theirs by a fifth: autovacuum never analyzes a partitioned table such as
    ``documents`` (only its segments), and reaches a fresh table a minute or more later, so that the views were
    planned for empty tables. The documents held are read from the batches' counts (a scan of ``documents``
    would grow with the archive, at every batch's end); removals do not lower those counts, so after large ones
    the tables are analyzed more often than they need, at ANALYZE's bounded sampling cost. Tables that another
    session holds (a relayout's index build) are left for the next batch: the chunk never waits for them."""
    tables = ("documents", "near_duplicates", "clusters")
    estimated = dict(connection.execute(sa.text(
        "SELECT c.relname, c.reltuples FROM pg_class c WHERE c.oid = ANY(ARRAY[to_regclass('documents'), "
        "to_regclass('near_duplicates'), to_regclass('clusters')]::oid[])")).all())
    if all(estimated.get(table, -1) >= 0 for table in tables):
        held = connection.exec_driver_sql("SELECT coalesce(sum(documents), 0) FROM batches").scalar_one()
        if held <= (1 + STALE_GROWTH) * estimated["documents"]:
            return []
    try:  # never wait: an index build (relayout) holds a segment's lock while it waits for this transaction
        with connection.begin_nested():
            connection.exec_driver_sql(f"LOCK TABLE {', '.join(tables)} IN SHARE UPDATE EXCLUSIVE MODE NOWAIT")
            for table in tables:
                connection.exec_driver_sql(f"ANALYZE {table}")
    except sa.exc.OperationalError as error:
        if getattr(error.orig, "sqlstate", None) != LOCK_NOT_AVAILABLE:
            raise
        return []  # the next batch's last chunk analyzes them
    return list(tables)


def _probe_rows(ids: np.ndarray, sketches, keys: np.ndarray, left_out: set[int]) -> Iterator[tuple]:
    """The staged documents as the probes of a candidate join: (id, sketch, key columns...)."""
    for identifier, sketch, key_row in zip(ids.tolist(), sketches, keys.tolist()):
        if identifier not in left_out:
            yield (identifier, sketch, *key_row)


def _kept(stored: list, staged: np.ndarray) -> list:
    """The stored sketches of the staged documents."""
    return [sketch for sketch, kept in zip(stored, staged.tolist()) if kept]


def _from_staging(column: str) -> str:
    """The SQL storing a staged column: the text decoded; no metadata (staged as NULL: psycopg's JSON
    dumping of ``{}`` cost 0.6-1.4 s per 100k documents) stored as ``{}``, as it always was."""
    if column == "text":
        return "convert_from(s.text, 'UTF8')"
    return "coalesce(s.metadata, '{}'::jsonb)" if column == "metadata" else f"s.{column}"


def chunk_or_stored(connection: sa.Connection, ids: np.ndarray, wanted: np.ndarray, column: str | tuple[str, ...],
                    in_chunk: Callable[[int], object] | None) -> dict[int, object]:
    """{id: value} of the ``wanted`` ids: ``in_chunk(i)`` for the chunk's ``i``-th document (``ids[i]``), and
    ``column`` of ``documents`` for the stored ones (``in_chunk`` None: every one is read from there); for a
    tuple of columns, each value is the tuple of them."""
    found, stored = {}, []
    for i in np.unique(wanted).tolist():
        at = int(np.searchsorted(ids, i))
        if in_chunk is not None and at < len(ids) and ids[at] == i:
            found[i] = in_chunk(at)
        else:
            stored.append(i)
    found.update(stored_column(connection, column, stored))
    return found


def stored_column(connection: sa.Connection, column: str | tuple[str, ...], ids: list[int]) -> dict[int, object]:
    """{id: ``column``} of the stored documents ``ids``, joined with them by id (co-located on Citus); for a
    tuple of columns, {id: the tuple of them}."""
    if not ids:
        return {}
    columns = (column,) if isinstance(column, str) else column
    rows = connection.exec_driver_sql(
        f"SELECT d.id, {', '.join(f'd.{name}' for name in columns)} FROM documents d "
        f"JOIN {id_table(connection, 'wanted_ids', ids)} USING (id)").all()
    found = {row[0]: row[1] if isinstance(column, str) else tuple(row[1:]) for row in rows}
    connection.exec_driver_sql("DROP TABLE wanted_ids")
    return found


def _stored_ids(connection: sa.Connection, chunk, ids: np.ndarray, batch_id: int | None, *, keyed: bool,
                distributed: bool) -> tuple[list[tuple[int, InputError]], list[int], list[tuple[int, int]]]:
    """Staged ids that are already stored: (rejects by input position, every staging id to leave out,
    (chunk index, stored document id) of the ones already stored with the same text).

    The same id with the same text in another batch is a re-run: skipped. In this batch (``batch_id``; None:
    every batch counts as another), or with another text, it is an error. On the keyed layout the check is
    routed by external id (:func:`simdb.pg.keyed.stage_external_ids`), and only the documents it finds are
    read, by id.
    """
    if keyed:
        rows = _stored_by_external_id(connection, chunk, ids, batch_id)
    else:
        rows = sorted((row for target, probed in _external_id_lookups(connection, len(ids), distributed=distributed)
                       for row in connection.execute(sa.text(_stored_ids_sql(target, probed)), {"batch": batch_id})),
                      key=lambda row: row.id)
    errors, unstored, already = [], [], []
    for row in rows:
        i = int(np.searchsorted(ids, row.id))
        unstored.append(row.id)
        origin, external_id = chunk.origins[i], chunk.external_ids[i]
        if row.same_batch:
            error = checks.repeated_id(external_id, origin, "first in an earlier chunk")
        elif not row.same_text:
            error = checks.stored_with_another_text(external_id, origin, row.name)
        else:
            already.append((i, row.stored_id))
            continue
        errors.append((chunk.positions[i], error))
    return errors, unstored, already


def _external_id_lookups(connection: sa.Connection, probes: int, *, distributed: bool) -> list[tuple[str, bool]]:
    """``(target, probed)``: where :func:`_stored_ids` looks the chunk's external ids up. On one server, each
    segment on its own: one index descent per staged id into a segment that may hold more documents than the
    chunk has ids (``probed``), the planner's join for a smaller one. One join with ``documents`` let the planner
    hash the chunk's ids against a sequential scan of every segment: 7 to 11 s for 100k ids against 3M
    stored documents, a cost that grew with the archive; the descents grow with its logarithm. On Citus, one
    join with ``documents`` (it plans no ``LATERAL`` probe)."""
    if distributed:
        return [("documents", False)]
    return [(f'"{segment.name}"', segment.size > probes) for segment in list_segments(connection, distributed=False)]


def _stored_ids_sql(target: str, probed: bool) -> str:
    """The statement of :func:`_stored_ids` against ``target`` (``probed``: by a descent into its ``external_id``
    index per staged id, in external id order, so that neighbouring descents read the same pages)."""
    source = (lateral_probe("staging", target, "external_id", ["id", "external_id", "content_hash"],
                            ["id", "batch_id", "content_hash"], ["t.external_id = p.external_id"])
              if probed else f"staging p JOIN {target} t USING (external_id)")
    return ("SELECT p.id, t.id AS stored_id, t.batch_id IS NOT DISTINCT FROM :batch AS same_batch, "
            f"t.content_hash = p.content_hash AS same_text, b.name FROM {source} JOIN batches b ON b.id = t.batch_id")


def _stored_by_external_id(connection: sa.Connection, chunk, ids: np.ndarray, batch_id: int | None) -> list[tuple]:
    """:func:`_stored_ids`' rows ``(id, stored_id, same_batch, same_text, name)`` on the keyed layout: the chunk's
    external ids checked on the shards of their hashes, then the stored documents found read by id."""
    found = keyed_layout.stage_external_ids(connection, ids, chunk.external_ids)
    if not found:
        return []
    stored = {row.id: row for row in connection.execute(sa.text(
        "SELECT d.id, d.batch_id, d.content_hash, b.name FROM documents d JOIN batches b ON b.id = d.batch_id "
        "WHERE d.id = ANY(:ids)"), {"ids": [document for _, document in found]})}
    rows = []
    for new_id, document in found:
        row = stored[document]  # external_ids and documents change together: a missing row is a broken index
        at = int(np.searchsorted(ids, new_id))
        rows.append(_StoredId(new_id, document, row.batch_id == batch_id,
                              bytes(row.content_hash) == bytes(chunk.content_hashes[at]), row.name))
    return rows


@dataclass
class _StoredId:
    id: int
    stored_id: int
    same_batch: bool
    same_text: bool
    name: str


# -- the whole batch ---------------------------------------------------------------------------------

def resume_position(connection: sa.Connection, name: str, resume: bool) -> tuple[int, int, bool] | None:
    """(records consumed, documents stored, complete) of a batch to resume, or None for a new batch. A complete
    batch is resumed only to write its files again (a kill after its last chunk committed may have cut them)."""
    row = connection.execute(sa.text("SELECT status, position, documents FROM batches WHERE name = :name"),
                             {"name": name}).first()
    if row is None:
        if resume:
            raise BatchError(f"there is no batch {name!r} to resume; run without «resume» to start it")
        return None
    if row.status == "complete" and not resume:
        raise BatchError(f"batch {name!r} is already complete; choose another name with «batch» (or «resume» it to "
                         "write its verdicts and rejects files again)")
    if not resume:
        raise BatchError(f"batch {name!r} was interrupted after {row.position:,} input records; continue it "
                         f"with «resume», or remove what it stored with `simdb remove --batch {name}`")
    return row.position, row.documents, row.status == "complete"
