"""The one binary COPY path between Python and PostgreSQL.

In: psycopg's binary COPY with ``set_types`` writes rows of any column types, inside the
caller's transaction, so a failure discards them. Out: a query's result as a binary COPY parsed
by numpy without a Python loop per row, for the big results (candidate pairs, key values):
every column is a NOT NULL ``bigint`` or a ``bytea`` of a fixed width.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import sqlalchemy as sa

_SIGNATURE = b"PGCOPY\n\xff\r\n\x00"
_HEADER = len(_SIGNATURE) + 8
_TRAILER = b"\xff\xff"


def copy_in(connection: sa.Connection, table: str, types: list[str], rows: Iterable, *,
            create: bool = False, freeze: bool = False) -> None:
    """Binary-COPY ``rows`` into ``table`` (``name (column, ...)``, with the columns' PostgreSQL ``types``).

    With ``create``, the table is first made as a temporary table dropped at commit. With ``freeze``,
    the rows are written frozen (the table must have been created or truncated in this transaction).
    """
    if create:
        name, _, columns = table.partition(" ")
        definition = ", ".join(f"{c.strip()} {t} NOT NULL" for c, t in zip(columns.strip("() ").split(","), types))
        connection.exec_driver_sql(f"CREATE TEMPORARY TABLE {name} ({definition}) ON COMMIT DROP")
    cursor = connection.connection.dbapi_connection.cursor()
    with cursor.copy(f"COPY {table} FROM STDIN (FORMAT BINARY{', FREEZE' if freeze else ''})") as copy:
        copy.set_types(types)
        for row in rows:
            copy.write_row(row)


def copy_in_int64(connection: sa.Connection, table: str, columns: np.ndarray) -> None:
    """Binary-COPY the rows of an (n, c) int64 array into ``table`` (``name (column, ...)``, c bigint columns),
    the COPY data built by numpy in one block (as :func:`copy_out_int64` parses it): :func:`copy_in`'s row by
    row adaptation took 120 ms of client CPU for a keyed chunk's 60,000 key rows of 4,000 documents, this 10."""
    columns = np.asarray(columns, dtype=np.int64)
    rows = np.empty(len(columns), dtype=_dtype([8] * columns.shape[1]))
    rows["count"] = columns.shape[1]
    for i in range(columns.shape[1]):
        rows[f"length{i}"], rows[f"value{i}"] = 8, columns[:, i]
    cursor = connection.connection.dbapi_connection.cursor()
    with cursor.copy(f"COPY {table} FROM STDIN (FORMAT BINARY)") as copy:
        # the whole stream in block mode: psycopg writes neither signature nor trailer for it
        copy.write(_SIGNATURE + bytes(8) + rows.tobytes() + _TRAILER)


def id_table(connection: sa.Connection, name: str, ids: Iterable[int]) -> str:
    """A temporary table ``name (id)`` of ``ids``, analyzed, to join ``documents`` with: never an array of
    ids in the statement, which PostgreSQL copies into every segment's scan (a million ids over 66
    segments took a 17 GB server process down with it). Returns ``name``."""
    copy_in(connection, f"{name} (id)", ["int8"], ((int(i),) for i in ids), create=True)
    connection.exec_driver_sql(f"ANALYZE {name}")
    return name


def _dtype(widths: list[int]) -> np.dtype:
    fields = [("count", ">i2")]
    for i, width in enumerate(widths):
        fields += [(f"length{i}", ">i4"), (f"value{i}", ">i8" if width == 8 else f"V{width}")]
    return np.dtype(fields)


def copy_out(connection: sa.Connection, sql: str, widths: list[int], params: dict | None = None,
             chunk_rows: int = 1 << 20) -> Iterator[np.ndarray]:
    """Run ``sql`` as a binary COPY; yield structured arrays with fields ``value0``, ``value1``, ...

    ``widths`` are the columns' byte widths: 8 for a ``bigint``, else a ``bytea`` of that fixed width.
    """
    columns = len(widths)
    dtype = _dtype(widths)
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
                if not buffer.startswith(_SIGNATURE):
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


def copy_out_int64(connection: sa.Connection, sql: str, columns: int, params: dict | None = None,
                   chunk_rows: int = 1 << 20) -> Iterator[np.ndarray]:
    """Run ``sql`` (NOT NULL bigint columns only) as a binary COPY; yield int64 arrays of shape (n, columns)."""
    for rows in copy_out(connection, sql, [8] * columns, params, chunk_rows):
        yield np.stack([rows[f"value{i}"].astype(np.int64) for i in range(columns)], axis=1) \
            if rows.size else np.empty((0, columns), dtype=np.int64)
