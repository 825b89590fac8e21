"""Connections: a PostgreSQL server by URL, or an embedded one.

``database_url`` (or ``SIMDB_DATABASE_URL``) names a server; ``schema`` (or
``SIMDB_SCHEMA``, default ``simdb``) the PostgreSQL schema of the index. With neither,
simdb starts an embedded PostgreSQL (the ``pgserver`` package ships real
PostgreSQL binaries) in a data directory (``data_dir``, ``SIMDB_DATA_DIR``, or
``~/.local/share/simdb/postgres``), which stops by itself after a while without
use (:mod:`.embedded`).

Every connection's ``search_path`` starts with the index's schema, so the
index's tables are reachable unqualified and one database can hold several
indexes side by side.
"""

from __future__ import annotations

import functools
import itertools
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote, quote_plus, unquote, unquote_plus

import psycopg
import sqlalchemy as sa
from psycopg.conninfo import conninfo_to_dict
from sqlalchemy import event
from sqlalchemy.engine import URL, make_url

from ..errors import ConnectionLost, DatabaseUnavailable, PermissionDenied, SimdbError
from ..settings import MAX_CONNECTIONS
from . import DEFAULT_SCHEMA
from .embedded import idle_seconds, start_embedded  # noqa: F401 -- start_embedded re-exported

_SCHEMA_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def check_schema_name(schema: str) -> str:
    if not _SCHEMA_NAME.match(schema or ""):
        raise SimdbError(f"invalid schema name {schema!r}: use lower-case letters, digits and underscores, "
                         "starting with a letter or underscore (at most 63 characters)")
    if schema.startswith("pg_") or schema == "information_schema":
        raise SimdbError(f"the schema name {schema!r} is reserved by PostgreSQL (pg_dump leaves "
                         "information_schema out of backups): choose another name")
    return schema


#: Seconds between two tries for the ``migrate`` lock (see :func:`lock`).
LOCK_POLL = 0.5


def lock(connection: sa.Connection, schema: str, purpose: str) -> None:
    """Transaction-scoped advisory lock, so that two processes never migrate (``migrate``: schema changes,
    merges of segments, a relayout's index builds) or match and insert (``ingest``) at once in the same
    index. A transaction that needs both takes ``migrate`` first: a relayout holds it across its index
    builds, and takes the ingest lock meanwhile.

    The ``migrate`` lock is never waited for inside PostgreSQL. A relayout holds it while it builds
    indexes with CREATE INDEX CONCURRENTLY, which waits for every transaction whose snapshot is older
    than its own, and a statement waiting for a lock holds its snapshot: the two would wait for each
    other (``deadlock detected``). So it is asked for without waiting, and again after :data:`LOCK_POLL`
    seconds, between statements, where a READ COMMITTED transaction holds no snapshot."""
    if purpose == "migrate":
        while not try_lock(connection, schema, purpose):
            time.sleep(LOCK_POLL)
        return
    connection.execute(sa.text("SELECT pg_advisory_xact_lock(hashtextextended(:key, 0))"),
                       {"key": f"simdb {purpose} {schema}"})


def try_lock(connection: sa.Connection, schema: str, purpose: str) -> bool:
    """:func:`lock` if no other session holds it now, else False at once."""
    return connection.execute(sa.text("SELECT pg_try_advisory_xact_lock(hashtextextended(:key, 0))"),
                              {"key": f"simdb {purpose} {schema}"}).scalar_one()


@contextmanager
def session_lock(connection: sa.Connection, schema: str, purpose: str) -> Iterator[None]:
    """The advisory lock of :func:`lock` held by an AUTOCOMMIT ``connection`` across its transactions, for the
    ``with`` block; waited for the way :func:`lock` waits."""
    key = {"key": f"simdb {purpose} {schema}"}
    while not connection.execute(sa.text("SELECT pg_try_advisory_lock(hashtextextended(:key, 0))"), key).scalar_one():
        time.sleep(LOCK_POLL)
    try:
        yield
    finally:
        connection.execute(sa.text("SELECT pg_advisory_unlock(hashtextextended(:key, 0))"), key)


def postgres_url(url: str | URL) -> URL:
    """Parse a URL (or a libpq ``key=value`` connection string) and point it at the psycopg 3 driver; anything
    but PostgreSQL is an error."""
    if isinstance(url, str) and "://" not in url and "=" in url:
        return _from_conninfo(url)
    try:
        parsed = make_url(url)
    except sa.exc.ArgumentError as exc:
        raise SimdbError(f"cannot parse the database URL {redact(url, secrets_in(url))!r}: expected "
                         "postgresql://user@host:port/database, or libpq's key=value pairs") from exc
    if parsed.drivername in ("postgres", "postgresql", "postgresql+psycopg", "postgresql+psycopg3"):
        return parsed.set(drivername="postgresql+psycopg")
    raise SimdbError(f"simdb stores its index in PostgreSQL; {parsed.drivername!r} URLs are not supported "
                     "(give a postgresql:// URL, or none for the embedded database)")


def _from_conninfo(conninfo: str) -> URL:
    """A libpq connection string (``host=... dbname=... password='...'``) as the URL that connects the same way."""
    try:
        params = conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError as exc:
        secrets = secrets_in(conninfo)
        raise SimdbError(f"cannot parse the database URL {redact(conninfo, secrets)!r}: "
                         f"{redact(str(exc).strip(), secrets)}; quote a value that holds spaces or quotes "
                         "('...', with \\' for a quote), or give a postgresql:// URL") from None
    user, password, database = (params.pop(name, None) for name in ("user", "password", "dbname"))
    host, port = params.get("host"), params.get("port")
    if host and not set(host) & set("/,") and (port is None or port.isdigit()):  # one host by name or address
        del params["host"]
        port = int(params.pop("port")) if port is not None else None
    else:  # a socket folder or several hosts: as libpq options
        host = port = None
    return URL.create("postgresql+psycopg", username=user, password=password, host=host, port=port,
                      database=database, query={name: str(value) for name, value in params.items()})


#: ``scheme://user:password@``: the password part.
_USERINFO = re.compile(r"(?P<keep>\b[a-z][a-z0-9+.-]*://[^\s/@:]*:)[^\s@]*(?=@)", re.IGNORECASE)
#: ``?password=...`` or ``&sslpassword=...`` in a URL's query.
_QUERY = re.compile(r"(?P<keep>[?&]\w*password=)(?P<value>[^&#\s'\"]*)", re.IGNORECASE)
#: ``password=...`` (``sslpassword``, ``PGPASSWORD``, any ``...password``) in a libpq connection string or
#: any text: a value quoted by libpq's rules ('...', with \' and \\ inside; unterminated too), or a run of
#: non-blanks (with \ escapes).
_KEYWORD = re.compile(r"(?P<keep>(?<![?&\w])\w*password\s*=\s*)(?P<value>'(?:[^'\\]|\\.)*(?:'|$)|(?:\\.|[^\s\\])*)",
                      re.IGNORECASE)
_MASK = "***"


def redact(value: str | URL, secrets: Iterable[str] = ()) -> str:
    """Text safe to print: a database URL, a libpq connection string or any message, with every password masked.

    Masked are a URL's userinfo password, its ``password`` and ``sslpassword`` query parameters and
    ``password=...`` in libpq's ``key=value`` form (any ``...password`` keyword), wherever they are in the
    text; and anywhere, each of ``secrets`` (what :func:`secrets_in` finds in the URL given to simdb), which
    catches what a message quotes of a password outside those forms (libpq's ``missing "=" after "..."``).
    """
    url = _as_url(value)
    text = _rendered(url) if url is not None else value
    text = _QUERY.sub(lambda match: match["keep"] + _MASK, text)
    text = _KEYWORD.sub(lambda match: match["keep"] + _MASK + match["value"].partition(_MASK)[2]
                        if match["value"].startswith(_MASK) else match["keep"] + _MASK, text)  # masked once
    text = _USERINFO.sub(lambda match: match["keep"] + _MASK, text)
    for secret in sorted(_spellings(secrets), key=len, reverse=True):
        # where it stands alone (quoted, between a URL's : and @, ...): a password that is also a common word
        # ("postgres") must not take the letters out of every other word of the message
        text = re.sub(rf"(?<!\w){re.escape(secret)}(?!\w)", _MASK, text)
    return text


def _as_url(value: str | URL) -> URL | None:
    """``value`` as a URL when it is one (not a message that holds one), else None."""
    if isinstance(value, URL):
        return value
    if not re.match(r"[a-z][a-z0-9+.-]*://", value, re.IGNORECASE) or "\n" in value:
        return None
    try:
        return make_url(value)
    except (sa.exc.ArgumentError, ValueError):
        return None


def _rendered(url: URL) -> str:
    if url.drivername.startswith("postgresql+"):
        url = url.set(drivername="postgresql")
    if url.password == "":
        url = url._replace(password=None)  # URL.set() treats None as "unchanged"
    return url.render_as_string(hide_password=True)


def _spellings(secrets: Iterable[str]) -> set[str]:
    """Each secret as it may be written: itself, URL-encoded, and quoted for libpq."""
    found = set()
    for secret in secrets:
        if secret and secret != _MASK:
            found |= {secret, quote(secret, safe=""), quote_plus(secret, safe=""),
                      secret.replace("\\", "\\\\").replace("'", "\\'")}
    return found


def secrets_in(url: str | URL | None) -> list[str]:
    """The secrets a database URL or libpq connection string carries, a malformed one too (for :func:`redact`):
    each password as written and decoded, and the words of one written with blanks (libpq may quote one)."""
    if url is None:
        return []
    parsed = _as_url(url)
    found = [] if parsed is None else [parsed.password, *(value for name, value in parsed.query.items()
                                                         if name.lower().endswith("password"))]
    if isinstance(url, URL):
        return [secret for secret in found if secret]
    for match in _QUERY.finditer(url):
        found += [match["value"], unquote_plus(match["value"])]
    for match in _KEYWORD.finditer(url):
        value = match["value"]
        if value.startswith("'"):
            value = re.sub(r"\\(.)", r"\1", value[1:].removesuffix("'"))
        else:  # the words up to the next keyword: a password with blanks that was not quoted
            value = " ".join([value, *itertools.takewhile(lambda word: "=" not in word, url[match.end():].split())])
        found += [value, *value.split()]
    for match in _USERINFO.finditer(url):
        written = url[match.end("keep"):match.end()]
        found += [written, unquote(written)]
    return [secret for secret in dict.fromkeys(found) if secret and secret != _MASK]


#: Seconds a pooled connection may lie idle and still be handed out without a ping first.
PING_AFTER_IDLE = 1.0


def ping_after_idle(engine: sa.Engine) -> None:
    """Ping a pooled connection before handing it out (a ``SELECT 1`` round trip; a broken one is replaced) only
    when it lay idle more than :data:`PING_AFTER_IDLE` seconds, not on every checkout as ``pool_pre_ping``
    does: lookups made one after another check a connection out each time, and that round trip was 0.05 to
    0.15 ms of a lookup's p50 of 0.3-0.4 ms (``Index.query_fingerprint``, 300k documents, one segment).

    A server that restarted (or ended the sessions) within the second fails the next operation, as it would
    the operation it broke; that failure replaces every pooled connection made before it, not only its own
    (psycopg's dialect takes only a closed or broken connection for a lost one, and the lookups' statements
    run on psycopg's connection itself, so each dead connection had failed an operation of its own)."""
    lost = {"at": float("-inf")}  # when a connection of this engine was last found lost

    @event.listens_for(engine, "connect")
    def _connected(_dbapi_connection, record):
        record.info["used"] = record.info["connected"] = time.monotonic()

    @event.listens_for(engine, "checkin")
    def _used(_dbapi_connection, record):
        record.info["used"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _ping(dbapi_connection, record, _proxy):
        if record.info.get("connected", float("-inf")) < lost["at"]:
            raise sa.exc.DisconnectionError("a connection made before it was found lost")  # the pool connects anew
        if time.monotonic() - record.info.get("used", float("-inf")) <= PING_AFTER_IDLE:
            return
        try:  # any error of the ping's (the server ended the session: AdminShutdown) means it is not usable
            alive = engine.dialect.do_ping(dbapi_connection)
        except (sa.exc.DBAPIError, psycopg.Error):
            alive = False
        if not alive:
            raise sa.exc.DisconnectionError("the connection broke while it was idle")  # the pool connects anew

    @event.listens_for(engine, "invalidate")
    def _invalidated(_dbapi_connection, _record, exception):
        if _connection_lost(exception):
            lost["at"] = time.monotonic()

    @event.listens_for(engine, "handle_error")
    def _ended(context):
        if _connection_lost(context.original_exception):
            context.is_disconnect = True


def _connection_lost(error: BaseException | None) -> bool:
    """Whether ``error`` says the connection is gone: the server ended the session (a restart,
    ``pg_terminate_backend``: SQLSTATE 57P01-57P03), a connection failure (08...), or psycopg's own word that it
    is lost (no SQLSTATE)."""
    if isinstance(error, sa.exc.DBAPIError):
        error = error.orig
    if not isinstance(error, psycopg.Error):
        return False
    state = error.sqlstate or ""
    return state.startswith("08") or state in ("57P01", "57P02", "57P03") or \
        (not state and isinstance(error, psycopg.OperationalError))


@dataclass
class Database:
    """An engine bound to one index schema, and the embedded server it may run on."""

    engine: sa.Engine
    schema: str
    server: object | None = None
    session: dict[str, str] = field(default_factory=dict)  #: settings every new connection gets

    def use_session(self, settings: dict[str, str]) -> None:
        """Give every connection from now on these settings (the pool's idle connections are replaced)."""
        if any(self.session.get(name) != value for name, value in settings.items()):
            self.session.update(settings)
            self.engine.dispose()

    @classmethod
    def connect(cls, database_url: str | URL | None = None, *, schema: str | None = None,
                data_dir: str | Path | None = None) -> "Database":
        schema = check_schema_name(schema or os.environ.get("SIMDB_SCHEMA") or DEFAULT_SCHEMA)
        database_url = database_url or os.environ.get("SIMDB_DATABASE_URL") or None
        server = None
        if database_url is None:
            server = start_embedded(data_dir, idle=idle_seconds())
            database_url = server.get_uri()
        url = postgres_url(database_url)
        engine = sa.create_engine(url, pool_size=5, max_overflow=MAX_CONNECTIONS - 5,
                                  connect_args={"connect_timeout": 10, "application_name": "simdb"})
        ping_after_idle(engine)

        session: dict[str, str] = {}  # more settings for every connection (Database.use_session)

        @event.listens_for(engine, "connect", insert=True)
        def _set_search_path(dbapi_connection, _record):
            autocommit = dbapi_connection.autocommit
            dbapi_connection.autocommit = True
            dbapi_connection.execute(f"SET search_path TO {schema}, public")
            for name, value in session.items():
                dbapi_connection.execute("SELECT set_config(%s, %s, false)", (name, value))
            dbapi_connection.autocommit = autocommit

        try:
            with engine.connect() as connection:
                version = connection.execute(sa.text("SHOW server_version_num")).scalar_one()
        except sa.exc.DBAPIError as exc:  # the server's answer, or libpq's refusal of an option (ProgrammingError)
            engine.dispose()
            reason = redact(str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc),
                            [*secrets_in(database_url), *secrets_in(url)])
            raise DatabaseUnavailable(
                f"cannot connect to {redact(url)}: {reason}. Check that the server is running and the URL "
                "is right, or unset SIMDB_DATABASE_URL and «database_url» to use the embedded database") from exc
        if int(version) < 140000:
            engine.dispose()
            raise DatabaseUnavailable(f"{redact(url)} runs PostgreSQL {int(version) // 10000}; simdb needs 14 or newer")
        if server is not None:  # the embedded server is simdb's own: set it up for an archive on this machine
            from .server import tune_embedded

            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
                tune_embedded(connection)
        return cls(engine=engine, schema=schema, server=server, session=session)

    @property
    def display_url(self) -> str:
        return redact(self.engine.url)

    def close(self) -> None:
        self.engine.dispose()


#: SQLSTATE classes and codes -> what they mean for the person running simdb.
_READ_ONLY = "25006"
_PRIVILEGE = "42501"
#: The session is gone: a connection exception (class 08), the server shutting down or restarting, the
#: database dropped, an idle session or transaction timed out.
_CONNECTION_LOST = ("08", "57P01", "57P02", "57P03", "57P04", "57P05", "25P03")


def translate(error: sa.exc.DBAPIError | psycopg.Error, url: str | URL | None = None) -> SimdbError:
    """A database error (through SQLAlchemy or straight from psycopg) as a :class:`SimdbError` whose
    message says what happened and what to do, decided by its SQLSTATE (psycopg counts a deadlock, a
    cancelled statement and a size limit as an ``OperationalError``, like a lost connection)."""
    original = error if isinstance(error, psycopg.Error) else error.orig
    state = getattr(original, "sqlstate", None) or ""
    message = redact((str(original) if original is not None else str(error)).strip().splitlines()[0],
                     secrets_in(url))
    try:
        role = postgres_url(url).username if url is not None else None
    except SimdbError:  # a URL that cannot be parsed names no role
        role = None
    who = f"the database role {role!r}" if role else "this database role"
    if state == _READ_ONLY:
        return PermissionDenied(f"{who} is read-only ({message}): it can query the index but not change it; "
                                "run this as the role that owns the index")
    if state == _PRIVILEGE:
        return PermissionDenied(f"{who} lacks a privilege this needs: {message}; run it as the role that owns "
                                "the index, or have the owner grant it (simdb grant-reader grants reading only)")
    if state.startswith(_CONNECTION_LOST) or (not state and isinstance(
            error, (sa.exc.OperationalError, psycopg.OperationalError))):
        return ConnectionLost(f"lost the database connection: {message}")
    if state.startswith("53"):
        return DatabaseUnavailable(f"the database server ran out of resources: {message}; free disk space or "
                                   "memory on the server, then run the command again")
    if state.startswith("54"):
        return SimdbError(f"PostgreSQL refused a value or statement over one of its size limits: {message} "
                          f"(SQLSTATE {state}); make what it names smaller (an id, a metadata field, a text), "
                          "or split it")
    if state == "40P01":
        return SimdbError(f"a deadlock with another session, which PostgreSQL broke by stopping this one: "
                          f"{message}; run the command again")
    if state == "40001":
        return SimdbError(f"a concurrent transaction changed what this one read: {message}; "
                          "run the command again")
    if state == "55P03":
        return SimdbError(f"a lock was not granted in time: {message} (another session holds it; a lock_timeout "
                          "of the server, the database or the role set how long to wait); run the command again "
                          "when that session is done")
    if state == "57014":
        return SimdbError(f"PostgreSQL cancelled the statement: {message} (a statement_timeout of the server, the "
                          "database or the role, or someone cancelled it); raise or unset the timeout, then run "
                          "the command again")
    return SimdbError(f"PostgreSQL refused the operation: {message} (SQLSTATE {state or 'unknown'})")


#: Where a translated error's redaction and role come from: the URL a call used, from its arguments.
UrlOf = Callable[[tuple, dict], "str | URL | None"]
#: What a call's database error means where the call knows better than its SQLSTATE (from the call's arguments and
#: the error; None: :func:`translate` says it).
Explain = Callable[[tuple, dict, BaseException], "SimdbError | None"]


def translating(url_of: UrlOf, explain: Explain | None = None) -> Callable[[Callable], Callable]:
    """A decorator for the library's boundary: a database error the function raises, or the iterator it returns
    raises while it is read, becomes :func:`translate`'s :class:`SimdbError` (the original kept as its
    ``__cause__``), or ``explain``'s where it has one; simdb's own errors pass as they are. ``url_of(args,
    kwargs)`` names the URL the call used."""
    def decorate(function: Callable) -> Callable:
        def translated_error(error: BaseException, args: tuple, kwargs: dict) -> SimdbError:
            return (explain(args, kwargs, error) if explain is not None else None) or \
                translate(error, url_of(args, kwargs))

        @functools.wraps(function)
        def translated(*args, **kwargs):
            try:
                result = function(*args, **kwargs)
            except (sa.exc.DBAPIError, psycopg.Error) as error:
                raise translated_error(error, args, kwargs) from error
            return _translated_items(result, lambda error: translated_error(error, args, kwargs)) \
                if isinstance(result, Iterator) else result
        translated.translates_database_errors = True
        return translated
    return decorate


def _translated_items(items: Iterator, translated: Callable[[BaseException], SimdbError]) -> Iterator:
    try:
        yield from items
    except (sa.exc.DBAPIError, psycopg.Error) as error:
        raise translated(error) from error


LOCAL_SERVER = "postgresql://postgres@127.0.0.1:5432/test"


def answers(url: str) -> bool:
    """Whether a PostgreSQL at ``url`` accepts a connection within two seconds."""
    try:
        psycopg.connect(url, connect_timeout=2).close()
        return True
    except psycopg.OperationalError:
        return False


def scratch_server(variable: str) -> tuple[str, str, object | None]:
    """A PostgreSQL for tests and benchmarks: ``(url, where it came from, embedded server or None)``.

    The URL in the environment variable ``variable`` if set; else the local server at
    127.0.0.1:5432 (database ``test``) if it answers; else an embedded PostgreSQL in a new temporary
    directory (the caller stops it with ``server.cleanup()``).
    """
    import tempfile

    if os.environ.get(variable):
        return os.environ[variable], variable, None
    if answers(LOCAL_SERVER):
        return LOCAL_SERVER, "local server", None
    directory = tempfile.mkdtemp(prefix="simdb-pg-")
    server = start_embedded(os.path.join(directory, "data"))
    return server.get_uri(), f"embedded PostgreSQL in {directory}", server
