"""On one server, ``simdb_lookup`` is a SQL function again, inlined into ``simdb_near`` and ``simdb_similar``,
whose plans are generic from the first call.

``simdb_near`` and ``simdb_similar`` (PL/pgSQL) called ``simdb_lookup``, which was PL/pgSQL too (its key lookups
in a ``RETURN QUERY``) with ``SET plan_cache_mode = force_generic_plan``: each call set that nested plan's 15
index scans per segment up and tore them down again (beside 16 segments, 240 of them: about 7 MB and 1,700 page
faults a call), 7.2-7.5 ms a call at 1M documents in 16 segments. ``simdb_lookup`` is now the ``LANGUAGE sql``
function it was written as, with no ``SET`` (a function with one is never inlined), and the two callers carry
the setting instead: their query, with the lookup inlined, is planned once per session with its parameters,
1.8-2.1 ms a call. Its answers are the same rows.

A MinHash index deciding exactly keeps its PL/pgSQL ``simdb_lookup`` (a body of several statements, which is never
inlined). A distributed index is left as it was: Citus plans no SQL function's parameterised statements (its
functions are PL/pgSQL without the setting); so is a schema for the keyed distributed layout that is not yet
distributed (its documents have no key columns for a SQL function to name: its functions are made again when it is).

This migration carries its own SQL and imports nothing from simdb.

Revision ID: 0023
Revises: 0022
Create Date: 2026-11-28
"""
import re

import sqlalchemy as sa
from alembic import context, op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None

#: simdb_lookup as one server's simdb wrote it before: its SQL statement in a PL/pgSQL RETURN QUERY
WRAPPED = re.compile(r"\A\n#variable_conflict use_column\nBEGIN\nRETURN QUERY (?P<query>.*);\nEND \Z", re.S)
#: ... and its query as a SQL function's body, as simdb writes it (indented to the function's text)
INDENT = "\n            "
GENERIC = "plan_cache_mode=force_generic_plan"


def _distributed(schema: str) -> bool:
    connection = op.get_bind()
    if connection.execute(sa.text("SELECT to_regclass('pg_catalog.pg_dist_partition')")).scalar_one() is None:
        return False
    return connection.execute(sa.text(
        "SELECT count(*) FROM pg_dist_partition WHERE logicalrelid = CAST(:t AS regclass)"),
        {"t": f"{schema}.documents"}).scalar_one() > 0


def _keyed() -> bool:
    return op.get_bind().execute(sa.text(
        "SELECT coalesce((SELECT value ->> 'layout' FROM settings WHERE name = 'distributed'), '') = 'keyed'")
    ).scalar_one()


def _lookup(schema: str) -> tuple[str, str, str, list[str]] | None:
    """(arguments' types, language, body, settings) of the schema's simdb_lookup, or None if it has none."""
    row = op.get_bind().execute(sa.text(
        "SELECT pg_get_function_identity_arguments(p.oid), l.lanname, p.prosrc, coalesce(p.proconfig, '{}') "
        "FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace JOIN pg_language l ON l.oid = p.prolang "
        "WHERE n.nspname = :s AND p.proname = 'simdb_lookup'"), {"s": schema}).first()
    return None if row is None else (row[0], row[1], row[2], list(row[3]))


def _callers(arguments: str) -> list[str]:
    sketch = arguments.split(",")[0].split()[-1]  # "fingerprint bigint, ..." -> bigint
    return [f"simdb_near({sketch}, integer)", f"simdb_similar({sketch}, double precision)"]


def _definition(schema: str, signature: str) -> str:
    return op.get_bind().execute(sa.text("SELECT pg_get_functiondef(CAST(:f AS regprocedure))"),
                                 {"f": f"{schema}.{signature}"}).scalar_one()


def _run(statement: str) -> None:
    op.get_bind().connection.dbapi_connection.execute(statement)  # DDL as written: '%' is no placeholder


def _rewrite(schema: str, arguments: str, body: str, language: str, setting: str) -> None:
    """simdb_lookup's definition with its body, language and settings replaced."""
    signature = f"simdb_lookup({', '.join(a.split()[-1] for a in arguments.split(', '))})"
    definition = _definition(schema, signature)
    head, _, _ = definition.partition("AS $function$")
    head = re.sub(r"^ LANGUAGE \w+$", f" LANGUAGE {language}", head, flags=re.M)
    head = re.sub(r"^ SET plan_cache_mode TO '\w+'\n", "", head, flags=re.M) + setting
    _run(f"{head}AS $function${body}$function$")


def _changed(schema: str) -> tuple[str, str, str, list[str]] | None:
    """simdb_lookup of an index this revision changes: one server's, not a keyed schema's."""
    return None if _distributed(schema) or _keyed() else _lookup(schema)


def upgrade() -> None:
    schema = context.config.attributes["schema"]
    if (lookup := _changed(schema)) is None:
        return
    arguments, language, body, settings = lookup
    wrapped = WRAPPED.match(body)
    if language == "plpgsql" and wrapped is not None and GENERIC in settings:
        _rewrite(schema, arguments, f"{INDENT}{wrapped['query']}{INDENT}", "sql", "")
    for caller in _callers(arguments):
        _run(f"ALTER FUNCTION {schema}.{caller} SET plan_cache_mode = force_generic_plan")


def downgrade() -> None:
    schema = context.config.attributes["schema"]
    if (lookup := _changed(schema)) is None:
        return
    arguments, language, body, _ = lookup
    if language == "sql":
        query = body.strip()
        _rewrite(schema, arguments, f"\n#variable_conflict use_column\nBEGIN\nRETURN QUERY {query};\nEND ", "plpgsql",
                 " SET plan_cache_mode TO 'force_generic_plan'\n")
    for caller in _callers(arguments):
        _run(f"ALTER FUNCTION {schema}.{caller} RESET plan_cache_mode")
