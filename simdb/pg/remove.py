"""Removing documents (by id, by batch, or by ingest time) in one transaction.

Documents whose ``duplicate_of`` pointed at a removed document are pointed at
their earliest remaining near-duplicate that was stored before them, read
from the stored pairs; where none is left, they become originals. Pairs of
removed documents go with them, and the clusters they belonged to are
recomputed (a removal can split a cluster), and the counts by metadata fields lose the removed documents and
the duplicates left without one (:mod:`simdb.pg.field_counts`); a removed batch's ``records`` (its verdicts) go with its row,
deleted here, since no foreign key cascades into them (migration 0016). The ingest lock is held, so no concurrent ingest matches against
documents that are going away.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa

from ..errors import NotFound, SimdbError
from ..methods import Method
from . import keyed as keyed_layout
from .catalog import check_layout
from .clusters import recluster, refresh_clusters
from .copy import copy_in
from .database import lock
from .field_counts import uncount_removal
from .methods import sql_of


@dataclass(frozen=True)
class RemovalSummary:
    removed: int
    repointed: int
    now_original: int
    batch_removed: str | None = None
    dry_run: bool = False

    def __str__(self) -> str:
        if self.dry_run:
            text = (f"would remove {self.removed:,} documents; {self.repointed:,} that point at them would point at "
                    f"their earliest remaining near-duplicate, {self.now_original:,} would have none left")
            return text + (f"; batch {self.batch_removed!r} would be removed" if self.batch_removed else "")
        text = (f"removed {self.removed:,} documents; {self.repointed:,} that pointed at them now point at their "
                f"earliest remaining near-duplicate, {self.now_original:,} have none left")
        return text + (f"; batch {self.batch_removed!r} removed" if self.batch_removed else "")


def remove(connection: sa.Connection, schema: str, method: Method, *, external_ids: list[str] | None = None,
           batch: str | None = None, before: datetime | None = None, keyed: bool) -> RemovalSummary:
    """Remove the documents selected by exactly one of ``external_ids``, ``batch`` or ``before``."""
    if sum(x is not None for x in (external_ids, batch, before)) != 1:
        raise SimdbError("say what to remove with exactly one of «ids», «batch» or «before»")
    lock(connection, schema, "ingest")
    check_layout(connection, method, keyed_layout=keyed)
    connection.exec_driver_sql("CREATE TEMPORARY TABLE removing (id int8 PRIMARY KEY) ON COMMIT DROP")
    batch_id = None
    if external_ids is not None:
        # the ids go to a table, never into the statement as an array: an array of a million ids is copied
        # into every segment's scan, and a removal that large took a 17 GB backend down with it
        unique_ids = sorted(set(external_ids))
        if keyed:  # found through external_ids, each id sent to the one shard of its hash (not to every worker)
            found = keyed_layout.stored_documents(connection, unique_ids)
            copy_in(connection, "removing (id)", ["int8"], ((document,) for _, document in found))
            missing = sorted(set(unique_ids) - {external_id for external_id, _ in found})[:11]
        else:
            copy_in(connection, "removing_ids (external_id)", ["text"], ((i,) for i in unique_ids), create=True)
            connection.exec_driver_sql("ANALYZE removing_ids")
            stored = connection.exec_driver_sql("INSERT INTO removing SELECT d.id FROM documents d "
                                                "JOIN removing_ids i USING (external_id)").rowcount
            missing = [] if stored == len(unique_ids) else connection.exec_driver_sql(
                "WITH found AS (SELECT d.external_id FROM documents d JOIN removing_ids i USING (external_id)) "
                "SELECT i.external_id FROM removing_ids i WHERE NOT EXISTS "
                "(SELECT 1 FROM found f WHERE f.external_id = i.external_id) ORDER BY 1 LIMIT 11").scalars().all()
        if missing:
            raise NotFound(f"no stored document has the id(s) {', '.join(map(repr, missing[:10]))}"
                           f"{' ...' if len(missing) > 10 else ''}; nothing was removed")
    elif batch is not None:
        batch_id = connection.execute(sa.text("SELECT id FROM batches WHERE name = :name"), {"name": batch}).scalar()
        if batch_id is None:
            raise NotFound(f"no batch named {batch!r}; `simdb stats` lists the batches")
        connection.execute(sa.text("INSERT INTO removing SELECT id FROM documents WHERE batch_id = :b"), {"b": batch_id})
    else:
        connection.execute(sa.text("INSERT INTO removing SELECT id FROM documents WHERE created_at < :before"),
                           {"before": before})
    connection.exec_driver_sql("ANALYZE removing")

    # documents that stay but pointed at a removed one: their earliest remaining earlier near-duplicate,
    # from the stored pairs (every pair within k was stored when its later document was ingested)
    # (first the documents that point at a removed one, through the duplicate_of index: in one
    # statement the planner ran the LATERAL for every document of the archive before filtering)
    # (each step joins the archive only with one temporary table, and nothing else: on a distributed index
    # Citus ships that table to the workers, and refuses a temporary table anywhere else in the statement)
    connection.exec_driver_sql(
        "CREATE TEMPORARY TABLE repointing ON COMMIT DROP AS SELECT d.id FROM documents d "
        "JOIN removing r ON d.duplicate_of = r.id")
    connection.exec_driver_sql("DELETE FROM repointing a USING removing x WHERE x.id = a.id")
    connection.exec_driver_sql("ANALYZE repointing")
    connection.exec_driver_sql(  # their remaining earlier near-duplicates, the earliest kept
        "CREATE TEMPORARY TABLE repointing_pairs ON COMMIT DROP AS SELECT p.b_id AS id, p.a_id, p.distance "
        "FROM near_duplicates p JOIN repointing a ON p.b_id = a.id")
    connection.exec_driver_sql("DELETE FROM repointing_pairs p USING removing x WHERE x.id = p.a_id")
    connection.exec_driver_sql(
        "CREATE TEMPORARY TABLE repointed ON COMMIT DROP AS SELECT a.id, first.a_id, first.distance "
        "FROM repointing a LEFT JOIN (SELECT DISTINCT ON (id) id, a_id, distance FROM repointing_pairs "
        "ORDER BY id, a_id) first USING (id)")
    affected = connection.execute(sa.text(
        "UPDATE documents d SET duplicate_of = r.a_id, duplicate_distance = r.distance FROM repointed r "
        "WHERE d.id = r.id RETURNING d.duplicate_of")).scalars().all()
    repointed = sum(1 for duplicate_of in affected if duplicate_of is not None)
    connection.exec_driver_sql(  # the clusters that lose documents: only they can split
        "CREATE TEMPORARY TABLE reclustering ON COMMIT DROP AS SELECT DISTINCT cluster_id FROM documents "
        "WHERE id IN (SELECT id FROM removing)")
    removed_per_batch = connection.exec_driver_sql(
        "SELECT d.batch_id, count(*) FROM documents d JOIN removing r ON r.id = d.id GROUP BY d.batch_id").all()
    uncount_removal(connection, "removing", "repointed")  # the counts by metadata fields, before the rows go
    if keyed:  # and their key rows, which the keyed layout's probes read: routed by the keys of their sketches
        gone = connection.exec_driver_sql(f"DELETE FROM documents WHERE id IN (SELECT id FROM removing) RETURNING "
                                          f"id, {sql_of(method).sketch_column[0]}, external_id").all()
        removed = len(gone)
        keyed_layout.remove(connection, method, [row[0] for row in gone], [row[1] for row in gone])
        keyed_layout.remove_external_ids(connection, [row[0] for row in gone], [row[2] for row in gone])
    else:
        removed = connection.execute(sa.text("DELETE FROM documents WHERE id IN (SELECT id FROM removing)")).rowcount
    for removed_batch, count in removed_per_batch:  # what each batch holds: documents - removed
        if removed_batch != batch_id:  # (nothing to keep for a batch removed whole: its row goes)
            connection.execute(sa.text("UPDATE batches SET removed = removed + :count WHERE id = :id"),
                               {"count": count, "id": removed_batch})
    # their pairs go with them (no foreign key cascades into segments); both sides through their indexes
    connection.exec_driver_sql("DELETE FROM near_duplicates WHERE a_id IN (SELECT id FROM removing)")
    connection.exec_driver_sql("DELETE FROM near_duplicates WHERE b_id IN (SELECT id FROM removing)")
    recluster(connection, "reclustering")  # a removal can split clusters; only those that lost documents are redone
    refresh_clusters(connection, "reclustering", method, schema)
    if batch_id is not None:  # its verdicts with it: no foreign key cascades from batches (migration 0016)
        connection.execute(sa.text("DELETE FROM records WHERE batch_id = :b"), {"b": batch_id})
        connection.execute(sa.text("DELETE FROM batches WHERE id = :b"), {"b": batch_id})
    return RemovalSummary(removed=removed, repointed=repointed, now_original=len(affected) - repointed,
                          batch_removed=batch)
