"""Clusters: connected components of the near-duplicate pairs, kept up to date incrementally.

Every document has a ``cluster_id``: the id of the earliest document of its
component (itself when it has no near-duplicate). An ingest only merges: the
new pairs join new documents to each other and to existing clusters, and the
merged clusters take the smallest canonical id, so only the documents of
clusters that actually merge are touched. A removal can split clusters; only
the clusters that lost documents are recomputed, from their stored pairs.
"""

from __future__ import annotations

import numpy as np
import sqlalchemy as sa

from .copy import copy_in


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
    clusters = dict(connection.execute(sa.text("SELECT id, cluster_id FROM documents WHERE id = ANY(:ids)"),
                                       {"ids": stored}).all()) if stored else {}
    forest = UnionFind()
    for new, matched in pairs[:, :2].tolist():
        forest.union(new, clusters.get(matched, matched))
    relabel = [(root, forest.find(root)) for root in set(clusters.values()) if forest.find(root) != root]
    if relabel:
        copy_in(connection, "cluster_relabel (old, new)", ["int8", "int8"], relabel, create=True)
        connection.exec_driver_sql("UPDATE documents d SET cluster_id = r.new FROM cluster_relabel r "
                                   "WHERE d.cluster_id = r.old")
    # every new document the pairs touch, on either side: one that is only ever the earlier side of a
    # pair (matched by a later document of its chunk) still joins the merged cluster
    touched = {int(node) for node in pairs[:, :2].ravel() if first_new is not None and node >= first_new}
    return {new: forest.find(new) for new in touched}


def recluster(connection: sa.Connection, cluster_ids: list[int]) -> int:
    """Recompute the given clusters from their stored pairs (after a removal); returns documents relabelled."""
    if not cluster_ids:
        return 0
    members = connection.execute(sa.text("SELECT id FROM documents WHERE cluster_id = ANY(:c)"),
                                 {"c": cluster_ids}).scalars().all()
    pairs = connection.execute(sa.text(
        "SELECT p.a_id, p.b_id FROM near_duplicates p JOIN documents d ON d.id = p.b_id "
        "WHERE d.cluster_id = ANY(:c)"), {"c": cluster_ids}).all()
    forest = UnionFind()
    for member in members:
        forest.find(member)
    for a, b in pairs:
        forest.union(a, b)
    changes = [(member, forest.find(member)) for member in members]
    copy_in(connection, "cluster_recomputed (id, cluster_id)", ["int8", "int8"], changes, create=True)
    return connection.exec_driver_sql(
        "UPDATE documents d SET cluster_id = r.cluster_id FROM cluster_recomputed r "
        "WHERE d.id = r.id AND d.cluster_id <> r.cluster_id").rowcount
