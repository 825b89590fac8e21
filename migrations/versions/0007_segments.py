"""Documents are stored in segments: ``documents`` becomes a table partitioned by id ranges.

New documents go to the newest segment, whose indexes are small and stay in memory; older
segments take no index maintenance for new documents, so ingest does not slow down as the archive
grows (a 10M-row table maintaining ten B-trees larger than the buffer cache wrote a full page
image for nearly every insert). Segments are plain tables named ``documents_<first id>``, each
one range of ids, attached to ``documents``; simdb creates them as ids advance and merges them
(``simdb compact``). Queries keep reading ``documents``.

What changes with partitioning:

* ids come from the sequence ``documents_id_seq`` (PostgreSQL 15 has no identity columns on
  partitioned tables); its position is carried over;
* ``external_id`` can no longer be unique across the table (a unique index must contain the
  partition key): it has a plain index, and ingest checks ids set-based under its lock, as it
  already did before inserting;
* no foreign keys point at ``documents`` (``near_duplicates.a_id/b_id``, ``documents.duplicate_of``):
  a segment could not be detached while rows elsewhere refer to it. simdb deletes pairs of removed
  documents itself;
* an existing archive becomes the first segment without being rewritten: its indexes are attached
  as they are, except ``external_id``'s, which is rebuilt without uniqueness. The table is locked
  for that index build and a scan that checks its id range (seconds per million rows).

Views that read ``documents`` are re-pointed at the new table with their own definitions
(``CREATE OR REPLACE VIEW``, so views built on them, comments and grants stay); grants on
``documents`` are carried over.

This migration carries its own SQL and imports nothing from simdb.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-23
"""
import json
import re

import sqlalchemy as sa
from alembic import context, op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

DEFAULT_SEGMENTS = {"size": 1_000_000, "merge_factor": 4}


def _views_on(connection, table_oid: int) -> list[tuple[str, str, str]]:
    """(schema, name, definition) of every view that reads the table, as PostgreSQL prints it now."""
    return connection.execute(sa.text(
        "SELECT DISTINCT n.nspname, v.relname, pg_get_viewdef(v.oid) FROM pg_depend d "
        "JOIN pg_rewrite r ON r.oid = d.objid JOIN pg_class v ON v.oid = r.ev_class "
        "JOIN pg_namespace n ON n.oid = v.relnamespace "
        "WHERE d.classid = 'pg_rewrite'::regclass AND d.refobjid = :t AND v.oid <> :t AND v.relkind = 'v'"),
        {"t": table_oid}).all()


def _grants(connection, table_oid: int) -> list[tuple[str, str]]:
    """(privilege, grantee) granted on the table to roles other than its owner."""
    return connection.execute(sa.text(
        "SELECT a.privilege_type, CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(r.rolname) END "
        "FROM pg_class c, aclexplode(c.relacl) a LEFT JOIN pg_roles r ON r.oid = a.grantee "
        "WHERE c.oid = :t AND a.grantee <> c.relowner"), {"t": table_oid}).all()


def _regrant(connection, grants, table: str) -> None:
    for privilege, grantee in grants:
        connection.exec_driver_sql(f"GRANT {privilege} ON {table} TO {grantee}")


def _index_definitions(connection, table: str) -> list[tuple[str, str, bool]]:
    """(name, CREATE INDEX statement, backs a constraint) of the table's indexes."""
    return connection.execute(sa.text(
        "SELECT i.relname, pg_get_indexdef(i.oid), EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = i.oid) "
        "FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid WHERE x.indrelid = CAST(:t AS regclass) "
        "ORDER BY i.relname"), {"t": table}).all()


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _sequence_next(connection, sequence: str) -> int:
    last, called = connection.execute(sa.text(f"SELECT last_value, is_called FROM {sequence}")).one()
    return last + 1 if called else last


def upgrade() -> None:
    connection = op.get_bind()
    run = connection.exec_driver_sql
    documents_oid = connection.execute(sa.text("SELECT CAST('documents' AS regclass)::oid")).scalar_one()
    views, grants = _views_on(connection, documents_oid), _grants(connection, documents_oid)
    comment = connection.execute(sa.text("SELECT obj_description(:t, 'pg_class')"), {"t": documents_oid}).scalar()

    # no foreign keys may point at a partition that can be detached
    for name, table in connection.execute(sa.text(
            "SELECT conname, conrelid::regclass::text FROM pg_constraint WHERE contype = 'f' AND confrelid = :t"),
            {"t": documents_oid}).all():
        run(f'ALTER TABLE {table} DROP CONSTRAINT "{name}"')

    sequence = connection.execute(sa.text("SELECT pg_get_serial_sequence('documents', 'id')")).scalar_one()
    next_id = max(_sequence_next(connection, sequence),
                  connection.execute(sa.text("SELECT coalesce(max(id), 0) + 1 FROM documents")).scalar_one())
    stored = connection.execute(sa.text("SELECT EXISTS (SELECT 1 FROM documents)")).scalar_one()
    run("ALTER TABLE documents ALTER COLUMN id DROP IDENTITY")  # drops its sequence
    run("ALTER TABLE documents DROP CONSTRAINT uq_documents_external_id")
    old = "documents_000000000001"
    run(f"ALTER TABLE documents RENAME TO {old}")
    old_indexes = _index_definitions(connection, old)
    for name, _, _ in old_indexes:
        suffix = name.removeprefix("ix_documents_").removeprefix("pk_documents") or "pkey"
        run(f'ALTER INDEX "{name}" RENAME TO "{old}_{suffix}"')

    run(f"CREATE TABLE documents (LIKE {old} INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING STORAGE "
        "INCLUDING COMMENTS) PARTITION BY RANGE (id)")
    run(f"CREATE SEQUENCE documents_id_seq AS bigint START WITH {int(next_id)} OWNED BY documents.id")
    run("ALTER TABLE documents ALTER COLUMN id SET DEFAULT nextval('documents_id_seq')")
    run("ALTER TABLE documents ADD CONSTRAINT pk_documents PRIMARY KEY (id)")
    run("ALTER TABLE documents ADD CONSTRAINT fk_documents_batch_id_batches FOREIGN KEY (batch_id) "
        "REFERENCES batches (id)")
    for _, definition, constraint in old_indexes:
        if not constraint:  # the same index on the partitioned table: attaching reuses the segment's own
            run(re.sub(rf" ON (\S+\.)?{old} USING ", " ON documents USING ", definition))
    run("CREATE INDEX ix_documents_external_id ON documents (external_id)")
    if comment is not None:
        run("COMMENT ON TABLE documents IS " + _literal(comment))

    for view_schema, view, definition in views:  # re-point the views at the new table
        run(f'CREATE OR REPLACE VIEW "{view_schema}"."{view}" AS {definition}')
    if stored:
        # the existing rows become the first segment, checked against its range once, not rewritten
        run(f"ALTER TABLE {old} ADD CONSTRAINT {old}_range CHECK (id >= 1 AND id < {int(next_id)})")
        run(f"ALTER TABLE documents ATTACH PARTITION {old} FOR VALUES FROM (1) TO ({int(next_id)})")
        run(f"ALTER TABLE {old} DROP CONSTRAINT {old}_range")
    else:
        run(f"DROP TABLE {old}")

    _regrant(connection, grants, "documents")

    new_index = context.config.attributes.get("new_index_settings") or {}
    connection.execute(sa.text(
        "INSERT INTO settings (name, value) VALUES ('segments', CAST(:value AS jsonb)) ON CONFLICT (name) DO NOTHING"),
        {"value": json.dumps(new_index.get("segments", DEFAULT_SEGMENTS))})


def downgrade() -> None:
    connection = op.get_bind()
    run = connection.exec_driver_sql
    documents_oid = connection.execute(sa.text("SELECT CAST('documents' AS regclass)::oid")).scalar_one()
    views, grants = _views_on(connection, documents_oid), _grants(connection, documents_oid)
    next_id = _sequence_next(connection, "documents_id_seq")
    indexes = [(name, definition) for name, definition, constraint in _index_definitions(connection, "documents")
               if not constraint and name != "ix_documents_external_id"]
    run("ALTER TABLE documents RENAME TO documents_segmented")
    for name, _ in indexes:
        run(f'ALTER INDEX "{name}" RENAME TO "{name}_segmented"')
    run("ALTER TABLE documents_segmented RENAME CONSTRAINT pk_documents TO pk_documents_segmented")
    run("CREATE TABLE documents (LIKE documents_segmented INCLUDING CONSTRAINTS INCLUDING STORAGE "
        "INCLUDING COMMENTS)")
    run("ALTER TABLE documents ALTER COLUMN metadata SET DEFAULT '{}'::jsonb, "
        "ALTER COLUMN created_at SET DEFAULT now()")
    run("INSERT INTO documents SELECT * FROM documents_segmented ORDER BY id")
    run(f"ALTER TABLE documents ALTER COLUMN id ADD GENERATED BY DEFAULT AS IDENTITY (START WITH {int(next_id)})")
    run("ALTER TABLE documents ADD CONSTRAINT pk_documents PRIMARY KEY (id)")
    run("ALTER TABLE documents ADD CONSTRAINT uq_documents_external_id UNIQUE (external_id)")
    run("ALTER TABLE documents ADD CONSTRAINT fk_documents_batch_id_batches FOREIGN KEY (batch_id) "
        "REFERENCES batches (id)")
    run("ALTER TABLE documents ADD CONSTRAINT fk_documents_duplicate_of_documents FOREIGN KEY (duplicate_of) "
        "REFERENCES documents (id)")
    for _, definition in indexes:
        run(definition.replace(" ON ONLY ", " ON "))
    for view_schema, view, definition in views:
        run(f'CREATE OR REPLACE VIEW "{view_schema}"."{view}" AS {definition}')
    run("DROP TABLE documents_segmented")  # its segments with it
    run("DELETE FROM near_duplicates p WHERE NOT EXISTS (SELECT 1 FROM documents d WHERE d.id = p.a_id) "
        "OR NOT EXISTS (SELECT 1 FROM documents d WHERE d.id = p.b_id)")
    for column in ("a_id", "b_id"):
        run(f"ALTER TABLE near_duplicates ADD CONSTRAINT fk_near_duplicates_{column}_documents FOREIGN KEY "
            f"({column}) REFERENCES documents (id) ON DELETE CASCADE")
    _regrant(connection, grants, "documents")
    run("DELETE FROM settings WHERE name = 'segments'")
