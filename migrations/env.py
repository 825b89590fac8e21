"""Alembic environment for simdb.

simdb runs alembic in code (see simdb/migrate.py): the caller passes an open
connection whose search_path starts with the index's schema, the schema name,
and, when creating an index, its settings. There is no alembic.ini.
"""

from alembic import context

from simdb.schema import build_metadata

config = context.config
connection = config.attributes["connection"]
layout = config.attributes.get("layout")



def include_name(name, type_, parent_names):
    # The version table lives in the index's own schema, which is also the
    # default schema here, so autogenerate would otherwise report it as extra.
    return not (type_ == "table" and name == "alembic_version")


context.configure(
    connection=connection,
    include_name=include_name,
    target_metadata=build_metadata(layout) if layout is not None else None,
    version_table_schema=config.attributes["schema"],
    transaction_per_migration=False,
)

with context.begin_transaction():
    context.run_migrations()
