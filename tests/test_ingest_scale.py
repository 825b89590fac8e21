"""Archive-scale ingest: parallel fingerprints, chunks, rejects, resume, SIGKILL, concurrent processes."""

import json
import os
import random
import subprocess
import sys
import time

import pytest
import sqlalchemy as sa

from simdb import Index, InputError
from simdb.ingest import IngestOptions
from simdb.methods import MinHash, SimHash
from simdb.methods.simhash import SHORT_FEATURES
from simdb.methods.simhash.fingerprint import fingerprint
from simdb.text import content_hash
from simdb.inputs import Document
from simdb.parallel import TASK_SIZE, Fingerprinted, fingerprint_stream, key_rows
from simdb.samples import corpus
from simdb.methods.simhash.blocks import DEFAULT_MAX_DISTANCE as K
from simdb.pg.database import lock
from tests.conftest import assert_consistent, count_rows, init_options, killed

CORPUS = list(corpus())


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return str(path)


def state(engine, schema):
    """What an index holds, independent of surrogate ids: documents with their duplicate_of, in order."""
    return assert_consistent(engine, schema)


def test_parallel_fingerprints_equal_serial_ones_in_order():
    documents = [Document(r["id"], r["text"]) for r in CORPUS] * 4  # enough to start the pool
    items = documents[:10] + [InputError("bad record", path="f", line=3)] + documents[10:] + [Document("e", "  ")]
    assert len(items) > 2 * TASK_SIZE
    settings = SimHash()
    serial = list(fingerprint_stream(items, settings, workers=1))
    parallel = list(fingerprint_stream(items, settings, workers=2))
    assert [type(x) for x in parallel] == [type(x) for x in serial]
    assert [(x.sketch, x.content_hash) for x in parallel if isinstance(x, Fingerprinted)] == \
        [(fingerprint(d.text), content_hash(d.text)) for d in documents]
    assert str(parallel[10]) == "f:3: bad record"
    assert str(parallel[-1]) == "the text is empty or only whitespace (give every document some text)"


@pytest.mark.parametrize("method", [SimHash(), MinHash.new()], ids=["simhash", "minhash"])
def test_the_workers_key_values_are_the_methods_keys_of_their_sketches(method):
    documents = [Document(r["id"], r["text"]) for r in CORPUS] * 4
    for workers in (1, 2):
        found = [x for x in fingerprint_stream(documents, method, workers=workers) if isinstance(x, Fingerprinted)]
        sketches = [x.sketch for x in found]
        assert len(found) > 2 * TASK_SIZE and all(x.keys is not None for x in found)
        assert key_rows([x.keys for x in found], sketches, method).tolist() == method.keys(sketches).tolist()
    assert key_rows([None, *[x.keys for x in found[1:]]], sketches, method).tolist() == method.keys(sketches).tolist()


def test_short_texts_are_judged_by_the_workers_that_sketch_them(database_url, schema, monkeypatch):
    """Issue 36: an ingest judged its first 200 texts short or not after the last chunk, in the process that
    stores the chunks, which loaded the tokenizer's dictionaries for it (1.7 s of one core at the end of every
    SimHash ingest, while the workers had them loaded). The workers judge them now, and say the same: here
    the main process cannot tokenize at all (the spawned workers import their own simdb), yet the advice is
    given, counted over the first 200 texts, as one process alone gives it."""
    texts = [f"Review {i}: the room was clean, breakfast {'good' if i % 2 else 'cold'}." for i in range(600)]
    records = [{"id": f"s{i}", "text": text} for i, text in enumerate(texts)]
    assert all(len(set(SimHash().tokens(text))) < SHORT_FEATURES for text in texts)
    with Index.create(database_url, schema=schema) as index:
        alone = index.add_many(records[:300], batch="alone", workers=1)
    assert alone.warnings and alone.warnings[0].startswith("200 of the first 200 texts have fewer than 40")

    def refuse(self, text):
        raise AssertionError("tokenized in the process that stores the chunks")

    monkeypatch.setattr(SimHash, "tokens", refuse)
    monkeypatch.setattr(SimHash, "is_short", refuse, raising=False)
    with Index.open(database_url, schema=schema) as index:
        pooled = index.add_many([{**r, "id": f"p-{r['id']}"} for r in records], batch="pooled", workers=2)
    assert pooled.documents == 600 and pooled.warnings == alone.warnings


def test_chunked_ingest_equals_one_transaction(database_url, admin_engine, schema):
    with Index.create(database_url, schema=schema) as index:
        whole = index.add_many(CORPUS, batch="whole")
    expected = state(admin_engine, schema)
    with admin_engine.begin() as connection:
        connection.exec_driver_sql(f"DROP SCHEMA {schema} CASCADE")
    with Index.create(database_url, schema=schema) as index:
        chunked = index.add_many(CORPUS, batch="whole", chunk_size=37, workers=2)
    assert state(admin_engine, schema) == expected
    assert (chunked.documents, chunked.new, chunked.exact_duplicates, chunked.near_duplicates, chunked.within_batch) \
        == (whole.documents, whole.new, whole.exact_duplicates, whole.near_duplicates, whole.within_batch)


def test_skip_writes_rejects_and_stores_the_rest(run, tmp_path, admin_engine, schema):
    run("init")
    good = CORPUS[:20]
    lines = [json.dumps(r) for r in good[:10]]
    lines += ['{"id": "broken", "text": ', json.dumps({"id": "empty", "text": " "}),
              json.dumps({"id": good[0]["id"], "text": "same id, other text"}),
              json.dumps({"id": "huge", "text": "x" * 5000})]
    lines += [json.dumps(r) for r in good[10:]]
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join(lines) + "\n")
    rejects = tmp_path / "rejects.jsonl"
    result = run("ingest", str(path), "--batch", "mixed", "--on-error", "skip", "--rejects", str(rejects),
                 "--max-chars", "4000", "--chunk-size", "7")
    assert result.exit_code == 3, result.output  # done, some records rejected
    assert ", 4 rejected (see " in result.output
    assert count_rows(admin_engine, schema) == (20, 1)
    found = [json.loads(line) for line in rejects.read_text().splitlines()]
    assert [(r["line"], r["reason"]) for r in found] == [
        (11, "malformed JSON at column 26: Expecting value"),
        (12, "the text is empty or only whitespace"),
        (13, f"id {good[0]['id']!r} appears twice in this batch (first in an earlier chunk)"),
        (14, "the text is 5,000 characters, over the limit of 4,000"),
    ]
    assert all(r["path"] == str(path) for r in found)
    state(admin_engine, schema)


def test_stop_after_stored_chunks_says_how_to_resume(run, tmp_path, admin_engine, schema):
    run("init")
    records = CORPUS + [{**r, "id": r["id"] + "-again"} for r in CORPUS]
    assert len(records) > 650
    path = tmp_path / "in.jsonl"
    lines = [json.dumps(r) for r in records]
    lines[599] = '{"id": "x", "text": ""}'
    path.write_text("\n".join(lines) + "\n")
    result = run("ingest", str(path), "--batch", "b", "--chunk-size", "100", "--workers", "1")
    assert result.exit_code == 1
    stored, _ = count_rows(admin_engine, schema)
    assert result.output == (  # issue 9: says what was kept and the exact command that resumes
        f"Error: {path}:600: the text is empty or only whitespace (drop the document or give it text); batch 'b' "
        f"keeps what its committed chunks stored ({stored} documents from the first {stored} input records): it "
        f"can be resumed once the cause is fixed, or removed: `simdb ingest {path} --workers 1 --chunk-size 100 "
        "--batch b --resume` resumes it, `simdb remove --batch b` removes it\n")
    assert stored in (300, 400, 500)  # whole chunks only; how many depends on the read-ahead
    assert run("ingest", str(path), "--batch", "b").output == (
        f"Error: batch 'b' was interrupted after {stored} input records; continue it with --resume, or remove what "
        "it stored with `simdb remove --batch b`\n")
    assert f"running: stopped after {stored} input records; continue with --resume" in run("stats").output
    records[599] = {"id": "x", "text": "now it has text"}
    write_jsonl(path, records)
    result = run("ingest", str(path), "--batch", "b", "--chunk-size", "100", "--resume")
    assert result.exit_code == 0, result.output
    assert count_rows(admin_engine, schema) == (len(records), 1)
    assert f"b: {len(records)} documents" in run("stats").output
    state(admin_engine, schema)


def simdb_command(database_url, schema, *args):
    """``simdb ARGS`` in a subprocess; ``init`` creates the index the test's backend wants (distributed on Citus)."""
    extra = init_options(database_url, args[args.index("--method") + 1] if "--method" in args else "simhash") \
        if args[:1] == ("init",) else []
    return [sys.executable, "-m", "simdb", *args, *extra, "--database-url", database_url, "--schema", schema]


def wait_for_backends_to_finish(engine, schema, seconds=30):
    """Until no session holds the index's ingest lock: the server finishes a killed client's chunk transaction on
    its own. Only this index's sessions are waited for, not those of other tests on the server (another xdist
    worker's, another checkout's), which kept it waiting its whole time."""
    with engine.begin() as connection:
        connection.exec_driver_sql(f"SET LOCAL lock_timeout = '{seconds}s'")
        lock(connection, schema, "ingest")


@pytest.mark.citus
@pytest.mark.slow
def test_sigkill_at_random_moments_loses_nothing_and_stores_once(database_url, admin_engine, schema, tmp_path):
    """Kill ingests with SIGKILL at random points; every time the archive holds whole chunks only, and
    resuming finishes with exactly the documents of a clean run."""
    rng = random.Random(3)
    records = [{**r, "id": f"{r['id']}-{copy}"} for copy in range(8) for r in CORPUS]
    path = write_jsonl(tmp_path / "in.jsonl", records)
    subprocess.run(simdb_command(database_url, schema, "init"), check=True, capture_output=True)
    chunk = 50
    for attempt in range(6):
        with admin_engine.connect() as connection:
            status = connection.execute(sa.text(f"SELECT status FROM {schema}.batches")).scalar()
        if status == "complete":
            break
        resume = ["--resume"] if status == "running" else []
        process = subprocess.Popen(simdb_command(database_url, schema, "ingest", path, "--batch", "b",
                                                 "--chunk-size", str(chunk), "--workers", "1", *resume),
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        time.sleep(rng.uniform(1.0, 4.0))
        killed(process)
        wait_for_backends_to_finish(admin_engine, schema)  # a COMMIT sent just before the kill may still be landing
        with admin_engine.connect() as connection:  # one statement: one snapshot
            row = connection.execute(sa.text(
                f"SELECT (SELECT count(*) FROM {schema}.documents) AS stored, b.status, b.position, b.documents "
                f"FROM (SELECT 1) AS one LEFT JOIN {schema}.batches b ON true")).one()
        if row.status is None:
            assert row.stored == 0  # killed before the first chunk committed: nothing at all
        else:
            assert row.documents == row.stored
            assert row.position == len(records) if row.status == "complete" else row.position % chunk == 0
        state(admin_engine, schema)
    with admin_engine.connect() as connection:
        status = connection.execute(sa.text(f"SELECT status FROM {schema}.batches")).scalar()
    if status != "complete":
        resume = ["--resume"] if status == "running" else []
        subprocess.run(simdb_command(database_url, schema, "ingest", path, "--batch", "b", "--chunk-size",
                                     str(chunk), *resume), check=True, capture_output=True)
    after_kills = state(admin_engine, schema)
    with admin_engine.begin() as connection:
        connection.exec_driver_sql(f"DROP SCHEMA {schema} CASCADE")
    with Index.create(database_url, schema=schema) as index:
        index.add_many(records, batch="b")
    assert after_kills == state(admin_engine, schema)


@pytest.mark.citus
def test_a_rerun_of_the_same_input_stores_nothing_twice(run, tmp_path, admin_engine, schema):
    run("init")
    path = write_jsonl(tmp_path / "in.jsonl", CORPUS[:50])
    assert run("ingest", path, "--batch", "one").exit_code == 0
    result = run("ingest", path, "--batch", "again")
    assert "0 documents: 0 new" in result.output and "50 already stored" in result.output
    assert count_rows(admin_engine, schema) == (50, 2)


@pytest.mark.citus
@pytest.mark.citus_by_id
@pytest.mark.slow
def test_concurrent_ingests_find_every_pair(database_url, admin_engine, schema, tmp_path):
    """Three processes at once, their batches sharing near-duplicates: same result as one after another."""
    subprocess.run(simdb_command(database_url, schema, "init"), check=True, capture_output=True)
    # spread each base and its copies over different files
    files = [[], [], []]
    for i, record in enumerate(CORPUS):
        files[i % 3].append(record)
    paths = [write_jsonl(tmp_path / f"part{i}.jsonl", records) for i, records in enumerate(files)]
    processes = [subprocess.Popen(simdb_command(database_url, schema, "ingest", path, "--batch", f"part{i}",
                                                "--chunk-size", "25", "--workers", "1"),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for i, path in enumerate(paths)]
    for process in processes:
        out, err = process.communicate(timeout=300)
        assert process.returncode == 0, err
    assert count_rows(admin_engine, schema) == (len(CORPUS), 3)
    pairs = state(admin_engine, schema)  # duplicate_of is the earliest match, whatever the interleaving
    assert sum(dup is not None for _, dup in pairs) > 40
    with Index.open(database_url, schema=schema) as index:
        found = {(p.a, p.b) for p in index.pairs()}
        exported = [(e["id"], int(e["simhash"], 16)) for e in index.export()]
    expected = {(a, b) for i, (a, fa) in enumerate(exported) for b, fb in exported[i + 1:] if (fa ^ fb).bit_count() <= K}
    assert found == expected


@pytest.mark.slow
def test_rejects_are_as_durable_as_stored_rows_across_sigkill(database_url, admin_engine, schema, tmp_path):
    """Regression (issue 9): the rejects file was written after its chunk committed, so a kill in
    between lost rejects the batch counted. Now they are kept in the chunk's transaction and the
    file is rebuilt from the database: it never holds a reject the database lacks, and after the
    resume it holds exactly the database's."""
    rng = random.Random(9)
    lines, bad = [], []
    for copy in range(4):
        for i, record in enumerate(CORPUS):
            if (copy * len(CORPUS) + i) % 7 == 3:
                lines.append('{"id": "broken-%d-%d", "text": ' % (copy, i))
                bad.append(len(lines))
            else:
                lines.append(json.dumps({**record, "id": f"{record['id']}-{copy}"}))
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(lines) + "\n")
    rejects = tmp_path / "rejects.jsonl"
    subprocess.run(simdb_command(database_url, schema, "init"), check=True, capture_output=True)
    command = simdb_command(database_url, schema, "ingest", str(path), "--batch", "b", "--chunk-size", "40",
                            "--workers", "1", "--on-error", "skip", "--rejects", str(rejects))

    def stored_rejects():
        with admin_engine.connect() as connection:
            return connection.execute(sa.text(
                f"SELECT line FROM {schema}.records WHERE status = 'rejected' ORDER BY position")).scalars().all()

    def status():
        with admin_engine.connect() as connection:
            return connection.execute(sa.text(f"SELECT status FROM {schema}.batches")).scalar()

    for attempt in range(5):
        current = status()
        if current == "complete":
            break
        process = subprocess.Popen(command + (["--resume"] if current == "running" else []),
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        time.sleep(rng.uniform(1.0, 3.0))
        killed(process, done=(0, 3))  # done, some records rejected
        wait_for_backends_to_finish(admin_engine, schema)
        in_file = [json.loads(line)["line"] for line in rejects.read_text().splitlines()] if rejects.exists() else []
        in_database = stored_rejects()
        assert in_file == in_database[:len(in_file)]  # the file never runs ahead of the database
        state(admin_engine, schema)  # batch counts == record statuses, documents == their records
    if status() != "complete":
        finished = subprocess.run(command + (["--resume"] if status() == "running" else []), capture_output=True)
        assert finished.returncode == 3, finished.stderr  # done, some records rejected
    assert [json.loads(line)["line"] for line in rejects.read_text().splitlines()] == stored_rejects() == bad
    assert count_rows(admin_engine, schema) == (len(lines) - len(bad), 1)
    state(admin_engine, schema)


def test_a_resume_rewrites_the_rejects_file_from_the_database(database_url, schema, tmp_path, monkeypatch):
    """A process that dies after its chunk commits but before the files are written loses nothing."""
    from simdb.verdicts import OutcomeFile as Rejects

    documents = [Document(r["id"], r["text"]) for r in CORPUS[:120]]
    items = [InputError(f"bad record {i}", path="in", line=i) if i % 10 == 5 else d for i, d in enumerate(documents)]
    rejects = tmp_path / "rejects.jsonl"
    verdicts = tmp_path / "verdicts.jsonl"
    options = dict(batch="b", on_error="skip", rejects=str(rejects), chunk_size=30, verdicts=str(verdicts))
    real_sync = Rejects.sync

    def dies_after_its_first_commit(self, position):
        if position:
            raise KeyboardInterrupt  # as a SIGKILL would, before the file is written
        real_sync(self, position)

    with Index.create(database_url, schema=schema) as index:
        monkeypatch.setattr(Rejects, "sync", dies_after_its_first_commit)
        try:
            index.ingest(items, IngestOptions(**options))
        except KeyboardInterrupt:
            pass
        monkeypatch.setattr(Rejects, "sync", real_sync)
        assert not rejects.exists() or rejects.read_text() == ""
        summary = index.ingest(items, IngestOptions(**options, resume=True))
    assert summary.rejected == 12
    assert [json.loads(line)["line"] for line in rejects.read_text().splitlines()] == list(range(5, 120, 10))
    written = [json.loads(line) for line in verdicts.read_text().splitlines()]
    assert [v["position"] for v in written] == list(range(1, 121))
    assert [v["status"] == "rejected" for v in written] == [i % 10 == 5 for i in range(120)]


def children_of(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    if int(stat.read().rsplit(")", 1)[1].split()[1]) == pid:
                        found.append(int(entry))
            except (OSError, IndexError, ValueError):
                pass
    return found


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
def test_fingerprinting_workers_exit_when_the_ingest_is_killed(database_url, schema, tmp_path):
    """Regression (issue 9): after kill -9 of `simdb ingest` its workers (~150 MB each) lived on."""
    path = write_jsonl(tmp_path / "in.jsonl", [{**r, "id": f"{r['id']}-{copy}"} for copy in range(60) for r in CORPUS])
    subprocess.run(simdb_command(database_url, schema, "init"), check=True, capture_output=True)
    process = subprocess.Popen(simdb_command(database_url, schema, "ingest", path, "--batch", "b", "--workers", "2"),
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while len(children_of(process.pid)) < 3 and time.monotonic() < deadline:  # 2 workers and the resource tracker
        time.sleep(0.1)
    children = children_of(process.pid)
    assert len(children) >= 2, "the ingest never started its worker pool"
    killed(process)
    deadline = time.monotonic() + 10
    while any(alive(child) for child in children) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [child for child in children if alive(child)]
