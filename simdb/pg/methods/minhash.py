"""MinHash in SQL: band joins, verification of both signatures in numpy, and the analysts' functions.

The band joins give each candidate pair once (``UNION``); PostgreSQL returns both signatures as
fixed-width ``bytea`` in a binary COPY, and numpy counts the positions where they agree: a pair is
kept when the signatures differ in at most ``max_distance`` positions, that is, when the Jaccard
estimate reaches the threshold. PostgreSQL computes a band's key with ``md5()``, so SQL can cut a
signature into band keys too.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import sqlalchemy as sa

from ...errors import IncompatibleIndex
from ...methods.minhash.signature import EXACT_SCALE, MinHashSettings
from ..copy import copy_out
from ..probes import lateral_probe
from .base import MethodSQL, lookup_functions, other_method_functions, similarity_sql


def band_candidate_sql(settings: MinHashSettings, probe: str, target: str, *, where: str | None = None,
                       index_probes: bool = False, columns: Sequence[str] | None = None) -> str:
    """SQL for ``(probe id, target id, probe signature, target signature)``, once per pair sharing a band;
    ``index_probes`` and ``columns``: see :meth:`simdb.pg.methods.base.MethodSQL.candidate_pairs`."""
    columns = columns or settings.key_columns
    conditions = [f"({where})"] if where else []
    if index_probes:
        selects = ["SELECT p.id AS p_id, t.id AS t_id FROM " + lateral_probe(
                       probe, target, column, ["id", column], ["id"], [f"t.{column} = p.{column}", *conditions])
                   for column in columns]
        # each target signature by its primary key, as the probes do
        signatures = f"CROSS JOIN LATERAL (SELECT t.signature FROM {target} t WHERE t.id = c.t_id OFFSET 0) t"
    else:
        selects = [f"SELECT p.id AS p_id, t.id AS t_id FROM {probe} p JOIN {target} t "
                   f"ON {' AND '.join([f't.{column} = p.{column}', *conditions])}" for column in columns]
        signatures = f"JOIN {target} t ON t.id = c.t_id"
    return (f"SELECT c.p_id, c.t_id, p.signature, t.signature FROM ({' UNION '.join(selects)}) c "
            f"JOIN {probe} p ON p.id = c.p_id {signatures}")


def band_pairs(connection: sa.Connection, settings: MinHashSettings, sql: str, max_distance: int,
               params: dict | None = None) -> Iterator[np.ndarray]:
    """Run a :func:`band_candidate_sql` query; yield ``(probe id, target id, distance)`` rows whose
    signatures differ in at most ``max_distance`` positions."""
    width = settings.signature_bytes
    for rows in copy_out(connection, sql, [8, 8, width, width], params, chunk_rows=1 << 16):
        if not rows.size:
            continue
        probe = np.frombuffer(rows["value2"].tobytes(), dtype="<u4").reshape(len(rows), settings.num_perm)
        target = np.frombuffer(rows["value3"].tobytes(), dtype="<u4").reshape(len(rows), settings.num_perm)
        distances = settings.distances_of(settings.num_perm - np.count_nonzero(probe == target, axis=1))
        keep = distances <= max_distance
        yield np.stack([rows["value0"][keep].astype(np.int64), rows["value1"][keep].astype(np.int64),
                        distances[keep].astype(np.int64)], axis=1)


def band_key_sql(settings: MinHashSettings, band: int | str, signature: str = "signature") -> str:
    """SQL for one band's key (``band`` a number, or an SQL expression for it): the first 8 bytes of its MD5."""
    width = 4 * settings.rows
    return f"('x' || substr(md5(substr({signature}, {band} * {width} + 1, {width})), 1, 16))::bit(64)::bigint"


#: The SimHash functions a MinHash index answers with one clear error (:func:`other_method_functions`).
SIMHASH_FUNCTIONS = (
    ("simdb_hamming", "a bigint, b bigint", "bigint, bigint", "integer"),
    ("simdb_fingerprint_hex", "fingerprint bigint", "bigint", "text"),
    ("simdb_fingerprint_from_hex", "hex text", "text", "bigint"),
    ("simdb_near", "fingerprint bigint, max_distance integer DEFAULT NULL", "bigint, integer",
     "TABLE (document_id bigint, distance integer)"),
    ("simdb_similar", "fingerprint bigint, min_similarity double precision DEFAULT NULL", "bigint, double precision",
     "TABLE (document_id bigint, similarity double precision)"))


def function_statements(schema: str, settings: MinHashSettings, one_statement: bool = False
                        ) -> list[tuple[str, str, str]]:
    """``(signature, CREATE statement, comment)`` of the MinHash analysts' functions.

    ``simdb_lookup`` decides by the index's own rule. Estimate: the signatures' share of differing positions.
    Exact (``--verify exact``): a signature that is a stored document's is answered with that document's
    stored pairs, whose distances ingest computed from the two texts' shingle sets (every pair within the
    index's maximum distance is stored), so that a pair's similarity is the same number in every function and
    view; a signature no stored document has cannot be decided by its text, which SQL does not have, and is
    answered by the estimate, with a NOTICE. A stored document's pairs are read in one statement, by either
    side (a ``UNION ALL`` of the two sides was, on Citus, two subplans and their results gathered, 0021)."""
    n, k, scale = settings.num_perm, settings.max_distance, settings.scale
    # the parameter qualified by the function's name: a bare ``signature`` here is the documents column, which
    # made every band "match" its own row and every lookup a scan of the table
    conditions = [f"{column} = {band_key_sql(settings, i, 'simdb_lookup.signature')}"
                  for i, column in enumerate(settings.key_columns)]
    lookups = (f"                SELECT id, signature AS s FROM {schema}.documents WHERE " + " OR ".join(conditions)
               if one_statement else "\n                UNION\n".join(
                   f"                SELECT id, signature AS s FROM {schema}.documents WHERE {condition}"
                   for condition in conditions))
    positions = f"{n} - round({schema}.simdb_similarity(c.s, simdb_lookup.signature) * {n})::integer"
    distance = f"(({positions}) * {EXACT_SCALE} + {n - 1}) / {n}" if settings.exact else positions
    estimated = (f"SELECT c.id, d.distance FROM (\n{lookups}\n            ) c\n"
                 f"            CROSS JOIN LATERAL (SELECT {distance} AS distance) d\n"
                 f"            WHERE d.distance <= max_distance")
    if settings.exact:
        lookup = f"""CREATE OR REPLACE FUNCTION {schema}.simdb_lookup(signature bytea, max_distance integer)
            RETURNS TABLE (document_id bigint, distance integer) ROWS 10 SET plan_cache_mode = force_generic_plan
            LANGUAGE plpgsql STABLE PARALLEL SAFE AS $$
            #variable_conflict use_column
            DECLARE
                stored_id bigint;
                stored_texts bigint;
            BEGIN
                SELECT min(d.id), count(DISTINCT d.content_hash) INTO stored_id, stored_texts
                FROM {schema}.documents d
                WHERE d.key_0 = {band_key_sql(settings, 0, 'simdb_lookup.signature')} AND d.signature = simdb_lookup.signature;
                IF stored_id IS NULL THEN
                    RAISE NOTICE 'simdb: no stored document has this signature, and this index decides by the texts, '
                                 'which SQL does not have: these similarities are the signatures'' estimates (simdb '
                                 'query decides a text exactly)';
                    RETURN QUERY {estimated};
                    RETURN;
                END IF;
                IF stored_texts > 1 THEN
                    RAISE NOTICE 'simdb: % stored documents with different texts have this signature: the answer is '
                                 'the earliest one''s (id %); simdb_neighbours(external_id) gives each one''s',
                                 stored_texts, stored_id;
                END IF;
                RETURN QUERY SELECT stored_id, 0;
                RETURN QUERY SELECT CASE WHEN p.a_id = stored_id THEN p.b_id ELSE p.a_id END, p.distance::integer
                FROM {schema}.near_duplicates p
                WHERE (p.a_id = stored_id OR p.b_id = stored_id) AND p.distance <= max_distance;
            END $$"""
        beyond = ("a stored document's pairs are stored only up to it, and other signatures find fewer candidates "
                  "beyond it")
    else:
        lookup = f"""CREATE OR REPLACE FUNCTION {schema}.simdb_lookup(signature bytea, max_distance integer)
            RETURNS TABLE (document_id bigint, distance integer) ROWS 10
            LANGUAGE sql STABLE PARALLEL SAFE AS $$
            {estimated}
            $$"""
        beyond = "only documents sharing a band are found, and fewer do beyond it, so some may be missing"
    unit = "ten-thousandths of Jaccard distance" if settings.exact else "signature positions"
    return [
        ("simdb_similarity(bytea, bytea)",
         f"""CREATE OR REPLACE FUNCTION {schema}.simdb_similarity(a bytea, b bytea) RETURNS double precision
            LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
            SELECT count(*) FILTER (WHERE substr(a, 4 * i + 1, 4) = substr(b, 4 * i + 1, 4))::double precision
                   / (length(a) / 4)
            FROM generate_series(0, length(a) / 4 - 1) AS i
            $$""",
         "Estimated Jaccard similarity of two MinHash signatures: the share of positions where they agree."),
        ("simdb_band_keys(bytea)",
         f"""CREATE OR REPLACE FUNCTION {schema}.simdb_band_keys(signature bytea) RETURNS bigint[]
            LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
            SELECT array_agg({band_key_sql(settings, 'i')} ORDER BY i) FROM generate_series(0, {settings.bands - 1}) AS i
            $$""",
         "The LSH band keys of a signature, as stored in key_0, key_1, ..."),
        ("simdb_lookup(bytea, integer)", lookup,
         f"What simdb_near and simdb_similar read: the documents within max_distance {unit} of a signature "
         f"by the index's rule (up to {k}, every one), unchecked."),
        *lookup_functions(schema, sketch="signature", sketch_type="bytea", max_distance=k, scale=scale,
                          min_similarity=repr(settings.threshold), unit=unit, beyond=beyond),
        *other_method_functions(schema, "MinHash", SIMHASH_FUNCTIONS,
                                "give a signature (bytea) to simdb_near or simdb_similar, and compare two with "
                                "simdb_similarity"),
    ]


class MinHashSQL(MethodSQL):
    """:class:`simdb.methods.MinHash`'s SQL: band keys, joins on them, and the analysts' functions."""

    name = "minhash"
    sketch_type = "bytea"
    sketch_column = ("signature", "bytea")

    def candidate_pairs(self, connection: sa.Connection, probe: str, target: str, max_distance: int, *,
                        where: str | None = None, params: dict | None = None, index_probes: bool = False,
                        columns: Sequence[str] | None = None) -> Iterator[np.ndarray]:
        settings = self.method.settings
        return band_pairs(connection, settings, band_candidate_sql(settings, probe, target, where=where,
                                                                   index_probes=index_probes, columns=columns),
                          max_distance, params)

    def lookup_sql(self, sketch: bytes, max_distance: int) -> tuple[str, dict]:
        keys = self.method.keys([sketch])[0].tolist()
        union = " UNION ".join(f"SELECT id AS document_id FROM documents WHERE {column} = :band_{i}"
                               for i, column in enumerate(self.key_columns))
        return union, {f"band_{i}": key for i, key in enumerate(keys)}

    def key_sql(self, sketch: str) -> list[str]:
        settings = self.method.settings
        return [band_key_sql(settings, i, sketch) for i in range(settings.bands)]

    def functions(self, schema: str, one_statement: bool = False, keys: tuple[str, list[str]] | None = None
                  ) -> list[tuple[str, str, str]]:
        if keys is not None:
            raise IncompatibleIndex("a MinHash index has no keys table (the keyed distributed layout holds SimHash "
                                    "indexes only)")
        return function_statements(schema, self.method.settings, one_statement)

    def similarity_sql(self, distance: str) -> str:
        return similarity_sql(distance, self.method.settings.scale)

    def similarity_between_sql(self, schema: str, a: str, b: str) -> str:
        return f"{schema}.simdb_similarity({a}.signature, {b}.signature)"  # the estimate, even when deciding exactly
