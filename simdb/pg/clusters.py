"""Clusters: connected components of the near-duplicate pairs, kept up to date incrementally.

Every document has a ``cluster_id``: the id of the earliest document of its
component (itself when it has no near-duplicate). An ingest only merges: the
new pairs join new documents to each other and to existing clusters, and the
merged clusters take the smallest canonical id, so only the documents of
clusters that actually merge are touched. A removal can split clusters; only
the clusters that lost documents are recomputed, from their stored pairs.

The ``clusters`` table holds one row per cluster of two or more documents (size, first and last
seen, batches), kept in the same transactions: every ingest chunk and every removal recomputes the
rows of the clusters it touched: an ingest from the rows of the clusters it merged and its own
documents (:func:`merge_cluster_rows`), a removal from the members of the clusters that lost documents
(:func:`refresh_clusters`). "The biggest clusters" is then an index scan of ``clusters``, where
grouping every document took 2.8 s at 1M documents.
"""

from __future__ import annotations

import numpy as np
import sqlalchemy as sa

from ..methods import Method
from .copy import copy_in, id_table
from .methods import sql_of


class UnionFind:
    """Union by smallest id: every root is the minimum of its component."""

    def __init__(self) -> None:
        self.parent: dict[int, int] = {}

    def find(self, node: int) -> int:
        parent = self.parent.setdefault(node, node)
        if parent != node:
            root = self.find(parent)
            self.parent[node] = root
            return root
        return node

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


def merge_clusters(connection: sa.Connection, pairs: np.ndarray, new_ids: np.ndarray) -> dict[int, int]:
    """Cluster ids for the new documents; relabels existing clusters that the new pairs merge.

    ``pairs`` are verified ``(new id, matched id, distance)`` rows; matched ids
    below ``new_ids[0]`` are stored documents. Returns {new id: cluster id} for
    new documents in a pair, on either side (the others are their own cluster).
    """
    if not len(pairs):
        return {}
    first_new = int(new_ids[0]) if len(new_ids) else None
    stored = sorted({int(t) for t in pairs[:, 1] if first_new is None or t < first_new})
    clusters = dict(connection.exec_driver_sql(
        f"SELECT d.id, d.cluster_id FROM documents d JOIN {id_table(connection, 'matched_stored', stored)} "
        "USING (id)").all()) if stored else {}
    forest = UnionFind()
    for new, matched in pairs[:, :2].tolist():
        forest.union(new, clusters.get(matched, matched))
    parts = [(root, forest.find(root)) for root in set(clusters.values())]
    relabel = [(root, new) for root, new in parts if new != root]
    if relabel:  # the stored documents whose cluster is absorbed into another, with their sketches (for
        # merge_cluster_rows: their similarity to their new canonical document)
        copy_in(connection, "cluster_relabel (old, new)", ["int8", "int8"], relabel, create=True)
        connection.exec_driver_sql(
            "CREATE TEMPORARY TABLE cluster_moved ON COMMIT DROP AS SELECT d.id, r.new AS root, d.simhash, "
            "d.signature FROM documents d JOIN cluster_relabel r ON d.cluster_id = r.old")
        connection.exec_driver_sql("UPDATE documents d SET cluster_id = r.new FROM cluster_relabel r "
                                   "WHERE d.cluster_id = r.old")
    else:
        connection.exec_driver_sql("CREATE TEMPORARY TABLE cluster_moved (id int8, root int8, simhash int8, "
                                   "signature bytea) ON COMMIT DROP")
    # every stored cluster the pairs reach, with the cluster it is now part of (for merge_cluster_rows)
    copy_in(connection, "cluster_parts (old, root)", ["int8", "int8"], parts, create=True)
    # every new document the pairs touch, on either side: one that is only ever the earlier side of a
    # pair (matched by a later document of its chunk) still joins the merged cluster
    touched = {int(node) for node in pairs[:, :2].ravel() if first_new is not None and node >= first_new}
    return {new: forest.find(new) for new in touched}


def merge_cluster_rows(connection: sa.Connection, batch_id: int, method: Method, schema: str, *,
                       distributed: bool) -> None:
    """After a chunk's documents are stored: the ``clusters`` rows of the clusters its pairs made or merged,
    from the rows of the stored clusters they absorbed (``cluster_parts``: a stored document without a row is
    a cluster of one) and the chunk's own members (``staging_clusters``), without reading other members.

    A merged cluster's ``min_similarity`` is the least of the row of the cluster that keeps its canonical
    document and the similarities (:func:`spread_sql`) of the members whose canonical document changed: the
    chunk's own (their sketches in ``staging``) and those of the absorbed clusters (``cluster_moved``). Only
    the canonical documents stored before the chunk are read from ``documents``, each by its id."""
    sketch = sql_of(method).sketch_column[0]
    connection.exec_driver_sql("ANALYZE cluster_parts")
    connection.exec_driver_sql(
        f"CREATE TEMPORARY TABLE cluster_joined ON COMMIT DROP AS SELECT id, root, {sketch} FROM cluster_moved "
        f"UNION ALL SELECT c.id, c.cluster_id, s.{sketch} FROM staging_clusters c JOIN staging s USING (id)")
    connection.exec_driver_sql(
        f"CREATE TEMPORARY TABLE cluster_canonical ON COMMIT DROP AS SELECT r.id, s.{sketch} FROM "
        "(SELECT DISTINCT root AS id FROM cluster_joined) r LEFT JOIN staging s USING (id)")
    connection.exec_driver_sql(  # canonical documents stored before the chunk, one join with one table
        "CREATE TEMPORARY TABLE cluster_canonical_stored ON COMMIT DROP AS SELECT id FROM cluster_canonical "
        f"WHERE {sketch} IS NULL")
    connection.exec_driver_sql("ANALYZE cluster_canonical_stored")
    if distributed:  # Citus ships the table to the workers, each joins its shards by id
        stored = (f"SELECT d.id, d.{sketch} FROM documents d JOIN cluster_canonical_stored c ON c.id = d.id")
    else:  # by id, one document each: a join was planned as a hash of every document
        stored = (f"SELECT c.id, d.{sketch} FROM cluster_canonical_stored c CROSS JOIN LATERAL "
                  f"(SELECT d.{sketch} FROM documents d WHERE d.id = c.id OFFSET 0) d")
    connection.exec_driver_sql(f"CREATE TEMPORARY TABLE cluster_canonical_read ON COMMIT DROP AS {stored}")
    connection.exec_driver_sql(f"UPDATE cluster_canonical c SET {sketch} = r.{sketch} FROM cluster_canonical_read r "
                               "WHERE r.id = c.id")
    connection.exec_driver_sql("ANALYZE cluster_joined")
    connection.exec_driver_sql("ANALYZE cluster_canonical")
    # the merged clusters' rows, in steps that each join one temporary table with one distributed table (in
    # one statement, cluster_parts LEFT JOIN clusters LEFT JOIN documents, Citus pulled all of clusters and
    # documents to the coordinator and sent them to every node: per chunk, the whole archive times the nodes)
    with_rows = connection.exec_driver_sql(  # the parts that have a clusters row (read once: a join on every shard)
        "CREATE TEMPORARY TABLE cluster_merged ON COMMIT DROP AS SELECT p.old, p.root, c.size::bigint AS size, "
        "c.first_seen, c.last_seen, c.batches, c.min_similarity FROM cluster_parts p "
        "JOIN clusters c ON c.cluster_id = p.old").rowcount
    connection.exec_driver_sql(
        "CREATE TEMPORARY TABLE cluster_spread ON COMMIT DROP AS SELECT root, min(similarity) AS similarity FROM ("
        " SELECT root, min_similarity AS similarity FROM cluster_merged WHERE old = root UNION ALL"
        f" SELECT d.root, {spread_sql(method, schema)} FROM cluster_joined d JOIN cluster_canonical c"
        " ON c.id = d.root) s GROUP BY root")
    connection.exec_driver_sql("ANALYZE cluster_spread")
    connection.exec_driver_sql(  # the parts that are one document without one
        "CREATE TEMPORARY TABLE cluster_singles ON COMMIT DROP AS SELECT p.old, p.root FROM cluster_parts p "
        "WHERE NOT EXISTS (SELECT 1 FROM cluster_merged m WHERE m.old = p.old)")
    connection.exec_driver_sql("ANALYZE cluster_singles")  # unanalyzed, 12,000 rows planned a scan of documents
    connection.exec_driver_sql(
        "CREATE TEMPORARY TABLE cluster_single_documents ON COMMIT DROP AS SELECT d.id, d.created_at, b.name "
        "FROM documents d JOIN cluster_singles s ON d.id = s.old LEFT JOIN batches b ON b.id = d.batch_id")
    connection.exec_driver_sql(
        "INSERT INTO cluster_merged (old, root, size, first_seen, last_seen, batches) "
        "SELECT s.old, s.root, 1, d.created_at, d.created_at, ARRAY[d.name] "
        "FROM cluster_singles s LEFT JOIN cluster_single_documents d ON d.id = s.old")
    # the chunk's own clusters by a statement of their own (a temporary table alone: nothing sent to the workers)
    connection.exec_driver_sql(f"""
        INSERT INTO cluster_merged (old, root, size, first_seen, last_seen, batches)
        SELECT NULL, s.cluster_id, count(*), now(), now(),
               ARRAY[(SELECT name FROM batches WHERE id = {int(batch_id)})]
        FROM staging_clusters s GROUP BY s.cluster_id""")
    if with_rows:  # (a statement on every shard, for rows that none has when no merged cluster had one)
        connection.exec_driver_sql("DELETE FROM clusters c USING cluster_parts p WHERE c.cluster_id = p.old")
    connection.exec_driver_sql(  # two aggregates joined (a subquery per root read every row once per root)
        "INSERT INTO clusters (cluster_id, size, first_seen, last_seen, batches, min_similarity) "
        "SELECT m.root, m.size, m.first_seen, m.last_seen, n.batches, s.similarity FROM "
        "(SELECT root, sum(size) AS size, min(first_seen) AS first_seen, max(last_seen) AS last_seen "
        " FROM cluster_merged GROUP BY root HAVING sum(size) > 1) m JOIN "
        "(SELECT root, array_agg(DISTINCT name) AS batches FROM cluster_merged, unnest(batches) name GROUP BY root) n "
        "USING (root) JOIN cluster_spread s USING (root)")  # every root's row was among those just deleted: each
    # is inserted afresh


def spread_sql(method: Method, schema: str) -> str:
    """SQL for the similarity of a member ``d`` to its cluster's canonical document ``c`` (rows with ``simhash``
    and ``signature``), as ``cluster_members`` gives it: what ``clusters.min_similarity`` is the least of."""
    return sql_of(method).similarity_between_sql(schema, "d", "c")


def refresh_clusters(connection: sa.Connection, touched: str, method: Method, schema: str) -> None:
    """Recompute the ``clusters`` rows of the cluster ids in the table ``touched`` (a ``cluster_id`` column)
    from their members: a cluster left with one document (or none) has no row; ``min_similarity`` from every
    member's similarity to its canonical document (:func:`spread_sql`)."""
    connection.exec_driver_sql(f"ANALYZE {touched}")
    connection.exec_driver_sql(f"DELETE FROM clusters c USING {touched} t WHERE c.cluster_id = t.cluster_id")
    connection.exec_driver_sql(  # the members with their sketches, and their canonical documents' (one join
        # with one temporary table each: Citus ships it to the workers)
        "CREATE TEMPORARY TABLE cluster_refreshed ON COMMIT DROP AS SELECT d.id, d.cluster_id, d.created_at, "
        f"d.batch_id, d.simhash, d.signature FROM documents d JOIN (SELECT DISTINCT cluster_id FROM {touched}) t "
        "ON t.cluster_id = d.cluster_id")
    connection.exec_driver_sql(
        "INSERT INTO clusters (cluster_id, size, first_seen, last_seen, batches, min_similarity) "
        "SELECT d.cluster_id, count(*), min(d.created_at), max(d.created_at), array_agg(DISTINCT b.name), "
        f"min({spread_sql(method, schema)}) FROM cluster_refreshed d JOIN cluster_refreshed c ON c.id = d.cluster_id "
        "JOIN batches b ON b.id = d.batch_id GROUP BY d.cluster_id HAVING count(*) > 1")
    connection.exec_driver_sql("DROP TABLE cluster_refreshed")


def recluster(connection: sa.Connection, clusters: str) -> int:
    """Recompute the clusters listed in the table ``clusters`` (a ``cluster_id`` column) from their stored
    pairs, after a removal, and adds the clusters' new ids to that table (for :func:`refresh_clusters`);
    returns documents relabelled. Members and pairs are found by joining that
    table, not through an array of ids in the statement: a removed batch of a million documents lists a
    million clusters, and a million-element array in every segment's scan exhausted the server's memory."""
    connection.exec_driver_sql(f"ANALYZE {clusters}")
    members = connection.exec_driver_sql(
        f"SELECT d.id FROM documents d JOIN {clusters} c ON c.cluster_id = d.cluster_id").scalars().all()
    if not members:  # every document of those clusters was removed: nothing is left to split
        return 0
    pairs = connection.exec_driver_sql(
        f"SELECT p.a_id, p.b_id FROM near_duplicates p JOIN documents d ON d.id = p.b_id "
        f"JOIN {clusters} c ON c.cluster_id = d.cluster_id").all()
    forest = UnionFind()
    for member in members:
        forest.find(member)
    for a, b in pairs:
        forest.union(a, b)
    changes = [(member, forest.find(member)) for member in members]
    copy_in(connection, "cluster_recomputed (id, cluster_id)", ["int8", "int8"], changes, create=True)
    relabelled = connection.exec_driver_sql(
        "UPDATE documents d SET cluster_id = r.cluster_id FROM cluster_recomputed r "
        "WHERE d.id = r.id AND d.cluster_id <> r.cluster_id").rowcount
    connection.exec_driver_sql(f"INSERT INTO {clusters} (cluster_id) SELECT DISTINCT cluster_id FROM cluster_recomputed")
    return relabelled
