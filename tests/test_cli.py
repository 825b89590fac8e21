"""The command line, with exact output, and every kind of bad input."""

import json
import re

import pytest
from click.testing import CliRunner

from simdb import native, __version__, fingerprint
from simdb.cli import cli
from simdb.pg.database import redact
from simdb.samples import corpus
from simdb.methods.simhash.blocks import DEFAULT_MAX_DISTANCE as K
from tests.conftest import count_rows

SECTION_A = ("Assert statements are a convenient way to insert debugging assertions into a program. "
             "The simple form is equivalent to raising AssertionError when the expression is false.")


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return str(path)


def expected_counts(records):
    """(exact, near) duplicates of a batch computed by brute force, in input order."""
    exact = near = 0
    for i, record in enumerate(records):
        earlier = records[:i]
        if any(r["text"] == record["text"] for r in earlier):
            exact += 1
        elif any((fingerprint(r["text"]) ^ fingerprint(record["text"])).bit_count() <= K for r in earlier):
            near += 1
    return exact, near


def timeless(text):
    return re.sub(r" in \d+\.\d s", " in <t> s", text)


def test_version_and_help():
    runner = CliRunner()
    assert runner.invoke(cli, ["--version"]).output == (f"simdb, version {__version__} "
                                                         f"(compiled fast paths: {native.description()})\n")
    for command in cli.commands:
        result = runner.invoke(cli, [command, "-h"])
        assert result.exit_code == 0
        assert "Example:" in result.output, f"`simdb {command} --help` has no example"


def test_the_top_level_help_names_both_methods():
    """Issue 38: `simdb --help` mentioned SimHash only; a new user learnt of MinHash nowhere before `init --help`."""
    text = " ".join(CliRunner().invoke(cli, ["--help"]).output.split())
    assert "SimHash (the default)" in text
    assert "MinHash-LSH (--method minhash)" in text and "--verify exact" in text


def test_fingerprint_prints_16_hex_digits():
    result = CliRunner().invoke(cli, ["fingerprint", SECTION_A])
    assert result.output == f"{fingerprint(SECTION_A):016x}\n"
    tokens = CliRunner().invoke(cli, ["fingerprint", "--tokens", "Hello, big World"])
    assert tokens.output == f"hello big world\n{fingerprint('Hello, big World'):016x}\n"
    assert CliRunner().invoke(cli, ["fingerprint"]).exit_code == 2


@pytest.mark.parametrize("arguments", [[], ["--help"], ["init", "--help"], ["fingerprint", SECTION_A],
                                       ["fingerprint", "--tokens", "Hello, big World"], ["--version"]])
def test_commands_without_a_database_start_without_its_libraries(arguments):
    """Issue 38: `import simdb.cli` loaded SQLAlchemy, alembic and psycopg (0.7 s) to fingerprint a string, and a
    fingerprint loaded the Chinese segmenter's dictionary for English. In a fresh interpreter, neither importing
    the CLI nor a command that needs no database loads them, nor what only other paths need: psutil (the
    embedded server's watcher), threadpoolctl (numpy's weighted sums), multiprocessing (ingest's workers), the
    email package (importlib.metadata: the segmenter's version)."""
    import subprocess
    import sys

    code = ("import json, sys\nimport simdb.cli\n"
            "if sys.argv[1:]:\n"
            "    try:\n        simdb.cli.cli(sys.argv[1:], prog_name='simdb')\n    except SystemExit as exc:\n"
            "        assert not exc.code, exc.code\n"
            "print(json.dumps(sorted({name.partition('.')[0] for name in sys.modules} & "
            "{'sqlalchemy', 'alembic', 'psycopg', 'pgserver', 'psutil', 'jieba', 'rjieba', 'threadpoolctl', "
            "'multiprocessing', 'email'})))\n")
    result = subprocess.run([sys.executable, "-c", code, *arguments], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1]) == []


def test_init_ingest_query_pairs_export(run, tmp_path, database_url, schema):
    result = run("init")
    assert result.exit_code == 0
    assert result.output == (
        f"created index in schema '{schema}' of {redact(database_url)}\n"
        "layout: 6 blocks of 10/11 bits, 15 keys of 2 blocks (20/21/22 bits), max distance 4\n"
        "expected candidates per lookup at 1,000,000 documents (random fingerprints):\n"
        "  --blocks 5:   5 keys,       732.42\n"
        "  --blocks 6:  15 keys,         6.20  <- this index\n"
        "  --blocks 7:  35 keys,         0.20\n")
    assert run("init").output.startswith("found existing index")

    records = list(corpus())[:40]
    path = write_jsonl(tmp_path / "part1.jsonl", records)
    result = run("ingest", path, "--batch", "first")
    assert result.exit_code == 0, result.output
    exact, near = expected_counts(records)
    assert exact >= 1 and near >= 1
    assert timeless(result.output) == (
        f"batch 'first': 40 documents: {40 - exact - near} new, {exact} exact duplicates, {near} near-duplicates "
        f"({exact + near} of the duplicates matched within the batch) in <t> s\n")

    base = records[0]
    fp = fingerprint(base["text"])
    expected = sorted(((fingerprint(r["text"]) ^ fp).bit_count(), r["id"], fingerprint(r["text"])) for r in records
                      if (fingerprint(r["text"]) ^ fp).bit_count() <= K)
    assert len(expected) >= 2
    result = run("query", base["text"])
    assert result.output == "distance  simhash           id\n" + "".join(
        f"{distance:>8}  {value:016x}  {name}\n" for distance, name, value in expected)
    result = run("query", "--simhash", f"{fingerprint(base['text']):016x}", "--json")
    assert json.loads(result.output.splitlines()[0]) == {"id": base["id"], "distance": 0,
                                         "simhash": f"{fingerprint(base['text']):016x}",
                                         "metadata": {"source": base["source"]}}
    assert run("query", "--simhash", "xyz").exit_code == 2

    pairs = [json.loads(line) for line in run("pairs").output.splitlines()]
    assert all(set(p) == {"a", "b", "distance"} for p in pairs)
    fps = [(r["id"], fingerprint(r["text"])) for r in records]
    assert pairs == [{"a": a, "b": b, "distance": (fa ^ fb).bit_count()}
                     for j, (b, fb) in enumerate(fps) for a, fa in fps[:j] if (fa ^ fb).bit_count() <= K]
    csv_output = run("pairs", "--format", "csv").output.splitlines()
    assert csv_output[0] == "a,b,distance" and len(csv_output) == len(pairs) + 1

    exported = [json.loads(line) for line in run("export").output.splitlines()]
    assert [e["id"] for e in exported] == [r["id"] for r in records]
    assert exported[0] == {"id": base["id"], "simhash": f"{fingerprint(base['text']):016x}", "source": base["source"]}

    stats = run("stats").output
    assert f"documents:  40 ({exact + near} near or exact duplicates)" in stats
    assert f"  first: 40 documents, {40 - exact - near} new, {exact} exact, {near} near (complete)" in stats


def test_pairs_equal_brute_force_over_export(run, tmp_path):
    """`simdb pairs` over an ingested corpus is exactly the set of exported pairs within k."""
    records = list(corpus())
    run("init")
    assert run("ingest", write_jsonl(tmp_path / "a.jsonl", records[:200]), "--batch", "a").exit_code == 0
    assert run("ingest", write_jsonl(tmp_path / "b.jsonl", records[200:]), "--batch", "b").exit_code == 0
    exported = [json.loads(line) for line in run("export").output.splitlines()]
    fingerprints = [(e["id"], int(e["simhash"], 16)) for e in exported]
    expected = set()
    for i, (a, fa) in enumerate(fingerprints):
        for b, fb in fingerprints[i + 1:]:
            if (fa ^ fb).bit_count() <= K:
                expected.add((a, b, (fa ^ fb).bit_count()))
    found = {(p["a"], p["b"], p["distance"]) for p in map(json.loads, run("pairs").output.splitlines())}
    assert found == expected
    assert len(expected) > 50
    batch_b = {(p["a"], p["b"], p["distance"]) for p in map(json.loads, run("pairs", "--batch", "b").output.splitlines())}
    ids_b = {r["id"] for r in records[200:]}
    assert batch_b == {p for p in expected if p[0] in ids_b or p[1] in ids_b}


def test_csv_tsv_and_txt_inputs(run, tmp_path):
    run("init")
    (tmp_path / "a.csv").write_text('doc,body,lang\n1,"first, with a comma\nand a second line",en\n2,second,fr\n')
    (tmp_path / "b.tsv").write_text("id\ttext\n3\tthird text\n")
    (tmp_path / "c.txt").write_text("a whole file is one document\n")
    result = run("ingest", str(tmp_path / "a.csv"), "--id-field", "doc", "--text-field", "body", "--batch", "csv")
    assert result.exit_code == 0, result.output
    assert run("ingest", str(tmp_path / "b.tsv"), str(tmp_path / "c.txt"), "--batch", "mixed").exit_code == 0
    exported = [json.loads(line) for line in run("export").output.splitlines()]
    assert [(e["id"], e.get("lang")) for e in exported] == [("1", "en"), ("2", "fr"), ("3", None),
                                                           (str(tmp_path / "c.txt"), None)]
    assert run("query", "first, with a comma\nand a second line").output.splitlines()[1].endswith("  1")


BAD_INPUTS = [
    ("bad.jsonl", b'{"id": 1, "text": "fine"}\n{"id": 2, "text": "caf\xe9"}\n',
     "bad.jsonl:2: invalid UTF-8 (byte 0xe9 at offset 22 of the line) (re-encode the file as UTF-8)"),
    ("bad.jsonl", b'{"id": 1, "text": "fine"}\n{"id": 2, "text": "a\\u0000b"}\n',
     "bad.jsonl:2: the text contains a NUL character, which PostgreSQL cannot store (remove NUL bytes from the input)"),
    ("bad.csv", b'id,text\n1,fine\n2,a\x00b\n',
     "bad.csv:3: the line contains a NUL character, which PostgreSQL cannot store (remove NUL bytes from the input)"),
    ("bad.jsonl", b'{"id": 1, "text": "fine"}\n\n{"id": 2, "text": "  \\n "}\n',
     "bad.jsonl:3: the text is empty or only whitespace (drop the document or give it text)"),
    ("bad.jsonl", b'{"id": 1, "text": "fine"}\n{"id": 2, "text": "x",}\n',
     "bad.jsonl:2: malformed JSON at column 23: Expecting property name enclosed in double quotes "
     "(each line must be one JSON object)"),
    ("bad.jsonl", b'{"id": 1, "text": "fine"}\n[1, 2]\n', "bad.jsonl:2: expected a JSON object, got list"),
    ("bad.jsonl", b'{"id": 1, "text": "fine"}\n{"key": 2, "text": "x"}\n',
     "bad.jsonl:2: no id field 'id' (fields: 'key', 'text') (name the id field with --id-field)"),
    ("bad.jsonl", b'{"id": 1, "body": "x"}\n',
     "bad.jsonl:1: no text field 'text' (fields: 'id', 'body') (name the text field with --text-field)"),
    ("bad.csv", b'id,body\n1,x\n', "bad.csv:1: no text field 'text' (fields: 'id', 'body') "
                                   "(name the text field with --text-field)"),
    ("bad.jsonl", b'{"id": "a", "text": "one"}\n{"id": "b", "text": "two"}\n{"id": "a", "text": "three"}\n',
     "bad.jsonl:3: id 'a' appears twice in this batch (first at bad.jsonl:1) (ids must be unique; fix or drop one of them)"),
    ("bad.jsonl", b'{"id": null, "text": "x"}\n',
     "bad.jsonl:1: the id field 'id' must be a string or an integer, not null"),
    ("bad.csv", b'id,text\n1,fine\n2,a,b\n',
     "bad.csv:3: 3 fields where the header has 2 (quote fields that contain the delimiter)"),
    ("bad.dat", b'x',
     "bad.dat: cannot tell the format from the file name (pass --format with one of jsonl, csv, tsv, txt, parquet)"),
]


@pytest.mark.parametrize("name, content, message", BAD_INPUTS, ids=[m.split(": ", 1)[1][:40] for _, _, m in BAD_INPUTS])
def test_bad_input_is_refused_whole(run, tmp_path, monkeypatch, admin_engine, schema, name, content, message):
    run("init")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "good.jsonl").write_text('{"id": "g", "text": "a good document"}\n')
    (tmp_path / name).write_bytes(content)
    result = run("ingest", "good.jsonl", name)
    assert result.exit_code == 1
    assert result.output == f"Error: {message}\n"
    assert count_rows(admin_engine, schema) == (0, 0)


def test_missing_file_is_reported_before_anything(run, tmp_path, admin_engine, schema):
    run("init")
    (tmp_path / "good.jsonl").write_text('{"id": "g", "text": "a good document"}\n')
    result = run("ingest", str(tmp_path / "good.jsonl"), str(tmp_path / "missing.jsonl"))
    assert result.exit_code == 1
    assert result.output == f"Error: {tmp_path / 'missing.jsonl'}: no such file (check the path)\n"
    assert count_rows(admin_engine, schema) == (0, 0)


def test_ids_already_stored(run, tmp_path, admin_engine, schema):
    """The same id with the same text is a re-run and is skipped; with another text it is an error."""
    run("init")
    path = write_jsonl(tmp_path / "a.jsonl", [{"id": "x", "text": "first text"}])
    assert run("ingest", path, "--batch", "one").exit_code == 0
    again = write_jsonl(tmp_path / "b.jsonl", [{"id": "y", "text": "new"}, {"id": "x", "text": "first text"}])
    result = run("ingest", again, "--batch", "two")
    assert timeless(result.output) == ("batch 'two': 1 documents: 1 new, 0 exact duplicates, 0 near-duplicates "
                                       "(0 of the duplicates matched within the batch), 1 already stored in <t> s\n")
    changed = write_jsonl(tmp_path / "c.jsonl", [{"id": "z", "text": "new"}, {"id": "x", "text": "other text"}])
    result = run("ingest", changed, "--batch", "three")
    assert result.exit_code == 1
    assert result.output == (f"Error: {changed}:2: id 'x' is already stored with a different text (batch 'one') "
                             "(give the new document a new id, or remove the old one with simdb remove)\n")
    assert count_rows(admin_engine, schema) == (2, 2)
    result = run("ingest", changed, "--batch", "one")
    assert result.output == ("Error: batch 'one' is already complete; choose another name with --batch (or --resume "
                             "it to write its verdicts and rejects files again)\n")


def test_stats_explains_the_candidates_of_a_tiny_index(run, tmp_path):
    """Issue 38: `stats` printed "6.0 per lookup measured, 0.0 expected for random fingerprints" on the
    quickstart's index, right after `init` printed 6.20 expected: alarming, though near-duplicates must share
    keys. Where chance alone would give less than one candidate, the line says where the candidates come from.
    The figures are computed from the texts: each document's key-mates, summed over the keys."""
    from collections import Counter

    from simdb.methods import SimHash

    texts = [SECTION_A, SECTION_A.replace("convenient", "convenent"), SECTION_A + " Indeed.",
             "A wholly different text about gardens, rivers and the weather in spring.", "Another one, on trains."]
    run("init")
    run("ingest", write_jsonl(tmp_path / "tiny.jsonl", [{"id": f"d{i}", "text": t} for i, t in enumerate(texts)]))
    method = SimHash.new()
    keys = method.keys([method.sketch(text) for text in texts])
    buckets = [Counter(keys[:, column].tolist()) for column in range(keys.shape[1])]
    measured = round(sum(sum(n * (n - 1) for n in bucket.values()) / len(texts) for bucket in buckets), 2)
    largest = max(max(bucket.values()) for bucket in buckets)
    expected = round(method.expected_candidates(len(texts)), 2)
    assert measured > 0 and expected < 1
    line = next(line for line in run("stats").output.splitlines() if line.startswith("candidates:"))
    assert line == (f"candidates: {measured:,} per lookup measured; these are texts similar enough to share a key, "
                    "near-duplicates among them, which a lookup must meet (by chance alone, 5 random fingerprints "
                    f"would give {expected:,}); largest key bucket {largest}")


@pytest.mark.parametrize("method", ["simhash", "minhash"])
def test_an_ingest_of_short_texts_names_the_mode_for_them(run, tmp_path, method):
    """Issue 38: on short texts the default (SimHash) found 1 of 6 one-typo copies and said nothing of the mode
    that finds them. An ingest whose first texts are mostly short for SimHash says so once, on standard error
    and in the JSON summary; MinHash has no such limit, and long texts none either."""
    from simdb.methods import SimHash
    from simdb.methods.simhash import SHORT_FEATURES

    short = [f"Review {i}: the room was clean, the staff kind, breakfast {'good' if i % 2 else 'cold'}."
             for i in range(30)]
    long = [f"{SECTION_A} {' '.join(f'word{i}x{j}' for j in range(60))}" for i in range(10)]
    simhash = SimHash.new()
    assert all(len(set(simhash.tokens(text))) < SHORT_FEATURES for text in short)
    run("init", "--method", method)
    records = [{"id": f"s{i}", "text": text} for i, text in enumerate(short)]
    result = run("ingest", write_jsonl(tmp_path / "short.jsonl", records), "--json")
    advice = ("30 of the first 30 texts have fewer than 40 distinct tokens, too few for SimHash: on the devset, 59% "
              "of such texts' near-duplicates (Jaccard >= 0.8) fell within 4 bits, against 84% for texts of 60 "
              "tokens or more. For short texts, create the index with `simdb init --method minhash --verify "
              "exact`, which decides on the texts' exact Jaccard similarity (docs/quality.md)")
    expected = [advice] if method == "simhash" else []
    assert json.loads(result.stdout)["warnings"] == expected
    assert result.stderr.splitlines() == [f"warning: {line}" for line in expected]
    records = [{"id": f"l{i}", "text": text} for i, text in enumerate(long)] * 2
    records = [{**record, "id": f"{record['id']}-{i}"} for i, record in enumerate(records)]
    result = run("ingest", write_jsonl(tmp_path / "long.jsonl", records))
    assert result.exit_code == 0 and result.stderr == ""
    few = [{"id": f"f{i}", "text": text} for i, text in enumerate(short[:19])]  # too few to judge
    result = run("ingest", write_jsonl(tmp_path / "few.jsonl", few))
    assert result.exit_code == 0 and result.stderr == ""


def test_other_settings_are_refused(run, database_url, schema):
    run("init")
    result = run("init", "--max-distance", "3", "--blocks", "5")
    assert result.exit_code == 1
    assert result.output == ("Error: the index was created with other settings (max_distance: asked 3, stored 4; "
                             "blocks: asked 5, stored 6). Open it without those options, or create a new index "
                             "in another --schema\n")


def test_no_index_yet(run, schema, database_url):
    result = run("stats")
    assert result.exit_code == 1
    assert result.output == (f"Error: no simdb index in schema '{schema}' of {redact(database_url)}; "
                             "create one with `simdb init`\n")


def test_unreachable_database_and_passwords_are_never_printed():
    result = CliRunner().invoke(cli, ["stats", "--database-url", "postgresql://simdb:s3cret@127.0.0.1:1/archive"])
    assert result.exit_code == 1
    assert result.output.startswith("Error: cannot connect to postgresql://simdb:***@127.0.0.1:1/archive: ")
    assert result.output.endswith("Check that the server is running and the URL is right, or unset "
                                  "SIMDB_DATABASE_URL and --database-url to use the embedded database\n")
    assert "s3cret" not in result.output


def test_not_postgresql_is_refused():
    result = CliRunner().invoke(cli, ["stats", "--database-url", "sqlite:///x.db"])
    assert result.exit_code == 1
    assert "'sqlite' URLs are not supported" in result.output


def test_bad_schema_name():
    result = CliRunner().invoke(cli, ["stats", "--schema", "Robert'); DROP"])
    assert result.exit_code == 1
    assert result.output.startswith("Error: invalid schema name")


def test_an_empty_input_warns_and_records_nothing(run, tmp_path, admin_engine, schema):
    """Issue 9: an empty input made a complete 0-document batch without a word."""
    run("init")
    (tmp_path / "empty.jsonl").write_text("\n\n")
    result = run("ingest", str(tmp_path / "empty.jsonl"), "--batch", "nothing")
    assert result.exit_code == 0 and result.stdout == ""
    assert result.stderr == (f"warning: {tmp_path / 'empty.jsonl'} held no records; nothing was stored and no batch "
                             "was created\n")
    assert count_rows(admin_engine, schema) == (0, 0)


def test_database_errors_are_told_by_their_sqlstate(database_url):
    """Issue 34: a deadlock or a size limit on a live connection was reported as "lost the database connection"."""
    import concurrent.futures

    import sqlalchemy as sa

    from simdb.pg.database import postgres_url, translate

    engine = sa.create_engine(postgres_url(database_url))

    def refused(*statements, connection=None) -> str:
        with (connection or engine.connect()) as session:
            with pytest.raises(sa.exc.DBAPIError) as caught:
                for statement in statements:
                    session.exec_driver_sql(statement)
        return str(translate(caught.value, database_url))

    try:
        assert refused("SELECT repeat('x', 1073741824)") == (
            "PostgreSQL refused a value or statement over one of its size limits: requested length too large "
            "(SQLSTATE 54000); make what it names smaller (an id, a metadata field, a text), or split it")
        assert refused("SET statement_timeout = 10", "SELECT pg_sleep(2)") == (
            "PostgreSQL cancelled the statement: canceling statement due to statement timeout (a statement_timeout "
            "of the server, the database or the role, or someone cancelled it); raise or unset the timeout, then "
            "run the command again")
        with engine.connect() as holder:
            holder.exec_driver_sql("SELECT pg_advisory_xact_lock(34000)")
            assert refused("SET lock_timeout = 10", "SELECT pg_advisory_xact_lock(34000)") == (
                "a lock was not granted in time: canceling statement due to lock timeout (another session holds "
                "it; a lock_timeout of the server, the database or the role set how long to wait); run the "
                "command again when that session is done")
        # a real deadlock between two sessions: PostgreSQL stops one of them
        first, second = engine.connect(), engine.connect()
        first.exec_driver_sql("SELECT pg_advisory_xact_lock(34001)")
        second.exec_driver_sql("SELECT pg_advisory_xact_lock(34002)")

        def take(connection, key):
            try:
                connection.exec_driver_sql("SET deadlock_timeout = '100ms'")
                connection.exec_driver_sql(f"SELECT pg_advisory_xact_lock({key})")
                return None
            except sa.exc.DBAPIError as error:
                connection.rollback()  # let the other one through
                return str(translate(error, database_url))

        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            outcomes = [future.result() for future in [pool.submit(take, first, 34002),
                                                        pool.submit(take, second, 34001)]]
        first.close()
        second.close()
        (deadlock,) = [outcome for outcome in outcomes if outcome is not None]
        assert deadlock.startswith("a deadlock with another session, which PostgreSQL broke by stopping this one: "
                                   "deadlock detected"), deadlock
        assert deadlock.endswith("; run the command again")
        # only a connection really lost says so
        killed = engine.connect()
        assert refused("SELECT pg_terminate_backend(pg_backend_pid())", connection=killed).startswith(
            "lost the database connection: terminating connection due to administrator command")
    finally:
        engine.dispose()


def fill_wordy(index):
    """Make ``index`` one whose pairs, export and verdicts each print well over a pipe's 64 KiB."""
    import random

    from tests.test_index import make_batch

    rng = random.Random(34)
    fingerprints = [fingerprint for base in (rng.getrandbits(64) for _ in range(2500)) for fingerprint in
                    (base, base ^ 1)]
    index.add_fingerprinted(make_batch(fingerprints, "d"), batch="big")
    return index


@pytest.fixture
def wordy(database_url, backend, admin_engine, read_only_archives):
    """The schema of a wordy index (:func:`fill_wordy`) that the module's tests only read, built once (issue 35:
    each closed pipe's test built its own)."""
    from simdb import Index

    def build(schema, stack):
        fill_wordy(stack.enter_context(Index.create(database_url, schema=schema)))
        return schema

    with read_only_archives.use((database_url, "wordy"), admin_engine, backend, build) as schema:
        yield schema


def simdb_shell(script: str, database_url: str, schema: str, **options):
    """Run a bash script in which ``simdb`` is this checkout's command line, against the test's index."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "SIMDB_DATABASE_URL": database_url, "SIMDB_SCHEMA": schema}
    return subprocess.run(["bash", "-c", f"simdb() {{ {sys.executable} -m simdb \"$@\"; }}\n{script}"], env=env,
                          capture_output=True, text=True, timeout=120, **options)


@pytest.mark.parametrize("arguments", [["pairs"], ["pairs", "--format", "csv"], ["export"],
                                       ["export", "--format", "csv"], ["verdicts", "--batch", "big"]])
def test_a_closed_pipe_is_a_normal_end(wordy, database_url, arguments):
    """Issue 34: `simdb pairs | head -n 1` exited 1 (click's answer to EPIPE)."""
    result = simdb_shell(f"simdb {' '.join(arguments)} | head -n 1; echo \"status ${{PIPESTATUS[0]}}\"",
                         database_url, wordy)
    first, status = result.stdout.splitlines()
    assert status == "status 0" and result.stderr == ""
    assert first.startswith(("{", "a,b,distance", "id,simhash"))


def test_a_full_standard_output_is_one_line(index, database_url, schema):
    """Issue 34: an error writing standard output (here ENOSPC, /dev/full) printed a traceback. (Its compact
    writes: on an index of its own.)"""
    fill_wordy(index)
    result = simdb_shell("simdb export > /dev/full; echo \"status $?\" >&2", database_url, schema)
    assert result.stderr == "Error: cannot write to standard output: No space left on device\nstatus 1\n"
    result = simdb_shell("simdb compact --json > /dev/full; echo \"status $?\" >&2", database_url, schema)
    assert result.stderr == ("Error: cannot write to standard output: No space left on device (what `simdb compact` "
                             "changed in the index is committed)\nstatus 1\n")


@pytest.mark.parametrize("command", ["ingest", "check"])
def test_the_seconds_a_summary_gives_are_the_whole_commands(command, database_url, schema, tmp_path):
    """Issue 34: `ingest` printed "in 2.1 s" for a 4.6 s command: Python's start-up and imports, seconds on a busy
    machine, were left out. A start-up made 2 s longer here shows in the figure."""
    import subprocess
    import sys
    import time

    from simdb import Index

    Index.create(database_url, schema=schema).close()
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({"id": r["id"], "text": r["text"]}) + "\n" for r in list(corpus())[:50]))
    slow_start = ("import sys, time; time.sleep(2); from simdb.cli import main; sys.argv[0] = 'simdb'; main()")
    began = time.monotonic()
    process = subprocess.Popen([sys.executable, "-c", slow_start, command, str(path), "--json", "--database-url",
                                database_url, "--schema", schema], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    stream = process.stdout if command == "ingest" else process.stderr
    summary = next(line for line in stream if line.startswith("{") and '"seconds"' in line)
    printed = time.monotonic() - began
    process.communicate(timeout=300)
    assert process.returncode == 0
    assert printed - 0.5 <= json.loads(summary)["seconds"] <= printed + 0.05  # /proc counts in 10 ms ticks
