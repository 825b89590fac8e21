"""A batch of documents -> rows in the archive, set-based and atomic.

1. Fingerprint every document (outside any transaction) and refuse the batch
   at the first bad document or repeated id.
2. In one transaction: record the batch, take the ingest lock, reserve
   document ids in input order, binary-COPY the batch into a temporary
   staging table, and find the candidates of every new document by joining
   the staging table on each block key, against the archive and against the
   earlier documents of the batch itself.
3. Verify the candidates by popcount, point each document's ``duplicate_of``
   at its earliest near-duplicate, and insert the whole batch with one
   ``INSERT ... SELECT``.

Either all of it commits or none of it does. The ingest lock (a transaction
advisory lock) serialises the match-and-insert step of concurrent ingests into
one index, so two batches that arrive together still see each other.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np
import sqlalchemy as sa

from .bits import to_signed_array
from .blocks import BlockLayout
from .errors import BatchError, InputError
from .fingerprint import FingerprintSettings, content_hash, fingerprint
from .inputs import Document
from .matching import candidate_sql, collect, copy_out_int64, verified_pairs
from .migrate import lock


@dataclass
class FingerprintedBatch:
    """A batch ready for the database: one entry per document, in input order."""

    external_ids: list[str] = field(default_factory=list)
    simhashes: list[int] = field(default_factory=list)
    content_hashes: list[bytes] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    metadata: list[dict] = field(default_factory=list)
    origins: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.external_ids)

    def append(self, external_id: str, simhash: int, digest: bytes, length: int, metadata: dict,
               origin: str) -> None:
        self.external_ids.append(external_id)
        self.simhashes.append(simhash)
        self.content_hashes.append(digest)
        self.lengths.append(length)
        self.metadata.append(metadata)
        self.origins.append(origin)


def fingerprint_documents(documents: Iterable[Document], settings: FingerprintSettings,
                          progress: Callable[[int], None] | None = None) -> FingerprintedBatch:
    """Fingerprint a batch; raise :class:`InputError` at the first bad document or repeated id."""
    batch = FingerprintedBatch()
    seen: dict[str, str] = {}
    for document in documents:
        if document.external_id in seen:
            raise InputError(f"id {document.external_id!r} appears twice in this batch "
                             f"(first at {seen[document.external_id]})", path=document.path, line=document.line,
                             hint="ids must be unique; fix or drop one of them")
        seen[document.external_id] = document.origin
        try:
            simhash = fingerprint(document.text, settings)
        except InputError as exc:
            raise InputError(exc.reason, path=document.path, line=document.line, hint=exc.hint) from None
        batch.append(document.external_id, simhash, content_hash(document.text), len(document.text),
                     document.metadata, document.origin)
        if progress is not None:
            progress(1)
    return batch


@dataclass(frozen=True)
class BatchSummary:
    name: str
    documents: int
    new: int
    exact_duplicates: int
    near_duplicates: int
    within_batch: int
    seconds: float

    def __str__(self) -> str:
        return (f"batch {self.name!r}: {self.documents:,} documents: {self.new:,} new, "
                f"{self.exact_duplicates:,} exact duplicates, {self.near_duplicates:,} near-duplicates "
                f"({self.within_batch:,} of the duplicates matched within the batch) in {self.seconds:.1f} s")


#: Staged documents whose exact text is already stored or comes earlier in the batch. Two semi-joins
#: glued by UNION: with ``OR`` between the two ``EXISTS`` PostgreSQL cannot turn them into hash
#: joins and rescans the staging table once per row, which is quadratic in the batch size.
EXACT_DUPLICATES_SQL = (
    "SELECT s.id FROM staging s WHERE EXISTS (SELECT 1 FROM documents d WHERE d.content_hash = s.content_hash) "
    "UNION "
    "SELECT s.id FROM staging s WHERE EXISTS (SELECT 1 FROM staging e WHERE e.content_hash = s.content_hash "
    "AND e.id < s.id)")


def create_staging(connection: sa.Connection, layout: BlockLayout) -> list[tuple[str, str]]:
    """The transaction's temporary staging table; returns its (column, type) list."""
    columns = ([("id", "int8"), ("external_id", "text"), ("simhash", "int8")]
               + [(name, "int8") for name in layout.key_columns]
               + [("content_hash", "bytea"), ("length", "int4"), ("metadata", "jsonb")])
    connection.exec_driver_sql(
        "CREATE TEMPORARY TABLE staging (" + ", ".join(f"{n} {t} NOT NULL" for n, t in columns) + ") ON COMMIT DROP")
    return columns


def ingest_batch(connection: sa.Connection, schema: str, layout: BlockLayout, batch: FingerprintedBatch,
                 name: str, source: str) -> BatchSummary:
    """Match and insert a fingerprinted batch inside the caller's transaction."""
    started = time.perf_counter()
    count = len(batch)
    batch_id = connection.execute(sa.text(
        "INSERT INTO batches (name, source, status, started_at, documents) "
        "VALUES (:name, :source, 'running', now(), :count) ON CONFLICT (name) DO NOTHING RETURNING id"),
        {"name": name, "source": source, "count": count}).scalar()
    if batch_id is None:
        raise BatchError(f"a batch named {name!r} already exists; choose another name with --batch")
    lock(connection, schema, "ingest")

    sequence = connection.execute(sa.text("SELECT pg_get_serial_sequence('documents', 'id')::regclass::oid")).scalar_one()
    ids = collect(copy_out_int64(connection, f"SELECT nextval({int(sequence)}::oid::regclass) "
                                             f"FROM generate_series(1, {int(count)})", 1), 1)[:, 0]
    simhashes = np.array(batch.simhashes, dtype=np.uint64)
    keys = layout.block_keys_array(simhashes)
    signed = to_signed_array(simhashes)

    columns = create_staging(connection, layout)
    column_list = ", ".join(name for name, _ in columns)
    cursor = connection.connection.dbapi_connection.cursor()
    with cursor.copy(f"COPY staging ({column_list}) FROM STDIN (FORMAT BINARY)") as copy:
        copy.set_types([t for _, t in columns])
        id_list, signed_list, key_rows = ids.tolist(), signed.tolist(), keys.tolist()
        for i in range(count):
            copy.write_row((id_list[i], batch.external_ids[i], signed_list[i], *key_rows[i],
                            batch.content_hashes[i], batch.lengths[i], batch.metadata[i]))

    stored = connection.execute(sa.text(
        "SELECT s.external_id, b.name FROM staging s JOIN documents d USING (external_id) "
        "JOIN batches b ON b.id = d.batch_id ORDER BY s.id LIMIT 1")).first()
    if stored:
        origin = batch.origins[batch.external_ids.index(stored[0])]
        raise BatchError(f"{origin}: id {stored[0]!r} is already in the archive (batch {stored[1]!r}); "
                         "nothing from this batch was stored. Give new documents new ids, or remove the old one")
    connection.exec_driver_sql("ANALYZE staging")

    k = layout.max_distance
    sql = (candidate_sql(layout, "staging", "documents", k) + "\nUNION ALL\n"
           + candidate_sql(layout, "staging", "staging", k, earlier_only=True))
    pairs = collect(verified_pairs(connection, sql, k))
    exact = set(connection.execute(sa.text(EXACT_DUPLICATES_SQL)).scalars())

    duplicates = _earliest_matches(pairs)
    if len(duplicates):
        connection.exec_driver_sql("CREATE TEMPORARY TABLE staging_duplicates "
                                   "(id int8 NOT NULL, duplicate_of int8 NOT NULL, distance int2 NOT NULL) "
                                   "ON COMMIT DROP")
        with cursor.copy("COPY staging_duplicates FROM STDIN (FORMAT BINARY)") as copy:
            copy.set_types(["int8", "int8", "int2"])
            for row in duplicates.tolist():
                copy.write_row(row)
        join = "LEFT JOIN staging_duplicates m USING (id)"
        dup_columns = "m.duplicate_of, m.distance"
    else:
        join, dup_columns = "", "NULL::int8, NULL::int2"
    connection.exec_driver_sql(
        f"INSERT INTO documents ({column_list}, batch_id, duplicate_of, duplicate_distance) "
        f"SELECT {', '.join('s.' + n for n, _ in columns)}, {int(batch_id)}, {dup_columns} "
        f"FROM staging s {join} ORDER BY s.id")

    exact_count = len(exact)
    near_count = len(duplicates) - exact_count
    within = int(np.count_nonzero(duplicates[:, 1] >= ids[0])) if len(duplicates) and count else 0
    summary = BatchSummary(name=name, documents=count, new=count - len(duplicates), exact_duplicates=exact_count,
                           near_duplicates=near_count, within_batch=within,
                           seconds=time.perf_counter() - started)
    connection.execute(sa.text(
        "UPDATE batches SET status = 'complete', finished_at = clock_timestamp(), new = :new, "
        "exact_duplicates = :exact, near_duplicates = :near, within_batch = :within WHERE id = :id"),
        {"new": summary.new, "exact": exact_count, "near": near_count, "within": within, "id": batch_id})
    return summary


def _earliest_matches(pairs: np.ndarray) -> np.ndarray:
    """``(probe, match, distance)`` rows -> one ``(probe, earliest match, its distance)`` per probe."""
    if not len(pairs):
        return np.empty((0, 3), dtype=np.int64)
    order = np.lexsort((pairs[:, 1], pairs[:, 0]))
    ordered = pairs[order]
    first = np.ones(len(ordered), dtype=bool)
    first[1:] = ordered[1:, 0] != ordered[:-1, 0]
    return ordered[first]
