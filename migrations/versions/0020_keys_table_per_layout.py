"""The keyed distributed layout's keys table is named after its layout's first key column: ``keys_<n>``.

A relayout numbers the new key columns after the old ones (``key_<first_key>`` onwards), so that a process that
opened the index before it fails on the dropped columns instead of answering wrongly. The keyed layout's table
of keys was ``keys`` whatever the layout, and a relayout rebuilt it under that name: such a process then probed
the new layout's keys with the old layout's and silently missed matches. The table is now named after the
layout's first key column (``keys_0`` for ``key_0`` onwards, ``keys_4`` after a relayout to ``key_4`` ...), as
its index is (``keys_<n>_key``); a relayout drops the old one.

This renames the ``keys`` table (and its index) of an index with the keyed layout after the stored
``first_key`` (0 where the row is absent, as simdb reads it); an index without one is left as it is. On Citus
the renames reach the shards. This migration carries its own SQL and imports nothing from simdb.

Revision ID: 0020 (0019 is another branch's migration; whichever lands second follows the other)
Revises: 0019
Create Date: 2026-11-27
"""
import sqlalchemy as sa
from alembic import context, op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

COMMENT = ("One row per document and key number, distributed by key (key value << 6 | key number): a probe "
           "goes to the one shard of its key. Named after the first key column of the layout it holds.")
OLD_COMMENT = ("One row per document and key number, distributed by key (key value << 6 | key number): a probe "
               "goes to the one shard of its key.")


def _first_key(connection) -> int:
    return connection.execute(sa.text(
        "SELECT coalesce((SELECT CAST(value #>> '{}' AS integer) FROM settings WHERE name = 'first_key'), 0)")
    ).scalar_one()


def _table(connection, schema: str, name: str) -> bool:
    return connection.execute(sa.text("SELECT to_regclass(:t) IS NOT NULL"), {"t": f"{schema}.{name}"}).scalar()


def upgrade() -> None:
    schema = context.config.attributes["schema"]
    connection = op.get_bind()
    if not _table(connection, schema, "keys"):
        return
    first = _first_key(connection)
    run = connection.exec_driver_sql
    run(f"ALTER TABLE keys RENAME TO keys_{first}")
    run(f"ALTER INDEX IF EXISTS keys_key RENAME TO keys_{first}_key")
    run(f"COMMENT ON TABLE keys_{first} IS '{COMMENT}'")


def downgrade() -> None:
    schema = context.config.attributes["schema"]
    connection = op.get_bind()
    first = _first_key(connection)
    if not _table(connection, schema, f"keys_{first}"):
        return
    run = connection.exec_driver_sql
    run(f"ALTER TABLE keys_{first} RENAME TO keys")
    run(f"ALTER INDEX IF EXISTS keys_{first}_key RENAME TO keys_key")
    run(f"COMMENT ON TABLE keys IS '{OLD_COMMENT}'")
