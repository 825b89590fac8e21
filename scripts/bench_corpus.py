"""The inputs the ingest benchmarks share: text documents composed of real sentences, random fingerprints.

Used by bench_ingest (and its parts), bench_text, bench_memory, bench_sources and bench_citus.
"""

from __future__ import annotations

import json
import os
import random
import re
from collections import deque

import numpy as np

from bench_common import random_u64

from simdb.ingest import FingerprintedBatch
from simdb.methods.simhash.blocks import DEFAULT_MAX_DISTANCE

NEAR_FRACTION = 0.01  # of the random fingerprints: near copies (1..max_distance bits flipped) of stored ones


# -- text ----------------------------------------------------------------------------------------

SENTENCE = re.compile(r"[^。！？；\n]+[。！？；]?")


def corpus_pieces(texts: list[str] | None, rng: random.Random) -> tuple[list[str], list[int]]:
    """(sentences, document lengths in characters) to compose documents from; random Han text without a corpus."""
    if texts:
        sentences = [s.strip() for text in texts for s in SENTENCE.findall(text) if len(s.strip()) >= 4]
        return sentences, [len(text) for text in texts]
    han = [chr(c) for c in range(0x4E00, 0x9FA6)]
    return ["".join(rng.choices(han, k=rng.randint(8, 40))) + "。" for _ in range(50_000)], [1200]


def edited_copy(recent: deque[str], alphabet: str | list[str], rng: random.Random) -> str:
    """One of the ``recent`` texts with 1-3 of its characters replaced from ``alphabet``: a planted near copy."""
    chars = list(rng.choice(recent))
    for _ in range(rng.randint(1, 3)):
        chars[rng.randrange(len(chars))] = rng.choice(alphabet)
    return "".join(chars)


def write_corpus(path: str, count: int, sentences: list[str], lengths: list[int], rng: random.Random,
                 near: float = 0.02) -> int:
    """``count`` JSONL documents of recombined sentences (``near`` of them lightly edited copies); returns bytes."""
    recent: deque[str] = deque(maxlen=2000)
    han = "的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动同工也能下过子说产种面而方后多定行学法所"
    with open(path, "w", encoding="utf-8") as f:
        for i in range(count):
            if recent and rng.random() < near:
                text = edited_copy(recent, han, rng)
            else:
                target, parts, size = rng.choice(lengths), [], 0
                while size < target:
                    parts.append(rng.choice(sentences))
                    size += len(parts[-1])
                text = "".join(parts)
            recent.append(text)
            f.write(json.dumps({"id": f"doc-{i:09d}", "text": text}, ensure_ascii=False) + "\n")
    return os.path.getsize(path)



def write_variants(path: str, count: int, sentences: list[str], lengths: list[int], rng: random.Random,
                   variants: int = 10) -> int:
    """``count`` JSONL documents in which each composed text comes ``variants`` times, its sentences rotated
    (variant j starts at its j-th sentence): all but one of each group are near-duplicates of the others,
    as in an archive of reposts. Lengths from the long side of ``lengths`` (at least 500 characters), so
    that each text has sentences to rotate. Returns bytes."""
    long = [n for n in lengths if n >= 500] or [max(lengths)]
    with open(path, "w", encoding="utf-8") as f:
        i = 0
        while i < count:
            target, parts, size = rng.choice(long), [], 0
            while size < target:
                parts.append(rng.choice(sentences))
                size += len(parts[-1])
            for j in range(min(variants, count - i)):
                shift = j % len(parts)
                text = "".join(parts[shift:] + parts[:shift])
                f.write(json.dumps({"id": f"doc-{i:09d}", "text": text}, ensure_ascii=False) + "\n")
                i += 1
    return os.path.getsize(path)


# -- fingerprints, without text ------------------------------------------------------------------

def near_copies(rng: np.random.Generator, source: np.ndarray, count: int, max_distance: int) -> np.ndarray:
    """``count`` fingerprints, each a random one of ``source`` with 1..max_distance random bits flipped."""
    picks = source[rng.integers(0, len(source), count)]
    masks = [sum(1 << int(b) for b in rng.choice(64, int(d), replace=False)) for d in rng.integers(1, max_distance + 1, count)]
    return picks ^ np.array(masks, dtype=np.uint64)


def new_fingerprints(rng: np.random.Generator, count: int, stored: np.ndarray | None,
                     max_distance: int = DEFAULT_MAX_DISTANCE) -> np.ndarray:
    """Random fingerprints, NEAR_FRACTION of them near copies (1..max_distance bits off) of ``stored`` (or of
    their own earlier part)."""
    fps = random_u64(rng, count)
    planted = int(count * NEAR_FRACTION)
    if planted:
        source = stored if stored is not None and len(stored) else fps[:count - planted]
        fps[count - planted:] = near_copies(rng, source, planted, max_distance)
        fps = fps[rng.permutation(count)]
    return fps


def fingerprinted_batch(rng: np.random.Generator, fps: np.ndarray, prefix: str) -> FingerprintedBatch:
    n = len(fps)
    ids = [f"{prefix}-{i:09d}" for i in range(n)]
    digests = rng.bytes(16 * n)
    return FingerprintedBatch(external_ids=ids, sketches=fps.tolist(),
                              content_hashes=[digests[16 * i:16 * i + 16] for i in range(n)],
                              lengths=rng.integers(200, 5000, n).tolist(), metadata=[{}] * n, origins=ids)
