"""Schema migrations, run in code (no alembic.ini).

The migration scripts live in the top-level ``migrations/`` folder of a source
checkout and inside the package (``simdb/migrations``) in an installed wheel;
:func:`migrations_path` finds whichever is there.

Opening an index only asks which revision it is at and whether that is the head: both are read
without alembic (its import and its reading of every script took half a second of each command), from
the version table and from the scripts' ``revision`` / ``down_revision`` lines
(:func:`revision_chain`; the tests hold it equal to alembic's reading). alembic is imported to migrate.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import TYPE_CHECKING

import sqlalchemy as sa

from ..errors import IncompatibleIndex
from .schema import build_metadata

if TYPE_CHECKING:
    from alembic.config import Config
    from alembic.script import ScriptDirectory


def migrations_path() -> Path:
    package = Path(__file__).resolve().parent.parent
    for candidate in (package / "migrations", package.parent / "migrations"):
        if (candidate / "env.py").is_file():
            return candidate
    raise RuntimeError(f"simdb's migrations are missing (looked in {package / 'migrations'} and "
                       f"{package.parent / 'migrations'}); reinstall simdb")


def alembic_config(connection: sa.Connection, schema: str, *, layout=None, key_columns=None,
                   new_index_settings: dict | None = None, new_index_idf_terms: dict | None = None) -> Config:
    """``key_columns`` are the key columns ``documents`` has in the current schema's metadata (for ``alembic
    check``): ``layout``'s (the index's key layout) where not given, none on the keyed distributed layout
    (:func:`simdb.pg.keyed.document_key_columns`); a new index also passes its settings rows and, with tfidf
    weighting, its IDF table."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(migrations_path()))
    if key_columns is None and layout is not None:
        key_columns = layout.key_columns
    metadata = build_metadata(tuple(key_columns)) if key_columns is not None else None
    config.attributes.update(connection=connection, schema=schema, target_metadata=metadata,
                             new_index_settings=new_index_settings, new_index_idf_terms=new_index_idf_terms)
    return config


@functools.cache
def script_directory() -> ScriptDirectory:
    """The migration scripts, read once per process (alembic compiles every script each time it reads them)."""
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    config = Config()
    config.set_main_option("script_location", str(migrations_path()))
    return ScriptDirectory.from_config(config)


_REVISION_LINE = re.compile(r"^(down_revision|revision) = (None|\"(\w+)\")$", re.MULTILINE)


@functools.cache
def revision_chain() -> dict[str, str | None]:
    """Each migration script's revision -> the revision it follows (None for the first), read from the lines
    every script starts with (``revision = "0007"``, ``down_revision = "0006"``)."""
    chain: dict[str, str | None] = {}
    for script in sorted((migrations_path() / "versions").glob("*.py")):
        found = {match[1]: match[3] for match in _REVISION_LINE.finditer(script.read_text(encoding="utf-8"))}
        if "revision" not in found or "down_revision" not in found:
            raise RuntimeError(f"{script} lacks its revision = ... or down_revision = ... line; reinstall simdb")
        chain[found["revision"]] = found["down_revision"]
    return chain


def head_revision() -> str:
    chain = revision_chain()
    heads = set(chain) - set(chain.values())
    if len(heads) != 1:
        raise RuntimeError(f"simdb's migrations have {len(heads)} heads ({', '.join(sorted(heads))}); reinstall simdb")
    return heads.pop()


def known_revisions() -> set[str]:
    return set(revision_chain())


def current_revision(connection: sa.Connection, schema: str) -> str | None:
    """The revision the index in ``schema`` is at (its version table's one row), or None where there is none."""
    if connection.execute(sa.text("SELECT to_regclass(:table)"), {"table": f"{schema}.alembic_version"}).scalar() \
            is None:
        return None
    rows = connection.execute(sa.text(f"SELECT version_num FROM {schema}.alembic_version")).scalars().all()
    if len(rows) > 1:
        raise IncompatibleIndex(f"the version table of schema {schema!r} holds {len(rows)} revisions; simdb's "
                                "migrations are one line: the table was changed by hand")
    return rows[0] if rows else None


def upgrade(connection: sa.Connection, schema: str, *, layout=None, key_columns=None,
            new_index_settings: dict | None = None, new_index_idf_terms: dict | None = None,
            revision: str = "head") -> None:
    from alembic import command

    command.upgrade(alembic_config(connection, schema, layout=layout, key_columns=key_columns,
                                   new_index_settings=new_index_settings,
                                   new_index_idf_terms=new_index_idf_terms), revision)


def stamp(connection: sa.Connection, schema: str, revision: str = "head") -> None:
    """Record ``revision`` in the index's version table (made where missing) without running a migration: a
    new index is created at the head revision directly (:func:`simdb.pg.catalog.create_index`)."""
    from alembic.runtime.migration import MigrationContext

    MigrationContext.configure(connection, opts={"version_table_schema": schema}).stamp(script_directory(), revision)


def downgrade(connection: sa.Connection, schema: str, revision: str = "base") -> None:
    from alembic import command

    command.downgrade(alembic_config(connection, schema), revision)
