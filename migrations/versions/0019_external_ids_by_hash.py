"""The keyed distributed layout keeps its documents' external ids in a table distributed by them: ``external_ids``.

A chunk of an ingest checks that its external ids are not stored yet. On a distributed index that was a join
of the chunk's staging table with ``documents`` on ``external_id``, which is not ``documents``' distribution
column: Citus sent the chunk's ids to every worker (about 62 bytes a document per worker), the keyed layout's
one cost that grew with the cluster. An index with the keyed layout (the ``distributed`` settings row names
``"layout": "keyed"``) now has ``external_ids (external_id, id)``, hash-distributed by the external id with a
unique covering index, and ``external_id_probes (external_id, probe)`` co-located beside it for a chunk's ids:
the check is a co-located join, each id sent once, to the shard of its hash.

Filled here from ``documents``, where the keyed layout's ``keys`` table is there: a schema the migrations make
before it is distributed gets these tables with the others when it is. Every other index (one server, or the layout by id) is left as it was: for
them this revision changes nothing.

This migration carries its own SQL and imports nothing from simdb.

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-27
"""
import json

import sqlalchemy as sa
from alembic import context, op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def _keyed_shards(connection) -> int | None:
    """The shard count of a keyed distributed index, else None."""
    value = connection.execute(sa.text("SELECT value FROM settings WHERE name = 'distributed'")).scalar()
    if value is None:
        return None
    distributed = value if isinstance(value, dict) else json.loads(value)
    if distributed.get("layout") != "keyed":
        return None
    return int(distributed["shards"])


def upgrade() -> None:
    schema = context.config.attributes["schema"]
    connection = op.get_bind()
    shards = _keyed_shards(connection)
    made = connection.execute(sa.text("SELECT to_regclass('keys') IS NOT NULL AND to_regclass('external_ids') IS NULL")
                              ).scalar()
    if shards is None or not made:  # not keyed, not distributed yet (its tables come with it), or done
        return
    run = connection.exec_driver_sql
    run("CREATE TABLE external_ids (external_id text NOT NULL, id bigint NOT NULL)")
    run("CREATE UNIQUE INDEX external_ids_external_id ON external_ids (external_id) INCLUDE (id)")
    run("CREATE TABLE external_id_probes (external_id text NOT NULL, probe bigint NOT NULL)")
    connection.execute(sa.text("SELECT create_distributed_table(CAST(:t AS regclass), 'external_id', "
                               "shard_count => :n, colocate_with => 'none')"),
                       {"t": f"{schema}.external_ids", "n": shards})
    connection.execute(sa.text("SELECT create_distributed_table(CAST(:t AS regclass), 'external_id', "
                               "colocate_with => :w)"),
                       {"t": f"{schema}.external_id_probes", "w": f"{schema}.external_ids"})
    run("COMMENT ON TABLE external_ids IS 'Every stored document''s external id, distributed by it: a chunk''s "
        "check of its ids is routed (0019).'")
    run("COMMENT ON TABLE external_id_probes IS 'An ingest chunk''s external ids (or a removal''s), co-located "
        "with external_ids; emptied inside its transaction.'")
    run("INSERT INTO external_ids (external_id, id) SELECT external_id, id FROM documents")
    run("ANALYZE external_ids")  # the next chunks' checks are planned on its statistics


def downgrade() -> None:
    run = op.get_bind().exec_driver_sql
    run("DROP TABLE IF EXISTS external_id_probes")
    run("DROP TABLE IF EXISTS external_ids")
