"""Documents may keep their texts; every pair has a similarity, whatever the method.

* ``documents.text``: each document's text, in an index created with ``simdb init --store-text`` or
  one that decides by the texts (MinHash with ``--verify exact``); NULL otherwise, and for every
  document stored before this revision. TOAST compresses it, with lz4 where the server was built
  with it (``pglz`` otherwise). Adding a nullable column without a default rewrites nothing.
* ``near_duplicate_pairs`` gains ``a_text`` and ``b_text``, and its ``similarity`` is no longer NULL
  for SimHash: ``1 - distance / 64``, the share of equal bits. MinHash keeps ``1 - distance /
  num_perm`` (an index deciding exactly: ``1 - distance / 10000``). The view is replaced in place
  (``CREATE OR REPLACE VIEW``: new columns at the end), so grants and views built on it stay.

This migration carries its own SQL and imports nothing from simdb.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-24
"""
import sqlalchemy as sa
from alembic import context, op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

PAIRS_COMMENT = ("Every near-duplicate pair found at ingest (a stored first), with both documents' metadata and, "
                 "where the index keeps them, texts. distance: differing bits (SimHash), signature positions "
                 "(MinHash) or ten-thousandths of Jaccard distance (MinHash deciding exactly); similarity: "
                 "1 - distance / 64 (SimHash), the Jaccard estimate or the exact Jaccard (MinHash).")


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _similarity(rows: dict) -> str:
    if rows.get("method") == "minhash":
        settings = rows["minhash"]
        scale = 10000 if settings.get("verify") == "exact" else settings["num_perm"]
        return f"(1 - p.distance::real / {scale})"
    return f"(1 - p.distance::real / {int(rows.get('bits', 64))})::real"  # the column was NULL::real


def _pairs_view(schema: str, similarity: str, texts: bool) -> str:
    text_columns = ", a.text AS a_text, b.text AS b_text" if texts else ""
    return f"""CREATE OR REPLACE VIEW {schema}.near_duplicate_pairs AS
        SELECT p.a_id, a.external_id AS a_external_id, p.b_id, b.external_id AS b_external_id, p.distance,
               a.content_hash = b.content_hash AS exact, bt.name AS batch, p.found_at,
               a.metadata AS a_metadata, b.metadata AS b_metadata, {similarity} AS similarity{text_columns}
        FROM {schema}.near_duplicates p
        JOIN {schema}.documents a ON a.id = p.a_id
        JOIN {schema}.documents b ON b.id = p.b_id
        JOIN {schema}.batches bt ON bt.id = p.batch_id"""


def upgrade() -> None:
    schema = context.config.attributes["schema"]
    connection = op.get_bind()
    run = connection.exec_driver_sql
    run("ALTER TABLE documents ADD COLUMN text text")
    lz4 = connection.execute(sa.text(
        "SELECT 'lz4' = ANY(enumvals) FROM pg_settings WHERE name = 'default_toast_compression'")).scalar()
    if lz4:  # recurses into every segment; new segments copy it (LIKE ... INCLUDING COMPRESSION)
        run("ALTER TABLE documents ALTER COLUMN text SET COMPRESSION lz4")
    rows = dict(connection.execute(sa.text("SELECT name, value FROM settings")).all())
    run(_pairs_view(schema, _similarity(rows), texts=True))
    run(f"COMMENT ON VIEW {schema}.near_duplicate_pairs IS " + _literal(PAIRS_COMMENT))


def downgrade() -> None:
    schema = context.config.attributes["schema"]
    connection = op.get_bind()
    rows = dict(connection.execute(sa.text("SELECT name, value FROM settings")).all())
    similarity = _similarity(rows) if rows.get("method") == "minhash" else "NULL::real"
    connection.exec_driver_sql(f"DROP VIEW {schema}.near_duplicate_pairs")
    connection.exec_driver_sql(_pairs_view(schema, similarity, texts=False))
    connection.exec_driver_sql(
        f"COMMENT ON VIEW {schema}.near_duplicate_pairs IS " + _literal(
            "Every near-duplicate pair found at ingest (a stored first), with both documents' metadata. "
            "distance: differing bits (SimHash) or signature positions (MinHash); similarity: the Jaccard "
            "estimate (MinHash only)."))
    connection.exec_driver_sql("ALTER TABLE documents DROP COLUMN text")
    connection.exec_driver_sql("DELETE FROM settings WHERE name = 'texts'")
