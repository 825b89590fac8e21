"""bench_ingest's end-to-end part: the ``simdb ingest`` CLI in a subprocess, on real text (devset sentences
recombined) and, for its peak memory, on two sizes of short documents; its process tree sampled with psutil.

Run through bench_ingest (``--skip fingerprint,empty,archive,peer`` for this part alone), or on its own::

    .venv/bin/python scripts/bench_ingest_cli.py --markdown

which takes bench_ingest's options and leaves its other parts out.
"""

from __future__ import annotations

import os
import random
import sys
from dataclasses import dataclass

import sqlalchemy as sa

from bench_common import log, mb
from bench_corpus import corpus_pieces, write_corpus
from bench_process import ProcessRun, quarters, run_cli, simdb_command, simdb_setup

PARTS = {"cli"}


@dataclass(frozen=True)
class CliIngest:
    """One ``simdb ingest`` run into an empty archive: the sampled process tree and what it stored."""

    run: ProcessRun
    documents: int
    bytes: int  # of the input file
    duplicates: int  # documents marked duplicate_of
    pairs: int | None  # stored near-duplicate pairs (None: the schema keeps no pairs)


@dataclass(frozen=True)
class CliRuns:
    text: CliIngest | None = None  # real text
    small: CliIngest | None = None  # the smaller input of short documents
    large: CliIngest | None = None  # the larger one


def cli_ingest(url: str, admin: sa.Engine, schema: str, path: str, documents: int, size: int, args,
               directory: str) -> CliIngest:
    common = ["--database-url", url, "--schema", schema]
    simdb_setup(["init", *common, "--max-distance", str(args.max_distance)])
    command = [*simdb_command(), "ingest", path, *common, "--workers", str(args.workers), "--batch", "bench",
               "--chunk-size", str(args.cli_chunk_size)]
    run = run_cli(command, os.path.join(directory, f"{schema}.log"))
    with admin.connect() as c:
        stored, duplicates = c.exec_driver_sql(
            f"SELECT count(*), count(duplicate_of) FROM {schema}.documents").one()
        pairs = (c.exec_driver_sql(f"SELECT count(*) FROM {schema}.near_duplicates").scalar_one()
                 if sa.inspect(c).has_table("near_duplicates", schema=schema) else None)
        c.exec_driver_sql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    if stored != documents:
        raise RuntimeError(f"the CLI stored {stored:,} of {documents:,} documents")
    log(f"  {documents:,} documents in {run.seconds:.1f} s ({documents / run.seconds:,.0f} docs/s), "
        f"{duplicates:,} marked duplicates" + (f", {pairs:,} stored pairs" if pairs is not None else "")
        + f"; peak RSS: CLI {mb(run.main)} (by quarter of the run: {quarters(run)}), largest worker "
        f"{mb(run.worker)}, tree {mb(run.tree)} ({run.processes} processes); CPU: CLI process "
        f"{run.cpu_main:.0f} s, its children {run.cpu_children:.0f} s, of {run.seconds:.0f} s")
    return CliIngest(run=run, documents=documents, bytes=size, duplicates=duplicates, pairs=pairs)


def measure_cli(url: str, admin: sa.Engine, schemas: dict[str, str], texts: list[str] | None, args,
                directory: str) -> CliRuns:
    rng = random.Random(args.seed)
    sentences, lengths = corpus_pieces(texts, rng)
    found = {}
    if texts and args.text_documents:
        path = os.path.join(directory, "text.jsonl")
        log(f"writing {args.text_documents:,} documents of real text")
        size = write_corpus(path, args.text_documents, sentences, lengths, rng)
        log(f"simdb ingest --workers {args.workers}: {args.text_documents:,} documents, {mb(size)}")
        found["text"] = cli_ingest(url, admin, schemas["text"], path, args.text_documents, size, args, directory)
        os.remove(path)
    for name, count in zip(("small", "large"), args.memory_documents):
        path = os.path.join(directory, f"{name}.jsonl")
        log(f"writing {count:,} short documents")
        size = write_corpus(path, count, sentences, list(range(60, 200)), rng)
        log(f"simdb ingest --workers {args.workers}: {count:,} short documents, {mb(size)}")
        found[name] = cli_ingest(url, admin, schemas[name], path, count, size, args, directory)
        os.remove(path)
    return CliRuns(**found)


if __name__ == "__main__":
    import bench_ingest

    bench_ingest.main(sys.argv[1:], parts=PARTS)
