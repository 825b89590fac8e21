"""A batch of documents -> rows in the archive, set-based, in atomic chunks.

1. Documents are read lazily and fingerprinted on every core
   (:mod:`simdb.parallel`), outside any transaction.
2. Every ``chunk_size`` documents (and at the end) one transaction takes the
   ingest lock, reserves document ids in input order, binary-COPYs the chunk
   into a temporary staging table, sets aside ids that are already stored,
   finds each document's candidates by joining the staging table on each block
   key against the archive and against the earlier documents of the chunk,
   verifies them by popcount, and inserts the chunk with one
   ``INSERT ... SELECT`` that also points ``duplicate_of`` at the earliest
   near-duplicate. The batch row records the counts and how many input
   records the batch has consumed (``position``).

A batch that fits in one chunk lands whole or not at all. A larger one is
committed chunk by chunk; if it is interrupted (even by SIGKILL) every chunk
is either fully stored or not at all, the batch stays ``running``, and
``resume`` continues after the last stored chunk (of a batch that is complete, it
only writes the verdicts and rejects files again: a kill after the last commit
may have cut them). One process stores a batch at a time: a chunk whose batch
moved on since this process read where it stood is refused. An id that is already
stored with the same text is skipped (counted as ``already_stored``), so
re-running an input stores each document once.

The ingest lock (a transaction advisory lock) serialises the match-and-insert
step of concurrent ingests into one index, so that two batches arriving
together still see each other; fingerprinting, the slow part, stays parallel.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import sqlalchemy as sa

from .errors import InputError, KeptBatch, SimdbError
from .inputs import Document, checks
from .methods import Method
from .parallel import Fingerprinted, fingerprint_stream, key_rows
from .pg import reads
from .pg.chunks import ConcurrentIngest, resume_position, store_chunk
from .pg.segments import compact
from .pg.database import translate
from .verdicts import OutcomeFile, sync_all
from .ingest_options import DEFAULT_CHUNK_SIZE, ON_ERROR, IngestOptions  # noqa: F401 -- and re-exported

#: The first documents of a batch whose texts the method judges (too short for it, or not): a few hundred
#: tokenizations, about 10 ms in the workers that sketch them (in this process, the tokenizer's dictionaries
#: alone took 1.7 s to load); a batch of fewer than SHORT_TEXT_MINIMUM is too small to judge.
SHORT_TEXT_SAMPLE, SHORT_TEXT_MINIMUM = 200, 20

@dataclass
class FingerprintedBatch:
    """A chunk ready for the database: one entry per document, in input order.

    ``sketches`` are unsigned SimHash fingerprints or MinHash signature bytes.
    """

    external_ids: list[str] = field(default_factory=list)
    sketches: list[int | bytes] = field(default_factory=list)
    content_hashes: list[bytes] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    metadata: list[dict] = field(default_factory=list)
    origins: list[str] = field(default_factory=list)
    #: Each document's 1-based position among the batch's input records (default: 1, 2, 3, ...).
    positions: list[int] = field(default_factory=list)
    #: Each sketch's key values as the fingerprinting workers computed them (:attr:`Fingerprinted.keys`), or
    #: empty: then they are computed when the chunk is stored.
    keys: list[bytes] = field(default_factory=list)
    #: Each document's text as UTF-8, when the index keeps texts (``documents.text``), or empty. Bytes, not
    #: str: a str sent to a worker keeps the UTF-8 copy pickling made of it beside its own characters, which
    #: for 100k long Chinese texts came to 660 MB of the CLI's 1.1 GB.
    texts: list[bytes] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.positions:  # built whole rather than appended to: positions 1, 2, 3, ...
            self.positions = list(range(1, len(self.external_ids) + 1))
        if not len(self.external_ids) == len(self.sketches) == len(self.content_hashes) == len(self.lengths) \
                == len(self.metadata) == len(self.origins) == len(self.positions):
            raise ValueError("a FingerprintedBatch needs one id, sketch, content hash, length, metadata, origin and "
                             "position per document")

    def __len__(self) -> int:
        return len(self.external_ids)

    def key_rows(self, method: Method) -> np.ndarray:
        """The sketches' key values, ``(len(self), len(method.key_columns))``."""
        return key_rows(self.keys, self.sketches, method)

    def append(self, external_id: str, sketch: int | bytes, digest: bytes, length: int, metadata: dict,
               origin: str, position: int | None = None, keys: bytes | None = None, text: str | None = None) -> None:
        """Add one document; ``text`` (kept where the index keeps texts) is stored as UTF-8."""
        if keys is not None and len(self.keys) == len(self):
            self.keys.append(keys)  # kept only while every document has them
        if text is not None and len(self.texts) == len(self):
            self.texts.append(text.encode("utf-8"))
        self.external_ids.append(external_id)
        self.sketches.append(sketch)
        self.content_hashes.append(digest)
        self.lengths.append(length)
        self.metadata.append(metadata)
        self.origins.append(origin)
        self.positions.append(len(self.positions) + 1 if position is None else position)


@dataclass(frozen=True)
class BatchSummary:
    name: str
    documents: int
    new: int
    exact_duplicates: int
    near_duplicates: int
    within_batch: int
    seconds: float
    already_stored: int = 0
    rejected: int = 0
    rejects_path: str | None = None
    #: False when the input held no record at all: no batch was created.
    recorded: bool = True
    #: Segments merged during and after the batch (:class:`simdb.pg.segments.CompactionSummary` merges).
    compacted: list = field(default_factory=list)
    #: Why merging segments failed during the batch, if it did: the documents are stored all the same
    #: (every chunk commits before any merge), and ``simdb compact`` merges later.
    merge_failed: str | None = None
    #: True when a ``resume`` found the batch complete: nothing was stored, its files were written again.
    already_complete: bool = False
    #: What the batch's method says of its texts (:meth:`simdb.methods.Method.short_text_advice`): one line each.
    warnings: list = field(default_factory=list)

    def to_json(self, verdicts: str | Path | None = None) -> dict:
        """The summary a script reads (``simdb ingest --json``)."""
        return {"batch": self.name if self.recorded else None, "documents": self.documents, "new": self.new,
                "exact_duplicates": self.exact_duplicates, "near_duplicates": self.near_duplicates,
                "within_batch": self.within_batch, "already_stored": self.already_stored, "rejected": self.rejected,
                "rejects": self.rejects_path, "verdicts": None if verdicts is None else str(verdicts),
                "seconds": round(self.seconds, 3), "compacted": self.compacted, "merge_failed": self.merge_failed,
                "already_complete": self.already_complete, "warnings": self.warnings}

    def __str__(self) -> str:
        text = (f"batch {self.name!r}: {self.documents:,} documents: {self.new:,} new, "
                f"{self.exact_duplicates:,} exact duplicates, {self.near_duplicates:,} near-duplicates "
                f"({self.within_batch:,} of the duplicates matched within the batch)")
        if self.already_stored:
            text += f", {self.already_stored:,} already stored"
        if self.rejected:
            text += f", {self.rejected:,} rejected" + (f" (see {self.rejects_path})" if self.rejects_path else "")
        text = f"{text} in {self.seconds:.1f} s"
        if self.compacted:
            text += (f", {sum(m['seconds'] for m in self.compacted):.1f} s of it merging "
                     f"{sum(len(m['replaced']) for m in self.compacted)} segments into {len(self.compacted)}")
        if self.merge_failed:
            text += f"; {self.merge_warning()}"
        if self.already_complete:
            text += "; the batch was complete already: nothing was stored, its files were written again"
        return text

    def merge_warning(self) -> str:
        return (f"merging segments failed, so the batch went on without it ({self.merge_failed}); every document "
                "is stored: run `simdb compact` when the cause is fixed")


def size_checked(items: Iterable[Document | InputError], max_chars: int) -> Iterator[Document | InputError]:
    """The items, a document whose text or id is too long to store turned into its reject (which keeps the id):
    every ingest and check, of files or through the API, passes here."""
    for item in items:
        if isinstance(item, Document):
            try:
                if len(item.text) > max_chars:
                    raise InputError(f"the text is {len(item.text):,} characters, over the limit of {max_chars:,}",
                                     path=item.path, line=item.line, hint="raise «max_chars» or split the document")
                checks.check_id_size(item.external_id, item.path, item.line)
            except InputError as error:
                error.external_id = item.external_id
                item = error
        yield item


def ingest(engine: sa.Engine, schema: str, method: Method,
           items: Iterable[Document | InputError], options: IngestOptions,
           progress: Callable[[int], None] | None = None, *, store_text: bool = False,
           distributed: bool, keyed: bool) -> BatchSummary:
    """Ingest a batch in atomic chunks (keeping each text when ``store_text``) into an index, ``distributed`` or
    not as its settings say; see the module docstring."""
    started = time.perf_counter()
    started_at = datetime.now(timezone.utc)  # the batch's start: before reading and fingerprinting, not after
    name = options.batch_name
    with engine.connect() as connection:
        resumed = resume_position(connection, name, options.resume)
    position = resumed[0] if resumed else 0
    skip_errors = options.on_error == "skip"
    rejects = OutcomeFile(options.rejects_file(name), engine, method, name, what="rejects",
                          only_rejected=True, spell=options.spell) if skip_errors else None
    verdicts = OutcomeFile(options.verdicts, engine, method, name, what="verdicts", spell=options.spell) \
        if options.verdicts is not None else None
    files = [file for file in (rejects, verdicts) if file is not None]
    first = resumed is None
    kept = KeptBatch(name, position, resumed[1], complete=resumed[2]) if resumed else None  # what is committed
    try:
        if resumed is not None:
            sync_all(files, position)  # the files as the database has them, whatever a kill left behind
            if resumed[2]:  # complete: nothing to read or store, the files were all it lacked
                return _summary(engine, name, rejects, started, already_complete=True)
        unread = items if options.items_follow_position else itertools.islice(items, position, None)
        stream = fingerprint_stream(size_checked(unread, options.max_chars),
                                    method, workers=options.workers, judge_first=SHORT_TEXT_SAMPLE)
        chunk, chunk_errors, seen = FingerprintedBatch(), [], {}
        consumed, compacted, merge_failed = position, [], None
        judged = short = 0  # of the first texts: for the method to say whether they are too short for it

        def commit(final: bool) -> None:
            nonlocal chunk, chunk_errors, seen, first, kept, merge_failed
            with engine.begin() as connection:
                # a chunk whose transaction changed the stored documents first (a sync run replacing changed
                # rows) keeps its lookups to this connection: another one reads its exported snapshot, which
                # does not show this transaction's own changes (simdb.pg.spread)
                changed = options.before_chunk is not None and options.before_chunk(connection, chunk)
                result = store_chunk(connection, schema, method, chunk, name=name, source=options.source,
                                      first=first, final=final, position=consumed, rejects=chunk_errors,
                                      skip_errors=skip_errors, started_at=started_at,
                                      stored_up_to=kept.position if kept else None,
                                      rereads=options.items_follow_position, distributed=distributed,
                                      keyed=keyed, connections=1 if changed else options.connections)
                if options.after_chunk is not None:
                    options.after_chunk(connection, consumed)
            kept = KeptBatch(name, consumed, (kept.documents if kept else 0) + result.stored, complete=final)
            sync_all(files, consumed)
            first = False
            chunk, chunk_errors, seen = FingerprintedBatch(), [], {}
            if options.compact and merge_failed is None:  # between chunks too: bulk chunks must not pile up
                try:  # housekeeping: its failure (a lock timeout, a full disk, a merge simdb refuses) must not
                    # fail a stored batch, nor may it hold the batch up for long behind an analyst's long query
                    # (its merged segments vacuumed, their key indexes not read in: that is `simdb compact`'s, up
                    # to 14-30 s at 10M, which would hold the batch up)
                    compact(engine, schema, distributed=distributed, merged=compacted, lock_attempts=1, wait=False)
                except sa.exc.DBAPIError as error:
                    merge_failed = str(translate(error, engine.url))
                except SimdbError as error:
                    merge_failed = str(error)

        for item in stream:
            consumed += 1
            if isinstance(item, Fingerprinted):
                document = item.document
                if document.external_id in seen:
                    item = checks.repeated_id(document.external_id, document.origin,
                                              f"first at {seen[document.external_id]}")
                else:
                    seen[document.external_id] = document.origin
                    if item.short is not None and judged < SHORT_TEXT_SAMPLE:
                        judged, short = judged + 1, short + item.short
                    chunk.append(document.external_id, item.sketch, item.content_hash, len(document.text),
                                 document.metadata, document.origin, consumed, item.keys,
                                 document.text if store_text else None)
            if isinstance(item, InputError):
                if not skip_errors:
                    raise item
                chunk_errors.append((consumed, item))
            if progress is not None:
                progress(1)
            if len(chunk) >= options.chunk_size:
                commit(final=False)
        if first and consumed == 0:
            if verdicts is not None:
                verdicts.output.write([])  # no record, no verdict: but the file a script waits for
            return BatchSummary(name=name, documents=0, new=0, exact_duplicates=0, near_duplicates=0,
                                within_batch=0, seconds=time.perf_counter() - started, recorded=False)
        commit(final=True)
    except SimdbError as error:
        raise _kept(error, kept) from None
    except sa.exc.DBAPIError as error:
        raise _kept(translate(error, engine.url), kept) from None
    finally:
        for file in files:
            file.close()
    advice = method.short_text_advice(short, judged) if judged >= SHORT_TEXT_MINIMUM else None
    return _summary(engine, name, rejects, started, compacted=compacted, merge_failed=merge_failed,
                    warnings=[advice] if advice else [])


def _summary(engine: sa.Engine, name: str, rejects: OutcomeFile | None, started: float, **more) -> BatchSummary:
    """The stored batch's summary, ``started`` (``time.perf_counter()``) being when the ingest began."""
    with engine.connect() as connection:
        row = reads.batch_row(connection, name)
    return BatchSummary(name=name, documents=row.documents, new=row.new, exact_duplicates=row.exact_duplicates,
                        near_duplicates=row.near_duplicates, within_batch=row.within_batch,
                        already_stored=row.already_stored, rejected=row.rejected,
                        rejects_path=rejects.path if rejects and row.rejected else None,
                        seconds=time.perf_counter() - started, **more)


def _kept(error: SimdbError, kept: KeptBatch | None) -> SimdbError:
    """The error, saying what its batch keeps when earlier chunks were committed (not when another process is
    storing the batch: what this one kept is no longer what the batch holds, nor is it this one's to remove)."""
    if kept is not None and error.kept is None and not isinstance(error, ConcurrentIngest):
        error.kept = kept
        error.args = (f"{error}; {kept.describe()}",)
    return error
