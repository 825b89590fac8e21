"""Brute-force oracles for the counts simdb keeps so that the SQL recipes need not scan the archive:
``batches.removed`` (a batch holds ``documents - removed``) and ``clusters.min_similarity`` (the least
similarity of a member to its cluster's earliest document), ``records.duplicate_of_batch_id`` (the batch of the
document a verdict named), and ``field_counts`` (documents and duplicates per value of a metadata field)."""

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
                      max_distance: int | None = None, batches: dict[str, str] | None = None) -> None:
    """Every batch's ``documents - removed`` is the documents of it stored, every cluster row's
    ``min_similarity`` the least similarity of a member to the cluster's earliest document, and every verdict's
    ``duplicate_of_batch_id`` the batch of the document it named.

    With ``fingerprints`` (SimHash: external id -> the input's fingerprint) the clusters are the connected
    components of the pairs within ``max_distance`` of the inputs, found here by comparing every two; without,
    the members are those ``documents.cluster_id`` names (which ``assert_consistent`` checks). With ``batches``
    (external id -> the name of the batch its input was in, removed documents included) a named document's batch
    is the input's; without, the batch of the stored document, else of the verdict that stored it."""
    assert_verdict_batches(engine, schema, batches)
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
    assert_field_counts(engine, schema, settings.get("count_by") or [], fingerprints, max_distance)


def assert_field_counts(engine: sa.Engine, schema: str, fields: list[str], fingerprints: dict[str, int] | None,
                        max_distance: int | None) -> None:
    """``field_counts`` of every field the index counts by: per value of ``metadata ->> field``, the documents
    stored and those with an earlier near-duplicate. With ``fingerprints`` (SimHash, as above) a document is a
    duplicate while a document stored before it (a smaller id) is within ``max_distance`` of the input's
    fingerprint, found here by comparing every two; without, while its ``duplicate_of`` is set."""
    with engine.connect() as connection:
        kept = {(row.field, row.value): (row.documents, row.duplicates) for row in connection.execute(sa.text(
            f"SELECT field, value, documents, duplicates FROM {schema}.field_counts"))}
        documents = connection.execute(sa.text(
            f"SELECT d.external_id, d.duplicate_of IS NOT NULL AS has_earlier, f.field, d.metadata ->> f.field AS value "
            f"FROM {schema}.documents d CROSS JOIN unnest(CAST(:fields AS text[])) AS f (field) ORDER BY d.id, f.field"),
            {"fields": fields}).all() if fields else []
    order = list(dict.fromkeys(row.external_id for row in documents))
    duplicate = {row.external_id: row.has_earlier for row in documents}
    if fingerprints is not None:
        duplicate = {name: any((fingerprints[earlier] ^ fingerprints[name]).bit_count() <= max_distance
                               for earlier in order[:at]) for at, name in enumerate(order)}
    expected: dict[tuple[str, str | None], list[int]] = {}
    for row in documents:
        counts = expected.setdefault((row.field, row.value), [0, 0])
        counts[0] += 1
        counts[1] += duplicate[row.external_id]
    assert kept == {key: tuple(counts) for key, counts in expected.items()}


def assert_verdict_batches(engine: sa.Engine, schema: str, batches: dict[str, str] | None = None) -> None:
    """``records.duplicate_of_batch_id`` of every verdict that named an earlier document: that document's batch
    (see ``assert_maintained``); NULL only where no batch holds a trace of it (its batch removed whole)."""
    with engine.connect() as connection:
        named = connection.execute(sa.text(
            f"SELECT r.duplicate_of, r.duplicate_of_external_id, r.duplicate_of_batch_id, b.name AS kept "
            f"FROM {schema}.records r LEFT JOIN {schema}.batches b ON b.id = r.duplicate_of_batch_id "
            "WHERE r.duplicate_of IS NOT NULL")).all()
        stored = dict(connection.execute(sa.text(f"SELECT id, batch_id FROM {schema}.documents")).all())
        recorded = dict(connection.execute(sa.text(
            f"SELECT document_id, batch_id FROM {schema}.records WHERE status IN ('new', 'exact', 'near')")).all())
        names = set(connection.execute(sa.text(f"SELECT name FROM {schema}.batches")).scalars())
    if batches is not None:  # a batch removed whole is no longer there to name
        assert [row.kept for row in named] == [batches[row.duplicate_of_external_id] if
                                               batches[row.duplicate_of_external_id] in names else None
                                               for row in named]
    for row in named:
        expected = stored.get(row.duplicate_of, recorded.get(row.duplicate_of))
        if expected is None:  # no trace left of the named document's batch: kept as ingest knew it, or NULL
            assert row.kept is None
        else:
            assert row.duplicate_of_batch_id == expected
