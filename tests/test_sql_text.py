"""A typed-in text looked up without leaving SQL: simdb_sketch, simdb_near_text, simdb_similar_text (issue 38)."""

import time
import uuid

import numpy as np
import psycopg
import pytest
import sqlalchemy as sa

from simdb import Index
from simdb.errors import SimdbError
from simdb.pg import plpython as plpython_module
from simdb.pg.database import postgres_url
from simdb.pg.methods import sql_of
from tests.conftest import Concurrently

METHODS = [{"method": "simhash"}, {"method": "minhash"}]
IDS = ["simhash", "minhash"]


def error_of(engine: sa.Engine, statement: str, params: dict | None = None) -> psycopg.Error:
    with engine.connect() as connection, pytest.raises(sa.exc.DBAPIError) as raised:
        connection.execute(sa.text(statement), params or {})
    return raised.value.orig


@pytest.mark.parametrize("options", METHODS, ids=IDS)
def test_until_enabled_the_functions_exist_and_say_in_one_line_how_to_enable_them(options, database_url, schema,
                                                                                   admin_engine):
    with Index.create(database_url, schema=schema, **options):
        pass
    for statement in (f"SELECT {schema}.simdb_sketch('some text')",
                      f"SELECT * FROM {schema}.simdb_near_text('some text')",
                      f"SELECT * FROM {schema}.simdb_similar_text('some text', 0.9)"):
        error = error_of(admin_engine, statement)
        assert error.sqlstate == "0A000"  # feature_not_supported
        message = error.diag.message_primary
        assert "\n" not in message
        for words in ("postgresql-plpython3-", "CREATE EXTENSION plpython3u", "superuser", "`simdb sql-functions`",
                      "`simdb query TEXT`", "`simdb fingerprint --index TEXT`"):
            assert words in message, (words, message)
    with admin_engine.connect() as connection:  # the sketch's type is the stored sketch's
        returns = connection.execute(sa.text("SELECT pg_get_function_result(to_regprocedure(:f))"),
                                     {"f": f"{schema}.simdb_sketch(text)"}).scalar_one()
    assert returns == ("bytea" if options["method"] == "minhash" else "bigint")


@pytest.fixture
def plain_role(admin_engine):
    """A role that may log in and read an index, and is no superuser."""
    role = f"simdb_plain_{uuid.uuid4().hex[:8]}"
    with admin_engine.begin() as connection:
        connection.exec_driver_sql(f"CREATE ROLE {role} LOGIN NOSUPERUSER")
    yield role
    with admin_engine.begin() as connection:
        connection.exec_driver_sql(f"DROP OWNED BY {role}")
        connection.exec_driver_sql(f"DROP ROLE {role}")


def test_sql_functions_without_a_superuser_says_what_to_do_and_changes_nothing(database_url, schema, admin_engine,
                                                                              plain_role, run):
    """Whether or not the server has PL/Python: a role that is no superuser may neither create the extension
    nor write functions in it; the command says so in one line and the placeholder stays."""
    with Index.create(database_url, schema=schema):
        pass
    with admin_engine.begin() as connection:
        connection.exec_driver_sql(f"GRANT USAGE, CREATE ON SCHEMA {schema} TO {plain_role}")
        connection.exec_driver_sql(f"GRANT SELECT ON ALL TABLES IN SCHEMA {schema} TO {plain_role}")
    url = postgres_url(database_url).set(drivername="postgresql", username=plain_role, password=None) \
        .render_as_string(hide_password=False)
    result = run("sql-functions", "--database-url", url)
    assert result.exit_code == 1
    (line,) = result.output.splitlines()
    assert line.startswith("Error: ") and "superuser" in line and "`simdb query TEXT`" in line, line
    assert "`simdb sql-functions`" in line
    error = error_of(admin_engine, f"SELECT {schema}.simdb_sketch('some text')")
    assert error.diag.message_primary == plpython_module.NOT_ENABLED


def test_sql_functions_refuses_a_server_that_cannot_import_this_simdb(database_url, schema, admin_engine, plpython):
    """simdb not where the function looks for it, or another version there: one line, and nothing installed."""
    engine = sa.create_engine(postgres_url(database_url), poolclass=sa.pool.NullPool)  # fresh backends: no
    try:                                                                                # simdb imported yet
        with Index.create(database_url, schema=schema) as index:
            method = index.sketcher
        with pytest.raises(SimdbError) as raised, engine.begin() as connection:
            plpython_module.install(connection, schema, method, paths=["/nonexistent/simdb-environment"])
        message = str(raised.value)
        assert "\n" not in message and "cannot import simdb from /nonexistent/simdb-environment" in message
        assert "ModuleNotFoundError" in message and "`simdb sql-functions`" in message
        with pytest.raises(SimdbError) as raised, engine.begin() as connection:
            plpython_module.install(connection, schema, method, version="0.0.0")
        message = str(raised.value)
        assert "\n" not in message and "installed by simdb 0.0.0" in message and "`simdb sql-functions` again" \
            in message
        error = error_of(engine, f"SELECT {schema}.simdb_sketch('some text')")  # both rolled back
        assert error.diag.message_primary == plpython_module.NOT_ENABLED
    finally:
        engine.dispose()


def edited(text: str) -> str:
    """A text a person might type in for a stored one: its last character dropped, a word added."""
    return text[:-1] + (" 另外" if any("\u4e00" <= c <= "\u9fff" for c in text) else " moreover")


@pytest.mark.parametrize("options", METHODS, ids=IDS)
def test_simdb_sketch_is_what_ingest_stores_and_the_text_lookups_answer_as_the_index(
        options, database_url, schema, admin_engine, devset_texts, plpython, run):
    """On the devset (Chinese and English, long and short), SQL sketches each text as ingest stored it and as
    this process sketches it; the lookups of a typed-in text give what brute force over the inputs gives."""
    records = [{"id": f"doc-{i}", "text": text} for i, text in enumerate(devset_texts)]
    with Index.create(database_url, schema=schema, **options) as index:
        index.add_many(records, batch="devset")
        method = index.sketcher
    result = run("sql-functions")
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"simdb_sketch, simdb_near_text and simdb_similar_text answer in schema "
                                    f"{schema!r}; the server's Python imports simdb from ")
    column = sql_of(method).sketch_column[0]
    with admin_engine.connect() as connection:
        rows = connection.execute(sa.text(
            f"SELECT x.id, {schema}.simdb_sketch(x.text) AS in_sql, d.{column} AS stored "
            "FROM unnest(CAST(:ids AS text[]), CAST(:texts AS text[])) WITH ORDINALITY x(id, text, n) "
            f"LEFT JOIN {schema}.documents d ON d.external_id = x.id ORDER BY x.n"),
            {"ids": [r["id"] for r in records], "texts": devset_texts}).all()
    sketches = method.sketch_all(devset_texts)  # the oracle, from the inputs
    here = method.stored(sketches)
    normal = (lambda value: bytes(value)) if options["method"] == "minhash" else (lambda value: value)
    assert len(rows) == len(records)
    assert [normal(row.in_sql) for row in rows] == here
    assert [normal(row.stored) for row in rows if row.stored is not None] == \
        [sketch for sketch, row in zip(here, rows) if row.stored is not None]
    assert sum(row.stored is not None for row in rows) > len(records) * 0.9
    chinese = [any("\u4e00" <= c <= "\u9fff" for c in text) for text in devset_texts]
    assert 1000 < sum(chinese) < len(devset_texts) - 1000  # both languages

    queries = [edited(text) for text in devset_texts[::len(devset_texts) // 20][:20]]
    query_sketches = method.sketch_all(queries)
    limit, found = method.max_distance, 0
    with admin_engine.connect() as connection:
        for query, sketch in zip(queries, query_sketches):
            near = {(row.external_id, row.distance) for row in connection.execute(sa.text(
                f"SELECT d.external_id, n.distance FROM {schema}.simdb_near_text(:q) n "
                f"JOIN {schema}.documents d ON d.id = n.document_id"), {"q": query})}
            similar = {row.external_id: row.similarity for row in connection.execute(sa.text(
                f"SELECT d.external_id, s.similarity FROM {schema}.simdb_similar_text(:q) s "
                f"JOIN {schema}.documents d ON d.id = s.document_id"), {"q": query})}
            distances = method.distances(sketch, here)
            if options["method"] == "simhash":  # the block keys find every document within k: brute force
                expected = {(r["id"], int(d)) for r, d in zip(records, distances.tolist()) if d <= limit}
                assert near == expected
                assert similar == {i: pytest.approx(1 - d / 64) for i, d in expected}
            else:  # a band shared and the estimate at the threshold: brute force over the input's signatures
                keys, query_keys = method.keys(sketches), method.keys([sketch])[0]
                estimate = 1 - distances / method.max_possible_distance
                share = (keys == query_keys).any(axis=1)
                expected = {r["id"]: e for r, e, s in zip(records, estimate.tolist(), share.tolist())
                            if s and np.float32(e) >= np.float32(method.layout.threshold)}
                assert similar == {i: pytest.approx(e, abs=1e-6) for i, e in expected.items()}
                assert {i for i, _ in near} == {i for i, e in expected.items()
                                                if round((1 - np.float32(e)) * method.max_possible_distance) <= limit}
            found += bool(near)
        assert connection.execute(sa.text(f"SELECT count(*) FROM {schema}.simdb_near_text(:q, 0)"),
                                  {"q": devset_texts[0]}).scalar_one() >= 1  # the text itself, stored
    assert found >= len(queries) // 2


def test_sql_functions_run_side_by_side_where_plpython_is_not_yet_enabled(database_url, admin_engine, plpython):
    """Two `simdb sql-functions` at once in a database without PL/Python (two schemas, two ingest scripts): the
    second's CREATE EXTENSION waits on the first's pg_extension row and, once that commits, found it there (a
    unique violation that came through as the command's error; the whole suite's runs of the docs' recipes met
    it)."""
    name = f"simdb_plpython_{uuid.uuid4().hex[:8]}"
    with admin_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.exec_driver_sql(f"CREATE DATABASE {name}")
    url = postgres_url(database_url).set(database=name)
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with Index.create(url.render_as_string(hide_password=False), schema="simdb_second") as index:
            method = index.sketcher
        with engine.connect() as first, Concurrently() as threads:
            first.exec_driver_sql("CREATE EXTENSION plpython3u")  # in its transaction, not yet committed

            def second() -> list[str]:
                with engine.begin() as connection:
                    return plpython_module.install(connection, "simdb_second", method)

            waiting = threads.start(second)
            for _ in range(600):  # until the second waits on the first's row
                with admin_engine.connect() as watcher:
                    if watcher.execute(sa.text("SELECT 1 FROM pg_stat_activity WHERE datname = :name AND "
                                               "wait_event_type = 'Lock'"), {"name": name}).first():
                        break
                assert not waiting.done(), waiting.result()
                time.sleep(0.05)
            else:
                raise AssertionError("the second installation never waited on the first's CREATE EXTENSION")
            first.commit()
            assert threads.results()[0]
        with engine.connect() as connection:
            assert connection.exec_driver_sql("SELECT simdb_second.simdb_sketch('some text')").scalar() == \
                method.stored([method.sketch("some text")])[0]
    finally:
        engine.dispose()
        with admin_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
            connection.exec_driver_sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
