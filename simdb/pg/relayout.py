"""Rebuilding the key columns for a new layout, online.

An archive that outgrows its layout (too many candidates per lookup) gets more blocks, hence
wider keys. The new key columns are added beside the old ones and numbered after them, filled in
bounded transactions from the stored sketches (by the method's SQL for its keys), indexed with
``CREATE INDEX CONCURRENTLY``, and switched to in one short transaction that also fills the rows
ingested meanwhile, drops the old columns and rewrites the layout in ``settings``. Lookups and
ingests go on using the old keys until the switch; a process that still holds the old layout
afterwards fails on the missing columns (on the keyed layout, on the old layout's keys table, which the switch
drops: :func:`simdb.pg.keyed.rebuild`) instead of answering wrongly, and is told to open the index again
(:func:`simdb.pg.catalog.relaid_out`; its ingests and removals are refused under the ingest lock first).

An interrupted relayout leaves the index as it was, plus unused columns that the next relayout
removes first.

On the keyed distributed layout ``documents`` has no key columns: a relayout there builds the new layout's
keys table from the fingerprints and rewrites the analysts' functions, in one transaction under the ingest
lock (:func:`simdb.pg.keyed.rebuild`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

import sqlalchemy as sa

from ..settings import IndexSettings
from . import keyed as keyed_layout
from .catalog import check_layout, document_columns, save_method
from .database import lock, session_lock
from .functions import create_functions
from .methods import sql_of


def index_segments(engine: sa.Engine, connection: sa.Connection, schema: str, name: str, definition: str) -> None:
    """On an AUTOCOMMIT ``connection``: the partitioned index ``name`` on ``documents``, built segment by
    segment with ``CREATE INDEX CONCURRENTLY`` (which a partitioned table does not take) and attached; it
    becomes valid when every segment has its part. Segments created meanwhile get theirs when they are
    attached.

    Each part is attached in a short transaction of ``engine`` that holds the ingest lock: ATTACH
    PARTITION locks the partitioned index, then the part, which a chunk that read its segment holds; a
    chunk that attaches a new segment locks the partitioned index too (``deadlock detected``)."""
    with engine.begin() as attaching:
        lock(attaching, schema, "ingest")
        attaching.exec_driver_sql(f"CREATE INDEX IF NOT EXISTS {name} ON ONLY documents {definition}")
    while True:
        missing = connection.execute(sa.text(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = CAST('documents' AS regclass) AND NOT EXISTS ("
            "  SELECT 1 FROM pg_inherits x JOIN pg_index p ON p.indexrelid = x.inhrelid "
            "  WHERE x.inhparent = CAST(:name AS regclass) AND p.indrelid = c.oid) ORDER BY c.relname"),
            {"name": name}).scalars().all()
        if not missing:
            return
        for segment in missing:
            part = f"{segment}_{name.removeprefix('ix_documents_')}"
            # a part left invalid by an interrupted build is built again
            connection.exec_driver_sql(f'DROP INDEX CONCURRENTLY IF EXISTS "{part}"')
            connection.exec_driver_sql(f'CREATE INDEX CONCURRENTLY "{part}" ON "{segment}" {definition}')
            _attach_part(engine, schema, name, part)


def _attach_part(engine: sa.Engine, schema: str, name: str, part: str, attempts: int = 10) -> None:
    """``ALTER INDEX name ATTACH PARTITION part`` under the ingest lock, tried again when PostgreSQL (on Citus,
    its distributed deadlock detection) breaks a deadlock with a lookup by stopping it: a lookup that read
    the segment in an earlier statement of its transaction holds the part that ATTACH locks. A later try
    finds the lookup gone."""
    for attempt in range(attempts):
        try:
            with engine.begin() as attaching:
                lock(attaching, schema, "ingest")
                attaching.exec_driver_sql(f'ALTER INDEX {name} ATTACH PARTITION "{part}"')
            return
        except sa.exc.OperationalError as exc:
            if getattr(exc.orig, "sqlstate", None) != "40P01" or attempt == attempts - 1:
                raise
            time.sleep(1)


def relayout(engine: sa.Engine, schema: str, settings: IndexSettings, blocks: int | None, *,
             rows_per_transaction: int = 200_000, progress: Callable[[str], None] | None = None) -> IndexSettings:
    """Switch the index to ``blocks`` blocks (default: the best for its size); returns the new settings."""
    keyed = keyed_layout.layout_of(settings.distributed) == keyed_layout.KEYED
    old = settings.method
    with engine.connect() as connection:
        documents = connection.execute(sa.text("SELECT count(*) FROM documents")).scalar_one()
    new = old.relaid_out(blocks, documents)
    say = progress or (lambda message: None)
    sketch = sql_of(old).sketch_column[0]

    if keyed:  # documents has no key columns: the new keys table, built from the sketches, is all there is to do
        with engine.begin() as connection:
            lock(connection, schema, "migrate")
            lock(connection, schema, "ingest")
            check_layout(connection, old, keyed_layout=keyed)
            written = keyed_layout.rebuild(connection, old, new)
            create_functions(connection, schema, new, distributed=True, keyed=True)  # they read the new table
            # key columns left by hand, dropped last: the DROP's ACCESS EXCLUSIVE lock on documents, held to the
            # commit, would otherwise hold every lookup through the whole rebuild
            for column in sorted(c for c in document_columns(connection) if c.startswith("key_")):
                connection.exec_driver_sql(f"ALTER TABLE documents DROP COLUMN {column}")
            save_method(connection, new)
        say(f"rebuilt the keys table: {written:,} key rows")
        say(f"switched to {new.describe()}")
        return replace(settings, method=new)

    # the statements below that change documents hold the ingest lock (after the migrate lock, which the
    # relayout holds throughout its index builds): an ingest's chunk and a relayout's statement never wait for
    # each other's rows, tables or indexes
    with engine.begin() as connection:
        lock(connection, schema, "migrate")
        lock(connection, schema, "ingest")
        check_layout(connection, old, keyed_layout=keyed)
        leftovers = sorted(c for c in document_columns(connection)
                           if c.startswith("key_") and c not in old.key_columns)
        for column in leftovers:  # from an interrupted relayout
            connection.exec_driver_sql(f"ALTER TABLE documents DROP COLUMN {column}")
        for column in new.key_columns:
            connection.exec_driver_sql(f"ALTER TABLE documents ADD COLUMN {column} bigint")
    say(f"added {len(new.key_columns)} key columns ({new.key_columns[0]}..{new.key_columns[-1]})")

    assignments = ", ".join(f"{column} = {expression}"
                            for column, expression in zip(new.key_columns, sql_of(new).key_sql(sketch)))
    with engine.connect() as connection:
        last = connection.execute(sa.text("SELECT coalesce(max(id), 0) FROM documents")).scalar_one()
    for start in range(0, last + 1, rows_per_transaction):
        with engine.begin() as connection:
            lock(connection, schema, "ingest")  # a chunk (and a removal) updates rows of documents too
            connection.execute(sa.text(f"UPDATE documents SET {assignments} WHERE id >= :start AND id < :end"),
                               {"start": start, "end": start + rows_per_transaction})
        say(f"filled keys of documents {start:,}..{min(start + rows_per_transaction, last + 1) - 1:,}")

    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        # no merge of segments meanwhile (it takes the migrate lock): the segments being indexed stay. Nothing
        # may wait for this lock inside PostgreSQL meanwhile (see simdb.pg.database.lock), nor for a lock that
        # CREATE INDEX CONCURRENTLY holds on a segment (simdb.pg.segments.seal skips one it cannot have now)
        with session_lock(connection, schema, "migrate"):
            for column in new.key_columns:
                index_segments(engine, connection, schema, f"ix_documents_{column}",
                               f"({column}) INCLUDE (simhash, id)")
                say(f"indexed {column}")

    with engine.begin() as connection:
        lock(connection, schema, "migrate")
        lock(connection, schema, "ingest")
        check_layout(connection, old, keyed_layout=keyed)
        connection.execute(sa.text(f"UPDATE documents SET {assignments} WHERE {new.key_columns[0]} IS NULL"))
        for column in new.key_columns:
            connection.exec_driver_sql(f"ALTER TABLE documents ALTER COLUMN {column} SET NOT NULL")
        for column in old.key_columns:
            connection.exec_driver_sql(f"ALTER TABLE documents DROP COLUMN {column}")
        create_functions(connection, schema, new, distributed=settings.distributed is not None)  # the new key columns
        save_method(connection, new)
    say(f"switched to {new.describe()}")
    return replace(settings, method=new)
