"""Precision, recall and F1 of simdb's near-duplicate decisions on labelled real text, beside its peers.

For each category of the devset (``../shared/devset``: long-zh, long-en,
short-zh), in one run:

* simdb, in three configurations: SimHash with default settings; SimHash with
  IDF weights learned from the category's documents (``simdb init
  --idf-from``, the way an archive would learn them from a sample of itself);
  and MinHash-LSH (``simdb init --method minhash``, threshold 0.8, 128
  permutations). Each ingests the documents through the normal API into a
  fresh schema, and ``Index.pairs()`` is the prediction;
* the PyPI ``simhash`` package: ``SimhashIndex(k=3)`` over jieba tokens
  (Chinese) or ``\\w+`` words (English), term-frequency weights;
* ``datasketch``: ``MinHashLSH(threshold=0.8, num_perm=128)`` over the shingles
  the labels are made of (character 5-grams of NFKC, lower-cased text without
  punctuation, symbols and spaces, traditional characters simplified by
  OpenCC t2s, for Chinese; word 3-grams for English).

Every prediction is scored by the devset's own ``score.py`` (near-duplicate =
Jaccard >= 0.8). It prints a table per category and, for simdb, per pair type.

    .venv/bin/pip install -e ".[bench]" && .venv/bin/python scripts/eval_quality.py --markdown
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import unicodedata
from pathlib import Path

import sqlalchemy as sa

from bench_common import DATABASE_HELP, Server, log

from simdb import Index
from simdb.pg.database import postgres_url
from simdb.methods.simhash.fingerprint import learn_idf
from simdb.text.normalize import simplify

ROOT = Path(__file__).resolve().parent.parent
CATEGORIES = ("long-zh", "long-en", "short-zh")


def load(devset: Path, category: str) -> list[dict]:
    with open(devset / "docs" / f"{category}.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def simdb_pairs(url: str, category: str, documents: list[dict], workers: int, **settings
                ) -> tuple[list[dict], float]:
    """The pairs simdb reports, and the bytes per document of its documents table (indexes and TOAST too)."""
    schema = "simdb_eval_" + category.replace("-", "_")
    admin = sa.create_engine(postgres_url(url), isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.exec_driver_sql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    try:
        with Index.create(url, schema=schema, **settings) as index:
            index.add_many(documents, batch=category, workers=workers)
            return [pair.to_json() for pair in index.pairs()], index.stats(exact=True)["table_bytes"] / len(documents)
    finally:
        with admin.connect() as connection:
            connection.exec_driver_sql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        admin.dispose()


def simhash_peer(category: str, documents: list[dict]) -> list[dict]:
    import jieba
    from simhash import Simhash, SimhashIndex

    def features(text: str) -> list[str]:
        if category.endswith("-zh"):
            return [t for t in jieba.lcut(text) if t.strip()]
        return re.findall(r"\w+", text.lower())

    objects = [(d["id"], Simhash(features(d["text"]))) for d in documents]
    index = SimhashIndex(objects, k=3)
    pairs = set()
    for name, value in objects:
        for other in index.get_near_dups(value):
            if other != name:
                pairs.add(tuple(sorted((name, other))))
    return [{"a": a, "b": b} for a, b in sorted(pairs)]


def label_shingles(category: str, text: str) -> set[str]:
    text = unicodedata.normalize("NFKC", text).lower()
    if category.endswith("-zh"):
        text = simplify(text)
        chars = "".join(c for c in text if not c.isspace() and unicodedata.category(c)[0] not in "PS")
        return {chars[i:i + 5] for i in range(max(len(chars) - 4, 1))}
    words = re.findall(r"\w+", text)
    return {" ".join(words[i:i + 3]) for i in range(max(len(words) - 2, 1))}


def datasketch_peer(category: str, documents: list[dict]) -> list[dict]:
    from datasketch import MinHash, MinHashLSH

    lsh = MinHashLSH(threshold=0.8, num_perm=128)
    sketches = {}
    for d in documents:
        sketch = MinHash(num_perm=128)
        sketch.update_batch([s.encode("utf-8") for s in label_shingles(category, d["text"])])
        sketches[d["id"]] = sketch
        lsh.insert(d["id"], sketch)
    pairs = {tuple(sorted((name, other))) for name, sketch in sketches.items()
             for other in lsh.query(sketch) if other != name}
    return [{"a": a, "b": b} for a, b in sorted(pairs)]


def score(devset: Path, category: str, pairs: list[dict], directory: str) -> dict:
    predicted = os.path.join(directory, "predicted.jsonl")
    result = os.path.join(directory, "score.json")
    with open(predicted, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(p) + "\n" for p in pairs)
    subprocess.run([sys.executable, str(devset / "score.py"), "--truth", str(devset / "pairs.jsonl"),
                    "--pred", predicted, "--categories", category, "--json", result],
                   check=True, stdout=subprocess.DEVNULL)
    with open(result, encoding="utf-8") as f:
        return json.load(f)


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devset", type=Path, default=ROOT.parent / "shared" / "devset")
    parser.add_argument("--database-url", help=DATABASE_HELP)
    parser.add_argument("--categories", default=",".join(CATEGORIES))
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    if not (args.devset / "score.py").is_file():
        sys.exit(f"no devset at {args.devset}: pass --devset DIR (it holds docs/, pairs.jsonl and score.py)")
    summary, per_type = [], {}
    server = Server(args.database_url)
    args.database_url = server.url
    with server, tempfile.TemporaryDirectory() as directory:
        for category in args.categories.split(","):
            documents = load(args.devset, category)
            texts = [d["text"] for d in documents]
            for method, run in (("simdb SimHash, default settings",
                                 lambda: simdb_pairs(args.database_url, category, documents, args.workers)),
                                ("simdb SimHash, IDF from the archive (top 8 features)",
                                 lambda: simdb_pairs(args.database_url, category, documents, args.workers,
                                                     idf=learn_idf(texts))),
                                ("simdb MinHash-LSH (0.8, 128)",
                                 lambda: simdb_pairs(args.database_url, category, documents, args.workers,
                                                     method="minhash")),
                                ("simdb MinHash-LSH (0.8, 128), exact Jaccard (--verify exact)",
                                 lambda: simdb_pairs(args.database_url, category, documents, args.workers,
                                                     method="minhash", verify="exact")),
                                ("PyPI simhash SimhashIndex(k=3)", lambda: (simhash_peer(category, documents), None)),
                                ("datasketch MinHashLSH(0.8, 128)",
                                 lambda: (datasketch_peer(category, documents), None))):
                started = time.perf_counter()
                pairs, per_document = run()
                seconds = time.perf_counter() - started
                result = score(args.devset, category, pairs, directory)
                overall = result["overall"]
                summary.append((category, method, overall["precision"], overall["recall"], overall["f1"],
                                len(pairs), seconds, per_document))
                log(f"{category} {method}: F1 {fmt(overall['f1'])} ({len(pairs):,} pairs, {seconds:.1f} s)")
                if method.startswith("simdb"):
                    per_type.setdefault(category, {})[method] = result["per_pair_type"]
    print(f"devset: {args.devset}; near-duplicate = Jaccard >= 0.8; scored by the devset's score.py\n")
    print("| category | method | precision | recall | F1 | pairs | seconds | bytes per document |\n"
          "|---|---|---:|---:|---:|---:|---:|---:|")
    for category, method, p, r, f, n, s, b in summary:
        stored = "-" if b is None else f"{b:,.0f}"
        print(f"| {category} | {method} | {fmt(p)} | {fmt(r)} | {fmt(f)} | {n:,} | {s:.1f} | {stored} |")
    for category, methods in per_type.items():
        names = list(methods)
        print(f"\nsimdb on {category}, recall per pair type (positives found / positives)\n\n| pair type | "
              + " | ".join(names) + " |\n|---|" + "---:|" * len(names))
        types = sorted({t for rows in methods.values() for t in rows})
        for t in types:
            cells = []
            for name in names:
                m = methods[name].get(t)
                cells.append("-" if m is None or not (m["tp"] + m["fn"]) else
                             f"{m['tp']}/{m['tp'] + m['fn']} ({fmt(m['recall'])})")
            print(f"| {t} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
