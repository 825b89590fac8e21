"""Benchmark simdb's text path: what each stage of a sketch costs, and ``simdb ingest`` end to end.

It measures, on this machine, in one run:

* per stage, on one core, over the devset's texts (``long-zh``, ``long-en``, ``short-zh``): the
  microseconds per document of each step of a SimHash fingerprint as simdb takes them -- JSON parsing,
  ``fold`` (NFKC, case), OpenCC t2s, segmentation (the Han runs in one ``cut``), the rest of
  tokenization (the runs of each kind), the features (token ids and hashes, stop words dropped, bigrams,
  weights) and the SimHash's sums, and the whole fingerprint under the earlier default recipe --
  and of a MinHash signature, the content hash and the pickling a worker task costs (its texts out, its
  results back); beside bare ``rjieba.cut(text, False)`` and ``jieba.lcut(text, HMM=False)`` on the same
  raw texts. The target: the whole fingerprint at >= 0.6x the rate of bare ``rjieba.cut``;
* end to end, the ``simdb ingest`` CLI in a subprocess (``--workers``, default all cores, timed from start
  to exit, peak memory sampled with psutil) of ``--documents`` (100k) documents composed of devset
  sentences (2 % near copies, lengths as in the devset) into empty archives: Chinese with SimHash and
  with MinHash (0.8, 128), English with SimHash; and, in the same run, a subprocess running
  ``jieba.lcut(text, HMM=False)`` on one core over ``--jieba-documents`` (50k) of the same Chinese
  documents, start to exit as well. Targets: 2,500 / 4,000 / 5,000 docs/s and 6x single-core jieba.
* a duplicate-heavy archive (issue 36): ``--documents`` long Chinese texts in groups of 10 rotated variants
  (90 % of the documents are near-duplicates of others, so most have pairs and clusters to keep), ``simdb
  ingest`` with SimHash against single-core ``jieba.lcut(HMM=False)`` on the same documents (target 6x);
  ``--skip duplicates`` leaves it out, ``--skip ingest`` every end-to-end run.

Only prints (progress on stderr, the tables on stdout); asserts nothing about timings. Its schemas
(``simdb_bench_text_*``) are dropped at the start and at the end.

Run (about 6 minutes on 2 cores)::

    .venv/bin/python scripts/bench_text.py --markdown
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_common import DATABASE_HELP, Server, command_line, log, machine, mb, print_table, ratio
from bench_corpus import SENTENCE, corpus_pieces, write_corpus, write_variants
from bench_process import ProcessRun, quarters, run_cli, simdb_command, simdb_setup

from simdb import native
from simdb.methods import Method
from simdb.methods.simhash.fingerprint import FingerprintSettings, fingerprint, fingerprints, simhashes_of_tokens
from simdb.parallel import TASK_SIZE, default_workers
from simdb.text import content_hash
from simdb.text.normalize import fold, simplify
from simdb.text.segment import cut, segmenter_name
from simdb.text.tokenize import punctuated_runs, punctuated_parts

REPO = Path(__file__).resolve().parent.parent
DEVSET = Path(os.environ.get("SIMDB_DEVSET", REPO.parent / "shared" / "devset")) / "docs"
PREFIX = "simdb_bench_text"
DUPLICATES = 4  # the schema number of the duplicate-heavy run (0-3: the runs on composed documents)
ENGLISH_SENTENCE = re.compile(r"[^.!?\n]+[.!?]?")


def per_document(function, items: list, min_seconds: float) -> tuple[list, float]:
    """(function's results, microseconds per item), repeating the pass until it lasts ``min_seconds``.

    One untimed pass over every item first: a dictionary that loads on first need (jieba's, for the texts
    rjieba hands over to it, about 1.4 s) would otherwise be charged to the stage's documents (the rest of
    tokenization showed 274 us a long Chinese document where it takes about 100)."""
    results = [function(item) for item in items]  # warm: dictionaries, caches, regex compilation
    passes, start = 0, time.perf_counter()
    while True:
        results = [function(item) for item in items]
        passes += 1
        seconds = time.perf_counter() - start
        if seconds >= min_seconds:
            return results, seconds / passes / len(items) * 1e6


def measure_stages(name: str, lines: list[str], min_seconds: float, jieba_min_seconds: float) -> dict:
    import jieba
    import rjieba

    log(f"stages on {name}: {len(lines):,} documents")
    m: dict = {"documents": len(lines), "bytes": sum(len(line.encode()) for line in lines)}
    records, m["parse"] = per_document(json.loads, lines, min_seconds)
    texts = [record["text"] for record in records]
    folded, m["fold"] = per_document(fold, texts, min_seconds)
    simplified, m["t2s"] = per_document(simplify, folded, min_seconds)
    # what the tokenizer hands the segmenter: the Han text, and whether it holds a character jieba-rs and jieba
    # segment differently (the compiled runs tell; else a search of the text, as the Python path makes)
    not_han, compiled = punctuated_runs()[0], native.module()
    runs = [compiled.runs(text) if compiled is not None else None for text in simplified]
    han_texts = [(not_han.sub(" ", text), None if run is None else run[3]) for text, run in zip(simplified, runs)]
    _, m["segment"] = per_document(lambda han: cut(han[0], False, han[1]), han_texts, min_seconds)
    token_lists, tokens = per_document(punctuated_parts, simplified, min_seconds)
    m["tokens"] = tokens - m["segment"]
    settings = FingerprintSettings()
    tasks = [texts[i:i + TASK_SIZE] for i in range(0, len(texts), TASK_SIZE)]
    token_tasks = [token_lists[i:i + TASK_SIZE] for i in range(0, len(token_lists), TASK_SIZE)]
    _, per_task = per_document(lambda task: simhashes_of_tokens(task, settings), token_tasks, min_seconds)
    m["simhash"] = per_task * len(tasks) / len(texts)
    _, per_task = per_document(lambda task: fingerprints(task, settings), tasks, min_seconds)
    m["fingerprint"] = per_task * len(tasks) / len(texts)
    _, m["fingerprint_one"] = per_document(lambda text: fingerprint(text, settings), texts, min_seconds)
    earlier = FingerprintSettings(weighting="sublinear_tf", bigrams=0)
    _, m["fingerprint_earlier"] = per_document(lambda text: fingerprint(text, earlier), texts, min_seconds)
    minhash = Method.named("minhash").new()
    _, per_task = per_document(minhash.sketch_many, tasks, min_seconds)
    m["minhash"] = per_task * len(tasks) / len(texts)
    _, m["content_hash"] = per_document(content_hash, texts, min_seconds)
    results = [(fingerprint(text), content_hash(text)) for text in texts]
    result_tasks = [results[i:i + TASK_SIZE] for i in range(0, len(results), TASK_SIZE)]
    _, out = per_document(lambda task: pickle.loads(pickle.dumps(task)), tasks, min_seconds)
    _, back = per_document(lambda task: pickle.loads(pickle.dumps(task)), result_tasks, min_seconds)
    m["pickle"] = (out + back) * len(tasks) / len(texts)
    _, m["rjieba"] = per_document(lambda text: rjieba.cut(text, False), texts, min_seconds)
    jieba.setLogLevel(60)
    jieba.initialize()
    _, m["jieba"] = per_document(lambda text: jieba.lcut(text, HMM=False), texts, max(min_seconds, jieba_min_seconds))
    return m


STAGES = (("parse", "JSON parsing of the input line"), ("fold", "fold: NFKC and case folding"),
          ("t2s", "OpenCC t2s (traditional -> simplified)"),
          ("segment", "segmentation: the Han runs in one `cut`"),
          ("tokens", "the rest of tokenization: the runs of each kind, in order"),
          ("simhash", "features, 256 texts a call: token ids and hashes from the vocabulary, stop words dropped, "
                      "counts, bigrams, weights, signed sums, bits"))


def stage_rows(stages: dict) -> tuple[list[str], list[list[str]]]:
    names = list(stages)
    header = ["stage (us per document, 1 core)", *names]
    rows = [[label, *(f"{stages[n][key]:,.1f}" for n in names)] for key, label in STAGES]
    rows.append(["**SimHash fingerprint, whole** (`fingerprints(texts)`, 256 a call, as the workers run it)",
                 *(f"**{stages[n]['fingerprint']:,.1f}**" for n in names)])
    rows.append(["SimHash fingerprint, one text a call (`fingerprint(text)`)",
                 *(f"{stages[n]['fingerprint_one']:,.1f}" for n in names)])
    rows.append(["the earlier default recipe (sublinear tf, no bigrams: indexes created before), whole",
                 *(f"{stages[n]['fingerprint_earlier']:,.1f}" for n in names)])
    rows.append(["MinHash (0.8, 128) signature, whole (`sketch_many`, 256 a call)",
                 *(f"{stages[n]['minhash']:,.1f}" for n in names)])
    rows.append(["content hash (xxh3-128 of the text)", *(f"{stages[n]['content_hash']:,.1f}" for n in names)])
    rows.append(["pickling a worker's task: texts out, results back", *(f"{stages[n]['pickle']:,.1f}" for n in names)])
    rows.append(["peer: bare `rjieba.cut(text, False)` on the raw text", *(f"{stages[n]['rjieba']:,.1f}" for n in names)])
    rows.append(["peer: `jieba.lcut(text, HMM=False)` on the raw text", *(f"{stages[n]['jieba']:,.1f}" for n in names)])
    rows.append(["fingerprint rate / bare rjieba.cut rate (target >= 0.6x)",
                 *(ratio(stages[n]["rjieba"] / stages[n]["fingerprint"]) for n in names)])
    return header, rows


def print_grid(header: list[str], rows: list[list[str]], markdown: bool) -> None:
    if markdown:
        print("| " + " | ".join(header) + " |\n|---|" + "---:|" * (len(header) - 1))
        for row in rows:
            print("| " + " | ".join(row) + " |")
    else:
        widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
        for row in [header, *rows]:
            print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    print()


# -- end to end ------------------------------------------------------------------------------------

def compose(path: str, source: Path, count: int, sentence: re.Pattern, seed: int) -> int:
    texts = [json.loads(line)["text"] for line in source.open(encoding="utf-8")]
    sentences = [s.strip() for text in texts for s in sentence.findall(text) if len(s.strip()) >= 4]
    return write_corpus(path, count, sentences, [len(text) for text in texts], random.Random(seed))


def compose_variants(path: str, source: Path, count: int, seed: int) -> int:
    """The duplicate-heavy corpus: devset sentences composed into long texts, each in 10 rotated variants."""
    rng = random.Random(seed)
    sentences, lengths = corpus_pieces([json.loads(line)["text"] for line in source.open(encoding="utf-8")], rng)
    return write_variants(path, count, sentences, lengths, rng)


def ingest(url: str, admin, schema: str, path: str, documents: int, workers: int, init: list[str],
           directory: str) -> tuple[ProcessRun, int]:
    """The CLI's run, and the bytes its archive takes."""
    common = ["--database-url", url, "--schema", schema]
    simdb_setup(["init", *common, *init])
    m = run_cli([*simdb_command(), "ingest", path, *common, "--workers", str(workers), "--batch", "bench"],
                os.path.join(directory, f"{schema}.log"))
    with admin.connect() as c:
        stored = c.exec_driver_sql(f"SELECT count(*) FROM {schema}.documents").scalar_one()
        stored_bytes = c.exec_driver_sql(  # every segment with its indexes and TOAST
            f"SELECT sum(pg_total_relation_size(inhrelid)) FROM pg_inherits "
            f"WHERE inhparent = '{schema}.documents'::regclass").scalar_one()
        c.exec_driver_sql(f"DROP SCHEMA {schema} CASCADE")
    if stored != documents:
        raise RuntimeError(f"the CLI stored {stored:,} of {documents:,} documents")
    log(f"  {documents / m.seconds:,.0f} docs/s ({m.seconds:.1f} s); peak RSS CLI {mb(m.main)} "
        f"(quarters {quarters(m)}), largest worker {mb(m.worker)}; CPU: CLI {m.cpu_main:.0f} s, "
        f"workers {m.cpu_children:.0f} s")
    return m, stored_bytes


JIEBA_ALONE = """
import json, sys, jieba
jieba.setLogLevel(60)
count = 0
with open(sys.argv[1], encoding="utf-8") as f:
    for line in f:
        if count == int(sys.argv[2]):
            break
        jieba.lcut(json.loads(line)["text"], HMM=False)
        count += 1
"""


def jieba_alone(path: str, documents: int) -> float:
    """Seconds for one process to start, load jieba and ``lcut(HMM=False)`` the first ``documents`` of ``path``."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", JIEBA_ALONE, path, str(documents)], check=True)
    return time.perf_counter() - start


def measure_end_to_end(server: Server, args, directory: str) -> list[tuple[str, str, str, str]]:
    zh, en = os.path.join(directory, "zh.jsonl"), os.path.join(directory, "en.jsonl")
    log(f"composing {args.documents:,} Chinese and {args.documents:,} English documents")
    zh_bytes = compose(zh, DEVSET / "long-zh.jsonl", args.documents, SENTENCE, args.seed)
    en_bytes = compose(en, DEVSET / "long-en.jsonl", args.documents, ENGLISH_SENTENCE, args.seed)
    jieba_documents = min(args.jieba_documents, args.documents)
    log(f"jieba.lcut(HMM=False), one process, the first {jieba_documents:,} Chinese documents")
    jieba_rate = jieba_documents / jieba_alone(zh, jieba_documents)
    log(f"  {jieba_rate:,.0f} docs/s")
    rows = []
    runs = (("zh", "SimHash", zh, zh_bytes, [], 2500),
            ("zh", "MinHash (0.8, 128)", zh, zh_bytes, ["--method", "minhash"], 4000),
            ("zh", "MinHash (0.8, 128) `--verify exact` (texts kept)", zh, zh_bytes,
             ["--method", "minhash", "--verify", "exact"], None),
            ("en", "SimHash", en, en_bytes, [], 5000))
    estimate = None
    for i, (language, method, path, size, init, target) in enumerate(runs):
        log(f"simdb ingest --workers {args.workers}: {args.documents:,} {language} documents ({mb(size)}), {method}")
        m, stored_bytes = ingest(server.url, server.admin, f"{PREFIX}_{i}", path, args.documents, args.workers,
                                 init, directory)
        rate = args.documents / m.seconds
        stored = f"{stored_bytes / args.documents:,.0f} B/doc stored"
        if target is None:  # measured against the estimate-only run just before it
            against = (f"estimate-only MinHash: {estimate[0]:,.0f} docs/s, {estimate[1]:,.0f} B/doc", rate / estimate[0])
        else:
            against = (f"target {target:,} docs/s", rate / target)
        if init[-1:] == ["minhash"]:
            estimate = (rate, stored_bytes / args.documents)
        rows.append((f"end to end: `simdb ingest --workers {args.workers}`, {args.documents:,} {language} docs "
                     f"({size / args.documents / 1000:.1f} KB avg), {method}, into an empty archive",
                     f"{rate:,.0f} docs/s, {size / m.seconds / 1e6:.2f} MB/s, {stored} (peak RSS CLI "
                     f"{mb(m.main)}, worker {mb(m.worker)})", against[0], ratio(against[1])))
        if i == 0:
            rows.append((f"the same run against single-core `jieba.lcut(HMM=False)` (one process, start to exit, "
                         f"{jieba_documents:,} of the same documents)", f"{rate:,.0f} docs/s",
                         f"{jieba_rate:,.0f} docs/s (target 6x)", ratio(rate / jieba_rate)))
    if "duplicates" not in args.skip:
        rows.extend(measure_duplicates(server, args, directory))
    return rows


def measure_duplicates(server: Server, args, directory: str) -> list[tuple[str, str, str, str]]:
    """Most documents with pairs and clusters to keep: ``simdb ingest`` against one-core jieba on the same texts."""
    path = os.path.join(directory, "variants.jsonl")
    log(f"composing {args.documents:,} Chinese documents, each text in 10 rotated variants")
    size = compose_variants(path, DEVSET / "long-zh.jsonl", args.documents, args.seed)
    jieba_documents = min(args.jieba_documents, args.documents)
    log(f"jieba.lcut(HMM=False), one process, the first {jieba_documents:,} of them")
    jieba_rate = jieba_documents / jieba_alone(path, jieba_documents)
    log(f"  {jieba_rate:,.0f} docs/s")
    log(f"simdb ingest --workers {args.workers}: {args.documents:,} documents, 90 % near-duplicates, SimHash")
    m, _ = ingest(server.url, server.admin, f"{PREFIX}_{DUPLICATES}", path, args.documents, args.workers, [],
                  directory)
    rate = args.documents / m.seconds
    return [(f"end to end: `simdb ingest --workers {args.workers}`, {args.documents:,} zh docs "
             f"({size / args.documents / 1000:.1f} KB avg) in groups of 10 rotated variants (90 % near-duplicates), "
             f"SimHash, against single-core `jieba.lcut(HMM=False)` on {jieba_documents:,} of them",
             f"{rate:,.0f} docs/s (CPU: CLI {m.cpu_main:.0f} s, workers {m.cpu_children:.0f} s)",
             f"{jieba_rate:,.0f} docs/s (target 6x)", ratio(rate / jieba_rate))]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", help=DATABASE_HELP)
    parser.add_argument("--workers", type=int, default=default_workers(), help="cores to use (default: all)")
    parser.add_argument("--documents", type=int, default=100_000, help="per end-to-end run (default 100,000)")
    parser.add_argument("--jieba-documents", type=int, default=50_000,
                        help="Chinese documents the single-core jieba process segments (default 50,000)")
    parser.add_argument("--min-seconds", type=float, default=2.0, help="per stage measurement (default 2)")
    parser.add_argument("--jieba-min-seconds", type=float, default=3.0,
                        help="at least this long for the jieba peer's stage measurement (default 3)")
    parser.add_argument("--skip", default="", help="comma-separated parts to leave out: stages,ingest,duplicates")
    parser.add_argument("--seed", type=int, default=20261123)
    parser.add_argument("--markdown", action="store_true", help="print GitHub markdown tables")
    args = parser.parse_args(argv)
    args.skip = {part.strip() for part in args.skip.split(",") if part.strip()}
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if not (DEVSET / "long-zh.jsonl").exists():
        sys.exit(f"no devset at {DEVSET}: set SIMDB_DEVSET to the folder holding docs/long-zh.jsonl")
    stages = {}
    if "stages" not in args.skip:
        for name in ("long-zh", "long-en", "short-zh"):
            lines = [line for line in (DEVSET / f"{name}.jsonl").open(encoding="utf-8") if line.strip()]
            stages[name] = measure_stages(name, lines, args.min_seconds, args.jieba_min_seconds)
    rows = []
    server = None
    if "ingest" not in args.skip:
        server = Server(args.database_url)
        with tempfile.TemporaryDirectory(prefix="simdb-bench-text-") as directory:
            try:
                rows = measure_end_to_end(server, args, directory)
            finally:
                with server.admin.connect() as c:
                    for i in range(DUPLICATES + 1):
                        c.exec_driver_sql(f"DROP SCHEMA IF EXISTS {PREFIX}_{i} CASCADE")
    version = server.version() if server else "not used"
    bullet = "- " if args.markdown else ""
    print(f"{bullet}{machine(version, server.embedded if server else False)}; segmenter {segmenter_name()}")
    print(f"{bullet}{command_line('bench_text.py')}\n")
    if stages:
        print_grid(*stage_rows(stages), args.markdown)
    if rows:
        print_table([], rows, args.markdown)
    if server:
        server.close()


if __name__ == "__main__":
    main()
