"""The ``simdb`` command's entry point: run the command in a warm process when one is up, else in this one.

Importing SQLAlchemy, psycopg, numpy and click takes most of half a second of every command before it can ask
the database anything. So the first command that finds no warm process starts one (and runs itself as before):
``python -c "from simdb.warm import serve; serve()"`` (:mod:`simdb.warm`), a per-user background process that
imports simdb's command line and database layer once and waits on a Unix socket. A later ``simdb`` imports
only ``os``, ``sys`` and ``socket`` (this module), connects, and sends its arguments, environment, umask and
working directory with its standard input, output and error themselves (``SCM_RIGHTS``). The warm process
forks a child per command that takes those over (so output, ``isatty``, pipes and exit codes are those of the
command run here), runs the same click ``main`` and exits; the warm process sends its exit status (or the
signal that ended it) back, and ``simdb`` exits with it. SIGINT, SIGTERM and SIGHUP that ``simdb`` receives go
to the child: Ctrl-C interrupts the command as before; a ``simdb`` killed outright (SIGKILL) takes its command
along (the warm process sees its connection close and sends the child SIGTERM).

Where it lives: a directory of the user's own, mode 0700 (``$SIMDB_WARM_DIR``, else
``$XDG_RUNTIME_DIR/simdb-warm``, else ``/tmp/simdb-warm-<uid>``; a directory that is not the user's own or
is open to others is not used). Each warm process answers only its own user (``SO_PEERCRED``) and only
commands whose *key* is its own: the Python executable, version and flags, the path, size and modification
time of every file of simdb, the packages installed in the import path's directories, and the environment
variables that act at import (``SIMDB_NATIVE``, ``PYTHON*``, the locale's ``LANG``/``LC_*``, thread counts)
and ``SIMDB_SERVER_IDLE``. A changed key names another socket, so an upgrade or an edit starts a fresh warm
process; the stale one exits when it notices (within 30 s) or after its idle time.

It stops by itself once no command has run for ``SIMDB_SERVER_IDLE`` seconds (default 300, as the embedded
PostgreSQL; ``0`` means no warm process at all). ``SIMDB_WARM=0`` turns it off; ``SIMDB_WARM=require`` waits
for one (starting it) and fails rather than run here, to check that it works.

Any failure before the command starts (no warm process, a stale or unreachable one, a closed standard
stream, a timeout) runs the command in this process instead: a command is never lost, and never run twice
(the child starts it only after ``simdb`` said go). What runs here always: ``ingest``, ``check``, ``init``
and ``sync run`` (long runs, where half a second does not matter, that start worker processes and deserve
their own process for job control, resource limits and ``ps``), and any command given ``--workers``.
"""

from __future__ import annotations

import os
import socket
import sys

from .clock import process_age

WARM_ENV = "SIMDB_WARM"
DIR_ENV = "SIMDB_WARM_DIR"
#: The embedded PostgreSQL's idle time (:data:`simdb.pg.embedded.IDLE_ENV`), which the warm process shares.
IDLE_ENV = "SIMDB_SERVER_IDLE"
DEFAULT_IDLE = 300.0
#: Commands that always run in their own process (see the module's docstring), by their first words.
IN_PROCESS = {("ingest",), ("check",), ("init",), ("sync", "run")}
#: Seconds to connect and to hear from the child before falling back; how often the child, waiting for "go" as
#: long as its ``simdb`` is there, looks whether it still is (:mod:`simdb.warm` is the warm process, and shares
#: these and the functions below).
CONNECT_TIMEOUT, READY_TIMEOUT, GO_TIMEOUT = 2.0, 10.0, 10.0
#: How long ``SIMDB_WARM=require`` waits for a warm process to start.
START_TIMEOUT = 60.0
#: How often a warm process checks that its key still holds.
STALE_CHECK_SECONDS = 30.0
#: Environment variables that act when a module is imported, by name or prefix.
KEY_ENV_NAMES = ("SIMDB_NATIVE", IDLE_ENV, "LANG", "LANGUAGE")
KEY_ENV_PREFIXES = ("PYTHON", "LC_")
KEY_ENV_SUFFIXES = ("_NUM_THREADS",)
FORWARDED_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")


def main() -> None:
    """The ``simdb`` console script."""
    started = _now() - process_age()
    code = None
    mode = os.environ.get(WARM_ENV, "1").strip().lower()
    if mode not in ("0", "off", "no", "false") and runs_warm(sys.argv[1:]):
        code = run_warm(sys.argv, started, require=mode == "require")
    if code is None:
        from .cli import main as run_here

        run_here(started)
    sys.exit(code)


def runs_warm(arguments: list[str]) -> bool:
    """Whether a command with these arguments may run in the warm process (see :data:`IN_PROCESS`)."""
    if not hasattr(socket, "SO_PEERCRED"):  # not Linux: no way to know who is at the socket's other end
        return False
    words = [word for word in arguments if not word.startswith("-")]
    if any(tuple(words[:len(first)]) == first for first in IN_PROCESS):
        return False
    return not any(word == "--workers" or word.startswith("--workers=") for word in arguments)


def _now() -> float:
    import time  # a builtin module: no cost

    return time.perf_counter()  # CLOCK_MONOTONIC on Linux: the same clock in the warm child


def idle_seconds() -> float | None:
    """``SIMDB_SERVER_IDLE`` in seconds; None where it is not a number (the command then says so)."""
    raw = os.environ.get(IDLE_ENV, "").strip()
    try:
        seconds = float(raw) if raw else DEFAULT_IDLE
    except ValueError:
        return None
    return seconds if 0 <= seconds < float("inf") else None


# --- where and what: the directory, the key ---------------------------------------------------------------

def warm_directory(create: bool = True) -> str | None:
    """The user's private directory for warm processes' sockets; None where it is not private (or cannot be made)."""
    import stat

    given = os.environ.get(DIR_ENV)
    if given:
        path = given
    elif os.environ.get("XDG_RUNTIME_DIR"):
        path = os.path.join(os.environ["XDG_RUNTIME_DIR"], "simdb-warm")
    else:
        path = f"/tmp/simdb-warm-{os.getuid()}"
    try:
        if create:
            try:
                os.mkdir(path, 0o700)
            except FileExistsError:
                pass
        found = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid() or found.st_mode & 0o077:
        return None
    return path


def package_directory() -> str:
    return os.path.dirname(os.path.abspath(__file__))


def warm_key(package: str | None = None) -> str:
    """Everything that makes a warm process stale for this command (see the module's docstring), as text."""
    package = package or package_directory()
    parts = [sys.executable, sys.version, repr(sys.flags), package]
    # the first entry is the script's directory (the console script's, or the working directory of `python -m
    # simdb`), where the warm process has simdb's (see start_server); not with -P or -I
    # and of each, the packages installed there, with their versions (not its modification time: that moves
    # whenever Python writes a __pycache__ directory in it)
    for directory in sys.path[0 if getattr(sys.flags, "safe_path", False) else 1:]:
        try:
            names = sorted(name for name in os.listdir(directory or ".")
                           if name.endswith((".dist-info", ".egg-info", ".egg-link", ".pth")))
        except OSError:
            names = ["-"]
        parts.append(f"{directory}:{' '.join(names)}")
    for root, directories, files in os.walk(package):
        directories[:] = sorted(name for name in directories if name != "__pycache__")
        for name in sorted(files):
            if name.endswith((".py", ".so", ".c", ".h")):
                path = os.path.join(root, name)
                try:
                    found = os.stat(path)
                except OSError:
                    continue
                parts.append(f"{path}:{found.st_size}:{found.st_mtime_ns}")
    parts += sorted(f"{name}={value}" for name, value in os.environ.items()
                    if name in KEY_ENV_NAMES or name.startswith(KEY_ENV_PREFIXES) or name.endswith(KEY_ENV_SUFFIXES))
    return "\n".join(parts)


def digest(key: str) -> str:
    import zlib  # a builtin module: hashlib would load OpenSSL

    data = key.encode("utf-8", "surrogateescape")
    return f"{zlib.crc32(data):08x}{zlib.adler32(data):08x}"


def socket_path(directory: str, key: str) -> str:
    return os.path.join(directory, f"{digest(key)}.sock")


def lock_path(socket_file: str) -> str:
    """The file a warm process holds locked while it runs (it holds its process id)."""
    return socket_file[:-len(".sock")] + ".lock"


def server_pid(socket_file: str) -> int | None:
    """The process id of the warm process for ``socket_file``, None where none holds its lock."""
    import fcntl

    try:
        with open(lock_path(socket_file), "r+") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError:
                return int(lock.read().strip() or 0) or None
            return None
    except (OSError, ValueError):
        return None


# --- messages: a length, then marshal's bytes ------------------------------------------------------------

def send_message(connection: socket.socket, message, fds: list[int] = ()) -> None:
    import marshal

    data = marshal.dumps(message)
    data = len(data).to_bytes(4, "big") + data
    sent = socket.send_fds(connection, [data], list(fds)) if fds else connection.send(data)
    if sent < len(data):
        connection.sendall(data[sent:])


def receive_message(connection: socket.socket, max_fds: int = 0):
    """(message, fds), or (None, fds) at the end of the stream."""
    import marshal

    data, fds = b"", []
    while len(data) < 4 or len(data) < 4 + int.from_bytes(data[:4], "big"):
        if max_fds and not fds:
            chunk, fds, _, _ = socket.recv_fds(connection, 65536, max_fds)
        else:
            chunk = connection.recv(65536)
        if not chunk:
            return None, fds
        data += chunk
    return marshal.loads(data[4:4 + int.from_bytes(data[:4], "big")]), fds


def peer_uid(connection: socket.socket) -> int:
    credentials = connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)  # struct ucred: pid, uid, gid
    return int.from_bytes(credentials[4:8], sys.byteorder)


# --- the client ----------------------------------------------------------------------------------------

class Unavailable(Exception):
    """The warm path failed before the command started: run it here (``SIMDB_WARM=require``: say why)."""


def run_warm(argv: list[str], started: float, *, require: bool = False) -> int | None:
    """Run the command in the warm process: its exit code; None where it must run here (nothing ran)."""
    try:
        if idle_seconds() in (None, 0.0):
            raise Unavailable(f"{IDLE_ENV}={os.environ.get(IDLE_ENV)!r} asks for no warm process")
        directory = warm_directory()
        if directory is None:
            raise Unavailable("no private directory for its socket (set SIMDB_WARM_DIR to one of yours, mode 0700)")
        key = warm_key()
        path = socket_path(directory, key)
        connection = _connect(path, key, require)
        try:
            return _converse(connection, argv, key, started)
        finally:
            connection.close()
    except Unavailable as why:
        if require:
            sys.stderr.write(f"Error: no warm simdb process: {why}\n")
            return 1
        return None


def _connect(path: str, key: str, require: bool) -> socket.socket:
    deadline = _now() + START_TIMEOUT
    while True:
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        connection.settimeout(CONNECT_TIMEOUT)
        try:
            connection.connect(path)
            if peer_uid(connection) != os.getuid():
                raise Unavailable(f"{path} is served by another user")
            return connection
        except (OSError, ValueError) as error:
            connection.close()
            if isinstance(error, socket.timeout):
                raise Unavailable(f"{path} did not answer") from None
            if server_pid(path) is None:
                start_server(path, key)
            if not require or _now() > deadline:
                raise Unavailable(f"none was up at {path}; one is starting") from None
            import time

            time.sleep(0.05)


def _converse(connection: socket.socket, argv: list[str], key: str, started: float) -> int:
    import signal

    umask = os.umask(0o022)
    os.umask(umask)
    try:
        here = os.open(".", os.O_RDONLY | os.O_DIRECTORY)
    except OSError as error:
        raise Unavailable(f"cannot open the working directory: {error.strerror}") from None
    try:
        request = {"key": key, "argv": list(argv), "environ": dict(os.environb), "umask": umask, "started": started}
        try:
            connection.settimeout(READY_TIMEOUT)
            send_message(connection, request, [0, 1, 2, here])
            ready, _ = receive_message(connection)
        except (OSError, ValueError, EOFError) as error:
            raise Unavailable(f"the warm process failed: {error}") from None
    finally:
        os.close(here)
    if not (isinstance(ready, tuple) and ready[:1] == ("ready",)):
        raise Unavailable("the warm process refused the command" if ready else "the warm process closed")
    child = ready[1]

    def forward(number, frame):
        try:
            os.kill(child, number)
        except OSError:
            pass

    before = {name: signal.signal(getattr(signal, name), forward) for name in FORWARDED_SIGNALS}
    try:
        send_message(connection, "go")
    except OSError as error:
        for name, handler in before.items():  # the command runs here after all: Ctrl-C is its own again
            signal.signal(getattr(signal, name), handler)
        raise Unavailable(f"the warm process failed: {error}") from None
    # the command runs from here: no falling back, and no timeout
    connection.settimeout(None)
    try:
        status, _ = receive_message(connection)
    except (OSError, ValueError, EOFError):
        status = None
    if not isinstance(status, tuple) or status[0] not in ("exit", "signal"):
        sys.stderr.write(f"Error: lost the warm simdb process running this command (pid {child}); its exit "
                         "status is unknown\n")
        return 1
    if status[0] == "signal":
        try:
            signal.signal(status[1], signal.SIG_DFL)
        except (OSError, ValueError):  # SIGKILL (the OOM killer's) has no handler to reset
            pass
        os.kill(os.getpid(), status[1])
        return 128 + status[1]
    return status[1]


def start_server(path: str, key: str) -> None:
    """Start the warm process for ``path`` in the background (a new session, its standard streams /dev/null)."""
    flags, options = [], sys.orig_argv[1:]
    while options and options[0].startswith("-") and options[0] not in ("-m", "-c", "-"):
        takes_value = options[0] in ("-X", "-W", "--check-hash-based-pycs")
        flags += options[:1 + takes_value]
        options = options[1 + takes_value:]
    package = os.path.dirname(package_directory())
    code = (f"import sys\nif not getattr(sys.flags, 'safe_path', False): sys.path[0] = {package!r}\n"
            "from simdb.warm import serve\nserve()")
    null = os.open(os.devnull, os.O_RDWR)
    try:
        # none of simdb's open files stays open in it: a caller waiting for the end of a pipe it gave simdb
        # (as fd 3, say) would wait for the warm process to stop
        others = [int(fd) for fd in os.listdir("/proc/self/fd") if int(fd) > 2 and int(fd) != null]
    except OSError:
        others = []
    actions = [(os.POSIX_SPAWN_DUP2, null, fd) for fd in (0, 1, 2)] + [(os.POSIX_SPAWN_CLOSE, fd) for fd in others]
    try:
        os.posix_spawn(sys.executable, [sys.executable, *flags, "-c", code, path], os.environ,
                       file_actions=actions, setsid=True)
    except OSError:
        pass
    finally:
        os.close(null)
