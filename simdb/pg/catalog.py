"""The index's description in the database: the ``settings`` table and the method's side tables.

Reading it back gives the :class:`~simdb.settings.IndexSettings` every process must use; under
the ingest lock, :func:`check_layout` makes sure a process still holds the key layout the index
has (a relayout may have changed it since the process opened the index).
"""

from __future__ import annotations

import json
from dataclasses import replace

import sqlalchemy as sa

from ..errors import IncompatibleIndex, IndexNotFound
from ..methods import Method
from ..settings import IndexSettings
from . import citus, keyed, migrate
from .database import lock
from .functions import create_functions, create_views
from .schema import create_tables
from .segments import add_segment, list_segments

#: The settings rows that decide which key columns an index has.
_LAYOUT_ROWS = ("keys", "first_key")


def load_settings(connection: sa.Connection) -> IndexSettings:
    rows = dict(connection.execute(sa.text("SELECT name, value FROM settings")).all())
    side_tables = {table: dict(connection.exec_driver_sql(f"SELECT * FROM {table}").all())
                   for table in IndexSettings.side_table_names(rows)}
    return IndexSettings.from_rows(rows, side_tables)


def document_columns(connection: sa.Connection) -> set[str]:
    return set(connection.execute(sa.text(
        "SELECT column_name FROM information_schema.columns "
        "WHERE table_schema = current_schema() AND table_name = 'documents'")).scalars())


def check_layout(connection: sa.Connection, method: Method, *, keyed_layout: bool) -> None:
    """Under the ingest lock: refuse to write keys of a layout the index no longer has (its key columns, and
    whether its probes read a ``keys`` table: a process that opened it before ``simdb relayout
    --distributed-layout keyed`` would store documents without their key rows)."""
    stored = _layout_rows(connection)
    relaid = _relaid_out(stored, method)
    if relaid is not None:
        raise IncompatibleIndex(f"{relaid} (an interrupted ingest can then be resumed)")
    if (keyed.layout_of(stored.get("distributed")) == keyed.KEYED) != keyed_layout:
        raise IncompatibleIndex("the index was moved to another distributed layout while this process had it "
                                "open; open it again (an interrupted ingest can then be resumed)")


def _layout_rows(connection: sa.Connection) -> dict[str, object]:
    return dict(connection.execute(sa.text("SELECT name, value FROM settings WHERE name = ANY(:names)"),
                                   {"names": [*_LAYOUT_ROWS, "blocks", "distributed"]}).all())


def _relaid_out(stored: dict[str, object], method: Method) -> str | None:
    """What to tell a process whose ``method`` holds a key layout other than the ``stored`` settings rows', or
    None where it holds the index's."""
    mine = method.to_rows()
    if [stored.get(name, 0) for name in _LAYOUT_ROWS] == [mine.get(name, 0) for name in _LAYOUT_ROWS]:
        return None
    return (f"the index was re-laid out since this process opened it (blocks {mine.get('blocks')} -> "
            f"{stored.get('blocks')}): open it again")


#: SQLSTATEs of a statement that names a relation or column the schema does not have (any longer).
_UNDEFINED = {"42P01", "42703"}


def relaid_out(engine: sa.Engine, method: Method, error: BaseException, keyed_layout: bool | None = None
               ) -> IncompatibleIndex | None:
    """The error to raise instead of ``error`` where ``error`` is a statement's ``undefined table`` or ``undefined
    column`` and the index was re-laid out since the process that holds ``method`` opened it; else None.

    Such a process computes the old layout's keys; it reads the key columns (``key_<n>``) and, on the keyed
    distributed layout, the keys table (``keys_<n>``) of that layout, named so that a relayout drops them, never
    a table or column of the new layout under the old name: its lookups fail instead of answering wrongly, at
    no cost to the lookups, and this turns the failure into what to do (one read of ``settings`` once a
    statement has failed). With ``keyed_layout`` (whether the process holds the keyed layout), a process that
    opened an index by id before its move to the keyed layout (which drops the documents' key columns) is told
    so too."""
    state = getattr(getattr(error, "orig", error), "sqlstate", None)
    if state not in _UNDEFINED:
        return None
    try:
        with engine.connect() as connection:
            stored = _layout_rows(connection)
    except sa.exc.DBAPIError:  # the settings cannot be read either: the original error says more
        return None
    relaid = _relaid_out(stored, method)
    if relaid is None and keyed_layout is not None and \
            (keyed.layout_of(stored.get("distributed")) == keyed.KEYED) != keyed_layout:
        relaid = ("the index was moved to the keyed distributed layout since this process opened it (its documents "
                  "have no key columns there): open it again")
    return IncompatibleIndex(relaid) if relaid is not None else None


def save_rows(connection: sa.Connection, rows: dict[str, object]) -> None:
    """Write settings rows, each replacing the row of its name."""
    for name, value in rows.items():
        connection.execute(sa.text(
            "INSERT INTO settings (name, value) VALUES (:name, CAST(:value AS jsonb)) "
            "ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value"), {"name": name, "value": json.dumps(value)})


def save_method(connection: sa.Connection, method: Method) -> None:
    """Write the method's settings rows (after a relayout)."""
    save_rows(connection, method.to_rows())


def record_segmenter(connection: sa.Connection, method: Method) -> None:
    """Add this process's word segmenter to the index's ``segmenters`` row unless it is there (under the
    ingest lock, before the chunk's sketches are stored)."""
    if method.segmenter is None:
        return
    connection.execute(sa.text(
        "INSERT INTO settings (name, value) VALUES ('segmenters', jsonb_build_array(CAST(:name AS text))) "
        "ON CONFLICT (name) DO UPDATE SET value = settings.value || EXCLUDED.value "
        "WHERE NOT settings.value @> EXCLUDED.value"), {"name": method.segmenter})


def create_index(connection: sa.Connection, schema: str, settings: IndexSettings, where: str = "the database") -> bool:
    """Create the index in ``schema`` at the head revision, unless one is there; True if it was created.

    A new index is made as the migrations would leave it, without running them (ten migrations took
    seconds): today's tables (:func:`~simdb.pg.schema.create_tables`), the settings rows and the method's side
    tables, distributed where asked (Citus distributes only tables that no view or function depends on),
    today's functions and views, and the version table stamped at head. ``tests/test_migrations.py`` holds
    such an index equal, catalog by catalog, to one the migrations made; existing indexes upgrade through the
    migrations (:func:`open_index`)."""
    lock(connection, schema, "migrate")
    if settings.distributed is not None:
        citus.require_citus(connection, where)
    connection.exec_driver_sql(f"CREATE SCHEMA IF NOT EXISTS {schema}")
    if migrate.current_revision(connection, schema) is not None:
        return False
    keyed_layout = keyed.layout_of(settings.distributed) == keyed.KEYED
    create_tables(connection, keyed.document_key_columns(settings.method, keyed_layout))
    connection.execute(sa.text("INSERT INTO settings (name, value) VALUES (:name, CAST(:value AS jsonb))"),
                       [{"name": name, "value": json.dumps(value)} for name, value in settings.to_rows().items()])
    cursor = connection.connection.dbapi_connection.cursor()
    for table, rows in settings.method.side_tables().items():  # (key, value) tables such as idf_terms
        with cursor.copy(f"COPY {table} FROM STDIN") as copy:
            for row in rows.items():
                copy.write_row(row)
    if settings.distributed is not None:
        citus.distribute(connection, schema, settings.distributed["shards"])
        if keyed_layout:
            keyed.create(connection, schema, settings.distributed["shards"], settings.method)
    distributed = settings.distributed is not None
    create_functions(connection, schema, settings.method, distributed=distributed, keyed=keyed_layout)
    create_views(connection, schema, settings.method, distributed=distributed)
    migrate.stamp(connection, schema)
    return True


def open_index(connection: sa.Connection, schema: str, where: str) -> IndexSettings:
    """The stored settings of the index in ``schema`` (``where`` names the database for messages), after
    upgrading its schema to this simdb's head revision when it is behind."""
    revision = migrate.current_revision(connection, schema)
    if revision is None:
        raise IndexNotFound(f"no simdb index in schema {schema!r} of {where}; create one with `simdb init`")
    if revision not in migrate.known_revisions():
        raise IncompatibleIndex(f"the index in schema {schema!r} is at schema revision {revision}, "
                                "written by a newer simdb; upgrade simdb to open it")
    stored = load_settings(connection)
    behind = revision != migrate.head_revision()
    if stored.distributed is not None:
        citus.check(connection, schema, where, upgrading=behind)
        citus.set_session(connection)
    if behind:
        lock(connection, schema, "migrate")
        migrate.upgrade(connection, schema, key_columns=_document_key_columns(stored))
        if stored.distributed is not None:  # and the tables the upgrade made are distributed as designed
            citus.check(connection, schema, where)
    columns = document_columns(connection)
    if not set(_document_key_columns(stored)) <= columns:  # a relayout's switch between the two reads: read again
        stored = load_settings(connection)
    missing = set(_document_key_columns(stored)) - columns
    if missing:
        raise IncompatibleIndex(f"the documents table lacks key columns {sorted(missing)} that its layout "
                                "needs; the schema was changed by hand")
    if stored.distributed is not None:  # after the upgrade, which makes the layout's tables as today's (0019, 0020)
        try:
            keyed.check(connection, schema, keyed.layout_of(stored.distributed), stored.method)
        except IncompatibleIndex:  # a relayout's switch between the two reads (its keys table renamed): read again
            stored = load_settings(connection)
            keyed.check(connection, schema, keyed.layout_of(stored.distributed), stored.method)
    return stored


def _document_key_columns(settings: IndexSettings) -> list[str]:
    """The key columns the index's ``documents`` has (none on the keyed layout: :func:`keyed.document_key_columns`)."""
    return keyed.document_key_columns(settings.method, keyed.layout_of(settings.distributed) == keyed.KEYED)


def copy_to_distributed(connection: sa.Connection, source: str, target: str, shards: int, where: str,
                        layout: str | None = None) -> dict[str, int]:
    """A new distributed index in ``target`` holding everything the index in ``source`` holds, segments of the
    same id ranges included (see :func:`simdb.pg.citus.copy_rows`), in one transaction, the source's ingests
    waiting; rows copied per table. The source is left as it was. ``layout``: the distributed layout (None:
    the default for the source's method, :func:`simdb.pg.keyed.default_layout`)."""
    lock(connection, source, "ingest")
    connection.exec_driver_sql(f"SET LOCAL search_path TO {source}, public")
    stored = open_index(connection, source, where)
    ranges = [(s.first_id, s.end_id) for s in list_segments(connection, distributed=stored.distributed is not None)]
    connection.exec_driver_sql(f"SET LOCAL search_path TO {target}, public")
    layout = keyed.check_layout(keyed.default_layout(stored.method) if layout is None else layout, stored.method)
    distributed = {"shards": shards, **({"layout": layout} if layout != keyed.BY_ID else {})}
    if not create_index(connection, target, replace(stored, distributed=distributed), where):
        raise IncompatibleIndex(f"an index already exists in schema {target!r} of {where}; copy into a new schema")
    lock(connection, target, "ingest")
    for first_id, end_id in ranges:
        add_segment(connection, first_id, end_id)
    counts = citus.copy_rows(connection, source, target, stored.method)
    if layout == keyed.KEYED:
        counts["keys"] = keyed.build(connection, stored.method)
        keyed.build_external_ids(connection)
    return counts


def move_to_keyed(connection: sa.Connection, schema: str, settings: IndexSettings) -> tuple[IndexSettings, int]:
    """Move a distributed index with the layout by document id to the keyed layout (:mod:`simdb.pg.keyed`), in
    the caller's transaction: its ``keys`` and ``key_probes`` tables, ``keys`` filled from the documents' key
    columns by set-based ``INSERT ... SELECT`` (:func:`simdb.pg.keyed.build`), and the layout written into
    the ``distributed`` settings row, which every open checks. Holds the migrate and ingest locks: ingests and
    removals wait, lookups go on (on the documents' key columns until the transaction commits). An
    interrupted move rolls back whole: the index keeps the layout by id. The new settings, and key rows written."""
    lock(connection, schema, "migrate")
    lock(connection, schema, "ingest")
    stored = load_settings(connection)
    if stored.distributed is None:
        raise IncompatibleIndex(f"the index in schema {schema!r} is not distributed: only a distributed index "
                                "(simdb init --distributed) has a distributed layout")
    if keyed.layout_of(stored.distributed) == keyed.KEYED:
        raise IncompatibleIndex(f"the index in schema {schema!r} has the keyed distributed layout already")
    check_layout(connection, settings.method, keyed_layout=False)
    keyed.check_layout(keyed.KEYED, stored.method)
    keyed.create(connection, schema, stored.distributed["shards"], stored.method)
    written = keyed.build(connection, stored.method)
    keyed.build_external_ids(connection)
    keyed.drop_document_keys(connection, stored.method)
    create_functions(connection, schema, stored.method, distributed=True, keyed=True)  # they read the keys table
    distributed = {**stored.distributed, "layout": keyed.KEYED}
    connection.execute(sa.text(  # the layout's one change after creation (the tests watch for this statement)
        "UPDATE settings SET value = CAST(:value AS jsonb) WHERE name = :name"),
        {"name": "distributed", "value": json.dumps(distributed)})
    return replace(settings, distributed=distributed), written
