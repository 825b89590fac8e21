"""Alembic environment for simdb.

simdb runs alembic in code (see simdb/pg/migrate.py): the caller passes an open connection whose
search_path starts with the index's schema, the schema name, and, when creating an index, its
settings; for ``alembic check`` it also passes the current schema's metadata. Nothing here (or in
versions/) imports simdb: migrations are history and must not change when simdb's code does.
There is no alembic.ini.
"""

import re

from alembic import context

config = context.config


#: Segments of ``documents`` (revision 0007): partitions simdb creates and merges as the archive grows.
SEGMENT = re.compile(r"^documents_[0-9]+(_merged)?$")
#: The keyed distributed layout's tables (its keys table named after its layout's first key column, 0020): made
#: beside the migrated schema when a distributed index is created or moved to that layout, and checked on every
#: open, as the tables' distribution over Citus is.
KEYED_LAYOUT_TABLES = re.compile(r"^(keys_[0-9]+|key_probes|external_ids|external_id_probes)$")


def include_name(name, type_, parent_names):
    # The version table lives in the index's own schema, which is also the
    # default schema here, so autogenerate would otherwise report it as extra;
    # segments are described by the partitioned table they belong to.
    return not (type_ == "table" and (name == "alembic_version" or SEGMENT.match(name)
                                      or KEYED_LAYOUT_TABLES.match(name)))


context.configure(
    connection=config.attributes["connection"],
    include_name=include_name,
    target_metadata=config.attributes.get("target_metadata"),
    version_table_schema=config.attributes["schema"],
    transaction_per_migration=False,
)

with context.begin_transaction():
    context.run_migrations()
