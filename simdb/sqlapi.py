"""What analysts query: SQL functions, views and a read-only role.

The functions are written for the index's layout (``simdb_near`` joins on its
key columns), with every table schema-qualified so they work whatever the
caller's ``search_path``; migrations create them and ``relayout`` rewrites
them. ``simdb_near`` is a plain SQL function, so PostgreSQL inlines it into
the calling query and answers from the block-key indexes, never a table scan.
"""

from __future__ import annotations

import re

import sqlalchemy as sa
from psycopg import sql

from .blocks import BlockLayout
from .errors import SimdbError
from .minhash import MinHashSettings

FUNCTIONS = ("simdb_hamming(bigint, bigint)", "simdb_fingerprint_hex(bigint)", "simdb_fingerprint_from_hex(text)",
             "simdb_check_distance(integer)", "simdb_near(bigint, integer)",
             "simdb_similarity(bytea, bytea)", "simdb_band_keys(bytea)", "simdb_check_similarity(real)",
             "simdb_similar(bytea, real)")
VIEWS = ("near_duplicate_pairs", "duplicate_clusters", "batch_summary")


def _run(connection: sa.Connection, statement: str) -> None:
    """Execute DDL as written: no parameters, so '%' in PL/pgSQL is not taken for a placeholder."""
    connection.connection.dbapi_connection.execute(statement)


def create_functions(connection: sa.Connection, schema: str, layout: BlockLayout | MinHashSettings) -> None:
    from .relayout import key_expression

    if isinstance(layout, MinHashSettings):
        _create_minhash_functions(connection, schema, layout)
        return
    k = layout.max_distance
    statements = [
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
                        USING ERRCODE = 'invalid_text_representation',
                              HINT = 'give up to 16 hex digits, as simdb fingerprint prints them';
                END IF;
                RETURN ('x' || lpad(regexp_replace(hex, '^0x', '', 'i'), 16, '0'))::bit(64)::bigint;
            END $$""",
        f"""CREATE OR REPLACE FUNCTION {schema}.simdb_check_distance(max_distance integer) RETURNS boolean
            LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
            BEGIN
                IF max_distance IS NULL OR max_distance < 0 OR max_distance > {k} THEN
                    RAISE EXCEPTION 'simdb_near: max_distance must be between 0 and {k} (the index''s maximum '
                                    'distance), not %', max_distance USING ERRCODE = 'invalid_parameter_value';
                END IF;
                RETURN true;
            END $$""",
    ]
    lookups = "\n                UNION\n".join(
        f"                SELECT id, simhash FROM {schema}.documents WHERE {column} = {key_expression(layout, i, 'fingerprint')}"
        for i, column in enumerate(layout.key_columns))
    statements.append(
        f"""CREATE OR REPLACE FUNCTION {schema}.simdb_near(fingerprint bigint, max_distance integer DEFAULT {k})
            RETURNS TABLE (document_id bigint, distance integer)
            LANGUAGE sql STABLE PARALLEL SAFE AS $$
            SELECT c.id, bit_count((c.simhash # fingerprint)::bit(64))::integer
            FROM (
{lookups}
            ) c
            WHERE {schema}.simdb_check_distance(max_distance)
              AND bit_count((c.simhash # fingerprint)::bit(64)) <= max_distance
            $$""")
    comments = {
        "simdb_hamming(bigint, bigint)": "Bits in which two stored fingerprints differ.",
        "simdb_fingerprint_hex(bigint)": "A stored fingerprint as the 16 hex digits the simdb CLI prints.",
        "simdb_fingerprint_from_hex(text)": "The stored (signed BIGINT) form of a fingerprint given in hex.",
        "simdb_near(bigint, integer)": f"Documents within max_distance (default and at most {k}) bits of a "
                                       "fingerprint, found through the block-key indexes.",
    }
    for statement in statements:
        _run(connection, statement)
    for signature, comment in comments.items():
        _run(connection, f"COMMENT ON FUNCTION {schema}.{signature} IS " + sql.Literal(comment).as_string())


def _create_minhash_functions(connection: sa.Connection, schema: str, settings: MinHashSettings) -> None:
    width, bands, threshold = 4 * settings.rows, settings.bands, settings.threshold
    band_key = "('x' || substr(md5(substr(signature, {i} * %d + 1, %d)), 1, 16))::bit(64)::bigint" % (width, width)
    lookups = "\n                UNION\n".join(
        f"                SELECT id, signature AS s FROM {schema}.documents WHERE {column} = {band_key.format(i=i)}"
        for i, column in enumerate(settings.key_columns))
    statements = [
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
    ]
    comments = {
        "simdb_similarity(bytea, bytea)": "Estimated Jaccard similarity of two MinHash signatures: the share of "
                                          "positions where they agree.",
        "simdb_band_keys(bytea)": "The LSH band keys of a signature, as stored in key_0, key_1, ...",
        "simdb_similar(bytea, real)": f"Documents whose estimated Jaccard similarity to a signature is at least "
                                      f"min_similarity (default and at least {threshold}), found through the band "
                                      "indexes.",
    }
    for statement in statements:
        _run(connection, statement)
    for signature, comment in comments.items():
        _run(connection, f"COMMENT ON FUNCTION {schema}.{signature} IS " + sql.Literal(comment).as_string())


def create_views(connection: sa.Connection, schema: str, layout: BlockLayout | MinHashSettings | None = None) -> None:
    similarity = (f"(1 - p.distance::real / {layout.num_perm})" if isinstance(layout, MinHashSettings)
                  else "NULL::real")
    connection.exec_driver_sql(f"""
        CREATE OR REPLACE VIEW {schema}.near_duplicate_pairs AS
        SELECT p.a_id, a.external_id AS a_external_id, p.b_id, b.external_id AS b_external_id, p.distance,
               a.content_hash = b.content_hash AS exact, bt.name AS batch, p.found_at,
               a.metadata AS a_metadata, b.metadata AS b_metadata, {similarity} AS similarity
        FROM {schema}.near_duplicates p
        JOIN {schema}.documents a ON a.id = p.a_id
        JOIN {schema}.documents b ON b.id = p.b_id
        JOIN {schema}.batches bt ON bt.id = p.batch_id""")
    connection.exec_driver_sql(f"""
        CREATE OR REPLACE VIEW {schema}.duplicate_clusters AS
        SELECT d.cluster_id, c.external_id AS canonical_id, count(*) AS size,
               min(d.created_at) AS first_seen, max(d.created_at) AS last_seen,
               array_agg(DISTINCT b.name) AS batches
        FROM {schema}.documents d
        JOIN {schema}.documents c ON c.id = d.cluster_id
        JOIN {schema}.batches b ON b.id = d.batch_id
        GROUP BY d.cluster_id, c.external_id
        HAVING count(*) > 1""")
    connection.exec_driver_sql(f"""
        CREATE OR REPLACE VIEW {schema}.batch_summary AS
        SELECT b.id AS batch_id, b.name, b.source, b.status, b.started_at, b.finished_at,
               b.finished_at - b.started_at AS duration, b.documents, b.new, b.exact_duplicates,
               b.near_duplicates, b.exact_duplicates + b.near_duplicates - b.within_batch AS against_archive,
               b.within_batch, b.already_stored, b.rejected
        FROM {schema}.batches b""")
    for view, comment in {
        "near_duplicate_pairs": "Every near-duplicate pair found at ingest (a stored first), with both documents' "
                                "metadata. distance: differing bits (SimHash) or signature positions (MinHash); "
                                "similarity: the Jaccard estimate (MinHash only).",
        "duplicate_clusters": "Groups of near-duplicates (connected components), canonical = earliest document.",
        "batch_summary": "Per batch: documents, new, exact and near duplicates (against the archive / within "
                         "the batch), already stored, rejected, duration.",
    }.items():
        _run(connection, sql.SQL("COMMENT ON VIEW {}.{} IS {}").format(
            sql.Identifier(schema), sql.Identifier(view), sql.Literal(comment)).as_string())


def drop_functions_and_views(connection: sa.Connection, schema: str) -> None:
    for view in VIEWS:
        connection.exec_driver_sql(f"DROP VIEW IF EXISTS {schema}.{view}")
    for signature in FUNCTIONS:
        connection.exec_driver_sql(f"DROP FUNCTION IF EXISTS {schema}.{signature}")


_ROLE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def grant_reader(connection: sa.Connection, schema: str, role: str, *, login: bool = False,
                 password: str | None = None) -> bool:
    """Create (or update) a role that can read the index and nothing more; returns True if it was created."""
    if not _ROLE.match(role):
        raise SimdbError(f"invalid role name {role!r}: use lower-case letters, digits and underscores")
    if role in ("postgres", connection.exec_driver_sql("SELECT current_user").scalar_one()):
        raise SimdbError(f"refusing to make {role!r} read-only: it is an administrative role")
    created = not connection.execute(sa.text("SELECT 1 FROM pg_roles WHERE rolname = :r"), {"r": role}).first()
    raw = connection.connection.dbapi_connection
    options = sql.SQL(" LOGIN" if login else " NOLOGIN")
    if password is not None:
        options += sql.SQL(" PASSWORD {}").format(sql.Literal(password))
    verb = sql.SQL("CREATE ROLE" if created else "ALTER ROLE")
    with raw.cursor() as cursor:
        cursor.execute(verb + sql.SQL(" {}").format(sql.Identifier(role)) + options)
    for statement in (
        f"GRANT USAGE ON SCHEMA {schema} TO {role}",
        f"GRANT SELECT ON ALL TABLES IN SCHEMA {schema} TO {role}",
        f"GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA {schema} TO {role}",
        f"ALTER DEFAULT PRIVILEGES IN SCHEMA {schema} GRANT SELECT ON TABLES TO {role}",
        f"REVOKE CREATE ON SCHEMA {schema} FROM {role}",
        f"ALTER ROLE {role} SET default_transaction_read_only = on",
        f"ALTER ROLE {role} SET search_path = {schema}, public",
    ):
        connection.exec_driver_sql(statement)
    return created
