"""Stored near-duplicate pairs, clusters, and the analysts' SQL functions and views.

``near_duplicates`` keeps every pair found at ingest; ``documents.cluster_id`` is the earliest
document of each connected component. An index that already holds documents gets both computed
here, from the block keys, once.

The functions depend on the index's block layout, read from ``settings`` (``block_ranges``,
``keys``, ``first_key``, ``max_distance``). Like every migration, this one carries the SQL it
runs and imports nothing from simdb: it is history, run years later against the schema of its
time (the SQL below is simdb's as of this revision).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22
"""
from alembic import context, op
import sqlalchemy as sa

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

FUNCTIONS = ("simdb_hamming(bigint, bigint)", "simdb_fingerprint_hex(bigint)", "simdb_fingerprint_from_hex(text)",
             "simdb_check_distance(integer)", "simdb_near(bigint, integer)")
VIEWS = ("near_duplicate_pairs", "duplicate_clusters", "batch_summary")


def _layout(rows: dict) -> tuple[list[str], list[str], int]:
    """(key column names, SQL of each key computed from a ``fingerprint`` column, max distance)."""
    ranges, keys, first = rows["block_ranges"], rows["keys"], rows.get("first_key", 0)
    expressions = []
    for key in keys:
        parts, shift = [], 0
        for block in key:
            start, width = ranges[block]
            part = f"((fingerprint >> {start}) & {(1 << width) - 1})"
            parts.append(f"({part} << {shift})" if shift else part)
            shift += width
        expressions.append(" | ".join(parts))
    return [f"key_{first + i}" for i in range(len(keys))], expressions, rows["max_distance"]


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _functions(schema: str, columns: list[str], expressions: list[str], k: int) -> list[str]:
    lookups = "\n                UNION\n".join(
        f"                SELECT id, simhash FROM {schema}.documents WHERE {column} = {expression}"
        for column, expression in zip(columns, expressions))
    return [
        f"""CREATE OR REPLACE FUNCTION {schema}.simdb_hamming(a bigint, b bigint) RETURNS integer
            LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
            RETURN bit_count((a # b)::bit(64))::integer""",
        f"""CREATE OR REPLACE FUNCTION {schema}.simdb_fingerprint_hex(fingerprint bigint) RETURNS text
            LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
            RETURN lpad(to_hex(fingerprint), 16, '0')""",
        f"""CREATE OR REPLACE FUNCTION {schema}.simdb_fingerprint_from_hex(hex text) RETURNS bigint
            LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
            BEGIN
                IF hex !~* '^(0x)?[0-9a-f]{{1,16}}$' THEN
                    RAISE EXCEPTION 'simdb_fingerprint_from_hex: % is not a fingerprint', quote_literal(hex)
                        USING HINT = 'give up to 16 hex digits, as simdb fingerprint prints them';
                END IF;
                RETURN ('x' || lpad(regexp_replace(hex, '^0x', '', 'i'), 16, '0'))::bit(64)::bigint;
            END $$""",
        f"""CREATE OR REPLACE FUNCTION {schema}.simdb_check_distance(max_distance integer) RETURNS boolean
            LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
            BEGIN
                IF max_distance IS NULL OR max_distance < 0 OR max_distance > {k} THEN
                    RAISE EXCEPTION 'simdb_near: max_distance must be between 0 and {k} (the index''s maximum '
                                    'distance), not %', max_distance;
                END IF;
                RETURN true;
            END $$""",
        f"""CREATE OR REPLACE FUNCTION {schema}.simdb_near(fingerprint bigint, max_distance integer DEFAULT {k})
            RETURNS TABLE (document_id bigint, distance integer)
            LANGUAGE sql STABLE PARALLEL SAFE AS $$
            SELECT c.id, bit_count((c.simhash # fingerprint)::bit(64))::integer
            FROM (
{lookups}
            ) c
            WHERE {schema}.simdb_check_distance(max_distance)
              AND bit_count((c.simhash # fingerprint)::bit(64)) <= max_distance
            $$""",
        f"COMMENT ON FUNCTION {schema}.simdb_hamming(bigint, bigint) IS "
        + _literal("Bits in which two stored fingerprints differ."),
        f"COMMENT ON FUNCTION {schema}.simdb_fingerprint_hex(bigint) IS "
        + _literal("A stored fingerprint as the 16 hex digits the simdb CLI prints."),
        f"COMMENT ON FUNCTION {schema}.simdb_fingerprint_from_hex(text) IS "
        + _literal("The stored (signed BIGINT) form of a fingerprint given in hex."),
        f"COMMENT ON FUNCTION {schema}.simdb_near(bigint, integer) IS "
        + _literal(f"Documents within max_distance (default and at most {k}) bits of a fingerprint, found through "
                   "the block-key indexes."),
    ]


def _views(schema: str) -> list[str]:
    return [
        f"""CREATE OR REPLACE VIEW {schema}.near_duplicate_pairs AS
        SELECT p.a_id, a.external_id AS a_external_id, p.b_id, b.external_id AS b_external_id, p.distance,
               a.content_hash = b.content_hash AS exact, bt.name AS batch, p.found_at,
               a.metadata AS a_metadata, b.metadata AS b_metadata
        FROM {schema}.near_duplicates p
        JOIN {schema}.documents a ON a.id = p.a_id
        JOIN {schema}.documents b ON b.id = p.b_id
        JOIN {schema}.batches bt ON bt.id = p.batch_id""",
        f"""CREATE OR REPLACE VIEW {schema}.duplicate_clusters AS
        SELECT d.cluster_id, c.external_id AS canonical_id, count(*) AS size,
               min(d.created_at) AS first_seen, max(d.created_at) AS last_seen,
               array_agg(DISTINCT b.name) AS batches
        FROM {schema}.documents d
        JOIN {schema}.documents c ON c.id = d.cluster_id
        JOIN {schema}.batches b ON b.id = d.batch_id
        GROUP BY d.cluster_id, c.external_id
        HAVING count(*) > 1""",
        f"""CREATE OR REPLACE VIEW {schema}.batch_summary AS
        SELECT b.id AS batch_id, b.name, b.source, b.status, b.started_at, b.finished_at,
               b.finished_at - b.started_at AS duration, b.documents, b.new, b.exact_duplicates,
               b.near_duplicates, b.exact_duplicates + b.near_duplicates - b.within_batch AS against_archive,
               b.within_batch, b.already_stored, b.rejected
        FROM {schema}.batches b""",
        f"COMMENT ON VIEW {schema}.near_duplicate_pairs IS "
        + _literal("Every near-duplicate pair found at ingest (a stored first), with both documents' metadata."),
        f"COMMENT ON VIEW {schema}.duplicate_clusters IS "
        + _literal("Groups of near-duplicates (connected components), canonical = earliest document."),
        f"COMMENT ON VIEW {schema}.batch_summary IS "
        + _literal("Per batch: documents, new, exact and near duplicates (against the archive / within the batch), "
                   "already stored, rejected, duration."),
    ]


def _run(connection, statement: str) -> None:
    """DDL as written: no parameters, so '%' in PL/pgSQL is not taken for a placeholder."""
    connection.connection.dbapi_connection.execute(statement)


def _components(pairs) -> dict[int, int]:
    """Union-find by smallest id: {document: smallest id of its connected component}."""
    parent: dict[int, int] = {}

    def find(node: int) -> int:
        root = node
        while parent.get(root, root) != root:
            root = parent[root]
        while parent.get(node, node) != root:
            parent[node], node = root, parent[node]
        return root

    for a, b in pairs:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    return {node: find(node) for node in list(parent)}


def upgrade() -> None:
    schema = context.config.attributes["schema"]
    connection = op.get_bind()
    rows = dict(connection.execute(sa.text("SELECT name, value FROM settings")).all())
    # A MinHash index is only ever created at a later head, empty: it has nothing to backfill here, and 0004
    # creates its functions.
    minhash_index = rows.get("method") == "minhash"

    op.create_table(
        "near_duplicates",
        sa.Column("a_id", sa.BigInteger, nullable=False),
        sa.Column("b_id", sa.BigInteger, nullable=False),
        sa.Column("distance", sa.SmallInteger, nullable=False),
        sa.Column("batch_id", sa.Integer, nullable=False),
        sa.Column("found_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.PrimaryKeyConstraint("a_id", "b_id", name="pk_near_duplicates"),
        sa.ForeignKeyConstraint(["a_id"], ["documents.id"], name="fk_near_duplicates_a_id_documents",
                                ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["b_id"], ["documents.id"], name="fk_near_duplicates_b_id_documents",
                                ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["batch_id"], ["batches.id"], name="fk_near_duplicates_batch_id_batches",
                                ondelete="CASCADE"),
        sa.CheckConstraint("a_id < b_id", name="ck_near_duplicates_ordered"),
        comment="Every near-duplicate pair found at ingest: a was stored before b; batch is b's.",
    )
    op.create_index("ix_near_duplicates_b_id", "near_duplicates", ["b_id"])
    op.create_index("ix_near_duplicates_batch_id", "near_duplicates", ["batch_id"])
    op.add_column("documents", sa.Column("cluster_id", sa.BigInteger))
    connection.exec_driver_sql("UPDATE documents SET cluster_id = id")

    if not minhash_index:  # what is already stored: its pairs from the block keys, its clusters from the pairs
        columns, expressions, k = _layout(rows)
        candidates = "\nUNION ALL\n".join(
            f"SELECT p.id, t.id, p.simhash, t.simhash FROM documents p JOIN documents t ON t.{column} = p.{column} "
            f"AND bit_count((p.simhash # t.simhash)::bit(64)) <= {int(k)} AND t.id < p.id" for column in columns)
        connection.exec_driver_sql(
            "INSERT INTO near_duplicates (a_id, b_id, distance, batch_id, found_at) "
            "SELECT DISTINCT c.t_id, c.p_id, bit_count((c.ps # c.ts)::bit(64)), d.batch_id, d.created_at "
            f"FROM ({candidates}) AS c(p_id, t_id, ps, ts) JOIN documents d ON d.id = c.p_id")
        relabel = [(node, root) for node, root in _components(
            connection.exec_driver_sql("SELECT a_id, b_id FROM near_duplicates").all()).items() if node != root]
        if relabel:
            connection.exec_driver_sql(
                "CREATE TEMPORARY TABLE migrate_clusters (id int8, cluster_id int8) ON COMMIT DROP")
            with connection.connection.dbapi_connection.cursor() as cursor:
                with cursor.copy("COPY migrate_clusters FROM STDIN") as copy:
                    for row in relabel:
                        copy.write_row(row)
            connection.exec_driver_sql("UPDATE documents d SET cluster_id = m.cluster_id FROM migrate_clusters m "
                                       "WHERE d.id = m.id")
    op.alter_column("documents", "cluster_id", nullable=False)
    op.create_index("ix_documents_cluster_id", "documents", ["cluster_id"])

    if not minhash_index:
        for statement in _functions(schema, *_layout(rows)) + _views(schema):
            _run(connection, statement)


def downgrade() -> None:
    schema = context.config.attributes["schema"]
    connection = op.get_bind()
    for view in VIEWS:
        connection.exec_driver_sql(f"DROP VIEW IF EXISTS {schema}.{view}")
    for signature in FUNCTIONS:
        connection.exec_driver_sql(f"DROP FUNCTION IF EXISTS {schema}.{signature}")
    op.drop_index("ix_documents_cluster_id", "documents")
    op.drop_column("documents", "cluster_id")
    op.drop_table("near_duplicates")
