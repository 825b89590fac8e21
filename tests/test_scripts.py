"""Every benchmark in scripts/ runs, on tiny inputs, and prints its table.

The docs give each table with the command that produced it; a script that no longer runs makes those
commands lie (bench_core and bench_ingest's fingerprinting had stopped running after internal renames,
and nothing noticed). These runs time nothing worth reading and assert nothing about timings.
"""

from __future__ import annotations

import json
import re
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.conftest import CITUS_TOOLS, DEVSET, citus_missing, free_port

ROOT = Path(__file__).resolve().parents[1]

#: Documents per category of the devset the benchmarks run on (small_devset): 1,100-2,700 in the real one made
#: the devset's benchmarks a third of the whole suite's time
SMALL_DEVSET_DOCUMENTS = 120


@pytest.fixture(scope="module")
def small_devset(tmp_path_factory) -> Path:
    """The devset cut down for the benchmarks' runs (which read it wherever it is, bench_ingest's real text
    included): per category, the documents of its first labelled pairs (about SMALL_DEVSET_DOCUMENTS), with
    every labelled pair between them, their rows of docs_meta.jsonl, and the devset's own score.py; every
    category, kind of pair and file the benchmarks read is there. DEVSET itself where there is none."""
    if not (DEVSET / "docs").is_dir():
        return DEVSET
    small = tmp_path_factory.mktemp("devset")
    (small / "docs").mkdir()
    pairs = [json.loads(line) for line in (DEVSET / "pairs.jsonl").open(encoding="utf-8")]
    kept: set[str] = set()
    for path in sorted((DEVSET / "docs").glob("*.jsonl")):
        chosen: set[str] = set()
        for pair in pairs:
            if pair["category"] == path.stem and len(chosen) < SMALL_DEVSET_DOCUMENTS:
                chosen |= {pair["a"], pair["b"]}
        with path.open(encoding="utf-8") as lines:
            (small / "docs" / path.name).write_text("".join(line for line in lines
                                                            if json.loads(line)["id"] in chosen), encoding="utf-8")
        kept |= chosen
    (small / "pairs.jsonl").write_text("".join(json.dumps(pair) + "\n" for pair in pairs
                                               if pair["a"] in kept and pair["b"] in kept), encoding="utf-8")
    with (DEVSET / "docs_meta.jsonl").open(encoding="utf-8") as lines:
        (small / "docs_meta.jsonl").write_text("".join(line for line in lines if json.loads(line)["id"] in kept),
                                               encoding="utf-8")
    shutil.copy(DEVSET / "score.py", small / "score.py")
    return small


#: (script, arguments for a run of a few seconds, whether it needs the devset); DEVSET in them stands for
#: small_devset. ``--smoke`` where a script has it (bench_common.SMOKE_HELP): no CHECKPOINT of the server every other
#: test writes to, no wait for its WAL counters (bench_segments: from 32 s to 9 s, 16 s of CPU to 5 s, quiet)
RUNS = [
    ("bench_core.py", ["--documents", "3000", "--queries", "40", "--scan-queries", "2", "--smoke", "--markdown"],
     False),
    ("bench_sql.py", ["--documents", "3000", "--chunk", "1000", "--markdown"], False),
    ("bench_report.py", ["--documents", "3000", "--chunk", "1000", "--runs", "1", "--markdown"], False),
    ("bench_ingest.py", ["--quick", "--min-seconds", "0.2", "--documents", "3000", "--chunk", "1000",
                         "--archive", "20000", "--added", "1000", "--naive", "20", "--peer-documents", "2000",
                         "--text-documents", "300", "--memory-documents", "300,600", "--cli-chunk-size", "100",
                         "--smoke", "--markdown"], False),
    ("bench_ingest_fingerprint.py", ["--min-seconds", "0.2", "--workers", "2", "--markdown"], True),
    ("bench_ingest_archive.py", ["--quick", "--documents", "3000", "--chunk", "1000", "--archive", "20000",
                                 "--added", "1000", "--naive", "20", "--peer-documents", "2000", "--smoke",
                                 "--markdown"], False),
    ("bench_ingest_cli.py", ["--text-documents", "300", "--memory-documents", "300,600", "--cli-chunk-size", "100",
                             "--workers", "1", "--markdown"], False),
    ("bench_sources.py", ["--documents", "500", "--workers", "1", "--smoke", "--markdown"], False),
    ("bench_segments.py", ["--archive", "20000", "--added", "1000", "--lookups", "20", "--curve-segment", "100",
                           "--curve-probes", "20", "--smoke", "--markdown"], False),
    ("bench_segments.py", ["--archive", "20000", "--added", "1000", "--lookups", "20", "--curve-segment", "100",
                           "--curve-probes", "20", "--connections", "1,2", "--smoke", "--markdown"], False),
    ("profile_chunk.py", ["--archive", "20000", "--added", "1000", "--rounds", "1", "--smoke"], False),
    ("profile_chunk.py", ["--archive", "20000", "--added", "1000", "--rounds", "1", "--method", "minhash",
                          "--cprofile", "5", "--smoke"], False),
    ("profile_batch.py", ["--archive", "20000", "--batch", "100", "--rounds", "2"], False),
    ("profile_faults.py", ["--archive", "20000", "--batch", "100", "--rounds", "1", "--single", "10", "--markdown"],
     False),
    ("bench_probes.py", ["--archive", "30000", "--chunk", "2000", "--repeat", "1", "--oracle", "20",
                          "--staging", "2000"], False),
    ("bench_key_entries.py", ["--archive", "20000", "--rounds", "1", "--singles", "4", "--oracle", "20",
                              "--markdown"], False),
    ("bench_minhash.py", ["--limit", "100", "--devset", str(DEVSET)], True),
    ("bench_text.py", ["--documents", "200", "--jieba-documents", "100", "--min-seconds", "0.05",
                       "--jieba-min-seconds", "0.05", "--markdown"], True),
    ("bench_memory.py", ["--huge", "300000", "--documents", "300", "--chunk-size", "100", "--workers", "1",
                         "--markdown"], True),
    ("eval_quality.py", ["--categories", "short-zh", "--workers", "1", "--devset", str(DEVSET), "--markdown"], True),
    ("simhash_ceiling.py", ["--categories", "long-en", "--seeds", "1", "--devset", str(DEVSET), "--markdown"], True),
    ("short_texts.py", ["--limit", "300", "--devset", str(DEVSET), "--markdown"], True),
    ("bench_cli.py", ["--runs", "1", "--no-warm-up", "--markdown"], False),
    ("bench_check.py", ["--docs", "300", "--archive", "300", "--runs", "1", "--baseline", str(ROOT), "--markdown"],
     False),
]
#: the scripts that do not use PostgreSQL, or only an embedded one of their own
NO_DATABASE = {"bench_minhash.py", "simhash_ceiling.py", "short_texts.py", "bench_cli.py"}


@pytest.mark.slow
@pytest.mark.parametrize("script, arguments, needs_devset", RUNS, ids=[run[0] for run in RUNS])
def test_the_benchmark_runs_and_prints_its_table(script, arguments, needs_devset, database_url, small_devset):
    if needs_devset and not (DEVSET / "docs").is_dir():
        pytest.skip(f"no devset at {DEVSET} (set SIMDB_DEVSET to its folder)")
    devset = small_devset
    database = [] if script in NO_DATABASE else ["--database-url", database_url]
    arguments = [str(devset) if argument == str(DEVSET) else argument for argument in arguments]
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / script), *database, *arguments],
                          cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "SIMDB_DEVSET": str(devset), "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "|---" in done.stdout, done.stdout[-3000:]


@pytest.mark.slow
def test_bench_segments_reuses_the_archive_it_kept(database_url, admin_engine):
    """``--reuse``: the first run bulk-loads the archive and keeps it, less the batches it added (and the empty
    segments their removal left); the second uses it as it is."""
    schema = "simdb_bench_segments_kept_20000_k4"
    command = [sys.executable, str(ROOT / "scripts" / "bench_segments.py"), "--database-url", database_url,
               "--archive", "20000", "--added", "1000", "--lookups", "20", "--connections", "1", "--reuse", "--smoke"]
    try:
        for turn in range(2):
            done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600,
                                  env={**os.environ, "PYTHONPATH": str(ROOT)})
            assert done.returncode == 0, done.stderr[-3000:]
            assert ("reusing the archive" in done.stderr) == (turn == 1), done.stderr[-3000:]
            with admin_engine.connect() as connection:
                batches = connection.exec_driver_sql(f"SELECT name, documents FROM {schema}.batches").all()
                count = connection.exec_driver_sql(f"SELECT count(*) FROM {schema}.documents").scalar_one()
                segments = connection.exec_driver_sql(
                    f"SELECT count(*) FROM pg_inherits WHERE inhparent = '{schema}.documents'::regclass").scalar_one()
            assert [tuple(row) for row in batches] == [("archive", 20000)] and count == 20000 and segments == 1
        # --lookups-only: the lookups alone, on the archive kept
        done = subprocess.run([*command, "--lookups-only", "1", "--markdown"], cwd=ROOT, capture_output=True,
                              text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert done.returncode == 0, done.stderr[-3000:]
        assert "| round 1 (load" in done.stdout and "simdb_near p50" in done.stdout, done.stdout[-3000:]
    finally:
        with admin_engine.begin() as connection:
            connection.exec_driver_sql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


@pytest.mark.slow
def test_bench_key_entries_reuses_kept_tables_of_its_own_seed_only(database_url, admin_engine):
    """``--keep``: a run with another ``--seed`` rebuilds the kept tables (it stopped with "pairs differ": the
    tables held the other seed's fingerprints); a run with the same seed and size reuses them."""
    schema = "simdb_bench_key_entries_kept_test"
    command = [sys.executable, str(ROOT / "scripts" / "bench_key_entries.py"), "--database-url", database_url,
               "--archive", "20000", "--rounds", "1", "--singles", "2", "--oracle", "20", "--keep", "--schema", schema]
    try:
        for seed, reused in (("1", False), ("2", False), ("2", True)):
            done = subprocess.run([*command, "--seed", seed], cwd=ROOT, capture_output=True, text=True, timeout=600,
                                  env={**os.environ, "PYTHONPATH": str(ROOT)})
            assert done.returncode == 0, done.stderr[-3000:]
            assert ("reusing the tables" in done.stderr) == reused and "pairs agree" in done.stderr, \
                done.stderr[-3000:]
            rebuilt = "hold 20,000 documents of seed 1, not 20,000 of seed 2: rebuilding them" in done.stderr
            assert rebuilt == (seed == "2" and not reused), done.stderr[-3000:]
    finally:
        with admin_engine.begin() as connection:
            connection.exec_driver_sql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


@pytest.mark.parametrize("rounds", ["0", "-1"])
def test_bench_segments_lookups_only_wants_a_round_or_more(rounds):
    """``--lookups-only 0`` ran the whole bench (bulk-loading an archive), a negative count printed an empty
    table: both stop at the command line, before any connection (the URL here answers nothing)."""
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_segments.py"), "--database-url",
                           "postgresql://nobody@127.0.0.1:1/none", "--connections", "1", "--reuse",
                           "--lookups-only", rounds], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 2 and f"--lookups-only {rounds}: give the number of rounds, 1 or more" in done.stderr, \
        done.stderr[-3000:]


def test_every_benchmark_in_scripts_is_run():
    """A benchmark added (bench_ingest was split into parts that each run alone) is run here too."""
    runnable = {path.name for path in (ROOT / "scripts").glob("*.py")
                if 'if __name__ == "__main__":' in path.read_text(encoding="utf-8")}
    assert runnable == {run[0] for run in RUNS} | {"bench_citus.py", "bench_neighbours.py"}


def test_the_scripts_sample_processes_with_psutil_not_proc():
    """Issue 35: the benchmarks read /proc by hand (bench_ingest's process tree, RSS, CPU; bench_sources;
    bench_common; bench_citus), Linux only and parsed by position; they use psutil, through bench_process."""
    readers = [f"{path.name}:{number}" for path in sorted((ROOT / "scripts").glob("*.py"))
               for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
               if '"/proc' in line or "'/proc" in line]
    # the one exception: minor page faults, which psutil does not count (profile_faults.server_faults)
    assert [reader.split(":")[0] for reader in readers] == ["profile_faults.py"], readers


def test_the_printed_command_masks_a_database_password(monkeypatch):
    """Every benchmark prints the command that ran (and docs/performance.md copies it): a password given in
    ``--database-url`` (userinfo or ``?password=``) is masked, the rest of the command kept."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from bench_common import command_line
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    monkeypatch.setattr(sys, "argv", ["bench_x.py", "--database-url", "postgresql://simdb:hunter2@db:5432/archive",
                                      "--database-url=postgresql://db/archive?password=sw0rdfish", "--runs", "5"])
    printed = command_line("bench_x.py")
    assert "hunter2" not in printed and "sw0rdfish" not in printed, printed
    assert printed.startswith("command: .venv/bin/python scripts/bench_x.py --database-url postgresql://simdb:")
    assert printed.endswith("--runs 5") and "@db:5432/archive" in printed, printed


def test_the_sampler_names_what_it_found(tmp_path):
    """bench_process.run_cli gives a named record: the command's own peak, its child's, the tree's, CPU seconds.
    Oracle: the sizes the command itself allocates (a parent holding 200 MB and a child holding 100 MB, both
    alive for a second, so that samples every 0.2 s see them)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from bench_process import ProcessRun, run_cli
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    child = "import time; held = bytearray(100 * 2**20); held[::4096] = b'x' * len(held[::4096]); time.sleep(1.5)"
    parent = (f"import subprocess, sys, time; held = bytearray(200 * 2**20); held[::4096] = b'x' * len(held[::4096]); "
              f"subprocess.run([sys.executable, '-c', {child!r}], check=True)")
    run = run_cli([sys.executable, "-c", parent], str(tmp_path / "log"))
    assert isinstance(run, ProcessRun)
    assert run.main >= 200 * 2**20 and 100 * 2**20 <= run.worker < 200 * 2**20
    assert run.tree >= 300 * 2**20 and run.processes == 2
    assert run.cpu_main > 0 and len(run.quarters) == 4
    with pytest.raises(RuntimeError, match="exited with 3"):
        run_cli([sys.executable, "-c", "import sys; print('no'); sys.exit(3)"], str(tmp_path / "log"))


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["citus"], indirect=True)
def test_the_neighbours_benchmark_runs_on_a_coordinator_and_prints_its_table(database_url):
    """bench_neighbours times simdb_neighbours beside the view reader it replaced, on a Citus coordinator (the run's
    cluster here): a row for each of its three indexes, and its schemas dropped at the end."""
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_neighbours.py"), "--database-url",
                           database_url, "--calls", "2"], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    for title in ("simhash, keyed", "simhash, by id", "minhash exact, by id"):
        assert f"| {title} |" in done.stdout, done.stdout[-3000:]
    with sa.create_engine(database_url).connect() as connection:
        assert connection.execute(sa.text("SELECT count(*) FROM pg_namespace WHERE starts_with(nspname, :p)"),
                                  {"p": "simdb_bench_neighbours_"}).scalar() == 0


@pytest.mark.slow
def test_the_citus_benchmark_runs_and_prints_its_table(database_url):
    """bench_citus starts clusters of its own (with ../shared/citus/cluster.sh), so it needs Citus installed."""
    missing = citus_missing()  # (it starts no cluster here: the benchmark starts its own)
    if missing:
        pytest.skip(missing)
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_citus.py"), "--database-url", database_url,
                           "--archive", "3000", "--batch", "1000", "--workers", "1", "--single", "3", "--queries",
                           "20", "--batches", "2", "--idle-seconds", "0.5", "--shards", "4", "--port", str(free_port(3)),
                           "--markdown"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "SIMDB_CITUS": str(CITUS_TOOLS), "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "|---" in done.stdout, done.stdout[-3000:]
    for layout in ("id", "keyed"):  # both distributed layouts, in the same run
        assert f"Citus 1 worker, layout {layout}: ingest" in done.stdout, done.stdout[-3000:]
        # the work counted, less the idle machine's (which a busy test machine can make slightly negative)
        assert re.search(rf"layout {layout}: the machine's CPU seconds [^|]*\| -?[\d.]+ s / -?[\d.]+ s \|",
                         done.stdout), done.stdout[-3000:]


@pytest.mark.slow
def test_the_quickstart_says_what_it_does_and_shows_both_methods_on_short_texts(tmp_path):
    """Issue 38: the quickstart was silent for about a minute on a fresh machine (pip ran quietly), and showed
    SimHash only, although it misses most near-duplicates of short texts. It says what it does before each
    step, pip's steps as they come, and ends with the planted copies of short texts each method found."""
    from simdb.pg import embedded

    data = tmp_path / "quickstart"
    environment = {name: value for name, value in os.environ.items() if not name.startswith("SIMDB_")}
    try:
        done = subprocess.run([str(ROOT / "scripts" / "quickstart")], cwd=ROOT, capture_output=True, text=True,
                              timeout=1200, env={**environment, "SIMDB_QUICKSTART_DIR": str(data),
                                                 embedded.IDLE_ENV: "0"})
    finally:
        pid = embedded.postmaster_pid(data / "postgres")
        if pid is not None:
            embedded.stop(data / "postgres", pid)
    assert done.returncode == 0, done.stderr[-3000:]
    said = done.stderr.splitlines()
    assert said[0].startswith("simdb quickstart: 1) set up .venv  2) a corpus")
    installing = next(i for i, line in enumerate(said) if line.startswith("simdb: installing simdb"))
    assert "Successfully installed simdb" in "\n".join(said[installing:])
    assert any(line.startswith("warning: ") and "--method minhash --verify exact" in line for line in said)
    table = done.stdout.split("planted copies of short texts found, by method")[1].splitlines()
    assert table[1].split() == ["edit", "SimHash", "MinHash", "exact"]
    counts = {line.split()[0]: [int(n) for n in line.split()[1:] if n.isdigit()] for line in table[2:5]}
    assert set(counts) == {"dropped_ending", "one_typo", "one_word"}
    found_simhash, planted, found_minhash, _ = map(sum, zip(*counts.values()))
    assert found_simhash < found_minhash <= planted

