"""The embedded PostgreSQL stays up between commands and stops by itself (issue 38: every command on an embedded
index started and stopped it, about a second each).

These tests start embedded servers of their own, in temporary directories, through the ``simdb`` command as a
user runs it (no database URL)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg
import pytest

from simdb.pg import embedded


def environment(data_dir, idle: str) -> dict[str, str]:
    """This environment, with no database URL: the command uses the embedded server in ``data_dir``."""
    found = {name: value for name, value in os.environ.items() if name not in ("SIMDB_DATABASE_URL", "SIMDB_SCHEMA")}
    return {**found, "SIMDB_DATA_DIR": str(data_dir), embedded.IDLE_ENV: idle}


def simdb(data_dir, *arguments, idle="10"):
    result = subprocess.run([sys.executable, "-m", "simdb", *arguments], env=environment(data_dir, idle),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return result.stdout


def wait_until(condition, seconds=60.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return condition()


@pytest.fixture
def data_dir():
    """Not under pytest's temporary folder: run as root, pgserver opens the folders above the data directory to
    the user it runs PostgreSQL as, and every pytest session that starts on the machine closes its own folder
    again (mode 0700), so that a server lingering there lost its files mid-test (PANIC: pg_control)."""
    folder = Path(tempfile.mkdtemp(prefix="simdb-embedded-test-"))
    path = folder / "postgres"
    yield path
    pid = embedded.postmaster_pid(path)
    if pid is not None:  # whatever a failed test left running
        embedded.stop(path, pid)
    shutil.rmtree(folder, ignore_errors=True)


def test_the_server_outlives_a_command_and_stops_after_the_idle_time(data_dir):
    simdb(data_dir, "init")
    started = embedded.postmaster_pid(data_dir)
    assert started is not None, "the server stopped with the command although SIMDB_SERVER_IDLE=10"
    stats = json.loads(simdb(data_dir, "stats", "--json"))
    assert stats["documents"] == 0
    assert embedded.postmaster_pid(data_dir) == started, "the second command started another server"
    assert wait_until(lambda: embedded.postmaster_pid(data_dir) is None), "the server did not stop by itself"
    assert json.loads(simdb(data_dir, "stats", "--json"))["documents"] == 0  # started again on demand
    assert embedded.postmaster_pid(data_dir) not in (None, started)


def test_a_connected_client_keeps_it_up(data_dir):
    simdb(data_dir, "init", idle="5")  # long enough for the next step (a file read and a connect) on a loaded machine
    pid = embedded.postmaster_pid(data_dir)
    socket_dir = (data_dir / "postmaster.pid").read_text().splitlines()[4]
    with psycopg.connect(host=socket_dir, user="postgres", dbname="postgres") as client:
        time.sleep(10)  # the idle time, and as long again for a watcher that wrongly stops it to be done
        assert embedded.postmaster_pid(data_dir) == pid
        assert client.execute("SELECT count(*) FROM simdb.documents").fetchone() == (0,)
    assert wait_until(lambda: embedded.postmaster_pid(data_dir) is None)


def test_an_idle_time_of_zero_stops_it_with_the_last_process(data_dir):
    simdb(data_dir, "init", idle="0")
    assert embedded.postmaster_pid(data_dir) is None


def test_a_bad_idle_time_is_one_line():
    result = subprocess.run([sys.executable, "-m", "simdb", "stats"], capture_output=True, text=True, timeout=120,
                            env=environment("/nonexistent/pg", "soon"))
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "Error: SIMDB_SERVER_IDLE='soon' is not a number of seconds: set it to how long the embedded PostgreSQL "
        "stays up after its last use (0 stops it with the last simdb process)"]


def test_a_relative_data_directory_such_as_the_current_one_works(data_dir):
    """A review found ``--data-dir .`` (as ``cd pgdata && simdb ...``) refused: its lock and watcher files were
    named from the path's last part, which ``.`` has none of."""
    data_dir.mkdir()
    for arguments in (["init"], ["stats", "--json"]):
        result = subprocess.run([sys.executable, "-m", "simdb", *arguments, "--data-dir", "."], cwd=data_dir,
                                env=environment(".", "3"), capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["documents"] == 0


def test_a_command_joins_a_running_server_without_pgserver(data_dir):
    """Issue 38: a command that finds the server up connects through the socket its ``postmaster.pid`` names,
    without importing pgserver (and psutil, platformdirs) or running its checks: a tenth of a second of every
    command on a small index."""
    simdb(data_dir, "init")
    pid = embedded.postmaster_pid(data_dir)
    code = ("import json, sys\nfrom simdb.cli import cli\n"
            "try:\n    cli(['stats', '--json'], prog_name='simdb')\n"
            "except SystemExit as exc:\n    assert not exc.code\n"
            "print(json.dumps(sorted({'pgserver', 'psutil', 'platformdirs'} & set(sys.modules))))\n")
    result = subprocess.run([sys.executable, "-c", code], env=environment(data_dir, "10"), capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    stats, _, imported = result.stdout.strip().rpartition("\n")
    assert json.loads(stats)["documents"] == 0
    assert json.loads(imported) == []
    assert embedded.postmaster_pid(data_dir) == pid


def test_a_process_that_joined_keeps_it_up_until_it_exits(data_dir):
    """A process that joined the running server (without pgserver's list of handles) holds it up for as long as it
    lives, connected or not; once it exits the server stops after the idle time."""
    simdb(data_dir, "init", idle="3")
    code = ("import sys, time\nfrom simdb import Index\n"
            "with Index.open() as index:\n    index.stats()\n"
            "print('closed', flush=True)\nsys.stdin.read()\n")  # until the test closes its standard input
    holder = subprocess.Popen([sys.executable, "-c", code], env=environment(data_dir, "3"), stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "closed\n"
        pid = embedded.postmaster_pid(data_dir)  # (the one it started where the first had stopped meanwhile)
        time.sleep(9)  # three times the idle time, with no connection open
        assert embedded.postmaster_pid(data_dir) == pid
    finally:
        holder.communicate("", timeout=60)
    assert holder.returncode == 0
    assert wait_until(lambda: embedded.postmaster_pid(data_dir) is None)


def test_opening_the_embedded_server_reads_its_settings_in_one_statement(data_dir, monkeypatch):
    """Every open of an embedded index checks the server's tuning: one round trip for what the server accepts
    and what was set, not one each (and nothing written when nothing changed)."""
    import sqlalchemy as sa

    from simdb.pg.database import Database

    monkeypatch.setenv(embedded.IDLE_ENV, "0")
    data_dir.mkdir()
    Database.connect(data_dir=data_dir).close()  # the first open tunes it
    statements: list[str] = []

    def record(connection, cursor, statement, parameters, context, executemany):
        statements.append(statement)

    sa.event.listen(sa.engine.Engine, "before_cursor_execute", record)
    try:
        database = Database.connect(data_dir=data_dir)
    finally:
        sa.event.remove(sa.engine.Engine, "before_cursor_execute", record)
    try:
        settings = [statement for statement in statements if "pg_settings" in statement or "pg_file" in statement]
        assert len(settings) == 1, statements
        assert not [statement for statement in statements if "ALTER SYSTEM" in statement]
    finally:
        database.close()
        database.server.cleanup()


def test_a_command_that_stops_the_server_leaves_it_to_a_process_that_joined_it(data_dir):
    """``SIMDB_SERVER_IDLE=0`` stops the server with the last process on pgserver's list of handles; a process that
    joined it without pgserver is not on that list, and keeps it up all the same (its watcher stops it later)."""
    simdb(data_dir, "init", idle="60")  # up when the next process joins it, however loaded the machine
    code = ("import sys\nfrom simdb import Index\nindex = Index.open()\nindex.stats()\n"
            "print('open', flush=True)\nsys.stdin.read()\nprint(index.stats()['documents'])\n")
    holder = subprocess.Popen([sys.executable, "-c", code], env=environment(data_dir, "60"), stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "open\n"
        pid = embedded.postmaster_pid(data_dir)
        assert pid is not None and holder.pid not in json.loads((data_dir / ".handle_pids.json").read_text())
        assert json.loads(simdb(data_dir, "stats", "--json", idle="0"))["documents"] == 0
        assert embedded.postmaster_pid(data_dir) == pid
    finally:
        out, err = holder.communicate("", timeout=60)
    assert holder.returncode == 0, err
    assert out == "0\n"


def test_a_postmaster_pid_left_behind_whose_id_another_process_took_is_not_the_server(tmp_path):
    """A server killed outright leaves ``postmaster.pid`` saying "ready"; once another process has its id, the
    command joined a server that was not there and the watcher sent SIGINT to that process when idle. It is
    recognised, nothing is signalled, and the command says what to do."""
    path = tmp_path / "postgres"
    path.mkdir()
    (tmp_path / ".s.PGSQL.5999").touch()
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (path / "postmaster.pid").write_text(f"{other.pid}\n{path}\n1700000000\n5999\n{tmp_path}\nlocalhost\n"
                                             "  5999001         0\nready   \n")
        assert embedded._running(path) is None
        assert embedded.postmaster_pid(path) is None
        embedded.watch(path, 0)  # returns at once: no server to watch
        with pytest.raises(embedded.DatabaseUnavailable) as caught:
            embedded.start_embedded(path, idle=10)
        assert str(caught.value) == (
            f"{path / 'postmaster.pid'} names process {other.pid}, which is not a PostgreSQL server of this "
            "directory: a server that did not stop cleanly left the file, and another process has its id now. "
            "No server runs there: remove that file and run again")
        assert other.poll() is None, "the process that took the server's id was signalled"
    finally:
        other.kill()
        other.wait()


def test_a_server_whose_working_directory_cannot_be_read_is_told_by_its_owner(tmp_path, monkeypatch):
    """Root without CAP_SYS_PTRACE (a container's default) cannot read another user's /proc/<pid>/cwd, and
    pgserver runs PostgreSQL as a user of its own when started by root: the running server was taken for a
    process that had taken a dead server's id, and every command refused to join it (found in review). Without
    the working directory, the process's owner decides: the data directory's owner runs its server."""
    def unreadable(link):
        raise PermissionError(1, "Operation not permitted", link)

    monkeypatch.setattr(embedded.os, "readlink", unreadable)
    own = tmp_path / "ours"
    own.mkdir()
    assert embedded._serves(os.getpid(), own)  # our process, our directory
    if os.geteuid() == 0:
        theirs = tmp_path / "theirs"
        theirs.mkdir()
        os.chown(theirs, 65534, 65534)
        assert not embedded._serves(os.getpid(), theirs)  # a directory another user owns: not its server
