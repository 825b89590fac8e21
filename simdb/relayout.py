"""Rebuilding the block-key columns for a new layout, online.

An archive that outgrows its layout (too many candidates per lookup) gets
more blocks, hence wider keys. The new key columns are added beside the old
ones and numbered after them (``first_key``), filled in bounded transactions,
indexed with ``CREATE INDEX CONCURRENTLY``, and switched to in one short
transaction that also fills the rows ingested meanwhile, drops the old
columns and rewrites the layout in ``settings``. Lookups and ingests go on
using the old keys until the switch; a process that still holds the old
layout afterwards fails on the missing columns instead of answering wrongly.

An interrupted relayout leaves the index as it was, plus unused columns that
the next relayout removes first.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace

import sqlalchemy as sa

from .blocks import BlockLayout
from .errors import SimdbError
from .ingest import check_layout
from .migrate import lock
from .settings import IndexSettings
from .sqlapi import create_functions


def key_expression(layout: BlockLayout, key: int, column: str = "simhash") -> str:
    """SQL computing one key of ``layout`` from a signed fingerprint (the ``simhash`` column by default).

    ``>>`` on BIGINT is arithmetic, but every block is masked after the shift,
    so the sign bits it drags in are dropped; the result equals
    :meth:`BlockLayout.block_keys` on the unsigned fingerprint.
    """
    parts, shift = [], 0
    for block in layout.keys[key]:
        start, width = layout.block_ranges[block]
        part = f"(({column} >> {start}) & {(1 << width) - 1})"
        parts.append(f"({part} << {shift})" if shift else part)
        shift += width
    return " | ".join(parts)


def _document_columns(connection: sa.Connection) -> set[str]:
    return set(connection.execute(sa.text(
        "SELECT column_name FROM information_schema.columns "
        "WHERE table_schema = current_schema() AND table_name = 'documents'")).scalars())


def relayout(engine: sa.Engine, schema: str, settings: IndexSettings, blocks: int, *,
             rows_per_transaction: int = 200_000, progress: Callable[[str], None] | None = None) -> IndexSettings:
    """Switch the index to ``blocks`` blocks; returns the new settings."""
    old = settings.layout
    if blocks == old.blocks:
        raise SimdbError(f"the index already uses {blocks} blocks")
    try:
        new = BlockLayout(max_distance=old.max_distance, blocks=blocks, first_key=old.first_key + len(old.keys))
    except ValueError as exc:
        raise SimdbError(f"invalid layout: {exc}") from None
    say = progress or (lambda message: None)

    with engine.begin() as connection:
        lock(connection, schema, "migrate")
        check_layout(connection, old)
        leftovers = sorted(c for c in _document_columns(connection)
                           if c.startswith("key_") and c not in old.key_columns)
        for column in leftovers:  # from an interrupted relayout
            connection.exec_driver_sql(f"ALTER TABLE documents DROP COLUMN {column}")
        for column in new.key_columns:
            connection.exec_driver_sql(f"ALTER TABLE documents ADD COLUMN {column} bigint")
    say(f"added {len(new.key_columns)} key columns ({new.key_columns[0]}..{new.key_columns[-1]})")

    assignments = ", ".join(f"{column} = {key_expression(new, i)}" for i, column in enumerate(new.key_columns))
    with engine.connect() as connection:
        last = connection.execute(sa.text("SELECT coalesce(max(id), 0) FROM documents")).scalar_one()
    for start in range(0, last + 1, rows_per_transaction):
        with engine.begin() as connection:
            connection.execute(sa.text(f"UPDATE documents SET {assignments} WHERE id >= :start AND id < :end"),
                               {"start": start, "end": start + rows_per_transaction})
        say(f"filled keys of documents {start:,}..{min(start + rows_per_transaction, last + 1) - 1:,}")

    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        for column in new.key_columns:
            connection.exec_driver_sql(f"CREATE INDEX CONCURRENTLY ix_documents_{column} ON documents ({column}) "
                                       "INCLUDE (simhash, id)")
            say(f"indexed {column}")

    updated = replace(settings, layout=new)
    with engine.begin() as connection:
        lock(connection, schema, "ingest")
        lock(connection, schema, "migrate")
        check_layout(connection, old)
        connection.execute(sa.text(f"UPDATE documents SET {assignments} WHERE {new.key_columns[0]} IS NULL"))
        for column in new.key_columns:
            connection.exec_driver_sql(f"ALTER TABLE documents ALTER COLUMN {column} SET NOT NULL")
        for column in old.key_columns:
            connection.exec_driver_sql(f"ALTER TABLE documents DROP COLUMN {column}")
        rows = updated.to_rows()
        create_functions(connection, schema, new)  # simdb_near joins on the new key columns
        for name in ("blocks", "block_ranges", "keys", "first_key"):
            connection.execute(sa.text(
                "INSERT INTO settings (name, value) VALUES (:name, CAST(:value AS jsonb)) "
                "ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value"),
                {"name": name, "value": json.dumps(rows[name])})
    say(f"switched to {new.describe()}")
    return updated
