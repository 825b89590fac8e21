"""Every benchmark in scripts/ runs, on tiny inputs, and prints its table.

The docs give each table with the command that produced it; a script that no longer runs makes those
commands lie (bench_core and bench_ingest's fingerprinting had stopped running after internal renames,
and nothing noticed). These runs time nothing worth reading and assert nothing about timings.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import CITUS_TOOLS, DEVSET, citus_missing, free_port

ROOT = Path(__file__).resolve().parents[1]

#: (script, arguments for a run of a few seconds, whether it needs the devset)
RUNS = [
    ("bench_core.py", ["--documents", "3000", "--queries", "40", "--scan-queries", "2", "--markdown"], False),
    ("bench_sql.py", ["--documents", "3000", "--chunk", "1000", "--markdown"], False),
    ("bench_report.py", ["--documents", "3000", "--chunk", "1000", "--markdown"], False),
    ("bench_ingest.py", ["--quick", "--min-seconds", "0.2", "--documents", "3000", "--chunk", "1000",
                         "--archive", "20000", "--added", "1000", "--naive", "20", "--peer-documents", "2000",
                         "--text-documents", "300", "--memory-documents", "300,600", "--cli-chunk-size", "100",
                         "--markdown"], False),
    ("bench_sources.py", ["--documents", "500", "--workers", "1", "--markdown"], False),
    ("bench_segments.py", ["--archive", "20000", "--added", "1000", "--lookups", "20", "--markdown"], False),
    ("bench_minhash.py", ["--limit", "100", "--devset", str(DEVSET)], True),
    ("bench_text.py", ["--documents", "300", "--jieba-documents", "200", "--min-seconds", "0.05", "--markdown"],
     True),
    ("bench_memory.py", ["--huge", "300000", "--documents", "300", "--chunk-size", "100", "--workers", "1",
                         "--markdown"], True),
    ("eval_quality.py", ["--categories", "short-zh", "--workers", "1", "--devset", str(DEVSET), "--markdown"], True),
    ("simhash_ceiling.py", ["--categories", "long-en", "--seeds", "1", "--devset", str(DEVSET), "--markdown"], True),
]
#: the scripts that do not use PostgreSQL
NO_DATABASE = {"bench_minhash.py", "simhash_ceiling.py"}


@pytest.mark.slow
@pytest.mark.parametrize("script, arguments, needs_devset", RUNS, ids=[run[0] for run in RUNS])
def test_the_benchmark_runs_and_prints_its_table(script, arguments, needs_devset, database_url):
    if needs_devset and not (DEVSET / "docs").is_dir():
        pytest.skip(f"no devset at {DEVSET} (set SIMDB_DEVSET to its folder)")
    database = [] if script in NO_DATABASE else ["--database-url", database_url]
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / script), *database, *arguments],
                          cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "SIMDB_DEVSET": str(DEVSET), "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "|---" in done.stdout, done.stdout[-3000:]


@pytest.mark.slow
def test_the_citus_benchmark_runs_and_prints_its_table(database_url):
    """bench_citus starts clusters of its own (with ../shared/citus/cluster.sh), so it needs Citus installed."""
    missing = citus_missing()  # (it starts no cluster here: the benchmark starts its own)
    if missing:
        pytest.skip(missing)
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_citus.py"), "--database-url", database_url,
                           "--archive", "3000", "--batch", "1000", "--workers", "1", "--single", "3", "--queries",
                           "20", "--shards", "4", "--port", str(free_port(3)), "--markdown"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "SIMDB_CITUS": str(CITUS_TOOLS), "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "|---" in done.stdout and "Citus 1 worker: ingest" in done.stdout, done.stdout[-3000:]
