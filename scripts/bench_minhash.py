"""MinHash signatures: simdb's vectorised numpy signatures beside datasketch's ``MinHash.bulk``.

Same documents, same shingles, same signature length (128), one core, one run:

* shingling (what both need first): simdb's normalisation (NFKC, case,
  OpenCC t2s, punctuation) and character 5-grams (Chinese) / word 3-grams;
* datasketch ``MinHash.bulk`` on those shingle strings, with its default
  hash (SHA-1) and with xxh32 (the fastest hash function it takes);
* simdb on the same shingle strings: xxh3-64 per shingle, then
  :func:`simdb.methods.minhash.signature.signatures` (all permutations as vectorised passes);
* simdb from the text, as ingest runs it: :func:`simdb.methods.minhash.signature.shingle_hashes`
  (code-point polynomial hashes in numpy, no string per shingle) plus
  :func:`simdb.methods.minhash.signature.signatures`.

It also checks the estimates: the error of each method's Jaccard estimate
against the exact Jaccard of the same shingle sets, on the devset's labelled
pairs.

    .venv/bin/python scripts/bench_minhash.py [--devset ../shared/devset] [--limit 1500]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import xxhash

from simdb.methods.minhash import signature as minhash
from simdb.text.normalize import normalize

ROOT = Path(__file__).resolve().parent.parent


def shingle_strings(text: str, settings: minhash.MinHashSettings) -> list[str]:
    """The shingles simdb hashes, as strings (what datasketch is given)."""
    normalized = normalize(text)
    if minhash.writes_without_spaces(normalized):
        chars = normalized.replace(" ", "")
        n = settings.char_ngram
        return [chars[i:i + n] for i in range(max(len(chars) - n + 1, 1))]
    words = normalized.split()
    n = settings.word_ngram
    return [" ".join(words[i:i + n]) for i in range(max(len(words) - n + 1, 1))]


def timed(function, repeat: int = 3):
    best, result = float("inf"), None
    for _ in range(repeat):
        started = time.perf_counter()
        result = function()
        best = min(best, time.perf_counter() - started)
    return best, result


def main() -> None:
    from datasketch import MinHash

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devset", type=Path, default=ROOT.parent / "shared" / "devset")
    parser.add_argument("--limit", type=int, default=1500, help="documents per category")
    args = parser.parse_args()
    settings = minhash.MinHashSettings()
    print(f"MinHash, {settings.num_perm} permutations; best of 3 runs, one core\n")
    print("| category | docs | mean chars | step | docs/s | vs datasketch bulk (SHA-1) | vs datasketch bulk (xxh32) |")
    print("|---|---:|---:|---|---:|---:|---:|")
    for category in ("long-zh", "long-en", "short-zh"):
        with open(args.devset / "docs" / f"{category}.jsonl", encoding="utf-8") as f:
            records = [json.loads(line) for line in f if line.strip()][:args.limit]
        texts, ids = [r["text"] for r in records], [r["id"] for r in records]
        n = len(texts)
        t_shingle, shingles = timed(lambda: [shingle_strings(t, settings) for t in texts], 1)
        encoded = [[s.encode("utf-8") for s in doc] for doc in shingles]
        t_sha1, _ = timed(lambda: MinHash.bulk(encoded, num_perm=settings.num_perm))
        t_xxh, ds = timed(lambda: MinHash.bulk(encoded, num_perm=settings.num_perm,
                                               hashfunc=lambda b: xxhash.xxh32_intdigest(b)))

        def simdb_same_shingles():
            hashes = [np.fromiter((xxhash.xxh3_64_intdigest(s) for s in doc), dtype=np.uint64, count=len(doc))
                      for doc in encoded]
            return minhash.signatures(hashes, settings)

        t_same, _ = timed(simdb_same_shingles)
        t_text, ours = timed(lambda: minhash.signatures([minhash.shingle_hashes(t, settings) for t in texts],
                                                        settings))
        chars = sum(map(len, texts)) / n
        rows = [("shingling to strings (the input of the next three)", t_shingle, None),
                ("datasketch MinHash.bulk, SHA-1", t_sha1, (t_sha1, t_xxh)),
                ("datasketch MinHash.bulk, xxh32", t_xxh, (t_sha1, t_xxh)),
                ("simdb signatures, same shingle strings", t_same, (t_sha1, t_xxh)),
                ("simdb from text, as ingest runs it (vs shingling + datasketch)", t_text,
                 (t_shingle + t_sha1, t_shingle + t_xxh))]
        for step, seconds, bases in rows:
            ratios = ["", ""] if bases is None else [f"{base / seconds:.1f}x" for base in bases]
            print(f"| {category} | {n:,} | {chars:,.0f} | {step} | {n / seconds:,.0f} | {ratios[0]} | {ratios[1]} |")
        # estimates against the exact Jaccard of the same shingle sets, on the devset's labelled pairs
        position = {record_id: i for i, record_id in enumerate(ids)}
        with open(args.devset / "pairs.jsonl", encoding="utf-8") as f:
            pairs = [(position[p["a"]], position[p["b"]]) for p in map(json.loads, f)
                     if p["a"] in position and p["b"] in position]
        sets = [set(doc) for doc in shingles]
        exact = np.array([len(sets[i] & sets[j]) / len(sets[i] | sets[j]) for i, j in pairs])
        ours_error = np.abs(np.array([minhash.similarity(ours[i], ours[j]) for i, j in pairs]) - exact)
        ds_error = np.abs(np.array([ds[i].jaccard(ds[j]) for i, j in pairs]) - exact)
        print(f"| {category} | | | mean / 99th-percentile error of the Jaccard estimate on {len(pairs):,} "
              f"labelled pairs: simdb {ours_error.mean():.4f} / {np.quantile(ours_error, 0.99):.3f}, "
              f"datasketch {ds_error.mean():.4f} / {np.quantile(ds_error, 0.99):.3f} | | | |")


if __name__ == "__main__":
    main()
