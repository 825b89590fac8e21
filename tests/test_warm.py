"""The warm command process (:mod:`simdb.launch`): a command run through it prints, reads and exits as the same
command run in its own process, and any failure of the warm path runs the command in-process instead.

Each test has its own directory for the warm processes (``SIMDB_WARM_DIR``) and stops the ones it started.
``SIMDB_WARM=require`` makes ``simdb`` fail rather than fall back, so that a test knows which path ran.
"""

from __future__ import annotations

import glob
import marshal
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from simdb import launch
from simdb.pg import embedded
from tests.test_ingest_scale import alive, children_of

ROOT = Path(__file__).resolve().parent.parent


def wait_for(condition, what: str, seconds: float = 60.0):
    deadline = time.monotonic() + seconds
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {seconds:.0f} s for {what}")
        time.sleep(0.05)


def servers(directory: str) -> dict[str, int]:
    """The warm processes running for ``directory``: socket path -> process id."""
    found = {}
    for lock in glob.glob(os.path.join(directory, "*.lock")):
        pid = launch.server_pid(lock[:-len(".lock")] + ".sock")
        if pid is not None:
            found[lock[:-len(".lock")] + ".sock"] = pid
    return found


def reading_stdin(pid: int) -> bool:
    """Whether the process waits in read(2) on its standard input (x86-64's and arm64's call numbers)."""
    try:
        with open(f"/proc/{pid}/syscall") as call:
            fields = call.read().split()
    except OSError:
        return False
    return len(fields) > 1 and fields[0] in ("0", "63") and int(fields[1], 16) == 0


@pytest.fixture
def warm(database_url, schema):
    """The environment of a ``simdb`` with its own warm directory (short: a socket's path has 107 bytes at most)."""
    directory = tempfile.mkdtemp(prefix="sw", dir="/tmp")
    env = {name: value for name, value in os.environ.items()
           if name not in ("SIMDB_DATA_DIR", "SIMDB_DATABASE_URL", "SIMDB_SCHEMA", "SIMDB_WARM")}
    env.update(SIMDB_DATABASE_URL=database_url, SIMDB_SCHEMA=schema, SIMDB_WARM_DIR=directory,
               SIMDB_SERVER_IDLE="120", PYTHONPATH=str(ROOT))
    yield env
    for pid in servers(directory).values():
        os.kill(pid, signal.SIGTERM)
        wait_for(lambda: not alive(pid), f"the warm process {pid} to stop")
    shutil.rmtree(directory, ignore_errors=True)


def simdb(env: dict, *arguments: str, mode: str = "require", input: str | None = None):
    return subprocess.run([sys.executable, "-m", "simdb", *arguments], env={**env, "SIMDB_WARM": mode},
                          input=input, capture_output=True, text=True, timeout=300, cwd=ROOT)


def outcome(result) -> tuple[int, str, str]:
    return result.returncode, result.stdout, result.stderr


def test_commands_print_read_and_exit_as_in_process(warm, corpus_archive):
    """stdout, stderr and exit status of each command, warm and in-process: reads, a pipe on standard input,
    a JSON output, an error (exit 1) and a usage error (exit 2)."""
    from simdb.samples import corpus

    record = next(iter(corpus()))
    commands = [(["show", record["id"]], None), (["query", record["text"][:300]], None),
                (["query", "--file", "-", "--json"], record["text"][:300]), (["fingerprint", "--file", "-"], "héllo"),
                (["pairs", "--batch", "new"], None), (["verdicts", "--batch", "new"], None),
                (["show", "no-such-document"], None), (["query", "--max-distance", "99", "x"], None),
                (["--help"], None), (["no-such-command"], None)]
    statuses = set()
    for arguments, given in commands:
        here = outcome(simdb(warm, *arguments, mode="0", input=given))
        warm_run = outcome(simdb(warm, *arguments, input=given))
        assert warm_run == here, arguments
        statuses.add(here[0])
    assert statuses == {0, 1, 2}
    assert len(servers(warm["SIMDB_WARM_DIR"])) == 1


def test_standard_streams_are_the_callers(warm):
    """The command writes to the caller's own stdout and stderr (a file here), and reads its stdin from a pipe."""
    directory = Path(warm["SIMDB_WARM_DIR"])
    with open(directory / "out", "w") as out, open(directory / "err", "w") as err:
        done = subprocess.run([sys.executable, "-m", "simdb", "fingerprint", "--file", "-", "--tokens"],
                              env={**warm, "SIMDB_WARM": "require"}, input=b"one two", stdout=out, stderr=err,
                              timeout=300)
    here = simdb(warm, "fingerprint", "--file", "-", "--tokens", mode="0", input="one two")
    assert done.returncode == 0
    assert (directory / "out").read_text() == here.stdout
    assert (directory / "err").read_text() == here.stderr


def test_a_stale_key_starts_a_new_warm_process(warm, tmp_path):
    simdb(warm, "fingerprint", "a")
    [(first_socket, first)] = servers(warm["SIMDB_WARM_DIR"]).items()
    # an environment variable that acts at import (a part of the key) asks for another warm process
    changed = simdb({**warm, "SIMDB_NATIVE": "off"}, "fingerprint", "a")
    assert outcome(changed) == outcome(simdb(warm, "fingerprint", "a", mode="0"))
    found = servers(warm["SIMDB_WARM_DIR"])
    assert len(found) == 2 and found[first_socket] == first

    # so does a changed source file
    package = tmp_path / "simdb"
    shutil.copytree(ROOT / "simdb", package, ignore=shutil.ignore_patterns("__pycache__"))
    before = launch.warm_key(str(package))
    os.utime(package / "cli.py", ns=(time.time_ns(), time.time_ns() + 10**9))
    assert launch.warm_key(str(package)) != before


def test_a_killed_warm_process_falls_back_to_in_process(warm):
    simdb(warm, "fingerprint", "a")
    [(path, pid)] = servers(warm["SIMDB_WARM_DIR"]).items()
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not alive(pid), "the killed warm process to go")
    assert os.path.exists(path)  # its socket is left behind, unanswered
    assert outcome(simdb(warm, "fingerprint", "a", mode="1")) == outcome(simdb(warm, "fingerprint", "a", mode="0"))
    # and that command started a new one
    wait_for(lambda: servers(warm["SIMDB_WARM_DIR"]).get(path) not in (None, pid), "a new warm process")
    assert simdb(warm, "fingerprint", "a").returncode == 0


def test_no_warm_process_where_it_is_off(warm):
    assert simdb(warm, "fingerprint", "a", mode="0").returncode == 0
    assert simdb({**warm, "SIMDB_SERVER_IDLE": "0"}, "fingerprint", "a", mode="1").returncode == 0
    assert servers(warm["SIMDB_WARM_DIR"]) == {}
    refused = simdb({**warm, "SIMDB_SERVER_IDLE": "0"}, "fingerprint", "a")
    assert refused.returncode == 1 and "SIMDB_SERVER_IDLE='0' asks for no warm process" in refused.stderr


def interrupted(env: dict, mode: str, waiting) -> tuple[int, str, str]:
    """Outcome of ``simdb fingerprint --file -`` given SIGINT (Ctrl-C) while it reads its standard input;
    ``waiting(client)`` is the process that reads it."""
    client = subprocess.Popen([sys.executable, "-m", "simdb", "fingerprint", "--file", "-"],
                              env={**env, "SIMDB_WARM": mode}, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        reader = wait_for(lambda: waiting(client), "the command to read its standard input")
        wait_for(lambda: reading_stdin(reader), "the command to read its standard input")
        client.send_signal(signal.SIGINT)
        out, err = client.communicate(timeout=120)
    finally:
        client.kill()
        client.wait()
    return client.returncode, out, err


def test_ctrl_c_reaches_the_command(warm):
    simdb(warm, "fingerprint", "a")
    [server] = servers(warm["SIMDB_WARM_DIR"]).values()

    def warm_child(client):
        found = [pid for pid in children_of(server) if alive(pid)]
        return found[0] if found and client.poll() is None else None

    here = interrupted(warm, "0", lambda client: client.pid)
    assert here[0] == 1 and "Aborted!" in here[2]
    assert interrupted(warm, "require", warm_child) == here
    wait_for(lambda: not [pid for pid in children_of(server) if alive(pid)], "the interrupted child to end")


def test_a_killed_simdb_takes_its_command_along(warm):
    """SIGKILL cannot be passed on: the warm process sees simdb's end and stops the command (SIGTERM)."""
    simdb(warm, "fingerprint", "a")
    [server] = servers(warm["SIMDB_WARM_DIR"]).values()
    client = subprocess.Popen([sys.executable, "-m", "simdb", "fingerprint", "--file", "-"],
                              env={**warm, "SIMDB_WARM": "require"}, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, cwd=ROOT)
    try:
        child = wait_for(lambda: [pid for pid in children_of(server) if alive(pid)], "the command")[0]
        client.kill()
        client.wait(timeout=60)
        wait_for(lambda: not alive(child), "the command to stop")
    finally:
        client.kill()
        client.wait()
    assert alive(server)


def test_a_command_killed_outright_ends_simdb_as_it_would_end_here(warm):
    """A warm command SIGKILLed (the OOM killer, ``kill -9``) ends ``simdb`` by SIGKILL too, as the command run
    here would have ended; resetting SIGKILL's handler first raised OSError, a traceback and exit 1."""
    simdb(warm, "fingerprint", "a")
    [server] = servers(warm["SIMDB_WARM_DIR"]).values()
    client = subprocess.Popen([sys.executable, "-m", "simdb", "fingerprint", "--file", "-"],
                              env={**warm, "SIMDB_WARM": "require"}, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        child = wait_for(lambda: [pid for pid in children_of(server) if alive(pid)], "the command")[0]
        wait_for(lambda: reading_stdin(child), "the command to read its standard input")
        os.kill(child, signal.SIGKILL)
        _, err = client.communicate(timeout=120)
    finally:
        client.kill()
        client.wait()
    assert (client.returncode, err) == (-signal.SIGKILL, "")
    assert alive(server)


def python_for_others() -> str:
    """A Python interpreter another user can run: this one where every folder above it is open to others, else the
    system's (pgserver opens the folders above a data directory to others and tests close them again, so whether
    /root, where this one may live, is open depends on which test ran last)."""
    def open_to_others(path: str) -> bool:
        real = os.path.realpath(path)
        return all(os.stat(folder).st_mode & stat.S_IXOTH for folder in [real, *map(str, Path(real).parents)])

    for candidate in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"):
        if os.path.exists(candidate) and open_to_others(candidate):
            return candidate
    pytest.skip("no Python interpreter here that another user can run")


def raw_request(path: str, key: str, user: int | None) -> bytes:
    """What the warm process at ``path`` answers a request made by hand by a process of ``user``."""
    request = marshal.dumps({"key": key, "argv": ["simdb", "--help"], "environ": {}, "umask": 0o22, "started": 0.0})
    code = ("import socket, sys\n"
            "s = socket.socket(socket.AF_UNIX); s.settimeout(30); s.connect(sys.argv[1])\n"
            "data = bytes.fromhex(sys.argv[2]); data = len(data).to_bytes(4, 'big') + data\n"
            "try:\n"
            "    socket.send_fds(s, [data], [0, 1, 2, 0])\n"
            "    sys.stdout.write(s.recv(65536).hex())\n"
            "except (BrokenPipeError, ConnectionResetError):\n"
            "    pass  # closed without a word\n")
    python = sys.executable if user is None else python_for_others()
    done = subprocess.run([python, "-I", "-c", code, path, request.hex()], capture_output=True, text=True,
                          timeout=60, user=user, stdin=subprocess.DEVNULL, cwd="/")
    assert done.returncode == 0, done.stderr
    return bytes.fromhex(done.stdout)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to connect as another user")
def test_another_users_connection_is_refused(warm):
    directory = warm["SIMDB_WARM_DIR"]
    simdb(warm, "fingerprint", "a")
    [path] = servers(directory)
    # a request with another key is answered "stale": the warm process reads what its own user sends
    assert marshal.loads(raw_request(path, "another key", None)[4:]) == ("stale",)
    # another user who can reach the socket is not answered at all
    os.chmod(directory, 0o711)
    os.chmod(path, 0o666)
    try:
        assert raw_request(path, "another key", 65534) == b""
    finally:
        os.chmod(directory, 0o700)
        os.chmod(path, 0o600)


def test_a_directory_open_to_others_is_not_used(warm):
    os.chmod(warm["SIMDB_WARM_DIR"], 0o755)
    refused = simdb(warm, "fingerprint", "a")
    assert refused.returncode == 1 and "no private directory" in refused.stderr
    assert simdb(warm, "fingerprint", "a", mode="1").returncode == 0
    assert servers(warm["SIMDB_WARM_DIR"]) == {}


def test_the_warm_process_stops_when_idle(warm):
    env = {**warm, "SIMDB_SERVER_IDLE": "1"}
    simdb(env, "fingerprint", "a")
    [(path, pid)] = servers(warm["SIMDB_WARM_DIR"]).items()
    wait_for(lambda: not alive(pid), "the idle warm process to stop")
    assert not os.path.exists(path)


def test_which_commands_run_in_their_own_process():
    assert launch.runs_warm(["stats"]) and launch.runs_warm(["show", "ingest"]) and launch.runs_warm(["sync", "list"])
    for arguments in (["ingest", "a.jsonl"], ["check", "a.jsonl"], ["init"], ["sync", "run", "x"],
                      ["query", "--workers", "2", "x"], ["report", "--workers=2"]):
        assert not launch.runs_warm(arguments), arguments


def test_the_entry_point_imports_nothing_heavy():
    """``simdb`` (the console script, and ``python -m simdb``) starts from :mod:`simdb.launch`, whose import
    loads none of simdb's other modules or their dependencies."""
    assert 'simdb = "simdb.launch:main"' in (ROOT / "pyproject.toml").read_text()
    loaded = subprocess.run([sys.executable, "-c", "import sys, simdb.launch; print(' '.join(sys.modules))"],
                            capture_output=True, text=True, check=True, cwd=ROOT).stdout.split()
    assert [name for name in loaded if name.startswith("simdb")] == ["simdb", "simdb.clock", "simdb.launch"]
    assert not {"click", "sqlalchemy", "psycopg", "numpy", "subprocess", "json"} & set(loaded)


def test_the_idle_setting_is_the_embedded_servers():
    assert (launch.IDLE_ENV, launch.DEFAULT_IDLE) == (embedded.IDLE_ENV, embedded.DEFAULT_IDLE)


def test_the_terminal_is_the_callers(warm):
    """On a terminal (a pseudo-terminal 50 columns wide here), the command sees that terminal: help is wrapped
    to its width (more lines than at 120 columns), and what it prints is what it prints in its own process."""
    import fcntl
    import pty
    import struct
    import termios

    def on_terminal(mode: str, columns: int = 50) -> tuple[int, bytes]:
        leader, follower = pty.openpty()
        fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
        env = {name: value for name, value in warm.items() if name not in ("COLUMNS", "LINES")}
        try:
            done = subprocess.run([sys.executable, "-m", "simdb", "fingerprint", "--help"],
                                  env={**env, "SIMDB_WARM": mode}, stdout=follower, stderr=subprocess.PIPE,
                                  timeout=300, cwd=ROOT)
            os.close(follower)
            printed = b""
            while True:
                try:
                    chunk = os.read(leader, 65536)
                except OSError:  # EIO: the terminal's other side is closed and drained
                    break
                if not chunk:
                    break
                printed += chunk
        finally:
            os.close(leader)
        return done.returncode, printed

    here = on_terminal("0")
    assert here[0] == 0 and len(here[1].splitlines()) > len(on_terminal("0", 120)[1].splitlines())  # wrapped
    assert on_terminal("require") == here


def test_the_warm_process_keeps_none_of_the_callers_files(warm):
    """A caller that gave simdb a pipe (fd 3 and up) sees its end when simdb ends, not when the warm process
    it started stops."""
    read_end, write_end = os.pipe()
    try:
        done = subprocess.run([sys.executable, "-m", "simdb", "fingerprint", "a"],
                              env={**warm, "SIMDB_WARM": "require"}, pass_fds=(write_end,), capture_output=True,
                              timeout=300, cwd=ROOT)
        assert done.returncode == 0 and servers(warm["SIMDB_WARM_DIR"])
        os.close(write_end)
        write_end = None
        os.set_blocking(read_end, False)
        assert os.read(read_end, 1) == b""
    finally:
        os.close(read_end)
        if write_end is not None:
            os.close(write_end)


#: A ``simdb fingerprint a`` that stops itself (SIGSTOP) between the child's "ready" and its own "go", as a
#: terminal's Ctrl-Z or a debugger stops it there.
STOPPED_BEFORE_GO = """
import os, signal, sys
from simdb import launch

send = launch.send_message


def stopping(connection, message, fds=()):
    if message == "go":
        os.kill(os.getpid(), signal.SIGSTOP)
    return send(connection, message, fds)


launch.send_message = stopping
sys.argv = ["simdb", "fingerprint", "a"]
launch.main()
"""


def stopped(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "T"
    except OSError:
        return False


def test_a_simdb_stopped_before_go_still_runs_its_command(warm):
    """A ``simdb`` stopped for longer than the child once waited for "go" (GO_TIMEOUT) runs its command when it
    continues: the child waits as long as its ``simdb`` is there. It exited 1 without running it."""
    simdb(warm, "fingerprint", "a")
    [server] = servers(warm["SIMDB_WARM_DIR"]).values()
    client = subprocess.Popen([sys.executable, "-c", STOPPED_BEFORE_GO], env={**warm, "SIMDB_WARM": "require"},
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              cwd=ROOT)
    try:
        wait_for(lambda: stopped(client.pid), "simdb to stop before its go")
        [child] = [pid for pid in children_of(server) if alive(pid)]
        time.sleep(launch.GO_TIMEOUT + 1.5)
        assert alive(child)
        os.kill(client.pid, signal.SIGCONT)
        out, err = client.communicate(timeout=120)
    finally:
        client.kill()
        client.wait()
    assert (client.returncode, out, err) == outcome(simdb(warm, "fingerprint", "a", mode="0"))
    assert alive(server)


def test_a_child_whose_connection_is_a_descriptor_past_1024_still_reads_its_go():
    """The warm process holds one connection per running command, and its children inherit its table: a
    connection's descriptor can be past 1,024, where ``select.select`` raises ValueError (the command then
    failed before running). The child waits on it with ``poll``."""
    import resource
    import socket

    from simdb import warm as served

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"this process may open at most {hard} files")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    high = socket.socket(fileno=os.dup2(ours.fileno(), 1100))
    try:
        launch.send_message(theirs, ("go", 1))
        assert served._wait_for_go(high) == ("go", 1)
        theirs.close()
        assert served._readable([high], 5) == [high]  # the end of the connection reads as something to read
    finally:
        high.close()
        ours.close()
        theirs.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
