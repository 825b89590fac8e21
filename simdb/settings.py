"""What an index is: the settings stored with it and checked on every open.

An index's answers depend on its fingerprint recipe (normalization, tokenizer,
weighting, hash and seed) and on its block layout. All of it is written to the
``settings`` table when the index is created, read back on open, and compared
with what the caller asked for; a difference is an :class:`IncompatibleIndex`
error, never silently different results.

The settings also carry *canaries*: the fingerprints of a few fixed texts as
computed when the index was created. Before a process fingerprints anything
for an index, it recomputes them; if a new jieba dictionary, Unicode database
or simdb release would fingerprint differently, the index refuses to mix old
and new fingerprints.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import unicodedata
from dataclasses import dataclass, field

from . import minhash
from .blocks import BlockLayout
from .errors import IncompatibleIndex
from .fingerprint import ALGORITHM, ALGORITHMS, DEFAULT_TOP_FEATURES, FingerprintSettings, IdfTable
from .sketch import Recipe, digest, sketch
from .tokenize import TokenizerSettings

METHODS = ("simhash", "minhash")

CANARY_TEXTS = (
    "The quick brown fox jumps over the lazy dog; near-duplicate detection since 1997.",
    "人民日报：全国各地庆祝新年，经济持续稳定增长，人民生活水平不断提高。",
    "Ｆｕｌｌ－ｗｉｄｔｈ ＴＥＸＴ, mixed 中文 and English, numbers 12345 and ÉÇÅ accents!",
    "สวัสดีครับ ภาษาไทย カタカナとひらがな",
    "頭髮乾燥後來發現，軟體與網路設定有關。",
)


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def compute_canaries(recipe: Recipe) -> dict[str, str]:
    return {text: digest(sketch(text, recipe)) for text in CANARY_TEXTS}


@dataclass(frozen=True)
class IndexSettings:
    """The stored description of an index."""

    #: SimHash: the block layout. MinHash: the MinHash settings, whose bands are the keys.
    layout: BlockLayout | minhash.MinHashSettings = field(default_factory=BlockLayout)
    #: What turns a text into its stored sketch (for MinHash, the same object as ``layout``).
    fingerprints: Recipe = field(default_factory=FingerprintSettings)
    #: Informational: which software built the index (the canaries do the checking).
    created_with: dict = field(default_factory=dict, compare=False)
    canaries: dict = field(default_factory=dict, compare=False)

    @property
    def method(self) -> str:
        return "minhash" if isinstance(self.layout, minhash.MinHashSettings) else "simhash"

    @classmethod
    def new(cls, *, method: str = "simhash", max_distance: int = 3, blocks: int | None = None,
            expected_size: int = 1_000_000,
            tokenizer: str = "auto", jieba_hmm: bool = False, shingle_size: int = 3, stopwords: bool = True,
            weighting: str | None = None, idf: IdfTable | None = None, top_features: int | None = None,
            threshold: float = 0.8, num_perm: int = 128, char_ngram: int = 5,
            word_ngram: int = 3) -> "IndexSettings":
        from . import __version__

        if method not in METHODS:
            raise ValueError(f"unknown method {method!r}: choose one of {', '.join(METHODS)}")
        created_with = {"simdb": __version__, "jieba": _version("jieba"), "opencc": _version("opencc"),
                        "xxhash": _version("xxhash"), "numpy": _version("numpy"),
                        "unicode": unicodedata.unidata_version}
        if method == "minhash":
            recipe = minhash.MinHashSettings(threshold=threshold, num_perm=num_perm, char_ngram=char_ngram,
                                             word_ngram=word_ngram)
            return cls(layout=recipe, fingerprints=recipe, created_with=created_with,
                       canaries=compute_canaries(recipe))
        layout = BlockLayout(max_distance=max_distance, blocks=blocks) if blocks is not None else \
            BlockLayout.for_size(max_distance, expected_size)
        if weighting is None:
            weighting = "tfidf" if idf is not None else "sublinear_tf"
        if top_features is None:
            top_features = DEFAULT_TOP_FEATURES if weighting == "tfidf" else 0
        fps = FingerprintSettings(
            tokenizer=TokenizerSettings(name=tokenizer, jieba_hmm=jieba_hmm, shingle_size=shingle_size,
                                        stopwords=stopwords),
            weighting=weighting, idf=idf, top_features=top_features)
        return cls(layout=layout, fingerprints=fps, created_with=created_with,
                   canaries=compute_canaries(fps))

    # -- storage: one row per name in the settings table -------------------------------------

    def to_rows(self) -> dict[str, object]:
        """The settings table's rows (the IDF table's terms go to their own table, ``idf_terms``)."""
        if self.method == "minhash":
            mh = self.layout
            return {
                "method": "minhash",
                "algorithm": mh.algorithm,
                "minhash": {"threshold": mh.threshold, "num_perm": mh.num_perm, "bands": mh.bands, "rows": mh.rows,
                            "char_ngram": mh.char_ngram, "word_ngram": mh.word_ngram},
                "max_distance": mh.max_distance,
                "keys": [list(band) for band in mh.keys],
                "hash": {"function": "xxh3_64+splitmix64, multiply-shift permutations", "seed": mh.seed},
                "created_with": self.created_with,
                "canaries": self.canaries,
            }
        idf = self.fingerprints.idf
        return {
            "method": "simhash",
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
            "idf": None if idf is None else {"documents": idf.documents, "terms": len(idf.terms),
                                             "digest": idf.digest, "table": "idf_terms"},
            "hash": {"function": "xxh3_64", "seed": self.fingerprints.seed},
            "created_with": self.created_with,
            "canaries": self.canaries,
        }

    @classmethod
    def from_rows(cls, rows: dict[str, object], idf_terms: dict[str, int] | None = None) -> "IndexSettings":
        """Read the settings back; ``idf_terms`` is the ``idf_terms`` table when the settings name one."""
        if rows.get("method", "simhash") == "minhash":
            return cls._minhash_from_rows(rows)
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
                if idf_terms is None:
                    raise IncompatibleIndex("the index has an IDF table but it was not read")
                idf = IdfTable(documents=rows["idf"]["documents"], terms=idf_terms, digest=rows["idf"]["digest"])
                try:
                    idf.check()
                except ValueError as exc:
                    raise IncompatibleIndex(f"{exc}; fingerprints would no longer be reproducible. Restore "
                                            "the idf_terms table from a backup or rebuild the index") from None
            fps = FingerprintSettings(tokenizer=TokenizerSettings(**rows["tokenizer"]),
                                      weighting=rows["weighting"], seed=rows["hash"]["seed"],
                                      algorithm=rows["algorithm"], idf=idf,
                                      top_features=rows.get("top_features", 0))
        except (KeyError, TypeError, ValueError) as exc:
            raise IncompatibleIndex(f"the stored settings cannot be read ({exc!r}); "
                                    "the index was written by another simdb version or edited by hand") from exc
        return cls(layout=layout, fingerprints=fps, created_with=rows.get("created_with", {}),
                   canaries=rows.get("canaries", {}))

    @classmethod
    def _minhash_from_rows(cls, rows: dict[str, object]) -> "IndexSettings":
        if rows.get("algorithm") != minhash.ALGORITHM:
            raise IncompatibleIndex(
                f"the index was built with signature algorithm {rows.get('algorithm')!r}, this simdb computes "
                f"{minhash.ALGORITHM!r}: use the simdb version that built it "
                f"({rows.get('created_with', {}).get('simdb', 'unknown')}) or rebuild the index")
        try:
            recipe = minhash.MinHashSettings(**rows["minhash"], seed=rows["hash"]["seed"])
            if [list(band) for band in recipe.keys] != rows["keys"]:
                raise IncompatibleIndex("the stored bands are not the ones this simdb derives; upgrade simdb")
        except (KeyError, TypeError, ValueError) as exc:
            raise IncompatibleIndex(f"the stored settings cannot be read ({exc!r}); "
                                    "the index was written by another simdb version or edited by hand") from exc
        return cls(layout=recipe, fingerprints=recipe, created_with=rows.get("created_with", {}),
                   canaries=rows.get("canaries", {}))

    # -- checks ----------------------------------------------------------------------------

    def check_requested(self, requested: dict[str, object]) -> None:
        """Refuse to open when the caller asked for settings other than the stored ones."""
        stored = self.summary()
        differences = [f"{name}: asked {value!r}, stored {stored.get(name)!r}"
                       for name, value in requested.items() if value is not None and stored.get(name) != value]
        if differences:
            raise IncompatibleIndex(
                "the index was created with other settings (" + "; ".join(differences) + "). "
                "Open it without those options, or create a new index in another --schema")

    def check_canaries(self) -> None:
        """Recompute the canary fingerprints; raise if this environment disagrees."""
        now = compute_canaries(self.fingerprints)
        changed = [text for text, fp in self.canaries.items() if now.get(text) != fp]
        if changed:
            built = self.created_with
            raise IncompatibleIndex(
                f"this environment fingerprints {len(changed)} reference text(s) differently from the one "
                f"that built the index (built with simdb {built.get('simdb')}, jieba {built.get('jieba')}, "
                f"Unicode {built.get('unicode')}; here jieba {_version('jieba')}, Unicode "
                f"{unicodedata.unidata_version}). Install the versions that built it, or rebuild the index")

    def summary(self) -> dict[str, object]:
        """Flat, human-facing view of the settings that change answers."""
        if self.method == "minhash":
            mh = self.layout
            return {"method": "minhash", "threshold": mh.threshold, "max_distance": mh.max_distance,
                    "num_perm": mh.num_perm, "bands": mh.bands, "rows": mh.rows, "char_ngram": mh.char_ngram,
                    "word_ngram": mh.word_ngram, "seed": mh.seed, "algorithm": mh.algorithm}
        tok = self.fingerprints.tokenizer
        idf = self.fingerprints.idf
        return {"method": "simhash", "max_distance": self.layout.max_distance, "blocks": self.layout.blocks,
                "tokenizer": tok.name, "jieba_hmm": tok.jieba_hmm, "shingle_size": tok.shingle_size,
                "stopwords": tok.stopwords, "weighting": self.fingerprints.weighting,
                "top_features": self.fingerprints.top_features,
                "idf_documents": idf.documents if idf else None,
                "seed": self.fingerprints.seed, "algorithm": self.fingerprints.algorithm}
