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

from ...pg.copy import copy_out
from ...pg.probes import lateral_probe
from ..base import check_distance_function
from .signature import EXACT_SCALE, MinHashSettings


def band_candidate_sql(settings: MinHashSettings, probe: str, target: str, *, where: str | None = None,
                       index_probes: bool = False, columns: Sequence[str] | None = None) -> str:
    """SQL for ``(probe id, target id, probe signature, target signature)``, once per pair sharing a band;
    ``index_probes`` and ``columns``: see :meth:`simdb.methods.base.Method.candidate_pairs`."""
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


def function_statements(schema: str, settings: MinHashSettings, one_statement: bool = False
                        ) -> list[tuple[str, str, str]]:
    """``(signature, CREATE statement, comment)`` of the MinHash analysts' functions."""
    bands, threshold, k, n = settings.bands, settings.threshold, settings.max_distance, settings.num_perm
    positions = f"round((1 - s.similarity) * {n})::integer"  # the positions in which the signatures differ
    distance = f"(({positions} * {EXACT_SCALE} + {n - 1}) / {n})" if settings.exact else positions
    unit = "ten-thousandths of Jaccard distance (estimated)" if settings.exact else "signature positions"
    # the parameter qualified by the function's name: a bare ``signature`` here is the documents column, which
    # made every band "match" its own row and every lookup a scan of the table
    conditions = [f"{column} = {band_key_sql(settings, i, 'simdb_similar.signature')}"
                  for i, column in enumerate(settings.key_columns)]
    lookups = (f"                SELECT id, signature AS s FROM {schema}.documents WHERE " + " OR ".join(conditions)
               if one_statement else "\n                UNION\n".join(
                   f"                SELECT id, signature AS s FROM {schema}.documents WHERE {condition}"
                   for condition in conditions))
    return [
        ("simdb_similarity(bytea, bytea)",
         f"""CREATE OR REPLACE FUNCTION {schema}.simdb_similarity(a bytea, b bytea) RETURNS real
            LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
            SELECT count(*) FILTER (WHERE substr(a, 4 * i + 1, 4) = substr(b, 4 * i + 1, 4))::real
                   / (length(a) / 4)
            FROM generate_series(0, length(a) / 4 - 1) AS i
            $$""",
         "Estimated Jaccard similarity of two MinHash signatures: the share of positions where they agree."),
        ("simdb_band_keys(bytea)",
         f"""CREATE OR REPLACE FUNCTION {schema}.simdb_band_keys(signature bytea) RETURNS bigint[]
            LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
            SELECT array_agg({band_key_sql(settings, 'i')} ORDER BY i) FROM generate_series(0, {bands - 1}) AS i
            $$""",
         "The LSH band keys of a signature, as stored in key_0, key_1, ..."),
        ("simdb_check_similarity(real)",
         f"""CREATE OR REPLACE FUNCTION {schema}.simdb_check_similarity(min_similarity real) RETURNS boolean
            LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
            BEGIN
                IF min_similarity IS NULL OR min_similarity < {threshold} OR min_similarity > 1 THEN
                    RAISE EXCEPTION 'simdb_similar: min_similarity must be between {threshold} (the index''s '
                                    'threshold) and 1, not %', min_similarity USING ERRCODE = 'invalid_parameter_value';
                END IF;
                RETURN true;
            END $$""",
         ""),
        ("simdb_similar(bytea, real)",
         f"""CREATE OR REPLACE FUNCTION {schema}.simdb_similar(signature bytea, min_similarity real DEFAULT {threshold})
            RETURNS TABLE (document_id bigint, similarity real)
            LANGUAGE sql STABLE PARALLEL SAFE AS $$
            SELECT c.id, {schema}.simdb_similarity(c.s, signature)
            FROM (
{lookups}
            ) c
            WHERE {schema}.simdb_check_similarity(min_similarity)
              AND {schema}.simdb_similarity(c.s, signature) >= min_similarity
            $$""",
         f"Documents whose estimated Jaccard similarity to a signature is at least min_similarity (default and at "
         f"least {threshold}), found through the band indexes."),
        check_distance_function(schema, k),
        ("simdb_near(bytea, integer)",
         f"""CREATE OR REPLACE FUNCTION {schema}.simdb_near(signature bytea, max_distance integer DEFAULT {k})
            RETURNS TABLE (document_id bigint, distance integer)
            LANGUAGE sql STABLE PARALLEL SAFE AS $$
            SELECT s.document_id, {distance}
            FROM {schema}.simdb_similar(simdb_near.signature, {threshold}) s
            WHERE {schema}.simdb_check_distance(max_distance) AND {distance} <= max_distance
            $$""",
         f"Documents within max_distance (default and at most {k}) {unit} of a signature, found through the band "
         "indexes: simdb_similar in the vocabulary of distance that SimHash indexes share."),
    ]
