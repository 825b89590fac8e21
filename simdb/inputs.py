"""Input files -> documents, with every problem reported by file and line.

Formats: ``jsonl`` (one JSON object per line), ``csv`` and ``tsv`` (a header
row, then one document per row), ``txt`` (the whole file is one document whose
id is the path as given). A ``.gz`` suffix is read through gzip. The format is
told from the file name unless given.

Fields other than the id and the text are kept as the document's metadata.
"""

from __future__ import annotations

import csv
import gzip
import json
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .errors import InputError

FORMATS = ("jsonl", "csv", "tsv", "txt")
_SUFFIXES = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".csv": "csv", ".tsv": "tsv",
             ".tab": "tsv", ".txt": "txt", ".text": "txt"}


@dataclass(frozen=True)
class Document:
    external_id: str
    text: str
    metadata: dict = field(default_factory=dict)
    path: str | None = None
    line: int | None = None

    @property
    def origin(self) -> str:
        if self.path is None:
            return f"document {self.external_id!r}"
        return f"{self.path}:{self.line}" if self.line is not None else self.path


def detect_format(path: str) -> str:
    name = path[:-3] if path.endswith(".gz") else path
    fmt = _SUFFIXES.get(Path(name).suffix.lower())
    if fmt is None:
        raise InputError("cannot tell the format from the file name", path=path,
                         hint=f"pass --format with one of {', '.join(FORMATS)}")
    return fmt


def check_paths(paths: Iterable[str]) -> None:
    """Fail before reading anything if an input file is missing."""
    for path in paths:
        p = Path(path)
        if not p.exists():
            raise InputError("no such file", path=path, hint="check the path")
        if not p.is_file():
            raise InputError("not a regular file", path=path, hint="give files, not directories")


def check_text(text: object, path: str | None, line: int | None, what: str = "text") -> str:
    if not isinstance(text, str):
        raise InputError(f"the {what} must be a string, not {type(text).__name__}", path=path, line=line)
    if "\x00" in text:
        raise InputError(f"the {what} contains a NUL character, which PostgreSQL cannot store",
                         path=path, line=line, hint="remove NUL bytes from the input")
    if what == "text" and not text.strip():
        raise InputError("the text is empty or only whitespace", path=path, line=line,
                         hint="drop the document or give it text")
    return text


def _decode(raw: bytes, path: str, line: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"invalid UTF-8 (byte {raw[exc.start]:#04x} at offset {exc.start} of the line)",
                         path=path, line=line, hint="re-encode the file as UTF-8") from None


def _raw_lines(path: str, progress: Callable[[int], None] | None) -> Iterator[tuple[int, bytes]]:
    """(line number, raw line) pairs; ``progress`` gets the bytes of the file on disk consumed so far."""
    with open(path, "rb") as disk:
        stream = gzip.GzipFile(fileobj=disk) if path.endswith(".gz") else disk
        last = 0
        for number, raw in enumerate(stream, 1):
            yield number, raw
            if progress is not None:
                position = disk.tell()
                progress(position - last)
                last = position


def _external_id(value: object, id_field: str, path: str, line: int) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise InputError(f"the id field {id_field!r} must be a string or an integer, not {json.dumps(value)}",
                         path=path, line=line)
    text = str(value)
    if not text.strip():
        raise InputError(f"the id field {id_field!r} is empty", path=path, line=line)
    check_text(text, path, line, what="id")
    return text


def _metadata(record: dict, id_field: str, text_field: str, path: str, line: int) -> dict:
    metadata = {k: v for k, v in record.items() if k not in (id_field, text_field)}
    if metadata and "\\u0000" in json.dumps(metadata):
        raise InputError("a metadata field contains a NUL character, which PostgreSQL cannot store",
                         path=path, line=line, hint="remove NUL characters from the input")
    return metadata


def _missing(field_name: str, role: str, available: Iterable[str], path: str, line: int, flag: str) -> InputError:
    names = ", ".join(repr(n) for n in available) or "none"
    return InputError(f"no {role} field {field_name!r} (fields: {names})", path=path, line=line,
                      hint=f"name the {role} field with {flag}")


def _json_record(raw: bytes, path: str, line: int) -> dict | None:
    """The JSON object on one line, or None for a blank line."""
    content = _decode(raw, path, line).rstrip("\r\n")
    if not content.strip():
        return None
    try:
        record = json.loads(content)
    except json.JSONDecodeError as exc:
        raise InputError(f"malformed JSON at column {exc.colno}: {exc.msg.removesuffix(' at')}", path=path,
                         line=line, hint="each line must be one JSON object") from None
    if not isinstance(record, dict):
        raise InputError(f"expected a JSON object, got {type(record).__name__}", path=path, line=line)
    return record


def json_records(path: str) -> Iterator[tuple[int, dict]]:
    """(line number, object) for every non-blank line of a JSON-lines file (``.gz`` read through gzip)."""
    for line, raw in _raw_lines(path, None):
        record = _json_record(raw, path, line)
        if record is not None:
            yield line, record


def _jsonl_document(raw: bytes, path: str, line: int, id_field: str, text_field: str) -> Document | None:
    record = _json_record(raw, path, line)
    if record is None:
        return None
    if id_field not in record:
        raise _missing(id_field, "id", record, path, line, "--id-field")
    if text_field not in record:
        raise _missing(text_field, "text", record, path, line, "--text-field")
    return Document(_external_id(record[id_field], id_field, path, line), check_text(record[text_field], path, line),
                    _metadata(record, id_field, text_field, path, line), path, line)


def read_jsonl(path: str, id_field: str, text_field: str, skip_errors: bool = False,
               progress: Callable[[int], None] | None = None) -> Iterator[Document | InputError]:
    for line, raw in _raw_lines(path, progress):
        try:
            document = _jsonl_document(raw, path, line, id_field, text_field)
        except InputError as error:
            if not skip_errors:
                raise
            yield error
            continue
        if document is not None:
            yield document


def read_delimited(path: str, id_field: str, text_field: str, delimiter: str, skip_errors: bool = False,
                   progress: Callable[[int], None] | None = None) -> Iterator[Document | InputError]:
    bad_lines: list[InputError] = []  # lines the csv module must not see, reported in order

    def checked_lines() -> Iterator[str]:
        for line, raw in _raw_lines(path, progress):
            try:
                content = _decode(raw, path, line)
                if "\x00" in content:
                    raise InputError("the line contains a NUL character, which PostgreSQL cannot store",
                                     path=path, line=line, hint="remove NUL bytes from the input")
            except InputError as error:
                if not skip_errors or line == 1:
                    raise
                bad_lines.append(error)
                content = "\n"
            yield content

    reader = csv.reader(checked_lines(), delimiter=delimiter)
    try:
        header = next(reader)
    except StopIteration:
        return
    for name in (id_field, text_field):
        if name not in header:
            role, flag = ("id", "--id-field") if name == id_field else ("text", "--text-field")
            raise _missing(name, role, header, path, 1, flag)
    start = reader.line_num + 1
    try:
        for row in reader:
            line = start
            start = reader.line_num + 1
            yield from bad_lines
            bad_lines.clear()
            if not row:
                continue
            try:
                if len(row) != len(header):
                    raise InputError(f"{len(row)} fields where the header has {len(header)}", path=path, line=line,
                                     hint="quote fields that contain the delimiter")
                record = dict(zip(header, row))
                yield Document(_external_id(record[id_field], id_field, path, line),
                               check_text(record[text_field], path, line),
                               _metadata(record, id_field, text_field, path, line), path, line)
            except InputError as error:
                if not skip_errors:
                    raise
                yield error
    except csv.Error as exc:
        kind = "TSV" if delimiter == "\t" else "CSV"
        raise InputError(f"malformed {kind}: {exc}", path=path, line=reader.line_num) from None
    yield from bad_lines


def read_txt(path: str, progress: Callable[[int], None] | None = None) -> Iterator[Document]:
    with (gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")) as stream:
        raw = stream.read()
    if progress is not None:
        progress(os.path.getsize(path))
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise InputError(f"invalid UTF-8 (byte {raw[exc.start]:#04x})", path=path, line=line,
                         hint="re-encode the file as UTF-8") from None
    if "\x00" in text:
        line = text.count("\n", 0, text.index("\x00")) + 1
        raise InputError("the text contains a NUL character, which PostgreSQL cannot store",
                         path=path, line=line, hint="remove NUL bytes from the input")
    yield Document(path, check_text(text, path, None), {}, path, None)


def read_documents(paths: Iterable[str], *, format: str | None = None, id_field: str = "id",
                   text_field: str = "text", skip_errors: bool = False,
                   progress: Callable[[int], None] | None = None) -> Iterator[Document | InputError]:
    """Documents from ``paths`` in order.

    A bad record raises :class:`InputError`; with ``skip_errors`` it is yielded
    instead (and reading goes on), except for problems that make the rest of a
    file unreadable (a missing header field, a broken CSV quote). ``progress``
    is called with the bytes of input consumed, for a progress bar.
    """
    paths = list(paths)
    check_paths(paths)
    if format is not None and format not in FORMATS:
        raise InputError(f"unknown format {format!r}", hint=f"choose one of {', '.join(FORMATS)}")
    formats = [format or detect_format(path) for path in paths]
    for path, fmt in zip(paths, formats):
        if fmt == "jsonl":
            yield from read_jsonl(path, id_field, text_field, skip_errors, progress)
        elif fmt == "txt":
            try:
                yield from read_txt(path, progress)
            except InputError as error:
                if not skip_errors:
                    raise
                yield error
        else:
            yield from read_delimited(path, id_field, text_field, "," if fmt == "csv" else "\t", skip_errors, progress)


def total_bytes(paths: Iterable[str]) -> int:
    return sum(os.path.getsize(path) for path in paths)
