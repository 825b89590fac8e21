"""Migrations: empty database -> head -> base and back; the models match; wheels carry them; a new index, made at
the head revision directly, is exactly what the migrations make."""

import os
import random
import subprocess
import sys
import uuid
import zipfile
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command

from simdb import Index
from simdb.pg import migrate
from simdb.pg.database import Database
from simdb.settings import IndexSettings
from tests.conftest import CITUS_SHARDS, assert_consistent, catalog, keys_table, migrated_index
from tests.test_index import flip, make_batch

ROOT = Path(__file__).resolve().parent.parent


def tables_in(engine, schema):
    return set(sa.inspect(engine).get_table_names(schema=schema))


def test_the_revisions_read_without_alembic_are_alembics():
    """Issue 38: opening an index imported alembic and read every script (half a second of each command). The
    revisions simdb reads from the scripts' lines are those alembic reads (the version table is compared with
    alembic's reading at head and at base in the next test)."""
    scripts = migrate.script_directory()
    assert migrate.known_revisions() == {script.revision for script in scripts.walk_revisions()}
    assert migrate.head_revision() == scripts.get_current_head()
    assert migrate.revision_chain() == {script.revision: script.down_revision for script in scripts.walk_revisions()}


def alembics_revision(connection, schema):
    from alembic.runtime.migration import MigrationContext

    return MigrationContext.configure(connection, opts={"version_table_schema": schema}).get_current_revision()


def test_upgrade_to_head_then_down_to_base_and_up_again(database_url, schema, admin_engine):
    settings = IndexSettings.new(blocks=5, max_distance=3)
    database = Database.connect(database_url, schema=schema)
    try:
        with database.engine.begin() as connection:
            connection.exec_driver_sql(f"CREATE SCHEMA {schema}")
            assert migrate.current_revision(connection, schema) is None
            migrate.upgrade(connection, schema, layout=settings.layout, new_index_settings=settings.to_rows())
            # the version table read without alembic, as alembic reads it (at base too, below)
            assert migrate.current_revision(connection, schema) == migrate.head_revision() \
                == alembics_revision(connection, schema)
        assert tables_in(admin_engine, schema) == {"alembic_version", "settings", "batches", "documents",
                                                   "near_duplicates", "idf_terms", "records", "clusters", "sync_sources",
                                                   "field_counts"}
        columns = {c["name"] for c in sa.inspect(admin_engine).get_columns("documents", schema=schema)}
        assert {f"key_{i}" for i in range(10)} <= columns

        with database.engine.begin() as connection:
            # the schema the migrations built is exactly the one simdb/schema.py describes
            command.check(migrate.alembic_config(connection, schema, layout=settings.layout))

        with database.engine.begin() as connection:
            migrate.downgrade(connection, schema, "base")
            assert migrate.current_revision(connection, schema) is None is alembics_revision(connection, schema)
        assert tables_in(admin_engine, schema) == {"alembic_version"}
    finally:
        database.close()
    with Index.create(database_url, schema=schema) as index:  # and up again, through the public path
        assert index.created and index.layout.blocks == 6


def test_upgrading_an_index_with_data_computes_its_pairs_and_clusters(database_url, schema, admin_engine):
    """An index at revision 0002 (no stored pairs, no clusters) holding documents, upgraded to head."""
    import random

    from simdb.bits import to_signed
    from simdb.pg.clusters import UnionFind

    settings = IndexSettings.new()
    layout = settings.layout
    rng = random.Random(1)
    fingerprints = []
    for _ in range(60):
        base = rng.getrandbits(64)
        fingerprints += [base] + [base ^ (1 << rng.randrange(64)) ^ (1 << rng.randrange(64)) for _ in range(2)]
    fingerprints += [rng.getrandbits(64) for _ in range(300)]
    rng.shuffle(fingerprints)
    database = Database.connect(database_url, schema=schema)
    try:
        with database.engine.begin() as connection:
            connection.exec_driver_sql(f"CREATE SCHEMA {schema}")
            migrate.upgrade(connection, schema, layout=layout, new_index_settings=settings.to_rows(), revision="0002")
            connection.exec_driver_sql("INSERT INTO batches (name, source, status, started_at) "
                                       "VALUES ('old', 'test', 'complete', now())")
            for i, fp in enumerate(fingerprints, 1):
                keys = ", ".join(str(k) for k in layout.block_keys(fp))
                connection.exec_driver_sql(
                    f"INSERT INTO documents (id, external_id, batch_id, simhash, {', '.join(layout.key_columns)}, "
                    f"content_hash, length) OVERRIDING SYSTEM VALUE VALUES ({i}, 'd{i}', 1, {to_signed(fp)}, {keys}, "
                    f"'\\x{i:04x}', 1)")
            migrate.upgrade(connection, schema, layout=layout)
            stored = set(connection.exec_driver_sql("SELECT a_id, b_id, distance FROM near_duplicates").all())
            clusters = dict(connection.exec_driver_sql("SELECT id, cluster_id FROM documents").all())
    finally:
        database.close()
    expected = {(i + 1, j + 1, (a ^ b).bit_count()) for i, a in enumerate(fingerprints)
                for j, b in enumerate(fingerprints) if i < j and (a ^ b).bit_count() <= layout.max_distance}
    assert stored == expected and len(expected) >= 120
    forest = UnionFind()
    for a, b, _ in expected:
        forest.union(a, b)
    assert clusters == {i: forest.find(i) for i in range(1, len(fingerprints) + 1)}


def test_the_migration_refuses_to_run_without_settings(database_url, schema):
    database = Database.connect(database_url, schema=schema)
    try:
        with database.engine.begin() as connection:
            connection.exec_driver_sql(f"CREATE SCHEMA {schema}")
            with pytest.raises(RuntimeError, match="simdb init"):
                migrate.upgrade(connection, schema)
    finally:
        database.close()


@pytest.mark.slow
def test_an_installed_wheel_finds_and_runs_its_migrations(tmp_path, database_url, schema):
    """alembic's script location inside an installed package: build the wheel, install it, create an index."""
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path / "dist"), str(ROOT)], check=True)
    wheel = next((tmp_path / "dist").glob("simdb-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "simdb/migrations/env.py" in names
    assert "simdb/migrations/versions/0001_create_index.py" in names
    compiled = [name for name in names if name.startswith("simdb/_native.")]
    assert len(compiled) == 1 and compiled[0].endswith((".so", ".pyd")), names  # built for the wheel, once
    assert wheel.name.endswith(".whl") and "-py3-none-any" not in wheel.name  # a platform wheel: it holds C
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
                   check=True)
    code = ("import simdb, simdb.pg.migrate as m; from simdb import Index, native; print(m.migrations_path()); "
            f"Index.create({database_url!r}, schema={schema!r}).close(); print(simdb.__file__); "
            "print(native.module().__file__)")
    env = {**os.environ, "PYTHONPATH": str(site)}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    migrations, package, extension = out.stdout.split()
    assert migrations == str(site / "simdb" / "migrations")
    assert package.startswith(str(site)) and extension.startswith(str(site))


def test_a_minhash_index_matches_the_models_and_cannot_be_downgraded_below_it(database_url, schema):
    settings = IndexSettings.new(method="minhash", threshold=0.85)
    database = Database.connect(database_url, schema=schema)
    try:
        with database.engine.begin() as connection:
            connection.exec_driver_sql(f"CREATE SCHEMA {schema}")
            migrate.upgrade(connection, schema, layout=settings.layout, new_index_settings=settings.to_rows())
            command.check(migrate.alembic_config(connection, schema, layout=settings.layout))
        with pytest.raises(RuntimeError, match="cannot be downgraded"):
            with database.engine.begin() as connection:
                migrate.downgrade(connection, schema, "0003")
    finally:
        database.close()


@pytest.mark.citus
def test_upgrading_to_0011_names_what_each_verdict_duplicated_even_when_it_was_removed(database_url, schema):
    """Revision 0011 keeps a verdict's duplicate_of as an external id; for the records stored before it the name
    comes from the document, else from the removed document's own record; a document whose batch was removed
    has no record left, and its name is lost (what `simdb verdicts` printed before 0011 already)."""
    from tests.test_index import flip, make_batch

    p, q, r = 0x1111_2222_3333_4444, 0x5555_6666_7777_8888, 0x9999_AAAA_BBBB_CCCC
    with Index.create(database_url, schema=schema) as index:
        index.add_fingerprinted(make_batch([p, q], "one"), batch="one")
        index.add_fingerprinted(make_batch([r], "two"), batch="two")
        index.add_fingerprinted(make_batch([flip(p, [1]), flip(q, [2]), flip(r, [3])], "three"), batch="three")
        index.remove(ids=["one-0"])
        index.remove(batch="two")
        assert [v.duplicate_of for v in index.verdicts("three")] == ["one-0", "one-1", "two-0"]
        with index.database.engine.begin() as connection:  # back to the archive as 0010 kept it, and up again
            migrate.downgrade(connection, schema, "0010")
            assert "duplicate_of_external_id" not in connection.exec_driver_sql(
                "SELECT * FROM records LIMIT 0").keys()
            migrate.upgrade(connection, schema, layout=index.layout)
        assert [v.duplicate_of for v in index.verdicts("three")] == ["one-0", "one-1", None]


def learned_idf():
    from simdb.methods.simhash.fingerprint import learn_idf
    from simdb.samples import corpus

    return learn_idf(record["text"] for record in corpus())


@pytest.mark.citus
@pytest.mark.slow_on_citus
@pytest.mark.parametrize("options", [
    {}, {"blocks": 5, "max_distance": 3}, {"idf": "learned", "store_text": True},
    {"method": "minhash", "threshold": 0.7}, {"method": "minhash", "verify": "exact"},
    {"segment_size": 1000, "merge_factor": 3, "bulk_chunk": 5000}],
    ids=["simhash", "simhash-5-blocks", "simhash-tfidf-texts", "minhash", "minhash-exact", "storage"])
def test_a_new_index_is_exactly_what_the_migrations_make(options, database_url, schema, admin_engine, backend):
    """Index.create makes a new index at the head revision without running the migrations: its catalog is the
    one that creating it at revision 0001 and upgrading it to head gives (on Citus, distributed both ways)."""
    if options.get("idf") == "learned":
        options = {**options, "idf": learned_idf()}
    with Index.create(database_url, schema=schema, **options) as index:
        settings = index.settings
    migrated = f"simdb_test_{uuid.uuid4().hex[:12]}"
    try:
        migrated_index(database_url, migrated, settings)
        with admin_engine.begin() as connection:
            created, upgraded = catalog(connection, schema), catalog(connection, migrated)
    finally:
        with admin_engine.begin() as connection:
            connection.exec_driver_sql(f"DROP SCHEMA IF EXISTS {migrated} CASCADE")
    for part in created:  # a keyed index's key columns, which 0022 drops, leave dropped columns behind
        assert _undropped(part, created[part]) == _undropped(part, upgraded[part]), part
    assert created.keys() == upgraded.keys()
    assert len(created["relations"]) >= 20 and len(created["functions"]) >= 7 and len(created["views"]) == 6
    assert created["alembic_version"] == [(migrate.head_revision(),)]
    assert (len(created["idf_terms"]) > 100) == ("idf" in options)
    # keys, key_probes, external_ids, external_id_probes
    keys_tables = 4 if settings.distributed and settings.distributed.get("layout") == "keyed" else 0
    assert ("distribution" in created and len(created["distribution"]) == 8 + keys_tables) == (backend == "citus")


def _undropped(part: str, rows: list[tuple]) -> list[tuple]:
    """A part of ``catalog`` without what a dropped column leaves: its ``pg_attribute`` row (the last field,
    ``attisdropped``, true), its count in ``relnatts`` (the relations' last field), and the numbers of the
    columns added after it."""
    if part == "relations":
        return [row[:-1] for row in rows]
    if part == "columns":  # without attnum too (in its order): a column added again comes after the dropped one
        return [row[:1] + row[2:] for row in sorted(rows, key=lambda row: (row[0], int(row[1])))
                if str(row[-1]) != "True"]
    return rows


@pytest.mark.parametrize("before", ["0011", "0022"])
@pytest.mark.parametrize("options", [{}, {"method": "minhash"}, {"method": "minhash", "verify": "exact"}],
                         ids=["simhash", "minhash", "minhash-exact"])
def test_a_rewrite_of_the_functions_goes_down_to_what_the_revision_before_made_and_up_again(
        options, before, database_url, schema, admin_engine):
    """Revisions 0012 and 0023 rewrite the lookups (0012 the views too) from what the index holds (its key or
    band lookups; 0023 simdb_lookup's query, a SQL function again); down, each gives back the functions and views
    of the revision ``before`` it exactly, and up again today's."""
    with Index.create(database_url, schema=schema, **options) as index:
        settings = index.settings
    at_before = f"simdb_test_{uuid.uuid4().hex[:12]}"
    database = Database.connect(database_url, schema=at_before)
    try:
        with database.engine.begin() as connection:
            connection.exec_driver_sql(f"CREATE SCHEMA {at_before}")
            migrate.upgrade(connection, at_before, layout=settings.layout, new_index_settings=settings.to_rows(),
                            revision=before)
        with admin_engine.begin() as connection:
            head = catalog(connection, schema)
            connection.exec_driver_sql(f"SET LOCAL search_path TO {schema}")
            migrate.downgrade(connection, schema, before)
            down, made = catalog(connection, schema), catalog(connection, at_before)
            connection.exec_driver_sql(f"SET LOCAL search_path TO {schema}")
            migrate.upgrade(connection, schema, layout=settings.layout)
            up = catalog(connection, schema)
    finally:
        database.close()
        with admin_engine.begin() as connection:
            connection.exec_driver_sql(f"DROP SCHEMA IF EXISTS {at_before} CASCADE")
    for part in made:  # a column a downgrade dropped (0015's) stays in the catalog, marked dropped
        assert _undropped(part, down[part]) == _undropped(part, made[part]), part
    assert up.keys() == head.keys() and head["functions"] != made["functions"]
    for part in head:
        assert _undropped(part, up[part]) == _undropped(part, head[part]), part


@pytest.mark.citus
@pytest.mark.slow_on_citus
@pytest.mark.parametrize("options", [{}, {"method": "minhash"}], ids=["simhash", "minhash"])
def test_0015_fills_the_kept_counts_of_an_index_with_removals(options, database_url, schema, admin_engine):
    """An index at revision 0014 with documents removed by id (and a batch removed whole) upgrades with each
    batch's ``removed`` and each cluster's ``min_similarity`` as brute force gives them, on one server and on
    Citus, and keeps them through the next ingest and removal."""
    from simdb.samples import corpus
    from tests.maintained import assert_maintained

    records = list(corpus())
    with Index.create(database_url, schema=schema, **options) as index:
        index.add_many(records[:200], batch="one")
        index.add_many(records[200:], batch="two")
        index.add_many([{"id": "gone", "text": records[0]["text"]}], batch="gone")
        index.remove(batch="gone")
        index.remove(ids=[records[1]["id"], records[250]["id"], records[260]["id"]])
        layout = index.settings.layout
    with admin_engine.begin() as connection:
        connection.exec_driver_sql(f"SET LOCAL search_path TO {schema}")
        migrate.downgrade(connection, schema, "0014")
        assert "removed" not in {c["name"] for c in sa.inspect(connection).get_columns("batches", schema=schema)}
        connection.exec_driver_sql(f"SET LOCAL search_path TO {schema}")
        migrate.upgrade(connection, schema, layout=layout)
    assert_maintained(admin_engine, schema)
    with admin_engine.connect() as connection:
        removed = dict(connection.exec_driver_sql(f"SELECT name, removed FROM {schema}.batches").all())
    assert removed == {"one": 1, "two": 2}
    with Index.open(database_url, schema=schema) as index:
        index.add_many([{"id": "again", "text": records[2]["text"]}], batch="three")
        index.remove(ids=[records[3]["id"]])
    assert_maintained(admin_engine, schema)


@pytest.mark.citus
@pytest.mark.slow_on_citus
@pytest.mark.parametrize("options", [{}, {"method": "minhash"}], ids=["simhash", "minhash"])
def test_0017_fills_the_batch_each_verdict_named_even_when_it_was_removed(options, database_url, schema,
                                                                       admin_engine):
    """An index at revision 0015 upgrades with each verdict's ``duplicate_of_batch_id``: the named document's
    batch from the document, else (removed by id) from the verdict that stored it; NULL where its batch was
    removed whole. The inputs say which batch each document was in; the next ingest and removal keep it."""
    from simdb.samples import corpus
    from tests.maintained import assert_maintained

    records = list(corpus())
    only = {"id": "only-three", "text": "Zebras quietly juggle seventeen purple umbrellas beneath the northern "
                                        "lighthouse every other Tuesday, and nobody minds."}
    three = [{"id": f"copy-{r['id']}", "text": r["text"]} for r in records[:5]] + [only]
    four = [{"id": f"copy-{r['id']}", "text": r["text"]} for r in records[5:10] + records[200:205]] + \
        [{"id": "copy-only-three", "text": only["text"]}]
    with Index.create(database_url, schema=schema, **options) as index:
        index.add_many(records[:200], batch="one")
        index.add_many(records[200:], batch="two")
        index.add_many(three, batch="three")  # copies of batch one's, and one of its own
        index.add_many(four, batch="four")  # copies of batch one's, two's and three's
        index.remove(ids=[records[5]["id"], records[200]["id"]])  # named by four's verdicts
        index.remove(batch="three")  # named by four's last verdict: no trace of it left
        layout = index.settings.layout
    batches = {**{r["id"]: "one" for r in records[:200]}, **{r["id"]: "two" for r in records[200:]},
               **{r["id"]: "three" for r in three}, **{r["id"]: "four" for r in four}}
    with admin_engine.begin() as connection:
        connection.exec_driver_sql(f"SET LOCAL search_path TO {schema}")
        migrate.downgrade(connection, schema, "0015")
        assert "duplicate_of_batch_id" not in connection.exec_driver_sql("SELECT * FROM records LIMIT 0").keys()
        connection.exec_driver_sql(f"SET LOCAL search_path TO {schema}")
        migrate.upgrade(connection, schema, layout=layout)
    assert_maintained(admin_engine, schema, batches=batches)
    with admin_engine.connect() as connection:
        named = dict(connection.exec_driver_sql(
            f"SELECT r.duplicate_of_external_id, ob.name FROM {schema}.records r JOIN {schema}.batches b "
            f"ON b.id = r.batch_id LEFT JOIN {schema}.batches ob ON ob.id = r.duplicate_of_batch_id "
            "WHERE b.name = 'four' AND r.duplicate_of IS NOT NULL").all())
    assert {name: named.get(name, "not named") for name in (records[5]["id"], records[200]["id"], "only-three")} \
        == {records[5]["id"]: "one", records[200]["id"]: "two", "only-three": None}
    with Index.open(database_url, schema=schema) as index:
        index.add_many([{"id": "again", "text": records[2]["text"]}], batch="five")
        index.remove(ids=[records[2]["id"]])
    assert_maintained(admin_engine, schema, batches={**batches, "again": "five"})


@pytest.mark.parametrize("backend", ["citus"], indirect=True)
def test_0020_names_a_keyed_index_keys_table_after_its_layout(database_url, schema, admin_engine):
    """A keyed index at revision 0018 held its keys in ``keys`` whatever its layout (here one relaid out, whose key
    columns start at ``key_4``); opening it upgrades it to exactly what a keyed index of that layout is today,
    its table ``keys_4``: lookups and ingests go on giving brute force's answers, and ``keys_4`` holds exactly the
    documents' keys. Down, 0018's names again."""
    rng = random.Random(20)
    with Index.create(database_url, schema=schema, shards=CITUS_SHARDS, max_distance=3, distributed=True,
                      distributed_layout="keyed") as index:
        rows = [(f"a-{i}", rng.getrandbits(64)) for i in range(200)]
        rows += [(f"b-{i}", flip(rng.choice(rows)[1], rng.sample(range(64), rng.randrange(5)))) for i in range(100)]
        index.add_fingerprinted(make_batch([fp for name, fp in rows if name[0] == "a"], "a"), batch="a")
        index.add_fingerprinted(make_batch([fp for name, fp in rows if name[0] == "b"], "b"), batch="b")
        index.relayout(5)
    with admin_engine.begin() as connection:
        head = catalog(connection, schema)
        assert keys_table(connection, schema) == "keys_4"
        connection.exec_driver_sql(f"SET LOCAL search_path TO {schema}")
        migrate.downgrade(connection, schema, "0018")
        assert keys_table(connection, schema) is None
        assert connection.exec_driver_sql(f"SELECT to_regclass('{schema}.keys_key')").scalar() is not None
    with Index.open(database_url, schema=schema) as upgraded:
        with admin_engine.begin() as connection:  # 0022's down and up leave the key columns behind as dropped ones
            again = catalog(connection, schema)
            assert {part: _undropped(part, rows) for part, rows in again.items()} == \
                {part: _undropped(part, rows) for part, rows in head.items()}
        queries = [fp for _, fp in rng.sample(rows, 20)] + [rng.getrandbits(64) for _ in range(5)]
        for query, found in zip(queries, upgraded.query_fingerprints(queries)):
            expected = {(name, (fp ^ query).bit_count()) for name, fp in rows if (fp ^ query).bit_count() <= 3}
            assert {(m.external_id, m.distance) for m in found} == expected
            assert {(m.external_id, m.distance) for m in upgraded.query_fingerprint(query)} == expected
        upgraded.add_fingerprinted(make_batch([flip(fp, [9]) for _, fp in rows[:20]], "c"), batch="c")
    assert_consistent(admin_engine, schema)


@pytest.mark.citus
@pytest.mark.slow_on_citus
@pytest.mark.parametrize("options", [{"store_text": True}, {"method": "minhash", "verify": "exact"}],
                         ids=["simhash", "minhash-exact"])
def test_0021_routes_simdb_neighbours_on_citus_and_goes_down_to_the_view_reader(options, database_url, schema,
                                                                                admin_engine, backend):
    """Revision 0021 rewrites simdb_neighbours of a distributed index into routed statements (a repartition join
    before) and leaves one server's alone, and the exact MinHash lookup's read of a stored document's pairs into
    one statement (everywhere); down, it gives back the function that read the view and the two-statement
    lookup, and up again exactly what today's code makes, with the same answers as the view both ways."""
    from simdb.samples import corpus

    # on Citus, the function revision 0021 rewrote answers each name by a repartition join of the view (0.4-0.9 s):
    # the first 60 records there (every kind of edit; 22 names with neighbours under MinHash, 14 under SimHash), 120
    # on one server
    records = list(corpus())[:60 if backend == "citus" else 120]
    before = migrate.revision_chain()["0021"]  # the revision 0021 follows (renumbered at merge)
    with Index.create(database_url, schema=schema, **options) as index:
        index.add_many(records, batch="one")
        layout = index.settings.layout
        with index.database.engine.connect() as connection:  # simdb's sessions: Citus's settings on
            connection.exec_driver_sql(f"SET search_path TO {schema}")
            names = connection.exec_driver_sql("SELECT DISTINCT external_id FROM document_neighbours").scalars().all()
            view = sorted(connection.exec_driver_sql("SELECT * FROM document_neighbours").all())
            connection.commit()  # no lock held into the migrations, whose ALTER TABLEs (0022's) would wait for it

            def answers():
                found = sorted(row for name in names for row in connection.execute(
                    sa.text("SELECT * FROM simdb_neighbours(:n)"), {"n": name}).all())
                connection.commit()
                return found

            with admin_engine.begin() as admin:  # at 0021 (later revisions, 0022's keyed documents, undone first)
                admin.exec_driver_sql(f"SET LOCAL search_path TO {schema}")
                migrate.downgrade(admin, schema, "0021")
                head = catalog(admin, schema)
                admin.exec_driver_sql(f"SET LOCAL search_path TO {schema}")
                migrate.downgrade(admin, schema, before)
                down = catalog(admin, schema)
            assert answers() == view and len(view) > 10
            with admin_engine.begin() as admin:
                admin.exec_driver_sql(f"SET LOCAL search_path TO {schema}")
                migrate.upgrade(admin, schema, layout=layout, revision="0021")
                up = catalog(admin, schema)
                admin.exec_driver_sql(f"SET LOCAL search_path TO {schema}")
                migrate.upgrade(admin, schema, layout=layout)
            assert answers() == view
    neighbours = {part: [row for row in rows if str(row[0]).startswith("simdb_neighbours(")]
                  for part, rows in (("head", head["functions"]), ("down", down["functions"]))}
    if backend == "citus":
        assert "ANY(pair_neighbours)" in neighbours["head"][0][1]
        assert "document_neighbours n WHERE n.external_id" in neighbours["down"][0][1]
        assert neighbours["down"][0][2:] == neighbours["head"][0][2:]  # its comment and grants kept
    else:
        assert neighbours["down"] == neighbours["head"]
    rewritten = ("simdb_neighbours(", "simdb_lookup(") if options.get("verify") == "exact" else ("simdb_neighbours(",)
    others = [row for row in head["functions"] if not str(row[0]).startswith(rewritten)]
    assert [row for row in down["functions"] if not str(row[0]).startswith(rewritten)] == others
    if options.get("verify") == "exact":  # a stored document's pairs: one statement, two before
        lookup = {part: next(row[1] for row in rows if str(row[0]).startswith("simdb_lookup("))
                  for part, rows in (("head", head["functions"]), ("down", down["functions"]))}
        assert "OR p.b_id = stored_id" in lookup["head"] and "UNION ALL SELECT p.b_id" in lookup["down"]
    assert down["alembic_version"] == [(before,)] and up["alembic_version"] == head["alembic_version"]
    for part in head:
        assert up[part] == head[part], part
