"""What analysts query: SQL functions, views and a read-only role.

The functions are the method's (:meth:`simdb.methods.Method.sql_functions`), written for the
index's key layout, with every table schema-qualified so they work whatever the caller's
``search_path``; migrations create them and ``relayout`` rewrites them. They are plain SQL
functions, so PostgreSQL inlines them into the calling query and answers from the key indexes,
never a table scan.
"""

from __future__ import annotations

import re

import sqlalchemy as sa
from psycopg import sql

from ..errors import SimdbError
from ..methods import Method

VIEWS = ("near_duplicate_pairs", "duplicate_clusters", "batch_summary")


def _run(connection: sa.Connection, statement: str) -> None:
    """Execute DDL as written: no parameters, so '%' in PL/pgSQL is not taken for a placeholder."""
    connection.connection.dbapi_connection.execute(statement)


def create_functions(connection: sa.Connection, schema: str, method: Method) -> None:
    """The method's analysts' functions, written for its current key layout."""
    for signature, statement, comment in method.sql_functions(schema):
        _run(connection, statement)
        if comment:
            _run(connection, f"COMMENT ON FUNCTION {schema}.{signature} IS " + sql.Literal(comment).as_string())


def create_views(connection: sa.Connection, schema: str, method: Method) -> None:
    similarity = method.similarity_sql("p.distance")
    connection.exec_driver_sql(f"""
        CREATE OR REPLACE VIEW {schema}.near_duplicate_pairs AS
        SELECT p.a_id, a.external_id AS a_external_id, p.b_id, b.external_id AS b_external_id, p.distance,
               a.content_hash = b.content_hash AS exact, bt.name AS batch, p.found_at,
               a.metadata AS a_metadata, b.metadata AS b_metadata, {similarity} AS similarity,
               a.text AS a_text, b.text AS b_text
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
                                "metadata and, where the index keeps them, texts. distance: differing bits "
                                "(SimHash), signature positions (MinHash) or ten-thousandths of Jaccard distance "
                                "(MinHash deciding exactly); similarity: 1 - distance / 64 (SimHash), the Jaccard "
                                "estimate or the exact Jaccard (MinHash).",
        "duplicate_clusters": "Groups of near-duplicates (connected components), canonical = earliest document.",
        "batch_summary": "Per batch: documents, new, exact and near duplicates (against the archive / within "
                         "the batch), already stored, rejected, duration.",
    }.items():
        _run(connection, sql.SQL("COMMENT ON VIEW {}.{} IS {}").format(
            sql.Identifier(schema), sql.Identifier(view), sql.Literal(comment)).as_string())


def drop_functions_and_views(connection: sa.Connection, schema: str) -> None:
    for view in VIEWS:
        connection.exec_driver_sql(f"DROP VIEW IF EXISTS {schema}.{view}")
    for function in connection.execute(sa.text(
            "SELECT quote_ident(n.nspname) || '.' || quote_ident(p.proname) || '(' "
            "|| pg_get_function_identity_arguments(p.oid) || ')' FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
            "WHERE n.nspname = :schema AND p.proname LIKE 'simdb\\_%'"), {"schema": schema}).scalars():
        connection.exec_driver_sql(f"DROP FUNCTION IF EXISTS {function}")


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
    ):
        connection.exec_driver_sql(statement)
    # the role's settings hold in this database only (another database on the server may be none of simdb's),
    # and its search_path keeps every schema granted here before, adding this one
    database = connection.exec_driver_sql("SELECT current_database()").scalar_one()
    path = [name for name in _role_search_path(connection, role) if name != "public"]
    path = [*path, schema] if schema not in path else path
    with raw.cursor() as cursor:
        for setting in (sql.SQL("default_transaction_read_only = on"),
                        sql.SQL("search_path = {}").format(sql.SQL(", ").join(
                            [*map(sql.Identifier, path), sql.Identifier("public")]))):
            cursor.execute(sql.SQL("ALTER ROLE {} IN DATABASE {} SET ").format(
                sql.Identifier(role), sql.Identifier(database)) + setting)
    return created


def _role_search_path(connection: sa.Connection, role: str) -> list[str]:
    """The schemas of ``role``'s search_path setting in this database (empty if it has none)."""
    settings = connection.execute(sa.text(
        "SELECT s.setconfig FROM pg_db_role_setting s JOIN pg_roles r ON r.oid = s.setrole "
        "JOIN pg_database d ON d.oid = s.setdatabase WHERE r.rolname = :role AND d.datname = current_database()"),
        {"role": role}).scalar() or []
    for setting in settings:
        name, _, value = setting.partition("=")
        if name == "search_path":
            return [part.strip().strip('"') for part in value.split(",") if part.strip()]
    return []
