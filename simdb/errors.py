"""One error base for everything simdb reports to a user.

Every message says what went wrong, where (file and line, or the setting), and
what to do about it. The CLI prints ``str(error)`` as a single line and exits
non-zero; nothing else is needed to act on it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

#: How a message names a parameter: «batch». The library shows it as `batch`; the CLI as its flag (--batch).
_PARAMETER = re.compile("«([a-z_]+)»")
#: A parameter as the library shows it, in an input error's hint (``InputError.hint``, and as ``records`` keep it).
_SHOWN = re.compile("`([a-z_]+)`")


def parameter(name: str) -> str:
    """A parameter's name inside an error message, shown as the caller knows it (see :class:`SimdbError`)."""
    return f"«{name}»"


class SimdbError(Exception):
    """Base class: the message is meant for the person running simdb.

    ``kept`` is set on an error that stopped an ingest after some of its chunks were committed.
    """

    kept: "KeptBatch | None" = None

    def __str__(self) -> str:
        return _PARAMETER.sub(r"`\1`", super().__str__())

    def message(self, spell: Callable[[str], str]) -> str:
        """The message with each parameter it names spelt by ``spell`` (the CLI: its flags)."""
        return _PARAMETER.sub(lambda match: spell(match.group(1)), super().__str__())


class Row(int):
    """A row of a Parquet file, counted from 1. It goes wherever a line number goes (an error's ``line``, the
    rejects' and verdicts' ``line``), and a message says it as ``path, row N``."""

    __slots__ = ()


def place(path: str, line: int | None) -> str:
    """``path:line``, ``path, row N`` for a :class:`Row`, or the path alone."""
    if line is None:
        return path
    return f"{path}, row {line}" if isinstance(line, Row) else f"{path}:{line}"


def respell(hint: str | None, spell: Callable[[str], str] | None) -> str | None:
    """An input error's hint (as ``InputError.hint`` and the ``records`` table have it, each parameter it names
    shown `name`) with each parameter spelt by ``spell`` (the CLI: its flags); ``spell`` None: as it is."""
    return hint if hint is None or spell is None else _SHOWN.sub(lambda match: spell(match.group(1)), hint)


class InputError(SimdbError):
    """A document in an input file (or passed to the API) cannot be indexed; ``external_id`` is its id where
    that could be read (a rejected record keeps it)."""

    external_id: str | None = None

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None,
                 hint: str | None = None) -> None:
        self.path = path
        self.line = line
        self.reason = _PARAMETER.sub(r"`\1`", message)
        self.hint = None if hint is None else _PARAMETER.sub(r"`\1`", hint)
        where = ""
        if path is not None:
            where = place(path, line) + ": "
        text = f"{where}{message}"
        if hint:
            text = f"{text} ({hint})"
        super().__init__(text)


class OutputError(SimdbError):
    """A file simdb was asked to write cannot be written there (or is an input it would destroy).

    ``again`` says how to get the file once the cause is fixed, where its content is kept elsewhere (an
    ingest's verdicts, in the database)."""

    again: str | None = None

    def __init__(self, message: str, *, path: str | None = None, hint: str | None = None) -> None:
        self.path = path
        text = f"{path}: {message}" if path is not None else message
        super().__init__(f"{text} ({hint})" if hint else text)


class DatabaseUnavailable(SimdbError):
    """The PostgreSQL server cannot be reached or refused the connection."""


class ConnectionLost(DatabaseUnavailable):
    """The connection to PostgreSQL broke during an operation (the server restarted, the session was ended, the
    network dropped): what the operation committed stays, and running it again may succeed."""


class NotFound(SimdbError):
    """What a call names is not stored: a batch, a document, a sync source (or, as :class:`IndexNotFound`, the
    index itself)."""


class IndexNotFound(NotFound):
    """There is no simdb index where one was expected."""


class IncompatibleIndex(SimdbError):
    """The stored index was built with other settings or by another simdb version.

    Opening it anyway would give silently different answers, so simdb refuses.
    """


class BatchError(SimdbError):
    """A batch cannot be ingested as given (name taken, ids already stored, ...)."""


class PermissionDenied(SimdbError):
    """The database role may not do this (a read-only role asked to write, a schema it was not granted)."""


@dataclass(frozen=True)
class KeptBatch:
    """What an interrupted ingest left stored: its batch goes on from ``position`` when resumed."""

    batch: str
    position: int  # input records consumed by the committed chunks
    documents: int  # documents the batch holds
    complete: bool = False  # every chunk is stored: the error came after the last one committed

    def describe(self) -> str:
        if self.complete:
            return (f"batch {self.batch!r} is stored whole ({self.documents:,} documents from the first "
                    f"{self.position:,} input records)")
        return (f"batch {self.batch!r} keeps what its committed chunks stored ({self.documents:,} documents from "
                f"the first {self.position:,} input records): it can be resumed once the cause is fixed, or removed")
