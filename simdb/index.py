"""The index: open or create one, ingest batches, query, list pairs, export.

A facade over the pipeline: the method (:mod:`simdb.methods`) sketches texts and owns its keys
and SQL, :mod:`simdb.ingest` stores batches, and the PostgreSQL layer (:mod:`simdb.pg`) does every
read and write; nothing here speaks SQL.

>>> with Index.create(url) as index:                       # doctest: +SKIP
...     index.add_many([{"id": "a", "text": "..."}], batch="first")
...     index.query("some text")
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path

import numpy as np

from .bits import format_fingerprint
from .check import check
from .errors import IncompatibleIndex, InputError, SimdbError, parameter
from .ingest import BatchSummary, FingerprintedBatch, IngestOptions, ingest
from .inputs import DEFAULT_MAX_CHARS, Document, check_text, checks
from .methods import Method
from .pg import DEFAULT_SHARDS, catalog, citus, field_counts, keyed, plpython, reads, segments, server
from .pg.chunks import store_chunk
from .pg.context import IndexContext
from .pg.database import Database, check_schema_name, translating
from .pg.functions import Grant, grant_reader
from .pg.relayout import relayout
from .pg.remove import RemovalSummary, remove
from . import sync
from .settings import IndexSettings, connections_problem
from .verdicts import Verdict, stored_verdicts


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


@dataclass(frozen=True)
class StoredDocument:
    """One stored document as ``simdb show`` prints it; ``text`` is None where the index keeps no texts."""

    external_id: str
    batch: str
    length: int
    created_at: datetime
    cluster: str  #: the external id of its cluster's canonical (earliest) document
    duplicate_of: str | None  #: the external id of its earliest near-duplicate stored before it
    duplicate_distance: int | None
    metadata: dict
    text: str | None
    id: int = field(repr=False, default=0)
    sketch: object = field(repr=False, default=None)

    def to_json(self) -> dict:
        return {"id": self.external_id, "batch": self.batch, "length": self.length,
                "created_at": self.created_at.isoformat(), "cluster": self.cluster,
                "duplicate_of": self.duplicate_of, "duplicate_distance": self.duplicate_distance,
                "metadata": self.metadata, "text": self.text}


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


def _url(args: tuple, kwargs: dict):
    """The database URL a call at the boundary used: the open index's, else the one a classmethod was given."""
    if args and isinstance(args[0], Index):
        return args[0].database.engine.url
    return kwargs.get("database_url") or (args[1] if len(args) > 1 else None) or os.environ.get("SIMDB_DATABASE_URL")


def _relaid_out(args: tuple, kwargs: dict, error: BaseException) -> SimdbError | None:
    """An open index's statement that names a key column or keys table its layout no longer has: the index was
    re-laid out since this process opened it (:func:`simdb.pg.catalog.relaid_out`)."""
    if args and isinstance(args[0], Index):
        return catalog.relaid_out(args[0].database.engine, args[0].settings.method, error,
                                  args[0].context.keyed)
    return None


def _at_the_boundary(cls: type) -> type:
    """Every public method (and classmethod) of ``cls`` raises simdb's errors, never the database's: the one
    place where a database error becomes a :class:`SimdbError` subclass (:func:`simdb.pg.database.translate`;
    a statement of an index opened before a relayout on the old layout's keys, :func:`_relaid_out`).
    ``tests/test_boundary.py`` holds every public method to it."""
    for name, member in list(vars(cls).items()):
        if name.startswith("_"):
            continue
        if isinstance(member, classmethod):
            setattr(cls, name, classmethod(translating(_url)(member.__func__)))
        elif inspect.isfunction(member):
            setattr(cls, name, translating(_url, _relaid_out)(member))
    return cls


#: Setting names of Index.create -> the names IndexSettings.summary() compares them by.
_SUMMARY_NAMES = {"idf": ("idf_documents", "weighting"), "expected_size": (), "store_text": ()}


@_at_the_boundary
class Index:
    """A near-duplicate index stored in one PostgreSQL schema.

    Every public method raises :class:`SimdbError` subclasses (a database error translated by its SQLSTATE,
    with the original as ``__cause__``): :class:`PermissionDenied` for a read-only role, :class:`ConnectionLost`
    when the server goes away, ... (see :mod:`simdb.errors`)."""

    def __init__(self, database: Database, settings: IndexSettings, *, created: bool = False) -> None:
        self.database = database
        self.created = created
        self.settings = settings

    # -- opening -------------------------------------------------------------------------------

    @classmethod
    def create(cls, database_url: str | None = None, *, schema: str | None = None,
               data_dir: str | Path | None = None, exist_ok: bool = False, **settings) -> "Index":
        """Create an index (``method``, then that method's settings: ``max_distance``, ``blocks``, ``idf``,
        ``threshold``, ... as in :meth:`IndexSettings.new`).

        With ``exist_ok``, an existing index with the same settings is opened
        instead; one with other settings is an :class:`IncompatibleIndex`.
        """
        storage = {name: settings.pop(name) for name in ("segment_size", "merge_factor", "bulk_chunk")
                   if settings.get(name) is not None}
        distributed, shards = settings.pop("distributed", False), settings.pop("shards", None)
        layout = settings.pop("distributed_layout", None)
        count_by = settings.pop("count_by", None) or ()
        count_by = tuple(field_counts.check_field(name) for name in
                         dict.fromkeys((count_by,) if isinstance(count_by, str) else count_by))
        for name, value in (("shards", shards), ("distributed_layout", layout)):
            if value is not None and not distributed:
                raise SimdbError(f"{parameter(name)} is for a distributed index: add {parameter('distributed')}")
        try:
            wanted = IndexSettings.new(**settings)
            policy = segments.SegmentPolicy(**{{"segment_size": "size"}.get(name, name): value
                                               for name, value in storage.items()})
        except ValueError as exc:
            raise SimdbError(f"invalid index settings: {exc}") from None
        # a new distributed index is keyed where its method can be (SimHash), else by id; the layout by id is not
        # written: indexes made before layouts were stored have it
        made = keyed.check_layout(keyed.default_layout(wanted.method) if layout is None else layout, wanted.method)
        wanted = replace(wanted, segments=policy, distributed={
            "shards": citus.check_shards(DEFAULT_SHARDS if shards is None else shards),
            **({"layout": made} if made != keyed.BY_ID else {})} if distributed else None, count_by=count_by)
        database = Database.connect(database_url, schema=schema, data_dir=data_dir)
        try:
            with database.engine.begin() as connection:
                created = catalog.create_index(connection, database.schema, wanted, database.display_url)
            if not created and not exist_ok:
                raise SimdbError(f"an index already exists in schema {database.schema!r} of {database.display_url}; "
                                 f"use it as it is, or choose another {parameter('schema')}")
            # an existing index is compared with the settings asked for, not with defaults it was not asked about
            summary = wanted.summary()
            asked = {name: summary.get(name) for given, value in settings.items() if value is not None
                     for name in _SUMMARY_NAMES.get(given, (given,))}
            index = cls._open(database, {} if created else asked)
            index.created = created
            stored = index.settings.segments  # storage settings, compared like the others when asked for
            differences = [f"{name}: asked {value!r}, stored {getattr(stored, key)!r}" for name, key in
                           (("segment_size", "size"), ("merge_factor", "merge_factor"), ("bulk_chunk", "bulk_chunk"))
                           if (value := storage.get(name)) is not None and getattr(stored, key) != value]
            if settings.get("store_text") and not index.settings.texts:
                differences.append("store_text: asked True, stored False")
            if distributed and index.settings.distributed is None:
                differences.append("distributed: asked True, stored False")
            elif layout is not None and keyed.layout_of(index.settings.distributed) != layout:
                differences.append(f"distributed_layout: asked {layout!r}, stored {keyed.layout_of(index.settings.distributed)!r}")
            missing = [name for name in count_by if name not in index.settings.count_by]
            if missing:
                differences.append(f"count_by: asked {list(count_by)!r}, stored {list(index.settings.count_by)!r}; "
                                   f"`simdb count-by add {missing[0]}` adds a field to an index")
            if differences:
                raise IncompatibleIndex("the index was created with other storage settings ("
                                        + "; ".join(differences) + "). Open it without those options, or create "
                                        f"a new index in another {parameter('schema')}")
            return index
        except BaseException:
            database.close()
            raise

    @classmethod
    def copy_to_distributed(cls, database_url: str | None = None, *, schema: str, source: str,
                            shards: int | None = None, data_dir: str | Path | None = None,
                            distributed_layout: str | None = None) -> "Index":
        """A new distributed index in ``schema`` of a Citus coordinator's database, holding everything the
        index in schema ``source`` of the same database holds: its settings, batches, documents with their
        ids, segments, pairs, clusters and verdicts, so that it gives the same answers. One transaction;
        the source's ingests wait for it, and the source is left as it was. ``distributed_layout``: as in
        :meth:`create` (by default keyed for SimHash, by id for MinHash)."""
        database = Database.connect(database_url, schema=schema, data_dir=data_dir)
        try:
            with database.engine.begin() as connection:
                catalog.copy_to_distributed(
                    connection, check_schema_name(source), database.schema,
                    citus.check_shards(DEFAULT_SHARDS if shards is None else shards), database.display_url,
                    distributed_layout)
            index = cls._open(database, {})
            index.created = True
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
        with database.engine.begin() as connection:
            stored = catalog.open_index(connection, database.schema, database.display_url)
        stored.check_requested(expected)
        if stored.distributed is not None:
            database.use_session(citus.SESSION_SETTINGS)
        return cls(database, stored)

    @property
    def context(self) -> IndexContext:
        """What the PostgreSQL layer is told of this index (its settings, method, distributed or not)."""
        return IndexContext(self.database.engine, self.database.schema, self.settings)

    def close(self) -> None:
        self.database.close()

    def __enter__(self) -> "Index":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # -- the method ----------------------------------------------------------------------------

    @property
    def method(self) -> str:
        """The method's name: ``simhash`` or ``minhash``."""
        return self.settings.method.name

    @property
    def layout(self):
        """The method's key layout (key columns, maximum distance)."""
        return self.settings.method.layout

    @functools.cached_property
    def sketcher(self) -> Method:
        """The method, once this process has proven it reproduces the index's canaries."""
        self.settings.check_canaries()
        return self.settings.method

    @property
    def fingerprint_settings(self):
        """The recipe that turns a text into its sketch (checked against the canaries first)."""
        return self.sketcher.recipe

    def fingerprint(self, text: str) -> int | bytes:
        """The text's sketch under the index's recipe: a SimHash fingerprint, or MinHash signature bytes."""
        check_text(text, None, None)
        return self.sketcher.sketch(text)

    # -- ingest --------------------------------------------------------------------------------

    def add(self, external_id: str, text: str, metadata: dict | None = None, *,
            batch: str | None = None) -> BatchSummary:
        """Add one document (as a batch of one)."""
        return self.add_many([Document(checks.external_id(external_id, "id", None, None), check_text(text, None, None),
                                       metadata or {})], batch=batch)

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
        """Ingest documents (and, with ``on_error="skip"``, read errors to reject) as one batch, merging
        segments after each chunk if the index's policy asks for it (unless ``options.compact`` is false)."""
        return ingest(self.database.engine, self.database.schema, self.sketcher, items, options, progress,
                      store_text=self.settings.texts, distributed=self.context.distributed,
                      keyed=self.context.keyed)

    def verdicts(self, batch: str, *, status: str | None = None) -> Iterator[Verdict]:
        """What became of every input record of a stored batch (of one ``status``), in input order, streamed."""
        with self.database.engine.connect() as connection:
            reads.batch_id(connection, batch)
            yield from stored_verdicts(connection, self.settings.method, batch, status=status)

    def check(self, items: Iterable[Document | InputError], *, batch: str | None = None, workers: int | None = 1,
              max_chars: int = DEFAULT_MAX_CHARS) -> Iterator[Verdict]:
        """The verdict each record would get from an ingest now, in input order, streamed; nothing is stored.

        Runs in one read-only snapshot (the reader role may call it). A bad record (an ``InputError``
        item, a text over ``max_chars``, a repeated id) is a ``rejected`` verdict, as ingest records it
        with ``on_error="skip"``.
        """
        return check(self.context, items, batch=batch, workers=workers, max_chars=max_chars)

    def check_many(self, documents: Iterable[Document | Mapping], *, batch: str | None = None,
                   workers: int | None = 1, max_chars: int = DEFAULT_MAX_CHARS) -> list[Verdict]:
        """The verdict each document would get from ``add_many`` now, in input order; nothing is stored."""
        docs = (_as_document(item, i) for i, item in enumerate(documents))
        return list(self.check(docs, batch=batch, workers=workers, max_chars=max_chars))

    def add_fingerprinted(self, fingerprinted: FingerprintedBatch, *, batch: str, source: str = "api",
                          connections: int | None = None) -> BatchSummary:
        """Store already-fingerprinted documents as one batch in one transaction (benchmarks, tests);
        ``connections`` as in :class:`IngestOptions`."""
        started = time.perf_counter()
        with self.database.engine.begin() as connection:
            result = store_chunk(connection, self.database.schema, self.settings.method, fingerprinted, name=batch,
                                 source=source, first=True, final=True, position=len(fingerprinted),
                                 skip_errors=False, distributed=self.context.distributed,
                                 keyed=self.context.keyed, connections=connections)
            row = reads.batch_row(connection, batch)
        return BatchSummary(name=batch, documents=result.stored, new=row.new, exact_duplicates=row.exact_duplicates,
                            near_duplicates=row.near_duplicates, within_batch=row.within_batch,
                            already_stored=row.already_stored, seconds=time.perf_counter() - started)

    # -- PostgreSQL sources kept in sync ---------------------------------------------------------------

    @property
    def _own_url(self) -> str:
        """The index's database as libpq takes it, password included: a source in the same database is read there."""
        return self.database.engine.url.set(drivername="postgresql").render_as_string(hide_password=False)

    def sync_add(self, name: str, **source) -> tuple[sync.Source, bool]:
        """Record a PostgreSQL table or query to keep in sync (``table`` or ``query``, ``id_column``,
        ``text_column``, ``metadata_columns``, ``watermark_column``, ``source_url``, ``on_change``, ``lag``: see
        :mod:`simdb.sync`); returns it and whether a password was left out of its stored URL."""
        return sync.add_source(self.database.engine, self._own_url, name=name, **source)

    def sync_sources(self) -> list[tuple[sync.Source, dict | None]]:
        """Every sync source, with its latest run's batch counts (None before its first stored chunk)."""
        return sync.list_sources(self.database.engine)

    def sync_run(self, name: str, options: IngestOptions | None = None, *, source_url: str | None = None,
                 wait: bool = False, itersize: int = sync.DEFAULT_ITERSIZE,
                 progress: Callable[[int], None] | None = None) -> BatchSummary:
        """Ingest source ``name``'s rows past its watermark as one batch (options as for :meth:`ingest`; the batch
        name is the run's own)."""
        return sync.run_source(self.database.engine, self.database.schema, self.sketcher, self._own_url, name,
                               options or IngestOptions(), source_url=source_url, wait=wait, itersize=itersize,
                               store_text=self.settings.texts, distributed=self.context.distributed,
                               keyed=self.context.keyed, progress=progress)

    # -- removal and layout ------------------------------------------------------------------------

    def remove(self, *, ids: list[str] | None = None, batch: str | None = None, before: datetime | None = None,
               dry_run: bool = False) -> RemovalSummary:
        """Remove documents by id, batch or ingest time; ``dry_run`` reports without removing."""
        connection = self.database.engine.connect()
        try:
            with connection.begin() as transaction:
                summary = remove(connection, self.database.schema, self.settings.method, external_ids=ids,
                                 batch=batch, before=before, keyed=self.context.keyed)
                if dry_run:
                    transaction.rollback()
            return dataclasses.replace(summary, dry_run=dry_run)
        finally:
            connection.close()

    def count_by(self, field: str) -> int:
        """Count documents and duplicates by the values of the metadata field ``field`` from now on (the table
        ``field_counts``): its counts filled from the stored documents in one statement, in one transaction with
        the settings that name it, ingests waiting; how many values it has."""
        with self.database.engine.begin() as connection:
            values = field_counts.add_field(connection, self.database.schema, field)
        self.settings = replace(self.settings, count_by=(*self.settings.count_by, field))
        return values

    def counts_by_field(self) -> dict[str, tuple[int, int, int]]:
        """{field: (values, documents, duplicates)} of every metadata field the index counts by."""
        with self.database.engine.connect() as connection:
            return field_counts.field_values(connection)

    def relayout(self, blocks: int | None = None, progress: Callable[[str], None] | None = None) -> None:
        """Rebuild the key columns for ``blocks`` blocks (default: the fewest that suit the archive's size),
        online (see :mod:`simdb.pg.relayout`)."""
        self.settings = relayout(self.database.engine, self.database.schema, self.settings, blocks,
                                 progress=progress)
        self.__dict__.pop("sketcher", None)

    def move_to_keyed_layout(self) -> int:
        """Move this distributed index from the layout by document id to the keyed layout (``simdb relayout
        --distributed-layout keyed``; :func:`simdb.pg.catalog.move_to_keyed`): one transaction, so that an
        interrupted move leaves the layout by id as it was; key rows written."""
        with self.database.engine.begin() as connection:
            self.settings, written = catalog.move_to_keyed(connection, self.database.schema, self.settings)
        return written

    def compact(self, *, full: bool = False, progress: Callable[[str], None] | None = None
                ) -> segments.CompactionSummary:
        """Merge sealed segments as the index's policy asks (``full``: all of them into one); see
        :mod:`simdb.pg.segments`."""
        return segments.compact(self.database.engine, self.database.schema, distributed=self.context.distributed,
                                full=full, progress=progress, key_columns=self.settings.method.key_columns)

    def segments(self) -> list[segments.Segment]:
        """The segments of ``documents`` in id order, with their document counts and sizes."""
        with self.database.engine.connect() as connection:
            return segments.list_segments(connection, distributed=self.context.distributed, counts=True)

    def grant_reader(self, role: str, *, login: bool | None = None, password: str | None = None) -> Grant:
        """Create or update a read-only role for analysts. ``login`` gives (True) or takes (False) its LOGIN;
        None leaves an existing role's as it is."""
        with self.database.engine.begin() as connection:
            return grant_reader(connection, self.database.schema, role, login=login, password=password,
                                distributed=self.context.distributed)

    def install_sql_functions(self) -> list[str]:
        """Write ``simdb_sketch(text)`` in PL/Python, finding simdb where this process does, so that SQL can
        sketch a text (and ``simdb_near_text``, ``simdb_similar_text`` look it up); the paths it gave the server.
        Needs a superuser and PL/Python on the server (:func:`simdb.pg.plpython.install`)."""
        with self.database.engine.begin() as connection:
            return plpython.install(connection, self.database.schema, self.sketcher)

    # -- queries -------------------------------------------------------------------------------

    def _max_distance(self, max_distance: int | None) -> int:
        limit = self.settings.method.max_distance
        if max_distance is None:
            return limit
        if not 0 <= max_distance <= limit:
            raise SimdbError(f"{parameter('max_distance')} must be between 0 and the index's maximum distance "
                             f"{limit}, not {max_distance}")
        return max_distance

    def distance_for(self, min_similarity: float) -> int:
        """The largest distance whose similarity is still ``min_similarity`` (MinHash)."""
        return self.settings.method.distance_for(min_similarity)

    def _match(self, row, distance: int) -> "Match":
        method = self.settings.method
        return Match(row.external_id, distance, method.match_sketch(row.sketch),
                     {} if row.metadata is None else row.metadata, method.reported_similarity(distance))

    def query(self, text: str, max_distance: int | None = None) -> list["Match"]:
        """Stored documents within ``max_distance`` of ``text``, nearest first (decided as ingest decides: by
        the texts where the method does)."""
        return self.query_many([text], max_distance)[0] if self.settings.method.needs_texts else \
            self.query_fingerprint(self.fingerprint(text), max_distance)

    def query_fingerprint(self, sketch: int | bytes, max_distance: int | None = None) -> list["Match"]:
        """Stored documents within ``max_distance`` of a sketch (a SimHash fingerprint or MinHash signature).

        The lookup is the analysts' SQL function where the method has one (``simdb_lookup``, which ``simdb_near``
        reads), through the key indexes; Python verifies every answer again.
        """
        limit = self._max_distance(max_distance)
        # one statement, one round trip: no BEGIN/ROLLBACK around a read
        with self.database.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
            found = reads.lookup(connection, self.settings.method, sketch, limit, keyed=self.context.keyed)
        return sorted((self._match(row, distance) for row, distance in found),
                      key=lambda m: (m.distance, m.external_id))

    def query_many(self, texts: Iterable[str], max_distance: int | None = None, *,
                   connections: int | None = None) -> list[list["Match"]]:
        """One result list per text, found with one set-based statement per key column."""
        texts = list(texts)
        return self.query_fingerprints(self.sketcher.sketch_all(texts), max_distance, texts=texts,
                                       connections=connections)

    def query_fingerprints(self, sketches: list[int | bytes], max_distance: int | None = None, *,
                           texts: list[str] | None = None, connections: int | None = None) -> list[list["Match"]]:
        """One result list per sketch (fingerprint or signature bytes), found with one set-based statement per key
        column (its statements shared out over ``connections`` database connections, all reading one snapshot;
        default: this machine's cores for a batch of a few hundred or more, see
        :func:`simdb.pg.reads.probe_arrays`; on the keyed distributed layout, its routed statements over that many
        coordinator connections, outside a transaction block, see :func:`simdb.pg.reads.keyed_matches`); with the
        sketches' ``texts``, a method that decides by the texts decides by them (else by the sketches)."""
        limit = self._max_distance(max_distance)
        if (problem := connections_problem(connections)) is not None:
            raise SimdbError(f"{parameter('connections')} {problem}")
        if not sketches:
            return []
        method = self.settings.method
        by_texts = texts is not None and method.needs_texts
        if self.context.keyed and not by_texts:
            # outside a transaction block (each worker reads its own snapshot there anyway), which spares every
            # worker connection a BEGIN, a transaction id and a COMMIT; read again where a row went missing
            with self.database.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
                found, rows = reads.keyed_matches(connection, self.context, sketches, limit, connections=connections)
            return self._matches(found, rows)
        # one snapshot for the lookups (over several connections) and the rows read after them
        with self.database.engine.connect().execution_options(isolation_level="REPEATABLE READ") as connection, \
                connection.begin():
            found = reads.match_many(connection, self.context, sketches,
                                     method.candidate_distance(limit) if by_texts else limit, connections=connections)
            if by_texts:  # the queries are -1, -2, ... among the stored ids
                pairs = np.array([(-i - 1, d, distance) for i, distances in enumerate(found)
                                  for d, distance in distances.items()], dtype=np.int64).reshape(-1, 3)
                decided = method.decide(pairs, lambda ids: reads.texts(connection, ids, texts), limit)
                found = [{} for _ in sketches]
                for query, d, distance in decided.tolist():
                    found[-query - 1][d] = distance
            rows = reads.documents(connection, method, sorted({d for distances in found for d in distances}),
                                   keyed=self.context.keyed, connections=connections)
        return self._matches(found, rows)

    def _matches(self, found: list[dict[int, int]], rows: dict) -> list[list["Match"]]:
        """Each sketch's matches, nearest first, from its {document id: distance} and the documents' rows. On
        Citus each worker reads its own snapshot: a match whose documents row is not there was being removed or
        added meanwhile (the two-phase commit reached its keys' worker and its row's at different moments), and
        is left out, as if the removal came first or the chunk after."""
        return [sorted((self._match(rows[d], distance) for d, distance in distances.items() if d in rows),
                       key=lambda m: (m.distance, m.external_id)) for distances in found]

    def document(self, external_id: str) -> StoredDocument:
        """A stored document by its id, with its text where the index keeps texts."""
        method = self.settings.method
        with self.database.engine.connect() as connection:
            row = reads.stored_document(connection, method, external_id)
        return StoredDocument(row.external_id, row.batch, row.length, row.created_at, row.cluster, row.duplicate_of,
                              row.duplicate_distance, row.metadata, row.text, row.id, row.sketch)

    def distance_between(self, a: StoredDocument, b: StoredDocument) -> int:
        """The distance the index's method gives two stored documents (by their texts where it decides by
        them), whether or not it is within the index's distance."""
        method = self.settings.method
        distance = int(method.pair_distances([a.sketch, b.sketch], np.array([0]), np.array([1]))[0])
        if method.needs_texts:
            pair = np.array([[b.id, a.id, distance]], dtype=np.int64)
            distance = int(method.decide(pair, lambda ids: {a.id: a.text, b.id: b.text},
                                         method.max_possible_distance)[0, 2])
        return distance

    def pairs(self, batch: str | None = None, max_distance: int | None = None) -> Iterator[Pair]:
        """Every stored pair within ``max_distance`` (or involving one batch), earlier document first.

        Pairs are stored as they are found at ingest (every pair within the
        index's distance is found when its later document arrives), so this
        reads the ``near_duplicates`` table. An unknown batch is an error now,
        before the first pair is asked for.
        """
        limit = self._max_distance(max_distance)
        chosen = None
        if batch is not None:
            with self.database.engine.connect() as connection:
                chosen = reads.batch_id(connection, batch)
        return self._pairs(limit, chosen)

    def _pairs(self, limit: int, batch: int | None) -> Iterator[Pair]:
        method = self.settings.method
        with self.database.engine.connect() as connection:
            for row in reads.pairs(connection, limit, batch):
                yield Pair(row.a, row.b, row.distance, method.reported_similarity(row.distance))

    def export(self, *, batch: str | None = None, unique: bool = False, canonical: bool = False) -> Iterator[dict]:
        """``{"id", "simhash" | "signature", ...metadata}`` for every document, in the order they were stored.

        ``batch`` keeps one batch's documents. ``unique`` keeps the documents that duplicated nothing stored
        before them when they arrived (their verdict was ``new``; with ``batch``: the deduplicated batch); a
        verdict is history, so neither later batches nor removals change the answer. ``canonical`` keeps
        one document per cluster as the archive stands, its earliest (a later document can link a cluster to
        an older one, and a removal can split one). The sketch is the fingerprint's 16 hex digits (SimHash)
        or the signature's hex (MinHash). A metadata field with the same name as one of these is exported as
        ``metadata.<name>``.
        """
        for row in self.export_rows(batch=batch, unique=unique, canonical=canonical):
            record = {"id": row["id"], row["sketch_name"]: row["sketch"]}
            for key, value in row["metadata"].items():
                record[f"metadata.{key}" if key in ("id", row["sketch_name"]) else key] = value
            yield record

    def export_rows(self, *, batch: str | None = None, unique: bool = False, canonical: bool = False
                    ) -> Iterator[dict]:
        """The documents :meth:`export` gives, as ``{"id", "sketch_name", "sketch", "batch", "metadata"}``."""
        if unique and canonical:
            raise SimdbError("give «unique» or «canonical», not both: the documents that were new when they "
                             "arrived, or the earliest of each cluster")
        method = self.settings.method
        column = self.context.sql.sketch_column[0]
        with self.database.engine.connect() as connection:
            chosen = reads.batch_id(connection, batch) if batch is not None else None
            for row in reads.export(connection, method, batch=chosen, unique=unique, canonical=canonical):
                yield {"id": row.external_id, "sketch_name": column, "sketch": method.format(row.sketch),
                       "batch": row.batch, "metadata": row.metadata}

    def stats(self, *, exact: bool = False) -> dict:
        """Counts, layout and the measured key buckets (with a layout advice when they have grown too big):
        measured over every document when ``exact`` or the archive is small, else over a random sample
        (:func:`simdb.pg.reads.statistics`)."""
        method = self.settings.method
        with self.database.engine.connect() as connection:
            found = reads.statistics(connection, method, sample=None if exact else reads.STATS_SAMPLE,
                                     keyed=self.context.keyed)
            stored_segments = segments.list_segments(connection, distributed=self.context.distributed, counts=True)
            policy = segments.load_policy(connection)
            server_warnings = server.warnings(connection)
            stored_settings = catalog.load_settings(connection)  # ingests since the open add segmenters
        documents = found["documents"]
        expected = method.expected_candidates(documents)
        return {
            "schema": self.database.schema,
            "database": self.database.display_url,
            "documents": documents,
            "duplicates": found["duplicates"],
            "batches": [dict(row._mapping) for row in found["batches"]],
            "settings": self.settings.summary(),
            # on Citus: its shards and layout (id, or keyed: simdb.pg.keyed); None on one server
            "distributed": None if self.settings.distributed is None else {
                "shards": self.settings.distributed["shards"], "layout": keyed.layout_of(self.settings.distributed)},
            "layout": method.describe(),
            "segmenters": list(stored_settings.segmenters),
            "expected_candidates_per_lookup": None if expected is None else round(expected, 2),
            "measured_candidates_per_lookup": round(found["measured"], 2),
            "measured_from_sample": found["sampled"],
            "largest_key_buckets": [{"key": column, "value": value, "documents": n}
                                    for n, column, value in found["largest"]],
            "advice": method.layout_advice(found["measured"], documents),
            "table_bytes": found["table_bytes"],
            "segments": [segment.to_json() for segment in stored_segments],
            "segment_policy": policy.to_row(),
            "compaction_due": bool(policy.plan([s.size for s in stored_segments if not s.active])),
            "server_warnings": server_warnings,
        }
