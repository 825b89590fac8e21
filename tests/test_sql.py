"""The analysts' SQL: functions, the index-backed simdb_near, and the read-only role."""

import random
import uuid

import psycopg
import pytest
import sqlalchemy as sa

from click.testing import CliRunner

from simdb import Index, format_fingerprint
from simdb.bits import hamming, to_signed
from simdb.cli import cli
from simdb.pg.database import postgres_url
from tests.conftest import explained
from tests.test_index import flip, make_batch


@pytest.fixture
def filled(index):
    rng = random.Random(2)
    fingerprints = [rng.getrandbits(64) for _ in range(5000)] + [2**64 - 1, 2**63, 0]
    bases = fingerprints[:20]
    fingerprints += [flip(b, rng.sample(range(64), d)) for b in bases for d in (1, 2, 3)]
    index.add_fingerprinted(make_batch(fingerprints, "f"), batch="f")
    with index.database.engine.begin() as connection:
        connection.exec_driver_sql("ANALYZE documents")
    return index, fingerprints


def scalar(index, sql, **params):
    with index.database.engine.connect() as connection:
        return connection.execute(sa.text(sql), params).scalar_one()


@pytest.mark.citus
def test_hamming_and_hex_functions(filled):
    index, fingerprints = filled
    for a, b in [(fingerprints[0], fingerprints[1]), (2**64 - 1, 0), (2**63, 2**63 - 1)]:
        assert scalar(index, "SELECT simdb_hamming(:a, :b)", a=to_signed(a), b=to_signed(b)) == hamming(a, b)
    for value in (0, 1, 2**63, 2**64 - 1, fingerprints[7]):
        text = format_fingerprint(value)
        assert scalar(index, "SELECT simdb_fingerprint_hex(:v)", v=to_signed(value)) == text
        assert scalar(index, "SELECT simdb_fingerprint_from_hex(:t)", t=text) == to_signed(value)
        assert scalar(index, "SELECT simdb_fingerprint_from_hex(:t)", t="0x" + text.upper()) == to_signed(value)
    with pytest.raises(sa.exc.DataError, match="'nope' is not a fingerprint"):
        scalar(index, "SELECT simdb_fingerprint_from_hex('nope')")


def test_simdb_near_matches_the_index_and_uses_the_key_indexes(filled):
    index, fingerprints = filled
    for base in fingerprints[:20] + [2**64 - 1]:
        with index.database.engine.connect() as connection:
            rows = connection.execute(sa.text(
                "SELECT d.external_id, n.distance FROM simdb_near(simdb_fingerprint_from_hex(:hex)) n "
                "JOIN documents d ON d.id = n.document_id"), {"hex": format_fingerprint(base)}).all()
        assert sorted((distance, name) for name, distance in rows) == \
            sorted((m.distance, m.external_id) for m in index.query_fingerprint(base))
    with explained(index.database.engine) as plans, index.database.engine.connect() as connection:
        connection.execute(sa.text("SELECT * FROM simdb_near(simdb_fingerprint_from_hex(:hex), 2)"),
                           {"hex": format_fingerprint(fingerprints[3])}).all()
    # the function's own query, simdb_lookup inlined into it (a plain EXPLAIN of the call shows a Function Scan,
    # and nothing of its body)
    plan, = [plan for plan in plans if plan.startswith("Query Text: SELECT l.document_id")]
    assert "Seq Scan" not in plan
    # each key column through its index, in every segment
    assert all(f"Index Cond: ({column} = " in plan for column in index.layout.key_columns), plan
    with pytest.raises(sa.exc.DataError, match="max_distance must be between 0 and 64"):
        scalar(index, "SELECT count(*) FROM simdb_near(0, 65)")


@pytest.mark.citus
def test_a_looser_lookup_answers_with_a_notice_and_a_wrong_one_is_refused_in_one_line(filled):
    """Beyond the index's maximum distance (or below its similarity) the lookups answer from what the keys find,
    and a NOTICE says that the answer may be incomplete; an argument that means nothing is refused in one line,
    never with the lookup's 15-branch query (an error raised inside the query printed it into psql)."""
    index, fingerprints = filled
    k = index.layout.max_distance
    names = {f"f-{i}": fingerprint for i, fingerprint in enumerate(fingerprints)}
    for base in fingerprints[:20]:
        within = {name: hamming(base, f) for name, f in names.items() if hamming(base, f) <= 2 * k}
        with index.database.engine.connect() as connection:
            said, raw = [], connection.connection.dbapi_connection
            raw.add_notice_handler(handler := lambda notice: said.append(notice.message_primary))
            near = dict(connection.execute(sa.text(
                "SELECT d.external_id, n.distance FROM simdb_near(:f, :d) n JOIN documents d ON d.id = n.document_id"),
                {"f": to_signed(base), "d": 2 * k}).all())
            similar = dict(connection.execute(sa.text(
                "SELECT d.external_id, s.similarity FROM simdb_similar(:f, :s) s "
                "JOIN documents d ON d.id = s.document_id"), {"f": to_signed(base), "s": 1 - 2 * k / 64}).all())
            raw.remove_notice_handler(handler)  # the connection goes back to the pool
        assert near.items() <= within.items()  # what the keys find, at its true distance
        assert {n: d for n, d in within.items() if d <= k} .items() <= near.items()  # every one up to k
        assert similar == {name: (64 - distance) / 64 for name, distance in near.items()}
        assert said == [f"simdb_near: {2 * k} is beyond the index's maximum distance {k}: only documents sharing a "
                        "block key are found, so some within it may be missing",
                        f"simdb_similar: {1 - 2 * k / 64} is below the index's threshold {1 - k / 64}: only documents "
                        "sharing a block key are found, so some within it may be missing"]
    for statement, message in (("SELECT * FROM simdb_near(0, -1)", "simdb_near: max_distance must be between 0 and 64"),
                               ("SELECT * FROM simdb_similar(0, 2)", "simdb_similar: min_similarity must be between "
                                                                     "0 and 1")):
        with pytest.raises(sa.exc.DataError) as raised:
            scalar(index, statement)
        assert raised.value.orig.diag.message_primary.startswith(message)
        assert "SQL statement" not in (raised.value.orig.diag.context or "") and "UNION" not in str(raised.value)


def test_simdb_near_is_planned_once_per_session(filled):
    """From psql or a BI tool every call is a new statement: a SQL function inlined into it was planned with it
    each time (1.9 of 2.2 ms a call at 10M documents in 6 segments). The PL/pgSQL function keeps its query's
    plan for the session, the fingerprint a parameter ($1) from the first call on (PostgreSQL's plan cache
    planned the first five calls with their values: 37 of 43 ms a call at 1M documents in 11 segments), with
    simdb_lookup inlined into it: its key lookups are in that one plan (a PL/pgSQL simdb_lookup under it set
    its index scans up anew on every call, 7.2-7.5 against 1.8-2.1 ms at 1M documents in 16 segments); and it
    answers the same."""
    index, fingerprints = filled
    expected = [sorted(m.distance for m in index.query_fingerprint(base)) for base in fingerprints[:8]]
    with explained(index.database.engine) as plans, index.database.engine.connect() as connection:
        for base, distances in zip(fingerprints[:8], expected):  # a different statement each, as typed into psql
            rows = connection.exec_driver_sql(f"SELECT document_id, distance FROM simdb_near({to_signed(base)})").all()
            assert sorted(distance for _, distance in rows) == distances
    lookups = [plan for plan in plans if "Index Cond" in plan]
    assert len(lookups) == 8 and all(plan.startswith("Query Text: SELECT l.document_id") for plan in lookups), plans
    assert all("$1" in plan for plan in lookups), lookups[0]


def test_the_librarys_lookup_is_one_statement_of_key_lookups_with_no_function_nested_in_it(filled):
    """``Index.query_fingerprint`` runs one plan with the key columns' equality lookups in it (simdb_lookup, a SQL
    function, inlined into its statement), where it called simdb_near, whose PL/pgSQL set a nested plan of 15
    index scans per segment up and tore it down on every call (beside 16 segments 240, 1,700 page faults a call,
    p50 6-8 ms against 1.4-3 ms). The answers stay those of brute force."""
    index, fingerprints = filled
    with explained(index.database.engine) as plans:
        for base in fingerprints[:8]:
            found = sorted((m.external_id, m.distance) for m in index.query_fingerprint(base))
            expected = sorted((f"f-{i}", hamming(base, other)) for i, other in enumerate(fingerprints)
                              if hamming(base, other) <= 4)
            assert found == expected
    lookups = [plan for plan in plans if "key_0" in plan]
    assert len(lookups) == 8 and all(plan.startswith("Query Text: SELECT d.id") for plan in lookups), plans[:2]
    assert all(f"key_{i} = " in plan for plan in lookups for i in range(15)), lookups[0]


def test_simdb_near_follows_a_relayout(filled):
    index, fingerprints = filled
    before = scalar(index, "SELECT count(*) FROM simdb_near(:f)", f=to_signed(fingerprints[0]))
    index.relayout(5)
    assert scalar(index, "SELECT count(*) FROM simdb_near(:f)", f=to_signed(fingerprints[0])) == before == 4


@pytest.fixture
def reader_role(admin_engine):
    role = f"simdb_reader_{uuid.uuid4().hex[:8]}"
    yield role
    with admin_engine.begin() as connection:
        if connection.execute(sa.text("SELECT 1 FROM pg_roles WHERE rolname = :r"), {"r": role}).first():
            connection.exec_driver_sql(f"DROP OWNED BY {role}")
            connection.exec_driver_sql(f"DROP ROLE {role}")


@pytest.mark.citus
def test_the_reader_role_reads_everything_and_writes_nothing(filled, database_url, run, reader_role, backend):
    index, fingerprints = filled
    result = run("grant-reader", reader_role, "--login")
    assert result.output == (f"created role {reader_role!r}: it can read schema {index.database.schema!r} and "
                             "write nothing; it can log in\n")
    assert run("grant-reader", reader_role, "--login").output.startswith(f"updated role {reader_role!r}")
    url = postgres_url(database_url).set(username=reader_role, password=None)
    conninfo = url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(conninfo, autocommit=True) as connection:
        assert connection.execute("SELECT count(*) FROM documents").fetchone()[0] == len(fingerprints)
        for view in ("near_duplicate_pairs", "duplicate_clusters", "batch_summary"):
            connection.execute(f"SELECT * FROM {view}").fetchall()
        assert connection.execute("SELECT count(*) FROM simdb_near(%s)", [to_signed(fingerprints[0])]).fetchone()[0] == 4
        for statement in ("INSERT INTO batches (name, source, status, started_at) VALUES ('x', 'x', 'running', now())",
                          "UPDATE documents SET length = 0", "DELETE FROM near_duplicates",
                          "CREATE TABLE mine (x int)", "TRUNCATE settings"):
            # (Citus checks the privilege before the transaction's read-only mode when truncating its tables)
            refused = psycopg.errors.ReadOnlySqlTransaction if backend == "postgres" or "TRUNCATE" not in statement \
                else psycopg.errors.InsufficientPrivilege
            with pytest.raises(refused):
                connection.execute(statement)
        connection.execute("SET default_transaction_read_only = off")  # even then, no privilege to write
        for statement in ("UPDATE documents SET length = 0", "CREATE TABLE mine (x int)", "DELETE FROM settings"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                connection.execute(statement)
    with Index.open(conninfo, schema=index.database.schema) as as_reader:  # stats counts every segment
        stats = as_reader.stats()
    assert sum(segment["documents"] for segment in stats["segments"]) == len(fingerprints)


def test_a_reader_of_two_indexes_keeps_both_schemas_and_its_settings_stay_in_this_database(
        index, database_url, admin_engine, reader_role):
    other = f"simdb_test_{uuid.uuid4().hex[:12]}"
    try:
        with Index.create(database_url, schema=other) as second:
            index.grant_reader(reader_role)
            second.grant_reader(reader_role)
            second.grant_reader(reader_role)  # again: nothing repeated
        with admin_engine.connect() as connection:
            server_wide = connection.execute(sa.text(
                "SELECT rolconfig FROM pg_roles WHERE rolname = :r"), {"r": reader_role}).scalar()
            here = connection.execute(sa.text(
                "SELECT s.setconfig FROM pg_db_role_setting s JOIN pg_roles r ON r.oid = s.setrole "
                "JOIN pg_database d ON d.oid = s.setdatabase WHERE r.rolname = :r AND d.datname = current_database()"),
                {"r": reader_role}).scalar()
        assert server_wide is None  # other databases on the server are left alone
        assert sorted(here) == sorted(["default_transaction_read_only=on",
                                       f"search_path={index.database.schema}, {other}, public"])
    finally:
        with admin_engine.begin() as connection:
            connection.exec_driver_sql(f"DROP SCHEMA IF EXISTS {other} CASCADE")


def test_grant_reader_keeps_a_roles_login_unless_asked(run, database_url, schema, admin_engine, reader_role):
    """Issue 34: granting a second schema without --login took LOGIN away from a role that had it."""
    def can_login() -> bool:
        with admin_engine.connect() as connection:
            return connection.execute(sa.text("SELECT rolcanlogin FROM pg_roles WHERE rolname = :r"),
                                      {"r": reader_role}).scalar_one()

    other = f"simdb_test_{uuid.uuid4().hex[:12]}"
    try:
        run("init")
        assert run("grant-reader", reader_role).output.endswith("write nothing; it cannot log in\n")
        assert not can_login()  # a new role without --login is a group role
        assert run("grant-reader", reader_role, "--login").output.endswith("; it can log in\n") and can_login()
        with Index.create(database_url, schema=other) as second:
            second.grant_reader(reader_role)  # the library keeps it too
        assert can_login()
        result = CliRunner().invoke(cli, ["grant-reader", reader_role], env={
            "SIMDB_DATABASE_URL": database_url, "SIMDB_SCHEMA": other})
        assert result.output == (f"updated role {reader_role!r}: it can read schema {other!r} and write nothing; "
                                 "it can log in\n")
        assert can_login()
        assert run("grant-reader", reader_role, "--no-login").output.endswith("; it cannot log in\n")
        assert not can_login()
    finally:
        with admin_engine.begin() as connection:
            connection.exec_driver_sql(f"DROP SCHEMA IF EXISTS {other} CASCADE")


def test_grant_reader_refuses_bad_or_administrative_roles(run):
    run("init")
    assert run("grant-reader", "Bad-Name").output.startswith("Error: invalid role name 'Bad-Name'")
    assert run("grant-reader", "postgres").output == ("Error: refusing to make 'postgres' read-only: it is an "
                                                      "administrative role\n")
    assert run("grant-reader", "x", "--password-env", "SIMDB_NO_SUCH_VARIABLE").output == (
        "Error: the environment variable SIMDB_NO_SUCH_VARIABLE is not set or empty\n")


@pytest.mark.citus
def test_views_agree_with_the_tables(corpus_archive, admin_engine):
    schema = corpus_archive
    with admin_engine.connect() as connection:
        summary = connection.execute(sa.text(f"SELECT * FROM {schema}.batch_summary ORDER BY batch_id")).all()
        clusters = connection.execute(sa.text(f"SELECT * FROM {schema}.duplicate_clusters")).all()
        sizes = dict(connection.execute(sa.text(
            f"SELECT cluster_id, count(*) FROM {schema}.documents GROUP BY cluster_id HAVING count(*) > 1")).all())
        pairs = connection.execute(sa.text(f"SELECT count(*) FROM {schema}.near_duplicate_pairs")).scalar_one()
        stored = connection.execute(sa.text(f"SELECT count(*) FROM {schema}.near_duplicates")).scalar_one()
    assert [s.name for s in summary] == ["archive", "new"]
    assert all(s.against_archive + s.within_batch == s.exact_duplicates + s.near_duplicates for s in summary)
    assert summary[0].against_archive == 0 and summary[1].against_archive > 0
    assert {c.cluster_id: c.size for c in clusters} == sizes and len(sizes) > 10
    assert pairs == stored > 0


def test_a_batch_leaves_the_planner_statistics_current(index):
    """A fresh index's tables had no statistics until someone ran ANALYZE (autovacuum never analyzes the
    partitioned documents table), and the views were planned for empty tables."""
    rng = random.Random(4)
    bases = [rng.getrandbits(64) for _ in range(3000)]
    index.add_fingerprinted(make_batch(bases + [flip(b, [1]) for b in bases[:300]], "one"), batch="one")

    def estimated():
        with index.database.engine.connect() as connection:
            return dict(connection.exec_driver_sql(
                "SELECT relname, reltuples FROM pg_class WHERE oid IN (to_regclass('documents'), "
                "to_regclass('near_duplicates'), to_regclass('clusters'))").all())

    assert estimated() == {"documents": 3300, "near_duplicates": 300, "clusters": 300}
    for batch in ("two", "three", "four"):  # a tenth each: the third outgrows the statistics by more than a fifth
        index.add_fingerprinted(make_batch([rng.getrandbits(64) for _ in range(330)], batch), batch=batch)
    assert estimated()["documents"] == 3300 + 3 * 330
