"""Counts per value of the metadata fields an index counts by (``simdb init --count-by``, ``simdb count-by add``).

"Duplicate rate by a metadata field" grouped every stored document by ``metadata ->> field``, counting those with
a ``duplicate_of`` (an earlier stored near-duplicate): a scan of every segment (0.86 s at 1M documents). For the
fields an index declares, ``field_counts`` keeps that answer: one row per field and value (``value`` NULL where a
document has no such field, or JSON null: what ``->>`` gives), with the documents stored and how many of them
have a ``duplicate_of``. It is written in the transaction of every change to either:

- an ingest chunk adds its stored documents, and its duplicates (:func:`count_chunk`);
- a removal subtracts the removed documents, and the documents it left without an earlier near-duplicate
  (their ``duplicate_of`` pointed at a removed one and none is left); a document it re-points keeps a
  ``duplicate_of`` and its count (:func:`uncount_removal`);
- adding a field fills its rows from the stored documents in one statement (:func:`add_field`).

A relayout rewrites key columns and a compaction moves documents between segments: neither changes a document's
metadata or ``duplicate_of``, and the counts stand. Every writer holds the index's ingest lock and reads the
fields counted from the ``settings`` table under it (a field added by another process since this one opened
the index is counted from the next chunk on). On a distributed index the table is a reference table, written
with constants and from the coordinator's temporary tables only (see :mod:`simdb.pg.citus`).
"""

from __future__ import annotations

import json

import sqlalchemy as sa

from ..errors import SimdbError
from .database import lock

#: The settings row that names the fields counted, in the order they were declared.
SETTINGS_ROW = "count_by"
#: How ``field_counts`` is told a row apart: NULL (no such field) is a value of its own (PostgreSQL 14 has no
#: NULLS NOT DISTINCT), so the unique index is on expressions, and an upsert names them.
CONFLICT = "(field, md5(coalesce(value, '')), (value IS NULL))"


def counted_fields(connection: sa.Connection) -> list[str]:
    """The fields the index counts by, as its settings say now (read under the ingest lock by every writer)."""
    value = connection.execute(sa.text("SELECT value FROM settings WHERE name = :name"),
                               {"name": SETTINGS_ROW}).scalar()
    return list(value or [])


def check_field(field: object) -> str:
    if not isinstance(field, str) or not field.strip():
        raise SimdbError(f"a field to count by is a metadata field's name (a top-level key of the documents' "
                         f"metadata), not {field!r}")
    return field


def count_chunk(connection: sa.Connection) -> None:
    """Add an ingest chunk's stored documents (``staging``, its duplicates in ``staging_duplicates``) to the
    counts of the fields counted."""
    fields = counted_fields(connection)
    if not fields:
        return
    rows = connection.execute(sa.text(  # temporary tables only: on Citus this runs on the coordinator
        "SELECT f.field, s.metadata ->> f.field AS value, count(*) AS documents, count(m.id) AS duplicates "
        "FROM staging s CROSS JOIN unnest(CAST(:fields AS text[])) AS f (field) "
        "LEFT JOIN staging_duplicates m ON m.id = s.id GROUP BY 1, 2"), {"fields": fields}).all()
    _add(connection, [tuple(row) for row in rows])


def uncount_removal(connection: sa.Connection, removing: str, repointed: str) -> None:
    """Before a removal deletes the documents in the temporary table ``removing``: subtract them, and the
    duplicates that no longer are (the documents of ``repointed`` left without a near-duplicate, ``a_id``
    NULL), from the counts of the fields counted."""
    deltas = []
    for field in counted_fields(connection):
        # (one field a statement: the archive joined with one temporary table and nothing else, as Citus takes it)
        for value, documents, duplicates in connection.execute(sa.text(
                f"SELECT d.metadata ->> :field, count(*), count(d.duplicate_of) FROM documents d "
                f"JOIN {removing} r ON r.id = d.id GROUP BY 1"), {"field": field}).all():
            deltas.append((field, value, -documents, -duplicates))
        for value, originals in connection.execute(sa.text(
                f"SELECT d.metadata ->> :field, count(*) FROM documents d JOIN {repointed} r ON r.id = d.id "
                "WHERE r.a_id IS NULL GROUP BY 1"), {"field": field}).all():
            deltas.append((field, value, 0, -originals))
    _add(connection, deltas)


def add_field(connection: sa.Connection, schema: str, field: str) -> int:
    """Count by ``field`` from now on: its rows filled from the stored documents in one statement, and the
    settings row extended, in the caller's transaction under the ingest lock; the values it has."""
    check_field(field)
    lock(connection, schema, "ingest")
    if field in counted_fields(connection):
        raise SimdbError(f"the index already counts by {field!r}; `simdb count-by list` shows its fields")
    filled = connection.execute(sa.text(
        "INSERT INTO field_counts (field, value, documents, duplicates) "
        "SELECT CAST(:field AS text), metadata ->> :field, count(*), count(duplicate_of) FROM documents GROUP BY 2"),
        {"field": field}).rowcount
    connection.execute(sa.text(
        "INSERT INTO settings (name, value) VALUES (:name, CAST(:value AS jsonb)) "
        "ON CONFLICT (name) DO UPDATE SET value = settings.value || EXCLUDED.value"),
        {"name": SETTINGS_ROW, "value": json.dumps([field])})
    return filled


def field_values(connection: sa.Connection) -> dict[str, tuple[int, int, int]]:
    """{field: (values, documents, duplicates)} of every field counted, in the order they were declared."""
    totals = {field: (0, 0, 0) for field in counted_fields(connection)}
    for field, values, documents, duplicates in connection.execute(sa.text(
            "SELECT field, count(*), sum(documents), sum(duplicates) FROM field_counts GROUP BY field")).all():
        totals[field] = (values, int(documents), int(duplicates))
    return totals


def _add(connection: sa.Connection, deltas: list[tuple[str, str | None, int, int]]) -> None:
    """Add (field, value, documents, duplicates) to the counts; a value left with no document goes. The rows
    come as constants (bound arrays): Citus writes a reference table from no join."""
    merged: dict[tuple[str, str | None], list[int]] = {}
    for field, value, documents, duplicates in deltas:
        counts = merged.setdefault((field, value), [0, 0])
        counts[0] += documents
        counts[1] += duplicates
    changed = [(field, value, *counts) for (field, value), counts in merged.items() if counts != [0, 0]]
    if not changed:
        return
    # the same order in every writer (they hold the ingest lock anyway)
    changed.sort(key=lambda row: (row[0], row[1] is None, row[1] or ""))
    fields, values, documents, duplicates = (list(column) for column in zip(*changed))
    connection.execute(sa.text(
        "INSERT INTO field_counts (field, value, documents, duplicates) "
        "SELECT * FROM unnest(CAST(:fields AS text[]), CAST(:values AS text[]), CAST(:documents AS int8[]), "
        f"CAST(:duplicates AS int8[])) ON CONFLICT {CONFLICT} DO UPDATE SET "
        "documents = field_counts.documents + EXCLUDED.documents, "
        "duplicates = field_counts.duplicates + EXCLUDED.duplicates"),
        {"fields": fields, "values": values, "documents": documents, "duplicates": duplicates})
    if any(count < 0 for count in documents):
        connection.execute(sa.text("DELETE FROM field_counts WHERE documents = 0"))
