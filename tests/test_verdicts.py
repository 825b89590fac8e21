"""Verdicts: what became of every input record, from ingest (stored with its chunk) and from check (nothing
stored), held to a brute-force oracle and to each other, record by record."""

import dataclasses
import json
import random

import psycopg
import pytest
import sqlalchemy as sa

from simdb import Index, InputError
from simdb.check import check
from simdb.ingest import IngestOptions
from simdb.inputs import Document
from simdb.pg.database import postgres_url
from simdb.samples import corpus
from simdb.text import content_hash
from tests.conftest import assert_records_consistent, count_rows

CORPUS = list(corpus())
METHODS = [{}, {"method": "minhash", "threshold": 0.7}]


def batches(seed: int) -> tuple[list, list]:
    """An archive batch, and a new batch with everything a verdict can be: new texts, exact and near copies of
    the archive and of itself, bad records, an id twice, ids already stored with the same and another text."""
    rng = random.Random(seed)
    records = CORPUS[:]
    rng.shuffle(records)
    old = [Document(r["id"], r["text"]) for r in records[:60]]
    new: list = [Document(r["id"], r["text"]) for r in records[60:140]]
    new += [Document(f"copy-{d.external_id}", d.text) for d in rng.sample(old, 5) + rng.sample(new[:40], 5)]
    new += [Document(d.external_id, d.text) for d in rng.sample(old, 3)]                    # already stored
    new.append(Document(old[10].external_id, old[10].text + " changed"))                   # another text
    new.append(Document(new[0].external_id, "the same id twice in one batch"))
    new += [InputError(f"bad record {i}", path="new.jsonl", line=1000 + i) for i in range(3)]
    rng.shuffle(new)
    return old, new


def oracle(method, stored: list, batch: list) -> list[tuple]:
    """(id, status, duplicate_of, distance) per record by brute force; appends what would be stored to ``stored``."""
    out, seen = [], set()
    names = {name: digest for name, _, digest in stored}
    for item in batch:
        if isinstance(item, InputError):
            out.append((None, "rejected", None, None))
            continue
        name, sketch, digest = item.external_id, method.sketch(item.text), content_hash(item.text)
        if name in seen or (name in names and names[name] != digest):
            seen.add(name)
            out.append((name, "rejected", None, None))
            continue
        seen.add(name)
        if name in names:
            out.append((name, "already_stored", None, None))
            continue
        distances = method.distances(sketch, [method.stored([s])[0] for _, s, _ in stored]).tolist() if stored else []
        matches = [j for j, d in enumerate(distances) if d <= method.max_distance]
        exact = any(d == digest for _, _, d in stored)
        first = matches[0] if matches else None
        out.append((name, "exact" if exact else "near" if matches else "new",
                    stored[first][0] if matches else None, distances[first] if matches else None))
        stored.append((name, sketch, digest))
        names[name] = digest
    return out


def essentials(verdicts) -> list[tuple]:
    return [(v.id if v.status != "rejected" or v.id else None, v.status, v.duplicate_of, v.distance)
            for v in verdicts]


@pytest.mark.citus
@pytest.mark.slow_on_citus
@pytest.mark.citus_by_id
@pytest.mark.parametrize("settings", METHODS, ids=["simhash", "minhash"])
@pytest.mark.parametrize("seed", [1, 2])
def test_check_and_ingest_give_the_oracles_verdicts(settings, seed, database_url, schema, admin_engine, tmp_path):
    old, new = batches(seed)
    with Index.create(database_url, schema=schema, **settings) as index:
        method = index.settings.method
        stored: list = []
        expected_old, expected_new = oracle(method, stored, old), oracle(method, stored, new)
        index.ingest(old, IngestOptions(batch="old", chunk_size=13))
        before = count_rows(admin_engine, schema)
        checked = list(check(index.context, new, batch="new", chunk_size=9))
        assert count_rows(admin_engine, schema) == before  # nothing stored
        verdicts_file = tmp_path / "verdicts.jsonl"
        summary = index.ingest(new, IngestOptions(batch="new", chunk_size=7, on_error="skip",
                                                  rejects=str(tmp_path / "rejects.jsonl"),
                                                  verdicts=str(verdicts_file)))
        ingested = list(index.verdicts("new"))
        assert essentials(index.verdicts("old")) == expected_old
    # the records whose id a reject cannot know (reader errors) have none in the oracle either
    expected_new = [(None, s, d, x) if s == "rejected" and isinstance(item, InputError) else (n, s, d, x)
                    for item, (n, s, d, x) in zip(new, expected_new)]
    assert essentials(ingested) == expected_new
    # the same verdicts; only a reject's wording may differ (ingest meets an id repeated across chunks in SQL)
    assert [dataclasses.replace(v, reason=None) for v in checked] == \
        [dataclasses.replace(v, reason=None) for v in ingested]
    assert {status for _, status, _, _ in expected_new} == {"new", "exact", "near", "already_stored", "rejected"}
    assert [json.loads(line) for line in verdicts_file.read_text().splitlines()] == [v.to_json(method)
                                                                                     for v in ingested]
    assert summary.rejected == sum(status == "rejected" for _, status, _, _ in expected_new)
    assert_records_consistent(admin_engine, schema, method.max_distance)


def test_a_verdict_says_what_a_script_needs(index):
    index.add_many([{"id": "a", "text": "The archive keeps every article it has ever received."}], batch="one")
    (a, b, c, bad) = index.check_many([
        {"id": "a", "text": "The archive keeps every article it has ever received."},
        {"id": "b", "text": "The archive keeps every article it has ever received!"},
        {"id": "c", "text": "Something else entirely, about the weather in the mountains."},
        {"id": "d", "text": "x" * 90}], batch="two", max_chars=80)
    method = index.settings.method
    assert a.to_json(method) == {"id": "a", "status": "already_stored", "duplicate_of": None, "similarity": None,
                                 "distance": None, "batch": "two", "position": 1}
    assert b.to_json(method) == {"id": "b", "status": "near", "duplicate_of": "a", "similarity": 1.0,
                                 "distance": 0, "batch": "two", "position": 2}
    assert c.to_json(method)["status"] == "new" and c.duplicate_of is None
    assert bad.to_json(method) == {"id": "d", "status": "rejected", "duplicate_of": None, "similarity": None,
                                   "distance": None, "batch": "two", "position": 4,
                                   "reason": "the text is 90 characters, over the limit of 80", "path": None,
                                   "line": None, "hint": "raise `max_chars` or split the document"}
    with pytest.raises(Exception, match="no batch named 'nope'"):
        list(index.verdicts("nope"))


@pytest.mark.citus
def test_the_reader_role_can_check_and_look_up_and_stores_nothing(database_url, schema, admin_engine, run):
    role = f"simdb_check_{schema[-8:]}"
    run("init")
    with Index.open(database_url, schema=schema) as index:
        index.add_many([{"id": r["id"], "text": r["text"]} for r in CORPUS[:50]], batch="old")
        index.grant_reader(role, login=True)
    try:
        url = postgres_url(database_url).set(username=role, password=None)
        before = count_rows(admin_engine, schema)
        with Index.open(url.render_as_string(hide_password=False), schema=schema) as reader:
            verdicts = reader.check_many([{"id": f"x-{r['id']}", "text": r["text"]} for r in CORPUS[40:60]])
            # batch lookups too: a read-only transaction sends its probes as arrays, not a temporary table
            texts = [r["text"] for r in CORPUS[40:60]]
            as_reader = [[m.external_id for m in found] for found in reader.query_many(texts)]
        with Index.open(database_url, schema=schema) as owner:
            assert as_reader == [[m.external_id for m in found] for found in owner.query_many(texts)]
            assert all(as_reader[:10])
        assert [v.status for v in verdicts[:10]] == ["exact"] * 10 and all(v.duplicate_of for v in verdicts[:10])
        assert count_rows(admin_engine, schema) == before
        conninfo = url.set(drivername="postgresql").render_as_string(hide_password=False)
        with psycopg.connect(conninfo) as connection:
            with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
                connection.execute("CREATE TEMPORARY TABLE t (x int)")
    finally:
        with admin_engine.begin() as connection:
            connection.exec_driver_sql(f"DROP OWNED BY {role}")
            connection.exec_driver_sql(f"DROP ROLE {role}")


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    return str(path)


@pytest.mark.citus
def test_the_command_line_for_an_ingest_script(run, tmp_path, schema, admin_engine):
    run("init")
    old = write_jsonl(tmp_path / "old.jsonl", [{"id": r["id"], "text": r["text"], "source": "wire"}
                                               for r in CORPUS[:100]])
    assert run("ingest", old, "--batch", "old").exit_code == 0
    new_records = [{"id": f"n-{r['id']}", "text": r["text"]} for r in CORPUS[90:130]]
    new = tmp_path / "new.jsonl"
    new.write_text("".join(json.dumps(r) + "\n" for r in new_records) + "{not json\n")

    checked = run("check", str(new), "--batch", "new", "--json")
    assert checked.exit_code == 0
    check_lines = [json.loads(line) for line in checked.stdout.splitlines()]
    assert json.loads(checked.stderr.splitlines()[-1])["records"] == 41 == len(check_lines)
    assert count_rows(admin_engine, schema)[0] == 100

    result = run("ingest", str(new), "--batch", "new", "--on-error", "skip", "--verdicts",
                 str(tmp_path / "v.jsonl"), "--rejects", str(tmp_path / "r.jsonl"), "--json")
    assert result.exit_code == 3  # done, some records rejected
    summary = json.loads(result.stdout)
    assert summary["batch"] == "new" and summary["rejected"] == 1 and summary["documents"] == 40
    written = [json.loads(line) for line in (tmp_path / "v.jsonl").read_text().splitlines()]
    assert summary["exact_duplicates"] == sum(v["status"] == "exact" for v in written) >= 10
    assert summary["verdicts"] == str(tmp_path / "v.jsonl")
    assert written == check_lines
    assert written[-1]["status"] == "rejected" and written[-1]["line"] == 41
    assert [json.loads(line) for line in run("verdicts", "--batch", "new").stdout.splitlines()] == written
    rejected = run("verdicts", "--batch", "new", "--status", "rejected").stdout.splitlines()
    assert [json.loads(line)["position"] for line in rejected] == [41]

    unique = [json.loads(line)["id"] for line in run("export", "--batch", "new", "--unique").stdout.splitlines()]
    assert unique == [v["id"] for v in written if v["status"] == "new"] and len(unique) >= 20
    canonical = [json.loads(line)["id"] for line in run("export", "--batch", "new", "--canonical").stdout.splitlines()]
    with admin_engine.connect() as connection:
        earliest = connection.execute(sa.text(
            f"SELECT d.external_id FROM {schema}.documents d JOIN {schema}.batches b ON b.id = d.batch_id "
            "WHERE b.name = 'new' AND d.id = d.cluster_id ORDER BY d.id")).scalars().all()
    assert canonical == earliest
    csv_out = run("export", "--batch", "old", "--format", "csv").stdout.splitlines()
    assert csv_out[0] == "id,simhash,batch,metadata" and len(csv_out) == 101
    assert csv_out[1].endswith(',old,"{""source"": ""wire""}"')
    assert run("export", "--format", "parquet").output.startswith("Error: parquet is written to a file")

    removed = run("remove", "--batch", "new", "--dry-run", "--json")
    assert json.loads(removed.stdout)["removed"] == 40 and json.loads(removed.stdout)["dry_run"] is True
    assert run("ingest", old, "--batch", "again", "--json").exit_code == 0


def test_an_empty_input_writes_an_empty_verdicts_file(run, tmp_path):
    run("init")
    (tmp_path / "empty.jsonl").write_text("")
    result = run("ingest", str(tmp_path / "empty.jsonl"), "--verdicts", str(tmp_path / "v.jsonl"), "--json")
    assert result.exit_code == 0 and json.loads(result.stdout)["batch"] is None
    assert (tmp_path / "v.jsonl").read_text() == ""


def test_parquet_export_when_pyarrow_is_there(run, tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    run("init")
    path = write_jsonl(tmp_path / "in.jsonl", [{"id": r["id"], "text": r["text"]} for r in CORPUS[:30]])
    run("ingest", path, "--batch", "one")
    assert run("export", "--format", "parquet", "--output", str(tmp_path / "out.parquet")).exit_code == 0
    table = pq.read_table(tmp_path / "out.parquet")
    assert table.column_names == ["id", "simhash", "batch", "metadata"] and table.num_rows == 30
    assert not (tmp_path / "out.parquet.partial").exists()


def test_every_line_splitter_sees_one_verdict_per_record(index, tmp_path):
    """U+2028, U+2029 and U+0085 end a line for str.splitlines(): they are escaped in every JSON-lines output."""
    ids = ["a\u2028b", "c\u2029d", "e\x85f"]
    index.add_many([{"id": i, "text": f"text number {n} of three"} for n, i in enumerate(ids)], batch="odd",
                   verdicts=str(tmp_path / "v.jsonl"))
    lines = (tmp_path / "v.jsonl").read_text(encoding="utf-8").splitlines()
    assert [json.loads(line)["id"] for line in lines] == ids


@pytest.mark.citus
def test_a_verdict_is_history_it_names_the_document_it_duplicated_after_that_is_removed(run, tmp_path):
    """Issue 34: after `simdb remove`, `simdb verdicts` printed "near" with "duplicate_of": null."""
    run("init")
    assert run("ingest", write_jsonl(tmp_path / "one.jsonl", CORPUS[:40]), "--batch", "one").exit_code == 0
    again = write_jsonl(tmp_path / "two.jsonl", [{"id": f"again-{r['id']}", "text": r["text"]} for r in CORPUS[:40]])
    written = tmp_path / "two.verdicts.jsonl"
    assert run("ingest", again, "--batch", "two", "--verdicts", str(written)).exit_code == 0
    assert run("remove", "--id", CORPUS[0]["id"], "--id", CORPUS[1]["id"]).exit_code == 0
    assert run("remove", "--batch", "one").exit_code == 0
    assert run("verdicts", "--batch", "two").stdout == written.read_text()
    verdicts = [json.loads(line) for line in written.read_text().splitlines()]
    assert all(v["status"] == "exact" and v["duplicate_of"] for v in verdicts)
    assert {v["duplicate_of"] for v in verdicts} <= {r["id"] for r in CORPUS[:40]}


@pytest.mark.parametrize("kind", ["jsonl", "csv", "txt"])
def test_a_rejected_record_keeps_the_id_it_had_and_its_hint_names_the_option(kind, run, index, tmp_path,
                                                                            monkeypatch):
    """Issue 34: a reject whose id was readable had "id": null, and its hint named `text_field` where the
    command line's option is --text-field (the Python API keeps the parameter's name)."""
    if kind == "jsonl":
        (tmp_path / "in.jsonl").write_text('{"id": "no-text", "body": "x"}\n{"id": "blank", "text": "  "}\n'
                                           '{"id": "nul", "text": "a\\u0000b"}\n{"id": "meta", "text": "fine", '
                                           '"m": "a\\u0000b"}\n{"id": "long", "text": "' + "x" * 50 + '"}\n'
                                           '{"text": "no id"}\n{"id": "good", "text": "a good text"}\n')
        paths, ids = ["in.jsonl"], ["no-text", "blank", "nul", "meta", "long", None, "good"]
    elif kind == "csv":
        (tmp_path / "in.csv").write_text('id,text,m\nblank,  ,x\nlong,' + "x" * 50 + ',y\ngood,a good text,z\n')
        paths, ids = ["in.csv"], ["blank", "long", "good"]
    else:
        (tmp_path / "a.txt").write_bytes(b"caf\xe9")
        (tmp_path / "b.txt").write_text("   ")
        (tmp_path / "c.txt").write_text("a good text")
        paths, ids = ["a.txt", "b.txt", "c.txt"], ["a.txt", "b.txt", "c.txt"]
    monkeypatch.chdir(tmp_path)
    result = run("ingest", *paths, "--batch", "b", "--on-error", "skip", "--max-chars", "40", "--verdicts",
                 "v.jsonl", "--rejects", "r.jsonl")
    assert result.exit_code == 3, result.output
    written = [json.loads(line) for line in (tmp_path / "v.jsonl").read_text().splitlines()]
    assert [v["id"] for v in written] == ids
    assert [v["id"] for v in written if v["status"] == "rejected"] == \
        [json.loads(line)["id"] for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert [json.loads(line) for line in run("verdicts", "--batch", "b").stdout.splitlines()] == written
    hints = {v["id"]: v["hint"] for v in written if v["status"] == "rejected"}
    if kind != "txt":
        assert hints["long"] == "raise --max-chars or split the document"
        assert [v.hint for v in index.verdicts("b") if v.id == "long"] == ["raise `max_chars` or split the document"]
    if kind == "jsonl":
        assert hints["no-text"] == "name the text field with --text-field"
        checked = [json.loads(line) for line in run("check", *paths, "--max-chars", "40").stdout.splitlines()]
        assert [(v["id"], v.get("hint")) for v in checked] == [(v["id"], v.get("hint")) for v in written]


def test_an_id_over_the_limit_is_a_reject_in_ingest_and_check_and_an_error_in_the_api(run, tmp_path, database_url,
                                                                                      schema, admin_engine):
    """Issue 34 item 8: an incompressible id over the B-tree limit failed its whole chunk even under
    ``--on-error skip``, and ``check`` called the record new."""
    rng = random.Random(8)
    too_long = "".join(rng.choice("0123456789abcdef") for _ in range(3000))  # incompressible, past the B-tree
    at_limit = too_long[:1000]  # stored: an incompressible id at the limit fits the B-tree
    just_over = "é" * 500 + "x"  # 1,001 bytes of UTF-8 in 501 characters: the limit is in bytes
    ids = ["first", too_long, at_limit, just_over, "last"]
    path = write_jsonl(tmp_path / "in.jsonl", [{"id": i, "text": r["text"]} for i, r in zip(ids, CORPUS)])
    run("init")
    checked = run("check", path, "--batch", "b")
    assert checked.exit_code == 0, checked.output
    result = run("ingest", path, "--batch", "b", "--on-error", "skip", "--verdicts", str(tmp_path / "v.jsonl"),
                 "--rejects", str(tmp_path / "r.jsonl"))
    assert result.exit_code == 3, result.output
    written = [json.loads(line) for line in (tmp_path / "v.jsonl").read_text().splitlines()]
    assert written == [json.loads(line) for line in checked.stdout.splitlines()]
    assert [json.loads(line)["id"] for line in (tmp_path / "r.jsonl").read_text().splitlines()] == [too_long, just_over]
    assert [v["status"] for v in written] == ["new", "rejected", "new", "rejected", "new"]
    assert [(v["line"], v["reason"]) for v in written if v["status"] == "rejected"] == [
        (2, "the id is 3,000 bytes of UTF-8, over the limit of 1,000"),
        (4, "the id is 1,001 bytes of UTF-8, over the limit of 1,000")]
    with admin_engine.connect() as connection:
        stored = connection.execute(sa.text(f"SELECT external_id FROM {schema}.documents ORDER BY id")).scalars().all()
    assert stored == ["first", at_limit, "last"]
    with Index.open(database_url, schema=schema) as index:
        for add in (lambda: index.add(just_over, "a text"), lambda: index.add_many([{"id": too_long, "text": "a"}]),
                    lambda: index.add_many([Document(too_long, "a text")], batch="api")):
            with pytest.raises(InputError, match="bytes of UTF-8, over the limit of 1,000"):
                add()
        assert [v.status for v in index.check_many([Document(too_long, "a text")])] == ["rejected"]
    assert count_rows(admin_engine, schema)[0] == 3
