"""SimHash: a 64-bit fingerprint per text; near-duplicates differ in at most *k* bits.

The pipeline: text -> tokens (:mod:`simdb.text`) -> weighted features -> fingerprint
(:mod:`.fingerprint`) -> block keys (:mod:`.blocks`) -> candidate joins and the analysts'
functions (:mod:`simdb.pg.methods.simhash`) -> popcount in numpy. Two fingerprints within *k* bits share at least one
block key (the pigeonhole argument of Manku, Jain & Das Sarma), so the lookup is exact.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ...bits import (BITS, format_fingerprint, hamming_array, parse_fingerprint, to_signed_array, to_unsigned,
                     to_unsigned_array)
from ...errors import IncompatibleIndex, InputError, SimdbError
from ...text.segment import segmenter_name
from ...text.tokenize import TokenizerSettings
from ..base import Method
from .blocks import DEFAULT_EXPECTED_SIZE, DEFAULT_MAX_DISTANCE, MAX_DISTANCE, BlockLayout, layouts_for
from .fingerprint import (ALGORITHM, ALGORITHMS, DEFAULT_BIGRAMS, DEFAULT_TOP_FEATURES, FingerprintSettings, IdfTable,
                          fingerprints, learn_idf, tokens_for)

#: Mean candidates per lookup above which ``stats`` advises more blocks.
OUTGROWN_CANDIDATES = 256
#: A text with fewer distinct features (tokens) is short for SimHash: a few changed tokens move many of its 64
#: bits, so its near-duplicates fall outside the maximum distance (scripts/short_texts.py measures the recall
#: by features on the devset: docs/quality.md).
SHORT_FEATURES = 40
#: What the devset measured of pairs whose shorter text is below :data:`SHORT_FEATURES` (549 pairs at Jaccard >=
#: 0.8: recall 0.59, against 0.84 from 60 features on; 0.55 to 0.70 in each band of 10 features below 40).
SHORT_RECALL = "59% of such texts' near-duplicates (Jaccard >= 0.8) fell within"
#: Texts this long have more than :data:`SHORT_FEATURES` tokens, whatever they say: not tokenized to count them.
SHORT_CHARACTERS = 2_000


@dataclass(frozen=True)
class SimHash(Method):
    """SimHash with its fingerprint recipe and its block layout."""

    name = "simhash"
    title = "SimHash"
    distance_unit = "bits"
    calibration_symbol = "k"
    calibration_axis = "max distance k (bits)"
    option_notes = {"max_distance": {"max": MAX_DISTANCE}, "bigrams": {"default": DEFAULT_BIGRAMS},
                    "top_features": {"default": DEFAULT_TOP_FEATURES}}

    fingerprints: FingerprintSettings = field(default_factory=FingerprintSettings)
    layout: BlockLayout = field(default_factory=lambda: BlockLayout.for_size(DEFAULT_MAX_DISTANCE,
                                                                                      DEFAULT_EXPECTED_SIZE))

    @classmethod
    def new(cls, *, max_distance: int = DEFAULT_MAX_DISTANCE, blocks: int | None = None,
            expected_size: int = DEFAULT_EXPECTED_SIZE, tokenizer: str = TokenizerSettings.name,
            jieba_hmm: bool = TokenizerSettings.jieba_hmm, shingle_size: int = TokenizerSettings.shingle_size,
            stopwords: bool = TokenizerSettings.stopwords, weighting: str | None = None, idf: IdfTable | None = None,
            top_features: int | None = None, bigrams: int | None = None) -> "SimHash":
        """A SimHash method; without ``blocks``, the fewest that keep lookups small at ``expected_size``."""
        layout = BlockLayout(max_distance=max_distance, blocks=blocks) if blocks is not None else \
            BlockLayout.for_size(max_distance, expected_size)
        if weighting is None:
            weighting = "tfidf" if idf is not None else "tf"
        if top_features is None:
            top_features = DEFAULT_TOP_FEATURES if weighting == "tfidf" else 0
        if bigrams is None:
            bigrams = 0 if weighting == "tfidf" else DEFAULT_BIGRAMS
        return cls(FingerprintSettings(
            tokenizer=TokenizerSettings(name=tokenizer, jieba_hmm=jieba_hmm, shingle_size=shingle_size,
                                        stopwords=stopwords),
            weighting=weighting, idf=idf, top_features=top_features, bigrams=bigrams), layout)

    # -- settings ------------------------------------------------------------------------------

    @property
    def recipe(self) -> FingerprintSettings:
        return self.fingerprints

    @property
    def algorithm(self) -> str:
        return self.fingerprints.algorithm

    @property
    def segmenter(self) -> str | None:
        tokenizer = self.fingerprints.tokenizer
        return segmenter_name(tokenizer.jieba_hmm) if tokenizer.name in ("auto", "jieba") else None

    def to_rows(self) -> dict[str, object]:
        idf = self.fingerprints.idf
        return {
            "method": self.name,
            "bits": self.layout.bits,
            "max_distance": self.layout.max_distance,
            "blocks": self.layout.blocks,
            "block_ranges": [list(r) for r in self.layout.block_ranges],
            "keys": [list(k) for k in self.layout.keys],
            "first_key": self.layout.first_key,
            "algorithm": self.fingerprints.algorithm,
            "tokenizer": dataclasses.asdict(self.fingerprints.tokenizer),
            "weighting": self.fingerprints.weighting,
            "top_features": self.fingerprints.top_features,
            "bigrams": self.fingerprints.bigrams,
            "idf": None if idf is None else {"documents": idf.documents, "terms": len(idf.terms),
                                             "digest": idf.digest, "table": "idf_terms"},
            "hash": {"function": "xxh3_64", "seed": self.fingerprints.seed},
        }

    def side_tables(self) -> dict[str, dict]:
        idf = self.fingerprints.idf
        return {"idf_terms": dict(idf.terms)} if idf is not None else {}

    @classmethod
    def side_table_names(cls, rows: dict[str, object]) -> list[str]:
        return ["idf_terms"] if rows.get("idf") else []

    @classmethod
    def learn(cls, option: str, texts: Iterable[str], map_texts: Callable = map, **options) -> IdfTable:
        """``idf``: the IDF table of ``texts`` under the tokenizer ``options`` (those of :meth:`new`) ask for."""
        if option != "idf":
            return super().learn(option, texts, map_texts, **options)
        defaults = TokenizerSettings()
        tokenizer = TokenizerSettings(name=options.get("tokenizer", defaults.name),
                                      jieba_hmm=options.get("jieba_hmm", defaults.jieba_hmm),
                                      shingle_size=options.get("shingle_size", defaults.shingle_size),
                                      stopwords=options.get("stopwords", defaults.stopwords))
        return learn_idf(texts, tokenizer, map_texts)

    @classmethod
    def from_rows(cls, rows: dict[str, object], side_tables: dict[str, dict]) -> "SimHash":
        try:
            layout = BlockLayout(max_distance=rows["max_distance"], blocks=rows["blocks"], bits=rows["bits"],
                                 first_key=rows.get("first_key", 0))
            stored_layout = ([tuple(r) for r in rows["block_ranges"]], [tuple(k) for k in rows["keys"]])
            if stored_layout != (list(layout.block_ranges), list(layout.keys)):
                raise IncompatibleIndex(
                    "the stored block layout is not the one this simdb version derives from "
                    f"{rows['blocks']} blocks at distance {rows['max_distance']}; upgrade simdb")
            if rows["algorithm"] not in ALGORITHMS:
                raise IncompatibleIndex(
                    f"the index was built with fingerprint algorithm {rows['algorithm']!r}, "
                    f"this simdb computes {', '.join(ALGORITHMS)} (new indexes: {ALGORITHM}): use the simdb version "
                    "that built it "
                    f"({rows.get('created_with', {}).get('simdb', 'unknown')}) or rebuild the index")
            if rows["hash"].get("function") != "xxh3_64":
                raise IncompatibleIndex(f"unknown feature hash {rows['hash']!r}: upgrade simdb")
            idf = None
            if rows.get("idf"):
                if "idf_terms" not in side_tables:
                    raise IncompatibleIndex("the index has an IDF table but it was not read")
                idf = IdfTable(documents=rows["idf"]["documents"], terms=side_tables["idf_terms"],
                               digest=rows["idf"]["digest"])
                try:
                    idf.check()
                except ValueError as exc:
                    raise IncompatibleIndex(f"{exc}; fingerprints would no longer be reproducible. Restore "
                                            "the idf_terms table from a backup or rebuild the index") from None
            fps = FingerprintSettings(tokenizer=TokenizerSettings(**rows["tokenizer"]),
                                      weighting=rows["weighting"], seed=rows["hash"]["seed"],
                                      algorithm=rows["algorithm"], idf=idf,
                                      top_features=rows.get("top_features", 0), bigrams=rows.get("bigrams", 0))
        except (KeyError, TypeError, ValueError) as exc:
            raise IncompatibleIndex(f"the stored settings cannot be read ({exc!r}); "
                                    "the index was written by another simdb version or edited by hand") from exc
        return cls(fps, layout)

    def summary(self) -> dict[str, object]:
        tok = self.fingerprints.tokenizer
        idf = self.fingerprints.idf
        return {"method": self.name, "max_distance": self.layout.max_distance, "blocks": self.layout.blocks,
                "tokenizer": tok.name, "jieba_hmm": tok.jieba_hmm, "shingle_size": tok.shingle_size,
                "stopwords": tok.stopwords, "weighting": self.fingerprints.weighting,
                "top_features": self.fingerprints.top_features, "bigrams": self.fingerprints.bigrams,
                "idf_documents": idf.documents if idf else None,
                "seed": self.fingerprints.seed, "algorithm": self.fingerprints.algorithm}

    def describe(self) -> str:
        return self.layout.describe()

    # -- text -> fingerprint -> stored values and keys ----------------------------------------------

    def sketch_many(self, texts: Sequence[str]) -> list[int | InputError]:
        return fingerprints(texts, self.fingerprints)

    def digest(self, sketch: int) -> str:
        return format_fingerprint(sketch)

    def format(self, stored: int) -> str:
        return format_fingerprint(to_unsigned(stored))

    def parse(self, text: str) -> int:
        return parse_fingerprint(text)

    def tokens(self, text: str) -> list[str]:
        return tokens_for(text, self.recipe)

    @property
    def key_columns(self) -> list[str]:
        return self.layout.key_columns

    @property
    def max_distance(self) -> int:
        return self.layout.max_distance

    @property
    def max_possible_distance(self) -> int:
        return BITS

    def stored(self, sketches: Sequence[int]) -> list[int]:
        return to_signed_array(np.array(sketches, dtype=np.uint64)).tolist()

    def keys(self, sketches: Sequence[int]) -> np.ndarray:
        return self.layout.block_keys_array(np.array(sketches, dtype=np.uint64))

    def stored_keys(self, stored: np.ndarray) -> np.ndarray:
        return self.layout.block_keys_array(to_unsigned_array(stored))

    def distances(self, sketch: int, stored: Sequence[int]) -> np.ndarray:
        return hamming_array(to_unsigned_array(np.array(stored, dtype=np.int64)), sketch)

    def pair_distances(self, stored: Sequence[int], left: np.ndarray, right: np.ndarray) -> np.ndarray:
        fingerprints = to_unsigned_array(np.asarray(stored, dtype=np.int64))
        return hamming_array(fingerprints[left], fingerprints[right])

    def similarity(self, distance: int) -> float:
        return (BITS - distance) / BITS

    def distance_for(self, similarity: float) -> int:
        raise SimdbError("a minimum similarity is for MinHash indexes; a SimHash index takes a maximum distance")

    def reported_similarity(self, distance: int) -> float | None:
        return None

    def match_sketch(self, stored: int) -> int | None:
        return to_unsigned(stored)

    # -- calibration and creation -------------------------------------------------------------

    def calibration_settings(self) -> list[tuple[float, int]]:
        return [(k, k) for k in range(0, 17)]

    def init_options(self, setting: float) -> dict[str, object]:
        return {"max_distance": int(setting)}

    def report_terms(self) -> dict[str, str]:
        k, bits = self.layout.max_distance, self.layout.bits
        return {"key": "block", "measure": "bits apart (Hamming distance)", "tick": "{distance}",
                "pair": "{distance} bits apart", "estimate": "bits apart (Hamming distance)",
                "rule": f"are at most {k} of {bits} bits apart", "threshold": f"at most {k} bits apart"}

    def creation_notes(self, expected_size: int) -> list[str]:
        lines = []
        idf = self.fingerprints.idf
        if idf is not None:
            lines.append(f"IDF weights: {idf.documents:,} sample documents, {len(idf.terms):,} terms, top "
                         f"{self.fingerprints.top_features} features per document")
        lines.append(f"expected candidates per lookup at {expected_size:,} documents (random fingerprints):")
        for layout, candidates in layouts_for(self.layout.max_distance, expected_size):
            mark = "  <- this index" if layout == self.layout else ""
            lines.append(f"  --blocks {layout.blocks}: {len(layout.keys):>3} keys, {candidates:>12,.2f}{mark}")
        return lines

    # -- growth --------------------------------------------------------------------------------

    def expected_candidates(self, documents: int) -> float:
        return self.layout.expected_candidates(documents)

    def layout_advice(self, measured: float, documents: int) -> str | None:
        if measured <= OUTGROWN_CANDIDATES:
            return None
        # real fingerprints are skewed, so at least one block more even where random ones would not need it
        blocks = max(BlockLayout.for_size(self.layout.max_distance, documents).blocks, self.layout.blocks + 1)
        return (f"lookups meet {measured:,.0f} candidates on average: the archive has outgrown its layout; "
                f"run `simdb relayout --blocks {blocks}`")

    def is_short(self, text: str) -> bool:
        # a text of many characters has many tokens: tokenized only where it could be short
        return len(text) < SHORT_CHARACTERS and len(set(self.tokens(text))) < SHORT_FEATURES

    def short_text_advice(self, short: int, judged: int) -> str | None:
        if not judged or short * 2 <= judged:
            return None
        return (f"{short:,} of the first {judged:,} texts have fewer than {SHORT_FEATURES} distinct tokens, too "
                f"few for SimHash: on the devset, {SHORT_RECALL} {self.max_distance} bits, against 84% for texts of "
                "60 tokens or more. For short texts, create the index with `simdb init --method minhash --verify exact`, "
                "which decides on the texts' exact Jaccard similarity (docs/quality.md)")

    def relaid_out(self, blocks: int | None, documents: int) -> "SimHash":
        if blocks is None:
            blocks = BlockLayout.for_size(self.layout.max_distance, documents).blocks
        if blocks == self.layout.blocks:
            raise SimdbError(f"the index already uses {blocks} blocks")
        try:
            layout = BlockLayout(max_distance=self.layout.max_distance, blocks=blocks,
                                 first_key=self.layout.first_key + len(self.layout.keys))
        except ValueError as exc:
            raise SimdbError(f"invalid layout: {exc}") from None
        return dataclasses.replace(self, layout=layout)
