"""``simdb_neighbours`` on a distributed index: one routed statement a step instead of a repartition join; the exact
MinHash lookup reads a stored document's pairs in one statement.

On Citus, ``simdb_neighbours(external_id)`` read the ``document_neighbours`` view, which joins each pair with
both its documents; ``documents`` is distributed by ``id`` and a pair lives on its later document's shard, so
Citus planned every call as a repartition join (0.5-5 s a call on a test cluster of 4 shards, whatever the
index's size; and it failed unless the session had ``citus.multi_shard_modify_mode = sequential``). On a
distributed index it now runs a statement a step, each sent to the shards it reads: the document by its
external id, its pairs from both sides, its neighbours by id; the rows are matched on the coordinator. The
answers are the same rows. On one server nothing changes (it reads the view, through the indexes).

On a MinHash index deciding exactly, ``simdb_lookup`` answers a stored document's signature with its stored
pairs: a ``UNION ALL`` of the two sides, which Citus ran as two subplans whose results it gathered; it reads
them in one statement now, by either side (on every index of that kind, one server's too: the same rows).

This migration carries its own SQL and imports nothing from simdb. The coordinator renumbers it at merge:
written after 0018 (0019 and 0020 are taken by other branches).

Revision ID: 0021
Revises: 0020
Create Date: 2026-11-27
"""
import sqlalchemy as sa
from alembic import context, op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

EXACT_SCALE = 10000

ROUTED = """CREATE OR REPLACE FUNCTION {schema}.simdb_neighbours(external_id text)
            RETURNS SETOF {schema}.document_neighbours
            LANGUAGE plpgsql STABLE AS $$
            DECLARE
                me record;
                pair record;
                neighbour record;
                found {schema}.document_neighbours;
                pair_neighbours bigint[];
                pair_distances smallint[];
                pair_found timestamptz[];
                i integer;
            BEGIN
                -- one statement a step, each sent to the shards it reads, rows and no aggregate back: no repartition
                -- join (0021). A document's pairs and its neighbours come in the order of the neighbours' ids, and
                -- are matched walking both (every neighbour is one of the pairs').
                FOR me IN SELECT d.id, d.external_id, b.name AS batch
                          FROM {schema}.documents d JOIN {schema}.batches b ON b.id = d.batch_id
                          WHERE d.external_id = simdb_neighbours.external_id LOOP
                    pair_neighbours := '{{}}'; pair_distances := '{{}}'; pair_found := '{{}}';
                    FOR pair IN SELECT CASE WHEN p.b_id = me.id THEN p.a_id ELSE p.b_id END AS neighbour,
                                       p.distance, p.found_at
                                FROM {schema}.near_duplicates p WHERE p.b_id = me.id OR p.a_id = me.id
                                ORDER BY 1 LOOP
                        pair_neighbours := pair_neighbours || pair.neighbour;
                        pair_distances := pair_distances || pair.distance;
                        pair_found := pair_found || pair.found_at;
                    END LOOP;
                    CONTINUE WHEN cardinality(pair_neighbours) = 0;
                    i := 1;
                    FOR neighbour IN SELECT o.id, o.external_id, ob.name AS batch
                                     FROM {schema}.documents o JOIN {schema}.batches ob ON ob.id = o.batch_id
                                     WHERE o.id = ANY(pair_neighbours) ORDER BY o.id LOOP
                        WHILE pair_neighbours[i] < neighbour.id LOOP
                            i := i + 1;
                        END LOOP;
                        found.document_id := me.id;
                        found.external_id := me.external_id;
                        found.batch := me.batch;
                        found.neighbour_id := neighbour.id;
                        found.neighbour_external_id := neighbour.external_id;
                        found.neighbour_batch := neighbour.batch;
                        found.neighbour_is_earlier := neighbour.id < me.id;
                        found.distance := pair_distances[i];
                        found.similarity := {similarity};
                        found.found_at := pair_found[i];
                        RETURN NEXT found;
                    END LOOP;
                END LOOP;
            END $$"""

#: What 0012 made on a distributed index (``LANGUAGE sql`` rewritten in PL/pgSQL, not parallel safe).
VIEW_READER = """CREATE OR REPLACE FUNCTION {schema}.simdb_neighbours(external_id text)
            RETURNS SETOF {schema}.document_neighbours
            LANGUAGE plpgsql STABLE AS $$
#variable_conflict use_column
BEGIN
RETURN QUERY SELECT * FROM {schema}.document_neighbours n WHERE n.external_id = simdb_neighbours.external_id;
END $$"""


PAIRS_BEFORE = """                RETURN QUERY SELECT stored_id, 0
                UNION ALL SELECT p.b_id, p.distance::integer FROM {schema}.near_duplicates p
                          WHERE p.a_id = stored_id AND p.distance <= max_distance
                UNION ALL SELECT p.a_id, p.distance::integer FROM {schema}.near_duplicates p
                          WHERE p.b_id = stored_id AND p.distance <= max_distance;"""
PAIRS_NOW = """                RETURN QUERY SELECT stored_id, 0;
                RETURN QUERY SELECT CASE WHEN p.a_id = stored_id THEN p.b_id ELSE p.a_id END, p.distance::integer
                FROM {schema}.near_duplicates p
                WHERE (p.a_id = stored_id OR p.b_id = stored_id) AND p.distance <= max_distance;"""


def _rewrite_exact_lookup(schema: str, before: str, now: str) -> None:
    """On a MinHash index deciding exactly, ``simdb_lookup``'s read of a stored document's pairs, ``before`` ->
    ``now``, the rest of the function (its band lookups) kept as the index has it."""
    connection = op.get_bind()
    rows = dict(connection.execute(sa.text("SELECT name, value FROM settings")).all())
    if rows.get("method") != "minhash" or rows["minhash"].get("verify") != "exact":
        return
    definition = connection.execute(sa.text("SELECT pg_get_functiondef(CAST(:f AS regprocedure))"),
                                    {"f": f"{schema}.simdb_lookup(bytea, integer)"}).scalar_one()
    before, now = before.format(schema=schema), now.format(schema=schema)
    if definition.count(before) != 1:  # stop before changing anything
        raise RuntimeError(f"migration 0021 cannot find the read of a stored document's pairs in simdb_lookup, so "
                           f"the migration is rolled back and the index left as it was; report it with the "
                           f"definition:\n{definition}")
    _run(definition.replace(before, now))


def _distributed(schema: str) -> bool:
    connection = op.get_bind()
    if connection.execute(sa.text("SELECT to_regclass('pg_catalog.pg_dist_partition')")).scalar_one() is None:
        return False
    return connection.execute(sa.text(
        "SELECT count(*) FROM pg_dist_partition WHERE logicalrelid = CAST(:t AS regclass)"),
        {"t": f"{schema}.documents"}).scalar_one() > 0


def _scale() -> int:
    """The distance's scale, as 0012 reads it: 64 bits (or ``bits``), ``num_perm``, or 10,000 deciding exactly."""
    rows = dict(op.get_bind().execute(sa.text("SELECT name, value FROM settings")).all())
    if rows.get("method") == "minhash":
        return EXACT_SCALE if rows["minhash"].get("verify") == "exact" else rows["minhash"]["num_perm"]
    return int(rows.get("bits", 64))


def _run(statement: str) -> None:
    op.get_bind().connection.dbapi_connection.execute(statement)  # DDL as written: '%' is no placeholder


def upgrade() -> None:
    schema = context.config.attributes["schema"]
    if _distributed(schema):  # on one server the function reads the view through the indexes, as it did
        scale = _scale()
        _run(ROUTED.format(schema=schema, similarity=f"(({scale} - pair_distances[i])::double precision / {scale})"))
    _rewrite_exact_lookup(schema, PAIRS_BEFORE, PAIRS_NOW)


def downgrade() -> None:
    schema = context.config.attributes["schema"]
    if _distributed(schema):
        _run(VIEW_READER.format(schema=schema))
    _rewrite_exact_lookup(schema, PAIRS_NOW, PAIRS_BEFORE)
