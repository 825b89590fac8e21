"""Errors at the library boundary (issue 35 item 4): every public ``Index`` method raises simdb's own errors.

A caller of the Python API branches on :class:`SimdbError` subclasses (a read-only role, a lost connection),
never on SQLAlchemy's or psycopg's; the CLI prints the very message the library raised.
"""

from __future__ import annotations

import inspect
import time
import uuid

import psycopg
import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from simdb import Document, Index
from simdb.cli import cli, flag
from simdb.errors import ConnectionLost, DatabaseUnavailable, NotFound, PermissionDenied, SimdbError
from simdb.ingest import IngestOptions
from simdb.pg.database import postgres_url, translate
from tests.test_index import make_batch

UNREACHABLE = "postgresql://simdb:secret@127.0.0.1:1/archive"
TEXT = "document number 3 is about topic 3, at some length"

#: Every public method of Index, called as a read-only role on an index with one batch: name -> the call.
CALLS = {
    "create": lambda index, schema, url: Index.create(url, schema=schema),
    "copy_to_distributed": lambda index, schema, url: Index.copy_to_distributed(
        url, schema=f"{schema}_copy", source=schema),
    "open": lambda index, schema, url: Index.open(url, schema=schema).close(),
    "close": lambda index, schema, url: Index.open(url, schema=schema).close(),
    "fingerprint": lambda index, schema, url: index.fingerprint(TEXT),
    "add": lambda index, schema, url: index.add("new-1", "a fresh document", batch="second"),
    "add_many": lambda index, schema, url: index.add_many([{"id": "new-1", "text": "a fresh one"}], batch="second"),
    "ingest": lambda index, schema, url: index.ingest(iter([Document("new-1", "a fresh one", {})]),
                                                      IngestOptions(batch="second")),
    "add_fingerprinted": lambda index, schema, url: index.add_fingerprinted(make_batch([1, 2], "fp"), batch="fp"),
    "verdicts": lambda index, schema, url: list(index.verdicts("first")),
    "check": lambda index, schema, url: list(index.check(iter([Document("new-1", TEXT, {})]))),
    "check_many": lambda index, schema, url: index.check_many([{"id": "new-1", "text": TEXT}]),
    "sync_add": lambda index, schema, url: index.sync_add("feed", table="pg_class", id_column="oid",
                                                          text_column="relname"),
    "sync_sources": lambda index, schema, url: index.sync_sources(),
    "sync_run": lambda index, schema, url: index.sync_run("feed"),
    "remove": lambda index, schema, url: index.remove(ids=["doc-0"]),
    "relayout": lambda index, schema, url: index.relayout(),
    "compact": lambda index, schema, url: index.compact(full=True),
    "segments": lambda index, schema, url: index.segments(),
    "grant_reader": lambda index, schema, url: index.grant_reader(f"simdb_boundary_{uuid.uuid4().hex[:8]}"),
    "install_sql_functions": lambda index, schema, url: index.install_sql_functions(),
    "distance_for": lambda index, schema, url: index.distance_for(0.8),
    "query": lambda index, schema, url: index.query(TEXT),
    "query_fingerprint": lambda index, schema, url: index.query_fingerprint(index.fingerprint(TEXT)),
    "query_many": lambda index, schema, url: index.query_many([TEXT]),
    "query_fingerprints": lambda index, schema, url: index.query_fingerprints([index.fingerprint(TEXT)]),
    "document": lambda index, schema, url: index.document("doc-0"),
    "distance_between": lambda index, schema, url: index.distance_between(index.document("doc-0"),
                                                                          index.document("doc-1")),
    "pairs": lambda index, schema, url: list(index.pairs(batch="first")),
    "export": lambda index, schema, url: list(index.export()),
    "export_rows": lambda index, schema, url: list(index.export_rows(batch="first")),
    "stats": lambda index, schema, url: index.stats(),
    "count_by": lambda index, schema, url: index.count_by("topic"),
    "counts_by_field": lambda index, schema, url: index.counts_by_field(),
    "move_to_keyed_layout": lambda index, schema, url: index.move_to_keyed_layout(),  # refused: not distributed
}

#: The calls that write, which a read-only role is refused.
WRITES = {"add", "add_many", "ingest", "add_fingerprinted", "sync_add", "remove", "relayout", "grant_reader",
          "count_by"}


def public_methods() -> set[str]:
    """Index's public methods (properties compute from what the index holds and reach no database)."""
    return {name for name, member in inspect.getmembers(Index) if not name.startswith("_")
            and not isinstance(inspect.getattr_static(Index, name), property | type(Index.sketcher))}


@pytest.fixture(scope="module")
def reader_archive(server_url):
    """A SimHash index with a batch (and a pair), and a read-only role's URL for it."""
    schema = f"simdb_boundary_{uuid.uuid4().hex[:8]}"
    reader = f"simdb_boundary_reader_{uuid.uuid4().hex[:8]}"
    documents = [{"id": f"doc-{i}", "text": f"document number {i} is about topic {i % 5}, at some length"}
                 for i in range(30)] + [{"id": "doc-0-copy", "text": "document number 0 is about topic 0, at some length"}]
    with Index.create(server_url, schema=schema) as index:
        index.add_many(documents, batch="first")
        index.grant_reader(reader, login=True)
    url = postgres_url(server_url).set(username=reader, password=None).set(
        drivername="postgresql").render_as_string(hide_password=False)
    yield schema, url
    engine = sa.create_engine(postgres_url(server_url))
    with engine.begin() as connection:
        connection.exec_driver_sql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        connection.exec_driver_sql(f"DROP OWNED BY {reader}")
        connection.exec_driver_sql(f"DROP ROLE {reader}")
    engine.dispose()


def test_every_public_method_has_a_call_here():
    """A new public method joins CALLS (and so the test below), or this fails."""
    assert public_methods() == set(CALLS)


def test_every_public_method_is_behind_the_boundary():
    """A new public method that does not translate database errors fails here."""
    unguarded = [name for name in public_methods()
                 if not getattr(getattr(Index, name), "translates_database_errors", False)]
    assert unguarded == []


@pytest.mark.parametrize("name", sorted(CALLS))
def test_a_read_only_role_gets_simdb_errors_only(name, reader_archive):
    schema, url = reader_archive
    with Index.open(url, schema=schema) as index:
        try:
            CALLS[name](index, schema, url)
        except SimdbError as error:
            assert not isinstance(error, DatabaseUnavailable), error
            assert name not in WRITES or isinstance(error, PermissionDenied), repr(error)
            assert isinstance(error.__cause__, (sa.exc.DBAPIError, psycopg.Error, type(None)))
        else:
            assert name not in WRITES, f"{name} wrote as a read-only role"


@pytest.mark.parametrize("name, arguments", [("remove", ["remove", "--id", "doc-0"]),
                                             ("add", ["init"]), ("relayout", ["relayout"])])
def test_the_cli_prints_the_library_s_message(name, arguments, reader_archive):
    schema, url = reader_archive
    with Index.open(url, schema=schema) as index:
        call = CALLS["create" if arguments == ["init"] else name]
        with pytest.raises(PermissionDenied) as raised:
            call(index, schema, url)
    result = CliRunner().invoke(cli, arguments, env={"SIMDB_DATABASE_URL": url, "SIMDB_SCHEMA": schema})
    assert result.exit_code == 1
    assert result.stderr == f"Error: {raised.value.message(flag)}\n"
    assert isinstance(raised.value.__cause__, sa.exc.DBAPIError)  # the original is kept for a developer


def test_an_unreachable_server_is_database_unavailable_and_shows_no_password():
    with pytest.raises(DatabaseUnavailable) as raised:
        Index.open(UNREACHABLE, schema="simdb")
    assert "secret" not in str(raised.value)
    result = CliRunner().invoke(cli, ["stats"], env={"SIMDB_DATABASE_URL": UNREACHABLE})
    assert result.stderr == f"Error: {raised.value.message(flag)}\n"  # the CLI names the option by its flag


@pytest.mark.parametrize("error", [psycopg.errors.AdminShutdown("terminating connection due to administrator "
                                                                 "command"),
                                   psycopg.OperationalError("server closed the connection unexpectedly")])
def test_a_lost_connection_is_connection_lost(error):
    translated = translate(sa.exc.OperationalError("SELECT 1", {}, error))
    assert isinstance(translated, ConnectionLost) and isinstance(translated, DatabaseUnavailable)
    assert str(translated).startswith("lost the database connection: ")



@pytest.mark.parametrize("call", [lambda index: index.document("no-such-id"), lambda index: index.pairs(batch="nope"),
                                  lambda index: index.remove(ids=["no-such-id"]), lambda index: index.sync_run("nope"),
                                  lambda index: list(index.verdicts("nope"))], ids=["document", "pairs", "remove",
                                                                                     "sync_run", "verdicts"])
def test_what_a_call_names_and_is_not_stored_is_not_found(call, reader_archive, server_url):
    schema, _ = reader_archive
    with Index.open(server_url, schema=schema) as index, pytest.raises(NotFound):
        call(index)


def test_a_missing_index_is_not_found(server_url):
    with pytest.raises(NotFound):
        Index.open(server_url, schema=f"simdb_boundary_{uuid.uuid4().hex[:8]}")


def test_a_method_this_simdb_has_no_sql_for_is_one_clear_error():
    """An index made by another simdb, with a method this one does not know: IncompatibleIndex naming both, not
    a KeyError from the registry of the methods' SQL."""
    from simdb.errors import IncompatibleIndex
    from simdb.pg.methods.base import MethodSQL

    with pytest.raises(IncompatibleIndex, match=r"no SQL for the method 'lsh-forest' \(it knows minhash, simhash\)"):
        MethodSQL.named("lsh-forest")


def test_a_pooled_connection_is_pinged_only_after_lying_idle(database_url, schema, admin_engine, monkeypatch):
    """Lookups one after another take a pooled connection each without a ping's round trip; a connection that
    lay idle longer than PING_AFTER_IDLE is pinged first, and one the server ended meanwhile is replaced."""
    from simdb.pg import database

    with Index.create(database_url, schema=schema, max_distance=3) as index:
        engine = index.database.engine
        engine.dispose()  # one pooled connection from here
        pings = []
        real = engine.dialect.do_ping
        monkeypatch.setattr(engine.dialect, "do_ping", lambda connection: pings.append(1) or real(connection))
        for _ in range(5):
            assert index.query_fingerprint(1) == []
        assert pings == [] and engine.pool.checkedin() == 1
        with engine.connect() as connection:
            pid = connection.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
        with admin_engine.connect() as connection:
            assert connection.exec_driver_sql(f"SELECT pg_terminate_backend({int(pid)}, 5000)").scalar_one()
        monkeypatch.setattr(database, "PING_AFTER_IDLE", 0.05)
        time.sleep(0.1)
        assert index.query_fingerprint(1) == []  # the ping found it ended; a new connection answered, unpinged
        assert pings == [1]


def test_after_the_server_ends_the_pools_sessions_one_operation_fails_not_one_per_connection(database_url, schema,
                                                                                            admin_engine):
    """A restart ends every pooled session; connections used within PING_AFTER_IDLE are handed out unpinged, and
    psycopg's dialect took only a closed or broken connection for a disconnect, so each dead connection failed
    an operation of its own (found in review). The first failure now replaces the whole pool."""
    from simdb.errors import ConnectionLost

    with Index.create(database_url, schema=schema, max_distance=3) as index:
        engine = index.database.engine
        engine.dispose()
        held = [engine.connect() for _ in range(4)]  # four pooled connections, just used
        pids = [connection.exec_driver_sql("SELECT pg_backend_pid()").scalar_one() for connection in held]
        for connection in held:
            connection.close()
        with admin_engine.connect() as connection:
            for pid in pids:
                assert connection.exec_driver_sql(f"SELECT pg_terminate_backend({int(pid)}, 5000)").scalar_one()
        outcomes = []
        for _ in range(3):
            try:
                outcomes.append(index.query_fingerprint(1))
            except ConnectionLost:
                outcomes.append("lost")
        assert outcomes[1:] == [[], []], outcomes
