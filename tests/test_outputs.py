"""Every file a command writes follows one set of rules (simdb/outputs.py, docs/cli.md "Output files").

A regular file (or a new one) appears whole or not at all, through a temporary file of simdb's own
beside it, and keeps its permissions; a symlink is followed and stays a symlink; a device or a FIFO
is written into, never replaced; no other file is touched (no ``PATH.partial``); an output that is
an input is refused before anything is written or stored; and an error while writing is one line
saying what was kept. The devices are made in the test's folder (``mknod``, as root), so that no
test can harm the machine's own ``/dev/null`` or ``/dev/full``.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import stat
import subprocess
import sys
import threading

import pytest
import sqlalchemy as sa

from simdb import OutputError, outputs

RECORDS = [{"id": f"d{i}", "text": f"document number {i} about topic {i % 4}, with a few more words in it"}
           for i in range(40)]


def write_jsonl(path, records) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return str(path)


@pytest.fixture
def archive(run, tmp_path):
    """An index with one batch ("one"), and what `simdb export` prints for it."""
    assert run("init").exit_code == 0
    assert run("ingest", write_jsonl(tmp_path / "in.jsonl", RECORDS), "--batch", "one").exit_code == 0
    return run("export").stdout


def device(path, kind: str):
    """A character device like /dev/null or /dev/full at ``path``, or skip (only root may make one)."""
    major_minor = {"null": (1, 3), "full": (1, 7)}[kind]
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(*major_minor))
    except PermissionError:
        pytest.skip("making a device node needs root")
    return path


def read_fifo(path) -> concurrent.futures.Future:
    """Make a FIFO and read it in a thread: the future's result is what was written to it, as text, or the
    thread's error. A daemon thread, so that a FIFO nobody opens (the bug this looks for) cannot hang the run."""
    os.mkfifo(path)
    future = concurrent.futures.Future()

    def read():
        try:
            with open(path, encoding="utf-8") as fifo:
                future.set_result(fifo.read())
        except BaseException as error:  # handed to whoever waits for the result
            future.set_exception(error)

    threading.Thread(target=read, daemon=True).start()
    return future


def folder_listing(folder) -> list[tuple[str, str]]:
    """Every entry of a folder with its kind: what a command may have created, replaced or left behind."""
    kinds = {stat.S_IFREG: "file", stat.S_IFLNK: "link", stat.S_IFCHR: "device", stat.S_IFIFO: "fifo",
             stat.S_IFDIR: "folder"}
    return sorted((name, kinds[stat.S_IFMT(os.lstat(folder / name).st_mode)]) for name in os.listdir(folder))


@pytest.mark.parametrize("command", [["export"], ["export", "--format", "csv"], ["report"]])
def test_an_output_through_a_symlink_replaces_the_target_and_keeps_the_link(archive, run, tmp_path, command):
    target, link = tmp_path / "real" / "out.txt", tmp_path / "link.txt"
    target.parent.mkdir()
    target.write_text("old")
    os.chmod(target, 0o640)
    link.symlink_to(target)
    (tmp_path / "link.txt.partial").write_text("someone else's file")
    result = run(*command, "--output", str(link))
    assert result.exit_code == 0, result.output
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text() != "old" and stat.S_IMODE(target.stat().st_mode) == 0o640
    assert (tmp_path / "link.txt.partial").read_text() == "someone else's file"
    if command == ["export"]:
        assert target.read_text() == archive
    assert folder_listing(target.parent) == [("out.txt", "file")]  # no temporary file left behind


def test_a_new_output_gets_the_usual_permissions(archive, run, tmp_path):
    mask = os.umask(0o027)
    try:
        assert run("export", "--output", str(tmp_path / "new.jsonl")).exit_code == 0
    finally:
        os.umask(mask)
    assert stat.S_IMODE((tmp_path / "new.jsonl").stat().st_mode) == 0o640
    assert (tmp_path / "new.jsonl").read_text() == archive


@pytest.mark.parametrize("command", [["export"], ["report"]])
def test_an_output_into_a_fifo_or_a_device_is_streamed_into_it(archive, run, tmp_path, command):
    fifo = tmp_path / "fifo"
    received = read_fifo(fifo)
    result = run(*command, "--output", str(fifo))
    assert result.exit_code == 0, result.output
    written = received.result(timeout=30)
    assert written == archive if command == ["export"] else written.startswith("<!DOCTYPE html>")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    null = device(tmp_path / "null", "null")
    assert run(*command, "--output", str(null)).exit_code == 0
    assert stat.S_ISCHR(os.lstat(null).st_mode)  # still the device, not a regular file
    assert folder_listing(tmp_path) == sorted([("fifo", "fifo"), ("in.jsonl", "file"), ("null", "device")])


def test_a_failed_export_leaves_the_file_there_as_it_was_and_nothing_else(archive, run, tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_text("the previous export\n")
    before = folder_listing(tmp_path)
    result = run("export", "--batch", "nope", "--output", str(out))
    assert result.exit_code == 1 and "no batch named 'nope'" in result.output
    assert out.read_text() == "the previous export\n" and folder_listing(tmp_path) == before


def test_a_full_device_is_one_line_and_stays_a_device(archive, run, tmp_path):
    full = device(tmp_path / "full", "full")
    for command, what in ((["export"], "export"), (["export", "--format", "csv"], "export"), (["report"], "report")):
        result = run(*command, "--output", str(full))
        assert result.exit_code == 1
        assert result.stderr == f"Error: {full}: cannot write the {what}: No space left on device\n"
        assert stat.S_ISCHR(os.lstat(full).st_mode)


def test_verdicts_and_rejects_follow_symlinks_and_stream_into_fifos(run, tmp_path):
    assert run("init").exit_code == 0
    records = write_jsonl(tmp_path / "in.jsonl", RECORDS[:5])
    with open(records, "a") as file:
        file.write('{"id": "bad", "text": \n')
    target = tmp_path / "kept" / "verdicts.jsonl"
    target.parent.mkdir()
    (tmp_path / "v.jsonl").symlink_to(target)
    received = read_fifo(tmp_path / "rejects.fifo")
    result = run("ingest", records, "--batch", "b", "--chunk-size", "2", "--on-error", "skip", "--verdicts",
                 str(tmp_path / "v.jsonl"), "--rejects", str(tmp_path / "rejects.fifo"))
    assert result.exit_code == 3, result.output
    assert (tmp_path / "v.jsonl").is_symlink()
    assert [json.loads(line)["status"] for line in target.read_text().splitlines()] == ["new"] * 5 + ["rejected"]
    assert [json.loads(line)["line"] for line in received.result(timeout=30).splitlines()] == [6]
    assert stat.S_ISFIFO(os.lstat(tmp_path / "rejects.fifo").st_mode)


def test_a_full_verdicts_file_says_the_batch_is_stored_and_how_to_get_the_file(run, tmp_path, admin_engine, schema):
    """Issue 34: ENOSPC on the verdicts file (`--verdicts /dev/full`) was a traceback after the batch committed."""
    assert run("init").exit_code == 0
    records = write_jsonl(tmp_path / "in.jsonl", RECORDS)
    try:
        full = str(device(tmp_path / "full", "full"))
    except pytest.skip.Exception:
        full = "/dev/full"  # written into, never replaced, by this code and by the code before it
    result = run("ingest", records, "--batch", "b", "--verdicts", full)
    assert result.exit_code == 1
    assert result.stderr == (f"Error: {full}: cannot write the verdicts file: No space left on device; batch 'b' is "
                             f"stored whole (40 documents from the first 40 input records): `simdb verdicts --batch "
                             f"b > {full}` writes the verdicts file again\n")
    with admin_engine.connect() as connection:
        assert connection.execute(sa.text(f"SELECT status, documents FROM {schema}.batches")).one() == ("complete", 40)
    # in the middle of a batch: what its committed chunks keep, and the resume that writes the files whole
    others = [{"id": f"c{i}", "text": f"another document, number {i}, on subject {i % 7}"} for i in range(30)]
    records = write_jsonl(tmp_path / "c.jsonl", others[:3])
    with open(records, "a") as file:
        file.write('{"id": "bad", "text": \n' + "".join(json.dumps(record) + "\n" for record in others[3:]))
    result = run("ingest", records, "--batch", "c", "--chunk-size", "10", "--on-error", "skip", "--rejects", full,
                 "--verdicts", str(tmp_path / "v.jsonl"))
    assert result.exit_code == 1
    assert result.stderr.startswith(f"Error: {full}: cannot write the rejects file: No space left on device; batch "
                                    "'c' keeps what its committed chunks stored (10 documents from the first 11 input "
                                    "records)")
    assert "--batch c --resume` resumes it" in result.stderr
    assert len((tmp_path / "v.jsonl").read_text().splitlines()) == 11  # every file is written as far as it can be
    resumed = run("ingest", records, "--batch", "c", "--chunk-size", "10", "--on-error", "skip", "--rejects",
                  str(tmp_path / "r.jsonl"), "--verdicts", str(tmp_path / "v.jsonl"), "--resume")
    assert resumed.exit_code == 3, resumed.output
    assert [json.loads(line)["id"] for line in (tmp_path / "v.jsonl").read_text().splitlines()] == \
        [record["id"] for record in others[:3]] + [None] + [record["id"] for record in others[3:]]
    assert [json.loads(line)["line"] for line in (tmp_path / "r.jsonl").read_text().splitlines()] == [4]


# -- outputs that are inputs -----------------------------------------------------------------------

def aliases(tmp_path, name: str) -> dict[str, str]:
    """Paths that are the file ``name`` in ``tmp_path``: itself, another spelling, a symlink, a hard link."""
    original = tmp_path / name
    (tmp_path / "sub").mkdir(exist_ok=True)
    (tmp_path / f"symlink-{name}").symlink_to(original)
    os.link(original, tmp_path / f"hardlink-{name}")
    return {"same path": str(original), "another spelling": str(tmp_path / "sub" / ".." / name),
            "symlink": str(tmp_path / f"symlink-{name}"), "hard link": str(tmp_path / f"hardlink-{name}")}


@pytest.mark.parametrize("option", ["--verdicts", "--rejects"])
def test_an_output_that_is_an_input_is_refused_before_anything_is_written(run, tmp_path, admin_engine, schema,
                                                                          option):
    """Issue 34: `simdb ingest in.jsonl --verdicts in.jsonl` truncated the input after its first chunk."""
    assert run("init").exit_code == 0
    data = "".join(json.dumps(r) + "\n" for r in RECORDS)
    (tmp_path / "in.jsonl").write_text(data)
    for kind, alias in aliases(tmp_path, "in.jsonl").items():
        before = folder_listing(tmp_path)
        result = run("ingest", str(tmp_path / "in.jsonl"), "--chunk-size", "5", "--on-error", "skip", option, alias)
        assert result.exit_code == 1, (kind, result.output)
        assert result.stderr == (f"Error: {option} {alias} is the input file {tmp_path / 'in.jsonl'} (the same file"
                                 f"{'' if kind in ('same path', 'another spelling') else ', through a ' + kind}): "
                                 f"writing it would destroy the input (choose another {option} file)\n"), kind
        assert (tmp_path / "in.jsonl").read_text() == data and folder_listing(tmp_path) == before
    with admin_engine.connect() as connection:
        assert connection.execute(sa.text(f"SELECT count(*) FROM {schema}.batches")).scalar_one() == 0


def test_two_outputs_that_are_one_file_are_refused(run, tmp_path):
    assert run("init").exit_code == 0
    records = write_jsonl(tmp_path / "in.jsonl", RECORDS)
    (tmp_path / "out.jsonl").symlink_to(tmp_path / "other.jsonl")  # a new file, by two names
    result = run("ingest", records, "--on-error", "skip", "--verdicts", str(tmp_path / "other.jsonl"),
                 "--rejects", str(tmp_path / "out.jsonl"))
    assert result.exit_code == 1
    assert result.stderr == (f"Error: --rejects {tmp_path / 'out.jsonl'} is the same file as --verdicts: one would "
                             f"overwrite the other (choose another --rejects file)\n")
    assert not (tmp_path / "other.jsonl").exists()


def test_the_default_rejects_file_may_not_be_the_input_either(run, tmp_path, monkeypatch):
    assert run("init").exit_code == 0
    monkeypatch.chdir(tmp_path)
    data = write_jsonl(tmp_path / "rejects-b.jsonl", RECORDS)
    result = run("ingest", data, "--batch", "b", "--on-error", "skip")
    assert result.exit_code == 1 and "--rejects rejects-b.jsonl is the input file" in result.stderr


def test_a_plot_that_is_an_input_is_refused(tmp_path):
    from click.testing import CliRunner

    from simdb.cli import cli

    pairs = tmp_path / "pairs.svg"  # JSON lines, under a name a plot may have
    pairs.write_text(json.dumps({"a": "one text", "b": "another text", "duplicate": True}) + "\n" +
                     json.dumps({"a": "one text", "b": "a third text", "duplicate": False}) + "\n")
    before = pairs.read_text()
    for alias in aliases(tmp_path, "pairs.svg").values():
        result = CliRunner().invoke(cli, ["calibrate", str(pairs), "--plot", alias])
        assert result.exit_code == 1 and result.stderr.startswith(f"Error: --plot {alias} is the input file "), \
            result.output
    assert pairs.read_text() == before


@pytest.mark.parametrize("command", ["check", "ingest"])
def test_standard_output_that_is_an_input_is_refused(run, database_url, schema, tmp_path, command):
    """`simdb check in.jsonl >> in.jsonl` would read the verdicts it appends, on and on."""
    assert run("init").exit_code == 0
    data = write_jsonl(tmp_path / "in.jsonl", RECORDS)
    before = (tmp_path / "in.jsonl").read_text()
    with open(tmp_path / "in.jsonl", "a") as stdout:
        result = subprocess.run([sys.executable, "-m", "simdb", command, data], stdout=stdout, stderr=subprocess.PIPE,
                                text=True, timeout=120, env={**os.environ, "SIMDB_DATABASE_URL": database_url,
                                                             "SIMDB_SCHEMA": schema})
    assert result.returncode == 1
    assert result.stderr == (f"Error: standard output is the input file {data} (the same file): writing it would "
                             "destroy the input (send standard output to another file)\n")
    assert (tmp_path / "in.jsonl").read_text() == before


# -- the helper itself -----------------------------------------------------------------------------

def test_written_removes_only_its_own_temporary_file_when_the_block_fails(tmp_path):
    out = tmp_path / "out.txt"
    out.write_text("before")
    with pytest.raises(ZeroDivisionError):
        with outputs.written(out, "test output") as file:
            file.write("half of it")
            1 / 0
    assert out.read_text() == "before" and folder_listing(tmp_path) == [("out.txt", "file")]
    with pytest.raises(OutputError, match="it is a folder"):
        outputs.check(tmp_path, "test output")
    with outputs.written(out, "test output") as file:
        file.write("after")
    assert out.read_text() == "after" and folder_listing(tmp_path) == [("out.txt", "file")]
