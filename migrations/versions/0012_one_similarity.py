"""One similarity per pair, lookups that decide by the index's own rule, checked before they run.

* ``simdb_lookup(sketch, max_distance)``, one per method, is what ``simdb_near`` and ``simdb_similar`` read.
  On a MinHash index deciding exactly (``--verify exact``), a signature that is a stored document's is
  answered with that document's stored pairs, whose similarity ingest computed from the texts (the lookups
  gave the signatures' estimate, and missed pairs whose estimate fell short: exact 0.876, estimate 0.789).
* ``simdb_near`` and ``simdb_similar`` check their argument in PL/pgSQL before the query runs (an error
  raised inside it printed the whole 15-branch lookup into psql), and answer beyond the index's maximum
  distance or below its threshold with a NOTICE saying what is no longer guaranteed.
* ``similarity`` is ``double precision`` everywhere, computed as ``(scale - distance) / scale``: it was
  ``real`` on SimHash and printed ``0.8502000000000001`` on MinHash. ``near_duplicate_pairs`` gains
  ``a_batch`` and ``b_batch``.
* The other method's functions exist and raise one line saying which method the index is.

The lookups (the key or band conditions, which depend on the layout) are read from the index's own
functions and kept. This migration carries its own SQL and imports nothing from simdb.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-26
"""
import re
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

EXACT_SCALE = 10000


def similarity_sql(distance: str, scale: int) -> str:
    """SQL for the similarity of a distance counted out of ``scale``: ``(scale - distance) / scale`` in double
    precision, the nearest double to that fraction (psql prints ``0.8502``, where ``1 - 1498 / 10000.0`` prints
    ``0.8502000000000001``), as the methods compute it in Python."""
    return f"(({scale} - {distance})::double precision / {scale})"


def lookup_functions(schema: str, *, sketch: str, sketch_type: str, max_distance: int, scale: int,
                     min_similarity: str, unit: str, beyond: str) -> list[tuple[str, str, str]]:
    """``simdb_near`` and ``simdb_similar`` over the method's ``simdb_lookup(sketch, max_distance)``, the same for
    every method: each checks its argument in PL/pgSQL before its query runs (an error raised inside the query
    printed the whole lookup, 15 or 21 branches, into psql), and answers a distance beyond the index's maximum
    (or a similarity below its threshold) from what the keys find, with a NOTICE that says what is no longer
    guaranteed (``beyond``). ``min_similarity`` is the default of ``simdb_similar`` as SQL text."""
    k, beyond = max_distance, beyond.replace("'", "''")  # inside an SQL string
    similarity = similarity_sql("l.distance", scale)
    return [
        (f"simdb_near({sketch_type}, integer)",
         f"""CREATE OR REPLACE FUNCTION {schema}.simdb_near({sketch} {sketch_type}, max_distance integer DEFAULT {k})
            RETURNS TABLE (document_id bigint, distance integer) ROWS 10
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
            RETURNS TABLE (document_id bigint, similarity double precision) ROWS 10
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


MINHASH_FUNCTIONS = (
    ("simdb_similarity", "a bytea, b bytea", "bytea, bytea", "double precision"),
    ("simdb_band_keys", "signature bytea", "bytea", "bigint[]"),
    ("simdb_near", "signature bytea, max_distance integer DEFAULT NULL", "bytea, integer",
     "TABLE (document_id bigint, distance integer)"),
    ("simdb_similar", "signature bytea, min_similarity double precision DEFAULT NULL", "bytea, double precision",
     "TABLE (document_id bigint, similarity double precision)"))

SIMHASH_FUNCTIONS = (
    ("simdb_hamming", "a bigint, b bigint", "bigint, bigint", "integer"),
    ("simdb_fingerprint_hex", "fingerprint bigint", "bigint", "text"),
    ("simdb_fingerprint_from_hex", "hex text", "text", "bigint"),
    ("simdb_near", "fingerprint bigint, max_distance integer DEFAULT NULL", "bigint, integer",
     "TABLE (document_id bigint, distance integer)"),
    ("simdb_similar", "fingerprint bigint, min_similarity double precision DEFAULT NULL", "bigint, double precision",
     "TABLE (document_id bigint, similarity double precision)"))

def simhash_functions(schema: str, rows: dict, lookups: str) -> list[tuple[str, str, str]]:
    """simdb.methods.simhash.sql.function_statements of revision 0012 (the functions it changed), given the
    lookups as the index has them."""
    k = int(rows["max_distance"])
    return [
        ("simdb_lookup(bigint, integer)",
         f"""CREATE OR REPLACE FUNCTION {schema}.simdb_lookup(fingerprint bigint, max_distance integer)
            RETURNS TABLE (document_id bigint, distance integer) ROWS 10 SET plan_cache_mode = force_generic_plan
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


def minhash_functions(schema: str, rows: dict, lookups: str, band_key_0: str) -> list[tuple[str, str, str]]:
    """simdb.methods.minhash.sql.function_statements of revision 0012, given the lookups and the first band's key
    as the index has them."""
    settings = rows["minhash"]
    exact = settings.get("verify") == "exact"
    n, k, threshold = settings["num_perm"], int(rows["max_distance"]), settings["threshold"]
    scale = EXACT_SCALE if exact else n
    positions = f"{n} - round({schema}.simdb_similarity(c.s, simdb_lookup.signature) * {n})::integer"
    distance = f"(({positions}) * {EXACT_SCALE} + {n - 1}) / {n}" if exact else positions
    estimated = (f"SELECT c.id, d.distance FROM (\n{lookups}\n            ) c\n"
                 f"            CROSS JOIN LATERAL (SELECT {distance} AS distance) d\n"
                 f"            WHERE d.distance <= max_distance")
    if exact:
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
                WHERE d.key_0 = {band_key_0} AND d.signature = simdb_lookup.signature;
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
                RETURN QUERY SELECT stored_id, 0
                UNION ALL SELECT p.b_id, p.distance::integer FROM {schema}.near_duplicates p
                          WHERE p.a_id = stored_id AND p.distance <= max_distance
                UNION ALL SELECT p.a_id, p.distance::integer FROM {schema}.near_duplicates p
                          WHERE p.b_id = stored_id AND p.distance <= max_distance;
            END $$"""
        beyond = ("a stored document's pairs are stored only up to it, and other signatures find fewer candidates "
                  "beyond it")
    else:
        lookup = f"""CREATE OR REPLACE FUNCTION {schema}.simdb_lookup(signature bytea, max_distance integer)
            RETURNS TABLE (document_id bigint, distance integer) ROWS 10 SET plan_cache_mode = force_generic_plan
            LANGUAGE sql STABLE PARALLEL SAFE AS $$
            {estimated}
            $$"""
        beyond = "only documents sharing a band are found, and fewer do beyond it, so some may be missing"
    unit = "ten-thousandths of Jaccard distance" if exact else "signature positions"
    return [
        ("simdb_similarity(bytea, bytea)",
         f"""CREATE OR REPLACE FUNCTION {schema}.simdb_similarity(a bytea, b bytea) RETURNS double precision
            LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
            SELECT count(*) FILTER (WHERE substr(a, 4 * i + 1, 4) = substr(b, 4 * i + 1, 4))::double precision
                   / (length(a) / 4)
            FROM generate_series(0, length(a) / 4 - 1) AS i
            $$""",
         "Estimated Jaccard similarity of two MinHash signatures: the share of positions where they agree."),
        ("simdb_lookup(bytea, integer)", lookup,
         f"What simdb_near and simdb_similar read: the documents within max_distance {unit} of a signature "
         f"by the index's rule (up to {k}, every one), unchecked."),
        *lookup_functions(schema, sketch="signature", sketch_type="bytea", max_distance=k, scale=scale,
                          min_similarity=repr(threshold), unit=unit, beyond=beyond),
        *other_method_functions(schema, "MinHash", SIMHASH_FUNCTIONS,
                                "give a signature (bytea) to simdb_near or simdb_similar, and compare two with "
                                "simdb_similarity"),
    ]


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _run(statement: str) -> None:
    op.get_bind().connection.dbapi_connection.execute(statement)  # DDL as written: '%' is no placeholder


def _distributed(schema: str) -> bool:
    connection = op.get_bind()
    if connection.execute(sa.text("SELECT to_regclass('pg_catalog.pg_dist_partition')")).scalar_one() is None:
        return False
    return connection.execute(sa.text(
        "SELECT count(*) FROM pg_dist_partition WHERE logicalrelid = CAST(:t AS regclass)"),
        {"t": f"{schema}.documents"}).scalar_one() > 0


_SQL_BODY = re.compile(r"LANGUAGE sql STABLE PARALLEL SAFE AS \$\$(.*)\$\$\s*$", re.S)
_LOOKUPS = re.compile(r"FROM \(\n(?P<lookups>.*?)\n\s*\) c\s+WHERE", re.S)


def _as_plpgsql(statement: str, parallel_safe: bool) -> str:
    attributes = "STABLE PARALLEL SAFE" if parallel_safe else "STABLE"
    statement = statement.replace("LANGUAGE plpgsql STABLE PARALLEL SAFE AS", f"LANGUAGE plpgsql {attributes} AS")
    if not parallel_safe:  # distributed: Citus plans no generic plan's parameters, only PL/pgSQL's values
        statement = statement.replace(" SET plan_cache_mode = force_generic_plan", "")
    return _SQL_BODY.sub(lambda m: f"LANGUAGE plpgsql {attributes} AS $$\n#variable_conflict use_column\nBEGIN\n"
                                   f"RETURN QUERY {m.group(1).strip()};\nEND $$", statement)


def _definition(schema: str, signature: str) -> str:
    return op.get_bind().execute(sa.text("SELECT pg_get_functiondef(CAST(:f AS regprocedure))"),
                                 {"f": f"{schema}.{signature}"}).scalar_one()


def _lookups(schema: str, signature: str) -> str:
    """The key or band lookups of a function the index has, as written into it."""
    definition = _definition(schema, signature)
    match = _LOOKUPS.search(definition)
    if match is None:  # stop before changing anything
        raise RuntimeError(f"migration 0012 cannot find the lookups in {signature}, so the upgrade is rolled back "
                           f"and the index left as it was; report it with the definition:\n{definition}")
    return match["lookups"]


def pairs_view(schema: str, similarity: str, distributed: bool) -> str:
    """``near_duplicate_pairs``. Each column of a pair's documents is a subquery by the document's primary key,
    which PostgreSQL computes only where a query reads the column (a view's unread output is left out, where a
    join to the partitioned documents table cannot be): the similarity histogram reads ``near_duplicates`` and
    ``batches`` alone (it joined both documents of every pair: 1.2-1.8 s at 1M documents, 5-10 ms from the
    table), and a query of a batch's pairs reads the documents of those pairs only. Citus plans no subquery of a
    distributed table that is not joined on its distribution column: a distributed index's view joins."""
    if distributed:
        return f"""CREATE OR REPLACE VIEW {schema}.near_duplicate_pairs AS
        SELECT p.a_id, a.external_id AS a_external_id, p.b_id, b.external_id AS b_external_id, p.distance,
               a.content_hash = b.content_hash AS exact, bt.name AS batch, ab.name AS a_batch, bt.name AS b_batch,
               p.found_at,
               a.metadata AS a_metadata, b.metadata AS b_metadata, {similarity} AS similarity,
               a.text AS a_text, b.text AS b_text
        FROM {schema}.near_duplicates p
        JOIN {schema}.documents a ON a.id = p.a_id
        JOIN {schema}.documents b ON b.id = p.b_id
        JOIN {schema}.batches ab ON ab.id = a.batch_id
        JOIN {schema}.batches bt ON bt.id = p.batch_id"""

    def of(column: str, side: str) -> str:
        return f"(SELECT d.{column} FROM {schema}.documents d WHERE d.id = p.{side}_id)"

    return f"""CREATE OR REPLACE VIEW {schema}.near_duplicate_pairs AS
        SELECT p.a_id, {of("external_id", "a")} AS a_external_id, p.b_id, {of("external_id", "b")} AS b_external_id,
               p.distance, (SELECT a.content_hash = b.content_hash FROM {schema}.documents a, {schema}.documents b
                            WHERE a.id = p.a_id AND b.id = p.b_id) AS exact, bt.name AS batch,
               (SELECT ab.name FROM {schema}.documents d JOIN {schema}.batches ab ON ab.id = d.batch_id
                WHERE d.id = p.a_id) AS a_batch, bt.name AS b_batch, p.found_at,
               {of("metadata", "a")} AS a_metadata, {of("metadata", "b")} AS b_metadata, {similarity} AS similarity,
               {of("text", "a")} AS a_text, {of("text", "b")} AS b_text
        FROM {schema}.near_duplicates p
        JOIN {schema}.batches bt ON bt.id = p.batch_id"""


def _views(schema: str, rows: dict, distributed: bool = True) -> list[str]:
    """simdb.pg.functions.create_views of revision 0012: the views whose similarity or columns changed (those of
    0011, with their joins, where ``distributed``)."""
    if rows.get("method") == "minhash":
        settings = rows["minhash"]
        scale = EXACT_SCALE if settings.get("verify") == "exact" else settings["num_perm"]
        to_canonical = f"{schema}.simdb_similarity(d.signature, c.signature)"
    else:
        scale = int(rows.get("bits", 64))
        to_canonical = similarity_sql("bit_count((d.simhash # c.simhash)::bit(64))", scale)
    similarity = similarity_sql("p.distance", scale)
    side = ("SELECT p.{me}_id AS document_id, {me}.external_id, {me}b.name AS batch, p.{other}_id AS neighbour_id, "
            "{other}.external_id AS neighbour_external_id, {other}b.name AS neighbour_batch, {earlier} AS "
            "neighbour_is_earlier, p.distance, {similarity} AS similarity, p.found_at "
            f"FROM {schema}.near_duplicates p JOIN {schema}.documents a ON a.id = p.a_id "
            f"JOIN {schema}.batches ab ON ab.id = a.batch_id JOIN {schema}.documents b ON b.id = p.b_id "
            f"JOIN {schema}.batches bb ON bb.id = b.batch_id")
    return [
        pairs_view(schema, similarity, distributed),
        f"CREATE OR REPLACE VIEW {schema}.document_neighbours AS "
        + side.format(me="b", other="a", earlier="true", similarity=similarity) + " UNION ALL "
        + side.format(me="a", other="b", earlier="false", similarity=similarity),
        f"""CREATE OR REPLACE VIEW {schema}.cluster_members AS
        SELECT d.cluster_id, c.external_id AS canonical_id, k.size AS cluster_size, d.id AS document_id,
               d.external_id, b.name AS batch, d.created_at, d.duplicate_of, d.duplicate_distance,
               {to_canonical} AS similarity_to_canonical,
               min({to_canonical}) OVER (PARTITION BY d.cluster_id) AS cluster_min_similarity, d.text
        FROM {schema}.clusters k
        JOIN {schema}.documents d ON d.cluster_id = k.cluster_id
        JOIN {schema}.documents c ON c.id = k.cluster_id
        JOIN {schema}.batches b ON b.id = d.batch_id""",
    ]


NEIGHBOURS = """CREATE OR REPLACE FUNCTION {schema}.simdb_neighbours(external_id text)
            RETURNS SETOF {schema}.document_neighbours
            LANGUAGE sql STABLE PARALLEL SAFE AS $$
            SELECT * FROM {schema}.document_neighbours n WHERE n.external_id = simdb_neighbours.external_id
            $$"""
VIEW_COMMENTS = {
    "near_duplicate_pairs": "Every near-duplicate pair found at ingest (a stored first), with both documents' "
                            "metadata, batches (a_batch, b_batch; batch is b_batch) and, where the index keeps "
                            "them, texts. distance: differing bits (SimHash), signature positions (MinHash) or "
                            "ten-thousandths of Jaccard distance (MinHash deciding exactly); similarity (double "
                            "precision, the same in every function and view): 1 - distance / 64 (SimHash), the "
                            "Jaccard estimate or the exact Jaccard (MinHash).",
    "document_neighbours": "Every stored pair from both sides: each document with each of its near-duplicates, "
                           "both batches, whether the neighbour came earlier, distance and similarity.",
    "cluster_members": "The members of every cluster of two or more, each with its similarity to the "
                       "cluster's canonical (earliest) document as the sketches estimate it, and the smallest "
                       "such similarity in its cluster: how far the cluster has spread.",
}


def upgrade() -> None:
    schema = context.config.attributes["schema"]
    connection = op.get_bind()
    rows = dict(connection.execute(sa.text("SELECT name, value FROM settings")).all())
    minhash = rows.get("method") == "minhash"
    sketch_type = "bytea" if minhash else "bigint"
    if minhash:
        lookups = _lookups(schema, "simdb_similar(bytea, real)").replace("simdb_similar.signature",
                                                                         "simdb_lookup.signature")
        key = re.search(r"key_0 = (\('x' \|\| substr\(md5\(substr\(simdb_lookup\.signature, [^)]*\)\), 1, 16\)\)"
                        r"::bit\(64\)::bigint)", lookups)
        if key is None:
            raise RuntimeError("migration 0012 cannot find the first band's key in simdb_similar, so the upgrade is "
                               "rolled back and the index left as it was; report it with the definition:\n"
                               + _definition(schema, "simdb_similar(bytea, real)"))
        functions = minhash_functions(schema, rows, lookups, key[1])
    else:
        functions = simhash_functions(schema, rows, _lookups(schema, "simdb_near(bigint, integer)"))
    _run(f"DROP FUNCTION {schema}.simdb_neighbours(text)")  # it returns a view's rows
    for view in ("near_duplicate_pairs", "document_neighbours", "cluster_members"):  # their similarity's type
        _run(f"DROP VIEW {schema}.{view}")
    _run(f"DROP FUNCTION {schema}.simdb_near({sketch_type}, integer)")
    _run(f"DROP FUNCTION {schema}.simdb_similar({sketch_type}, real)")
    _run(f"DROP FUNCTION {schema}.simdb_check_distance(integer)")
    _run(f"DROP FUNCTION {schema}.simdb_check_similarity(real)")
    if minhash:
        _run(f"DROP FUNCTION {schema}.simdb_similarity(bytea, bytea)")  # real, now double precision
    parallel_safe = not _distributed(schema)
    for signature, statement, comment in functions:
        _run(_as_plpgsql(statement, parallel_safe))
        if comment:
            _run(f"COMMENT ON FUNCTION {schema}.{signature} IS {_literal(comment)}")
    for statement in _views(schema, rows, distributed=not parallel_safe):
        _run(statement)
    for view, comment in VIEW_COMMENTS.items():
        _run(f"COMMENT ON VIEW {schema}.{view} IS {_literal(comment)}")
    _run(_as_plpgsql(NEIGHBOURS.format(schema=schema), parallel_safe))
    _run(f"COMMENT ON FUNCTION {schema}.simdb_neighbours(text) IS "
         + _literal("The near-duplicates of one document (by its external id), earlier and later, with both batches."))


def downgrade() -> None:
    schema = context.config.attributes["schema"]
    connection = op.get_bind()
    rows = dict(connection.execute(sa.text("SELECT name, value FROM settings")).all())
    minhash = rows.get("method") == "minhash"
    sketch_type = "bytea" if minhash else "bigint"
    definition = _definition(schema, f"simdb_lookup({sketch_type}, integer)")
    match = re.search(r"FROM \(\n(?P<lookups>.*?)\n\s*\) c\s+(?:WHERE|CROSS JOIN)", definition, re.S)
    if match is None:
        raise RuntimeError("migration 0012 cannot find the lookups in simdb_lookup, so the downgrade is rolled back; "
                           f"report it with the definition:\n{definition}")
    lookups = match["lookups"]
    if minhash:
        functions = _old_minhash(schema, rows, lookups.replace("simdb_lookup.signature", "simdb_similar.signature"))
    else:
        functions = _old_simhash(schema, rows, lookups)
    _run(f"DROP FUNCTION {schema}.simdb_neighbours(text)")
    for view in ("near_duplicate_pairs", "document_neighbours", "cluster_members"):
        _run(f"DROP VIEW {schema}.{view}")
    for name, _, types, _ in (SIMHASH_FUNCTIONS if minhash else MINHASH_FUNCTIONS):  # the stubs
        _run(f"DROP FUNCTION {schema}.{name}({types})")
    _run(f"DROP FUNCTION {schema}.simdb_near({sketch_type}, integer)")
    _run(f"DROP FUNCTION {schema}.simdb_similar({sketch_type}, double precision)")
    _run(f"DROP FUNCTION {schema}.simdb_lookup({sketch_type}, integer)")
    if minhash:
        _run(f"DROP FUNCTION {schema}.simdb_similarity(bytea, bytea)")
    parallel_safe = not _distributed(schema)
    for signature, statement, comment in functions:
        _run(_as_plpgsql(statement, parallel_safe))
        if comment:
            _run(f"COMMENT ON FUNCTION {schema}.{signature} IS {_literal(comment)}")
    for statement in _old_views(schema, rows):
        _run(statement)
    for view, comment in {**VIEW_COMMENTS, "near_duplicate_pairs": OLD_PAIRS_COMMENT}.items():
        _run(f"COMMENT ON VIEW {schema}.{view} IS {_literal(comment)}")
    _run(_as_plpgsql(NEIGHBOURS.format(schema=schema), parallel_safe))
    _run(f"COMMENT ON FUNCTION {schema}.simdb_neighbours(text) IS "
         + _literal("The near-duplicates of one document (by its external id), earlier and later, with both batches."))


OLD_PAIRS_COMMENT = ("Every near-duplicate pair found at ingest (a stored first), with both documents' "
                     "metadata and, where the index keeps them, texts. distance: differing bits "
                     "(SimHash), signature positions (MinHash) or ten-thousandths of Jaccard distance "
                     "(MinHash deciding exactly); similarity: 1 - distance / 64 (SimHash), the Jaccard "
                     "estimate or the exact Jaccard (MinHash).")


def _old_views(schema: str, rows: dict) -> list[str]:
    """Revision 0011's views that 0012 replaced (similarity real)."""
    if rows.get("method") == "minhash":
        settings = rows["minhash"]
        scale = EXACT_SCALE if settings.get("verify") == "exact" else settings["num_perm"]
        similarity = f"(1 - p.distance::real / {scale})"
        to_canonical = f"{schema}.simdb_similarity(d.signature, c.signature)"
    else:
        bits = int(rows.get("bits", 64))
        similarity = f"(1 - p.distance::real / {bits})::real"
        to_canonical = f"(1 - bit_count((d.simhash # c.simhash)::bit(64))::real / {bits})::real"
    views = _views(schema, rows)
    pairs = views[0].replace(" ab.name AS a_batch, bt.name AS b_batch,\n               p.found_at,",
                             "\n               p.found_at,")
    pairs = pairs.replace(f"\n        JOIN {schema}.batches ab ON ab.id = a.batch_id", "")
    return [_resimilar(view, schema, rows, similarity, to_canonical) for view in (pairs, views[1], views[2])]


def _resimilar(view: str, schema: str, rows: dict, similarity: str, to_canonical: str) -> str:
    """A view of :func:`_views` with 0011's similarity expressions."""
    if rows.get("method") == "minhash":
        scale = EXACT_SCALE if rows["minhash"].get("verify") == "exact" else rows["minhash"]["num_perm"]
    else:
        scale = int(rows.get("bits", 64))
        view = view.replace(similarity_sql("bit_count((d.simhash # c.simhash)::bit(64))", scale), to_canonical)
    return view.replace(similarity_sql("p.distance", scale), similarity)


def _old_minhash(schema: str, rows: dict, lookups: str) -> list[tuple[str, str, str]]:
    """Revision 0011's MinHash functions that 0012 replaced."""
    settings = rows["minhash"]
    exact = settings.get("verify") == "exact"
    threshold, k, n = settings["threshold"], int(rows["max_distance"]), settings["num_perm"]
    positions = f"round((1 - s.similarity) * {n})::integer"  # the positions in which the signatures differ
    distance = f"(({positions} * {EXACT_SCALE} + {n - 1}) / {n})" if exact else positions
    unit = "ten-thousandths of Jaccard distance (estimated)" if exact else "signature positions"
    return [
        ("simdb_similarity(bytea, bytea)",
         f"""CREATE OR REPLACE FUNCTION {schema}.simdb_similarity(a bytea, b bytea) RETURNS real
            LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
            SELECT count(*) FILTER (WHERE substr(a, 4 * i + 1, 4) = substr(b, 4 * i + 1, 4))::real
                   / (length(a) / 4)
            FROM generate_series(0, length(a) / 4 - 1) AS i
            $$""",
         "Estimated Jaccard similarity of two MinHash signatures: the share of positions where they agree."),
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
        _old_check_distance(schema, k),
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


def _old_simhash(schema: str, rows: dict, lookups: str) -> list[tuple[str, str, str]]:
    """Revision 0011's SimHash functions that 0012 replaced."""
    k = int(rows["max_distance"])
    return [
        _old_check_distance(schema, k),
        ("simdb_near(bigint, integer)",
         f"""CREATE OR REPLACE FUNCTION {schema}.simdb_near(fingerprint bigint, max_distance integer DEFAULT {k})
            RETURNS TABLE (document_id bigint, distance integer)
            LANGUAGE sql STABLE PARALLEL SAFE AS $$
            SELECT c.id, bit_count((c.simhash # fingerprint)::bit(64))::integer
            FROM (
{lookups}
            ) c
            WHERE {schema}.simdb_check_distance(max_distance)
              AND bit_count((c.simhash # fingerprint)::bit(64)) <= max_distance
            $$""",
         f"Documents within max_distance (default and at most {k}) bits of a fingerprint, found through the "
         "block-key indexes."),
        ("simdb_check_similarity(real)",
         f"""CREATE OR REPLACE FUNCTION {schema}.simdb_check_similarity(min_similarity real) RETURNS boolean
            LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
            BEGIN
                IF min_similarity IS NULL OR min_similarity < {1 - k / 64} OR min_similarity > 1 THEN
                    RAISE EXCEPTION 'simdb_similar: min_similarity must be between {1 - k / 64} (1 - {k} / 64, the '
                                    'index''s maximum distance) and 1, not %', min_similarity
                                    USING ERRCODE = 'invalid_parameter_value';
                END IF;
                RETURN true;
            END $$""",
         ""),
        ("simdb_similar(bigint, real)",
         f"""CREATE OR REPLACE FUNCTION {schema}.simdb_similar(fingerprint bigint, min_similarity real DEFAULT {1 - k / 64})
            RETURNS TABLE (document_id bigint, similarity real)
            LANGUAGE sql STABLE PARALLEL SAFE AS $$
            SELECT n.document_id, (1 - n.distance::real / 64)::real
            FROM {schema}.simdb_near(fingerprint, {k}) n
            WHERE {schema}.simdb_check_similarity(min_similarity) AND 1 - n.distance::real / 64 >= min_similarity
            $$""",
         f"Documents whose similarity (1 - differing bits / 64) to a fingerprint is at least min_similarity (default "
         f"and at least {1 - k / 64}), found through the block-key indexes: simdb_near in the vocabulary of "
         "similarity that MinHash indexes share."),
    ]


def _old_check_distance(schema: str, max_distance: int) -> tuple[str, str, str]:
    """``simdb_check_distance(integer)``, which ``simdb_near`` calls to refuse a distance outside the index's:
    the same text for every method (as migration 0003 first wrote it)."""
    k = max_distance
    return ("simdb_check_distance(integer)",
            f"""CREATE OR REPLACE FUNCTION {schema}.simdb_check_distance(max_distance integer) RETURNS boolean
            LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
            BEGIN
                IF max_distance IS NULL OR max_distance < 0 OR max_distance > {k} THEN
                    RAISE EXCEPTION 'simdb_near: max_distance must be between 0 and {k} (the index''s maximum '
                                    'distance), not %', max_distance USING ERRCODE = 'invalid_parameter_value';
                END IF;
                RETURN true;
            END $$""",
            "")
