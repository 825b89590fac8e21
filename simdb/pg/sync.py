"""Sources kept in sync (``simdb sync``): their rows in ``sync_sources``, the lock of a run, and the source's
rows past its watermark, read through a server-side cursor.

A source's rows are read in ``(watermark, id)`` order (``id`` alone without a watermark column) by
``DECLARE ... CURSOR`` (psycopg's named cursor, ``itersize`` rows a round trip), in one read-only
REPEATABLE READ transaction: one snapshot of the source for the whole run, and memory flat in its size.
The position a run has reached is the ``(watermark, id)`` of the last row a committed chunk consumed,
both as the source prints them (``::text``) and compared back in the source's own types (psycopg sends a
string as an untyped literal, which PostgreSQL reads as the column's type).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta

import numpy as np
import psycopg
import sqlalchemy as sa
from psycopg import sql

from ..errors import NotFound, SimdbError
from ..methods import Method
from . import keyed as keyed_layout
from .copy import copy_in
from .database import lock, redact, secrets_in, translate
from .remove import remove


@dataclass(frozen=True)
class Source:
    """How to read one source, and where its last committed chunk stopped (``watermark``, ``last_id``)."""

    name: str
    relation: str | None
    query: str | None
    id_column: str
    text_column: str
    metadata_columns: tuple[str, ...] = ()
    watermark_column: str | None = None
    source_url: str | None = None
    on_change: str = "keep"
    lag: timedelta | None = None
    watermark: str | None = None
    last_id: str | None = None
    batch: str | None = None
    created_at: datetime | None = None
    last_run_at: datetime | None = None

    @property
    def started(self) -> bool:
        """Whether a committed chunk has stored rows of it (a position to read after)."""
        return self.watermark is not None or self.last_id is not None

    def to_json(self, last_run: dict | None = None) -> dict:
        return {"name": self.name, "table": self.relation, "query": self.query, "id": self.id_column,
                "text": self.text_column, "metadata": list(self.metadata_columns),
                "watermark_column": self.watermark_column, "source_url": self.source_url,
                "on_change": self.on_change, "lag": None if self.lag is None else str(self.lag),
                "watermark": self.watermark, "last_id": self.last_id, "batch": self.batch,
                "last_run_at": None if self.last_run_at is None else self.last_run_at.isoformat(),
                "last_run": last_run}


_COLUMNS = ("name", "relation", "query", "id_column", "text_column", "metadata_columns", "watermark_column",
            "source_url", "on_change", "lag", "watermark", "last_id", "batch", "created_at", "last_run_at")


def _source(row) -> Source:
    values = dict(row._mapping)
    values["metadata_columns"] = tuple(values["metadata_columns"])
    return Source(**values)


def add_source(connection: sa.Connection, source: Source) -> None:
    added = connection.execute(sa.text(
        "INSERT INTO sync_sources (name, relation, query, id_column, text_column, metadata_columns, "
        "watermark_column, source_url, on_change, lag) VALUES (:name, :relation, :query, :id_column, :text_column, "
        ":metadata_columns, :watermark_column, :source_url, :on_change, :lag) ON CONFLICT (name) DO NOTHING "
        "RETURNING name"),
        {name: getattr(source, name) if name != "metadata_columns" else list(source.metadata_columns)
         for name in _COLUMNS[:10]}).first()
    if added is None:
        raise SimdbError(f"a sync source named {source.name!r} exists already; choose another name "
                         "(`simdb sync list` shows them)")


def list_sources(connection: sa.Connection) -> list[Source]:
    return [_source(row) for row in connection.execute(sa.text(
        f"SELECT {', '.join(_COLUMNS)} FROM sync_sources ORDER BY name"))]


def get_source(connection: sa.Connection, name: str) -> Source:
    row = connection.execute(sa.text(f"SELECT {', '.join(_COLUMNS)} FROM sync_sources WHERE name = :name"),
                             {"name": name}).first()
    if row is None:
        raise NotFound(f"no sync source named {name!r}; add it with `simdb sync add` (`simdb sync list` shows "
                         "the sources)")
    return _source(row)


def advance(connection: sa.Connection, name: str, watermark: str | None, last_id: str | None, batch: str) -> None:
    """Inside a chunk's transaction: the source's rows up to ``(watermark, last_id)`` are stored by ``batch``."""
    connection.execute(sa.text(
        "UPDATE sync_sources SET watermark = :watermark, last_id = :last_id, batch = :batch WHERE name = :name"),
        {"watermark": watermark, "last_id": last_id, "batch": batch, "name": name})


def finish_run(connection: sa.Connection, name: str) -> None:
    connection.execute(sa.text("UPDATE sync_sources SET last_run_at = now() WHERE name = :name"), {"name": name})


def running_batch(connection: sa.Connection, batch: str | None) -> int | None:
    """The input records consumed by ``batch`` (a source's latest) if it is stored in part (an interrupted run to
    continue), else None."""
    return None if batch is None else connection.execute(sa.text(
        "SELECT position FROM batches WHERE name = :name AND status = 'running'"), {"name": batch}).scalar()


def batch_summaries(connection: sa.Connection) -> dict[str, dict]:
    """{batch name: its counts} of the batches of synced sources."""
    return {row.name: {"batch": row.name, "status": row.status, "started_at": row.started_at.isoformat(),
                       "finished_at": None if row.finished_at is None else row.finished_at.isoformat(),
                       "documents": row.documents, "new": row.new, "exact_duplicates": row.exact_duplicates,
                       "near_duplicates": row.near_duplicates, "already_stored": row.already_stored,
                       "rejected": row.rejected}
            for row in connection.execute(sa.text(
                "SELECT name, status, started_at, finished_at, documents, new, exact_duplicates, near_duplicates, "
                "already_stored, rejected FROM batches WHERE source LIKE 'sync %'"))}


def _lock_key(schema: str, name: str) -> str:
    return f"simdb sync {schema} {name}"


def lock_run(connection: sa.Connection, schema: str, name: str, wait: bool) -> bool:
    """Take the session lock of source ``name``'s runs (waiting for it when ``wait``); False if another run holds
    it. It is released by :func:`unlock_run`, or when the session ends (a killed run's too)."""
    function = "pg_advisory_lock" if wait else "pg_try_advisory_lock"
    granted = connection.execute(sa.text(f"SELECT {function}(hashtextextended(:key, 0))"),
                                 {"key": _lock_key(schema, name)}).scalar()
    connection.commit()
    return wait or bool(granted)


def unlock_run(connection: sa.Connection, schema: str, name: str) -> None:
    connection.execute(sa.text("SELECT pg_advisory_unlock(hashtextextended(:key, 0))"),
                       {"key": _lock_key(schema, name)})
    connection.commit()


def remove_changed(connection: sa.Connection, schema: str, method: Method, external_ids: list[str],
                   content_hashes: list[bytes], origin: str, *, keyed: bool) -> list[str]:
    """Inside a chunk's transaction, before it is stored: remove the documents that the source's batches
    (``batches.source`` = ``origin``, "sync NAME") stored and that the chunk holds with another text (their
    pairs go with them, see :mod:`simdb.pg.remove`); returns their ids. An earlier chunk of the running batch
    counts: its run read no row twice (:func:`simdb.sync._records`), so the row was stored by an interrupted run
    and read again because it changed. A document of another origin is left to the chunk to reject."""
    if not external_ids:
        return []
    lock(connection, schema, "ingest")  # before the SELECT: no `simdb remove` between it and remove()
    if keyed:  # the stored ones found through external_ids (each id to one shard), then read by id (routed)
        stored = dict(keyed_layout.stored_documents(connection, external_ids))
        texts = dict(zip(external_ids, content_hashes))
        ids = np.asarray(sorted(stored.values()), dtype=np.int64)
        rows = [row for group in (keyed_layout.by_shard(connection, "documents", ids) if len(ids) else [])
                for row in connection.execute(sa.text(  # each shard its own ids
                    "SELECT d.external_id, d.content_hash FROM documents d JOIN batches b ON b.id = d.batch_id "
                    "WHERE d.id = ANY(:ids) AND b.source = :origin"), {"ids": group.tolist(), "origin": origin})]
        changed = sorted({external_id for external_id, content_hash in rows if texts[external_id] != content_hash})
    else:
        copy_in(connection, "sync_chunk (external_id, content_hash)", ["text", "bytea"],
                zip(external_ids, content_hashes), create=True)
        changed = connection.execute(sa.text(
            "SELECT DISTINCT d.external_id FROM sync_chunk c JOIN documents d USING (external_id) "
            "JOIN batches b ON b.id = d.batch_id WHERE b.source = :origin AND d.content_hash <> c.content_hash "
            "ORDER BY 1"), {"origin": origin}).scalars().all()
        connection.exec_driver_sql("DROP TABLE sync_chunk")
    if changed:
        remove(connection, schema, method, external_ids=list(changed), keyed=keyed)
    return list(changed)


# -- the source's side ------------------------------------------------------------------------------

def _relation(relation: str) -> sql.Composable:
    return sql.Identifier(*relation.split(".", 1))


def select_rows(source: Source, after: bool) -> sql.Composed:
    """The statement reading the source's rows in order (past its position when ``after``): id and watermark
    as text, the text, and the metadata columns as the text of one jsonb object (parsed by the reader, which
    checks its numbers: see :func:`simdb.sync._records`; a jsonb value holds no NUL and no unpaired surrogate)."""
    base = sql.SQL(source.query.strip().rstrip(";").replace("%", "%%")) if source.query else \
        sql.SQL("SELECT * FROM {}").format(_relation(source.relation))
    column = {"id": sql.SQL("s.{}").format(sql.Identifier(source.id_column))}
    metadata = sql.SQL("jsonb_build_object({})::text").format(sql.SQL(", ").join(
        sql.SQL("{}, s.{}").format(sql.Literal(name), sql.Identifier(name)) for name in source.metadata_columns))
    conditions, order = [], [column["id"]]
    if source.watermark_column is not None:
        column["watermark"] = sql.SQL("s.{}").format(sql.Identifier(source.watermark_column))
        conditions.append(sql.SQL("{} IS NOT NULL").format(column["watermark"]))
        order.insert(0, column["watermark"])
        if after and source.last_id is None:  # a NULL id, last among its ties, stands for all of them
            conditions.append(sql.SQL("{} > %(watermark)s").format(column["watermark"]))
        elif after:  # ties on the watermark go by id, then the NULL ids
            conditions.append(sql.SQL("({w} > %(watermark)s OR ({w} = %(watermark)s AND ({i} > %(last_id)s "
                                      "OR {i} IS NULL)))").format(w=column["watermark"], i=column["id"]))
        if source.lag is not None:
            conditions.append(sql.SQL("{} <= now() - %(lag)s").format(column["watermark"]))
    elif after:  # the rows with a NULL id come last, read again by every run until they have one
        conditions.append(sql.SQL("({i} > %(last_id)s OR {i} IS NULL)").format(i=column["id"]))
    return sql.SQL("SELECT {id}::text, s.{text}::text, {metadata}, {watermark} FROM ({base}\n) AS s{where} "
                   "ORDER BY {order}").format(
        id=column["id"], text=sql.Identifier(source.text_column), metadata=metadata,
        watermark=sql.SQL("{}::text").format(column["watermark"]) if "watermark" in column else sql.SQL("NULL"),
        base=base, where=sql.SQL(" WHERE ") + sql.SQL(" AND ").join(conditions) if conditions else sql.SQL(""),
        # then by the id's text: the reader compares ids as text with the one before, and the id's own type can
        # sort different texts as equal (a float's 0 and -0, citext's 'a' and 'A'); this keeps one text's rows
        # next to each other among them, so that a repeat between them is still seen
        order=sql.SQL(", ").join([*order, sql.SQL('{}::text COLLATE "C"').format(column["id"])]))


def parameters(source: Source) -> dict:
    """The parameters of :func:`select_rows` (always given: a query's ``%`` is written ``%%`` there)."""
    return {"watermark": source.watermark, "last_id": source.last_id, "lag": source.lag}


def connect_source(url: str) -> psycopg.Connection:
    try:
        return psycopg.connect(url, connect_timeout=10, application_name="simdb sync")
    except psycopg.Error as error:
        reason = redact(str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__,
                        secrets_in(url))
        raise SimdbError(f"cannot connect to the source database {redact(url)}: {reason}; check the source's URL "
                         "(`simdb sync add --source-url`, or `simdb sync run --source-url` with its password)") from None


def check_source(url: str, source: Source) -> None:
    """Read no row, but prove the source's statement runs and names its columns (at ``sync add``)."""
    with connect_source(url) as connection:
        connection.read_only = True  # as a run reads it: nothing the statement calls may write
        try:
            connection.execute(sql.SQL("SELECT * FROM ({}) AS checked LIMIT 0").format(select_rows(source, False)),
                               parameters(source))
        except psycopg.Error as error:
            raise SimdbError(f"sync source {source.name!r} cannot be read: {translate(error, url)}; check the "
                             "table, query and column names (as PostgreSQL spells them: case matters)") from None


def source_rows(url: str, source: Source, itersize: int) -> Iterator[tuple[str | None, str | None, str, str | None]]:
    """(id, text, metadata as JSON text, watermark) of the source's rows past its position, in order, streamed
    ``itersize`` rows a round trip."""
    connection = connect_source(url)
    try:
        connection.read_only = True
        connection.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        with connection.cursor(name="simdb_sync") as cursor:
            cursor.itersize = itersize
            cursor.execute(select_rows(source, source.started), parameters(source))
            while rows := cursor.fetchmany(itersize):  # a list at a time: no cursor call per row
                yield from rows
    except psycopg.Error as error:
        raise SimdbError(f"reading sync source {source.name!r} failed: {translate(error, url)}") from None
    finally:
        connection.close()
