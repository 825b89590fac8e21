"""A verdict keeps the external id of the document it names, whatever is removed later.

``records.duplicate_of`` holds the document id of the earliest stored near-duplicate at ingest; its
external id was looked up in ``documents`` when the verdict was read, so once that document was
removed, ``simdb verdicts`` printed ``"status": "near", "duplicate_of": null`` where the verdicts
file written at ingest named it. ``records.duplicate_of_external_id`` keeps the name, written with
the record from now on. For the records already stored it is filled from ``documents`` where that
document is still stored, else from the document's own record (a document removed by id or by
time keeps its record; one whose batch was removed has none left, and its name stays NULL).

The names go through temporary tables, each filled by one simple statement: on a distributed index
``records`` is distributed by ``batch_id`` and ``documents`` by ``id``, and Citus updates a table
from a join with another distributed table only when both are joined on their distribution columns.

This migration carries its own SQL and imports nothing from simdb.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-25
"""
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run = op.get_bind().exec_driver_sql
    run("ALTER TABLE records ADD COLUMN duplicate_of_external_id text")
    run("CREATE TEMPORARY TABLE named AS "
        "SELECT DISTINCT duplicate_of AS id FROM records WHERE duplicate_of IS NOT NULL")
    run("ANALYZE named")
    run("CREATE TEMPORARY TABLE names_stored AS "
        "SELECT d.id, d.external_id FROM documents d WHERE d.id IN (SELECT id FROM named)")
    run("CREATE TEMPORARY TABLE names_recorded AS "
        "SELECT r.document_id AS id, r.external_id FROM records r "
        "WHERE r.status IN ('new', 'exact', 'near') AND r.document_id IN (SELECT id FROM named)")
    for names in ("names_stored", "names_recorded"):
        run(f"ANALYZE {names}")
        run(f"UPDATE records r SET duplicate_of_external_id = n.external_id FROM {names} n "
            "WHERE n.id = r.duplicate_of AND r.duplicate_of_external_id IS NULL")
    for name in ("named", "names_stored", "names_recorded"):
        run(f"DROP TABLE {name}")


def downgrade() -> None:
    op.execute("ALTER TABLE records DROP COLUMN duplicate_of_external_id")
