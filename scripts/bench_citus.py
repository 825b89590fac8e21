"""simdb on a Citus cluster against simdb on one server: ingest and lookups, bytes between nodes, shards per lookup.

    .venv/bin/python scripts/bench_citus.py [--archive 200000] [--batch 20000] [--workers 1,2,4]
        [--layouts id,keyed] [--markdown]

For each worker count, a local cluster is started with ``../shared/citus/cluster.sh`` (Citus installed by
its ``install.sh``), an index on the coordinator is filled with ``--archive`` random SimHash
fingerprints and moved onto the workers as a distributed index (``simdb init --distributed --copy-from``,
timed, ``--shards`` per table), which is then measured, tokenization excluded (fingerprints are stored through
``Index.add_fingerprinted``), as on the single server that is the peer (``SIMDB_DATABASE_URL``, else the
local server, else an embedded one):

- ingest of a ``--batch`` of new fingerprints (1 % near copies of stored ones) in chunks of 20,000;
- bytes between nodes per ingested document: the growth of the kernel's byte counters of each TCP connection
  to a worker (coordinator to worker, worker to worker; ``ss -tin``), so that other processes on the machine
  are not counted; and, as before, every byte over loopback less the same ingest's bytes between client and
  the single server (the client's traffic is the same statements either way), which counts whatever else
  the machine does meanwhile: an upper bound;
- what a chunk's candidate join ships, from Citus's own ``EXPLAIN ANALYZE`` of it (a staged chunk of
  ``--batch``'s first 20,000 against every segment): probe rows and bytes sent to the workers, candidate
  rows and bytes received; and the rows an ingest stores per document (each sent once, to its worker);
- bytes stored per document (tables and their indexes, every shard): the keyed layout's ``keys`` table, and
  the rest (documents and segments, pairs, clusters, verdicts);
- the shard queries one lookup makes (the plans inside ``simdb_near``: one task per shard a statement reaches);
- single lookups (``Index.query_fingerprint``, p50) and ``--batches`` batches of ``--queries`` each
  (``query_fingerprints``, its statements over ``--connections`` connections: on the keyed layout, coordinator
  connections; the median batch);
- the CPU seconds the whole machine spent (busy time of every core, ``/proc/stat``) per 1,000 documents ingested
  and per 1,000 lookups in batches (the mean of the batches, whose median time is reported), less what it keeps
  busy idle (``--idle-seconds`` measured before each measure, the cluster started and empty): on a quiet machine,
  the work of the client, the coordinator and every worker together, which is what a cluster of nodes with cores
  of their own has to provide, whatever two shared cores make of the wall-clock rates; the machine's load before
  each measure is printed with it;
- each distributed layout of ``--layouts`` in the same run: ``id`` (documents by id, every probe to every
  shard) and ``keyed`` (``--distributed-layout keyed``: a keys table by key, each probe routed; its
  candidate join's rows sent are the key rows a chunk stages, each to one shard, and its lookup's shard
  tasks come from the plan of its routed statement);
- the alternative layout, in plain SQL on the largest cluster: ``--archive`` random rows distributed by id
  and by their first key, each looked up by its 15 keys (shard tasks and p50).

This machine has 2 cores: more workers share them, so the point is the shape of the work, not a speed-up.
Nothing here asserts anything about timings.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psutil
import psycopg
import sqlalchemy as sa

from bench_common import (DATABASE_HELP, Server, busy_seconds, command_line, log, machine, print_table, rate,
                          ratio)
from bench_corpus import fingerprinted_batch, new_fingerprints

from simdb import Index
from simdb.pg.database import postgres_url

CHUNK = 20_000
TOOLS = Path(os.environ.get("SIMDB_CITUS", Path(__file__).resolve().parents[2] / "shared" / "citus"))


def idle_rate(seconds: float = 3.0) -> float:
    """Cores the machine keeps busy while the measured code does nothing (the nodes' own background work, the
    rest of the machine): subtracted from the busy time of what is measured."""
    busy = busy_seconds()
    time.sleep(seconds)
    return (busy_seconds() - busy) / seconds


def loopback_bytes() -> int:
    """Bytes received on the loopback interface since boot (each byte between two local processes, once)."""
    counters = psutil.net_io_counters(pernic=True).get("lo")
    if counters is None:
        raise RuntimeError("no loopback interface named lo on this machine")
    return counters.bytes_recv


_SOCKET = re.compile(r"^\d+\s+\d+\s+(\S+)\s+(\S+)\s*$")  # (with a state filter, ss leaves out the state)
_SOCKET_BYTES = re.compile(r"bytes_(sent|received):(\d+)")


def node_bytes(ports: list[int]) -> dict[tuple[str, str], int]:
    """Bytes sent and received so far on each open TCP connection to one of ``ports`` (the workers': each
    connection between two nodes, coordinator to worker or worker to worker, once, from its connecting end),
    by its two addresses; read from the kernel's per-socket counters (``ss -tin``), so that other processes'
    traffic on the machine is not counted."""
    if not ports:
        return {}
    where = " or ".join(f"dport = :{port}" for port in ports)
    listing = subprocess.run(["ss", "-tinH", "state", "established", f"( {where} )"], capture_output=True,
                             text=True, check=True).stdout
    found: dict[tuple[str, str], int] = {}
    name = None
    for line in listing.splitlines():
        socket = _SOCKET.match(line)
        if socket:
            name = socket.groups()
        elif name is not None:
            found[name] = found.get(name, 0) + sum(int(n) for _, n in _SOCKET_BYTES.findall(line))
    return found


def bytes_since(before: dict[tuple[str, str], int], ports: list[int]) -> int:
    """Bytes between the nodes since ``before`` (a :func:`node_bytes`): the growth of each connection open
    then, and every byte of each opened since (the bench clusters cache their connections, so that none
    closes in between)."""
    return sum(count - before.get(name, 0) for name, count in node_bytes(ports).items())


class Cluster:
    """A coordinator and ``workers`` workers on loopback, stopped and removed on exit."""

    def __init__(self, workers: int, port: int) -> None:
        self.directory = tempfile.mkdtemp(prefix="simdb-bench-citus-")
        self.workers, self.port = workers, port
        started = subprocess.run(["bash", str(TOOLS / "cluster.sh"), "start", self.directory, str(workers),
                                  str(port)], capture_output=True, text=True)
        if started.returncode:
            raise SystemExit(f"could not start a Citus cluster: {started.stderr.strip()} (is Citus installed? "
                             f"run {TOOLS}/install.sh as root)")
        self.url = started.stdout.strip().splitlines()[-1]
        self.worker_ports = [port + n for n in range(1, workers + 1)]
        # keep every connection a coordinator backend opens to a worker, so that the per-socket byte counters
        # (node_bytes) see all of its traffic: none is closed at the end of a transaction and lost
        with psycopg.connect(self.url, autocommit=True) as connection:
            connection.execute("ALTER SYSTEM SET citus.max_cached_conns_per_worker = 64")
            connection.execute("SELECT pg_reload_conf()")

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc_info) -> None:
        subprocess.run(["bash", str(TOOLS / "cluster.sh"), "stop", self.directory], capture_output=True)
        subprocess.run(["rm", "-rf", self.directory], capture_output=True)


def measure(url: str, schema: str, args, options: dict, worker_ports: list[int] | None = None) -> dict:
    """Fill an index, then time a batch's ingest and the lookups."""
    rng = np.random.default_rng(7)
    # before any work of its own: how loaded the machine is, and what it (with this cluster's idle nodes) keeps
    # busy doing nothing, subtracted from what the ingest and the batches are counted to cost
    result: dict = {"load": os.getloadavg()[0], "idle": idle_rate(args.idle_seconds)}
    admin = sa.create_engine(postgres_url(url), isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.exec_driver_sql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    stored = new_fingerprints(rng, args.archive, None)
    local = f"{schema}_local" if options.get("distributed") else schema
    with admin.connect() as connection:
        connection.exec_driver_sql(f"DROP SCHEMA IF EXISTS {local} CASCADE")
    with Index.create(url, schema=local) as index:  # on Citus: an archive on the coordinator alone, then moved
        started = time.perf_counter()
        for start in range(0, len(stored), CHUNK):
            index.add_fingerprinted(fingerprinted_batch(rng, stored[start:start + CHUNK], f"a{start}"),
                                    batch=f"archive-{start}")
        result["fill"] = time.perf_counter() - started
        log(f"  archive of {args.archive:,} in {result['fill']:.1f} s")
    if local != schema:
        started = time.perf_counter()
        Index.copy_to_distributed(url, schema=schema, source=local, shards=options["shards"],
                                  distributed_layout=options.get("layout")).close()
        result["copy"] = time.perf_counter() - started
        log(f"  copied onto the workers in {result['copy']:.1f} s")
        with admin.connect() as connection:
            connection.exec_driver_sql(f"DROP SCHEMA {local} CASCADE")
    with Index.open(url, schema=schema) as index:
        fresh = new_fingerprints(rng, args.batch, stored)
        keyed = options.get("layout") == "keyed"
        if options.get("distributed"):
            result["join"] = keyed_join_traffic(index, fresh[:CHUNK], worker_ports or []) if keyed else \
                join_traffic(index, fresh[:CHUNK])
        rows_before = stored_rows(index)
        before, between = loopback_bytes(), node_bytes(worker_ports or [])
        busy, started = busy_seconds(), time.perf_counter()
        for start in range(0, len(fresh), CHUNK):
            index.add_fingerprinted(fingerprinted_batch(rng, fresh[start:start + CHUNK], f"n{start}"),
                                    batch=f"new-{start}")
        result["ingest"] = time.perf_counter() - started
        result["ingest_cpu"] = busy_seconds() - busy - result["idle"] * result["ingest"]
        result["bytes"] = loopback_bytes() - before
        result["between"] = bytes_since(between, worker_ports or [])
        result["rows"] = stored_rows(index) - rows_before
        log(f"  batch of {args.batch:,} in {result['ingest']:.2f} s, {result['bytes'] / args.batch:,.0f} loopback "
            "bytes a document")
        result["sizes"] = stored_bytes(index, distributed=bool(options.get("distributed")))
        probes = [int(x) for x in rng.choice(stored, args.single)]
        index.query_fingerprint(probes[0])
        times = []
        for probe in probes:
            started = time.perf_counter()
            index.query_fingerprint(probe)
            times.append(time.perf_counter() - started)
        result["p50"] = statistics.median(times)
        index.query_fingerprints([int(x) for x in rng.choice(stored, args.queries)], connections=args.connections)
        batches, busy = [], busy_seconds()  # (after one batch, which opened the coordinator connections)
        for _ in range(args.batches):
            queries = [int(x) for x in rng.choice(stored, args.queries)]
            started = time.perf_counter()
            index.query_fingerprints(queries, connections=args.connections)
            batches.append(time.perf_counter() - started)
        result["batch"] = statistics.median(batches)
        result["batch_cpu"] = (busy_seconds() - busy - result["idle"] * sum(batches)) / args.batches
        result["tasks"] = (keyed_lookup_tasks if keyed else lookup_tasks)(index, probes[0])
    with admin.connect() as connection:
        connection.exec_driver_sql(f"DROP SCHEMA {schema} CASCADE")
    admin.dispose()
    return result


_SIZE = re.compile(r"(Intermediate Data Size|Tuple data received from nodes): ([\d.]+) (bytes|kB|MB|GB)")
_UNITS = {"bytes": 1, "kB": 1024, "MB": 1024 ** 2, "GB": 1024 ** 3}


def received(plan: list[str], position: int, size: re.Match, found: dict) -> None:
    """Add to ``found`` what the coordinator received of one task: the size on ``plan``'s line ``position``, and
    the rows of the node above it."""
    found["bytes_received"] += float(size.group(2)) * _UNITS[size.group(3)]
    rows = re.search(r"actual time=\S+ rows=(\d+)", plan[position - 2] + plan[position - 1])
    found["rows_received"] += int(rows.group(1)) if rows else 0


def join_traffic(index: Index, fingerprints: np.ndarray) -> dict:
    """What one chunk's candidate join ships between the nodes, from Citus's own EXPLAIN ANALYZE of it against
    every segment: probe rows and bytes sent to the workers (each intermediate result times the nodes it is
    sent to), and candidate rows and bytes received from them."""
    from simdb.bits import to_signed
    from simdb.pg.methods.simhash import candidate_sql
    from simdb.pg.chunks import create_staging
    from simdb.pg.copy import copy_in
    from simdb.pg.segments import list_segments

    method = index.sketcher
    sketches = [int(x) for x in fingerprints]
    keys = method.keys(sketches).tolist()
    found = {"probes": len(sketches), "rows_sent": 0, "bytes_sent": 0, "rows_received": 0, "bytes_received": 0}
    # apart: a transaction that read a reference table on the coordinator may not then send a distributed plan's tasks
    with index.database.engine.connect() as connection:
        stored = list_segments(connection, distributed=index.context.distributed)
    with index.database.engine.begin() as connection:
        columns = create_staging(connection, method)
        copy_in(connection, f"staging ({', '.join(name for name, _ in columns)})", [kind for _, kind in columns],
                ((i, f"p{i}", to_signed(f), *k, b"0" * 16, 1000, "{}") for i, (f, k) in enumerate(zip(sketches, keys))))
        connection.exec_driver_sql("ANALYZE staging")
        for segment in stored:
            sql = candidate_sql(method.layout, "staging", f'"{segment.name}"', method.max_distance)
            plan = connection.exec_driver_sql("EXPLAIN (ANALYZE, FORMAT TEXT) " + sql).scalars().all()
            for position, line in enumerate(plan):
                size = _SIZE.search(line)
                if size and size.group(1) == "Intermediate Data Size":
                    destination = plan[position + 1]
                    nodes = int(re.search(r"Send to (\d+) node", destination).group(1)) \
                        if "Send to" in destination else 0
                    found["bytes_sent"] += float(size.group(2)) * _UNITS[size.group(3)] * nodes
                    found["rows_sent"] += len(sketches) * nodes if nodes else 0
                elif size:
                    received(plan, position, size, found)
        connection.rollback()
    return found


def keyed_join_traffic(index: Index, fingerprints: np.ndarray, worker_ports: list[int]) -> dict:
    """What one chunk's candidate join ships on the keyed layout, from Citus's EXPLAIN ANALYZE of it: the probe
    rows are the key rows the chunk stages (one COPY, each row to the one shard of its key: no intermediate
    result; its bytes are those between the coordinator and the workers, :func:`node_bytes`), and the
    candidate rows and bytes received from the workers."""
    from simdb.pg import keyed

    method = index.sketcher
    sketches = [int(x) for x in fingerprints]
    found = {"probes": len(sketches), "rows_sent": 0, "bytes_sent": 0, "rows_received": 0, "bytes_received": 0}
    with index.database.engine.begin() as connection:
        before = node_bytes(worker_ports)
        keyed.stage_probes(connection, np.arange(10**12, 10**12 + len(sketches)), method.stored(sketches),
                           method.keys(sketches))
        found["bytes_sent"] = bytes_since(before, worker_ports)  # coordinator to workers
        found["rows_sent"] = connection.exec_driver_sql("SELECT count(*) FROM key_probes").scalar_one()
        plan = connection.exec_driver_sql("EXPLAIN (ANALYZE, FORMAT TEXT) "
                                          + keyed.candidate_join_sql(method, method.max_distance, 10**12)).scalars().all()
        for position, line in enumerate(plan):
            size = _SIZE.search(line)
            if size:
                received(plan, position, size, found)
        connection.rollback()
    return found


def keyed_lookup_tasks(index: Index, probe: int) -> int:
    """Shard tasks of one lookup on the keyed layout: the plan of its routed statement."""
    from simdb.pg import keyed

    method = index.sketcher
    with index.database.engine.connect() as connection:
        plan = connection.exec_driver_sql("EXPLAIN " + keyed.lookup_sql(method),
                                          {"keys": keyed.fold(method.keys([probe])).tolist()}).scalars().all()
    return sum(int(line.split(":")[1]) for line in plan if "Task Count:" in line)


def stored_bytes(index: Index, *, distributed: bool) -> dict[str, int]:
    """Bytes on disk (tables and their indexes) of the index's ``keys`` table and of the rest (documents and
    segments, pairs, clusters, verdicts): on Citus the sum of its distributed tables' shards (``citus_shards``),
    on one server of its tables."""
    with index.database.engine.connect() as connection:
        if distributed:
            rows = connection.execute(sa.text(
                "SELECT c.relname, sum(s.shard_size) FROM citus_shards s JOIN pg_class c ON c.oid = s.table_name "
                "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = :schema "
                "AND s.citus_table_type = 'distributed' GROUP BY c.relname"), {"schema": index.database.schema}).all()
        else:
            rows = connection.execute(sa.text(
                "SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_class c JOIN pg_namespace n ON "
                "n.oid = c.relnamespace WHERE n.nspname = :schema AND c.relkind = 'r'"),
                {"schema": index.database.schema}).all()
    from simdb.pg import keyed

    keys = sum(int(size) for name, size in rows if name in (keyed.table(index.sketcher), keyed.PROBES))
    return {"keys": keys, "rest": sum(int(size) for _, size in rows) - keys}


def stored_rows(index: Index) -> int:
    """Rows in the tables an ingest writes (each sent once, to the worker that keeps it)."""
    with index.database.engine.connect() as connection:
        tables = ["documents", "records", "near_duplicates", "clusters"]
        if index.context.keyed:
            from simdb.pg import keyed

            tables.append(keyed.table(index.sketcher))
        return sum(connection.exec_driver_sql(f"SELECT count(*) FROM {table}").scalar_one() for table in tables)


def distribution_columns(url: str, rows: int, shards: int, lookups: int = 60) -> list[tuple[str, int, float]]:
    """The alternative to distributing by id, measured in plain SQL: the same ``rows`` random rows (an id,
    a fingerprint, 15 keys, each key indexed) distributed by ``id`` and by the first key, looked up by all 15
    keys at once (ORed, as simdb's lookups on Citus are, and as a UNION): (layout, shard tasks, p50 s)."""
    keys = [f"k{i}" for i in range(15)]
    found = []
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute("DROP SCHEMA IF EXISTS simdb_bench_layouts CASCADE")
        connection.execute("CREATE SCHEMA simdb_bench_layouts")
        connection.execute("SET search_path = simdb_bench_layouts")
        for table, column in (("by_id", "id"), ("by_key", "k0")):
            connection.execute(f"CREATE TABLE {table} (id bigint, simhash bigint, "
                               + ", ".join(f"{k} bigint" for k in keys) + ")")
            connection.execute(f"SELECT create_distributed_table('{table}', '{column}', shard_count => {shards}, "
                               "colocate_with => 'none')")
            connection.execute(f"INSERT INTO {table} SELECT g, (random() * 1e18)::bigint, "
                               + ", ".join(f"(random() * {rows * 10})::bigint" for _ in keys)
                               + f" FROM generate_series(1, {rows}) g")
            for k in keys:
                connection.execute(f"CREATE INDEX ON {table} ({k}) INCLUDE (simhash, id)")
            connection.execute(f"ANALYZE {table}")
        sample = connection.execute(f"SELECT {', '.join(keys)} FROM by_id ORDER BY random() LIMIT {lookups}").fetchall()
        for table in ("by_id", "by_key"):
            for form in ("OR", "UNION"):
                statements = [(f"SELECT id, simhash FROM {table} WHERE "
                               + " OR ".join(f"{k} = {v}" for k, v in zip(keys, row))) if form == "OR" else
                              " UNION ".join(f"SELECT id, simhash FROM {table} WHERE {k} = {v}" for k, v in zip(keys, row))
                              for row in sample]
                plan = "\n".join(r[0] for r in connection.execute("EXPLAIN " + statements[0]).fetchall())
                tasks = sum(int(line.split(":")[1]) for line in plan.splitlines() if "Task Count:" in line)
                times = []
                for statement in statements:
                    started = time.perf_counter()
                    connection.execute(statement).fetchall()
                    times.append(time.perf_counter() - started)
                found.append((f"{'id' if table == 'by_id' else 'a key column'}, keys {form}ed" if form == "OR" else
                              f"{'id' if table == 'by_id' else 'a key column'}, keys in a UNION", tasks,
                              statistics.median(times)))
        connection.execute("DROP SCHEMA simdb_bench_layouts CASCADE")
    return found


def lookup_tasks(index: Index, probe: int) -> int:
    """Shard queries of one ``simdb_near`` lookup, from the plans of the statements inside the function
    (auto_explain, nested statements included): Citus runs one task per shard a statement reaches."""
    plans: list[str] = []
    with index.database.engine.connect() as connection:
        raw = connection.connection.dbapi_connection
        raw.add_notice_handler(lambda diagnostic: plans.append(diagnostic.message_primary or ""))
        for statement in ("LOAD 'auto_explain'", "SET auto_explain.log_min_duration = 0",
                          "SET auto_explain.log_nested_statements = on", "SET auto_explain.log_analyze = on",
                          "SET auto_explain.log_verbose = on", "SET client_min_messages = log"):
            connection.exec_driver_sql(statement)
        connection.exec_driver_sql(f"SELECT * FROM simdb_near({int(np.int64(np.uint64(probe)))})").all()
        connection.exec_driver_sql("RESET client_min_messages")
        connection.rollback()
    text = "\n".join(plans)
    return sum(int(line.split(":")[1]) for line in text.splitlines() if "Task Count:" in line) or 1


def clusters(args) -> Iterator[tuple[int, str, dict]]:
    """(workers, layout, measures) for each worker count and layout, the layouts measured on the same cluster;
    on the largest cluster, the first layout's measures also hold the plain-SQL alternatives."""
    counts = [int(w) for w in args.workers.split(",")]
    for workers in counts:
        with Cluster(workers, args.port) as cluster:
            for position, layout in enumerate(args.layouts.split(",")):
                log(f"Citus, {workers} worker(s), {args.shards} shards per table, layout {layout}")
                found = measure(cluster.url, "simdb_bench_citus", args,
                                {"distributed": True, "shards": args.shards, "layout": layout}, cluster.worker_ports)
                if workers == max(counts) and position == 0:
                    log("  the alternative: distributed by a key column")
                    found["alternatives"] = distribution_columns(cluster.url, args.archive, args.shards)
                yield workers, layout, found


def cpu(found: dict, args) -> str:
    """CPU seconds of the whole machine per 1,000 documents ingested and per 1,000 lookups in batches."""
    return (f"{found['ingest_cpu'] * 1000 / args.batch:.2f} s / "
            f"{found['batch_cpu'] * 1000 / args.queries:.2f} s")


def background(found: dict) -> str:
    """How loaded the machine was before the measure began, and what it kept busy idle (subtracted)."""
    return f"load {found['load']:.1f} before, {found['idle']:.2f} cores busy idle"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--archive", type=int, default=200_000, help="fingerprints stored first")
    parser.add_argument("--batch", type=int, default=20_000, help="new fingerprints ingested and timed")
    parser.add_argument("--queries", type=int, default=1000, help="fingerprints in the timed batch of lookups")
    parser.add_argument("--batches", type=int, default=5, help="batches of lookups timed (their median reported)")
    parser.add_argument("--idle-seconds", type=float, default=3.0,
                        help="how long the idle machine's busy CPU is sampled before each measure")
    parser.add_argument("--connections", type=int, default=None,
                        help="connections the batch of lookups is spread over (default: the library's)")
    parser.add_argument("--single", type=int, default=200, help="single lookups timed (their median reported)")
    parser.add_argument("--workers", default="1,2,4", help="worker counts, comma-separated")
    parser.add_argument("--shards", type=int, default=32, help="shards per distributed table")
    parser.add_argument("--layouts", default="id,keyed", help="distributed layouts measured, comma-separated")
    parser.add_argument("--port", type=int, default=9900, help="the clusters' first port")
    parser.add_argument("--database-url", default=None, help=DATABASE_HELP)
    parser.add_argument("--markdown", action="store_true", help="print the table as GitHub markdown")
    args = parser.parse_args(argv)
    if not (TOOLS / "cluster.sh").exists():
        raise SystemExit(f"no {TOOLS}/cluster.sh: set SIMDB_CITUS to the folder with Citus's install.sh and "
                         "cluster.sh")

    with Server(args.database_url) as server:
        log("single server")
        single = measure(server.url, "simdb_bench_citus", args, {})
        version = server.version()
    rows = []
    per_document = args.batch
    rows.append(("one server: ingest (tokenization excluded)", rate(args.batch, single["ingest"], "docs"), "", ""))
    rows.append(("one server: client bytes per document", f"{single['bytes'] / per_document:,.0f} B", "", ""))
    rows.append(("one server: lookup p50", f"{single['p50'] * 1000:.2f} ms", "", ""))
    rows.append(("one server: batch of lookups", rate(args.queries, single["batch"], "queries"), "", ""))
    rows.append((f"one server: the machine's CPU seconds per 1,000 documents ingested / per 1,000 lookups in "
                 f"batches (the mean of the batches; {background(single)})", cpu(single, args), "", ""))
    layouts = []
    for workers, layout, found in clusters(args):
        label = f"Citus {workers} worker{'s' if workers > 1 else ''}, layout {layout}"
        rows.append((f"{label}: move the archive onto the workers (init --copy-from)",
                     rate(args.archive, found["copy"], "docs"), "", ""))
        rows.append((f"{label}: ingest", rate(args.batch, found["ingest"], "docs"),
                     rate(args.batch, single["ingest"], "docs") + " (one server)",
                     ratio(single["ingest"] / found["ingest"])))
        rows.append((f"{label}: bytes between nodes per document (coordinator and workers, per-socket counters)",
                     f"{found['between'] / per_document:,.0f} B", "", ""))
        rows.append((f"{label}: loopback bytes per document, less one server's client bytes (every process "
                     "on the machine: an upper bound)",
                     f"{(found['bytes'] - single['bytes']) / per_document:,.0f} B", "", ""))
        join = found["join"]
        rows.append((f"{label}: candidate join, per document: probe rows and bytes sent to workers",
                     f"{join['rows_sent'] / join['probes']:.0f} rows, {join['bytes_sent'] / join['probes']:,.0f} B",
                     "", ""))
        rows.append((f"{label}: candidate join, per document: candidate rows and bytes received",
                     f"{join['rows_received'] / join['probes']:.2f} rows, "
                     f"{join['bytes_received'] / join['probes']:,.0f} B", "", ""))
        rows.append((f"{label}: rows stored per document (each sent once, to its worker)",
                     f"{found['rows'] / per_document:.2f}", f"{single['rows'] / per_document:.2f} (one server)", ""))
        documents = args.archive + args.batch
        rows.append((f"{label}: bytes stored per document: keys table, and the rest",
                     f"{found['sizes']['keys'] / documents:,.0f} B, {found['sizes']['rest'] / documents:,.0f} B",
                     f"{single['sizes']['rest'] / documents:,.0f} B (one server)", ""))
        rows.append((f"{label}: shard queries per lookup", f"{found['tasks']} ({args.shards} shards)", "", ""))
        rows.append((f"{label}: lookup p50", f"{found['p50'] * 1000:.2f} ms", f"{single['p50'] * 1000:.2f} ms",
                     ratio(single["p50"] / found["p50"])))
        rows.append((f"{label}: batch of lookups", rate(args.queries, found["batch"], "queries"),
                     rate(args.queries, single["batch"], "queries"), ratio(single["batch"] / found["batch"])))
        rows.append((f"{label}: the machine's CPU seconds per 1,000 documents ingested / per 1,000 lookups in "
                     f"batches ({background(found)}); ratio: of the lookups, one server's against Citus's",
                     cpu(found, args), cpu(single, args) + " (one server)",
                     ratio(single["batch_cpu"] / found["batch_cpu"]) if found["batch_cpu"] > 0 else ""))
        layouts = found.get("alternatives", layouts)
    largest = max(int(w) for w in args.workers.split(","))
    for name, tasks, seconds in layouts:  # (measured on the largest cluster, with the first layout)
        rows.append((f"Citus {largest} worker{'s' if largest > 1 else ''}, plain SQL, distributed by {name}: lookup",
                     f"{tasks} shard tasks, {seconds * 1000:.2f} ms p50", "", ""))
    header = [command_line("bench_citus.py"), machine(version),
              f"archive {args.archive:,} random fingerprints, then a batch of {args.batch:,} (1 % near copies), "
              f"SimHash k = 4 (15 keys); {args.queries:,} queries in the batch lookup; ratio = simdb on Citus "
              "against simdb on one server (above 1: Citus faster)"]
    print_table(header, rows, args.markdown)


if __name__ == "__main__":
    main()
