"""PostgreSQL tables kept in sync (``simdb sync``, issue 39): runs over a table in the same database and in
another one give, row by row, the verdicts a brute-force oracle gives for the rows in (watermark, id) order;
runs SIGKILLed at random chunks, then run again, store every row once with the records and pairs of one clean
run; two runs at once never ingest a row twice; changed rows under each policy; bad rows are rejects naming
the source and the row."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa

from simdb import Index, InputError, SimdbError
from simdb.inputs import Document
from simdb.ingest import IngestOptions
from simdb.pg import sync as pg_sync
from simdb.samples import corpus
from simdb.text import content_hash
from tests.conftest import Concurrently, assert_consistent
from tests.maintained import assert_maintained
from tests.test_verdicts import oracle

ROOT = Path(__file__).resolve().parent.parent
CORPUS = list(corpus())
START = datetime(2026, 1, 1, tzinfo=timezone.utc)


def source_rows(seed: int, count: int, first: int = 0, *, bad: bool = True) -> list[tuple]:
    """(id, body, title, updated_at) rows: corpus texts under shuffled integer ids, four rows to a watermark
    value (ties), and, with ``bad``, a NULL id, a NULL text, an empty text and a repeated id."""
    rng = random.Random(seed)
    ids = list(range(first + 1, first + count + 1))
    rng.shuffle(ids)
    rows = [(ids[i], CORPUS[(first + i) % len(CORPUS)]["text"], f"title {ids[i]}",
             START + timedelta(minutes=(first + i) // 4)) for i in range(count)]
    if bad:
        at = START + timedelta(minutes=(first + count // 2) // 4)
        rows += [(None, "a text whose row has no id at all", "no id", at),
                 (first + count + 1, None, "no text", at),
                 (first + count + 2, "   ", "blank", at),
                 (ids[0], CORPUS[first + 5]["text"] + " (again)", "repeated", at)]
    return rows


def in_order(rows: list[tuple]) -> list[tuple]:
    """The rows as a sync run reads them: by watermark, then id, a NULL id last among its ties."""
    return sorted(rows, key=lambda row: (row[3], row[0] is None, row[0] or 0))


def items(rows: list[tuple]) -> list:
    """The oracle's input for rows in reading order."""
    return [InputError("bad row") if row[0] is None or row[1] is None or not row[1].strip()
            else Document(str(row[0]), row[1]) for row in rows]


def create_table(url: str, table: str, rows: list[tuple]) -> None:
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute(f"CREATE TABLE {table} (id int, body text, title text, updated_at timestamptz)")
        insert(url, table, rows)


def insert(url: str, table: str, rows: list[tuple]) -> None:
    with psycopg.connect(url) as connection:
        with connection.cursor().copy(f"COPY {table} (id, body, title, updated_at) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)


def essentials(verdicts) -> list[tuple]:
    return [(None if v.status == "rejected" else v.id, v.status, v.duplicate_of, v.distance) for v in verdicts]


def expected(method, stored: list, rows: list[tuple]) -> list[tuple]:
    return [(None if status == "rejected" else name, status, duplicate_of, distance)
            for name, status, duplicate_of, distance in oracle(method, stored, items(rows))]


@pytest.fixture
def table(database_url):
    """A source table's name, in a schema of its own (a table in ``public`` would be on every index's search path,
    where ``alembic check`` in another test would see it)."""
    schema = f"sync_src_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(database_url, autocommit=True) as connection:
        connection.execute(f"CREATE SCHEMA {schema}")
    yield f"{schema}.articles"
    with psycopg.connect(database_url, autocommit=True) as connection:
        connection.execute(f"DROP SCHEMA {schema} CASCADE")


@pytest.fixture
def other_database(database_url):
    """A database of its own on the test server, dropped after the test: ``(url, name)``."""
    name = f"simdb_sync_src_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(database_url, autocommit=True) as connection:
        connection.execute(f"CREATE DATABASE {name}")
    yield sa.make_url(database_url).set(database=name).render_as_string(hide_password=False), name
    with psycopg.connect(database_url, autocommit=True) as connection:
        connection.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def run_options(tmp_path: Path, **more) -> IngestOptions:
    """A run's options, its rejects file under ``tmp_path`` (the default is in the working folder)."""
    more.setdefault("rejects", str(tmp_path / f"rejects-{uuid.uuid4().hex[:8]}.jsonl"))
    more.setdefault("on_error", "skip")
    return IngestOptions(chunk_size=more.pop("chunk_size", 7), workers=1, **more)


def test_runs_over_a_table_give_the_oracles_verdicts_row_by_row(database_url, schema, table, admin_engine, tmp_path):
    first, later = source_rows(1, 60), source_rows(2, 25, first=60)
    create_table(database_url, table, first)
    with Index.create(database_url, schema=schema) as index:
        method, stored = index.settings.method, []
        index.sync_add("articles", table=table, id_column="id", text_column="body", metadata_columns=["title"],
                       watermark_column="updated_at")
        one = index.sync_run("articles", run_options(tmp_path))
        assert essentials(index.verdicts(one.name)) == expected(method, stored, in_order(first))
        insert(database_url, table, later)
        two = index.sync_run("articles", run_options(tmp_path))
        assert essentials(index.verdicts(two.name)) == expected(method, stored, in_order(later))
        nothing = index.sync_run("articles", run_options(tmp_path))
        assert not nothing.recorded and nothing.documents == 0
        ((source, last),) = index.sync_sources()
        assert source.batch == two.name and last["documents"] == two.documents and source.last_run_at
        stored_metadata = index.document(str(first[0][0])).metadata
    assert stored_metadata == {"title": first[0][2]}
    assert_maintained(admin_engine, schema)
    assert len(assert_consistent(admin_engine, schema)) == one.documents + two.documents == \
        len({row[0] for row in first + later if row[0] is not None and row[1] and row[1].strip()})


def test_a_table_in_another_database_is_read_through_its_url(database_url, schema, other_database, tmp_path):
    url, _ = other_database
    rows = source_rows(3, 40)
    create_table(url, "public.posts", rows)
    with Index.create(database_url, schema=schema) as index:
        index.sync_add("forum", query="SELECT id, body, updated_at FROM public.posts WHERE body NOT LIKE '%(again)'",
                       id_column="id", text_column="body", watermark_column="updated_at", source_url=url)
        summary = index.sync_run("forum", run_options(tmp_path))
        kept = [row for row in in_order(rows) if row[1] is not None and not row[1].endswith("(again)")]  # as SQL
        assert essentials(index.verdicts(summary.name)) == expected(index.settings.method, [], kept)


def test_a_source_password_is_neither_stored_nor_printed(database_url, schema, table, run, tmp_path):
    create_table(database_url, table, source_rows(4, 5, bad=False))
    assert run("init").exit_code == 0
    secret_url = sa.make_url(database_url).set(password="s3cr3t-sync", port=1).render_as_string(hide_password=False)
    added = run("sync", "add", "t", "--table", table, "--id", "id", "--text", "body", "--source-url", secret_url)
    assert added.exit_code == 1 and "s3cr3t-sync" not in added.output and "***" in added.output, added.output
    kept = sa.make_url(database_url).set(password="s3cr3t-sync").render_as_string(hide_password=False)
    added = run("sync", "add", "t", "--table", table, "--id", "id", "--text", "body", "--source-url", kept)
    assert added.exit_code == 0 and "s3cr3t-sync" not in added.output and "password is not stored" in added.output
    listed = run("sync", "list", "--json")
    assert "s3cr3t-sync" not in listed.output and json.loads(listed.output)["source_url"]
    failed = run("sync", "run", "t", "--source-url", secret_url, "--rejects", str(tmp_path / "r.jsonl"))
    assert failed.exit_code == 1 and "s3cr3t-sync" not in failed.output and "***" in failed.output


@pytest.mark.parametrize("form", ["query", "sslpassword", "keywords"])
def test_a_password_in_the_source_urls_parameters_is_neither_stored_nor_printed(database_url, schema, table, run,
                                                                                admin_engine, form):
    """A review found ``?password=`` and ``?sslpassword=`` kept in the stored URL (only a userinfo password was
    left out), printed by ``sync add`` and ``sync list`` and readable by the reader role."""
    create_table(database_url, table, source_rows(4, 5, bad=False))
    assert run("init").exit_code == 0
    url = sa.make_url(database_url)
    source_url = {"query": f"{url.render_as_string(hide_password=False)}?password=s3cr3t-q&application_name=simdb",
                  "sslpassword": f"{url.render_as_string(hide_password=False)}?sslpassword=s3cr3t-q",
                  "keywords": f"host={url.host} port={url.port} dbname={url.database} user={url.username} "
                              f"password=s3cr3t-q"}[form]
    added = run("sync", "add", "t", "--table", table, "--id", "id", "--text", "body", "--source-url", source_url)
    assert added.exit_code == 0, added.output
    assert "s3cr3t-q" not in added.output and "password is not stored" in added.output
    for listed in (run("sync", "list"), run("sync", "list", "--json")):
        assert listed.exit_code == 0 and "s3cr3t-q" not in listed.output, listed.output
    with admin_engine.connect() as connection:
        stored = connection.exec_driver_sql(f"SELECT source_url FROM {schema}.sync_sources").scalar_one()
    assert stored and "s3cr3t-q" not in stored and "password" not in stored.lower()


def test_bad_rows_are_rejects_naming_the_source_and_the_row(database_url, schema, table, tmp_path):
    rows = source_rows(5, 20)
    create_table(database_url, table, rows)
    rejects = tmp_path / "rejects.jsonl"
    with Index.create(database_url, schema=schema) as index:
        index.sync_add("src", table=table, id_column="id", text_column="body", watermark_column="updated_at")
        summary = index.sync_run("src", run_options(tmp_path, rejects=str(rejects)))
        with pytest.raises(InputError, match=r"^sync source strict, row \d+: id '\d+' appears twice .*\(first at "
                                             r"sync source strict, row \d+\)"):
            index.sync_add("strict", table=table, id_column="id", text_column="body")
            index.sync_run("strict", IngestOptions(workers=1))  # on_error stop: the first bad row stops it
    lines = [json.loads(line) for line in rejects.read_text().splitlines()]
    assert summary.rejected == 4 == len(lines) and all(line["path"] == "sync source src" for line in lines)
    assert [line["line"] for line in lines] == [line["position"] for line in lines]  # row N: its place in the batch
    repeated, no_text, blank = (str(rows[-1][0]), str(rows[-3][0]), str(rows[-2][0]))
    reasons = {line["id"]: line["reason"] for line in lines}
    assert reasons[None].startswith("a row (watermark 2026-01-01 ") and "NULL id column 'id'" in reasons[None]
    assert "NULL text column 'body'" in reasons[no_text] and repr(no_text) in reasons[no_text]
    assert "empty or only whitespace" in reasons[blank] and repr(blank) in reasons[blank]
    assert "appears twice" in reasons[repeated]


@pytest.mark.parametrize("policy", ["keep", "replace"])
def test_a_changed_row_is_kept_or_replaced_as_the_source_says(policy, database_url, schema, table, admin_engine,
                                                              tmp_path):
    rows = source_rows(6, 30, bad=False)
    create_table(database_url, table, rows)
    changed_id, new_text = rows[3][0], CORPUS[100]["text"]
    with Index.create(database_url, schema=schema, count_by=["title"]) as index:  # field_counts kept through it
        method = index.settings.method
        index.sync_add("src", table=table, id_column="id", text_column="body", watermark_column="updated_at",
                       on_change=policy, metadata_columns=["title"])
        index.sync_run("src", run_options(tmp_path))
        with psycopg.connect(database_url, autocommit=True) as connection:
            connection.execute(f"UPDATE {table} SET body = %s, title = 'changed', updated_at = %s WHERE id = %s",
                               (new_text, START + timedelta(days=1), changed_id))
            connection.execute(f"UPDATE {table} SET updated_at = %s WHERE id = %s",  # touched, same text
                               (START + timedelta(days=1), rows[4][0]))
        again = index.sync_run("src", run_options(tmp_path))
        verdicts = {v.id: v for v in index.verdicts(again.name)}
    with admin_engine.connect() as connection:
        digest = connection.execute(sa.text(f"SELECT content_hash FROM {schema}.documents WHERE external_id = :id"),
                                    {"id": str(changed_id)}).scalar_one()
    assert verdicts[str(rows[4][0])].status == "already_stored"
    survivors = [(str(row[0]), method.sketch(row[1]), content_hash(row[1])) for row in in_order(rows)
                 if row[0] != changed_id]
    if policy == "keep":
        assert verdicts[str(changed_id)].status == "rejected" and "different text" in verdicts[str(changed_id)].reason
        assert digest == content_hash(rows[3][1]) and again.rejected == 1
    else:
        want = oracle(method, survivors, [Document(str(changed_id), new_text)])[0]
        got = verdicts[str(changed_id)]
        assert (got.id, got.status, got.duplicate_of, got.distance) == want
        assert digest == content_hash(new_text) and again.rejected == 0
    assert_maintained(admin_engine, schema)  # field_counts by title among them
    assert len(assert_consistent(admin_engine, schema)) == 30
    with admin_engine.connect() as connection:
        titles = dict(connection.execute(sa.text(f"SELECT value, documents FROM {schema}.field_counts")).all())
    assert titles.get("changed") == (1 if policy == "replace" else None) and sum(titles.values()) == 30


def test_a_replace_run_whose_lookups_are_spread_does_not_meet_the_rows_it_replaced(database_url, schema, table,
                                                                                   admin_engine, tmp_path, monkeypatch):
    """A replace run removes a changed row's old document in the chunk's transaction, then looks the chunk up.
    Lookups spread over other connections read the chunk's exported snapshot, which does not show its own
    transaction's removal: they met the old document, a near copy of its new text, and the chunk failed
    (KeyError: the pair's stored side was gone), at the same chunk on every rerun. Such a chunk keeps to its
    own connection; the verdict is the oracle's against the documents that remain."""
    from simdb.pg import in_memory, probes

    monkeypatch.setattr(in_memory, "ROWS_PER_PROBE", 0)  # every stored segment looked up by index,
    monkeypatch.setattr(probes, "SHARED_PROBES", 1)  # and over several connections, however small the chunk
    rows = source_rows(8, 30, bad=False)
    create_table(database_url, table, rows)
    changed_id, old_text = rows[3][0], rows[3][1]
    new_text = old_text + " 附"  # a near copy of the text it replaces
    with Index.create(database_url, schema=schema, segment_size=10) as index:
        method = index.settings.method
        assert method.distances(method.sketch(new_text), method.stored([method.sketch(old_text)]))[0] <= method.max_distance
        index.sync_add("src", table=table, id_column="id", text_column="body", watermark_column="updated_at",
                       on_change="replace")
        index.sync_run("src", run_options(tmp_path, connections=2))
        with psycopg.connect(database_url, autocommit=True) as connection:
            connection.execute(f"UPDATE {table} SET body = %s, updated_at = %s WHERE id = %s",
                               (new_text, START + timedelta(days=1), changed_id))
        again = index.sync_run("src", run_options(tmp_path, connections=2))
        got = [(v.id, v.status, v.duplicate_of, v.distance) for v in index.verdicts(again.name)]
    survivors = [(str(row[0]), method.sketch(row[1]), content_hash(row[1])) for row in in_order(rows)
                 if row[0] != changed_id]
    assert got == oracle(method, survivors, [Document(str(changed_id), new_text)])
    assert_maintained(admin_engine, schema)
    assert len(assert_consistent(admin_engine, schema)) == 30


def test_a_second_run_of_a_source_refuses_or_waits_and_no_row_is_ingested_twice(database_url, schema, table,
                                                                                admin_engine, tmp_path):
    rows = source_rows(7, 50, bad=False)
    create_table(database_url, table, rows)
    with Index.create(database_url, schema=schema) as index:
        index.sync_add("src", table=table, id_column="id", text_column="body", watermark_column="updated_at")
        with index.database.engine.connect() as holder:  # as a run under way holds it
            assert pg_sync.lock_run(holder, schema, "src", wait=False)
            with pytest.raises(SimdbError, match="another `simdb sync run` of source 'src' is under way"):
                index.sync_run("src", run_options(tmp_path))
            with Concurrently() as threads:
                waiting = threads.start(index.sync_run, "src", run_options(tmp_path), wait=True)
                assert not waiting.done()
                pg_sync.unlock_run(holder, schema, "src")
                assert waiting.result(120).documents == 50
        insert(database_url, table, source_rows(8, 40, first=50, bad=False))
        with Concurrently() as threads:
            for _ in range(3):
                threads.start(index.sync_run, "src", run_options(tmp_path), wait=True)
            summaries = threads.results()
    assert sorted(summary.documents for summary in summaries) == [0, 0, 40]
    assert_maintained(admin_engine, schema)
    assert len(assert_consistent(admin_engine, schema)) == 90


def records_and_pairs(engine: sa.Engine, schema: str) -> tuple[list, set]:
    with engine.connect() as connection:
        records = connection.execute(sa.text(
            f"SELECT r.position, r.external_id, r.status, r.duplicate_of_external_id, r.distance "
            f"FROM {schema}.records r ORDER BY r.batch_id, r.position")).all()
        pairs = connection.execute(sa.text(
            f"SELECT a_external_id, b_external_id, distance FROM {schema}.near_duplicate_pairs")).all()
    return [tuple(r) for r in records], {tuple(p) for p in pairs}


@pytest.mark.slow
@pytest.mark.parametrize("seed", [11, 12])
def test_runs_killed_at_random_chunks_store_every_row_once_as_one_clean_run(seed, database_url, admin_engine,
                                                                             table, tmp_path):
    rows = source_rows(seed, 80)
    create_table(database_url, table, rows)
    schemas = {name: f"sync_{name}_{uuid.uuid4().hex[:8]}" for name in ("clean", "killed")}
    where = {name: ["--database-url", database_url, "--schema", schema] for name, schema in schemas.items()}
    add = ["sync", "add", "src", "--table", table, "--id", "id", "--text", "body", "--watermark", "updated_at"]
    run = ["sync", "run", "src", "--chunk-size", "6", "--workers", "1", "--rejects", str(tmp_path / "r.jsonl")]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        for name in schemas:
            for command in (["init"], add):
                done = subprocess.run([sys.executable, "-m", "simdb", *command, *where[name]], capture_output=True,
                                      text=True, timeout=300)
                assert done.returncode == 0, done.stderr
        clean = subprocess.run([sys.executable, "-m", "simdb", *run, *where["clean"]], capture_output=True, text=True,
                               timeout=300)
        assert clean.returncode == 3, clean.stderr  # the bad rows
        rng, kills = random.Random(seed), 0
        while True:
            chunk, when = rng.randint(1, 4), rng.choice(["before", "after"])
            done = subprocess.run([sys.executable, "-m", "tests.killsync", str(chunk), when, *run, *where["killed"]],
                                  cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
            if done.returncode != -signal.SIGKILL:
                # the last run: fewer chunks left than the kill's (0: the run before it stored the last chunk)
                assert done.returncode in (0, 3), done.stderr
                break
            kills += 1
        assert kills >= 2
        (records, pairs), (clean_records, clean_pairs) = (records_and_pairs(admin_engine, schemas[name])
                                                          for name in ("killed", "clean"))
        assert [r for r in records if r not in clean_records] == [] == [r for r in clean_records if r not in records]
        assert records == clean_records and pairs == clean_pairs
        stored = len(assert_consistent(admin_engine, schemas["killed"]))
        assert stored == len({row[0] for row in rows if row[0] is not None and row[1] and row[1].strip()})
    finally:
        with admin_engine.begin() as connection:
            for schema in schemas.values():
                connection.exec_driver_sql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def test_the_sql_recipe_puts_verdicts_next_to_the_rows_for_the_reader_role(database_url, schema, table, admin_engine,
                                                                           tmp_path):
    import re

    (recipe,) = re.findall(r"```sql sync\n(.*?)```", (ROOT / "docs" / "sql.md").read_text(), flags=re.S)
    rows = source_rows(9, 40, bad=False)
    create_table(database_url, table, rows)
    role = f"sync_reader_{uuid.uuid4().hex[:8]}"
    try:
        with Index.create(database_url, schema=schema) as index:
            index.sync_add("articles", table=table, id_column="id", text_column="body", metadata_columns=["title"],
                           watermark_column="updated_at")
            summary = index.sync_run("articles", run_options(tmp_path))
            index.grant_reader(role)
            method = index.settings.method
        with admin_engine.begin() as connection:
            connection.exec_driver_sql(f"GRANT USAGE ON SCHEMA {table.split('.')[0]} TO {role}")  # the analyst's
            connection.exec_driver_sql(f"GRANT SELECT ON {table} TO {role}")  # own table
            connection.exec_driver_sql(f"SET LOCAL ROLE {role}")
            found = connection.execute(sa.text(recipe.replace("simdb.", f"{schema}.").replace(
                "public.articles", table))).all()
        want = sorted((int(name), status, duplicate_of, summary.name)
                      for name, status, duplicate_of, _ in oracle(method, [], items(in_order(rows)))
                      if status in ("exact", "near"))
        assert [(r.id, r.status, r.duplicate_of, r.batch) for r in found] == want and want
        assert [r.title for r in found] == [f"title {r[0]}" for r in want]
    finally:
        with admin_engine.begin() as connection:
            connection.exec_driver_sql(f"DROP OWNED BY {role}")
            connection.exec_driver_sql(f"DROP ROLE {role}")


@pytest.mark.slow
def test_the_nightly_sync_script_runs(database_url, schema, table, tmp_path, admin_engine):
    """docs/scripts.md's script, as cron would run it: a first run, new and changed rows, nothing new, a run
    killed in the middle and the run after it, a run while another holds the source."""
    import re

    (text,) = re.findall(r"```bash\n(#!/usr/bin/env bash\n# nightly-sync.*?)```",
                         (ROOT / "docs" / "scripts.md").read_text(), flags=re.S)
    script = tmp_path / "nightly-sync"
    script.write_text(text)
    script.chmod(0o755)
    env = {**os.environ, "SIMDB_DATABASE_URL": database_url, "SIMDB_SCHEMA": schema, "PYTHONPATH": str(ROOT),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    out = tmp_path / "out"

    def nightly():
        return subprocess.run([str(script), "articles", str(out)], env=env, capture_output=True, text=True,
                              timeout=300)

    def latest(kind):
        return [json.loads(line) for line in sorted(out.glob(f"articles-*.{kind}.jsonl"))[-1].read_text().splitlines()]

    rows = source_rows(10, 50, bad=False)
    create_table(database_url, table, rows)
    for command in (["init"], ["sync", "add", "articles", "--table", table, "--id", "id", "--text", "body",
                               "--watermark", "updated_at"]):
        assert subprocess.run([sys.executable, "-m", "simdb", *command], env=env, capture_output=True).returncode == 0
    first = nightly()
    assert first.returncode == 0, first.stderr
    verdicts = latest("verdicts")
    assert [v["id"] for v in verdicts] == [str(row[0]) for row in in_order(rows)]
    (unique,) = out.glob("sync-articles-*.unique.jsonl")
    assert [json.loads(line)["id"] for line in unique.read_text().splitlines()] == \
        [v["id"] for v in verdicts if v["status"] == "new"]

    insert(database_url, table, source_rows(11, 10, first=50, bad=False))
    with psycopg.connect(database_url, autocommit=True) as connection:
        connection.execute(f"UPDATE {table} SET body = body || ' (edited)', updated_at = %s WHERE id = %s",
                           (START + timedelta(days=2), rows[0][0]))
    second = nightly()
    assert second.returncode == 0 and "some rows of articles were rejected" in second.stderr, second.stderr
    assert [r["id"] for r in latest("rejects")] == [str(rows[0][0])] and len(latest("verdicts")) == 11

    nothing = nightly()
    assert nothing.returncode == 0 and "articles has nothing new" in nothing.stderr, nothing.stderr

    insert(database_url, table, [(*row[:3], row[3] + timedelta(days=3))  # after the edited row's watermark
                                 for row in source_rows(12, 30, first=60, bad=False)])
    killed = subprocess.run([sys.executable, "-m", "tests.killsync", "2", "after", "sync", "run", "articles",
                             "--chunk-size", "10", "--rejects", str(tmp_path / "killed.rejects.jsonl")],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    after = nightly()
    assert after.returncode == 0, after.stderr
    assert [v["position"] for v in latest("verdicts")] == list(range(1, 31))  # the whole batch, written again

    with Index.open(database_url, schema=schema) as index, index.database.engine.connect() as holder:
        assert pg_sync.lock_run(holder, schema, "articles", wait=False)
        locked = nightly()
    assert locked.returncode == 75 and "another run of articles is under way" in locked.stderr, locked.stderr
    assert_maintained(admin_engine, schema)
    assert len(assert_consistent(admin_engine, schema)) == 90


def test_rows_are_read_through_a_server_side_cursor_a_few_at_a_time(database_url, table):
    """Memory stays flat in the table's size: the rows come ``itersize`` at a time from a cursor on the server."""
    import re

    rows = source_rows(13, 30, bad=False)
    create_table(database_url, table, rows)
    source = pg_sync.Source("s", table, None, "id", "body", watermark_column="updated_at")
    read = pg_sync.source_rows(database_url, source, itersize=7)
    first = next(read)
    with psycopg.connect(database_url) as connection:
        queries = [query for (query,) in connection.execute(
            "SELECT query FROM pg_stat_activity WHERE application_name = 'simdb sync'")]
    assert any(re.match(r'FETCH FORWARD 7 FROM "?simdb_sync"?', query) for query in queries), queries
    assert [first[0], *(row[0] for row in read)] == [str(row[0]) for row in in_order(rows)]


def test_lag_holds_back_rows_whose_watermark_is_too_recent(database_url, schema, table, tmp_path):
    """A row stamped a moment ago may have neighbours still uncommitted: with --lag it waits for a later run."""
    now = datetime.now(timezone.utc)
    rows = [(1, CORPUS[0]["text"], "old", now - timedelta(hours=2)), (2, CORPUS[1]["text"], "new", now)]
    create_table(database_url, table, rows)
    with Index.create(database_url, schema=schema) as index:
        index.sync_add("src", table=table, id_column="id", text_column="body", watermark_column="updated_at",
                       lag=timedelta(hours=1))
        first = index.sync_run("src", run_options(tmp_path))
        assert [v.id for v in index.verdicts(first.name)] == ["1"]
        with index.database.engine.begin() as connection:  # an hour later, as far as the lag can tell
            connection.exec_driver_sql("UPDATE sync_sources SET lag = interval '0'")
        second = index.sync_run("src", run_options(tmp_path))
        assert [v.id for v in index.verdicts(second.name)] == ["2"]


def test_replace_removes_only_the_documents_of_its_own_source(database_url, schema, table, admin_engine, tmp_path):
    """External ids are global to the index: a replace run of source b whose ids collide with source a's rows and
    with a plain ingest's documents stores none of them and removes none of theirs."""
    other = f"{table}_b"
    rows_a = [(i, CORPUS[i]["text"], f"a {i}", START) for i in range(1, 11)]
    rows_b = [(i, CORPUS[20 + i]["text"], f"b {i}", START) for i in range(1, 11)]
    rows_b.append((99, CORPUS[40]["text"], "b 99", START))  # an id of the plain ingest, another text
    create_table(database_url, table, rows_a)
    create_table(database_url, other, rows_b)
    with Index.create(database_url, schema=schema) as index:
        index.add_many([Document("99", CORPUS[50]["text"])], batch="plain")
        index.sync_add("a", table=table, id_column="id", text_column="body", watermark_column="updated_at")
        index.sync_add("b", table=other, id_column="id", text_column="body", watermark_column="updated_at",
                       on_change="replace")
        index.sync_run("a", run_options(tmp_path))
        summary = index.sync_run("b", run_options(tmp_path))
        verdicts = {v.id: v for v in index.verdicts(summary.name)}
    with admin_engine.connect() as connection:
        stored = dict(connection.execute(sa.text(f"SELECT external_id, content_hash FROM {schema}.documents")).all())
    want = {str(row[0]): content_hash(row[1]) for row in rows_a}
    want["99"] = content_hash(CORPUS[50]["text"])
    assert stored == want
    different = {str(row[0]) for row in rows_b if content_hash(row[1]) != want[str(row[0])]}
    assert {i for i, v in verdicts.items() if v.status == "rejected" and "different text" in v.reason} == different
    assert summary.documents == 0 and summary.rejected == len(different) == 11
    assert_maintained(admin_engine, schema)
    assert len(assert_consistent(admin_engine, schema)) == 11


def test_a_replace_run_waits_for_a_removal_under_way_before_it_looks_for_changed_rows(database_url, schema, table,
                                                                                    admin_engine, tmp_path):
    """A `simdb remove --id X` that commits while the run's chunk is looking for changed rows: the chunk sees
    the removal (X is stored as a new row), rather than removing X again and failing with "no stored document"."""
    import time

    from simdb.pg.remove import remove

    rows = source_rows(17, 12, bad=False)
    create_table(database_url, table, rows)
    changed, new_text = rows[3][0], CORPUS[130]["text"]
    with Index.create(database_url, schema=schema) as index:
        method = index.settings.method
        index.sync_add("src", table=table, id_column="id", text_column="body", watermark_column="updated_at",
                       on_change="replace")
        index.sync_run("src", run_options(tmp_path))
        with psycopg.connect(database_url, autocommit=True) as connection:
            connection.execute(f"UPDATE {table} SET body = %s, updated_at = %s WHERE id = %s",
                               (new_text, START + timedelta(days=1), changed))
        with index.database.engine.connect() as remover, psycopg.connect(database_url, autocommit=True) as watcher, \
                Concurrently() as threads:
            remover.begin()
            remove(remover, schema, method, external_ids=[str(changed)], keyed=index.context.keyed)  # the ingest lock
            holder = remover.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()
            run = threads.start(index.sync_run, "src", run_options(tmp_path))
            while not watcher.execute("SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
                                      (holder,)).fetchone()[0]:  # a transaction's own view of it would stand still
                assert not run.done(), run.result()
                time.sleep(0.05)
            remover.commit()
            summary = run.result(120)
        got = {v.id: v for v in index.verdicts(summary.name)}[str(changed)]
    survivors = [(str(row[0]), method.sketch(row[1]), content_hash(row[1])) for row in in_order(rows)
                 if row[0] != changed]
    assert (got.id, got.status, got.duplicate_of, got.distance) == \
        oracle(method, survivors, [Document(str(changed), new_text)])[0]
    assert_maintained(admin_engine, schema)
    assert len(assert_consistent(admin_engine, schema)) == 12


def _killed_after_first_chunk(monkeypatch, index, name: str, options: IngestOptions) -> None:
    """Run source ``name`` and stop it (as a kill would) once its first chunk has committed."""
    from simdb import ingest as ingest_module

    synced = ingest_module.sync_all

    def stop(files, position):
        raise KeyboardInterrupt("killed after the first chunk")

    monkeypatch.setattr(ingest_module, "sync_all", stop)
    with pytest.raises(KeyboardInterrupt):
        index.sync_run(name, options)
    monkeypatch.setattr(ingest_module, "sync_all", synced)


@pytest.mark.parametrize("policy", ["keep", "replace"])
def test_a_resumed_run_reads_a_row_its_killed_run_stored_as_a_changed_row(policy, monkeypatch, database_url, schema,
                                                                          table, admin_engine, tmp_path):
    rows = source_rows(13, 14, bad=False)
    create_table(database_url, table, rows)
    first_chunk = in_order(rows)[:7]
    changed, touched, new_text = first_chunk[2][0], first_chunk[4][0], CORPUS[120]["text"]
    with Index.create(database_url, schema=schema) as index:
        method = index.settings.method
        index.sync_add("src", table=table, id_column="id", text_column="body", watermark_column="updated_at",
                       on_change=policy)
        _killed_after_first_chunk(monkeypatch, index, "src", run_options(tmp_path))
        with psycopg.connect(database_url, autocommit=True) as connection:
            connection.execute(f"UPDATE {table} SET body = %s, updated_at = %s WHERE id = %s",
                               (new_text, START + timedelta(days=1), changed))
            connection.execute(f"UPDATE {table} SET updated_at = %s WHERE id = %s", (START + timedelta(days=1), touched))
        on_error = "skip" if policy == "keep" else "stop"  # keep rejects the changed row
        resumed = index.sync_run("src", run_options(tmp_path, on_error=on_error))
        verdicts = {v.id: v for v in index.verdicts(resumed.name)}
    with admin_engine.connect() as connection:
        digest = connection.execute(sa.text(f"SELECT content_hash FROM {schema}.documents WHERE external_id = :id"),
                                    {"id": str(changed)}).scalar_one()
    assert verdicts[str(touched)].status == "already_stored"
    if policy == "keep":
        assert verdicts[str(changed)].status == "rejected" and "different text" in verdicts[str(changed)].reason
        assert digest == content_hash(dict((row[0], row[1]) for row in rows)[changed]) and resumed.rejected == 1
    else:
        survivors = [(str(row[0]), method.sketch(row[1]), content_hash(row[1])) for row in in_order(rows)
                     if row[0] != changed]
        want = oracle(method, survivors, [Document(str(changed), new_text)])[0]
        got = verdicts[str(changed)]
        assert (got.id, got.status, got.duplicate_of, got.distance) == want
        assert digest == content_hash(new_text) and resumed.rejected == 0
    assert_maintained(admin_engine, schema)
    assert len(assert_consistent(admin_engine, schema)) == 14


def test_a_row_read_twice_by_one_resumed_run_is_still_a_reject(monkeypatch, database_url, schema, table, tmp_path):
    rows = source_rows(14, 14, bad=False)
    create_table(database_url, table, rows)
    with Index.create(database_url, schema=schema) as index:
        index.sync_add("src", table=table, id_column="id", text_column="body", watermark_column="updated_at")
        _killed_after_first_chunk(monkeypatch, index, "src", run_options(tmp_path))
        later = in_order(rows)[9]  # read by the resumed run, then again in the same snapshot
        insert(database_url, table, [(later[0], later[1], "again", START + timedelta(days=2))])
        resumed = index.sync_run("src", run_options(tmp_path))
        verdicts = list(index.verdicts(resumed.name))
    again = [v for v in verdicts if v.id == str(later[0]) and v.status == "rejected"]
    assert len(again) == 1 and "appears twice" in again[0].reason and resumed.rejected == 1


def test_a_query_ending_in_a_comment_is_read(database_url, schema, table, tmp_path):
    rows = source_rows(15, 10, bad=False)
    create_table(database_url, table, rows)
    with Index.create(database_url, schema=schema) as index:
        index.sync_add("q", query=f"SELECT id, body FROM {table} -- every row", id_column="id", text_column="body")
        assert index.sync_run("q", run_options(tmp_path)).documents == 10


def test_checking_a_source_runs_its_query_read_only(database_url, schema, table):
    """``sync add`` proves the query runs, and nothing it calls may write: a function the planner folds (declared
    immutable) runs at planning time even under LIMIT 0."""
    create_table(database_url, table, source_rows(16, 3, bad=False))
    sequence, function = f"{table}_seq", f"{table}_bump"
    with psycopg.connect(database_url, autocommit=True) as connection:
        connection.execute(f"CREATE SEQUENCE {sequence}")
        connection.execute(f"CREATE FUNCTION {function}() RETURNS bigint IMMUTABLE LANGUAGE sql "
                           f"AS $$ SELECT nextval('{sequence}') $$")
    with Index.create(database_url, schema=schema) as index:
        with pytest.raises(SimdbError, match="read-only transaction"):
            index.sync_add("w", query=f"SELECT id, body FROM {table} WHERE {function}() > 0", id_column="id",
                           text_column="body")
    with psycopg.connect(database_url, autocommit=True) as connection:
        assert connection.execute(f"SELECT last_value, is_called FROM {sequence}").fetchone() == (1, False)


def test_metadata_keeps_its_json_types_and_a_number_json_cannot_hold_rejects_only_its_row(database_url, schema,
                                                                                           table, tmp_path):
    """The metadata columns are the JSON of their jsonb values (numbers, ISO timestamps, nested objects, nulls); a
    number no double holds (a numeric of 400 digits and a fraction) or of more than 4,300 digits (which Python's
    JSON parser refuses) rejects its row, naming it, and the run goes on."""
    texts = [CORPUS[i]["text"] for i in range(4)]
    with psycopg.connect(database_url, autocommit=True) as connection:
        connection.execute(f"CREATE TABLE {table} (id int, body text, n numeric, at timestamptz, extra jsonb)")
        connection.execute(
            f"INSERT INTO {table} VALUES (1, %s, 2.5, '2026-01-01 12:00+00', '{{\"k\": [1, \"x\"]}}'), "
            f"(2, %s, repeat('9', 5000)::numeric, NULL, NULL), (3, %s, 10::numeric ^ 400 + 0.5, NULL, NULL), "
            f"(4, %s, 7, NULL, 'null')", texts)
    with Index.create(database_url, schema=schema) as index:
        index.sync_add("typed", table=table, id_column="id", text_column="body", metadata_columns=["n", "at", "extra"])
        summary = index.sync_run("typed", run_options(tmp_path))
        rejected = {v.id: v.reason for v in index.verdicts(summary.name) if v.status == "rejected"}
        assert index.document("1").metadata == {"n": 2.5, "at": "2026-01-01T12:00:00+00:00", "extra": {"k": [1, "x"]}}
        assert index.document("4").metadata == {"n": 7, "at": None, "extra": None}
    assert summary.documents == 2 and summary.rejected == 2 and sorted(rejected) == ["2", "3"], rejected
    assert all("unreadable number in a metadata column" in reason for reason in rejected.values()), rejected


def test_without_a_watermark_column_the_reader_keeps_no_memory_per_row(database_url, table):
    """Rows come in id order without a watermark column, so a repeated id comes right after its first row: the
    reader keeps only the last id, and what it holds does not grow with the rows read (a dict of every id read
    grew by about 4 MB over these 28,000 rows), while the repeat is still a reject naming the first row."""
    import tracemalloc

    from simdb.sync import source_documents

    with psycopg.connect(database_url, autocommit=True) as connection:
        connection.execute(f"CREATE TABLE {table} (id int, body text)")
        connection.execute(f"INSERT INTO {table} SELECT i, 'text ' || i FROM generate_series(1, 30000) i")
        connection.execute(f"INSERT INTO {table} VALUES (7, 'again')")
    errors, held = [], {}
    tracemalloc.start()
    try:
        for read, item in enumerate(source_documents(database_url, pg_sync.Source("flat", table, None, "id", "body"),
                                                     itersize=1000), 1):
            if isinstance(item, InputError):
                errors.append(str(item))
            if read in (2_000, 30_001):  # the last: before the reader ends (and lets go of what it holds)
                held[read] = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert held[30_001] - held[2_000] < 1 << 20, held
    assert len(errors) == 1 and "sync source flat, row 8" in errors[0] and "id '7' appears twice" in errors[0] and \
        "first at sync source flat, row 7" in errors[0], errors


def test_ids_the_source_sorts_as_equal_but_that_differ_as_text_still_catch_a_repeat(database_url, table):
    """The reader compares ids as text with the one before; the source sorts by the id column's own type, in which
    different texts can be equal (a float's 0 and -0, citext's 'a' and 'A'): ids of the same text must still come
    next to each other, or a repeat between them is missed and stored twice. Oracle: the rows as inserted."""
    from simdb.sync import source_documents

    with psycopg.connect(database_url, autocommit=True) as connection:
        connection.execute(f"CREATE TABLE {table} (id float8, body text)")
        connection.execute(f"INSERT INTO {table} VALUES ('0', 'first'), ('-0', 'between'), ('0', 'again')")
    items = list(source_documents(database_url, pg_sync.Source("ties", table, None, "id", "body")))
    errors = [str(item) for item in items if isinstance(item, InputError)]
    assert sorted(item.external_id for item in items if not isinstance(item, InputError)) == ["-0", "0"], items
    assert len(errors) == 1 and "id '0' appears twice" in errors[0], errors
