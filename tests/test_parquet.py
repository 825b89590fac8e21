"""Parquet inputs: every row read as written or rejected at its row, whole-file problems as one-line errors, and
``ingest``, ``check`` and ``calibrate`` on Parquet files, folders and patterns.

Expected values come from the rows as this file writes them, never from what simdb read."""

from __future__ import annotations

import datetime
import decimal
import json
import sys

import pytest
import sqlalchemy as sa

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from simdb import InputError  # noqa: E402
from simdb.errors import Row  # noqa: E402
from simdb.inputs import Document, read_documents  # noqa: E402

TEXTS = [f"document {i}: " + " ".join(f"w{(i * 7 + j) % 97}" for j in range(i % 13 + 3)) for i in range(3000)]


def write(path, columns: dict, **options):
    options.setdefault("write_page_checksum", True)
    pq.write_table(pa.table(columns), path, **options)
    return str(path)


def read(path, **options):
    return list(read_documents([str(path)], **options))


def outcome(items):
    """(row, id, text, metadata) of a document, (row, reason) of a reject."""
    return [(int(d.line), d.external_id, d.text, d.metadata) if isinstance(d, Document) else (int(d.line), d.reason)
            for d in items]


def test_every_row_of_every_row_group_is_read_as_written(tmp_path):
    path = write(tmp_path / "corpus.parquet", {"id": list(range(3000)), "text": pa.array(TEXTS, pa.large_string()),
                                               "lang": ["en", "fr", "zh"] * 1000}, row_group_size=700)
    items = read(path)
    assert outcome(items) == [(i + 1, str(i), TEXTS[i], {"lang": ["en", "fr", "zh"][i % 3]}) for i in range(3000)]
    assert all(type(d.line) is Row for d in items)
    assert items[1233].origin == f"{path}, row 1234"


def test_string_ids_and_dictionary_encoded_columns(tmp_path):
    ids = pa.array([f"doc-{i % 50}-{i}" for i in range(200)]).dictionary_encode()
    texts = pa.array([TEXTS[i % 20] for i in range(200)]).dictionary_encode()  # repeated texts: a dictionary
    path = write(tmp_path / "dict.parquet", {"doc": ids, "body": texts}, row_group_size=64)
    assert outcome(read(path, id_field="doc", text_field="body")) == \
        [(i + 1, f"doc-{i % 50}-{i}", TEXTS[i % 20], {}) for i in range(200)]
    if hasattr(pa, "string_view"):
        view = write(tmp_path / "view.parquet", {"id": pa.array(["a", "b"], pa.string_view()),
                                                 "text": pa.array(["x y", "z"], pa.string_view())})
        assert outcome(read(view)) == [(1, "a", "x y", {}), (2, "b", "z", {})]


def test_metadata_columns_become_json_values(tmp_path):
    stamp = datetime.datetime(2024, 5, 1, 12, 0, 0, 250_000)
    columns = {
        "id": [1, 2], "text": ["first text", "second text"],
        "count": pa.array([7, None], pa.int16()), "flag": [True, False], "score": [0.5, float("nan")],
        "price": pa.array([decimal.Decimal("10.10"), decimal.Decimal("-0.01")], pa.decimal128(6, 2)),
        "at": pa.array([stamp, None], pa.timestamp("ms")),
        "at_utc": pa.array([stamp, stamp], pa.timestamp("us", tz="UTC")),
        "day": pa.array([datetime.date(2024, 5, 1)] * 2, pa.date32()),
        "nanos": pa.array([1_000_000_000_123_456_789, 0], pa.timestamp("ns")),
        "took": pa.array([datetime.timedelta(seconds=90)] * 2, pa.duration("s")),
        "digest": pa.array([b"\x00\xff", b""], pa.binary()),
        "tags": [["a", "b"], []], "where": [{"x": 1, "at": None}, {"x": None, "at": None}],
        "attrs": pa.array([[("k", 1.5)], []], pa.map_(pa.string(), pa.float64())),
        "nothing": pa.array([None, None], pa.null()),
    }
    columns["where"] = pa.array(columns["where"], pa.struct([("x", pa.int64()), ("at", pa.date32())]))
    first, second = read(write(tmp_path / "types.parquet", columns))
    assert first.metadata == {
        "count": 7, "flag": True, "score": 0.5, "price": "10.10", "at": "2024-05-01 12:00:00.250",
        "at_utc": "2024-05-01 12:00:00.250000Z", "day": "2024-05-01", "nanos": "2001-09-09 01:46:40.123456789",
        "took": 90, "digest": "00ff", "tags": ["a", "b"], "where": {"x": 1, "at": None}, "attrs": [["k", 1.5]],
        "nothing": None}
    assert second.metadata["score"] is None and second.metadata["at"] is None and second.metadata["digest"] == ""
    assert second.metadata["nanos"] == "1970-01-01 00:00:00.000000000"
    json.dumps([first.metadata, second.metadata], allow_nan=False)  # what jsonb is given


def test_pandas_index_column_is_not_metadata(tmp_path):
    table = pa.table({"id": [1], "text": ["x y"], "lang": ["en"], "__index_level_0__": [41]})
    pandas = {"index_columns": ["__index_level_0__"], "columns": []}
    table = table.replace_schema_metadata({b"pandas": json.dumps(pandas).encode()})
    pq.write_table(table, tmp_path / "pandas.parquet")
    (document,) = read(tmp_path / "pandas.parquet")
    assert document.metadata == {"lang": "en"}


def invalid_utf8(values: list[bytes]):
    """A string column holding these bytes as they are (writers do not all check UTF-8; Parquet does not)."""
    offsets = [0]
    for value in values:
        offsets.append(offsets[-1] + len(value))
    return pa.Array.from_buffers(pa.string(), len(values), [None, pa.array(offsets, pa.int32()).buffers()[1],
                                                            pa.py_buffer(b"".join(values))])


def test_bad_rows_are_rejects_naming_their_row(tmp_path):
    path = write(tmp_path / "bad.parquet", {
        "id": pa.array(["a", None, "c", "d", "e", "f", "g", "", "i"]),
        "text": invalid_utf8([b"fine", b"no id", b"", b"  ", b"nul \x00 here", b"caf\xe9", b"ok", b"empty id",
                              b"also fine"]),
        "score": [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, float("inf"), 1.0, 1.0],
        "note": invalid_utf8([b"x"] * 8 + [b"\xff"]),
    }, row_group_size=4)
    items = read(path, skip_errors=True)
    assert outcome(items) == [
        (1, "a", "fine", {"score": 1.0, "note": "x"}),
        (2, "the id column 'id' is NULL"),
        (3, "the text is empty or only whitespace"),
        (4, "the text is empty or only whitespace"),
        (5, "the text contains a NUL character, which PostgreSQL cannot store"),
        (6, "invalid UTF-8 in column 'text' (byte 0xe9 at offset 3)"),
        (7, "a metadata field holds NaN or an infinite number, which JSON cannot store"),
        (8, "the id field 'id' is empty"),
        (9, "invalid UTF-8 in column 'note' (byte 0xff at offset 0)"),
    ]
    with pytest.raises(InputError) as caught:
        read(path)
    assert str(caught.value) == f"{path}, row 2: the id column 'id' is NULL (give every row an id)"
    nulls = write(tmp_path / "nulls.parquet", {"id": [1, 2], "text": ["x", None]})
    assert str(pytest.raises(InputError, read, nulls).value) == \
        f"{nulls}, row 2: the text column 'text' is NULL (drop the row or give it text)"


@pytest.mark.parametrize("columns, options, message", [
    ({"id": [1], "body": ["x"]}, {}, "no text column 'text' (columns: 'id', 'body') (name the text column with "
                                     "`text_field`)"),
    ({"key": [1], "text": ["x"]}, {}, "no id column 'id' (columns: 'key', 'text') (name the id column with "
                                      "`id_field`)"),
    ({"id": [1.0], "text": ["x"]}, {}, "the id column 'id' holds double, not integers or strings (write the ids as "
                                       "integers or strings (pandas turns integers with missing values into floats: "
                                       "use its Int64 type))"),
    ({"id": [1], "text": [b"x"]}, {}, "the text column 'text' holds binary, not strings (write the texts as a string "
                                      "(UTF-8) column)"),
    ({"id": [[1]], "text": ["x"]}, {}, "the id column 'id' holds list<element: int64>, not integers or strings"),
])
def test_a_file_without_usable_columns_is_an_error_even_when_skipping(tmp_path, columns, options, message):
    good = write(tmp_path / "good.parquet", {"id": [9], "text": ["read first"]})
    path = write(tmp_path / "columns.parquet", columns)
    for skip in (False, True):
        with pytest.raises(InputError) as caught:
            next(iter(read_documents([good, path], skip_errors=skip, **options)))  # before the first row of any file
        assert str(caught.value).startswith(f"{path}: {message}")


@pytest.mark.parametrize("names, repeated", [(["id", "text", "m", "m"], "'m' twice (columns 3 and 4)"),
                                             (["text", "id", "text", "m"], "'text' twice (columns 1 and 3)")])
def test_a_schema_that_repeats_a_column_name_is_an_error_even_when_skipping(tmp_path, names, repeated):
    """Issue 34 item 9, in Parquet: a repeated metadata column lost a value, a repeated text column raised KeyError."""
    path = str(tmp_path / "repeated.parquet")
    pq.write_table(pa.Table.from_arrays([pa.array([f"{name}-{i}"]) for i, name in enumerate(names)], names=names),
                   path)
    for skip_errors in (False, True):
        with pytest.raises(InputError) as caught:
            read(path, skip_errors=skip_errors)
        assert str(caught.value) == f"{path}: the schema names the column {repeated} (give every column its own name)"


@pytest.mark.parametrize("name, content, message", [
    ("empty.parquet", b"", "not a Parquet file: it is empty (check the file, or give its format with `format`)"),
    ("json.parquet", b'{"id": 1, "text": "x"}\n', "not a Parquet file: it does not begin with PAR1"),
    ("cut.parquet", None, "the Parquet file is cut short: it has no footer (a Parquet file ends with PAR1) (the file "
                          "is truncated: copy it again)"),
    ("squashed.parquet", b"PAR1" + b"\x00" * 40 + b"\x10\x00\x00\x00PAR1", "the Parquet footer cannot be read ("),
    ("twice.parquet.zst", b"PAR1", "a Parquet file is read as it is, not through gzip or zstd"),
])
def test_a_file_that_is_not_parquet_or_is_cut_short_is_a_one_line_error(tmp_path, name, content, message):
    path = tmp_path / name
    if content is None:
        write(path, {"id": list(range(500)), "text": TEXTS[:500]})
        content = path.read_bytes()[:-100]
    path.write_bytes(content)
    for skip in (False, True):
        with pytest.raises(InputError) as caught:
            read(path, skip_errors=skip)
        assert str(caught.value).startswith(f"{path}: {message}") and "\n" not in str(caught.value)


def damage_row_group(path, group: int, column: int = 1) -> None:
    """Flip a byte in the middle of one column chunk of one row group (its page checksum no longer matches)."""
    chunk = pq.ParquetFile(path).metadata.row_group(group).column(column)
    data = bytearray(open(path, "rb").read())
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    data[start + chunk.total_compressed_size // 2] ^= 0x5A
    open(path, "wb").write(bytes(data))


def test_a_damaged_row_group_rejects_its_rows_and_the_rest_is_read(tmp_path):
    path = write(tmp_path / "damaged.parquet", {"id": list(range(3000)), "text": TEXTS}, row_group_size=600)
    damage_row_group(path, 2)
    with pytest.raises(InputError) as caught:
        read(path)
    reason = "row group 3 of 5 (rows 1201-1800) cannot be read: "
    assert str(caught.value).startswith(f"{path}, row 1201: {reason}") and "\n" not in str(caught.value)
    assert caught.value.hint == "the file is damaged: copy it again"
    items = read(path, skip_errors=True)
    assert [int(item.line) for item in items] == list(range(1, 3001))  # every row once
    for i, item in enumerate(items):
        if 1200 <= i < 1800:
            assert isinstance(item, InputError) and item.reason.startswith(reason)
        else:
            assert (item.external_id, item.text) == (str(i), TEXTS[i])


def test_folders_and_patterns_stand_for_their_files_in_path_order(tmp_path):
    folder = tmp_path / "dataset"
    (folder / "year=2024").mkdir(parents=True)
    (folder / "_temporary").mkdir()
    write(folder / "part-1.parquet", {"id": [3, 4], "text": ["c", "d"]})
    write(folder / "part-0.parquet", {"id": [1, 2], "text": ["a", "b"]})
    write(folder / "year=2024" / "part-0.parquet", {"id": [5], "text": ["e"]})
    write(folder / "_temporary" / "part-9.parquet", {"id": [9], "text": ["not yet written"]})
    (folder / "_SUCCESS").write_bytes(b"")
    (folder / ".part-0.parquet.crc").write_bytes(b"\x00")
    (folder / "README").write_text("not an input")
    assert [(d.path, d.external_id) for d in read(folder)] == [
        (str(folder / "part-0.parquet"), "1"), (str(folder / "part-0.parquet"), "2"),
        (str(folder / "part-1.parquet"), "3"), (str(folder / "part-1.parquet"), "4"),
        (str(folder / "year=2024" / "part-0.parquet"), "5")]
    assert [d.external_id for d in read(folder / "part-*.parquet")] == ["1", "2", "3", "4"]
    # a pattern matches what the shell's would: _temporary too
    assert [d.external_id for d in read(f"{folder}/**/*.parquet")] == ["9", "1", "2", "3", "4", "5"]
    assert [d.external_id for d in read(f"{folder}/**/")] == ["1", "2", "3", "4", "5", "9"]  # folders: each file once
    assert [d.external_id for d in read(f"{folder}/y*")] == ["5"]  # a folder matched: its files
    with pytest.raises(InputError, match=r"\*\.jsonl: no file matches this pattern \(check the pattern\)"):
        read(folder / "*.jsonl")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="empty: the folder holds no input files"):
        read(tmp_path / "empty")


def test_without_pyarrow_the_error_says_what_to_install(tmp_path, monkeypatch):
    path = write(tmp_path / "corpus.parquet", {"id": [1], "text": ["x"]})
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with pytest.raises(InputError) as caught:
        read(path)
    assert str(caught.value) == "reading Parquet needs pyarrow, which is not installed (pip install " \
                                "'simdb[parquet]' (or pyarrow))"


# -- through the command line ---------------------------------------------------------------------------

def test_ingest_a_parquet_file_with_rejects_at_their_rows(run, tmp_path, admin_engine, schema):
    texts = TEXTS[:40]
    texts[6] = None
    ids = [f"p{i}" for i in range(40)]
    ids[30] = "p3"  # repeats row 4's id, stored by an earlier chunk
    ids[34] = "p32"  # repeats row 33's id, in the same chunk
    path = write(tmp_path / "corpus.parquet", {"doc": ids, "body": texts, "n": list(range(40))}, row_group_size=16)
    run("init")
    stopped = run("ingest", path, "--id-field", "doc", "--text-field", "body")
    assert stopped.exit_code == 1
    assert stopped.stderr == f"Error: {path}, row 7: the text column 'body' is NULL (drop the row or give it text)\n"
    rejects, verdicts = tmp_path / "rejects.jsonl", tmp_path / "verdicts.jsonl"
    result = run("ingest", path, "--id-field", "doc", "--text-field", "body", "--on-error", "skip", "--batch", "pq",
                 "--rejects", str(rejects), "--verdicts", str(verdicts), "--chunk-size", "10")
    assert result.exit_code == 3, result.output
    assert [(r["line"], r["reason"], r["path"]) for r in map(json.loads, rejects.read_text().splitlines())] == [
        (7, "the text column 'body' is NULL", path),
        (31, "id 'p3' appears twice in this batch (first in an earlier chunk)", path),
        (35, f"id 'p32' appears twice in this batch (first at {path}, row 33)", path)]
    lines = [json.loads(line) for line in verdicts.read_text().splitlines()]
    assert [v["position"] for v in lines] == list(range(1, 41))
    with admin_engine.connect() as connection:
        stored = connection.execute(sa.text(f"SELECT external_id, metadata FROM {schema}.documents")).all()
    assert sorted(stored) == sorted((ids[i], {"n": i}) for i in range(40) if i not in (6, 30, 34))


def test_check_reads_parquet_and_names_rows(run, tmp_path):
    run("init")
    archive = write(tmp_path / "archive.parquet", {"id": ["a", "b"], "text": TEXTS[:2]})
    assert run("ingest", archive, "--batch", "archive").exit_code == 0
    new = write(tmp_path / "new.parquet", {"id": ["a", "c", "d"], "text": [TEXTS[0], TEXTS[1], None]})
    result = run("check", new)
    assert [(v["status"], v.get("line"), v["duplicate_of"]) for v in map(json.loads, result.stdout.splitlines())] == \
        [("already_stored", None, None), ("exact", None, "b"), ("rejected", 3, None)]


def test_calibrate_reads_parquet_pairs_and_documents_as_it_reads_json_lines(run, tmp_path):
    texts = {f"d{i}": TEXTS[i] for i in range(40)}
    texts.update({f"e{i}": TEXTS[i] + " and a small edit" for i in range(20)})
    pairs = [(f"d{i}", f"e{i}", True) for i in range(20)] + [(f"d{i}", f"d{i + 1}", False) for i in range(20, 39)]
    write(tmp_path / "docs.parquet", {"key": list(texts), "body": list(texts.values())})
    write(tmp_path / "pairs.parquet", {"a": [p[0] for p in pairs], "b": [p[1] for p in pairs],
                                       "duplicate": [p[2] for p in pairs]})
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"id": k, "text": t}) + "\n" for k, t in texts.items()))
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps({"a": a, "b": b, "duplicate": d}) + "\n"
                                                  for a, b, d in pairs))
    from_parquet = run("calibrate", str(tmp_path / "pairs.parquet"), "--documents", str(tmp_path / "docs.parquet"),
                       "--id-field", "key", "--text-field", "body", "--json", "--plot", str(tmp_path / "a.svg"))
    from_jsonl = run("calibrate", str(tmp_path / "pairs.jsonl"), "--documents", str(tmp_path / "docs.jsonl"),
                     "--json", "--plot", str(tmp_path / "b.svg"))
    assert from_parquet.exit_code == 0, from_parquet.output
    assert json.loads(from_parquet.stdout) == json.loads(from_jsonl.stdout)
    assert json.loads(from_parquet.stdout)["pairs"] == 39
    write(tmp_path / "unlabelled.parquet", {"a": ["x"], "b": ["y"], "duplicate": ["yes"]})
    bad = run("calibrate", str(tmp_path / "unlabelled.parquet"))
    assert bad.exit_code == 1 and "unlabelled.parquet, row 1: the label 'duplicate' is 'yes'" in bad.stderr


@pytest.mark.slow
def test_no_damage_to_the_footer_loses_a_row_in_silence(tmp_path):
    """Regression: the footer has no checksum, and a damaged row count or page offset made pyarrow give a row
    group fewer rows, or none, without an error. Every flip of these bits of it is an error, or changes nothing
    a row holds."""
    rows = 40
    path = write(tmp_path / "whole.parquet", {"id": list(range(rows)), "text": [f"text {i}" for i in range(rows)],
                                              "tag": ["x"] * rows}, row_group_size=10)
    whole = open(path, "rb").read()
    footer = len(whole) - 8 - int.from_bytes(whole[-8:-4], "little")
    damaged_path = tmp_path / "damaged.parquet"
    silent = []
    for at in range(footer, len(whole) - 8):
        for bit in (1, 4, 32):
            damaged = bytearray(whole)
            damaged[at] ^= bit
            damaged_path.write_bytes(bytes(damaged))
            try:
                items = read(damaged_path, skip_errors=True)
            except InputError:
                continue
            wrong = [i for i, d in enumerate(items) if isinstance(d, Document) and
                     (d.external_id, d.text, int(d.line)) != (str(i), f"text {i}", i + 1)]
            if len(items) != rows or wrong:
                silent.append((at - footer, bit, len(items), wrong[:3]))
    assert silent == []
