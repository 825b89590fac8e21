"""Create an index: settings, batches, documents with one column per block key.

The number of key columns depends on the block layout chosen at creation, so
this migration reads the new index's settings from the alembic config
(``simdb init`` puts them there) and stores them in the settings table in the
same transaction as the tables themselves.

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""
from alembic import context, op
import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    settings_rows = context.config.attributes.get("new_index_settings")
    if settings_rows is None:
        raise RuntimeError("this migration creates a simdb index; run it through `simdb init`, "
                           "which supplies the index settings")
    settings = op.create_table(
        "settings",
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("value", JSONB, nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_settings"),
        comment="What the index is: fingerprint recipe, block layout, canaries. Checked on every open.",
    )
    op.bulk_insert(settings, [{"name": name, "value": value} for name, value in settings_rows.items()])

    op.create_table(
        "batches",
        sa.Column("id", sa.Integer, sa.Identity(), nullable=False),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("source", sa.Text, nullable=False),
        sa.Column("status", sa.Text, nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True)),
        sa.Column("documents", sa.Integer, nullable=False, server_default="0"),
        sa.Column("new", sa.Integer, nullable=False, server_default="0"),
        sa.Column("exact_duplicates", sa.Integer, nullable=False, server_default="0"),
        sa.Column("near_duplicates", sa.Integer, nullable=False, server_default="0"),
        sa.Column("within_batch", sa.Integer, nullable=False, server_default="0"),
        sa.PrimaryKeyConstraint("id", name="pk_batches"),
        sa.UniqueConstraint("name", name="uq_batches_name"),
        sa.CheckConstraint("status IN ('running', 'complete')", name="ck_batches_status"),
        comment="One row per ingested batch, with its counts.",
    )

    key_columns = [f"key_{i}" for i in range(len(settings_rows["keys"]))]
    op.create_table(
        "documents",
        sa.Column("id", sa.BigInteger, sa.Identity(), nullable=False),
        sa.Column("external_id", sa.Text, nullable=False),
        sa.Column("batch_id", sa.Integer, nullable=False),
        sa.Column("simhash", sa.BigInteger, nullable=False),
        *[sa.Column(name, sa.BigInteger, nullable=False) for name in key_columns],
        sa.Column("content_hash", sa.LargeBinary, nullable=False),
        sa.Column("length", sa.Integer, nullable=False),
        sa.Column("metadata", JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("duplicate_of", sa.BigInteger),
        sa.Column("duplicate_distance", sa.SmallInteger),
        sa.PrimaryKeyConstraint("id", name="pk_documents"),
        sa.UniqueConstraint("external_id", name="uq_documents_external_id"),
        sa.ForeignKeyConstraint(["batch_id"], ["batches.id"], name="fk_documents_batch_id_batches"),
        sa.ForeignKeyConstraint(["duplicate_of"], ["documents.id"], name="fk_documents_duplicate_of_documents"),
        comment="One row per document: fingerprint (signed BIGINT), block keys, and the earliest near-duplicate.",
    )
    op.create_index("ix_documents_batch_id", "documents", ["batch_id"])
    op.create_index("ix_documents_content_hash", "documents", ["content_hash"])
    op.create_index("ix_documents_duplicate_of", "documents", ["duplicate_of"])
    for name in key_columns:
        op.create_index(f"ix_documents_{name}", "documents", [name], postgresql_include=["simhash", "id"])


def downgrade() -> None:
    op.drop_table("documents")
    op.drop_table("batches")
    op.drop_table("settings")
