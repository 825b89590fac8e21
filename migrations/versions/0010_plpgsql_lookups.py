"""The lookup functions are PL/pgSQL, planned once per session, not once per call.

A ``LANGUAGE sql`` function is inlined into the calling statement and planned with it, every time:
from psql or a BI tool, which send each call as a new statement, ``simdb_near`` at 10M documents
in 6 segments spent 1.9 of its 2.2 ms planning the fifteen key lookups in every segment. A
PL/pgSQL function keeps the plan of its query for the session, with the arguments as parameters
(a generic plan from the sixth call: the lookups are key equalities, whatever the values), and the
same call took 0.57 ms. Each set-returning ``LANGUAGE sql`` function of the index (``simdb_near``,
``simdb_similar``, ``simdb_neighbours``) becomes ``RETURN QUERY`` of the same statement, with
``#variable_conflict use_column`` so that a column still wins over a parameter of the same name, as
in a SQL function. A distributed index's functions are PL/pgSQL already and are left as they are.

This migration carries its own SQL and imports nothing from simdb.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-24
"""
import re

import sqlalchemy as sa
from alembic import context, op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

#: pg_get_functiondef's layout of a function's language, attributes and body.
_DEFINITION = re.compile(r"\n LANGUAGE (?P<language>\w+)\n(?P<attributes>[^\n]*)\nAS \$function\$(?P<body>.*)\$function\$\s*$",
                         re.S)
_PLPGSQL_BODY = re.compile(r"^\s*#variable_conflict use_column\s+BEGIN\s+RETURN QUERY (?P<query>.*);\s*END\s*$", re.S)


def _definitions(language: str) -> list[str]:
    """simdb's set-returning functions in the index's schema in ``language``, as CREATE OR REPLACE statements."""
    return list(op.get_bind().execute(sa.text(
        "SELECT pg_get_functiondef(p.oid) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
        "JOIN pg_language l ON l.oid = p.prolang WHERE n.nspname = :schema AND p.proname LIKE 'simdb\\_%' "
        "AND p.proretset AND l.lanname = :language "
        "ORDER BY p.proname"), {"schema": context.config.attributes["schema"], "language": language}).scalars())


def _distributed() -> bool:
    connection = op.get_bind()
    if connection.execute(sa.text("SELECT to_regclass('pg_catalog.pg_dist_partition')")).scalar_one() is None:
        return False
    return connection.execute(sa.text(
        "SELECT count(*) FROM pg_dist_partition WHERE logicalrelid = CAST(:t AS regclass)"),
        {"t": f"{context.config.attributes['schema']}.documents"}).scalar_one() > 0


def _run(statement: str) -> None:
    op.get_bind().connection.dbapi_connection.execute(statement)  # DDL as written: '%' is no placeholder


def _parts(definition: str) -> re.Match:
    match = _DEFINITION.search(definition)
    if match is None:  # another server's layout of pg_get_functiondef: stop before changing anything more
        raise RuntimeError(f"migration 0010 cannot read this function's definition, so the upgrade is rolled "
                           f"back and the index left as it was; report it with the definition:\n{definition}")
    return match


def upgrade() -> None:
    for definition in _definitions("sql"):
        match = _parts(definition)
        query = match["body"].strip().rstrip(";")
        _run(definition[:match.start()] + f"\n LANGUAGE plpgsql\n{match['attributes']}\nAS $function$\n"
             f"#variable_conflict use_column\nBEGIN\nRETURN QUERY {query};\nEND $function$")


def downgrade() -> None:
    if _distributed():  # its functions were PL/pgSQL before this revision too
        return
    for definition in _definitions("plpgsql"):
        match = _parts(definition)
        body = _PLPGSQL_BODY.match(match["body"])
        if body is None:  # not one this migration wrote
            continue
        _run(definition[:match.start()] + f"\n LANGUAGE sql\n{match['attributes']}\nAS $function$\n"
             f"{body['query']}\n$function$")
