"""The embedded PostgreSQL (the ``pgserver`` package's binaries) and how long it stays up.

Without a database URL, a command starts the embedded server in its data directory, or joins the one
running there. Starting and stopping it took about a second of every command on a small index, so a
command leaves it running when it ends: a watcher process (``python -m simdb.pg.embedded``, one per data
directory, started by the first command that finds none) stops it once no command has used it and no
client has been connected for :data:`IDLE_ENV` seconds (default :data:`DEFAULT_IDLE`). ``SIMDB_SERVER_IDLE=0``
stops it with the last process that uses it, as before.

Two files beside the data directory coordinate the two: ``.<name>.lock``, whose modification time is when a
command last started or ended (a command holds it shared from the moment it joins the server until it exits,
the watcher takes it exclusively to stop the server, so that no command joins a server that is stopping and
none is stopped under a command), and ``.<name>.watcher``, which the watcher holds locked for as long as it runs.

A command that finds the server up joins it without pgserver: it reads the socket and port from the data
directory's ``postmaster.pid`` (what pgserver reads too), and skips the import of pgserver, psutil and
platformdirs and pgserver's checks, which were a tenth of a second of every command on a small index.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

from ..errors import DatabaseUnavailable

#: Seconds the embedded server stays up after its last use; 0 stops it with the last process that uses it.
IDLE_ENV = "SIMDB_SERVER_IDLE"
DEFAULT_IDLE = 300.0
#: How often the watcher looks for clients and commands.
POLL_SECONDS = 2.0


def idle_seconds() -> float:
    """:data:`IDLE_ENV` from the environment, else :data:`DEFAULT_IDLE`."""
    raw = os.environ.get(IDLE_ENV, "").strip()
    if not raw:
        return DEFAULT_IDLE
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds < float("inf"):
        raise DatabaseUnavailable(f"{IDLE_ENV}={raw!r} is not a number of seconds: set it to how long the embedded "
                                  "PostgreSQL stays up after its last use (0 stops it with the last simdb process)")
    return seconds


def default_data_dir() -> Path:
    if os.environ.get("SIMDB_DATA_DIR"):
        return Path(os.environ["SIMDB_DATA_DIR"])
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "simdb" / "postgres"


def start_embedded(data_dir: str | Path | None = None, *, idle: float = 0):
    """Start (or join) the embedded PostgreSQL in ``data_dir``; returns the server handle (pgserver's).

    ``idle`` is how many seconds it stays up after its last use (a watcher stops it); 0 stops it when the
    last process using it exits (or calls the handle's ``cleanup()``), as tests and benchmarks want of a
    server in a temporary directory."""
    # absolute: its lock and watcher files are named after its last part, which "." has none of
    path = (Path(data_dir) if data_dir is not None else default_data_dir()).absolute()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DatabaseUnavailable(f"cannot create the data directory {path}: {exc.strerror}; "
                                  "choose another with «data_dir» or SIMDB_DATA_DIR") from exc
    stale = _stale_pid(path)
    if stale is not None:
        raise DatabaseUnavailable(
            f"{path / 'postmaster.pid'} names process {stale}, which is not a PostgreSQL server of this directory: "
            "a server that did not stop cleanly left the file, and another process has its id now. No server "
            "runs there: remove that file and run again")
    try:
        with _joining(path, idle):
            server = (_running(path) if idle else None) or _pgserver(path, idle)
    except DatabaseUnavailable:
        raise
    except Exception as exc:  # pgserver raises plain exceptions with the postgres log inside
        raise DatabaseUnavailable(
            f"could not start the embedded PostgreSQL in {path}: {exc}. "
            "Check the directory is writable and not used by another PostgreSQL version, "
            "or pass «database_url» to use a server") from exc
    if idle:
        if path not in _MARKED_AT_EXIT:
            _MARKED_AT_EXIT.add(path)
            atexit.register(_used, path)
        _ensure_watcher(path, idle)
    return server


#: The data directories this process marks as used when it exits (once each, however often it connects).
_MARKED_AT_EXIT: set[Path] = set()
#: The lock file of each data directory this process has joined, held shared until it exits.
_HELD: dict[Path, object] = {}


def _pgserver(path: Path, idle: float):
    """pgserver's handle on the server in ``path``, which it starts where none runs (and, with ``idle`` 0, stops
    when the last process holding a handle exits, unless a process that joined it without pgserver still holds
    it: then its watcher stops it)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs warns about XDG_RUNTIME_DIR on servers
        import pgserver

        server = pgserver.get_server(path, cleanup_mode=None if idle else "stop")
    if not idle and path not in _SPARED_AT_EXIT:
        _SPARED_AT_EXIT.add(path)
        atexit.register(_spare_if_held, path, server)  # runs before pgserver's own exit handler, registered earlier
    return server


#: The data directories whose pgserver handle this process checks at exit (:func:`_spare_if_held`).
_SPARED_AT_EXIT: set[Path] = set()


def _spare_if_held(path: Path, server) -> None:
    """At the exit of a process that would stop the server (``SIMDB_SERVER_IDLE=0``): leave it up where a process
    that joined it without pgserver (and so is not on pgserver's list of handles) still holds it."""
    if _held_by_others(path):
        server.cleanup_mode = None


class RunningServer:
    """The server that runs in a data directory, as its ``postmaster.pid`` describes it: what a command needs of
    pgserver's handle (:meth:`get_uri`, :meth:`cleanup`) when the server is up already."""

    def __init__(self, path: Path, pid: int, socket_dir: str, hostname: str, port: int) -> None:
        self.path, self.pid, self.socket_dir, self.hostname, self.port = path, pid, socket_dir, hostname, port

    def get_uri(self, database: str | None = None) -> str:
        """The server's URL, the very one pgserver gives (``PostmasterInfo.get_uri``): its socket directory
        (PostgreSQL's default port, which pgserver starts it on), else its host and port."""
        if self.socket_dir:
            return f"postgresql://postgres:@/{database or 'postgres'}?host={self.socket_dir}"
        return f"postgresql://postgres:@{self.hostname}:{self.port}/{database or 'postgres'}"

    def cleanup(self) -> None:
        """Nothing to release: the watcher stops a lingering server."""


def _running(path: Path) -> RunningServer | None:
    """The server up and ready in ``path``, or None (none runs, it is starting or stopping, or its
    ``postmaster.pid`` names another directory or a socket that is not there): pgserver then takes over."""
    try:
        lines = (path / "postmaster.pid").read_text().splitlines()
        pid, pgdata, port, socket_dir, hostname = int(lines[0]), lines[1], int(lines[3]), lines[4], lines[5]
        status = lines[7].strip()
        os.kill(pid, 0)
    except (OSError, ValueError, IndexError):
        return None
    if status != "ready" or Path(pgdata) != path.resolve() or not _serves(pid, path):
        return None
    if not (os.path.exists(os.path.join(socket_dir, f".s.PGSQL.{port}")) if socket_dir else hostname):
        return None
    return RunningServer(path, pid, socket_dir, hostname, port)


def _lock_file(path: Path) -> Path:
    return path.with_name(f".{path.name}.lock")


def _watcher_file(path: Path) -> Path:
    return path.with_name(f".{path.name}.watcher")


@contextlib.contextmanager
def _joining(path: Path, idle: float) -> Iterator[None]:
    """While a command joins the server: marked as used, and never while the watcher stops it. The shared lock
    is then held until the process exits (the watcher does not stop a server that a process holds)."""
    if not idle:
        yield
        return
    if path in _HELD:
        _used(path)
        yield
        return
    handle = open(_lock_file(path), "a")  # not inherited by the processes this one starts (PEP 446)
    try:
        fcntl.flock(handle, fcntl.LOCK_SH)
        _used(path)
        yield
    except BaseException:
        handle.close()
        raise
    _HELD[path] = handle


def _used(path: Path) -> None:
    with contextlib.suppress(OSError):
        _lock_file(path).touch()


def _ensure_watcher(path: Path, idle: float) -> None:
    """Start the watcher of ``path`` unless one runs (it holds its file locked)."""
    try:
        with open(_watcher_file(path), "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return  # one is watching
    except OSError:
        return  # no file to lock beside the data directory: the server then stays up, as pgserver leaves it
    subprocess.Popen([sys.executable, "-m", __name__, str(path), repr(idle)], stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)


def _pid_file_pid(path: Path) -> int | None:
    """The live process that ``postmaster.pid`` names (its first line), or None (no file, or no such process)."""
    try:
        pid = int((path / "postmaster.pid").read_text().split("\n", 1)[0])
        os.kill(pid, 0)
        return pid
    except (OSError, ValueError):
        return None


def _serves(pid: int, path: Path) -> bool:
    """Whether process ``pid`` is the server of the data directory ``path`` (the postmaster runs in its data
    directory), not a process that took the id of a server that did not stop cleanly. Where the system does not
    say (no ``/proc``), a live process is taken to be the server, as PostgreSQL itself takes it."""
    try:
        return Path(os.readlink(f"/proc/{pid}/cwd")) == path.resolve()
    except FileNotFoundError:
        return not os.path.isdir("/proc/self")  # gone since, or a system without /proc
    except OSError:
        # its working directory is not ours to read (another user's process, read by root without
        # CAP_SYS_PTRACE, as in containers, or /proc mounted with hidepid): the server runs as the user that
        # owns its data directory, so a process of another user is not it; one of that user may be
        try:
            return os.stat(f"/proc/{pid}").st_uid == path.stat().st_uid
        except OSError:
            return True


def _stale_pid(path: Path) -> int | None:
    """The process ``postmaster.pid`` names where it is alive but not this directory's server, else None."""
    pid = _pid_file_pid(path)
    return pid if pid is not None and not _serves(pid, path) else None


def postmaster_pid(path: Path) -> int | None:
    """The running server's process id (the first line of ``postmaster.pid``), or None where none runs (no file,
    no such process, or a process that is not this directory's server: the watcher never signals it)."""
    pid = _pid_file_pid(path)
    return pid if pid is not None and _serves(pid, path) else None


def busy(path: Path, pid: int, *, locked: bool = False) -> bool:
    """Whether a client is connected to the server (a backend serving a socket connection: ``[local]`` in its
    title) or a process still holds a handle on it (the lock file shared, unless the caller holds it
    exclusively: ``locked``; or pgserver's list of the processes using it)."""
    import psutil

    if not locked and _held_by_others(path):
        return True
    try:
        for child in psutil.Process(pid).children():
            with contextlib.suppress(psutil.Error):
                if "[local]" in " ".join(child.cmdline()):
                    return True
    except psutil.Error:
        return False
    try:
        handles = json.loads((path / ".handle_pids.json").read_text())
    except (OSError, ValueError):
        return False
    return any(isinstance(handle, int) and psutil.pid_exists(handle) for handle in handles)


def _held_by_others(path: Path) -> bool:
    """Whether a process holds the lock file of ``path`` (shared: it has joined the server and not exited)."""
    try:
        with open(_lock_file(path), "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    return False


def watch(path: Path, idle: float) -> None:
    """Stop the server in ``path`` once it has been idle for ``idle`` seconds; return when it has stopped (by
    this watcher or by anyone else), or at once if another watcher runs."""
    with open(_watcher_file(path), "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return
        last_busy = 0.0
        while (pid := postmaster_pid(path)) is not None:
            if busy(path, pid):
                last_busy = time.time()
            quiet_since = max(last_busy, _last_used(path))
            if time.time() - quiet_since < idle:
                time.sleep(min(POLL_SECONDS, max(0.1, quiet_since + idle - time.time())))
                continue
            with open(_lock_file(path), "a") as lock:  # no command joins while it stops
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:  # a command has joined since
                    continue
                if time.time() - _last_used(path) >= idle and not busy(path, pid, locked=True):
                    stop(path, pid)


def _last_used(path: Path) -> float:
    try:
        return _lock_file(path).stat().st_mtime
    except OSError:
        return 0.0


def stop(path: Path, pid: int, timeout: float = 60) -> None:
    """Stop the server (PostgreSQL's fast shutdown) and wait until it is down."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGINT)
    deadline = time.monotonic() + timeout
    while postmaster_pid(path) == pid and time.monotonic() < deadline:
        time.sleep(0.05)


if __name__ == "__main__":
    watch(Path(sys.argv[1]), float(sys.argv[2]))
