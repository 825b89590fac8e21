"""Real PostgreSQL for every test that needs one; nothing is mocked.

The database is ``SIMDB_TEST_DATABASE_URL`` when set; otherwise the local
server at 127.0.0.1:5432 (database ``test``) if it answers; otherwise an
embedded PostgreSQL (pgserver) in a temporary directory, removed afterwards.
Each test gets its own schema, dropped when the test ends, so tests are
isolated and leave nothing behind.

A test that asks for no database fixture is marked ``unit``: ``-m unit`` runs
them without PostgreSQL, and nothing here connects to one (or starts one)
unless a selected test needs it.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import pathlib
import shutil
import tempfile
import uuid
from collections.abc import Callable, Sequence

import hypothesis
import psycopg
import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from simdb import Index
from simdb.cli import cli
from simdb.pg import citus, keyed, migrate
from simdb.pg.database import Database, postgres_url, redact, start_embedded
from simdb.pg.functions import create_functions, create_views, drop_functions_and_views
from simdb.settings import IndexSettings
from tests import scheduling
from tests.scheduling import _parameters, on_citus

#: The ``simdb`` processes that tests start run their commands in-process, leaving no warm process behind
#: (tests/test_warm.py runs both paths and compares them).
os.environ.setdefault("SIMDB_WARM", "0")

LOCAL_SERVER = "postgresql://postgres@127.0.0.1:5432/test"
#: The labelled devset of real text (beside the checkout in ../shared/devset, or SIMDB_DEVSET).
DEVSET = pathlib.Path(os.environ.get("SIMDB_DEVSET", pathlib.Path(__file__).parents[2] / "shared" / "devset"))


def _answers(url: str) -> bool:
    try:
        psycopg.connect(url, connect_timeout=2).close()
        return True
    except psycopg.OperationalError:
        return False


@functools.cache
def _database() -> tuple[str, str, object]:
    """(url, where it came from, embedded server or None), decided once per test session."""
    if os.environ.get("SIMDB_TEST_DATABASE_URL"):
        return os.environ["SIMDB_TEST_DATABASE_URL"], "SIMDB_TEST_DATABASE_URL", None
    if _answers(LOCAL_SERVER):
        return LOCAL_SERVER, "local server", None
    directory = tempfile.mkdtemp(prefix="simdb-test-pg-")
    server = start_embedded(os.path.join(directory, "data"))
    return server.get_uri(), f"embedded PostgreSQL in {directory}", server


#: How many examples each Hypothesis property runs, per lane (SIMDB_TEST_EXAMPLES, else chosen by the lane):
#: "full" runs every property's own count (the whole suite, CI); "quick" a tenth of it, at least 10, for the
#: lanes a developer runs while working (``-m unit``, ``-m "not slow"``), which CI's full counts back.
EXAMPLES_ENV = "SIMDB_TEST_EXAMPLES"
EXAMPLE_SHARE = {"full": 1.0, "quick": 0.1}


def examples(count: int) -> int:
    """A property's ``max_examples``: ``count`` in the full lane, a tenth of it (at least 10, at most ``count``)
    in the quick one."""
    lane = os.environ.get(EXAMPLES_ENV, "full")
    if lane not in EXAMPLE_SHARE:
        raise pytest.UsageError(f"{EXAMPLES_ENV}={lane!r}: use one of {', '.join(EXAMPLE_SHARE)}")
    return min(count, max(10, round(count * EXAMPLE_SHARE[lane])))


#: The share of a property's examples that its runs on Citus draw (:func:`check_property`). An example costs about
#: 2 s there against 0.4 s on one server (the clusters property, 10 examples: 19.8 s against 5.8, quiet); the run on
#: the test database draws them all, through the same code but for the statements Citus plans and routes, which any
#: drawn history reaches (every chunk, merge and removal runs them).
CITUS_EXAMPLE_SHARE = 0.25


def check_property(backend: str, count: int, check: Callable, /, *arguments, **strategies) -> None:
    """Run ``check(*arguments, **drawn)`` as a Hypothesis property, drawing ``strategies``: ``examples(count)``
    examples on the test database, a CITUS_EXAMPLE_SHARE of them (at least 10, at most ``count``) on Citus.
    ``check`` takes the test's fixtures in ``arguments``, which every example shares."""
    share = 1.0 if backend == "postgres" else CITUS_EXAMPLE_SHARE
    hypothesis.settings(max_examples=examples(min(count, max(10, round(count * share)))), deadline=None,
                        suppress_health_check=[hypothesis.HealthCheck.too_slow])(
        hypothesis.given(**strategies)(check))(*arguments)


def examples_of_lane(selection: str) -> str:
    """The share of examples for a ``-m`` selection: quick where it leaves the slow tests out or takes the unit
    tests only (a developer's lanes), full for the whole suite (CI) and the rest."""
    selection = " ".join(selection.split())
    return "quick" if "not slow" in selection or selection.startswith("unit") else "full"


def pytest_configure(config):
    """The lane's Hypothesis share, decided before the test modules (whose decorators read it) are imported:
    quick where the selection leaves the slow tests out or takes the unit tests only, unless SIMDB_TEST_EXAMPLES
    says. The environment carries it to pytest-xdist's workers and to ``tests.conftest`` imported again."""
    os.environ.setdefault(EXAMPLES_ENV, examples_of_lane(config.getoption("markexpr", "") or ""))
    if not config.getoption("hypothesis_profile", None):  # --hypothesis-profile wins
        hypothesis.settings.register_profile("simdb", max_examples=examples(100))  # the properties that set no count
        hypothesis.settings.load_profile("simdb")
    if not hasattr(config, "workerinput") and not os.environ.get("SIMDB_TEST_CITUS_URL"):
        # the process that runs the session (not one of pytest-xdist's workers, which inherit the variable) makes
        # the folder of the run's one Citus cluster, and stops the cluster when the session ends
        _OWNED_CITUS_DIRS.append(_make_citus_dir())


#: The Citus folder this process made for the run (pytest_configure), to stop the cluster in when the session ends.
_OWNED_CITUS_DIRS: list[str] = []
_CITUS_STARTS: list = []


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook, in its controller
def pytest_xdist_node_collection_finished(node, ids):
    """Once the first worker has collected, the controller starts the run's Citus cluster in a thread where a
    collected test needs it: the workers meanwhile run other tests, instead of the first one on Citus waiting
    for the three servers to start (15 s at load 8)."""
    import threading

    if _CITUS_STARTS or not _OWNED_CITUS_DIRS or not any(on_citus(nodeid) for nodeid in ids) or citus_missing():
        return

    def start() -> None:
        with contextlib.suppress(Exception):  # a failed start is written down and raised in the workers that ask
            start_shared_cluster(_OWNED_CITUS_DIRS[0])

    _CITUS_STARTS.append(threading.Thread(target=start, daemon=True))
    _CITUS_STARTS[0].start()


def pytest_report_header(config):
    return f"simdb Hypothesis examples: {os.environ[EXAMPLES_ENV]} ({EXAMPLES_ENV}=full|quick)"


#: Every fixture that reaches a database asks for one of these.
DATABASE_FIXTURES = {"server_url", "database_url", "backend"}


def needs_database(item: pytest.Item) -> bool:
    return bool(DATABASE_FIXTURES.intersection(getattr(item, "fixturenames", ())))


@pytest.hookimpl(tryfirst=True)  # before -m selects by marker
def pytest_collection_modifyitems(config, items):
    """Marks the tests that need no database ``unit``, and runs the longest kinds first, so that pytest-xdist's
    workers (scripts/test) end together rather than one of them on a long test the others finished without: the
    slow tests (benchmarks, SIGKILL loops), then the unit tests (no database: time for the Citus cluster to start
    meanwhile), then the tests on Citus, then the rest, each kind in the order of the files."""
    for item in items:
        if not needs_database(item):
            item.add_marker(pytest.mark.unit)
    # the layout by id's run of a MinHash index is its citus run again (MinHash has that layout only)
    again = [item for item in items if "citus-id" in _parameters(item.nodeid) and "minhash" in _parameters(item.nodeid)]
    if again:
        config.hook.pytest_deselected(items=again)
        items[:] = [item for item in items if item not in again]

    def kind(item: pytest.Item) -> int:
        if item.get_closest_marker("slow"):
            return 0
        return 1 if item.get_closest_marker("unit") else 2 if on_citus(item.nodeid) else 3

    items.sort(key=kind)


#: pytest-xdist's hook, in tests/scheduling.py (which the pytest runs of tests/test_lanes.py import alone)
pytest_xdist_make_scheduler = scheduling.pytest_xdist_make_scheduler


def pytest_report_collectionfinish(config, start_path, items):
    """The test database, once the selected tests are known: none is reached where none of them needs it."""
    if not any(needs_database(item) for item in items):
        return "simdb test database: none (no selected test needs PostgreSQL)"
    url, origin, _ = _database()
    with psycopg.connect(url) as connection:
        version = connection.execute("SHOW server_version").fetchone()[0]
    return f"simdb test database: {redact(url)} ({origin}), PostgreSQL {version}"


def pytest_sessionfinish(session, exitstatus):
    for engine in _ENGINES.values():
        engine.dispose()
    for thread in _CITUS_STARTS:
        thread.join()
    for directory in _OWNED_CITUS_DIRS:
        _stop_citus(directory)
    if _database.cache_info().currsize:
        _, origin, server = _database()
        if server is not None:
            server.cleanup()
            shutil.rmtree(str(server.pgdata.parent), ignore_errors=True)


@pytest.fixture(scope="session")
def devset_texts() -> list[str]:
    """Every text of the devset; the test is skipped, saying why, where there is none."""
    files = sorted((DEVSET / "docs").glob("*.jsonl"))
    if not files:
        pytest.skip(f"no devset at {DEVSET} (set SIMDB_DEVSET to its folder)")
    return [json.loads(line)["text"] for path in files for line in path.open(encoding="utf-8")]


def use_python_twins(monkeypatch: pytest.MonkeyPatch) -> None:
    """Within a test, what ``SIMDB_NATIVE=off`` chooses at import: every function :mod:`simdb.native` chose set
    to its Python twin (``tests/test_native_choice.py`` holds this list to what a process with
    ``SIMDB_NATIVE=off`` imports)."""
    from simdb import native
    from simdb.methods.minhash import signature
    from simdb.methods.simhash import fingerprint

    for name, twin in native.PYTHON_TWINS.items():
        monkeypatch.setattr(native, name, twin)
    monkeypatch.setattr(fingerprint, "_sums_of_ids", fingerprint._simhashes_of_ids)
    monkeypatch.setattr(fingerprint, "_batch_simhashes", fingerprint._simhashes_in_numpy)
    monkeypatch.setattr(signature, "_minhashes", signature._signatures_in_numpy)
    monkeypatch.setattr(signature, "_band_keys", signature._band_keys_in_python)


@pytest.fixture
def python_twins(monkeypatch) -> None:
    """Every compiled path off for the test: the Python twins alone."""
    use_python_twins(monkeypatch)


@pytest.fixture
def plpython(admin_engine) -> None:
    """Skips the test, saying why, where the test server cannot run simdb's Python (``simdb sql-functions``)."""
    with admin_engine.connect() as connection:
        if not connection.execute(sa.text("SELECT 1 FROM pg_available_extensions WHERE name = 'plpython3u'")).first():
            pytest.skip("PL/Python is not installed on the test server (Debian: apt-get install "
                        "postgresql-plpython3-<major>, which scripts/test does as root; the embedded server has none)")
        if not connection.execute(sa.text("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")).scalar():
            pytest.skip("the test role is no superuser: only a superuser may write PL/Python functions")


# -- Citus: the core correctness tests run on a local cluster too -------------------------------------------

#: ../shared/citus beside the checkout (or SIMDB_CITUS): install.sh and cluster.sh (see its README).
CITUS_TOOLS = pathlib.Path(os.environ.get("SIMDB_CITUS", pathlib.Path(__file__).parents[2] / "shared" / "citus"))
#: Shards per distributed table in the tests: a few, so that every segment's DDL stays quick.
CITUS_SHARDS = 4
#: The distributed layout the ``citus`` backend gives the SimHash indexes it makes: keyed, simdb's default
#: (SIMDB_TEST_CITUS_LAYOUT=id runs the citus-marked suite on the layout by id); MinHash indexes keep the layout by
#: id, the only one they have. The tests also marked ``citus_by_id`` run a third time, on the layout by id
#: (backend ``citus-id``), which existing indexes still have.
CITUS_LAYOUT = os.environ.get("SIMDB_TEST_CITUS_LAYOUT", "keyed")
#: What the running test's ``citus`` backend gives (read by init_options, also in subprocesses' tests).
LAYOUT_NOW_ENV = "SIMDB_TEST_CITUS_LAYOUT_NOW"


def citus_missing() -> str | None:
    """Why no Citus cluster can be started here (Citus not installed, no cluster.sh), or None."""
    import subprocess

    library = subprocess.run(["pg_config", "--pkglibdir"], capture_output=True, text=True).stdout.strip() \
        if shutil.which("pg_config") else ""
    candidates = [pathlib.Path(library)] if library else []
    candidates += sorted(pathlib.Path("/usr/lib/postgresql").glob("*/lib"))
    if not any((folder / "citus.so").exists() for folder in candidates):
        return (f"Citus is not installed on this machine (install it as root with {CITUS_TOOLS}/install.sh, "
                "as scripts/test does, or set SIMDB_TEST_CITUS_URL)")
    if not (CITUS_TOOLS / "cluster.sh").exists():
        return f"no {CITUS_TOOLS}/cluster.sh to start a Citus cluster with (set SIMDB_CITUS to its folder)"
    return None


#: Settings of the test cluster's servers, for its tables of a few hundred rows: a repartition join (Citus's plan
#: for the views that join documents on other columns than their distribution column) in one bucket per worker
#: instead of 4, the same plan in a fifth of the time (simdb_neighbours on an exact MinHash index: 3.2 s -> 0.5-0.9
#: s a call, 340 s -> about 70 s for the test that calls it for every document).
CITUS_TEST_SETTINGS = {"citus.repartition_join_bucket_count_per_node": "1"}
#: The folder of this run's cluster (SIMDB_TEST_CITUS_DIR): made by the process that runs the session (pytest-xdist's
#: controller, or pytest itself without workers) and shared by its workers, which start one cluster there between
#: them (the first to need it, or the controller once it knows a collected test does) and read its URL from it.
CITUS_DIR_ENV = "SIMDB_TEST_CITUS_DIR"


@functools.cache
def _citus() -> tuple[str | None, str]:
    """(coordinator URL, None and why there is none), decided once per test session: SIMDB_TEST_CITUS_URL, else
    a coordinator and 2 workers started by ``cluster.sh`` when Citus is installed, one for the whole run."""
    if os.environ.get("SIMDB_TEST_CITUS_URL"):
        return os.environ["SIMDB_TEST_CITUS_URL"], "SIMDB_TEST_CITUS_URL"
    missing = citus_missing()
    if missing:
        return None, missing
    directory = os.environ.get(CITUS_DIR_ENV) or _make_citus_dir()
    url = start_shared_cluster(directory)
    # for every later caller, this module imported again by a test module (`from tests.conftest import ...`)
    # included
    os.environ["SIMDB_TEST_CITUS_URL"] = url
    return url, f"a coordinator and 2 workers in {directory}"


def _make_citus_dir() -> str:
    os.environ[CITUS_DIR_ENV] = tempfile.mkdtemp(prefix="simdb-test-citus-")
    return os.environ[CITUS_DIR_ENV]


#: How many times a run tries to start its cluster on the next free ports, where another run took one of them
#: between the check and the start.
CITUS_START_TRIES = 5


def start_shared_cluster(directory: str, workers: int = 2) -> str:
    """The URL of the cluster in ``directory`` (a coordinator and ``workers`` workers), started there by the first
    process of the run that asks (the others wait for it on a lock): every test on Citus uses one cluster, on
    whichever worker it runs. A start that failed is raised again to every process that asks. Where a port that was
    free is taken by the time a server starts on it (another run's cluster, started side by side), the cluster
    starts again on the next free ports."""
    import fcntl
    import subprocess

    nodes = workers + 1
    folder = pathlib.Path(directory)
    with open(folder / "start.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (folder / "failed").exists():
            raise RuntimeError((folder / "failed").read_text())
        if not (folder / "url").exists():
            port, started = 9800 - 10, None
            for _ in range(CITUS_START_TRIES):
                port = free_port(nodes, start=port + 10)
                started = subprocess.run(["bash", str(CITUS_TOOLS / "cluster.sh"), "start", directory, str(workers),
                                          str(port)], capture_output=True, text=True)
                if started.returncode == 0 or not _port_taken_meanwhile(folder):
                    break
                # another run's cluster took a port between free_port and the start (two runs side by side):
                # what started of this one is stopped and made again on the next free ports
                subprocess.run(["bash", str(CITUS_TOOLS / "cluster.sh"), "stop", directory], capture_output=True)
                for node in folder.glob("node*"):
                    shutil.rmtree(node, ignore_errors=True)
            if started.returncode != 0:
                (folder / "failed").write_text(f"could not start a Citus cluster in {directory}: "
                                               f"{started.stderr.strip()}")
                raise RuntimeError((folder / "failed").read_text())
            for node in range(port, port + nodes):
                with psycopg.connect(f"postgresql://postgres@127.0.0.1:{node}/postgres", autocommit=True) as server:
                    for name, value in CITUS_TEST_SETTINGS.items():
                        server.execute(f"ALTER SYSTEM SET {name} = '{value}'")
                    server.execute("SELECT pg_reload_conf()")
            (folder / "url").write_text(started.stdout.strip().splitlines()[-1])
        return (folder / "url").read_text()


def _port_taken_meanwhile(folder: pathlib.Path) -> bool:
    """Whether a server of the cluster in ``folder`` failed to start because its port was taken."""
    return any("could not bind" in log.read_text(errors="replace") and "Address already in use" in
               log.read_text(errors="replace") for log in folder.glob("node*/log"))


def free_port(count: int, start: int = 9850) -> int:
    """The first of ``count`` consecutive loopback ports nothing listens on (a cluster's coordinator and workers)."""
    import socket

    def taken(port: int) -> bool:
        with socket.socket() as probe:
            return probe.connect_ex(("127.0.0.1", port)) == 0

    port = start
    while any(taken(p) for p in range(port, port + count)):
        port += 10
    return port


def _stop_citus(directory: str) -> None:
    """Stop the run's cluster (where one was started) and remove its folder."""
    import subprocess

    if (pathlib.Path(directory) / "url").exists():
        subprocess.run(["bash", str(CITUS_TOOLS / "cluster.sh"), "stop", directory], capture_output=True)
    shutil.rmtree(directory, ignore_errors=True)


def pytest_generate_tests(metafunc):
    """A test marked ``citus`` runs twice: on the test database, and on a distributed index on Citus (SimHash
    indexes with the layout CITUS_LAYOUT); marked ``citus_by_id`` too, a third time, on the layout by id. Marked
    ``slow_on_citus`` too, its runs on Citus are ``slow``: the whole suite (CI) runs them, ``-m "not slow"`` its
    run on the test database only."""
    definition = metafunc.definition
    if definition.get_closest_marker("citus"):
        by_id = definition.get_closest_marker("citus_by_id") and CITUS_LAYOUT != "id"
        marks = [pytest.mark.slow] if definition.get_closest_marker("slow_on_citus") else []
        metafunc.parametrize("backend", ["postgres", *(pytest.param(name, marks=marks) for name in
                                                       ["citus", *(["citus-id"] if by_id else [])])], indirect=True)


@pytest.fixture
def backend(request, monkeypatch) -> str:
    """"postgres", or "citus": then the test's database is a Citus coordinator, and every index it creates
    (Index.create, ``simdb init``) is distributed unless the test says otherwise, a SimHash index with the layout
    CITUS_LAYOUT; the parameter "citus-id" is "citus" with the layout by id."""
    name = getattr(request, "param", "postgres")
    if name in ("citus", "citus-id"):
        url, why = _citus()
        if url is None:
            pytest.skip(why)
        layout = "id" if name == "citus-id" else CITUS_LAYOUT
        monkeypatch.setenv(LAYOUT_NOW_ENV, layout)
        create = Index.create.__func__

        def distributed_create(cls, *args, **kwargs):
            kwargs.setdefault("distributed", True)
            if kwargs["distributed"]:
                kwargs.setdefault("shards", CITUS_SHARDS)
                if kwargs.get("method", "simhash") == "simhash":
                    kwargs.setdefault("distributed_layout", layout)
            return create(cls, *args, **kwargs)

        monkeypatch.setattr(Index, "create", classmethod(distributed_create))
        return "citus"
    return name


def init_options(database_url: str, method: str = "simhash") -> list[str]:
    """What ``simdb init`` in a subprocess needs to create the index the test's backend wants."""
    citus_url = os.environ.get("SIMDB_TEST_CITUS_URL")
    if not citus_url or database_url != citus_url:
        return []
    layout = os.environ.get(LAYOUT_NOW_ENV, CITUS_LAYOUT)
    return ["--distributed", "--shards", str(CITUS_SHARDS), "--distributed-layout", layout if method == "simhash" else "id"]


@pytest.fixture(scope="session")
def server_url() -> str:
    """The test database, for fixtures shared by a module's tests (which do not run on Citus)."""
    return _database()[0]


@pytest.fixture(scope="session")
def server_engine(server_url) -> sa.Engine:
    """An engine on the test database, for Hypothesis tests (whose fixtures must outlive their examples)."""
    if server_url not in _ENGINES:
        _ENGINES[server_url] = sa.create_engine(postgres_url(server_url))
    return _ENGINES[server_url]


@pytest.fixture
def database_url(backend) -> str:
    return _citus()[0] if backend == "citus" else _database()[0]


_ENGINES: dict[str, sa.Engine] = {}


@pytest.fixture
def admin_engine(database_url):
    if database_url not in _ENGINES:  # on Citus, with the settings a distributed index's own connections have
        options = {"options": " ".join(f"-c {name}={value}" for name, value in citus.SESSION_SETTINGS.items())} \
            if database_url == os.environ.get("SIMDB_TEST_CITUS_URL") else {}
        _ENGINES[database_url] = sa.create_engine(postgres_url(database_url), connect_args=options)
    return _ENGINES[database_url]


@pytest.fixture
def schema(admin_engine, backend):
    """A fresh schema name for one test; the schema (if created) is dropped afterwards. On Citus, an index the
    test made there must have been distributed (else the test ran on a plain index on the coordinator)."""
    name = f"simdb_test_{uuid.uuid4().hex[:12]}"
    yield name
    with admin_engine.begin() as connection:
        if backend == "citus" and connection.execute(sa.text("SELECT to_regclass(:t)"), {"t": f"{name}.settings"}
                                                     ).scalar() is not None:
            assert _distributed(admin_engine, name), f"the test made a plain index in {name} on the Citus coordinator"
        connection.exec_driver_sql(f"DROP SCHEMA IF EXISTS {name} CASCADE")


@pytest.fixture
def index(database_url, schema):
    with Index.create(database_url, schema=schema) as created:
        yield created


@pytest.fixture
def run(database_url, schema):
    """Run the CLI against the test schema: ``run("ingest", path)`` -> click Result."""
    runner = CliRunner()
    env = {"SIMDB_DATABASE_URL": database_url, "SIMDB_SCHEMA": schema}

    def invoke(*args, input=None):
        return runner.invoke(cli, list(args), env=env, input=input, catch_exceptions=False)

    return invoke


@pytest.fixture
def corpus_archive(run, tmp_path, schema):
    """The quickstart corpus ingested through the CLI as batches 'archive' (250) and 'new' (the rest), counted by
    its metadata field ``source`` (``field_counts``, which the docs' recipe reads)."""
    import json

    from simdb.samples import corpus

    records = list(corpus())
    run("init", "--count-by", "source")
    for name, part in (("archive", records[:250]), ("new", records[250:])):
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in part))
        assert run("ingest", str(path), "--batch", name).exit_code == 0
    return schema


def _distributed(engine: sa.Engine, schema: str) -> bool:
    with engine.connect() as connection:
        return _has_citus(connection) and connection.execute(sa.text(
            "SELECT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = to_regclass(:t))"),
            {"t": f"{schema}.documents"}).scalar_one()


def _has_citus(connection) -> bool:
    return connection.execute(sa.text("SELECT count(*) FROM pg_extension WHERE extname = 'citus'")).scalar_one() > 0


def migrated_index(database_url: str, schema: str, settings: IndexSettings) -> None:
    """An index with ``settings`` made by every migration from 0001 to head, as simdb made new indexes before it
    created them at the head revision directly (and as it still upgrades old ones); distributed afterwards
    where ``settings`` say, as it was then."""
    database = Database.connect(database_url, schema=schema)
    try:
        with database.engine.begin() as connection:
            connection.exec_driver_sql(f"CREATE SCHEMA {schema}")
            migrate.upgrade(connection, schema, layout=settings.layout, new_index_settings=settings.to_rows(),
                            new_index_idf_terms=settings.method.side_tables().get("idf_terms"))
            if settings.distributed is not None:
                drop_functions_and_views(connection, schema)
                citus.distribute(connection, schema, settings.distributed["shards"])
                keyed_layout = keyed.layout_of(settings.distributed) == keyed.KEYED
                if keyed_layout:  # its keys tables, as simdb makes them
                    keyed.create(connection, schema, settings.distributed["shards"], settings.method)
                create_functions(connection, schema, settings.method, distributed=True, keyed=keyed_layout)
                create_views(connection, schema, settings.method, distributed=True)
    finally:
        database.close()


def catalog(connection: sa.Connection, schema: str) -> dict[str, list[tuple]]:
    """What PostgreSQL (and Citus, where it is there) holds of the index in ``schema``: its relations, columns and
    their types, defaults and storage, constraints, indexes, sequences and what owns them, functions' and views'
    definitions, comments, grants, triggers and types; the rows of its settings, side tables and version table;
    how its tables are distributed. Definitions are printed schema-qualified and the schema's name is
    replaced by ``S``, so that two indexes compare."""
    connection.exec_driver_sql("SET LOCAL search_path TO pg_catalog")  # every name printed qualified
    citus = connection.exec_driver_sql("SELECT to_regclass('pg_dist_partition')").scalar() is not None
    shards = [str(shard) for shard in connection.execute(sa.text(  # a shard's id is in its tables' names
        "SELECT s.shardid FROM pg_dist_shard s JOIN pg_class c ON c.oid = s.logicalrelid JOIN pg_namespace n "
        "ON n.oid = c.relnamespace WHERE n.nspname = :s"), {"s": schema}).scalars()] if citus else []

    def rows(statement: str) -> list[tuple]:
        def named(value) -> str:
            value = str(value).replace(schema, "S")
            for shard in shards:
                value = value.replace(f"_{shard}", "_<shard>")
            return value
        return sorted(tuple(named(value) for value in row)
                      for row in connection.execute(sa.text(statement), {"s": schema}).all())

    in_schema = "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = :s"
    found = {
        "schema": rows("SELECT nspacl, obj_description(oid, 'pg_namespace') FROM pg_namespace WHERE nspname = :s"),
        "relations": rows("SELECT c.relname, c.relkind, c.relpersistence, c.relispartition, pg_get_partkeydef(c.oid), "
                          "c.reloptions, c.relacl, obj_description(c.oid, 'pg_class'), c.relreplident, "
                          f"c.relrowsecurity, c.relhasindex, c.relnatts FROM pg_class c {in_schema} ORDER BY 1"),
        "columns": rows("SELECT c.relname, a.attnum, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull, "
                        "pg_get_expr(d.adbin, d.adrelid), a.attidentity, a.attgenerated, a.attcompression, "
                        "a.attstorage, a.attcollation, col_description(c.oid, a.attnum), a.attacl, a.attisdropped "
                        "FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid LEFT JOIN pg_attrdef d "
                        f"ON d.adrelid = a.attrelid AND d.adnum = a.attnum {in_schema} AND a.attnum > 0 ORDER BY 1, 2"),
        "constraints": rows("SELECT c.relname, k.conname, k.contype, pg_get_constraintdef(k.oid), k.condeferrable, "
                            "k.condeferred, k.convalidated, k.conislocal, k.coninhcount FROM pg_constraint k "
                            f"JOIN pg_class c ON c.oid = k.conrelid {in_schema} ORDER BY 1, 2"),
        "indexes": rows("SELECT c.relname, i.relname, pg_get_indexdef(i.oid), x.indisunique, x.indisprimary, "
                        "x.indisvalid, x.indisready FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid "
                        f"JOIN pg_class c ON c.oid = x.indrelid {in_schema} ORDER BY 1, 2"),
        "sequences": rows("SELECT c.relname, format_type(s.seqtypid, NULL), s.seqstart, s.seqincrement, s.seqmax, "
                          "s.seqmin, s.seqcache, s.seqcycle, t.relname, a.attname, d.deptype FROM pg_sequence s "
                          "JOIN pg_class c ON c.oid = s.seqrelid LEFT JOIN pg_depend d ON d.objid = c.oid "
                          "AND d.classid = 'pg_class'::regclass AND d.refclassid = 'pg_class'::regclass "
                          "AND d.deptype IN ('a', 'i') LEFT JOIN pg_class t ON t.oid = d.refobjid LEFT JOIN "
                          "pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid "
                          f"{in_schema} ORDER BY 1"),
        "functions": rows("SELECT p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ')', "
                          "pg_get_functiondef(p.oid), obj_description(p.oid, 'pg_proc'), p.proacl FROM pg_proc p "
                          "JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = :s ORDER BY 1"),
        "views": rows(f"SELECT c.relname, pg_get_viewdef(c.oid) FROM pg_class c {in_schema} AND c.relkind = 'v' "
                      "ORDER BY 1"),
        "triggers": rows("SELECT c.relname, t.tgname, pg_get_triggerdef(t.oid) FROM pg_trigger t "
                         f"JOIN pg_class c ON c.oid = t.tgrelid {in_schema} AND NOT t.tgisinternal ORDER BY 1, 2"),
        "types": rows("SELECT t.typname, t.typtype FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace "
                      "WHERE n.nspname = :s ORDER BY 1"),
        **{table: rows(f"SELECT * FROM {schema}.{table} ORDER BY 1") for table in
           ("settings", "idf_terms", "alembic_version")},
    }
    if citus:
        # each table's distribution, shards and the first table it is co-located with; not for reference tables
        # (a copy on every node, whatever its group): on the cluster the tests share, one was seen in a group of its
        # own while other tests made and dropped their schemas, a difference of no consequence
        found["distribution"] = rows(
            "SELECT c.relname, p.partmethod, column_to_column_name(p.logicalrelid, p.partkey), p.repmodel, "
            "(SELECT count(*) FROM pg_dist_shard s WHERE s.logicalrelid = p.logicalrelid), "
            "CASE WHEN p.partmethod <> 'n' THEN (SELECT min(o.relname) FROM pg_dist_partition q "
            " JOIN pg_class o ON o.oid = q.logicalrelid "
            " WHERE q.colocationid = p.colocationid AND o.relnamespace = c.relnamespace) END "
            f"FROM pg_dist_partition p JOIN pg_class c ON c.oid = p.logicalrelid {in_schema} ORDER BY 1")
    return found


@pytest.fixture
def fresh_index(database_url, admin_engine, schema):
    """For Hypothesis tests, whose examples share the test's fixtures: ``fresh_index(**settings)`` opens an index
    in ``schema`` that is as if just created with ``settings``. The first call creates it; later ones empty it
    (:func:`empty_index`) instead of creating another, which takes seconds on Citus."""
    created: dict = {}

    def fresh(**settings) -> Index:
        if not created:
            Index.create(database_url, schema=schema, **settings).close()
            with admin_engine.connect() as connection:
                created.update(settings=settings, rows=connection.execute(sa.text(
                    f"SELECT name, CAST(value AS text) FROM {schema}.settings")).all())
        else:
            assert settings == created["settings"], "one test, one kind of index"
            empty_index(admin_engine, schema, created["rows"])
        return Index.open(database_url, schema=schema)

    return fresh


class ReadOnlyArchives:
    """Archives that a module's tests only read (:func:`read_only_archives`): each built once per database and
    kind, in a schema of its own, by the first test that asks; a test that writes to one fails."""

    def __init__(self) -> None:
        self.built: dict = {}
        self.stack = contextlib.ExitStack()

    @contextlib.contextmanager
    def use(self, key, engine: sa.Engine, backend: str, build):
        """``build(schema, stack)`` makes the archive (entering what must be closed into ``stack``) where ``key``
        has none yet; yields it, then checks that its rows are as they were."""
        if key not in self.built:
            schema = f"simdb_test_{uuid.uuid4().hex[:12]}"
            self.stack.callback(_drop_schema, engine, schema)
            self.built[key] = (schema, build(schema, self.stack))
            if backend == "citus":
                assert _distributed(engine, schema), f"the archive in {schema} is not distributed"
        schema, archive = self.built[key]
        before = _rows_of(engine, schema)
        yield archive
        assert _rows_of(engine, schema) == before, "a test wrote to an archive shared by the module's tests"


def _rows_of(engine: sa.Engine, schema: str) -> list:
    with engine.connect() as connection:
        return [connection.exec_driver_sql(f"SELECT count(*), md5(string_agg(CAST(t AS text), ',' ORDER BY "
                                           f"CAST(t AS text))) FROM {schema}.{table} t").one()
                for table in ("settings", *GATHERING_TABLES)]


def _drop_schema(engine: sa.Engine, schema: str) -> None:
    with engine.begin() as connection:
        connection.exec_driver_sql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


@pytest.fixture(scope="module")
def read_only_archives():
    """Archives shared by a module's tests that only read them, dropped when the module is done (see
    :class:`ReadOnlyArchives`)."""
    archives = ReadOnlyArchives()
    with archives.stack:
        yield archives


#: The tables whose rows an index gathers (settings, idf_terms and alembic_version hold what it was created with).
GATHERING_TABLES = ("batches", "documents", "near_duplicates", "clusters", "records", "field_counts")


def empty_index(engine: sa.Engine, schema: str, settings_rows) -> None:
    """Make the index in ``schema`` as it was created (tests/test_clusters.py checks that it is): no segments, no
    rows, ids from 1 again, the settings rows it was created with. Not after a relayout, which changes its
    columns (opening it would then fail on the key columns its settings name)."""
    with engine.begin() as connection:
        for segment in connection.execute(sa.text(
                "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                "WHERE i.inhparent = CAST(:t AS regclass)"), {"t": f"{schema}.documents"}).scalars().all():
            connection.exec_driver_sql(f'DROP TABLE {schema}."{segment}"')
        if _distributed(engine, schema):
            keys = keys_table(connection, schema)  # the keyed layout's keys and external ids too
            tables = [*GATHERING_TABLES, *((keys, "external_ids") if keys is not None else ())]
            connection.exec_driver_sql(f"TRUNCATE {', '.join(f'{schema}.{t}' for t in tables)} RESTART IDENTITY")
        else:  # what TRUNCATE ... RESTART IDENTITY leaves, in a 20th of its time (0.02 s, not 0.4: no new files)
            delete_rows(connection, schema)
            connection.execute(sa.text(
                "SELECT setval(d.objid, 1, false) FROM pg_depend d JOIN pg_class t ON t.oid = d.refobjid "
                "JOIN pg_namespace n ON n.oid = t.relnamespace WHERE d.classid = 'pg_class'::regclass "
                "AND d.refclassid = 'pg_class'::regclass AND d.deptype IN ('a', 'i') AND n.nspname = :s "
                "AND t.relname = ANY(:tables) AND (SELECT relkind FROM pg_class WHERE oid = d.objid) = 'S'"),
                {"s": schema, "tables": list(GATHERING_TABLES)})
        connection.exec_driver_sql(f"DELETE FROM {schema}.settings")
        connection.execute(sa.text(f"INSERT INTO {schema}.settings (name, value) "
                                   "VALUES (:name, CAST(:value AS jsonb))"),
                           [{"name": name, "value": value} for name, value in settings_rows])


def delete_rows(connection: sa.Connection, schema: str) -> None:
    """Every row of the tables an index gathers, by DELETE: a TRUNCATE of an index's tables, which makes new
    files for every table and index, took 0.4 s where these take 0.02 s (half of a fuzz example's time)."""
    for table in reversed(GATHERING_TABLES):  # batches last: the others refer to it
        connection.exec_driver_sql(f"DELETE FROM {schema}.{table}")


#: The tables a brute-force check reads, with their primary keys.
ORACLE_TABLES = {"settings": "name", "batches": "id", "documents": "id", "near_duplicates": "a_id, b_id",
                 "clusters": "cluster_id", "records": "batch_id, position"}


def on_a_local_copy(check):
    """A brute-force check of a distributed index runs on a copy of its tables, as they are, in a local schema
    of the coordinator: the oracle's joins (a document with its duplicate's row, say) are ones Citus does not
    run on tables distributed by other columns, and the copy holds exactly what the index stores."""
    @functools.wraps(check)
    def checked(engine: sa.Engine, schema: str, *args, **kwargs):
        if not _distributed(engine, schema):
            return check(engine, schema, *args, **kwargs)
        copy = f"{schema}_oracle"
        with engine.begin() as connection:
            connection.exec_driver_sql(f"DROP SCHEMA IF EXISTS {copy} CASCADE")
            connection.exec_driver_sql(f"CREATE SCHEMA {copy}")
            for table, key in ORACLE_TABLES.items():
                connection.exec_driver_sql(f"CREATE TABLE {copy}.{table} AS SELECT * FROM {schema}.{table}")
                connection.exec_driver_sql(f"ALTER TABLE {copy}.{table} ADD PRIMARY KEY ({key})")
        try:
            return check(engine, copy, *args, **kwargs)
        finally:
            with engine.begin() as connection:
                connection.exec_driver_sql(f"DROP SCHEMA {copy} CASCADE")
    return checked


def count_rows(engine: sa.Engine, schema: str) -> tuple[int, int]:
    """(documents, batches) stored in an index schema."""
    with engine.connect() as connection:
        documents = connection.execute(sa.text(f"SELECT count(*) FROM {schema}.documents")).scalar_one()
        batches = connection.execute(sa.text(f"SELECT count(*) FROM {schema}.batches")).scalar_one()
    return documents, batches


def stored_max_distance(engine: sa.Engine, schema: str) -> int:
    """The k a SimHash index was created with, read from its settings table."""
    with engine.connect() as connection:
        return int(connection.execute(sa.text(
            f"SELECT value FROM {schema}.settings WHERE name = 'max_distance'")).scalar_one())


def assert_consistent(engine: sa.Engine, schema: str, max_distance: int | None = None
                      ) -> list[tuple[str, str | None]]:
    """Brute-force check of what ingest and removal maintain; returns (external id, duplicate_of's) rows.

    Every document's duplicate_of is its earliest stored near-duplicate, the
    stored pairs are exactly the pairs within ``max_distance`` (by default the index's own), and every
    cluster_id is the smallest id of the document's connected component; on the keyed distributed layout,
    its ``keys`` table holds exactly the stored documents' keys (:func:`assert_keys_consistent`).
    """
    rows = _assert_consistent(engine, schema, max_distance)
    assert_keys_consistent(engine, schema)
    return rows


def keys_table(connection: sa.Connection, schema: str) -> str | None:
    """The keyed layout's keys table in ``schema`` (the one named ``keys_<n>``, :func:`simdb.pg.keyed.table`), or
    None where the index has none; two are an error (a relayout leaves one)."""
    tables = connection.execute(sa.text(
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = :s "
        "AND c.relkind = 'r' AND c.relname ~ '^keys_[0-9]+$'"), {"s": schema}).scalars().all()
    assert len(tables) <= 1, f"keys tables {tables} in {schema}"
    return tables[0] if tables else None


def assert_keys_consistent(engine: sa.Engine, schema: str) -> None:
    """Where the index has the keyed distributed layout: ``keys`` holds one row per stored document and key number,
    ``(folded key, id, fingerprint)`` computed from the document's fingerprint by the index's block layout, and
    nothing else (no row of a removed document, of an old layout, or twice); ``key_probes`` is empty."""
    from simdb.bits import to_unsigned
    from simdb.pg import catalog

    with engine.begin() as connection:
        keys = keys_table(connection, schema)
        if keys is None:
            return
        connection.exec_driver_sql(f"SET LOCAL search_path TO {schema}, public")
        method = catalog.load_settings(connection).method
        assert keys == keyed.table(method), f"the keys table is {keys}, not that of the index's layout"
        documents = [tuple(row) for row in connection.exec_driver_sql("SELECT id, simhash FROM documents")]
        stored = [tuple(row) for row in connection.exec_driver_sql(f"SELECT key, id, fingerprint FROM {keys}")]
        probes = connection.exec_driver_sql("SELECT count(*) FROM key_probes").scalar_one()
    folded = keyed.fold(method.keys([to_unsigned(fingerprint) for _, fingerprint in documents])).tolist() \
        if documents else []
    columns = len(method.key_columns)
    expected = [(key, *documents[i // columns]) for i, key in enumerate(folded)]
    assert len(stored) == len(expected) and set(stored) == set(expected), \
        f"keys: {len(stored)} rows, {len(set(stored) - set(expected))} not of a stored document's keys"
    assert probes == 0


@on_a_local_copy
def _assert_consistent(engine: sa.Engine, schema: str, max_distance: int | None = None
                       ) -> list[tuple[str, str | None]]:
    if max_distance is None:
        max_distance = stored_max_distance(engine, schema)
    from simdb.bits import to_unsigned
    from simdb.pg.clusters import UnionFind

    with engine.connect() as connection:
        rows = connection.execute(sa.text(
            f"SELECT d.id, d.external_id, d.simhash, o.external_id AS dup, d.duplicate_distance, d.cluster_id "
            f"FROM {schema}.documents d LEFT JOIN {schema}.documents o ON o.id = d.duplicate_of ORDER BY d.id")).all()
        stored_pairs = set(connection.execute(sa.text(
            f"SELECT a_id, b_id, distance FROM {schema}.near_duplicates")).all())
    earlier: list[tuple[int, str, int]] = []
    pairs = set()
    forest = UnionFind()
    for row in rows:
        fingerprint = to_unsigned(row.simhash)
        forest.find(row.id)
        matches = [(identifier, name, (fingerprint ^ fp).bit_count()) for identifier, name, fp in earlier
                   if (fingerprint ^ fp).bit_count() <= max_distance]
        expected = (matches[0][1], matches[0][2]) if matches else (None, None)
        assert (row.dup, row.duplicate_distance) == expected, row.external_id
        for identifier, _, distance in matches:
            pairs.add((identifier, row.id, distance))
            forest.union(identifier, row.id)
        earlier.append((row.id, row.external_id, fingerprint))
    assert stored_pairs == pairs
    assert {row.id: row.cluster_id for row in rows} == {row.id: forest.find(row.id) for row in rows}
    with engine.connect() as connection:  # the keyed layout's external ids follow the documents exactly
        if connection.execute(sa.text("SELECT to_regclass(:t)"), {"t": f"{schema}.external_ids"}).scalar():
            routed = connection.exec_driver_sql(f"SELECT external_id, id FROM {schema}.external_ids").all()
            assert sorted(map(tuple, routed)) == sorted((row.external_id, row.id) for row in rows)
            assert connection.exec_driver_sql(f"SELECT count(*) FROM {schema}.external_id_probes").scalar() == 0
    assert_records_consistent(engine, schema, max_distance)
    return [(row.external_id, row.dup) for row in rows]


@on_a_local_copy
def assert_records_consistent(engine: sa.Engine, schema: str, max_distance: int | None = None) -> None:
    """The per-record outcomes agree with the batches and documents (for batches that have them).

    Each batch's counts are its records' statuses; every stored document has one record, with its
    batch, id and duplicate_of (as at ingest, unless that document was removed since); positions run 1..position without a gap; a duplicate's
    duplicate_of, while both are stored, is a stored pair within the distance (by default the index's own).
    """
    if max_distance is None:
        max_distance = stored_max_distance(engine, schema)
    with engine.connect() as connection:
        batches = connection.execute(sa.text(
            f"SELECT b.id, b.position, b.documents, b.new, b.exact_duplicates, b.near_duplicates, b.already_stored, "
            f"b.rejected, count(r.*) AS records FROM {schema}.batches b LEFT JOIN {schema}.records r "
            f"ON r.batch_id = b.id GROUP BY b.id")).all()
        statuses = {(row.batch_id, row.status): row.n for row in connection.execute(sa.text(
            f"SELECT batch_id, status, count(*) AS n FROM {schema}.records GROUP BY 1, 2"))}
        positions = {row.batch_id: (row.low, row.high, row.n) for row in connection.execute(sa.text(
            f"SELECT batch_id, min(position) AS low, max(position) AS high, count(*) AS n FROM {schema}.records "
            "GROUP BY 1"))}
        unmatched = connection.execute(sa.text(
            f"SELECT count(*) FROM {schema}.documents d JOIN {schema}.batches b ON b.id = d.batch_id "
            f"WHERE EXISTS (SELECT 1 FROM {schema}.records x WHERE x.batch_id = b.id AND x.position = 1) "
            f"AND NOT EXISTS "
            f"(SELECT 1 FROM {schema}.records r WHERE r.document_id = d.id AND r.batch_id = d.batch_id "
            f"AND r.external_id = d.external_id AND r.status IN ('new', 'exact', 'near') "
            # duplicate_of as at ingest: it changes only when that document is removed (and it is re-pointed)
            f"AND (r.duplicate_of IS NOT DISTINCT FROM d.duplicate_of OR (r.duplicate_of IS NOT NULL AND NOT EXISTS "
            f"(SELECT 1 FROM {schema}.documents o WHERE o.id = r.duplicate_of))))")).scalar_one()
        misnamed = connection.execute(sa.text(  # a verdict names the document it duplicated, stored or not
            f"SELECT count(*) FROM {schema}.records r LEFT JOIN {schema}.documents o ON o.id = r.duplicate_of "
            "WHERE (r.duplicate_of IS NULL) <> (r.duplicate_of_external_id IS NULL) "
            "OR o.external_id <> r.duplicate_of_external_id")).scalar_one()
        far = connection.execute(sa.text(
            f"SELECT count(*) FROM {schema}.records r JOIN {schema}.documents a ON a.id = r.duplicate_of "
            f"JOIN {schema}.documents b ON b.id = r.document_id LEFT JOIN {schema}.near_duplicates p "
            f"ON p.a_id = a.id AND p.b_id = b.id WHERE p.a_id IS NULL OR p.distance > {max_distance}")).scalar_one()
    for batch in batches:
        if not batch.records:
            continue  # ingested before records were kept
        low, high, n = positions[batch.id]
        assert (high, high - low + 1) == (batch.position, n)  # no gap up to the batch's position
        if low > 1:
            continue  # begun before records were kept, resumed after: its counts include the earlier part
        count = lambda status: statuses.get((batch.id, status), 0)  # noqa: E731
        assert (count("new"), count("exact"), count("near"), count("already_stored"), count("rejected")) == \
            (batch.new, batch.exact_duplicates, batch.near_duplicates, batch.already_stored, batch.rejected)
    assert unmatched == 0
    assert misnamed == 0
    assert far == 0
    assert_clusters_table(engine, schema)


@on_a_local_copy
def assert_clusters_table(engine: sa.Engine, schema: str) -> None:
    """The maintained ``clusters`` table is what grouping every document by its cluster gives."""
    with engine.connect() as connection:
        kept, grouped = ({(row[0], row[1], row[2], row[3], tuple(sorted(row[4]))) for row in connection.execute(
            sa.text(statement)).all()} for statement in (
            f"SELECT cluster_id, size, first_seen, last_seen, batches FROM {schema}.clusters",
            f"SELECT d.cluster_id, count(*), min(d.created_at), max(d.created_at), array_agg(DISTINCT b.name) "
            f"FROM {schema}.documents d JOIN {schema}.batches b ON b.id = d.batch_id GROUP BY d.cluster_id "
            "HAVING count(*) > 1"))
    assert kept == grouped


@contextlib.contextmanager
def explained(engine: sa.Engine):
    """Collect the plan of every statement run through ``engine`` meanwhile, nested ones included (function
    bodies; the queries of COPY): auto_explain's log lines, sent to the client as notices. A list of
    ``"Query Text: ...\n<plan>"`` strings."""
    with notices(engine, ("LOAD 'auto_explain'", "SET auto_explain.log_min_duration = 0",
                          "SET auto_explain.log_nested_statements = on", "SET client_min_messages = log"),
                 lambda message: message.split("plan:\n", 1)[-1] if message.startswith("duration:") else None) as plans:
        yield plans


@contextlib.contextmanager
def notices(engine: sa.Engine, settings: Sequence[str], keep: Callable[[str], str | None]):
    """The notices sent to the client by the statements run through ``engine`` meanwhile, each connection of its
    pool made anew with the ``settings`` statements run first: a list of what ``keep`` returns for each notice's
    text (those it returns None for are left out)."""
    kept: list[str] = []

    def handler(diagnostic) -> None:
        if (text := keep(diagnostic.message_primary or "")) is not None:
            kept.append(text)

    def setup(dbapi_connection, record) -> None:  # each new connection of the pool
        dbapi_connection.add_notice_handler(handler)
        for statement in settings:
            dbapi_connection.execute(statement)
        dbapi_connection.commit()

    engine.dispose()
    sa.event.listen(engine, "connect", setup)
    try:
        yield kept
    finally:
        sa.event.remove(engine, "connect", setup)
        engine.dispose()  # its connections keep their settings: drop them


def killed(process, done: tuple[int, ...] = (0,)) -> None:
    """SIGKILL a test's subprocess (a ``subprocess.Popen``) and wait for it. It must have died of the kill, or
    ended before it with one of the ``done`` exit statuses: an error it met first is raised here, not lost."""
    import signal

    process.send_signal(signal.SIGKILL)
    _, err = process.communicate()
    if process.returncode != -signal.SIGKILL and process.returncode not in done:
        raise AssertionError(f"{process.args!r} failed before it was killed (exit {process.returncode}): {err}")


class Concurrently:
    """Functions run in threads beside the test, none of whose errors is lost.

    A thread's exception is printed and dropped by ``threading.Thread``; a test that goes on to check
    the database then checks what the writers that did not fail left. Here every function started is a
    future: ``results()`` waits for them all and re-raises the first error (leaving the block does the
    same), and ``outcomes()`` gives each one's result or exception for a test that expects some to fail.

        with Concurrently() as threads:
            threads.start(index.add_many, documents, batch="a")
            ...
    """

    def __init__(self, workers: int = 16) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self._pool = ThreadPoolExecutor(max_workers=workers)
        self._futures: list = []

    def start(self, function, *args, **kwargs):
        """Run ``function(*args, **kwargs)`` in a thread now; returns its future."""
        future = self._pool.submit(function, *args, **kwargs)
        self._futures.append(future)
        return future

    def results(self, timeout: float = 300) -> list:
        """What each function started since the last call returned, in the order they were started; the first
        error any of them raised is raised here, once all have ended."""
        outcomes = self.outcomes(timeout)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        return outcomes

    def outcomes(self, timeout: float = 300) -> list:
        """Each function's result, or the exception it raised, once all started since the last call have ended."""
        from concurrent.futures import wait

        futures, self._futures = self._futures, []
        done, running = wait(futures, timeout)
        if running:
            raise TimeoutError(f"{len(running)} of {len(futures)} threads still running after {timeout} s")
        return [future.exception() or future.result() for future in futures]

    def __enter__(self) -> "Concurrently":
        return self

    def __exit__(self, kind, error, traceback) -> None:
        try:
            if kind is None:
                self.results()
            else:
                self.outcomes()  # the test failed already: wait for the threads, and report its own error
        finally:
            self._pool.shutdown(wait=True)
