"""The warm command process that ``simdb`` (:mod:`simdb.launch`) hands its commands to.

It imports simdb's command line and database layer once (:data:`PRELOAD`), listens on its Unix socket, and
forks a child per command; the child takes over the caller's standard streams, working directory,
environment and umask and runs the same click ``main``; the warm process sends back its exit status (or the
signal that ended it). It stops after its idle time, or once its key is stale and its commands have ended.
"""

from __future__ import annotations

import os
import socket
import sys

from .launch import (GO_TIMEOUT, READY_TIMEOUT, STALE_CHECK_SECONDS, idle_seconds, lock_path, peer_uid,
                     receive_message, send_message, socket_path, warm_key)

#: What the warm process imports once: what a command on an index loads, and the segmenter of Chinese text
#: (rjieba builds its dictionary at import: 0.3 s) and OpenCC's binding. Modules only: their data (OpenCC's
#: dictionaries, the character tables) load in each command, as before.
PRELOAD = ("simdb.cli", "simdb.index", "simdb.pg.database", "simdb.pg.reads", "simdb.pg.embedded",
           "sqlalchemy.dialects.postgresql.psycopg", "psycopg", "rjieba", "opencc")


class _Child(BaseException):
    """Raised in a forked child to leave the warm process's loop (and its clean-up) behind."""

    def __init__(self, connection: socket.socket, request: dict, fds: list[int]):
        super().__init__()
        self.connection, self.request, self.fds = connection, request, fds


def serve() -> None:
    """The warm process's main: serve commands on the socket named by ``sys.argv[1]`` until idle."""
    path = sys.argv[1]
    os.chdir("/")
    try:
        child = _serve(path)
    except _Child as child_:
        child = child_
    if child is not None:
        _run_child(child)


def _serve(path: str):
    import contextlib
    import fcntl
    import importlib
    import signal
    import time

    lock = open(lock_path(path), "a+")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return None  # another warm process has it
    key, idle = warm_key(), idle_seconds()
    if socket_path(os.path.dirname(path), key) != path or not idle:
        return None  # started for another key (or none wanted)
    lock.truncate(0)
    lock.write(f"{os.getpid()}\n")
    lock.flush()
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:  # not installed, or broken: the command that needs it says so, as in its own process
            pass
    import gc

    gc.freeze()  # what is imported stays out of the children's collections: their pages stay shared
    server = os.getpid()
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda number, frame: None)
    signal.signal(signal.SIGTERM, lambda number, frame: sys.exit(0))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    running: dict[int, socket.socket] = {}  # the children running commands, with their simdb's connection
    abandoned: set[int] = set()  # those whose simdb went away
    quiet: dict[int, float] = {}  # when to look again at a connection with something to read
    try:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        old_umask = os.umask(0o177)
        try:
            listener.bind(path)
        finally:
            os.umask(old_umask)
        listener.listen(64)
        last, checked, stale = time.monotonic(), time.monotonic(), False
        while True:
            now = time.monotonic()
            if not stale and now - checked >= STALE_CHECK_SECONDS:
                checked = now
                if warm_key() != key:  # no more commands; stop once those running have ended
                    stale = True
                    with contextlib.suppress(OSError):
                        os.unlink(path)
                    listener.close()
            if not running and (stale or now - last >= idle):
                break
            wait = STALE_CHECK_SECONDS if running else min(STALE_CHECK_SECONDS, idle - (now - last))
            if any(until > now for until in quiet.values()):
                wait = min(wait, 1.0)
            # a connection is watched for simdb's end; "go" on it is the child's to read: look again in a second
            watched = [connection for pid, connection in running.items()
                       if pid not in abandoned and quiet.get(pid, 0.0) <= now]
            readable = _readable([wake_read, *watched, *([] if stale else [listener])], max(0.0, wait))
            if wake_read in readable:
                os.read(wake_read, 4096)
            for pid, connection in running.items():
                if connection in readable:
                    there = _still_there(connection)
                    if there is None:
                        quiet[pid] = time.monotonic() + 1.0
                    elif not there:
                        abandoned.add(pid)
                        _signal(pid, signal.SIGTERM)  # simdb was killed: so is its command, as it would have been
            for pid, connection in list(running.items()):
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    code = os.waitstatus_to_exitcode(status)
                    try:
                        connection.settimeout(READY_TIMEOUT)
                        send_message(connection, ("exit", code) if code >= 0 else ("signal", -code))
                    except OSError:
                        pass
                    connection.close()
                    del running[pid]
                    abandoned.discard(pid)
                    quiet.pop(pid, None)
                    last = time.monotonic()
            if listener in readable:
                last = time.monotonic()
                try:
                    connection, _ = listener.accept()
                except OSError:
                    continue
                pid = _accept(connection, key)
                if pid:
                    # watched without waiting: a timeout's wait (Python polls before it reads) would hold the
                    # whole loop whenever the child read "go" between select and the look
                    connection.setblocking(False)
                    running[pid] = connection
                else:
                    connection.close()
    finally:
        if os.getpid() == server:
            try:
                os.unlink(path)  # ours: the lock is held until this process ends
            except OSError:
                pass
            listener.close()
        else:  # a forked child on its way to run its command: nothing of the warm process's stays open in it
            listener.close()
            for other in running.values():
                other.close()
            os.close(wake_read)
            os.close(wake_write)
            lock.close()
    return None


def _readable(watched: list, timeout: float) -> list:
    """Those of ``watched`` (file descriptors, or objects with ``fileno()``) with something to read, or at their
    end, after waiting at most ``timeout`` seconds. ``poll``, not ``select``: a process with more than 1,024 files
    open gets descriptors that ``select`` refuses (ValueError), and the warm process (one connection per running
    command) or a child forked from it may hold that many."""
    import select

    poller = select.poll()
    by_descriptor = {}
    for item in watched:
        descriptor = item if isinstance(item, int) else item.fileno()
        by_descriptor[descriptor] = item
        poller.register(descriptor, select.POLLIN)
    return [by_descriptor[descriptor] for descriptor, _ in poller.poll(timeout * 1000)]


def _still_there(connection: socket.socket) -> bool | None:
    """Whether the ``simdb`` on ``connection`` is still there; None where it said something (left unread)."""
    try:
        return None if connection.recv(1, socket.MSG_DONTWAIT | socket.MSG_PEEK) else False
    except (BlockingIOError, TimeoutError):
        return True
    except OSError:
        return False


def _signal(pid: int, number: int) -> None:
    try:
        os.kill(pid, number)
    except OSError:
        pass


def _accept(connection: socket.socket, key: str) -> int | None:
    """Fork a child for the command on ``connection``: its process id (None where the command was refused). In
    the child, raises :class:`_Child`."""
    fds: list[int] = []
    pid = None
    try:
        connection.settimeout(READY_TIMEOUT)
        if peer_uid(connection) != os.getuid():
            return None  # another user's: not a word to it
        request, fds = receive_message(connection, max_fds=4)
        if not isinstance(request, dict) or request.get("key") != key or len(fds) != 4:
            if request is not None:
                send_message(connection, ("stale",))
        else:
            pid = os.fork()
    except (OSError, ValueError, EOFError):
        pass
    if pid == 0:
        raise _Child(connection, request, fds)
    for fd in fds:
        os.close(fd)
    return pid


def _run_child(child: _Child) -> None:
    """In the forked child: say ready, wait for go, take over the command's streams and context, run it."""
    import signal
    import time

    signal.set_wakeup_fd(-1)
    for name in ("SIGCHLD", "SIGTERM", "SIGHUP"):
        signal.signal(getattr(signal, name), signal.SIG_DFL)
    connection, request = child.connection, child.request
    try:
        send_message(connection, ("ready", os.getpid()))
        go = _wait_for_go(connection)
    except (OSError, ValueError, EOFError):
        go = None
    if go != "go":  # simdb went away, or said something else: it runs nothing, and neither does this child
        os._exit(1)
    # keep the connection open (not inherited by programs it starts): its end tells simdb the command ended
    connection.detach()
    stdin, stdout, stderr, here = child.fds
    for fd, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
        os.dup2(fd, target)
    os.fchdir(here)
    for fd in child.fds:
        os.close(fd)
    os.umask(request["umask"])
    os.environ.clear()
    os.environb.update(request["environ"])
    time.tzset()
    sys.argv = list(request["argv"])
    sys.stdin, sys.stdout, sys.stderr = (_stdio(0, False, sys.stdin), _stdio(1, True, sys.stdout),
                                         _stdio(2, True, sys.stderr))
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr
    from .cli import main as run_command

    try:
        run_command(request["started"])
        code = 0
    except SystemExit as exit:
        code = _exit_code(exit.code)
    except BaseException as error:  # what the interpreter does with an uncaught exception
        sys.excepthook(type(error), error, error.__traceback__)
        if isinstance(error, KeyboardInterrupt):
            _finish(130)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        code = 1
    _finish(code)


def _wait_for_go(connection: socket.socket):
    """simdb's answer to "ready", waited for as long as that ``simdb`` is there: one stopped between the two
    (Ctrl-Z, a debugger, a machine too loaded to schedule it) says "go" when it continues, and its command must
    run then (a child that gave up after :data:`GO_TIMEOUT` made it exit 1 without running). A ``simdb`` that
    ends closes its connection (an end of file here, and the warm process sends this child SIGTERM); every
    :data:`GO_TIMEOUT` seconds the child also looks whether the process that connected is still there."""
    client = int.from_bytes(connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)[:4], sys.byteorder)
    while not _readable([connection], GO_TIMEOUT):
        if not _process_exists(client):
            return None
    connection.settimeout(GO_TIMEOUT)  # the message is on its way: a few bytes sent at once
    go, _ = receive_message(connection)
    return go


def _process_exists(pid: int) -> bool:
    if pid <= 0:  # not known (a peer in another PID namespace): the connection's end will tell
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # there, and another user's (a pid reused): the connection's end will tell
        pass
    return True


def _exit_code(code) -> int:
    """The exit status of ``sys.exit(code)``, as the interpreter makes it (a message is printed, status 1)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        sys.stderr.write(f"{code}\n")
    except Exception:
        pass
    return 1


def _finish(code: int) -> None:
    """End the child as the interpreter's finalization would, less its tear-down of every module: that touches
    every object the warm process imported, copying each page the fork shared (most of a second of CPU).
    What a command can see of the tear-down is kept: waiting for its threads, the ``atexit`` functions, the
    final flush of the standard streams (status 120 where it fails, as Python's)."""
    import threading

    threading._shutdown()  # what Py_FinalizeEx calls first: join the non-daemon threads
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception as error:
            code = 120
            try:
                sys.stderr.write(f"Exception ignored in: {stream!r}\n{type(error).__name__}: {error}\n")
            except Exception:
                pass
    os._exit(code)


def _stdio(fd: int, writing: bool, like):
    """A standard stream on ``fd`` as Python's start-up makes one (pylifecycle.c's create_stdio)."""
    import io

    buffered = not (writing and like.write_through)  # -u or PYTHONUNBUFFERED (in the key) made it so
    raw = io.FileIO(fd, "wb" if writing else "rb", closefd=False)
    raw.name = {0: "<stdin>", 1: "<stdout>", 2: "<stderr>"}[fd]
    buffer = raw if writing and not buffered else (io.BufferedWriter(raw) if writing else io.BufferedReader(raw))
    stream = io.TextIOWrapper(buffer, encoding=like.encoding, errors=like.errors, newline="\n",
                              line_buffering=buffered and (fd == 2 or raw.isatty()), write_through=not buffered)
    stream.mode = "w" if writing else "r"
    return stream
