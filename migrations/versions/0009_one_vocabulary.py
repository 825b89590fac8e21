"""One SQL vocabulary for both methods; a maintained clusters table; neighbours and cluster members.

* ``clusters``: one row per cluster of two or more documents (``cluster_id``, ``size``,
  ``first_seen``, ``last_seen``, ``batches``), filled here once from ``documents`` and kept by every
  ingest and removal from now on, with an index on ``size`` so that "the biggest clusters" is an
  index scan. ``duplicate_clusters`` reads it (same columns, plus ``canonical_text``), where it
  grouped every document of the archive on each query.
* ``document_neighbours``: every stored pair from both sides, with both batches; ``simdb_neighbours
  (external_id)`` gives one document's.
* ``cluster_members``: every member of every cluster with its similarity to the canonical document
  (as the sketches estimate it) and the smallest such similarity in its cluster.
* SimHash indexes gain ``simdb_similar(fingerprint, min_similarity)`` (similarity = 1 - bits / 64),
  MinHash indexes ``simdb_near(signature, max_distance)``, so that both methods answer to both names.

This migration carries its own SQL and imports nothing from simdb.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-24
"""
import sqlalchemy as sa
from alembic import context, op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

EXACT_SCALE = 10000


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _similarity(rows: dict) -> str:
    if rows.get("method") == "minhash":
        settings = rows["minhash"]
        scale = EXACT_SCALE if settings.get("verify") == "exact" else settings["num_perm"]
        return f"(1 - p.distance::real / {scale})"
    return f"(1 - p.distance::real / {int(rows.get('bits', 64))})::real"


def _between(schema: str, rows: dict) -> str:
    if rows.get("method") == "minhash":
        return f"{schema}.simdb_similarity(d.signature, c.signature)"
    return f"(1 - bit_count((d.simhash # c.simhash)::bit(64))::real / {int(rows.get('bits', 64))})::real"


def _views(schema: str, rows: dict) -> list[str]:
    similarity, to_canonical = _similarity(rows), _between(schema, rows)
    side = ("SELECT p.{me}_id AS document_id, {me}.external_id, {me}b.name AS batch, p.{other}_id AS neighbour_id, "
            "{other}.external_id AS neighbour_external_id, {other}b.name AS neighbour_batch, {earlier} AS "
            "neighbour_is_earlier, p.distance, {similarity} AS similarity, p.found_at "
            f"FROM {schema}.near_duplicates p JOIN {schema}.documents a ON a.id = p.a_id "
            f"JOIN {schema}.batches ab ON ab.id = a.batch_id JOIN {schema}.documents b ON b.id = p.b_id "
            f"JOIN {schema}.batches bb ON bb.id = b.batch_id")
    return [
        f"""CREATE OR REPLACE VIEW {schema}.duplicate_clusters AS
        SELECT k.cluster_id, c.external_id AS canonical_id, k.size, k.first_seen, k.last_seen, k.batches,
               c.text AS canonical_text
        FROM {schema}.clusters k
        JOIN {schema}.documents c ON c.id = k.cluster_id""",
        f"CREATE OR REPLACE VIEW {schema}.document_neighbours AS "
        + side.format(me="b", other="a", earlier="true", similarity=similarity) + " UNION ALL "
        + side.format(me="a", other="b", earlier="false", similarity=similarity),
        f"""CREATE OR REPLACE VIEW {schema}.cluster_members AS
        SELECT d.cluster_id, c.external_id AS canonical_id, k.size AS cluster_size, d.id AS document_id,
               d.external_id, b.name AS batch, d.created_at, d.duplicate_of, d.duplicate_distance,
               {to_canonical} AS similarity_to_canonical,
               min({to_canonical}) OVER (PARTITION BY d.cluster_id) AS cluster_min_similarity, d.text
        FROM {schema}.clusters k
        JOIN {schema}.documents d ON d.cluster_id = k.cluster_id
        JOIN {schema}.documents c ON c.id = k.cluster_id
        JOIN {schema}.batches b ON b.id = d.batch_id""",
        f"""CREATE OR REPLACE FUNCTION {schema}.simdb_neighbours(external_id text)
            RETURNS SETOF {schema}.document_neighbours
            LANGUAGE sql STABLE PARALLEL SAFE AS $$
            SELECT * FROM {schema}.document_neighbours n WHERE n.external_id = simdb_neighbours.external_id
            $$""",
        f"COMMENT ON FUNCTION {schema}.simdb_neighbours(text) IS "
        + _literal("The near-duplicates of one document (by its external id), earlier and later, with both batches."),
        f"COMMENT ON VIEW {schema}.duplicate_clusters IS "
        + _literal("Groups of near-duplicates (connected components), canonical = earliest document, with its text "
                   "where the index keeps texts; read from the clusters table."),
        f"COMMENT ON VIEW {schema}.document_neighbours IS "
        + _literal("Every stored pair from both sides: each document with each of its near-duplicates, both "
                   "batches, whether the neighbour came earlier, distance and similarity."),
        f"COMMENT ON VIEW {schema}.cluster_members IS "
        + _literal("The members of every cluster of two or more, each with its similarity to the cluster's "
                   "canonical (earliest) document as the sketches estimate it, and the smallest such similarity "
                   "in its cluster: how far the cluster has spread."),
    ]


def _simhash_functions(schema: str, rows: dict) -> list[str]:
    k = int(rows["max_distance"])
    floor = 1 - k / 64
    return [
        f"""CREATE OR REPLACE FUNCTION {schema}.simdb_check_similarity(min_similarity real) RETURNS boolean
            LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
            BEGIN
                IF min_similarity IS NULL OR min_similarity < {floor} OR min_similarity > 1 THEN
                    RAISE EXCEPTION 'simdb_similar: min_similarity must be between {floor} (1 - {k} / 64, the '
                                    'index''s maximum distance) and 1, not %', min_similarity
                                    USING ERRCODE = 'invalid_parameter_value';
                END IF;
                RETURN true;
            END $$""",
        f"""CREATE OR REPLACE FUNCTION {schema}.simdb_similar(fingerprint bigint, min_similarity real DEFAULT {floor})
            RETURNS TABLE (document_id bigint, similarity real)
            LANGUAGE sql STABLE PARALLEL SAFE AS $$
            SELECT n.document_id, (1 - n.distance::real / 64)::real
            FROM {schema}.simdb_near(fingerprint, {k}) n
            WHERE {schema}.simdb_check_similarity(min_similarity) AND 1 - n.distance::real / 64 >= min_similarity
            $$""",
        f"COMMENT ON FUNCTION {schema}.simdb_similar(bigint, real) IS " + _literal(
            f"Documents whose similarity (1 - differing bits / 64) to a fingerprint is at least min_similarity "
            f"(default and at least {floor}), found through the block-key indexes: simdb_near in the vocabulary of "
            "similarity that MinHash indexes share."),
    ]


def _minhash_functions(schema: str, rows: dict) -> list[str]:
    settings = rows["minhash"]
    k, n, threshold = int(rows["max_distance"]), settings["num_perm"], settings["threshold"]
    exact = settings.get("verify") == "exact"
    positions = f"round((1 - s.similarity) * {n})::integer"
    distance = f"(({positions} * {EXACT_SCALE} + {n - 1}) / {n})" if exact else positions
    unit = "ten-thousandths of Jaccard distance (estimated)" if exact else "signature positions"
    return [
        f"""CREATE OR REPLACE FUNCTION {schema}.simdb_check_distance(max_distance integer) RETURNS boolean
            LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
            BEGIN
                IF max_distance IS NULL OR max_distance < 0 OR max_distance > {k} THEN
                    RAISE EXCEPTION 'simdb_near: max_distance must be between 0 and {k} (the index''s maximum '
                                    'distance), not %', max_distance USING ERRCODE = 'invalid_parameter_value';
                END IF;
                RETURN true;
            END $$""",
        f"""CREATE OR REPLACE FUNCTION {schema}.simdb_near(signature bytea, max_distance integer DEFAULT {k})
            RETURNS TABLE (document_id bigint, distance integer)
            LANGUAGE sql STABLE PARALLEL SAFE AS $$
            SELECT s.document_id, {distance}
            FROM {schema}.simdb_similar(simdb_near.signature, {threshold}) s
            WHERE {schema}.simdb_check_distance(max_distance) AND {distance} <= max_distance
            $$""",
        f"COMMENT ON FUNCTION {schema}.simdb_near(bytea, integer) IS " + _literal(
            f"Documents within max_distance (default and at most {k}) {unit} of a signature, found through the band "
            "indexes: simdb_similar in the vocabulary of distance that SimHash indexes share."),
    ]


def upgrade() -> None:
    schema = context.config.attributes["schema"]
    connection = op.get_bind()
    run = connection.connection.dbapi_connection.execute  # DDL as written: '%' in PL/pgSQL is no placeholder
    run("""CREATE TABLE clusters (
        cluster_id bigint NOT NULL, size bigint NOT NULL, first_seen timestamptz NOT NULL,
        last_seen timestamptz NOT NULL, batches text[] NOT NULL, CONSTRAINT pk_clusters PRIMARY KEY (cluster_id))""")
    run("CREATE INDEX ix_clusters_size ON clusters (size DESC, cluster_id)")
    run("COMMENT ON TABLE clusters IS " + _literal(
        "One row per cluster of two or more documents (cluster_id = its earliest document's id), kept by every "
        "ingest and removal: size, first and last seen, the batches of its members."))
    run("""INSERT INTO clusters (cluster_id, size, first_seen, last_seen, batches)
        SELECT d.cluster_id, count(*), min(d.created_at), max(d.created_at), array_agg(DISTINCT b.name)
        FROM documents d JOIN batches b ON b.id = d.batch_id GROUP BY d.cluster_id HAVING count(*) > 1""")
    rows = dict(connection.execute(sa.text("SELECT name, value FROM settings")).all())
    functions = _minhash_functions(schema, rows) if rows.get("method") == "minhash" else \
        _simhash_functions(schema, rows)
    for statement in [*functions, *_views(schema, rows)]:
        run(statement)


def downgrade() -> None:
    schema = context.config.attributes["schema"]
    connection = op.get_bind()
    run = connection.connection.dbapi_connection.execute
    rows = dict(connection.execute(sa.text("SELECT name, value FROM settings")).all())
    run(f"DROP FUNCTION {schema}.simdb_neighbours(text)")
    run(f"DROP VIEW {schema}.document_neighbours")
    run(f"DROP VIEW {schema}.cluster_members")
    if rows.get("method") == "minhash":
        run(f"DROP FUNCTION {schema}.simdb_near(bytea, integer)")
        run(f"DROP FUNCTION {schema}.simdb_check_distance(integer)")
    else:
        run(f"DROP FUNCTION {schema}.simdb_similar(bigint, real)")
        run(f"DROP FUNCTION {schema}.simdb_check_similarity(real)")
    run(f"DROP VIEW {schema}.duplicate_clusters")  # its columns change: replaced, not altered
    run(f"""CREATE VIEW {schema}.duplicate_clusters AS
        SELECT d.cluster_id, c.external_id AS canonical_id, count(*) AS size,
               min(d.created_at) AS first_seen, max(d.created_at) AS last_seen,
               array_agg(DISTINCT b.name) AS batches
        FROM {schema}.documents d
        JOIN {schema}.documents c ON c.id = d.cluster_id
        JOIN {schema}.batches b ON b.id = d.batch_id
        GROUP BY d.cluster_id, c.external_id
        HAVING count(*) > 1""")
    run(f"COMMENT ON VIEW {schema}.duplicate_clusters IS "
        + _literal("Groups of near-duplicates (connected components), canonical = earliest document."))
    run("DROP TABLE clusters")
