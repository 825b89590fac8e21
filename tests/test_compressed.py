"""Compressed inputs: a ``.zst`` or ``.gz`` file reads as its content does, and a truncated or damaged one is an
error that says so, never a shorter input read in silence."""

from __future__ import annotations

import gzip
import json

import pytest
import zstandard

from simdb import InputError
from simdb.calibrate import read_pairs
from simdb.inputs import Document, read_documents

RECORDS = [{"id": f"d{i}", "text": f"text number {i} " * 20, "tag": i % 3} for i in range(3000)]
JSONL = "".join(json.dumps(record) + "\n" for record in RECORDS).encode()


def compress(data: bytes, **options) -> bytes:
    return zstandard.ZstdCompressor(**options).compress(data)


def read(path, **options):
    return list(read_documents([str(path)], **options))


def as_records(items):
    return [{"id": d.external_id, "text": d.text, **d.metadata} for d in items]


@pytest.mark.parametrize("suffix, data", [
    (".jsonl.zst", JSONL),
    (".csv.zst", b"id,text,tag\n" + b"".join(f"{r['id']},{r['text']},{r['tag']}\n".encode() for r in RECORDS)),
    (".tsv.zst", b"id\ttext\ttag\n" + b"".join(f"{r['id']}\t{r['text']}\t{r['tag']}\n".encode() for r in RECORDS)),
])
def test_every_record_of_a_zst_file_is_read_as_written(tmp_path, suffix, data):
    path = tmp_path / f"in{suffix}"
    path.write_bytes(compress(data, write_checksum=True))
    items = read(path)
    expected = RECORDS if suffix == ".jsonl.zst" else [{**r, "tag": str(r["tag"])} for r in RECORDS]
    assert as_records(items) == expected
    assert [d.line for d in items] == list(range(1, 3001)) if suffix == ".jsonl.zst" else list(range(2, 3002))


def test_a_file_of_several_frames_is_read_whole(tmp_path):
    """zstd -c a b > ab.zst, pzstd and seekable zstd write one frame after another: every frame is read."""
    path = tmp_path / "frames.jsonl.zst"
    third = len(JSONL) // 3
    cut = JSONL.rfind(b"\n", 0, third) + 1
    path.write_bytes(compress(JSONL[:cut]) + compress(b"") + compress(JSONL[cut:], write_checksum=True))
    assert as_records(read(path)) == RECORDS


def test_a_text_file_and_an_idf_sample_read_through_zstd(tmp_path):
    text = "un texte entier, 一篇完整的文章\n" * 50
    (tmp_path / "whole.txt.zst").write_bytes(compress(text.encode()))
    (document,) = read(tmp_path / "whole.txt.zst")
    assert document.text == text and document.external_id == str(tmp_path / "whole.txt.zst")


def test_labelled_pairs_and_their_documents_read_through_zstd(tmp_path):
    (tmp_path / "pairs.jsonl.zst").write_bytes(compress(b'{"a": "d1", "b": "d2", "duplicate": false}\n'))
    (tmp_path / "docs.jsonl.zst").write_bytes(compress(JSONL))
    (pair,) = read_pairs(tmp_path / "pairs.jsonl.zst", documents=tmp_path / "docs.jsonl.zst")
    assert (pair.a, pair.b, pair.duplicate) == (RECORDS[1]["text"], RECORDS[2]["text"], False)


@pytest.mark.parametrize("suffix", [".jsonl.zst", ".txt.zst"])
def test_a_truncated_zst_file_is_an_error_at_the_line_where_reading_stopped(tmp_path, suffix):
    """Regression: the decompressor ends a frame cut short without a word, and half the file was read as all."""
    whole = compress(JSONL, write_checksum=True)
    path = tmp_path / f"cut{suffix}"
    path.write_bytes(whole[:len(whole) // 2])
    with pytest.raises(InputError) as caught:
        read(path)
    assert "ends in the middle of its zstd stream" in caught.value.reason
    assert caught.value.hint == "the file is truncated or damaged: copy it again"
    assert "\n" not in str(caught.value)
    if suffix == ".jsonl.zst":
        items = read(path, skip_errors=True)
        assert all(isinstance(d, Document) for d in items[:-1]) and isinstance(items[-1], InputError)
        assert len(items) > 100 and items[-1].line == len(items)
        assert as_records(items[:-1]) == RECORDS[:len(items) - 1]


def test_a_file_cut_between_frames_reads_the_whole_frames(tmp_path):
    path = tmp_path / "frames.jsonl.zst"
    path.write_bytes(compress(JSONL[:JSONL.index(b"\n") + 1]) + compress(JSONL)[:-3])
    items = read(path, skip_errors=True)
    assert as_records(items[:1]) == RECORDS[:1] and "zstd stream" in items[-1].reason


def test_a_corrupt_zst_file_is_an_error_naming_the_file(tmp_path):
    whole = bytearray(compress(JSONL, write_checksum=True))
    whole[len(whole) // 2] ^= 0x5A
    path = tmp_path / "damaged.jsonl.zst"
    path.write_bytes(bytes(whole))
    with pytest.raises(InputError) as caught:
        read(path)
    assert str(caught.value).startswith(f"{path}:")
    assert "has a corrupt zstd stream" in caught.value.reason and "\n" not in str(caught.value)


def test_a_file_named_zst_that_is_not_one_is_an_error(tmp_path):
    path = tmp_path / "plain.jsonl.zst"
    path.write_bytes(JSONL[:500])
    with pytest.raises(InputError, match=r"plain.jsonl.zst:1: not a zstd file, though its name ends in .zst"):
        read(path)
    txt = tmp_path / "plain.txt.zst"
    txt.write_bytes(b"just text")
    with pytest.raises(InputError, match="not a zstd file"):
        read(txt)


@pytest.mark.parametrize("at, reason", [(-6, "CRC check failed"), (-2, "Incorrect length of data produced")])
def test_a_gzip_file_whose_check_fails_is_corrupt_not_another_format(tmp_path, at, reason):
    """Regression: a CRC mismatch at the end of a gzip file was reported as "not a gzip file" at the line after
    the last one, as if the file had been named wrongly."""
    whole = bytearray(gzip.compress(JSONL))
    whole[at] ^= 0x01
    path = tmp_path / "crc.jsonl.gz"
    path.write_bytes(bytes(whole))
    items = read(path, skip_errors=True)
    assert as_records(items[:-1]) == RECORDS
    assert items[-1].line == 3001
    assert items[-1].reason.startswith(f"the file has a corrupt gzip stream ({reason}")
    assert items[-1].reason.endswith("; line 3000 was the last one read")
    assert items[-1].hint == "the file is truncated or damaged: copy it again"
