"""The files simdb writes: exports, reports, plots, and the verdicts and rejects files of an ingest.

One set of rules for every command that writes a file (docs/cli.md, "Output files"):

- A path that is a regular file, or nothing yet, gets its new content whole or not at all
  (:func:`written`): it goes into a temporary file beside the final file, under a name no other file
  has, which is renamed over it once complete and synced to disk, with the permissions the file had
  (a new one: 0666 less the umask). Symlinks are followed: a link keeps pointing where it did, and
  its target gets the content.
- Anything else, a device (``/dev/null``), a FIFO or standard output (``/dev/stdout``), is written
  into as a stream: nothing is renamed, truncated or created there. A path that is the file standard
  output or standard error already writes to is written through that stream.
- A failed write removes the temporary file it made and nothing else: simdb writes no file besides
  the one asked for and its own temporary file.
- A folder, a path in a folder that does not exist, or one simdb may not write is refused before
  any work (:func:`check`); so is an output that is the same file as an input, or as another output,
  compared by device and inode, so that a symlink or a hard link to an input is caught
  (:func:`refuse_aliases`).
- A file written piece by piece, the verdicts and rejects of an ingest (:class:`Appended`), is
  opened once, truncated, and flushed and synced to disk after each piece.

Any OSError while writing is an :class:`~simdb.errors.OutputError`: one line with the file and the
reason.
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import IO

from .errors import OutputError, parameter

#: The standard streams an output may already be (``--output /dev/stdout``, or the file stdout goes to).
_STREAMS = {1: "standard output", 2: "standard error"}


@dataclass(frozen=True)
class Target:
    """Where an output path leads."""

    path: str  #: as given
    final: str  #: with every symlink resolved: the file that gets the content
    what: str  #: what it is, for messages: "export", "verdicts file", ...
    status: os.stat_result | None  #: of the file there now (None: nothing yet)
    stream: int | None = None  #: the standard stream (1 or 2) that already writes to this file

    @property
    def whole(self) -> bool:
        """Written whole or not at all: a regular file, or nothing yet."""
        return self.stream is None and (self.status is None or stat.S_ISREG(self.status.st_mode))

    def error(self, error: OSError) -> OutputError:
        return OutputError(f"cannot write the {self.what}: {error.strerror or error}", path=self.path)


def check(path: str | os.PathLike, what: str, option: str = "output") -> Target:
    """Where ``path`` leads, or OutputError when nothing can be written there (``option`` names the parameter
    that gave it, so that the message says what to change)."""
    path = os.fspath(path)
    refuse = f"choose another {parameter(option)} file"
    try:
        status = os.stat(path)  # through every symlink, /dev/stdout's too
    except FileNotFoundError:
        status = None
    except OSError as error:
        raise OutputError(f"cannot write the {what} there: {error.strerror}", path=path, hint=refuse) from None
    final = os.path.realpath(path)
    folder = os.path.dirname(final)
    if status is not None and stat.S_ISDIR(status.st_mode):
        raise OutputError(f"cannot write the {what} there: it is a folder", path=path, hint=refuse)
    if status is None and not os.path.isdir(folder):
        raise OutputError(f"cannot write the {what} there: the folder does not exist", path=path,
                          hint=f"create the folder, or {refuse}")
    if not os.access(path if status is not None else folder, os.W_OK) or \
            (status is not None and stat.S_ISREG(status.st_mode) and not os.access(folder, os.W_OK)):
        raise OutputError(f"cannot write the {what} there: permission denied", path=path,
                          hint=f"check the permissions, or {refuse}")
    stream = next((number for number in _STREAMS if status is not None and _same(status, _fd_status(number))), None)
    return Target(path, final, what, status, stream)


@contextlib.contextmanager
def written(path: str | os.PathLike, what: str, *, option: str = "output", binary: bool = False,
            target: Target | None = None) -> Iterator[IO]:
    """A file to write ``path``'s whole content into, by the module's rules: it replaces a regular file when the
    block ends without an error, or streams into anything else. ``target``: ``check``'s answer, if it was
    asked before (to refuse a bad path before long work)."""
    target = target or check(path, what, option)
    if not target.whole:
        with _opened_stream(target, binary) as file:
            yield file
        return
    folder, name = os.path.split(target.final)
    try:
        descriptor, temporary = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=".tmp")
    except OSError as error:
        raise target.error(error) from None
    try:
        with os.fdopen(descriptor, "wb" if binary else "w", **({} if binary else {"encoding": "utf-8",
                                                                                  "newline": ""})) as file:
            yield file
            file.flush()
            os.fsync(file.fileno())
        _keep_permissions(temporary, target.status)
        os.replace(temporary, target.final)
        _sync_folder(folder)
    except OSError as error:
        raise target.error(error) from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(temporary)  # ours, and only there when something failed


class Appended:
    """A file written piece by piece (an ingest's verdicts or rejects, after each chunk): opened at the first
    piece, truncated, and flushed and synced to disk after each one, so that it holds every piece written so
    far whatever stops the process. It follows symlinks and writes into a device or FIFO as into a file."""

    def __init__(self, path: str | os.PathLike, what: str, option: str) -> None:
        self.target = check(path, what, option)
        self.path = self.target.path
        self._file: IO | None = None

    def write(self, pieces: Iterable[str]) -> None:
        """Append the strings ``pieces`` (the first call truncates the file, or creates it)."""
        try:
            if self._file is None:
                self._file = _open_stream(self.target, binary=False)
            self._file.writelines(pieces)
            self._file.flush()
            if self.target.whole:
                os.fsync(self._file.fileno())
        except OSError as error:
            self._abandon()
            raise self.target.error(error) from None

    def close(self) -> None:
        if self._file is not None:
            file, self._file = self._file, None
            try:
                file.close()
            except OSError as error:
                raise self.target.error(error) from None

    def _abandon(self) -> None:
        """Close the file after a failed write, dropping what its buffer still holds (it would fail again)."""
        if self._file is not None:
            with contextlib.suppress(OSError):
                os.close(self._file.fileno())
            with contextlib.suppress(OSError, ValueError):
                self._file.close()
            self._file = None


def refuse_aliases(outputs: dict[str, str | os.PathLike | None], inputs: Iterable[str | os.PathLike],
                   *, stdout: bool = False) -> None:
    """OutputError if an output is the same file as an input, or as another output, before anything is written
    or stored. ``outputs`` maps each output's parameter name to its path (None: not asked for); files are
    compared by device and inode, through symlinks and hard links. With ``stdout``, standard output is an
    output too (``simdb check in.jsonl >> in.jsonl`` would read what it appends)."""
    read = {}
    for path in inputs:
        with contextlib.suppress(OSError):
            read.setdefault(_identity(os.stat(path)), os.fspath(path))
    written_to: dict[tuple, str] = {}
    candidates = [(parameter(name), path) for name, path in outputs.items() if path is not None]
    status = _fd_status(1) if stdout else None
    if status is not None and stat.S_ISREG(status.st_mode):
        candidates.append(("standard output", None))
    for name, path in candidates:
        try:
            status = os.stat(path) if path is not None else _fd_status(1)
        except FileNotFoundError:  # a new file: another output may name it too
            status = None
        except OSError:
            continue  # check() says what is wrong with it
        if status is not None and not stat.S_ISREG(status.st_mode):
            continue  # two outputs into /dev/null are fine
        key = _identity(status) if status is not None else ("new", os.path.realpath(path))
        shown = f"{name} {path}" if path is not None else name
        if key in read:
            raise OutputError(f"{shown} is the input file {read[key]} (the same file{_by_link(path, read[key])}): "
                              "writing it would destroy the input",
                              hint=f"choose another {name} file" if path is not None else
                              "send standard output to another file")
        if key in written_to:
            raise OutputError(f"{shown} is the same file as {written_to[key]}: one would overwrite the other",
                              hint=f"choose another {name} file")
        written_to[key] = name


def _by_link(path: str | None, source: str) -> str:
    """How an output path is an input file other than by its name."""
    if path is None or os.path.abspath(path) == os.path.abspath(source):
        return ""
    return ", through a symlink" if os.path.realpath(path) == os.path.realpath(source) else ", through a hard link"


def _identity(status: os.stat_result) -> tuple[int, int]:
    return status.st_dev, status.st_ino


def _same(status: os.stat_result, other: os.stat_result | None) -> bool:
    return other is not None and _identity(status) == _identity(other)


def _fd_status(number: int) -> os.stat_result | None:
    try:
        return os.fstat(number)
    except OSError:
        return None


def _open_stream(target: Target, binary: bool) -> IO:
    """``target`` opened to be written into as it is: a standard stream through a copy of its descriptor (so
    that closing it leaves the stream open, and output to it stays in order), anything else by its path."""
    options = {} if binary else {"encoding": "utf-8", "newline": ""}
    if target.stream is not None:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError, AttributeError):
                stream.flush()
        return os.fdopen(os.dup(target.stream), "wb" if binary else "w", **options)
    return open(target.final if target.whole else target.path, "wb" if binary else "w", **options)


@contextlib.contextmanager
def _opened_stream(target: Target, binary: bool) -> Iterator[IO]:
    try:
        file = _open_stream(target, binary)
    except OSError as error:
        raise target.error(error) from None
    try:
        yield file
        file.flush()
    except OSError as error:
        with contextlib.suppress(OSError):
            os.close(file.fileno())  # what the buffer still holds would fail again
        raise target.error(error) from None
    finally:
        with contextlib.suppress(OSError, ValueError):
            file.close()


def _keep_permissions(path: str, status: os.stat_result | None) -> None:
    """Give the new file the old one's permissions (and owner, where simdb may), or a new file's default."""
    if status is None:
        os.chmod(path, 0o666 & ~_umask())
        return
    os.chmod(path, stat.S_IMODE(status.st_mode))
    if (status.st_uid, status.st_gid) != (os.getuid(), os.getgid()):
        with contextlib.suppress(OSError):
            os.chown(path, status.st_uid, status.st_gid)


def _umask() -> int:
    """The process's umask, read without changing it where the system tells it (Linux)."""
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _sync_folder(folder: str) -> None:
    """Make the rename durable (where the system lets a folder be synced)."""
    with contextlib.suppress(OSError):
        descriptor = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
