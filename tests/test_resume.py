"""Resuming a batch: after a SIGKILL at every moment between its last commit and its files, and in the middle
of an export, what the docs say to do next (the same command with ``--resume``; the export again) gives
the files a run without a kill gives, held to a brute-force oracle of the input, record by record; a
complete batch resumed; two resumes of one batch at once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from simdb import BatchError, Index, InputError
from simdb import ingest as ingest_module
from simdb.ingest import IngestOptions
from simdb.inputs import Document
from simdb.samples import corpus
from simdb.verdicts import OutcomeFile
from tests.conftest import Concurrently, assert_consistent
from tests.maintained import assert_maintained
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


@pytest.mark.citus
def test_two_resumes_of_one_batch_at_once_one_finishes_and_the_other_says_why_it_stopped(
        database_url, schema, admin_engine, tmp_path, monkeypatch):
    """Issue 34: the second failed with a raw `duplicate key value violates unique constraint "pk_records"`."""
    items = [InputError(f"bad record {i}", path="in", line=i) if i % 10 == 5 else Document(r["id"], r["text"])
             for i, r in enumerate(CORPUS[:40])]
    options = dict(batch="b", chunk_size=10, on_error="skip", workers=1)
    real_sync = OutcomeFile.sync

    def dies_after_its_first_commit(self, position):
        if position:
            raise KeyboardInterrupt  # as a kill would: the batch stays running after its first chunk
        real_sync(self, position)

    with Index.create(database_url, schema=schema) as index:
        monkeypatch.setattr(OutcomeFile, "sync", dies_after_its_first_commit)
        with pytest.raises(KeyboardInterrupt):
            index.ingest(items, IngestOptions(**options, rejects=str(tmp_path / "r.jsonl")))
        monkeypatch.setattr(OutcomeFile, "sync", real_sync)
        both_read, real_position = threading.Barrier(2), ingest_module.resume_position

        def together(*args):  # both have read where the batch stands before either stores a chunk
            found = real_position(*args)
            both_read.wait(60)
            return found

        monkeypatch.setattr(ingest_module, "resume_position", together)
        with Concurrently() as threads:
            for number in range(2):
                threads.start(index.ingest, items, IngestOptions(**options, resume=True,
                                                                 rejects=str(tmp_path / f"r{number}.jsonl")))
            outcomes = threads.outcomes()
        (error,) = [o for o in outcomes if isinstance(o, BaseException)]
        (summary,) = [o for o in outcomes if not isinstance(o, BaseException)]
        assert isinstance(error, BatchError), repr(error)
        assert "another ingest or resume of batch 'b'" in str(error) and "simdb remove" not in str(error), str(error)
        assert summary.documents == 36 and summary.rejected == 4
    assert_maintained(admin_engine, schema)
    assert len(assert_consistent(admin_engine, schema)) == 36
