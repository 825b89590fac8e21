"""The index: open or create one, ingest batches, query, list pairs, export.

>>> with Index.create(url) as index:                       # doctest: +SKIP
...     index.add_many([{"id": "a", "text": "..."}], batch="first")
...     index.query("some text")
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import sqlalchemy as sa

from . import migrate
from .blocks import BlockLayout
from .bits import format_fingerprint, hamming, to_signed, to_unsigned
from .database import Database
from .errors import IncompatibleIndex, IndexNotFound, InputError, SimdbError
from .ingest import BatchSummary, FingerprintedBatch, IngestOptions, ingest, ingest_chunk
from .inputs import Document, check_text, checks
from .matching import collect, copy_in, pairs_between
from .relayout import relayout
from .remove import RemovalSummary, remove
from .settings import IndexSettings
from .sketch import keys_and_values, sketch, sketch_column
from .sqlapi import grant_reader


@dataclass(frozen=True)
class Match:
    """A stored document within the query's distance.

    SimHash: ``distance`` in bits, ``simhash`` the stored fingerprint. MinHash: ``distance`` in
    signature positions, ``similarity`` the Jaccard estimate, ``simhash`` None.
    """

    external_id: str
    distance: int
    simhash: int | None
    metadata: dict = field(default_factory=dict)
    similarity: float | None = None

    def to_json(self) -> dict:
        sketch_field = ({"similarity": round(self.similarity, 4)} if self.similarity is not None
                        else {"simhash": format_fingerprint(self.simhash)})
        return {"id": self.external_id, "distance": self.distance, **sketch_field,
                **({"metadata": self.metadata} if self.metadata else {})}


@dataclass(frozen=True)
class Pair:
    """Two stored documents within the index's distance; ``a`` was stored first."""

    a: str
    b: str
    distance: int
    similarity: float | None = None  # MinHash: the Jaccard estimate

    def to_json(self) -> dict:
        return {"a": self.a, "b": self.b, "distance": self.distance,
                **({"similarity": round(self.similarity, 4)} if self.similarity is not None else {})}


def _as_document(item: Document | Mapping, index: int) -> Document:
    if isinstance(item, Document):
        return item
    where = f"document #{index + 1}"
    if not isinstance(item, Mapping) or "id" not in item or "text" not in item:
        raise InputError(f"{where} must be a Document or a mapping with 'id' and 'text'")
    try:
        external_id = checks.external_id(item["id"], "id", None, None)
        text = check_text(item["text"], None, None)
        given = item.get("metadata")  # an explicit metadata mapping is kept whole, "id" and "text" included
        metadata = checks.metadata(dict(given), None, None, None, None) if given else \
            checks.metadata(dict(item), "id", "text", None, None)
    except InputError as error:
        raise InputError(f"{where}: {error.reason}", hint=error.hint) from None
    return Document(external_id, text, metadata)


#: Setting names of Index.create -> the names IndexSettings.summary() compares them by.
_SUMMARY_NAMES = {"idf": ("idf_documents", "weighting"), "expected_size": ()}

#: Mean candidates per lookup above which ``stats`` advises more blocks.
OUTGROWN_CANDIDATES = 256


class Index:
    """A near-duplicate index stored in one PostgreSQL schema."""

    def __init__(self, database: Database, settings: IndexSettings, *, created: bool = False) -> None:
        self.database = database
        self.created = created
        self.settings = settings
        self.layout = settings.layout

    # -- opening -------------------------------------------------------------------------------

    @classmethod
    def create(cls, database_url: str | None = None, *, schema: str | None = None,
               data_dir: str | Path | None = None, exist_ok: bool = False, **settings) -> "Index":
        """Create an index (``method``, ``max_distance``, ``blocks``, ``idf``, ``threshold``, ... as in
        :meth:`IndexSettings.new`).

        With ``exist_ok``, an existing index with the same settings is opened
        instead; one with other settings is an :class:`IncompatibleIndex`.
        """
        try:
            wanted = IndexSettings.new(**settings)
        except ValueError as exc:
            raise SimdbError(f"invalid index settings: {exc}") from None
        database = Database.connect(database_url, schema=schema, data_dir=data_dir)
        schema = database.schema
        try:
            with database.engine.begin() as connection:
                migrate.lock(connection, schema, "migrate")
                connection.exec_driver_sql(f"CREATE SCHEMA IF NOT EXISTS {schema}")
                exists = migrate.current_revision(connection, schema) is not None
                if not exists:
                    idf = getattr(wanted.fingerprints, "idf", None)
                    migrate.upgrade(connection, schema, layout=wanted.layout, new_index_settings=wanted.to_rows(),
                                    new_index_idf_terms=dict(idf.terms) if idf else None)
            if exists and not exist_ok:
                raise SimdbError(f"an index already exists in schema {schema!r} of {database.display_url}; "
                                 "use it as it is, or choose another --schema")
            # an existing index is compared with the settings asked for, not with defaults it was not asked about
            summary = wanted.summary()
            asked = {name: summary.get(name) for given, value in settings.items() if value is not None
                     for name in _SUMMARY_NAMES.get(given, (given,))}
            index = cls._open(database, asked if exists else {})
            index.created = not exists
            return index
        except BaseException:
            database.close()
            raise

    @classmethod
    def open(cls, database_url: str | None = None, *, schema: str | None = None,
             data_dir: str | Path | None = None, **expected) -> "Index":
        """Open an existing index; any ``expected`` setting (``max_distance=3``, ...) must match the stored one."""
        database = Database.connect(database_url, schema=schema, data_dir=data_dir)
        try:
            return cls._open(database, expected)
        except BaseException:
            database.close()
            raise

    @classmethod
    def _open(cls, database: Database, expected: dict) -> "Index":
        schema = database.schema
        with database.engine.begin() as connection:
            revision = migrate.current_revision(connection, schema)
            if revision is None:
                raise IndexNotFound(f"no simdb index in schema {schema!r} of {database.display_url}; "
                                    "create one with `simdb init`")
            if revision not in migrate.known_revisions():
                raise IncompatibleIndex(f"the index in schema {schema!r} is at schema revision {revision}, "
                                        "written by a newer simdb; upgrade simdb to open it")
            rows = dict(connection.execute(sa.text("SELECT name, value FROM settings")).all())
            terms = dict(connection.execute(sa.text("SELECT term, documents FROM idf_terms")).all()) \
                if rows.get("idf") else None
            stored = IndexSettings.from_rows(rows, idf_terms=terms)
            if revision != migrate.head_revision():
                migrate.lock(connection, schema, "migrate")
                migrate.upgrade(connection, schema, layout=stored.layout)
            columns = {c["name"] for c in sa.inspect(connection).get_columns("documents", schema=schema)}
            missing = set(stored.layout.key_columns) - columns
            if missing:
                raise IncompatibleIndex(f"the documents table lacks key columns {sorted(missing)} that its layout "
                                        "needs; the schema was changed by hand")
        stored.check_requested(expected)
        return cls(database, stored)

    def close(self) -> None:
        self.database.close()

    def __enter__(self) -> "Index":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # -- fingerprints -----------------------------------------------------------------------------

    @functools.cached_property
    def fingerprint_settings(self):
        """The fingerprint settings, once this process has proven it reproduces the index's canaries."""
        self.settings.check_canaries()
        return self.settings.fingerprints

    @property
    def method(self) -> str:
        """``simhash`` or ``minhash``."""
        return self.settings.method

    def fingerprint(self, text: str) -> int | bytes:
        """The text's sketch under the index's recipe: a SimHash fingerprint, or MinHash signature bytes."""
        check_text(text, None, None)
        return sketch(text, self.fingerprint_settings)

    # -- ingest --------------------------------------------------------------------------------

    def add(self, external_id: str, text: str, metadata: dict | None = None, *,
            batch: str | None = None) -> BatchSummary:
        """Add one document (as a batch of one)."""
        return self.add_many([Document(str(external_id), check_text(text, None, None), metadata or {})],
                             batch=batch)

    def add_many(self, documents: Iterable[Document | Mapping], *, batch: str | None = None,
                 source: str = "api", **options) -> BatchSummary:
        """Fingerprint, match and store a batch (options as in :class:`IngestOptions`).

        A batch of up to ``chunk_size`` documents is stored whole or, on any
        error, not at all.
        """
        docs = (_as_document(item, i) for i, item in enumerate(documents))
        return self.ingest(docs, IngestOptions(batch=batch, source=source, **options))

    def ingest(self, items: Iterable[Document | InputError], options: IngestOptions,
               progress: Callable[[int], None] | None = None) -> BatchSummary:
        """Ingest documents (and, with ``on_error="skip"``, read errors to reject) as one batch."""
        return ingest(self.database.engine, self.database.schema, self.layout, self.fingerprint_settings,
                      items, options, progress)

    def add_fingerprinted(self, fingerprinted: FingerprintedBatch, *, batch: str, source: str = "api") -> BatchSummary:
        """Store already-fingerprinted documents as one batch in one transaction (benchmarks, tests)."""
        started = time.perf_counter()
        with self.database.engine.begin() as connection:
            result = ingest_chunk(connection, self.database.schema, self.layout, fingerprinted, name=batch,
                                  source=source, first=True, final=True, position=len(fingerprinted),
                                  skip_errors=False)
            row = connection.execute(sa.text("SELECT * FROM batches WHERE name = :name"), {"name": batch}).one()
        return BatchSummary(name=batch, documents=result.stored, new=row.new, exact_duplicates=row.exact_duplicates,
                            near_duplicates=row.near_duplicates, within_batch=row.within_batch,
                            already_stored=row.already_stored, seconds=time.perf_counter() - started)

    # -- removal and layout ------------------------------------------------------------------------

    def remove(self, *, ids: list[str] | None = None, batch: str | None = None, before: datetime | None = None,
               dry_run: bool = False) -> RemovalSummary:
        """Remove documents by id, batch or ingest time; ``dry_run`` reports without removing."""
        connection = self.database.engine.connect()
        try:
            with connection.begin() as transaction:
                summary = remove(connection, self.database.schema, self.layout, external_ids=ids, batch=batch,
                                 before=before)
                if dry_run:
                    transaction.rollback()
            return dataclasses.replace(summary, dry_run=dry_run)
        finally:
            connection.close()

    def relayout(self, blocks: int | None = None, progress: Callable[[str], None] | None = None) -> None:
        """Rebuild the key columns for ``blocks`` blocks (default: the fewest that suit the archive's size),
        online (see :mod:`simdb.relayout`)."""
        if self.method != "simhash":
            raise SimdbError("relayout changes SimHash block layouts; a MinHash index's bands are fixed when it is "
                             "created: create a new index with other --threshold/--num-perm and ingest again")
        if blocks is None:
            with self.database.engine.connect() as connection:
                documents = connection.execute(sa.text("SELECT count(*) FROM documents")).scalar_one()
            blocks = BlockLayout.for_size(self.layout.max_distance, documents).blocks
        self.settings = relayout(self.database.engine, self.database.schema, self.settings, blocks,
                                 progress=progress)
        self.layout = self.settings.layout

    def grant_reader(self, role: str, *, login: bool = False, password: str | None = None) -> bool:
        """Create or update a read-only role for analysts; True if it was created."""
        with self.database.engine.begin() as connection:
            return grant_reader(connection, self.database.schema, role, login=login, password=password)

    # -- queries -------------------------------------------------------------------------------

    def _max_distance(self, max_distance: int | None) -> int:
        if max_distance is None:
            return self.layout.max_distance
        if not 0 <= max_distance <= self.layout.max_distance:
            raise SimdbError(f"--max-distance must be between 0 and the index's maximum distance "
                             f"{self.layout.max_distance}, not {max_distance}")
        return max_distance

    def distance_for(self, min_similarity: float) -> int:
        """MinHash: the largest distance (differing positions) whose estimate is still ``min_similarity``."""
        if self.method != "minhash":
            raise SimdbError("--min-similarity is for MinHash indexes; a SimHash index takes --max-distance")
        if not self.layout.threshold <= min_similarity <= 1:
            raise SimdbError(f"--min-similarity must be between the index's threshold {self.layout.threshold:g} "
                             f"and 1, not {min_similarity:g}")
        return self.layout.distance_for(min_similarity)

    def query(self, text: str, max_distance: int | None = None) -> list[Match]:
        """Stored documents within ``max_distance`` of ``text``, nearest first."""
        if self.method == "minhash":
            return self.query_many([text], max_distance)[0]
        return self.query_fingerprint(self.fingerprint(text), max_distance)

    def query_fingerprint(self, simhash: int, max_distance: int | None = None) -> list[Match]:
        """Stored documents within ``max_distance`` bits of a fingerprint.

        The lookup is the analysts' ``simdb_near`` (block-key equality through the
        key indexes, inlined by PostgreSQL); Python verifies every answer again.
        """
        limit = self._max_distance(max_distance)
        sql = sa.text("SELECT d.external_id, d.simhash, d.metadata FROM simdb_near(CAST(:q AS bigint), :limit) n "
                      "JOIN documents d ON d.id = n.document_id")
        # one statement, one round trip: no BEGIN/ROLLBACK around a read
        with self.database.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
            rows = connection.execute(sql, {"q": to_signed(simhash), "limit": limit}).all()
        matches = (Match(row.external_id, hamming(simhash, to_unsigned(row.simhash)), to_unsigned(row.simhash),
                         row.metadata) for row in rows)
        return sorted((m for m in matches if m.distance <= limit), key=lambda m: (m.distance, m.external_id))

    def query_many(self, texts: Iterable[str], max_distance: int | None = None) -> list[list[Match]]:
        """One result list per text, found with a single set-based join."""
        return self.query_fingerprints([self.fingerprint(text) for text in texts], max_distance)

    def query_fingerprints(self, sketches: list[int | bytes], max_distance: int | None = None) -> list[list[Match]]:
        """One result list per sketch (fingerprint or signature bytes), found with one set-based join."""
        limit = self._max_distance(max_distance)
        if not sketches:
            return []
        keys, values = keys_and_values(self.layout, sketches)
        with self.database.engine.begin() as connection:
            columns = [("id", "int8"), sketch_column(self.layout), *((c, "int8") for c in self.layout.key_columns)]
            copy_in(connection, f"probes ({', '.join(name for name, _ in columns)})", [t for _, t in columns],
                    ((i, value, *key_row) for i, (value, key_row) in enumerate(zip(values, keys.tolist()))),
                    create=True)
            connection.exec_driver_sql("ANALYZE probes")
            pairs = collect(pairs_between(connection, self.layout, "probes", "documents", limit))
            per_probe: list[dict[int, int]] = [{} for _ in sketches]
            for probe, document, distance in pairs.tolist():
                per_probe[probe][document] = distance
            return self._matches(connection, per_probe)

    def _matches(self, connection: sa.Connection, found: list[dict[int, int]]) -> list[list[Match]]:
        ids = sorted({document for distances in found for document in distances})
        rows = {}
        if ids:
            rows = {row.id: row for row in connection.execute(sa.text(
                "SELECT id, external_id, simhash, metadata FROM documents WHERE id = ANY(:ids)"), {"ids": ids})}
        minhash = self.method == "minhash"
        return [sorted((Match(rows[d].external_id, distance, None if minhash else to_unsigned(rows[d].simhash),
                              rows[d].metadata, self.layout.similarity_of(distance) if minhash else None)
                        for d, distance in distances.items()), key=lambda m: (m.distance, m.external_id))
                for distances in found]

    def pairs(self, batch: str | None = None, max_distance: int | None = None) -> Iterator[Pair]:
        """Every stored pair within ``max_distance`` (or involving one batch), earlier document first.

        Pairs are stored as they are found at ingest (every pair within the
        index's distance is found when its later document arrives), so this
        reads the ``near_duplicates`` table.
        """
        limit = self._max_distance(max_distance)
        condition, params = "p.distance <= :limit", {"limit": limit}
        if batch is not None:  # checked now, before the caller writes anything
            with self.database.engine.connect() as connection:
                params["batch"] = self._batch_id(connection, batch)
            condition += " AND (a.batch_id = :batch OR b.batch_id = :batch)"
        return self._pairs(condition, params)

    def _pairs(self, condition: str, params: dict) -> Iterator[Pair]:
        with self.database.engine.connect() as connection:
            result = connection.execution_options(yield_per=10_000).execute(sa.text(
                "SELECT a.external_id AS a, b.external_id AS b, p.distance FROM near_duplicates p "
                "JOIN documents a ON a.id = p.a_id JOIN documents b ON b.id = p.b_id "
                f"WHERE {condition} ORDER BY p.a_id, p.b_id"), params)
            minhash = self.method == "minhash"
            for row in result:
                yield Pair(row.a, row.b, row.distance, self.layout.similarity_of(row.distance) if minhash else None)

    def _batch_id(self, connection: sa.Connection, name: str) -> int:
        batch_id = connection.execute(sa.text("SELECT id FROM batches WHERE name = :name"), {"name": name}).scalar()
        if batch_id is None:
            raise SimdbError(f"no batch named {name!r}; `simdb stats` lists the batches")
        return batch_id

    def export(self) -> Iterator[dict]:
        """``{"id", "simhash" | "signature", ...metadata}`` for every document, in the order they were stored.

        The sketch is the fingerprint's 16 hex digits (SimHash) or the signature's hex (MinHash). A
        metadata field with the same name as one of these is exported as ``metadata.<name>``.
        """
        column = "signature" if self.method == "minhash" else "simhash"
        with self.database.engine.connect() as connection:
            result = connection.execution_options(yield_per=10_000).execute(sa.text(
                f"SELECT external_id, {column} AS sketch, metadata FROM documents ORDER BY id"))
            for row in result:
                value = bytes(row.sketch).hex() if column == "signature" else \
                    format_fingerprint(to_unsigned(row.sketch))
                record = {"id": row.external_id, column: value}
                for key, value in row.metadata.items():
                    record[f"metadata.{key}" if key in ("id", column) else key] = value
                yield record

    def stats(self) -> dict:
        """Counts, layout and the measured key buckets (with a layout advice when they have grown too big)."""
        with self.database.engine.connect() as connection:
            counts = connection.execute(sa.text(
                "SELECT count(*) AS documents, count(duplicate_of) AS duplicates FROM documents")).one()
            batches = connection.execute(sa.text(
                "SELECT name, documents, new, exact_duplicates, near_duplicates, already_stored, rejected, status, "
                "position, finished_at FROM batches ORDER BY id")).all()
            size = connection.execute(sa.text("SELECT pg_total_relation_size('documents')")).scalar_one()
            means, largest = [], []
            for column in self.layout.key_columns:
                means.append(connection.execute(sa.text(
                    f"SELECT coalesce(sum(n * (n - 1))::float8 / nullif(sum(n), 0), 0) "  # other documents in its bucket
                    f"FROM (SELECT count(*) AS n FROM documents GROUP BY {column}) b")).scalar_one())
                largest += [(row.n, column, row.value) for row in connection.execute(sa.text(
                    f"SELECT {column} AS value, count(*) AS n FROM documents GROUP BY {column} "
                    "ORDER BY n DESC LIMIT 3"))]
        documents = counts.documents
        measured = sum(means)
        advice = None
        if measured > OUTGROWN_CANDIDATES and self.method == "simhash":
            # real fingerprints are skewed, so at least one block more even where random ones would not need it
            blocks = max(BlockLayout.for_size(self.layout.max_distance, documents).blocks, self.layout.blocks + 1)
            advice = (f"lookups meet {measured:,.0f} candidates on average: the archive has outgrown its layout; "
                      f"run `simdb relayout --blocks {blocks}`")
        return {
            "schema": self.database.schema,
            "database": self.database.display_url,
            "documents": documents,
            "duplicates": counts.duplicates,
            "batches": [dict(row._mapping) for row in batches],
            "settings": self.settings.summary(),
            "layout": self.layout.describe(),
            "expected_candidates_per_lookup": round(self.layout.expected_candidates(documents), 2)
            if self.method == "simhash" else None,
            "measured_candidates_per_lookup": round(measured, 2),
            "largest_key_buckets": [{"key": column, "value": value, "documents": n}
                                    for n, column, value in sorted(largest, reverse=True)[:5]],
            "advice": advice,
            "table_bytes": size,
        }
