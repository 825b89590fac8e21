"""A dry run of an ingest: the verdict every input record would get, with nothing stored.

The input is read and sketched exactly as ``ingest`` does, and matched chunk by chunk in one
read-only snapshot of the archive (so the reader role may run it): ids already stored, exact
texts, and the method's candidate joins against the archive, with the chunk given to PostgreSQL as
arrays (a read-only transaction may not create even a temporary table). Records are matched against
the earlier records of the input in memory, through the same keys, so the verdicts are those an
ingest of the input, alone and now, would record: the tests hold ``check`` to ``ingest`` record by
record.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import sqlalchemy as sa

from .errors import InputError
from .ingest import size_checked
from .inputs import DEFAULT_MAX_CHARS, Document, checks
from .methods import Method
from .parallel import Fingerprinted, fingerprint_stream, key_rows
from .pg import reads
from .verdicts import Verdict, rejected, verdict

#: Records matched against the archive per statement.
CHECK_CHUNK = 10_000


class _InputIndex:
    """The input's earlier records, by key, for matching within the input (exact, as the SQL joins)."""

    def __init__(self, method: Method) -> None:
        self.method = method
        self.by_key: list[dict[int, list[int]]] = [{} for _ in method.key_columns]
        self.sketches: list = []  # as stored (method.stored)
        self.names: list[str] = []
        self.hashes: dict[bytes, int] = {}
        # kept only for a method that decides by the texts, as UTF-8: the input's texts, the one part of a check
        # that grows with the input beyond its sketches (a pickled str would also keep pickle's copy of itself)
        self.texts: list[bytes] = []

    def matches(self, sketch, keys: list[int], text: str) -> list[tuple[int, int]]:
        """(earlier record's index, distance) of every earlier record within the method's distance."""
        candidates = sorted({i for column, key in zip(self.by_key, keys) for i in column.get(key, ())})
        if not candidates:
            return []
        method, k = self.method, self.method.max_distance
        distances = method.distances(sketch, [self.sketches[i] for i in candidates]).tolist()
        wide = method.candidate_distance(k)
        found = [(i, int(d)) for i, d in zip(candidates, distances) if d <= wide]
        if not method.needs_texts or not found:
            return found
        # the record is -1 among the earlier records' indexes
        pairs = np.array([(-1, i, d) for i, d in found], dtype=np.int64)
        decided = method.decide(pairs, lambda ids: {i: text if i < 0 else self.texts[i].decode("utf-8")
                                                    for i in ids.tolist()}, k)
        return [(int(i), int(d)) for _, i, d in decided.tolist()]

    def add(self, name: str, stored, keys: list[int], content_hash: bytes, text: str) -> None:
        """Index one record by its keys; ``stored`` is its sketch as the sketch column holds it."""
        index = len(self.sketches)
        for column, key in zip(self.by_key, keys):
            column.setdefault(key, []).append(index)
        self.sketches.append(stored)
        self.names.append(name)
        self.hashes.setdefault(content_hash, index)
        if self.method.needs_texts:
            self.texts.append(text.encode("utf-8"))


def check(engine: sa.Engine, method: Method, items: Iterable[Document | InputError], *, batch: str | None = None,
          max_chars: int = DEFAULT_MAX_CHARS, workers: int | None = 1, chunk_size: int = CHECK_CHUNK
          ) -> Iterator[Verdict]:
    """The verdict of every input record, in input order, as an ingest of the input now would give it.

    Input errors are verdicts (``rejected``), as under ``on_error="skip"``; nothing is written.
    """
    seen: dict[str, str] = {}
    earlier = _InputIndex(method)
    stream = fingerprint_stream(size_checked(items, max_chars), method, workers=workers)
    with engine.connect() as connection:
        reads.read_only_snapshot(connection)
        chunk: list[tuple[int, Fingerprinted | InputError]] = []
        position = 0
        for item in stream:
            position += 1
            chunk.append((position, item))
            if len(chunk) >= chunk_size:
                yield from _check_chunk(connection, method, chunk, batch, seen, earlier)
                chunk = []
        yield from _check_chunk(connection, method, chunk, batch, seen, earlier)
        connection.rollback()


def _check_chunk(connection: sa.Connection, method: Method, chunk: list, batch: str | None, seen: dict[str, str],
                 earlier: _InputIndex) -> Iterator[Verdict]:
    documents = [(position, item) for position, item in chunk if isinstance(item, Fingerprinted)]
    sketches = [item.sketch for _, item in documents]
    stored = reads.stored_ids(connection, [item.document.external_id for _, item in documents])
    exact = reads.stored_texts(connection, [item.content_hash for _, item in documents])
    archive: dict[int, list[tuple[int, int]]] = {}  # chunk index -> (stored id, distance)
    keys = key_rows([item.keys for _, item in documents], sketches, method).tolist() if documents else []
    values = method.stored(sketches) if documents else []  # as the sketch column holds them
    if documents:
        k = method.max_distance
        found = np.array(list(reads.probe_arrays(connection, method, sketches, method.candidate_distance(k), keys)),
                         dtype=np.int64).reshape(-1, 3)
        if method.needs_texts and len(found):  # the chunk's records are -1, -2, ... among the stored ids
            found[:, 0] = -found[:, 0] - 1
            inputs = [item.document.text for _, item in documents]
            found = method.decide(found, lambda ids: reads.texts(connection, ids, inputs), k)
            found[:, 0] = -found[:, 0] - 1
        for index, document_id, distance in found.tolist():
            archive.setdefault(index, []).append((document_id, distance))
    external = reads.external_ids(connection, sorted({d for found in archive.values() for d, _ in found}))

    index_of = {position: i for i, (position, _) in enumerate(documents)}
    for position, item in chunk:
        if isinstance(item, InputError):
            yield rejected(position, item, batch)
            continue
        document, i = item.document, index_of[position]
        name = document.external_id
        if name in seen:
            yield rejected(position, checks.repeated_id(name, document.origin, f"first at {seen[name]}"), batch)
            continue
        seen[name] = document.origin
        row = stored.get(name)
        if row is not None:
            if row.content_hash == item.content_hash:
                yield verdict(method, position=position, external_id=name, status="already_stored", batch=batch)
            else:
                yield rejected(position, checks.stored_with_another_text(name, document.origin, row.batch), batch)
            continue
        found_archive = archive.get(i)
        if found_archive:
            document_id, distance = min(found_archive)
            duplicate_of = external[document_id]
        else:
            found_input = earlier.matches(item.sketch, keys[i], document.text)
            duplicate_of, distance = (earlier.names[min(found_input)[0]], min(found_input)[1]) if found_input \
                else (None, None)
        is_exact = item.content_hash in exact or item.content_hash in earlier.hashes
        status = "exact" if is_exact else "near" if duplicate_of is not None else "new"
        earlier.add(name, values[i], keys[i], item.content_hash, document.text)
        yield verdict(method, position=position, external_id=name, status=status, batch=batch,
                      duplicate_of=duplicate_of, distance=distance)

