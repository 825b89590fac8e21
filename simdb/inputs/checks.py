"""What every record must be before simdb stores it, whatever file it came from.

A text or an id is a string PostgreSQL can store: no NUL character, no unpaired surrogate (a
JSON ``"\\ud800"`` decodes to one, and UTF-8 cannot encode it), and a text is not only
whitespace; an id is at most ``MAX_ID_BYTES`` bytes of UTF-8 (checked beside the text's size, in
``ingest.size_checked``, which every ingest and check passes), and a file's columns have distinct names. Metadata is what ``jsonb`` can
store: no NUL, no unpaired surrogate, no NaN or infinite number.
"""

from __future__ import annotations

import json
import math
import re
from contextlib import contextmanager

from ..errors import InputError, Row

_SURROGATE = re.compile("[\ud800-\udfff]")
_ROW = re.compile(r"(.*), row (\d+)", re.S)


def check_string(value: str, path: str | None, line: int | None, what: str) -> str:
    if "\x00" in value:
        raise InputError(f"the {what} contains a NUL character, which PostgreSQL cannot store",
                         path=path, line=line, hint="remove NUL bytes from the input")
    surrogate = _SURROGATE.search(value)
    if surrogate:
        raise InputError(f"the {what} contains an unpaired surrogate U+{ord(surrogate.group()):04X} at character "
                         f"{surrogate.start() + 1:,}, which UTF-8 cannot encode", path=path, line=line,
                         hint="fix the escape sequence (a \\ud800-\\udfff escape must be half of a pair)")
    return value


#: The longest external id, in bytes of UTF-8. PostgreSQL indexes ids with a B-tree (``ix_documents_external_id``,
#: the only index that holds them), whose entry must fit in a third of a page: 2,704 bytes with the default 8 kB
#: pages, of an id that does not compress. An id over it failed its whole chunk; this limit keeps well below it.
MAX_ID_BYTES = 1_000


def check_id_size(external_id: str, path: str | None, line: int | None) -> str:
    """The id, if PostgreSQL can index it (see ``MAX_ID_BYTES``)."""
    size = len(external_id.encode("utf-8", "surrogatepass"))
    if size > MAX_ID_BYTES:
        raise InputError(f"the id is {size:,} bytes of UTF-8, over the limit of {MAX_ID_BYTES:,}", path=path,
                         line=line, hint="give the document a shorter id (a hash of a long one, for instance)")
    return external_id


def check_text(text: object, path: str | None, line: int | None, what: str = "text") -> str:
    if not isinstance(text, str):
        raise InputError(f"the {what} must be a string, not {type(text).__name__}", path=path, line=line)
    check_string(text, path, line, what)
    if what == "text" and not text.strip():
        raise InputError("the text is empty or only whitespace", path=path, line=line,
                         hint="drop the document or give it text")
    return text


def external_id(value: object, id_field: str, path: str | None, line: int | None) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        shown = json.dumps(value) if isinstance(value, (type(None), float, list, dict)) else repr(value)
        raise InputError(f"the id field {id_field!r} must be a string or an integer, not {shown}",
                         path=path, line=line)
    text = str(value)
    if not text.strip():
        raise InputError(f"the id field {id_field!r} is empty", path=path, line=line)
    return check_string(text, path, line, what="id")


def distinct_columns(names: list[str], what: str, path: str, line: int | None) -> None:
    """Refuse a header (or a Parquet schema) that names a column twice: a record would keep only one of them."""
    first_at: dict[str, int] = {}
    for column, name in enumerate(names, 1):
        if name in first_at:
            raise InputError(f"the {what} names the column {name!r} twice (columns {first_at[name]} and {column})",
                             path=path, line=line, hint="give every column its own name")
        first_at[name] = column


class RepeatedName(ValueError):
    """A JSON object that names a field twice (raised while parsing, caught at the record's line)."""


def distinct_names(pairs: list[tuple[str, object]]) -> dict:
    """``json.loads``'s object hook: the object, refused when it names a field twice. JSON readers keep one of
    the values, which one depending on the reader (Python's keeps the last; PostgreSQL's ``jsonb`` too, its
    ``json`` both), so the text sketched, the id stored or the metadata kept would be a guess."""
    record = dict(pairs)
    if len(record) != len(pairs):
        seen: set[str] = set()
        for name, _ in pairs:
            if name in seen:
                raise RepeatedName(f"the JSON object names the field {name!r} twice")
            seen.add(name)
    return record


@contextmanager
def about(external_id: str):
    """An input error raised inside is about the record with this id, which a reject keeps."""
    try:
        yield
    except InputError as error:
        if error.external_id is None:
            error.external_id = external_id
        raise


def metadata(record: dict, id_field: str | None, text_field: str | None, path: str | None, line: int | None) -> dict:
    """The record's other fields, checked to be storable as ``jsonb``."""
    found = {k: v for k, v in record.items() if k not in (id_field, text_field)}
    if not found:
        return found
    try:
        encoded = json.dumps(found, ensure_ascii=False, allow_nan=False)
        encoded.encode("utf-8")
    except ValueError as exc:  # NaN or an infinite float (UnicodeEncodeError is a ValueError too)
        if isinstance(exc, UnicodeEncodeError):
            raise InputError("a metadata field contains an unpaired surrogate, which UTF-8 cannot encode",
                             path=path, line=line, hint="fix the escape sequence in the input") from None
        raise InputError("a metadata field holds NaN or an infinite number, which JSON cannot store",
                         path=path, line=line, hint="write such values as strings or null") from None
    if "\\u0000" in encoded or "\x00" in encoded:
        raise InputError("a metadata field contains a NUL character, which PostgreSQL cannot store",
                         path=path, line=line, hint="remove NUL characters from the input")
    return found


def repeated_id(external_id: str, origin: str, first: str) -> InputError:
    """An id that a batch holds twice; ``origin`` is where the second one is (``Document.origin``), ``first``
    says where the first one is."""
    return _about(external_id, origin, f"id {external_id!r} appears twice in this batch ({first})",
                  "ids must be unique; fix or drop one of them")


def stored_with_another_text(external_id: str, origin: str, batch: str) -> InputError:
    """An id already stored (in ``batch``) with a text other than the record's."""
    return _about(external_id, origin, f"id {external_id!r} is already stored with a different text (batch {batch!r})",
                  "give the new document a new id, or remove the old one with simdb remove")


def _about(external_id: str, origin: str, message: str, hint: str) -> InputError:
    """An error about one record at its origin: ``path:line``, ``path, row N`` (Parquet), a path (a text file), or
    ``document 'id'``."""
    path, _, line = origin.rpartition(":")
    in_table = _ROW.fullmatch(origin)
    if in_table:
        error = InputError(message, path=in_table.group(1), line=Row(in_table.group(2)), hint=hint)
    elif path and line.isdigit():
        error = InputError(message, path=path, line=int(line), hint=hint)
    elif origin.startswith("document "):
        error = InputError(message, hint=hint)  # given through the API: the id in the message says which
    else:
        error = InputError(message, path=origin, hint=hint)
    error.external_id = external_id
    return error


def finite_float(text: str) -> float:
    """``json.loads``'s float parser, refusing numbers too large for a double (1e400 would be infinity)."""
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"the number {text[:40]} is too large for a double")
    return value


def no_constant(name: str):
    """``json.loads``'s parser for NaN, Infinity and -Infinity, which JSON does not have."""
    raise ValueError(f"{name} is not a JSON value")
