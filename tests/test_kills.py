"""A SIGKILL at every moment between a batch's last commit and its files, and in the middle of an export:
what the docs say to do next (the same command with ``--resume``; the export again) gives the files a
run without a kill gives, held to a brute-force oracle of the input, record by record."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from simdb import Index, InputError
from simdb.inputs import Document
from simdb.samples import corpus
from tests.killpoint import MOMENTS
from tests.test_verdicts import oracle

ROOT = Path(__file__).resolve().parent.parent
CORPUS = list(corpus())


def killed_at(moment: str, *arguments: str) -> subprocess.CompletedProcess:
    """``simdb ARGUMENTS`` killed by SIGKILL at ``moment`` (see tests/killpoint.py)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "tests.killpoint", moment, *arguments], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def simdb(*arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "simdb", *arguments], capture_output=True, text=True, timeout=300)


def batch_input(tmp_path: Path) -> tuple[str, list]:
    """70 records (near and exact copies among them), three of them broken, as a file and as the oracle's items."""
    lines, items = [], []
    for i, record in enumerate(CORPUS[:70]):
        if i % 23 == 5:
            lines.append('{"id": "broken-%d", "text": ' % i)
            items.append(InputError("broken"))
        else:
            lines.append(json.dumps({"id": record["id"], "text": record["text"]}))
            items.append(Document(record["id"], record["text"]))
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return str(path), items


def expected_files(method, items) -> tuple[list, list]:
    """(id, status, duplicate_of, distance) per record, and the lines of the rejects, by brute force."""
    verdicts = oracle(method, [], items)
    return verdicts, [i + 1 for i, item in enumerate(items) if isinstance(item, InputError)]


def read_files(verdicts: Path, rejects: Path) -> tuple[list, list]:
    lines = [json.loads(line) for line in verdicts.read_text().splitlines()]
    return ([(v["id"], v["status"], v["duplicate_of"], v["distance"]) for v in lines],
            [json.loads(line)["line"] for line in rejects.read_text().splitlines()])


@pytest.mark.slow
@pytest.mark.parametrize("moment", [m for m in MOMENTS if m != "mid-export"])
def test_a_kill_after_the_last_commit_loses_no_file_once_resumed(moment, database_url, schema, tmp_path):
    with Index.create(database_url, schema=schema) as index:
        method = index.settings.method
    path, items = batch_input(tmp_path)
    verdicts, rejects = tmp_path / "verdicts.jsonl", tmp_path / "rejects.jsonl"
    command = ["ingest", path, "--batch", "b", "--chunk-size", "25", "--workers", "1", "--on-error", "skip",
               "--rejects", str(rejects), "--verdicts", str(verdicts), "--database-url", database_url,
               "--schema", schema]
    killed = killed_at(moment, *command)
    assert killed.returncode == -signal.SIGKILL, killed.stderr  # it met its moment
    resumed = simdb(*command, "--resume")
    assert resumed.returncode == 3, resumed.stderr  # done, some records rejected
    complete = moment != "before-last-commit"
    assert ("the batch was complete already" in resumed.stdout) == complete, resumed.stdout
    expected = expected_files(method, items)
    assert read_files(verdicts, rejects) == expected
    printed = simdb("verdicts", "--batch", "b", "--database-url", database_url, "--schema", schema)
    assert printed.stdout == verdicts.read_text()
    unique = simdb("export", "--batch", "b", "--unique", "--database-url", database_url, "--schema", schema)
    assert [json.loads(line)["id"] for line in unique.stdout.splitlines()] == \
        [name for name, status, _, _ in expected[0] if status == "new"]


@pytest.mark.slow
def test_an_export_killed_midway_leaves_no_file_and_the_next_export_writes_it_whole(database_url, schema,
                                                                                      tmp_path):
    path, items = batch_input(tmp_path)
    Index.create(database_url, schema=schema).close()
    where = ["--database-url", database_url, "--schema", schema]
    assert simdb("ingest", path, "--batch", "b", "--on-error", "skip", "--rejects", str(tmp_path / "r.jsonl"),
                 *where).returncode == 3
    output = tmp_path / "unique.jsonl"
    killed = killed_at("mid-export", "export", "--batch", "b", "--unique", "--output", str(output), *where)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert not output.exists()
    again = simdb("export", "--batch", "b", "--unique", "--output", str(output), *where)
    assert again.returncode == 0, again.stderr
    with Index.open(database_url, schema=schema) as index:
        expected = [name for name, status, _, _ in oracle(index.settings.method, [], items) if status == "new"]
    assert [json.loads(line)["id"] for line in output.read_text().splitlines()] == expected


def test_resuming_a_complete_batch_writes_its_files_again_and_reads_no_input(index, tmp_path):
    documents = [Document(r["id"], r["text"]) for r in CORPUS[:30]]
    files = {"verdicts": str(tmp_path / "v.jsonl"), "rejects": str(tmp_path / "r.jsonl")}
    first = index.add_many(documents, batch="b", on_error="skip", **files)
    written = {name: Path(path).read_text() for name, path in files.items()}
    for path in files.values():
        Path(path).write_text("cut short\n")

    def unread():
        raise AssertionError("a complete batch's input is read")
        yield

    again = index.add_many(unread(), batch="b", on_error="skip", resume=True, **files)
    assert {name: Path(path).read_text() for name, path in files.items()} == written
    assert again.already_complete and not first.already_complete and again.documents == first.documents == 30
    assert index.stats()["documents"] == 30
