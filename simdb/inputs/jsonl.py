"""JSON-lines files -> records: one JSON object per line; blank lines are skipped.

A line is a record or a reject, never more: malformed JSON, a value that is not an object, an object
that names a field twice (at any depth: which value a reader keeps is the reader's choice), NaN
or Infinity (not JSON), a number too large for a double or an integer of more than 4,300 digits,
nesting too deep to parse, a missing id or text field, or a value PostgreSQL cannot store.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

from ..errors import InputError
from . import checks
from .lines import StreamError, decode, raw_lines
from .model import Document

_DECODER = json.JSONDecoder(parse_float=checks.finite_float, parse_constant=checks.no_constant,
                            object_pairs_hook=checks.distinct_names)


def json_object(raw: bytes, path: str, line: int) -> dict | None:
    """The JSON object on one line, or None for a blank line."""
    content = decode(raw, path, line).rstrip("\r\n")
    if not content.strip():
        return None
    try:
        record = _DECODER.decode(content)
    except json.JSONDecodeError as exc:
        raise InputError(f"malformed JSON at column {exc.colno}: {exc.msg.removesuffix(' at')}", path=path,
                         line=line, hint="each line must be one JSON object") from None
    except checks.RepeatedName as exc:
        raise InputError(str(exc), path=path, line=line,
                         hint="give every field its own name (JSON readers keep only one of them)") from None
    except RecursionError:
        raise InputError("the JSON is nested too deeply to read", path=path, line=line,
                         hint="flatten the record (at most a few hundred levels of nesting)") from None
    except ValueError as exc:  # NaN / Infinity, a float overflowing a double, an integer of > 4,300 digits
        raise InputError(f"unreadable JSON number: {exc}", path=path, line=line,
                         hint="write such values as strings") from None
    if not isinstance(record, dict):
        raise InputError(f"expected a JSON object, got {type(record).__name__}", path=path, line=line)
    return record


def json_records(path: str) -> Iterator[tuple[int, dict]]:
    """(line number, object) for every non-blank line of a JSON-lines file (``.gz`` read through gzip)."""
    for line, raw in raw_lines(path):
        record = json_object(raw, path, line)
        if record is not None:
            yield line, record


def _missing(field_name: str, role: str, available, path: str, line: int, flag: str) -> InputError:
    names = ", ".join(repr(n) for n in available) or "none"
    return InputError(f"no {role} field {field_name!r} (fields: {names})", path=path, line=line,
                      hint=f"name the {role} field with {flag}")


def _document(raw: bytes, path: str, line: int, id_field: str, text_field: str) -> Document | None:
    record = json_object(raw, path, line)
    if record is None:
        return None
    if id_field not in record:
        raise _missing(id_field, "id", record, path, line, "«id_field»")
    external_id = checks.external_id(record[id_field], id_field, path, line)
    with checks.about(external_id):
        if text_field not in record:
            raise _missing(text_field, "text", record, path, line, "«text_field»")
        return Document(external_id, checks.check_text(record[text_field], path, line),
                        checks.metadata(record, id_field, text_field, path, line), path, line)


def read_jsonl(path: str, id_field: str, text_field: str, skip_errors: bool = False,
               progress: Callable[[int], None] | None = None) -> Iterator[Document | InputError]:
    try:
        for line, raw in raw_lines(path, progress):
            try:
                document = _document(raw, path, line, id_field, text_field)
            except InputError as error:
                if not skip_errors:
                    raise
                yield error
                continue
            if document is not None:
                yield document
    except StreamError as error:
        if not skip_errors:
            raise
        yield error
