"""No foreign key checked row by row on the ingest path: ``records`` and ``documents`` keep ``batch_id``
without a foreign key to ``batches``.

Every stored document and every input record's outcome fired a foreign-key trigger that looked its
batch up in ``batches``' primary key, one row at a time: 0.98 s per 100k ``records`` rows against 0.31 s
without it (docs/performance.md, issue 36), and the same again for ``documents`` (a row trigger on the
active segment, a validating scan when a bulk chunk's segment is attached). Each chunk writes its
batch's row in the same transaction under the ingest lock, so the key cannot point at a missing batch
when it is written; the only thing that deletes a batch, ``simdb remove --batch``, deletes its documents
and (since this revision) its ``records`` rows itself, where the cascade of ``records`` did it before.

Downgrading adds the keys again, after deleting what would violate them (rows of batches that no longer
exist: none, unless something other than simdb deleted a batch).

This migration carries its own SQL and imports nothing from simdb.

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-26
"""
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE records DROP CONSTRAINT IF EXISTS fk_records_batch_id_batches")
    op.execute("ALTER TABLE documents DROP CONSTRAINT IF EXISTS fk_documents_batch_id_batches")


def downgrade() -> None:
    op.execute("DELETE FROM records r WHERE NOT EXISTS (SELECT 1 FROM batches b WHERE b.id = r.batch_id)")
    op.execute("ALTER TABLE records ADD CONSTRAINT fk_records_batch_id_batches FOREIGN KEY (batch_id) "
               "REFERENCES batches (id) ON DELETE CASCADE")
    op.execute("ALTER TABLE documents ADD CONSTRAINT fk_documents_batch_id_batches FOREIGN KEY (batch_id) "
               "REFERENCES batches (id)")
