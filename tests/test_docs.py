"""The README cannot drift: its commands exist, its Python runs, its SQL runs."""

import re
from pathlib import Path

import sqlalchemy as sa

from simdb.cli import cli

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


def test_the_sql_examples_run(index, admin_engine):
    index.add_many([{"id": "old", "text": "The archive keeps every article it has ever received."}], batch="archive")
    index.add_many([{"id": "new", "text": "The archive keeps every article it has ever received!"}], batch="new")
    for sql in blocks("sql"):
        sql = sql.replace("simdb.", f"{index.database.schema}.")
        with admin_engine.connect() as connection:
            rows = connection.execute(sa.text(sql)).all()
        assert [tuple(r) for r in rows] == [("new", "old", 0)]
