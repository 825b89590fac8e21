"""A distributed index: the same tables on a Citus cluster (``simdb init --distributed``).

Citus is distributed PostgreSQL: a coordinator holds the catalog and plans every statement, workers
hold the rows in shards. simdb's tables keep their shape; :func:`distribute` makes them Citus tables
right after :func:`simdb.pg.catalog.create_index` creates them, in the same transaction:

- ``documents`` (partitioned into segments) is hash-distributed by ``id``: every segment, present or
  future, is split into the same ``shards`` by the same hash, each shard with its own key indexes. A
  chunk's candidate join ships the staged probes to every worker (an intermediate result per key
  column: each probe's id, fingerprint and key, 24 bytes) and each shard joins them against its own key
  indexes, all workers at once; the archive's rows never leave their workers, only the candidate pairs
  come back.
- ``near_duplicates`` is distributed by ``b_id`` and ``clusters`` by ``cluster_id``, co-located with
  ``documents`` (a pair lives beside its later document, a cluster row beside its earliest one);
  ``records`` by ``batch_id`` (a batch's verdicts are read and removed together).
- ``settings``, ``batches``, ``idf_terms`` and ``field_counts`` are small and read by every statement (or
  whole): reference tables, a copy on every node.

The analysts' functions and views are made after, as Citus distributes only tables nothing depends
on. Writes run in ``citus.multi_shard_modify_mode = sequential`` (one
connection per worker): the tables keep their foreign keys to ``batches``, and Citus can keep those
consistent only over one connection per node. Joins of a pair with its earlier document (not co-located:
``a_id`` is not the pair's distribution column) are repartition joins, which Citus runs only when
``citus.enable_repartition_joins`` is on; every connection of the index, and the role ``grant-reader``
makes, has it on. The ``distributed`` settings row records the shard
count; :func:`check` refuses to open a distributed index on a server without Citus, or one whose
tables are no longer distributed.
"""

from __future__ import annotations


import sqlalchemy as sa

from ..errors import IncompatibleIndex, SimdbError
from ..methods import Method
from .methods import sql_of


REFERENCE_TABLES = ("settings", "batches", "idf_terms", "field_counts")
#: (table, distribution column), co-located with documents by the document id they hold.
COLOCATED_TABLES = (("documents", "id"), ("near_duplicates", "b_id"), ("clusters", "cluster_id"))
OTHER_TABLES = (("records", "batch_id"),)

#: Set on every connection of a distributed index (see the module's docstring).
SESSION_SETTINGS = {"citus.multi_shard_modify_mode": "sequential", "citus.enable_repartition_joins": "on"}


def citus_version(connection: sa.Connection) -> str | None:
    """The Citus extension's version in this database, or None when it has none."""
    return connection.execute(sa.text("SELECT extversion FROM pg_extension WHERE extname = 'citus'")).scalar()


def workers(connection: sa.Connection) -> int:
    """Active worker nodes of the cluster (the coordinator not counted)."""
    return connection.execute(sa.text(
        "SELECT count(*) FROM pg_dist_node WHERE isactive AND noderole = 'primary' AND groupid <> 0")).scalar_one()


def check_shards(shards: int) -> int:
    if not isinstance(shards, int) or isinstance(shards, bool) or not 1 <= shards <= 4096:
        raise SimdbError(f"the shard count must be a whole number from 1 to 4096, not {shards!r}")
    return shards


def require_citus(connection: sa.Connection, where: str) -> str:
    """The Citus version of a coordinator with at least one worker; else a clear error."""
    version = citus_version(connection)
    if version is None:
        raise SimdbError(f"{where} has no Citus extension: a distributed index needs a Citus coordinator "
                         "(CREATE EXTENSION citus, with citus in shared_preload_libraries), or leave out "
                         "«distributed» for an index on this one server")
    if not workers(connection):
        raise SimdbError(f"the Citus coordinator {where} has no active worker nodes; add them with "
                         "citus_add_node() first")
    return version


def distribute(connection: sa.Connection, schema: str, shards: int) -> None:
    """Make a new index's tables Citus tables (see the module's docstring), inside the transaction that
    created them, before the functions and views that read them are made."""
    set_session(connection)
    tables = [*REFERENCE_TABLES, *(t for t, _ in COLOCATED_TABLES + OTHER_TABLES)]
    comments = dict(connection.execute(sa.text(  # Citus drops some tables' comments as it distributes them
        "SELECT t, obj_description(CAST(t AS regclass), 'pg_class') FROM unnest(CAST(:tables AS text[])) t"),
        {"tables": tables}).all())
    for table in REFERENCE_TABLES:
        connection.execute(sa.text("SELECT create_reference_table(CAST(:t AS regclass))"),
                           {"t": f"{schema}.{table}"})
    for position, (table, column) in enumerate(COLOCATED_TABLES):
        placement = "shard_count => :n, colocate_with => 'none'" if position == 0 else "colocate_with => :w"
        connection.execute(sa.text(f"SELECT create_distributed_table(CAST(:t AS regclass), :c, {placement})"),
                           {"t": f"{schema}.{table}", "c": column, "n": shards, "w": f"{schema}.documents"})
    for table, column in OTHER_TABLES:
        connection.execute(sa.text(
            "SELECT create_distributed_table(CAST(:t AS regclass), :c, shard_count => :n, colocate_with => 'none')"),
            {"t": f"{schema}.{table}", "c": column, "n": shards})
    for table, comment in comments.items():
        if comment is not None:
            connection.exec_driver_sql(f"COMMENT ON TABLE {table} IS " + _literal(comment))


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def distribute_like_documents(connection: sa.Connection, table: str) -> None:
    """Shard a new, empty segment table as ``documents`` is (co-located with it), so that it can be filled on
    the workers and attached."""
    connection.execute(sa.text("SELECT create_distributed_table(CAST(:t AS regclass), 'id', colocate_with => :w)"),
                       {"t": f'"{table}"', "w": _qualified(connection, "documents")})


def _qualified(connection: sa.Connection, table: str) -> str:
    return connection.execute(sa.text("SELECT CAST(CAST(:t AS regclass) AS text)"), {"t": table}).scalar_one()


def set_session(connection: sa.Connection) -> None:
    for name, value in SESSION_SETTINGS.items():
        connection.execute(sa.text("SELECT set_config(:name, :value, false)"), {"name": name, "value": value})


def check(connection: sa.Connection, schema: str, where: str, *, upgrading: bool = False) -> None:
    """On opening a distributed index: Citus is here and its tables are still distributed. ``upgrading``: the
    index is at an earlier revision, whose upgrade makes (and distributes) the tables it does not have yet, so
    only the tables it has are checked (the check is made again after the upgrade)."""
    require_citus(connection, where)
    distributed = set(connection.execute(sa.text(
        "SELECT c.relname FROM pg_dist_partition p JOIN pg_class c ON c.oid = p.logicalrelid "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = :schema"), {"schema": schema}).scalars())
    expected = [*REFERENCE_TABLES, *(t for t, _ in COLOCATED_TABLES + OTHER_TABLES)]
    if upgrading:
        present = set(connection.execute(sa.text(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = :schema AND c.relkind IN ('r', 'p')"), {"schema": schema}).scalars())
        expected = [t for t in expected if t in present]
    missing = [t for t in expected if t not in distributed]
    if missing:
        raise IncompatibleIndex(f"the index in schema {schema!r} is distributed, yet its tables {missing} are not "
                                "Citus tables on this coordinator; open it on the coordinator that holds it")


#: The tables whose rows make an index, in the order they are copied (foreign keys point backwards).
COPIED_TABLES = ("batches", "documents", "near_duplicates", "clusters", "records", "field_counts")


def copy_rows(connection: sa.Connection, source: str, target: str, method: Method) -> dict[str, int]:
    """Copy every row of the index in schema ``source`` into the new distributed index in ``target`` (the
    connection's search path, its segments already made like the source's), with the same ids and
    sequences; rows per table. ``method``: both indexes' method, whose SQL key expressions compute from the
    stored sketch each key column of ``documents`` the source lacks (a keyed source has none, the layout by id
    has them all). The caller holds both indexes' ingest locks."""
    counts = {}
    keys = dict(zip(method.key_columns, sql_of(method).key_sql(sql_of(method).sketch_column[0])))
    for table in COPIED_TABLES:
        targets, sources = _columns(connection, target, table), set(_columns(connection, source, table))
        selected = ", ".join(f"({keys[c]})" if table == "documents" and c in keys and c not in sources else f'"{c}"'
                             for c in targets)
        columns = ", ".join(f'"{c}"' for c in targets)
        counts[table] = connection.exec_driver_sql(
            f"INSERT INTO {target}.{table} ({columns}) SELECT {selected} FROM {source}.{table}").rowcount
    for table, column in (("batches", "id"), ("documents", "id")):
        connection.exec_driver_sql(
            f"SELECT setval(pg_get_serial_sequence('{target}.{table}', '{column}'), "
            f"(SELECT last_value FROM {_sequence(connection, source, table, column)}), "
            f"(SELECT is_called FROM {_sequence(connection, source, table, column)}))")
    segmenters = connection.execute(sa.text(f"SELECT CAST(value AS text) FROM {source}.settings "
                                            "WHERE name = 'segmenters'")).scalar()
    if segmenters is not None:  # every segmenter that wrote the copied sketches
        connection.execute(sa.text(f"UPDATE {target}.settings SET value = CAST(:v AS jsonb) WHERE name = 'segmenters'"),
                           {"v": segmenters})
    return counts


def _columns(connection: sa.Connection, schema: str, table: str) -> list[str]:
    return connection.execute(sa.text(
        "SELECT column_name FROM information_schema.columns WHERE table_schema = :s AND table_name = :t "
        "ORDER BY ordinal_position"), {"s": schema, "t": table}).scalars().all()


def _sequence(connection: sa.Connection, schema: str, table: str, column: str) -> str:
    return connection.execute(sa.text("SELECT pg_get_serial_sequence(:t, :c)"),
                              {"t": f"{schema}.{table}", "c": column}).scalar_one()
