"""How an ingest runs (:class:`IngestOptions`): what the command line reads before any work starts.

Kept apart from :mod:`simdb.ingest`, which loads the database layer, so that ``simdb --help`` and
``simdb fingerprint`` start without it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from .inputs import DEFAULT_MAX_CHARS
from .settings import connections_problem

DEFAULT_CHUNK_SIZE = 100_000
ON_ERROR = ("stop", "skip")
#: What a sync run does with a row whose text changed since it was ingested (:mod:`simdb.sync`), and how many
#: rows it fetches from the source at a time.
ON_CHANGE = ("keep", "replace")
DEFAULT_ITERSIZE = 2000


@dataclass(frozen=True)
class IngestOptions:
    batch: str | None = None
    source: str = "api"
    #: ``stop`` at the first bad record, or ``skip`` it (written to ``rejects``) and go on.
    on_error: str = "stop"
    rejects: str | Path | None = None
    #: Where to write every record's verdict as JSON lines (see :mod:`simdb.verdicts`), or None.
    verdicts: str | Path | None = None
    max_chars: int = DEFAULT_MAX_CHARS
    chunk_size: int = DEFAULT_CHUNK_SIZE
    workers: int | None = 1
    #: How many database connections a chunk's lookups into the archive's large segments are spread over
    #: (:mod:`simdb.pg.spread`); None: as many as the machine has cores, within the server's
    #: ``max_parallel_workers`` (:func:`simdb.pg.spread.default_connections`).
    connections: int | None = None
    resume: bool = False
    #: Merge segments after each chunk when the index's policy asks for it (see :mod:`simdb.pg.segments`).
    compact: bool = True
    #: How the verdicts and rejects files spell a parameter that a reject's hint names: the CLI passes its
    #: flags (``--text-field``); None keeps the API's `text_field`.
    spell: Callable[[str], str] | None = None
    #: Called in each chunk's transaction: ``before_chunk(connection, chunk)`` before the chunk is stored (a sync
    #: run replacing changed documents; true when it changed stored documents), ``after_chunk(connection, position)`` once it is, ``position`` being the
    #: input records the batch has consumed (a sync run's watermark, committed with the chunk).
    before_chunk: Callable | None = None
    after_chunk: Callable | None = None
    #: The items of a resumed batch start after the records it consumed (a sync run reads its source past the
    #: watermark), rather than at its first record.
    items_follow_position: bool = False

    def __post_init__(self) -> None:
        if self.on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {', '.join(ON_ERROR)}, not {self.on_error!r}")
        if self.chunk_size < 1 or self.max_chars < 1:
            raise ValueError("chunk_size and max_chars must be positive")
        if (problem := connections_problem(self.connections)) is not None:
            raise ValueError(f"connections {problem}")

    @property
    def batch_name(self) -> str:
        return self.batch or datetime.now(timezone.utc).strftime("batch-%Y%m%dT%H%M%S.%fZ")

    def rejects_file(self, batch: str) -> str:
        """Where the rejects of ``batch`` go (with ``on_error="skip"``)."""
        return str(self.rejects or f"rejects-{batch}.jsonl")
