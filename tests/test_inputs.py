"""Readers: every record is read as written or reported at its line; none is merged into another."""

from __future__ import annotations

import gzip
import json

import pytest

from simdb import InputError
from simdb.inputs import Document, read_documents


def read(path, **options):
    return list(read_documents([str(path)], **options))


def summary(items):
    return [(d.external_id, d.text) if isinstance(d, Document) else (d.line, d.reason) for d in items]


def csv_rows(count, broken=None):
    lines = ["id,text"]
    for i in range(1, count + 1):
        lines.append(f'{i},"row number {i}' if i == broken else f"{i},row number {i}")
    return "\n".join(lines) + "\n"


def test_an_unterminated_quote_is_an_error_at_the_line_where_it_opened(tmp_path):
    """Regression (issue 9): rows 5-999 ended up inside row 4's text and the ingest exited 0."""
    path = tmp_path / "broken.csv"
    path.write_text(csv_rows(1000, broken=4))
    with pytest.raises(InputError) as caught:
        read(path)
    assert str(caught.value) == (f"{path}:5: the quote opened at line 5 (column 3) is never closed (quote fields "
                                 "that hold quotes or line breaks, and double the quotes inside them)")
    items = read(path, skip_errors=True)
    assert summary(items)[3] == (5, "the quote opened at line 5 (column 3) is never closed")
    documents = [d for d in items if isinstance(d, Document)]
    assert [d.external_id for d in documents] == [str(i) for i in range(1, 1001) if i != 4]
    assert all(d.text == f"row number {d.external_id}" for d in documents)


def test_a_quote_that_closes_on_a_later_record_costs_one_record(tmp_path):
    path = tmp_path / "stray.csv"
    path.write_text('id,text\n1,"opened and never closed\n2,plain\n3,"quoted, properly"\n4,last\n')
    assert summary(read(path, skip_errors=True)) == [
        (2, "the closing quote at line 4 (column 3) is followed by 'q' instead of the delimiter or the end of the "
            "line"),
        ("2", "plain"), ("3", "quoted, properly"), ("4", "last")]


def test_a_runaway_quote_stops_at_max_chars(tmp_path):
    path = tmp_path / "long.csv"
    path.write_text('id,text\n1,"' + "word " * 100 + "\n" + "2,next\n" * 50)
    items = read(path, skip_errors=True, max_chars=200)
    assert items[0].line == 2 and "runs past 200 characters" in items[0].reason
    assert [d.external_id for d in items[1:]] == ["2"] * 50


def test_legal_multi_line_fields_and_doubled_quotes(tmp_path):
    path = tmp_path / "ok.csv"
    path.write_bytes(b'\xef\xbb\xbfid,text,lang\r\n1,"two\r\nlines, ""quoted""",en\r\n\r\n2,"",fr\r\n3,plain "quote" inside,de')
    items = read(path, skip_errors=True)
    assert summary(items) == [("1", 'two\r\nlines, "quoted"'), (5, "the text is empty or only whitespace"),
                              ("3", 'plain "quote" inside')]
    assert items[0].metadata == {"lang": "en"} and items[0].line == 2


def test_invalid_utf8_inside_a_multi_line_field_rejects_the_whole_record(tmp_path):
    """Regression (issue 9): the record was stored with the bad line removed and also rejected."""
    path = tmp_path / "bytes.csv"
    path.write_bytes(b'id,text\n1,"first line\nsecond caf\xe9 line\nthird line"\n2,fine\n')
    assert summary(read(path, skip_errors=True)) == [
        (2, "invalid UTF-8 (byte 0xe9 at offset 10 on line 3 of the record) (the record spans lines 2-4)"),
        ("2", "fine")]


def test_wrong_field_counts_skip_the_whole_record(tmp_path):
    path = tmp_path / "fields.tsv"
    path.write_text('id\ttext\n1\t"a\tb\nc"\textra\n2\tok\n')
    assert summary(read(path, skip_errors=True)) == [
        (2, "3 fields where the header has 2 (the record spans lines 2-3)"), ("2", "ok")]


def test_a_byte_order_mark_is_not_part_of_the_first_field(tmp_path):
    (tmp_path / "bom.jsonl").write_bytes(b'\xef\xbb\xbf{"id": "a", "text": "x"}\n')
    (tmp_path / "bom.csv").write_bytes(b"\xef\xbb\xbfid,text\nb,y\n")
    (tmp_path / "bom.txt").write_bytes(b"\xef\xbb\xbfwhole file")
    assert [(d.external_id, d.text) for d in read(tmp_path / "bom.jsonl") + read(tmp_path / "bom.csv")] == \
        [("a", "x"), ("b", "y")]
    assert read(tmp_path / "bom.txt")[0].text == "whole file"


@pytest.mark.parametrize("name, header, repeated", [("in.csv", "id,tag,text,tag", "tag"),
                                                     ("in.tsv", "text\tid\ttext", "text")])
def test_a_header_that_repeats_a_name_is_refused_at_line_1(tmp_path, name, header, repeated):
    """Issue 34 item 9: the header was accepted and the first column of the name silently lost."""
    delimiter = "\t" if name.endswith(".tsv") else ","
    path = tmp_path / name
    path.write_text(header + "\n" + delimiter.join(["a", "b", "c", "d"][:header.count(delimiter) + 1]) + "\n")
    for skip_errors in (False, True):  # a header is the whole file's: never one reject
        with pytest.raises(InputError) as caught:
            read(path, skip_errors=skip_errors)
        assert (caught.value.path, caught.value.line) == (str(path), 1)
        assert str(caught.value) == (f"{path}:1: the header names the column {repeated!r} twice (columns 2 and 4)"
                                     if name.endswith(".csv") else
                                     f"{path}:1: the header names the column {repeated!r} twice (columns 1 and 3)") + \
            " (give every column its own name)"


JSON_CASES = [
    ('{"id": "a", "text": "lone \\ud800 surrogate"}',
     "the text contains an unpaired surrogate U+D800 at character 6, which UTF-8 cannot encode"),
    ('{"id": "\\udfff", "text": "x"}', "the id contains an unpaired surrogate U+DFFF at character 1, which UTF-8 cannot "
                                       "encode"),
    ('{"id": "a", "text": "x", "score": NaN}', "unreadable JSON number: NaN is not a JSON value"),
    ('{"id": "a", "text": "x", "score": -Infinity}', "unreadable JSON number: -Infinity is not a JSON value"),
    ('{"id": "a", "text": "x", "score": 1e400}', "unreadable JSON number: the number 1e400 is too large for a double"),
    ('{"id": "a", "text": "x", "n": ' + "9" * 5000 + "}", "unreadable JSON number: Exceeds the limit (4300 digits) "
                                                          "for integer string conversion: value has 5000 digits; use "
                                                          "sys.set_int_max_str_digits() to increase the limit"),
    ('{"id": "a", "text": "x", "deep": ' + "[" * 100_000 + "]" * 100_000 + "}", "the JSON is nested too deeply to read"),
    ('{"id": "a", "text": "x", "note": "\\u0000"}', "a metadata field contains a NUL character, which PostgreSQL "
                                                     "cannot store"),
    ('{"id": "a", "text": "x", "note": "\\udc00"}', "a metadata field contains an unpaired surrogate, which UTF-8 "
                                                     "cannot encode"),
]


@pytest.mark.parametrize("line, reason", JSON_CASES, ids=[r[:30] for _, r in JSON_CASES])
def test_json_values_postgresql_cannot_store_are_rejected_at_their_line(tmp_path, line, reason):
    path = tmp_path / "odd.jsonl"
    path.write_text('{"id": "ok", "text": "fine"}\n' + line + "\n")
    with pytest.raises(InputError) as caught:
        read(path)
    assert (caught.value.line, caught.value.reason) == (2, reason)
    assert summary(read(path, skip_errors=True)) == [("ok", "fine"), (2, reason)]


@pytest.mark.parametrize("line, name", [
    ('{"id": "a", "text": "first", "text": "second"}', "text"),
    ('{"id": "a", "id": "b", "text": "x"}', "id"),
    ('{"id": "a", "text": "x", "meta": {"source": "web", "source": "mail"}}', "source"),
])
def test_a_json_object_that_names_a_field_twice_is_rejected_at_its_line(tmp_path, line, name):
    """JSON keeps one value of a repeated name, which one depending on the reader: Python's json kept the last
    silently, so which text was sketched (or which id stored, or which metadata kept) was a guess."""
    path = tmp_path / "twice.jsonl"
    path.write_text('{"id": "ok", "text": "fine"}\n' + line + "\n")
    reason = f"the JSON object names the field {name!r} twice"
    with pytest.raises(InputError) as caught:
        read(path)
    assert (caught.value.path, caught.value.line, caught.value.reason) == (str(path), 2, reason)
    assert "give every field its own name" in str(caught.value)
    assert summary(read(path, skip_errors=True)) == [("ok", "fine"), (2, reason)]


def test_a_big_integer_within_limits_is_kept(tmp_path):
    path = tmp_path / "big.jsonl"
    path.write_text(json.dumps({"id": 10**30, "text": "x", "n": 10**300}) + "\n")
    (document,) = read(path)
    assert document.external_id == str(10**30) and document.metadata == {"n": 10**300}


def test_broken_gzip_files_are_errors_not_tracebacks(tmp_path):
    fake = tmp_path / "fake.jsonl.gz"
    fake.write_text('{"id": "a", "text": "x"}\n')
    with pytest.raises(InputError, match="not a gzip file, though its name ends in .gz"):
        read(fake)
    whole = gzip.compress("".join(json.dumps({"id": str(i), "text": f"t{i}" * 50}) + "\n"
                                  for i in range(2000)).encode())
    truncated = tmp_path / "cut.jsonl.gz"
    truncated.write_bytes(whole[:len(whole) // 2])
    with pytest.raises(InputError) as caught:
        read(truncated)
    assert "ends in the middle of its gzip stream" in caught.value.reason
    items = read(truncated, skip_errors=True)
    assert isinstance(items[-1], InputError) and all(isinstance(d, Document) for d in items[:-1])
    assert items[-1].line == len(items) and len(items) > 100
    txt = tmp_path / "cut.txt.gz"
    txt.write_bytes(gzip.compress(b"some text " * 1000)[:50])
    with pytest.raises(InputError, match="ends in the middle of its gzip stream"):
        read(txt)
