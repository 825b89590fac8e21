"""MinHash: ``simdb_similar`` looks its signature up through the band indexes again.

Inside the function body a bare ``signature`` is the ``documents.signature`` column, which shadows
the parameter of the same name: each band key was computed from the row's own signature, so every
row "matched" and every lookup scanned the whole table (21 scans; 4.3 s for one lookup in 800
documents). The right answers came out only because the similarity filter, outside the subquery,
did see the parameter. The lookups now name the parameter ``simdb_similar.signature``. SimHash
indexes have no such function and are left as they are.

This migration carries its own SQL and imports nothing from simdb.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23
"""
import sqlalchemy as sa
from alembic import context, op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def _similar(schema: str, rows: dict, parameter: str) -> str:
    settings = rows["minhash"]
    width, bands, threshold = 4 * settings["rows"], settings["bands"], settings["threshold"]
    band_key = "('x' || substr(md5(substr(%s, {i} * %d + 1, %d)), 1, 16))::bit(64)::bigint" % (parameter, width,
                                                                                                  width)
    lookups = "\n                UNION\n".join(
        f"                SELECT id, signature AS s FROM {schema}.documents WHERE key_{i} = {band_key.format(i=i)}"
        for i in range(bands))
    return f"""CREATE OR REPLACE FUNCTION {schema}.simdb_similar(signature bytea, min_similarity real DEFAULT {threshold})
            RETURNS TABLE (document_id bigint, similarity real)
            LANGUAGE sql STABLE PARALLEL SAFE AS $$
            SELECT c.id, {schema}.simdb_similarity(c.s, signature)
            FROM (
{lookups}
            ) c
            WHERE {schema}.simdb_check_similarity(min_similarity)
              AND {schema}.simdb_similarity(c.s, signature) >= min_similarity
            $$"""


def _replace(parameter: str) -> None:
    schema = context.config.attributes["schema"]
    connection = op.get_bind()
    rows = dict(connection.execute(sa.text("SELECT name, value FROM settings")).all())
    if rows.get("method") != "minhash":
        return
    connection.connection.dbapi_connection.execute(_similar(schema, rows, parameter))  # DDL as written


def upgrade() -> None:
    _replace("simdb_similar.signature")


def downgrade() -> None:
    _replace("signature")
