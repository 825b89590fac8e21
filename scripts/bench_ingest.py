"""Benchmark simdb's ingest path against its peers, side by side in one run.

It measures, on this machine, in one run:

* fingerprinting with jieba on real Chinese text (``--zh``, default the devset's
  ``long-zh.jsonl``, repeated so that each measurement lasts ``--min-seconds``):
  ``simdb.parallel.fingerprint_stream`` on one worker and on all cores, beside plain
  ``jieba.lcut(text, HMM=False)`` on one core and on all cores (a warm ``spawn`` pool,
  jieba loaded once per worker), in docs/s and MB/s (UTF-8); and the target
  0.8 x (single-core jieba x cores);
* the archive path without tokenization: precomputed random fingerprints (1 % of them
  near copies of stored ones) through ``Index.add_fingerprinted``, one transaction per
  chunk: ``--documents`` (1M) into an empty archive, and ``--added`` (100k) into an
  archive of ``--archive`` (10M) rows. The big archive is built as one segment by a
  binary ``COPY ... FREEZE`` into the bare segment table, indexed from simdb's own
  definitions, attached, and ``VACUUM ANALYZE``d (``bench_common.bulk_load``); its
  layout is ``BlockLayout.for_size(k, archive)`` (k = 4, simdb's default: 6 blocks at 10M;
  ``--max-distance 3``: 5 blocks), and the smallest layout for k (``BlockLayout(max_distance=k)``)
  is measured the same way unless ``--no-default-layout``;
* the naive path: ``--naive`` documents, each with one SELECT on the block keys,
  popcount in Python and one INSERT through SQLAlchemy Core, one commit per document,
  into the same big archive;
* the PyPI ``simhash`` package's in-memory ``SimhashIndex(k)``: insert and query
  rates and RSS growth for ``--peer-documents`` (1M) ``Simhash(int)`` objects;
* end to end: the ``simdb ingest`` CLI in a subprocess (``--workers`` = all cores) on
  ``--text-documents`` (100k) documents of real text (devset sentences recombined,
  2 % near copies) into an empty archive; and its peak memory on ``--memory-documents``
  (200k and 1M) short documents, read from /proc while it runs (the CLI process, each
  fingerprint worker, and the sum over the process tree) .

The script only prints (progress on stderr, the table on stdout) and asserts nothing
about timings. It works in its own schemas (``simdb_bench_ingest_*``), dropped at the
start and at the end, and in a temporary directory removed at the end.

Run (about 25 minutes at 10M on 2 cores; ``--archive 1000000 --quick`` takes a few)::

    .venv/bin/python scripts/bench_ingest.py --markdown

Without ``--database-url`` it uses ``SIMDB_DATABASE_URL`` or
postgresql://postgres@127.0.0.1:5432/test, and if nothing answers there it starts an
embedded PostgreSQL (pgserver) in a temporary directory.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import multiprocessing
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict, deque
from pathlib import Path

import numpy as np
import sqlalchemy as sa

from bench_common import (DATABASE_HELP, Server, bulk_load, checkpoint, log, print_table, random_u64, rate,
                          ratio, rss_bytes)

import simdb
from simdb.ingest import DEFAULT_CHUNK_SIZE, FingerprintedBatch
from simdb.inputs import Document
from simdb.methods.simhash import SimHash
from simdb.methods.simhash.blocks import DEFAULT_MAX_DISTANCE, BlockLayout
from simdb.parallel import default_workers, fingerprint_stream
from simdb.pg import segments

PREFIX = "simdb_bench_ingest"
SCHEMAS = {name: f"{PREFIX}_{name}" for name in ("empty", "archive", "archive_default", "text", "small", "large")}
REPO = Path(__file__).resolve().parent.parent
DEFAULT_ZH = Path(os.environ.get("SIMDB_DEVSET", REPO.parent / "shared" / "devset")) / "docs" / "long-zh.jsonl"
K = DEFAULT_MAX_DISTANCE  # --max-distance sets it for the whole run
NEAR_FRACTION = 0.01  # of the fingerprinted documents: near copies (1..K bits flipped) of stored ones
SETTINGS = ("server_version", "shared_buffers", "max_wal_size", "checkpoint_timeout", "synchronous_commit",
            "autovacuum")


# -- helpers -------------------------------------------------------------------------------------

def mb(count_bytes: float) -> str:
    return f"{count_bytes / 2**20:,.0f} MB"


def docs_and_mb(documents: int, size: int, seconds: float) -> str:
    return f"{documents / seconds:,.0f} docs/s, {size / seconds / 1e6:.2f} MB/s"


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def drop_schemas(admin: sa.Engine) -> None:
    with admin.connect() as c:
        for schema in SCHEMAS.values():
            c.exec_driver_sql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def drop_schema(admin: sa.Engine, schema: str) -> None:
    with admin.connect() as c:
        c.exec_driver_sql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


# -- fingerprinting: simdb against plain jieba ---------------------------------------------------

def load_texts(path: Path) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f if line.strip()]


def _start_jieba() -> None:
    """Pool initializer: load jieba's dictionary once per worker."""
    import logging

    import jieba

    jieba.setLogLevel(logging.WARNING)
    jieba.initialize()


def _lcut_all(texts: list[str]) -> int:
    import jieba

    return sum(len(jieba.lcut(text, HMM=False)) for text in texts)


def _ready(_: int) -> int:
    time.sleep(0.5)  # long enough that every worker takes one: then all have run their initializer
    return os.getpid()


def repeated(texts: list[str], passes: int):
    for _ in range(passes):
        yield from texts


def measure_fingerprinting(texts: list[str], workers: int, min_seconds: float) -> dict:
    """docs, bytes and seconds of plain jieba and of simdb's fingerprint_stream, on one core and on ``workers``."""
    sizes = [len(text.encode("utf-8")) for text in texts]
    m: dict = {"set": len(texts), "set_bytes": sum(sizes), "workers": workers}

    _start_jieba()
    _lcut_all(texts[:20])
    log(f"plain jieba.lcut(HMM=False), 1 core, at least {min_seconds:.0f} s")
    passes, start = 0, time.perf_counter()
    while time.perf_counter() - start < min_seconds:
        _lcut_all(texts)
        passes += 1
    m["jieba1"] = (passes * len(texts), passes * m["set_bytes"], time.perf_counter() - start)
    single = m["jieba1"][0] / m["jieba1"][2]
    m["passes1"] = passes
    # enough passes that the all-core measurements last min_seconds too
    m["passes"] = max(1, math.ceil(min_seconds * single * workers / len(texts)))

    log(f"plain jieba.lcut on {workers} cores (spawn pool, {m['passes']} passes)")
    context = multiprocessing.get_context("spawn")
    with context.Pool(workers, initializer=_start_jieba) as pool:
        if len(set(pool.map(_ready, range(workers), chunksize=1))) < workers:
            log("warning: not every pool worker answered the warm-up")
        tasks = [texts[i:i + 64] for i in range(0, len(texts), 64)]
        start = time.perf_counter()
        for _ in pool.imap_unordered(_lcut_all, (task for _ in range(m["passes"]) for task in tasks)):
            pass
        m["jieba_n"] = (m["passes"] * len(texts), m["passes"] * m["set_bytes"], time.perf_counter() - start)

    settings = SimHash.new()  # what `simdb init` stores by default: auto tokenizer, jieba without HMM
    for count, key in ((1, "simdb1"), (workers, "simdb_n")):  # with one worker the second repeats the first
        passes = m["passes1"] if count == 1 else m["passes"]
        log(f"simdb fingerprint_stream(workers={count}), {passes} passes")
        if count == 1:
            list(fingerprint_stream([Document("warm", texts[0])], settings, workers=1))  # load jieba in-process
        documents = (Document(f"d{i}", text) for i, text in enumerate(repeated(texts, passes)))
        done, first, start = 0, None, time.perf_counter()
        for item in fingerprint_stream(documents, settings, workers=count):
            if first is None:
                first = time.perf_counter() - start
            done += 1
            if isinstance(item, simdb.InputError):
                raise RuntimeError(f"fingerprinting failed: {item}")
        seconds = time.perf_counter() - start
        m[key], m[f"{key}_first"] = (done, passes * m["set_bytes"], seconds), first
    return m


# -- fingerprinted batches -----------------------------------------------------------------------

def near_copies(rng: np.random.Generator, source: np.ndarray, count: int) -> np.ndarray:
    """``count`` fingerprints, each a random one of ``source`` with 1..K random bits flipped."""
    picks = source[rng.integers(0, len(source), count)]
    masks = [sum(1 << int(b) for b in rng.choice(64, int(d), replace=False)) for d in rng.integers(1, K + 1, count)]
    return picks ^ np.array(masks, dtype=np.uint64)


def new_fingerprints(rng: np.random.Generator, count: int, stored: np.ndarray | None) -> np.ndarray:
    """Random fingerprints, NEAR_FRACTION of them near copies of ``stored`` (or of their own earlier part)."""
    fps = random_u64(rng, count)
    planted = int(count * NEAR_FRACTION)
    if planted:
        source = stored if stored is not None and len(stored) else fps[:count - planted]
        fps[count - planted:] = near_copies(rng, source, planted)
        fps = fps[rng.permutation(count)]
    return fps


def fingerprinted_batch(rng: np.random.Generator, fps: np.ndarray, prefix: str) -> FingerprintedBatch:
    n = len(fps)
    ids = [f"{prefix}-{i:09d}" for i in range(n)]
    digests = rng.bytes(16 * n)
    return FingerprintedBatch(external_ids=ids, sketches=fps.tolist(),
                              content_hashes=[digests[16 * i:16 * i + 16] for i in range(n)],
                              lengths=rng.integers(200, 5000, n).tolist(), metadata=[{}] * n, origins=ids)


class StatementTimer:
    """Seconds per SQL statement run through SQLAlchemy on ``engine`` (COPYs on the raw cursor are not seen)."""

    def __init__(self, engine: sa.Engine) -> None:
        self.engine, self.seconds, self.started = engine, defaultdict(float), {}

    def _before(self, conn, cursor, statement, parameters, context, executemany):
        self.started[id(cursor)] = time.perf_counter()

    def _after(self, conn, cursor, statement, parameters, context, executemany):
        key = " ".join(statement.split())[:70]
        self.seconds[key] += time.perf_counter() - self.started.pop(id(cursor), time.perf_counter())

    def __enter__(self) -> "StatementTimer":
        sa.event.listen(self.engine, "before_cursor_execute", self._before)
        sa.event.listen(self.engine, "after_cursor_execute", self._after)
        return self

    def __exit__(self, *exc_info) -> None:
        sa.event.remove(self.engine, "before_cursor_execute", self._before)
        sa.event.remove(self.engine, "after_cursor_execute", self._after)

    def top(self, count: int = 4) -> list[tuple[str, float]]:
        return sorted(self.seconds.items(), key=lambda item: -item[1])[:count]


# -- the archive path: into an empty archive ------------------------------------------------------

def ingest_empty(url: str, admin: sa.Engine, args, rng: np.random.Generator) -> dict:
    """``args.documents`` fingerprints into an empty archive, ``args.chunk`` per add_fingerprinted call."""
    layout = BlockLayout.for_size(K, args.documents)
    schema = SCHEMAS["empty"]
    m = {"layout": layout, "documents": 0, "seconds": 0.0, "chunks": [], "duplicates": 0, "planted": 0}
    stored = np.empty(0, dtype=np.uint64)
    checkpoint(admin)
    with simdb.Index.create(url, schema=schema, blocks=layout.blocks, max_distance=K) as index:
        for number, first in enumerate(range(0, args.documents, args.chunk)):
            count = min(args.chunk, args.documents - first)
            fps = new_fingerprints(rng, count, stored)
            batch = fingerprinted_batch(rng, fps, f"e{number:03d}")
            summary = index.add_fingerprinted(batch, batch=f"empty-{number}")
            log(f"  {summary} ({count / summary.seconds:,.0f} docs/s)")
            m["documents"] += count
            m["seconds"] += summary.seconds
            m["chunks"].append(count / summary.seconds)
            m["duplicates"] += summary.near_duplicates + summary.exact_duplicates
            m["planted"] += int(count * NEAR_FRACTION)
            stored = np.concatenate([stored, fps])
            del batch
    drop_schema(admin, schema)
    return m


# -- the big archive: bulk load, then the same add_fingerprinted ----------------------------------

def build_archive(url: str, admin: sa.Engine, schema: str, layout: BlockLayout, size: int,
                  rng: np.random.Generator) -> tuple[np.ndarray, dict]:
    """simdb's schema with ``size`` random rows as one sealed segment (bench_common.bulk_load)."""
    return bulk_load(url, admin, schema, layout, size, rng, K)


def ingest_into(url: str, admin: sa.Engine, schema: str, stored: np.ndarray, count: int, prefix: str,
                rng: np.random.Generator) -> dict:
    """Time one add_fingerprinted of ``count`` new fingerprints into the archive in ``schema``."""
    fps = new_fingerprints(rng, count, stored)
    batch = fingerprinted_batch(rng, fps, prefix)
    checkpoint(admin)  # the bulk load's dirty pages are flushed now, not during the timed ingest
    before = wal_position(admin)
    with simdb.Index.open(url, schema=schema) as index:
        with StatementTimer(index.database.engine) as timer:
            summary = index.add_fingerprinted(batch, batch=prefix)
    wal = wal_since(admin, before)
    log(f"  {summary} ({count / summary.seconds:,.0f} docs/s); WAL written meanwhile (whole server): "
        f"{mb(wal[0])}, {wal[1]:,} full-page images")
    for statement, seconds in timer.top():
        log(f"    {seconds:6.2f} s  {statement}")
    return {"documents": count, "seconds": summary.seconds, "planted": int(count * NEAR_FRACTION),
            "duplicates": summary.near_duplicates + summary.exact_duplicates, "statements": timer.top(),
            "sql_seconds": sum(timer.seconds.values()), "wal": wal}


def wal_position(admin: sa.Engine) -> tuple[str, int]:
    with admin.connect() as c:
        return (c.exec_driver_sql("SELECT pg_current_wal_lsn()::text").scalar_one(),
                c.exec_driver_sql("SELECT wal_fpi FROM pg_stat_wal").scalar_one())


def wal_since(admin: sa.Engine, before: tuple[str, int]) -> tuple[int, int]:
    """(WAL bytes, full-page images) written by the whole server since ``before``."""
    time.sleep(1.0)  # backends report their WAL counters at most about once a second
    with admin.connect() as c:
        written = c.execute(sa.text("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), CAST(:lsn AS pg_lsn))"),
                            {"lsn": before[0]}).scalar_one()
        return int(written), c.exec_driver_sql("SELECT wal_fpi FROM pg_stat_wal").scalar_one() - before[1]


def naive_ingest(url: str, schema: str, layout: BlockLayout, stored: np.ndarray, count: int,
                 rng: np.random.Generator) -> dict:
    """Per document: one SELECT on the block keys, popcount in Python, one INSERT; a commit per document.

    The tables are reflected from the database, so that the rows are complete whatever the schema
    revision: with ``cluster_id`` (revision 0003) the new id comes from the sequence first and a
    duplicate joins its earliest match's cluster; with ``near_duplicates`` every match is stored as a pair.
    """
    fps = new_fingerprints(rng, count, stored)
    digests = rng.bytes(16 * count)
    duplicates = 0
    with simdb.Index.open(url, schema=schema) as index:
        engine = index.database.engine
        metadata = sa.MetaData()
        with engine.connect() as c:
            documents = sa.Table("documents", metadata, schema=schema, autoload_with=c)
            batches = sa.Table("batches", metadata, schema=schema, autoload_with=c)
            pairs = (sa.Table("near_duplicates", metadata, schema=schema, autoload_with=c)
                     if sa.inspect(c).has_table("near_duplicates", schema=schema) else None)
        clustered = "cluster_id" in documents.c
        lookup = sa.select(documents.c.id, documents.c.simhash, *([documents.c.cluster_id] if clustered else [])).where(
            sa.or_(*(documents.c[column] == sa.bindparam(column) for column in layout.key_columns)))
        next_id = sa.select(sa.func.nextval(sa.func.pg_get_serial_sequence(f"{schema}.documents", "id")))
        insert = documents.insert()
        with engine.begin() as c:
            batch_id = c.execute(batches.insert().values(name="naive", source="bench", status="running",
                                                         started_at=sa.func.now()).returning(batches.c.id)).scalar_one()
            first = c.execute(sa.text("SELECT last_value + 1 FROM documents_id_seq")).scalar_one()
            segments.ensure_segments(c, segments.load_policy(c), segments.list_segments(c), first,
                                     first + count - 1)  # the naive client's rows need a segment too
        start = time.perf_counter()
        for i, fp in enumerate(fps.tolist()):
            keys = dict(zip(layout.key_columns, layout.block_keys(fp)))
            with engine.begin() as c:
                rows = c.execute(lookup, keys).all()
                found = sorted((row.id, ((row.simhash & 0xFFFF_FFFF_FFFF_FFFF) ^ fp).bit_count(), row)
                               for row in rows)
                found = [(d, distance, row) for d, distance, row in found if distance <= K]
                duplicates += bool(found)
                row = {"external_id": f"naive-{i:09d}", "batch_id": batch_id,
                       "simhash": fp - (1 << 64) if fp >> 63 else fp, **keys,
                       "content_hash": digests[16 * i:16 * i + 16], "length": 1000, "metadata": {},
                       "duplicate_of": found[0][0] if found else None,
                       "duplicate_distance": found[0][1] if found else None}
                if clustered or (pairs is not None and found):
                    row["id"] = c.execute(next_id).scalar_one()
                if clustered:
                    row["cluster_id"] = found[0][2].cluster_id if found else row["id"]
                c.execute(insert, row)
                if pairs is not None and found:
                    c.execute(pairs.insert(), [{"a_id": d, "b_id": row["id"], "distance": distance,
                                                "batch_id": batch_id} for d, distance, _ in found])
        seconds = time.perf_counter() - start
    log(f"  naive: {count:,} documents in {seconds:.1f} s ({count / seconds:,.0f} docs/s), "
        f"{duplicates:,} near-duplicates (planted {int(count * NEAR_FRACTION):,})")
    return {"documents": count, "seconds": seconds, "duplicates": duplicates}


def measure_archive(url: str, admin: sa.Engine, args, rng: np.random.Generator) -> dict:
    """The big archive in the for_size layout (plus the naive path), then in the default layout."""
    m = {}
    layouts = [("archive", BlockLayout.for_size(K, args.archive))]
    if args.default_layout and layouts[0][1] != BlockLayout(max_distance=K, blocks=K + 1):
        layouts.append(("archive_default", BlockLayout(max_distance=K, blocks=K + 1)))
    for name, layout in layouts:
        schema = SCHEMAS[name]
        log(f"building an archive of {args.archive:,} rows ({layout.describe()})")
        stored, build = build_archive(url, admin, schema, layout, args.archive, rng)
        log(f"add_fingerprinted of {args.added:,} into {args.archive:,}")
        m[name] = ingest_into(url, admin, schema, stored, args.added, "added", rng) | {"layout": layout,
                                                                                      "build": build}
        if name == "archive" and args.naive:
            log(f"naive ingest of {args.naive:,} documents through SQLAlchemy Core into the same archive")
            m["naive"] = naive_ingest(url, schema, layout, stored, args.naive, rng)
        del stored
        drop_schema(admin, schema)
    return m


# -- the in-memory peer --------------------------------------------------------------------------

def simhash_peer(count: int, queries: int, rng: np.random.Generator) -> dict:
    """PyPI ``SimhashIndex(k=3)``: ``add`` of ``count`` ``Simhash(int)``, then ``get_near_dups``."""
    from simhash import Simhash, SimhashIndex

    fps = random_u64(rng, count)
    probes = np.concatenate([near_copies(rng, fps, queries // 2), random_u64(rng, queries - queries // 2)]).tolist()
    ids = [f"p{i}" for i in range(count)]
    gc.collect()
    before, start = rss_bytes(), time.perf_counter()
    index = SimhashIndex([], k=K)
    for external_id, value in zip(ids, fps.tolist()):
        index.add(external_id, Simhash(value))
    build, memory = time.perf_counter() - start, rss_bytes() - before
    seconds, found = [], 0
    for q in probes:
        start = time.perf_counter()
        found += bool(index.get_near_dups(Simhash(q)))
        seconds.append(time.perf_counter() - start)
    del index
    gc.collect()
    return {"documents": count, "build": build, "memory": memory, "queries": len(probes), "found": found,
            "query_seconds": sum(seconds), "p50": float(np.percentile(seconds, 50))}


# -- end to end: the CLI in a subprocess ----------------------------------------------------------

SENTENCE = re.compile(r"[^。！？；\n]+[。！？；]?")


def corpus_pieces(texts: list[str] | None, rng: random.Random) -> tuple[list[str], list[int]]:
    """(sentences, document lengths in characters) to compose documents from; random Han text without a corpus."""
    if texts:
        sentences = [s.strip() for text in texts for s in SENTENCE.findall(text) if len(s.strip()) >= 4]
        return sentences, [len(text) for text in texts]
    han = [chr(c) for c in range(0x4E00, 0x9FA6)]
    return ["".join(rng.choices(han, k=rng.randint(8, 40))) + "。" for _ in range(50_000)], [1200]


def write_corpus(path: str, count: int, sentences: list[str], lengths: list[int], rng: random.Random,
                 near: float = 0.02) -> int:
    """``count`` JSONL documents of recombined sentences (``near`` of them lightly edited copies); returns bytes."""
    recent: deque[str] = deque(maxlen=2000)
    han = "的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动同工也能下过子说产种面而方后多定行学法所"
    with open(path, "w", encoding="utf-8") as f:
        for i in range(count):
            if recent and rng.random() < near:
                chars = list(rng.choice(recent))
                for _ in range(rng.randint(1, 3)):
                    chars[rng.randrange(len(chars))] = rng.choice(han)
                text = "".join(chars)
            else:
                target, parts, size = rng.choice(lengths), [], 0
                while size < target:
                    parts.append(rng.choice(sentences))
                    size += len(parts[-1])
                text = "".join(parts)
            recent.append(text)
            f.write(json.dumps({"id": f"doc-{i:09d}", "text": text}, ensure_ascii=False) + "\n")
    return os.path.getsize(path)


def process_tree(root: int) -> list[int]:
    children = defaultdict(list)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    children[int(f.read().rsplit(")", 1)[1].split()[1])].append(int(entry))
            except (OSError, IndexError, ValueError):
                continue
    tree, stack = [], [root]
    while stack:
        pid = stack.pop()
        tree.append(pid)
        stack.extend(children.get(pid, ()))
    return tree


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far, 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def memory_kb(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of a process in kB, (0, 0) once it is gone."""
    values = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    values[line[:5]] = int(line.split()[1])
    except OSError:
        pass
    return values.get("VmRSS", 0), values.get("VmHWM", 0)


def run_cli(command: list[str], log_path: str) -> dict:
    """Run ``command``, sampling the memory of its process tree every 0.2 s; wall time, peaks and exit status."""
    with open(log_path, "w") as output:
        start = time.perf_counter()
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        peaks: dict[int, int] = {}
        cpu: dict[int, float] = {}  # last seen CPU seconds per process (misses the last 0.2 s)
        tree_peak, timeline = 0, []  # timeline: (seconds, VmRSS of the CLI process)
        while True:
            pid, status, _ = os.wait4(process.pid, os.WNOHANG)
            if pid:
                break
            total = 0
            for member in process_tree(process.pid):
                rss, hwm = memory_kb(member)
                total += rss
                peaks[member] = max(peaks.get(member, 0), hwm)
                cpu[member] = max(cpu.get(member, 0.0), cpu_seconds(member))
                if member == process.pid:
                    timeline.append((time.perf_counter() - start, rss))
            tree_peak = max(tree_peak, total)
            time.sleep(0.2)
        seconds = time.perf_counter() - start
        process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode:
        with open(log_path) as f:
            tail = f.read()[-3000:]
        raise RuntimeError(f"{' '.join(command)} exited with {process.returncode}:\n{tail}")
    # (wait4's ru_maxrss is no use here: it keeps the high-water mark of the forked child before exec,
    # that is of this big benchmark process)
    workers = [kb for member, kb in peaks.items() if member != process.pid]
    quarters = [max((rss for at, rss in timeline if q * seconds / 4 <= at < (q + 1) * seconds / 4), default=0) * 1024
                for q in range(4)]  # the CLI's largest sampled RSS in each quarter of the run: flat or growing?
    return {"seconds": seconds, "main": peaks.get(process.pid, 0) * 1024, "worker": max(workers, default=0) * 1024,
            "processes": len(peaks), "tree": tree_peak * 1024, "quarters": quarters,
            "cpu_main": cpu.get(process.pid, 0.0), "cpu_children": sum(cpu.values()) - cpu.get(process.pid, 0.0)}


def quarters(run: dict) -> str:
    return " / ".join(f"{q / 2**20:,.0f}" for q in run["quarters"]) + " MB"


def simdb_command() -> list[str]:
    script = Path(sys.executable).with_name("simdb")
    return [str(script)] if script.exists() else [sys.executable, "-c", "from simdb.cli import main; main()"]


def cli_ingest(url: str, admin: sa.Engine, schema: str, path: str, documents: int, size: int, args,
               directory: str) -> dict:
    common = ["--database-url", url, "--schema", schema]
    subprocess.run([*simdb_command(), "init", *common, "--max-distance", str(K)], check=True,
                   stdout=subprocess.DEVNULL)
    command = [*simdb_command(), "ingest", path, *common, "--workers", str(args.workers), "--batch", "bench",
               "--chunk-size", str(args.cli_chunk_size)]
    m = run_cli(command, os.path.join(directory, f"{schema}.log"))
    with admin.connect() as c:
        stored, duplicates = c.exec_driver_sql(
            f"SELECT count(*), count(duplicate_of) FROM {schema}.documents").one()
        pairs = (c.exec_driver_sql(f"SELECT count(*) FROM {schema}.near_duplicates").scalar_one()
                 if sa.inspect(c).has_table("near_duplicates", schema=schema) else None)
    drop_schema(admin, schema)
    if stored != documents:
        raise RuntimeError(f"the CLI stored {stored:,} of {documents:,} documents")
    log(f"  {documents:,} documents in {m['seconds']:.1f} s ({documents / m['seconds']:,.0f} docs/s), "
        f"{duplicates:,} marked duplicates" + (f", {pairs:,} stored pairs" if pairs is not None else "")
        + f"; peak RSS: CLI {mb(m['main'])} (by quarter of the run: {quarters(m)}), largest worker "
        f"{mb(m['worker'])}, tree {mb(m['tree'])} ({m['processes']} processes); CPU: CLI process "
        f"{m['cpu_main']:.0f} s, its children {m['cpu_children']:.0f} s, of {m['seconds']:.0f} s")
    return m | {"documents": documents, "bytes": size, "duplicates": duplicates, "pairs": pairs}


def measure_cli(url: str, admin: sa.Engine, texts: list[str] | None, args, directory: str) -> dict:
    rng = random.Random(args.seed)
    sentences, lengths = corpus_pieces(texts, rng)
    m = {}
    if texts and args.text_documents:
        path = os.path.join(directory, "text.jsonl")
        log(f"writing {args.text_documents:,} documents of real text")
        size = write_corpus(path, args.text_documents, sentences, lengths, rng)
        log(f"simdb ingest --workers {args.workers}: {args.text_documents:,} documents, {mb(size)}")
        m["text"] = cli_ingest(url, admin, SCHEMAS["text"], path, args.text_documents, size, args, directory)
        os.remove(path)
    for name, count in zip(("small", "large"), args.memory_documents):
        path = os.path.join(directory, f"{name}.jsonl")
        log(f"writing {count:,} short documents")
        size = write_corpus(path, count, sentences, list(range(60, 200)), rng)
        log(f"simdb ingest --workers {args.workers}: {count:,} short documents, {mb(size)}")
        m[name] = cli_ingest(url, admin, SCHEMAS[name], path, count, size, args, directory)
        os.remove(path)
    return m


# -- report --------------------------------------------------------------------------------------

def fingerprint_rows(f: dict) -> list[tuple[str, str, str, str]]:
    n = f["workers"]
    jieba1, jieba_n, simdb1, simdb_n = f["jieba1"], f["jieba_n"], f["simdb1"], f["simdb_n"]
    single = jieba1[0] / jieba1[2]
    target = 0.8 * single * n
    steady = (simdb_n[0] - 1) / (simdb_n[2] - f["simdb_n_first"])
    return [
        ("fingerprint zh text, 1 core: `fingerprint_stream(workers=1)`", docs_and_mb(*simdb1),
         f"plain `jieba.lcut(text, HMM=False)`, 1 core: {docs_and_mb(*jieba1)}",
         ratio(simdb1[0] / simdb1[2] / single)),
        (f"fingerprint zh text, {n} cores: `fingerprint_stream(workers={n})`",
         f"{docs_and_mb(*simdb_n)} (first result after {f['simdb_n_first']:.1f} s: spawn, jieba load; "
         f"{steady:,.0f} docs/s after it)",
         f"plain `jieba.lcut` on {n} cores (warm spawn pool): {docs_and_mb(*jieba_n)}",
         ratio(simdb_n[0] / simdb_n[2] / (jieba_n[0] / jieba_n[2]))),
        (f"fingerprint zh text, {n} cores, steady state (after the pool's start): against the target",
         f"{steady:,.0f} docs/s", f"target 0.8 x 1-core jieba x {n} cores = {target:,.0f} docs/s (with the pool's "
         f"start counted: {ratio(simdb_n[0] / simdb_n[2] / target)})", ratio(steady / target)),
    ]


def table_rows(f: dict | None, e: dict | None, a: dict | None, peer: dict | None, c: dict | None,
               args) -> list[tuple[str, str, str, str]]:
    rows = fingerprint_rows(f) if f else []
    big = a.get("archive") if a else None
    if e:
        simdb_rate = e["documents"] / e["seconds"]
        chunks = e["chunks"]
        rows.append((f"archive path: {e['documents']:,} docs into an empty archive "
                     f"({len(chunks)} x `add_fingerprinted` of {args.chunk:,}; {e['layout'].blocks} blocks)",
                     f"{simdb_rate:,.0f} docs/s (first chunk {chunks[0]:,.0f}, last {chunks[-1]:,.0f})",
                     f"PyPI simhash `SimhashIndex(k={K}).add`, in memory, {peer['documents']:,}: "
                     f"{rate(peer['documents'], peer['build'], 'inserts')}, +{mb(peer['memory'])} RSS"
                     if peer else "", ratio(simdb_rate / (peer["documents"] / peer["build"])) if peer else ""))
    if big:
        simdb_rate = big["documents"] / big["seconds"]
        rows.append((f"archive path: {big['documents']:,} docs into an archive of {args.archive:,} "
                     f"({big['layout'].blocks} blocks, one `add_fingerprinted`)", f"{simdb_rate:,.0f} docs/s",
                     "target 30,000 docs/s", ratio(simdb_rate / 30_000)))
        if "naive" in a:
            naive = a["naive"]
            rows.append((f"the same, naive: per doc one SELECT on the {len(big['layout'].key_columns)} keys, "
                         "popcount in Python, one INSERT (SQLAlchemy Core, commit per doc)",
                         f"{simdb_rate:,.0f} docs/s",
                         f"naive, {naive['documents']:,} docs into the same archive: "
                         f"{rate(naive['documents'], naive['seconds'], 'docs')} (100k would take "
                         f"{100_000 * naive['seconds'] / naive['documents'] / 60:,.0f} min); target 20x",
                         ratio(simdb_rate / (naive["documents"] / naive["seconds"]))))
        default = a.get("archive_default")
        if default:
            default_rate = default["documents"] / default["seconds"]
            rows.append((f"archive path: {default['documents']:,} docs into {args.archive:,}, default "
                         f"{default['layout'].blocks}-block layout", f"{default_rate:,.0f} docs/s",
                         f"{big['layout'].blocks}-block layout (above): {simdb_rate:,.0f} docs/s",
                         ratio(default_rate / simdb_rate)))
        if peer:
            rows.append((f"per-document near-duplicate lookup (simdb: lookup + insert, at {args.archive:,})",
                         f"{simdb_rate:,.0f} docs/s",
                         f"PyPI simhash `get_near_dups`, {peer['documents']:,} in memory: "
                         f"{rate(peer['queries'], peer['query_seconds'], 'queries')}, p50 {peer['p50'] * 1e3:.2f} ms",
                         ratio(simdb_rate / (peer["queries"] / peer["query_seconds"]))))
    elif peer:
        rows.append(("PyPI simhash `SimhashIndex` queries", "",
                     f"`get_near_dups`: {rate(peer['queries'], peer['query_seconds'], 'queries')}", ""))
    if c and "text" in c:
        t = c["text"]
        peer_text = ""
        value = ""
        if f:
            jieba_n = f["jieba_n"]
            peer_text = (f"plain `jieba.lcut` on {f['workers']} cores (warm pool, devset docs): "
                         f"{docs_and_mb(*jieba_n)}")
            value = ratio(t["bytes"] / t["seconds"] / (jieba_n[1] / jieba_n[2]))
        rows.append((f"end to end: `simdb ingest --workers {args.workers}`, {t['documents']:,} real zh docs "
                     f"({t['bytes'] / t['documents'] / 1e3:.1f} KB avg) into an empty archive",
                     f"{docs_and_mb(t['documents'], t['bytes'], t['seconds'])} (CPU: CLI process "
                     f"{t['cpu_main']:.0f} s, workers {t['cpu_children']:.0f} s, in {t['seconds']:.0f} s)",
                     peer_text, value))
    if c and "large" in c:
        small, large = c["small"], c["large"]

        def cell(run: dict) -> str:
            pairs = f", {run['pairs']:,} pairs" if run["pairs"] is not None else ""
            return (f"{run['documents']:,} short docs ({run['duplicates']:,} duplicates{pairs}): CLI "
                    f"{mb(run['main'])} (by quarter of the run: {quarters(run)}), largest worker {mb(run['worker'])}, "
                    f"tree {mb(run['tree'])}; {rate(run['documents'], run['seconds'], 'docs')}")

        rows.append(("peak RSS of `simdb ingest` (CLI process; its fingerprint workers; sum over the tree)",
                     cell(large), cell(small), f"{large['main'] / small['main']:.2f}x"))
        if peer:
            rows.append(("memory: `simdb ingest` process against an in-memory index",
                         f"{mb(large['main'])} peak for {large['documents']:,} docs",
                         f"PyPI simhash, {peer['documents']:,} fingerprints: +{mb(peer['memory'])} RSS",
                         ratio(peer["memory"] / large["main"])))
    return rows


def header_lines(f, e, a, peer, c, args, server: dict, embedded: bool, load_start: str, zh_note: str) -> list[str]:
    memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30
    settings = ", ".join(f"{name} {value}" for name, value in server.items() if name != "server_version")
    lines = [
        f"machine: {os.cpu_count()} cores, {memory:.0f} GiB; PostgreSQL {server['server_version']}"
        f"{' (embedded)' if embedded else ''} ({settings}); simdb {simdb.__version__} "
        f"({os.path.dirname(simdb.__file__)}); Python {sys.version.split()[0]}; "
        f"load average at start {load_start}, at end {load_average()}",
    ]
    if f:
        lines.append(f"fingerprinting: {zh_note}, {f['set']:,} docs ({f['set_bytes'] / f['set'] / 1e3:.1f} KB avg), "
                     f"repeated {f['passes1']}x on 1 core and {f['passes']}x on {f['workers']}; simdb with the default "
                     "settings of `simdb init` (auto tokenizer: jieba without HMM, stop words, numpy SimHash); "
                     "the all-core simdb figure includes starting its spawn pool")
    else:
        lines.append(f"fingerprinting: skipped ({zh_note})")
    if e or a:
        lines.append(f"archive path (no tokenization): random 64-bit fingerprints, {NEAR_FRACTION:.0%} of each batch "
                     f"near copies (1..{K} bits) of stored ones, each batch one `Index.add_fingerprinted` call "
                     "(one transaction: staging COPY, key joins, popcount, INSERT ... SELECT)")
    if e:
        lines.append(f"empty archive: layout {e['layout'].describe()} (BlockLayout.for_size({K}, {args.documents:,})); "
                     f"marked {e['duplicates']:,} duplicates, planted {e['planted']:,}")
    if a:
        for name in ("archive", "archive_default"):
            if name in a:
                r, b = a[name], a[name]["build"]
                lines.append(
                    f"archive of {args.archive:,} ({r['layout'].describe()}): built as one segment by binary COPY FREEZE "
                    f"into the bare segment table ({b['copy']:.0f} s), simdb's own indexes and constraints from their "
                    f"definitions and ATTACH ({b['indexes']:.0f} s), VACUUM ANALYZE "
                    f"({b['vacuum']:.0f} s): {mb(b['bytes'])}; then CHECKPOINT; the {r['documents']:,} marked "
                    f"{r['duplicates']:,} duplicates (planted {r['planted']:,}); WAL meanwhile (whole server) "
                    f"{mb(r['wal'][0])}, {r['wal'][1]:,} full-page images; slowest statements: "
                    + "; ".join(f"{s:.1f} s `{q[:40]}`" for q, s in r["statements"][:2])
                    + f" (SQL statements {r['sql_seconds']:.1f} s of {r['seconds']:.1f} s; COPYs and Python the rest)")
    if peer:
        lines.append(f"PyPI simhash: {peer['documents']:,} random fingerprints as `Simhash(int)`; "
                     f"{peer['queries']:,} queries, half near copies ({peer['found']:,} found something)")
    if c:
        what = "real text" if "text" in c else "no real text"
        lines.append(f"end to end: the `simdb ingest` CLI in a subprocess, `--workers {args.workers} --chunk-size "
                     f"{args.cli_chunk_size:,}`, into a new empty archive (default 4 blocks), timed from start to exit "
                     f"(imports, jieba load, connection included); {what}: documents composed of random sentences "
                     "of the devset texts (lengths as in the devset; short docs 60-200 characters), 2 % of them "
                     "copies with 1-3 characters changed")
        lines.append("peak RSS: VmHWM of each process read from /proc every 0.2 s (CLI process; largest of its "
                     "children: spawn fingerprint workers and the resource tracker) and the largest sampled sum of "
                     "VmRSS over the tree (shared pages counted per process); PostgreSQL's own memory not counted; "
                     "ratio = larger input / smaller input (1.00x = flat)")
    lines.append("ratio: >1 means simdb is faster (or, for targets, meets it); "
                 f"total run {time.perf_counter() - STARTED_AT:.0f} s")
    lines.append("command: " + " ".join([".venv/bin/python", "scripts/bench_ingest.py", *sys.argv[1:]]))
    return lines


STARTED_AT = time.perf_counter()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", help=DATABASE_HELP)
    parser.add_argument("--zh", type=Path, default=DEFAULT_ZH, help="JSONL of real Chinese text ({id, text} lines)")
    parser.add_argument("--workers", type=int, default=default_workers(), help="cores to use (default: all)")
    parser.add_argument("--min-seconds", type=float, help="per fingerprinting measurement (default 10; quick 3)")
    parser.add_argument("--documents", type=int, help="into the empty archive (default 1,000,000; quick 200,000)")
    parser.add_argument("--chunk", type=int, default=DEFAULT_CHUNK_SIZE, help="documents per add_fingerprinted call")
    parser.add_argument("--archive", type=int, help="rows of the big archive (default 10,000,000)")
    parser.add_argument("--added", type=int, default=100_000, help="documents ingested into the big archive")
    parser.add_argument("--naive", type=int, help="documents through the naive path (default 5,000; quick 1,000)")
    parser.add_argument("--default-layout", action=argparse.BooleanOptionalAction, default=True,
                        help="also measure the big archive in the smallest layout for k (k + 1 blocks)")
    parser.add_argument("--peer-documents", type=int, help="PyPI simhash index size (default 1,000,000; quick 200,000)")
    parser.add_argument("--text-documents", type=int,
                        help="real-text documents for the end-to-end CLI run (default 100,000; quick 5,000)")
    parser.add_argument("--memory-documents", help="two sizes of short-document inputs for peak memory "
                        "(default 200000,1000000; quick 20000,100000)")
    parser.add_argument("--cli-chunk-size", type=int, help=f"--chunk-size of the CLI runs (default simdb's "
                        f"{DEFAULT_CHUNK_SIZE:,}; quick 10,000)")
    parser.add_argument("--skip", default="", help="comma-separated parts to leave out: "
                        "fingerprint,empty,archive,peer,cli")
    parser.add_argument("--quick", action="store_true", help="smaller defaults: a few minutes with --archive 1000000")
    parser.add_argument("--max-distance", type=int, default=DEFAULT_MAX_DISTANCE,
                        help="k of every index measured (default: simdb's)")
    parser.add_argument("--seed", type=int, default=20240601)
    parser.add_argument("--markdown", action="store_true", help="print a GitHub markdown table")
    args = parser.parse_args(argv)
    global K
    K = args.max_distance
    defaults = {"min_seconds": (10.0, 3.0), "documents": (1_000_000, 200_000), "archive": (10_000_000, 10_000_000),
                "naive": (5_000, 1_000), "peer_documents": (1_000_000, 200_000), "text_documents": (100_000, 5_000),
                "memory_documents": ("200000,1000000", "20000,100000"),
                "cli_chunk_size": (DEFAULT_CHUNK_SIZE, 10_000)}
    for name, (full, quick) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    args.memory_documents = [int(x) for x in str(args.memory_documents).split(",") if x.strip()]
    if len(args.memory_documents) not in (0, 2):
        parser.error("--memory-documents takes two sizes, like 200000,1000000 (or an empty string)")
    args.skip = {part.strip() for part in args.skip.split(",") if part.strip()}
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    load_start = load_average()
    texts, zh_note = None, f"{args.zh} is missing"
    if args.zh.is_file():
        texts, zh_note = load_texts(args.zh), f"{args.zh.name}"
    else:
        log(f"{args.zh} is missing: skipping the jieba rows and the real-text end-to-end run "
            "(the memory runs use random Han text)")
    rng = np.random.default_rng(args.seed)

    f = None
    if texts and "fingerprint" not in args.skip:
        f = measure_fingerprinting(texts, args.workers, args.min_seconds)
    peer = None
    if "peer" not in args.skip and args.peer_documents:
        log(f"PyPI simhash SimhashIndex(k={K}) over {args.peer_documents:,} fingerprints")
        peer = simhash_peer(args.peer_documents, 1000, rng)

    server = Server(args.database_url)
    url, admin = server.url, server.admin
    work = tempfile.mkdtemp(prefix="simdb-bench-ingest-")
    e = a = c = None
    try:
        with admin.connect() as connection:
            server_settings = {name: connection.exec_driver_sql(f"SHOW {name}").scalar_one() for name in SETTINGS}
        if server_settings["autovacuum"] != "on":
            log(f"note: autovacuum is {server_settings['autovacuum']} on this server")
        drop_schemas(admin)
        if "empty" not in args.skip and args.documents:
            log(f"archive path: {args.documents:,} fingerprints into an empty archive")
            e = ingest_empty(url, admin, args, rng)
        if "archive" not in args.skip and args.archive:
            a = measure_archive(url, admin, args, rng)
        if "cli" not in args.skip:
            c = measure_cli(url, admin, texts, args, work)
    finally:
        drop_schemas(admin)
        server.close()
        shutil.rmtree(work, ignore_errors=True)
    log("done")
    header = header_lines(f, e, a, peer, c, args, server_settings, server.embedded, load_start, zh_note)
    print_table(header, table_rows(f, e, a, peer, c, args), args.markdown)


if __name__ == "__main__":
    main()
