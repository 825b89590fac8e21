"""Tokens -> weighted features -> 64-bit SimHash (Charikar 2002).

Each distinct token is a feature weighted by its term frequency, and each
distinct pair of neighbouring tokens (a *bigram*, hashed from its tokens'
hashes) is one too, weighted by its own frequency times
``min(1, bigrams / tokens)``: word order is what a bag of words loses, and it
matters most in short texts, where a few words decide all the bits (see
docs/quality.md for the measurements that chose these defaults; indexes
created before them keep ``1 + ln(tf)`` and no bigrams). An index created
with an IDF table (learned from a sample of the archive by
``simdb init --idf-from``, then frozen in the database) weights features by
``(1 + ln tf) * ln((N + 1) / (df + 1))`` and keeps only the
``top_features`` heaviest ones (ties broken by the token), so that function words and boilerplate no longer decide the bits and small edits
elsewhere do not move them. Each feature is hashed with xxh3-64 under a fixed
seed; bit ``i`` of the fingerprint is set when the weights of the features
whose hash has bit ``i`` set outweigh those whose hash has it clear. The sums
are vectorised with numpy, for many texts at once where there are many
(:func:`fingerprints`, :func:`simhashes_of_tokens`): token ids and hashes from
a per-process vocabulary, one sort to count every text's features, one
``bincount`` per byte of the hashes.

Bit ``i`` of a fingerprint is ``(fp >> i) & 1``; fingerprints are unsigned
Python ints (see :mod:`simdb.bits` for how they are stored).
"""

from __future__ import annotations

import functools
import itertools
import math
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import xxhash

from ... import native
from ...errors import InputError
from ...text.normalize import PIECE_CHARACTERS, fold, fold_and_simplify, normalized_or_folded
from ...text.tokenize import (STOPWORDS, TokenizerSettings, count_pieces, count_punctuated, dropped,
                              kinds_in_pieces, punctuated_parts, punctuated_parts_many, tokenize)
from ..base import DEFAULT_SEED

if TYPE_CHECKING:
    from threadpoolctl import ThreadpoolController

#: Names the whole text -> fingerprint recipe. Any change to normalization,
#: tokenization, weighting or hashing that can change a fingerprint must bump
#: it, so that indexes built by the old recipe refuse to open under the new one.
ALGORITHM = "simhash64-v2"  # v2: traditional Chinese folded to simplified (OpenCC t2s)
#: Every recipe this simdb can still compute: indexes built by an earlier release keep their answers.
ALGORITHMS = ("simhash64-v1", ALGORITHM)
WEIGHTINGS = ("sublinear_tf", "tf", "binary", "tfidf")
#: Default ``bigrams`` scale: in a text of up to this many tokens a bigram weighs as much as a token.
DEFAULT_BIGRAMS = 50
#: Features kept per document under ``tfidf`` weighting (measured on the devset: see docs/quality.md).
DEFAULT_TOP_FEATURES = 8
#: Terms seen in fewer documents are not stored; they weigh as if seen in one.
IDF_MIN_DF = 2


@dataclass(frozen=True)
class IdfTable:
    """Document frequencies learned from a sample, frozen with the index.

    ``terms`` maps a token to the number of sample documents containing it
    (only tokens in at least :data:`IDF_MIN_DF` of them); ``digest`` names the
    exact table, so an index checks on open that its stored table is intact.
    """

    documents: int
    terms: Mapping[str, int] = field(compare=False, hash=False, repr=False)
    digest: str = ""

    def __post_init__(self) -> None:
        if self.documents < 1:
            raise ValueError("an IDF table needs at least one document")
        if not self.digest:
            object.__setattr__(self, "digest", self.compute_digest())

    def compute_digest(self) -> str:
        hasher = xxhash.xxh3_128(f"{self.documents}\n".encode())
        for term in sorted(self.terms):
            hasher.update(f"{term}\t{self.terms[term]}\n".encode("utf-8"))
        return hasher.hexdigest()

    def check(self) -> None:
        if self.compute_digest() != self.digest:
            raise ValueError("the stored IDF table does not match its digest: it was changed after the index "
                             "was created")

    def weight(self, term: str) -> float:
        return math.log((self.documents + 1) / (self.terms.get(term, 1) + 1))

    @classmethod
    def learn(cls, token_lists: Iterable[list[str]]) -> "IdfTable":
        counts: Counter = Counter()
        documents = 0
        for tokens in token_lists:
            documents += 1
            counts.update(set(tokens))
        if not documents:
            raise ValueError("no documents to learn IDF weights from")
        return cls(documents=documents, terms={t: n for t, n in counts.items() if n >= IDF_MIN_DF})


@dataclass(frozen=True)
class FingerprintSettings:
    """Everything that decides a text's fingerprint; stored with the index."""

    tokenizer: TokenizerSettings = field(default_factory=TokenizerSettings)
    weighting: str = "tf"
    seed: int = DEFAULT_SEED
    algorithm: str = ALGORITHM
    idf: IdfTable | None = None
    #: With ``tfidf``: features kept per document (0 = all).
    top_features: int = 0
    #: Bigrams of adjacent tokens are features too, weighted ``min(1, bigrams / tokens)`` times their
    #: frequency; 0 = tokens only (every index created before bigrams existed).
    bigrams: int = DEFAULT_BIGRAMS

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"unknown fingerprint algorithm {self.algorithm!r}: this simdb computes "
                             f"{', '.join(ALGORITHMS)}")
        if self.weighting not in WEIGHTINGS:
            raise ValueError(f"unknown weighting {self.weighting!r}: choose one of {', '.join(WEIGHTINGS)}")
        if (self.weighting == "tfidf") != (self.idf is not None):
            raise ValueError("tfidf weighting needs an IDF table (learned from a sample: simdb init --idf-from SAMPLE), "
                             "and an IDF table needs tfidf weighting")
        if self.top_features < 0:
            raise ValueError(f"top features must be 0 (all) or more, not {self.top_features}")
        if self.bigrams < 0:
            raise ValueError(f"the bigram scale must be 0 (no bigrams) or more, not {self.bigrams}")
        if self.bigrams and self.weighting == "tfidf":
            raise ValueError("bigrams have no IDF weights: tfidf weighting needs --bigrams 0")
        if not 0 <= self.seed < 2**64:
            raise ValueError("the hash seed must be an unsigned 64-bit integer")

    @property
    def simplifies_script(self) -> bool:
        """Whether traditional Chinese is folded to simplified (every recipe since ``simhash64-v1``)."""
        return self.algorithm != "simhash64-v1"


#: ``1 + ln(tf)`` for the common term frequencies, computed once (the same ``math.log`` values).
_SUBLINEAR = np.array([0.0] + [1.0 + math.log(c) for c in range(1, 1024)])


def term_weights(frequencies: np.ndarray, weighting: str) -> np.ndarray:
    """Weights of features seen ``frequencies`` times (``tfidf``: before the IDF factor)."""
    if weighting == "binary":
        return np.ones(len(frequencies))
    if weighting == "tf":
        return frequencies.astype(np.float64)
    if len(frequencies) and frequencies.max() < len(_SUBLINEAR):
        return _SUBLINEAR[frequencies]
    return np.array([1.0 + math.log(c) for c in frequencies.tolist()])


def weighted_features(tokens: list[str] | Counter, weighting: str, idf: IdfTable | None = None,
                      top_features: int = 0) -> tuple[list[str], np.ndarray]:
    """Distinct tokens (given as a list, or already counted) and their weights (with ``tfidf``: the
    ``top_features`` heaviest)."""
    counts = tokens if isinstance(tokens, Counter) else Counter(tokens)
    features = list(counts)
    weights = term_weights(np.fromiter(counts.values(), dtype=np.int64, count=len(features)), weighting)
    if weighting == "tfidf":
        weights = weights * np.fromiter((idf.weight(f) for f in features), dtype=np.float64, count=len(features))
        if 0 < top_features < len(features):
            kept = sorted(range(len(features)), key=lambda i: (-weights[i], features[i]))[:top_features]
            features, weights = [features[i] for i in kept], weights[kept]
        if not weights.any():  # every token is in every sample document: fall back to term frequency
            weights = np.ones(len(features))
    return features, weights


def feature_hashes(features: list[str], seed: int = DEFAULT_SEED) -> np.ndarray:
    """xxh3-64 of each feature's UTF-8 under ``seed``."""
    return np.fromiter((xxhash.xxh3_64_intdigest(f.encode("utf-8"), seed) for f in features),
                       dtype="<u8", count=len(features))


def bigram_hashes(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """The hash of the bigram of two tokens, from the tokens' hashes: the first rotated by 32 bits, xored
    with the second (so the order counts), through the splitmix64 finalizer (Steele, Lea & Flood 2014;
    every input bit flips each output bit with probability close to 1/2). It serves a SimHash as a hash of
    the pair as one string would, without building, encoding and hashing the string."""
    with np.errstate(over="ignore"):
        x = ((first << np.uint64(32)) | (first >> np.uint64(32))) ^ second
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


@functools.cache
def _blas() -> ThreadpoolController:
    from threadpoolctl import ThreadpoolController  # here: a command that sums no weights in numpy skips it

    return ThreadpoolController()


def one_blas_thread():
    """A context in which numpy's BLAS runs on one thread. simdb's matrix products are small; with more
    threads, OpenBLAS wakes its pool for each one and the pool spin-waits after it: measured in a worker
    fingerprinting Chinese text, 1,160 us of CPU a document where one thread takes 730, taken from the other
    worker and the database on a 2-core machine."""
    return _blas().limit(limits=1, user_api="blas")


def simhash(features: list[str], weights: np.ndarray, seed: int = DEFAULT_SEED) -> int:
    """The 64-bit SimHash of weighted features: see :func:`simhash_of_hashes`."""
    return simhash_of_hashes(feature_hashes(features, seed), weights)


def simhash_of_hashes(hashes: np.ndarray, weights: np.ndarray) -> int:
    """The 64-bit SimHash of features with these hashes and weights: bit ``i`` is set when the exact sum of
    the weights, each signed by bit ``i`` of its feature's hash, is positive.

    The sums are taken in floating point, where their rounding depends on the order of the features and on
    the machine (numpy's matrix product runs different BLAS kernels on different CPUs). Where a sum lies
    within the worst-case rounding error of zero -- equal weights cancelling, which is common -- its sign
    is taken from the exactly rounded sum (:func:`math.fsum`) instead, so a fingerprint is the same on every
    machine and for every order of its features.
    """
    bits = np.unpackbits(hashes.astype("<u8", copy=False).view(np.uint8).reshape(-1, 8), axis=1,
                         bitorder="little")
    # the signed sum is 2 * (the weights whose bit is set) - (all the weights)
    with one_blas_thread():
        totals = 2.0 * (weights @ bits) - weights.sum()
    # each of the two sums, in any order, errs by at most (n - 1) * 2**-53 * sum(|w|), the doubling is exact
    # and the difference rounds once: (4n + 4) * 2**-53 * sum(|w|) leaves room for the bound's own rounding
    bound = (2 * len(hashes) + 2) * 2.0**-52 * float(np.abs(weights).sum())
    for column in np.flatnonzero(np.abs(totals) <= bound):
        totals[column] = math.fsum((weights * (bits[:, column] * 2.0 - 1.0)).tolist())
    packed = np.packbits(totals > 0, bitorder="little")
    return int(packed.view("<u8")[0])


def tokens_for(text: str, settings: FingerprintSettings) -> list[str]:
    """The features' tokens for ``text``, with the fallbacks for odd texts.

    A text with no word left after normalization (only punctuation, say) falls
    back to its folded characters, so that it still gets a fingerprint; a text
    with nothing but whitespace has none and is an error.
    """
    return dropped(_undropped_tokens(text, settings), settings.tokenizer)


def _undropped_tokens(text: str, settings: FingerprintSettings) -> list[str]:
    """:func:`tokens_for`, but with the ``auto`` tokenizer's spaces and stop words still in where it takes its
    fast path (:func:`simhashes_of_tokens` drops them; dropping them again from the other paths' tokens
    changes nothing)."""
    if settings.tokenizer.name == "auto":  # the default: without building the normalized text
        tokens = punctuated_parts(fold_and_simplify(text, settings.simplifies_script), settings.tokenizer)
        if tokens:
            return tokens
    return _plain_tokens(text, settings)


def _plain_tokens(text: str, settings: FingerprintSettings) -> list[str]:
    normalized, folded = normalized_or_folded(text, simplify_script=settings.simplifies_script)
    if folded:
        return [c for c in normalized if c != " "]
    return tokenize(normalized, settings.tokenizer) or [c for c in fold(text) if not c.isspace()]


def token_counts(text: str, settings: FingerprintSettings) -> Counter:
    """``Counter(tokens_for(text, settings))``, by the ``auto`` tokenizer's fast path where it applies (a long
    text a piece at a time)."""
    if settings.tokenizer.name == "auto":  # the default: without building the normalized text
        counts = (count_pieces(text, settings.tokenizer, settings.simplifies_script, PIECE_CHARACTERS)
                  if len(text) > PIECE_CHARACTERS else
                  count_punctuated(fold_and_simplify(text, settings.simplifies_script), settings.tokenizer))
        if counts:
            return counts
    return Counter(tokens_for(text, settings))


def fingerprint(text: str, settings: FingerprintSettings = FingerprintSettings()) -> int:
    """Text -> unsigned 64-bit SimHash under ``settings``."""
    if not settings.bigrams:
        features, weights = weighted_features(token_counts(text, settings), settings.weighting, settings.idf,
                                              settings.top_features)
        return simhash(features, weights, settings.seed)
    sketch = _long_fingerprint(text, settings)
    return simhashes_of_tokens([_undropped_tokens(text, settings)], settings)[0] if sketch is None else sketch


def _long_fingerprint(text: str, settings: FingerprintSettings) -> int | None:
    """The fingerprint (with bigrams) of a text longer than :data:`PIECE_CHARACTERS`, its tokens read a piece at
    a time and held as ids of a vocabulary of its own (the process's starts again past its limit, which would
    make the ids read before stale); None for a shorter text, another tokenizer than ``auto``, or a text
    without tokens there (it takes the plain way, with its fallbacks)."""
    if len(text) <= PIECE_CHARACTERS or settings.tokenizer.name != "auto":
        return None
    vocabulary = _Vocabulary(settings.seed, limit=None)
    kinds: tuple[list[np.ndarray], ...] = ([], [], [])  # the Han tokens, the words, the shingles: in that order
    for piece in kinds_in_pieces(text, settings.tokenizer, settings.simplifies_script, PIECE_CHARACTERS):
        for ids, tokens in zip(kinds, piece):
            if tokens:
                ids.append(vocabulary.lookup(tokens).astype(np.int32))  # 4 bytes a token until the end
    if not any(kinds):
        return None
    ids = np.concatenate([ids for kind in kinds for ids in kind], dtype=np.int64)
    del kinds
    lengths = np.array([len(ids)], dtype=np.int64)
    return _sums_of_ids(ids, lengths, vocabulary, settings)[0]


def feature_vector(text: str, settings: FingerprintSettings = FingerprintSettings()) -> tuple[np.ndarray, np.ndarray]:
    """The hashes and weights of the features whose SimHash is ``text``'s fingerprint, one entry per distinct
    feature: ``simhash_of_hashes(*feature_vector(text, settings)) == fingerprint(text, settings)``.

    Two fingerprints differ in a bit with probability ``angle / pi`` between these vectors (over the draw of
    the hash seed), so this is what to compare when asking how far apart SimHash *can* put two texts
    (``scripts/simhash_ceiling.py``); indexing goes through :func:`fingerprints`, which sums whole batches.
    """
    if not settings.bigrams:
        features, weights = weighted_features(token_counts(text, settings), settings.weighting, settings.idf,
                                              settings.top_features)
        return feature_hashes(features, settings.seed), weights
    tokens = tokens_for(text, settings)
    unigrams = Counter(tokens)
    hashes = feature_hashes(list(unigrams), settings.seed)
    of_token = dict(zip(unigrams, hashes.tolist()))
    bigrams = Counter(zip(tokens, tokens[1:]))
    first = np.array([of_token[a] for a, _ in bigrams], dtype="<u8")
    second = np.array([of_token[b] for _, b in bigrams], dtype="<u8")
    counts = np.fromiter(itertools.chain(unigrams.values(), bigrams.values()), dtype=np.int64,
                         count=len(unigrams) + len(bigrams))
    weights = term_weights(counts, settings.weighting)
    weights[len(unigrams):] *= min(1.0, settings.bigrams / len(tokens))
    return np.concatenate((hashes, bigram_hashes(first, second))), weights


def fingerprints(texts: Sequence[str], settings: FingerprintSettings) -> list[int | InputError]:
    """:func:`fingerprint` of each text, or the :class:`InputError` of a text that has none; with bigrams, the
    features of all the texts are counted, hashed and summed together (:func:`simhashes_of_tokens`)."""
    if not settings.bigrams:
        return [_or_error(fingerprint, text, settings) for text in texts]
    long = {i: _long_fingerprint(text, settings) for i, text in enumerate(texts) if len(text) > PIECE_CHARACTERS}
    long = {i: sketch for i, sketch in long.items() if sketch is not None}
    if not long:
        return _short_fingerprints(texts, settings)
    short = iter(_short_fingerprints([text for i, text in enumerate(texts) if i not in long], settings))
    return [long[i] if i in long else next(short) for i in range(len(texts))]


def _short_fingerprints(texts: Sequence[str], settings: FingerprintSettings) -> list[int | InputError]:
    """:func:`fingerprints` of texts of at most :data:`PIECE_CHARACTERS` (with bigrams)."""
    parts = (punctuated_parts_many(texts, settings.tokenizer, settings.simplifies_script)
             if settings.tokenizer.name == "auto" else [None] * len(texts))
    # a text without tokens there (only punctuation, say) takes the plain way, with its fallbacks and errors
    results = [tokens or _or_error(_undropped_tokens, text, settings) for text, tokens in zip(texts, parts)]
    token_lists = [tokens for tokens in results if not isinstance(tokens, InputError)]
    sketches = iter(simhashes_of_tokens(token_lists, settings))
    return [tokens if isinstance(tokens, InputError) else next(sketches) for tokens in results]


def _or_error(function, text: str, settings: FingerprintSettings):
    try:
        return function(text, settings)
    except InputError as exc:
        return exc


#: Distinct tokens whose ids and hashes a process keeps between batches (about 100 bytes each); past this the
#: vocabulary starts again.
VOCABULARY_LIMIT = 1 << 18
#: Up to this many features, one text's sums are taken from a matrix of its hashes' bits (:func:`simhash_of_hashes`),
#: beyond it through byte bins, as for many texts.
FEW_FEATURES = 1 << 12
#: Texts whose features :func:`simhashes_of_tokens` sums in one go.
BATCH_TEXTS = 256
#: The batch's ``(text, id, next id)`` keys stay below this (int64); a batch that could pass it is halved.
KEY_BOUND = 2**62


#: What a vocabulary knows of a token besides its hash: a feature, a stop word, or the space between Han runs.
WORD, STOPWORD, SPACE = 0, 1, 2


class _Vocabulary:
    """Token -> a small integer id, and each id's xxh3-64 hash under one seed and its kind (:data:`WORD`,
    :data:`STOPWORD`, :data:`SPACE`), kept between batches: most of a batch's tokens were seen before, and a
    dictionary lookup costs a fraction of encoding and hashing."""

    def __init__(self, seed: int, limit: int | None = VOCABULARY_LIMIT) -> None:
        self.seed = seed
        #: Held from a batch's first lookup to the end of its sums: the ids, hashes and kinds change together as
        #: another thread adds tokens (or starts the vocabulary again), and a batch's ids must stay those of the
        #: arrays it sums with (re-entrant: a batch too large for its keys is summed in halves)
        self.lock = threading.RLock()
        self.limit = limit  # None: never starts again (one text's vocabulary, whose ids must all stay valid)
        self.ids: dict[str, int] = {}
        self.hashes = np.empty(0, dtype="<u8")
        self.kinds = np.empty(0, dtype=np.int8)

    def lookup(self, tokens: list[str]) -> np.ndarray:
        """The ids of ``tokens`` (new ones are hashed and added)."""
        ids = np.fromiter(map(self.ids.get, tokens, itertools.repeat(-1)), dtype=np.int64, count=len(tokens))
        missing = np.flatnonzero(ids < 0)
        if not len(missing):
            return ids
        added = self.add([tokens[i] for i in missing.tolist()])
        if added is None:  # the ids already read are stale; the empty vocabulary takes them all
            return self.lookup(tokens)
        ids[missing] = added
        return ids

    def add(self, missing: list[str]) -> list[int] | None:
        """The ids of tokens the vocabulary does not hold (repeats allowed), after hashing and adding them; None
        where the vocabulary had to start again to hold them (every id handed out before is then stale)."""
        new = list(dict.fromkeys(missing))
        if self.limit is not None and self.ids and len(self.ids) + len(new) > self.limit:
            self.ids, self.hashes, self.kinds = {}, self.hashes[:0], self.kinds[:0]
            return None
        start = len(self.ids)
        self.ids.update(zip(new, range(start, start + len(new))))
        self.hashes = np.concatenate((self.hashes, feature_hashes(new, self.seed)))
        kinds = [SPACE if token == " " else STOPWORD if token in STOPWORDS else WORD for token in new]
        self.kinds = np.concatenate((self.kinds, np.array(kinds, dtype=np.int8)))
        return list(map(self.ids.__getitem__, missing))


@functools.cache
def _vocabulary(seed: int) -> _Vocabulary:
    return _Vocabulary(seed)


#: Row ``v``, column ``b``: bit ``b`` of the byte ``v`` (1.0 or 0.0).
_BYTE_BITS = ((np.arange(256)[:, None] >> np.arange(8)) & 1).astype(np.float64)


def simhashes_of_tokens(token_lists: Sequence[list[str]], settings: FingerprintSettings) -> list[int]:
    """The SimHash of each text's tokens, in order, under ``settings`` with bigrams, computed for many texts
    with a few numpy passes: the same value as the text alone gives (:func:`simhash_of_hashes` of its
    features), whatever else is in the batch. The tokens are those of :func:`tokens_for`, or the ``auto``
    tokenizer's before :func:`simdb.text.tokenize.dropped` (this drops the same ones).

    Every token of the batch gets an id from the process's :class:`_Vocabulary`, which also says which
    tokens to drop; sorting ``(text, id)`` and
    ``(text, id, next id)`` counts the features of every text at once; the weighted bit sums are one
    ``bincount`` per byte of the hashes (each text's weights binned by the byte's value, then the 256 bins
    summed by their bits). That is a different order of summation than one text's, and the signs do not
    depend on it: a sum within its worst-case rounding error of zero is taken exactly, as in
    :func:`simhash_of_hashes`.
    """
    if len(token_lists) > BATCH_TEXTS:
        return [sketch for start in range(0, len(token_lists), BATCH_TEXTS)
                for sketch in simhashes_of_tokens(token_lists[start:start + BATCH_TEXTS], settings)]
    texts = len(token_lists)
    if not texts:
        return []
    vocabulary = _vocabulary(settings.seed)
    with vocabulary.lock:
        return _batch_simhashes(vocabulary, token_lists, settings)


def _simhashes_in_numpy(vocabulary: _Vocabulary, token_lists: Sequence[list[str]],
                        settings: FingerprintSettings) -> list[int]:
    """:func:`simhashes_of_tokens` of at most :data:`BATCH_TEXTS` texts, in numpy (the definition)."""
    texts = len(token_lists)
    ids = vocabulary.lookup(list(itertools.chain.from_iterable(token_lists)))
    if texts * max(len(vocabulary.ids), 1) ** 2 >= KEY_BOUND and texts > 1:  # the keys below could overflow
        middle = texts // 2
        return simhashes_of_tokens(token_lists[:middle], settings) + simhashes_of_tokens(token_lists[middle:], settings)
    return _simhashes_of_ids(ids, np.fromiter(map(len, token_lists), dtype=np.int64, count=texts), vocabulary,
                             settings)


def _simhashes_of_ids(ids: np.ndarray, lengths: np.ndarray, vocabulary: _Vocabulary,
                      settings: FingerprintSettings) -> list[int]:
    """:func:`simhashes_of_tokens` in numpy, from the texts' token ids (``lengths[t]`` of them for text ``t``,
    text after text)."""
    texts = len(lengths)
    owner = np.repeat(np.arange(texts), lengths)
    kinds = vocabulary.kinds[ids]
    kept = kinds == WORD if settings.tokenizer.stopwords else kinds != SPACE
    only_stopwords = np.bincount(owner[kept], minlength=texts) == 0  # such a text keeps its stop words
    if only_stopwords.any():
        kept |= (kinds != SPACE) & only_stopwords[owner]
    if not kept.all():
        ids, owner = ids[kept], owner[kept]
    lengths = np.bincount(owner, minlength=texts)
    size = max(len(vocabulary.ids), 1)
    keys, frequencies = np.unique(owner * size + ids, return_counts=True)
    text_of, token = np.divmod(keys, size)
    hashes, weights, owners = [vocabulary.hashes[token]], [term_weights(frequencies, settings.weighting)], [text_of]
    same = owner[1:] == owner[:-1]  # neighbours within one text
    if same.any():
        keys, frequencies = np.unique((owner[1:][same] * size + ids[:-1][same]) * size + ids[1:][same],
                                      return_counts=True)
        rest, second = np.divmod(keys, size)
        text_of, first = np.divmod(rest, size)
        scale = np.minimum(1.0, settings.bigrams / np.maximum(lengths, 1))
        hashes.append(bigram_hashes(vocabulary.hashes[first], vocabulary.hashes[second]))
        weights.append(term_weights(frequencies, settings.weighting) * scale[text_of])
        owners.append(text_of)
    return _simhashes(np.concatenate(owners), np.concatenate(hashes), np.concatenate(weights), texts)


#: The weightings ``simdb/csrc/`` computes, by its codes (``tfidf`` has no bigrams, so no batch path).
_COMPILED_WEIGHTINGS = {"tf": 0, "sublinear_tf": 1, "binary": 2}


def _compiled_sums(compiled, ids: np.ndarray, lengths: np.ndarray, vocabulary: _Vocabulary,
                   settings: FingerprintSettings) -> list[int]:
    """:func:`_simhashes_of_ids` by the compiled twin: each text's features counted in hash tables and summed,
    with the same exact signs near zero, hence the same fingerprints (``tfidf``: by numpy)."""
    if settings.weighting not in _COMPILED_WEIGHTINGS:
        return _simhashes_of_ids(ids, lengths, vocabulary, settings)
    out = np.empty(len(lengths), dtype=np.uint64)
    compiled.simhashes(ids, lengths, vocabulary.hashes, vocabulary.kinds, _SUBLINEAR, out,
                       _COMPILED_WEIGHTINGS[settings.weighting], settings.bigrams, settings.tokenizer.stopwords)
    return out.tolist()


def _compiled_simhashes(compiled, vocabulary: _Vocabulary, token_lists: Sequence[list[str]],
                        settings: FingerprintSettings) -> list[int]:
    """:func:`_simhashes_in_numpy` by the compiled twins: the ids looked up in the vocabulary's dictionary
    without the interpreter (only the new tokens are added in Python), then :func:`_compiled_sums`."""
    if settings.weighting not in _COMPILED_WEIGHTINGS:
        return _simhashes_in_numpy(vocabulary, token_lists, settings)
    token_lists = token_lists if isinstance(token_lists, list) else list(token_lists)
    lengths = np.fromiter(map(len, token_lists), dtype=np.int64, count=len(token_lists))
    ids = np.empty(int(lengths.sum()), dtype=np.int64)
    missing = compiled.token_ids(token_lists, vocabulary.ids, ids)
    if missing:  # new tokens: only those go through Python
        added = vocabulary.add(missing)
        if added is None:
            ids = vocabulary.lookup(list(itertools.chain.from_iterable(token_lists)))
        else:
            ids[ids < 0] = added
    return _compiled_sums(compiled, ids, lengths, vocabulary, settings)


#: Chosen once (:mod:`simdb.native`): the compiled sums and batches where built, else their numpy twins.
_sums_of_ids = native.chosen(_compiled_sums, _simhashes_of_ids)
_batch_simhashes = native.chosen(_compiled_simhashes, _simhashes_in_numpy)


def _simhashes(owner: np.ndarray, hashes: np.ndarray, weights: np.ndarray, texts: int) -> list[int]:
    """The SimHash of each of ``texts`` texts, from their features' hashes and weights (feature ``i`` belongs to
    text ``owner[i]``)."""
    if texts == 1 and len(hashes) <= FEW_FEATURES:  # fewer numpy calls (a bit matrix of 64 bytes a feature)
        return [simhash_of_hashes(hashes, weights)]
    octets = hashes.astype("<u8", copy=False).view(np.uint8).reshape(-1, 8)
    bins = owner * 256
    sums = np.empty((texts, 64))
    with one_blas_thread():
        for byte in range(8):  # bits 8 * byte ... 8 * byte + 7
            binned = np.bincount(bins + octets[:, byte], weights=weights, minlength=texts * 256)
            sums[:, 8 * byte:8 * byte + 8] = binned.reshape(texts, 256) @ _BYTE_BITS
    # as in simhash_of_hashes: 2 * (the weights whose bit is set) - (all the weights), and the same error bound
    totals = 2.0 * sums - np.bincount(owner, weights=weights, minlength=texts)[:, None]
    features = np.bincount(owner, minlength=texts)
    bound = (2 * features + 2) * 2.0**-52 * np.bincount(owner, weights=np.abs(weights), minlength=texts)
    for text, column in zip(*np.nonzero(np.abs(totals) <= bound[:, None])):
        mine = owner == text
        signs = ((hashes[mine] >> np.uint64(column)) & np.uint64(1)).astype(np.float64) * 2.0 - 1.0
        totals[text, column] = math.fsum((weights[mine] * signs).tolist())
    packed = np.packbits(totals > 0, axis=1, bitorder="little")
    return packed.view("<u8")[:, 0].tolist()


def distinct_tokens(text: str, settings: FingerprintSettings) -> list[str]:
    """A text's distinct tokens under ``settings``: what IDF weights count."""
    return list(token_counts(text, settings))


def learn_idf(texts: Iterable[str], tokenizer: TokenizerSettings = TokenizerSettings(),
              map_texts: Callable = map) -> IdfTable:
    """Document frequencies of the tokens of ``texts`` (a sample of the archive; texts of nothing but whitespace
    are left out), for tfidf weighting; ``map_texts(function, texts)`` tokenizes them (on every core:
    :func:`simdb.parallel.map_texts`)."""
    tokens = functools.partial(distinct_tokens, settings=FingerprintSettings(tokenizer=tokenizer))
    return IdfTable.learn(map_texts(tokens, (text for text in texts if text.strip())))
