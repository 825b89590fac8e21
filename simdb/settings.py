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

import math
import unicodedata
from dataclasses import dataclass, field, replace

from .errors import IncompatibleIndex, SimdbError
from .methods import Method, SimHash
from .version import __version__

#: The method of an index created without one.
DEFAULT_METHOD = SimHash.name
#: Documents (ids) per new segment, sealed segments of one size that merge into one, and the chunk size from
#: which a chunk is bulk-loaded into a segment of its own (simdb.pg.segments).
DEFAULT_SEGMENT_SIZE = 1_000_000
DEFAULT_MERGE_FACTOR = 4
DEFAULT_BULK_CHUNK = 50_000
#: The most database connections an open index uses at once: its engine's pool (5 kept open, 10 more while
#: they are needed). A chunk's or a batch's lookups spread over more would wait for connections it holds itself.
MAX_CONNECTIONS = 15


def connections_problem(connections: int | None) -> str | None:
    """What is wrong with ``connections`` (how many database connections to spread lookups over), or None."""
    if connections is not None and not 1 <= connections <= MAX_CONNECTIONS:
        return (f"must be between 1 and {MAX_CONNECTIONS} (the connections an open index's pool holds), "
                f"not {connections}")
    return None

CANARY_TEXTS = (
    "The quick brown fox jumps over the lazy dog; near-duplicate detection since 1997.",
    "人民日报：全国各地庆祝新年，经济持续稳定增长，人民生活水平不断提高。",
    "Ｆｕｌｌ－ｗｉｄｔｈ ＴＥＸＴ, mixed 中文 and English, numbers 12345 and ÉÇÅ accents!",
    "สวัสดีครับ ภาษาไทย カタカナとひらがな",
    "頭髮乾燥後來發現，軟體與網路設定有關。",
)


@dataclass(frozen=True)
class SegmentPolicy:
    size: int = DEFAULT_SEGMENT_SIZE  #: ids per new active segment
    merge_factor: int = DEFAULT_MERGE_FACTOR  #: sealed segments of one tier that merge into one
    bulk_chunk: int = DEFAULT_BULK_CHUNK  #: a chunk of at least this many documents gets a segment of its own

    def __post_init__(self) -> None:
        for name, what in (("size", "segment size"), ("bulk_chunk", "bulk chunk size")):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise SimdbError(f"the {what} must be a positive whole number, not {value!r}")
        if not isinstance(self.merge_factor, int) or self.merge_factor < 2:
            raise SimdbError(f"the merge factor must be at least 2, not {self.merge_factor!r}")

    def to_row(self) -> dict:
        return {"size": self.size, "merge_factor": self.merge_factor, "bulk_chunk": self.bulk_chunk}

    @classmethod
    def from_row(cls, row: dict | None) -> "SegmentPolicy":
        return cls(**(row or {}))  # a row from before bulk chunks takes today's default

    def tier(self, documents: int) -> int:
        unit = min(self.size, self.bulk_chunk)
        return max(0, math.floor(math.log(max(documents, 1) / unit, self.merge_factor) + 1e-9))

    def plan(self, documents: list[int], full: bool = False) -> list[list[int]]:
        """Runs of adjacent sealed segments (by index into ``documents``, their sizes in id order) to merge:
        every run of ``merge_factor`` segments of one tier, repeatedly (a merged segment may complete a run
        of the next tier); ``full`` merges all of them into one."""
        if full:
            return [list(range(len(documents)))] if len(documents) > 1 else []
        groups = [[i] for i in range(len(documents))]  # each group: original indexes it holds
        sizes = list(documents)
        while True:
            tiers = [self.tier(w) for w in sizes]
            for start in range(len(sizes) - self.merge_factor + 1):
                window = tiers[start:start + self.merge_factor]
                if len(set(window)) == 1:
                    end = start + self.merge_factor
                    groups[start:end] = [[i for g in groups[start:end] for i in g]]
                    sizes[start:end] = [sum(sizes[start:end])]
                    break
            else:
                return [g for g in groups if len(g) > 1]


def _version(package: str) -> str:
    import importlib.metadata  # here: it loads the email package, which a fingerprint never needs

    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def compute_canaries(method: Method) -> dict[str, str]:
    return {text: method.digest(method.sketch(text)) for text in CANARY_TEXTS}


@dataclass(frozen=True)
class IndexSettings:
    """The stored description of an index: its method (with all of that method's settings), what built it,
    and the canaries."""

    method: Method = field(default_factory=SimHash)
    #: Informational: which software built the index (the canaries do the checking).
    created_with: dict = field(default_factory=dict, compare=False)
    canaries: dict = field(default_factory=dict, compare=False)
    #: How documents are stored in segments (see :mod:`simdb.pg.segments`); storage only, it changes no answer.
    segments: SegmentPolicy = field(default_factory=SegmentPolicy, compare=False)
    #: Every word segmenter that has written sketches to the index, with its version (``rjieba 0.2.2``,
    #: ``jieba 0.42.1``): each ingest adds its own (:func:`simdb.pg.catalog.record_segmenter`); they give
    #: the same tokens, which the canaries check on every open.
    segmenters: tuple = field(default=(), compare=False)
    #: Whether ``documents.text`` keeps each document's text (``simdb init --store-text``, or a method that
    #: decides by the texts, as MinHash with ``verify="exact"``); storage only, it changes no answer.
    texts: bool = field(default=False, compare=False)
    #: A distributed index on a Citus cluster (``simdb init --distributed``): ``{"shards": n}``, else None;
    #: storage only, it changes no answer (:mod:`simdb.pg.citus`).
    distributed: dict | None = field(default=None, compare=False)
    #: The metadata fields whose values the index counts documents and duplicates by (``simdb init --count-by``,
    #: ``simdb count-by add``; :mod:`simdb.pg.field_counts`), in the order declared; storage only, it changes no
    #: answer.
    count_by: tuple = field(default=(), compare=False)

    @property
    def layout(self):
        """The method's key layout (SimHash: the block layout; MinHash: its settings, bands included)."""
        return self.method.layout

    @property
    def fingerprints(self):
        """What turns a text into its stored sketch."""
        return self.method.recipe

    @classmethod
    def new(cls, *, method: str = DEFAULT_METHOD, store_text: bool = False, **options) -> "IndexSettings":
        """Settings for a new index; ``options`` are the method's (see its ``new``); ``store_text`` keeps the
        texts (a method that decides by them keeps them anyway)."""
        try:
            made = Method.named(method).new(**options)
        except TypeError as exc:  # an option of another method
            raise ValueError(f"{exc}".replace("new()", f"the {method} method")) from None
        created_with = {"simdb": __version__, "jieba": _version("jieba"), "rjieba": _version("rjieba"),
                        "segmenter": made.segmenter, "opencc": _version("opencc"), "xxhash": _version("xxhash"),
                        "numpy": _version("numpy"), "unicode": unicodedata.unidata_version}
        return cls(method=made, created_with=created_with, canaries=compute_canaries(made),
                   segmenters=(made.segmenter,) if made.segmenter else (), texts=store_text or made.needs_texts)

    # -- storage: one row per name in the settings table -------------------------------------

    def to_rows(self) -> dict[str, object]:
        """The settings table's rows (side tables such as ``idf_terms`` are the method's)."""
        return {**self.method.to_rows(), "created_with": self.created_with, "canaries": self.canaries,
                "segments": self.segments.to_row(), "segmenters": list(self.segmenters), "texts": {"stored": self.texts},
                **({"distributed": self.distributed} if self.distributed is not None else {}),
                **({"count_by": list(self.count_by)} if self.count_by else {})}

    @staticmethod
    def side_table_names(rows: dict[str, object]) -> list[str]:
        return Method.stored_class(rows).side_table_names(rows)

    @classmethod
    def from_rows(cls, rows: dict[str, object], side_tables: dict[str, dict] | None = None) -> "IndexSettings":
        """Read the settings back, with the side tables their method named (:meth:`side_table_names`)."""
        method = Method.stored_class(rows).from_rows(rows, side_tables or {})
        created_with = rows.get("created_with", {})
        segmenters = rows.get("segmenters")
        if segmenters is None:  # written before segmenters were recorded: jieba did all the segmenting
            segmenters = [f"jieba {created_with.get('jieba', 'unknown')}"] if method.segmenter else []
        texts = bool(rows.get("texts", {}).get("stored", False))  # written before texts were kept: none
        if method.needs_texts and not texts:
            raise IncompatibleIndex(f"the index's method decides by the documents' texts ({method.describe()}), "
                                    "yet its settings say it keeps none; the settings were edited by hand")
        count_by = rows.get("count_by") or []  # written before fields were counted: none
        if not isinstance(count_by, list) or not all(isinstance(name, str) and name.strip() for name in count_by) \
                or len(set(count_by)) != len(count_by):  # a name twice: every chunk would count it twice
            raise IncompatibleIndex(f"the index's settings name the metadata fields it counts by as {count_by!r}, "
                                    "not a list of distinct field names; the settings were edited by hand")
        made = cls(method=method, created_with=created_with, canaries=rows.get("canaries", {}),
                   segmenters=tuple(segmenters), texts=texts, distributed=rows.get("distributed"),
                   count_by=tuple(count_by))
        return replace(made, segments=SegmentPolicy.from_row(rows["segments"])) if "segments" in rows else made

    # -- checks ----------------------------------------------------------------------------

    def check_requested(self, requested: dict[str, object]) -> None:
        """Refuse to open when the caller asked for settings other than the stored ones."""
        stored = self.summary()
        differences = [f"{name}: asked {value!r}, stored {stored.get(name)!r}"
                       for name, value in requested.items() if value is not None and stored.get(name) != value]
        if differences:
            raise IncompatibleIndex(
                "the index was created with other settings (" + "; ".join(differences) + "). "
                "Open it without those options, or create a new index in another «schema»")

    def check_canaries(self) -> None:
        """Recompute the canary sketches; raise if this environment disagrees."""
        now = compute_canaries(self.method)
        changed = [text for text, fp in self.canaries.items() if now.get(text) != fp]
        if changed:
            built = self.created_with
            raise IncompatibleIndex(
                f"this environment fingerprints {len(changed)} reference text(s) differently from the one "
                f"that built the index (built with simdb {built.get('simdb')}, segmenters "
                f"{', '.join(self.segmenters) or 'none'}, Unicode {built.get('unicode')}; here "
                f"{self.method.segmenter or 'no segmenter'}, Unicode {unicodedata.unidata_version}). Install the "
                "versions that built it (SIMDB_SEGMENTER=jieba makes jieba itself segment), or rebuild the index")

    def summary(self) -> dict[str, object]:
        """Flat, human-facing view of the settings that change answers."""
        return self.method.summary()
