"""Schema migrations, run in code (no alembic.ini).

The migration scripts live in the top-level ``migrations/`` folder of a source
checkout and inside the package (``simdb/migrations``) in an installed wheel;
:func:`migrations_path` finds whichever is there.
"""

from __future__ import annotations

import functools
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from .schema import build_metadata


def migrations_path() -> Path:
    package = Path(__file__).resolve().parent.parent
    for candidate in (package / "migrations", package.parent / "migrations"):
        if (candidate / "env.py").is_file():
            return candidate
    raise RuntimeError(f"simdb's migrations are missing (looked in {package / 'migrations'} and "
                       f"{package.parent / 'migrations'}); reinstall simdb")


def alembic_config(connection: sa.Connection, schema: str, *, layout=None, new_index_settings: dict | None = None,
                   new_index_idf_terms: dict | None = None) -> Config:
    """``layout`` is the index's key layout, whose key columns the current schema's metadata has (for
    ``alembic check``); a new index also passes its settings rows and, with tfidf weighting, its IDF table."""
    config = Config()
    config.set_main_option("script_location", str(migrations_path()))
    metadata = build_metadata(tuple(layout.key_columns)) if layout is not None else None
    config.attributes.update(connection=connection, schema=schema, target_metadata=metadata,
                             new_index_settings=new_index_settings, new_index_idf_terms=new_index_idf_terms)
    return config


@functools.cache
def script_directory() -> ScriptDirectory:
    """The migration scripts, read once per process (alembic compiles every script each time it reads them)."""
    config = Config()
    config.set_main_option("script_location", str(migrations_path()))
    return ScriptDirectory.from_config(config)


def head_revision() -> str:
    return script_directory().get_current_head()


def known_revisions() -> set[str]:
    return {script.revision for script in script_directory().walk_revisions()}


def current_revision(connection: sa.Connection, schema: str) -> str | None:
    context = MigrationContext.configure(connection, opts={"version_table_schema": schema})
    return context.get_current_revision()


def upgrade(connection: sa.Connection, schema: str, *, layout=None, new_index_settings: dict | None = None,
            new_index_idf_terms: dict | None = None, revision: str = "head") -> None:
    command.upgrade(alembic_config(connection, schema, layout=layout, new_index_settings=new_index_settings,
                                   new_index_idf_terms=new_index_idf_terms), revision)


def stamp(connection: sa.Connection, schema: str, revision: str = "head") -> None:
    """Record ``revision`` in the index's version table (made where missing) without running a migration: a
    new index is created at the head revision directly (:func:`simdb.pg.catalog.create_index`)."""
    MigrationContext.configure(connection, opts={"version_table_schema": schema}).stamp(script_directory(), revision)


def downgrade(connection: sa.Connection, schema: str, revision: str = "base") -> None:
    command.downgrade(alembic_config(connection, schema), revision)
