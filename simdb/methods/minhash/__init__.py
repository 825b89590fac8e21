"""MinHash-LSH: a signature of min-wise hashes per text; near-duplicates reach a Jaccard threshold.

The pipeline: text -> shingles -> signature -> band keys (:mod:`.signature`) -> band joins and the
analysts' functions (:mod:`simdb.pg.methods.minhash`) -> the signatures compared in numpy. Bands are chosen so that a
pair at the threshold becomes a candidate with probability at least 0.995.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import xxhash

from ...errors import IncompatibleIndex, InputError, SimdbError
from ..base import Method
from . import signature as sig
from .signature import ALGORITHM, MinHashSettings


#: Exact mode: the most texts whose shingle sets are held at once while candidate pairs are decided (a 100k chunk
#: of long texts with many copies holds tens of thousands of candidates; their shingle sets all at once,
#: gigabytes). Counted in texts, not pairs: 20,000 pairs held up to 40,000 texts and their sets, and an archive
#: that grows gives a chunk more candidates, so that the memory an ingest took grew with the archive.
DECIDE_TEXTS = 2_000


def _few_texts(pairs: np.ndarray, texts: int) -> Iterator[slice]:
    """Consecutive slices of ``(a, b, ...)`` rows, each naming at most ``texts`` distinct ids (or one row)."""
    start, seen = 0, set()
    for row, (a, b) in enumerate(pairs[:, :2].tolist()):
        if len(seen) + (a not in seen) + (b not in seen and b != a) > texts and row > start:
            yield slice(start, row)
            start, seen = row, set()
        seen.update((a, b))
    if start < len(pairs):
        yield slice(start, len(pairs))


@dataclass(frozen=True)
class MinHash(Method):
    """MinHash-LSH with its settings (shingles, permutations, bands)."""

    name = "minhash"
    title = "MinHash"
    calibration_symbol = "t"
    calibration_axis = "threshold t (Jaccard estimate)"

    settings: MinHashSettings = field(default_factory=MinHashSettings)

    @classmethod
    def new(cls, *, threshold: float = MinHashSettings.threshold, num_perm: int = MinHashSettings.num_perm,
            char_ngram: int = MinHashSettings.char_ngram, word_ngram: int = MinHashSettings.word_ngram,
            verify: str = MinHashSettings.verify) -> "MinHash":
        return cls(MinHashSettings(threshold=threshold, num_perm=num_perm, char_ngram=char_ngram,
                                   word_ngram=word_ngram, verify=verify))

    @property
    def distance_unit(self) -> str:
        return "ten-thousandths of Jaccard distance" if self.settings.exact else "signature positions"

    @property
    def needs_texts(self) -> bool:
        return self.settings.exact

    @property
    def layout(self) -> MinHashSettings:
        """The bands are the key layout, and they are part of the settings."""
        return self.settings

    @property
    def recipe(self) -> MinHashSettings:
        return self.settings

    # -- settings ------------------------------------------------------------------------------

    @property
    def algorithm(self) -> str:
        return self.settings.algorithm

    def to_rows(self) -> dict[str, object]:
        mh = self.settings
        return {
            "method": self.name,
            "algorithm": mh.algorithm,
            "minhash": {"threshold": mh.threshold, "num_perm": mh.num_perm, "bands": mh.bands, "rows": mh.rows,
                        "char_ngram": mh.char_ngram, "word_ngram": mh.word_ngram, "verify": mh.verify},
            "max_distance": mh.max_distance,
            "keys": [list(band) for band in mh.keys],
            "hash": {"function": "xxh3_64+splitmix64, multiply-shift permutations", "seed": mh.seed},
        }

    @classmethod
    def from_rows(cls, rows: dict[str, object], side_tables: dict[str, dict]) -> "MinHash":
        if rows.get("algorithm") != ALGORITHM:
            raise IncompatibleIndex(
                f"the index was built with signature algorithm {rows.get('algorithm')!r}, this simdb computes "
                f"{ALGORITHM!r}: use the simdb version that built it "
                f"({rows.get('created_with', {}).get('simdb', 'unknown')}) or rebuild the index")
        try:
            settings = MinHashSettings(**rows["minhash"], seed=rows["hash"]["seed"])
            if [list(band) for band in settings.keys] != rows["keys"]:
                raise IncompatibleIndex("the stored bands are not the ones this simdb derives; upgrade simdb")
        except (KeyError, TypeError, ValueError) as exc:
            raise IncompatibleIndex(f"the stored settings cannot be read ({exc!r}); "
                                    "the index was written by another simdb version or edited by hand") from exc
        return cls(settings)

    def summary(self) -> dict[str, object]:
        mh = self.settings
        return {"method": self.name, "threshold": mh.threshold, "max_distance": mh.max_distance,
                "num_perm": mh.num_perm, "bands": mh.bands, "rows": mh.rows, "char_ngram": mh.char_ngram,
                "word_ngram": mh.word_ngram, "seed": mh.seed, "algorithm": mh.algorithm, "verify": mh.verify}

    def describe(self) -> str:
        return self.settings.describe()

    # -- text -> signature -> stored values and keys ------------------------------------------------

    def sketch_many(self, texts: Sequence[str]) -> list[bytes | InputError]:
        """Signatures of the whole list in one vectorised pass."""
        hashes, results = [], []
        for text in texts:
            try:
                if len(text) > sig.WINDOW:  # its own minima, a window of shingles at a time
                    results.append(sig.to_bytes(sig.signature(text, self.settings)))
                else:
                    hashes.append(sig.shingle_hashes(text, self.settings))
                    results.append(None)
            except InputError as exc:
                results.append(exc)
        rows = iter(sig.signatures(hashes, self.settings))
        return [sig.to_bytes(next(rows)) if result is None else result for result in results]

    def digest(self, sketch: bytes) -> str:
        return xxhash.xxh3_64_hexdigest(sketch)

    def format(self, stored: bytes) -> str:
        return bytes(stored).hex()

    @property
    def key_columns(self) -> list[str]:
        return self.settings.key_columns

    @property
    def max_distance(self) -> int:
        return self.settings.max_distance

    @property
    def max_possible_distance(self) -> int:
        return self.settings.scale

    def stored(self, sketches: Sequence[bytes]) -> list[bytes]:
        return list(sketches)

    def _rows(self, sketches: Sequence[bytes] | np.ndarray) -> np.ndarray:
        """The signatures as ``(n, num_perm)`` uint32 rows (given as rows already: themselves)."""
        if isinstance(sketches, np.ndarray):
            return sketches
        return np.frombuffer(b"".join(bytes(s) for s in sketches), dtype="<u4").reshape(len(sketches),
                                                                                        self.settings.num_perm)

    def keys(self, sketches: Sequence[bytes]) -> np.ndarray:
        return sig.band_keys_array(self._rows(sketches), self.settings)

    def distances(self, sketch: bytes, stored: Sequence[bytes]) -> np.ndarray:
        if not len(stored):
            return np.empty(0, dtype=np.int64)
        query = np.frombuffer(sketch, dtype="<u4")
        return self.settings.distances_of(self.settings.num_perm - np.count_nonzero(self._rows(stored) == query,
                                                                                    axis=1))

    def pairs_within(self, ids: np.ndarray, stored: Sequence[bytes], keys: np.ndarray, max_distance: int
                     ) -> np.ndarray:
        """As :meth:`Method.pairs_within`, the signatures joined into rows once: :meth:`pair_distances` joined all
        of the chunk's (51 MB for 100k) again for each batch of candidates, 22 times or more per chunk."""
        return super().pairs_within(ids, self._rows(stored), keys, max_distance)

    def pair_distances(self, stored: Sequence[bytes] | np.ndarray, left: np.ndarray, right: np.ndarray
                       ) -> np.ndarray:
        rows, step = self._rows(stored), 1 << 16  # a slice at a time: a pair's two rows are 1 KiB
        return self.settings.distances_of(np.concatenate([np.empty(0, dtype=np.int64)] + [
            self.settings.num_perm - np.count_nonzero(rows[left[i:i + step]] == rows[right[i:i + step]], axis=1)
            for i in range(0, len(left), step)]))

    def candidate_distance(self, max_distance: int) -> int:
        return self.settings.candidate_distance(max_distance)

    def decide(self, candidates: np.ndarray, texts, max_distance: int) -> np.ndarray:
        """Exact mode: each candidate's distance is recomputed from the two texts' shingle sets (each text
        shingled once per batch of pairs, with the recipe the canaries check), and the pairs within
        ``max_distance`` kept."""
        if not self.settings.exact or not len(candidates):
            return candidates
        order = np.lexsort((candidates[:, 0], candidates[:, 1]))  # by earlier id: each stored text read once
        distances = np.empty(len(candidates), dtype=np.int64)
        for batch in _few_texts(candidates[order], DECIDE_TEXTS):  # texts and shingle sets of one batch at a time
            pairs = candidates[order[batch]]
            ids = np.unique(pairs[:, :2])
            found = texts(ids)
            missing = [int(i) for i in ids.tolist() if found.get(int(i)) is None]
            if missing:
                raise SimdbError(f"{len(missing):,} document(s) have no stored text (document id {missing[0]}, ...), "
                                 "yet this index decides by the texts: store documents through ingest, which keeps "
                                 "them")
            sets = {int(i): sig.shingle_set(found.pop(int(i)), self.settings) for i in ids.tolist()}
            distances[order[batch]] = sig.exact_distances(sets, pairs[:, 0], pairs[:, 1])
        keep = distances <= max_distance
        return np.stack([candidates[keep, 0], candidates[keep, 1], distances[keep]], axis=1).astype(np.int64)

    distance_in_verdicts = False  # signature positions or ten-thousandths: the similarity says it

    def similarity(self, distance: int) -> float:
        return self.settings.similarity_of(distance)

    def distance_for(self, similarity: float) -> int:
        if not self.settings.threshold <= similarity <= 1:
            raise SimdbError(f"the minimum similarity must be between the index's threshold "
                             f"{self.settings.threshold:g} and 1, not {similarity:g}")
        return self.settings.distance_for(similarity)

    def reported_similarity(self, distance: int) -> float | None:
        return self.similarity(distance)

    def match_sketch(self, stored: bytes) -> None:
        return None

    # -- calibration ---------------------------------------------------------------------------

    def calibration_settings(self) -> list[tuple[float, int]]:
        thresholds = (round(0.5 + 0.025 * i, 3) for i in range(19))  # 0.5 .. 0.95
        return [(t, self.settings.distance_for(t)) for t in thresholds]

    def init_options(self, setting: float) -> dict[str, object]:
        return {"method": self.name, "threshold": setting}

    def report_terms(self) -> dict[str, str]:
        settings, n = self.settings, self.settings.num_perm
        if settings.exact:
            return {"key": "band", "measure": "Jaccard similarity", "tick": "{similarity:.3g}",
                    "pair": "Jaccard similarity {similarity:.4f}",
                    "estimate": "Jaccard similarity estimated from the signatures",
                    "rule": f"have a Jaccard similarity of at least {settings.threshold:g}",
                    "threshold": f"Jaccard similarity ≥ {settings.threshold:g}"}
        return {"key": "band", "measure": "estimated Jaccard similarity", "tick": "{similarity:.3g}",
                "pair": "estimated Jaccard similarity {similarity:.3f}", "estimate": "estimated Jaccard similarity",
                "rule": f"have an estimated Jaccard similarity of at least {self.similarity(self.max_distance):.3f} "
                        f"(at most {self.max_distance} of {n} signature positions differ)",
                "threshold": f"estimated Jaccard similarity ≥ {self.similarity(self.max_distance):.3f}"}

    def relaid_out(self, blocks: int | None, documents: int) -> "MinHash":
        raise SimdbError("a MinHash index's bands are fixed when it is created: create a new index with another "
                         "threshold or number of permutations and ingest again")
