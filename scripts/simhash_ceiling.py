"""How well can a 64-bit SimHash decide "Jaccard >= 0.8" on the devset? The expected precision, recall and F1 of
the recipe at each k, over every draw of the hash seed, and the bounds behind them.

Two fingerprints differ in each bit with probability ``p = angle / pi``, where the angle is between the two
texts' feature vectors (Charikar 2002), and the 64 bits are 64 draws: the distance of a pair is
Binomial(64, p). So for every pair of documents in a category, from the exact angle between the recipe's
feature vectors (``simdb.methods.simhash.fingerprint.feature_vector``; every pair, as sparse dot products),
this computes the probability that it lands within k bits, and sums those into the expected true and false
positives: the recipe's precision, recall and F1 averaged over hash seeds, without the luck of one seed. It
prints, per category:

* **model**: that expectation, at each k;
* **measured**: the F1 of real fingerprints (``simdb.methods.simhash.fingerprint.fingerprints``) under
  ``--seeds`` different hash seeds, all pairs within k found by brute force; its mean should sit on the
  model's (it checks the model);
* **without hashing noise**: the F1 of deciding by the exact angle, at the best cut: what the features
  themselves allow, and the distance that cut corresponds to;
* **any feature map**: the best F1 at each k of an imagined recipe whose expected distance is an exact,
  monotone function ``d0 * ((1 - J) / 0.2) ** g`` of each labelled pair's Jaccard ``J`` (the best ``d0``
  for each ``g``), with only the binomial noise left. Random feature hashes put the angle of two texts that
  share most of their features at about ``sqrt`` of the weight they do not share (independent differences
  add in quadrature), which is ``g = 0.5``; repeated words add coherently and lift a real recipe above it.

With ``--recipes``, it also prints the model's F1 of every recipe simdb can be told to use (weighting, bigram
scale, stop words) at each k, to show where the default stands among them.

Scored like the devset's ``score.py``: a pair is a positive when its exact shingle Jaccard is >= 0.8.

    .venv/bin/pip install -e ".[bench]" && .venv/bin/python scripts/simhash_ceiling.py --markdown
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
import scipy.sparse

from bench_common import log
from eval_quality import CATEGORIES, load as load_documents

from simdb.bits import hamming_array
from simdb.errors import InputError
from simdb.methods.simhash.fingerprint import FingerprintSettings, feature_vector, fingerprints
from simdb.text.tokenize import TokenizerSettings

ROOT = Path(__file__).resolve().parent.parent
BITS = 64
#: Pairs that land within the largest k with a probability below this are left out of the sums.
NEGLIGIBLE = 1e-9
#: The exponents g of the imagined feature maps (0.5: independent differences adding in quadrature).
EXPONENTS = (0.5, 0.75, 1.0)
#: The bigram scales ``--recipes`` compares (0: tokens only).
RECIPE_BIGRAMS = (0, 20, 50, 200)


def load(devset: Path, category: str) -> tuple[list[str], list[tuple[int, int, bool, float]]]:
    """Texts, and each labelled pair as (i, j, positive at 0.8, Jaccard), i < j."""
    documents = load_documents(devset, category)
    index = {d["id"]: i for i, d in enumerate(documents)}
    labelled = []
    with open(devset / "pairs.jsonl", encoding="utf-8") as f:
        for line in f:
            pair = json.loads(line)
            if pair["category"] == category:
                i, j = sorted((index[pair["a"]], index[pair["b"]]))
                labelled.append((i, j, pair["inter"] * 5 >= 4 * pair["union"], pair["inter"] / pair["union"]))
    return [d["text"] for d in documents], labelled


def binomial_cdf(k: int, p: np.ndarray) -> np.ndarray:
    """P(Binomial(64, p) <= k), elementwise."""
    q = 1.0 - p
    return sum(math.comb(BITS, i) * p**i * q ** (BITS - i) for i in range(k + 1))


def angles(texts: list[str], settings: FingerprintSettings) -> np.ndarray:
    """The matrix of ``angle / pi`` between every two texts' feature vectors."""
    vectors = [feature_vector(text, settings) for text in texts]
    hashes = np.concatenate([h for h, _ in vectors])
    _, columns = np.unique(hashes, return_inverse=True)  # a feature's column: its hash (distinct per feature)
    rows = np.repeat(np.arange(len(texts)), [len(h) for h, _ in vectors])
    weights = np.concatenate([w / np.linalg.norm(w) for _, w in vectors])
    matrix = scipy.sparse.csr_matrix((weights, (rows, columns.ravel())), shape=(len(texts), columns.max() + 1))
    cosines = np.clip((matrix @ matrix.T).toarray(), -1.0, 1.0)
    return np.arccos(cosines) / math.pi


def far(k: int) -> float:
    """The bit-difference probability from which a pair lands within ``k`` bits with negligible probability."""
    for chance in np.arange(0.01, 0.5, 0.01):
        if binomial_cdf(k, np.array(chance)) < NEGLIGIBLE:
            return float(chance)
    return 1.0  # keep every pair


def f1(tp: float, fp: float, fn: float) -> tuple[float, float, float]:
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    return precision, recall, 2 * tp / (2 * tp + fp + fn) if tp else 0.0


def model(p: np.ndarray, labelled, ks: list[int]) -> tuple[dict, tuple[float, float]]:
    """The expected (precision, recall, F1) at each k, and the best F1 by the exact angle with its distance."""
    labelled_positive = np.zeros(p.shape, dtype=bool)
    for a, b, is_positive, _ in labelled:
        labelled_positive[a, b] = is_positive
    positives = int(labelled_positive.sum())
    upper = np.triu_indices(p.shape[0], 1)
    near = p[upper] < far(max(ks))
    chances, positive = p[upper][near], labelled_positive[upper][near]
    expected = {}
    for k in ks:
        found = binomial_cdf(k, chances)
        tp = float(found[positive].sum())
        expected[k] = f1(tp, float(found[~positive].sum()), positives - tp)
    order = np.argsort(chances, kind="stable")
    tps = np.cumsum(positive[order])
    scores = 2 * tps / (2 * tps + np.cumsum(~positive[order]) + (positives - tps))
    best = int(scores.argmax())
    return expected, (float(scores[best]), BITS * float(chances[order][best]))


def measured(texts: list[str], labelled, ks: list[int], seeds: int) -> dict[int, list[float]]:
    """The F1 of real fingerprints at each k, under each of ``seeds`` hash seeds (all pairs by brute force)."""
    positives = {(a, b) for a, b, is_positive, _ in labelled if is_positive}
    scores: dict[int, list[float]] = {k: [] for k in ks}
    for seed in range(seeds):
        values = fingerprints(texts, FingerprintSettings(seed=seed))
        errors = [(at, value) for at, value in enumerate(values) if isinstance(value, InputError)]
        if errors:
            sys.exit(f"simhash_ceiling: document {errors[0][0] + 1} of its category has no fingerprint: {errors[0][1]}")
        prints = np.array(values, dtype=np.uint64)
        found: dict[int, set] = {k: set() for k in ks}
        for a in range(len(prints) - 1):
            distances = hamming_array(prints[a + 1:], int(prints[a]))
            for k in ks:
                found[k].update((a, a + 1 + b) for b in np.flatnonzero(distances <= k).tolist())
        for k in ks:
            tp = len(found[k] & positives)
            scores[k].append(f1(tp, len(found[k]) - tp, len(positives) - tp)[2])
    return scores


def any_feature_map(labelled, ks: list[int]) -> dict[float, dict[int, float]]:
    """For each exponent g, the best F1 at each k of distances ``d0 * ((1 - J) / 0.2) ** g`` over d0."""
    jaccard = np.array([j for *_, j in labelled])
    positive = np.array([is_positive for _, _, is_positive, _ in labelled])
    best: dict[float, dict[int, float]] = {}
    for g in EXPONENTS:
        best[g] = {}
        for k in ks:
            scores = []
            for d0 in np.arange(1.0, 12.01, 0.25):
                found = binomial_cdf(k, np.minimum(d0 * ((1 - jaccard) / 0.2) ** g / BITS, 0.5))
                tp = float(found[positive].sum())
                scores.append(f1(tp, float(found[~positive].sum()), float(positive.sum()) - tp)[2])
            best[g][k] = max(scores)
    return best


def distances(text: str) -> list[int]:
    """``--ks``: comma-separated distances, each from 0 to 63."""
    try:
        ks = [int(k) for k in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not comma-separated integers: {text!r}") from None
    if min(ks) < 0 or max(ks) >= BITS:
        raise argparse.ArgumentTypeError(f"each distance must be from 0 to {BITS - 1}: {text!r}")
    return ks


def seed_count(text: str) -> int:
    """``--seeds``: a whole number of hash seeds, at least 1."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"a whole number of seeds, at least 1: {text!r}")
    return int(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devset", type=Path, default=ROOT.parent / "shared" / "devset")
    parser.add_argument("--categories", default=",".join(CATEGORIES))
    parser.add_argument("--ks", type=distances, default="3,4,5,6", help="distances to score (default 3,4,5,6)")
    parser.add_argument("--seeds", type=seed_count, default=5, help="hash seeds for the measured F1 (default 5)")
    parser.add_argument("--recipes", action="store_true",
                        help="also the model's F1 of every weighting x bigram scale x stop words (a few minutes)")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    if not (args.devset / "docs").is_dir():
        sys.exit(f"simhash_ceiling: no devset at {args.devset}: give its folder with --devset")
    ks = args.ks
    categories = args.categories.split(",")
    unknown = sorted(set(categories) - set(CATEGORIES))
    if unknown:
        parser.error(f"--categories: unknown {', '.join(unknown)}; the devset has {', '.join(CATEGORIES)}")

    print(f"devset: {args.devset}; near-duplicate = Jaccard >= 0.8; the default SimHash recipe "
          f"({FingerprintSettings().algorithm}, tf + bigrams {FingerprintSettings().bigrams}); "
          f"measured over {args.seeds} hash seeds\n")
    print("| category | k | model: precision | model: recall | model: F1 | measured F1, mean (min-max) |")
    print("|---|---:|---:|---:|---:|---:|")
    bounds = []
    for category in categories:
        texts, labelled = load(args.devset, category)
        log(f"{category}: {len(texts)} documents, {len(labelled)} labelled pairs")
        expected, ceiling = model(angles(texts, FingerprintSettings()), labelled, ks)
        log(f"{category}: model done; fingerprints under {args.seeds} seeds")
        scores = measured(texts, labelled, ks, args.seeds)
        for k in ks:
            precision, recall, score = expected[k]
            print(f"| {category} | {k} | {precision:.3f} | {recall:.3f} | {score:.3f} | {np.mean(scores[k]):.3f} "
                  f"({min(scores[k]):.3f}-{max(scores[k]):.3f}) |")
        bounds.append((category, ceiling, any_feature_map(labelled, ks)))
    print("\n| category | without hashing noise: best F1 (at distance) | "
          + " | ".join(f"any feature map, g = {g}: F1 at k = {'/'.join(map(str, ks))}" for g in EXPONENTS) + " |")
    print("|---|---:|" + "---:|" * len(EXPONENTS))
    for category, (score, distance), best in bounds:
        print(f"| {category} | {score:.3f} ({distance:.1f}) | "
              + " | ".join(" / ".join(f"{best[g][k]:.3f}" for k in ks) for g in EXPONENTS) + " |")
    if args.recipes:
        print_recipes(args.devset, categories, ks)


def print_recipes(devset: Path, categories: list[str], ks: list[int]) -> None:
    """The model's F1 at each k of every weighting x bigram scale x stop words, per category."""
    recipes = [FingerprintSettings(weighting=weighting, bigrams=bigrams, tokenizer=TokenizerSettings(stopwords=stop))
               for weighting in ("tf", "sublinear_tf", "binary") for bigrams in RECIPE_BIGRAMS
               for stop in (True, False)]
    print("\n| weighting | bigrams | stop words | "
          + " | ".join(f"{c}: F1 at k = {'/'.join(map(str, ks))}" for c in categories) + " |")
    print("|---|---:|---|" + "---:|" * len(categories))
    cells: dict[FingerprintSettings, list[str]] = {recipe: [] for recipe in recipes}
    for category in categories:
        texts, labelled = load(devset, category)
        for recipe in recipes:
            expected, _ = model(angles(texts, recipe), labelled, ks)
            cells[recipe].append(" / ".join(f"{expected[k][2]:.3f}" for k in ks))
        log(f"{category}: {len(recipes)} recipes")
    for recipe in recipes:
        default = " (default)" if recipe == FingerprintSettings() else ""
        stop = "dropped" if recipe.tokenizer.stopwords else "kept"
        print(f"| {recipe.weighting}{default} | {recipe.bigrams} | {stop} | " + " | ".join(cells[recipe]) + " |")


if __name__ == "__main__":
    main()
