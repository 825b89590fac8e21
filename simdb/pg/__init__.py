"""The PostgreSQL layer: everything that speaks SQL.

* :mod:`.database`: connections (a server by URL, or the embedded one), the advisory locks,
  database errors as simdb's errors;
* :mod:`.migrate` and :mod:`.schema`: the schema's history (alembic) and its current shape;
* :mod:`.copy`: the one binary COPY path, in (psycopg's ``set_types``) and out (parsed by numpy);
* :mod:`.chunks`: one ingest chunk's transaction; :mod:`.clusters`, :mod:`.remove`,
  :mod:`.relayout`: what else writes to an archive;
* :mod:`.reads`: what the library reads (pairs, exports, statistics, the report's data);
* :mod:`.functions`: the analysts' functions and views, and the read-only role;
* :mod:`.methods`: each method's SQL (candidate joins, key expressions, the analysts' functions),
  registered by the method's name: the methods (:mod:`simdb.methods`) compute and run no SQL.
"""

#: The PostgreSQL schema an index lives in unless told otherwise (here, not in :mod:`.database`, so that the
#: command line's options are declared without loading SQLAlchemy).
DEFAULT_SCHEMA = "simdb"
#: Shards per distributed table unless told: Citus's own default, room for 32 workers (:mod:`.citus`; here for
#: the command line's help, as above).
DEFAULT_SHARDS = 32
