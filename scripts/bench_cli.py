"""Time the ``simdb`` command as a user runs it: a whole process each, on a small embedded index.

Each command runs ``--runs`` times (after one warm-up run, which starts the embedded server where it is
down) and is given as the median with the minimum and maximum. The peers are run in the same way: the
bare interpreter, the import of the database layer (SQLAlchemy and psycopg), ``simdb stats`` with
``SIMDB_SERVER_IDLE=0`` (the server started and stopped by the command, as every command did before), and,
with ``--baseline DIR``, each command of another simdb source checkout (run by this Python with
``PYTHONPATH=DIR``; each of its runs starts and stops the server where that simdb does). The index (the
quickstart corpus, texts kept) is made in a temporary directory and removed at the end.

    .venv/bin/python scripts/bench_cli.py --markdown
    git archive 3103828 | tar -x -C /tmp/simdb-before && cp simdb/_native*.so /tmp/simdb-before/simdb/
    .venv/bin/python scripts/bench_cli.py --baseline /tmp/simdb-before --markdown
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_common import command_line, log, print_table, ratio

from simdb.pg import embedded

RUN_SIMDB = "import sys; sys.argv[0] = 'simdb'; from simdb.cli import main; main()"


def timed(arguments: list[str], environment: dict[str, str], runs: int, warm_up: bool = True) -> list[float]:
    """Seconds of each of ``runs`` runs of the command, after one run that is not counted. They run in the
    temporary directory: ``python -c`` puts the working directory first on the path, where a checkout's simdb
    would shadow the baseline's."""
    seconds = []
    for run in range(runs + warm_up):
        start = time.perf_counter()
        done = subprocess.run(arguments, env=environment, capture_output=True, text=True, timeout=600,
                              cwd=environment["SIMDB_DATA_DIR"].rsplit("/", 1)[0])
        elapsed = time.perf_counter() - start
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(arguments)} failed: {done.stderr.strip()}")
        if run or not warm_up:
            seconds.append(elapsed)
    return seconds


def summary(seconds: list[float]) -> str:
    return f"{statistics.median(seconds):.3f} s ({min(seconds):.3f}-{max(seconds):.3f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7, help="Timed runs of each command (after one warm-up).")
    parser.add_argument("--baseline", type=Path, default=None,
                        help="A source checkout of another simdb to time the same commands with.")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()

    load_start = os.getloadavg()[0]
    directory = Path(tempfile.mkdtemp(prefix="simdb-bench-cli-"))
    data_dir = directory / "postgres"
    base = {name: value for name, value in os.environ.items()
            if name not in ("SIMDB_DATABASE_URL", "SIMDB_SCHEMA", "PYTHONPATH")}
    base["SIMDB_DATA_DIR"] = str(data_dir)
    this = {**base, embedded.IDLE_ENV: "120"}
    simdb = [sys.executable, "-c", RUN_SIMDB]
    try:
        corpus = directory / "corpus.jsonl"
        subprocess.run([sys.executable, "-m", "simdb.samples", str(corpus)], env=this, check=True,
                       capture_output=True)
        log("making the index (init, ingest of the quickstart corpus)")
        timed([*simdb, "init", "--store-text"], this, 1, warm_up=False)
        timed([*simdb, "ingest", str(corpus), "--batch", "archive"], this, 1, warm_up=False)
        first = json.loads(corpus.read_text().splitlines()[0])
        commands = [("simdb --help", ["--help"]), ("simdb fingerprint TEXT", ["fingerprint", "hello world"]),
                    ("simdb stats", ["stats"]), ("simdb show ID", ["show", first["id"]]),
                    ("simdb query TEXT", ["query", first["text"][:500]])]
        rows = []
        bare = timed([sys.executable, "-c", "pass"], this, args.runs)
        rows.append(("Python start-up (peer)", summary(bare), "", ""))
        database_layer = timed([sys.executable, "-c", "import sqlalchemy, psycopg"], this, args.runs)
        rows.append(("import sqlalchemy, psycopg (peer)", summary(database_layer), "", ""))
        for name, arguments in commands:
            before = None
            if args.baseline is not None:
                log(f"{name}: baseline")
                before = timed([*simdb, *arguments], {**base, "PYTHONPATH": str(args.baseline)}, args.runs)
            log(f"{name}: this simdb")
            after = timed([*simdb, *arguments], this, args.runs)
            rows.append((name, summary(after), "" if before is None else f"{summary(before)} (baseline)",
                         "" if before is None else ratio(statistics.median(before) / statistics.median(after))))
            if name == "simdb stats":
                cold = timed([*simdb, *arguments], {**this, embedded.IDLE_ENV: "0"}, args.runs)
                rows.append(("simdb stats, server started and stopped (SIMDB_SERVER_IDLE=0)", summary(cold),
                             f"{summary(after)} (server left up)",
                             ratio(statistics.median(cold) / statistics.median(after))))
        header = [command_line("bench_cli.py"), f"load (1 min): {load_start:.2f} at the start, "
                  f"{os.getloadavg()[0]:.2f} at the end; {os.cpu_count()} cores", "each: median of the runs, (min-max), whole process; ratio: the "
                  "peer's median over simdb's"]
        print_table(header, rows, args.markdown)
    finally:
        pid = embedded.postmaster_pid(data_dir)
        if pid is not None:
            embedded.stop(data_dir, pid)
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
