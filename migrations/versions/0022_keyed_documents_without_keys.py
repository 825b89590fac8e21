"""On the keyed distributed layout, ``documents`` has no key columns: its keys table answers every probe.

An index with the keyed layout (the ``distributed`` settings row names ``"layout": "keyed"``) kept in ``documents``
its 15 key columns (35 with 7 blocks) and their covering B-tree indexes, which nothing there read once its
probes went to the keys table: about 1,250 of 3,250 bytes a document, written by every ingest. This drops them
(their indexes go with them, on every segment and shard), and rewrites the analysts' ``simdb_lookup(bigint,
integer)`` of such an index, which read them, to read the keys table ``keys_<first key>`` by ``key = ANY(...)``
(each key folded with its key number: ``key << 6 | number``), routed to the shards of its keys. The new function
is the old one with its lookup replaced (each document once, as the scan that ORed the keys gave it): the key expressions are those it had, so that it is the function a new
index of the same layout gets.

A schema the migrations make before it is distributed loses its key columns too (its functions are made again
when it is distributed). Every other index (one server, or the layout by id) is left as it was.

The downgrade adds the key columns again, filled from the fingerprints by the same expressions, indexed, and
the function as it was on a distributed index. A keyed schema without its keys table (not distributed yet)
has no lookup to read the expressions from: its downgrade stops with an error, the schema left as it was.

This migration carries its own SQL and imports nothing from simdb. Written after 0021; the coordinator
renumbers it at merge.

Revision ID: 0022
Revises: 0021
Create Date: 2026-11-27
"""
import re

import sqlalchemy as sa
from alembic import context, op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None

KEY_NUMBER_BITS = 6
LOOKUP = "simdb_lookup(bigint, integer)"
#: The lookup of simdb_lookup on a distributed index before this revision: one scan ORing the keys.
OLD_LOOKUP = re.compile(r"( *)SELECT id, simhash FROM (\S+)\.documents WHERE (key_[0-9]+ = .*)$", re.M)
#: ... and after it.
NEW_LOOKUP = re.compile(r"( *)SELECT DISTINCT k\.id, k\.fingerprint AS simhash FROM (\S+)\.(keys_[0-9]+) k "
                        r"WHERE k\.key = ANY\(ARRAY\[(.*)\]\)$", re.M)


def _keyed(connection) -> bool:
    return connection.execute(sa.text(
        "SELECT coalesce((SELECT value ->> 'layout' FROM settings WHERE name = 'distributed'), '') = 'keyed'")
    ).scalar_one()


def _first_key(connection) -> int:
    return connection.execute(sa.text(
        "SELECT coalesce((SELECT CAST(value #>> '{}' AS integer) FROM settings WHERE name = 'first_key'), 0)")
    ).scalar_one()


def _key_columns(connection) -> list[str]:
    return connection.execute(sa.text(
        "SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema() "
        "AND table_name = 'documents' AND column_name ~ '^key_[0-9]+$' ORDER BY ordinal_position")).scalars().all()


def _lookup_definition(connection, schema: str) -> str | None:
    """simdb_lookup's definition where the keys table is there (the index is distributed), else None."""
    if connection.execute(sa.text("SELECT to_regclass(:t)"), {"t": f"{schema}.keys_{_first_key(connection)}"}
                          ).scalar() is None:
        return None
    return connection.execute(sa.text("SELECT pg_get_functiondef(CAST(:f AS regprocedure))"),
                              {"f": f"{schema}.{LOOKUP}"}).scalar_one()


def _stop(definition: str, what: str) -> None:
    raise RuntimeError(f"migration 0022 cannot find {what} in simdb_lookup, so the migration is rolled back and "
                       f"the index left as it was; report it with the definition:\n{definition}")


def _run(statement: str) -> None:
    op.get_bind().connection.dbapi_connection.execute(statement)  # DDL as written: '%' is no placeholder


def upgrade() -> None:
    schema = context.config.attributes["schema"]
    connection = op.get_bind()
    if not _keyed(connection):
        return
    definition = _lookup_definition(connection, schema)
    if definition is not None and NEW_LOOKUP.search(definition) is None:  # rewritten first: it stops before
        found = OLD_LOOKUP.search(definition)  # anything changed where it cannot be
        if found is None:
            _stop(definition, "the lookup of the documents' key columns")
        indent, named, conditions = found.groups()
        expressions = [condition.split(" = ", 1)[1] for condition in conditions.split(" OR ")]
        # the parameter named in full: the keys table has a column ``fingerprint`` too
        folded = ", ".join(f"((({expression.replace('fingerprint', 'simdb_lookup.fingerprint')}) "
                           f"<< {KEY_NUMBER_BITS}) | {number})" for number, expression in enumerate(expressions))
        lookup = (f"{indent}SELECT DISTINCT k.id, k.fingerprint AS simhash FROM {named}.keys_{_first_key(connection)} k "
                  f"WHERE k.key = ANY(ARRAY[{folded}])")
        _run(definition[:found.start()] + lookup + definition[found.end():])
    columns = _key_columns(connection)
    if columns:
        connection.exec_driver_sql("ALTER TABLE documents " + ", ".join(f"DROP COLUMN {c}" for c in columns))


_FOLDED = re.compile(r"^\(\(\((.*)\) << " + str(KEY_NUMBER_BITS) + r"\) \| ([0-9]+)\)$")


def downgrade() -> None:
    schema = context.config.attributes["schema"]
    connection = op.get_bind()
    if not _keyed(connection) or _key_columns(connection):
        return
    definition = _lookup_definition(connection, schema)
    if definition is None:  # no keys table (not distributed yet): no lookup to read the key expressions from
        raise RuntimeError(
            f"migration 0022 cannot downgrade the keyed index in schema {schema!r}: its documents have no key "
            f"columns, which revision 0021 has, and its keys table keys_{_first_key(connection)} is not there, "
            "whose simdb_lookup holds the key expressions to fill them from the fingerprints; the downgrade is "
            "rolled back and the index left as it was. Downgrade it once it is distributed with its keys table, or "
            "make the index anew with the older simdb")
    found = NEW_LOOKUP.search(definition)
    if found is None:
        _stop(definition, "the lookup of the keys table")
    indent, named, _, folded = found.groups()
    expressions = []
    for part in re.split(r", (?=\(\(\()", folded):
        matched = _FOLDED.match(part)
        if matched is None:
            _stop(definition, f"a folded key in {part!r}")
        expressions.append(matched[1].replace("simdb_lookup.fingerprint", "fingerprint"))
    first = _first_key(connection)
    columns = [f"key_{first + number}" for number in range(len(expressions))]
    run = connection.exec_driver_sql
    run("ALTER TABLE documents " + ", ".join(f"ADD COLUMN {column} bigint" for column in columns))
    run("UPDATE documents SET " + ", ".join(f"{column} = {expression.replace('fingerprint', 'simhash')}"
                                            for column, expression in zip(columns, expressions)))
    for column in columns:
        run(f"ALTER TABLE documents ALTER COLUMN {column} SET NOT NULL")
        run(f"CREATE INDEX ix_documents_{column} ON documents ({column}) INCLUDE (simhash, id)")
    conditions = " OR ".join(f"{column} = {expression}" for column, expression in zip(columns, expressions))
    _run(definition[:found.start()] + f"{indent}SELECT id, simhash FROM {named}.documents WHERE {conditions}"
         + definition[found.end():])
