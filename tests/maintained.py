"""Brute-force oracles for the counts simdb keeps so that the SQL recipes need not scan the archive:
``batches.removed`` (a batch holds ``documents - removed``) and ``clusters.min_similarity`` (the least
similarity of a member to its cluster's earliest document)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import sqlalchemy as sa

from simdb.bits import to_unsigned
from simdb.pg.clusters import UnionFind


def similarity(method: str, num_perm: int | None, a, b) -> float:
    """What the sketches of two documents say of their similarity, computed here: SimHash 1 - bits / 64 of
    two unsigned fingerprints, MinHash the share of signature positions that agree (as ``cluster_members``
    estimates it)."""
    if method == "minhash":
        return int(np.count_nonzero(np.frombuffer(a, "<u4") == np.frombuffer(b, "<u4"))) / num_perm
    return (64 - (a ^ b).bit_count()) / 64


def assert_maintained(engine: sa.Engine, schema: str, fingerprints: dict[str, int] | None = None,
                      max_distance: int | None = None) -> None:
    """Every batch's ``documents - removed`` is the documents of it stored, and every cluster row's
    ``min_similarity`` the least similarity of a member to the cluster's earliest document.

    With ``fingerprints`` (SimHash: external id -> the input's fingerprint) the clusters are the connected
    components of the pairs within ``max_distance`` of the inputs, found here by comparing every two; without,
    the members are those ``documents.cluster_id`` names (which ``assert_consistent`` checks)."""
    with engine.connect() as connection:
        settings = dict(connection.execute(sa.text(f"SELECT name, value FROM {schema}.settings")).all())
        documents = connection.execute(sa.text(
            f"SELECT d.id, d.external_id, b.name AS batch, d.cluster_id, coalesce(d.signature, int8send(d.simhash)) "
            f"AS sketch, d.simhash FROM {schema}.documents d JOIN {schema}.batches b ON b.id = d.batch_id "
            "ORDER BY d.id")).all()
        held = {row.name: row.held for row in connection.execute(sa.text(
            f"SELECT name, documents - removed AS held FROM {schema}.batches"))}
        kept = dict(connection.execute(sa.text(f"SELECT cluster_id, min_similarity FROM {schema}.clusters")).all())
    stored = Counter(row.batch for row in documents)
    assert held == {name: stored.get(name, 0) for name in held}
    method = settings.get("method", "simhash")
    num_perm = (settings.get("minhash") or {}).get("num_perm")
    sketches = {row.id: (row.sketch if method == "minhash" else to_unsigned(row.simhash)) for row in documents}
    forest = UnionFind()
    if fingerprints is None:
        for row in documents:
            forest.union(row.id, row.cluster_id)
    else:
        assert {row.external_id: to_unsigned(row.simhash) for row in documents} == fingerprints
        sketches = {row.id: fingerprints[row.external_id] for row in documents}
        ids = [row.id for row in documents]
        for later, b in enumerate(ids):
            forest.find(b)
            for a in ids[:later]:
                if (sketches[a] ^ sketches[b]).bit_count() <= max_distance:
                    forest.union(a, b)
    members: dict[int, list[int]] = {}
    for row in documents:
        members.setdefault(forest.find(row.id), []).append(row.id)
    expected = {canonical: min(similarity(method, num_perm, sketches[canonical], sketches[member])
                               for member in group)
                for canonical, group in members.items() if len(group) > 1}
    assert kept == expected
