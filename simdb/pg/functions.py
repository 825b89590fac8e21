"""What analysts query: SQL functions, views and a read-only role.

The functions are the method's (:meth:`simdb.pg.methods.MethodSQL.functions`), written for the
index's key layout, with every table schema-qualified so they work whatever the caller's
``search_path``; migrations create them and ``relayout`` rewrites them. They answer from the key
indexes, never a table scan. Those that read tables run as PL/pgSQL: a SQL function is inlined into
the calling statement and planned with it on every call, and planning the key lookups of every
segment cost 1.9 of 2.2 ms a call at 10M documents, where PL/pgSQL plans its query once per session
(0.57 ms a call; migration 0010).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import sqlalchemy as sa
from psycopg import sql

from ..errors import SimdbError
from ..methods import Method
from .citus import SESSION_SETTINGS
from .keyed import function_keys
from .methods import sql_of
from .plpython import create_placeholders

VIEWS = ("near_duplicate_pairs", "duplicate_clusters", "batch_summary", "document_neighbours", "cluster_members",
         "source_verdicts")

#: The view of each synced source row's verdict (``simdb sync``); migration 0014 creates the same.
SOURCE_VERDICTS = """CREATE OR REPLACE VIEW {schema}.source_verdicts AS
        SELECT DISTINCT ON (b.source, r.external_id) substr(b.source, 6) AS source, r.external_id AS id,
               r.status, r.duplicate_of_external_id AS duplicate_of, r.distance, b.name AS batch,
               r.document_id, r.reason
        FROM {schema}.records r JOIN {schema}.batches b ON b.id = r.batch_id
        WHERE b.source LIKE 'sync %' AND r.external_id IS NOT NULL
        ORDER BY b.source, r.external_id, CASE WHEN r.status IN ('new', 'exact', 'near') THEN 0
                 WHEN r.status = 'already_stored' THEN 1 ELSE 2 END, r.batch_id DESC, r.position DESC"""


SOURCE_VERDICTS_COMMENT = (
    "Per row of each synced source (simdb sync), by its id as text: its latest verdict that stored it (new, exact, "
    "near; else already_stored, else rejected), the id of the earliest near-duplicate, the batch. Join it with the "
    "source table: ON v.source = 'articles' AND v.id = a.id::text.")


def _run(connection: sa.Connection, statement: str) -> None:
    """Execute DDL as written: no parameters, so '%' in PL/pgSQL is not taken for a placeholder."""
    connection.connection.dbapi_connection.execute(statement)


def neighbours_function(schema: str, similarity: str, distributed: bool) -> tuple[str, str, str]:
    """``simdb_neighbours(external_id)``, the same for every method: the ``document_neighbours`` view's rows of one
    document. ``similarity`` is the SQL of the similarity of a pair whose distance is ``pair_distances[i]``.

    On one server it reads the view, through the indexes. On a distributed index Citus planned that query as a
    repartition join of the pairs with both their documents (0.5-5 s a call on a test cluster of 4 shards,
    whatever the index's size): there it runs one statement per step, each of which Citus sends to the shards
    it reads, with no repartition or broadcast (0021): the document by its external id (an index probe per
    shard, as ``documents`` is distributed by ``id``), its pairs from both sides (by ``b_id``, their
    distribution column, and by the primary key's ``a_id``), its neighbours by ``id`` (the shards that hold
    them), and the rows joined from those values on the coordinator."""
    comment = "The near-duplicates of one document (by its external id), earlier and later, with both batches."
    if not distributed:
        return ("simdb_neighbours(text)",
                f"""CREATE OR REPLACE FUNCTION {schema}.simdb_neighbours(external_id text)
            RETURNS SETOF {schema}.document_neighbours
            LANGUAGE sql STABLE PARALLEL SAFE AS $$
            SELECT * FROM {schema}.document_neighbours n WHERE n.external_id = simdb_neighbours.external_id
            $$""", comment)
    return ("simdb_neighbours(text)", ROUTED_NEIGHBOURS.format(schema=schema, similarity=similarity), comment)


#: ``simdb_neighbours`` of a distributed index (see :func:`neighbours_function`); migration 0021 writes the same.
ROUTED_NEIGHBOURS = """CREATE OR REPLACE FUNCTION {schema}.simdb_neighbours(external_id text)
            RETURNS SETOF {schema}.document_neighbours
            LANGUAGE plpgsql STABLE PARALLEL SAFE AS $$
            DECLARE
                me record;
                pair record;
                neighbour record;
                found {schema}.document_neighbours;
                pair_neighbours bigint[];
                pair_distances smallint[];
                pair_found timestamptz[];
                i integer;
            BEGIN
                -- one statement a step, each sent to the shards it reads, rows and no aggregate back: no repartition
                -- join (0021). A document's pairs and its neighbours come in the order of the neighbours' ids, and
                -- are matched walking both (every neighbour is one of the pairs').
                FOR me IN SELECT d.id, d.external_id, b.name AS batch
                          FROM {schema}.documents d JOIN {schema}.batches b ON b.id = d.batch_id
                          WHERE d.external_id = simdb_neighbours.external_id LOOP
                    pair_neighbours := '{{}}'; pair_distances := '{{}}'; pair_found := '{{}}';
                    FOR pair IN SELECT CASE WHEN p.b_id = me.id THEN p.a_id ELSE p.b_id END AS neighbour,
                                       p.distance, p.found_at
                                FROM {schema}.near_duplicates p WHERE p.b_id = me.id OR p.a_id = me.id
                                ORDER BY 1 LOOP
                        pair_neighbours := pair_neighbours || pair.neighbour;
                        pair_distances := pair_distances || pair.distance;
                        pair_found := pair_found || pair.found_at;
                    END LOOP;
                    CONTINUE WHEN cardinality(pair_neighbours) = 0;
                    i := 1;
                    FOR neighbour IN SELECT o.id, o.external_id, ob.name AS batch
                                     FROM {schema}.documents o JOIN {schema}.batches ob ON ob.id = o.batch_id
                                     WHERE o.id = ANY(pair_neighbours) ORDER BY o.id LOOP
                        WHILE pair_neighbours[i] < neighbour.id LOOP
                            i := i + 1;
                        END LOOP;
                        found.document_id := me.id;
                        found.external_id := me.external_id;
                        found.batch := me.batch;
                        found.neighbour_id := neighbour.id;
                        found.neighbour_external_id := neighbour.external_id;
                        found.neighbour_batch := neighbour.batch;
                        found.neighbour_is_earlier := neighbour.id < me.id;
                        found.distance := pair_distances[i];
                        found.similarity := {similarity};
                        found.found_at := pair_found[i];
                        RETURN NEXT found;
                    END LOOP;
                END LOOP;
            END $$"""


_SQL_BODY = re.compile(r"LANGUAGE sql STABLE PARALLEL SAFE AS \$\$(.*)\$\$\s*$", re.S)


#: The SQL functions that stay SQL on one server: inlined into the query of the PL/pgSQL function that calls
#: them, which keeps that plan for the session (:func:`simdb.pg.methods.base.lookup_functions`).
INLINED = ("simdb_lookup(",)


def as_plpgsql(statement: str, parallel_safe: bool = False) -> str:
    """A ``LANGUAGE sql`` set-returning function that reads tables, rewritten in PL/pgSQL (one written in
    PL/pgSQL keeps its body, and is parallel safe only where ``parallel_safe``): Citus cannot plan a
    SQL function's parameterised statements against distributed tables, and plans PL/pgSQL's with their
    values; on one server, PL/pgSQL keeps the plan for the session where a SQL function is planned on every
    call, except where its callers inline it (:data:`INLINED`). A column still wins over a parameter of the same
    name, as in SQL functions."""
    attributes = "STABLE PARALLEL SAFE" if parallel_safe else "STABLE"
    statement = statement.replace("LANGUAGE plpgsql STABLE PARALLEL SAFE AS", f"LANGUAGE plpgsql {attributes} AS")
    if not parallel_safe:  # distributed: Citus plans no generic plan's parameters, only PL/pgSQL's values
        statement = statement.replace(" SET plan_cache_mode = force_generic_plan", "")
    elif any(f".{name}" in statement.split("\n", 1)[0] for name in INLINED):
        return statement
    return _SQL_BODY.sub(lambda m: f"LANGUAGE plpgsql {attributes} AS $$\n#variable_conflict use_column\nBEGIN\n"
                                   f"RETURN QUERY {m.group(1).strip()};\nEND $$", statement)


def _create_function(connection: sa.Connection, schema: str, function: tuple[str, str, str],
                     distributed: bool) -> None:
    """One ``(signature, CREATE statement, comment)`` function; one that reads tables in PL/pgSQL (parallel
    safe where the index is not ``distributed``)."""
    signature, statement, comment = function
    _run(connection, as_plpgsql(statement, parallel_safe=not distributed))
    if comment:
        _run(connection, f"COMMENT ON FUNCTION {schema}.{signature} IS " + sql.Literal(comment).as_string())


def create_functions(connection: sa.Connection, schema: str, method: Method, *, distributed: bool,
                     keyed: bool = False) -> None:
    """The method's analysts' functions, written for its current key layout (and for a ``distributed`` index; a
    ``keyed`` one's lookups read its keys table, :func:`simdb.pg.keyed.function_keys`)."""
    keys = function_keys(method) if keyed else None
    for function in sql_of(method).functions(schema, one_statement=distributed, keys=keys):
        _create_function(connection, schema, function, distributed)


def pairs_view(schema: str, similarity: str, distributed: bool) -> str:
    """``near_duplicate_pairs``. Each column of a pair's documents is a subquery by the document's primary key,
    which PostgreSQL computes only where a query reads the column (a view's unread output is left out, where a
    join to the partitioned documents table cannot be): the similarity histogram reads ``near_duplicates`` and
    ``batches`` alone (it joined both documents of every pair: 1.2-1.8 s at 1M documents, 5-10 ms from the
    table), and a query of a batch's pairs reads the documents of those pairs only. Citus plans no subquery of a
    distributed table that is not joined on its distribution column: a distributed index's view joins."""
    if distributed:
        return f"""CREATE OR REPLACE VIEW {schema}.near_duplicate_pairs AS
        SELECT p.a_id, a.external_id AS a_external_id, p.b_id, b.external_id AS b_external_id, p.distance,
               a.content_hash = b.content_hash AS exact, bt.name AS batch, ab.name AS a_batch, bt.name AS b_batch,
               p.found_at,
               a.metadata AS a_metadata, b.metadata AS b_metadata, {similarity} AS similarity,
               a.text AS a_text, b.text AS b_text
        FROM {schema}.near_duplicates p
        JOIN {schema}.documents a ON a.id = p.a_id
        JOIN {schema}.documents b ON b.id = p.b_id
        JOIN {schema}.batches ab ON ab.id = a.batch_id
        JOIN {schema}.batches bt ON bt.id = p.batch_id"""

    def of(column: str, side: str) -> str:
        return f"(SELECT d.{column} FROM {schema}.documents d WHERE d.id = p.{side}_id)"

    return f"""CREATE OR REPLACE VIEW {schema}.near_duplicate_pairs AS
        SELECT p.a_id, {of("external_id", "a")} AS a_external_id, p.b_id, {of("external_id", "b")} AS b_external_id,
               p.distance, (SELECT a.content_hash = b.content_hash FROM {schema}.documents a, {schema}.documents b
                            WHERE a.id = p.a_id AND b.id = p.b_id) AS exact, bt.name AS batch,
               (SELECT ab.name FROM {schema}.documents d JOIN {schema}.batches ab ON ab.id = d.batch_id
                WHERE d.id = p.a_id) AS a_batch, bt.name AS b_batch, p.found_at,
               {of("metadata", "a")} AS a_metadata, {of("metadata", "b")} AS b_metadata, {similarity} AS similarity,
               {of("text", "a")} AS a_text, {of("text", "b")} AS b_text
        FROM {schema}.near_duplicates p
        JOIN {schema}.batches bt ON bt.id = p.batch_id"""


def create_views(connection: sa.Connection, schema: str, method: Method, *, distributed: bool) -> None:
    """The views, ``simdb_neighbours`` (it returns a view's rows) and the lookups of a typed-in text, with
    ``simdb_sketch`` a placeholder until ``simdb sql-functions`` (:mod:`simdb.pg.plpython`), written for a
    ``distributed`` index or not."""
    similarity = sql_of(method).similarity_sql("p.distance")
    connection.exec_driver_sql(pairs_view(schema, similarity, distributed))
    connection.exec_driver_sql(f"""
        CREATE OR REPLACE VIEW {schema}.duplicate_clusters AS
        SELECT k.cluster_id, c.external_id AS canonical_id, k.size, k.first_seen, k.last_seen, k.batches,
               c.text AS canonical_text, k.min_similarity
        FROM {schema}.clusters k
        JOIN {schema}.documents c ON c.id = k.cluster_id""")
    side = ("SELECT p.{me}_id AS document_id, {me}.external_id, {me}b.name AS batch, p.{other}_id AS neighbour_id, "
            "{other}.external_id AS neighbour_external_id, {other}b.name AS neighbour_batch, {earlier} AS "
            "neighbour_is_earlier, p.distance, {similarity} AS similarity, p.found_at "
            f"FROM {schema}.near_duplicates p JOIN {schema}.documents a ON a.id = p.a_id "
            f"JOIN {schema}.batches ab ON ab.id = a.batch_id JOIN {schema}.documents b ON b.id = p.b_id "
            f"JOIN {schema}.batches bb ON bb.id = b.batch_id")
    connection.exec_driver_sql(
        f"CREATE OR REPLACE VIEW {schema}.document_neighbours AS "
        + side.format(me="b", other="a", earlier="true", similarity=similarity) + " UNION ALL "
        + side.format(me="a", other="b", earlier="false", similarity=similarity))
    to_canonical = sql_of(method).similarity_between_sql(schema, "d", "c")
    connection.exec_driver_sql(f"""
        CREATE OR REPLACE VIEW {schema}.cluster_members AS
        SELECT d.cluster_id, c.external_id AS canonical_id, k.size AS cluster_size, d.id AS document_id,
               d.external_id, b.name AS batch, d.created_at, d.duplicate_of, d.duplicate_distance,
               {to_canonical} AS similarity_to_canonical,
               k.min_similarity AS cluster_min_similarity, d.text
        FROM {schema}.clusters k
        JOIN {schema}.documents d ON d.cluster_id = k.cluster_id
        JOIN {schema}.documents c ON c.id = k.cluster_id
        JOIN {schema}.batches b ON b.id = d.batch_id""")
    connection.exec_driver_sql(f"""
        CREATE OR REPLACE VIEW {schema}.batch_summary AS
        SELECT b.id AS batch_id, b.name, b.source, b.status, b.started_at, b.finished_at,
               b.finished_at - b.started_at AS duration, b.documents, b.new, b.exact_duplicates,
               b.near_duplicates, b.exact_duplicates + b.near_duplicates - b.within_batch AS against_archive,
               b.within_batch, b.already_stored, b.rejected
        FROM {schema}.batches b""")
    _run(connection, SOURCE_VERDICTS.format(schema=schema))
    _create_function(connection, schema,  # it returns a view's rows: after the views
                     neighbours_function(schema, sql_of(method).similarity_sql("pair_distances[i]"), distributed),
                     distributed)
    for view, comment in {
        "near_duplicate_pairs": "Every near-duplicate pair found at ingest (a stored first), with both documents' "
                                "metadata, batches (a_batch, b_batch; batch is b_batch) and, where the index keeps "
                                "them, texts. distance: differing bits (SimHash), signature positions (MinHash) or "
                                "ten-thousandths of Jaccard distance (MinHash deciding exactly); similarity (double "
                                "precision, the same in every function and view): 1 - distance / 64 (SimHash), the "
                                "Jaccard estimate or the exact Jaccard (MinHash).",
        "duplicate_clusters": "Groups of near-duplicates (connected components), canonical = earliest document, "
                              "with its text where the index keeps texts, and the smallest similarity of a member "
                              "to the canonical (min_similarity); read from the clusters table.",
        "document_neighbours": "Every stored pair from both sides: each document with each of its near-duplicates, "
                               "both batches, whether the neighbour came earlier, distance and similarity.",
        "cluster_members": "The members of every cluster of two or more, each with its similarity to the "
                           "cluster's canonical (earliest) document as the sketches estimate it, and the smallest "
                           "such similarity in its cluster: how far the cluster has spread.",
        "batch_summary": "Per batch: documents, new, exact and near duplicates (against the archive / within "
                         "the batch), already stored, rejected, duration.",
        "source_verdicts": SOURCE_VERDICTS_COMMENT,
    }.items():
        _run(connection, sql.SQL("COMMENT ON VIEW {}.{} IS {}").format(
            sql.Identifier(schema), sql.Identifier(view), sql.Literal(comment)).as_string())
    create_placeholders(connection, schema, method)


def drop_functions_and_views(connection: sa.Connection, schema: str) -> None:
    connection.exec_driver_sql(f"DROP FUNCTION IF EXISTS {schema}.simdb_neighbours(text)")  # it needs a view
    for view in VIEWS:
        connection.exec_driver_sql(f"DROP VIEW IF EXISTS {schema}.{view}")
    for function in connection.execute(sa.text(
            "SELECT quote_ident(n.nspname) || '.' || quote_ident(p.proname) || '(' "
            "|| pg_get_function_identity_arguments(p.oid) || ')' FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
            "WHERE n.nspname = :schema AND p.proname LIKE 'simdb\\_%'"), {"schema": schema}).scalars():
        connection.exec_driver_sql(f"DROP FUNCTION IF EXISTS {function}")


_ROLE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


@dataclass(frozen=True)
class Grant:
    """What ``grant_reader`` did: whether it created the role, and whether the role can log in now."""

    created: bool
    login: bool


def grant_reader(connection: sa.Connection, schema: str, role: str, *, login: bool | None = None,
                 password: str | None = None, distributed: bool) -> Grant:
    """Create (or update) a role that can read the index and nothing more.

    ``login`` True or False gives or takes the role's LOGIN; None leaves an existing role's as it is (a new
    role is then a group role, NOLOGIN)."""
    if not _ROLE.match(role):
        raise SimdbError(f"invalid role name {role!r}: use lower-case letters, digits and underscores")
    if role in ("postgres", connection.exec_driver_sql("SELECT current_user").scalar_one()):
        raise SimdbError(f"refusing to make {role!r} read-only: it is an administrative role")
    created = not connection.execute(sa.text("SELECT 1 FROM pg_roles WHERE rolname = :r"), {"r": role}).first()
    raw = connection.connection.dbapi_connection
    options = []  # nothing to change in an existing role unless asked
    if login is not None or created:
        options.append(sql.SQL("LOGIN" if login else "NOLOGIN"))
    if password is not None:
        options.append(sql.SQL("PASSWORD {}").format(sql.Literal(password)))
    if options:
        with raw.cursor() as cursor:
            cursor.execute(sql.SQL("{} {} {}").format(sql.SQL("CREATE ROLE" if created else "ALTER ROLE"),
                                                      sql.Identifier(role), sql.SQL(" ").join(options)))
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
    settings = [sql.SQL("default_transaction_read_only = on"),
                sql.SQL("search_path = {}").format(sql.SQL(", ").join(
                    [*map(sql.Identifier, path), sql.Identifier("public")]))]
    if distributed:  # e.g. the views' joins of a pair with its earlier document (simdb.pg.citus)
        settings += [sql.SQL("{} = {}").format(sql.Identifier(*name.split(".")), sql.Literal(value))
                     for name, value in SESSION_SETTINGS.items()]
    with raw.cursor() as cursor:
        for setting in settings:
            cursor.execute(sql.SQL("ALTER ROLE {} IN DATABASE {} SET ").format(
                sql.Identifier(role), sql.Identifier(database)) + setting)
    can_login = connection.execute(sa.text("SELECT rolcanlogin FROM pg_roles WHERE rolname = :r"),
                                   {"r": role}).scalar_one()
    return Grant(created=created, login=can_login)


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
