"""Benchmark how much memory ``simdb ingest`` takes: for one huge text, and as the archive grows.

It runs the ``simdb ingest`` CLI in a subprocess and samples the memory of its process tree every
0.2 s with psutil (the CLI's own largest RSS, and the largest sum of the RSS of the CLI and its
fingerprint workers), for:

* one huge text (``--huge``, default 5M, 20M and 50M characters) of real-looking mixed Chinese and
  English (devset sentences, 60 % Chinese, recombined) as one JSON line, ingested with ``--max-chars``
  raised to fit, into an empty index of each method: SimHash, MinHash (0.8, 128), and MinHash
  ``--verify exact``;
* ``--documents`` (default 10k, 50k and 100k) documents of recombined devset sentences (as
  ``bench_text.py`` composes them: lengths as in the devset, 2 % near copies) at ``--chunk-size``
  (default 10,000), for the same three methods: memory must stay flat as the archive grows, bounded by
  the chunk and not by what is stored.

The table: case, peak RSS of the process tree, peak RSS of the CLI process, bytes of input (the file's
UTF-8), and the ratio of the tree's peak to the input; for the huge texts also the CLI's peak above its
baseline, the peak of the same command on one short document into an index of the same method (Python,
numpy, the dictionaries); and the CLI's largest RSS in each quarter of the run (flat, or growing?). Only
prints (progress on stderr, the table on stdout); asserts nothing. Its schemas
(``simdb_bench_memory_<pid>_*``) are dropped as each run ends.

Run (about an hour on 2 shared cores; ``--huge 5000000 --documents 10000`` takes a few minutes)::

    .venv/bin/python scripts/bench_memory.py --markdown
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
import tempfile
from pathlib import Path

from bench_common import DATABASE_HELP, Server, command_line, log, machine, mb
from bench_corpus import SENTENCE, write_corpus
from bench_process import ProcessRun, quarters, run_cli, simdb_command, simdb_setup

REPO = Path(__file__).resolve().parent.parent
DEVSET = Path(os.environ.get("SIMDB_DEVSET", REPO.parent / "shared" / "devset")) / "docs"
PREFIX = f"simdb_bench_memory_{os.getpid()}"  # two runs at once do not collide
ENGLISH_SENTENCE = re.compile(r"[^.!?\n]+[.!?]?")
METHODS = (("SimHash", []), ("MinHash", ["--method", "minhash"]),
           ("MinHash --verify exact", ["--method", "minhash", "--verify", "exact"]))


def sentences() -> tuple[list[str], list[str], list[int]]:
    """(Chinese sentences, English sentences, the Chinese documents' lengths) of the devset."""
    zh = [json.loads(line)["text"] for line in (DEVSET / "long-zh.jsonl").open(encoding="utf-8")]
    en = [json.loads(line)["text"] for line in (DEVSET / "long-en.jsonl").open(encoding="utf-8")]
    return ([s.strip() for text in zh for s in SENTENCE.findall(text) if len(s.strip()) >= 4],
            [s.strip() + " " for text in en for s in ENGLISH_SENTENCE.findall(text) if len(s.strip()) >= 4],
            [len(text) for text in zh])


def write_huge(path: str, characters: int, zh: list[str], en: list[str], rng: random.Random) -> int:
    """One JSON line holding a text of ``characters`` characters, 60 % Chinese sentences; returns the bytes."""
    parts, size = [], 0
    while size < characters:
        parts.append(rng.choice(zh) if rng.random() < 0.6 else rng.choice(en))
        size += len(parts[-1])
    text = "".join(parts)[:characters]
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps({"id": "huge", "text": text}, ensure_ascii=False) + "\n")
    return os.path.getsize(path)


def baseline(url: str, schema: str, init: list[str], directory: str) -> int:
    """The CLI's peak RSS ingesting one short document into an index of a method: what it holds before any
    large text (Python, numpy, the dictionaries)."""
    path = os.path.join(directory, "one.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps({"id": "one", "text": "一个很短的文本 a short text"}, ensure_ascii=False) + "\n")
    return ingest(url, schema, path, init, ["--workers", "1"], directory).main


def ingest(url: str, schema: str, path: str, init: list[str], options: list[str], directory: str) -> ProcessRun:
    common = ["--database-url", url, "--schema", schema]
    simdb_setup(["init", *common, *init])
    try:
        return run_cli([*simdb_command(), "ingest", path, *common, "--batch", "bench", *options],
                       os.path.join(directory, f"{schema}.log"))
    finally:
        drop(url, schema)


def drop(url: str, schema: str) -> None:
    import sqlalchemy as sa

    from simdb.pg.database import postgres_url

    engine = sa.create_engine(postgres_url(url), isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as c:
            c.exec_driver_sql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    finally:
        engine.dispose()


def row(case: str, m: ProcessRun, size: int, base: int | None = None) -> tuple[str, ...]:
    above = "" if base is None else f"{mb(m.main - base)} ({(m.main - base) / size:.1f}x)"
    return (case, mb(m.tree), mb(m.main), above, quarters(m), f"{size / 2**20:,.1f} MB",
            f"{m.tree / size:.1f}x", f"{m.seconds:.0f} s")


def measure(server: Server, args, directory: str) -> list[tuple[str, ...]]:
    zh, en, lengths = sentences()
    rows = []
    bases = {i: baseline(server.url, f"{PREFIX}_{i}", init, directory) for i, (_, init) in chosen(args)} \
        if args.huge else {}
    if bases:
        log(f"CLI baselines (one short document): {', '.join(mb(base) for base in bases.values())}")
    for characters in args.huge:
        path = os.path.join(directory, f"huge-{characters}.jsonl")
        size = write_huge(path, characters, zh, en, random.Random(args.seed))
        for i, (method, init) in chosen(args):
            log(f"one text of {characters:,} characters ({mb(size)}), {method}")
            m = ingest(server.url, f"{PREFIX}_{i}", path, init, ["--max-chars", str(characters)], directory)
            log(f"  peak RSS tree {mb(m.tree)}, CLI {mb(m.main)}; {m.seconds:.0f} s")
            rows.append(row(f"one text of {characters / 1e6:g}M characters, {method}", m, size, bases[i]))
        os.unlink(path)
    for documents in args.documents:
        path = os.path.join(directory, f"docs-{documents}.jsonl")
        size = write_corpus(path, documents, zh, lengths, random.Random(args.seed))
        for i, (method, init) in chosen(args):
            log(f"{documents:,} documents ({mb(size)}), {method}, --chunk-size {args.chunk_size:,}")
            m = ingest(server.url, f"{PREFIX}_{i}", path, init,
                       ["--chunk-size", str(args.chunk_size), "--workers", str(args.workers)], directory)
            log(f"  peak RSS tree {mb(m.tree)}, CLI {mb(m.main)} (quarters {quarters(m)}); {m.seconds:.0f} s")
            rows.append(row(f"{documents / 1000:g}k documents, --chunk-size {args.chunk_size:,}, {method}", m, size))
        os.unlink(path)
    return rows


def chosen(args) -> list[tuple[int, tuple[str, list[str]]]]:
    return [(i, method) for i, method in enumerate(METHODS) if i in args.methods]


def counts(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", help=DATABASE_HELP)
    parser.add_argument("--huge", default="5000000,20000000,50000000",
                        help="characters of each huge text, comma-separated; empty: none (default 5M, 20M, 50M)")
    parser.add_argument("--documents", default="10000,50000,100000",
                        help="documents of each many-document run, comma-separated; empty: none "
                             "(default 10k, 50k, 100k)")
    parser.add_argument("--chunk-size", type=int, default=10_000, help="of the many-document runs (default 10,000)")
    parser.add_argument("--workers", type=int, default=None, help="of the many-document runs (default: all cores)")
    parser.add_argument("--methods", default=",".join(str(i) for i in range(len(METHODS))),
                        help="which of " + ", ".join(f"{i}: {name}" for i, (name, _) in enumerate(METHODS))
                             + " to run, comma-separated (default: all)")
    parser.add_argument("--seed", type=int, default=20261126)
    parser.add_argument("--markdown", action="store_true", help="print a GitHub markdown table")
    args = parser.parse_args(argv)
    args.huge, args.documents, args.methods = counts(args.huge), counts(args.documents), set(counts(args.methods))
    if args.workers is None:
        args.workers = len(os.sched_getaffinity(0))
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if not (DEVSET / "long-zh.jsonl").exists():
        sys.exit(f"no devset at {DEVSET}: set SIMDB_DEVSET to the folder holding docs/long-zh.jsonl")
    server = Server(args.database_url)
    try:
        with tempfile.TemporaryDirectory(prefix="simdb-bench-memory-") as directory:
            rows = measure(server, args, directory)
        header = ["case", "peak RSS, tree", "peak RSS, CLI", "CLI above its baseline (x input)",
                  "CLI by quarter of the run", "input (UTF-8)", "tree / input", "time"]
        bullet = "- " if args.markdown else ""
        print(f"{bullet}{machine(server.version(), server.embedded)}")
        print(f"{bullet}{command_line('bench_memory.py')}\n")
        if args.markdown:
            print("| " + " | ".join(header) + " |\n|---|" + "---:|" * (len(header) - 1))
            for r in rows:
                print("| " + " | ".join(r) + " |")
        else:
            widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
            for r in [header, *rows]:
                print("  ".join(cell.ljust(width) for cell, width in zip(r, widths)))
    finally:
        server.close()


if __name__ == "__main__":
    main()
