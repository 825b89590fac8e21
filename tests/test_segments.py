"""Segments: documents spread over id-range partitions give the same answers as one table, through
ingest, concurrent ingest, merges, removal and relayout; merges are atomic and follow their policy."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simdb import Index
from simdb.errors import IncompatibleIndex, SimdbError
from simdb.pg import segments
from simdb.pg.methods import sql_of
from simdb.pg.segments import SegmentPolicy
from simdb.text import content_hash
from tests.conftest import (Concurrently, _distributed, assert_consistent, check_property, count_rows, examples,
                            killed)
from tests.test_clusters import histories, replay
from tests.test_index import flip, make_batch


def segment_rows(engine, schema):
    with engine.connect() as connection:
        connection.exec_driver_sql(f"SET search_path = {schema}")
        return segments.list_segments(connection, distributed=_distributed(engine, schema), counts=True)


def snapshot(engine, schema):
    """Everything a merge must keep: every document row, every pair."""
    with engine.connect() as connection:
        documents = connection.exec_driver_sql(
            f"SELECT * FROM {schema}.documents ORDER BY id").all()
        pairs = connection.exec_driver_sql(f"SELECT a_id, b_id, distance FROM {schema}.near_duplicates "
                                           "ORDER BY 1, 2").all()
    return [tuple(row) for row in documents], [tuple(row) for row in pairs]


# -- the policy ------------------------------------------------------------------------------------

def test_the_policy_merges_runs_of_one_tier_and_cascades():
    policy = SegmentPolicy(size=100, merge_factor=4)
    assert policy.plan([100, 100, 100]) == []
    assert policy.plan([100, 100, 100, 100]) == [[0, 1, 2, 3]]
    # three of tier 1 and four of tier 0: the four merge into a fourth of tier 1, and those four merge again
    assert policy.plan([400, 400, 400, 100, 100, 100, 100]) == [[0, 1, 2, 3, 4, 5, 6]]
    assert policy.plan([1600, 400, 100, 100]) == []
    assert policy.plan([1600, 400, 100, 100], full=True) == [[0, 1, 2, 3]]
    assert policy.plan([1600], full=True) == []
    assert SegmentPolicy(size=100, merge_factor=2).plan([100, 100]) == [[0, 1]]


def test_the_policy_sizes_tiers_by_documents_from_the_smaller_of_segment_and_bulk_chunk():
    policy = SegmentPolicy(size=1000, merge_factor=4, bulk_chunk=100)  # tiers from 100 documents
    assert [policy.tier(n) for n in (0, 1, 100, 399, 400, 1000, 1599, 1600)] == [0, 0, 0, 0, 1, 1, 1, 2]
    # four bulk chunks merge; an active segment sealed early (30 documents in 1,000 ids) merges with them
    assert policy.plan([120, 110, 100, 130]) == [[0, 1, 2, 3]]
    assert policy.plan([1000, 30, 120, 110, 100]) == [[1, 2, 3, 4]]
    assert policy.plan([1000, 1000, 1000, 120, 110, 100, 130]) == [[0, 1, 2, 3, 4, 5, 6]]


def test_segment_counts_stay_logarithmic_as_an_archive_grows():
    policy = SegmentPolicy(size=1, merge_factor=4)
    widths = []
    for _ in range(1000):
        widths.append(1)
        for run in policy.plan(widths):
            widths[run[0]:run[-1] + 1] = [sum(widths[run[0]:run[-1] + 1])]
        assert len(widths) <= 3 * 5 + 1  # (factor - 1) per tier, log4(1000) < 5 tiers
    assert sum(widths) == 1000


@pytest.mark.parametrize("size, factor", [(0, 4), (10, 1), (2.5, 4)])
def test_a_bad_policy_is_refused(size, factor):
    with pytest.raises(Exception, match="segment size|merge factor"):
        SegmentPolicy(size=size, merge_factor=factor)


# -- ingest over segments ----------------------------------------------------------------------------

@pytest.mark.citus
@pytest.mark.slow_on_citus
@pytest.mark.citus_by_id  # the layout by id's candidate join over segments
def test_ingest_creates_segments_as_ids_advance_and_finds_every_pair(database_url, schema, admin_engine):
    rng = random.Random(7)
    base = [rng.getrandbits(64) for _ in range(40)]
    with Index.create(database_url, schema=schema, segment_size=10, merge_factor=3) as index:
        for number in range(6):
            fingerprints = [fp ^ (1 << rng.randrange(64)) if rng.random() < 0.7 else rng.getrandbits(64)
                            for fp in rng.sample(base, 15)]
            index.add_fingerprinted(make_batch(fingerprints, f"b{number}"), batch=f"b{number}")
            assert_consistent(admin_engine, schema)
        stored = segment_rows(admin_engine, schema)
        assert len(stored) == 9 and [s.active for s in stored] == [False] * 8 + [True]
        assert all(s.end_id - s.first_id == 10 for s in stored)
        assert sum(s.documents for s in stored) == 90
        before = snapshot(admin_engine, schema)
        summary = index.compact()
        assert [len(m["replaced"]) for m in summary.merged] == [3, 3]  # 8 sealed: two runs of three merge
        assert [s.width for s in segment_rows(admin_engine, schema)] == [30, 30, 10, 10, 10]
        assert snapshot(admin_engine, schema) == before
        assert_consistent(admin_engine, schema)
        index.add_fingerprinted(make_batch(base[:5], "after"), batch="after")
        assert_consistent(admin_engine, schema)
        assert index.query_fingerprint(base[0])  # stored in the merged segment and found again


def test_init_again_compares_the_segment_settings_it_is_given(database_url, schema, run):
    with Index.create(database_url, schema=schema, segment_size=5000, merge_factor=3):
        pass
    with Index.create(database_url, schema=schema, exist_ok=True, segment_size=5000) as same:
        assert same.settings.segments == SegmentPolicy(size=5000, merge_factor=3, bulk_chunk=50_000)
    with Index.create(database_url, schema=schema, exist_ok=True):  # not asked: not compared
        pass
    with pytest.raises(IncompatibleIndex, match="segment_size: asked 6000, stored 5000"):
        Index.create(database_url, schema=schema, exist_ok=True, segment_size=6000)
    result = run("init", "--merge-factor", "4")
    assert result.exit_code == 1 and "merge_factor: asked 4, stored 3" in result.output
    result = run("init", "--bulk-chunk", "1000")
    assert result.exit_code == 1 and "bulk_chunk: asked 1000, stored 50000" in result.output


def index_names(engine, schema, table):
    """The index definitions of a table, with its name taken out of them."""
    with engine.connect() as connection:
        return sorted(re.sub(rf"\b{table}\w*|documents\w*", "T", d) for d in connection.execute(sa.text(
            "SELECT indexdef FROM pg_indexes WHERE schemaname = :s AND tablename = :t"),
            {"s": schema, "t": table}).scalars())


@pytest.mark.citus
def test_a_bulk_chunk_gets_a_segment_of_its_own_indexed_like_the_others(database_url, schema, admin_engine, backend):
    rng = random.Random(5)
    base = [rng.getrandbits(64) for _ in range(50)]

    def near(count):
        return [fp ^ (1 << rng.randrange(64)) if rng.random() < 0.5 else rng.getrandbits(64)
                for fp in rng.choices(base, k=count)]

    with Index.create(database_url, schema=schema, segment_size=100, merge_factor=4, bulk_chunk=40) as index:
        for number, count in enumerate([10, 60, 40, 5, 39, 45]):
            index.add_fingerprinted(make_batch(near(count), f"b{number}"), batch=f"b{number}")
            assert_consistent(admin_engine, schema)
        stored = segment_rows(admin_engine, schema)
        # 10 in an active segment, sealed early; 60 and 40 alone; 5 and 39 share a new active segment; 45 alone
        assert [(s.width, s.documents) for s in stored] == [(100, 10), (60, 60), (40, 40), (100, 44), (45, 45)]
        # analyzed when sealed, for the policy; a distributed segment's rows are on the workers: sized by its width
        assert [s.estimated for s in stored[:-1]] == ([10, 60, 40, 44] if backend == "postgres" else [None] * 4)
        assert [s.first_id for s in stored] == [1, 101, 161, 201, 301]
        reference = index_names(admin_engine, schema, stored[0].name)
        assert len(reference) == len(index_names(admin_engine, schema, "documents"))  # each of documents' own
        for segment in stored[1:]:
            assert index_names(admin_engine, schema, segment.name) == reference, segment.name
        with admin_engine.connect() as connection:  # attached without a range check left behind
            assert not connection.execute(sa.text(
                "SELECT count(*) FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace "
                "WHERE n.nspname = :s AND c.conname LIKE '%range'"), {"s": schema}).scalar_one()
        assert index.query_fingerprint(base[0])


@pytest.mark.citus
def test_a_failed_bulk_chunk_leaves_no_table_behind(database_url, schema, admin_engine):
    from simdb.errors import InputError
    from simdb.ingest import FingerprintedBatch

    with Index.create(database_url, schema=schema, segment_size=100, bulk_chunk=10) as index:
        index.add_fingerprinted(make_batch([random.getrandbits(64) for _ in range(20)], "b0"), batch="b0")
        before = segment_rows(admin_engine, schema)
        batch = FingerprintedBatch()
        for i in range(20):  # b0's first id again, with another text: an error after the bulk table was made
            batch.append("b0-0" if i == 15 else f"x{i}", random.getrandbits(64),
                         content_hash(f"other {i}"), 10, {}, f"x:{i + 1}")
        with pytest.raises(InputError, match="different text"):
            index.add_fingerprinted(batch, batch="b1")
        assert segment_rows(admin_engine, schema) == before
        with admin_engine.connect() as connection:
            tables = connection.execute(sa.text(
                "SELECT tablename FROM pg_tables WHERE schemaname = :s AND tablename LIKE 'documents\\_%'"),
                {"s": schema}).scalars().all()
        assert sorted(tables) == sorted(s.name for s in before)
        index.add_fingerprinted(make_batch([random.getrandbits(64) for _ in range(20)], "b2"), batch="b2")
        assert_consistent(admin_engine, schema)


@pytest.mark.citus
@pytest.mark.slow_on_citus
@pytest.mark.citus_by_id  # the layout by id's candidate join over segments
def test_ingest_merges_between_its_chunks(database_url, schema, admin_engine):
    from simdb import Document
    from simdb.ingest import IngestOptions

    rng = random.Random(9)
    words = [f"w{i}" for i in range(400)]
    texts = [" ".join(rng.choices(words, k=30)) for _ in range(120)]
    seen = []  # the segments as each document is taken in

    with Index.create(database_url, schema=schema, segment_size=1000, merge_factor=2, bulk_chunk=20) as index:
        summary = index.ingest((Document(f"d{i}", text, {}) for i, text in enumerate(texts + texts[:40])),
                               IngestOptions(batch="one", chunk_size=20),
                               progress=lambda _: seen.append(len(segment_rows(admin_engine, schema))))
        # eight bulk chunks of 20, merged pairwise as they come: at most one segment per tier waits, where
        # merging after the batch would have let all eight pile up
        assert summary.compacted and summary.documents == 160 and summary.exact_duplicates == 40
        assert max(seen) <= 3 and len(segment_rows(admin_engine, schema)) <= 4, seen
    assert_consistent(admin_engine, schema)


def test_a_merge_that_fails_mid_batch_leaves_the_batch_to_finish(database_url, schema, admin_engine):
    """Merging is housekeeping: when it fails (here its lock times out, once, after 5 s, behind an analyst's
    open transaction), the batch goes on unmerged, is complete and says so, and ``compact`` merges later."""
    from simdb import Document
    from simdb.ingest import IngestOptions

    rng = random.Random(3)
    texts = [" ".join(rng.choices([f"w{i}" for i in range(400)], k=30)) for _ in range(100)]
    with Index.create(database_url, schema=schema, segment_size=1000, merge_factor=2, bulk_chunk=20) as index:
        index.add_many([{"id": "first", "text": texts[0]}], batch="zero")
        with admin_engine.connect() as analyst:  # reads documents, and keeps its transaction open
            analyst.exec_driver_sql(f"SELECT count(*) FROM {schema}.documents").scalar_one()
            summary = index.ingest((Document(f"d{i}", text, {}) for i, text in enumerate(texts)),
                                   IngestOptions(batch="one", chunk_size=20))
            analyst.rollback()
        assert summary.documents == 100 and summary.compacted == []
        assert "lock" in summary.merge_failed and "simdb compact" in str(summary)
        assert summary.to_json()["merge_failed"] == summary.merge_failed
        with admin_engine.connect() as connection:
            assert connection.exec_driver_sql(f"SELECT status FROM {schema}.batches WHERE name = 'one'"
                                              ).scalar_one() == "complete"
        assert len(segment_rows(admin_engine, schema)) >= 5  # five bulk chunks, none merged
        assert index.compact().merged
    assert_consistent(admin_engine, schema)


def merged_and_removed_on_a_fresh_index(database_url, admin_engine, schema, fresh_index, history, merge_after
                                        ) -> None:
    # chunks of three or more documents are bulk-loaded into segments of their own, smaller ones are not; each
    # example on an index as created
    with fresh_index(segment_size=4, merge_factor=2, bulk_chunk=3) as index:
        # a merge after some chunks, beside a concurrent ingest when one runs
        replay(database_url, admin_engine, schema, index, history,
               after_chunk=lambda number: merge_after[number % 20] and index.compact())
        index.compact(full=True)
        assert_consistent(admin_engine, schema)
        assert len([s for s in segment_rows(admin_engine, schema) if not s.active]) <= 1


@pytest.mark.citus
@pytest.mark.slow_on_citus
def test_segments_merges_and_removals_keep_pairs_and_clusters_exact(backend, database_url, admin_engine, schema,
                                                                   fresh_index):
    check_property(backend, 25, merged_and_removed_on_a_fresh_index, database_url, admin_engine, schema, fresh_index,
                   history=histories(), merge_after=st.lists(st.booleans(), min_size=20, max_size=20))


@pytest.mark.citus
def test_an_id_is_stored_once_across_segments_under_concurrent_ingests(database_url, schema, admin_engine):
    """No unique index spans segments: the ingest lock and the set-based check keep ids unique. The
    same ids with the same texts are re-runs (skipped); with other texts, errors."""
    from simdb.ingest import FingerprintedBatch

    with Index.create(database_url, schema=schema, segment_size=5):
        pass

    def ingest(number):
        batch = FingerprintedBatch()
        for i in range(12):
            text = f"text {i}" if number % 2 == 0 else f"other text {i}"  # two texts per id
            batch.append(f"same-{i}", random.getrandbits(64), content_hash(text), 10, {}, f"t{number}:{i + 1}")
        with Index.open(database_url, schema=schema) as other:
            return other.add_fingerprinted(batch, batch=f"t{number}").documents

    with Concurrently() as threads:
        for number in range(6):
            threads.start(ingest, number)
        outcomes = threads.outcomes()  # each one's documents stored, or the error it met
    stored = [outcome for outcome in outcomes if not isinstance(outcome, BaseException)]
    errors = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
    with admin_engine.connect() as connection:
        ids = connection.exec_driver_sql(f"SELECT external_id FROM {schema}.documents").scalars().all()
    assert sorted(ids) == sorted(set(ids)) and len(ids) == 12
    assert sorted(stored) == [0, 0, 12] and len(errors) == 3  # the first stores; its twins skip; the others fail
    assert all("different text" in str(error) for error in errors), errors


def test_ingests_that_start_during_a_full_merge_wait_for_it_and_keep_every_pair(database_url, schema, admin_engine,
                                                                                 monkeypatch):
    """Three ingests start while a full merge holds the ingest lock (it is held inside the merge until they
    have all begun); each brings near copies of stored documents and of the others' documents. They wait
    for the merge, and the full compaction's later rounds interleave with them (each round takes the lock
    anew): the pairs, earliest matches and clusters are brute force's."""
    rng = random.Random(12)
    stored = [rng.getrandbits(64) for _ in range(600)]
    with Index.create(database_url, schema=schema, segment_size=100, merge_factor=64, bulk_chunk=50) as index:
        for number in range(6):
            index.add_fingerprinted(make_batch(stored[100 * number:100 * (number + 1)], f"s{number}"),
                                    batch=f"s{number}")
    assert len(segment_rows(admin_engine, schema)) >= 6
    shared = [rng.getrandbits(64) for _ in range(30)]  # near copies of these come in every concurrent batch
    batches = [make_batch([flip(fp, rng.sample(range(64), 2)) for fp in rng.sample(stored, 40)]
                          + [flip(fp, [rng.randrange(64)]) for fp in shared], f"c{number}") for number in range(3)]

    merging, started = threading.Event(), threading.Event()
    real_merge = segments.merge

    def held_merge(*args, **kwargs):  # the merge holds the ingest lock until every ingest has begun
        merging.set()
        started.wait(30)
        time.sleep(0.5)  # the ingests reach the lock
        return real_merge(*args, **kwargs)

    monkeypatch.setattr(segments, "merge", held_merge)
    errors, summaries = [], []

    def run(work):
        try:
            with Index.open(database_url, schema=schema) as index:
                summaries.append(work(index))
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    merge = threading.Thread(target=run, args=(lambda index: index.compact(full=True),))
    merge.start()
    assert merging.wait(30)
    ingests = [threading.Thread(target=run, args=(lambda index, b=batch, n=number: index.add_fingerprinted(
        b, batch=f"c{n}"),)) for number, batch in enumerate(batches)]
    for thread in ingests:
        thread.start()
    started.set()
    for thread in [merge, *ingests]:
        thread.join(120)
    assert not errors, errors
    assert len(summaries) == 4
    # the six merged into one, and the merge's next rounds may have taken the ingests' segments in too
    after = segment_rows(admin_engine, schema)
    assert after[0].documents >= 600 and sum(s.documents for s in after) == 600 + 3 * 70
    rows = assert_consistent(admin_engine, schema)
    assert len(rows) == 600 + 3 * 70 and sum(dup is not None for _, dup in rows) >= 3 * 40 + 2 * 30


# -- merges are atomic -------------------------------------------------------------------------------

@pytest.mark.citus
@pytest.mark.slow_on_citus
def test_a_merge_killed_at_any_moment_leaves_the_old_segments(database_url, schema, admin_engine):
    rng = random.Random(3)
    with Index.create(database_url, schema=schema, segment_size=1000) as index:
        for number in range(8):
            index.add_fingerprinted(make_batch([rng.getrandbits(64) for _ in range(1000)], f"b{number}"),
                                    batch=f"b{number}")
    before, names_before = snapshot(admin_engine, schema), [s.name for s in segment_rows(admin_engine, schema)]
    merged = [names_before[0], names_before[-1]]
    environment = {**os.environ, "SIMDB_DATABASE_URL": database_url, "SIMDB_SCHEMA": schema}
    delay, names = 0.4, names_before
    while names != merged:  # kill ever later, until a merge gets through
        process = subprocess.Popen([sys.executable, "-m", "simdb", "compact", "--full"], env=environment,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(delay)
        killed(process)
        for _ in range(50):  # until the server has noticed the lost connection and rolled back
            with admin_engine.connect() as connection:
                if not connection.execute(sa.text(
                        "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
                        "WHERE c.relname LIKE '%merged'")).scalar_one():
                    break
            time.sleep(0.1)
        names = [s.name for s in segment_rows(admin_engine, schema)]
        assert names in (names_before, merged)
        assert snapshot(admin_engine, schema) == before
        with admin_engine.connect() as connection:
            assert not connection.execute(sa.text(
                "SELECT count(*) FROM pg_tables WHERE schemaname = :s AND tablename LIKE '%merged'"),
                {"s": schema}).scalar_one()
        delay *= 1.5
    assert_consistent(admin_engine, schema)


# -- lookups use every segment's indexes ---------------------------------------------------------------

def test_lookups_use_the_indexes_of_every_segment(database_url, schema, admin_engine):
    rng = random.Random(11)
    fingerprints = [rng.getrandbits(64) for _ in range(300)]
    with Index.create(database_url, schema=schema, segment_size=100) as index:
        for number in range(3):
            index.add_fingerprinted(make_batch(fingerprints[number * 100:(number + 1) * 100], f"b{number}"),
                                    batch=f"b{number}")
        assert len(index.segments()) == 3
        probe = fingerprints[150]
        notices = []
        with admin_engine.connect() as connection:
            connection.exec_driver_sql(f"SET search_path = {schema}")
            connection.exec_driver_sql("LOAD 'auto_explain'")
            for setting in ("auto_explain.log_min_duration = 0", "auto_explain.log_nested_statements = on",
                            "client_min_messages = log", "enable_seqscan = off"):
                connection.exec_driver_sql(f"SET {setting}")
            connection.connection.dbapi_connection.add_notice_handler(lambda d: notices.append(d.message_primary))
            found = connection.execute(sa.text("SELECT document_id, distance FROM simdb_near(:fp)"),
                                       {"fp": probe - 2**64 if probe >= 2**63 else probe}).all()
        plans = "\n".join(notices)
        assert [distance for _, distance in found] == [0]
        assert "Seq Scan" not in plans
        segments_now = len(index.segments())
        for column in index.layout.key_columns:  # every key of every segment through its own index
            assert plans.count(f"Index Cond: ({column} = ") >= segments_now, (column, plans)


# -- stats, CLI ----------------------------------------------------------------------------------------

@pytest.mark.citus
def test_stats_lists_segments_and_compact_reports_json(run, database_url, schema, tmp_path):
    assert run("init", "--segment-size", "1000", "--merge-factor", "2").exit_code == 0
    path = tmp_path / "docs.jsonl"
    for number in range(3):
        path.write_text("".join(json.dumps({"id": f"{number}-{i}", "text": f"document {number} {i} " * 5}) + "\n"
                                for i in range(700)))
        result = run("ingest", str(path), "--batch", f"b{number}", "--no-compact", "--workers", "1")
        assert result.exit_code == 0, result.output
    result = run("stats", "--json")
    info = json.loads(result.stdout)
    assert [s["documents"] for s in info["segments"]] == [1000, 1000, 100]
    assert info["compaction_due"] is True
    assert info["segment_policy"] == {"size": 1000, "merge_factor": 2, "bulk_chunk": 50_000}
    assert "a merge is due" in run("stats").stdout
    result = run("compact", "--json")
    merged = json.loads(result.stdout)
    assert [m["documents"] for m in merged["merged"]] == [2000]
    assert merged["segments_before"] == 3 and merged["segments_after"] == 2
    assert "nothing to merge" in run("compact").stdout


def test_stats_warns_about_server_settings_below_what_an_archive_needs(index, admin_engine):
    from simdb.pg import server

    with admin_engine.connect() as connection:
        buffers = connection.execute(sa.text("SELECT setting::int8 * 8 FROM pg_settings "
                                             "WHERE name = 'shared_buffers'")).scalar_one()
    warnings = index.stats()["server_warnings"]
    assert any("shared_buffers" in line for line in warnings) == (buffers < server.MINIMUMS["shared_buffers"])
    assert all("ALTER SYSTEM SET" in line or "vm.nr_hugepages=" in line for line in warnings)  # each says what to do


GB = 1024 * 1024  # kB
TRY = {"huge_pages": "try", "shared_memory_size_in_huge_pages": "3152"}
OFF = {"huge_pages": "off", "shared_memory_size_in_huge_pages": "3152"}


def machine(total, free=None, size_kb=2048):
    from simdb.pg.server import HugePages

    return HugePages(total, total if free is None else free, size_kb)


@pytest.mark.parametrize("settings, buffers, here, expected", [
    # the server on this machine: what it lacks, and the command that gives it
    (OFF, 6 * GB, machine(0), ["huge_pages is off", "ALTER SYSTEM SET huge_pages = 'try'",
                               "sysctl -w vm.nr_hugepages=3152"]),
    (TRY, 6 * GB, machine(0), ["runs without huge pages", "sysctl -w vm.nr_hugepages=3152"]),
    (TRY, 6 * GB, machine(3151), ["runs without huge pages", "sysctl -w vm.nr_hugepages=3152"]),
    (TRY, 6 * GB, machine(200, free=100), ["sysctl -w vm.nr_hugepages=3252"]),  # another's 100 kept
    ({**TRY, "huge_pages_status": "off"}, 6 * GB, machine(3160), ["3,160 huge pages free, enough"]),
    (TRY, 6 * GB, machine(3160), None),
    ({**TRY, "huge_page_size": "1048576"}, 6 * GB, machine(0), None),  # counted in 1 GB pages, not meminfo's
    ({**TRY, "huge_page_size": "2048"}, 6 * GB, machine(0), ["sysctl -w vm.nr_hugepages=3152"]),
    ({"huge_pages": "on", "shared_memory_size_in_huge_pages": "3152"}, 6 * GB, machine(0, size_kb=2048), None),
    # a server elsewhere: only PostgreSQL 17's word that it runs without what it asks for
    (OFF, 6 * GB, None, None),  # set off on purpose, perhaps (a container, a managed service)
    (TRY, 6 * GB, None, None),  # before 17, unknowable
    ({**TRY, "huge_pages_status": "off"}, 6 * GB, None, ["runs without the huge pages it asks for", "3,152"]),
    ({**TRY, "huge_pages_status": "on"}, 6 * GB, machine(0), None),
    # nothing to say
    ({"huge_pages": "off", "shared_memory_size_in_huge_pages": "80"}, 128 * 1024, machine(0), None),  # small
    ({"huge_pages": "off", "shared_memory_size_in_huge_pages": "-1"}, 6 * GB, machine(0), None),  # no huge pages
    ({"huge_pages": "off"}, 6 * GB, machine(0), None),  # PostgreSQL 13-14: no count to give
])
def test_stats_asks_for_huge_pages_where_shared_buffers_are_mapped_4_kb_at_a_time(settings, buffers, here,
                                                                                    expected):
    """A batch of new lookups into 10M took 9,000-21,000 page faults on a fresh connection and ran 1.5x slower
    without huge pages (docs/performance.md): the warning says what to do, and only where it knows."""
    from simdb.pg import server

    line = server.huge_pages_warning(settings, buffers, here)
    if expected is None:
        assert line is None, line
    else:
        assert line is not None and all(part in line for part in expected) and "restart" in line, line


def test_the_huge_pages_this_machine_has_are_read_from_meminfo(tmp_path):
    from simdb.pg import server

    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nHugePages_Total:    3160\nHugePages_Free:     3086\n"
                       "HugePages_Rsvd:     3078\nHugepagesize:       2048 kB\n")
    assert server.machine_huge_pages(meminfo) == server.HugePages(3160, 8, 2048)  # 3,078 a running server holds
    meminfo.write_text("MemTotal:       24000000 kB\n")
    assert server.machine_huge_pages(meminfo) is None
    assert server.machine_huge_pages(tmp_path / "absent") is None


def test_a_server_is_on_this_machine_when_its_backend_is_a_process_here(admin_engine):
    """A tunnel or proxy on 127.0.0.1 leads to a server elsewhere: the machine's huge pages say nothing of it."""
    from simdb.pg import server

    with admin_engine.connect() as connection:
        pid = connection.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()
        here = server.on_this_machine(connection)
    host = admin_engine.url.host or ""
    if host not in ("", "localhost", "127.0.0.1", "::1") and not host.startswith("/"):
        pytest.skip(f"the test server is at {host}")
    # the tests' server runs here (its backend is a process here), unless in a PID namespace of its own
    assert here == Path(f"/proc/{pid}").exists()


def test_recommended_settings_scale_with_memory():
    from simdb.pg import server

    small, large = server.recommended(4 * 2**30), server.recommended(64 * 2**30)
    assert small["shared_buffers"] == "1024MB" and large["shared_buffers"] == "16384MB"
    assert small["max_wal_size"] == "16GB" and small["wal_compression"] == "on"
    # lz4 where the server has it: pglz made index builds 2.6x slower
    assert server.recommended(compressions=["pglz", "lz4", "on", "off"])["wal_compression"] == "lz4"


def test_stats_advises_lz4_over_pglz_where_the_server_has_it(index):
    from simdb.pg import server

    with index.database.engine.connect() as connection:
        offered = server.wal_compressions(connection)
        connection.exec_driver_sql("SET wal_compression = pglz")
        advice = server.warnings(connection)
    assert "pglz" in offered
    assert any("ALTER SYSTEM SET wal_compression = 'lz4'" in line for line in advice) == ("lz4" in offered)


@pytest.mark.parametrize("shared", [False, True], ids=["one connection", "shared"])
@pytest.mark.parametrize("method", ["simhash", "minhash"])
def test_a_chunk_looks_its_keys_up_in_a_large_segment_whatever_the_planner_thinks(database_url, schema, method,
                                                                                   shared, monkeypatch):
    """Regression: the candidate join of a chunk against ``documents`` was the planner's choice, and at 10M
    it chose a hash join over a full scan of a segment's key index (34 s against about 5 s of lookups).
    Against a segment wider than the chunk, every key is looked up through the segment's index, on the
    chunk's connection and on the second one that shares the lookups of a large chunk."""
    import numpy as np

    from simdb.ingest import FingerprintedBatch
    from simdb.pg import in_memory
    from simdb.pg import probes as shared_probes
    from tests.conftest import explained

    monkeypatch.setattr(shared_probes, "SHARED_PROBES", 1 if shared else 10**9)
    monkeypatch.setattr(in_memory, "ROWS_PER_PROBE", 1)  # 20,000 for 4,000 probes: read into memory otherwise

    rng = np.random.default_rng(3)

    def batch(prefix: str, count: int) -> FingerprintedBatch:
        made = FingerprintedBatch()
        for i in range(count):
            sketch = (rng.bytes(512) if method == "minhash" else int(rng.integers(0, 2**63)))
            made.append(f"{prefix}-{i}", sketch, content_hash(f"{prefix}-{i}"), 10, {}, f"{prefix}:{i}")
        return made

    options = {"method": "minhash", "threshold": 0.8} if method == "minhash" else {}
    with Index.create(database_url, schema=schema, **options) as index:
        index.add_fingerprinted(batch("archive", 20_000), batch="archive")
        with index.database.engine.connect() as connection:
            connection.exec_driver_sql("ANALYZE documents")
        with explained(index.database.engine) as plans:
            summary = index.add_fingerprinted(batch("new", 4_000), batch="new")
    assert summary.new == 4_000
    segment = segments.segment_name(1)
    probes = [plan for plan in plans if f'"{segment}"' in plan.split("\n", 1)[0] and "COPY" in plan]
    assert probes, "no candidate query against the segment"
    assert any("spread_probes" in plan for plan in probes) == shared
    for plan in probes:
        assert f"Seq Scan on {segment}" not in plan and not re.search(r"(Hash|Merge) Cond: \(\w+\.key_", plan), plan
        assert "Index Cond: (key_" in plan or "Index Cond: (band_" in plan, plan


def test_a_chunk_looks_its_external_ids_up_in_a_large_segment_and_finds_every_stored_one(database_url, schema):
    """Regression: the check that a chunk's external ids are not stored yet was one join of the staging table
    with ``documents``, and the planner hashed the chunk's ids against a sequential scan of every segment
    (7-11 s for 100k ids against 3M stored documents, growing with the archive). Against a segment larger than
    the chunk, each id is now looked up in the segment's ``external_id`` index; against a smaller one, the
    planner's join. Whichever way, every id stored before with the same text is found (a re-run: already
    stored), in the large segment and in the small one, and one stored with another text is refused."""
    from simdb.errors import InputError
    from tests.conftest import explained

    rng = random.Random(36)
    archive = [rng.getrandbits(64) for _ in range(6_000)]
    small = [rng.getrandbits(64) for _ in range(30)]
    with Index.create(database_url, schema=schema, segment_size=100, bulk_chunk=1_000) as index:
        index.add_fingerprinted(make_batch(archive, "archive"), batch="archive")  # a bulk segment of 6,000
        index.add_fingerprinted(make_batch(small, "small"), batch="small")  # through an active segment of 100
        again = sorted(rng.sample(range(len(archive)), 300))
        again_small = sorted(rng.sample(range(len(small)), 10))
        chunk = make_batch([rng.getrandbits(64) for _ in range(1_700)], "new")
        for i in again:  # the archive's own documents, ingested again: same id, same text
            chunk.append(f"archive-{i}", archive[i], content_hash(f"archive-{i}"), 10, {}, f"again-{i}")
        for i in again_small:
            chunk.append(f"small-{i}", small[i], content_hash(f"small-{i}"), 10, {}, f"again-small-{i}")
        with explained(index.database.engine) as plans:
            summary = index.add_fingerprinted(chunk, batch="rerun")
        assert (summary.documents, summary.already_stored, summary.new) == (1_700, 310, 1_700)
        with index.database.engine.connect() as connection:
            statuses = dict(connection.exec_driver_sql(
                "SELECT r.external_id, r.status FROM records r JOIN batches b ON b.id = r.batch_id "
                "WHERE b.name = 'rerun'").all())
        assert {name for name, status in statuses.items() if status == "already_stored"} == \
            {f"archive-{i}" for i in again} | {f"small-{i}" for i in again_small}

        changed = make_batch([rng.getrandbits(64)], "other")
        changed.append(f"archive-{again[0] + 1}", archive[again[0] + 1], content_hash("another text"), 10, {}, "x")
        with pytest.raises(InputError, match=f"archive-{again[0] + 1}"):
            index.add_fingerprinted(changed, batch="changed")
    large = segments.segment_name(1)
    checks = [plan for plan in plans if "external_id = p.external_id" in plan.split("\n", 1)[0]
              and f'"{large}"' in plan.split("\n", 1)[0]]
    assert checks, "no external-id check against the large segment by its index"
    for plan in checks:
        assert f"Seq Scan on {large}" not in plan and "Index Cond: (external_id = p0.external_id)" in plan, plan


def test_sealing_analyzes_a_segment_only_when_its_estimate_falls_short_of_its_width(database_url, schema):
    """Regression: a bulk chunk seals the segment before it, and analyzed it whenever the planner's estimate was
    below its width, which a segment of more than ANALYZE's 30,000 sampled pages (a bulk-loaded or merged one,
    full) never reaches exactly: the 3M archive was analyzed again by every chunk that followed it (1.6 s).
    A segment that was never analyzed, or estimates less than 99 % of its width, still is."""
    with Index.create(database_url, schema=schema, bulk_chunk=50) as index:
        index.add_fingerprinted(make_batch([random.Random(5).getrandbits(64) for _ in range(200)], "a"), batch="a")
        (segment,) = [found for found in index.segments() if found.documents]
        assert segment.width == 200
        analyzed = []

        def record(conn, cursor, statement, *args):
            if statement.startswith("ANALYZE"):
                analyzed.append(statement)

        engine = index.database.engine
        sa.event.listen(engine, "before_cursor_execute", record)
        try:
            with engine.begin() as connection:
                for estimated in (200, 199, 198, None, 150, 0):
                    analyzed.clear()
                    segments.seal(connection, [segments.Segment(segment.name, segment.first_id, segment.end_id, False,
                                                                estimated)])
                    assert bool(analyzed) == (estimated is None or estimated < 198), (estimated, analyzed)
        finally:
            sa.event.remove(engine, "before_cursor_execute", record)


def test_a_chunk_compiles_no_jit_on_any_of_its_connections(database_url, schema, monkeypatch):
    """A chunk's statements run without JIT: against a large archive the planner priced its index probes and
    its external-id check past ``jit_inline_above_cost``, and compiling took longer than the statements (1.2 s
    of a 2.2 s check at 3M). Here JIT is asked for every statement (``jit_above_cost = 0``), and the chunk's
    connection and the helper that shares its lookups both run with it off."""
    from simdb.pg import chunks, spread
    from simdb.pg import probes as shared_probes

    monkeypatch.setattr(shared_probes, "SHARED_PROBES", 1)
    seen = []
    real_pairs, real_snapshot = chunks.segment_pairs, spread.on_shared_snapshot

    def pairs(connection, *args, **kwargs):
        seen.append(("chunk", connection.exec_driver_sql("SHOW jit").scalar_one()))
        return real_pairs(connection, *args, **kwargs)

    def snapshot(connection, here, elsewhere):
        return real_snapshot(connection, here, [((lambda other, run=run: seen.append(
            ("helper", other.exec_driver_sql("SHOW jit").scalar_one())) or run(other)), instead)
            for run, instead in elsewhere])

    monkeypatch.setattr(chunks, "segment_pairs", pairs)
    monkeypatch.setattr(spread, "on_shared_snapshot", snapshot)
    rng = random.Random(7)
    with Index.create(database_url, schema=schema, bulk_chunk=100) as index:
        index.database.use_session({"jit": "on", "jit_above_cost": "0"})
        stored = [rng.getrandbits(64) for _ in range(300)]
        index.add_fingerprinted(make_batch(stored, "a"), batch="a")
        summary = index.add_fingerprinted(make_batch([flip(stored[0], [1, 2]), rng.getrandbits(64)], "b"),
                                          batch="b", connections=2)
    assert summary.near_duplicates == 1
    assert ("chunk", "off") in seen and ("helper", "off") in seen and all(jit == "off" for _, jit in seen), seen


# -- a small segment read into memory --------------------------------------------------------------------

def sketches_with_near_copies(method, rng, count: int) -> list:
    """``count`` random sketches of ``method``, half of them near copies of the other half."""
    import numpy as np

    if method.name == "simhash":
        base = [int(x) for x in rng.integers(0, 2**63, count // 2)]
        return base + [b ^ int(sum(1 << int(bit) for bit in rng.choice(64, int(rng.integers(0, 7)), replace=False)))
                       for b in base]
    base = rng.integers(0, 2**32, (count // 2, method.settings.num_perm), dtype=np.uint32)
    near = base.copy()
    for row in near:
        row[rng.choice(len(row), int(rng.integers(0, len(row) // 2)), replace=False)] = 7
    return [row.astype("<u4").tobytes() for row in np.concatenate([base, near])]


@pytest.mark.parametrize("options", [{}, {"method": "minhash", "num_perm": 16, "threshold": 0.7}],
                         ids=["simhash", "minhash"])
def test_a_segment_read_into_memory_gives_the_pairs_its_index_lookups_give(database_url, schema, options,
                                                                            monkeypatch):
    """The in-memory join of probes with a segment's rows, read in several slices of ids, against the
    same probes' candidate join through the segment's key indexes: pair for pair, distance for distance."""
    import numpy as np

    from simdb.ingest import FingerprintedBatch
    from simdb.matches import distinct
    from simdb.pg import in_memory
    from simdb.pg.copy import copy_in

    monkeypatch.setattr(in_memory, "SLICE_IDS", 37)
    rng = np.random.default_rng(8)
    with Index.create(database_url, schema=schema, **options) as index:
        method = index.settings.method
        stored_sketches = sketches_with_near_copies(method, rng, 400)
        batch = FingerprintedBatch()
        for i, sketch in enumerate(stored_sketches):
            batch.append(f"s-{i}", sketch, content_hash(f"s-{i}"), 10, {}, f"s:{i}")
        index.add_fingerprinted(batch, batch="stored")
        # probes: near copies of stored sketches and of each other, exact copies, and strangers
        probe_sketches = sketches_with_near_copies(method, rng, 60) + stored_sketches[::7]
        if method.name == "simhash":
            probe_sketches += [s ^ 1 for s in stored_sketches[1::9]]
        ids = np.arange(10_000, 10_000 + len(probe_sketches), dtype=np.int64)
        stored, keys = method.stored(probe_sketches), method.keys(probe_sketches)
        assert method.stored_keys(stored).tolist() == keys.tolist()  # keys from the column's form too
        k = method.candidate_distance(method.max_distance)
        with index.database.engine.begin() as connection:
            columns = [("id", "int8"), sql_of(method).sketch_column, *((c, "int8") for c in method.key_columns)]
            copy_in(connection, f"probes_t ({', '.join(n for n, _ in columns)})", [t for _, t in columns],
                    ((int(i), s, *row) for i, s, row in zip(ids, stored, keys.tolist())), create=True)
            [segment] = segments.list_segments(connection, distributed=index.context.distributed)
            by_index = distinct(sql_of(method).candidate_pairs(connection, "probes_t", f'"{segment.name}"', k,
                                                               index_probes=True))
            read = distinct(in_memory.segment_pairs_in_memory(
                connection, method, segment.name, segment.first_id, segment.first_id + 400,
                in_memory.MemoryProbes.of(method, ids, stored, keys), k))
    assert read.tolist() == by_index.tolist()
    assert len(read) >= 60 and (read[:, 2] == 0).sum() >= len(stored_sketches[::7])


@pytest.mark.parametrize("method", ["simhash", "minhash"])
def test_segments_read_into_memory_over_two_connections_give_one_connections_pairs(database_url, admin_engine,
                                                                                   method, monkeypatch):
    """The slices of the segments a chunk reads into memory, dealt to its connection and a helper reading its
    exported snapshot (a spy shows that the helper read some; MinHash verifies by signatures read by id there):
    the same duplicates, pairs and clusters as on one connection; SimHash's, brute force's."""
    import numpy as np

    from simdb.ingest import FingerprintedBatch
    from simdb.pg import in_memory, probes

    monkeypatch.setattr(in_memory, "ROWS_PER_PROBE", 10**6)  # every segment read, none looked up
    monkeypatch.setattr(in_memory, "MIN_SLICE_IDS", 16)
    monkeypatch.setattr(in_memory, "SLICE_IDS", 40)
    monkeypatch.setattr(probes, "SHARED_PROBES", 1)
    readers, real = [], in_memory._read
    monkeypatch.setattr(in_memory, "_read", lambda *a: readers.append(threading.current_thread().name) or real(*a))
    rng, numbers = random.Random(17), np.random.default_rng(17)
    if method == "simhash":
        options, batches, fingerprints = {"max_distance": 3}, [], []
        for number in range(4):
            batches.append(make_batch(near_and_far(rng, fingerprints, 80, 3), f"b{number}"))
            fingerprints += batches[-1].sketches
    else:
        from simdb.methods import MinHash

        options, batches = {"method": "minhash", "num_perm": 16, "threshold": 0.7}, []
        sketches = sketches_with_near_copies(MinHash.new(num_perm=16, threshold=0.7), numbers, 320)
        order = numbers.permutation(len(sketches))
        for number in range(4):
            batch = FingerprintedBatch()
            for at in order[number * 80:(number + 1) * 80].tolist():
                batch.append(f"m-{at}", sketches[at], content_hash(f"m-{at}"), 10, {}, f"m:{at}")
            batches.append(batch)
    answers = []
    for connections in (1, 2):
        readers.clear()
        schema = f"simdb_test_{uuid.uuid4().hex[:12]}"
        try:
            with Index.create(database_url, schema=schema, segment_size=100, **options) as index:
                for number, batch in enumerate(batches):
                    index.add_fingerprinted(batch, batch=f"b{number}", connections=connections)
            if method == "simhash":
                assert_consistent(admin_engine, schema)  # against brute force over the inputs stored
            answers.append(stored_answers(admin_engine, schema))
        finally:
            with admin_engine.begin() as connection:
                connection.exec_driver_sql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        assert any(name.startswith("simdb-spread-") for name in readers) == (connections == 2), readers
    assert answers[0] == answers[1] and answers[0][1], "reading over two connections changed the pairs"


@pytest.mark.parametrize("method", ["simhash", "minhash"])
def test_staging_is_analyzed_by_the_columns_it_is_joined_by(database_url, schema, admin_engine, method,
                                                            monkeypatch):
    """Regression: ANALYZE staging computed statistics of every column (a MinHash chunk's 21 band keys and 512-byte
    signatures: 0.35 of its 0.44 s per 100k), which no plan of the chunk used on one server. Now of the id and
    external id alone; the chunk still finds its duplicates in a stored segment and among its own."""
    from simdb.pg import chunks

    analyzed, real = [], chunks.segment_pairs

    def pairs(connection, *args, **kwargs):
        analyzed.append(set(connection.exec_driver_sql(
            "SELECT attname FROM pg_stats WHERE schemaname = pg_my_temp_schema()::regnamespace::text AND tablename = 'staging'").scalars()))
        return real(connection, *args, **kwargs)

    monkeypatch.setattr(chunks, "segment_pairs", pairs)
    rng = random.Random(5)
    with Index.create(database_url, schema=schema, **({"method": "minhash"} if method == "minhash" else {})) as index:
        texts = [" ".join(rng.choices([f"w{i}" for i in range(500)], k=60)) for _ in range(40)]
        index.add_many([{"id": f"a{i}", "text": text} for i, text in enumerate(texts)], batch="a")
        summary = index.add_many([{"id": f"b{i}", "text": text} for i, text in enumerate(texts[:10])]
                                 + [{"id": "c", "text": "a text of its own"}, {"id": "d", "text": "a text of its own"}],
                                 batch="b")
    assert analyzed == [{"id", "external_id"}] * 2
    assert (summary.exact_duplicates, summary.within_batch) == (11, 1)


def test_an_archive_of_small_segments_read_into_memory_keeps_every_pair(database_url, schema, admin_engine,
                                                                       monkeypatch):
    """Chunks met with small segments in memory (a spy shows they were), beside index lookups into the
    ones too large to read: every pair within k is stored, as brute force finds them."""
    from simdb.pg import in_memory

    read, real = [], segments.segment_pairs_in_memory
    monkeypatch.setattr(segments, "segment_pairs_in_memory", lambda *a: read.append(a[2]) or real(*a))
    monkeypatch.setattr(in_memory, "SLICE_IDS", 50)
    monkeypatch.setattr(in_memory, "ROWS_PER_PROBE", 2)
    rng = random.Random(4)
    with Index.create(database_url, schema=schema, segment_size=120) as index:
        k = index.settings.method.max_distance
        fingerprints = []
        for number, size in enumerate([300, 40, 90, 40, 200, 30]):
            batch = []
            for _ in range(size):
                if fingerprints and rng.random() < 0.4:
                    batch.append(rng.choice(fingerprints) ^ sum(1 << b for b in rng.sample(range(64), rng.randint(0, k + 1))))
                else:
                    batch.append(rng.getrandbits(64))
            index.add_fingerprinted(make_batch(batch, f"b{number}"), batch=f"b{number}")
            fingerprints += batch
            if number % 2:  # else the segments have no estimate: their largest ids bound them
                with index.database.engine.connect() as connection:
                    connection.exec_driver_sql("ANALYZE documents")
    assert read, "no segment was read into memory"
    assert_consistent(admin_engine, schema)


# -- a second connection shares a chunk's lookups -------------------------------------------------------

def stored_answers(engine, schema):
    with engine.connect() as connection:
        documents = connection.exec_driver_sql(
            f"SELECT external_id, duplicate_of, duplicate_distance, cluster_id FROM {schema}.documents ORDER BY id")
        pairs = connection.exec_driver_sql(f"SELECT a_id, b_id, distance FROM {schema}.near_duplicates ORDER BY 1, 2")
        return [tuple(row) for row in documents], [tuple(row) for row in pairs]


@pytest.mark.parametrize("method", ["simhash", "minhash"])
def test_lookups_shared_with_a_second_connection_give_the_same_pairs(database_url, admin_engine, method,
                                                                    monkeypatch):
    from simdb.pg import in_memory, probes

    monkeypatch.setattr(in_memory, "ROWS_PER_PROBE", 0)  # every segment looked up by index, none read
    rng = random.Random(21)
    words = [f"w{i}" for i in range(300)]
    texts = [" ".join(rng.choices(words, k=40)) for _ in range(150)]
    batches = [[(f"b{n}-{i}", text if rng.random() < 0.5 else text + f" extra{n}")
                for i, text in enumerate(rng.sample(texts, 60))] for n in range(4)]
    options = {"method": "minhash", "threshold": 0.5} if method == "minhash" else {}
    calls = []
    real = segments.spread_lookups
    monkeypatch.setattr(segments, "spread_lookups", lambda *args: calls.append(args[3]) or real(*args))
    answers = []
    for shared in (False, True):
        monkeypatch.setattr(probes, "SHARED_PROBES", 1 if shared else 10**9)
        schema = f"simdb_test_{uuid.uuid4().hex[:12]}"
        try:
            with Index.create(database_url, schema=schema, segment_size=100, **options) as index:
                for number, batch in enumerate(batches):
                    index.add_many([{"id": i, "text": t} for i, t in batch], batch=f"b{number}")
                if method == "simhash":
                    assert_consistent(admin_engine, schema)
            answers.append(stored_answers(admin_engine, schema))
        finally:
            with admin_engine.begin() as connection:
                connection.exec_driver_sql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    assert answers[0] == answers[1] and answers[0][1], "sharing the lookups changed the pairs"
    # the later chunks looked up the wide segments by index, half on each connection
    assert calls and all(any(lookup.index_probes for lookup in lookups) for lookups in calls)


def near_and_far(rng: random.Random, earlier: list[int], count: int, k: int) -> list[int]:
    """``count`` fingerprints: half near copies (0 to k + 1 bits away) of ``earlier`` ones, where there are any."""
    return [rng.choice(earlier) ^ sum(1 << b for b in rng.sample(range(64), rng.randint(0, k + 1)))
            if earlier and rng.random() < 0.5 else rng.getrandbits(64) for _ in range(count)]


@pytest.fixture
def spread_everything(monkeypatch):
    """Every chunk spreads its lookups, every segment is looked up by index; the shares' (thread, probe table)
    are recorded."""
    from simdb.pg import in_memory, probes, spread

    monkeypatch.setattr(in_memory, "ROWS_PER_PROBE", 0)
    monkeypatch.setattr(probes, "SHARED_PROBES", 1)
    shares, real = [], spread._pairs_of
    monkeypatch.setattr(spread, "_pairs_of", lambda method, connection, probe, share, k: shares.append(
        (threading.current_thread().name, probe)) or real(method, connection, probe, share, k))
    return shares


def test_a_chunk_spread_over_one_or_three_connections_stores_brute_forces_pairs(database_url, admin_engine,
                                                                                spread_everything):
    """The lookups of each chunk into the archive's segments on 1 connection, then over 3 (the chunk's and two
    helpers reading its exported snapshot): the same duplicates, pairs and clusters, each brute force's."""
    rng = random.Random(36)
    fingerprints: list[int] = []
    batches = []
    for number in range(5):
        batch = near_and_far(rng, fingerprints, 90, 3)
        batches.append(batch)
        fingerprints += batch
    answers = []
    for connections in (1, 3):
        spread_everything.clear()
        schema = f"simdb_test_{uuid.uuid4().hex[:12]}"
        try:
            with Index.create(database_url, schema=schema, max_distance=3, segment_size=100) as index:
                for number, batch in enumerate(batches):
                    index.add_fingerprinted(make_batch(batch, f"b{number}"), batch=f"b{number}",
                                            connections=connections)
            assert_consistent(admin_engine, schema)  # against brute force over the inputs stored
            answers.append(stored_answers(admin_engine, schema))
        finally:
            with admin_engine.begin() as connection:
                connection.exec_driver_sql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        helpers = {probe for thread, probe in spread_everything if thread.startswith("simdb-spread-")}
        assert helpers == ({"spread_probes_1", "spread_probes_2"} if connections == 3 else set())
    assert answers[0] == answers[1] and answers[0][1], "spreading the lookups changed the pairs"


def test_chunks_spread_over_connections_beside_concurrent_ingests_keep_every_pair(database_url, schema,
                                                                                  admin_engine, spread_everything):
    """Four ingests at once, each chunk's lookups over 3 connections, near copies of each other's documents:
    each chunk's helpers see every chunk committed before it took the ingest lock (its exported snapshot),
    so every pair within k is stored, as brute force over what was stored finds them."""
    rng = random.Random(7)
    seed = [rng.getrandbits(64) for _ in range(150)]
    streams = [[near_and_far(rng, seed, 60, 3) for _ in range(3)] for _ in range(4)]
    with Index.create(database_url, schema=schema, max_distance=3, segment_size=100) as index:
        index.add_fingerprinted(make_batch(seed, "seed"), batch="seed", connections=3)

        def ingest(writer: int) -> None:
            for number, batch in enumerate(streams[writer]):
                index.add_fingerprinted(make_batch(batch, f"w{writer}-{number}"), batch=f"w{writer}-{number}",
                                        connections=3)

        with Concurrently() as threads:
            for writer in range(4):
                threads.start(ingest, writer)
            threads.results()
    assert any(thread.startswith("simdb-spread-") for thread, _ in spread_everything)
    assert len(assert_consistent(admin_engine, schema)) == 150 + 4 * 3 * 60


def test_an_error_in_a_helper_connection_is_raised_and_nothing_is_stored(database_url, schema, admin_engine,
                                                                         spread_everything, monkeypatch):
    """A helper's error that the database did not report (a bug, not a lock it would not wait for) is raised
    in the ingest, whose chunk then stores nothing."""
    from simdb.pg import spread

    real = spread.copy_in

    def failing(connection, table, *args, **kwargs):
        if table.startswith("spread_probes_"):
            raise RuntimeError("a helper failed")
        return real(connection, table, *args, **kwargs)

    rng = random.Random(5)
    with Index.create(database_url, schema=schema, max_distance=3, segment_size=100) as index:
        index.add_fingerprinted(make_batch([rng.getrandbits(64) for _ in range(150)], "a"), batch="a")
        monkeypatch.setattr(spread, "copy_in", failing)
        with pytest.raises(RuntimeError, match="a helper failed"):
            index.add_fingerprinted(make_batch([rng.getrandbits(64) for _ in range(50)], "b"), batch="b",
                                    connections=2)
    assert count_rows(admin_engine, schema) == (150, 1)


def test_a_chunk_stored_inside_a_savepoint_keeps_to_its_own_connection(database_url, schema, admin_engine,
                                                                       spread_everything):
    """PostgreSQL exports no snapshot from a subtransaction: a chunk stored inside a caller's savepoint runs
    every lookup itself instead of failing the caller's transaction."""
    from simdb.pg.chunks import store_chunk

    rng = random.Random(9)
    archive = [rng.getrandbits(64) for _ in range(150)]
    with Index.create(database_url, schema=schema, max_distance=3, segment_size=100) as index:
        index.add_fingerprinted(make_batch(archive, "a"), batch="a")
        spread_everything.clear()
        new = near_and_far(rng, archive, 60, 3)
        with index.database.engine.begin() as connection, connection.begin_nested():
            store_chunk(connection, schema, index.settings.method, make_batch(new, "b"), name="b", source="test",
                        first=True, final=True, position=len(new), skip_errors=False, connections=3,
                        distributed=index.context.distributed, keyed=index.context.keyed)
    assert spread_everything and not any(t.startswith("simdb-spread-") for t, _ in spread_everything)
    assert len(assert_consistent(admin_engine, schema)) == 210


@pytest.mark.parametrize("connections, read_only", [(1, False), (3, False), (3, True)],
                         ids=["one", "three", "three-read-only"])
def test_a_batch_of_lookups_over_one_or_three_connections_is_brute_forces_answer(database_url, schema, monkeypatch,
                                                                                  connections, read_only):
    """``query_fingerprints`` of a batch (near copies at 0 to k + 1 bits, and random probes) against an archive in
    several segments (bulk chunks and an active one), its key columns' statements over 1 or 3 connections
    reading one snapshot (probes in temporary tables; or, in read-only transactions as the reader role and
    ``simdb check`` read, as arrays): each probe's matches are brute force's over the stored fingerprints."""
    from simdb.pg import spread

    shares, jit = [], []
    real = spread.on_shared_snapshot

    def recorded(connection, here, elsewhere):  # how many helpers, and the jit setting each statement ran with
        shares.append(len(elsewhere))
        jit.append(connection.exec_driver_sql("SHOW jit").scalar_one())
        return real(connection, here, [((lambda other, run=run: jit.append(other.exec_driver_sql(
            "SHOW jit").scalar_one()) or run(other)), instead) for run, instead in elsewhere])

    monkeypatch.setattr(spread, "on_shared_snapshot", recorded)
    rng = random.Random(36 + connections)
    stored: list[int] = []
    with Index.create(database_url, schema=schema, max_distance=3, segment_size=100, bulk_chunk=50) as index:
        for number, size in enumerate((120, 60, 30, 20)):  # bulk chunks, then a chunk through the active segment
            batch = near_and_far(rng, stored, size, 3)
            index.add_fingerprinted(make_batch(batch, f"b{number}"), batch=f"b{number}")
            stored += batch
        assert len(index.segments()) >= 3
        probes = near_and_far(rng, stored, 80, 3)
        if read_only:  # every connection from now on, the helpers' too
            index.database.use_session({"default_transaction_read_only": "on"})
        found = index.query_fingerprints(probes, connections=connections)
        names = {f"b{number}-{i}": fp for number, batch in enumerate(
            [stored[:120], stored[120:180], stored[180:210], stored[210:]]) for i, fp in enumerate(batch)}
    assert shares == [connections - 1]
    assert jit == ["off"] * connections  # compiling the join cost more than a batch's lookups (reads.without_jit)
    for probe, matches in zip(probes, found):
        expected = sorted((bin(probe ^ fp).count("1"), name) for name, fp in names.items()
                          if bin(probe ^ fp).count("1") <= 3)
        assert sorted((m.distance, m.external_id) for m in matches) == expected
    assert any(found), "no probe found anything: the test tests nothing"


@pytest.mark.parametrize("read_only", [False, True], ids=["probes-table", "read-only"])
def test_a_merge_that_commits_as_a_batch_of_lookups_begins_hides_no_document(database_url, schema, admin_engine,
                                                                             monkeypatch, read_only):
    """A batch of lookups reads one snapshot (REPEATABLE READ), taken by its first statement, while the segments
    were locked by its first lookup: a merge that committed between the two gave the lookups the new segment,
    whose rows the merge wrote after the snapshot, and every document of the merged segments went missing
    (60 of 180 stored probes found themselves; found in review). The batch now locks the documents first: the
    merge waits for it."""
    from simdb.pg import reads

    rng = random.Random(38)
    stored: list[int] = []
    with Index.create(database_url, schema=schema, max_distance=3, segment_size=100, bulk_chunk=50) as index:
        for number in range(3):
            batch = [rng.getrandbits(64) for _ in range(60)]
            index.add_fingerprinted(make_batch(batch, f"b{number}"), batch=f"b{number}")
            stored += batch
        assert len(index.segments()) >= 3
        if read_only:
            index.database.use_session({"default_transaction_read_only": "on"})
        real, started = reads.without_jit, []

        def merge_meanwhile(connection):  # in the batch's transaction, after its first statement took the snapshot
            real(connection)
            if started:  # once
                return
            connection.exec_driver_sql("SELECT 1")
            merging = threads.start(merge)
            started.append(merging)
            deadline = time.monotonic() + 60
            while not merging.done() and not waiting() and time.monotonic() < deadline:
                time.sleep(0.05)  # until the merge has committed (the bug) or waits for the batch's lock

        def merge():
            with Index.open(database_url, schema=schema) as other:
                return other.compact(full=True)

        def waiting() -> bool:  # a lock on this index's tables asked for and not granted: the merge's
            with admin_engine.connect() as connection:
                return connection.execute(sa.text(
                    "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation JOIN pg_namespace n "
                    "ON n.oid = c.relnamespace WHERE NOT l.granted AND n.nspname = :schema"),
                    {"schema": schema}).scalar() > 0

        monkeypatch.setattr(reads, "without_jit", merge_meanwhile)
        with Concurrently() as threads:
            found = index.query_fingerprints(stored, connections=1)
            (merged,) = threads.results()
        monkeypatch.setattr(reads, "without_jit", real)
        assert merged.merged, "nothing was merged: the test tests nothing"
        assert len(index.segments()) < 3
    for probe, matches in zip(stored, found):
        expected = sorted(i for i, fp in enumerate(stored) if bin(probe ^ fp).count("1") <= 3)
        assert sorted(int(m.external_id.split("-")[1]) + 60 * int(m.external_id[1]) for m in matches) == expected


def test_spreading_over_more_connections_than_an_index_holds_is_refused(database_url, schema):
    """An open index's pool holds 15 connections: a chunk or a batch asking for more would wait for connections
    it holds itself (each helper 30 s, then its share runs on the first connection). Refused up front."""
    from simdb.ingest import IngestOptions
    from simdb.settings import MAX_CONNECTIONS

    with pytest.raises(ValueError, match="connections must be between 1 and 15"):
        IngestOptions(connections=MAX_CONNECTIONS + 1)
    assert IngestOptions(connections=MAX_CONNECTIONS).connections == 15
    with Index.create(database_url, schema=schema, max_distance=3) as index:
        assert index.database.engine.pool.size() + index.database.engine.pool._max_overflow == MAX_CONNECTIONS
        with pytest.raises(SimdbError, match="connections. must be between 1 and 15"):
            index.query_fingerprints([1, 2], connections=16)
        with pytest.raises(SimdbError, match="connections. must be between 1 and 15"):
            index.query_fingerprints([1, 2], connections=0)
        assert index.query_fingerprints([1], connections=15) == [[]]


def test_ingest_refuses_more_connections_than_an_index_holds(run, tmp_path):
    """``simdb ingest --connections 16``: a usage error naming the range, nothing ingested."""
    path = tmp_path / "docs.jsonl"
    path.write_text('{"id": "a", "text": "one two three four"}\n')
    assert run("init").exit_code == 0
    result = run("ingest", "--connections", "16", str(path))
    assert result.exit_code == 2 and "1<=x<=15" in result.output, result.output


def test_a_shared_lookup_that_would_wait_on_a_queued_lock_gives_way(database_url, schema, admin_engine,
                                                                    monkeypatch):
    """A statement queued for an exclusive lock on a segment (as `ALTER TABLE documents` in a relayout)
    waits for the chunk's transaction, which holds a share lock on every segment; the second connection's
    lookups would queue behind it and the chunk would wait for them: a deadlock PostgreSQL cannot see.
    The second connection gives up after its lock timeout and the chunk does the lookups itself."""
    from simdb.pg import probes, spread

    monkeypatch.setattr(probes, "SHARED_PROBES", 1)
    monkeypatch.setattr(spread, "LOCK_WAIT", "300ms")
    rng = random.Random(4)
    archive = [rng.getrandbits(64) for _ in range(500)]
    with Index.create(database_url, schema=schema, segment_size=1000) as index:
        index.add_fingerprinted(make_batch(archive, "archive"), batch="archive")
        segment = segments.segment_name(1)
        queued = threading.Event()
        locker = {}

        def lock_the_segment():
            with admin_engine.connect() as connection:
                locker["pid"] = connection.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
                connection.exec_driver_sql(f'LOCK TABLE {schema}."{segment}" IN ACCESS EXCLUSIVE MODE')
                locker["got"] = time.monotonic()
                connection.commit()

        real = segments.spread_lookups
        threads = Concurrently()

        def shared_after_a_queued_lock(*args):
            threads.start(lock_the_segment)
            for _ in range(100):  # until the exclusive lock waits behind this chunk's share lock
                with admin_engine.connect() as connection:
                    if locker.get("pid") and connection.execute(sa.text(
                            "SELECT count(*) FROM pg_locks WHERE pid = :pid AND NOT granted"),
                            {"pid": locker["pid"]}).scalar_one():
                        queued.set()
                        break
                time.sleep(0.05)
            return real(*args)

        monkeypatch.setattr(segments, "spread_lookups", shared_after_a_queued_lock)
        near = [fp ^ (1 << rng.randrange(64)) for fp in archive[:20]]
        with threads:  # the locking thread's error, if it met one, is raised here
            summary = index.add_fingerprinted(make_batch(near + [rng.getrandbits(64) for _ in range(20)], "new"),
                                              batch="new")
            finished = time.monotonic()
            threads.results(timeout=30)
    assert queued.is_set() and locker["got"] >= finished - 0.5  # the lock came after the chunk's commit
    assert summary.near_duplicates == 20
    assert_consistent(admin_engine, schema)


def test_a_slice_read_into_memory_holds_no_more_rows_than_the_chunk_has_probes(database_url, schema, monkeypatch):
    """Regression: a segment read into memory came in slices of 262,144 ids whatever the chunk, so an
    ingest's memory grew with the archive (MinHash --verify exact, chunks of 10k: 172 MB at 10k documents,
    283 MB at 100k). A slice now spans at most as many ids as the chunk has probes (or a floor), and the
    pairs are those of brute force."""
    import numpy as np

    from simdb.pg import in_memory

    spans, real = [], in_memory._read
    monkeypatch.setattr(in_memory, "_read",
                        lambda c, m, t, start, end: spans.append(end - start) or real(c, m, t, start, end))
    monkeypatch.setattr(in_memory, "MIN_SLICE_IDS", 64)
    monkeypatch.setattr(in_memory, "ROWS_PER_PROBE", 100)  # the 1,000 stored documents are read, not probed
    rng = np.random.default_rng(11)
    with Index.create(database_url, schema=schema) as index:
        k = index.settings.method.max_distance
        stored = [int(x) for x in rng.integers(0, 2**63, 1_000)]
        index.add_fingerprinted(make_batch(stored, "stored"), batch="stored")
        near = [s ^ (1 << int(rng.integers(0, 64))) for s in stored[:90]]
        index.add_fingerprinted(make_batch(near, "near"), batch="near")
        pairs = {(p.a, p.b) for p in index.pairs(batch="near")}
    assert spans and max(spans) <= 90, spans
    expected = {(f"stored-{i}", f"near-{j}") for j, b in enumerate(near) for i, a in enumerate(stored)
                if bin(a ^ b).count("1") <= k}
    expected |= {(f"near-{i}", f"near-{j}") for j, b in enumerate(near) for i, a in enumerate(near)
                 if i < j and bin(a ^ b).count("1") <= k}
    assert pairs == expected


# -- gaps in the ids ----------------------------------------------------------------------------------

def brute_force_pairs(sketcher, records, max_distance):
    """{(earlier id, later id, distance)} of every record pair within ``max_distance``, from the input texts in
    the order they were stored."""
    fingerprints = [(record["id"], sketcher(record["text"])) for record in records]
    return {(a, b, (fa ^ fb).bit_count()) for i, (b, fb) in enumerate(fingerprints) for a, fa in fingerprints[:i]
            if (fa ^ fb).bit_count() <= max_distance}


@pytest.mark.citus
@pytest.mark.slow_on_citus
def test_a_failed_bulk_chunk_leaves_a_gap_that_later_merges_and_ingests_take_in_their_stride(
        run, database_url, schema, tmp_path):
    """Issue 34 item 6: a bulk chunk that fails uses up its ids (sequences do not roll back), so the next bulk
    segment starts after a gap. The merge policy then merged segments with a gap between them: every merge
    failed ("not adjacent"), and every later ingest stored one chunk, exited 1 and offered to resume a batch
    that was complete. Segments merge whatever gaps their ids have; the pairs are brute force's."""
    rng = random.Random(34)
    words = [f"w{i}" for i in range(300)]
    bases = [rng.choices(words, k=40) for _ in range(30)]

    def records(prefix, count):  # near copies of a few shared texts, so that the batches pair up
        out = []
        for i in range(count):
            text = list(rng.choice(bases))
            text[rng.randrange(40)] = rng.choice(words)
            out.append({"id": f"{prefix}-{i}", "text": " ".join(text)})
        return out

    def ingest(name, batch):
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps(record) + "\n" for record in batch))
        return run("ingest", str(path), "--batch", name, "--chunk-size", "20", "--workers", "1")

    assert run("init", "--segment-size", "1000", "--merge-factor", "2", "--bulk-chunk", "20").exit_code == 0
    stored = records("a", 40)
    assert ingest("a", stored).exit_code == 0
    failing = records("f", 19) + [{"id": "a-3", "text": "another text under a stored id"}]
    result = ingest("f", failing)  # one bulk chunk, refused whole at its last record
    assert result.exit_code == 1 and "different text" in result.output
    gaps = []
    for name in ("b", "c", "d", "e"):
        batch = records(name, 40)
        result = ingest(name, batch)
        assert result.exit_code == 0, result.output
        assert "merging segments failed" not in result.output
        stored += batch
        with Index.open(database_url, schema=schema) as index:
            listed = index.segments()
            gaps += [(left.end_id, right.first_id) for left, right in zip(listed, listed[1:])
                     if left.end_id != right.first_id]
    assert gaps  # the failed chunk's ids are a gap between two segments, merged over since
    result = run("compact")
    assert result.exit_code == 0, result.output
    with Index.open(database_url, schema=schema) as index:
        ids = [document["id"] for document in index.export()]
        assert sorted(ids) == sorted(record["id"] for record in stored)  # every id exactly once
        pairs = {(p.a, p.b, p.distance) for p in index.pairs()}
        expected = brute_force_pairs(index.fingerprint, stored, index.settings.method.max_distance)
        assert pairs == expected and len(expected) > 100
        assert not index.compact().merged  # the policy is satisfied: nothing left that it cannot merge
        # a segment's range may hold ids never stored: lookups and removals go by the ids that are
        assert any(s.first_id < end <= first < s.end_id for s in index.segments() for end, first in gaps)
        assert stored[0]["id"] in {match.external_id for match in index.query(stored[0]["text"])}
        index.remove(batch="b")
        kept = [record for record in stored if not record["id"].startswith("b-")]
        assert sorted(document["id"] for document in index.export()) == sorted(record["id"] for record in kept)
        assert {(p.a, p.b, p.distance) for p in index.pairs()} == brute_force_pairs(
            index.fingerprint, kept, index.settings.method.max_distance)


def test_a_segment_dropped_while_it_is_listed_is_said_so(database_url, schema):
    """A reader without the ingest lock (compact's listing before it merges, stats) could list the segments
    while a merge dropped one: the catalog rows of its snapshot still held it, but its bound read as NULL, and
    the listing said "a partition bound simdb did not create; detach it" (a concurrent relayout test met it in
    CI). A new statement sees the merge's result, so the listing is tried again; where the reader's snapshot
    cannot move (REPEATABLE READ, as here), it says what happened and to run the command again."""
    rng = random.Random(12)
    with Index.create(database_url, schema=schema, max_distance=3, segment_size=50) as index:
        for number in range(3):
            index.add_fingerprinted(make_batch([rng.getrandbits(64) for _ in range(60)], f"b{number}"),
                                    batch=f"b{number}")
        with index.database.engine.connect() as reader:
            reader = reader.execution_options(isolation_level="REPEATABLE READ")
            with reader.begin():
                before = segments.list_segments(reader, distributed=False)
                assert len(before) > 2
                index.compact(full=True)  # drops the segments it merges, after the reader's snapshot
                with pytest.raises(SimdbError, match="was dropped while it was being listed .* run the command"):
                    segments.list_segments(reader, distributed=False)
            assert len(segments.list_segments(reader, distributed=False)) < len(before)  # a new snapshot


# -- a chunk's staging, written a block of rows at a time ------------------------------------------------

COPIED_COLUMNS = [("a", "int8"), ("b", "text"), ("c", "bytea"), ("d", "int4"), ("e", "jsonb"), ("f", "bytea"),
                  ("g", "int2")]


@st.composite
def columnar_rows(draw):
    """Rows of every type copy_in_columns writes: integers at their extremes, text beyond ASCII, bytea of one width
    (fixed-width fields) and of several or NULL, JSON or NULL."""
    count = draw(st.integers(0, 12))
    width = draw(st.integers(1, 5))
    text = st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=6)
    column = {"int8": st.integers(-2**63, 2**63 - 1), "int4": st.integers(-2**31, 2**31 - 1),
              "int2": st.integers(-2**15, 2**15 - 1)}
    return [(draw(column["int8"]), draw(text), draw(st.binary(min_size=width, max_size=width)), draw(column["int4"]),
             draw(st.none() | st.dictionaries(text, st.integers(-2**70, 2**70) | text, max_size=2)),
             draw(st.none() | st.binary(max_size=4)), draw(column["int2"])) for _ in range(count)]


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=columnar_rows(), block=st.sampled_from([1, 3, 8192]), as_arrays=st.booleans())
def test_columns_copied_a_block_at_a_time_are_the_rows_copied_one_by_one(server_engine, monkeypatch, rows, block,
                                                                        as_arrays):
    """copy_in_columns (a chunk's staging) stores what psycopg's write_row stores of the same rows (copy_in), in
    blocks of rows or all at once, integer columns given as numpy arrays or lists."""
    import numpy as np

    from simdb.pg import copy as copy_module

    monkeypatch.setattr(copy_module, "COLUMN_BLOCK", block)
    definition = ", ".join(f"{name} {kind}" for name, kind in COPIED_COLUMNS)
    with server_engine.begin() as connection:
        for table in ("by_row", "by_column"):
            connection.exec_driver_sql(f"CREATE TEMPORARY TABLE {table} ({definition}, n serial) ON COMMIT DROP")
        copy_module.copy_in(connection, f"by_row ({', '.join(name for name, _ in COPIED_COLUMNS)})",
                            [kind for _, kind in COPIED_COLUMNS], rows)
        columns = []
        for at, (name, kind) in enumerate(COPIED_COLUMNS):
            values = [row[at] for row in rows]
            if as_arrays and kind.startswith("int"):
                values = np.array(values, dtype=np.int64)
            columns.append((name, kind, values))
        copy_module.copy_in_columns(connection, "by_column", columns)
        read = [connection.exec_driver_sql(f"SELECT {', '.join(name for name, _ in COPIED_COLUMNS)} FROM {table} "
                                           "ORDER BY n").all() for table in ("by_row", "by_column")]
    assert [tuple(row) for row in read[1]] == [tuple(row) for row in read[0]]
    assert len(read[0]) == len(rows)


@pytest.mark.parametrize("kind, values, error", [
    ("int4", [1, 2**40], OverflowError), ("int2", [-2**15 - 1], OverflowError),
    ("int8", [2**63], OverflowError), ("int8", [1.9], TypeError)], ids=["int4", "int2", "uint64", "float"])
def test_columns_copied_a_block_at_a_time_refuse_what_their_type_cannot_hold(server_engine, kind, values, error):
    """A numpy array assigned to a narrower field wraps (2**40 into an int4 is 0) and a float truncates: the
    columns' copy refuses both, as psycopg's write_row does, and the table keeps nothing."""
    import numpy as np

    from simdb.pg import copy as copy_module

    array = np.array(values, dtype=np.uint64 if values == [2**63] else None)
    with server_engine.connect() as connection:
        connection.exec_driver_sql(f"CREATE TEMPORARY TABLE narrow (a {kind}, b text)")
        connection.commit()
        try:
            with pytest.raises(error, match=f"column a \\({kind}\\)"), connection.begin():
                copy_module.copy_in_columns(connection, "narrow", [("a", kind, array),
                                                                   ("b", "text", ["x"] * len(array))])
            assert connection.exec_driver_sql("SELECT count(*) FROM narrow").scalar() == 0
        finally:
            connection.rollback()
            connection.exec_driver_sql("DROP TABLE narrow")
            connection.commit()


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.lists(st.integers(-2**63, 2**63 - 1), max_size=40), as_array=st.booleans())
def test_a_bigint_array_parameter_is_the_values_psycopg_sends_as_a_list(server_engine, values, as_array):
    """int8_array (the keyed layout's routed keys and ids, a batch's probes as arrays) sends, in binary, the
    values that psycopg's own text dump of the list sends: the same array back, the same = ANY matches."""
    import numpy as np

    from simdb.pg.copy import copy_out_int64, int8_array

    sent = int8_array(np.array(values, dtype=np.int64) if as_array else values)
    probe = values[0] if values else 0
    statement = ("SELECT CAST(%(a)s AS bigint[]), %(probe)s = ANY(CAST(%(a)s AS bigint[])), "
                 "cardinality(CAST(%(a)s AS bigint[]))")
    with server_engine.connect() as connection:
        ours = connection.exec_driver_sql(statement, {"a": sent, "probe": probe}).one()
        theirs = connection.exec_driver_sql(statement, {"a": values, "probe": probe}).one()
        # bound into the statement's text here, as psycopg binds a COPY's parameters
        copied = list(copy_out_int64(connection, "SELECT unnest(CAST(%(a)s AS bigint[]))", 1, {"a": sent}))
    assert list(ours[0]) == values
    assert tuple(ours) == tuple(theirs)
    assert np.concatenate(copied)[:, 0].tolist() == values


@pytest.mark.parametrize("values, error", [([1.9], TypeError), ([2**63], OverflowError), ([[1, 2]], ValueError),
                                           (["1"], TypeError)], ids=["float", "uint64", "2-d", "text"])
def test_a_bigint_array_parameter_refuses_what_bigint_cannot_hold(values, error):
    """A float would truncate and a uint64 above int64 wrap, silently: int8_array refuses them."""
    import numpy as np

    from simdb.pg.copy import int8_array

    with pytest.raises(error):
        int8_array(np.array(values, dtype=np.uint64) if values == [2**63] else values)
