"""A PostgreSQL table or query kept in sync with the index: each run ingests the rows past the source's
watermark as one batch.

A source (``simdb sync add``) names a table (or a query), its id and text columns, metadata columns, and
optionally a watermark column such as ``updated_at`` and another server's URL. A run (``simdb sync run``)
is an ingest (:mod:`simdb.ingest`: chunks, verdicts, rejects, summary) whose input is the source's rows
in ``(watermark, id)`` order past the source's position, read through a server-side cursor
(:mod:`simdb.pg.sync`). The position is the ``(watermark, id)`` of the last row of the last committed
chunk, stored in the index's ``sync_sources`` table in that chunk's transaction: a run that is killed or
fails keeps what its committed chunks stored, and the next run continues its batch from there, never
skipping or repeating a row.

- **Ties.** Rows with equal watermarks are told apart by their ids, so a chunk that ends inside a run of
  equal ``updated_at`` values resumes at the next id. Without a watermark column the id alone orders the
  rows, and a run reads the ids above the last one stored: new rows only.
- **Late commits.** A row committed in the source after a run read past its watermark value (a long
  transaction that set ``updated_at = now()`` at its start) is never read. ``lag`` reads only rows whose
  watermark is at least that old (``now() - lag`` on the source's clock), which leaves such transactions
  time to commit; it needs a timestamp watermark.
- **Changed rows.** A row read again (its watermark moved) whose text is the one stored is
  ``already_stored``. One whose text changed is handled as ``on_change`` says: ``keep`` (the default)
  keeps the first version and records the change as the row's verdict, ``rejected`` with the reason
  "already stored with a different text" (so a run with changes exits 3); ``replace`` removes the stored
  document and its pairs (:func:`simdb.pg.remove.remove`) in the transaction of the chunk that stores the
  new text, which is then matched like any new row; only a document of this source's batches is replaced (one
  of another origin is a reject, as under ``keep``). A row that an interrupted run stored and its resumed run
  (the same batch) reads again is such a changed row.
- **Bad rows.** A NULL id or text, an empty text, or an id one run reads twice is a reject naming the
  source and the row: ``sync source NAME, row N`` (its place in the batch's input) and its id, or its
  watermark where the id is NULL. A row with a NULL id is read once (at its watermark); without a
  watermark column, by every run until it has an id. Rows whose watermark is NULL are not read until it
  is set.
- **One run at a time.** A run holds a session advisory lock on its source: a second run of the same
  source refuses at once (or waits, with ``wait``), and never ingests a row twice.
"""

from __future__ import annotations

import json
import re
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from datetime import datetime, timedelta, timezone

import sqlalchemy as sa

from .errors import InputError, Row, SimdbError, place
from .ingest import BatchSummary, IngestOptions, ingest
from .ingest_options import DEFAULT_ITERSIZE, ON_CHANGE
from .inputs import Document, checks
from .methods import Method
from .pg import sync as pg
from .pg.database import postgres_url, redact, secrets_in
from .pg.sync import Source

_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,62}$")

__all__ = ["ON_CHANGE", "Source", "add_source", "list_sources", "run_source"]


def stored_url(url: str | None) -> tuple[str | None, bool]:
    """A source URL as a source row keeps it, without its passwords (userinfo, ``?password=``,
    ``?sslpassword=``, libpq's ``password=``); and whether it had one."""
    if url is None:
        return None, False
    parsed = postgres_url(url)
    secret_parameters = [name for name in parsed.query if name.lower().endswith("password")]
    kept = parsed._replace(password=None).set(drivername="postgresql")  # URL.set() takes None as "unchanged"
    kept = kept.difference_update_query(secret_parameters)
    return kept.render_as_string(hide_password=False), bool(parsed.password or secret_parameters or secrets_in(url))


def add_source(engine: sa.Engine, own_url: str, *, name: str, table: str | None = None, query: str | None = None,
               id_column: str, text_column: str, metadata_columns: Iterable[str] = (),
               watermark_column: str | None = None, source_url: str | None = None, on_change: str = "keep",
               lag: timedelta | None = None) -> tuple[Source, bool]:
    """Record a source after proving it can be read (from ``source_url``, else ``own_url``, the index's database);
    returns it and whether a password was left out of the stored URL."""
    if not _NAME.match(name or ""):
        raise SimdbError(f"invalid sync source name {name!r}: use letters, digits, '_', '-' and '.' (at most 63)")
    if (table is None) == (query is None):
        raise SimdbError("give the source's rows with exactly one of «table» (schema.table) or «query»")
    if on_change not in ON_CHANGE:
        raise SimdbError(f"«on_change» must be one of {', '.join(ON_CHANGE)}, not {on_change!r}")
    if lag is not None and watermark_column is None:
        raise SimdbError("«lag» holds rows back by their watermark: give «watermark» (a timestamp column) too")
    columns = [id_column, text_column, *metadata_columns]
    if len(set(columns)) != len(columns):
        raise SimdbError(f"the id, text and metadata columns must differ: {', '.join(columns)}")
    url, had_password = stored_url(source_url)
    source = Source(name=name, relation=table, query=query, id_column=id_column, text_column=text_column,
                    metadata_columns=tuple(metadata_columns), watermark_column=watermark_column, source_url=url,
                    on_change=on_change, lag=lag)
    pg.check_source(source_url or own_url, source)
    with engine.begin() as connection:
        pg.add_source(connection, source)
    return source, had_password


def list_sources(engine: sa.Engine) -> list[tuple[Source, dict | None]]:
    """Every source with its latest run's batch counts (None before its first stored chunk)."""
    with engine.connect() as connection:
        sources, batches = pg.list_sources(connection), pg.batch_summaries(connection)
    return [(source, batches.get(source.batch)) for source in sources]


class _Positions:
    """The source position of each record read, by its place in the batch's input, until a chunk commits
    past it: the reader runs ahead of the commits (fingerprinting in flight, a chunk being filled)."""

    def __init__(self, consumed: int, source: Source) -> None:
        self.read = consumed
        self.pending: deque[tuple[int, str | None, str | None]] = deque()
        self.by_watermark = source.watermark_column is not None
        self.last = (source.watermark, source.last_id)

    def note(self, watermark: str | None, row_id: str | None) -> None:
        self.read += 1
        self.pending.append((self.read, watermark, row_id))

    def at(self, consumed: int) -> tuple[str | None, str | None]:
        """The position after the first ``consumed`` records."""
        while self.pending and self.pending[0][0] <= consumed:
            _, watermark, row_id = self.pending.popleft()
            if self.by_watermark:
                self.last = (watermark, row_id)  # a NULL id sorts last among its ties: past all of them
            elif row_id is not None:
                self.last = (None, row_id)  # NULL ids come after every id: a run reads them again
        return self.last


def _records(source: Source, rows: Iterator[tuple], positions: _Positions) -> Iterator[Document | InputError]:
    """The run's rows as documents, or errors. An id this run reads twice is a reject here, in memory (its
    first row's place kept by id): the index cannot tell it apart from a row that an earlier, interrupted run
    of the same batch stored and that was read again because its watermark moved (a changed row). Without a
    watermark column the rows come in id order, so a repeated id comes right after its first row: only the
    last id is kept, and memory stays flat in the run's size. With one, every id the run has read is kept
    (about 150 bytes an id: 140 MB at a million rows).

    The metadata comes as a jsonb object's text, which holds no NUL, no unpaired surrogate and no NaN: only
    its numbers are checked (as JSON lines' are: one too large for a double, such as a numeric of 400 digits
    and a fraction, or an integer of more than 4,300 digits, rejects its row), not encoded again."""
    where, first_at = f"sync source {source.name}", {}
    by_id = source.watermark_column is None
    for row_id, text, metadata, watermark in rows:
        positions.note(watermark, row_id)
        row = Row(positions.read)  # its place in the batch's input: "sync source NAME, row N"
        try:
            if row_id is None:
                at = f" (watermark {watermark})" if watermark is not None else ""
                raise InputError(f"a row{at} has a NULL id column {source.id_column!r}", path=where, line=row,
                                 hint="give every row an id")
            if row_id in first_at:
                raise checks.repeated_id(row_id, place(where, row), f"first at {place(where, first_at[row_id])}")
            checks.check_string(row_id, where, row, "id")  # the error's id: set below
            if text is None:
                raise InputError(f"the row with id {row_id!r} has a NULL text column {source.text_column!r}",
                                 path=where, line=row, hint="give the row a text, or leave it out of the source")
            checks.check_text(text, where, row)
            document = Document(row_id, text, _metadata(metadata, where, row), path=where, line=row)
            if by_id:
                first_at.clear()
            first_at[row_id] = row
            yield document
        except InputError as error:
            if error.external_id is None and row_id is not None:
                error.external_id = row_id
            if row_id is not None and str(row_id) not in str(error):
                error = _naming(error, row_id)
            yield error


_METADATA = json.JSONDecoder(parse_float=checks.finite_float)


def _metadata(text: str, where: str, row: Row) -> dict:
    """A row's metadata from its jsonb text (see :func:`_records`)."""
    try:
        return _METADATA.decode(text)
    except ValueError as exc:  # a number too large for a double, an integer of more than 4,300 digits
        raise InputError(f"unreadable number in a metadata column: {exc}", path=where, line=row,
                         hint="cast such a column to text in the source's query (--query)") from None


def source_documents(url: str, source: Source, itersize: int = DEFAULT_ITERSIZE) -> Iterator[Document | InputError]:
    """The documents (and bad rows, as errors) a run of ``source`` would read now from ``url``, storing nothing
    (benchmarks: the reader alone)."""
    positions = _Positions(0, source)
    for item in _records(source, pg.source_rows(url, source, itersize), positions):
        positions.at(positions.read)  # no chunk commits here: keep no row's position
        yield item


def _naming(error: InputError, row_id: str) -> InputError:
    """The error, saying which row it is about."""
    named = InputError(f"row with id {row_id!r}: {error.reason}", path=error.path, line=error.line, hint=error.hint)
    named.external_id = row_id
    return named


def run_source(engine: sa.Engine, schema: str, method: Method, own_url: str, name: str, options: IngestOptions,
               *, source_url: str | None = None, wait: bool = False, itersize: int = DEFAULT_ITERSIZE,
               store_text: bool = False, distributed: bool, keyed: bool,
               progress: Callable[[int], None] | None = None) -> BatchSummary:
    """Ingest source ``name``'s rows past its position as one batch (see the module docstring); ``source_url``
    overrides the stored URL for this run (one with its password)."""
    with engine.connect() as holder:
        if not pg.lock_run(holder, schema, name, wait):
            raise SimdbError(f"another `simdb sync run` of source {name!r} is under way; this one stopped before "
                             "reading anything (run it again when that one is done, or pass «wait»)")
        try:
            return _run(engine, schema, method, own_url, name, options, source_url, itersize, store_text, distributed,
                        keyed, progress)
        finally:
            pg.unlock_run(holder, schema, name)


def _run(engine, schema, method, own_url, name, options, source_url, itersize, store_text, distributed, keyed,
         progress) -> BatchSummary:
    with engine.connect() as connection:
        source = pg.get_source(connection, name)
        consumed = pg.running_batch(connection, source.batch)
    resumed = consumed is not None
    batch = source.batch if resumed else f"sync-{name}-{datetime.now(timezone.utc):%Y%m%dT%H%M%S.%fZ}"
    positions, origin = _Positions(consumed or 0, source), f"sync {name}"  # origin: its batches' source

    def replace_changed(connection: sa.Connection, chunk) -> bool:
        return bool(pg.remove_changed(connection, schema, method, chunk.external_ids, chunk.content_hashes, origin,
                                      keyed=keyed))

    def advance(connection: sa.Connection, position: int) -> None:
        pg.advance(connection, name, *positions.at(position), batch)

    url = source_url or source.source_url or own_url
    rows = pg.source_rows(url, source, itersize)
    run_options = replace(options, batch=batch, resume=resumed, source=origin, items_follow_position=True,
                          before_chunk=replace_changed if source.on_change == "replace" else None,
                          after_chunk=advance)
    try:
        summary = ingest(engine, schema, method, _records(source, rows, positions), run_options, progress,
                         store_text=store_text, distributed=distributed, keyed=keyed)
    except SimdbError as error:
        error.args = (redact(str(error.args[0]) if error.args else str(error), secrets_in(url)),)
        raise
    finally:
        rows.close()
    with engine.begin() as connection:
        pg.finish_run(connection, name)
    return summary
