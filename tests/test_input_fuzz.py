"""Input fuzzing: every record of any file is stored once with exactly its text, or rejected; never both.

Hypothesis writes records as JSON lines, CSV, TSV or a text file (any characters: quotes,
delimiters, line breaks, CJK, control characters; sometimes gzip- or zstd-compressed, sometimes with a
byte order mark, CRLF lines or fully quoted fields, ids about the limit of 1,000 bytes, CSV and TSV headers that
name a column twice), then damages the bytes: stray quotes and
delimiters, invalid UTF-8, NUL bytes, deleted and duplicated spans, truncation, another encoding,
huge fields. An oracle, written here independently of simdb's readers, applies the documented
rules (simdb.inputs.delimited for CSV and TSV; one object per line for JSON lines; the whole file
for text) to the damaged bytes and says what each input record is: a document (id and text) or a
reject (at a line). The ingest, with ``on_error="skip"`` and small chunks, must agree record by
record: the ``records`` table's positions, statuses and lines, the stored documents' ids and
exact texts (by their content hash), and the rejects file; ``check`` of the same file, run first,
rejects the same records. Compressed files are also cut short
and damaged after compression: the lines a lenient decompressor recovers are read as the oracle
says, then one reject. Parquet files (NULLs, invalid UTF-8, any row groups, page sizes, encodings
and codecs) are damaged in their pages, their footer, or cut short: every row is read as written
or rejected, a row group that cannot be read is rejected from its first row not read, and a file
whose footer is gone is one error. A SIGKILL test runs large damaged inputs through the CLI, kills
it at random moments and resumes, with the same oracle.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import random
import re
import subprocess
import sys
import time
import uuid
import zlib
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simdb import Index, InputError
from simdb.text import content_hash
from simdb.ingest import IngestOptions
from simdb.inputs import read_documents
from tests.conftest import delete_rows, examples, killed

MAX_CHARS = 300
MAX_ID_BYTES = 1_000  # the documented limit of an id, in bytes of UTF-8
BOM = b"\xef\xbb\xbf"


# -- the oracle ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Expected:
    line: int | None
    external_id: str | None = None  # None: a reject
    text: str | None = None


class FileError(Exception):
    """The whole file is refused (a header without the id or text field, or a bad header)."""


_SURROGATE = re.compile("[\ud800-\udfff]")


def storable(value: str) -> bool:
    return "\x00" not in value and not _SURROGATE.search(value)


def document(external_id, text, metadata, line) -> Expected:
    """A parsed record, or its reject, by the checks every format shares."""
    if isinstance(external_id, bool) or not isinstance(external_id, (str, int)):
        return Expected(line)
    external_id = str(external_id)
    if not external_id.strip() or not storable(external_id) or len(external_id.encode("utf-8")) > MAX_ID_BYTES:
        return Expected(line)
    if not isinstance(text, str) or not text.strip() or not storable(text) or len(text) > MAX_CHARS:
        return Expected(line)
    try:
        encoded = json.dumps(metadata, ensure_ascii=False, allow_nan=False)
        encoded.encode("utf-8")
    except ValueError:
        return Expected(line)
    if "\\u0000" in encoded or "\x00" in encoded:
        return Expected(line)
    return Expected(line, external_id, text)


def oracle_jsonl(data: bytes) -> list[Expected]:
    found = []
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    for number, raw in enumerate(lines, 1):
        if number == 1 and raw.startswith(BOM):
            raw = raw[3:]
        try:
            content = raw.decode("utf-8")
        except UnicodeDecodeError:
            found.append(Expected(number))
            continue
        if not content.rstrip("\r").strip():
            continue
        try:
            def no_constants(name):
                raise ValueError(name)

            def finite(text):
                value = float(text)
                if value in (float("inf"), float("-inf")):
                    raise ValueError(text)
                return value
            record = json.loads(content, parse_constant=no_constants, parse_float=finite)
        except (ValueError, RecursionError):
            found.append(Expected(number))
            continue
        if not isinstance(record, dict) or "id" not in record or "text" not in record:
            found.append(Expected(number))
            continue
        found.append(document(record["id"], record["text"], {k: v for k, v in record.items() if k not in
                                                              ("id", "text")}, number))
    return found


def oracle_delimited(data: bytes, delimiter: str) -> list[Expected]:
    """The CSV/TSV rule, applied with regular expressions to the text from each record's first line on."""
    if data.startswith(BOM):
        data = data[3:]
    pieces = data.split(b"\n")
    lines = []  # (content, newline, bad bytes)
    for i, piece in enumerate(pieces):
        newline = "\n" if i < len(pieces) - 1 else ""
        if i == len(pieces) - 1 and piece == b"":
            break
        if newline and piece.endswith(b"\r"):
            piece, newline = piece[:-1], "\r\n"
        try:
            lines.append((piece.decode("utf-8"), newline, False))
        except UnicodeDecodeError:
            lines.append((piece.decode("utf-8", "surrogateescape"), newline, True))
    quoted = re.compile(r'"((?:[^"]|"")*)"', re.S)
    unquoted = re.compile(f"[^{re.escape(delimiter)}\r\n]*(?:\r(?!\n)[^{re.escape(delimiter)}\r\n]*)*")

    def parse(start: int):
        """(fields, index of the record's last line) or raise LookupError for a quote gone wrong."""
        text = "".join(content + newline for content, newline, _ in lines[start:])
        ends = []  # offsets in text where each line's break starts
        offset = 0
        for content, newline, _ in lines[start:]:
            ends.append(offset + len(content))
            offset += len(content) + len(newline)
        pos, fields = 0, []
        while True:
            if text.startswith('"', pos):
                match = quoted.match(text, pos)
                if not match:
                    raise LookupError("never closed")
                field = match.group(1).replace('""', '"')
                if len(field) > MAX_CHARS:
                    raise LookupError("too long")
                fields.append(field)
                pos = match.end()
                if pos in ends or pos == len(text):
                    return fields, start + next((i for i, end in enumerate(ends) if end >= pos), len(ends) - 1)
                if text[pos] != delimiter:
                    raise LookupError("junk after the quote")
                pos += 1
            else:
                match = unquoted.match(text, pos)
                field = match.group()
                fields.append(field)
                pos = match.end()
                if pos in ends or pos == len(text):
                    return fields, start + next((i for i, end in enumerate(ends) if end >= pos), len(ends) - 1)
                pos += 1  # the delimiter

    index = 0
    while index < len(lines) and lines[index][0] == "" and not lines[index][2]:
        index += 1
    if index == len(lines):
        return []
    try:
        header, last = parse(index)
    except LookupError:
        raise FileError("bad header") from None
    if any(lines[i][2] or "\x00" in lines[i][0] for i in range(index, last + 1)) or \
            "id" not in header or "text" not in header or len(set(header)) < len(header):
        raise FileError("bad header")
    found = []
    index = last + 1
    while index < len(lines):
        content, _, bad = lines[index]
        if content == "" and not bad:
            index += 1
            continue
        try:
            fields, last = parse(index)
        except LookupError:
            found.append(Expected(index + 1))
            index += 1
            continue
        spanned = lines[index:last + 1]
        if any(bad or "\x00" in content for content, _, bad in spanned) or len(fields) != len(header):
            found.append(Expected(index + 1))
        else:
            values = dict(zip(header, fields))
            found.append(document(values["id"], values["text"], {k: v for k, v in values.items()
                                                                 if k not in ("id", "text")}, index + 1))
        index = last + 1
    return found


def oracle_txt(data: bytes, path: str) -> list[Expected]:
    """One document; a reject names the line of the bad byte or NUL, or none for an empty text."""
    if data.startswith(BOM):
        data = data[3:]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return [Expected(data.count(b"\n", 0, exc.start) + 1)]
    if "\x00" in text:
        return [Expected(text.count("\n", 0, text.index("\x00")) + 1)]
    return [document(path, text, {}, None)]


def with_duplicate_ids(expected: list[Expected]) -> list[Expected]:
    """A second document under an id the batch already stored is a reject."""
    seen, result = set(), []
    for item in expected:
        if item.external_id is not None and item.external_id in seen:
            item = Expected(item.line)
        elif item.external_id is not None:
            seen.add(item.external_id)
        result.append(item)
    return result


def oracle(fmt: str, data: bytes, path: str) -> list[Expected]:
    if fmt == "jsonl":
        found = oracle_jsonl(data)
    elif fmt == "txt":
        found = oracle_txt(data, path)
    else:
        found = oracle_delimited(data, "," if fmt == "csv" else "\t")
    return with_duplicate_ids(found)


# -- what Hypothesis writes ------------------------------------------------------------------------

CHARACTERS = st.characters(codec="utf-8", categories=("L", "N", "P", "S", "Zs", "Cc")) | st.sampled_from(
    list(',"\t\n\r ;\'') + ["中", "文", "。", "\u3000", "\ufeff"])
texts = st.text(CHARACTERS, max_size=40) | st.text(CHARACTERS, min_size=MAX_CHARS - 5, max_size=MAX_CHARS + 20)
#: ids about the limit, of characters of 1 to 4 bytes of UTF-8: a little under it, at it (but for 3 bytes), over it
long_ids = st.sampled_from(["x", "é", "中", "\U00020000"]).flatmap(
    lambda c: st.integers(-2, 2).map(lambda more: c * (MAX_ID_BYTES // len(c.encode("utf-8")) + more)))
ids = st.text(CHARACTERS, min_size=0, max_size=8) | st.integers(-5, 10**6).map(str) | long_ids
#: CSV and TSV headers: the usual one, and some that name a column twice (an error of the whole file)
HEADERS = [["id", "text", "tag"]] * 5 + [["id", "text", "text"], ["id", "text", "id"], ["tag", "id", "tag"]]


@st.composite
def files(draw):
    fmt = draw(st.sampled_from(["jsonl", "csv", "tsv", "txt"]))
    if fmt == "txt":
        data = draw(texts).encode("utf-8", "surrogatepass")
    else:
        records = draw(st.lists(st.tuples(ids, texts, st.text(CHARACTERS, max_size=6)), max_size=12))
        if fmt == "jsonl":
            ascii_only = draw(st.booleans())
            data = "".join(json.dumps({"id": i, "text": t, "tag": g}, ensure_ascii=ascii_only) + "\n"
                           for i, t, g in records).encode("utf-8", "surrogatepass")
        else:
            out = io.StringIO()
            writer = csv.writer(out, delimiter="," if fmt == "csv" else "\t",
                                lineterminator=draw(st.sampled_from(["\n", "\r\n"])),
                                quoting=draw(st.sampled_from([csv.QUOTE_MINIMAL, csv.QUOTE_ALL])))
            writer.writerow(draw(st.sampled_from(HEADERS)))
            writer.writerows(records)
            data = out.getvalue().encode("utf-8", "surrogatepass")
    for _ in range(draw(st.integers(0, 3))):  # damage
        kind = draw(st.sampled_from(["insert", "delete", "truncate", "bom", "encoding", "duplicate", "huge"]))
        at = draw(st.integers(0, len(data)))
        if kind == "insert":
            data = data[:at] + draw(st.sampled_from([b'"', b",", b"\t", b"\n", b"\r\n", b"\xff", b"\x00", b"\xe9",
                                                      b'""', b"{", b"\\u0000", b"\\ud800", b"NaN"])) + data[at:]
        elif kind == "delete":
            data = data[:at] + data[at + draw(st.integers(1, 12)):]
        elif kind == "truncate":
            data = data[:at]
        elif kind == "bom":
            data = BOM + data
        elif kind == "encoding":
            try:
                data = data.decode("utf-8").encode(draw(st.sampled_from(["latin-1", "utf-16", "gb18030"])))
            except (UnicodeError, ValueError):
                pass
        elif kind == "duplicate":
            end = data.find(b"\n", at)
            start = data.rfind(b"\n", 0, at) + 1
            if end > 0:
                data = data[:end + 1] + data[start:end + 1] + data[end + 1:]
        else:
            data = data[:at] + b"x" * (MAX_CHARS + 50) + data[at:]
    compression = draw(st.sampled_from([None, "gz", "zst"]))
    return fmt, data, compression


def compress(data: bytes, compression: str | None) -> bytes:
    if compression == "gz":
        return gzip.compress(data)
    return zstandard.ZstdCompressor(write_checksum=True).compress(data) if compression == "zst" else data


def ingest_file(tmp_path, fmt, data, compression, name="input"):
    path = tmp_path / (f"{name}.{fmt}" + (f".{compression}" if compression else ""))
    path.write_bytes(compress(data, compression))
    return str(path)


def outcome(engine, schema, reasons: bool = False) -> list[tuple]:
    """(line of a reject, external id, content hash) per input record in order (with ``reasons``, a reject's
    reason in place of the id)."""
    with engine.connect() as connection:
        rows = connection.execute(sa.text(
            f"SELECT r.position, r.status, r.line, r.reason, d.external_id, d.content_hash FROM {schema}.records r "
            f"LEFT JOIN {schema}.documents d ON d.id = r.document_id ORDER BY r.position")).all()
        stored = connection.execute(sa.text(f"SELECT count(*) FROM {schema}.documents")).scalar_one()
    assert [row.position for row in rows] == list(range(1, len(rows) + 1))
    assert stored == sum(row.status != "rejected" for row in rows)  # stored once each, and nothing else
    return [(row.line, row.reason if reasons else None, None) if row.status == "rejected" else
            (None, row.external_id, bytes(row.content_hash)) for row in rows]


def without_reasons(got: list[tuple]) -> list[tuple]:
    return [(line, None, None) if line is not None else (line, external_id, digest) for line, external_id, digest in got]


def expected_outcome(items: list[Expected]) -> list[tuple]:
    return [(item.line, None, None) if item.external_id is None else
            (None, item.external_id, content_hash(item.text)) for item in items]


@pytest.fixture(scope="module")
def fuzz_index(server_url):
    schema = f"simdb_test_{uuid.uuid4().hex[:12]}"
    with Index.create(server_url, schema=schema) as index:
        yield index
        with index.database.engine.begin() as connection:
            connection.exec_driver_sql(f"DROP SCHEMA {schema} CASCADE")


EXAMPLES = int(__import__("os").environ.get("SIMDB_FUZZ_EXAMPLES", examples(200)))


def empty_archive(admin_engine, schema) -> None:
    with admin_engine.begin() as connection:  # an empty archive for every example
        delete_rows(connection, schema)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                       HealthCheck.too_slow])
@given(file=files(), chunk=st.integers(1, 5))
def test_every_record_is_stored_exactly_or_rejected(fuzz_index, admin_engine, tmp_path, file, chunk):
    fmt, data, compression = file
    index, schema = fuzz_index, fuzz_index.database.schema
    empty_archive(admin_engine, schema)
    path = ingest_file(tmp_path, fmt, data, compression)
    try:
        expected = oracle(fmt, data, path)
        file_error = None
    except FileError as exc:
        expected, file_error = None, exc
    rejects = tmp_path / "rejects.jsonl"
    rejects.unlink(missing_ok=True)
    items = read_documents([path], skip_errors=True, max_chars=MAX_CHARS)
    options = IngestOptions(batch="fuzz", on_error="skip", rejects=str(rejects), chunk_size=chunk,
                            max_chars=MAX_CHARS)
    checked = read_documents([path], skip_errors=True, max_chars=MAX_CHARS)
    if file_error is not None:
        with pytest.raises(InputError):
            list(index.check(checked, max_chars=MAX_CHARS))
        with pytest.raises(InputError) as caught:
            index.ingest(items, options)
        assert "header" in str(caught.value) or "field" in str(caught.value)
        with admin_engine.connect() as connection:
            assert connection.execute(sa.text(f"SELECT count(*) FROM {schema}.documents")).scalar_one() == 0
        return
    assert [v.status == "rejected" for v in index.check(checked, max_chars=MAX_CHARS)] == \
        [item.external_id is None for item in expected]
    summary = index.ingest(items, options)
    if not expected:
        assert not summary.recorded
        return
    assert outcome(admin_engine, schema) == expected_outcome(expected)
    in_file = [json.loads(line)["line"] for line in rejects.read_text().splitlines()] if rejects.exists() else []
    assert in_file == [item.line for item in expected if item.external_id is None]


#: How an output path can be an input file: by its own path, another spelling of it, a symlink (or a chain of
#: two), a hard link, or through a symlinked folder; and a copy, which is another file and must be accepted.
ALIASES = ("same path", "another spelling", "symlink", "symlink chain", "hard link", "symlinked folder", "copy")


def alias_of(original, folder, kind: str) -> str:
    if kind == "same path":
        return str(original)
    if kind == "another spelling":
        return str(folder / "." / "sub" / ".." / original.name)
    if kind == "copy":
        (folder / "copy").write_bytes(original.read_bytes())
        return str(folder / "copy")
    if kind == "hard link":
        (folder / "hard").hardlink_to(original)
        return str(folder / "hard")
    if kind == "symlinked folder":
        (folder / "elsewhere").symlink_to(folder)
        return str(folder / "elsewhere" / original.name)
    (folder / "link").symlink_to(original)
    if kind == "symlink chain":
        (folder / "link2").symlink_to(folder / "link")
        return str(folder / "link2")
    return str(folder / "link")


@settings(max_examples=max(5, EXAMPLES // 10), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(file=files(), option=st.sampled_from(["--verdicts", "--rejects"]), kind=st.sampled_from(ALIASES),
       second=st.booleans(), chunk=st.integers(1, 5))
def test_an_output_that_is_an_input_is_refused_and_the_input_kept(fuzz_index, admin_engine, tmp_path, file, option,
                                                                  kind, second, chunk):
    """Issue 34: an output file that was also an input was truncated after the first chunk, then read as input.
    Whatever the input holds (a bad header included), an output that is the same file as an input is refused
    before anything is read, written or stored; a copy of the input is another file, and is written."""
    from click.testing import CliRunner

    from simdb.cli import cli

    fmt, data, compressed = file
    schema = fuzz_index.database.schema
    empty_archive(admin_engine, schema)
    folder = tmp_path / uuid.uuid4().hex[:8]
    (folder / "sub").mkdir(parents=True)
    paths = [ingest_file(folder, fmt, data, compressed, name=name) for name in ("first", "second")]
    original = __import__("pathlib").Path(paths[second])
    before = [open(path, "rb").read() for path in paths]
    output = alias_of(original, folder, kind)
    result = CliRunner().invoke(cli, ["ingest", *paths, "--on-error", "skip", "--chunk-size", str(chunk),
                                      "--max-chars", str(MAX_CHARS), option, output,
                                      *(["--verdicts" if option == "--rejects" else "--rejects",
                                         str(folder / "other.jsonl")])],
                                env={"SIMDB_DATABASE_URL": fuzz_index.database.engine.url.render_as_string(
                                    hide_password=False).replace("+psycopg", ""), "SIMDB_SCHEMA": schema})
    assert "Traceback" not in result.output and isinstance(result.exception, (SystemExit, type(None)))
    assert [open(path, "rb").read() for path in paths] == before  # the inputs, byte for byte
    if kind == "copy":
        assert "is the input file" not in result.output
        return
    how = {"same path": "", "another spelling": "", "hard link": ", through a hard link"}.get(kind, ", through a "
                                                                                                 "symlink")
    assert result.exit_code == 1
    assert result.stderr == (f"Error: {option} {output} is the input file {original} (the same file{how}): writing "
                             f"it would destroy the input (choose another {option} file)\n")
    assert not (folder / "other.jsonl").exists()
    with admin_engine.connect() as connection:
        assert connection.execute(sa.text(f"SELECT count(*) FROM {schema}.batches")).scalar_one() == 0


# -- compressed streams cut short or damaged -------------------------------------------------------------

def recovered(damaged: bytes, compression: str) -> bytes:
    """What a lenient decompressor makes of a compressed file cut short: all it can decode, without a word."""
    if compression == "gz":
        return zlib.decompressobj(wbits=31).decompress(damaged)
    return zstandard.ZstdDecompressor().stream_reader(io.BytesIO(damaged), read_across_frames=True).read()


def ingest_path(index, path, rejects, chunk=3):
    options = IngestOptions(batch="fuzz", on_error="skip", rejects=str(rejects), chunk_size=chunk,
                            max_chars=MAX_CHARS)
    return index.ingest(read_documents([path], skip_errors=True, max_chars=MAX_CHARS), options)


@settings(max_examples=EXAMPLES // 2, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                            HealthCheck.too_slow])
@given(records=st.lists(st.tuples(texts, st.text(CHARACTERS, max_size=6)), min_size=1, max_size=30),
       compression=st.sampled_from(["gz", "zst"]), damage=st.sampled_from(["cut", "flip"]), data=st.data())
def test_a_compressed_stream_cut_short_or_damaged_ends_in_one_reject(fuzz_index, admin_engine, tmp_path, records,
                                                                      compression, damage, data):
    schema = fuzz_index.database.schema
    empty_archive(admin_engine, schema)
    plain = "".join(json.dumps({"id": f"r{i}", "text": t, "tag": g}) + "\n" for i, (t, g) in enumerate(records)).encode()
    whole = compress(plain, compression)
    at = data.draw(st.integers(1, len(whole) - 1))
    if damage == "cut":
        damaged = whole[:at]
    else:
        damaged = whole[:at] + bytes([whole[at] ^ data.draw(st.integers(1, 255))]) + whole[at + 1:]
    path = tmp_path / f"in.jsonl.{compression}"
    path.write_bytes(damaged)
    expected = expected_outcome(oracle("jsonl", plain, str(path)))
    summary = ingest_path(fuzz_index, str(path), tmp_path / "rejects.jsonl")
    got = outcome(admin_engine, schema, reasons=True) if summary.recorded else []
    stream = f"{'gzip' if compression == 'gz' else 'zstd'} "
    if damage == "cut":  # every line the lenient decompressor recovers, as the oracle says, then one reject
        lines = recovered(damaged, compression).count(b"\n")
        assert without_reasons(got[:-1]) == expected[:lines]
        assert got[-1][0] == lines + 1 and stream in got[-1][1]
    elif without_reasons(got) != expected:  # the damage changed what it holds
        reason = got[-1][1]  # then the stream's checksum or format says so, after what was read
        assert reason is not None and stream in reason


# -- Parquet ---------------------------------------------------------------------------------------------

def string_column(values: list, large: bool):
    """A string column holding str, raw bytes (maybe invalid UTF-8, as some writers leave them) or None."""
    raw = [v.encode("utf-8") if isinstance(v, str) else v for v in values]
    offsets, data = [0], b""
    for value in raw:
        data += value or b""
        offsets.append(len(data))
    validity = pa.array([v is not None for v in raw], pa.bool_()).buffers()[1] if None in raw else None
    kind, width = (pa.large_string(), pa.int64()) if large else (pa.string(), pa.int32())
    return pa.Array.from_buffers(kind, len(raw), [validity, pa.array(offsets, width).buffers()[1],
                                                  pa.py_buffer(data)], null_count=raw.count(None))


def parquet_oracle(rows: list[tuple], unreadable: set[int] = frozenset()) -> list[Expected]:
    """What each written row is: its document, or a reject (unreadable rows are rejects whatever they held)."""
    found = []
    for number, (external_id, text, tag) in enumerate(rows, 1):
        if number in unreadable or isinstance(text, bytes):
            found.append(Expected(number))
        else:
            found.append(document(external_id, text, {"tag": tag}, number))
    return with_duplicate_ids(found)


@st.composite
def parquet_files(draw):
    integer_ids = draw(st.booleans())
    identifiers = st.integers(-5, 10**6) if integer_ids else ids
    odd_text = texts.map(lambda t: t.encode("utf-8") + b"\xff")  # invalid UTF-8 in a string column
    rows = draw(st.lists(st.tuples(st.none() | identifiers, st.none() | texts | odd_text,
                                   st.none() | st.text(CHARACTERS, max_size=6)), max_size=30))
    texts_column = string_column([text for _, text, _ in rows], large=draw(st.booleans()))
    if draw(st.booleans()) and not any(isinstance(text, bytes) for _, text, _ in rows):
        texts_column = texts_column.dictionary_encode()
    table = pa.table({"id": pa.array([i for i, _, _ in rows], pa.int64() if integer_ids else pa.string()),
                      "text": texts_column, "tag": pa.array([g for _, _, g in rows], pa.string())})
    out = io.BytesIO()
    group_size = draw(st.integers(1, 12))
    pq.write_table(table, out, row_group_size=group_size, write_page_checksum=True,
                   data_page_size=draw(st.sampled_from([64, 512, 1 << 20])), use_dictionary=draw(st.booleans()),
                   compression=draw(st.sampled_from(["NONE", "SNAPPY", "ZSTD", "GZIP"])),
                   write_statistics=draw(st.booleans()))
    whole = out.getvalue()
    footer = len(whole) - 8 - int.from_bytes(whole[-8:-4], "little")
    damage = draw(st.sampled_from(["none", "pages", "pages", "splice", "footer", "cut"]))
    if footer <= 4 and damage in ("pages", "splice"):  # no row group: no pages
        damage = "none"
    damaged = bytearray(whole)
    if damage == "pages":  # bytes of the row groups: pages, their headers, dictionaries
        for _ in range(draw(st.integers(1, 3))):
            damaged[draw(st.integers(4, footer - 1))] ^= draw(st.integers(1, 255))
    elif damage == "splice":
        at = draw(st.integers(4, footer - 1))
        damaged[at:at + draw(st.integers(0, min(8, footer - at)))] = draw(st.binary(max_size=8))
    elif damage == "footer":
        damaged[draw(st.integers(footer, len(whole) - 9))] ^= draw(st.integers(1, 255))
    elif damage == "cut":
        damaged = damaged[:draw(st.integers(0, len(whole) - 1))]
    return rows, bytes(damaged), damage, group_size


def unreadable_rows(got: list[tuple]) -> set[int]:
    return {line for line, reason, _ in got if reason is not None and " cannot be read: " in reason}


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                       HealthCheck.too_slow])
@given(file=parquet_files(), chunk=st.integers(1, 5))
def test_every_parquet_row_is_stored_exactly_or_rejected(fuzz_index, admin_engine, tmp_path, file, chunk):
    rows, data, damage, group_size = file
    schema = fuzz_index.database.schema
    empty_archive(admin_engine, schema)
    path = tmp_path / "input.parquet"
    path.write_bytes(data)
    rejects = tmp_path / "rejects.jsonl"
    rejects.unlink(missing_ok=True)
    try:
        summary = ingest_path(fuzz_index, str(path), rejects, chunk)
    except InputError as error:  # a whole-file problem: nothing is stored
        assert damage in ("cut", "footer"), error
        assert error.line is None and "\n" not in str(error)
        with admin_engine.connect() as connection:
            assert connection.execute(sa.text(f"SELECT count(*) FROM {schema}.records")).scalar_one() == 0
        return
    assert damage != "cut"
    got = outcome(admin_engine, schema, reasons=True) if summary.recorded else []
    in_file = [json.loads(line)["line"] for line in rejects.read_text().splitlines()] if rejects.exists() else []
    assert in_file == [line for line, _, _ in got if line is not None]
    unreadable = unreadable_rows(got)
    if damage == "footer":  # names and statistics may have changed, not what a row holds
        assert len(got) == len(rows)
        written = {(str(i), content_hash(t)) for i, t, _ in rows if isinstance(t, str)}
        assert {(i, h) for line, i, h in got if line is None} <= written
        return
    expected = expected_outcome(parquet_oracle(rows, unreadable))
    assert without_reasons(got) == expected
    for start in range(1, len(rows) + 1, group_size):  # a group is read up to a row, then rejected from there
        group = [row in unreadable for row in range(start, min(start + group_size, len(rows) + 1))]
        assert group == sorted(group)
    if damage == "none":
        assert not unreadable


def large_damaged_input(seed: int, fmt: str) -> bytes:
    """A few thousand records with damage scattered through them (deterministic for the seed)."""
    rng = random.Random(seed)
    words = "the archive keeps 每 一 篇 文章 it has ever received , \" quoted \t tab".split(" ")
    records = [(f"r{i}", " ".join(rng.choice(words) for _ in range(rng.randrange(3, 30))), rng.choice("abc"))
               for i in range(3000)]
    if fmt == "jsonl":
        data = "".join(json.dumps({"id": i, "text": t, "tag": g}, ensure_ascii=False) + "\n" for i, t, g in records)
    else:
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(["id", "text", "tag"])
        writer.writerows(records)
        data = out.getvalue()
    raw = bytearray(data.encode("utf-8"))
    for _ in range(60):
        at = rng.randrange(len(raw))
        raw[at:at] = rng.choice([b'"', b"\xff", b"\x00", b",", b"\n", b"{"])
    return bytes(raw)


def large_damaged_parquet(seed: int, path) -> list[Expected]:
    """A few thousand rows with NULLs, invalid UTF-8, repeated ids and one damaged row group: what the oracle says."""
    rng = random.Random(seed)
    words = "the archive keeps 每 一 篇 文章 it has ever received , \" quoted \t tab".split(" ")
    rows = [(f"r{i}", " ".join(rng.choice(words) for _ in range(rng.randrange(3, 30))), rng.choice("abc"))
            for i in range(3000)]
    for _ in range(60):
        at = rng.randrange(len(rows))
        external_id, text, tag = rows[at]
        rows[at] = rng.choice([(None, text, tag), (external_id, None, tag), (external_id, text.encode() + b"\xff", tag),
                               (f"r{rng.randrange(3000)}", text, tag), (external_id, "\x00", tag)])
    table = pa.table({"id": pa.array([r[0] for r in rows], pa.string()),
                      "text": string_column([r[1] for r in rows], large=False), "tag": [r[2] for r in rows]})
    pq.write_table(table, path, row_group_size=250, write_page_checksum=True)
    chunk = pq.ParquetFile(path).metadata.row_group(5).column(1)  # rows 1251-1500
    data = bytearray(path.read_bytes())
    data[(chunk.dictionary_page_offset or chunk.data_page_offset) + chunk.total_compressed_size // 2] ^= 0x5A
    path.write_bytes(bytes(data))
    return parquet_oracle(rows, set(range(1251, 1501)))


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["jsonl", "csv", "jsonl.zst", "parquet"])
def test_killed_and_resumed_ingests_agree_with_the_oracle(fmt, database_url, admin_engine, schema, tmp_path):
    path = tmp_path / f"in.{fmt}"
    if fmt == "parquet":
        expected = expected_outcome(large_damaged_parquet(7, path))
    else:
        plain = fmt.removesuffix(".zst")
        data = large_damaged_input(7, plain)
        path.write_bytes(compress(data, "zst" if fmt.endswith(".zst") else None))
        expected = expected_outcome(oracle(plain, data, str(path)))
    rejects = tmp_path / "rejects.jsonl"
    base = [sys.executable, "-m", "simdb"]
    where = ["--database-url", database_url, "--schema", schema]
    subprocess.run([*base, "init", *where], check=True, capture_output=True)
    command = [*base, "ingest", str(path), "--batch", "b", "--chunk-size", "150", "--workers", "1", "--on-error",
               "skip", "--rejects", str(rejects), "--max-chars", str(MAX_CHARS), *where]
    rng = random.Random(fmt)

    def status():
        with admin_engine.connect() as connection:
            return connection.execute(sa.text(f"SELECT status FROM {schema}.batches")).scalar()

    for _ in range(4):
        current = status()
        if current == "complete":
            break
        process = subprocess.Popen(command + (["--resume"] if current == "running" else []),
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(rng.uniform(0.8, 2.5))
        killed(process, done=(0, 3))  # done, some records rejected
        time.sleep(0.3)
        so_far = outcome(admin_engine, schema) if status() else []
        assert so_far == expected[:len(so_far)]  # whole chunks, each record as the oracle says
    if status() != "complete":
        finished = subprocess.run(command + (["--resume"] if status() == "running" else []), capture_output=True)
        assert finished.returncode == 3, finished.stderr  # done, some records rejected
    assert outcome(admin_engine, schema) == expected
    assert [json.loads(line)["line"] for line in rejects.read_text().splitlines()] == \
        [line for line, external_id, _ in expected if external_id is None]
