"""A verdict keeps the batch of the document it named: ``records.duplicate_of_batch_id``.

"Which documents of batch ``new`` were already in the archive, and as what?" scanned every segment for
the batch's documents and looked up each one's earlier document by id (0.78 s at 1M documents). A
verdict (``records``) already keeps the earlier document's name (``duplicate_of_external_id``, 0011);
with its batch as well, written in the chunk's transaction, the recipe reads the batch's verdicts that
named an earlier batch through ``ix_records_earlier_batch``, a partial index of exactly those rows in
input order. Like the name, the batch is history: kept when that document is removed later, and
untouched by a relayout (which keeps every document's id).

Filled here from what is stored: a named document's batch from ``documents``, else (removed since)
from the verdict that stored it; a document whose batch was removed whole has neither, and its batch
stays NULL. The rows are updated by runs of the named ids that share a batch, each with constants
(``duplicate_of BETWEEN`` the run's first and last id): on a distributed index Citus updates
``records`` (distributed by ``batch_id``) from no join on another column.

This migration carries its own SQL and imports nothing from simdb.

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-26
"""
import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def _named_batches(connection) -> list[tuple[int, int | None]]:
    """(id, batch id or None) of every document a verdict named, in id order."""
    named = connection.execute(sa.text(
        "SELECT DISTINCT duplicate_of FROM records WHERE duplicate_of IS NOT NULL")).scalars().all()
    if not named:
        return []
    # (joined with the ids unnested: a semi-join, where ``= ANY`` of a bound array compares each row with every id)
    batches = dict(connection.execute(sa.text(
        "SELECT d.id, d.batch_id FROM documents d WHERE d.id IN (SELECT unnest(CAST(:ids AS bigint[])))"),
        {"ids": named}).all())
    removed = [i for i in named if i not in batches]
    if removed:
        batches.update(connection.execute(sa.text(
            "SELECT r.document_id, r.batch_id FROM records r WHERE r.status IN ('new', 'exact', 'near') "
            "AND r.document_id IN (SELECT unnest(CAST(:ids AS bigint[])))"), {"ids": removed}).all())
    return [(i, batches.get(i)) for i in sorted(named)]


def upgrade() -> None:
    connection = op.get_bind()
    run = connection.exec_driver_sql
    run("ALTER TABLE records ADD COLUMN duplicate_of_batch_id integer")
    # for the updates below, one per run of ids (about one per batch): without it each one read all of records
    run("CREATE INDEX ix_records_0017_duplicate_of ON records (duplicate_of) WHERE duplicate_of IS NOT NULL")
    runs: list[list] = []  # [batch id, first id, last id] of consecutive named ids of one batch
    for document_id, batch_id in _named_batches(connection):
        if runs and runs[-1][0] == batch_id:
            runs[-1][2] = document_id
        else:
            runs.append([batch_id, document_id, document_id])
    for batch_id, first, last in runs:
        if batch_id is not None:
            connection.execute(sa.text(
                "UPDATE records SET duplicate_of_batch_id = :batch WHERE duplicate_of BETWEEN :first AND :last"),
                {"batch": batch_id, "first": first, "last": last})
    run("DROP INDEX ix_records_0017_duplicate_of")
    run("CREATE INDEX ix_records_earlier_batch ON records (batch_id, position) "
        "WHERE duplicate_of_batch_id <> batch_id")


def downgrade() -> None:
    run = op.get_bind().exec_driver_sql
    run("DROP INDEX ix_records_earlier_batch")
    run("ALTER TABLE records DROP COLUMN duplicate_of_batch_id")
