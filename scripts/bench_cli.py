"""Time the ``simdb`` command as a user runs it: a whole process each, on a small embedded index.

Each command runs ``--runs`` times (after one warm-up run, which starts the embedded server where it is
down) and is given as the median wall time with the minimum and maximum, then the median CPU time of the
command's process (user + system, which a loaded machine disturbs much less than the wall time) and of the
embedded server's backends that served it (``server``: what the postmaster's finished children used). The
peers are run in the same way: the bare interpreter, the import of the database layer (SQLAlchemy and
psycopg), ``simdb stats`` with ``SIMDB_SERVER_IDLE=0`` (the server started and stopped by the command, as
every command did before), and, with ``--baseline DIR``, each command of another simdb source checkout (run
by this Python with ``PYTHONPATH=DIR``; each of its runs starts and stops the server where that simdb does).
The index (the quickstart corpus, texts kept) is made in a temporary directory and removed at the end.

Each command also runs through ``simdb``'s entry point (``python -m simdb``) in a warm command process
(:mod:`simdb.launch`, ``SIMDB_WARM=require``, started by the warm-up run), beside the same entry point run
in-process (``SIMDB_WARM=0``); the warm rows' CPU adds the warm process's child that ran the command.

The commands run as an installed simdb does, with their bytecode cached (``pip install`` compiles it; the
warm-up run writes it for a source checkout): ``PYTHONDONTWRITEBYTECODE`` is taken out of their environment,
and one peer row shows what compiling simdb's sources at every run costs.

    .venv/bin/python scripts/bench_cli.py --markdown
    git archive main | tar -x -C /tmp/simdb-before && cp simdb/_native*.so /tmp/simdb-before/simdb/
    .venv/bin/python scripts/bench_cli.py --baseline /tmp/simdb-before --markdown
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from bench_common import command_line, load_average, log, print_table, ratio

from simdb import launch
from simdb.pg import embedded

RUN_SIMDB = "import sys; sys.argv[0] = 'simdb'; from simdb.cli import main; main()"
ENTRY = [sys.executable, "-m", "simdb"]


class Timings:
    """Each run's wall seconds, CPU seconds of the command (user + system) and of the server's backends."""

    def __init__(self) -> None:
        self.wall: list[float] = []
        self.cpu: list[float] = []
        self.server: list[float] = []

    def __str__(self) -> str:
        wall = f"{statistics.median(self.wall):.3f} s ({min(self.wall):.3f}-{max(self.wall):.3f})"
        return f"{wall}; CPU {statistics.median(self.cpu):.3f} s + server {statistics.median(self.server):.3f} s"


def children_cpu() -> float:
    """User + system seconds of this process's finished children."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def backends_cpu(data_dir: Path) -> float:
    """User + system seconds of the embedded server's finished backends (its postmaster's cutime and cstime),
    0 where no server runs."""
    pid = embedded.postmaster_pid(data_dir)
    if pid is None:
        return 0.0
    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return 0.0
    return times.children_user + times.children_system  # the finished backends it waited for


def warm_cpu(environment: dict[str, str]) -> float:
    """User + system seconds of the finished children (the commands) of the warm processes in
    ``SIMDB_WARM_DIR``."""
    total = 0.0
    for lock in Path(environment["SIMDB_WARM_DIR"]).glob("*.lock"):
        pid = launch.server_pid(str(lock.with_suffix(".sock")))
        if pid is not None:
            try:
                times = psutil.Process(pid).cpu_times()
            except psutil.Error:
                continue
            total += times.children_user + times.children_system
    return total


def stop_warm(directory: Path) -> None:
    for lock in directory.glob("*.lock"):
        pid = launch.server_pid(str(lock.with_suffix(".sock")))
        if pid is not None:
            os.kill(pid, signal.SIGTERM)


def timed(arguments: list[str], environment: dict[str, str], runs: int, warm_up: bool = True) -> Timings:
    """Timings of each of ``runs`` runs of the command, after one run that is not counted. They run in the
    temporary directory: ``python -c`` puts the working directory first on the path, where a checkout's simdb
    would shadow the baseline's."""
    timings = Timings()
    data_dir = Path(environment["SIMDB_DATA_DIR"])
    for run in range(runs + warm_up):
        cpu, server = children_cpu() + warm_cpu(environment), backends_cpu(data_dir)
        start = time.perf_counter()
        done = subprocess.run(arguments, env=environment, capture_output=True, text=True, timeout=600,
                              cwd=data_dir.parent)
        elapsed = time.perf_counter() - start
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(arguments)} failed (exit status {done.returncode}): {done.stderr.strip()}")
        if run or not warm_up:
            timings.wall.append(elapsed)
            timings.cpu.append(children_cpu() + warm_cpu(environment) - cpu)
            timings.server.append(max(0.0, backends_cpu(data_dir) - server))
    return timings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7, help="Timed runs of each command (after one warm-up).")
    parser.add_argument("--baseline", type=Path, default=None,
                        help="A source checkout of another simdb to time the same commands with.")
    parser.add_argument("--warm-up", action=argparse.BooleanOptionalAction, default=True,
                        help="One uncounted run of each command before its timed runs (default); --no-warm-up: the "
                             "first timed run pays what it would (the server's or the warm process's start, the "
                             "bytecode written): the tests' run, which times nothing worth reading.")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()

    load_start = load_average()
    directory = Path(tempfile.mkdtemp(prefix="simdb-bench-cli-"))
    data_dir = directory / "postgres"
    base = {name: value for name, value in os.environ.items()
            if name not in ("SIMDB_DATABASE_URL", "SIMDB_SCHEMA", "PYTHONPATH", "PYTHONDONTWRITEBYTECODE")}
    base["SIMDB_DATA_DIR"] = str(data_dir)
    base[launch.DIR_ENV] = str(directory / "warm")
    (directory / "warm").mkdir(mode=0o700)
    this = {**base, embedded.IDLE_ENV: "120", launch.WARM_ENV: "0"}
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

        def measure(command: list[str], env: dict[str, str]) -> Timings:
            return timed(command, env, args.runs, args.warm_up)

        bare = measure([sys.executable, "-c", "pass"], this)
        rows.append(("Python start-up (peer)", str(bare), "", ""))
        database_layer = measure([sys.executable, "-c", "import sqlalchemy, psycopg"], this)
        rows.append(("import sqlalchemy, psycopg (peer)", str(database_layer), "", ""))
        for name, arguments in commands:
            before = None
            if args.baseline is not None:
                log(f"{name}: baseline")
                before = measure([*simdb, *arguments], {**base, "PYTHONPATH": str(args.baseline)})
            log(f"{name}: this simdb")
            after = measure([*simdb, *arguments], this)
            rows.append((name, str(after), "" if before is None else f"{before} (baseline)",
                         "" if before is None
                         else ratio(statistics.median(before.wall) / statistics.median(after.wall))))
            log(f"{name}: in-process and warm, through the entry point")
            here = measure([*ENTRY, *arguments], this)
            warm = measure([*ENTRY, *arguments], {**this, launch.WARM_ENV: "require"})
            rows.append((f"{name}, warm process (SIMDB_WARM=require)", str(warm), f"{here} (in-process, SIMDB_WARM=0)",
                         ratio(statistics.median(here.wall) / statistics.median(warm.wall))))
            if name == "simdb fingerprint TEXT":
                compiling = measure([*simdb, *arguments], {**this, "PYTHONDONTWRITEBYTECODE": "1"})
                rows.append(("simdb fingerprint TEXT, sources compiled every run (PYTHONDONTWRITEBYTECODE=1)",
                             str(compiling), f"{after} (bytecode cached)",
                             ratio(statistics.median(compiling.wall) / statistics.median(after.wall))))
            if name == "simdb stats":
                cold = measure([*simdb, *arguments], {**this, embedded.IDLE_ENV: "0"})
                rows.append(("simdb stats, server started and stopped (SIMDB_SERVER_IDLE=0)", str(cold),
                             f"{after} (server left up)",
                             ratio(statistics.median(cold.wall) / statistics.median(after.wall))))
        header = [command_line("bench_cli.py"), f"load (1, 5, 15 min): {load_start} at the start, "
                  f"{load_average()} at the end; {os.cpu_count()} cores",
                  "each: median wall time of the runs (min-max), whole process; CPU: median user + system time "
                  "of the command's process (warm: and of the warm process's child that ran it); server: of the "
                  "embedded server's backends; ratio: the peer's median wall time over simdb's"]
        print_table(header, rows, args.markdown)
    finally:
        stop_warm(directory / "warm")
        pid = embedded.postmaster_pid(data_dir)
        if pid is not None:
            embedded.stop(data_dir, pid)
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
