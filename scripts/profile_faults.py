"""What a batch of new lookups pays that the same batch repeated does not: the server's page faults and reads.

On the archive ``bench_segments.py --connections ... --reuse`` kept (with ``--reuse``; without, one bulk-loaded
here and dropped at the end), runs ``--rounds`` batches of ``--batch`` new
probes (half near copies of stored fingerprints), each followed by the same batch twice, on one open index (its
pooled connections), and prints for each batch its rate, the minor page faults of every server process
(``/proc/PID/stat``, which psutil does not count: the server must run on this machine) and the shared blocks its
statements hit and read (``pg_stat_statements``, where the server preloads it: the extension is then created in
the database, if it is not there, and left); then single lookups, new and repeated. A backend maps
each shared buffer into its own page table the first time it touches it: with 4 kB pages that is a fault per
page, with huge pages one per 2 MB (docs/performance.md, "Huge pages for the shared buffers").

    .venv/bin/python scripts/profile_faults.py --archive 10000000 --rounds 5 --reuse \\
        --database-url postgresql://postgres@127.0.0.1:5550/postgres
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import DATABASE_HELP, Server, command_line, load_average, log, machine, print_table  # noqa: E402
from bench_segments import near_and_random  # noqa: E402
from profile_chunk import archive_in_use, reuse_option  # noqa: E402

import simdb  # noqa: E402
from simdb.methods.simhash.blocks import DEFAULT_MAX_DISTANCE  # noqa: E402


def server_faults() -> int:
    """Minor page faults of every process named ``postgres`` on this machine, since each started."""
    total = 0
    for process in psutil.process_iter(["name"]):
        if process.info["name"] == "postgres":
            try:
                with open(f"/proc/{process.pid}/stat") as stat:
                    total += int(stat.read().rsplit(")", 1)[1].split()[7])  # minflt, the stat file's 10th field
            except (OSError, ValueError):
                continue  # (a backend that ended meanwhile)
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", help=DATABASE_HELP)
    parser.add_argument("--archive", type=int, default=10_000_000, help="the kept archive's size")
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--single", type=int, default=300, help="single lookups, new then repeated")
    parser.add_argument("--connections", type=int, default=1)
    parser.add_argument("--max-distance", type=int, default=DEFAULT_MAX_DISTANCE)
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--markdown", action="store_true", help="print the table as GitHub markdown")
    reuse_option(parser)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    with Server(args.database_url) as server:
        with archive_in_use(server, args, rng) as (schema, stored):
            rows = measure(server, schema, stored, args, rng)
            print_table([machine(server.version(), server.embedded), command_line("profile_faults.py"),
                         f"archive {args.archive:,} (k = {args.max_distance}); batches of {args.batch:,} new probes, "
                         f"each then repeated twice, over {args.connections} connection(s); faults: minor page "
                         "faults of every server process; blocks: shared blocks hit and read (pg_stat_statements)"],
                        rows, args.markdown, names=("what", "rate", "page faults", "shared blocks"))


def measure(server: Server, schema: str, stored: np.ndarray, args, rng: np.random.Generator
            ) -> list[tuple[str, str, str, str]]:
    """The table's rows: each batch's rate, faults and blocks, then the single lookups'."""
    with server.admin.connect() as c:
        counted = c.exec_driver_sql("SELECT 'pg_stat_statements' = ANY(regexp_split_to_array("
                                    "current_setting('shared_preload_libraries'), '\\s*,\\s*'))").scalar_one()
        if counted:
            c.exec_driver_sql("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            view = c.exec_driver_sql("SELECT quote_ident(extnamespace::regnamespace::text) || '.pg_stat_statements' "
                                     "FROM pg_extension WHERE extname = 'pg_stat_statements'").scalar_one()
        huge = c.exec_driver_sql("SHOW huge_pages").scalar_one()

    def blocks() -> tuple[int, int]:
        if not counted:
            return (0, 0)
        with server.admin.connect() as c:
            return tuple(c.exec_driver_sql("SELECT coalesce(sum(shared_blks_hit), 0)::int8, "
                                           f"coalesce(sum(shared_blks_read), 0)::int8 FROM {view}").one())

    log(f"huge_pages {huge}, load {load_average()}"
        + ("" if counted else "; blocks not counted (the server does not preload pg_stat_statements)"))
    rows = []
    with simdb.Index.open(server.url, schema=schema) as index:
        index.query_fingerprints(near_and_random(stored, args.batch, rng).tolist(), connections=args.connections)
        for round_ in range(1, args.rounds + 1):
            probes = near_and_random(stored, args.batch, rng).tolist()
            for kind in ("new", "repeated", "repeated"):
                (hit, read), faults, started = blocks(), server_faults(), time.perf_counter()
                index.query_fingerprints(probes, connections=args.connections)
                seconds, faults = time.perf_counter() - started, server_faults() - faults
                after = blocks()
                rows.append((f"round {round_}: batch, {kind}", f"{args.batch / seconds:,.0f} q/s", f"{faults:,} faults",
                             f"{after[0] - hit:,} hit, {after[1] - read:,} read" if counted else "not counted"))
        probes = near_and_random(stored, args.single, rng).tolist()
        for kind in ("new", "repeated"):
            faults, times = server_faults(), []
            for probe in probes:
                started = time.perf_counter()
                index.query_fingerprint(probe)
                times.append(time.perf_counter() - started)
            rows.append((f"{len(probes):,} single lookups, {kind}", f"p50 {statistics.median(times) * 1000:.2f} ms",
                         f"{(server_faults() - faults) / len(probes):,.1f} faults each", ""))
    return rows


if __name__ == "__main__":
    main()
