"""Removal (with duplicate_of re-pointed) and relayout with data in place."""

import random
import threading
import time
from datetime import datetime, timedelta, timezone

import numpy as np
import pytest
import sqlalchemy as sa
from alembic import command

from simdb import Document, IncompatibleIndex, Index, SimdbError
from simdb.ingest import IngestOptions
from simdb.pg import keyed, migrate
from simdb.report import build_report
from simdb.samples import corpus
from tests.conftest import Concurrently, assert_consistent, count_rows
from tests.maintained import assert_maintained
from tests.test_index import flip, make_batch


def dup_of(engine, schema):
    assert_maintained(engine, schema)
    return dict(assert_consistent(engine, schema))


@pytest.fixture
def index(database_url, schema):
    """The fingerprints below are planted at distances, and relaid out, from k = 3 in 4 blocks."""
    with Index.create(database_url, schema=schema, max_distance=3) as created:
        yield created


@pytest.mark.citus
@pytest.mark.citus_by_id
def test_remove_by_id_repoints_to_the_earliest_remaining(index, admin_engine):
    schema = index.database.schema
    base = 0x0123_4567_89AB_CDEF
    # a: original; b: 2 bits from a; c: 3 bits from a and 1 bit from b; d: far from a, 3 bits from c
    b = flip(base, [0, 1])
    c = flip(base, [0, 1, 2])
    d = flip(c, [40, 41, 42])
    index.add_fingerprinted(make_batch([base, b, c, d], "x"), batch="x")
    assert dup_of(admin_engine, schema) == {"x-0": None, "x-1": "x-0", "x-2": "x-0", "x-3": "x-2"}
    summary = index.remove(ids=["x-0"])
    assert (summary.removed, summary.repointed, summary.now_original) == (1, 1, 1)
    assert str(summary) == ("removed 1 documents; 1 that pointed at them now point at their earliest remaining "
                            "near-duplicate, 1 have none left")
    assert dup_of(admin_engine, schema) == {"x-1": None, "x-2": "x-1", "x-3": "x-2"}


@pytest.mark.citus
@pytest.mark.citus_by_id
def test_remove_a_batch_and_by_age(index, admin_engine):
    schema = index.database.schema
    records = list(corpus())[:120]
    index.add_many(records[:60], batch="one")
    index.add_many(records[60:], batch="two")
    before = dup_of(admin_engine, schema)
    dry = index.remove(batch="one", dry_run=True)
    assert dry.removed == 60 and dup_of(admin_engine, schema) == before
    summary = index.remove(batch="one")
    assert summary.removed == 60 and summary.batch_removed == "one"
    assert count_rows(admin_engine, schema) == (60, 1)
    dup_of(admin_engine, schema)  # consistent: every duplicate_of is the earliest remaining match
    assert [p.to_json() for p in index.pairs()] == [p.to_json() for p in index.pairs(batch="two")]
    assert index.remove(before=datetime.now(timezone.utc) - timedelta(days=1)).removed == 0
    assert index.remove(before=datetime.now(timezone.utc) + timedelta(seconds=1)).removed == 60
    assert count_rows(admin_engine, schema) == (0, 1)


def record_rows(engine, schema) -> list[tuple]:
    with engine.connect() as connection:
        return [tuple(row) for row in connection.execute(sa.text(
            f"SELECT b.name, r.position, r.external_id FROM {schema}.records r "
            f"LEFT JOIN {schema}.batches b ON b.id = r.batch_id ORDER BY b.name, r.position"))]


@pytest.mark.citus
def test_removing_a_batch_removes_its_records_and_leaves_none_dangling(index, admin_engine):
    """No foreign key cascades from ``batches`` to ``records`` (migration 0016): the removal deletes a batch's
    verdicts itself, and every other batch's stay, whatever documents a removal by id takes."""
    schema = index.database.schema
    records = list(corpus())[:90]
    one, two, three = records[:30], records[30:60], records[60:]
    index.add_many(one, batch="one")
    index.add_many(two + one[:5], batch="two")  # five already stored: verdicts without documents of their own
    index.add_many(three, batch="three")
    index.remove(batch="one")
    index.remove(ids=[three[0]["id"]])  # a removal by id keeps the batch's verdicts (they name what was)
    expected = sorted([("three", at, r["id"]) for at, r in enumerate(three, 1)]
                      + [("two", at, r["id"]) for at, r in enumerate(two + one[:5], 1)])
    assert record_rows(admin_engine, schema) == expected  # none of batch one's, none without a batch
    verdicts = list(index.verdicts("two"))
    assert [v.id for v in verdicts] == [r["id"] for r in two + one[:5]]
    assert [v.status for v in verdicts[-5:]] == ["already_stored"] * 5


@pytest.mark.citus
def test_remove_refuses_unknown_ids_and_removes_nothing(index, admin_engine):
    index.add_many([{"id": "a", "text": "some text"}], batch="b")
    with pytest.raises(SimdbError, match=r"no stored document has the id\(s\) 'nope'; nothing was removed"):
        index.remove(ids=["a", "nope"])
    with pytest.raises(SimdbError, match="no batch named 'zzz'"):
        index.remove(batch="zzz")
    with pytest.raises(SimdbError, match="exactly one of `ids`, `batch` or `before`"):  # the API names parameters
        index.remove(ids=["a"], batch="b")
    assert count_rows(admin_engine, index.database.schema) == (1, 1)


@pytest.mark.citus
def test_remove_from_the_cli(run, tmp_path):
    run("init")
    (tmp_path / "a.jsonl").write_text('{"id": "a", "text": "one text"}\n{"id": "b", "text": "one text"}\n')
    run("ingest", str(tmp_path / "a.jsonl"), "--batch", "a")
    assert run("remove", "--id", "a", "--dry-run").output == (
        "would remove 1 documents; 0 that point at them would point at their earliest remaining "
        "near-duplicate, 1 would have none left\n")
    assert run("remove", "--batch", "a").output.startswith("removed 2 documents")
    assert run("remove", "--id", "a").output == ("Error: no stored document has the id(s) 'a'; "
                                                 "nothing was removed\n")


@pytest.mark.citus
@pytest.mark.slow_on_citus
def test_relayout_with_data_in_place_answers_the_same(database_url, schema, admin_engine):
    rng = random.Random(5)
    with Index.create(database_url, schema=schema, max_distance=3) as index:
        fingerprints = [rng.getrandbits(64) for _ in range(3000)]
        for cluster in range(40):
            base = rng.getrandbits(64)
            fingerprints += [base] + [flip(base, rng.sample(range(64), d)) for d in range(1, 4)]
        index.add_fingerprinted(make_batch(fingerprints, "f"), batch="f")
        queries = fingerprints[-40:] + [rng.getrandbits(64) for _ in range(20)]
        before = ([index.query_fingerprint(q) for q in queries], list(index.pairs()), dup_of(admin_engine, schema))
        stale = Index.open(database_url, schema=schema)

        messages = []
        index.relayout(5, progress=messages.append)
        assert index.layout.blocks == 5 and index.layout.key_columns[0] == "key_4"
        assert messages[-1] == "switched to 5 blocks of 12/13 bits, 10 keys of 2 blocks (25/26 bits), max distance 3"
        after = ([index.query_fingerprint(q) for q in queries], list(index.pairs()), dup_of(admin_engine, schema))
        assert after == before
        assert index.query_fingerprints(queries) == before[0]

    with Index.open(database_url, schema=schema) as reopened:  # the new layout is what the index says it is
        assert reopened.layout == index.layout
        assert [reopened.query_fingerprint(q) for q in queries] == before[0]
        with reopened.database.engine.begin() as connection:
            command.check(migrate.alembic_config(connection, schema, key_columns=keyed.document_key_columns(
                reopened.settings.method, reopened.context.keyed)))  # none on the keyed layout
        reopened.add_fingerprinted(make_batch([flip(q, [7]) for q in queries[:5]], "g"), batch="g")
        dup_of(admin_engine, schema)

    with pytest.raises(IncompatibleIndex, match="re-laid out"):  # a writer holding the old layout is stopped
        stale.add_fingerprinted(make_batch([1], "h"), batch="h")
    stale.close()

    with Index.open(database_url, schema=schema) as index:  # and back, numbering the columns afresh
        answers = [index.query_fingerprint(q) for q in queries]
        index.relayout(4)
        assert index.layout.key_columns == ["key_14", "key_15", "key_16", "key_17"]
        assert [index.query_fingerprint(q) for q in queries] == answers


@pytest.mark.citus
def test_relayout_cleans_up_after_an_interrupted_one(index, admin_engine):
    schema = index.database.schema
    index.add_many([{"id": str(i), "text": f"text number {i} " * 10} for i in range(30)], batch="b")
    with admin_engine.begin() as connection:  # what a relayout killed after adding its columns leaves
        connection.exec_driver_sql(f"ALTER TABLE {schema}.documents ADD COLUMN key_4 bigint, ADD COLUMN key_5 bigint")
    with pytest.raises(SimdbError, match="already uses 4 blocks"):
        index.relayout(4)
    index.relayout(6)
    with admin_engine.connect() as connection:
        columns = [c["name"] for c in sa.inspect(connection).get_columns("documents", schema=schema)
                   if c["name"].startswith("key_")]
    # the keyed layout's documents have no key columns: its relayout drops what it finds
    assert columns == ([] if index.context.keyed else [f"key_{i}" for i in range(4, 24)])
    dup_of(admin_engine, schema)


def test_stats_advises_relayout_when_buckets_grow(index):
    # 400 fingerprints sharing their lowest 16 bits: every lookup meets them all on key_0
    rng = random.Random(9)
    index.add_fingerprinted(make_batch([(rng.getrandbits(48) << 16) | 0xBEEF for _ in range(400)], "s"), batch="s")
    stats = index.stats()
    assert stats["measured_candidates_per_lookup"] >= 399  # the 399 others in its bucket
    assert stats["largest_key_buckets"][0] == {"key": "key_0", "value": 0xBEEF, "documents": 400}
    assert stats["advice"] == (f"lookups meet {stats['measured_candidates_per_lookup']:,.0f} candidates on average: the archive has outgrown its layout; "
                               "run `simdb relayout --blocks 5`")


def test_removing_a_batch_reads_only_the_pairs_of_documents_that_pointed_at_it(index):
    """Regression: re-pointing documents was one UPDATE whose plan ran its LATERAL "earliest remaining pair"
    subquery for every document of the archive before filtering on ``duplicate_of`` (a batch of 100k out
    of a 10M archive took more than 8 minutes). The near_duplicates index scans of the removal, counted in
    its own transaction, must follow the documents that pointed at the removed ones, not the archive."""
    from simdb.pg.remove import remove

    rng = np.random.default_rng(5)
    archive = [int(v) for v in rng.integers(0, 2**63, 6000, dtype=np.int64)]
    gone = archive[:2000]
    index.add_fingerprinted(make_batch(archive[2000:], "base"), batch="base")
    index.add_fingerprinted(make_batch(gone, "gone"), batch="gone")
    index.add_fingerprinted(make_batch([flip(fp, [3]) for fp in gone], "later"), batch="later")
    with index.database.engine.begin() as connection:
        summary = remove(connection, index.database.schema, index.settings.method, batch="gone",
                         keyed=index.context.keyed)
        scans = connection.execute(sa.text(
            "SELECT idx_scan FROM pg_stat_xact_user_tables WHERE relid = CAST('near_duplicates' AS regclass)")
        ).scalar_one()
    assert (summary.removed, summary.repointed, summary.now_original) == (2000, 0, 2000)
    assert scans < 4000, f"{scans} index scans of near_duplicates to remove 2,000 documents from 8,000"


def test_no_statement_on_documents_carries_an_array_that_grows_with_the_work(database_url, schema, admin_engine):
    """Regression: removing a batch of 1M documents from a 34M archive in 66 segments sent the million
    clusters it touched as an array (``cluster_id = ANY(...)``), which PostgreSQL copies into every
    segment's scan: the server process grew to 17 GB and was killed, with every other connection. Ids of
    work that grows with a batch go to temporary tables; this checks ingest (near and exact copies of
    stored documents: clusters to merge, content hashes to compare) and removals by batch and by id."""
    with Index.create(database_url, schema=schema, segment_size=500) as index:
        arrays = []

        def record(conn, cursor, statement, parameters, context, executemany):
            if "documents" in statement and isinstance(parameters, dict):
                arrays.extend(len(v) for v in parameters.values() if isinstance(v, (list, tuple)))

        sa.event.listen(index.database.engine, "before_cursor_execute", record)
        rng = np.random.default_rng(7)
        stored = [int(v) for v in rng.integers(0, 2**63, 3000, dtype=np.int64)]
        index.add_fingerprinted(make_batch(stored, "old"), batch="old")
        near = make_batch([flip(fp, [5]) for fp in stored[:1500]] + stored[1500:], "new")
        near.content_hashes[1500:] = make_batch(stored, "old").content_hashes[1500:]  # the same texts again
        summary = index.add_fingerprinted(near, batch="new")
        assert (summary.near_duplicates, summary.exact_duplicates) == (1500, 1500)
        assert index.remove(batch="old").removed == 3000
        assert index.remove(ids=[f"new-{i}" for i in range(2000)]).removed == 2000
        assert max(arrays, default=0) <= 100, sorted(arrays)[-5:]
    assert_consistent(admin_engine, schema)
    assert_maintained(admin_engine, schema)


# -- relayout beside ingests and merges ------------------------------------------------------------------

def waiting_for(engine, schema: str, purpose: str) -> int:
    """Sessions waiting inside PostgreSQL for the ``purpose`` advisory lock of the index in ``schema``."""
    with engine.connect() as connection:
        return connection.execute(sa.text(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
            "AND ((classid::int8 << 32) | objid::int8) = hashtextextended(:key, 0)"),
            {"key": f"simdb {purpose} {schema}"}).scalar_one()


def until(condition, what: str, attempts: int = 1200) -> None:
    """Poll ``condition`` (every 0.1 s) until it holds; a guard against a hang, not a timing assertion."""
    for _ in range(attempts):
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(f"never happened: {what}")


def fingerprints_near(rng, stored: list[int], count: int, prefix: str) -> list[int]:
    return [flip(rng.choice(stored), rng.sample(range(64), rng.randrange(4))) if rng.random() < 0.6
            else rng.getrandbits(64) for _ in range(count)]


def brute_force(batches: list[tuple[str, list[int]]], max_distance: int) -> tuple[list[str], set]:
    """(every id, {(id, id, distance)} of every pair within ``max_distance``, the smaller id first) from the
    inputs: ``(batch, fingerprints)``, the ids being ``<batch>-<position>``."""
    rows = [(f"{name}-{i}", fp) for name, fingerprints in batches for i, fp in enumerate(fingerprints)]
    pairs = {(*sorted((a, b)), (fa ^ fb).bit_count()) for i, (b, fb) in enumerate(rows) for a, fa in rows[:i]
             if (fa ^ fb).bit_count() <= max_distance}
    return [name for name, _ in rows], pairs


def stored_pairs(index) -> set:
    """The index's pairs as :func:`brute_force` gives them."""
    return {(*sorted((p.a, p.b)), p.distance) for p in index.pairs()}


@pytest.mark.citus
@pytest.mark.slow_on_citus
def test_a_merge_that_starts_while_relayout_builds_its_indexes_waits_outside_postgresql(
        database_url, schema, admin_engine, backend):
    """Issue 34 item 7: relayout holds the migrate lock while it builds each segment's index with CREATE INDEX
    CONCURRENTLY, which waits for every transaction older than its snapshot. A merge (`simdb compact`, or
    the one an ingest runs after each chunk) that waited for that lock inside a transaction was one of
    them: a deadlock, broken by PostgreSQL stopping one side. Here the merges start between two of the
    relayout's index builds, deterministically; they wait without holding a snapshot, or skip (an ingest's),
    and everything ends: the pairs are brute force's, every id is stored once. On Citus, on the layout by id: a
    keyed index's documents have no key columns, so its relayout builds no segment indexes (it rebuilds the keys
    table in one transaction under the ingest lock; tests/test_keyed.py has lookups go on meanwhile)."""
    rng = random.Random(34)
    batches = [("s0", [rng.getrandbits(64) for _ in range(300)])]
    by_id = {"distributed_layout": "id"} if backend.startswith("citus") else {}
    with Index.create(database_url, schema=schema, max_distance=3, segment_size=100, merge_factor=2,
                      bulk_chunk=40, **by_id) as index:
        index.add_fingerprinted(make_batch(batches[0][1], "s0"), batch="s0")
        stored = list(batches[0][1])
        for number in range(1, 4):  # bulk segments that the policy wants merged
            batches.append((f"s{number}", fingerprints_near(rng, stored, 50, f"s{number}")))
            index.add_fingerprinted(make_batch(batches[-1][1], f"s{number}"), batch=f"s{number}")
        assert len(index.segments()) >= 4
        concurrent = [(f"c{number}", fingerprints_near(rng, batches[0][1], 60, f"c{number}")) for number in range(2)]
        words = [f"w{i}" for i in range(200)]
        texts = [" ".join(rng.choices(words, k=30)) for _ in range(50)]
        texts += [text.replace("w1 ", "w2 ", 1) for text in texts[:10]]
        compact_waits, started = threading.Event(), []

        def ingest_then_merge(name, fingerprints):
            with Index.open(database_url, schema=schema) as other:
                other.add_fingerprinted(make_batch(fingerprints, name), batch=name)
                return other.compact(progress=lambda message: "waiting" in message and compact_waits.set())

        def ingest_texts():  # in bulk chunks, merging after each one as an ingest does
            with Index.open(database_url, schema=schema) as other:
                return other.ingest((Document(f"t-{i}", text, {}) for i, text in enumerate(texts)),
                                    IngestOptions(batch="t", chunk_size=40))

        with Concurrently() as threads:
            def between_index_builds(message):
                if not message.startswith("indexed") or started:
                    return
                started.extend([threads.start(ingest_texts), threads.start(ingest_then_merge, *concurrent[0])])
                # each merges now, or waits for the relayout: outside PostgreSQL (or skips, the ingest's), or
                # (before the fix) inside it
                until(lambda: started[0].done() and (compact_waits.is_set() or started[1].done())
                      or waiting_for(admin_engine, schema, "migrate"), "the merges wait or end")

            index.relayout(5, progress=between_index_builds)
            threads.start(ingest_then_merge, *concurrent[1])
        assert started and index.layout.blocks == 5
        index.compact()
        batches.append(("t", [index.fingerprint(text) for text in texts]))
        order, pairs = brute_force(batches + concurrent, 3)
        stored_ids = [document["id"] for document in index.export()]
        assert sorted(stored_ids) == sorted(order)
        assert stored_pairs(index) == pairs and len(pairs) > 50


def test_a_chunk_never_waits_for_a_segment_that_relayout_is_indexing(database_url, schema, admin_engine):
    """Issue 34 item 7: CREATE INDEX CONCURRENTLY holds a SHARE UPDATE EXCLUSIVE lock on the segment it indexes
    while it waits for every older transaction, an ingest's chunk among them; the chunk that sealed that
    segment waited for the same lock (to ANALYZE it): a deadlock. Here a second connection holds that lock,
    as the index build does, while a chunk runs past the end of the segment: the chunk goes on without
    waiting, and its pairs are brute force's."""
    rng = random.Random(7)
    batches = [("s0", [rng.getrandbits(64) for _ in range(60)])]
    with Index.create(database_url, schema=schema, max_distance=3, segment_size=100) as index:
        index.add_fingerprinted(make_batch(batches[0][1], "s0"), batch="s0")
        (active,) = [s for s in index.segments() if s.active]
        batches.append(("s1", fingerprints_near(rng, batches[0][1], 80, "s1")))  # past its end: it is sealed
        with Concurrently() as threads, admin_engine.connect() as relayout:  # the lock goes before the wait
            relayout.exec_driver_sql(f'LOCK TABLE {schema}."{active.name}" IN SHARE UPDATE EXCLUSIVE MODE')
            chunk = threads.start(index.add_fingerprinted, make_batch(batches[1][1], "s1"), batch="s1")

            def waiting() -> bool:
                with admin_engine.connect() as connection:
                    return connection.execute(sa.text(
                        "SELECT count(*) FROM pg_locks WHERE relation = CAST(:t AS regclass) AND NOT granted"),
                        {"t": f'{schema}."{active.name}"'}).scalar_one() > 0

            until(lambda: chunk.done() or waiting(), "the chunk ends or waits")
            assert chunk.done(), "the chunk waits for the lock that an index build holds on its segment"
            relayout.rollback()
        order, pairs = brute_force(batches, 3)
        assert sorted(document["id"] for document in index.export()) == sorted(order)
        assert stored_pairs(index) == pairs and pairs


@pytest.mark.citus
@pytest.mark.slow_on_citus
def test_relayout_beside_concurrent_ingests_merges_and_lookups_keeps_every_pair(database_url, schema,
                                                                                 admin_engine):
    """Issue 34 item 7, as a user meets it: relayout while ingests (merging after each chunk), merges and lookups
    go on, each in its own thread; none fails (deadlock detected was two of three tries), the pairs are brute
    force's and every id is stored once."""
    rng = random.Random(77)
    batches = [("s0", [rng.getrandbits(64) for _ in range(400)])]
    words = [f"w{i}" for i in range(200)]
    texts = [" ".join(rng.choices(words, k=30)) for _ in range(60)]
    with Index.create(database_url, schema=schema, max_distance=3, segment_size=100, merge_factor=2,
                      bulk_chunk=30) as index:
        index.add_fingerprinted(make_batch(batches[0][1], "s0"), batch="s0")
        concurrent = [(f"c{n}", fingerprints_near(rng, batches[0][1], 40, f"c{n}")) for n in range(6)]

        def reopened(work):
            """``work(index)`` on an index opened afresh, again when the relayout's switch came in between
            (a process holding the old layout stops, and nothing of what it was doing is kept)."""
            for _ in range(5):
                with Index.open(database_url, schema=schema) as other:
                    try:
                        return work(other)
                    except IncompatibleIndex:
                        continue
            raise AssertionError("the layout kept changing")

        def ingests_and_merges(numbers):
            for number in numbers:
                reopened(lambda other: other.add_fingerprinted(make_batch(concurrent[number][1], f"c{number}"),
                                                               batch=f"c{number}"))
                reopened(lambda other: other.compact())

        def ingest_texts():  # one chunk per batch, merging after it
            for number in range(2):
                part = list(enumerate(texts))[30 * number:30 * (number + 1)]
                reopened(lambda other: other.ingest((Document(f"t-{i}", text, {}) for i, text in part),
                                                    IngestOptions(batch=f"t{number}", chunk_size=30)))

        def lookups():
            for fingerprint in batches[0][1][:40]:
                assert reopened(lambda other: other.query_fingerprint(fingerprint))

        with Concurrently() as threads:
            threads.start(index.relayout, 5)
            threads.start(ingests_and_merges, [0, 1, 2])
            threads.start(ingests_and_merges, [3, 4, 5])
            threads.start(ingest_texts)
            threads.start(lookups)
        assert index.layout.blocks == 5
    with Index.open(database_url, schema=schema) as index:
        index.compact()
        order, pairs = brute_force([*batches, *concurrent, ("t", [index.fingerprint(text) for text in texts])], 3)
        assert sorted(document["id"] for document in index.export()) == sorted(order)
        assert stored_pairs(index) == pairs and len(pairs) > 50
        assert [match.external_id for match in index.query_fingerprint(batches[0][1][0])][0] == "s0-0"


def test_an_index_opened_while_a_relayout_switches_opens_with_the_new_layout(database_url, schema, monkeypatch):
    """Issue 34 item 7: Index.open read the layout, then the key columns, in two statements; a relayout's switch
    that committed between them made it say "the schema was changed by hand". Here the settings are read as
    they stood just before the switch (deterministically): the open reads them again and takes the new layout."""
    from simdb.pg import catalog

    with Index.create(database_url, schema=schema, max_distance=3) as index:
        index.add_fingerprinted(make_batch([random.getrandbits(64) for _ in range(20)], "a"), batch="a")
        with index.database.engine.connect() as connection:
            before_switch = catalog.load_settings(connection)
        index.relayout(5)
    real, calls = catalog.load_settings, []

    def read_before_the_switch(connection):
        calls.append(1)
        return before_switch if len(calls) == 1 else real(connection)

    monkeypatch.setattr(catalog, "load_settings", read_before_the_switch)
    with Index.open(database_url, schema=schema) as reopened:
        assert reopened.layout.blocks == 5 and len(calls) == 2


def planted_records(rng: random.Random, count: int, earlier: list[dict], prefix: str) -> list[dict]:
    """``count`` texts of 200 words, half of them one of ``earlier`` with a word changed (near copies)."""
    words = [f"w{i}" for i in range(400)]
    records: list[dict] = []
    for i in range(count):
        if earlier and i % 2:
            text = rng.choice(earlier)["text"].split()
            at = rng.randrange(len(text))
            text[at] = rng.choice([word for word in words if word != text[at]])
            text = " ".join(text)
        else:
            text = " ".join(rng.choices(words, k=200))
        records.append({"id": f"{prefix}-{i}", "text": text})
    return records


@pytest.mark.citus
@pytest.mark.slow_on_citus
@pytest.mark.citus_by_id
def test_an_index_opened_before_a_relayout_answers_as_brute_force_or_says_to_open_it_again(database_url, schema):
    """A process that opened the index before another relaid it out still computes the old layout's keys. Each of
    its lookups (one, a batch over two connections, query_many, check) gives brute force's answer or the one clear
    error that says to open the index again: never fewer matches. On the keyed layout its probes of the rebuilt
    keys table (renamed into the old one's place) found almost nothing; by id a batch failed on a dropped key
    column with PostgreSQL's message."""
    rng = random.Random(43)
    stored = planted_records(rng, 60, [], "a")
    stored += planted_records(rng, 60, stored, "b")
    checked = planted_records(rng, 40, stored, "c")
    with Index.create(database_url, schema=schema, max_distance=3) as index:
        index.add_many(stored, batch="a")
        fingerprints = {record["id"]: index.fingerprint(record["text"]) for record in stored + checked}

    def near(text: str, among: list[dict] = stored) -> list[tuple[str, int]]:
        """[(id, distance)] of the records ``among`` within 3 of ``text``, in their order: by brute force."""
        fingerprint = index.fingerprint(text)
        return [(record["id"], (fingerprints[record["id"]] ^ fingerprint).bit_count()) for record in among
                if (fingerprints[record["id"]] ^ fingerprint).bit_count() <= 3]

    queries = [record["text"] for record in rng.sample(stored, 30)] + [record["text"] for record in checked]
    expected = [set(near(text)) for text in queries]
    assert sum(len(found) for found in expected) > 35  # each stored text finds itself, and near copies
    verdicts = []
    for i, record in enumerate(checked):  # the earliest match: stored ones first, then the input's earlier ones
        found = near(record["text"], stored + checked[:i])
        verdicts.append(("near", *found[0]) if found else ("new", None, None))
    assert sum(status == "near" for status, _, _ in verdicts) > 5

    stale = Index.open(database_url, schema=schema)
    assert [{(m.external_id, m.distance) for m in stale.query(text)} for text in queries] == expected  # prepared
    with Index.open(database_url, schema=schema) as other:
        other.relayout(5)
    lookups = {
        "query": lambda: [{(m.external_id, m.distance) for m in stale.query(text)} for text in queries],
        "query_fingerprint": lambda: [{(m.external_id, m.distance) for m in stale.query_fingerprint(
            stale.fingerprint(text))} for text in queries],
        "query_many": lambda: [{(m.external_id, m.distance) for m in found} for found in stale.query_many(queries)],
        "query_fingerprints over 2 connections": lambda: [
            {(m.external_id, m.distance) for m in found}
            for found in stale.query_fingerprints([stale.fingerprint(text) for text in queries], connections=2)],
        "check": lambda: [(v.status, v.duplicate_of, v.distance) for v in stale.check_many(checked)],
    }
    outcomes = {}
    for name, lookup in lookups.items():
        try:
            answers = lookup()
        except IncompatibleIndex as error:
            assert str(error) == ("the index was re-laid out since this process opened it (blocks 4 -> 5): "
                                  "open it again"), name
            outcomes[name] = "open it again"
            continue
        assert answers == (verdicts if name == "check" else expected), name
        outcomes[name] = "exact"
    for name, read in {"stats": stale.stats, "report": lambda: build_report(stale)}.items():  # key columns too
        with pytest.raises(IncompatibleIndex) as raised:
            read()
        assert str(raised.value) == ("the index was re-laid out since this process opened it (blocks 4 -> 5): "
                                     "open it again"), name
    stale.close()
    assert outcomes["query_many"] == outcomes["check"] == "open it again"  # they read the old key columns
    with Index.open(database_url, schema=schema) as reopened:  # opened again, it answers
        assert [{(m.external_id, m.distance) for m in found} for found in reopened.query_many(queries)] == expected
        assert [(v.status, v.duplicate_of, v.distance) for v in reopened.check_many(checked)] == verdicts
