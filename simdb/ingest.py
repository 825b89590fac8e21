"""A batch of documents -> rows in the archive, set-based, in atomic chunks.

1. Documents are read lazily and fingerprinted on every core
   (:mod:`simdb.parallel`), outside any transaction.
2. Every ``chunk_size`` documents (and at the end) one transaction takes the
   ingest lock, reserves document ids in input order, binary-COPYs the chunk
   into a temporary staging table, sets aside ids that are already stored,
   finds each document's candidates by joining the staging table on each block
   key against the archive and against the earlier documents of the chunk,
   verifies them by popcount, and inserts the chunk with one
   ``INSERT ... SELECT`` that also points ``duplicate_of`` at the earliest
   near-duplicate. The batch row records the counts and how many input
   records the batch has consumed (``position``).

A batch that fits in one chunk lands whole or not at all. A larger one is
committed chunk by chunk; if it is interrupted (even by SIGKILL) every chunk
is either fully stored or not at all, the batch stays ``running``, and
``resume`` continues after the last stored chunk. An id that is already
stored with the same text is skipped (counted as ``already_stored``), so
re-running an input stores each document once.

The ingest lock (a transaction advisory lock) serialises the match-and-insert
step of concurrent ingests into one index, so that two batches arriving
together still see each other; fingerprinting, the slow part, stays parallel.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import sqlalchemy as sa

from . import minhash
from .clusters import merge_clusters
from .database import translate
from .errors import BatchError, IncompatibleIndex, InputError, KeptBatch, SimdbError
from .inputs import DEFAULT_MAX_CHARS, Document
from .matching import collect, copy_in, copy_out_int64, earliest_matches, pairs_between
from .migrate import lock
from .parallel import Fingerprinted, fingerprint_stream
from .sketch import Layout, Recipe, keys_and_values, sketch_column

DEFAULT_CHUNK_SIZE = 100_000
ON_ERROR = ("stop", "skip")


@dataclass(frozen=True)
class IngestOptions:
    batch: str | None = None
    source: str = "api"
    #: ``stop`` at the first bad record, or ``skip`` it (written to ``rejects``) and go on.
    on_error: str = "stop"
    rejects: str | Path | None = None
    max_chars: int = DEFAULT_MAX_CHARS
    chunk_size: int = DEFAULT_CHUNK_SIZE
    workers: int | None = 1
    resume: bool = False

    def __post_init__(self) -> None:
        if self.on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {', '.join(ON_ERROR)}, not {self.on_error!r}")
        if self.chunk_size < 1 or self.max_chars < 1:
            raise ValueError("chunk_size and max_chars must be positive")

    @property
    def batch_name(self) -> str:
        return self.batch or datetime.now(timezone.utc).strftime("batch-%Y%m%dT%H%M%S.%fZ")


@dataclass
class FingerprintedBatch:
    """A chunk ready for the database: one entry per document, in input order.

    ``sketches`` are unsigned SimHash fingerprints or MinHash signature bytes.
    """

    external_ids: list[str] = field(default_factory=list)
    sketches: list[int | bytes] = field(default_factory=list)
    content_hashes: list[bytes] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    metadata: list[dict] = field(default_factory=list)
    origins: list[str] = field(default_factory=list)
    #: Each document's 1-based position among the batch's input records (default: 1, 2, 3, ...).
    positions: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.external_ids)

    def append(self, external_id: str, sketch: int | bytes, digest: bytes, length: int, metadata: dict,
               origin: str, position: int | None = None) -> None:
        self.external_ids.append(external_id)
        self.sketches.append(sketch)
        self.content_hashes.append(digest)
        self.lengths.append(length)
        self.metadata.append(metadata)
        self.origins.append(origin)
        self.positions.append(len(self.positions) + 1 if position is None else position)


@dataclass(frozen=True)
class BatchSummary:
    name: str
    documents: int
    new: int
    exact_duplicates: int
    near_duplicates: int
    within_batch: int
    seconds: float
    already_stored: int = 0
    rejected: int = 0
    rejects_path: str | None = None
    #: False when the input held no record at all: no batch was created.
    recorded: bool = True

    def __str__(self) -> str:
        text = (f"batch {self.name!r}: {self.documents:,} documents: {self.new:,} new, "
                f"{self.exact_duplicates:,} exact duplicates, {self.near_duplicates:,} near-duplicates "
                f"({self.within_batch:,} of the duplicates matched within the batch)")
        if self.already_stored:
            text += f", {self.already_stored:,} already stored"
        if self.rejected:
            text += f", {self.rejected:,} rejected" + (f" (see {self.rejects_path})" if self.rejects_path else "")
        return f"{text} in {self.seconds:.1f} s"


# -- the database side: one chunk, one transaction --------------------------------------------------

#: Staged documents whose exact text is already stored or comes earlier in the chunk. Two semi-joins
#: glued by UNION: with ``OR`` between the two ``EXISTS`` PostgreSQL cannot turn them into hash
#: joins and rescans the staging table once per row, which is quadratic in the chunk size.
EXACT_DUPLICATES_SQL = (
    "SELECT s.id FROM staging s WHERE EXISTS (SELECT 1 FROM documents d WHERE d.content_hash = s.content_hash) "
    "UNION "
    "SELECT s.id FROM staging s WHERE EXISTS (SELECT 1 FROM staging e WHERE e.content_hash = s.content_hash "
    "AND e.id < s.id)")


def create_staging(connection: sa.Connection, layout: Layout) -> list[tuple[str, str]]:
    """The transaction's temporary staging table; returns its (column, type) list."""
    columns = ([("id", "int8"), ("external_id", "text"), sketch_column(layout)]
               + [(name, "int8") for name in layout.key_columns]
               + [("content_hash", "bytea"), ("length", "int4"), ("metadata", "jsonb")])
    connection.exec_driver_sql(
        "CREATE TEMPORARY TABLE staging (" + ", ".join(f"{n} {t} NOT NULL" for n, t in columns)
        + ", position int8) ON COMMIT DROP")  # position: the record's place in the batch's input
    return columns


def check_layout(connection: sa.Connection, layout: Layout) -> None:
    """Under the ingest lock: refuse to write keys of a layout the index no longer has."""
    if isinstance(layout, minhash.MinHashSettings):
        return  # bands are fixed at creation
    stored = dict(connection.execute(sa.text(
        "SELECT name, value FROM settings WHERE name IN ('blocks', 'first_key')")).all())
    if (stored.get("blocks"), stored.get("first_key", 0)) != (layout.blocks, layout.first_key):
        raise IncompatibleIndex("the index was re-laid out (simdb relayout) while this process had it open; "
                                "open it again (for an interrupted ingest: run it again with --resume)")


def _open_batch(connection: sa.Connection, name: str, source: str, first: bool) -> int:
    if first:
        batch_id = connection.execute(sa.text(
            "INSERT INTO batches (name, source, status, started_at) VALUES (:name, :source, 'running', now()) "
            "ON CONFLICT (name) DO NOTHING RETURNING id"), {"name": name, "source": source}).scalar()
        if batch_id is None:
            raise BatchError(f"a batch named {name!r} already exists; choose another name with --batch "
                             "(or --resume it if it was interrupted)")
        return batch_id
    batch_id = connection.execute(sa.text(
        "SELECT id FROM batches WHERE name = :name AND status = 'running' FOR UPDATE"), {"name": name}).scalar()
    if batch_id is None:
        raise BatchError(f"batch {name!r} was removed or completed by another process during this ingest")
    return batch_id


@dataclass
class ChunkResult:
    rejected: list[tuple[int, InputError]]  # (position in the batch's input, error), in input order
    stored: int


def ingest_chunk(connection: sa.Connection, schema: str, layout: Layout, chunk: FingerprintedBatch, *,
                 name: str, source: str, first: bool, final: bool, position: int,
                 rejects: list[tuple[int, InputError]] = (), skip_errors: bool) -> ChunkResult:
    """Match and insert one chunk inside the caller's transaction; record every input record's outcome
    (``rejects`` are the reader's, by position) and update the batch's counts."""
    lock(connection, schema, "ingest")
    check_layout(connection, layout)
    batch_id = _open_batch(connection, name, source, first)
    count = len(chunk)
    sequence = connection.execute(sa.text(
        "SELECT pg_get_serial_sequence('documents', 'id')::regclass::oid")).scalar_one()
    ids = collect(copy_out_int64(connection, f"SELECT nextval({int(sequence)}::oid::regclass) "
                                             f"FROM generate_series(1, {int(count)})", 1), 1)[:, 0]
    keys, stored_sketches = keys_and_values(layout, chunk.sketches)

    columns = create_staging(connection, layout)
    column_list = ", ".join(name for name, _ in columns)
    cursor = connection.connection.dbapi_connection.cursor()
    with cursor.copy(f"COPY staging ({column_list}, position) FROM STDIN (FORMAT BINARY)") as copy:
        copy.set_types([t for _, t in columns] + ["int8"])
        id_list, key_rows = ids.tolist(), keys.tolist()
        for i in range(count):
            copy.write_row((id_list[i], chunk.external_ids[i], stored_sketches[i], *key_rows[i],
                            chunk.content_hashes[i], chunk.lengths[i], chunk.metadata[i], chunk.positions[i]))

    errors, unstored, already = _stored_ids(connection, chunk, ids, batch_id)
    if errors and not skip_errors:
        raise errors[0][1]
    if unstored:
        connection.execute(sa.text("DELETE FROM staging WHERE id = ANY(:ids)"), {"ids": unstored})
    connection.exec_driver_sql("ANALYZE staging")

    k = layout.max_distance
    pairs = collect(itertools.chain(  # (new id, earlier id, distance), every pair
        pairs_between(connection, layout, "staging", "documents", k),
        pairs_between(connection, layout, "staging", "staging", k, earlier_only=True)))
    duplicates = earliest_matches(pairs)
    clusters = merge_clusters(connection, pairs, ids)
    exact = connection.exec_driver_sql(
        f"CREATE TEMPORARY TABLE staging_exact ON COMMIT DROP AS {EXACT_DUPLICATES_SQL}").rowcount
    copy_in(connection, "staging_duplicates (id, duplicate_of, distance)", ["int8", "int8", "int2"],
            duplicates.tolist(), create=True)
    # every new document a pair touches gets its merged cluster, including one that is only the earlier
    # side of its pairs (it has no duplicate_of, yet a later document may link it to another cluster)
    copy_in(connection, "staging_clusters (id, cluster_id)", ["int8", "int8"], clusters.items(), create=True)
    connection.exec_driver_sql(
        f"INSERT INTO documents ({column_list}, batch_id, duplicate_of, duplicate_distance, cluster_id) "
        f"SELECT {', '.join('s.' + n for n, _ in columns)}, {int(batch_id)}, m.duplicate_of, m.distance, "
        f"coalesce(c.cluster_id, s.id) FROM staging s LEFT JOIN staging_duplicates m USING (id) "
        f"LEFT JOIN staging_clusters c USING (id) ORDER BY s.id")
    copy_in(connection, "near_duplicates (b_id, a_id, distance, batch_id)", ["int8", "int8", "int2", "int4"],
            ((probe, match, distance, batch_id) for probe, match, distance in pairs.tolist()))
    within = connection.execute(sa.text(
        "SELECT count(*) FROM staging_duplicates m JOIN documents o ON o.id = m.duplicate_of "
        "WHERE o.batch_id = :batch"), {"batch": batch_id}).scalar_one()

    # what became of every input record of the chunk, in the same transaction as the documents
    connection.exec_driver_sql(
        "INSERT INTO records (batch_id, position, status, external_id, document_id, duplicate_of, distance) "
        f"SELECT {int(batch_id)}, s.position, CASE WHEN e.id IS NOT NULL THEN 'exact' "
        "WHEN m.id IS NOT NULL THEN 'near' ELSE 'new' END, s.external_id, s.id, m.duplicate_of, m.distance "
        "FROM staging s LEFT JOIN staging_duplicates m USING (id) LEFT JOIN staging_exact e USING (id)")
    rejected = sorted([*rejects, *errors], key=lambda pair: pair[0])
    copy_in(connection, "records (batch_id, position, status, external_id, document_id, path, line, reason, hint)",
            ["int4", "int8", "text", "text", "int8", "text", "int8", "text", "text"],
            [*((batch_id, chunk.positions[i], "already_stored", chunk.external_ids[i], document, None, None, None,
                None) for i, document in already),
             *((batch_id, at, "rejected", getattr(error, "external_id", None), None, error.path, error.line,
                error.reason, error.hint) for at, error in rejected)])

    stored = count - len(unstored)
    connection.execute(sa.text(
        "UPDATE batches SET documents = documents + :stored, new = new + :new, "
        "exact_duplicates = exact_duplicates + :exact, near_duplicates = near_duplicates + :near, "
        "within_batch = within_batch + :within, already_stored = already_stored + :already, "
        "rejected = rejected + :rejected, position = :position, "
        "status = CASE WHEN :final THEN 'complete' ELSE status END, "
        "finished_at = CASE WHEN :final THEN clock_timestamp() END WHERE id = :id"),
        {"stored": stored, "new": stored - len(duplicates), "exact": exact, "near": len(duplicates) - exact,
         "within": within, "already": len(already), "rejected": len(rejected), "position": position,
         "final": final, "id": batch_id})
    return ChunkResult(rejected=rejected, stored=stored)


def _stored_ids(connection: sa.Connection, chunk: FingerprintedBatch, ids: np.ndarray, batch_id: int
                ) -> tuple[list[tuple[int, InputError]], list[int], list[tuple[int, int]]]:
    """Staged ids that are already stored: (rejects by input position, every staging id to leave out,
    (chunk index, stored document id) of the ones already stored with the same text).

    The same id with the same text in another batch is a re-run: skipped. In this
    batch, or with another text, it is an error.
    """
    rows = connection.execute(sa.text(
        "SELECT s.id, d.id AS stored_id, d.batch_id = :batch AS same_batch, d.content_hash = s.content_hash "
        "AS same_text, b.name FROM staging s JOIN documents d USING (external_id) JOIN batches b "
        "ON b.id = d.batch_id ORDER BY s.id"), {"batch": batch_id}).all()
    errors, unstored, already = [], [], []
    for row in rows:
        i = int(np.searchsorted(ids, row.id))
        unstored.append(row.id)
        origin, external_id = chunk.origins[i], chunk.external_ids[i]
        if row.same_batch:
            error = _error_at(origin, f"id {external_id!r} appears twice in this batch (first in an earlier "
                                      "chunk)", "ids must be unique; fix or drop one of them")
        elif not row.same_text:
            error = _error_at(origin, f"id {external_id!r} is already stored with a different text "
                                      f"(batch {row.name!r})",
                              "give the new document a new id, or remove the old one with simdb remove")
        else:
            already.append((i, row.stored_id))
            continue
        error.external_id = external_id
        errors.append((chunk.positions[i], error))
    return errors, unstored, already


def _error_at(origin: str, message: str, hint: str) -> InputError:
    path, _, line = origin.rpartition(":")
    if path and line.isdigit():
        return InputError(message, path=path, line=int(line), hint=hint)
    return InputError(f"{origin}: {message}", hint=hint)


# -- the whole batch ---------------------------------------------------------------------------------

class Rejects:
    """The rejects file, one JSON object per rejected record, written from the ``records`` table.

    After each chunk commits, its rejects are read back from the database and appended; a resumed
    batch first rewrites the file whole from there. So the file never holds a reject the database
    lacks, and after a kill it is made complete again by ``resume`` (or by ``simdb verdicts``).
    """

    def __init__(self, path: str | Path, engine: sa.Engine, batch: str) -> None:
        self.path = str(path)
        self.engine = engine
        self.batch = batch
        self.written = 0  # rejects up to this input position are in the file
        self.started = False
        folder = os.path.dirname(os.path.abspath(self.path))
        if not os.path.isdir(folder):
            raise InputError("cannot write the rejects file there: the folder does not exist", path=self.path,
                             hint="create the folder, or choose another rejects file")
        if os.path.isdir(self.path) or not os.access(self.path if os.path.exists(self.path) else folder, os.W_OK):
            raise InputError("cannot write the rejects file there", path=self.path,
                             hint="check the permissions, or choose another rejects file")

    def sync(self, position: int) -> None:
        """Append the rejects of input positions up to ``position`` that the file does not hold yet."""
        with self.engine.connect() as connection:
            rows = connection.execute(sa.text(
                "SELECT r.position, r.external_id, r.path, r.line, r.reason, r.hint FROM records r "
                "JOIN batches b ON b.id = r.batch_id WHERE b.name = :batch AND r.status = 'rejected' "
                "AND r.position > :after AND r.position <= :upto ORDER BY r.position"),
                {"batch": self.batch, "after": self.written, "upto": position}).all()
        with open(self.path, "a" if self.started else "w", encoding="utf-8") as file:
            for row in rows:
                file.write(json.dumps({"path": row.path, "line": row.line, "reason": row.reason, "hint": row.hint,
                                       "position": row.position, "id": row.external_id}, ensure_ascii=False) + "\n")
        self.started = True
        self.written = position


def _size_checked(items: Iterable[Document | InputError], max_chars: int) -> Iterator[Document | InputError]:
    for item in items:
        if isinstance(item, Document) and len(item.text) > max_chars:
            error = InputError(f"the text is {len(item.text):,} characters, over the limit of {max_chars:,}",
                               path=item.path, line=item.line, hint="raise --max-chars or split the document")
            error.external_id = item.external_id
            item = error
        yield item


def _resume_position(engine: sa.Engine, name: str, resume: bool) -> tuple[int, int] | None:
    """(records consumed, documents stored) of an interrupted batch to resume, or None for a new batch."""
    with engine.connect() as connection:
        row = connection.execute(sa.text("SELECT status, position, documents FROM batches WHERE name = :name"),
                                 {"name": name}).first()
    if row is None:
        if resume:
            raise BatchError(f"there is no batch {name!r} to resume; run without --resume to start it")
        return None
    if row.status == "complete":
        raise BatchError(f"batch {name!r} is already complete; choose another name with --batch")
    if not resume:
        raise BatchError(f"batch {name!r} was interrupted after {row.position:,} input records; continue it "
                         f"with --resume, or remove what it stored with `simdb remove --batch {name}`")
    return row.position, row.documents


def ingest(engine: sa.Engine, schema: str, layout: Layout, settings: Recipe,
           items: Iterable[Document | InputError], options: IngestOptions,
           progress: Callable[[int], None] | None = None) -> BatchSummary:
    """Ingest a batch in atomic chunks; see the module docstring."""
    started = time.perf_counter()
    name = options.batch_name
    resumed = _resume_position(engine, name, options.resume)
    position = resumed[0] if resumed else 0
    skip_errors = options.on_error == "skip"
    rejects = Rejects(options.rejects or f"rejects-{name}.jsonl", engine, name) if skip_errors else None
    if rejects is not None and resumed is not None:
        rejects.sync(position)  # the file as the database has it, whatever a kill left behind
    first = resumed is None
    kept = KeptBatch(name, position, resumed[1]) if resumed else None  # what the committed chunks hold
    try:
        stream = fingerprint_stream(_size_checked(itertools.islice(items, position, None), options.max_chars),
                                    settings, workers=options.workers)
        chunk, chunk_errors, seen = FingerprintedBatch(), [], {}
        consumed = position

        def commit(final: bool) -> None:
            nonlocal chunk, chunk_errors, seen, first, kept
            with engine.begin() as connection:
                result = ingest_chunk(connection, schema, layout, chunk, name=name, source=options.source,
                                      first=first, final=final, position=consumed, rejects=chunk_errors,
                                      skip_errors=skip_errors)
            kept = KeptBatch(name, consumed, (kept.documents if kept else 0) + result.stored)
            if rejects is not None:
                rejects.sync(consumed)
            first = False
            chunk, chunk_errors, seen = FingerprintedBatch(), [], {}

        for item in stream:
            consumed += 1
            if isinstance(item, Fingerprinted):
                document = item.document
                if document.external_id in seen:
                    item = InputError(f"id {document.external_id!r} appears twice in this batch "
                                      f"(first at {seen[document.external_id]})", path=document.path,
                                      line=document.line, hint="ids must be unique; fix or drop one of them")
                    item.external_id = document.external_id
                else:
                    seen[document.external_id] = document.origin
                    chunk.append(document.external_id, item.sketch, item.content_hash, len(document.text),
                                 document.metadata, document.origin, consumed)
            if isinstance(item, InputError):
                if not skip_errors:
                    raise item
                chunk_errors.append((consumed, item))
            if progress is not None:
                progress(1)
            if len(chunk) >= options.chunk_size:
                commit(final=False)
        if first and consumed == 0:
            return BatchSummary(name=name, documents=0, new=0, exact_duplicates=0, near_duplicates=0,
                                within_batch=0, seconds=time.perf_counter() - started, recorded=False)
        commit(final=True)
    except SimdbError as error:
        raise _kept(error, kept) from None
    except sa.exc.DBAPIError as error:
        raise _kept(translate(error, engine.url), kept) from None
    with engine.connect() as connection:
        row = connection.execute(sa.text("SELECT * FROM batches WHERE name = :name"), {"name": name}).one()
    return BatchSummary(name=name, documents=row.documents, new=row.new, exact_duplicates=row.exact_duplicates,
                        near_duplicates=row.near_duplicates, within_batch=row.within_batch,
                        already_stored=row.already_stored, rejected=row.rejected,
                        rejects_path=rejects.path if rejects and row.rejected else None,
                        seconds=time.perf_counter() - started)


def _kept(error: SimdbError, kept: KeptBatch | None) -> SimdbError:
    """The error, saying what its batch keeps when earlier chunks were committed."""
    if kept is not None and error.kept is None:
        error.kept = kept
        error.args = (f"{error}; {kept.describe()}",)
    return error
