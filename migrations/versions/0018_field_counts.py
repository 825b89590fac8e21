"""Counts per value of the metadata fields an index counts by: ``field_counts``.

"Duplicate rate by a metadata field" grouped every stored document by ``metadata ->> field`` (0.86 s at 1M
documents: a scan of every segment). An index now declares the fields it counts by (the ``count_by`` settings
row: ``simdb init --count-by``, ``simdb count-by add``), and ``field_counts`` keeps, per field and value, the
documents stored and how many of them have an earlier near-duplicate (``duplicate_of``), written in the
transaction of every ingest chunk and removal.

No index declared a field before this revision: the table starts empty, and no ``count_by`` row is written
(an index without one counts by nothing). ``value`` is NULL where a document has no such field, and NULL is a
value of its own: the unique index is on expressions, as PostgreSQL 14 has no NULLS NOT DISTINCT. On a
distributed index the table is a reference table, as ``batches`` is: small, and read whole.

This migration carries its own SQL and imports nothing from simdb.

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-27
"""
import sqlalchemy as sa
from alembic import context, op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

COMMENT = ("One row per value of each metadata field the index counts by (settings.count_by; simdb init "
           "--count-by, simdb count-by add): the documents stored with that value (metadata ->> field; NULL: "
           "none) and how many of them have an earlier near-duplicate (duplicate_of), kept by every ingest "
           "chunk and removal (0018).")


def upgrade() -> None:
    schema = context.config.attributes["schema"]
    connection = op.get_bind()
    run = connection.exec_driver_sql
    run("CREATE TABLE field_counts (field TEXT NOT NULL, value TEXT, documents BIGINT NOT NULL, "
        "duplicates BIGINT NOT NULL)")
    # the value by its MD5 digest: a B-tree entry holds at most 2,704 bytes, and a metadata value can be longer
    run("CREATE UNIQUE INDEX uq_field_counts_field_value ON field_counts (field, "
        "md5(coalesce(value, '')), (value IS NULL))")
    run("COMMENT ON TABLE field_counts IS '" + COMMENT.replace("'", "''") + "'")
    # a distributed index: its other small tables are reference tables already (an index being made by every
    # migration, as simdb once made them, is distributed after the last one, this table with the others)
    distributed = connection.execute(sa.text(
        "SELECT to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL")).scalar() and connection.execute(sa.text(
            "SELECT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = to_regclass('batches'))")).scalar()
    if distributed:
        connection.execute(sa.text("SELECT create_reference_table(CAST(:t AS regclass))"),
                           {"t": f"{schema}.field_counts"})
        run("COMMENT ON TABLE field_counts IS '" + COMMENT.replace("'", "''") + "'")  # Citus may drop it


def downgrade() -> None:
    run = op.get_bind().exec_driver_sql
    run("DROP TABLE field_counts")
    run("DELETE FROM settings WHERE name = 'count_by'")
