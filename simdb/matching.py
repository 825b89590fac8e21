"""Block keys -> candidate pairs in SQL -> verified matches in Python.

Candidates come from equality joins on each key column, one ``SELECT`` per
key glued with ``UNION ALL``; each join also applies the distance in SQL
(``bit_count((p.simhash # t.simhash)::bit(64)) <= k``) so that only likely
matches leave the server. The survivors stream out of PostgreSQL as a binary
COPY, are parsed by numpy without a Python loop, verified again by popcount
(the final check), and a pair that agreed on several keys is kept once.

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


def _copy_dtype(columns: int) -> np.dtype:
    fields = [("count", ">i2")]
    for i in range(columns):
        fields += [(f"length{i}", ">i4"), (f"value{i}", ">i8")]
    return np.dtype(fields)


def copy_out_int64(connection: sa.Connection, sql: str, columns: int, params: dict | None = None,
                   chunk_rows: int = 1 << 20) -> Iterator[np.ndarray]:
    """Run ``sql`` (NOT NULL bigint columns only) as a binary COPY; yield int64 arrays of shape (n, columns)."""
    dtype = _copy_dtype(columns)
    cursor = connection.connection.dbapi_connection.cursor()
    buffer = bytearray()
    header_done = False

    def parse(data: bytes | bytearray) -> np.ndarray:
        rows = np.frombuffer(data, dtype=dtype)
        if rows.size and not ((rows["count"] == columns).all()
                              and all((rows[f"length{i}"] == 8).all() for i in range(columns))):
            raise RuntimeError("unexpected COPY row layout (NULL or non-bigint column)")
        return np.stack([rows[f"value{i}"].astype(np.int64) for i in range(columns)], axis=1) \
            if rows.size else np.empty((0, columns), dtype=np.int64)

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
