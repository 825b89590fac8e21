"""A text can be looked up without leaving SQL: ``simdb_sketch(text)``, ``simdb_near_text``, ``simdb_similar_text``.

``simdb_near_text(content, max_distance)`` and ``simdb_similar_text(content, min_similarity)`` call
the index's own lookups (``simdb_near``, ``simdb_similar``) with ``simdb_sketch(content)``, the index's
sketch of the text (a ``bigint`` fingerprint on SimHash, a ``bytea`` signature on MinHash).
``simdb_sketch`` needs simdb's own Python in the server (PL/Python, which only a superuser can
install, with the paths of an environment on the server's machine): that depends on the machine,
not on the schema, so ``simdb sql-functions`` writes it (``simdb.pg.plpython``). This migration
creates it as a placeholder that raises one line saying how to enable it and what to run instead.

This migration carries its own SQL and imports nothing from simdb.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-26
"""
import sqlalchemy as sa
from alembic import context, op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

NOT_ENABLED = ("simdb_sketch cannot run simdb's Python in this database yet: as a superuser, install PL/Python "
               "(Debian: apt-get install postgresql-plpython3-<server major version>), run CREATE EXTENSION "
               "plpython3u in the database, then `simdb sql-functions`; until then `simdb query TEXT` and "
               "`simdb fingerprint --index TEXT` answer from the shell")
SKETCH_COMMENT = ("The index's sketch of a text, as ingest stores it (SimHash: the fingerprint; MinHash: the "
                  "signature). PL/Python, installed by `simdb sql-functions`; until then it says how to enable it.")
LOOKUPS = (("simdb_near_text", "simdb_near", "max_distance", "integer", "distance", "integer"),
           ("simdb_similar_text", "simdb_similar", "min_similarity", "double precision", "similarity", "double precision"))


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _run(statement: str) -> None:
    op.get_bind().connection.dbapi_connection.execute(statement)  # DDL as written: '%' is no placeholder


def upgrade() -> None:
    schema = context.config.attributes["schema"]
    method = op.get_bind().execute(sa.text("SELECT value #>> '{}' FROM settings WHERE name = 'method'")).scalar()
    returns = "bytea" if method == "minhash" else "bigint"
    _run(f"""CREATE OR REPLACE FUNCTION {schema}.simdb_sketch(content text) RETURNS {returns}
            LANGUAGE plpgsql STABLE STRICT AS $$
            BEGIN
                RAISE EXCEPTION {_literal(NOT_ENABLED)} USING ERRCODE = 'feature_not_supported';
            END $$""")
    _run(f"COMMENT ON FUNCTION {schema}.simdb_sketch(text) IS {_literal(SKETCH_COMMENT)}")
    for name, lookup, parameter, parameter_type, column, column_type in LOOKUPS:
        _run(f"""CREATE OR REPLACE FUNCTION {schema}.{name}(content text, {parameter} {parameter_type} DEFAULT NULL)
            RETURNS TABLE (document_id bigint, {column} {column_type})
            LANGUAGE plpgsql STABLE AS $$
            BEGIN
                IF {parameter} IS NULL THEN
                    RETURN QUERY SELECT l.document_id, l.{column}::{column_type}
                                 FROM {schema}.{lookup}({schema}.simdb_sketch(content)) l;
                ELSE
                    RETURN QUERY SELECT l.document_id, l.{column}::{column_type}
                                 FROM {schema}.{lookup}({schema}.simdb_sketch(content), {parameter}) l;
                END IF;
            END $$""")
        _run(f"COMMENT ON FUNCTION {schema}.{name}(text, {parameter_type}) IS " + _literal(
            f"{lookup} of a text: the stored documents {lookup} finds for simdb_sketch(content) ({parameter}: "
            f"{lookup}'s default when NULL)."))


def downgrade() -> None:
    schema = context.config.attributes["schema"]
    for signature in ("simdb_near_text(text, integer)", "simdb_similar_text(text, double precision)", "simdb_sketch(text)"):
        op.execute(f"DROP FUNCTION IF EXISTS {schema}.{signature}")
