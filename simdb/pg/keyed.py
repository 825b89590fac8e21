"""The keyed distributed layout (a new SimHash index's with ``simdb init --distributed``): each probe goes to one shard.

The layout by id (:mod:`simdb.pg.citus`) shards ``documents`` by ``id``, so that a document's
15 keys can sit on any shard and every probe is sent to every shard. This layout adds Manku's permuted tables
as one Citus table distributed by the key value:

- ``keys_<n> (key, id, fingerprint)``: one row per (document, key number), hash-distributed by ``key``, with a
  covering B-tree ``(key) INCLUDE (id, fingerprint)``; named after the layout's first key column ``key_<n>``
  (:func:`table`), as the key columns are numbered afresh by each relayout, so that a process that opened the
  index before a relayout probes a table that is gone (and says so, :func:`simdb.pg.catalog.relaid_out`)
  instead of the new layout's table with the old layout's keys. ``key`` folds the key number into the key value
  (:func:`fold`: ``value << 6 | key_no``), so that one ``key = ANY(...)`` finds a probe's matches on every key
  column at once and Citus prunes it to the shards that hold those values: a lookup is at most as many
  shard tasks as there are key columns, whatever the shard count.
- ``key_probes (key, probe, fingerprint)``: a chunk's probes, co-located with ``keys``, so that the chunk's
  candidate join is a co-located join, one task per shard, nothing broadcast. A chunk writes its probes
  there by one COPY (each new document's key rows go to one shard each), joins them, moves them into ``keys``
  by a co-located ``INSERT ... SELECT`` and deletes them, all in its own transaction (under the ingest lock),
  so no other transaction ever sees them.

Everything else is as in the layout by id (``documents`` and its segments by ``id``, pairs, clusters and
records), except that ``documents`` has no key columns nor key indexes (:func:`document_key_columns`,
migration 0022): every probe (ingest, check, lookups, queries, the analysts' ``simdb_lookup``, ``stats``' key
buckets, the report's sample) reads ``keys``, and ``keys`` is built from the fingerprints (:func:`build`). Candidates are verified
by the fingerprint stored with each key row, on the shard, and again in numpy. A fold that loses a wide key's
top bits only adds candidates, which the distance check drops: the answers are exact.

- ``external_ids (external_id, id)``: every stored document's external id, hash-distributed by the external
  id, with a unique covering B-tree ``(external_id) INCLUDE (id)``; ``external_id_probes (external_id, probe)``
  beside it (co-located) holds a chunk's ids while it checks which are stored already: a co-located join, each
  id sent once, to the shard of its hash (joined with ``documents`` by external id, the chunk's ids went to
  every worker: about 62 bytes a document per worker). Kept in step with ``documents`` by every ingest chunk
  (:func:`store_staged`), removal (:func:`remove_external_ids`), and by :func:`build` (``init --copy-from``,
  the move to this layout); migration 0019 made it for the keyed indexes before it.

A removal deletes its documents' key rows by their keys, one statement routed to each shard that holds some
(:func:`remove`). An index with the layout by id moves to this one by ``simdb relayout --distributed-layout
keyed`` (:func:`simdb.pg.catalog.move_to_keyed`: :func:`create`, then :func:`build`, in one transaction).

SimHash only for now (MinHash's band rows would need their signatures verified from ``documents``: a
second, id-routed step). ``simdb relayout --blocks`` builds the new layout's keys table in its switch and drops
the old one (:func:`rebuild`). Below, ``keys`` names the keys table of the index's layout.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence

import numpy as np
import psycopg
import sqlalchemy as sa
from psycopg.rows import namedtuple_row

from ..bits import hamming_array, to_unsigned_array
from ..errors import IncompatibleIndex, SimdbError
from ..methods import Method
from . import spread
from .copy import copy_in, copy_in_columns, int8_array
from .methods import sql_of
from .methods.simhash import verified_pairs

#: The distributed layouts: by document id (:mod:`simdb.pg.citus`; MinHash's only one, and that of indexes made before
#: layouts were stored), or routed by key (this module; a new SimHash index's default, :func:`default_layout`).
BY_ID, KEYED = "id", "keyed"
LAYOUTS = (BY_ID, KEYED)
#: Low bits of a stored key that hold its key number (a layout has at most 64 keys).
KEY_NUMBER_BITS = 6

PROBES = "key_probes"
#: The tables of the external ids, distributed by external id (their own co-location group).
ID_TABLES = ("external_ids", "external_id_probes")
#: Which of a chunk's staged ids are stored already, and as which document: a co-located join, one task per
#: shard pair, each id on the one shard of its hash (``tests/test_keyed.py`` holds its plan to that).
STORED_IDS_SQL = ("SELECT p.probe, e.id FROM external_id_probes p JOIN external_ids e "
                  "ON e.external_id = p.external_id")


def table(method: Method) -> str:
    """The keys table of ``method``'s key layout: ``keys_<n>``, after its first key column ``key_<n>``. Every
    statement and test names it through this function."""
    return "keys_" + method.key_columns[0].removeprefix("key_")


def lookup_sql(method: Method) -> str:
    """A routed probe of ``keys``: the stored rows of the given (folded) keys, on the shards that hold them (in
    the driver's parameter style: it is prepared on the driver's connection, see :func:`lookup`)."""
    return f"SELECT key, id, fingerprint FROM {table(method)} WHERE key = ANY(CAST(%(keys)s AS bigint[]))"


def layout_of(distributed: dict | None) -> str | None:
    """The distributed layout a ``distributed`` settings row names (None: the index is on one server)."""
    if distributed is None:
        return None
    layout = distributed.get("layout", BY_ID)
    if layout not in LAYOUTS:
        raise IncompatibleIndex(f"the index's distributed layout is {layout!r}, which this simdb does not know "
                                f"(it knows {', '.join(LAYOUTS)}); upgrade simdb to open it")
    return layout


def default_layout(method: Method) -> str:
    """The layout of a new distributed index that names none: keyed where ``method`` can have it (SimHash), else
    the layout by id (MinHash's only one)."""
    return KEYED if sql_of(method).verified_beside_keys else BY_ID


def check_layout(layout: str, method: Method) -> str:
    """``layout`` if a new distributed index of ``method`` can have it, else a clear error."""
    if layout not in LAYOUTS:
        raise SimdbError(f"the distributed layout must be one of {', '.join(LAYOUTS)}, not {layout!r}")
    if layout == KEYED and not sql_of(method).verified_beside_keys:
        raise SimdbError(f"the keyed distributed layout holds SimHash indexes only, not {method.title}; "
                         "leave out «distributed_layout» (the layout by document id) for this method")
    return layout


def document_key_columns(method: Method, keyed: bool) -> list[str]:
    """The key columns ``documents`` (and an ingest's staging table) has: none on the keyed layout, whose keys
    table answers every probe (they were about 1,250 of 3,250 bytes a document there, read by nothing), else
    ``method``'s."""
    return [] if keyed else list(method.key_columns)


def folded_keys_sql(method: Method, sketch: str) -> list[str]:
    """SQL computing each stored (folded, :func:`fold`) key of the sketch expression ``sketch``: PostgreSQL's
    ``<<`` on bigint wraps in 64 bits, as :func:`fold` does."""
    return [f"((({expression}) << {KEY_NUMBER_BITS}) | {number})"
            for number, expression in enumerate(sql_of(method).key_sql(sketch))]


def function_keys(method: Method) -> tuple[str, list[str]]:
    """What the analysts' lookup function of a keyed index reads (:meth:`simdb.pg.methods.MethodSQL.functions`):
    the keys table, and the SQL of the stored keys of its argument ``fingerprint`` (named in full: the keys
    table has a column of that name)."""
    return table(method), folded_keys_sql(method, "simdb_lookup.fingerprint")


def fold(keys: np.ndarray) -> np.ndarray:
    """Stored key values of an (n, key columns) array of key values: ``value << 6 | key number``, wrapping in
    64 bits as BIGINT does; row-major, so row ``i``'s keys are ``[i * columns, (i + 1) * columns)``."""
    keys = np.asarray(keys, dtype=np.int64)
    numbers = np.arange(keys.shape[1], dtype=np.int64)
    return ((keys << np.int64(KEY_NUMBER_BITS)) | numbers).reshape(-1)


# -- creating and checking -------------------------------------------------------------------------------

def create(connection: sa.Connection, schema: str, shards: int, method: Method) -> None:
    """The keyed layout's tables of a new distributed index of ``method``, distributed by key (see the module's
    docstring)."""
    keys = table(method)
    _create_keys(connection, keys)
    connection.exec_driver_sql("CREATE INDEX {0}_key ON {0} (key) INCLUDE (id, fingerprint)".format(keys))
    connection.exec_driver_sql(f"CREATE TABLE {PROBES} (key bigint NOT NULL, probe bigint NOT NULL, "
                               "fingerprint bigint NOT NULL)")
    connection.execute(sa.text("SELECT create_distributed_table(CAST(:t AS regclass), 'key', shard_count => :n, "
                               "colocate_with => 'none')"), {"t": f"{schema}.{keys}", "n": shards})
    connection.execute(sa.text("SELECT create_distributed_table(CAST(:t AS regclass), 'key', colocate_with => :w)"),
                       {"t": f"{schema}.{PROBES}", "w": f"{schema}.{keys}"})
    _comment_keys(connection, keys)
    connection.exec_driver_sql(f"COMMENT ON TABLE {PROBES} IS 'An ingest chunk''s probes, co-located with keys; "
                               "written and emptied inside the chunk''s transaction.'")
    create_external_ids(connection, schema, shards)


def create_external_ids(connection: sa.Connection, schema: str, shards: int) -> None:
    """``external_ids`` and ``external_id_probes``, distributed by external id and co-located (the same SQL as
    migration 0019, which made them for the keyed indexes made before it)."""
    connection.exec_driver_sql("CREATE TABLE external_ids (external_id text NOT NULL, id bigint NOT NULL)")
    connection.exec_driver_sql("CREATE UNIQUE INDEX external_ids_external_id ON external_ids (external_id) "
                               "INCLUDE (id)")
    connection.exec_driver_sql("CREATE TABLE external_id_probes (external_id text NOT NULL, probe bigint NOT NULL)")
    connection.execute(sa.text("SELECT create_distributed_table(CAST(:t AS regclass), 'external_id', "
                               "shard_count => :n, colocate_with => 'none')"),
                       {"t": f"{schema}.external_ids", "n": shards})
    connection.execute(sa.text("SELECT create_distributed_table(CAST(:t AS regclass), 'external_id', "
                               "colocate_with => :w)"),
                       {"t": f"{schema}.external_id_probes", "w": f"{schema}.external_ids"})
    connection.exec_driver_sql("COMMENT ON TABLE external_ids IS 'Every stored document''s external id, "
                               "distributed by it: a chunk''s check of its ids is routed (0019).'")
    connection.exec_driver_sql("COMMENT ON TABLE external_id_probes IS 'An ingest chunk''s external ids (or a "
                               "removal''s), co-located with external_ids; emptied inside its transaction.'")


def _create_keys(connection: sa.Connection, keys: str) -> None:
    connection.exec_driver_sql(f"CREATE TABLE {keys} (key bigint NOT NULL, id bigint NOT NULL, "
                               "fingerprint bigint NOT NULL)")


def _comment_keys(connection: sa.Connection, keys: str) -> None:
    connection.exec_driver_sql(f"COMMENT ON TABLE {keys} IS 'One row per document and key number, distributed by "
                               "key (key value << 6 | key number): a probe goes to the one shard of its key. Named "
                               "after the first key column of the layout it holds.'")


def check(connection: sa.Connection, schema: str, layout: str | None, method: Method) -> None:
    """On opening a keyed index: its key tables (those of ``method``'s layout) are distributed by key and
    co-located."""
    if layout != KEYED:
        return
    tables = (table(method), PROBES)
    rows = dict(connection.execute(sa.text(
        "SELECT c.relname, column_to_column_name(p.logicalrelid, p.partkey) || ' ' || p.colocationid "
        "FROM pg_dist_partition p JOIN pg_class c ON c.oid = p.logicalrelid "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = :schema AND c.relname = ANY(:tables)"),
        {"schema": schema, "tables": [*tables, *ID_TABLES]}).all())
    for names, column in ((tables, "key"), (ID_TABLES, "external_id")):
        placements = {rows.get(name, "").split(" ")[0] for name in names}
        if placements != {column} or len({rows[name].split(" ")[1] for name in names}) != 1:
            raise IncompatibleIndex(f"the index in schema {schema!r} has the keyed distributed layout, yet its "
                                    f"tables {', '.join(names)} are not co-located Citus tables distributed by "
                                    f"{column}; open it on the coordinator that holds it")


def build(connection: sa.Connection, method: Method) -> int:
    """Fill ``method``'s keys table from the stored documents' sketches (an index copied or moved into the
    keyed layout, or relaid out: the keys computed in SQL, :func:`folded_keys_sql`, so that ``documents``
    needs no key columns); rows written. One ``INSERT ... SELECT`` per key, which Citus repartitions by key."""
    written = 0
    sketch = sql_of(method).sketch_column[0]
    for folded in folded_keys_sql(method, sketch):
        written += connection.exec_driver_sql(
            f"INSERT INTO {table(method)} (key, id, fingerprint) SELECT {folded}, id, {sketch} FROM documents"
        ).rowcount
    connection.exec_driver_sql(f"ANALYZE {table(method)}")  # the first chunks' joins are planned on its statistics
    return written


def drop_document_keys(connection: sa.Connection, method: Method) -> None:
    """Drop ``documents``' key columns and, with them, their indexes on every segment and shard (the move to
    this layout, after :func:`build` read the sketches: nothing on this layout reads them)."""
    connection.exec_driver_sql("ALTER TABLE documents " + ", ".join(
        f"DROP COLUMN IF EXISTS {column}" for column in method.key_columns))


def build_external_ids(connection: sa.Connection) -> int:
    """Fill ``external_ids`` from the stored documents (an index copied or moved into the keyed layout); rows
    written, in one ``INSERT ... SELECT`` that Citus repartitions by external id."""
    written = connection.exec_driver_sql("INSERT INTO external_ids (external_id, id) "
                                         "SELECT external_id, id FROM documents").rowcount
    connection.exec_driver_sql("ANALYZE external_ids")
    return written


def rebuild(connection: sa.Connection, old: Method, new: Method) -> int:
    """Replace the keys table of ``old``'s layout by one of ``new``'s (``simdb relayout --blocks`` on the keyed
    layout, under the migrate and ingest locks: filled from the documents' fingerprints, :func:`build`); rows
    written.

    The new table, named after the new first key column (:func:`table`), is filled beside the old one (lookups
    go on reading that meanwhile), co-located with it (so ``key_probes`` stays co-located with what replaces
    it) and indexed once filled; the old one is dropped, locked only from its ``DROP`` to the commit. A process
    that still holds the old layout then finds no table of its keys, rather than the new one (whose keys are
    not those it computes). An interrupted rebuild rolls back whole."""
    keys = table(new)
    _create_keys(connection, keys)
    connection.execute(sa.text("SELECT create_distributed_table(CAST(:t AS regclass), 'key', colocate_with => :w)"),
                       {"t": keys, "w": table(old)})
    written = build(connection, new)
    connection.exec_driver_sql("CREATE INDEX {0}_key ON {0} (key) INCLUDE (id, fingerprint)".format(keys))
    connection.exec_driver_sql(f"DROP TABLE {table(old)}")
    _comment_keys(connection, keys)
    return written


# -- a chunk of an ingest ----------------------------------------------------------------------------

def stage_external_ids(connection: sa.Connection, ids: Sequence[int], external_ids: Sequence[str]
                       ) -> list[tuple[int, int]]:
    """Write a chunk's external ids (with its new document ids) into ``external_id_probes``, each to the shard
    of its hash, and return ``(new id, stored document id)`` of those stored already (a co-located join,
    :data:`STORED_IDS_SQL`). Those are taken out of the staged ids again: what stays is stored by
    :func:`store_staged` with the chunk."""
    if not len(ids):
        return []
    copy_in(connection, "external_id_probes (external_id, probe)", ["text", "int8"],
            zip(external_ids, np.asarray(ids, dtype=np.int64).tolist()))
    found = [tuple(row) for row in connection.exec_driver_sql(STORED_IDS_SQL).all()]
    if found:  # co-located too: each staged id that is stored, on its shard
        connection.exec_driver_sql("DELETE FROM external_id_probes p USING external_ids e "
                                   "WHERE e.external_id = p.external_id")
    return sorted(found)


def stored_documents(connection: sa.Connection, external_ids: Sequence[str]) -> list[tuple[str, int]]:
    """``(external id, document id)`` of those of ``external_ids`` that are stored: staged into
    ``external_id_probes`` (each to the shard of its hash), joined there with ``external_ids`` (a co-located
    join: each id sent once, where a join with ``documents`` by external id sent them to every worker), and the
    staging emptied. Under the ingest lock (a removal's ids, a sync chunk's replace check)."""
    if not len(external_ids):
        return []
    copy_in(connection, "external_id_probes (external_id, probe)", ["text", "int8"],
            ((external_id, 0) for external_id in external_ids))
    found = [tuple(row) for row in connection.exec_driver_sql(
        "SELECT DISTINCT e.external_id, e.id FROM external_id_probes p JOIN external_ids e "
        "ON e.external_id = p.external_id").all()]
    connection.exec_driver_sql("DELETE FROM external_id_probes")
    return sorted(found)


def stage_probes(connection: sa.Connection, ids: np.ndarray, fingerprints: Sequence[int], keys: np.ndarray
                 ) -> None:
    """Write a chunk's staged documents (their ids, stored fingerprints and key rows) into ``key_probes``: one
    row per document and key, each to the shard of its key."""
    if not len(ids):
        return
    columns = np.asarray(keys).shape[1]
    copy_in_columns(connection, PROBES, [
        ("key", "int8", fold(keys)), ("probe", "int8", np.repeat(np.asarray(ids, dtype=np.int64), columns)),
        ("fingerprint", "int8", np.repeat(np.asarray(fingerprints, dtype=np.int64), columns))])


def chunk_pairs(connection: sa.Connection, method: Method, max_distance: int, below: int) -> Iterator[np.ndarray]:
    """Verified ``(probe id, document id, distance)`` rows of the staged probes against every stored document
    (ids below ``below``): a co-located join of ``key_probes`` with ``keys``, verified on the shards. A pair
    that shares several keys comes back once per key."""
    yield from verified_pairs(connection, candidate_join_sql(method, max_distance, below), max_distance)


def candidate_join_sql(method: Method, max_distance: int, below: int) -> str:
    """The chunk's candidate join (a co-located join: ``tests/test_keyed.py`` holds its plan to that)."""
    return (f"SELECT p.probe, k.id, p.fingerprint, k.fingerprint FROM {PROBES} p JOIN {table(method)} k "
            f"ON k.key = p.key WHERE k.id < {int(below)} AND bit_count((p.fingerprint # k.fingerprint)::bit(64)) <= {int(max_distance)}")


def store_staged(connection: sa.Connection, method: Method) -> None:
    """Move the chunk's probes into ``keys`` and its external ids into ``external_ids`` (the chunk's documents
    are stored): co-located INSERT ... SELECTs, nothing crosses the network; ``key_probes`` and
    ``external_id_probes`` are left empty."""
    connection.exec_driver_sql(store_staged_sql(method))
    connection.exec_driver_sql(f"DELETE FROM {PROBES}")
    connection.exec_driver_sql("INSERT INTO external_ids (external_id, id) SELECT external_id, probe "
                               "FROM external_id_probes")
    connection.exec_driver_sql("DELETE FROM external_id_probes")


def store_staged_sql(method: Method) -> str:
    return f"INSERT INTO {table(method)} (key, id, fingerprint) SELECT key, probe, fingerprint FROM {PROBES}"


#: Most keys one routed removal statement names (a removal of more documents' keys takes several statements).
REMOVAL_KEYS = 20_000
#: Removed documents whose keys are grouped by shard at once (a larger removal takes several rounds).
REMOVAL_DOCUMENTS = 10_000


def remove(connection: sa.Connection, method: Method, ids: Sequence[int], stored: Sequence) -> int:
    """Drop the key rows of the removed documents (their ids and stored sketches, as the index stores them):
    their folded keys, computed from the sketches, grouped by the shard that holds each (Citus's own hash,
    asked on the coordinator), then one ``DELETE`` per shard and at most :data:`REMOVAL_KEYS` keys, each
    routed to that one shard by its ``key = ANY(...)`` (no scan of every shard: ``keys`` has no index on id);
    rows deleted. ``id = ANY(...)`` keeps other documents' rows of the same keys."""
    deleted = 0
    for start in range(0, len(ids), REMOVAL_DOCUMENTS):
        end = start + REMOVAL_DOCUMENTS
        key_rows = np.asarray(method.stored_keys(np.asarray(stored[start:end], dtype=np.int64)), dtype=np.int64)
        folded = fold(key_rows)
        owner = np.repeat(np.asarray(ids[start:end], dtype=np.int64), key_rows.shape[1])
        shards = shard_ids(connection, table(method), folded)
        for statement, params in removal_statements(method, shards, folded, owner):
            deleted += connection.exec_driver_sql(statement, params).rowcount
    return deleted


def remove_external_ids(connection: sa.Connection, ids: Sequence[int], external_ids: Sequence[str]) -> int:
    """Drop the removed documents' rows of ``external_ids``: staged into ``external_id_probes`` (each to the
    shard of its hash), deleted by a co-located join on the external id and the document id, and the staging
    emptied; rows deleted. A removal runs before a chunk stages anything (a sync run's replacement: see
    :func:`simdb.pg.sync.remove_changed`), under the ingest lock."""
    if not len(ids):
        return 0
    copy_in(connection, "external_id_probes (external_id, probe)", ["text", "int8"],
            zip(external_ids, np.asarray(ids, dtype=np.int64).tolist()))
    deleted = connection.exec_driver_sql("DELETE FROM external_ids e USING external_id_probes p "
                                         "WHERE e.external_id = p.external_id AND e.id = p.probe").rowcount
    connection.exec_driver_sql("DELETE FROM external_id_probes")
    return deleted


def removal_statements(method: Method, shards: np.ndarray, folded: np.ndarray, owner: np.ndarray
                       ) -> Iterator[tuple[str, dict]]:
    """The routed ``DELETE`` statements of :func:`remove`: the (shard, folded key, document id) rows grouped by
    shard, at most :data:`REMOVAL_KEYS` keys a statement, each statement naming keys of one shard only."""
    statement = (f"DELETE FROM {table(method)} WHERE key = ANY(CAST(%(keys)s AS bigint[])) "
                 "AND id = ANY(CAST(%(ids)s AS bigint[]))")
    order = np.lexsort((folded, shards))
    shards, folded, owner = shards[order], folded[order], owner[order]
    starts = np.flatnonzero(np.r_[True, shards[1:] != shards[:-1]])
    for start, end in zip(starts, np.r_[starts[1:], len(shards)]):
        for first in range(start, end, REMOVAL_KEYS):
            last = min(first + REMOVAL_KEYS, end)
            yield statement, {"keys": int8_array(np.unique(folded[first:last])),
                               "ids": int8_array(np.unique(owner[first:last]))}


# -- reads: lookups, queries, check --------------------------------------------------------------------

def probe(connection: sa.Connection, method: Method, sketches: Sequence, max_distance: int,
          keys: Sequence[Sequence[int]] | None = None, *, connections: int | None = 1
          ) -> Iterator[tuple[int, int, int]]:
    """``(sketch index, document id, distance)`` of the stored documents within ``max_distance`` of each sketch:
    one ``key = ANY(...)`` statement that Citus prunes to the shards holding the sketches' keys (one sketch:
    at most one task per key column), or for many sketches one statement per shard, spread over
    ``connections`` coordinator connections (:func:`routed_rows`). Writes nothing: it runs in a read-only
    transaction (``check``'s) or outside one (a batch of lookups')."""
    if not len(sketches):
        return
    key_rows = method.keys(sketches) if keys is None else np.asarray(keys, dtype=np.int64)
    wanted = np.unique(fold(key_rows))
    lookup = lookup_sql(method)
    if len(sketches) < SHARD_BY_SHARD:
        rows = connection.exec_driver_sql(lookup, {"keys": int8_array(wanted)}).all()
    else:  # each shard gets only its keys: one = ANY over all of them makes every shard probe every key
        rows = routed_rows(connection, lookup, "keys", by_shard(connection, table(method), wanted), None,
                           connections)
    yield from _verified(rows, method, sketches, key_rows, max_distance)


#: A batch of at least this many sketches probes ``keys`` shard by shard (:func:`probe`).
SHARD_BY_SHARD = 64


def shard_ids(connection: sa.Connection, table: str, values: np.ndarray) -> np.ndarray:
    """The shard of ``table`` that holds each of ``values`` (of its distribution column, bigint), computed here as
    Citus computes it (:func:`hashint8`, then the shard whose hash range holds it): one read of the table's
    shard ranges on the coordinator, where asking Citus (``get_shard_id_for_distribution_column``) was a call
    per value on it. ``tests/test_keyed.py`` holds the two equal."""
    ranges = np.asarray(connection.exec_driver_sql(
        "SELECT shardid, CAST(shardminvalue AS int4), CAST(shardmaxvalue AS int4) FROM pg_dist_shard "
        "WHERE logicalrelid = CAST(%(table)s AS regclass) ORDER BY 2", {"table": table}).all(),
        dtype=np.int64).reshape(-1, 3)
    hashes = hashint8(values).astype(np.int64)
    at = np.searchsorted(ranges[:, 1], hashes, side="right") - 1
    if len(hashes) and (at.min() < 0 or np.any(hashes > ranges[at, 2])):
        raise SimdbError(f"the shards of distributed table {table} do not cover every hash value (pg_dist_shard has a "
                         "gap in its hash ranges, so Citus could not place some keys): see its ranges with "
                         f"SELECT * FROM citus_shards WHERE table_name = '{table}'::regclass, and restore the "
                         "table's shards (citus_split_shard_by_split_points or a copy into a new index, "
                         "`simdb init --distributed --copy-from`) before using this index")
    return ranges[at, 0]


def _rotate(x: np.ndarray, k: int) -> np.ndarray:
    return (x << np.uint32(k)) | (x >> np.uint32(32 - k))


def hashint8(values: np.ndarray) -> np.ndarray:
    """PostgreSQL's ``hashint8`` of each bigint, as int32 (how Citus reads it to place a row): the high half
    folded into the low half (complemented for a negative value), then ``hash_bytes_uint32``, Bob Jenkins'
    lookup3 ``final`` mix of a single 32-bit word (``src/common/hashfn.c``, ``src/backend/access/hash/hashfunc.c``)."""
    values = np.asarray(values, dtype=np.int64)
    low, high = values.astype(np.uint32), (values >> np.int64(32)).astype(np.uint32)
    low = low ^ np.where(values >= 0, high, ~high)
    b = c = np.full(values.shape, (0x9E3779B9 + 4 + 3923095) & 0xFFFFFFFF, dtype=np.uint32)
    a = b + low
    # lookup3's final(a, b, c), step for step (uint32 arithmetic wraps, as C's does)
    c = (c ^ b) - _rotate(b, 14)
    a = (a ^ c) - _rotate(c, 11)
    b = (b ^ a) - _rotate(a, 25)
    c = (c ^ b) - _rotate(b, 16)
    a = (a ^ c) - _rotate(c, 4)
    b = (b ^ a) - _rotate(a, 14)
    c = (c ^ b) - _rotate(b, 24)
    return c.view(np.int32)


def by_shard(connection: sa.Connection, table: str, values: np.ndarray) -> list[np.ndarray]:
    """``values`` of ``table``'s distribution column grouped by the shard that holds each (Citus's own hash,
    asked on the coordinator): one array per shard, each routed to that one shard by ``= ANY``."""
    shards = shard_ids(connection, table, values)
    order = np.argsort(shards, kind="stable")
    shards, values = shards[order], values[order]
    starts = np.flatnonzero(np.r_[True, shards[1:] != shards[:-1]])
    return np.split(values, starts[1:])


def routed_rows(connection: sa.Connection, statement: str, parameter: str, groups: Sequence[np.ndarray],
                row_factory=None, connections: int | None = 1) -> list[tuple]:
    """The rows of ``statement`` (in the driver's parameter style) run once per group of values (its array
    parameter ``parameter``; each group the values of one shard, :func:`by_shard`, so that each statement is
    routed to that shard), sent in one pipeline on each of ``connections`` coordinator connections (None:
    :func:`coordinator_connections`): ``connection``'s own and others from its engine's pool, the groups
    dealt out in turn. A coordinator backend runs its statements one after another (64 for a batch of 1,000
    lookups, its keys and its documents: every worker but one waited at any moment), so each connection's
    pipeline is sent before any is read, and the coordinator's backends run theirs at the same time, with
    no thread here.

    Where ``connection`` is in a transaction, the other connections read in a ``REPEATABLE READ, READ ONLY``
    transaction begun while ``connection``'s holds its locks, so no merge or relayout commits under them; each
    worker connection of theirs takes its own snapshot, as ``connection``'s own do (Citus gives a transaction no
    snapshot of the whole cluster: each worker's is its own), later than ``connection``'s where it read that
    worker before (``simdb check`` therefore probes through its own connection alone, ``connections=1``, so that
    its probe and its reads of the matched rows share its snapshots). Where ``connection`` is in
    autocommit (a batch of lookups, :meth:`simdb.Index.query_fingerprints`), so are they: each connection's
    statements run in the one implicit transaction of its pipeline, and Citus sends each worker its shard's
    statement alone, without the ``BEGIN``, ``assign_distributed_transaction_id`` and ``COMMIT`` a transaction
    costs on every worker connection of every coordinator backend. A worker read through several
    statements or coordinator connections is read in several snapshots, the race a transaction already had
    between workers (a removal or a chunk whose two-phase commit reached one worker before another), and
    answered the same way: a match whose ``documents`` row is not seen is left out, as if the removal came
    first or the chunk after (:mod:`simdb.check`); outside a transaction, where a removal or ``sync``'s
    replacement may commit between the probe and the read of the rows, its sketch is looked up again first
    (:func:`simdb.pg.reads.keyed_matches`).

    A statement's error is raised (the first connection's first); every connection's pipeline is read to its
    end and the others' transactions rolled back before it is, so each is left usable. Connections read in
    turn wait for no lock longer than :data:`simdb.pg.spread.LOCK_WAIT`: a relayout's ``ALTER TABLE`` queued
    behind the locks of one connection would queue another's reads behind it while this process waits for
    that other, a cycle PostgreSQL cannot see (the other connections, where ``connection`` holds its locks
    first; every connection, in autocommit, where none holds its locks before the others begin and one whose
    results are not yet read may keep its locks until they are); where one gives up so, ``connection`` reads
    every group alone."""
    if not connection.in_transaction():  # as SQLAlchemy's own execute would: the driver's transaction is the one
        connection.begin()               # the caller commits or rolls back
    if connections is None:
        connections = coordinator_connections(connection, len(groups))
    shares = [groups[start::connections] for start in range(max(1, min(connections, len(groups))))]
    autocommit = connection.connection.driver_connection.autocommit
    quiet = _QuietPipelineExit()
    _PSYCOPG_LOG.addFilter(quiet)  # a failed statement is raised; psycopg would also log it again on leaving
    try:
        with contextlib.ExitStack() as held:
            drivers = [connection.connection.driver_connection]
            pipelines = [held.enter_context(drivers[0].pipeline())]
            if autocommit and len(shares) > 1:
                drivers[0].execute(_LOCK_WAIT_IN_PIPELINE)
            for driver, pipeline in (held.enter_context(_reader(connection.engine, autocommit))
                                     for _ in shares[1:]):
                drivers.append(driver)
                pipelines.append(pipeline)
            cursors: list[list[psycopg.Cursor]] = [[] for _ in shares]
            failed: dict[int, psycopg.Error] = {}
            for number, (driver, share) in enumerate(zip(drivers, shares)):
                try:  # an error that came back while sending stops this connection's sending, not the others'
                    for group in share:
                        cursors[number].append(driver.cursor(row_factory=row_factory).execute(
                            statement, {parameter: int8_array(group)}))
                except psycopg.Error as error:
                    failed[number] = error
            for number, pipeline in enumerate(pipelines):  # each sent already: read them in turn, each to its end
                try:
                    pipeline.sync()
                except psycopg.Error as error:
                    failed.setdefault(number, error)
            if failed and not all((number or autocommit) and isinstance(error, psycopg.errors.LockNotAvailable)
                                  for number, error in failed.items()):
                raise failed[min(failed)]
    finally:
        _PSYCOPG_LOG.removeFilter(quiet)
    if failed:  # a connection would not wait for its lock: this one reads every group, alone, waiting for it
        return routed_rows(connection, statement, parameter, groups, row_factory)
    return [row for share in cursors for cursor in share for row in cursor.fetchall()]


#: The most coordinator connections a batch's routed statements are spread over by default: the engine's pool
#: keeps 5 open between uses (more are opened and closed each time, and each new coordinator backend opens its
#: own connection to every worker it reads), and past 2 the gain was small (a batch of 1,000 lookups at 8 workers,
#: 32 shards, 2 shared cores at load 7, medians of 16 interleaved: 358 / 301 / 289 ms on 1 / 2 / 4 connections;
#: at load 4, 82 / 78 ms on 1 / 2, and at 1 worker 113 / 131 ms: two cores hold the coordinator, the workers and
#: the client, so that the measured gain is a floor where the coordinator has cores of its own).
COORDINATOR_CONNECTIONS = 4
#: The fewest routed statements a coordinator connection is given by default: another connection costs a
#: checkout, its pipeline's sync and, in a transaction (``check``'s), its ``BEGIN``, and ``BEGIN`` and
#: ``ROLLBACK`` on each worker it reads: about what a few routed statements cost.
STATEMENTS_PER_CONNECTION = 8


def coordinator_connections(connection: sa.Connection, statements: int) -> int:
    """How many coordinator connections ``statements`` routed statements are spread over when not told: the
    cores a batch may use (:func:`simdb.pg.spread.default_connections`: this machine's, and what the
    coordinator lets a parallel query use: its backends run the statements' Citus planning and execution,
    which is most of a routed read's time), at least :data:`STATEMENTS_PER_CONNECTION` statements each, at
    most :data:`COORDINATOR_CONNECTIONS`."""
    return max(1, min(spread.default_connections(connection), statements // STATEMENTS_PER_CONNECTION,
                      COORDINATOR_CONNECTIONS))


@contextlib.contextmanager
def _reader(engine: sa.Engine, autocommit: bool = False) -> Iterator[tuple[psycopg.Connection, psycopg.Pipeline]]:
    """A connection from ``engine``'s pool (its driver's, and the pipeline entered on it) in a read-only
    ``REPEATABLE READ`` transaction that waits for no lock longer than :data:`simdb.pg.spread.LOCK_WAIT` (its
    ``BEGIN`` and ``SET`` sent with the statements, in the pipeline); rolled back on leaving (it wrote nothing:
    a commit costs the same round trips). With ``autocommit``, in none: its pipeline's statements run in one
    implicit transaction, which the same wait for a lock holds."""
    if autocommit:
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as other:
            driver = other.connection.driver_connection
            with driver.pipeline() as pipeline:
                driver.execute(_LOCK_WAIT_IN_PIPELINE)
                yield driver, pipeline
        return
    with engine.connect().execution_options(isolation_level="REPEATABLE READ", postgresql_readonly=True) as other:
        other.begin()
        driver = other.connection.driver_connection
        try:
            with driver.pipeline() as pipeline:
                driver.execute(f"SET LOCAL lock_timeout = '{spread.LOCK_WAIT}'")
                yield driver, pipeline
        finally:
            other.rollback()


#: The wait for a lock of a pipeline's statements outside a transaction block: ``SET LOCAL`` there does nothing
#: (and warns), but a setting made local by ``set_config`` lasts until the pipeline's implicit transaction ends.
_LOCK_WAIT_IN_PIPELINE = f"SELECT set_config('lock_timeout', '{spread.LOCK_WAIT}', true)"

_PSYCOPG_LOG = logging.getLogger("psycopg")


class _QuietPipelineExit(logging.Filter):
    """Drops psycopg's "error ignored terminating <Pipeline ...>" warning: the error it repeats is the one the
    pipeline's block raises (which simdb translates), and the warning would name the host, user and database."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("error ignored terminating")


def _verified(rows: Sequence[tuple], method: Method, sketches: Sequence, key_rows: np.ndarray, max_distance: int
              ) -> Iterator[tuple[int, int, int]]:
    """``(sketch index, document id, distance)`` of the ``(key, id, fingerprint)`` rows found for the sketches'
    keys within ``max_distance`` (a row counts for every sketch that has its key)."""
    if not len(rows):
        return
    columns = key_rows.shape[1]
    folded = fold(key_rows)
    order = np.argsort(folded, kind="stable")
    wanted, owners = folded[order], order // columns  # the sorted keys, and the sketch each came from
    found = np.array([tuple(row) for row in rows], dtype=np.int64).reshape(-1, 3)
    first = np.searchsorted(wanted, found[:, 0], side="left")
    last = np.searchsorted(wanted, found[:, 0], side="right")
    repeats = last - first
    row_of = np.repeat(np.arange(len(found)), repeats)
    # each row's places among the sorted wanted keys: first[r], first[r] + 1, ..., last[r] - 1
    position = np.arange(repeats.sum()) - np.repeat(np.cumsum(repeats) - repeats, repeats) + np.repeat(first, repeats)
    sketch_index = owners[position]
    stored = np.asarray(method.stored(list(sketches)), dtype=np.int64)
    distances = hamming_array(to_unsigned_array(stored[sketch_index]),
                              to_unsigned_array(found[row_of, 2])).astype(np.int64)
    keep = distances <= max_distance
    yield from zip(sketch_index[keep].tolist(), found[row_of[keep], 1].tolist(), distances[keep].tolist())


def lookup(connection: sa.Connection, method: Method, sketch, max_distance: int) -> list[tuple[tuple, int]]:
    """(document, distance) of every stored document within ``max_distance`` of one sketch: the routed probe of
    ``keys``, then the documents it found, read by id (each from its own shard), each statement outside a
    transaction block, in its own snapshot: where a match's row is gone by the second (removed, or replaced by
    ``sync`` under the same external id, between the two), the lookup is made again, up to :data:`READ_AGAIN`
    times (a match still without its row is left out, as if its removal came first). Both statements are
    prepared on their first run on a connection (as :func:`simdb.pg.reads.lookup` prepares its one), unless the
    connection is told to prepare nothing (``prepare_threshold=None``, as behind PgBouncer)."""
    driver = connection.connection.driver_connection
    prepare = True if driver.prepare_threshold is not None else None
    key_rows = method.keys([sketch])
    keys = {"keys": int8_array(np.unique(fold(key_rows)))}
    for attempt in range(READ_AGAIN + 1):
        rows = driver.cursor().execute(lookup_sql(method), keys, prepare=prepare).fetchall()
        distances = {document: distance for _, document, distance in
                     _verified(rows, method, [sketch], key_rows, max_distance)}
        if not distances:
            return []
        documents = documents_by_id(driver, method, sorted(distances), prepare)
        if len(documents) == len(distances) or attempt == READ_AGAIN:
            return [(row, distances[row.id]) for row in documents]


def documents_by_id(driver: psycopg.Connection, method: Method, ids: list[int], prepare: bool | None) -> list:
    """The rows of the stored documents ``ids`` that the statement sees (:func:`document_columns`)."""
    return driver.cursor(row_factory=namedtuple_row).execute(
        f"SELECT {document_columns(method)} FROM documents WHERE id = ANY(CAST(%(ids)s AS bigint[]))",
        {"ids": int8_array(ids)}, prepare=prepare).fetchall()


def document_columns(method: Method) -> str:
    """What a lookup reads of each matched document: id, external_id, sketch, and metadata (None where it is
    empty, ``{}``: psycopg's decoding of each row's ``{}`` was a tenth of a warm batch of lookups at 3M)."""
    return f"id, external_id, {sql_of(method).sketch_column[0]} AS sketch, NULLIF(metadata, '{{}}') AS metadata"


#: How many times a lookup outside a transaction block (one, :func:`lookup`, or a batch,
#: :func:`simdb.pg.reads.keyed_matches`) is made again for the sketches whose matches' rows were gone when read:
#: a removal, or ``sync``'s replacement of a document under its external id, committed between its probe of
#: ``keys`` and its read of the rows (the new document, stored meanwhile, was not probed). Each time reads after
#: the last commit it saw, so one is enough unless another such commit comes between again.
READ_AGAIN = 3
