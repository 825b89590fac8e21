"""The README and docs/ cannot drift: their commands and options exist, their Python runs, their SQL runs."""

import json
import re
import shlex
from pathlib import Path

import pytest
import sqlalchemy as sa

from simdb.cli import cli
from simdb.samples import corpus
from tests.maintained import assert_maintained

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
DOCS = {path.name: path.read_text(encoding="utf-8") for path in sorted((ROOT / "docs").glob("*.md"))}
EVERYTHING = {"README.md": README, **DOCS}


def blocks(language, text=None):
    texts = [text] if text is not None else [README, DOCS["sql.md"]]
    return [block for t in texts for block in re.findall(rf"```{language}\n(.*?)```", t, flags=re.S)]


def test_every_command_is_documented():
    for command in cli.commands:
        assert f"simdb {command}" in DOCS["cli.md"], f"`simdb {command}` is not in docs/cli.md"
        assert f"simdb {command}" in README, f"`simdb {command}` is not named in the README"
        for sub in getattr(cli.commands[command], "commands", {}):  # a group's commands (simdb sync run)
            assert f"simdb {command} {sub}" in DOCS["cli.md"], f"`simdb {command} {sub}` is not in docs/cli.md"


def test_every_link_between_the_documents_resolves():
    for name, text in EVERYTHING.items():
        base = ROOT if name == "README.md" else ROOT / "docs"
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text):
            assert (base / target).exists(), f"{name} links to {target}, which does not exist"


def documented_invocations():
    """Every ``simdb ...`` command line shown in a console or bash block, with the document it is in."""
    for name, text in EVERYTHING.items():
        for block in re.findall(r"```(?:console|bash)\n(.*?)```", text, flags=re.S):
            for line in re.sub(r"\\\n\s*", " ", block).splitlines():  # continuation lines joined
                line = re.split(r" (?:#|\||>|2>|&&|\|\|) ", line.removeprefix("$ ") + " ")[0].strip()
                if line.startswith("simdb "):
                    yield name, shlex.split(line)[1:]


def test_every_documented_command_line_uses_options_that_exist():
    seen = 0
    for name, arguments in documented_invocations():
        command = cli.commands.get(arguments[0])
        assert command is not None, f"{name}: `simdb {arguments[0]}` is not a command"
        if hasattr(command, "commands"):  # a group: simdb sync run ...
            command, arguments = command.commands.get(arguments[1]), arguments[1:]
            assert command is not None, f"{name}: `simdb ... {arguments[0]}` is not a command"
        options = {option for parameter in command.params for option in getattr(parameter, "opts", [])
                   + getattr(parameter, "secondary_opts", [])} | {"--help"}
        for argument in arguments[1:]:
            if argument.startswith("--"):
                assert argument.split("=")[0] in options, f"{name}: `simdb {arguments[0]}` has no {argument}"
        seen += 1
    assert seen >= 20


def test_the_python_example_runs(database_url, schema, monkeypatch, capsys):
    monkeypatch.setenv("SIMDB_DATABASE_URL", database_url)
    monkeypatch.setenv("SIMDB_SCHEMA", schema)
    (example,) = blocks("python")
    exec(compile(example, "README.md", "exec"), {})
    lines = capsys.readouterr().out.splitlines()
    expected = [re.search(r"# (.*)$", line).group(1) for line in example.splitlines() if "print(" in line]
    assert lines[0] == expected[0]
    assert lines[1:3] == ["a 0", "b 0"]
    assert lines[3] == expected[2]


def test_every_sql_recipe_runs_and_answers(corpus_archive, admin_engine):
    archive = corpus_archive
    recipes = blocks("sql")
    assert len(recipes) >= 10
    for recipe in recipes:
        with admin_engine.connect() as connection:
            rows = connection.execute(sa.text(recipe.replace("simdb.", f"{archive}."))).all()
        assert rows, f"this README recipe returns nothing:\n{recipe}"


def test_the_minhash_recipes_run_and_answer(run, tmp_path, schema, admin_engine):
    records = list(corpus())
    assert run("init", "--method", "minhash", "--verify", "exact").exit_code == 0
    for name, part in (("archive", records[:250]), ("new", records[250:])):
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in part))
        assert run("ingest", str(path), "--batch", name).exit_code == 0
    recipes = blocks("sql minhash")
    assert len(recipes) >= 4
    for recipe in recipes:
        with admin_engine.connect() as connection:
            rows = connection.execute(sa.text(recipe.replace("simdb.", f"{schema}."))).all()
        assert rows, f"this MinHash recipe returns nothing:\n{recipe}"
    with admin_engine.connect() as connection:
        similar, near, closest, both_ways = (connection.execute(sa.text(r.replace("simdb.", f"{schema}."))).all()
                                             for r in recipes)
    assert [r.external_id for r in similar] == ["ref-0012-drop_sentence"] == [r.external_id for r in near]
    assert all(0.8 <= r.similarity < 1 and r.a_start and r.b_start for r in closest)
    assert {(r.external_id, r.neighbour_is_earlier) for r in both_ways} == \
        {("ref-0012", False), ("ref-0012-drop_sentence", True)}
    # the recipes that read no SimHash column answer on MinHash too, by its own pairs
    (earlier,) = [r for r in blocks("sql") if r.startswith("SELECT r.external_id, r.duplicate_of_external_id")]
    with admin_engine.connect() as connection:
        rows = connection.execute(sa.text(earlier.replace("simdb.", f"{schema}."))).all()
    archived = {r["id"] for r in records[:250]}
    assert rows and all(row.first_seen_in == "archive" and row.duplicate_of in archived for row in rows)


def test_the_docs_quote_what_simdb_sketch_says_until_it_is_enabled():
    from simdb.pg.plpython import NOT_ENABLED

    assert f"ERROR:  {NOT_ENABLED}\n" in blocks("text", DOCS["sql.md"])


@pytest.mark.parametrize("options", [[], ["--method", "minhash", "--verify", "exact"]], ids=["simhash", "minhash"])
def test_the_typed_in_text_recipes_run_and_answer(options, run, tmp_path, schema, admin_engine, plpython):
    """docs/sql.md's lookups of a typed-in text, on both methods, after `simdb sql-functions`."""
    records = list(corpus())
    assert run("init", *options).exit_code == 0
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert run("ingest", str(path), "--batch", "archive").exit_code == 0
    assert run("sql-functions").exit_code == 0
    recipes = blocks("sql plpython")
    assert len(recipes) == 2
    with admin_engine.connect() as connection:
        similar, same = (connection.execute(sa.text(r.replace("simdb.", f"{schema}."))).all() for r in recipes)
    assert [r.external_id for r in similar] == ["ref-0254", "ref-0254-typo"]
    assert 0.9 < similar[0].similarity < 1
    assert [r.external_id for r in same] == ["ref-0255"]


def test_the_recipes_say_what_they_claim(corpus_archive, admin_engine, run):
    archive = corpus_archive
    def answer(start):
        (recipe,) = [r for r in blocks("sql") if r.startswith(start)]
        with admin_engine.connect() as connection:
            return connection.execute(sa.text(recipe.replace("simdb.", f"{archive}."))).all()

    from simdb import fingerprint
    pasted = answer("SELECT d.external_id, n.distance\nFROM simdb.simdb_near(simdb.simdb_fingerprint_from_hex")
    assert ("ref-0004", 0) in [tuple(r) for r in pasted] and f"{fingerprint(corpus_text('ref-0004')):016x}" \
        == "2909ca0ac05a11df"
    earlier = answer("SELECT r.external_id, r.duplicate_of_external_id AS duplicate_of")
    assert earlier and all(row.first_seen_in == "archive" for row in earlier)
    (row,) = answer("SELECT simdb.simdb_hamming(a.simhash, b.simhash)")
    assert row.distance <= 4 and not row.identical
    unique = {row.name: row.unique_documents for row in answer("SELECT name, new AS unique_documents")}
    assert unique == {name: len(run("export", "--batch", name, "--unique").stdout.splitlines())
                      for name in ("archive", "new")} and all(unique.values())


def test_the_counting_recipes_agree_with_brute_force(corpus_archive, admin_engine):
    """The counts the recipes read from maintained tables (`clusters`, `batches`), against the corpus itself: every
    text fingerprinted, clusters as the connected components of the pairs within k, the duplicates of each batch
    as the texts within k of an earlier one, the duplicate rate by source from the same pairs."""
    from simdb import fingerprint, hamming

    archive = corpus_archive
    def answer(start):
        (recipe,) = [r for r in blocks("sql") if r.startswith(start)]
        with admin_engine.connect() as connection:
            return connection.execute(sa.text(recipe.replace("simdb.", f"{archive}."))).all()

    with admin_engine.connect() as connection:
        k = int(connection.execute(sa.text(f"SELECT value FROM {archive}.settings WHERE name = 'max_distance'"))
                .scalar_one())
    records = list(corpus())
    fingerprints = [fingerprint(r["text"]) for r in records]
    batch_of = ["archive" if i < 250 else "new" for i in range(len(records))]
    parent = list(range(len(records)))

    def root(i):
        while parent[i] != i:
            i = parent[i]
        return i

    earlier = [False] * len(records)
    first: dict[int, int] = {}  # each document's earliest earlier one within k
    for j in range(len(records)):
        for i in range(j):
            if hamming(fingerprints[i], fingerprints[j]) <= k:
                earlier[j] = True
                first.setdefault(j, i)
                parent[max(root(i), root(j))] = min(root(i), root(j))
    clusters = len({root(i) for i in range(len(records))})
    (row,) = answer("SELECT d.documents, d.documents - coalesce(c.duplicates, 0) AS clusters")
    assert (row.documents, row.clusters) == (len(records), clusters) and clusters < len(records)
    unique = {row.name: row.unique_documents for row in answer("SELECT name, new AS unique_documents")}
    assert unique == {name: sum(1 for i, b in enumerate(batch_of) if b == name and not earlier[i])
                      for name in ("archive", "new")}
    members: dict[int, list[int]] = {}
    for i in range(len(records)):
        members.setdefault(root(i), []).append(i)
    spread = sorted((min(1 - hamming(fingerprints[c], fingerprints[m]) / 64 for m in group), c, len(group))
                    for c, group in members.items() if len(group) > 1)[:10]
    assert [tuple(row) for row in answer("SELECT canonical_id, size, min_similarity AS least_similar_member")] == \
        [(records[c]["id"], size, least) for least, c, size in spread] and spread[0][0] < 1
    assert [tuple(row) for row in answer("SELECT r.external_id, r.duplicate_of_external_id AS duplicate_of")] == \
        [(records[j]["id"], records[i]["id"], hamming(fingerprints[i], fingerprints[j]), batch_of[i])
         for j, i in sorted(first.items()) if batch_of[j] == "new" and batch_of[i] != "new"]
    rates = {row.source: (row.documents, float(row.duplicate_percent))
             for row in answer("SELECT split_part(metadata ->> 'source', ':', 1) AS source")}
    sources = [r["source"].split(":")[0] for r in records]
    assert rates == {s: (sources.count(s), round(100.0 * sum(1 for i, t in enumerate(sources) if t == s and earlier[i])
                                                 / sources.count(s), 1)) for s in set(sources)}
    # the same from the counts the index keeps (field_counts), row for row
    assert [(row.source, int(row.documents), float(row.duplicate_percent))
            for row in answer("SELECT split_part(value, ':', 1) AS source")] == \
        [(row.source, row.documents, float(row.duplicate_percent))
         for row in answer("SELECT split_part(metadata ->> 'source', ':', 1) AS source")]
    (sampled,) = [r for r in blocks("sql") if r.startswith("SELECT split_part(s.metadata ->> 'source'")]
    assert "SYSTEM (5)" in sampled
    with admin_engine.connect() as connection:  # every page sampled: the exact rates
        whole = connection.execute(sa.text(sampled.replace("simdb.", f"{archive}.")
                                           .replace("SYSTEM (5)", "SYSTEM (100)"))).all()
    assert {row.source: (row.sampled, float(row.duplicate_percent)) for row in whole} == rates


def test_unique_per_batch_counts_what_was_new_at_ingest_and_export_what_is_still_stored(corpus_archive,
                                                                                       admin_engine, run):
    """As the recipe's note says: a document removed later still counts in `batches.new`, and no longer in
    `simdb export --unique`."""
    archive = corpus_archive
    (recipe,) = [r for r in blocks("sql") if r.startswith("SELECT name, new AS unique_documents")]

    def unique():
        with admin_engine.connect() as connection:
            return {row.name: row.unique_documents
                    for row in connection.execute(sa.text(recipe.replace("simdb.", f"{archive}.")))}

    def held():
        (recipe,) = [r for r in blocks("sql") if r.startswith("SELECT d.documents, d.documents - coalesce")]
        with admin_engine.connect() as connection:
            return connection.execute(sa.text(recipe.replace("simdb.", f"{archive}."))).one().documents

    before = unique()
    exported = run("export", "--batch", "new", "--unique").stdout.splitlines()
    assert before["new"] == len(exported) and held() == len(list(corpus()))
    assert run("remove", "--id", json.loads(exported[0])["id"]).exit_code == 0
    assert unique() == before and held() == len(list(corpus())) - 1
    assert_maintained(admin_engine, archive)
    assert len(run("export", "--batch", "new", "--unique").stdout.splitlines()) == before["new"] - 1


def test_the_earlier_duplicates_recipe_answers_as_the_verdicts_were_given(corpus_archive, admin_engine, run):
    """As the recipe's note says: a document of batch `new` removed since, and one whose earlier document was
    removed, are still listed, with the name and batch of that earlier document; after a relayout and a compaction
    too."""
    archive = corpus_archive
    (recipe,) = [r for r in blocks("sql") if r.startswith("SELECT r.external_id, r.duplicate_of_external_id")]

    def answer():
        with admin_engine.connect() as connection:
            return [tuple(row) for row in connection.execute(sa.text(recipe.replace("simdb.", f"{archive}.")))]

    before = answer()
    assert len(before) >= 2 and {row[3] for row in before} == {"archive"}
    assert run("remove", "--id", before[0][0], "--id", before[1][1]).exit_code == 0
    assert answer() == before
    assert_maintained(admin_engine, archive, batches={r["id"]: "archive" if i < 250 else "new"
                                                      for i, r in enumerate(corpus())})
    relaid = run("relayout", "--blocks", "7")
    assert relaid.exit_code == 0, relaid.output
    assert run("compact", "--full").exit_code == 0
    assert answer() == before
    assert_maintained(admin_engine, archive)


def corpus_text(external_id):
    return next(r["text"] for r in corpus() if r["id"] == external_id)


@pytest.mark.slow
def test_the_nightly_ingest_script_runs(database_url, schema, tmp_path):
    """docs/scripts.md's script, as cron would run it: a batch, a batch with a bad record, an interrupted batch
    resumed, a batch already done, one killed after its last commit, and a second run while another holds the
    lock."""
    import fcntl
    import json
    import os
    import subprocess
    import sys

    (script_text,) = re.findall(r"```bash\n(#!/usr/bin/env bash\n# nightly-ingest.*?)```", DOCS["scripts.md"],
                                flags=re.S)
    script = tmp_path / "nightly-ingest"
    script.write_text(script_text)
    script.chmod(0o755)
    env = {**os.environ, "SIMDB_DATABASE_URL": database_url, "SIMDB_SCHEMA": schema,
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    out = tmp_path / "out"
    records = list(corpus())

    def write(name, items, extra=""):
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps({"id": r["id"], "text": r["text"]}) + "\n" for r in items) + extra)
        return str(path)

    def nightly(path, batch):
        return subprocess.run([str(script), path, batch, str(out)], env=env, capture_output=True, text=True,
                              timeout=300)

    assert subprocess.run([sys.executable, "-m", "simdb", "init"], env=env, capture_output=True).returncode == 0
    first = nightly(write("first", records[:120]), "first")
    assert first.returncode == 0, first.stderr
    verdicts = [json.loads(line) for line in (out / "first.verdicts.jsonl").read_text().splitlines()]
    unique = [json.loads(line)["id"] for line in (out / "first.unique.jsonl").read_text().splitlines()]
    assert len(verdicts) == 120 and unique == [v["id"] for v in verdicts if v["status"] == "new"]
    assert json.loads((out / "first.summary.json").read_text())["documents"] == 120

    second = nightly(write("second", records[120:160], extra="{broken\n"), "second")
    assert second.returncode == 0 and "some records of second were rejected" in second.stderr
    assert [json.loads(line)["line"] for line in (out / "second.rejects.jsonl").read_text().splitlines()] == [41]

    # a crash: the first chunks of 'third' stored, the batch left running (reading runs a few hundred ahead)
    variants = [{"id": f"third-{i}", "text": f"{records[i % len(records)]['text']} (variant {i})"}
                for i in range(600)]
    bad = write("third-bad", variants, extra="{broken\n")
    crashed = subprocess.run([sys.executable, "-m", "simdb", "ingest", bad, "--batch", "third", "--chunk-size", "100",
                              "--workers", "1"], env=env, capture_output=True, text=True)
    assert crashed.returncode == 1 and "--resume" in crashed.stderr, crashed.stderr
    third = nightly(write("third", variants), "third")
    assert third.returncode == 0, third.stderr
    assert [json.loads(line)["position"] for line in (out / "third.verdicts.jsonl").read_text().splitlines()] \
        == list(range(1, 601))
    again = nightly(write("third", variants), "third")
    assert again.returncode == 0 and "already in the archive" in again.stderr

    # killed after its last chunk committed, before its files were written: the next run writes them
    fifth = write("fifth", records[210:240], extra="{broken\n")
    killed = subprocess.run([sys.executable, "-m", "tests.killpoint", "after-last-commit", "ingest", fifth, "--batch",
                             "fifth", "--on-error", "skip", "--rejects", str(out / "fifth.rejects.jsonl"),
                             "--verdicts", str(out / "fifth.verdicts.jsonl")], env={**env, "PYTHONPATH": str(ROOT)},
                            cwd=ROOT, capture_output=True, text=True)
    assert killed.returncode == -9 and not (out / "fifth.verdicts.jsonl").exists(), killed.stderr
    repaired = nightly(fifth, "fifth")
    assert repaired.returncode == 0 and "already in the archive" in repaired.stderr, repaired.stderr
    verdicts = [json.loads(line) for line in (out / "fifth.verdicts.jsonl").read_text().splitlines()]
    assert [v["position"] for v in verdicts] == list(range(1, 32)) and verdicts[-1]["status"] == "rejected"
    assert [json.loads(line)["line"] for line in (out / "fifth.rejects.jsonl").read_text().splitlines()] == [31]
    assert [json.loads(line)["id"] for line in (out / "fifth.unique.jsonl").read_text().splitlines()] == \
        [v["id"] for v in verdicts if v["status"] == "new"]
    assert json.loads((out / "fifth.summary.json").read_text())["already_complete"] is True

    with open(out / ".nightly-ingest.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        locked = nightly(write("fourth", records[200:210]), "fourth")
    assert locked.returncode == 75 and "another run holds" in locked.stderr


def test_the_documented_key_index_size_counts_every_segment(database_url, schema, admin_engine):
    """The query that docs/cli.md and docs/performance.md give for sizing shared buffers sums the key indexes of
    every segment: a bulk chunk's segment and the active one, whose indexes PostgreSQL named itself."""
    from simdb import Index

    records = list(corpus())
    with Index.create(database_url, schema=schema, segment_size=1000, bulk_chunk=100) as index:
        index.add_many(records[:150], batch="bulk")  # a bulk chunk: a segment of its own
        index.add_many(records[150:160], batch="small")  # the active segment
    # independently: every index on a segment whose first column is a key column (names not read)
    independent = """SELECT sum(pg_relation_size(i.indexrelid)), count(DISTINCT h.inhrelid), count(*)
        FROM pg_inherits h JOIN pg_index i ON i.indrelid = h.inhrelid
        JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
        WHERE h.inhparent = CAST(:documents AS regclass) AND a.attname ~ '^key_[0-9]+$'"""
    with admin_engine.connect() as connection:
        expected, segments, indexes = connection.execute(sa.text(independent),
                                                         {"documents": f"{schema}.documents"}).one()
        keys = connection.execute(sa.text("SELECT count(*) FROM information_schema.columns WHERE table_schema = "
                                          ":schema AND table_name = 'documents' AND column_name ~ '^key_[0-9]+$'"),
                                  {"schema": schema}).scalar_one()
        assert segments == 2 and indexes == 2 * keys and keys >= 10 and expected > 0
        for name in ("cli.md", "performance.md"):
            (query,) = [b for b in blocks("sql", DOCS[name]) if "pg_relation_size" in b]
            pretty = connection.execute(sa.text(query.replace("'simdb'", f"'{schema}'"))).scalar_one()
            exact = connection.execute(sa.text(query.replace("pg_size_pretty(", "(").replace("'simdb'", f"'{schema}'"))
                                       ).scalar_one()
            assert exact == expected and pretty is not None, f"docs/{name}: {exact} bytes, not {expected}"
