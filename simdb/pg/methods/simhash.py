"""SimHash in SQL: block keys computed by PostgreSQL, candidate joins, and the analysts' functions.

Candidates come from equality joins on each key column, one ``SELECT`` per key glued with
``UNION ALL``; each join also applies the distance in SQL
(``bit_count((p.simhash # t.simhash)::bit(64)) <= k``) so that only likely matches leave the
server. The survivors stream out as a binary COPY, are verified again by popcount in numpy (the
final check), and a pair that agreed on several keys comes back once per key.

Keys are not excluded pairwise in SQL (``t.key_0 <> p.key_0`` ...): that would read columns the
covering key indexes do not carry and cost the index-only scans, which matter far more than a few
repeated pairs.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import sqlalchemy as sa

from ...bits import hamming_array, to_signed, to_unsigned_array
from ...methods.simhash.blocks import BlockLayout
from ..copy import copy_out_int64
from ..probes import lateral_probe
from .base import MethodSQL, lookup_functions, other_method_functions, similarity_sql


def key_expression(layout: BlockLayout, key: int, column: str = "simhash") -> str:
    """SQL computing one key of ``layout`` from a signed fingerprint (the ``simhash`` column by default).

    ``>>`` on BIGINT is arithmetic, but every block is masked after the shift, so the sign bits it
    drags in are dropped; the result equals :meth:`BlockLayout.block_keys` on the unsigned fingerprint.
    """
    parts, shift = [], 0
    for block in layout.keys[key]:
        start, width = layout.block_ranges[block]
        part = f"(({column} >> {start}) & {(1 << width) - 1})"
        parts.append(f"({part} << {shift})" if shift else part)
        shift += width
    return " | ".join(parts)


def candidate_sql(layout: BlockLayout, probe: str, target: str, max_distance: int, *, where: str | None = None,
                  index_probes: bool = False, columns: Sequence[str] | None = None) -> str:
    """SQL for ``(probe id, target id, probe simhash, target simhash)`` rows sharing a key, within ``max_distance``.

    ``probe`` and ``target`` are table names (they may be the same table) or parenthesized subqueries;
    ``index_probes`` and ``columns``: see :meth:`simdb.pg.methods.base.MethodSQL.candidate_pairs`.
    """
    selects = []
    for column in columns or layout.key_columns:
        conditions = [f"t.{column} = p.{column}"]
        if where:
            conditions.append(f"({where})")
        close = f"bit_count((p.simhash # t.simhash)::bit(64)) <= {int(max_distance)}"
        if index_probes:
            probes = lateral_probe(probe, target, column, ["id", "simhash", column], ["id", "simhash"], conditions)
            selects.append(f"SELECT p.id, t.id, p.simhash, t.simhash FROM {probes} WHERE {close}")
        else:
            selects.append(f"SELECT p.id, t.id, p.simhash, t.simhash FROM {probe} p "
                           f"JOIN {target} t ON {' AND '.join([*conditions, close])}")
    return "\nUNION ALL\n".join(selects)


def verified_pairs(connection: sa.Connection, sql: str, max_distance: int,
                   params: dict | None = None) -> Iterator[np.ndarray]:
    """Run a :func:`candidate_sql` query; yield ``(probe id, target id, distance)`` rows within ``max_distance``."""
    for chunk in copy_out_int64(connection, sql, 4, params):
        distances = hamming_array(to_unsigned_array(chunk[:, 2]), to_unsigned_array(chunk[:, 3]))
        keep = distances <= max_distance
        yield np.stack([chunk[keep, 0], chunk[keep, 1], distances[keep].astype(np.int64)], axis=1)


#: The MinHash functions a SimHash index answers with one clear error (:func:`other_method_functions`).
MINHASH_FUNCTIONS = (
    ("simdb_similarity", "a bytea, b bytea", "bytea, bytea", "double precision"),
    ("simdb_band_keys", "signature bytea", "bytea", "bigint[]"),
    ("simdb_near", "signature bytea, max_distance integer DEFAULT NULL", "bytea, integer",
     "TABLE (document_id bigint, distance integer)"),
    ("simdb_similar", "signature bytea, min_similarity double precision DEFAULT NULL", "bytea, double precision",
     "TABLE (document_id bigint, similarity double precision)"))


def function_statements(schema: str, layout: BlockLayout, one_statement: bool = False,
                        keys: tuple[str, list[str]] | None = None) -> list[tuple[str, str, str]]:
    """``(signature, CREATE statement, comment)`` of the SimHash analysts' functions for ``layout``; with
    ``one_statement``, a lookup is one scan of ``documents`` whose condition ORs the keys; with ``keys``, one
    routed read of the keys table (see :meth:`simdb.pg.methods.base.MethodSQL.functions`)."""
    k = layout.max_distance
    conditions = [f"{column} = {key_expression(layout, i, 'fingerprint')}" for i, column in enumerate(layout.key_columns)]
    if keys is not None:  # the parameter named in full: the keys table has a column ``fingerprint`` too; a
        table, folded = keys  # document that shares several keys has a row for each: once, as the ORed scan gave it
        lookups = (f"                SELECT DISTINCT k.id, k.fingerprint AS simhash FROM {schema}.{table} k "
                   f"WHERE k.key = ANY(ARRAY[{', '.join(folded)}])")
    else:
        lookups = (f"                SELECT id, simhash FROM {schema}.documents WHERE " + " OR ".join(conditions)
                   if one_statement else "\n                UNION\n".join(
                       f"                SELECT id, simhash FROM {schema}.documents WHERE {condition}"
                       for condition in conditions))
    return [
        ("simdb_hamming(bigint, bigint)",
         f"""CREATE OR REPLACE FUNCTION {schema}.simdb_hamming(a bigint, b bigint) RETURNS integer
            LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
            RETURN bit_count((a # b)::bit(64))::integer""",
         "Bits in which two stored fingerprints differ."),
        ("simdb_fingerprint_hex(bigint)",
         f"""CREATE OR REPLACE FUNCTION {schema}.simdb_fingerprint_hex(fingerprint bigint) RETURNS text
            LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
            RETURN lpad(to_hex(fingerprint), 16, '0')""",
         "A stored fingerprint as the 16 hex digits the simdb CLI prints."),
        ("simdb_fingerprint_from_hex(text)",
         f"""CREATE OR REPLACE FUNCTION {schema}.simdb_fingerprint_from_hex(hex text) RETURNS bigint
            LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
            BEGIN
                IF hex !~* '^(0x)?[0-9a-f]{{1,16}}$' THEN
                    RAISE EXCEPTION 'simdb_fingerprint_from_hex: % is not a fingerprint', quote_literal(hex)
                        USING ERRCODE = 'invalid_text_representation',
                              HINT = 'give up to 16 hex digits, as simdb fingerprint prints them';
                END IF;
                RETURN ('x' || lpad(regexp_replace(hex, '^0x', '', 'i'), 16, '0'))::bit(64)::bigint;
            END $$""",
         "The stored (signed BIGINT) form of a fingerprint given in hex."),
        ("simdb_lookup(bigint, integer)",
         f"""CREATE OR REPLACE FUNCTION {schema}.simdb_lookup(fingerprint bigint, max_distance integer)
            RETURNS TABLE (document_id bigint, distance integer) ROWS 10
            LANGUAGE sql STABLE PARALLEL SAFE AS $$
            SELECT c.id, bit_count((c.simhash # fingerprint)::bit(64))::integer
            FROM (
{lookups}
            ) c
            WHERE bit_count((c.simhash # fingerprint)::bit(64)) <= max_distance
            $$""",
         f"What simdb_near and simdb_similar read: the documents sharing a block key with a fingerprint and within "
         f"max_distance bits of it (every one up to {k}), unchecked."),
        *lookup_functions(schema, sketch="fingerprint", sketch_type="bigint", max_distance=k, scale=64,
                          min_similarity=repr(1 - k / 64), unit="bits",
                          beyond="only documents sharing a block key are found, so some within it may be missing"),
        *other_method_functions(schema, "SimHash", MINHASH_FUNCTIONS,
                                "give a fingerprint (bigint) to simdb_near or simdb_similar, and compare two with "
                                "simdb_hamming"),
    ]


class SimHashSQL(MethodSQL):
    """:class:`simdb.methods.SimHash`'s SQL: block keys, joins on them, and the analysts' functions."""

    name = "simhash"
    sketch_type = "bigint"
    sketch_column = ("simhash", "int8")
    keys_from_stored = True
    verified_beside_keys = True

    def candidate_pairs(self, connection: sa.Connection, probe: str, target: str, max_distance: int, *,
                        where: str | None = None, params: dict | None = None, index_probes: bool = False,
                        columns: Sequence[str] | None = None) -> Iterator[np.ndarray]:
        return verified_pairs(connection, candidate_sql(self.method.layout, probe, target, max_distance, where=where,
                                                        index_probes=index_probes, columns=columns),
                              max_distance, params)

    def lookup_sql(self, sketch: int, max_distance: int) -> tuple[str, dict]:
        # simdb_lookup, not simdb_near (whose checks the Index makes itself): on one server a SQL function, inlined
        # into the prepared statement that calls it, whose plan the connection keeps until a relayout makes the
        # function anew (simdb_near's PL/pgSQL set a nested plan of 15 index scans per segment up anew on every
        # call: beside 16 segments, about 7 MB and 1,700 page faults a call, p50 6.1-7.7 ms against 1.9-2.6 ms)
        return ("SELECT document_id FROM simdb_lookup(CAST(:fingerprint AS bigint), :max_distance)",
                {"fingerprint": to_signed(sketch), "max_distance": max_distance})

    def key_sql(self, sketch: str) -> list[str]:
        layout = self.method.layout
        return [key_expression(layout, i, sketch) for i in range(len(layout.keys))]

    def functions(self, schema: str, one_statement: bool = False, keys: tuple[str, list[str]] | None = None
                  ) -> list[tuple[str, str, str]]:
        return function_statements(schema, self.method.layout, one_statement, keys)

    def similarity_sql(self, distance: str) -> str:
        return similarity_sql(distance, self.method.layout.bits)

    def similarity_between_sql(self, schema: str, a: str, b: str) -> str:
        return similarity_sql(f"bit_count(({a}.simhash # {b}.simhash)::bit(64))", self.method.layout.bits)
