"""One error base for everything simdb reports to a user.

Every message says what went wrong, where (file and line, or the setting), and
what to do about it. The CLI prints ``str(error)`` as a single line and exits
non-zero; nothing else is needed to act on it.
"""

from __future__ import annotations


class SimdbError(Exception):
    """Base class: the message is meant for the person running simdb."""


class InputError(SimdbError):
    """A document in an input file (or passed to the API) cannot be indexed."""

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None,
                 hint: str | None = None) -> None:
        self.path = path
        self.line = line
        self.reason = message
        self.hint = hint
        where = ""
        if path is not None:
            where = f"{path}:{line}: " if line is not None else f"{path}: "
        text = f"{where}{message}"
        if hint:
            text = f"{text} ({hint})"
        super().__init__(text)


class DatabaseUnavailable(SimdbError):
    """The PostgreSQL server cannot be reached or refused the connection."""


class IndexNotFound(SimdbError):
    """There is no simdb index where one was expected."""


class IncompatibleIndex(SimdbError):
    """The stored index was built with other settings or by another simdb version.

    Opening it anyway would give silently different answers, so simdb refuses.
    """


class BatchError(SimdbError):
    """A batch cannot be ingested as given (name taken, ids already stored, ...)."""
