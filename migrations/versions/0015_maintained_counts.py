"""Counts the recipes read instead of scanning the archive: documents removed per batch, each cluster's spread.

``batches.removed`` counts a batch's documents removed since it stored them (``simdb remove --id`` or
``--before``, a row replaced by ``simdb sync``), written in the removal's transaction: the documents
the index holds are ``sum(documents - removed)`` over the batches, where ``count(*)`` of ``documents``
read every segment (0.37 s at 1M documents). ``clusters.min_similarity`` is the smallest similarity of a
member to the cluster's canonical (earliest) document, as the sketches estimate it (the
``similarity_to_canonical`` of ``cluster_members``), kept by every ingest chunk and removal: "clusters
that have spread" reads an index of ``clusters`` where it compared every member of every cluster with its
canonical document (2.5 s at 1M). ``cluster_members.cluster_min_similarity`` reads it, and
``duplicate_clusters`` shows it.

Both are filled here from what is stored: ``removed`` as each batch's stored count less the documents it
still has, ``min_similarity`` from ``cluster_members`` as revision 0014 defines it. The updates go
through temporary tables filled by one simple statement each, and a reference table (``batches``) is
updated row by row with constants: on a distributed index Citus updates a table from a join only on
distribution columns, and a reference table from no join at all.

This migration carries its own SQL and imports nothing from simdb.

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-26
"""
import sqlalchemy as sa
from alembic import context, op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

EXACT_SCALE = 10_000


def _similarity_sql(distance: str, scale: int) -> str:
    return f"(({scale} - {distance})::double precision / {scale})"


def _to_canonical(schema: str, rows: dict) -> str:
    """The similarity of a member ``d`` to its canonical document ``c``, as revision 0012 wrote it."""
    if rows.get("method") == "minhash":
        return f"{schema}.simdb_similarity(d.signature, c.signature)"
    return _similarity_sql("bit_count((d.simhash # c.simhash)::bit(64))", int(rows.get("bits", 64)))


def _views(schema: str, to_canonical: str, spread: str) -> list[str]:
    return [
        f"""CREATE OR REPLACE VIEW {schema}.cluster_members AS
        SELECT d.cluster_id, c.external_id AS canonical_id, k.size AS cluster_size, d.id AS document_id,
               d.external_id, b.name AS batch, d.created_at, d.duplicate_of, d.duplicate_distance,
               {to_canonical} AS similarity_to_canonical,
               {spread} AS cluster_min_similarity, d.text
        FROM {schema}.clusters k
        JOIN {schema}.documents d ON d.cluster_id = k.cluster_id
        JOIN {schema}.documents c ON c.id = k.cluster_id
        JOIN {schema}.batches b ON b.id = d.batch_id""",
        f"""CREATE OR REPLACE VIEW {schema}.duplicate_clusters AS
        SELECT k.cluster_id, c.external_id AS canonical_id, k.size, k.first_seen, k.last_seen, k.batches,
               c.text AS canonical_text{", k.min_similarity" if spread == "k.min_similarity" else ""}
        FROM {schema}.clusters k
        JOIN {schema}.documents c ON c.id = k.cluster_id""",
    ]


def upgrade() -> None:
    schema = context.config.attributes["schema"]
    connection = op.get_bind()
    run = connection.exec_driver_sql
    rows = dict(connection.execute(sa.text("SELECT name, value FROM settings")).all())
    run("ALTER TABLE batches ADD COLUMN removed integer DEFAULT 0 NOT NULL")
    held = connection.execute(sa.text(
        "SELECT b.id, b.documents - coalesce(c.held, 0) FROM batches b LEFT JOIN "
        "(SELECT batch_id, count(*) AS held FROM documents GROUP BY batch_id) c ON c.batch_id = b.id")).all()
    for batch_id, removed in held:
        if removed:
            connection.execute(sa.text("UPDATE batches SET removed = :removed WHERE id = :id"),
                               {"removed": removed, "id": batch_id})
    run("ALTER TABLE clusters ADD COLUMN min_similarity double precision")
    run(f"CREATE TEMPORARY TABLE cluster_spread AS SELECT cluster_id, min(similarity_to_canonical) AS spread "
        f"FROM {schema}.cluster_members GROUP BY cluster_id")
    run("UPDATE clusters k SET min_similarity = s.spread FROM cluster_spread s WHERE s.cluster_id = k.cluster_id")
    run("DROP TABLE cluster_spread")
    run("CREATE INDEX ix_clusters_min_similarity ON clusters (min_similarity, cluster_id)")
    for statement in _views(schema, _to_canonical(schema, rows), "k.min_similarity"):
        run(statement)
    run(f"COMMENT ON VIEW {schema}.duplicate_clusters IS 'Groups of near-duplicates (connected components), "
        "canonical = earliest document, with its text where the index keeps texts, and the smallest similarity of "
        "a member to the canonical (min_similarity); read from the clusters table.'")
    run("COMMENT ON TABLE batches IS 'One row per ingested batch, with its counts (removed: its documents "
        "removed since; it holds documents - removed).'")
    run("COMMENT ON TABLE clusters IS 'One row per cluster of two or more documents (cluster_id = its earliest "
        "document''s id), kept by every ingest and removal: size, first and last seen, the batches of its "
        "members, the smallest similarity of a member to the earliest (min_similarity).'")


def downgrade() -> None:
    schema = context.config.attributes["schema"]
    connection = op.get_bind()
    run = connection.exec_driver_sql
    rows = dict(connection.execute(sa.text("SELECT name, value FROM settings")).all())
    to_canonical = _to_canonical(schema, rows)
    run(f"DROP VIEW {schema}.duplicate_clusters")  # a view's column cannot be dropped by replacing it
    for statement in _views(schema, to_canonical, f"min({to_canonical}) OVER (PARTITION BY d.cluster_id)"):
        run(statement)
    run(f"COMMENT ON VIEW {schema}.duplicate_clusters IS 'Groups of near-duplicates (connected components), "
        "canonical = earliest document, with its text where the index keeps texts; read from the clusters table.'")
    run("DROP INDEX ix_clusters_min_similarity")
    run("ALTER TABLE clusters DROP COLUMN min_similarity")
    run("ALTER TABLE batches DROP COLUMN removed")
    run("COMMENT ON TABLE batches IS 'One row per ingested batch, with its counts.'")
    run("COMMENT ON TABLE clusters IS 'One row per cluster of two or more documents (cluster_id = its earliest "
        "document''s id), kept by every ingest and removal: size, first and last seen, the batches of its "
        "members.'")
