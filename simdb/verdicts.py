"""What became of every input record: one verdict each, in input order.

A verdict says whether a record was stored as ``new``, as an ``exact`` or a ``near`` duplicate (and
of which stored document), was ``already_stored`` (the same id with the same text), or was
``rejected`` (and why). ``simdb ingest --verdicts`` writes them from the ``records`` table, which is
written in the same transaction as each chunk; ``simdb check`` computes the same verdicts without
storing anything.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import InputError, OutputError, respell
from .methods import Method
from . import jsonlines, outputs

if TYPE_CHECKING:  # the database layer loads where verdicts are read from it, not for the CLI's --status choices
    import sqlalchemy as sa

STATUSES = ("new", "exact", "near", "already_stored", "rejected")


@dataclass(frozen=True)
class Verdict:
    """One input record's outcome. ``position`` is its 1-based place among the input's records."""

    position: int
    id: str | None
    status: str
    batch: str | None = None
    duplicate_of: str | None = None
    distance: int | None = None
    similarity: float | None = None
    path: str | None = None
    line: int | None = None
    reason: str | None = None
    hint: str | None = None

    def to_json(self, method: Method, spell: Callable[[str], str] | None = None) -> dict:
        """The JSON object of a verdicts file: ``distance`` only where the method measures one in bits; a reject's
        hint names each parameter as ``spell`` spells it (the CLI: its flags), or `name` as the API does."""
        out = {"id": self.id, "status": self.status, "duplicate_of": self.duplicate_of,
               "similarity": self.similarity}
        if method.distance_in_verdicts:
            out["distance"] = self.distance
        out["batch"] = self.batch
        out["position"] = self.position
        if self.status == "rejected":
            out.update(reason=self.reason, path=self.path, line=self.line, hint=respell(self.hint, spell))
        return out


def verdict(method: Method, *, position: int, external_id: str | None, status: str, batch: str | None,
            duplicate_of: str | None = None, distance: int | None = None) -> Verdict:
    """A stored record's verdict; the similarity follows from the distance."""
    similarity = None if distance is None else round(method.similarity(int(distance)), 4)
    return Verdict(position, external_id, status, batch, duplicate_of, None if distance is None else int(distance),
                   similarity)


def rejected(position: int, error: InputError, batch: str | None) -> Verdict:
    return Verdict(position, error.external_id, "rejected", batch, path=error.path,
                   line=error.line, reason=error.reason, hint=error.hint)


def stored_verdicts(connection: sa.Connection, method: Method, batch: str, *, after: int = 0,
                    upto: int | None = None, status: str | None = None):
    """The verdicts of a stored batch at input positions in ``(after, upto]``, in input order, streamed."""
    from .pg import reads

    for row in reads.records(connection, batch, after=after, upto=upto, status=status):
        if row.status == "rejected":
            yield Verdict(row.position, row.external_id, "rejected", batch, path=row.path, line=row.line,
                          reason=row.reason, hint=row.hint)
        else:
            yield verdict(method, position=row.position, external_id=row.external_id, status=row.status,
                          batch=batch, duplicate_of=row.duplicate_of_id, distance=row.distance)


class OutcomeFile:
    """A JSON-lines file of a batch's records written from the ``records`` table: every verdict, or
    only the rejects (in the rejects file's format).

    After each chunk commits, its records are read back from the database and appended; a resumed
    batch first rewrites the file whole from there. So the file never holds a record the database
    lacks, and after a kill ``resume`` (or ``simdb verdicts``) makes it complete again. The file is
    written by the rules of :class:`simdb.outputs.Appended` (symlinks followed, devices and FIFOs
    written into, synced to disk after each chunk).
    """

    def __init__(self, path: str | Path, engine: sa.Engine, method: Method, batch: str, *, what: str,
                 only_rejected: bool = False, spell: Callable[[str], str] | None = None) -> None:
        self.output = outputs.Appended(path, f"{what} file", "rejects" if only_rejected else "verdicts")
        self.path = self.output.path
        self.spell = spell  # how a hint names a parameter (see Verdict.to_json)
        self.engine = engine
        self.method = method
        self.batch = batch
        self.only_rejected = only_rejected
        self.written = 0  # records up to this input position are in the file

    def line(self, item: Verdict) -> dict:
        if self.only_rejected:
            return {"path": item.path, "line": item.line, "reason": item.reason,
                    "hint": respell(item.hint, self.spell), "position": item.position, "id": item.id}
        return item.to_json(self.method, self.spell)

    def sync(self, position: int) -> None:
        """Append the records of input positions up to ``position`` that the file does not hold yet."""
        with self.engine.connect() as connection:
            rows = list(stored_verdicts(connection, self.method, self.batch, after=self.written, upto=position,
                                        status="rejected" if self.only_rejected else None))
        try:
            self.output.write(jsonlines.dumps(self.line(item)) + "\n" for item in rows)
        except OutputError as error:
            error.again = (f"`simdb verdicts --batch {shlex.quote(self.batch)} --status rejected > "
                           f"{shlex.quote(self.path)}` writes the rejects again, as verdicts" if self.only_rejected
                           else f"`simdb verdicts --batch {shlex.quote(self.batch)} > {shlex.quote(self.path)}` "
                                "writes the verdicts file again")
            raise
        self.written = position

    def close(self) -> None:
        self.output.close()


def sync_all(files: list[OutcomeFile], position: int) -> None:
    """Sync every file, even when one of them cannot be written; then raise the first error (its ``again``
    says how to get every file that failed)."""
    failed = []
    for file in files:
        try:
            file.sync(position)
        except OutputError as error:
            failed.append(error)
    if failed:
        failed[0].again = " and ".join(error.again for error in failed)
        raise failed[0]
