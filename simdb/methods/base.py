"""The method interface: what simdb asks of a way of sketching texts and finding near-duplicates.

A method owns every decision that depends on it: how a text becomes a sketch (and the settings
that decide it), how a sketch is stored and cut into key columns, how two sketches' distance is
measured and what a distance means as a similarity, how the layout should grow with the archive, and
how people are told about it. It computes and runs no SQL: its SQL (candidate joins, key expressions,
the analysts' functions) is :class:`simdb.pg.methods.MethodSQL`'s, registered under the same name. The
rest of simdb holds a :class:`Method` and asks it; nothing else tests which method an index uses.

Methods register themselves by ``name`` (as alembic's dialect implementations do); a new method
is one new module that subclasses :class:`Method` and is imported by :mod:`simdb.methods`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from typing import Any, ClassVar

import numpy as np

from ..errors import IncompatibleIndex, InputError
from ..matches import shared_key_candidates

#: The seed every hash of every method derives from, stored with each index.
DEFAULT_SEED = 0x51D8_5EED

Sketch = Any  # what one method stores per document: an int fingerprint, signature bytes, ...


class Method(ABC):
    """One method with its settings: immutable, comparable, stored with the index."""

    #: The name stored in ``settings.method`` and given to ``simdb init --method``.
    name: ClassVar[str]
    #: What a distance counts, for people ("bits", "signature positions").
    distance_unit: ClassVar[str]
    #: The method's name for people ("SimHash").
    title: ClassVar[str]
    #: What ``simdb calibrate`` sweeps, for the plot's axis, and its symbol in the table.
    calibration_axis: ClassVar[str]
    calibration_symbol: ClassVar[str]
    #: What the command line states of :meth:`new`'s options beyond their signature: an option's largest value
    #: (``max``), and the usual default of one whose default follows from another option (``default``).
    option_notes: ClassVar[dict[str, dict[str, int]]] = {}
    _registry: ClassVar[dict[str, type["Method"]]] = {}

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if "name" in cls.__dict__:
            Method._registry[cls.name] = cls

    @staticmethod
    def named(name: str) -> type["Method"]:
        try:
            return Method._registry[name]
        except KeyError:
            raise ValueError(f"unknown method {name!r}: choose one of {', '.join(Method.names())}") from None

    @staticmethod
    def names() -> tuple[str, ...]:
        return tuple(Method._registry)

    @staticmethod
    def stored_class(rows: dict[str, object]) -> type["Method"]:
        """The method class an index's ``settings`` rows name (indexes from before MinHash: SimHash)."""
        name = rows.get("method", "simhash")
        if name not in Method._registry:
            raise IncompatibleIndex(f"the index uses method {name!r}, which this simdb does not know: upgrade simdb")
        return Method._registry[name]

    # -- settings ------------------------------------------------------------------------------

    @classmethod
    @abstractmethod
    def new(cls, **options) -> "Method":
        """The method with ``options`` (each method documents its own); ValueError for impossible ones."""

    @classmethod
    @abstractmethod
    def from_rows(cls, rows: dict[str, object], side_tables: dict[str, dict]) -> "Method":
        """Read the stored settings back; :class:`IncompatibleIndex` when this simdb cannot honour them."""

    @abstractmethod
    def to_rows(self) -> dict[str, object]:
        """The ``settings`` table's rows describing this method (``method`` included)."""

    def side_tables(self) -> dict[str, dict]:
        """Tables a new index of this method is created with besides ``settings`` (``{table: {key: value}}``)."""
        return {}

    @classmethod
    def side_table_names(cls, rows: dict[str, object]) -> list[str]:
        """The side tables to read back for the stored ``rows``: two-column (key, value) tables."""
        return []

    @classmethod
    def learn(cls, option: str, texts: Iterable[str], map_texts: Callable = map, **options) -> Any:
        """The value of :meth:`new`'s ``option`` learned from ``texts``, a sample of the archive (``simdb init
        --idf-from``), under the other ``options`` asked for (a tokenizer's, say); ``map_texts(function,
        texts)`` maps a picklable function over them (on every core: :func:`simdb.parallel.map_texts`).
        ValueError where there is nothing to learn from."""
        raise ValueError(f"{cls.title} learns no {option!r} from a sample of the archive")

    @abstractmethod
    def summary(self) -> dict[str, object]:
        """Flat, human-facing view of the settings that change answers (``method`` first)."""

    @abstractmethod
    def describe(self) -> str:
        """One line: the key layout and what makes a near-duplicate."""

    #: The key layout (``key_columns``, ``max_distance``, ``describe()``); each method provides it.
    layout: Any
    #: The settings that decide a text's sketch; each method provides it.
    recipe: Any

    @property
    @abstractmethod
    def algorithm(self) -> str:
        """Names the text -> sketch recipe; a change that can change a sketch gets a new name."""

    @property
    def segmenter(self) -> str | None:
        """The word segmenter (and its version) this process's sketches go through, if any; recorded with the
        index by every ingest (see :mod:`simdb.text.segment`)."""
        return None

    @property
    def needs_texts(self) -> bool:
        """Whether the method decides by the documents' texts (:meth:`decide`), so the index must keep them."""
        return False

    # -- text -> sketch ------------------------------------------------------------------------

    @abstractmethod
    def sketch_many(self, texts: Sequence[str]) -> list[Sketch | InputError]:
        """Sketches of many texts; a text that has none gives its :class:`InputError` in its place."""

    def sketch(self, text: str) -> Sketch:
        (result,) = self.sketch_many([text])
        if isinstance(result, InputError):
            raise result
        return result

    def sketch_all(self, texts: Sequence[str]) -> list[Sketch]:
        """Sketches of many texts, computed together; the first text that has none raises its error."""
        results = self.sketch_many(texts)
        for result in results:
            if isinstance(result, InputError):
                raise result
        return results

    def tokens(self, text: str) -> list[str] | None:
        """The tokens a text's sketch is made of, for people (``simdb fingerprint --tokens``), where the method
        has tokens to show."""
        return None

    @abstractmethod
    def digest(self, sketch: Sketch) -> str:
        """A short, stable name for a sketch (the canaries)."""

    @abstractmethod
    def format(self, stored: Any) -> str:
        """A stored sketch as text for people and exports (hex)."""

    def parse(self, text: str) -> Sketch:
        """A sketch people give as text, to look it up (``simdb query --simhash``): ValueError for text that is
        not one; :class:`SimdbError` where the method's sketches are looked up by their texts only."""
        from ..errors import SimdbError

        raise SimdbError(f"a {self.title} index looks documents up by their texts, not by a sketch")

    # -- sketch -> stored values and key columns -----------------------------------------------

    @property
    @abstractmethod
    def key_columns(self) -> list[str]:
        """The documents columns that hold the keys, each with its own B-tree."""

    @property
    @abstractmethod
    def max_distance(self) -> int:
        """The largest distance (in :attr:`distance_unit`) that makes a near-duplicate."""

    @property
    @abstractmethod
    def max_possible_distance(self) -> int:
        """The distance of two sketches that share nothing."""

    @abstractmethod
    def stored(self, sketches: Sequence[Sketch]) -> list:
        """The sketches as the index stores them (a ``bigint``, ``bytea`` ...)."""

    @abstractmethod
    def keys(self, sketches: Sequence[Sketch]) -> np.ndarray:
        """Key values: ``(len(sketches), len(key_columns))`` int64."""

    def stored_keys(self, stored: Sequence) -> np.ndarray:
        """Key values of sketches as the index stores them (:meth:`stored`), as :meth:`keys` gives them; this
        default is for a method that stores its sketches as they are."""
        return self.keys(stored)

    @abstractmethod
    def similarity(self, distance: int) -> float:
        """What a distance means as a similarity between 0 and 1."""

    @abstractmethod
    def distance_for(self, similarity: float) -> int:
        """The largest distance whose similarity is still ``similarity`` (a :class:`SimdbError` when the
        method decides by distance alone, or for a similarity outside the index's range)."""

    @abstractmethod
    def reported_similarity(self, distance: int) -> float | None:
        """The similarity reported with a match or a pair, when the method reports one."""

    @abstractmethod
    def match_sketch(self, stored: Any) -> Any:
        """The sketch reported with a match (the SimHash fingerprint), or None."""

    def pairs_within(self, ids: np.ndarray, stored: Sequence, keys: np.ndarray, max_distance: int) -> np.ndarray:
        """Verified ``(later id, earlier id, distance)`` rows among sketches held in memory that share a key
        (``ids`` ascending, ``stored`` and ``keys`` row by row; a pair may come more than once): what
        :meth:`simdb.pg.methods.MethodSQL.candidate_pairs` of a table of them against itself, earlier ids only,
        would give, without a self-join in the server that ships both sketches of every candidate back (7.9 of a
        MinHash chunk's 37 s per 100k)."""
        found = [np.empty((0, 3), dtype=np.int64)]
        for candidates in shared_key_candidates(keys):  # verified a key column at a time, not all at once
            later, earlier = candidates[:, 0], candidates[:, 1]
            distances = np.asarray(self.pair_distances(stored, later, earlier), dtype=np.int64)
            keep = distances <= max_distance
            found.append(np.stack([ids[later[keep]], ids[earlier[keep]], distances[keep]], axis=1).astype(np.int64))
        return np.concatenate(found)

    @abstractmethod
    def pair_distances(self, stored: Sequence, left: np.ndarray, right: np.ndarray) -> np.ndarray:
        """Distances between ``stored[left[i]]`` and ``stored[right[i]]``, for every ``i``."""

    def candidate_distance(self, max_distance: int) -> int:
        """The distance between sketches up to which a pair is a candidate for :meth:`decide` to judge at
        ``max_distance``: ``max_distance`` itself when the sketches decide."""
        return max_distance

    def decide(self, candidates: np.ndarray, texts: Callable[[np.ndarray], dict[int, str]],
               max_distance: int) -> np.ndarray:
        """The final ``(later id, earlier id, distance)`` pairs within ``max_distance`` among ``candidates``
        (found at :meth:`candidate_distance`); ``texts`` gives the texts of the ids it is asked for. The
        sketches decide unless :attr:`needs_texts`: the candidates are the answer."""
        return candidates

    #: Whether a verdict reports the distance (a number users know, as SimHash's bits) beside the similarity.
    distance_in_verdicts = True

    @abstractmethod
    def distances(self, sketch: Sketch, stored: Sequence) -> np.ndarray:
        """Distances from one sketch to stored sketches (as :meth:`stored` gives them)."""

    # -- calibration ---------------------------------------------------------------------------

    @abstractmethod
    def calibration_settings(self) -> list[tuple[float, int]]:
        """The settings ``simdb calibrate`` sweeps: ``(setting, the largest distance it accepts)``."""

    @abstractmethod
    def init_options(self, setting: float) -> dict[str, object]:
        """The options of :meth:`new` (and ``simdb init``) that make an index of one swept setting."""

    @abstractmethod
    def report_terms(self) -> dict[str, str]:
        """How ``simdb report`` speaks of distances, as a person would: ``key`` (block or band); ``measure``, the
        axis of the stored pairs' distances, and ``estimate``, of the candidates' (what the sketches say);
        ``tick`` and ``pair``, templates for one distance as a tick label and in a sentence (given
        ``distance`` and ``similarity``); ``rule``, when two documents are near-duplicates ("Two documents are
        near-duplicates when they {rule}"), and ``threshold``, the same as a chart's label."""

    def creation_notes(self, expected_size: int) -> list[str]:
        """Lines ``simdb init`` prints about a new index of this method, beyond its layout."""
        return []

    # -- growth --------------------------------------------------------------------------------

    def expected_candidates(self, documents: int) -> float | None:
        """Stored documents a lookup is expected to meet at ``documents``, when the method can tell."""
        return None

    def layout_advice(self, measured: float, documents: int) -> str | None:
        """What to do when lookups meet ``measured`` candidates on average, or None when all is well."""
        return None

    def is_short(self, text: str) -> bool:
        """Whether ``text`` is too short for this method's guarantees (judged where it is sketched: in the
        workers, which have the tokenizer loaded)."""
        return False

    def short_text_advice(self, short: int, judged: int) -> str | None:
        """When most of the ``judged`` texts (the first of a batch) are ``short`` (:meth:`is_short`): one line that
        says so and names the better mode; else None."""
        return None

    def relaid_out(self, blocks: int | None, documents: int) -> "Method":
        """The same method with another key layout (``blocks``, or the best for ``documents``)."""
        from ..errors import SimdbError

        raise SimdbError(f"the {self.name} method's keys are fixed when the index is created; create a new index "
                         "with other settings and ingest again")

