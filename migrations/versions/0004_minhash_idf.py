"""MinHash indexes and frozen IDF tables.

``documents.signature`` holds a MinHash index's signature (``simhash`` is then NULL; exactly one
of the two is set), and ``idf_terms`` holds the document frequencies a SimHash index with tfidf
weighting was created with. The analysts' functions and views are recreated for the index's
method, from ``settings``.

Like every migration, this one carries the SQL it runs (simdb's as of this revision) and imports
nothing from simdb.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22
"""
from alembic import context, op
import sqlalchemy as sa

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

FUNCTIONS = ("simdb_hamming(bigint, bigint)", "simdb_fingerprint_hex(bigint)", "simdb_fingerprint_from_hex(text)",
             "simdb_check_distance(integer)", "simdb_near(bigint, integer)",
             "simdb_similarity(bytea, bytea)", "simdb_band_keys(bytea)", "simdb_check_similarity(real)",
             "simdb_similar(bytea, real)")
VIEWS = ("near_duplicate_pairs", "duplicate_clusters", "batch_summary")


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _run(connection, statement: str) -> None:
    """DDL as written: no parameters, so '%' in PL/pgSQL is not taken for a placeholder."""
    connection.connection.dbapi_connection.execute(statement)


def _simhash_functions(schema: str, rows: dict, errcodes: bool) -> list[str]:
    """The SimHash functions for the layout in ``rows``; ``errcodes``: as of this revision (else as of 0003)."""
    ranges, keys, first, k = rows["block_ranges"], rows["keys"], rows.get("first_key", 0), rows["max_distance"]
    lookups = []
    for i, key in enumerate(keys):
        parts, shift = [], 0
        for block in key:
            start, width = ranges[block]
            part = f"((fingerprint >> {start}) & {(1 << width) - 1})"
            parts.append(f"({part} << {shift})" if shift else part)
            shift += width
        lookups.append(f"                SELECT id, simhash FROM {schema}.documents WHERE key_{first + i} = "
                       + " | ".join(parts))
    lookups = "\n                UNION\n".join(lookups)
    hex_error = ("USING ERRCODE = 'invalid_text_representation',\n                              HINT"
                 if errcodes else "USING HINT")
    distance_error = " USING ERRCODE = 'invalid_parameter_value'" if errcodes else ""
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
                        {hex_error} = 'give up to 16 hex digits, as simdb fingerprint prints them';
                END IF;
                RETURN ('x' || lpad(regexp_replace(hex, '^0x', '', 'i'), 16, '0'))::bit(64)::bigint;
            END $$""",
        f"""CREATE OR REPLACE FUNCTION {schema}.simdb_check_distance(max_distance integer) RETURNS boolean
            LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
            BEGIN
                IF max_distance IS NULL OR max_distance < 0 OR max_distance > {k} THEN
                    RAISE EXCEPTION 'simdb_near: max_distance must be between 0 and {k} (the index''s maximum '
                                    'distance), not %', max_distance{distance_error};
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


def _minhash_functions(schema: str, rows: dict) -> list[str]:
    settings = rows["minhash"]
    width, bands, threshold = 4 * settings["rows"], settings["bands"], settings["threshold"]
    band_key = "('x' || substr(md5(substr(signature, {i} * %d + 1, %d)), 1, 16))::bit(64)::bigint" % (width, width)
    lookups = "\n                UNION\n".join(
        f"                SELECT id, signature AS s FROM {schema}.documents WHERE key_{i} = {band_key.format(i=i)}"
        for i in range(bands))
    return [
        f"""CREATE OR REPLACE FUNCTION {schema}.simdb_similarity(a bytea, b bytea) RETURNS real
            LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
            SELECT count(*) FILTER (WHERE substr(a, 4 * i + 1, 4) = substr(b, 4 * i + 1, 4))::real
                   / (length(a) / 4)
            FROM generate_series(0, length(a) / 4 - 1) AS i
            $$""",
        f"""CREATE OR REPLACE FUNCTION {schema}.simdb_band_keys(signature bytea) RETURNS bigint[]
            LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
            SELECT array_agg({band_key.format(i='i')} ORDER BY i) FROM generate_series(0, {bands - 1}) AS i
            $$""",
        f"""CREATE OR REPLACE FUNCTION {schema}.simdb_check_similarity(min_similarity real) RETURNS boolean
            LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
            BEGIN
                IF min_similarity IS NULL OR min_similarity < {threshold} OR min_similarity > 1 THEN
                    RAISE EXCEPTION 'simdb_similar: min_similarity must be between {threshold} (the index''s '
                                    'threshold) and 1, not %', min_similarity USING ERRCODE = 'invalid_parameter_value';
                END IF;
                RETURN true;
            END $$""",
        f"""CREATE OR REPLACE FUNCTION {schema}.simdb_similar(signature bytea, min_similarity real DEFAULT {threshold})
            RETURNS TABLE (document_id bigint, similarity real)
            LANGUAGE sql STABLE PARALLEL SAFE AS $$
            SELECT c.id, {schema}.simdb_similarity(c.s, signature)
            FROM (
{lookups}
            ) c
            WHERE {schema}.simdb_check_similarity(min_similarity)
              AND {schema}.simdb_similarity(c.s, signature) >= min_similarity
            $$""",
        f"COMMENT ON FUNCTION {schema}.simdb_similarity(bytea, bytea) IS "
        + _literal("Estimated Jaccard similarity of two MinHash signatures: the share of positions where they agree."),
        f"COMMENT ON FUNCTION {schema}.simdb_band_keys(bytea) IS "
        + _literal("The LSH band keys of a signature, as stored in key_0, key_1, ..."),
        f"COMMENT ON FUNCTION {schema}.simdb_similar(bytea, real) IS "
        + _literal(f"Documents whose estimated Jaccard similarity to a signature is at least min_similarity "
                   f"(default and at least {threshold}), found through the band indexes."),
    ]


def _views(schema: str, similarity: str | None) -> list[str]:
    """The views; ``similarity`` is the pairs view's similarity column (None: as of 0003, without one)."""
    column = "" if similarity is None else f", {similarity} AS similarity"
    pairs_comment = ("Every near-duplicate pair found at ingest (a stored first), with both documents' metadata."
                     if similarity is None else
                     "Every near-duplicate pair found at ingest (a stored first), with both documents' metadata. "
                     "distance: differing bits (SimHash) or signature positions (MinHash); similarity: the Jaccard "
                     "estimate (MinHash only).")
    return [
        f"""CREATE OR REPLACE VIEW {schema}.near_duplicate_pairs AS
        SELECT p.a_id, a.external_id AS a_external_id, p.b_id, b.external_id AS b_external_id, p.distance,
               a.content_hash = b.content_hash AS exact, bt.name AS batch, p.found_at,
               a.metadata AS a_metadata, b.metadata AS b_metadata{column}
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
        f"COMMENT ON VIEW {schema}.near_duplicate_pairs IS " + _literal(pairs_comment),
        f"COMMENT ON VIEW {schema}.duplicate_clusters IS "
        + _literal("Groups of near-duplicates (connected components), canonical = earliest document."),
        f"COMMENT ON VIEW {schema}.batch_summary IS "
        + _literal("Per batch: documents, new, exact and near duplicates (against the archive / within the batch), "
                   "already stored, rejected, duration."),
    ]


def _drop_functions_and_views(connection, schema: str) -> None:
    for view in VIEWS:
        connection.exec_driver_sql(f"DROP VIEW IF EXISTS {schema}.{view}")
    for signature in FUNCTIONS:
        connection.exec_driver_sql(f"DROP FUNCTION IF EXISTS {schema}.{signature}")


def upgrade() -> None:
    schema = context.config.attributes["schema"]
    connection = op.get_bind()
    op.alter_column("documents", "simhash", nullable=True)
    op.add_column("documents", sa.Column("signature", sa.LargeBinary))
    op.create_check_constraint("one_sketch", "documents", "(simhash IS NULL) <> (signature IS NULL)")
    op.create_table(
        "idf_terms",
        sa.Column("term", sa.Text, nullable=False),
        sa.Column("documents", sa.Integer, nullable=False),
        sa.PrimaryKeyConstraint("term", name="pk_idf_terms"),
        comment="SimHash with tfidf weighting: sample documents containing each term, frozen at creation "
                "(digest in settings.idf).",
    )
    new_index = context.config.attributes.get("new_index_idf_terms")
    if new_index:
        with connection.connection.dbapi_connection.cursor() as cursor:
            with cursor.copy("COPY idf_terms (term, documents) FROM STDIN") as copy:
                for row in new_index.items():
                    copy.write_row(row)
    rows = dict(connection.execute(sa.text("SELECT name, value FROM settings")).all())
    _drop_functions_and_views(connection, schema)
    if rows.get("method") == "minhash":
        statements = _minhash_functions(schema, rows) + _views(
            schema, f"(1 - p.distance::real / {rows['minhash']['num_perm']})")
    else:
        statements = _simhash_functions(schema, rows, errcodes=True) + _views(schema, "NULL::real")
    for statement in statements:
        _run(connection, statement)


def downgrade() -> None:
    schema = context.config.attributes["schema"]
    connection = op.get_bind()
    rows = dict(connection.execute(sa.text("SELECT name, value FROM settings")).all())
    if rows.get("method") == "minhash" or rows.get("idf"):
        raise RuntimeError("this index uses MinHash or IDF weights, which schema revision 0003 cannot hold; "
                           "it cannot be downgraded")
    _drop_functions_and_views(connection, schema)
    op.drop_table("idf_terms")
    op.drop_constraint("ck_documents_one_sketch", "documents", type_="check")
    op.drop_column("documents", "signature")
    op.alter_column("documents", "simhash", nullable=False)
    for statement in _simhash_functions(schema, rows, errcodes=False) + _views(schema, None):
        _run(connection, statement)
