"""Clusters are exactly the connected components of the stored pairs, whatever happens to the archive.

Hypothesis draws dense fingerprints (many pairs within k, chains and bridges between clusters),
splits them into chunks of any size, ingests some chunks concurrently, removes documents, and
after every step compares cluster_id, duplicate_of and the stored pairs with brute force.
"""

from __future__ import annotations

import threading
import uuid

import pytest

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simdb import Index
from tests.conftest import assert_consistent
from tests.test_index import make_batch

#: Fingerprints in a 9-bit space: any two are at most 9 bits apart, so pairs, chains and bridges abound.
dense = st.integers(0, 2**9 - 1).map(lambda low: (0xA5A5_0000_0000_0000 | low))


@st.composite
def histories(draw):
    fingerprints = draw(st.lists(dense, min_size=2, max_size=40))
    chunks, start = [], 0
    while start < len(fingerprints):
        size = draw(st.integers(1, 12))
        chunks.append(fingerprints[start:start + size])
        start += size
    concurrent = draw(st.lists(st.booleans(), min_size=len(chunks), max_size=len(chunks)))
    removals = draw(st.lists(st.integers(0, len(fingerprints) - 1), max_size=6, unique=True))
    return chunks, concurrent, removals


def replay(database_url, admin_engine, schema, index, history, after_chunk=None) -> None:
    """Ingest a drawn history into ``index`` (a chunk drawn ``concurrent`` runs in its own connection beside
    the next one), call ``after_chunk(number)`` after each chunk, then remove the drawn documents;
    brute-force checks after every step that waits for all ingests."""
    chunks, concurrent, removals = history
    names = []
    pending: list[threading.Thread] = []
    for number, (chunk, together) in enumerate(zip(chunks, concurrent)):
        batch = make_batch(chunk, f"c{number}")
        names += [f"c{number}-{i}" for i in range(len(chunk))]
        if together:  # runs beside the next chunk, in its own connection
            other = Index.open(database_url, schema=schema)
            thread = threading.Thread(target=lambda o=other, b=batch, n=f"c{number}": (
                o.add_fingerprinted(b, batch=n), o.close()))
            thread.start()
            pending.append(thread)
        else:
            index.add_fingerprinted(batch, batch=f"c{number}")
        if after_chunk is not None:
            after_chunk(number)
        if not together:
            for thread in pending:
                thread.join()
            pending.clear()
            assert_consistent(admin_engine, schema)
    for thread in pending:
        thread.join()
    assert_consistent(admin_engine, schema)
    for position in removals:
        index.remove(ids=[names[position]])
        assert_consistent(admin_engine, schema)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@pytest.mark.citus
@given(history=histories())
def test_clusters_are_the_connected_components_of_the_pairs(database_url, admin_engine, history):
    schema = f"simdb_test_{uuid.uuid4().hex[:12]}"
    try:
        with Index.create(database_url, schema=schema) as index:
            replay(database_url, admin_engine, schema, index, history)
    finally:
        with admin_engine.begin() as connection:
            connection.exec_driver_sql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
