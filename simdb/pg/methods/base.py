"""A method's SQL: what the PostgreSQL layer asks of SimHash or MinHash, registered by the method's name.

:mod:`simdb.methods` computes (text -> sketch -> keys -> distances) and runs no SQL; this is where each
method's candidate joins, key expressions, lookups and analysts' functions live. As alembic keeps a dialect
implementation per database (``DefaultImpl.get_by_dialect``), the PostgreSQL layer asks :func:`sql_of` for
the implementation registered under an index's method name, and never tests which method it holds.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from ...errors import IncompatibleIndex

if TYPE_CHECKING:
    import sqlalchemy as sa

    from ...methods import Method


class MethodSQL(ABC):
    """One method's SQL, for one method with its settings (:attr:`method`)."""

    #: The method's name (:attr:`simdb.methods.Method.name`) this implementation is registered under.
    name: ClassVar[str]
    #: The SQL type of a sketch as the analysts' functions take it (``bigint``, ``bytea``).
    sketch_type: ClassVar[str]
    #: The documents column that holds the sketch (as :meth:`simdb.methods.Method.stored` gives it), and its type.
    sketch_column: ClassVar[tuple[str, str]]
    #: Whether a stored sketch is one ``bigint`` whose keys :meth:`simdb.methods.Method.stored_keys` computes
    #: faster than they are read: a segment read into memory (:mod:`simdb.pg.in_memory`) is then read as ids
    #: and sketches, not as its key columns.
    keys_from_stored: ClassVar[bool] = False
    #: Whether a candidate is verified from its stored sketch alone, a BIGINT stored beside each key row: what the
    #: keyed distributed layout (:mod:`simdb.pg.keyed`) needs.
    verified_beside_keys: ClassVar[bool] = False
    _registry: ClassVar[dict[str, type["MethodSQL"]]] = {}

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if "name" in cls.__dict__:
            MethodSQL._registry[cls.name] = cls

    def __init__(self, method: Method) -> None:
        self.method = method

    @staticmethod
    def named(name: str) -> type["MethodSQL"]:
        """The implementation registered under a method's name."""
        try:
            return MethodSQL._registry[name]
        except KeyError:
            raise IncompatibleIndex(
                f"this simdb has no SQL for the method {name!r} (it knows {', '.join(sorted(MethodSQL._registry))}): "
                "open the index with the simdb that made it") from None

    @property
    def key_columns(self) -> list[str]:
        return self.method.key_columns

    @abstractmethod
    def candidate_pairs(self, connection: sa.Connection, probe: str, target: str, max_distance: int, *,
                        where: str | None = None, params: dict | None = None, index_probes: bool = False,
                        columns: Sequence[str] | None = None) -> Iterator[np.ndarray]:
        """Verified ``(probe id, target id, distance)`` rows between two tables sharing a key (one of
        ``columns``, default every key column), within ``max_distance``; ``where`` filters with ``p`` and ``t``
        as the two sides; ``params`` are bound (client-side, ``%(name)s``) into ``probe``, ``target`` and
        ``where``. ``index_probes`` looks each probe's keys up in ``target``'s key indexes, in key order (see
        :func:`simdb.pg.probes.lateral_probe`; ``where`` may then use only ``p.id`` of the probes), whatever
        the planner would choose; otherwise the planner picks the join. A pair may come more than once (see
        :func:`simdb.matches.distinct`)."""

    @abstractmethod
    def lookup_sql(self, sketch, max_distance: int) -> tuple[str, dict]:
        """``(SELECT of document_id, parameters)``: every stored document that may be within ``max_distance``
        of one sketch, through the key indexes (the caller verifies each with the method's ``distances``)."""

    @abstractmethod
    def key_sql(self, sketch: str) -> list[str]:
        """SQL computing each key column from the stored sketch (the expression ``sketch``)."""

    @abstractmethod
    def functions(self, schema: str, one_statement: bool = False, keys: tuple[str, list[str]] | None = None
                  ) -> list[tuple[str, str, str]]:
        """The analysts' functions of this method: ``(signature, CREATE statement, comment)``. A lookup reads
        each key column's index in its own branch of a ``UNION`` (index-only scans), or, with
        ``one_statement``, in one scan of ``documents`` whose condition ORs the keys: on a distributed
        index Citus runs each branch of a ``UNION`` on every shard apart (15 keys, 32 shards: 481 tasks, 55 ms
        a lookup in ``scripts/bench_citus.py``), and the one scan as one task per shard (7.4 ms). ``keys``: on
        the keyed distributed layout, its keys table and the SQL of the argument's stored keys
        (:func:`simdb.pg.keyed.function_keys`): a lookup reads that table by ``key = ANY(...)``, routed to
        the shards of its keys (``documents`` has no key columns there)."""

    @abstractmethod
    def similarity_sql(self, distance: str) -> str:
        """SQL for the reported similarity of a stored pair whose distance is the expression ``distance``."""

    @abstractmethod
    def similarity_between_sql(self, schema: str, a: str, b: str) -> str:
        """SQL for the similarity the sketches of two documents rows ``a`` and ``b`` give (a ``real``)."""


def sql_of(method: Method) -> MethodSQL:
    """The SQL of ``method``, by its name (the implementations register themselves in :mod:`simdb.pg.methods`)."""
    return MethodSQL.named(method.name)(method)


def similarity_sql(distance: str, scale: int) -> str:
    """SQL for the similarity of a distance counted out of ``scale``: ``(scale - distance) / scale`` in double
    precision, the nearest double to that fraction (psql prints ``0.8502``, where ``1 - 1498 / 10000.0`` prints
    ``0.8502000000000001``), as each method's :meth:`~simdb.methods.Method.similarity` computes it in Python."""
    return f"(({scale} - {distance})::double precision / {scale})"


def lookup_functions(schema: str, *, sketch: str, sketch_type: str, max_distance: int, scale: int,
                     min_similarity: str, unit: str, beyond: str) -> list[tuple[str, str, str]]:
    """``simdb_near`` and ``simdb_similar`` over the method's ``simdb_lookup(sketch, max_distance)``, the same for
    every method: each checks its argument in PL/pgSQL before its query runs (an error raised inside the query
    printed the whole lookup, 15 or 21 branches, into psql), and answers a distance beyond the index's maximum
    (or a similarity below its threshold) from what the keys find, with a NOTICE that says what is no longer
    guaranteed (``beyond``). ``min_similarity`` is the default of ``simdb_similar`` as SQL text. On one server
    ``simdb_lookup`` stays a SQL function, inlined into their query, whose plan is generic from the first call
    and kept for the session (PL/pgSQL calling a PL/pgSQL ``simdb_lookup`` set its 15 index scans per segment up
    anew on every call: beside 16 segments 5.2-9.0 ms a call against 1.2-3.7 ms; a session's first six calls
    cost about the same either way, where five custom plans had spent 37 of 43 ms planning at 11 segments)."""
    k, beyond = max_distance, beyond.replace("'", "''")  # inside an SQL string
    similarity = similarity_sql("l.distance", scale)
    return [
        (f"simdb_near({sketch_type}, integer)",
         f"""CREATE OR REPLACE FUNCTION {schema}.simdb_near({sketch} {sketch_type}, max_distance integer DEFAULT {k})
            RETURNS TABLE (document_id bigint, distance integer) ROWS 10 SET plan_cache_mode = force_generic_plan
            LANGUAGE plpgsql STABLE PARALLEL SAFE AS $$
            BEGIN
                IF max_distance IS NULL OR max_distance < 0 OR max_distance > {scale} THEN
                    RAISE EXCEPTION 'simdb_near: max_distance must be between 0 and {scale} ({k}, the index''s '
                                    'maximum distance, or more for an incomplete answer), not %', max_distance
                                    USING ERRCODE = 'invalid_parameter_value';
                END IF;
                IF max_distance > {k} THEN
                    RAISE NOTICE 'simdb_near: % is beyond the index''s maximum distance {k}: {beyond}', max_distance;
                END IF;
                RETURN QUERY SELECT l.document_id, l.distance FROM {schema}.simdb_lookup({sketch}, max_distance) l;
            END $$""",
         f"Documents within max_distance (default {k}, the index's maximum distance) {unit} of a {sketch}, "
         f"found through the key indexes; beyond {k} the answer is incomplete, and a NOTICE says so."),
        (f"simdb_similar({sketch_type}, double precision)",
         f"""CREATE OR REPLACE FUNCTION {schema}.simdb_similar({sketch} {sketch_type}, min_similarity double precision DEFAULT {min_similarity})
            RETURNS TABLE (document_id bigint, similarity double precision) ROWS 10 SET plan_cache_mode = force_generic_plan
            LANGUAGE plpgsql STABLE PARALLEL SAFE AS $$
            BEGIN
                IF min_similarity IS NULL OR min_similarity < 0 OR min_similarity > 1 THEN
                    RAISE EXCEPTION 'simdb_similar: min_similarity must be between 0 and 1 ({min_similarity}, the '
                                    'index''s threshold, or less for an incomplete answer), not %', min_similarity
                                    USING ERRCODE = 'invalid_parameter_value';
                END IF;
                IF min_similarity < {min_similarity} THEN
                    RAISE NOTICE 'simdb_similar: % is below the index''s threshold {min_similarity}: {beyond}',
                                 min_similarity;
                END IF;
                RETURN QUERY SELECT l.document_id, {similarity}
                FROM {schema}.simdb_lookup({sketch}, {scale} - ceil(min_similarity * {scale} - 1e-9)::integer) l;
            END $$""",
         f"Documents whose similarity (({scale} - distance) / {scale}) to a {sketch} is at least min_similarity "
         f"(default {min_similarity}, the index's threshold): simdb_near in the vocabulary of similarity."),
    ]


def other_method_functions(schema: str, this: str, functions: Sequence[tuple[str, str, str, str]], instead: str
                           ) -> list[tuple[str, str, str]]:
    """Stubs of the other method's functions (``(name, arguments, their types, return type)``): each raises one
    line saying that the index is ``this`` method and what to call ``instead``, where PostgreSQL said ``function
    ... does not exist``."""
    return [(f"{name}({types})",
             f"""CREATE OR REPLACE FUNCTION {schema}.{name}({arguments}) RETURNS {returns}
            LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
            BEGIN
                RAISE EXCEPTION '{name}({types}): this index is {this}, and that is the other method''s function: {instead}'
                    USING ERRCODE = 'feature_not_supported';
            END $$""",
             f"Not for a {this} index: {instead}.")
            for name, arguments, types, returns in functions]
