"""Block keys -> candidate pairs in SQL -> verified matches in Python.

Candidates come from equality joins on each key column, one ``SELECT`` per
key glued with ``UNION ALL``; each join also applies the distance in SQL
(``bit_count((p.simhash # t.simhash)::bit(64)) <= k``) so that only likely
matches leave the server. The survivors stream out of PostgreSQL as a binary
COPY, are parsed by numpy without a Python loop, verified again by popcount
(the final check), and a pair that agreed on several keys is kept once.

In MinHash mode (:func:`band_pairs`) the keys are band keys: the band joins
give each candidate pair once (``UNION``), PostgreSQL returns both signatures,
and numpy counts the positions where they agree; a pair is kept when the
signatures differ in at most ``max_distance`` positions, that is, when the
Jaccard estimate reaches the threshold.

Keys are not excluded pairwise in SQL (``t.key_0 <> p.key_0`` ...): that would
read columns the covering key indexes do not carry and cost the index-only
scans, which matter far more than a few repeated pairs.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import sqlalchemy as sa

from .bits import hamming_array, to_unsigned_array
from .blocks import BlockLayout
from .minhash import MinHashSettings

_COPY_SIGNATURE = b"PGCOPY\n\xff\r\n\x00"
_HEADER = len(_COPY_SIGNATURE) + 8
_TRAILER = b"\xff\xff"


def candidate_sql(layout: BlockLayout, probe: str, target: str, max_distance: int, *, earlier_only: bool = False,
                  where: str | None = None) -> str:
    """SQL for ``(probe id, target id, probe simhash, target simhash)`` rows sharing a key, within ``max_distance``.

    ``probe`` and ``target`` are table names (they may be the same table).
    ``earlier_only`` keeps pairs whose target id is smaller than the probe id,
    for matching a set against itself; ``where`` filters further, with ``p``
    and ``t`` as the two sides.
    """
    selects = []
    for column in layout.key_columns:
        conditions = [f"t.{column} = p.{column}", f"bit_count((p.simhash # t.simhash)::bit(64)) <= {int(max_distance)}"]
        if earlier_only:
            conditions.append("t.id < p.id")
        if where:
            conditions.append(f"({where})")
        selects.append(f"SELECT p.id, t.id, p.simhash, t.simhash FROM {probe} p "
                       f"JOIN {target} t ON {' AND '.join(conditions)}")
    return "\nUNION ALL\n".join(selects)


def _copy_dtype(widths: list[int]) -> np.dtype:
    fields = [("count", ">i2")]
    for i, width in enumerate(widths):
        fields += [(f"length{i}", ">i4"), (f"value{i}", ">i8" if width == 8 else f"V{width}")]
    return np.dtype(fields)


def copy_out_int64(connection: sa.Connection, sql: str, columns: int, params: dict | None = None,
                   chunk_rows: int = 1 << 20) -> Iterator[np.ndarray]:
    """Run ``sql`` (NOT NULL bigint columns only) as a binary COPY; yield int64 arrays of shape (n, columns)."""
    for rows in copy_out(connection, sql, [8] * columns, params, chunk_rows):
        yield np.stack([rows[f"value{i}"].astype(np.int64) for i in range(columns)], axis=1) \
            if rows.size else np.empty((0, columns), dtype=np.int64)


def copy_out(connection: sa.Connection, sql: str, widths: list[int], params: dict | None = None,
             chunk_rows: int = 1 << 20) -> Iterator[np.ndarray]:
    """Run ``sql`` as a binary COPY whose NOT NULL columns are bigints (width 8) or byteas of a fixed
    width; yield structured arrays with fields ``value0``, ``value1``, ...
    """
    columns = len(widths)
    dtype = _copy_dtype(widths)
    cursor = connection.connection.dbapi_connection.cursor()
    buffer = bytearray()
    header_done = False

    def parse(data: bytes | bytearray) -> np.ndarray:
        rows = np.frombuffer(data, dtype=dtype)
        if rows.size and not ((rows["count"] == columns).all()
                              and all((rows[f"length{i}"] == w).all() for i, w in enumerate(widths))):
            raise RuntimeError("unexpected COPY row layout (NULL, or a column of another type or width)")
        return rows

    with cursor.copy(f"COPY ({sql}) TO STDOUT (FORMAT BINARY)", params) as copy:
        for data in copy:
            buffer += data
            if not header_done:
                if len(buffer) < _HEADER:
                    continue
                if not buffer.startswith(_COPY_SIGNATURE):
                    raise RuntimeError("not a PostgreSQL binary COPY stream")
                extension = int.from_bytes(buffer[_HEADER - 4:_HEADER], "big")
                del buffer[:_HEADER + extension]
                header_done = True
            complete = len(buffer) // dtype.itemsize
            if complete >= chunk_rows:
                yield parse(bytes(buffer[:complete * dtype.itemsize]))
                del buffer[:complete * dtype.itemsize]
    if not buffer.endswith(_TRAILER) or (len(buffer) - len(_TRAILER)) % dtype.itemsize:
        raise RuntimeError("truncated PostgreSQL binary COPY stream")
    yield parse(bytes(buffer[:-len(_TRAILER)]))


def copy_in(connection: sa.Connection, table: str, types: list[str], rows, *, create: bool = False) -> None:
    """Binary-COPY ``rows`` into ``table``; with ``create``, as a new temporary table dropped at commit.

    ``table`` is ``name (column, ...)``; ``types`` are the columns' PostgreSQL types.
    """
    if create:
        name, _, columns = table.partition(" ")
        definition = ", ".join(f"{c.strip()} {t} NOT NULL" for c, t in zip(columns.strip("() ").split(","), types))
        connection.exec_driver_sql(f"CREATE TEMPORARY TABLE {name} ({definition}) ON COMMIT DROP")
    cursor = connection.connection.dbapi_connection.cursor()
    with cursor.copy(f"COPY {table} FROM STDIN (FORMAT BINARY)") as copy:
        copy.set_types(types)
        for row in rows:
            copy.write_row(row)


def verified_pairs(connection: sa.Connection, sql: str, max_distance: int,
                   params: dict | None = None) -> Iterator[np.ndarray]:
    """Run a :func:`candidate_sql` query; yield ``(probe id, target id, distance)`` rows within ``max_distance``."""
    for chunk in copy_out_int64(connection, sql, 4, params):
        distances = hamming_array(to_unsigned_array(chunk[:, 2]), to_unsigned_array(chunk[:, 3]))
        keep = distances <= max_distance
        yield np.stack([chunk[keep, 0], chunk[keep, 1], distances[keep].astype(np.int64)], axis=1)


def band_candidate_sql(settings: MinHashSettings, probe: str, target: str, *, earlier_only: bool = False,
                       where: str | None = None) -> str:
    """SQL for ``(probe id, target id, probe signature, target signature)``, once per pair sharing a band."""
    conditions = ["t.id < p.id"] if earlier_only else []
    if where:
        conditions.append(f"({where})")
    selects = [f"SELECT p.id AS p_id, t.id AS t_id FROM {probe} p JOIN {target} t "
               f"ON {' AND '.join([f't.{column} = p.{column}', *conditions])}" for column in settings.key_columns]
    return (f"SELECT c.p_id, c.t_id, p.signature, t.signature FROM ({' UNION '.join(selects)}) c "
            f"JOIN {probe} p ON p.id = c.p_id JOIN {target} t ON t.id = c.t_id")


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
        distances = settings.num_perm - np.count_nonzero(probe == target, axis=1)
        keep = distances <= max_distance
        yield np.stack([rows["value0"][keep].astype(np.int64), rows["value1"][keep].astype(np.int64),
                        distances[keep].astype(np.int64)], axis=1)


def pairs_between(connection: sa.Connection, layout: BlockLayout | MinHashSettings, probe: str, target: str,
                  max_distance: int, *, earlier_only: bool = False, where: str | None = None) -> Iterator[np.ndarray]:
    """Verified ``(probe id, target id, distance)`` rows between two tables, for either kind of index."""
    if isinstance(layout, MinHashSettings):
        return band_pairs(connection, layout, band_candidate_sql(layout, probe, target, earlier_only=earlier_only,
                                                                 where=where), max_distance)
    return verified_pairs(connection, candidate_sql(layout, probe, target, max_distance, earlier_only=earlier_only,
                                                    where=where), max_distance)


def collect(chunks: Iterator[np.ndarray], columns: int = 3) -> np.ndarray:
    """All rows of a chunked result, each distinct row once, sorted."""
    parts = list(chunks)
    return np.unique(np.concatenate(parts), axis=0) if parts else np.empty((0, columns), dtype=np.int64)


def earliest_matches(pairs: np.ndarray) -> np.ndarray:
    """``(probe, match, distance)`` rows -> one ``(probe, earliest match, its distance)`` per probe."""
    if not len(pairs):
        return np.empty((0, 3), dtype=np.int64)
    order = np.lexsort((pairs[:, 1], pairs[:, 0]))
    ordered = pairs[order]
    first = np.ones(len(ordered), dtype=bool)
    first[1:] = ordered[1:, 0] != ordered[:-1, 0]
    return ordered[first]
