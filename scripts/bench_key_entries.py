"""How large a SimHash key-index entry must be: three index designs side by side (issue 36).

At 10M documents simdb's fifteen covering key indexes ``(key_j) INCLUDE (simhash, id)`` take 5.8 GB (about
40 bytes per document and key); where shared buffers do not hold them, a batch of lookups reads from the
kernel (or the disk) and runs 3-4x slower. This measures what smaller entries give, on bare tables of
``--archive`` random fingerprints (k = 4, the layout ``BlockLayout.for_size`` picks: fifteen 20-22-bit
keys), each design in its own table so that no design's index serves another's query:

* **today**: ``(key_j) INCLUDE (simhash, id)``: an index-only scan per probe and key, the distance checked
  on the index tuple, the id read from it;
* **no id**: ``(key_j) INCLUDE (simhash)``: the same scan returns the verified stored fingerprints; their
  ids are fetched in one more statement, only for the verified matches (the ``key_0`` index with a heap
  visit for each row of those keys);
* **permuted** (Manku, Jain, Das Sarma 2007): one 64-bit column per key, ``perm_j``, holding the
  fingerprint with key j's blocks moved to the top bits (the other blocks after them, in order), indexed
  alone. A probe's candidates are the range ``perm_j BETWEEN lo AND hi`` (every fingerprint sharing key j's
  bits); the distance is checked on the index tuple (Hamming distance does not change when both sides'
  bits are permuted alike) in an index-only scan, and the ids are fetched only for verified matches through
  ``perm_0`` (a heap visit each).

Each design answers the same batches of ``--batch`` new probes (half 1-bit near copies of stored
fingerprints, half random) with one statement over its fifteen columns (probes as arrays in key order, a
``LATERAL`` index probe per probe and column, as simdb's batches run), on one connection without JIT; the
pair sets must agree between designs and, for ``--oracle`` probes of the first batch and the probes it
leads with that one key alone can find (each key in turn, at distance K and K + 1), with a numpy brute
force over every stored fingerprint. Reported per design: index bytes (``pg_relation_size`` of its fifteen
indexes) per document, batch q/s (the median over ``--rounds``, designs in the order A B C, then C B A) and
a single probe's p50, with the batch's shared buffer hits / reads from ``EXPLAIN (ANALYZE, BUFFERS)``.

``--state`` says what is in memory before each design's batches: ``cached`` (its indexes read into shared
buffers with ``pg_prewarm``, or by a full index scan of each where the server lacks it), ``buffers`` (the
same, on a server whose shared buffers are smaller than some designs' indexes: what does not fit is read
from the kernel's page cache), ``evicted`` (as ``buffers``, and
before every batch the kernel's page cache of its table and indexes dropped with ``posix_fadvise(DONTNEED)``,
so what shared buffers do not hold comes from the disk, the heap pages that no id and permuted visit for
their ids included; needs the server's data directory readable here).
``--keep`` leaves the tables for the next run (another ``--state``, or the server restarted with other
shared buffers), which reuses them when they hold its ``--archive`` documents of its ``--seed`` (else
rebuilds them).

Run::

    .venv/bin/python scripts/bench_key_entries.py --archive 3000000 --state cached \\
        --database-url postgresql://postgres@127.0.0.1:5540/postgres
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import command_line, load_average, log, random_u64  # noqa: E402

from simdb.bits import hamming_array, to_signed_array, to_unsigned_array  # noqa: E402
from simdb.methods.simhash.blocks import BlockLayout  # noqa: E402

K = 4
SCHEMA = "simdb_bench_key_entries"
DESIGNS = {"today": "(key_j) INCLUDE (simhash, id)", "no_id": "(key_j) INCLUDE (simhash)",
           "permuted": "(perm_j), range probe"}


def permutations(layout: BlockLayout) -> list[list[int]]:
    """For each key, its blocks first, then the other blocks in order: the block order of ``perm_j``."""
    return [[*key, *(b for b in range(layout.blocks) if b not in key)] for key in layout.keys]


def permute(layout: BlockLayout, fps: np.ndarray, order: list[int], back: bool = False) -> np.ndarray:
    """``fps`` (uint64) with their blocks rearranged into ``order``, the first at the top bits; ``back``: the
    inverse (permuted values to fingerprints)."""
    out, top = np.zeros_like(fps), 64
    for b in order:
        start, width = layout.block_ranges[b]
        top -= width
        source, target = (top, start) if back else (start, top)
        out |= ((fps >> np.uint64(source)) & np.uint64((1 << width) - 1)) << np.uint64(target)
    return out


def unpermute(layout: BlockLayout, perms: np.ndarray, order: list[int]) -> np.ndarray:
    return permute(layout, perms, order, back=True)


def binary_copy(columns: list[np.ndarray]) -> bytes:
    """PostgreSQL binary COPY data of int8 ``columns`` (all one length)."""
    n, fields = len(columns[0]), len(columns)
    dtype = [("count", ">i2")] + [item for f in range(fields) for item in ((f"l{f}", ">i4"), (f"v{f}", ">i8"))]
    rows = np.zeros(n, dtype=dtype)
    rows["count"] = fields
    for f, column in enumerate(columns):
        rows[f"l{f}"] = 8
        rows[f"v{f}"] = np.asarray(column).astype(np.int64)
    return b"PGCOPY\n\xff\r\n\x00" + b"\x00" * 8 + rows.tobytes() + b"\xff\xff"


def build(conn: psycopg.Connection, layout: BlockLayout, fps: np.ndarray, seed: int) -> dict:
    """The three tables and their indexes, vacuumed; seconds of each design's index builds. ``built`` records
    the documents and the ``--seed`` that drew them, for ``--keep``'s next run."""
    n, keys = len(fps), layout.block_keys_array(fps)
    ids, signed = np.arange(1, n + 1, dtype=np.int64), to_signed_array(fps)
    perms = [to_signed_array(permute(layout, fps, order)) for order in permutations(layout)]
    columns = len(layout.keys)
    conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
    conn.execute(f"CREATE SCHEMA {SCHEMA}")
    seconds = {}
    for design in DESIGNS:
        names = [f"{'perm' if design == 'permuted' else 'key'}_{j}" for j in range(columns)]
        data = binary_copy([ids, signed, *(perms if design == "permuted" else keys.T)])
        started = time.perf_counter()
        with conn.transaction():  # COPY FREEZE into a table of the same transaction: every page all-visible
            conn.execute(f"CREATE TABLE {SCHEMA}.{design} (id bigint, simhash bigint, "
                         + ", ".join(f"{name} bigint" for name in names) + ")")
            with conn.cursor().copy(f"COPY {SCHEMA}.{design} FROM STDIN (FORMAT binary, FREEZE)") as copy:
                for at in range(0, len(data), 1 << 24):
                    copy.write(data[at:at + (1 << 24)])
        log(f"  {design}: COPY {n:,} rows in {time.perf_counter() - started:.1f} s")
        started = time.perf_counter()
        for j, name in enumerate(names):
            include = {"today": " INCLUDE (simhash, id)", "no_id": " INCLUDE (simhash)", "permuted": ""}[design]
            conn.execute(f"CREATE INDEX {design}_{j} ON {SCHEMA}.{design} ({name}){include}")
        seconds[design] = time.perf_counter() - started
        conn.execute(f"VACUUM (ANALYZE) {SCHEMA}.{design}")
        log(f"  {design}: {columns} indexes in {seconds[design]:.1f} s")
    conn.execute(f"CREATE TABLE {SCHEMA}.built (documents bigint, seed bigint, seconds jsonb)")
    conn.execute(f"INSERT INTO {SCHEMA}.built VALUES (%s, %s, %s)", (n, seed, json.dumps(seconds)))
    return seconds


def near_and_random(rng: np.random.Generator, stored: np.ndarray, count: int) -> np.ndarray:
    near = count // 2
    flips = np.uint64(1) << rng.integers(0, 64, near).astype(np.uint64)
    return np.concatenate([stored[rng.integers(0, len(stored), near)] ^ flips, random_u64(rng, count - near)])


def one_key_only(rng: np.random.Generator, stored: np.ndarray, layout: BlockLayout, per_key: int
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Probes that only one key can find: for each key in turn, a stored fingerprint with one bit flipped in each
    of the K blocks outside the key (distance K: only that key's blocks still agree), and ``per_key`` more at
    distance K + 1 (one more bit in one of those blocks: the key finds a candidate the distance must reject).
    Returns the probes, the index of the stored fingerprint each came from, and each one's distance to it."""
    probes, sources, distances = [], [], []
    for round_ in range(2 * per_key):
        for key in layout.keys:
            outside = [b for b in range(layout.blocks) if b not in key]
            assert len(outside) == K, f"{layout.describe()}: {len(outside)} blocks outside a key, not {K}"
            source = int(rng.integers(0, len(stored)))
            bits = [layout.block_ranges[b][0] + int(rng.integers(0, layout.block_ranges[b][1])) for b in outside]
            if round_ % 2:  # one more bit, in the first block outside the key
                start, width = layout.block_ranges[outside[0]]
                bits.append(start + (bits[0] - start + 1 + int(rng.integers(0, width - 1))) % width)
            flips = sum(1 << bit for bit in bits)
            probes.append(int(stored[source]) ^ flips)
            sources.append(source)
            distances.append(len(bits))
    return np.array(probes, dtype=np.uint64), np.array(sources), np.array(distances)


class Design:
    """One design's batch: its statement, and the pairs (probe row, document id) it verifies."""

    def __init__(self, name: str, layout: BlockLayout) -> None:
        self.name, self.layout = name, layout
        self.orders = permutations(layout)
        columns = range(len(layout.keys))
        if name == "permuted":
            self.sql = "\nUNION ALL\n".join(
                f"SELECT p.i, {j}, t.v FROM (SELECT * FROM unnest(%(q{j})s::bigint[], %(i)s::int[]) AS p0(q, i) "
                f"ORDER BY q) p CROSS JOIN LATERAL (SELECT perm_{j} AS v FROM {SCHEMA}.permuted t WHERE t.perm_{j} "
                f"BETWEEN p.q & {-(1 << (64 - layout.key_widths[j]))} AND p.q | {(1 << (64 - layout.key_widths[j])) - 1} "
                f"AND bit_count((p.q # t.perm_{j})::bit(64)) <= {K} OFFSET 0) t" for j in columns)
        else:
            selected = "t.id, t.simhash" if name == "today" else "t.simhash"
            self.sql = "\nUNION ALL\n".join(
                f"SELECT p.i, {selected} FROM (SELECT * FROM unnest(%(k{j})s::bigint[], %(fp)s::bigint[], "
                f"%(i)s::int[]) AS p0(k, fp, i) ORDER BY k) p CROSS JOIN LATERAL "
                f"(SELECT {selected} FROM {SCHEMA}.{name} t WHERE t.key_{j} = p.k "
                f"AND bit_count((p.fp # t.simhash)::bit(64)) <= {K} OFFSET 0) t" for j in columns)

    def params(self, fps: np.ndarray) -> dict:
        params: dict = {"i": list(range(len(fps)))}
        if self.name == "permuted":
            for j, order in enumerate(self.orders):
                params[f"q{j}"] = to_signed_array(permute(self.layout, fps, order)).tolist()
        else:
            params["fp"] = to_signed_array(fps).tolist()
            for j, column in enumerate(self.layout.block_keys_array(fps).T):
                params[f"k{j}"] = column.tolist()
        return params

    def run(self, conn: psycopg.Connection, fps: np.ndarray) -> set:
        rows = conn.execute(self.sql, self.params(fps)).fetchall()
        if self.name == "today":
            return {(i, doc) for i, doc, _ in rows}
        if self.name == "no_id":  # the verified fingerprints' ids: key_0's index, a heap visit per row
            found = sorted({s for _, s in rows})
            if not found:
                return set()
            unsigned = to_unsigned_array(np.array(found, dtype=np.int64))
            keys0 = np.unique(self.layout.block_keys_array(unsigned)[:, 0]).tolist()
            ids: dict[int, list[int]] = {}
            for doc, s in conn.execute(f"SELECT id, simhash FROM {SCHEMA}.no_id WHERE key_0 = ANY(%s::bigint[]) "
                                       "AND simhash = ANY(%s::bigint[])", (keys0, found)):
                ids.setdefault(s, []).append(doc)
            return {(i, doc) for i, s in rows for doc in ids.get(s, [])}
        # permuted: each verified perm_j back to the fingerprint, its perm_0, ids through perm_0's index
        if not rows:
            return set()
        pairs, wanted = [], set()
        columns = np.array([j for _, j, _ in rows])
        values = to_unsigned_array(np.array([v for _, _, v in rows], dtype=np.int64))
        probe_rows = np.array([i for i, _, _ in rows])
        for j, order in enumerate(self.orders):
            mine = columns == j
            for i, fp in zip(probe_rows[mine].tolist(), unpermute(self.layout, values[mine], order).tolist()):
                pairs.append((i, fp))
                wanted.add(fp)
        perm0 = to_signed_array(permute(self.layout, np.array(sorted(wanted), dtype=np.uint64), self.orders[0]))
        found = conn.execute(f"SELECT id, perm_0 FROM {SCHEMA}.permuted WHERE perm_0 = ANY(%s::bigint[])",
                             (perm0.tolist(),)).fetchall()
        back = unpermute(self.layout, to_unsigned_array(np.array([v for _, v in found], dtype=np.int64)),
                         self.orders[0]).tolist()
        ids: dict[int, list[int]] = {}
        for (doc, _), fp in zip(found, back):
            ids.setdefault(fp, []).append(doc)
        return {(i, doc) for i, fp in pairs for doc in ids.get(fp, [])}

    def buffers(self, conn: psycopg.Connection, fps: np.ndarray) -> tuple[int, int, float]:
        """Shared buffer hits, reads and execution ms of the batch's main statement (EXPLAIN ANALYZE)."""
        plan = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + self.sql, self.params(fps)).fetchone()[0]
        top = plan[0]["Plan"]
        return top.get("Shared Hit Blocks", 0), top.get("Shared Read Blocks", 0), plan[0]["Execution Time"]


def relation_files(conn: psycopg.Connection, design: str) -> list[str]:
    """The files of ``design``'s table and of its indexes: every segment of the main fork, and the visibility
    map and free space map where they exist. The heap counts: no id and permuted read it for the ids of the
    verified matches (and every design's scan consults the visibility map)."""
    data = conn.execute("SHOW data_directory").fetchone()[0]
    paths = [row[0] for row in conn.execute(
        "SELECT pg_relation_filepath(c.oid) FROM pg_class c WHERE c.oid = %(t)s::regclass OR c.oid IN "
        "(SELECT indexrelid FROM pg_index WHERE indrelid = %(t)s::regclass)", {"t": f"{SCHEMA}.{design}"})]
    files = []
    for path in paths:
        base = os.path.join(data, path)
        files += [base] + [name for name in (f"{base}_vm", f"{base}_fsm", *(f"{base}.{n}" for n in range(1, 1000)))
                           if os.path.exists(name)]
    return files


def evict(files: list[str]) -> None:
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def warm(conn: psycopg.Connection, design: str, columns: int, prewarm: bool) -> None:
    """Read ``design``'s indexes into shared buffers: with ``pg_prewarm`` where the server has it, else by a full
    index-only scan of each (its leaf pages and the path to them: what a batch's descents read)."""
    for j in range(columns):
        if prewarm:
            conn.execute("SELECT pg_prewarm(%s::regclass)", (f"{SCHEMA}.{design}_{j}",))
            continue
        column = f"{'perm' if design == 'permuted' else 'key'}_{j}"
        with conn.transaction():
            for setting in ("enable_seqscan", "enable_sort", "enable_bitmapscan"):
                conn.execute(f"SET LOCAL {setting} = off")
            conn.execute(f"SELECT count(*) FROM (SELECT {column} FROM {SCHEMA}.{design} ORDER BY {column}) s")


def main(argv: list[str] | None = None) -> None:
    global SCHEMA
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", required=True, help="a PostgreSQL 15 server (with pg_prewarm where it has it)")
    parser.add_argument("--archive", type=int, default=3_000_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=10, help="batches per design per pass (two passes)")
    parser.add_argument("--singles", type=int, default=300, help="single-probe lookups per design")
    parser.add_argument("--oracle", type=int, default=200, help="probes of the first batch checked by brute force")
    parser.add_argument("--state", choices=["cached", "buffers", "evicted"], default="cached")
    parser.add_argument("--keep", action="store_true",
                        help="keep the tables (reused when they hold --archive documents of --seed)")
    parser.add_argument("--schema", default=SCHEMA, help="the schema of the tables (dropped unless --keep)")
    parser.add_argument("--seed", type=int, default=20261127)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    if not re.fullmatch(r"[a-z_][a-z0-9_]*", args.schema):
        parser.error(f"--schema {args.schema!r}: lower-case letters, digits and _ only")
    SCHEMA = args.schema
    layout = BlockLayout.for_size(K, args.archive)
    rng = np.random.default_rng(args.seed)
    stored = random_u64(rng, args.archive)
    probe_rng = np.random.default_rng([args.seed, 1])
    loads = [load_average()]
    with psycopg.connect(args.database_url, autocommit=True) as conn:
        prewarm = conn.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'pg_prewarm'"
                               ).fetchone() is not None
        if prewarm:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_prewarm")
        else:
            log("this server has no pg_prewarm: each design's indexes are read into shared buffers by a full index scan")
        conn.execute("SET jit = off")
        conn.execute("SET enable_bitmapscan = off")  # index(-only) scans, as at scale, also on small tests
        kept = conn.execute(f"SELECT to_regclass('{SCHEMA}.built')").fetchone()[0]
        # kept tables are reused only when they hold this run's fingerprints: --archive and --seed alike (the
        # seed is not in a kept table of the script's first version: rebuilt)
        row = conn.execute(f"SELECT documents, (to_jsonb(b) ->> 'seed')::bigint, seconds FROM {SCHEMA}.built b"
                           ).fetchone() if kept else None
        if row and row[:2] == (args.archive, args.seed):
            log(f"reusing the tables of {args.archive:,} (seed {args.seed}) in {SCHEMA}")
            seconds = row[2]
        else:
            if row:
                drawn = f"seed {row[1]}" if row[1] is not None else "no recorded seed"
                log(f"the tables kept in {SCHEMA} hold {row[0]:,} documents of {drawn}, not {args.archive:,} "
                    f"of seed {args.seed}: rebuilding them")
            log(f"building {args.archive:,} documents, {layout.describe()}")
            seconds = build(conn, layout, stored, args.seed)
        settings = {name: conn.execute(f"SHOW {name}").fetchone()[0] for name in ("shared_buffers", "server_version")}
        sizes = {d: conn.execute("SELECT sum(pg_relation_size(indexrelid)) FROM pg_index WHERE indrelid = %s::regclass",
                                 (f"{SCHEMA}.{d}",)).fetchone()[0] for d in DESIGNS}
        designs = {name: Design(name, layout) for name in DESIGNS}
        # correctness: every design's pairs equal, and equal to brute force for the oracle's probes
        # the first batch leads with probes only one key can find (each key in turn, at distance K and K + 1),
        # so that a key whose probe is wrong loses pairs that no other key finds
        singled, sources, distances = one_key_only(probe_rng, stored, layout, per_key=2)
        first = np.concatenate([singled, near_and_random(probe_rng, stored, args.batch)])
        results = {name: design.run(conn, first) for name, design in designs.items()}
        ahead, half = len(singled), args.batch // 2
        sample = np.concatenate([np.arange(ahead), ahead + np.arange(min(args.oracle // 2, half)),
                                 ahead + half + np.arange(min(args.oracle // 2, args.batch - half))])
        oracle = {(int(i), int(hit) + 1) for i in sample.tolist()
                  for hit in np.flatnonzero(hamming_array(stored, int(first[i])) <= K)}
        assert oracle, "no sampled probe has a match by brute force: the check would pass any design"
        for i, (source, distance) in enumerate(zip(sources.tolist(), distances.tolist())):
            assert ((i, source + 1) in oracle) == (distance <= K), f"probe {i} at distance {distance} of {source}"
        sampled = set(sample.tolist())
        for name, found in results.items():
            mine = {(i, doc) for i, doc in found if i in sampled}
            if mine != oracle or found != results["today"]:
                missed = sorted({layout.keys[i % len(layout.keys)] for i, _ in oracle - mine if i < ahead})
                raise SystemExit(f"{name}: pairs differ from brute force or from today's design "
                                 f"({len(mine)} against {len(oracle)} sampled; {len(found)} against "
                                 f"{len(results['today'])}; pairs only these keys find missed: {missed})")
        log(f"pairs agree: {len(results['today']):,} in the first batch; {len(oracle):,} sampled pairs by brute force, "
            f"{ahead} probes that one key alone can find (each key at distance {K} and {K + 1})")
        rates: dict[str, list[float]] = {name: [] for name in DESIGNS}
        singles: dict[str, list[float]] = {name: [] for name in DESIGNS}
        touched: dict[str, tuple[int, int, float]] = {}
        for order in (list(DESIGNS), list(reversed(DESIGNS))):
            for name in order:
                design = designs[name]
                files = relation_files(conn, name) if args.state == "evicted" else []
                warm(conn, name, len(layout.keys), prewarm)
                loads.append(load_average())
                for _ in range(args.rounds):
                    batch = near_and_random(probe_rng, stored, args.batch)
                    evict(files)
                    started = time.perf_counter()
                    design.run(conn, batch)
                    rates[name].append(args.batch / (time.perf_counter() - started))
                evict(files)
                touched[name] = design.buffers(conn, near_and_random(probe_rng, stored, args.batch))
                for fp in near_and_random(probe_rng, stored, args.singles // 2):
                    evict(files)
                    started = time.perf_counter()
                    design.run(conn, np.array([fp], dtype=np.uint64))
                    singles[name].append(time.perf_counter() - started)
                log(f"  {name}: batches {', '.join(f'{r:,.0f}' for r in rates[name][-args.rounds:])} q/s, "
                    f"single p50 {statistics.median(singles[name]) * 1e3:.2f} ms, buffers {touched[name]} "
                    f"(load {loads[-1]})")
        if not args.keep:
            conn.execute(f"DROP SCHEMA {SCHEMA} CASCADE")
    loads.append(load_average())
    keys = len(layout.keys)
    header = [f"{command_line('bench_key_entries.py')}",
              f"PostgreSQL {settings['server_version']}, shared_buffers {settings['shared_buffers']}; state: "
              f"{args.state}; indexes read in before each design's batches by "
              f"{'pg_prewarm' if prewarm else 'a full index scan (no pg_prewarm on this server)'}; "
              f"{args.archive:,} documents, {layout.describe()}; batches of {args.batch:,} new probes "
              f"(half 1-bit near copies), {2 * args.rounds} per design; load before each design's batches: "
              + " | ".join(loads)]
    print("\n".join(f"- {line}" for line in header) + "\n")
    print(f"| design | index bytes ({len(layout.keys)} indexes) | bytes per document and key | index build s | batch q/s "
          "(median; min-max) | single probe p50 | a batch's shared hit / read | its statement, EXPLAIN ANALYZE |"
          "\n|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, label in DESIGNS.items():
        print(f"| {name}: {label} | {sizes[name] / 2**20:,.0f} MiB | {sizes[name] / args.archive / keys:.1f} | "
              f"{seconds[name]:.0f} | {statistics.median(rates[name]):,.0f} ({min(rates[name]):,.0f}-"
              f"{max(rates[name]):,.0f}) | {statistics.median(singles[name]) * 1e3:.2f} ms | "
              f"{touched[name][0]:,} / {touched[name][1]:,} | {touched[name][2]:,.0f} ms |")


if __name__ == "__main__":
    main()
