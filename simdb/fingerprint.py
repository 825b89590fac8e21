"""Tokens -> weighted features -> 64-bit SimHash (Charikar 2002).

Each distinct token is a feature with a weight (sublinear term frequency by
default: ``1 + ln(tf)``). Each feature is hashed with xxh3-64 under a fixed
seed; bit ``i`` of the fingerprint is set when the weights of the features
whose hash has bit ``i`` set outweigh those whose hash has it clear. The sum is
vectorised with numpy: hash all features, unpack their bits into an
``(n, 64)`` matrix, and take one weighted sum per column.

Bit ``i`` of a fingerprint is ``(fp >> i) & 1``; fingerprints are unsigned
Python ints (see :mod:`simdb.bits` for how they are stored).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import xxhash

from .errors import InputError
from .normalize import fold, normalize
from .tokenize import TokenizerSettings, tokenize

#: Names the whole text -> fingerprint recipe. Any change to normalization,
#: tokenization, weighting or hashing that can change a fingerprint must bump
#: it, so that indexes built by the old recipe refuse to open under the new one.
ALGORITHM = "simhash64-v1"
WEIGHTINGS = ("sublinear_tf", "tf", "binary")
DEFAULT_SEED = 0x51D8_5EED


@dataclass(frozen=True)
class FingerprintSettings:
    """Everything that decides a text's fingerprint; stored with the index."""

    tokenizer: TokenizerSettings = field(default_factory=TokenizerSettings)
    weighting: str = "sublinear_tf"
    seed: int = DEFAULT_SEED
    algorithm: str = ALGORITHM

    def __post_init__(self) -> None:
        if self.weighting not in WEIGHTINGS:
            raise ValueError(f"unknown weighting {self.weighting!r}: choose one of {', '.join(WEIGHTINGS)}")
        if not 0 <= self.seed < 2**64:
            raise ValueError("the hash seed must be an unsigned 64-bit integer")


def weighted_features(tokens: list[str], weighting: str) -> tuple[list[str], np.ndarray]:
    """Distinct tokens and their weights."""
    counts = Counter(tokens)
    features = list(counts)
    if weighting == "binary":
        weights = np.ones(len(features))
    elif weighting == "tf":
        weights = np.fromiter(counts.values(), dtype=np.float64, count=len(features))
    else:
        weights = np.fromiter((1.0 + math.log(c) for c in counts.values()), dtype=np.float64,
                              count=len(features))
    return features, weights


def simhash(features: list[str], weights: np.ndarray, seed: int = DEFAULT_SEED) -> int:
    """The 64-bit SimHash of weighted features."""
    hashes = np.fromiter((xxhash.xxh3_64_intdigest(f.encode("utf-8"), seed) for f in features),
                         dtype="<u8", count=len(features))
    bits = np.unpackbits(hashes.view(np.uint8).reshape(-1, 8), axis=1, bitorder="little")
    totals = weights @ (bits.astype(np.float64) * 2.0 - 1.0)
    packed = np.packbits(totals > 0, bitorder="little")
    return int(packed.view("<u8")[0])


def tokens_for(text: str, settings: FingerprintSettings) -> list[str]:
    """The features' tokens for ``text``, with the fallbacks for odd texts.

    A text with no word left after normalization (only punctuation, say) falls
    back to its folded characters, so that it still gets a fingerprint; a text
    with nothing but whitespace has none and is an error.
    """
    tokens = tokenize(normalize(text), settings.tokenizer)
    if not tokens:
        tokens = [c for c in fold(text) if not c.isspace()]
    if not tokens:
        raise InputError("the text is empty or only whitespace", hint="give every document some text")
    return tokens


def fingerprint(text: str, settings: FingerprintSettings = FingerprintSettings()) -> int:
    """Text -> unsigned 64-bit SimHash under ``settings``."""
    features, weights = weighted_features(tokens_for(text, settings), settings.weighting)
    return simhash(features, weights, settings.seed)


def content_hash(text: str) -> bytes:
    """128-bit hash of the exact text, for telling exact from near duplicates."""
    return xxhash.xxh3_128_digest(text.encode("utf-8"))
