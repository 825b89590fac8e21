"""What every benchmark in scripts/ shares: a database to measure on, the clock, the table.

The benchmarks are run as ``.venv/bin/python scripts/NAME.py``, which puts this directory on
``sys.path``, so they import this module by name. Nothing here asserts anything about timings.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np
import psutil
import sqlalchemy as sa

import simdb
import simdb.native
from simdb.pg.database import postgres_url, redact, scratch_server
from simdb.pg.methods import sql_of

STARTED = time.perf_counter()
#: The environment variable a benchmark's database comes from (else the local server, else embedded).
DATABASE_VARIABLE = "SIMDB_DATABASE_URL"
DATABASE_HELP = (f"PostgreSQL URL (default: ${DATABASE_VARIABLE}, else postgresql://postgres@127.0.0.1:5432/test "
                 "if it answers, else an embedded server in a temporary directory)")
#: ``--smoke``: a run that only shows that the script works (tests/test_scripts.py runs each benchmark so, on the
#: server every other test writes to) skips what only makes the figures honest: a CHECKPOINT there waited for
#: every other test's writes (19 s once), and made their next writes log whole pages
SMOKE_HELP = ("a run for the tests, whose figures are not worth reading: no CHECKPOINT before the timed steps, no "
              "wait for the server's WAL counters")
SMOKE = {"on": False}


def log(message: str) -> None:
    """Progress on stderr, stamped with the seconds since the run started."""
    print(f"[{time.perf_counter() - STARTED:6.1f} s] {message}", file=sys.stderr, flush=True)


class Server:
    """The PostgreSQL a benchmark measures on: an explicit URL, or the tests' scratch server."""

    def __init__(self, explicit: str | None) -> None:
        if explicit:
            self.url, self.where, self._embedded = explicit, "--database-url", None
        else:
            self.url, self.where, self._embedded = scratch_server(DATABASE_VARIABLE)
        log(f"PostgreSQL: {self.where}")
        self.admin = sa.create_engine(postgres_url(self.url), isolation_level="AUTOCOMMIT")

    @property
    def embedded(self) -> bool:
        return self._embedded is not None

    def version(self) -> str:
        """The server's version, and whether its shared memory is in huge pages (which moved batch lookups into
        10M by 1.4-1.7x): ``huge_pages`` and, where the server runs on this machine, the huge pages it has."""
        from simdb.pg.server import machine_huge_pages, on_this_machine

        with self.admin.connect() as connection:
            version, huge = connection.exec_driver_sql(
                "SELECT current_setting('server_version'), current_setting('huge_pages')").one()
            here = machine_huge_pages() if on_this_machine(connection) else None
        return f"{version}, huge_pages {huge}" + ("" if here is None else f" ({here.total:,} reserved here)")

    def drop_schemas(self, *schemas: str) -> None:
        with self.admin.connect() as connection:
            for schema in schemas:
                connection.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')

    def checkpoint(self) -> None:
        checkpoint(self.admin)

    def close(self) -> None:
        self.admin.dispose()
        if self._embedded is not None:
            self._embedded.cleanup()

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def bulk_load(url: str, admin: sa.Engine, schema: str, layout, size: int, rng: np.random.Generator,
              max_distance: int = 3, *, options: dict | None = None) -> tuple[np.ndarray, dict]:
    """A new index in ``schema`` holding ``size`` random sketches (ids 1..size, each its own cluster) as
    one sealed segment, loaded the way a restore would: binary COPY FREEZE into the bare segment table,
    indexed and attached as a merge does (``segments.index_bare``, ``attach_indexed``), VACUUM.

    SimHash (``layout``, ``max_distance``) unless ``options`` are other ``Index.create`` settings (MinHash:
    random ``(num_perm,)`` uint32 signatures). Returns the sketches (SimHash: every fingerprint, uint64;
    MinHash: the first 200,000 signatures, ``(n, num_perm)`` uint32) and the timings."""
    from simdb.pg import segments
    from simdb.pg.copy import copy_in

    timings, started = {}, time.perf_counter()
    with simdb.Index.create(url, schema=schema, **(options or {"blocks": layout.blocks,
                                                                "max_distance": max_distance})) as index:
        method = index.settings.method
    minhash = method.name == "minhash"
    kept = []
    name = segments.segment_name(1)
    sketch_column, sketch_type = sql_of(method).sketch_column
    columns = ["id", "external_id", "batch_id", sketch_column, *method.key_columns, "content_hash", "length",
               "metadata", "cluster_id"]
    types = ["int8", "text", "int4", sketch_type, *["int8"] * len(method.key_columns), "bytea", "int4", "jsonb",
             "int8"]
    engine = sa.create_engine(postgres_url(url))
    try:
        with engine.begin() as c:
            c.exec_driver_sql(f"SET search_path TO {schema}")
            batch_id = c.execute(sa.text(
                "INSERT INTO batches (name, source, status, started_at, finished_at, documents, new, position) "
                "VALUES ('archive', 'bulk load', 'complete', now(), now(), :n, :n, :n) RETURNING id"),
                {"n": size}).scalar_one()
            c.exec_driver_sql(f"CREATE TABLE {name} (LIKE documents INCLUDING DEFAULTS INCLUDING CONSTRAINTS)")

            def rows():
                step = 500_000 if not minhash else 100_000
                for first in range(0, size, step):
                    count = min(step, size - first)
                    if minhash:
                        part = rng.integers(0, 2 ** 32, (count, method.settings.num_perm), dtype=np.uint32)
                        if sum(len(k) for k in kept) < 200_000:
                            kept.append(part)
                        sketches = [row.tobytes() for row in part]
                    else:
                        part = random_u64(rng, count)
                        kept.append(part)
                        sketches = part.tolist()
                    keys, stored = method.keys(sketches).tolist(), method.stored(sketches)
                    hashes = rng.bytes(16 * count)
                    for i in range(count):
                        row_id = first + i + 1
                        yield (row_id, f"arc-{row_id:010d}", batch_id, stored[i], *keys[i],
                               hashes[16 * i:16 * i + 16], 1000, {}, row_id)
                    if (first + step) % 2_000_000 == 0:
                        log(f"  COPY {first + step:,} rows")

            start = time.perf_counter()
            copy_in(c, f"{name} ({', '.join(columns)})", types, rows(), freeze=True)
            c.exec_driver_sql(f"SELECT setval('documents_id_seq', {int(size)})")
        timings["copy"] = time.perf_counter() - start
        start = time.perf_counter()
        with admin.connect() as c:
            c.exec_driver_sql(f"SET search_path TO {schema}")
            c.exec_driver_sql("SET maintenance_work_mem = '1GB'")
            segments.index_bare(c, name, 1, size + 1)  # as a merge builds its segment
            segments.attach_indexed(c, name, 1, size + 1)
            timings["indexes"] = time.perf_counter() - start
            start = time.perf_counter()
            c.exec_driver_sql(f"VACUUM {name}")  # the visibility map, for index-only scans
            timings["vacuum"] = time.perf_counter() - start
            timings["bytes"] = c.execute(sa.text("SELECT pg_total_relation_size(CAST(:t AS regclass))"),
                                         {"t": f"{schema}.{name}"}).scalar_one()
    finally:
        engine.dispose()
    timings["total"] = time.perf_counter() - started
    log(f"  bulk load of {size:,}: COPY {timings['copy']:.0f} s, indexes {timings['indexes']:.0f} s, VACUUM "
        f"{timings['vacuum']:.0f} s; {timings['bytes'] / 2**30:.1f} GiB")
    return np.concatenate(kept) if kept else np.empty(0, np.uint64), timings


def smoke(on: bool) -> None:
    """``--smoke`` given or not (SMOKE_HELP): whether :func:`checkpoint` and :func:`wal_counters_settle` do nothing."""
    SMOKE["on"] = on


def checkpoint(admin: sa.Engine) -> None:
    """Flush dirty pages so that one measurement does not pay for the previous one's writes (not in a ``--smoke``
    run)."""
    if SMOKE["on"]:
        return
    try:
        with admin.connect() as connection:
            connection.exec_driver_sql("CHECKPOINT")
    except sa.exc.DBAPIError:
        pass  # not a superuser: measure without it


def wal_counters_settle() -> None:
    """Wait until the backends have reported their WAL counters (about once a second) to ``pg_stat_wal`` (not in a
    ``--smoke`` run, whose full-page image counts then fall short)."""
    if not SMOKE["on"]:
        time.sleep(1.0)


def machine(version: str, embedded: bool = False) -> str:
    """One line: cores, memory, PostgreSQL, simdb and Python, for a table's header."""
    memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30
    return (f"machine: {os.cpu_count()} cores, {memory:.0f} GiB; PostgreSQL {version}"
            f"{' (embedded)' if embedded else ''}; simdb {simdb.__version__} ({os.path.dirname(simdb.__file__)}); "
            f"Python {sys.version.split()[0]}; compiled fast paths {simdb.native.description()}")


def command_line(script: str) -> str:
    """The command that ran, as the tables print it: a password in a database URL among the options masked."""
    return "command: " + " ".join([".venv/bin/python", f"scripts/{script}", *map(redact, sys.argv[1:])])


def random_u64(rng: np.random.Generator, n: int) -> np.ndarray:
    return np.frombuffer(rng.bytes(8 * n), dtype=np.uint64).copy()


def rss_bytes() -> int:
    """This process's resident memory now (psutil)."""
    return psutil.Process().memory_info().rss


def mb(count_bytes: float) -> str:
    return f"{count_bytes / 2**20:,.0f} MB"


def busy_seconds() -> float:
    """CPU seconds every core of the machine has been busy since boot (``/proc/stat`` through psutil): around a
    step, what the client and the server did for it together, on a quiet machine. Not idle, not waiting for I/O,
    not stolen by other guests of the host; a guest's own time is in user and nice already."""
    import psutil  # (a bench extra; only the benchmarks that count CPU need it)

    times = psutil.cpu_times()
    return sum(times) - sum(getattr(times, name, 0.0) for name in ("idle", "iowait", "steal", "guest", "guest_nice"))


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def rate(count: float, seconds: float, unit: str) -> str:
    return f"{count / seconds:,.0f} {unit}/s"


def ratio(x: float) -> str:
    return f"{x:,.1f}x" if x >= 10 else f"{x:.2f}x"


def print_table(header: list[str], rows: list[tuple[str, str, str, str]], markdown: bool,
                names: tuple[str, str, str, str] = ("operation", "simdb", "peer", "ratio")) -> None:
    """The header lines, then rows of four columns (``names``; by default operation, simdb, peer, ratio): GitHub
    markdown, or aligned columns."""
    if markdown:
        print("\n".join(f"- {line}" for line in header) + "\n")
        print("| " + " | ".join(names) + " |\n|---|---:|---|---:|")
        for row in rows:
            print("| " + " | ".join(row) + " |")
        return
    print("\n".join(header) + "\n")
    widths = [max(len(row[i]) for row in [names, *rows]) for i in range(4)]
    for row in [names, *rows]:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
