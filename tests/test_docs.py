"""The README cannot drift: its commands exist, its Python runs, its SQL runs."""

import re
from pathlib import Path

import sqlalchemy as sa

from simdb.cli import cli
from simdb.samples import corpus

README = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")


def blocks(language):
    return re.findall(rf"```{language}\n(.*?)```", README, flags=re.S)


def test_every_command_is_documented():
    for command in cli.commands:
        assert f"simdb {command}" in README, f"`simdb {command}` is not in the README"


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


def test_the_recipes_say_what_they_claim(corpus_archive, admin_engine):
    archive = corpus_archive
    def answer(start):
        (recipe,) = [r for r in blocks("sql") if r.startswith(start)]
        with admin_engine.connect() as connection:
            return connection.execute(sa.text(recipe.replace("simdb.", f"{archive}."))).all()

    from simdb import fingerprint
    pasted = answer("SELECT d.external_id, n.distance\nFROM simdb.simdb_near(simdb.simdb_fingerprint_from_hex")
    assert ("ref-0004", 0) in [tuple(r) for r in pasted] and f"{fingerprint(corpus_text('ref-0004')):016x}" \
        == "288dee8bc4fa50d7"
    earlier = answer("SELECT d.external_id, o.external_id AS duplicate_of")
    assert all(row.first_seen_in == "archive" for row in earlier)
    (row,) = answer("SELECT simdb.simdb_hamming(a.simhash, b.simhash)")
    assert row.distance <= 3 and not row.identical


def corpus_text(external_id):
    return next(r["text"] for r in corpus() if r["id"] == external_id)
