"""Batches record how far they got, what they rejected and what was already stored.

Large inputs are committed in chunks; ``position`` is the number of input
records a batch has consumed (stored, skipped or rejected), so that an
interrupted ingest can resume after the last committed chunk.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22
"""
from alembic import op
import sqlalchemy as sa

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("batches", sa.Column("position", sa.BigInteger, nullable=False, server_default="0"))
    op.add_column("batches", sa.Column("rejected", sa.Integer, nullable=False, server_default="0"))
    op.add_column("batches", sa.Column("already_stored", sa.Integer, nullable=False, server_default="0"))


def downgrade() -> None:
    op.drop_column("batches", "already_stored")
    op.drop_column("batches", "rejected")
    op.drop_column("batches", "position")
