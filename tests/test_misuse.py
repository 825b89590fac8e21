"""Every command under every failure we know of: a short error, the right exit status, nothing written.

Each case runs one CLI command against a prepared archive (a SimHash index with a batch, a
MinHash index, a read-only role) and asserts what a user and an ingest script rely on: exit
status 2 for a usage error and 1 for any other, one short message on stderr that starts with
``Error:`` (click's usage errors add their ``Usage:`` lines), no traceback, and nothing written:
the archives' tables, the schemas and roles the test made or a case names, and the files in the
working directory are exactly as before. Only those are compared, so that other test runs on the
same server may create and drop their own schemas and roles meanwhile.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import random
import stat
import uuid

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa
import zstandard
from click.testing import CliRunner

from simdb import Index
from simdb.cli import cli
from simdb.pg.database import postgres_url

UNREACHABLE = "postgresql://simdb:secret@127.0.0.1:1/archive"
GOOD = '{"id": "new-1", "text": "a fresh document about something else entirely"}\n'

def parquet(**columns) -> bytes:
    out = io.BytesIO()
    pq.write_table(pa.table(columns), out)
    return out.getvalue()


def parquet_repeating(*names: str) -> bytes:
    """A Parquet file of one row whose schema may name a column twice (``pa.table`` would refuse that)."""
    out = io.BytesIO()
    pq.write_table(pa.Table.from_arrays([pa.array([f"{name}-{i}"]) for i, name in enumerate(names)], names=names), out)
    return out.getvalue()


#: An id past the limit of 1,000 bytes, and past the B-tree's 2,704: random hex does not compress
LONG_ID = "".join(random.Random(34).choice("0123456789abcdef") for _ in range(3000))
PARQUET = parquet(id=[f"p{i}" for i in range(500)], text=[f"parquet text {i}" for i in range(500)])

#: name -> bytes of the bad input files the cases refer to
FILES = {
    "good.jsonl": GOOD.encode(),
    "bad-utf8.jsonl": b'{"id": "a", "text": "caf\xe9"}\n',
    "bad-json.jsonl": b'{"id": "a", "text": \n',
    "nan.jsonl": b'{"id": "a", "text": "x", "score": NaN}\n',
    "surrogate.jsonl": b'{"id": "a", "text": "lone \\ud800"}\n',
    "surrogate-id.jsonl": b'{"id": "\\ud800", "text": "x"}\n',
    "digits.jsonl": b'{"id": "a", "text": "x", "n": ' + b"9" * 5000 + b"}\n",
    "deep.jsonl": b'{"id": "a", "text": "x", "d": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n",
    "not-object.jsonl": b"[1, 2]\n",
    "no-text.jsonl": b'{"id": "a", "body": "x"}\n',
    "empty-text.jsonl": b'{"id": "a", "text": "  "}\n',
    "nul.jsonl": b'{"id": "a", "text": "a\\u0000b"}\n',
    "dup-ids.jsonl": b'{"id": "a", "text": "one"}\n{"id": "a", "text": "two"}\n',
    "stored-id.jsonl": b'{"id": "doc-0", "text": "another text under a stored id"}\n',
    "binary.jsonl": bytes(range(256)) * 4,
    "fake.jsonl.gz": GOOD.encode(),
    "truncated.jsonl.gz": gzip.compress((GOOD * 2000).encode())[:300],
    "fake.jsonl.zst": GOOD.encode(),
    "truncated.jsonl.zst": zstandard.ZstdCompressor().compress(GOOD.encode() * 2000)[:40],
    "corrupt.jsonl.zst": zstandard.ZstdCompressor(write_checksum=True).compress(GOOD.encode())[:-1] + b"\x00",
    "json.parquet": GOOD.encode(),
    "truncated.parquet": PARQUET[:len(PARQUET) // 2],
    "no-text.parquet": parquet(id=[1], body=["x"]),
    "float-ids.parquet": parquet(id=[1.0], text=["x"]),
    "null-text.parquet": parquet(id=["a", "b"], text=["x", None]),
    "quote.csv": b'id,text\n1,"never closed\n2,fine\n',
    "fields.csv": b"id,text\n1,a,b\n",
    "header.csv": b"doc,body\n1,x\n",
    "repeated.csv": b"id,text,text\n1,first text,second text\n",
    "repeated.tsv": b"id\ttext\tid\n1\tthe text\t2\n",
    "repeated.parquet": parquet_repeating("id", "text", "m", "m"),
    "long-id.jsonl": ('{"id": "' + LONG_ID + '", "text": "a text under an id past the limit"}\n').encode(),
    "long-id.csv": f"id,text\n{LONG_ID},a text under an id past the limit\n".encode(),
    "bad-utf8.txt": b"caf\xe9 au lait",
    "empty.jsonl": b"",
    "unknown.dat": b"x",
    "labels.jsonl": b'{"a": "x", "b": "y", "duplicate": "yes"}\n',
    "one-label.jsonl": b'{"a": "x", "b": "y", "duplicate": true}\n',
    "pairs.svg": b'{"a": "x y z", "b": "x y z", "duplicate": true}\n{"a": "x y", "b": "u v", "duplicate": false}\n',
}
#: name -> the file in FILES it is a symlink or hard link to (outputs that are inputs by another name)
LINKS = {"symlink-good.jsonl": ("good.jsonl", os.symlink), "hardlink-good.jsonl": ("good.jsonl", os.link),
         "symlink-pairs.svg": ("pairs.svg", os.symlink)}

# (case id, archive, arguments, exit status, a fragment of the message)
# archive: "simhash" (an index with batch "first"), "minhash", "none" (no index in the schema),
# "reader" (the SimHash index, as a read-only role), "ungranted" (the MinHash index, as a role it was
# not granted to)
CASES = [
    # bad files of each kind
    *[(f"ingest-{name}", "simhash", ["ingest", name], 1, fragment) for name, fragment in [
        ("bad-utf8.jsonl", "invalid UTF-8"), ("bad-json.jsonl", "malformed JSON"), ("nan.jsonl", "NaN"),
        ("surrogate.jsonl", "unpaired surrogate"), ("surrogate-id.jsonl", "unpaired surrogate"),
        ("digits.jsonl", "4300"), ("deep.jsonl", "nested too deeply"), ("not-object.jsonl", "expected a JSON object"),
        ("no-text.jsonl", "no text field"), ("empty-text.jsonl", "empty or only whitespace"),
        ("nul.jsonl", "NUL"), ("dup-ids.jsonl", "appears twice"), ("stored-id.jsonl", "already stored with a "
                                                                                      "different text"),
        ("binary.jsonl", "malformed JSON"), ("fake.jsonl.gz", "not a gzip file"),
        ("truncated.jsonl.gz", "gzip stream"), ("fake.jsonl.zst", "not a zstd file"),
        ("truncated.jsonl.zst", "ends in the middle of its zstd stream"),
        ("corrupt.jsonl.zst", "corrupt zstd stream"), ("json.parquet", "not a Parquet file"),
        ("truncated.parquet", "the Parquet file is cut short"), ("no-text.parquet", "no text column 'text'"),
        ("float-ids.parquet", "holds double, not integers or strings"), ("null-text.parquet", "row 2: the text column"),
        ("quote.csv", "never closed"), ("fields.csv", "3 fields"),
        ("header.csv", "no id field"), ("bad-utf8.txt", "invalid UTF-8"), ("unknown.dat", "cannot tell the format"),
        ("missing.jsonl", "no such file")]],
    ("ingest-folder", "simhash", ["ingest", "folder"], 1, "the folder holds no input files"),
    ("ingest-no-match", "simhash", ["ingest", "*.ndjson"], 1, "no file matches this pattern"),
    ("ingest-truncated-parquet-skipping", "simhash", ["ingest", "good.jsonl", "truncated.parquet", "--on-error",
                                                      "skip"], 1, "the Parquet file is cut short"),
    ("ingest-rejects-folder", "simhash", ["ingest", "good.jsonl", "--on-error", "skip", "--rejects",
                                          "no/such/folder/rejects.jsonl"], 1, "the folder does not exist"),
    ("ingest-resume-unknown", "simhash", ["ingest", "good.jsonl", "--batch", "nope", "--resume"], 1,
     "no batch 'nope' to resume"),
    ("ingest-batch-taken", "simhash", ["ingest", "good.jsonl", "--batch", "first"], 1,
     "already complete; choose another name with --batch (or --resume it to write its verdicts and rejects"),
    ("ingest-no-index", "none", ["ingest", "good.jsonl"], 1, "no simdb index"),
    ("ingest-bad-option", "simhash", ["ingest", "good.jsonl", "--chunk-size", "0"], 2, "--chunk-size"),
    ("init-idf-bad-file", "none", ["init", "--idf-from", "bad-json.jsonl"], 1, "malformed JSON"),
    ("init-idf-missing", "none", ["init", "--idf-from", "missing.jsonl"], 1, "no such file"),
    ("init-max-distance-16", "none", ["init", "--max-distance", "16"], 2, "1<=x<=15"),
    ("init-impossible-layout", "none", ["init", "--max-distance", "5", "--blocks", "4"], 1, "more blocks"),
    ("init-minhash-blocks", "none", ["init", "--method", "minhash", "--blocks", "5"], 2, "SimHash options"),
    ("init-simhash-threshold", "none", ["init", "--threshold", "0.9"], 2, "MinHash options"),
    ("init-num-perm", "none", ["init", "--method", "minhash", "--num-perm", "130"], 1, "multiple of 4"),
    ("init-other-settings", "simhash", ["init", "--max-distance", "3"], 1, "max_distance: asked 3, stored 4"),
    ("init-other-method", "simhash", ["init", "--method", "minhash"], 1, "method: asked 'minhash'"),
    ("init-shards-alone", "none", ["init", "--shards", "4"], 1, "is for a distributed index: add --distributed"),
    ("init-distributed-without-citus", "none", ["init", "--distributed"], 1, "has no Citus extension"),
    ("init-copy-not-distributed", "simhash", ["init", "--copy-from", "simdb"], 2, "give it with --distributed"),
    ("init-copy-with-settings", "simhash", ["init", "--distributed", "--copy-from", "simdb", "--max-distance", "3"], 2,
     "without --max-distance"),
    # mismatched settings and bad arguments
    ("query-nothing", "simhash", ["query"], 2, "give either TEXT or --file"),
    ("query-distance", "simhash", ["query", "x", "--max-distance", "9"], 1, "between 0 and the index's maximum"),
    ("query-similarity-simhash", "simhash", ["query", "x", "--min-similarity", "0.9"], 1, "MinHash"),
    ("query-simhash-on-minhash", "minhash", ["query", "--simhash", "00ff"], 2, "MinHash index"),
    ("query-similarity-low", "minhash", ["query", "x", "--min-similarity", "0.1"], 1, "threshold"),
    ("query-bad-hex", "simhash", ["query", "--simhash", "xyz"], 2, "not a fingerprint"),
    ("query-empty-text", "simhash", ["query", "   "], 1, "empty or only whitespace"),
    ("query-no-index", "none", ["query", "x"], 1, "no simdb index"),
    ("pairs-unknown-batch", "simhash", ["pairs", "--batch", "nosuch"], 1, "no batch named 'nosuch'"),
    ("pairs-csv-unknown-batch", "simhash", ["pairs", "--format", "csv", "--batch", "nosuch"], 1, "no batch named"),
    ("pairs-distance", "simhash", ["pairs", "--max-distance", "7"], 1, "maximum distance"),
    ("export-no-index", "none", ["export"], 1, "no simdb index"),
    ("export-unknown-batch", "simhash", ["export", "--batch", "nope"], 1, "no batch named 'nope'"),
    ("export-parquet-to-stdout", "simhash", ["export", "--format", "parquet"], 1, "written to a file"),
    ("export-output-folder", "simhash", ["export", "--output", "no/such/dir/out.jsonl"], 1, "no/such/dir"),
    ("export-unique-and-canonical", "simhash", ["export", "--batch", "first", "--unique", "--canonical"], 2,
     "--unique or --canonical, not both"),
    ("check-missing", "simhash", ["check", "missing.jsonl"], 1, "no such file"),
    ("check-folder", "simhash", ["check", "folder"], 1, "the folder holds no input files"),
    ("check-truncated-parquet", "simhash", ["check", "truncated.parquet"], 1, "the Parquet file is cut short"),
    ("check-no-index", "none", ["check", "good.jsonl"], 1, "no simdb index"),
    ("check-unknown-format", "simhash", ["check", "unknown.dat"], 1, "cannot tell the format"),
    ("verdicts-unknown-batch", "simhash", ["verdicts", "--batch", "nope"], 1, "no batch named 'nope'"),
    ("verdicts-no-batch", "simhash", ["verdicts"], 2, "--batch"),
    ("ingest-verdicts-folder", "simhash", ["ingest", "good.jsonl", "--verdicts", "no/such/folder/v.jsonl"], 1,
     "cannot write the verdicts file there"),
    ("stats-no-index", "none", ["stats"], 1, "no simdb index"),
    ("show-unknown-id", "simhash", ["show", "nope"], 1, "no document with id 'nope'"),
    ("show-unknown-second-id", "simhash", ["show", "doc-0", "nope"], 1, "no document with id 'nope'"),
    ("show-nothing", "simhash", ["show"], 2, "FIRST_ID"),
    ("show-no-index", "none", ["show", "x"], 1, "no simdb index"),
    ("init-verify-simhash", "none", ["init", "--verify", "exact"], 2, "not for --method simhash: --verify"),
    ("init-verify-threshold", "none", ["init", "--method", "minhash", "--verify", "exact", "--threshold", "0.80005"],
     1, "multiple of 0.0001"),
    ("report-unknown-batch", "simhash", ["report", "--batch", "nope", "--output", "r.html"], 1, "no batch named"),
    ("report-no-output", "simhash", ["report"], 2, "--output"),
    ("report-output-folder", "simhash", ["report", "--output", "no/such/dir/r.html"], 1, "cannot write"),
    ("remove-nothing-said", "simhash", ["remove"], 1, "exactly one of"),
    ("remove-unknown-id", "simhash", ["remove", "--id", "nope"], 1, "no stored document has the id"),
    ("remove-unknown-batch", "simhash", ["remove", "--batch", "nope"], 1, "no batch named"),
    ("compact-no-index", "none", ["compact"], 1, "no simdb index"),
    ("init-segment-too-small", "none", ["init", "--segment-size", "10"], 2, "--segment-size"),
    ("init-merge-factor-one", "none", ["init", "--merge-factor", "1"], 2, "--merge-factor"),
    ("relayout-same", "simhash", ["relayout", "--blocks", "6"], 1, "already uses 6 blocks"),
    ("relayout-minhash", "minhash", ["relayout"], 1, "bands are fixed"),
    ("relayout-minhash-blocks", "minhash", ["relayout", "--blocks", "5"], 1, "bands are fixed"),
    ("sql-functions-no-index", "none", ["sql-functions"], 1, "no simdb index"),
    ("sync-run-unknown", "simhash", ["sync", "run", "nope"], 1, "no sync source named 'nope'"),
    ("sync-add-both", "simhash", ["sync", "add", "x", "--table", "public.t", "--query", "SELECT 1", "--id", "id",
                                  "--text", "t"], 1, "exactly one of --table (schema.table) or --query"),
    ("sync-add-no-table", "simhash", ["sync", "add", "x", "--table", "public.no_such_table_here", "--id", "id",
                                      "--text", "t"], 1, "sync source 'x' cannot be read"),
    ("sync-add-bad-name", "simhash", ["sync", "add", "a b", "--table", "public.t", "--id", "id", "--text", "t"], 1,
     "invalid sync source name"),
    ("sync-add-lag-alone", "simhash", ["sync", "add", "x", "--table", "public.t", "--id", "id", "--text", "t",
                                       "--lag", "5 minutes"], 1, "give --watermark"),
    ("sync-add-bad-lag", "simhash", ["sync", "add", "x", "--table", "public.t", "--id", "id", "--text", "t",
                                     "--watermark", "w", "--lag", "soon"], 2, "--lag"),
    ("count-by-blank-field", "simhash", ["count-by", "add", " "], 1, "a metadata field's name"),
    ("count-by-no-index", "none", ["count-by", "list"], 1, "no simdb index"),
    ("init-count-by-not-counted", "simhash", ["init", "--count-by", "region"], 1, "simdb count-by add region"),
    ("grant-bad-role", "simhash", ["grant-reader", "Bad-Name"], 1, "invalid role name"),
    ("grant-admin-role", "simhash", ["grant-reader", "postgres"], 1, "administrative role"),
    ("grant-no-password", "simhash", ["grant-reader", "someone", "--password-env", "SIMDB_NO_SUCH_VAR"], 1,
     "is not set"),
    ("fingerprint-nothing", "none", ["fingerprint"], 2, "give either TEXT or --file"),
    ("fingerprint-empty", "none", ["fingerprint", " "], 1, "empty or only whitespace"),
    ("fingerprint-index-none", "none", ["fingerprint", "--index", "some text"], 1, "no simdb index"),
    ("fingerprint-index-tokenizer", "simhash", ["fingerprint", "--index", "--tokenizer", "jieba", "x"], 2,
     "--tokenizer is the index's own"),
    ("fingerprint-index-minhash-tokens", "minhash", ["fingerprint", "--index", "--tokens", "x y z"], 2,
     "this index uses MinHash"),
    ("calibrate-bad-label", "none", ["calibrate", "labels.jsonl", "--plot", "p.svg"], 1, "not true or false"),
    ("calibrate-one-label", "none", ["calibrate", "one-label.jsonl", "--plot", "p.svg"], 1, "same label"),
    ("calibrate-missing", "none", ["calibrate", "missing.jsonl"], 1, "no such file"),
    ("calibrate-truncated-parquet", "none", ["calibrate", "truncated.parquet"], 1, "the Parquet file is cut short"),
    ("calibrate-documents-not-parquet", "none", ["calibrate", "labels.jsonl", "--documents", "json.parquet"], 1,
     "not a Parquet file"),
    ("init-idf-truncated-zst", "none", ["init", "--idf-from", "truncated.jsonl.zst"], 1, "zstd stream"),
    # missing privileges: a read-only role, and a role on a schema it was not granted
    *[(f"reader-{args[0]}", "reader", args, 1, "read-only") for args in [
        ["ingest", "good.jsonl"], ["remove", "--id", "doc-0"], ["init"], ["grant-reader", "someone_else"],
        ["relayout", "--blocks", "5"], ["count-by", "add", "source"]]],
    ("reader-sql-functions", "reader", ["sql-functions"], 1, "only a superuser"),
    ("reader-relayout-default-blocks", "reader", ["relayout"], 1, "run this as the role that owns the index"),
    ("reader-ingest-skip", "reader", ["ingest", "good.jsonl", "--on-error", "skip"], 1, "read-only"),
    *[(f"ungranted-{args[0]}", "ungranted", args, 1, "permission denied for schema") for args in [
        ["report", "--output", "r.html"], ["stats"], ["export"], ["pairs"], ["query", "x"]]],
    # reserved schemas and bad names
    *[(f"reserved-{schema}-{args[0]}", "none", [*args, "--schema", schema], 1, "reserved by PostgreSQL")
      for schema in ("pg_catalog", "information_schema") for args in [["init"], ["ingest", "good.jsonl"], ["stats"],
                                                                       ["report", "--output", "r.html"]]],
    ("schema-injection", "none", ["init", "--schema", "x; DROP TABLE y"], 1, "invalid schema name"),
    # an unreachable server, for every command that needs one
    *[(f"unreachable-{args[0]}", "none", [*args, "--database-url", UNREACHABLE], 1, "cannot connect") for args in [
        ["init"], ["ingest", "good.jsonl"], ["query", "x"], ["pairs"], ["export"], ["stats"],
        ["report", "--output", "r.html"], ["remove", "--id", "x"], ["relayout"], ["grant-reader", "someone"],
        ["compact"]]],
    ("not-postgresql", "none", ["stats", "--database-url", "mysql://root@127.0.0.1/x"], 1, "not supported"),
    # a password in a URL's query or in a libpq connection string is never printed
    ("unreachable-query-password", "none", ["stats", "--database-url",
                                            "postgresql://simdb@127.0.0.1:1/archive?password=secret"], 1,
     "cannot connect to postgresql://simdb@127.0.0.1:1/archive?password=***"),
    ("unreachable-conninfo-password", "none", ["stats", "--database-url",
                                               "host=127.0.0.1 port=1 user=simdb password=secret dbname=archive"], 1,
     "cannot connect to postgresql://simdb:***@127.0.0.1:1/archive"),
    ("conninfo-unquoted-password", "none", ["stats", "--database-url", "host=127.0.0.1 password=a secret"], 1,
     "cannot parse the database URL"),
    # an output that is an input (by name, symlink or hard link), or another output: refused before anything
    *[(f"ingest-{option[2:]}-is-{alias}", "simhash", ["ingest", "good.jsonl", "--on-error", "skip", option, alias],
       1, "is the input file good.jsonl") for option in ("--verdicts", "--rejects")
      for alias in ("good.jsonl", "symlink-good.jsonl", "hardlink-good.jsonl")],
    ("ingest-default-rejects-is-input", "simhash", ["ingest", "rejects-b.jsonl", "--batch", "b", "--on-error", "skip"],
     1, "--rejects rejects-b.jsonl is the input file"),
    ("ingest-verdicts-are-rejects", "simhash", ["ingest", "good.jsonl", "--on-error", "skip", "--verdicts", "out.jsonl",
                                               "--rejects", "out.jsonl"], 1, "is the same file as --verdicts"),
    ("calibrate-plot-is-input", "none", ["calibrate", "pairs.svg", "--plot", "symlink-pairs.svg"], 1,
     "--plot symlink-pairs.svg is the input file pairs.svg"),
    ("calibrate-plot-format", "none", ["calibrate", "pairs.svg", "--plot", "plot.txt"], 1,
     "cannot write a plot as .txt"),
    ("export-output-is-folder", "simhash", ["export", "--output", "folder"], 2, "is a directory"),
    # a full device (ENOSPC) is one line, and the device stays a device
    ("export-to-dev-full", "simhash", ["export", "--output", "/dev/full"], 1,
     "/dev/full: cannot write the export: No space left on device"),
    ("report-to-dev-full", "simhash", ["report", "--output", "/dev/full"], 1,
     "/dev/full: cannot write the report: No space left on device"),
    # an id past the limit stops an ingest at its line; a header that names a column twice stops every reader
    *[(f"ingest-{name}", "simhash", ["ingest", name], 1,
       "the id is 3,000 bytes of UTF-8, over the limit of 1,000") for name in ("long-id.jsonl", "long-id.csv")],
    *[(f"{command}-{name}{'-skipping' if skip else ''}", "simhash", [command, name, *skip], 1,
       f"{name}:1: the header names the column {column!r} twice")
      for command in ("ingest", "check") for name, column in (("repeated.csv", "text"), ("repeated.tsv", "id"))
      for skip in ([], ["--on-error", "skip"]) if not (skip and command == "check")],
    ("ingest-repeated.parquet", "simhash", ["ingest", "repeated.parquet", "--on-error", "skip"], 1,
     "repeated.parquet: the schema names the column 'm' twice"),
    ("calibrate-documents-repeated-header", "none", ["calibrate", "labels.jsonl", "--documents", "repeated.csv"], 1,
     "repeated.csv:1: the header names the column 'text' twice"),
    # a hint names the option as the command line spells it
    ("ingest-no-text-hint", "simhash", ["ingest", "no-text.jsonl"], 1, "name the text field with --text-field"),
    ("report-output-is-folder", "simhash", ["report", "--output", "folder"], 2, "is a directory"),
]


@pytest.fixture(scope="module")
def archives(server_url):
    """The SimHash and MinHash archives and the read-only role every case starts from."""
    names = {"simhash": f"simdb_misuse_{uuid.uuid4().hex[:8]}", "minhash": f"simdb_misuse_{uuid.uuid4().hex[:8]}"}
    reader = f"simdb_misuse_reader_{uuid.uuid4().hex[:8]}"
    documents = [{"id": f"doc-{i}", "text": f"document number {i} is about topic {i % 5}, at some length"}
                 for i in range(30)]
    documents.append({"id": "doc-0-copy", "text": documents[0]["text"]})  # a pair, for the commands that print pairs
    with Index.create(server_url, schema=names["simhash"]) as index:
        index.add_many(documents, batch="first")
        index.grant_reader(reader, login=True)
    with Index.create(server_url, schema=names["minhash"], method="minhash") as index:
        index.add_many(documents, batch="first")
    engine = sa.create_engine(postgres_url(server_url))
    yield names, reader
    with engine.begin() as connection:
        for schema in names.values():
            connection.exec_driver_sql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        connection.exec_driver_sql(f"DROP OWNED BY {reader}")
        connection.exec_driver_sql(f"DROP ROLE {reader}")
    engine.dispose()


def snapshot(engine: sa.Engine, directory, archives: set[str], schemas: set[str], roles: set[str]) -> tuple:
    """Everything a failed command must leave as it was: the content of every table of the ``archives`` schemas,
    which of the ``schemas`` and ``roles`` exist (those this test made or a case names), and the files. Only
    those: other test runs may create and drop schemas and roles on the same server meanwhile."""
    with engine.connect() as connection:
        present = sorted(connection.execute(sa.text("SELECT nspname FROM pg_namespace WHERE nspname = ANY(:names)"),
                                            {"names": sorted(archives | schemas)}).scalars())
        tables = connection.execute(sa.text(
            "SELECT table_schema, table_name FROM information_schema.tables WHERE table_schema = ANY(:names) "
            "ORDER BY 1, 2"), {"names": sorted(archives)}).all()
        contents = {f"{s}.{t}": connection.exec_driver_sql(
            f'SELECT md5(coalesce(string_agg(x::text, \',\' ORDER BY x::text), \'\')) FROM "{s}"."{t}" x').scalar_one()
            for s, t in tables}
        found = sorted(connection.execute(sa.text(
            "SELECT rolname, rolcanlogin FROM pg_roles WHERE rolname = ANY(:names)"), {"names": sorted(roles)}).all())
    files = sorted((path, os.path.getsize(os.path.join(directory, path))) for path in os.listdir(directory))
    return present, contents, found, files


@pytest.mark.parametrize("case, archive, arguments, status, fragment", CASES, ids=[c[0] for c in CASES])
def test_misuse_is_a_short_error_that_writes_nothing(case, archive, arguments, status, fragment, archives,
                                                     database_url, admin_engine, tmp_path, monkeypatch):
    names, reader = archives
    monkeypatch.chdir(tmp_path)
    for name, content in FILES.items():
        (tmp_path / name).write_bytes(content)
    (tmp_path / "rejects-b.jsonl").write_bytes(GOOD.encode())
    for name, (original, link) in LINKS.items():
        link(original, tmp_path / name)
    (tmp_path / "folder").mkdir()
    url = database_url
    if archive in ("reader", "ungranted"):
        url = postgres_url(database_url).set(username=reader, password=None).set(
            drivername="postgresql").render_as_string(hide_password=False)
    schema = {"simhash": names["simhash"], "reader": names["simhash"], "minhash": names["minhash"],
              "ungranted": names["minhash"]}.get(archive, f"simdb_test_{uuid.uuid4().hex[:12]}")
    env = {"SIMDB_DATABASE_URL": url, "SIMDB_SCHEMA": schema, "SIMDB_DATA_DIR": str(tmp_path / "no-embedded")}
    named = set(arguments)  # a schema (--schema, --copy-from) or a role (grant-reader) a case names
    watched = ({*names.values(), schema}, {"simdb", *named}, {reader, *named})
    before = snapshot(admin_engine, tmp_path, *watched)
    result = CliRunner().invoke(cli, arguments, env=env)
    after = snapshot(admin_engine, tmp_path, *watched)
    if archive == "none":  # a case that needed no index must not have made one
        with admin_engine.connect() as connection:
            assert not connection.execute(sa.text(
                "SELECT count(*) FROM information_schema.tables WHERE table_schema = :s"), {"s": schema}).scalar_one()
    assert isinstance(result.exception, (SystemExit, type(None))), f"unhandled {result.exception!r}"
    assert "Traceback" not in result.output
    assert result.exit_code == status, result.output
    assert result.stdout == ""
    message = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(message) == 1 and fragment in message[0], result.stderr
    assert len(message[0]) < 600 and "secret" not in result.output
    if status == 1:
        assert result.stderr == message[0] + "\n"
    assert after == before


def test_every_command_has_a_misuse_case():
    covered = {arguments[0] for _, _, arguments, _, _ in CASES}
    assert covered >= set(cli.commands)


@pytest.mark.slow
def test_an_ingest_whose_connection_is_cut_says_what_it_kept_and_how_to_resume(database_url, schema, admin_engine,
                                                                                 tmp_path):
    """Issue 9: the server ended the session mid-ingest; the message said nothing was kept. The ingest connects
    as a role of its own, and only that role's sessions are cut: not those of another test run on the server
    (another xdist worker's, another checkout's)."""
    import subprocess
    import sys
    import time

    role = f"{schema}_cut"
    # the test database's URL as that role (a server that asks for passwords asked for none in the hint below)
    url = sa.engine.make_url(postgres_url(database_url)).set(drivername="postgresql", username=role).render_as_string()
    with admin_engine.begin() as connection:
        connection.exec_driver_sql(f"CREATE ROLE {role} LOGIN SUPERUSER")
    try:
        path = tmp_path / "in.jsonl"
        path.write_text("".join(json.dumps({"id": f"d{i}", "text": f"document {i} with words {i * 7} and {i % 13}"})
                                + "\n" for i in range(5_000)))
        base = [sys.executable, "-m", "simdb", "--help"][:3]
        command = [*base, "ingest", str(path), "--batch", "cut", "--chunk-size", "500", "--workers", "1",
                   "--database-url", url, "--schema", schema]
        subprocess.run([*base, "init", "--database-url", url, "--schema", schema], check=True, capture_output=True)
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        stored = 0
        while stored < 1000 and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.05)
            with admin_engine.connect() as connection:
                stored = connection.execute(sa.text(f"SELECT coalesce(sum(documents), 0) FROM {schema}.batches")
                                            ).scalar_one()
        while process.poll() is None and time.monotonic() < deadline:  # cut it inside a chunk's transaction
            with admin_engine.begin() as connection:
                connection.execute(sa.text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE "
                                           "usename = :role AND state <> 'idle'"), {"role": role})
            time.sleep(0.01)
        out, err = process.communicate(timeout=120)
        if process.returncode == 0:
            pytest.skip("the ingest finished before its connection could be cut")
        with admin_engine.connect() as connection:
            row = connection.execute(sa.text(f"SELECT status, position, documents FROM {schema}.batches")).one()
        assert process.returncode == 1 and "Traceback" not in err
        assert row.status == "running" and row.documents >= 1000
        (line,) = err.strip().splitlines()
        assert line.startswith("Error: lost the database connection")
        assert (f"batch 'cut' keeps what its committed chunks stored ({row.documents:,} documents from the first "
                f"{row.position:,} input records)") in line
        resume = line.split("`")[1]
        assert resume == (f"simdb ingest {path} --database-url {url} --schema {schema} --workers 1 "
                          "--chunk-size 500 --batch cut --resume")
        finished = subprocess.run([*base, *resume.split()[1:]], capture_output=True, text=True)
        assert finished.returncode == 0, finished.stderr
        assert "batch 'cut': 5,000 documents" in finished.stdout
    finally:
        with admin_engine.begin() as connection:
            connection.exec_driver_sql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
            connection.exec_driver_sql(f"DROP OWNED BY {role}")
            connection.exec_driver_sql(f"DROP ROLE {role}")


# -- misuse that must succeed: what a command does with an output it may not replace, a secret, a closed pipe ----

def invoke(url: str, schema: str, *arguments: str):
    return CliRunner().invoke(cli, list(arguments), env={"SIMDB_DATABASE_URL": url, "SIMDB_SCHEMA": schema})


def test_export_unique_keeps_a_new_document_that_a_later_one_links_to_an_older_cluster(index, run):
    """Issue 34 item 1: ``--unique`` selected ``id = cluster_id`` and dropped the batch's only new document."""
    from tests.test_exports import minimal_case

    minimal_case(index)  # batch one: P ("one-0"); batch two: X ("two-0", near nothing), then Y (near P and X)
    result = run("export", "--batch", "two", "--unique")
    assert [json.loads(line)["id"] for line in result.stdout.splitlines()] == ["two-0"]
    # item 5: a verdict is history: it keeps the id it named after that document is removed
    assert run("remove", "--batch", "one").exit_code == 0
    assert [(v["id"], v["status"], v["duplicate_of"]) for v in map(json.loads, run(
        "verdicts", "--batch", "two").stdout.splitlines())] == [("two-0", "new", None), ("two-1", "near", "one-0")]


def test_a_reject_keeps_its_readable_id_and_its_hint_names_the_option(run, tmp_path, monkeypatch):
    """Issue 34 item 12: a rejected record whose id was readable got ``"id": null``; its hint said ``text_field``."""
    monkeypatch.chdir(tmp_path)
    for name in ("no-text.jsonl", "empty-text.jsonl", "long-id.jsonl"):
        (tmp_path / name).write_bytes(FILES[name])
    assert run("init").exit_code == 0
    result = run("ingest", "no-text.jsonl", "empty-text.jsonl", "long-id.jsonl", "--on-error", "skip", "--batch", "b",
                 "--verdicts", "v.jsonl")
    assert result.exit_code == 3, result.output
    written = [json.loads(line) for line in (tmp_path / "v.jsonl").read_text().splitlines()]
    assert [(v["id"], v["status"], v["hint"]) for v in written] == [
        ("a", "rejected", "name the text field with --text-field"),
        ("a", "rejected", "drop the document or give it text"),
        (LONG_ID, "rejected", "give the document a shorter id (a hash of a long one, for instance)")]


def test_an_output_at_a_device_a_symlink_or_beside_a_partial_file_is_written_into_and_nothing_else(
        archives, database_url, tmp_path):
    """Issue 34 items 3 and 10: ``--output`` renamed a temporary file over a device (``/dev/full``) or a symlink and
    removed an unrelated ``PATH.partial``; ENOSPC was a traceback."""
    from tests.test_outputs import device

    names, _ = archives
    null, full = device(tmp_path / "null", "null"), device(tmp_path / "full", "full")
    (tmp_path / "target.jsonl").write_text("old\n")
    os.symlink("target.jsonl", tmp_path / "link.jsonl")
    (tmp_path / "out.jsonl.partial").write_text("someone else's file\n")
    for command in (["export"], ["report"]):
        assert invoke(database_url, names["simhash"], *command, "--output", str(null)).exit_code == 0
        result = invoke(database_url, names["simhash"], *command, "--output", str(full))
        assert (result.exit_code, result.stderr) == \
            (1, f"Error: {full}: cannot write the {command[0]}: No space left on device\n")
    exported = invoke(database_url, names["simhash"], "export").stdout
    assert invoke(database_url, names["simhash"], "export", "--output", str(tmp_path / "link.jsonl")).exit_code == 0
    assert invoke(database_url, names["simhash"], "export", "--output", str(tmp_path / "out.jsonl")).exit_code == 0
    assert os.readlink(tmp_path / "link.jsonl") == "target.jsonl"
    assert (tmp_path / "target.jsonl").read_text() == exported == (tmp_path / "out.jsonl").read_text()
    assert (tmp_path / "out.jsonl.partial").read_text() == "someone else's file\n"
    assert all(stat.S_ISCHR(os.lstat(path).st_mode) for path in (null, full))


def test_a_full_verdicts_file_is_one_line_that_says_the_batch_is_kept(database_url, schema, admin_engine, tmp_path):
    """Issue 34 item 10: ENOSPC on the verdicts file printed a traceback after the batch had committed."""
    from tests.test_outputs import device

    full = device(tmp_path / "full", "full")
    (tmp_path / "in.jsonl").write_text(GOOD)
    assert invoke(database_url, schema, "init").exit_code == 0
    result = invoke(database_url, schema, "ingest", str(tmp_path / "in.jsonl"), "--batch", "b", "--verdicts", str(full))
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.stderr.splitlines()[-1] == (
        f"Error: {full}: cannot write the verdicts file: No space left on device; batch 'b' is stored whole (1 "
        f"documents from the first 1 input records): `simdb verdicts --batch b > {full}` writes the verdicts file "
        "again")
    with admin_engine.connect() as connection:
        assert connection.execute(sa.text(f"SELECT status, documents FROM {schema}.batches")).one() == ("complete", 1)


def test_a_password_in_the_url_query_or_a_conninfo_string_is_printed_by_no_command(archives, database_url,
                                                                                     tmp_path):
    """Issue 34 item 11: ``?password=`` and libpq ``password=`` were printed by stats, init and the report."""
    names, _ = archives
    url = postgres_url(database_url)
    secret = url.password or "not-a-real-secret-h34b"  # the server may not ask for it (trust): any works then
    plain = url.set(password=None, drivername="postgresql")
    spelled = [plain.update_query_dict({"password": secret}).render_as_string(hide_password=False),
               " ".join(f"{key}={value}" for key, value in [("host", url.host), ("port", url.port or 5432),
                                                           ("user", url.username), ("password", secret),
                                                           ("dbname", url.database)] if value is not None)]
    for given in spelled:
        for arguments in (["stats"], ["stats", "--json"], ["init"], ["report", "--output", str(tmp_path / "r.html")]):
            result = invoke(given, names["simhash"], *arguments)
            assert result.exit_code == 0, result.output
            assert secret not in result.output
        assert secret not in (tmp_path / "r.html").read_text()


def test_grant_reader_on_a_second_schema_keeps_the_role_s_login(archives, database_url, admin_engine):
    """Issue 34 item 12: without ``--login`` it took LOGIN from a role that had it."""
    names, _ = archives
    role = f"simdb_misuse_login_{uuid.uuid4().hex[:8]}"
    try:
        assert invoke(database_url, names["simhash"], "grant-reader", role, "--login").exit_code == 0
        assert invoke(database_url, names["minhash"], "grant-reader", role).exit_code == 0
        with admin_engine.connect() as connection:
            assert connection.execute(sa.text("SELECT rolcanlogin FROM pg_roles WHERE rolname = :r"),
                                      {"r": role}).scalar_one()
    finally:
        with admin_engine.begin() as connection:
            connection.exec_driver_sql(f"DROP OWNED BY {role}")
            connection.exec_driver_sql(f"DROP ROLE IF EXISTS {role}")


@pytest.mark.parametrize("arguments", [["export"], ["pairs"], ["pairs", "--format", "csv"], ["verdicts", "--batch",
                                                                                            "first"]])
def test_a_closed_pipe_is_a_normal_end(archives, database_url, arguments):
    """Issue 34 item 12: ``simdb pairs | head -n 1`` exited 1. Here the pipe's reader is gone before simdb writes."""
    import subprocess
    import sys

    names, _ = archives
    assert invoke(database_url, names["simhash"], *arguments).stdout  # there is something to write
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        finished = subprocess.run([sys.executable, "-m", "simdb", *arguments, "--database-url", database_url,
                                   "--schema", names["simhash"]], stdout=write_end, stderr=subprocess.PIPE,
                                  text=True, timeout=120)
    finally:
        os.close(write_end)
    assert (finished.returncode, finished.stderr) == (0, "")


def test_a_merge_that_fails_after_the_last_chunk_leaves_a_complete_batch_and_exit_0(run, schema, admin_engine,
                                                                                    tmp_path, monkeypatch):
    """Issue 34 item 6: merging segments after a batch's last chunk is housekeeping. When it failed with simdb's
    own error (then: "segments ... are not adjacent"), the command exited 1 and offered to resume a batch that
    was complete. It warns in one line, exits 0, and the next `simdb compact` merges."""
    from simdb import SimdbError
    from simdb.pg import segments

    real_merge = segments.merge

    def failing_merge(*args, **kwargs):
        raise SimdbError("segments documents_a and documents_b cannot be merged (a test's failure)")

    assert run("init", "--segment-size", "1000", "--merge-factor", "2", "--bulk-chunk", "10").exit_code == 0
    monkeypatch.setattr(segments, "merge", failing_merge)
    results = []
    for number in range(4):  # one bulk chunk each, the batch's last: the merges due after them fail
        path = tmp_path / f"b{number}.jsonl"
        path.write_text("".join(json.dumps({"id": f"{number}-{i}", "text": f"text {number} {i} " * 8}) + "\n"
                                for i in range(10)))
        results.append(run("ingest", str(path), "--batch", f"b{number}", "--workers", "1", "--json"))
    for result in results:
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["documents"] == 10
        assert "Traceback" not in result.output and "resume" not in result.output
    failed = [result for result in results if json.loads(result.stdout)["merge_failed"]]
    assert failed, "no merge was due: the test tried nothing"
    for result in failed:
        (line,) = result.stderr.splitlines()
        assert line.startswith("warning: merging segments failed") and "simdb compact" in line
    with admin_engine.connect() as connection:
        assert connection.exec_driver_sql(f"SELECT array_agg(DISTINCT status) FROM {schema}.batches"
                                          ).scalar_one() == ["complete"]
    monkeypatch.setattr(segments, "merge", real_merge)
    result = run("compact", "--json")
    assert result.exit_code == 0 and json.loads(result.stdout)["merged"], result.output
