"""Parquet files -> records, streamed batch by batch through pyarrow, every problem reported at its row.

A row is said as ``path, row N``, counted from 1 over the whole file (:class:`~simdb.errors.Row`;
the rejects' and verdicts' ``line`` holds N). The id column is an integer or a string column
(ids become strings, as in JSON lines), the text column a string column (``large_string`` and
dictionary-encoded strings too); every other column is metadata, converted to what JSON can hold:
timestamps, dates and times as ISO 8601 text as Arrow writes it (``2024-05-01 12:00:00.250``, a
zone as ``Z`` or ``+0200``), decimals as their exact text, durations as their count in the column's
unit, binary as hex, NaN as null, lists as arrays, structs as objects, maps as ``[key, value]`` pairs;
pandas' stored index (``__index_level_0__``) is left out. A NULL id or text, a text PostgreSQL cannot
store, or invalid UTF-8 rejects its row.

A problem with the whole file is an error even when records are skipped, and is found before anything
is read (:func:`check_parquet`): not a Parquet file, a file cut short (its footer is at the end), no id
or text column, or a column of a type that cannot be an id or a text. A row group that cannot be read
(a damaged page: pages written with checksums are checked) is an error at its first row not yet
read; skipped, each of those rows is a reject that names the row group's rows, and reading goes on
with the next row group.

Memory stays flat in the file's size: one batch of rows at a time (about ``BATCH_BYTES`` of
uncompressed data), its pages read through a small buffer.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

from ..errors import InputError, Row
from . import checks
from .model import Document

BATCH_BYTES = 8 << 20  # uncompressed bytes of one batch of rows, by the row groups' own sizes
MAX_BATCH_ROWS = 16_384
_READ_BUFFER = 1 << 20  # pages are read through a buffer of this size, not a whole column chunk at once
_MAGIC = b"PAR1"
_UNREADABLE = "write strings as valid UTF-8, and values as types JSON can hold"


def _pyarrow():
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError:
        raise InputError("reading Parquet needs pyarrow, which is not installed",
                         hint="pip install 'simdb[parquet]' (or pyarrow)") from None
    return pyarrow, pyarrow.parquet


def _first_line(error: Exception, limit: int = 200) -> str:
    text = (str(error).strip().splitlines() or [type(error).__name__])[0]
    return text if len(text) <= limit else text[:limit - 3] + "..."


def open_parquet(path: str):
    """The file's :class:`pyarrow.parquet.ParquetFile`, or an error saying why it cannot be one."""
    pa, pq = _pyarrow()
    if path.endswith((".gz", ".zst")):
        raise InputError("a Parquet file is read as it is, not through gzip or zstd", path=path,
                         hint="decompress it first (Parquet compresses its pages itself)")
    with open(path, "rb") as disk:
        head = disk.read(4)
        disk.seek(max(0, os.path.getsize(path) - 4))
        tail = disk.read(4)
    if head != _MAGIC:
        what = "is empty" if not head else "does not begin with PAR1"
        raise InputError(f"not a Parquet file: it {what}", path=path,
                         hint="check the file, or give its format with «format»")
    if tail == b"PARE":
        raise InputError("an encrypted Parquet file, which simdb cannot read", path=path,
                         hint="decrypt it first")
    if tail != _MAGIC:
        raise InputError("the Parquet file is cut short: it has no footer (a Parquet file ends with PAR1)",
                         path=path, hint="the file is truncated: copy it again")
    try:
        file = pq.ParquetFile(path, buffer_size=_READ_BUFFER, pre_buffer=False, page_checksum_verification=True)
        file.schema_arrow  # noqa: B018  (its names are decoded here)
    except (pa.ArrowException, OSError, ValueError) as exc:  # UnicodeDecodeError: a damaged name
        raise InputError(f"the Parquet footer cannot be read ({_first_line(exc)})", path=path,
                         hint="the file is damaged: copy it again") from None
    problem = _footer_problem(file.metadata)
    if problem:
        raise InputError(f"the Parquet footer contradicts itself: {problem}", path=path,
                         hint="the file is damaged: copy it again")
    return file


def _footer_problem(metadata) -> str | None:
    """Row counts in the footer that disagree: the footer has no checksum, and a damaged count would lose rows
    silently or number every later row wrong. (Each column chunk's count is not compared: pyarrow aborts the
    process on some damaged column chunk metadata when Python asks for it; reading reports the same damage as
    an error, and a group that gives fewer rows than it has is damaged: see :func:`_batches`.)"""
    total = sum(metadata.row_group(group).num_rows for group in range(metadata.num_row_groups))
    if total != metadata.num_rows:
        return f"its row groups hold {total:,} rows, but it says {metadata.num_rows:,}"
    return None


def _is_string(pa, type_) -> bool:
    if pa.types.is_dictionary(type_):
        type_ = type_.value_type
    return (pa.types.is_string(type_) or pa.types.is_large_string(type_)
            or getattr(pa.types, "is_string_view", lambda _: False)(type_))


def check_parquet(path: str, id_field: str, text_field: str) -> list[str]:
    """Fail if the file cannot be read or has no usable id and text columns; else its metadata columns."""
    pa, _ = _pyarrow()
    schema = open_parquet(path).schema_arrow
    names = schema.names
    checks.distinct_columns(names, "schema", path, None)
    for name, role, flag in ((id_field, "id", "«id_field»"), (text_field, "text", "«text_field»")):
        if name not in names:
            listed = ", ".join(repr(n) for n in names) or "none"
            raise InputError(f"no {role} column {name!r} (columns: {listed})", path=path,
                             hint=f"name the {role} column with {flag}")
    id_type = schema.field(id_field).type
    plain = id_type.value_type if pa.types.is_dictionary(id_type) else id_type
    if not (pa.types.is_integer(plain) or _is_string(pa, id_type)):
        hint = "write the ids as integers or strings"
        if pa.types.is_floating(plain):
            hint += " (pandas turns integers with missing values into floats: use its Int64 type)"
        raise InputError(f"the id column {id_field!r} holds {id_type}, not integers or strings", path=path,
                         hint=hint)
    text_type = schema.field(text_field).type
    if not (_is_string(pa, text_type) or pa.types.is_null(text_type)):
        raise InputError(f"the text column {text_field!r} holds {text_type}, not strings", path=path,
                         hint="write the texts as a string (UTF-8) column")
    index = {name for name in (schema.pandas_metadata or {}).get("index_columns", []) if isinstance(name, str)}
    return [name for name in names if name not in (id_field, text_field) and name not in index]


# -- Arrow values -> JSON values ------------------------------------------------------------------------------

def _json_type(pa, type_):
    """The type to cast a column to before it becomes Python values JSON can hold (None: keep it)."""
    if pa.types.is_dictionary(type_):
        return _json_type(pa, type_.value_type) or type_.value_type
    if pa.types.is_timestamp(type_) or pa.types.is_date(type_) or pa.types.is_time(type_) or \
            pa.types.is_decimal(type_):
        return pa.string()
    if pa.types.is_duration(type_):
        return pa.int64()
    if pa.types.is_list(type_) or pa.types.is_large_list(type_) or pa.types.is_fixed_size_list(type_):
        inner = _json_type(pa, type_.value_type)
        return None if inner is None else pa.list_(inner)
    if pa.types.is_struct(type_):
        fields = [type_.field(i) for i in range(type_.num_fields)]
        inner = [_json_type(pa, field.type) for field in fields]
        if all(t is None for t in inner):
            return None
        return pa.struct([field.with_type(t or field.type) for field, t in zip(fields, inner)])
    if pa.types.is_map(type_):
        key, item = _json_type(pa, type_.key_type), _json_type(pa, type_.item_type)
        return None if key is None and item is None else pa.map_(key or type_.key_type, item or type_.item_type)
    return None


def _needs_python(pa, type_) -> bool:
    """Whether a (cast) column's Python values still need :func:`_json_value` (floats, bytes, the rest)."""
    if pa.types.is_integer(type_) or pa.types.is_boolean(type_) or pa.types.is_null(type_) or _is_string(pa, type_):
        return False
    if pa.types.is_list(type_) or pa.types.is_large_list(type_) or pa.types.is_fixed_size_list(type_):
        return _needs_python(pa, type_.value_type)
    if pa.types.is_struct(type_):
        return any(_needs_python(pa, type_.field(i).type) for i in range(type_.num_fields))
    return True  # floats, binary, maps (their Python values are tuples), and what has no JSON value


def _json_value(value):
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return None if value != value else value  # NaN: pandas' missing value; infinities are rejected later
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, dict):
        return {str(key): _json_value(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_value(item) for item in value]
    return str(value)  # what JSON has no value for (an interval, a UUID, a union's odd member): its text


def _python(pa, array, name: str, problems: dict[int, str]) -> list:
    """The column's values for JSON; a value that cannot be read is None, its problem in ``problems`` by index."""
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    target = _json_type(pa, array.type)
    if target is not None:
        try:
            array = array.cast(target)
        except (pa.ArrowException, ValueError):
            pass  # left as it is: its Python values go through _json_value
    try:
        values = array.to_pylist()
    except (UnicodeDecodeError, ValueError):
        values = []
        for i in range(len(array)):
            try:
                values.append(array[i].as_py())
            except UnicodeDecodeError as exc:
                problems.setdefault(i, f"invalid UTF-8 in column {name!r} (byte {exc.object[exc.start]:#04x} at "
                                       f"offset {exc.start})")
                values.append(None)
            except ValueError as exc:
                problems.setdefault(i, f"the value in column {name!r} cannot be read ({_first_line(exc)})")
                values.append(None)
    if _needs_python(pa, array.type):
        values = [_json_value(value) for value in values]
    return values


# -- reading ---------------------------------------------------------------------------------------------

def _batch_rows(metadata, group: int) -> int:
    row_group = metadata.row_group(group)
    per_row = row_group.total_byte_size / max(1, row_group.num_rows)
    return max(1, min(MAX_BATCH_ROWS, int(BATCH_BYTES / max(1.0, per_row))))


def _batches(path: str, skip_errors: bool, progress: Callable[[int], None] | None
             ) -> Iterator[tuple[int, dict[str, list], dict[int, str]] | InputError]:
    """(first row, values by column, problems by index) per batch; a row group that cannot be read is an error
    at its first row not read, or with ``skip_errors`` one error per row not read."""
    pa, _ = _pyarrow()
    file = open_parquet(path)
    metadata = file.metadata
    size, total, done = os.path.getsize(path), max(1, metadata.num_rows), 0
    reported = 0
    first = 1
    for group in range(metadata.num_row_groups):
        rows = metadata.row_group(group).num_rows
        read = 0
        try:
            for batch in file.iter_batches(batch_size=_batch_rows(metadata, group), row_groups=[group]):
                problems: dict[int, str] = {}
                columns = {name: _python(pa, batch.column(i), name, problems)
                           for i, name in enumerate(batch.schema.names)}
                yield first + read, columns, problems
                read += batch.num_rows
                done += batch.num_rows
                if progress is not None:
                    position = size * done // total
                    progress(position - reported)
                    reported = position
            cause = None if read >= rows else f"it gave {read:,} of its {rows:,} rows"  # a damaged offset does
        except (pa.ArrowException, OSError) as exc:
            cause = None if read >= rows else _first_line(exc)  # every row read: none is missing
        if cause is not None:
            span = f"rows {first}-{first + rows - 1}" if rows > 1 else f"row {first}"
            message = f"row group {group + 1} of {metadata.num_row_groups} ({span}) cannot be read: {cause}"
            hint = "the file is damaged: copy it again"
            if not skip_errors:
                raise InputError(message, path=path, line=Row(first + read), hint=hint)
            for row in range(first + read, first + rows):
                yield InputError(message, path=path, line=Row(row), hint=hint)
            done += rows - read
        first += rows


def read_parquet(path: str, id_field: str, text_field: str, skip_errors: bool = False,
                 progress: Callable[[int], None] | None = None) -> Iterator[Document | InputError]:
    names = check_parquet(path, id_field, text_field)
    for item in _batches(path, skip_errors, progress):
        if isinstance(item, InputError):
            yield item
            continue
        first, columns, problems = item
        ids, texts = columns[id_field], columns[text_field]
        metadata = [(name, columns[name]) for name in names]
        for i, text in enumerate(texts):
            row = Row(first + i)
            try:
                if i in problems:
                    raise InputError(problems[i], path=path, line=row, hint=_UNREADABLE)
                if ids[i] is None:
                    raise InputError(f"the id column {id_field!r} is NULL", path=path, line=row,
                                     hint="give every row an id")
                if text is None:
                    raise InputError(f"the text column {text_field!r} is NULL", path=path, line=row,
                                     hint="drop the row or give it text")
                document = Document(checks.external_id(ids[i], id_field, path, row),
                                    checks.check_text(text, path, row),
                                    checks.metadata({name: values[i] for name, values in metadata}, None, None,
                                                    path, row), path, row)
            except InputError as error:
                if not skip_errors:
                    raise
                yield error
                continue
            yield document


def parquet_records(path: str) -> Iterator[tuple[Row, dict]]:
    """(row, values by column) for every row of a Parquet file, as :func:`read_parquet` reads the metadata;
    a row that cannot be read is an error."""
    for first, columns, problems in _batches(path, False, None):
        names = list(columns)
        for i, values in enumerate(zip(*columns.values())):
            if i in problems:
                raise InputError(problems[i], path=path, line=Row(first + i), hint=_UNREADABLE)
            yield Row(first + i), dict(zip(names, values))
