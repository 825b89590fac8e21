"""The test lanes themselves (README, "Develop"): which worker runs the tests on Citus, how many examples a
Hypothesis property runs in each lane."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import EXAMPLES_ENV, check_property, examples, examples_of_lane, on_citus

ROOT = Path(__file__).resolve().parents[1]
#: The pytest runs below load pytest-xdist and tests/scheduling.py alone: Hypothesis's plugin and tests/conftest.py's
#: imports cost each of their processes (controller and workers) about 0.7 s of CPU for nothing they check
XDIST_ALONE, XDIST_ALONE_ENV = ["-p", "xdist"], {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}


@pytest.mark.slow  # a pytest run of its own with three workers: about 2 s of CPU (10 s when they imported simdb)
@pytest.mark.parametrize("citus_workers", [None, "1"], ids=["default-2", "one"])
def test_the_tests_on_citus_go_to_their_few_workers(tmp_path, citus_workers):
    """scripts/test runs ``--dist loadgroup``: the tests on Citus go to SIMDB_TEST_CITUS_WORKERS workers (2 when
    unset), sharing the run's one cluster (xdist's own grouping, by a suffix it writes into the ids, groups nothing
    under pytest 9.2: they spread over every worker). The other tests go to every worker. Oracle: the worker each
    test reports, with 3 workers."""
    (tmp_path / "conftest.py").write_text("from tests.scheduling import pytest_xdist_make_scheduler  # noqa: F401\n")
    (tmp_path / "test_spread.py").write_text(
        "import os, time\nimport pytest\n\n"
        "@pytest.mark.parametrize('backend', ['postgres', 'citus'])\n"
        "@pytest.mark.parametrize('n', range(12))\n"
        "def test_x(n, backend):\n"
        "    time.sleep(0.05)\n"
        "    print('WORKER', os.environ['PYTEST_XDIST_WORKER'])\n")
    env = {name: value for name, value in os.environ.items() if name != "SIMDB_TEST_CITUS_WORKERS"}
    if citus_workers is not None:
        env["SIMDB_TEST_CITUS_WORKERS"] = citus_workers
    done = subprocess.run([sys.executable, "-m", "pytest", *XDIST_ALONE, "-n", "3", "--dist", "loadgroup", "-v", "-p",
                           "no:cacheprovider", "-s", "test_spread.py"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env={**env, **XDIST_ALONE_ENV, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ran = {}
    for line in done.stdout.splitlines():  # "[gw1] [ 12%] PASSED test_spread.py::test_x[3-citus]"
        if line.startswith("[gw") and "PASSED" in line:
            ran[line.split()[-1]] = line.split()[0]
    assert len(ran) == 24, done.stdout[-3000:]
    on_citus_workers = {worker for test, worker in ran.items() if on_citus(test)}
    assert 1 <= len(on_citus_workers) <= int(citus_workers or 2), ran
    assert len(set(ran.values())) == 3, ran  # the rest are shared out


@pytest.mark.slow  # a pytest run of its own with four workers, one of which dies
def test_a_worker_that_dies_running_a_test_on_citus_ends_the_run_without_a_hang(tmp_path):
    """xdist gives a dead worker's tests to the others, those it had run too: as one test each (a unit of
    loadgroup), a finished one went out as an empty list, which no worker answers, and once both workers of the
    tests on Citus had been sent one, the rest were never sent and the run waited for ever (found in review).
    Oracle: every test passes once, the one that killed its worker when run again, and the run ends."""
    (tmp_path / "conftest.py").write_text("from tests.scheduling import pytest_xdist_make_scheduler  # noqa: F401\n")
    (tmp_path / "test_crash.py").write_text(
        "import os, time\nimport pytest\n\n"
        "@pytest.mark.parametrize('backend', ['citus'])\n"
        "@pytest.mark.parametrize('n', range(30))\n"
        "def test_c(n, backend):\n"
        "    if n == 24 and not os.path.exists('crashed'):\n"
        "        open('crashed', 'w').close()\n"
        "        os._exit(1)\n"
        "    time.sleep(0.2)\n\n"
        "@pytest.mark.parametrize('n', range(6))\n"
        "def test_o(n):\n"
        "    time.sleep(0.2)\n")
    try:
        done = subprocess.run([sys.executable, "-m", "pytest", *XDIST_ALONE, "-n", "4", "--dist", "loadgroup", "-v",
                               "-p", "no:cacheprovider", "--max-worker-restart", "1", "test_crash.py"], cwd=tmp_path,
                              capture_output=True, text=True, timeout=240,
                              env={**os.environ, **XDIST_ALONE_ENV, "PYTHONPATH": str(ROOT)})
    except subprocess.TimeoutExpired as timeout:
        pytest.fail(f"the run did not end after a worker died: {str(timeout.stdout)[-2000:]}")
    passed = [line.split()[-1] for line in done.stdout.splitlines() if line.startswith("[gw") and "PASSED" in line]
    assert sorted(passed) == sorted({*passed}), done.stdout[-3000:]  # none twice
    # the test that killed its worker is reported failed, and run again by the others (as xdist does), now passing
    assert {*passed} == {f"test_crash.py::test_c[{n}-citus]" for n in range(30)} | {
        f"test_crash.py::test_o[{n}]" for n in range(6)}, done.stdout[-3000:]
    assert "worker 'gw" in done.stdout and "crashed while running 'test_crash.py::test_c[24-citus]'" in done.stdout


def test_a_test_slow_on_citus_is_slow_on_citus_only(tmp_path):
    """``slow_on_citus``: the test's runs on Citus (the layout by id's too) are ``slow``, which the whole suite (CI)
    runs and ``-m "not slow"`` leaves out; its run on PostgreSQL stays in the quick lane. Oracle: the ids collected,
    each with whether it is marked slow."""
    (tmp_path / "conftest.py").write_text(
        "from tests.conftest import pytest_generate_tests  # noqa: F401\nimport pytest\n\n"
        "@pytest.fixture\ndef backend(request):\n    return request.param\n\n"
        "def pytest_collection_finish(session):\n    for item in session.items:\n"
        "        print('ITEM', item.name, bool(item.get_closest_marker('slow')))\n")
    (tmp_path / "test_marks.py").write_text(
        "import pytest\n\n"
        "@pytest.mark.citus\ndef test_a(backend):\n    pass\n\n"
        "@pytest.mark.citus\n@pytest.mark.citus_by_id\n@pytest.mark.slow_on_citus\ndef test_b(backend):\n    pass\n")
    env = {name: value for name, value in os.environ.items() if name != "SIMDB_TEST_CITUS_LAYOUT"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider", "-q", "-s",
                           "--collect-only", "test_marks.py"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, env={**env, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    slow = dict(line.split()[1:] for line in done.stdout.splitlines() if line.startswith("ITEM "))
    assert slow == {"test_a[postgres]": "False", "test_a[citus]": "False", "test_b[postgres]": "False",
                    "test_b[citus]": "True", "test_b[citus-id]": "True"}, done.stdout


def test_a_test_is_on_citus_by_its_backend_parameter():
    assert on_citus("tests/test_sql.py::test_views_agree_with_the_tables[citus]")
    assert on_citus("tests/test_x.py::test_y[3-citus]") and on_citus("tests/test_x.py::test_y[citus-a]")
    assert on_citus("tests/test_index.py::test_pairs_equal_brute_force[citus-id]")  # the layout by id's run
    assert not on_citus("tests/test_sql.py::test_views_agree_with_the_tables[postgres]")
    assert not on_citus("tests/test_scripts.py::test_the_benchmark_runs_and_prints_its_table[bench_citus.py]")
    assert not on_citus("tests/test_citus.py::test_no_parameter")


def test_the_quick_lane_runs_a_tenth_of_the_examples_and_the_full_lane_all(monkeypatch):
    monkeypatch.setenv(EXAMPLES_ENV, "full")
    assert [examples(n) for n in (5, 12, 300, 3000)] == [5, 12, 300, 3000]
    monkeypatch.setenv(EXAMPLES_ENV, "quick")
    assert [examples(n) for n in (5, 12, 300, 3000)] == [5, 10, 30, 300]
    monkeypatch.setenv(EXAMPLES_ENV, "most")
    with pytest.raises(pytest.UsageError, match="SIMDB_TEST_EXAMPLES='most': use one of full, quick"):
        examples(10)


@pytest.mark.parametrize("lane, backend, count, drawn", [("full", "postgres", 40, 40), ("full", "citus", 40, 10),
                                                          ("full", "citus", 25, 10), ("full", "citus", 12, 10),
                                                          ("full", "citus", 5, 5), ("quick", "postgres", 40, 10),
                                                          ("quick", "citus", 40, 10)])
def test_a_property_draws_a_quarter_of_its_examples_on_citus(monkeypatch, lane, backend, count, drawn):
    """check_property: the lane's examples on the test database, a quarter of them (at least 10, at most all) on
    Citus; the fixtures given reach every example, and an example that fails fails the test."""
    from hypothesis import strategies as st

    monkeypatch.setenv(EXAMPLES_ENV, lane)
    seen: list[tuple[str, int]] = []
    check_property(backend, count, lambda fixture, number: seen.append((fixture, number)), "fixture",
                   number=st.integers())
    assert len(seen) == drawn and {fixture for fixture, _ in seen} == {"fixture"}

    def fails(number):
        assert number < 1000

    with pytest.raises(AssertionError):
        check_property(backend, count, fails, number=st.integers())


@pytest.mark.parametrize("selection, lane", [("", "full"), ("slow", "full"), ("citus", "full"),
                                             ("not slow", "quick"), ("unit", "quick"), ("unit and not slow", "quick"),
                                             ("not  slow and not citus", "quick"), ("not unit", "full")])
def test_the_lane_chooses_the_examples(selection, lane):
    """``-m "not slow"`` and ``-m unit`` (the lanes a developer runs) take the quick share, the whole suite (CI)
    the full one."""
    assert examples_of_lane(selection) == lane


@pytest.mark.parametrize("backend", ["citus"], indirect=True)  # skipped, saying why, without Citus
def test_a_cluster_starts_on_the_next_free_ports_where_another_run_took_its_port_meanwhile(backend, monkeypatch):
    """Two runs side by side (helpers' lanes, CI beside a developer's run) may both find the same ports free and
    start their clusters there: the one whose server could not bind failed every test on Citus. Here the first
    ports chosen are taken by a listener before the cluster starts; the cluster starts on others and answers."""
    import shutil
    import socket
    import tempfile

    import psycopg

    from tests import conftest

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    chosen = []
    free_port = conftest.free_port

    def raced(count: int, start: int = 9850) -> int:  # the first check finds the port free, as a run's did
        chosen.append(port if not chosen else free_port(count, start))
        return chosen[-1]

    monkeypatch.setattr(conftest, "free_port", raced)
    directory = tempfile.mkdtemp(prefix="simdb-test-citus-")
    try:
        url = conftest.start_shared_cluster(directory, workers=0)
        assert chosen[0] == port and len(chosen) == 2 and url.endswith(f":{chosen[1]}/postgres"), (chosen, url)
        with psycopg.connect(url) as connection:
            assert connection.execute("SELECT extname FROM pg_extension WHERE extname = 'citus'").fetchone()
    finally:
        conftest._stop_citus(directory)
        shutil.rmtree(directory, ignore_errors=True)
        taken.close()
