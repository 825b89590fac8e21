"""A merged segment is vacuumed and its key indexes read into shared buffers as the merge commits
(simdb.pg.prewarm): probes then visit no heap page and read no page from outside shared buffers."""

from __future__ import annotations

import random
import uuid

import pytest
import sqlalchemy as sa

from simdb import Index
from simdb.bits import hamming
from simdb.pg import prewarm
from simdb.pg.database import postgres_url


@pytest.fixture
def own_database(database_url, admin_engine, backend):
    """A database of its own for one test: VACUUM sets the visibility map only for rows older than every open
    transaction in the database, and the shared test database has other tests' open ones."""
    if backend == "citus":
        pytest.skip("a Citus segment's shards are on the workers: nothing is vacuumed or read in there")
    name = f"simdb_test_prewarm_{uuid.uuid4().hex[:12]}"
    with admin_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        try:
            connection.exec_driver_sql(f'CREATE DATABASE "{name}"')
        except sa.exc.DBAPIError as error:
            pytest.skip(f"cannot create a database on the test server: {error.orig}")
    url = sa.make_url(postgres_url(database_url)).set(database=name)
    yield url.render_as_string(hide_password=False)
    with admin_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.exec_driver_sql(f'DROP DATABASE "{name}" WITH (FORCE)')


def texts(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(500)]
    return [" ".join(rng.choices(words, k=40)) for _ in range(count)]


def merged_index(url: str, stored: list[str], messages: list[str]) -> Index:
    """An index of ``stored`` in three bulk-loaded segments, merged into one (what the merge said in
    ``messages``)."""
    index = Index.create(url, schema="archive", segment_size=10_000, merge_factor=2, bulk_chunk=50)
    for part in range(3):
        index.add_many([{"id": f"d{i}", "text": text} for i, text in enumerate(stored) if i % 3 == part],
                       batch=f"b{part}", compact=False)
    merged = index.compact(full=True, progress=messages.append).merged
    assert len(merged) == 1 and merged[0]["ready"]["segment"] == merged[0]["name"]
    return index


def probe_plan(url: str, index: Index, column: str, value: int) -> dict:
    """The executed plan of an index-only probe of the merged segment's ``column`` index, as a chunk probes it."""
    segment = index.segments()[0].name
    engine = sa.create_engine(postgres_url(url))
    try:
        with engine.begin() as connection:
            connection.exec_driver_sql("SET LOCAL enable_seqscan = off")
            connection.exec_driver_sql("SET LOCAL enable_bitmapscan = off")
            plan = connection.exec_driver_sql(
                f'EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT id, simhash FROM archive."{segment}" '
                f"WHERE {column} = {int(value)}").scalar_one()[0]["Plan"]
    finally:
        engine.dispose()
    assert plan["Node Type"] == "Index Only Scan", plan
    return plan


def assert_brute_force_answers(index: Index, stored: list[str], queries: list[str]) -> None:
    """Every query's matches are the stored texts within the index's distance, by brute force."""
    fingerprints = [index.fingerprint(text) for text in stored]
    k = index.sketcher.max_distance
    for query in queries:
        sketch = index.fingerprint(query)
        expected = {f"d{i}" for i, fp in enumerate(fingerprints) if hamming(fp, sketch) <= k}
        assert {m.external_id for m in index.query_fingerprint(sketch)} == expected


@pytest.mark.parametrize("extension", [False, True], ids=["index-only scans", "pg_prewarm"])
def test_a_merged_segment_is_probed_from_shared_buffers_without_visiting_its_heap(own_database, extension):
    if extension:
        engine = sa.create_engine(postgres_url(own_database))
        try:
            with engine.begin() as connection:
                connection.exec_driver_sql("CREATE EXTENSION pg_prewarm")
        except sa.exc.DBAPIError as error:
            pytest.skip(f"no pg_prewarm on the test server: {error.orig}")
        finally:
            engine.dispose()
    stored, messages = texts(300, 1), []
    with merged_index(own_database, stored, messages) as index:
        key_columns = index.sketcher.key_columns
        probe = index.fingerprint(stored[7])
        plans = {column: probe_plan(own_database, index, column, value)
                 for column, value in zip(key_columns, index.sketcher.keys([probe])[0].tolist())}
        for column, plan in plans.items():  # unvacuumed, each entry visited the heap
            assert plan["Heap Fetches"] == 0 and plan["Actual Rows"] >= 1, (column, plan)
        # unwarmed, every probe read its index's pages from outside shared buffers (15 probes, 15 pages or more
        # each); warmed, none, but for a page the other tests' work evicts from the test server's 128 MB
        # meanwhile (a CI run once saw 1 read among 15 probes)
        read = {column: plan["Shared Read Blocks"] for column, plan in plans.items() if plan["Shared Read Blocks"]}
        assert sum(read.values()) <= 2, read
        said = [m for m in messages if "key indexes" in m]
        assert said and f"{len(key_columns)} of {len(key_columns)} key indexes" in said[0]
        assert ("pg_prewarm" if extension else "index-only scans") in said[0]
        assert_brute_force_answers(index, stored, stored[:20] + texts(20, 2))


def test_key_indexes_past_the_share_of_shared_buffers_are_left_unread(own_database, monkeypatch):
    monkeypatch.setattr(prewarm, "WARM_SHARE", 0.0)
    stored, messages = texts(300, 3), []
    with merged_index(own_database, stored, messages) as index:
        said = [m for m in messages if "key indexes" in m]
        assert said and f"0 of {len(index.sketcher.key_columns)} key indexes" in said[0], messages
        assert "left: more than 0% of shared buffers" in said[0]
        assert_brute_force_answers(index, stored, stored[:20] + texts(20, 4))


def test_no_index_is_scanned_while_an_older_transaction_keeps_the_visibility_map_unset(own_database):
    """Without pg_prewarm, an index-only scan of a segment whose visibility map VACUUM could not set would visit
    the heap for every entry: nothing is read, and it says why."""
    engine = sa.create_engine(postgres_url(own_database))
    stored, messages = texts(300, 5), []
    try:
        with engine.connect() as analyst:  # a snapshot older than the merge, held through it
            analyst.exec_driver_sql("BEGIN ISOLATION LEVEL REPEATABLE READ")
            analyst.exec_driver_sql("SELECT 1").scalar_one()
            with merged_index(own_database, stored, messages) as index:
                said = [m for m in messages if "key indexes" in m]
                assert said and "nothing read" in said[0] and "all-visible after VACUUM" in said[0], messages
                assert_brute_force_answers(index, stored, stored[:20] + texts(20, 6))
            analyst.rollback()
    finally:
        engine.dispose()
