"""One row per input record of every batch: what became of it (the verdict), rejects included.

``records`` is written in the same transaction as the chunk it belongs to, so a record's outcome
is exactly as durable as the documents: after a kill, the rejects file and the verdicts are
rebuilt from here. ``status`` is ``new``, ``exact`` or ``near`` for a stored document (with its
``document_id`` and, for a duplicate, the earliest stored near-duplicate and its distance at
ingest), ``already_stored`` for an id stored before with the same text (``document_id`` is that
document), or ``rejected`` (with ``path``, ``line``, ``reason`` and ``hint``). Batches ingested
before this revision have no rows here.

This migration carries its own SQL and imports nothing from simdb.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23
"""
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
        CREATE TABLE records (
            batch_id integer NOT NULL,
            position bigint NOT NULL,
            status text NOT NULL,
            external_id text,
            document_id bigint,
            duplicate_of bigint,
            distance smallint,
            path text,
            line bigint,
            reason text,
            hint text,
            CONSTRAINT pk_records PRIMARY KEY (batch_id, position),
            CONSTRAINT fk_records_batch_id_batches FOREIGN KEY (batch_id) REFERENCES batches (id) ON DELETE CASCADE,
            CONSTRAINT ck_records_status CHECK (status IN ('new', 'exact', 'near', 'already_stored', 'rejected'))
        )""")
    op.execute("COMMENT ON TABLE records IS 'One row per input record of a batch, in input order: what became of "
               "it (new, exact, near, already_stored, rejected), written with its chunk.'")


def downgrade() -> None:
    op.execute("DROP TABLE records")
