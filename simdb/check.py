"""A dry run of an ingest: the verdict every input record would get, with nothing stored.

The input is read and sketched exactly as ``ingest`` does, and matched chunk by chunk in one
read-only snapshot of the archive (so the reader role may run it): ids already stored, and the
method's candidate joins against the archive, with the chunk given to PostgreSQL as arrays (a
read-only transaction may not create even a temporary table). The input's earlier chunks, which an
ingest would have stored by then, are held in memory and met by their keys
(:func:`simdb.decisions.pairs_between`); the input's records take ids above every stored one, in input
order, as an ingest gives them. Statuses and ``duplicate_of`` then come from
:func:`simdb.decisions.decide_chunk`, the decision ``ingest`` takes for each chunk it stores: the two
cannot disagree, and the tests hold ``check`` to ``ingest`` record by record.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np
import sqlalchemy as sa

from .decisions import decide_chunk, pairs_between
from .errors import InputError
from .ingest import size_checked
from .inputs import DEFAULT_MAX_CHARS, Document, checks
from .parallel import Fingerprinted, fingerprint_stream, key_rows
from .pg import reads
from .pg.context import IndexContext
from .verdicts import Verdict, rejected, verdict

#: Records matched against the archive per statement.
CHECK_CHUNK = 10_000
#: The first id of the input's records: above every stored document's (ids are positive BIGINTs from a sequence).
FIRST_INPUT_ID = 1 << 62


@dataclass
class _InputRecords:
    """The input's matched records so far: their chunks, and by id what the decision may ask of them."""

    chunks: list[tuple[np.ndarray, list, np.ndarray]] = field(default_factory=list)  # (ids, stored sketches, keys)
    names: dict[int, str] = field(default_factory=dict)
    hashes: dict[int, bytes] = field(default_factory=dict)
    # kept only for a method that decides by the texts, as UTF-8: the input's texts, the one part of a check
    # that grows with the input beyond its sketches (a pickled str would also keep pickle's copy of itself)
    texts: dict[int, bytes] = field(default_factory=dict)


def check(index: IndexContext, items: Iterable[Document | InputError], *, batch: str | None = None,
          max_chars: int = DEFAULT_MAX_CHARS, workers: int | None = 1, chunk_size: int = CHECK_CHUNK
          ) -> Iterator[Verdict]:
    """The verdict of every input record, in input order, as an ingest of the input now would give it into the
    open ``index``.

    Input errors are verdicts (``rejected``), as under ``on_error="skip"``; nothing is written.
    """
    method, earlier = index.method, _InputRecords()
    seen: dict[str, str] = {}
    stream = fingerprint_stream(size_checked(items, max_chars), method, workers=workers)
    with index.engine.connect() as connection:
        reads.read_only_snapshot(connection)
        chunk: list[tuple[int, Fingerprinted | InputError]] = []
        position = 0
        for item in stream:
            position += 1
            chunk.append((position, item))
            if len(chunk) >= chunk_size:
                yield from _check_chunk(connection, index, chunk, batch, seen, earlier)
                chunk = []
        yield from _check_chunk(connection, index, chunk, batch, seen, earlier)
        connection.rollback()


def _check_chunk(connection: sa.Connection, index: IndexContext, chunk: list, batch: str | None,
                 seen: dict[str, str], earlier: _InputRecords) -> Iterator[Verdict]:
    method = index.method
    documents = [(position, item) for position, item in chunk if isinstance(item, Fingerprinted)]
    stored_rows = reads.stored_ids(connection, [item.document.external_id for _, item in documents])
    outcome: dict[int, Verdict] = {}  # by position
    matched: list[tuple[int, Fingerprinted]] = []
    for position, item in documents:
        document = item.document
        name = document.external_id
        if name in seen:
            outcome[position] = rejected(position, checks.repeated_id(name, document.origin,
                                                                      f"first at {seen[name]}"), batch)
            continue
        seen[name] = document.origin
        row = stored_rows.get(name)
        if row is None:
            matched.append((position, item))
        elif row.content_hash == item.content_hash:
            outcome[position] = verdict(method, position=position, external_id=name, status="already_stored",
                                        batch=batch)
        else:
            outcome[position] = rejected(position, checks.stored_with_another_text(name, document.origin, row.batch),
                                         batch)
    if matched:
        outcome.update(_decided(connection, index, matched, batch, earlier))
    for position, item in chunk:
        yield rejected(position, item, batch) if isinstance(item, InputError) else outcome[position]


def _decided(connection: sa.Connection, index: IndexContext, matched: list[tuple[int, Fingerprinted]],
             batch: str | None, earlier: _InputRecords) -> dict[int, Verdict]:
    """{position: verdict} of a chunk's records to match (as an ingest would stage them), by the decision an
    ingest of the chunk takes; they join the ``earlier`` records."""
    method = index.method
    sketches = [item.sketch for _, item in matched]
    ids = np.array([FIRST_INPUT_ID + position for position, _ in matched], dtype=np.int64)
    keys = key_rows([item.keys for _, item in matched], sketches, method)
    stored = method.stored(sketches)  # as the sketch column holds them
    for i, (_, item) in zip(ids.tolist(), matched):
        earlier.names[i], earlier.hashes[i] = item.document.external_id, item.content_hash
        if method.needs_texts:
            earlier.texts[i] = item.document.text.encode("utf-8")
    wide = method.candidate_distance(method.max_distance)
    names_read: dict[int, str] = {}  # external ids of stored matches read already (the keyed layout reads them first)

    def archive_pairs() -> Iterator[np.ndarray]:
        # on the keyed layout through this transaction's own connection, whose snapshot of each worker its reads
        # of the matches' rows share: another coordinator connection would read later snapshots of its own, and a
        # sync replacement committed in between could leave neither the old document nor the new one seen
        probed = reads.probe_arrays(connection, index, sketches, wide, keys, connections=1 if index.keyed else None)
        found = np.array(list(probed), dtype=np.int64).reshape(-1, 3)
        found[:, 0] = ids[found[:, 0]]  # sketch index -> the record's id
        if index.keyed and len(found):  # on Citus each worker reads its own snapshot: a match found by its keys
            # whose row is not there was being removed or added meanwhile (see Index.query_fingerprints), and is
            # left out, as if the removal came first or the chunk after
            names_read.update(reads.external_ids(connection, np.unique(found[:, 1]).tolist()))
            found = found[np.isin(found[:, 1], np.fromiter(names_read, dtype=np.int64, count=len(names_read)))]
        yield found
        # what an ingest would have stored of the input by now
        yield from pairs_between(method, ids, stored, keys, earlier.chunks, wide)

    def input_or_stored(wanted, held: dict, read) -> dict:
        wanted = np.unique(np.asarray(wanted, dtype=np.int64)).tolist()
        found = {i: held[i] for i in wanted if i >= FIRST_INPUT_ID}
        found.update(read([i for i in wanted if i < FIRST_INPUT_ID]))
        return found

    decision = decide_chunk(
        method, archive_pairs(), ids, stored, keys,
        lambda wanted: {i: text if isinstance(text, str) or text is None else text.decode("utf-8")
                        for i, text in input_or_stored(wanted, earlier.texts,
                                                       lambda some: reads.texts(connection, some)).items()},
        lambda wanted: input_or_stored(wanted, earlier.hashes, lambda some: reads.content_hashes(connection, some)))
    names = input_or_stored(decision.duplicates[:, 1], earlier.names, lambda some: {
        **{i: names_read[i] for i in some if i in names_read},
        **reads.external_ids(connection, [i for i in some if i not in names_read])})
    statuses = decision.statuses(ids.tolist())
    duplicates = {probe: (names[match], distance) for probe, match, distance in decision.duplicates.tolist()}
    earlier.chunks.append((ids, stored, keys))
    outcome = {}
    for i, status, (position, item) in zip(ids.tolist(), statuses, matched):
        duplicate_of, distance = duplicates.get(i, (None, None))
        outcome[position] = verdict(method, position=position, external_id=item.document.external_id,
                                    status=status, batch=batch, duplicate_of=duplicate_of, distance=distance)
    return outcome
