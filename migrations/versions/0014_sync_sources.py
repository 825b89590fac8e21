"""PostgreSQL tables and queries kept in sync (``simdb sync``): the ``sync_sources`` table and the
``source_verdicts`` view.

A source row says how to read the rows (a table or a query, the id, text, metadata and watermark
columns, another server's URL without its password), what to do with a row whose text changed, and
where the last committed chunk stopped: the (watermark, id) of its last row, written in that chunk's
transaction, so that a killed run resumes there. ``source_verdicts`` gives each synced row's verdict
by the source's name and the row's id, for an analyst to join with the source table.

This migration carries its own SQL and imports nothing from simdb.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-26
"""
from alembic import context, op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

TABLE = """CREATE TABLE sync_sources (
    name TEXT NOT NULL,
    relation TEXT,
    query TEXT,
    id_column TEXT NOT NULL,
    text_column TEXT NOT NULL,
    metadata_columns TEXT[] DEFAULT '{}' NOT NULL,
    watermark_column TEXT,
    source_url TEXT,
    on_change TEXT NOT NULL,
    lag INTERVAL,
    watermark TEXT,
    last_id TEXT,
    batch TEXT,
    created_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
    last_run_at TIMESTAMP WITH TIME ZONE,
    CONSTRAINT pk_sync_sources PRIMARY KEY (name),
    CONSTRAINT ck_sync_sources_one_origin CHECK ((relation IS NULL) <> (query IS NULL)),
    CONSTRAINT ck_sync_sources_on_change CHECK (on_change IN ('keep', 'replace'))
)"""
TABLE_COMMENT = ("One row per PostgreSQL table or query kept in sync (simdb sync): how to read it, and the "
                 "(watermark, id) of the last row a committed chunk stored, written in that chunk's transaction.")
VIEW = """CREATE OR REPLACE VIEW {schema}.source_verdicts AS
        SELECT DISTINCT ON (b.source, r.external_id) substr(b.source, 6) AS source, r.external_id AS id,
               r.status, r.duplicate_of_external_id AS duplicate_of, r.distance, b.name AS batch,
               r.document_id, r.reason
        FROM {schema}.records r JOIN {schema}.batches b ON b.id = r.batch_id
        WHERE b.source LIKE 'sync %' AND r.external_id IS NOT NULL
        ORDER BY b.source, r.external_id, CASE WHEN r.status IN ('new', 'exact', 'near') THEN 0
                 WHEN r.status = 'already_stored' THEN 1 ELSE 2 END, r.batch_id DESC, r.position DESC"""
VIEW_COMMENT = (
    "Per row of each synced source (simdb sync), by its id as text: its latest verdict that stored it (new, exact, "
    "near; else already_stored, else rejected), the id of the earliest near-duplicate, the batch. Join it with the "
    "source table: ON v.source = 'articles' AND v.id = a.id::text.")


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def upgrade() -> None:
    schema = context.config.attributes["schema"]
    run = op.get_bind().connection.dbapi_connection.execute  # as written: '%' is no placeholder
    run(TABLE)
    run("COMMENT ON TABLE sync_sources IS " + _literal(TABLE_COMMENT))
    run(VIEW.format(schema=schema))
    run(f"COMMENT ON VIEW {schema}.source_verdicts IS " + _literal(VIEW_COMMENT))


def downgrade() -> None:
    schema = context.config.attributes["schema"]
    op.execute(f"DROP VIEW {schema}.source_verdicts")
    op.execute("DROP TABLE sync_sources")
