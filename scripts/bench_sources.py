"""Benchmark simdb's input sources: the same documents from JSON lines, zstd-compressed JSON lines and Parquet.

It writes ``--documents`` (100,000; 1M for the docs' table) short documents of random Han text
(``--texts sentences``: sentences up to 60-200 characters, 2 % lightly edited copies of recent ones, as
bench_ingest's memory runs write them; ``--texts random``: ``--chars`` random characters each, which share
no text, so that matching is cheap and 1M documents fit a session) with four metadata fields (a source
name, a timestamp, a language and a score) as JSON lines; the same file compressed with zstd
(level 3, with checksums, as the ``zstd`` tool writes it); and the same rows as Parquet (read from
the JSON lines by pyarrow, so the timestamp becomes a timestamp column; pyarrow's default row groups
of 1,048,576 rows, snappy: one row group at 1M, the case where memory must not grow with it).
Then, in one run, for each source:

* the reader alone: ``simdb.read_documents`` over the whole file in a fresh process (spawned), in
  docs/s, with that process's peak RSS and its RSS at each quarter of the file (flat or growing?);
* end to end: ``simdb init`` and ``simdb ingest`` (``--workers``, all cores by default) into a fresh
  index, in docs/s and against JSON lines (the target is at least 0.9x: reading must not be what
  limits an ingest), with the CLI's peak RSS and the process tree's. JSON lines runs first and last,
  and the mean of the two is the baseline, as the machine may be shared.

The PostgreSQL table source (``simdb sync``) is the same rows COPYed into a table of the same
database (``simdb_bench_sources_src.corpus``: id, text and the four metadata fields, the timestamp as
``timestamptz``); its reader alone is :func:`simdb.sync.source_documents` (the run's server-side
cursor, 2,000 rows a round trip), also read alone in ``(published, id)`` order as a source with a
watermark column, and end to end ``simdb sync add`` then ``simdb sync run``.

Every source must store the same number of documents and mark the same number of duplicates, or the
run fails.

The script prints (progress on stderr, the table on stdout) and asserts nothing about timings. It
works in its own schemas (``simdb_bench_sources_PID_*``, PID its process id), dropped at the start and the end, and in a
temporary directory removed at the end.

Run::

    .venv/bin/python scripts/bench_sources.py --documents 1000000 --texts random --chars 20-40 \
        --tokenizer shingles --skip "JSON lines, zstd" --markdown
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import shlex
import shutil
import sys
import tempfile
import time
from collections import deque
from dataclasses import dataclass, field

import psutil

from bench_common import DATABASE_HELP, SMOKE_HELP, Server, load_average, log, machine, mb, print_table, ratio, smoke
from bench_corpus import corpus_pieces, edited_copy, write_corpus
from bench_process import ProcessRun, quarters, run_cli, simdb_command, simdb_setup

PREFIX = f"simdb_bench_sources_{os.getpid()}"  # its own: the tests run this script beside a longer run
TARGET = 0.9  # of the JSON-lines rate, end to end


# -- the inputs ------------------------------------------------------------------------------------

#: --texts: how the documents' texts are made
TEXTS = {"sentences": "sentences of random Han text up to {0}-{1} characters (bench_ingest's), 2 % edited copies",
         "random": "{0}-{1} random Han characters each (short titles, no text shared), 2 % copies with 1-3 characters "
                   "changed"}


def write_random(path: str, count: int, chars: tuple[int, int], rng: random.Random, near: float = 0.02) -> None:
    """``count`` JSON-lines documents of ``chars`` random Han characters each, ``near`` of them lightly edited copies
    of recent ones: texts that share nothing else, so their fingerprints are spread and matching is cheap."""
    han = [chr(c) for c in range(0x4E00, 0x9FA6)]
    recent: deque[str] = deque(maxlen=2000)
    with open(path, "w", encoding="utf-8") as f:
        for i in range(count):
            if recent and rng.random() < near:
                text = edited_copy(recent, han, rng)
            else:
                text = "".join(rng.choices(han, k=rng.randint(*chars)))
                recent.append(text)
            f.write(json.dumps({"id": f"doc-{i:09d}", "text": text}, ensure_ascii=False) + "\n")


def write_jsonl(path: str, count: int, rng: random.Random, texts: str = "sentences",
                chars: tuple[int, int] = (60, 200)) -> int:
    """``count`` short documents (see TEXTS) with four metadata fields; returns bytes."""
    if texts == "random":
        write_random(path + ".plain", count, chars, rng)
    else:
        sentences, _ = corpus_pieces(None, rng)
        write_corpus(path + ".plain", count, sentences, list(range(chars[0], chars[1] + 1)), rng)
    with open(path + ".plain", encoding="utf-8") as plain, open(path, "w", encoding="utf-8") as f:
        for i, line in enumerate(plain):
            record = json.loads(line)
            record.update(source=f"site-{rng.randrange(40)}", published=f"2024-{1 + i % 12:02d}-{1 + i % 28:02d}T"
                          f"{i % 24:02d}:00:00", lang="zh", score=round(rng.random(), 4))
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    os.remove(path + ".plain")
    return os.path.getsize(path)


def write_zstd(jsonl: str, path: str) -> int:
    import zstandard

    with open(jsonl, "rb") as source, open(path, "wb") as target:
        zstandard.ZstdCompressor(level=3, write_checksum=True).copy_stream(source, target)
    return os.path.getsize(path)


def write_parquet(jsonl: str, path: str) -> int:
    import pyarrow.json
    import pyarrow.parquet

    table = pyarrow.json.read_json(jsonl)
    pyarrow.parquet.write_table(table, path)
    return os.path.getsize(path)


TABLE_SCHEMA = f"{PREFIX}_src"
TABLE = "PostgreSQL table"
BY_WATERMARK = "PostgreSQL table, by watermark"  # the same table read in (published, id) order: read alone only
WATERMARK = "published"


def write_table(jsonl: str, server: Server) -> int:
    """The JSON lines' rows COPYed into ``TABLE_SCHEMA.corpus``; returns its size with its index."""
    server.drop_schemas(TABLE_SCHEMA)
    with server.admin.connect() as connection:
        connection.exec_driver_sql(f"CREATE SCHEMA {TABLE_SCHEMA}")
        connection.exec_driver_sql(f"CREATE TABLE {TABLE_SCHEMA}.corpus (id text PRIMARY KEY, text text NOT NULL, "
                                   "source text, published timestamptz, lang text, score float8)")
        cursor = connection.connection.dbapi_connection.cursor()
        with open(jsonl, encoding="utf-8") as lines, cursor.copy(
                f"COPY {TABLE_SCHEMA}.corpus (id, text, source, published, lang, score) FROM STDIN") as copy:
            for line in lines:
                record = json.loads(line)
                copy.write_row([record[name] for name in ("id", "text", "source", "published", "lang", "score")])
        connection.exec_driver_sql(f"ANALYZE {TABLE_SCHEMA}.corpus")
        return connection.exec_driver_sql(f"SELECT pg_total_relation_size('{TABLE_SCHEMA}.corpus')").scalar_one()


#: name -> (file suffix, how to write it from the JSON lines); the table's is made by write_table.
SOURCES = {
    "JSON lines": (".jsonl", None),
    "JSON lines, zstd": (".jsonl.zst", write_zstd),
    "Parquet": (".parquet", write_parquet),
    TABLE: (None, None),
    BY_WATERMARK: (None, None),
}
ADD_TABLE = ["sync", "add", "corpus", "--table", f"{TABLE_SCHEMA}.corpus", "--id", "id", "--text", "text",
             *(option for name in ("source", "published", "lang", "score") for option in ("--metadata", name))]


# -- the reader alone --------------------------------------------------------------------------------

#: documents between two samples of the reader's RSS
SAMPLE_EVERY = 256


@dataclass(frozen=True)
class ReaderRun:
    """The reader alone over a whole source, in a fresh process; memory in bytes."""

    seconds: float
    documents: int
    before: int  # RSS after the imports
    peak: int  # largest RSS sampled (every SAMPLE_EVERY documents and at each quarter)
    quarters: list[int]  # RSS at each quarter of the source


@dataclass(frozen=True)
class SourceIngest:
    """``simdb ingest`` (or ``simdb sync run``) of a whole source into a fresh index."""

    run: ProcessRun
    stored: int
    duplicates: int


@dataclass
class SourceRuns:
    read: ReaderRun
    ingest: list[SourceIngest] = field(default_factory=list)


def read_alone(path: str, count: int, url: str | None = None, watermark: str | None = None) -> dict:
    """In a fresh process: every document of ``path`` through ``read_documents`` (of the table, through a sync run's
    reader, when ``url`` is given, in ``watermark`` order when given); time and memory."""
    from simdb.inputs import Document, read_documents
    from simdb.sync import Source, source_documents

    if url is not None:
        import psycopg  # noqa: F401  (as pyarrow below)
    if path.endswith(".parquet"):
        import pyarrow.parquet  # noqa: F401  (its libraries are part of what a reader costs, not of its growth)
    process = psutil.Process()
    before = peak = process.memory_info().rss
    marks = {count * q // 4 for q in range(1, 5)}
    by_quarter, documents, start = [], 0, time.perf_counter()
    items = read_documents([path]) if url is None else source_documents(url, Source(
        "corpus", path, None, "id", "text", ("source", "published", "lang", "score"), watermark_column=watermark))
    for item in items:
        if isinstance(item, Document):
            documents += 1
            if documents % SAMPLE_EVERY == 0 or documents in marks:
                rss = process.memory_info().rss
                peak = max(peak, rss)
                if documents in marks:
                    by_quarter.append(rss)
    # a plain dict back across the process boundary: ReaderRun is made in the parent (measure_reader)
    return {"seconds": time.perf_counter() - start, "documents": documents, "before": before, "peak": peak,
            "quarters": by_quarter}


def measure_reader(path: str, count: int, url: str | None = None, watermark: str | None = None) -> ReaderRun:
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        m = ReaderRun(**pool.apply(read_alone, (path, count, url, watermark)))
    if m.documents != count:
        raise RuntimeError(f"the reader gave {m.documents:,} of {count:,} documents from {path}")
    log(f"  reader alone: {count / m.seconds:,.0f} docs/s; RSS {mb(m.before)} after imports, peak "
        f"{mb(m.peak)} (by quarter of the file: {' / '.join(mb(q) for q in m.quarters)})")
    return m


# -- end to end ----------------------------------------------------------------------------------------

def measure_ingest(server: Server, schema: str, path: str, count: int, args, directory: str) -> SourceIngest:
    common = ["--database-url", server.url, "--schema", schema]
    server.drop_schemas(schema)
    simdb_setup(["init", *common, "--tokenizer", args.tokenizer])
    server.checkpoint()
    if path == f"{TABLE_SCHEMA}.corpus":  # the table: the source is added, then one run ingests it all
        simdb_setup([*ADD_TABLE, *common])
        command = [*simdb_command(), "sync", "run", "corpus", *common, "--workers", str(args.workers),
                   "--rejects", os.path.join(directory, f"{schema}-rejects.jsonl")]  # not in the working directory
    else:
        command = [*simdb_command(), "ingest", path, *common, "--workers", str(args.workers), "--batch", "bench"]
    run = run_cli(command, os.path.join(directory, f"{schema}.log"))
    with server.admin.connect() as c:
        stored, duplicates = c.exec_driver_sql(f"SELECT count(*), count(duplicate_of) FROM {schema}.documents").one()
    server.drop_schemas(schema)
    if stored != count:
        raise RuntimeError(f"the CLI stored {stored:,} of {count:,} documents from {path}")
    log(f"  ingest: {count / run.seconds:,.0f} docs/s, {duplicates:,} duplicates; peak RSS: CLI "
        f"{mb(run.main)} (by quarter: {quarters(run)}), tree {mb(run.tree)}")
    return SourceIngest(run=run, stored=stored, duplicates=duplicates)


# -- report ----------------------------------------------------------------------------------------

def table_rows(results: dict[str, SourceRuns], count: int) -> list[tuple[str, str, str, str]]:
    base_read = results["JSON lines"].read
    baseline = sum(count / m.run.seconds for m in results["JSON lines"].ingest) / max(1, len(results["JSON lines"].ingest))
    rows = []
    for name, m in results.items():
        read = m.read
        reader = {TABLE: "`sync.source_documents`", BY_WATERMARK: f"`sync.source_documents`, watermark {WATERMARK}"
                  }.get(name, "`read_documents`")
        rows.append((f"read {name} alone: {reader}, peak RSS", f"{count / read.seconds:,.0f} docs/s, "
                     f"{mb(read.peak)}", f"JSON lines {count / base_read.seconds:,.0f} docs/s",
                     ratio(base_read.seconds / read.seconds)))
    for name, m in results.items():
        if not m.ingest:
            continue
        rates = [count / ingest.run.seconds for ingest in m.ingest]
        shown = " and ".join(f"{r:,.0f}" for r in rates) + " docs/s"
        peak = max(ingest.run.main for ingest in m.ingest)
        command = "`simdb sync run`" if name == TABLE else "`simdb ingest`"
        rows.append((f"{command} {name} (all stages), peak RSS of the CLI", f"{shown}, {mb(peak)}",
                     f"JSON lines {baseline:,.0f} docs/s (mean of first and last)",
                     ratio(sum(rates) / len(rates) / baseline)))
    return rows


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", help=DATABASE_HELP)
    parser.add_argument("--documents", type=int, default=100_000, help="documents in each input (default 100,000)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="--workers of simdb ingest "
                        "(default: all cores)")
    parser.add_argument("--seed", type=int, default=20240601)
    parser.add_argument("--texts", choices=TEXTS, default="sentences", help="sentences: random sentences recombined "
                        "(bench_ingest's); random: random characters, no text shared (cheap to match: what 1M "
                        "documents in a session's time need) [default: sentences]")
    parser.add_argument("--chars", type=lambda value: tuple(int(n) for n in value.split("-", 1)), default=(60, 200),
                        metavar="MIN-MAX", help="characters a document (default 60-200)")
    parser.add_argument("--tokenizer", default="auto", help="the indexes' `simdb init --tokenizer` (shingles: "
                        "tokenizing costs least, so reading weighs most) [default: auto]")
    parser.add_argument("--skip", action="append", default=[], choices=[name for name in SOURCES if name not in ("JSON lines", BY_WATERMARK)],
                        help="a source read alone but not ingested end to end (repeatable)")
    parser.add_argument("--readers-only", action="store_true", help="the readers alone, no ingest")
    parser.add_argument("--markdown", action="store_true", help="print a GitHub markdown table")
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP + "; JSON lines ingested first only, not "
                                                                          "first and last")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    smoke(args.smoke)
    load_start = load_average()
    server = Server(args.database_url)
    work = tempfile.mkdtemp(prefix="simdb-bench-sources-")
    results: dict[str, SourceRuns] = {}
    try:
        jsonl = os.path.join(work, "corpus.jsonl")
        log(f"writing {args.documents:,} documents")
        sizes = {"JSON lines": write_jsonl(jsonl, args.documents, random.Random(args.seed), args.texts, args.chars)}
        paths = {"JSON lines": jsonl}
        for name, (suffix, write) in SOURCES.items():
            if name == TABLE:
                paths[name], sizes[name] = f"{TABLE_SCHEMA}.corpus", write_table(jsonl, server)
            elif name == BY_WATERMARK:
                paths[name] = paths[TABLE]
                continue
            elif write is not None:
                paths[name] = os.path.join(work, "corpus" + suffix)
                sizes[name] = write(jsonl, paths[name])
            log(f"{name}: {mb(sizes[name])}")
        for name, path in paths.items():
            log(f"{name}: reader alone")
            results[name] = SourceRuns(measure_reader(path, args.documents, server.url if name in (TABLE, BY_WATERMARK)
                                                      else None, WATERMARK if name == BY_WATERMARK else None))
        again = [] if args.smoke else ["JSON lines"]  # last too: the baseline is the mean of both, the machine shared
        order = [] if args.readers_only else [name for name in [*paths, *again]
                                              if name not in (*args.skip, BY_WATERMARK)]
        for i, name in enumerate(order):
            log(f"{name}: simdb ingest --workers {args.workers}")
            results[name].ingest.append(measure_ingest(server, f"{PREFIX}_{i}", paths[name], args.documents,
                                                          args, work))
        duplicates = {name: {ingest.duplicates for ingest in m.ingest} for name, m in results.items()}
        if len(set().union(*duplicates.values())) > 1:
            raise RuntimeError(f"the sources marked different numbers of duplicates: {duplicates}")
        version = server.version()
    finally:
        server.drop_schemas(*(f"{PREFIX}_{i}" for i in range(len(SOURCES) + 1)), TABLE_SCHEMA)
        server.close()
        shutil.rmtree(work, ignore_errors=True)
    log("done")
    header = [machine(version, server.embedded),
              f"load average (1, 5, 15 min) at the start: {load_start}; at the end: {load_average()}",
              f"documents: {args.documents:,} short ({TEXTS[args.texts].format(*args.chars)}), "
              "four metadata fields; sizes: " + ", ".join(f"{name} {mb(size)}" for name, size in sizes.items()),
              f"ingest: a fresh index each (`simdb init --tokenizer {args.tokenizer}`), `--workers {args.workers}`, "
              "default chunk size; target: each source at "
              f"least {TARGET}x the JSON-lines rate",
              "command: " + shlex.join([".venv/bin/python", "scripts/bench_sources.py", *sys.argv[1:]])]
    print_table(header, table_rows(results, args.documents), args.markdown)


if __name__ == "__main__":
    main()
