"""The one binary COPY path between Python and PostgreSQL, and the binary ``bigint[]`` parameter.

In: psycopg's binary COPY with ``set_types`` writes rows of any column types, inside the
caller's transaction, so a failure discards them. Out: a query's result as a binary COPY parsed
by numpy without a Python loop per row, for the big results (candidate pairs, key values):
every column is a NOT NULL ``bigint`` or a ``bytea`` of a fixed width. A statement's array of
keys or ids (``= ANY(...)``): :func:`int8_array`, built by numpy in PostgreSQL's binary format.
"""

from __future__ import annotations

import itertools
import json
import struct
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import psycopg
import sqlalchemy as sa
from psycopg.adapt import Dumper
from psycopg.pq import Format

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


#: Rows that :func:`copy_in_columns` encodes at a time (about 6 MB of a MinHash chunk's staging).
COLUMN_BLOCK = 8192
#: The integer types :func:`copy_in_columns` writes as fixed-width fields, and their big-endian numpy types.
_INTEGERS = {"int8": ">i8", "int4": ">i4", "int2": ">i2"}
_NULL = b"\xff\xff\xff\xff"


def copy_in_columns(connection: sa.Connection, table: str, columns: Sequence[tuple[str, str, Sequence]]) -> None:
    """Binary-COPY the rows that ``columns`` hold column by column, ``(name, PostgreSQL type, values)`` with one
    value per row, into ``table``, inside the caller's transaction: what :func:`copy_in` writes of the same rows,
    a block of rows encoded at a time rather than a field at a time by psycopg's ``write_row`` (a chunk's staging
    has 30 fields a row). Types: ``int8``, ``int4``, ``int2`` (numpy arrays or ints, no NULL), ``bytea``,
    ``text``, ``jsonb`` (None for NULL; text and JSON encoded as psycopg encodes them). The fixed-width columns
    (the integers, and ``bytea`` whose values all have one width) come first in the COPY's column list, each
    block of them one numpy structured array; each row's other fields follow it."""
    rows = len(columns[0][2]) if columns else 0
    if any(len(values) != rows for _, _, values in columns):
        raise ValueError("every column of copy_in_columns needs one value per row")
    fixed, variable = [], []
    for name, kind, values in columns:
        width = _fixed_width(kind, values)
        (fixed if width else variable).append((name, kind, values, width))
    dtype = np.dtype([("fields", ">i2")] + [field for at, (_, kind, _, width) in enumerate(fixed) for field in (
        (f"length{at}", ">i4"), (f"value{at}", _INTEGERS.get(kind, f"V{width}")))])
    encoding = connection.connection.dbapi_connection.info.encoding
    encoding = "utf-8" if encoding == "ascii" else encoding  # SQL_ASCII: psycopg's text dumper writes UTF-8 there
    encoders = [_encoder(kind, encoding) for _, kind, _, _ in variable]
    names = ", ".join(name for name, *_ in fixed + variable)
    cursor = connection.connection.dbapi_connection.cursor()
    with cursor.copy(f"COPY {table} ({names}) FROM STDIN (FORMAT BINARY)") as copy:
        copy.write(_SIGNATURE + bytes(8))  # no flags, no header extension
        for start in range(0, rows, COLUMN_BLOCK):
            stop = min(rows, start + COLUMN_BLOCK)
            block = np.empty(stop - start, dtype)
            block["fields"] = len(columns)
            for at, (name, kind, values, width) in enumerate(fixed):
                block[f"length{at}"] = width
                part = values[start:stop]
                block[f"value{at}"] = _integers(name, kind, part) if kind in _INTEGERS else \
                    np.frombuffer(b"".join(part), f"V{width}")
            if not variable:
                copy.write(block.tobytes())
                continue
            data, size = block.tobytes(), dtype.itemsize
            fields = [[_NULL if value is None else len(encoded := encode(value)).to_bytes(4, "big") + encoded
                       for value in values[start:stop]] for (_, _, values, _), encode in zip(variable, encoders)]
            copy.write(b"".join(itertools.chain.from_iterable(zip(
                (data[at:at + size] for at in range(0, len(data), size)), *fields))))
        copy.write(_TRAILER)


def _integers(name: str, kind: str, values: Sequence) -> np.ndarray:
    """``values`` of integer column ``name`` as an array that assigns to ``kind``'s field unchanged: numpy would
    wrap a value out of its range (2**40 into an ``int4``) and truncate a float, where psycopg's ``write_row``
    refuses both."""
    array = np.asarray(values)
    if not len(array):
        return array.astype(np.int64)
    if array.dtype.kind not in "iu":
        raise TypeError(f"column {name} ({kind}) takes integers, not {array.dtype} values")
    limits = np.iinfo(_INTEGERS[kind].lstrip(">"))
    if int(array.min()) < limits.min or int(array.max()) > limits.max:
        raise OverflowError(f"column {name} ({kind}) holds a value outside [{limits.min}, {limits.max}]")
    return array


def _fixed_width(kind: str, values: Sequence) -> int | None:
    """The width of every value of a column written as fixed-width fields, or None."""
    if kind in _INTEGERS:
        return int(_INTEGERS[kind][-1])
    if kind == "bytea" and len(values) and all(value is not None for value in values):
        widths = {len(value) for value in values}
        return widths.pop() if len(widths) == 1 and 0 not in widths else None
    return None


def _encoder(kind: str, encoding: str):
    """A value of a variable-width column as its binary COPY field's bytes."""
    if kind == "bytea":
        return bytes
    if kind == "text":
        return lambda value: value.encode(encoding)
    if kind == "jsonb":
        return _jsonb
    raise ValueError(f"copy_in_columns writes no {kind!r} column")


def _jsonb(value) -> bytes:
    """A ``jsonb`` field: version 1, then the text, as psycopg's Jsonb dumper writes it (``json.dumps``, UTF-8)."""
    return b"\x01" + json.dumps(value).encode("utf-8")


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


# -- a bigint[] parameter ---------------------------------------------------------------------------------

class Int8Array:
    """int64 values sent as one ``bigint[]`` parameter in PostgreSQL's binary array format (see
    :func:`int8_array`)."""

    __slots__ = ("values",)

    def __init__(self, values: np.ndarray) -> None:
        self.values = values

    def __len__(self) -> int:
        return len(self.values)

    def __repr__(self) -> str:  # as an error or a log names a statement's parameters: short, whatever the length
        shown = ", ".join(map(str, self.values[:5].tolist()))
        return f"int8_array([{shown}{', ...' if len(self.values) > 5 else ''}], {len(self.values)} values)"


def int8_array(values: Sequence[int] | np.ndarray) -> Int8Array:
    """``values`` (int64, one dimension) as a ``bigint[]`` statement parameter, encoded by numpy: psycopg's own
    dumper writes a list of ints as text through a regular expression per element, about 0.7 microseconds each
    (a batch of 1,000 lookups sends 15,000 keys and its matches' ids: a quarter of the client's CPU), and the
    server parses that text again."""
    array = np.asarray(values)
    if array.ndim != 1:
        raise ValueError(f"a bigint[] parameter takes one dimension, not {array.ndim}")
    if array.size and array.dtype.kind not in "iu":  # floats would truncate, objects are beyond int64
        raise TypeError(f"a bigint[] parameter takes integers within int64, not {array.dtype} values")
    if array.dtype.kind == "u" and array.size and array.max() > np.iinfo(np.int64).max:
        raise OverflowError(f"a bigint[] parameter takes integers within int64, not {int(array.max())}")
    return Int8Array(array.astype(np.int64, copy=False))


class _Int8ArrayDumper(Dumper):
    """:class:`Int8Array` in the binary format of ``array_recv``: dimensions, flags, element type, then each
    dimension's length and lower bound, then each element's length and big-endian value (none of them NULL)."""

    format = Format.BINARY
    oid = 1016  # bigint[]

    def dump(self, obj: Int8Array) -> bytes:
        values = obj.values
        if not len(values):
            return _ARRAY_HEADER.pack(0, 0, _INT8_OID)
        elements = np.empty(len(values), dtype=[("length", ">i4"), ("value", ">i8")])
        elements["length"] = 8
        elements["value"] = values
        return _ARRAY_HEADER.pack(1, 0, _INT8_OID) + _DIMENSION.pack(len(values), 1) + elements.tobytes()


class _Int8ArrayTextDumper(Dumper):
    """:class:`Int8Array` as the text of an array, ``{1,-2,3}``: for a statement whose parameters psycopg binds
    into its text on this side (a ``COPY (...) TO STDOUT``, :func:`copy_out`, takes no server-side ones)."""

    format = Format.TEXT
    oid = 1016  # bigint[]

    def dump(self, obj: Int8Array) -> bytes:
        return ("{" + ",".join(map(str, obj.values.tolist())) + "}").encode()


_INT8_OID = 20
_ARRAY_HEADER = struct.Struct(">iiI")
_DIMENSION = struct.Struct(">ii")
# every connection made from here on (each copies psycopg's global adapters when it opens) sends Int8Array so:
# in binary where the server binds it (the last dumper registered is the one %s takes), as text where psycopg
# binds it into the statement; nothing else is an Int8Array, so no other parameter changes
psycopg.adapters.register_dumper(Int8Array, _Int8ArrayTextDumper)
psycopg.adapters.register_dumper(Int8Array, _Int8ArrayDumper)
