"""Input fuzzing: every record of any file is stored once with exactly its text, or rejected; never both.

Hypothesis writes records as JSON lines, CSV, TSV or a text file (any characters: quotes,
delimiters, line breaks, CJK, control characters; sometimes gzip-compressed, sometimes with a
byte order mark, CRLF lines or fully quoted fields), then damages the bytes: stray quotes and
delimiters, invalid UTF-8, NUL bytes, deleted and duplicated spans, truncation, another encoding,
huge fields. An oracle, written here independently of simdb's readers, applies the documented
rules (simdb.inputs.delimited for CSV and TSV; one object per line for JSON lines; the whole file
for text) to the damaged bytes and says what each input record is: a document (id and text) or a
reject (at a line). The ingest, with ``on_error="skip"`` and small chunks, must agree record by
record: the ``records`` table's positions, statuses and lines, the stored documents' ids and
exact texts (by their content hash), and the rejects file. A SIGKILL test runs large damaged
inputs through the CLI, kills it at random moments and resumes, with the same oracle.
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
from dataclasses import dataclass

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simdb import Index, InputError
from simdb.text import content_hash
from simdb.ingest import IngestOptions
from simdb.inputs import read_documents
from tests.conftest import killed

MAX_CHARS = 300
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
    if not external_id.strip() or not storable(external_id):
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
            "id" not in header or "text" not in header:
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
ids = st.text(CHARACTERS, min_size=0, max_size=8) | st.integers(-5, 10**6).map(str)


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
            writer.writerow(["id", "text", "tag"])
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
    compressed = draw(st.booleans())
    return fmt, data, compressed


def ingest_file(tmp_path, fmt, data, compressed, name="input"):
    path = tmp_path / f"{name}.{fmt}" if not compressed else tmp_path / f"{name}.{fmt}.gz"
    path.write_bytes(gzip.compress(data) if compressed else data)
    return str(path)


def outcome(engine, schema) -> list[tuple]:
    """(line of a reject, external id, content hash) per input record in order."""
    with engine.connect() as connection:
        rows = connection.execute(sa.text(
            f"SELECT r.position, r.status, r.line, d.external_id, d.content_hash FROM {schema}.records r "
            f"LEFT JOIN {schema}.documents d ON d.id = r.document_id ORDER BY r.position")).all()
        stored = connection.execute(sa.text(f"SELECT count(*) FROM {schema}.documents")).scalar_one()
    assert [row.position for row in rows] == list(range(1, len(rows) + 1))
    assert stored == sum(row.status != "rejected" for row in rows)  # stored once each, and nothing else
    return [(row.line, None, None) if row.status == "rejected" else (None, row.external_id, bytes(row.content_hash))
            for row in rows]


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


@settings(max_examples=int(__import__("os").environ.get("SIMDB_FUZZ_EXAMPLES", 200)), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(file=files(), chunk=st.integers(1, 5))
def test_every_record_is_stored_exactly_or_rejected(fuzz_index, admin_engine, tmp_path, file, chunk):
    fmt, data, compressed = file
    index, schema = fuzz_index, fuzz_index.database.schema
    with admin_engine.begin() as connection:  # an empty archive for every example
        connection.exec_driver_sql(f"TRUNCATE {schema}.documents, {schema}.batches, {schema}.records, "
                                   f"{schema}.near_duplicates")
    path = ingest_file(tmp_path, fmt, data, compressed)
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
    if file_error is not None:
        with pytest.raises(InputError) as caught:
            index.ingest(items, options)
        assert "header" in str(caught.value) or "field" in str(caught.value)
        with admin_engine.connect() as connection:
            assert connection.execute(sa.text(f"SELECT count(*) FROM {schema}.documents")).scalar_one() == 0
        return
    summary = index.ingest(items, options)
    if not expected:
        assert not summary.recorded
        return
    assert outcome(admin_engine, schema) == expected_outcome(expected)
    in_file = [json.loads(line)["line"] for line in rejects.read_text().splitlines()] if rejects.exists() else []
    assert in_file == [item.line for item in expected if item.external_id is None]


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


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_killed_and_resumed_ingests_agree_with_the_oracle(fmt, database_url, admin_engine, schema, tmp_path):
    data = large_damaged_input(7, fmt)
    path = tmp_path / f"in.{fmt}"
    path.write_bytes(data)
    expected = expected_outcome(oracle(fmt, data, str(path)))
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
