"""A distributed index on Citus: its layout, where its work runs, and every command on it.

The core correctness tests (brute force, concurrent ingests, kill and resume, removal, clusters,
verdicts, the analysts' SQL) are marked ``citus`` where they are and run on a local cluster too
(conftest); these are the tests only a distributed index has.
"""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa

from simdb import Index, IncompatibleIndex, SimdbError
from simdb.pg import keyed
from simdb.samples import corpus
from tests.conftest import CITUS_SHARDS, assert_consistent
from tests.maintained import assert_field_counts

CORPUS = list(corpus())


#: The test runs on a Citus coordinator (skipped, saying why, where Citus is not installed).
on_citus = pytest.mark.parametrize("backend", ["citus"], indirect=True)


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return str(path)


def test_a_distributed_index_needs_citus_and_says_so(index, database_url, schema, admin_engine):
    """On a server without Citus, --distributed is refused before anything is written; an index whose settings
    say it is distributed does not open there."""
    other = f"{schema}_d"
    try:
        with pytest.raises(SimdbError, match="has no Citus extension"):
            Index.create(database_url, schema=other, distributed=True)
        with admin_engine.connect() as connection:
            assert connection.execute(sa.text("SELECT to_regnamespace(:s)"), {"s": other}).scalar() is None
    finally:
        with admin_engine.begin() as connection:
            connection.exec_driver_sql(f"DROP SCHEMA IF EXISTS {other} CASCADE")
    with pytest.raises(SimdbError, match="is for a distributed index"):
        Index.create(database_url, schema=other, shards=4)
    with admin_engine.begin() as connection:
        connection.execute(sa.text(f"INSERT INTO {schema}.settings VALUES ('distributed', '{{\"shards\": 4}}')"))
    with pytest.raises(SimdbError, match="has no Citus extension"):
        Index.open(database_url, schema=schema)


@on_citus
def test_the_tables_are_sharded_and_co_located_as_designed(database_url, schema):
    with Index.create(database_url, schema=schema, distributed=True, distributed_layout="keyed", shards=CITUS_SHARDS,
                      segment_size=1000, bulk_chunk=100) as index:
        index.add_many(CORPUS[:150], batch="bulk")  # a bulk chunk: a segment of its own
        index.add_many(CORPUS[150:160], batch="small")  # the active segment
        with index.database.engine.connect() as connection:
            rows = connection.execute(sa.text(
                "SELECT c.relname, p.partmethod, CASE WHEN p.partkey IS NOT NULL "
                "THEN column_to_column_name(p.logicalrelid, p.partkey) END AS attname, p.colocationid, "
                "(SELECT count(*) FROM pg_dist_shard s WHERE s.logicalrelid = p.logicalrelid) AS shards "
                "FROM pg_dist_partition p JOIN pg_class c ON c.oid = p.logicalrelid "
                "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = :schema"), {"schema": schema}).all()
            on_coordinator = connection.execute(sa.text(  # the coordinator's own (shell) table
                "SELECT pg_relation_size('documents_000000000001')")).scalar_one()
    tables = {row.relname: row for row in rows}
    for name in ("settings", "batches", "idf_terms", "field_counts"):
        assert tables[name].partmethod == "n" and tables[name].shards == 1  # reference tables
    segments = [name for name in tables if name.startswith("documents_")]
    assert len(segments) == 2
    documents = tables["documents"].colocationid
    for name, column in [("documents", "id"), *((s, "id") for s in segments), ("near_duplicates", "b_id"),
                         ("clusters", "cluster_id")]:
        row = tables[name]
        assert (row.partmethod, row.attname, row.colocationid, row.shards) == ("h", column, documents, CITUS_SHARDS)
    assert (tables["records"].partmethod, tables["records"].attname) == ("h", "batch_id")
    assert on_coordinator == 0  # the bulk segment was sharded before it was filled: no rows left behind
    # the keyed layout (a SimHash index's default): its keys beside the documents, by key, co-located with the probes
    assert index.settings.distributed == {"shards": CITUS_SHARDS, "layout": "keyed"}
    keys = keyed.table(index.settings.method)  # keys_0: named after the layout's first key column
    assert [(tables[name].partmethod, tables[name].attname, tables[name].shards) for name in (keys, "key_probes")
            ] == [("h", "key", CITUS_SHARDS)] * 2
    assert tables[keys].colocationid == tables["key_probes"].colocationid != documents


@on_citus
def test_a_chunks_candidate_join_runs_on_every_shard_and_ships_only_the_probes(database_url, schema, admin_engine):
    from simdb.pg.methods.simhash import candidate_sql
    from simdb.pg.chunks import create_staging

    with Index.create(database_url, schema=schema, distributed=True, distributed_layout="id",  # its join
                      shards=CITUS_SHARDS) as index:
        index.add_many(CORPUS[:200], batch="one")
        method = index.sketcher
        with index.database.engine.begin() as connection:
            create_staging(connection, method)
            segment = connection.execute(sa.text(
                "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                "WHERE i.inhparent = CAST('documents' AS regclass)")).scalars().first()
            plan = "\n".join(connection.exec_driver_sql("EXPLAIN " + candidate_sql(
                method.layout, "staging", f'"{segment}"', 4, columns=method.key_columns[:1])).scalars())
    assert "Custom Scan (Citus Adaptive)" in plan
    assert "Distributed Subplan" in plan and "Seq Scan on staging" in plan  # the probes, sent to the workers
    assert f"Task Count: {CITUS_SHARDS}" in plan  # one task per shard: the join runs where the rows are
    assert f"{segment}_" in plan  # on the segment's shards, not on the coordinator's empty table


@on_citus
@pytest.mark.parametrize("layout", [pytest.param("id", marks=pytest.mark.slow), "keyed"])
def test_every_command_works_on_a_distributed_index(database_url, schema, admin_engine, tmp_path, monkeypatch,
                                                    layout):
    """Each distributed layout. The layout by id is ``slow`` (issue 35: the whole suite runs it): the command line
    only formats what the library answers, the same for either layout, and ``-m "not slow"`` still runs a SimHash
    index by id on Citus in ``test_an_archive_moves_onto_citus_as_a_distributed_copy_that_answers_the_same[id]``
    (ingest, pairs and lookups against the plain copy), ``test_an_ingest_sends_the_nodes_nothing_that_grows_with_
    the_archive[id]`` and the ``citus-id`` runs of ``tests/test_remove_relayout.py``'s removals, and MinHash (by id,
    its only layout) in ``test_minhash_index_end_to_end[citus]`` and ``tests/test_vocabulary.py``."""
    from click.testing import CliRunner

    from simdb.cli import cli

    runner = CliRunner()
    monkeypatch.chdir(tmp_path)

    def run(*args, exit_code=0):
        result = runner.invoke(cli, list(args), env={"SIMDB_DATABASE_URL": database_url, "SIMDB_SCHEMA": schema},
                               catch_exceptions=False)
        assert result.exit_code == exit_code, (args, result.output)
        return result.output

    first, second = write_jsonl(tmp_path / "a.jsonl", CORPUS[:250]), write_jsonl(tmp_path / "b.jsonl", CORPUS[250:])
    assert f"distributed: 4 shards per table (Citus), layout {layout}" in run(
        "init", "--distributed", "--shards", str(CITUS_SHARDS), "--segment-size", "1000", "--bulk-chunk", "100",
        "--store-text", "--distributed-layout", layout)
    run("ingest", first, "--batch", "a", "--chunk-size", "60")
    run("ingest", second, "--batch", "b")
    assert_consistent(admin_engine, schema)
    stats = json.loads(run("stats", "--json"))
    assert sum(segment["documents"] for segment in stats["segments"]) == len(CORPUS)
    exported = [json.loads(line) for line in run("export").splitlines()]
    fingerprints = {e["id"]: int(e["simhash"], 16) for e in exported}
    k = 4
    order = [e["id"] for e in exported]
    expected = {(a, b) for i, a in enumerate(order) for b in order[i + 1:]
                if (fingerprints[a] ^ fingerprints[b]).bit_count() <= k}
    found = {tuple(sorted((p["a"], p["b"]), key=order.index)) for p in map(json.loads, run("pairs").splitlines())}
    assert found == expected
    text = CORPUS[0]["text"]
    assert CORPUS[0]["id"] in run("query", text)
    assert run("fingerprint", "--index", text).strip() == format(fingerprints[CORPUS[0]["id"]], "016x")
    assert "new" in run("check", second) or "near" in run("check", second)
    assert CORPUS[0]["id"] in run("show", CORPUS[0]["id"])
    statuses = [json.loads(line)["status"] for line in run("verdicts", "--batch", "b").splitlines()]
    assert len(statuses) == len(CORPUS) - 250
    run("report", "--output", str(tmp_path / "report.html"))
    assert (tmp_path / "report.html").stat().st_size > 10_000
    assert "relaid out from 6 blocks" in run("relayout", "--blocks", "7")
    assert_consistent(admin_engine, schema)
    assert CORPUS[0]["id"] in run("query", text)
    run("compact", "--full")
    assert len(json.loads(run("stats", "--json"))["segments"]) == 2  # the sealed ones merged, the active one
    assert_consistent(admin_engine, schema)
    run("remove", "--batch", "a")
    assert_consistent(admin_engine, schema)
    with Index.open(database_url, schema=schema) as index:
        assert index.stats()["documents"] == len(CORPUS) - 250
    run("grant-reader", f"{schema}_reader")
    with admin_engine.begin() as connection:
        connection.exec_driver_sql(f"DROP SCHEMA {schema} CASCADE")
        connection.exec_driver_sql(f"DROP ROLE {schema}_reader")


@on_citus
def test_a_distributed_index_whose_tables_were_undistributed_does_not_open(database_url, schema, admin_engine):
    with Index.create(database_url, schema=schema, distributed=True, shards=CITUS_SHARDS):
        pass
    with admin_engine.begin() as connection:
        connection.exec_driver_sql(f"SELECT undistribute_table('{schema}.idf_terms')")
    with pytest.raises(IncompatibleIndex, match=r"its tables \['idf_terms'\] are not"):
        Index.open(database_url, schema=schema)


@on_citus
@pytest.mark.parametrize("layout", ["id", "keyed"])
def test_an_archive_moves_onto_citus_as_a_distributed_copy_that_answers_the_same(database_url, schema, admin_engine,
                                                                                   tmp_path, run, layout):
    """Into each distributed layout (the keyed one builds its keys table from the copied documents)."""
    from tests.conftest import assert_records_consistent

    source = f"{schema}_one"
    try:
        with Index.create(database_url, schema=source, distributed=False, segment_size=1000, bulk_chunk=100,
                          count_by=["source"]) as one:
            one.add_many(CORPUS[:250], batch="a")  # a bulk chunk: a segment of its own
            one.add_many(CORPUS[250:300], batch="b")  # the active segment
            one.remove(ids=[CORPUS[3]["id"]])
            expected = (assert_consistent(admin_engine, source), sorted((p.a, p.b, p.distance) for p in one.pairs()),
                        [list(one.verdicts(b)) for b in ("a", "b")], one.segments(), one.counts_by_field())
        result = run("init", "--distributed", "--shards", str(CITUS_SHARDS), "--copy-from", source,
                     "--distributed-layout", layout)
        assert result.exit_code == 0, result.output
        assert "a distributed copy of schema" in result.output and f"{len(CORPUS[:300]) - 1:,} documents" in result.output
        with Index.open(database_url, schema=schema) as copy:
            assert copy.settings.distributed == {"shards": CITUS_SHARDS,
                                                 **({"layout": layout} if layout == "keyed" else {})}
            assert (assert_consistent(admin_engine, schema), sorted((p.a, p.b, p.distance) for p in copy.pairs()),
                    [list(copy.verdicts(b)) for b in ("a", "b")]) == expected[:3]
            assert [(s.first_id, s.end_id) for s in copy.segments()] == [(s.first_id, s.end_id) for s in expected[3]]
            assert copy.settings.count_by == ("source",) and copy.counts_by_field() == expected[4]
            copy.add_many(CORPUS[300:], batch="c")  # ids, batches and clusters go on from where the source left off
            assert copy.query(CORPUS[5]["text"])[0].external_id == CORPUS[5]["id"]
        assert_consistent(admin_engine, schema)
        assert_records_consistent(admin_engine, schema)
        assert_field_counts(admin_engine, schema, ["source"], None, None)
    finally:
        with admin_engine.begin() as connection:
            connection.exec_driver_sql(f"DROP SCHEMA IF EXISTS {source} CASCADE")
