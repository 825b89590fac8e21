"""CSV and TSV files -> records, by a rule that never merges one record into another.

The rule (docs/cli.md states it for users; tests/test_input_fuzz.py checks it):

1. The first line is the header. Every later record begins at a line. Fields are separated by
   the delimiter; a field that begins with ``"`` is quoted: it ends at the next ``"`` that is not
   doubled (``""`` is a quote inside it), and it may hold the delimiter and line breaks, so a
   record may span lines. A ``"`` anywhere else is an ordinary character.
2. A record is malformed when a quoted field is not closed before the end of the file, or holds
   more than ``max_chars`` characters; when a closing quote is followed by anything but the delimiter or
   the end of its line; when it has another number of fields than the header; or when its lines
   hold invalid UTF-8 or a NUL byte. A header that names a column twice is an error of the whole file.
3. A malformed record is an error at the line where it began. When errors are skipped it becomes
   one reject. If its quotes were sound (a wrong number of fields, bad bytes), the reject names
   the lines it spans and reading goes on after them. If a quote went wrong (never closed, past
   ``max_chars``, or closed by something that is not the delimiter or a line break), where the
   record ends cannot be known, and the likeliest cause is a stray quote: only its first line is
   rejected and reading goes on at the next line, each later line a record of its own, so that a
   stray quote costs one record, not the rest of the file.

Blank lines between records are skipped.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ..errors import InputError
from . import checks
from .lines import StreamError, raw_lines
from .model import Document


@dataclass(frozen=True)
class Line:
    number: int
    content: str  # decoded (invalid bytes as surrogate escapes), without the line break
    newline: str  # the line break as read: "\n", "\r\n" or "" at the end of the file
    bad_utf8: int | None  # offset of the first invalid byte, if any


@dataclass
class Record:
    fields: list[str]
    lines: list[Line]

    @property
    def first(self) -> int:
        return self.lines[0].number

    @property
    def last(self) -> int:
        return self.lines[-1].number


class BadQuote(Exception):
    """A quote that is never closed, runs past the limit, or is closed by something else than the
    delimiter or a line break: where the record ends cannot be known."""

    def __init__(self, message: str, lines: list[Line]) -> None:
        super().__init__(message)
        self.lines = lines


class Malformed(Exception):
    """A record whose quotes are sound but whose content is not (field count, bytes)."""

    def __init__(self, message: str, lines: list[Line]) -> None:
        super().__init__(message)
        self.lines = lines


def _line(number: int, raw: bytes) -> Line:
    body = raw.rstrip(b"\n")
    newline = raw[len(body):].decode("ascii")
    if body.endswith(b"\r") and newline:
        body, newline = body[:-1], "\r" + newline
    try:
        return Line(number, body.decode("utf-8"), newline, None)
    except UnicodeDecodeError as exc:
        return Line(number, body.decode("utf-8", "surrogateescape"), newline, exc.start)


def parse_record(first: Line, more: Callable[[], Line | None], delimiter: str, limit: int) -> Record:
    """Parse the record that begins at ``first``, pulling continuation lines from ``more``."""
    lines = [first]
    text, pos, fields = first.content, 0, []
    while True:  # at the start of a field
        if text.startswith('"', pos):
            opened, column = lines[-1].number, pos + 1
            pos += 1
            parts, size = [], 0  # size: the field's characters so far, as it will be stored
            while True:
                quote = text.find('"', pos)
                if quote < 0:  # the field goes on past this line
                    parts += [text[pos:], lines[-1].newline]
                    size += len(text) - pos + len(lines[-1].newline)
                    if size > limit:
                        raise BadQuote(f"the quoted field opened at line {opened} (column {column}) runs past "
                                        f"{limit:,} characters without its closing quote", lines)
                    line = more() if lines[-1].newline else None
                    if line is None:
                        raise BadQuote(f"the quote opened at line {opened} (column {column}) is never closed", lines)
                    lines.append(line)
                    text, pos = line.content, 0
                    continue
                parts.append(text[pos:quote])
                size += quote - pos
                if text.startswith('"', quote + 1):  # a doubled quote is a quote
                    parts.append('"')
                    size += 1
                    pos = quote + 2
                    continue
                pos = quote + 1
                break
            if size > limit:
                raise BadQuote(f"the quoted field opened at line {opened} (column {column}) is longer than "
                                f"{limit:,} characters", lines)
            fields.append("".join(parts))
            if pos == len(text):
                return Record(fields, lines)
            if text[pos] != delimiter:
                raise BadQuote(f"the closing quote at line {lines[-1].number} (column {pos}) is followed by "
                                f"{text[pos]!r} instead of the delimiter or the end of the line", lines)
            pos += 1
        else:
            end = text.find(delimiter, pos)
            fields.append(text[pos:] if end < 0 else text[pos:end])
            if end < 0:
                return Record(fields, lines)
            pos = end + 1


def _content_problem(record: Record, header_size: int) -> str | None:
    for line in record.lines:
        where = "" if line is record.lines[0] else f" on line {line.number} of the record"
        if line.bad_utf8 is not None:
            raw = line.content.encode("utf-8", "surrogateescape")
            return f"invalid UTF-8 (byte {raw[line.bad_utf8]:#04x} at offset {line.bad_utf8}{where or ' of the line'})"
        if "\x00" in line.content:
            return f"the line{where and ' ' + str(line.number)} contains a NUL character, which PostgreSQL cannot store"
    if len(record.fields) != header_size:
        return f"{len(record.fields)} fields where the header has {header_size}"
    return None


_HINTS = {"invalid UTF-8": "re-encode the file as UTF-8", "fields where": "quote fields that contain the delimiter",
          "NUL": "remove NUL bytes from the input"}


def _error(message: str, path: str, lines: list[Line]) -> InputError:
    hint = next((h for key, h in _HINTS.items() if key in message), None)
    if hint is None:
        hint = "quote fields that hold quotes or line breaks, and double the quotes inside them"
    if len(lines) > 1:
        message += f" (the record spans lines {lines[0].number}-{lines[-1].number})"
    return InputError(message, path=path, line=lines[0].number, hint=hint)


def read_delimited(path: str, id_field: str, text_field: str, delimiter: str, skip_errors: bool = False,
                   max_chars: int = 5_000_000, progress: Callable[[int], None] | None = None
                   ) -> Iterator[Document | InputError]:
    kind = "TSV" if delimiter == "\t" else "CSV"
    source = raw_lines(path, progress)
    pending: deque[Line] = deque()  # lines given back after a record whose end could not be known

    def more() -> Line | None:
        if pending:
            return pending.popleft()
        item = next(source, None)
        return None if item is None else _line(*item)

    try:
        first = more()
        while first is not None and not first.content and first.bad_utf8 is None:  # blank lines
            first = more()
        if first is None:
            return
        try:
            header = parse_record(first, more, delimiter, max_chars)
        except (BadQuote, Malformed) as exc:
            raise InputError(f"malformed {kind} header: {exc}", path=path, line=first.number,
                             hint="the first line must name the fields") from None
        problem = _content_problem(header, len(header.fields))
        if problem:
            raise _error(f"bad {kind} header: {problem}", path, header.lines)
        names = header.fields
        checks.distinct_columns(names, "header", path, header.first)
        for name, role, flag in ((id_field, "id", "«id_field»"), (text_field, "text", "«text_field»")):
            if name not in names:
                listed = ", ".join(repr(n) for n in names) or "none"
                raise InputError(f"no {role} field {name!r} (fields: {listed})", path=path, line=header.first,
                                 hint=f"name the {role} field with {flag}")
        while True:
            line = more()
            if line is None:
                return
            if not line.content and line.bad_utf8 is None:
                continue  # a blank line
            try:
                record = parse_record(line, more, delimiter, max_chars)
                problem = _content_problem(record, len(names))
                if problem:
                    raise Malformed(problem, record.lines)
                values = dict(zip(names, record.fields))
                external_id = checks.external_id(values[id_field], id_field, path, record.first)
                with checks.about(external_id):
                    document = Document(external_id, checks.check_text(values[text_field], path, record.first),
                                        checks.metadata(values, id_field, text_field, path, record.first),
                                        path, record.first)
            except BadQuote as exc:
                pending.extendleft(reversed(exc.lines[1:]))  # read on at the line after the record's first
                error = _error(str(exc), path, exc.lines[:1])
            except Malformed as exc:
                error = _error(str(exc), path, exc.lines)
            except InputError as exc:
                error = exc
            else:
                yield document
                continue
            if not skip_errors:
                raise error
            yield error
    except StreamError as error:
        if not skip_errors:
            raise
        yield error
