"""Clusters are exactly the connected components of the stored pairs, whatever happens to the archive.

Hypothesis draws dense fingerprints (many pairs within k, chains and bridges between clusters),
splits them into chunks of any size, ingests some chunks concurrently (raising any error a thread
met), removes documents, and after every step checks that the stored documents are the inputs' and
compares cluster_id, duplicate_of and the stored pairs with brute force over them.
"""

from __future__ import annotations


import pytest
import sqlalchemy as sa

from hypothesis import strategies as st

from simdb import Index, to_signed
from tests.conftest import (Concurrently, GATHERING_TABLES, assert_consistent, catalog, check_property,
                            stored_max_distance)
from tests.maintained import assert_maintained
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


def add_beside(database_url: str, schema: str, batch, name: str) -> None:
    """Store a batch through a connection of its own, as a concurrent ingest does."""
    with Index.open(database_url, schema=schema) as other:
        other.add_fingerprinted(batch, batch=name)


def assert_stored(engine, schema: str, expected: dict[str, int]) -> None:
    """The index holds exactly the documents the history's inputs say, each with its input fingerprint: the
    oracle's checks then run over the inputs, not over whatever the ingests managed to store."""
    with engine.connect() as connection:
        stored = dict(connection.execute(sa.text(f"SELECT external_id, simhash FROM {schema}.documents")).all())
    assert stored == {name: to_signed(fingerprint) for name, fingerprint in expected.items()}


def replay(database_url, admin_engine, schema, index, history, after_chunk=None) -> None:
    """Ingest a drawn history into ``index`` (a chunk drawn ``concurrent`` runs in its own connection beside
    the next one, in a thread whose error the test raises), call ``after_chunk(number)`` after each chunk,
    then remove the drawn documents; after every step that waits for all ingests, the stored documents are
    the inputs' and pairs, earliest matches, clusters and the batch each verdict named are brute force's over
    them."""
    chunks, concurrent, removals = history
    names, expected, batch_of = [], {}, {}  # batch_of: every input's batch, removed ones included
    with Concurrently() as threads:
        for number, (chunk, together) in enumerate(zip(chunks, concurrent)):
            batch = make_batch(chunk, f"c{number}")
            names += [f"c{number}-{i}" for i in range(len(chunk))]
            expected.update(zip(names[-len(chunk):], chunk))
            batch_of.update((name, f"c{number}") for name in names[-len(chunk):])
            if together:  # runs beside the next chunk, in its own connection
                threads.start(add_beside, database_url, schema, batch, f"c{number}")
            else:
                index.add_fingerprinted(batch, batch=f"c{number}")
            if after_chunk is not None:
                after_chunk(number)
            if not together:
                threads.results()
                assert_stored(admin_engine, schema, expected)
                assert_consistent(admin_engine, schema)
                assert_maintained(admin_engine, schema, expected, stored_max_distance(admin_engine, schema), batch_of)
    assert_stored(admin_engine, schema, expected)
    assert_consistent(admin_engine, schema)
    assert_maintained(admin_engine, schema, expected, stored_max_distance(admin_engine, schema), batch_of)
    for position in removals:
        index.remove(ids=[names[position]])
        del expected[names[position]]
        assert_stored(admin_engine, schema, expected)
        assert_consistent(admin_engine, schema)
        assert_maintained(admin_engine, schema, expected, stored_max_distance(admin_engine, schema), batch_of)


def replayed_on_a_fresh_index(database_url, admin_engine, schema, fresh_index, history) -> None:
    with fresh_index(count_by=["source"]) as index:  # each example on an index as created
        replay(database_url, admin_engine, schema, index, history)


@pytest.mark.citus
@pytest.mark.slow_on_citus
def test_clusters_are_the_connected_components_of_the_pairs(backend, database_url, admin_engine, schema, fresh_index):
    check_property(backend, 40, replayed_on_a_fresh_index, database_url, admin_engine, schema, fresh_index,
                   history=histories())


@pytest.mark.citus
def test_a_chunk_reads_the_clusters_rows_it_merges_once_and_deletes_none_where_there_were_none(
        database_url, admin_engine, schema):
    """A chunk's pairs reach stored clusters: their ``clusters`` rows are read by one join (on Citus, a task on
    every shard; it was two, one for the rows, one for their least similarity), and deleted (to be written
    afresh) only when some had a row: a chunk that only reaches documents of no cluster yet deletes nothing.
    The clusters stay brute force's."""
    import random
    import re

    rng = random.Random(11)
    stored = [rng.getrandbits(64) for _ in range(40)]
    statements: list[str] = []
    with Index.create(database_url, schema=schema) as index:
        index.add_fingerprinted(make_batch(stored, "a"), batch="a")
        sa.event.listen(index.database.engine, "before_cursor_execute",
                        lambda connection, cursor, statement, *rest: statements.append(statement))
        chunks = []
        for batch, fingerprints in (("b", [fp ^ 1 for fp in stored[:3]]), ("c", [stored[0] ^ 6])):
            statements.clear()
            index.add_fingerprinted(make_batch(fingerprints, batch), batch=batch)
            chunks.append((sum(bool(re.search(r"\bJOIN clusters\b", s)) for s in statements),
                           sum(s.lstrip().startswith("DELETE FROM clusters") for s in statements)))
    # b: three pairs with documents of no cluster (no row); c: a pair with a document of b's first cluster of two
    assert chunks == [(1, 0), (1, 1)]
    assert_consistent(admin_engine, schema)
    with admin_engine.connect() as connection:
        assert connection.exec_driver_sql(f"SELECT size FROM {schema}.clusters ORDER BY size").scalars().all() == \
            [2, 2, 3]


@pytest.mark.citus
def test_an_emptied_index_is_the_index_as_created(database_url, admin_engine, schema, fresh_index):
    """The Hypothesis tests reuse one index, emptied between examples: it must be exactly as created, segments,
    rows, ids and settings included, whatever the example did (merged segments, removals, concurrent chunks)."""
    def state() -> dict:
        with admin_engine.begin() as connection:
            found = catalog(connection, schema)
            found["rows"] = [connection.exec_driver_sql(f"SELECT count(*) FROM {schema}.{table}").scalar_one()
                             for table in GATHERING_TABLES]
            found["ids"] = [tuple(connection.exec_driver_sql(f"SELECT last_value, is_called FROM {sequence}").one())
                            for sequence in (f"{schema}.batches_id_seq", f"{schema}.documents_id_seq")]
            return found

    fingerprints = [0xA5A5_0000_0000_0000 | low for low in range(0, 512, 7)]
    history = ([fingerprints[i:i + size] for i, size in zip(range(0, 70, 10), (1, 3, 10, 2, 5, 12, 4))],
               [False, True, False, False, True, False, False], [0, 5, 17, 30])
    with fresh_index(segment_size=4, merge_factor=2, bulk_chunk=3, count_by=["source"]) as index:
        created = state()
        replay(database_url, admin_engine, schema, index, history, after_chunk=lambda number: index.compact())
        assert state()["rows"] != created["rows"] and len(index.segments()) > 1
    with fresh_index(segment_size=4, merge_factor=2, bulk_chunk=3, count_by=["source"]):
        emptied = state()
    assert emptied == created and len(created["relations"]) > 20 and created["ids"] == [(1, False), (1, False)]
