"""Text -> shingles -> MinHash signature -> LSH band keys (Broder 1997; MMDS ch. 3).

The MinHash mode estimates the Jaccard similarity of two documents' shingle
sets, which is what "near-duplicate" means for most archives:

* **Shingles.** A text is normalized (see :mod:`simdb.normalize`). A text
  written mostly without spaces (Chinese, Japanese, Thai: at least a quarter
  of its letters) is shingled into overlapping character n-grams with spaces
  removed (default 5); any other text into overlapping word n-grams (default
  3). A text shorter than one shingle is one shingle.
* **Hashing, vectorised.** A character n-gram is hashed from its code points
  with a polynomial over 64-bit words and a splitmix64 finaliser; a word
  n-gram likewise from its words' xxh3-64 hashes. No Python loop runs per
  shingle for Chinese text.
* **Signature.** ``num_perm`` min-wise hashes: for each ``i``, the minimum over
  the shingles of the top 32 bits of ``a_i * h + b_i`` (mod 2**64; ``a_i`` odd),
  a multiply-shift hash family. ``a`` and ``b`` come from a seeded numpy
  generator, so they are the same on every machine. Two signatures agree in
  position ``i`` with probability equal to the Jaccard similarity; the share
  of agreeing positions is the estimate. Signatures are stored as ``num_perm``
  little-endian uint32 values (``bytea``).
* **Bands.** The signature is cut into ``bands`` bands of ``rows`` values; a
  band's key is the first 8 bytes of the MD5 of its bytes, as a signed BIGINT.
  PostgreSQL computes the same key with ``md5()``, so SQL can look up a
  signature too. Two documents of similarity ``s`` share at least one band
  key with probability ``1 - (1 - s**rows)**bands`` (the S-curve);
  :func:`choose_bands` picks the layout that keeps that probability at or
  above :data:`CANDIDATE_RECALL` at the threshold with the fewest false
  candidates.
"""

from __future__ import annotations

import functools
import hashlib
import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import xxhash

from ... import native
from ...text.normalize import (PIECE_CHARACTERS, ascii_spaced, bmp_punctuation, fold_and_simplify, normalize,
                               normalized_or_folded, strip_punctuation, text_pieces)
from ...text.scripts import ASTRAL_CHARACTER, WITHOUT_SPACES, WITHOUT_SPACES_CHARACTER, character_class, expand
from ..base import DEFAULT_SEED

#: Names the text -> signature recipe; bump on any change that can change a signature.
ALGORITHM = "minhash32-v1"
#: With ``verify="exact"``, distances count ten-thousandths of Jaccard distance: a pair's distance is
#: ``ceil((1 - J) * EXACT_SCALE)``, so ``J >= t`` exactly when the distance is at most ``(1 - t) * EXACT_SCALE``.
EXACT_SCALE = 10_000
#: Exact mode: a pair whose exact Jaccard reaches the decision is let through the signature stage unless its
#: estimate is so far below that this would happen less often than once in this many pairs.
EXACT_MISS = 1e-6
VERIFY = ("estimate", "exact")
#: Band layouts are chosen so that a pair exactly at the threshold becomes a candidate at least this often.
CANDIDATE_RECALL = 0.995
MAX_BANDS = 64

_POLY = np.uint64(0x9E37_79B9_7F4A_7C15)
_SPLITMIX = (np.uint64(30), np.uint64(0xBF58_476D_1CE4_E5B9), np.uint64(27), np.uint64(0x94D0_49BB_1331_11EB),
             np.uint64(31))


def candidate_probability(similarity: float, bands: int, rows: int) -> float:
    """The LSH S-curve: chance that two documents of Jaccard ``similarity`` share a band key."""
    return 1.0 - (1.0 - similarity ** rows) ** bands


def choose_bands(threshold: float, num_perm: int, recall: float = CANDIDATE_RECALL) -> tuple[int, int]:
    """``(bands, rows)`` with ``bands * rows <= num_perm``: the most rows per band (fewest false
    candidates) whose S-curve still reaches ``recall`` at ``threshold``, using as many bands as fit.

    Misses at the candidate stage cannot be recovered, false candidates are only verified and
    dropped, so recall at the threshold comes first.
    """
    if not 0.0 < threshold < 1.0:
        raise ValueError(f"the threshold must be between 0 and 1 (exclusive), not {threshold}")
    best = None
    for rows in range(1, num_perm + 1):
        bands = min(num_perm // rows, MAX_BANDS)
        if bands < 1:
            break
        if candidate_probability(threshold, bands, rows) >= recall:
            best = (bands, rows)
    if best is None:
        raise ValueError(f"{num_perm} permutations cannot reach candidate recall {recall} at threshold "
                         f"{threshold} with at most {MAX_BANDS} bands: use more permutations or a higher threshold")
    return best


@dataclass(frozen=True)
class MinHashSettings:
    """Everything that decides a text's signature and its band keys; stored with the index."""

    threshold: float = 0.8
    num_perm: int = 128
    bands: int = 0
    rows: int = 0
    char_ngram: int = 5
    word_ngram: int = 3
    seed: int = DEFAULT_SEED
    algorithm: str = ALGORITHM
    #: ``estimate``: the signatures decide (the share of equal positions). ``exact``: the signatures find the
    #: candidates, and the exact Jaccard similarity of the two texts' shingle sets decides.
    verify: str = "estimate"

    def __post_init__(self) -> None:
        if self.verify not in VERIFY:
            raise ValueError(f"verify must be one of {', '.join(VERIFY)}, not {self.verify!r}")
        if self.verify == "exact" and abs(self.threshold * EXACT_SCALE - round(self.threshold * EXACT_SCALE)) > 1e-6:
            raise ValueError(f"with exact verification the threshold must be a multiple of {1 / EXACT_SCALE:g}, "
                             f"not {self.threshold}")
        if not 16 <= self.num_perm <= 1024 or self.num_perm % 4:
            raise ValueError(f"the number of permutations must be a multiple of 4 from 16 to 1024, not {self.num_perm}")
        if not 0.0 < self.threshold < 1.0:
            raise ValueError(f"the threshold must be between 0 and 1 (exclusive), not {self.threshold}")
        for name in ("char_ngram", "word_ngram"):
            if not 1 <= getattr(self, name) <= 16:
                raise ValueError(f"{name.replace('_', ' ')} size must be between 1 and 16, not {getattr(self, name)}")
        if not self.bands and not self.rows:
            bands, rows = choose_bands(self.threshold, self.num_perm)
            object.__setattr__(self, "bands", bands)
            object.__setattr__(self, "rows", rows)
        if self.bands < 1 or self.rows < 1 or self.bands * self.rows > self.num_perm or self.bands > MAX_BANDS:
            raise ValueError(f"{self.bands} bands of {self.rows} rows do not fit {self.num_perm} permutations "
                             f"(at most {MAX_BANDS} bands)")
        if not 0 <= self.seed < 2**64:
            raise ValueError("the seed must be an unsigned 64-bit integer")

    @cached_property
    def permutations(self) -> tuple[np.ndarray, np.ndarray]:
        """The ``a`` (odd) and ``b`` multipliers of the hash family, from the seed."""
        generator = np.random.Generator(np.random.PCG64(self.seed))
        a = generator.integers(0, 2**64, size=self.num_perm, dtype=np.uint64, endpoint=False) | np.uint64(1)
        b = generator.integers(0, 2**64, size=self.num_perm, dtype=np.uint64, endpoint=False)
        return a, b

    @property
    def signature_bytes(self) -> int:
        return 4 * self.num_perm

    @property
    def exact(self) -> bool:
        return self.verify == "exact"

    @property
    def scale(self) -> int:
        """What a distance counts to: signature positions, or ten-thousandths of Jaccard distance (exact)."""
        return EXACT_SCALE if self.exact else self.num_perm

    @property
    def max_distance(self) -> int:
        """The largest distance at the threshold."""
        return self.distance_for(self.threshold)

    def distance_for(self, similarity: float) -> int:
        """The largest distance of a similarity of at least ``similarity``: ``scale - ceil(similarity * scale)``
        (estimate: positions two signatures may differ in)."""
        return self.scale - math.ceil(similarity * self.scale - 1e-9)

    def distances_of(self, positions: np.ndarray) -> np.ndarray:
        """Signature positions that differ, as distances: themselves, or (exact) the estimate's distance in
        ten-thousandths, rounded up."""
        positions = np.asarray(positions, dtype=np.int64)
        return (positions * EXACT_SCALE + self.num_perm - 1) // self.num_perm if self.exact else positions

    @functools.lru_cache(maxsize=64)  # noqa: B019 (settings are frozen and few): a binomial tail, 61-580 us
    def candidate_distance(self, max_distance: int) -> int:
        """Exact mode: the distance of estimates up to which a pair is judged by its texts, when judging at
        ``max_distance``: a pair exactly at ``max_distance`` has a larger estimate with probability at most
        :data:`EXACT_MISS` (the differing positions are binomial, ``num_perm`` trials of ``max_distance /
        scale``). Estimate mode: ``max_distance``."""
        if not self.exact:
            return max_distance
        p, n = max_distance / EXACT_SCALE, self.num_perm
        if p <= 0:
            positions = 0
        elif p >= 1:
            positions = n
        else:
            tail, positions = 0.0, n
            for x in range(n, -1, -1):  # P(X >= x), from the top, until it exceeds the miss rate
                tail += math.exp(math.lgamma(n + 1) - math.lgamma(x + 1) - math.lgamma(n - x + 1)
                                 + x * math.log(p) + (n - x) * math.log1p(-p))
                if tail > EXACT_MISS:
                    positions = x
                    break
        return int(self.distances_of(np.array([positions]))[0])

    @cached_property
    def keys(self) -> tuple[tuple[int, ...], ...]:
        """For each band, the signature positions it is made of."""
        return tuple(tuple(range(b * self.rows, (b + 1) * self.rows)) for b in range(self.bands))

    @property
    def key_columns(self) -> list[str]:
        return [f"key_{i}" for i in range(self.bands)]

    def similarity_of(self, distance: int) -> float:
        """The Jaccard similarity of a distance: the estimate of signatures that differ in ``distance``
        positions, or (exact) ``1 - distance / 10,000``."""
        return (self.scale - distance) / self.scale  # as SQL computes it: the nearest double to the fraction

    def describe(self) -> str:
        decided = ("; decided by the exact Jaccard similarity of the texts' shingles" if self.exact else "")
        return (f"MinHash, {self.num_perm} permutations, {self.bands} bands of {self.rows} rows, "
                f"threshold {self.threshold:g} (a pair at the threshold is a candidate with probability "
                f"{candidate_probability(self.threshold, self.bands, self.rows):.4f}){decided}")


def _mix(values: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: spreads the bits of a polynomial hash over all 64."""
    s1, m1, s2, m2, s3 = _SPLITMIX
    values = values ^ (values >> s1)
    values = values * m1
    values = values ^ (values >> s2)
    values = values * m2
    return values ^ (values >> s3)


def _ngram_hashes(units: np.ndarray, n: int) -> np.ndarray:
    """uint64 hashes of every run of ``n`` consecutive units (the whole array when it is shorter)."""
    count = max(len(units) - n + 1, 1)
    n = min(n, len(units))
    units = units.astype(np.uint64, copy=False)
    hashes = np.zeros(count, dtype=np.uint64)
    for offset in range(n):
        hashes = hashes * _POLY + units[offset:offset + count]
    return _mix(hashes + np.uint64(n))


#: Shingles hashed and reduced at a time: a text's shingle hashes are made a window of this many at a time
#: (:func:`shingle_hash_windows`), and a text longer than this many characters is read a piece at a time, so
#: that what a text holds beside its own characters is a window's arrays, not several arrays of 8 bytes a
#: character (one text of 50M characters took gigabytes). The hashes are the same, window after window.
WINDOW = 1 << 18


def _ngram_hash_windows(units: np.ndarray, n: int) -> Iterator[np.ndarray]:
    """:func:`_ngram_hashes` of ``units``, :data:`WINDOW` hashes at a time (each window's units overlap the
    next one's by ``n - 1``)."""
    for start in range(0, max(len(units) - n + 1, 1), WINDOW):
        yield _ngram_hashes(units[start:start + WINDOW + n - 1], n)


@functools.cache
def _not_counted() -> tuple[re.Pattern, re.Pattern]:
    """Runs of characters of the Basic Multilingual Plane that are not letters (``str.isalpha``), and runs
    of those that are not in a script written without spaces: deleting them leaves what is counted."""
    bmp = [chr(cp) for cp in range(0x10000) if not 0xD800 <= cp < 0xE000]
    return (re.compile(f"[{character_class(c for c in bmp if not c.isalpha())}]+"),
            re.compile(f"[{character_class(c for c in bmp if not WITHOUT_SPACES_CHARACTER.match(c))}]+"))


def writes_without_spaces(text: str) -> bool:
    """True when at least a quarter of the letters belong to scripts written without spaces."""
    letters, without_spaces = letter_counts(text)
    return letters > 0 and 4 * without_spaces >= letters


def letter_counts(text: str) -> tuple[int, int]:
    """(letters, letters of scripts written without spaces) of ``text``."""
    if ASTRAL_CHARACTER.search(text):
        return (sum(1 for c in text if c.isalpha()),
                len(text) - len(WITHOUT_SPACES_CHARACTER.sub("", text)))  # no list of every one
    not_letters, not_without_spaces = _not_counted()  # the same counts, with no loop over the characters in Python
    return len(not_letters.sub("", text)), len(not_without_spaces.sub("", text))


#: Flags of a Basic Multilingual Plane character (:func:`_character_flags`).
_SEPARATOR, _LETTER, _WITHOUT_SPACES = 1, 2, 4


@functools.cache
def _character_flags() -> np.ndarray:
    """For each code point of the Basic Multilingual Plane, what the shingles need to know of it:
    ``_SEPARATOR`` (whitespace, punctuation or a symbol: what normalization turns into spaces), ``_LETTER``
    (``str.isalpha``), ``_WITHOUT_SPACES`` (a script written without spaces). Built once per process."""
    flags = np.zeros(0x10000, dtype=np.uint8)
    separators = [ord(c) for c in bmp_punctuation()]
    separators += [cp for cp in range(0x10000) if chr(cp).isspace()]
    flags[separators] |= _SEPARATOR
    flags[[cp for cp in range(0x10000) if chr(cp).isalpha()]] |= _LETTER
    flags[[ord(c) for c in expand(WITHOUT_SPACES) if c <= "\uffff"]] |= _WITHOUT_SPACES
    return flags


#: Shorter texts are classified by regular expressions: the table lookups' fixed cost outweighs their gain.
TABLE_FROM = 100


def shingle_hashes(text: str, settings: MinHashSettings) -> np.ndarray:
    """The uint64 hashes of a text's shingles (with repeats): :func:`shingle_hash_windows` joined."""
    windows = list(shingle_hash_windows(text, settings))
    return windows[0] if len(windows) == 1 else np.concatenate(windows)


def shingle_hash_windows(text: str, settings: MinHashSettings) -> Iterator[np.ndarray]:
    """The uint64 hashes of a text's shingles (with repeats), a window of at most :data:`WINDOW` at a time.

    Text of some length without a character beyond the Basic Multilingual Plane has its code points
    classified by one table lookup each: the characters normalization keeps, whether the text writes
    without spaces (:func:`writes_without_spaces` of the normalized text), and, for character shingles,
    the characters themselves, without building the normalized text; a long text a piece at a time. ASCII
    text is split into words by one ``str.translate``. Other text goes the plain way
    (:func:`plain_shingle_hashes`); the tests hold the ways equal.
    """
    folded = fold_and_simplify(text)
    if folded.isascii():  # no script without spaces: words
        spaced = ascii_spaced(folded)
        if not spaced.isspace() and spaced:
            return _word_shingle_windows(text_pieces(spaced, PIECE_CHARACTERS), settings)
    elif len(folded) >= TABLE_FROM:
        classes = _table_classes(folded)
        if classes is not None:
            kept, letters, without_spaces = classes
            if kept:
                if letters and 4 * without_spaces >= letters:
                    return _ngram_hash_windows_of(_kept_units(folded), settings.char_ngram, kept)
                return _word_shingle_windows(map(strip_punctuation, text_pieces(folded, PIECE_CHARACTERS)), settings)
    else:
        normalized = strip_punctuation(folded)
        if normalized:
            return _windows_of_normalized(normalized, settings)
    if len(text) > PIECE_CHARACTERS:  # the same normalized text, a piece at a time
        pieces = [normalized for piece in text_pieces(text, PIECE_CHARACTERS) if (normalized := normalize(piece))]
        if pieces:
            return _windows_of_normalized_pieces(pieces, settings)
    return _windows_of_normalized(normalized_or_folded(text)[0], settings)


def _windows_of_normalized_pieces(pieces: list[str], settings: MinHashSettings) -> Iterator[np.ndarray]:
    """:func:`_windows_of_normalized` of ``" ".join(pieces)``, without joining them: each piece ends where the
    whole text has a separator, so their normalized texts joined by a space are the whole text's."""
    letters = without_spaces = 0
    for piece in pieces:
        piece_letters, piece_without_spaces = letter_counts(piece)
        letters, without_spaces = letters + piece_letters, without_spaces + piece_without_spaces
    if letters and 4 * without_spaces >= letters:
        total = sum(len(piece) - piece.count(" ") for piece in pieces)
        units = (np.frombuffer(piece.replace(" ", "").encode("utf-32-le"), dtype="<u4") for piece in pieces)
        return _ngram_hash_windows_of(units, settings.char_ngram, total)
    return _word_shingle_windows(pieces, settings)


def _pieces(text: str) -> Iterator[str]:
    """``text`` in slices of :data:`WINDOW` characters (for what reads characters one by one)."""
    for start in range(0, len(text), WINDOW):
        yield text[start:start + WINDOW]


def _table_classes(folded: str) -> tuple[int, int, int] | None:
    """(characters normalization keeps, letters among them, letters of scripts without spaces among them) of
    folded text, by one table lookup a character, a piece at a time; None when a character lies beyond the
    Basic Multilingual Plane."""
    table, kept, letters, without_spaces = _character_flags(), 0, 0, 0
    for piece in _pieces(folded):
        units = np.frombuffer(piece.encode("utf-32-le"), dtype="<u4")
        if units.max() > 0xFFFF:
            return None
        flags = table[units]
        flags = flags[(flags & _SEPARATOR) == 0]
        kept += len(flags)
        letters += np.count_nonzero(flags & _LETTER)
        without_spaces += np.count_nonzero(flags & _WITHOUT_SPACES)
    return kept, letters, without_spaces


def _kept_units(folded: str) -> Iterator[np.ndarray]:
    """The code points (uint32) of the characters normalization keeps, a piece at a time."""
    table = _character_flags()
    for piece in _pieces(folded):
        units = np.frombuffer(piece.encode("utf-32-le"), dtype="<u4")
        yield units[(table[units] & _SEPARATOR) == 0]


def _ngram_hash_windows_of(pieces: Iterator[np.ndarray], n: int, total: int) -> Iterator[np.ndarray]:
    """:func:`_ngram_hash_windows` of the units ``pieces`` hold one after another (``total`` of them), without
    joining them: each piece's n-grams with the last ``n - 1`` units before it."""
    if total < n:  # one shingle, the whole text
        yield _ngram_hashes(np.concatenate(list(pieces)), n)
        return
    carried = np.empty(0, dtype=np.uint32)
    for piece in pieces:
        units = np.concatenate((carried, piece)) if len(carried) else piece
        if len(units) >= n:
            yield from _ngram_hash_windows(units, n)
            carried = units[len(units) - n + 1:]
        else:
            carried = units


def plain_shingle_hashes(text: str, settings: MinHashSettings) -> np.ndarray:
    """:func:`shingle_hashes` by its definition: normalize, then shingle by characters (spaces removed) if the
    text writes without spaces, else by words."""
    normalized, _ = normalized_or_folded(text)  # only punctuation or symbols: the folded characters themselves
    return np.concatenate(list(_windows_of_normalized(normalized, settings)))


def _windows_of_normalized(normalized: str, settings: MinHashSettings) -> Iterator[np.ndarray]:
    if writes_without_spaces(normalized):
        characters = normalized.replace(" ", "")
        units = np.frombuffer(characters.encode("utf-32-le"), dtype="<u4")
        return _ngram_hash_windows(units, settings.char_ngram)
    return _word_shingle_windows(text_pieces(normalized, PIECE_CHARACTERS), settings)


def _word_shingle_windows(pieces: Iterable[str], settings: MinHashSettings) -> Iterator[np.ndarray]:
    """The word shingles' hashes of a text whose words are separated by whitespace (and hold no punctuation),
    given in pieces that split no word, a window at a time: the words' own hashes are taken a piece at a time,
    so that no list of the text's words is built."""
    seed = settings.seed
    units = np.concatenate([np.fromiter((xxhash.xxh3_64_intdigest(w.encode("utf-8"), seed) for w in words),
                                        dtype=np.uint64, count=len(words)) for words in map(str.split, pieces)])
    for hashes in _ngram_hash_windows(units, settings.word_ngram):
        yield hashes ^ np.uint64(0x5157_4F52_4453)  # words never equal characters


def shingle_set(text: str, settings: MinHashSettings) -> np.ndarray:
    """The text's distinct shingle hashes, sorted: the set whose Jaccard similarity exact mode decides by (each
    window's set first, so that a long text's repeats are never all held)."""
    windows = [np.unique(hashes) for hashes in shingle_hash_windows(text, settings)]
    return windows[0] if len(windows) == 1 else np.unique(np.concatenate(windows))


def exact_distances(sets: dict[int, np.ndarray], left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """``ceil((1 - J) * EXACT_SCALE)`` of the shingle sets ``sets[left[i]]`` and ``sets[right[i]]``, computed in
    integers (``J`` = shared / all), so that ``J >= t`` exactly when the distance is at most ``(1 - t) *
    EXACT_SCALE``."""
    out = np.empty(len(left), dtype=np.int64)
    for i, (a, b) in enumerate(zip(left.tolist(), right.tolist())):
        x, y = sets[a], sets[b]
        shared = len(np.intersect1d(x, y, assume_unique=True))
        union = len(x) + len(y) - shared
        out[i] = ((union - shared) * EXACT_SCALE + union - 1) // union
    return out


def signatures(hash_sets: list[np.ndarray], settings: MinHashSettings) -> np.ndarray:
    """Signatures of many shingle-hash arrays at once: ``(len(hash_sets), num_perm)`` uint32.

    The documents' hashes are laid end to end. The compiled ``minhashes`` (``simdb/csrc/``) takes each
    text's minima in one pass over its hashes, vectorized over the permutations (with AVX-512 about ten times
    numpy's speed); its twin, :func:`_signatures_in_numpy`, makes every permutation one vectorised pass with
    a segmented minimum (``np.minimum.reduceat``). Integer arithmetic: the two give the same bits.
    """
    out = np.empty((len(hash_sets), settings.num_perm), dtype=np.uint32)
    if not hash_sets:
        return out
    a, b = settings.permutations
    lengths = np.fromiter((len(h) for h in hash_sets), dtype=np.int64, count=len(hash_sets))
    if (lengths == 0).any():
        raise ValueError("every document needs at least one shingle")
    values = np.concatenate(hash_sets).astype(np.uint64, copy=False)
    _minhashes(values, lengths, a, b, out)
    return out


def _signatures_in_numpy(values: np.ndarray, lengths: np.ndarray, a: np.ndarray, b: np.ndarray,
                         out: np.ndarray) -> np.ndarray:
    """:func:`signatures` by numpy, the definition (the compiled ``minhashes`` gives the same bits)."""
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    permuted = np.empty_like(values)
    minima = np.empty((len(a), len(lengths)), dtype=np.uint64)
    for i in range(len(a)):  # two in-place passes and a segmented minimum per permutation
        np.multiply(values, a[i], out=permuted)
        np.add(permuted, b[i], out=permuted)
        np.minimum.reduceat(permuted, starts, out=minima[i])
    # the top 32 bits of the minimum are the minimum of the top 32 bits (shifting keeps the order)
    out[:] = (minima >> np.uint64(32)).T
    return out


#: Chosen once (:mod:`simdb.native`): the compiled minima where built (each text's in one pass, vectorized
#: over the permutations), else their numpy twin; either fills ``out``.
_minhashes = native.chosen("minhashes", _signatures_in_numpy)


def signature(text: str, settings: MinHashSettings) -> np.ndarray:
    """One text's signature: ``num_perm`` uint32 values, the minima of its windows' minima (the same minima:
    a long text's shingle hashes are never all held)."""
    return np.minimum.reduce([signatures([hashes], settings)[0] for hashes in shingle_hash_windows(text, settings)])


def to_bytes(signature_row: np.ndarray) -> bytes:
    """The stored form: little-endian uint32 values."""
    return np.ascontiguousarray(signature_row, dtype="<u4").tobytes()


def band_keys(signature_row: np.ndarray, settings: MinHashSettings) -> tuple[int, ...]:
    """One signed 64-bit key per band: the first 8 bytes of the MD5 of the band's bytes."""
    data = to_bytes(signature_row)
    width = 4 * settings.rows
    return tuple(int.from_bytes(hashlib.md5(data[i * width:(i + 1) * width]).digest()[:8], "big", signed=True)
                 for i in range(settings.bands))


def band_keys_array(signature_rows: np.ndarray, settings: MinHashSettings) -> np.ndarray:
    """Band keys of many signatures: ``(n, num_perm)`` uint32 -> ``(n, bands)`` int64, as :func:`band_keys`.

    The compiled ``band_keys`` (``simdb/csrc/bandkeys.c``, OpenSSL's MD5 in one loop over the signatures and
    their bands) where built, else its twin :func:`_band_keys_in_python`, one ``hashlib`` call per band (3.6 s
    per 100k signatures of 21 bands). The keys are stored, so their function cannot change without a new
    index; the tests hold both to PostgreSQL's ``md5()`` (:func:`simdb.pg.methods.minhash.band_key_sql`)."""
    if not len(signature_rows):
        return np.empty((0, settings.bands), dtype=np.int64)
    rows = np.ascontiguousarray(signature_rows, dtype="<u4").reshape(len(signature_rows), -1)
    out = np.empty((len(rows), settings.bands), dtype=np.int64)
    _band_keys(rows, rows.shape[1], settings.rows, out)
    return out


def _band_keys_in_python(rows: np.ndarray, num_perm: int, band_rows: int, out: np.ndarray) -> None:
    """:func:`band_keys_array` by ``hashlib``, the definition: fills ``out`` (``(n, bands)`` int64) with the
    keys of ``rows`` (``(n, num_perm)`` little-endian uint32), bands of ``band_rows`` positions.

    MD5 has no vectorized form, so this is one call per band; everything around the calls is done once
    for all rows (one buffer of the signatures, memoryview slices, the digests read as one big-endian
    array): 36 against 51 µs per 128-permutation signature, the MD5 calls being most of what is left."""
    stride, width, bands = 4 * num_perm, 4 * band_rows, out.shape[1]
    view, md5 = memoryview(rows.tobytes()), hashlib.md5
    starts = [band * width for band in range(bands)]
    digests = b"".join(md5(view[offset + start:offset + start + width]).digest()[:8]
                       for offset in range(0, stride * len(rows), stride) for start in starts)
    out[:] = np.frombuffer(digests, dtype=">i8").reshape(len(rows), bands)


#: Chosen once (:mod:`simdb.native`): the compiled keys where built (with OpenSSL), else their hashlib twin.
_band_keys = native.chosen("band_keys", _band_keys_in_python)


def similarity(a: np.ndarray, b: np.ndarray) -> float:
    """The signatures' estimate of Jaccard similarity: the share of equal positions."""
    return float(np.count_nonzero(a == b)) / len(a)


def similarity_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise :func:`similarity` of two ``(n, num_perm)`` arrays."""
    return np.count_nonzero(a == b, axis=1) / a.shape[1]
