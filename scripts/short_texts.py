"""How many features a text needs before SimHash finds its near-duplicates: recall by the features of a pair.

For every labelled near-duplicate pair of the devset (Jaccard >= 0.8, all categories), whether SimHash with
the default settings puts the two texts within its maximum distance (4 bits), grouped by the distinct
features (tokens, as ``simdb fingerprint --tokens`` lists them) of the pair's shorter text. The peer is
MinHash-LSH with exact verification (``--method minhash --verify exact``), which decides on the Jaccard
similarity of the texts' shingles: its recall, per group, on the same pairs. ``simdb ingest`` calls a text
short for SimHash below the feature count where SimHash's recall falls far below the peer's
(:data:`simdb.methods.simhash.SHORT_FEATURES`).

    .venv/bin/python scripts/short_texts.py --markdown
"""

from __future__ import annotations

import argparse
import json
import os
from collections import defaultdict
from pathlib import Path

import numpy as np
from bench_common import command_line, print_table

from simdb.methods import MinHash, SimHash
from simdb.methods.minhash.signature import shingle_set
from simdb.methods.simhash import SHORT_FEATURES

DEVSET = Path(os.environ.get("SIMDB_DEVSET", Path(__file__).resolve().parents[2] / "shared" / "devset"))
GROUPS = [(0, 10), (10, 20), (20, 30), (30, 40), (40, 60), (60, 100), (100, 10**9)]


def jaccard(a: str, b: str, minhash: MinHash) -> float:
    """The exact Jaccard similarity of two texts' shingles, as ``--verify exact`` decides it."""
    first, second = shingle_set(a, minhash.settings), shingle_set(b, minhash.settings)
    shared = len(np.intersect1d(first, second))
    return shared / max(len(first) + len(second) - shared, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devset", type=Path, default=DEVSET)
    parser.add_argument("--limit", type=int, default=None, help="Only the first N labelled pairs.")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    texts = {}
    for path in sorted((args.devset / "docs").glob("*.jsonl")):
        for line in path.open(encoding="utf-8"):
            record = json.loads(line)
            texts[record["id"]] = record["text"]
    pairs = [pair for pair in map(json.loads, (args.devset / "pairs.jsonl").open()) if pair["dup_80"]]
    pairs = pairs[:args.limit] if args.limit else pairs
    simhash, minhash = SimHash.new(), MinHash.new(verify="exact")
    sketches, features = {}, {}
    for pair in pairs:
        for name in (pair["a"], pair["b"]):
            if name not in sketches:
                sketches[name] = simhash.sketch(texts[name])
                features[name] = len(set(simhash.tokens(texts[name])))
    found, peer, counted = defaultdict(int), defaultdict(int), defaultdict(int)
    for pair in pairs:
        group = next(g for g in GROUPS if g[0] <= min(features[pair["a"]], features[pair["b"]]) < g[1])
        counted[group] += 1
        found[group] += (sketches[pair["a"]] ^ sketches[pair["b"]]).bit_count() <= simhash.max_distance
        peer[group] += jaccard(texts[pair["a"]], texts[pair["b"]], minhash) >= minhash.settings.threshold
    rows = []
    for group in GROUPS:
        if counted[group]:
            low, high = group
            name = f"{low}-{high - 1} features" if high < 10**9 else f"{low}+ features"
            simhash_recall, peer_recall = found[group] / counted[group], peer[group] / counted[group]
            rows.append((f"{name} ({counted[group]:,} pairs)", f"{simhash_recall:.3f}",
                         f"{peer_recall:.3f} (MinHash exact)", f"{simhash_recall / max(peer_recall, 1e-9):.2f}x"))
    print_table([command_line("short_texts.py"), f"devset: {args.devset}; pairs at Jaccard >= 0.8: {len(pairs):,}",
                 f"recall of SimHash (default settings, k = {simhash.max_distance}) by the distinct features of the "
                 f"pair's shorter text; ingest calls a text short below {SHORT_FEATURES}"], rows, args.markdown)


if __name__ == "__main__":
    main()
