"""A typed-in text sketched inside PostgreSQL: ``simdb_sketch(text)``, ``simdb_near_text``, ``simdb_similar_text``.

Only simdb's own Python can sketch a text as the index does (normalization, tokenizer, IDF weights,
shingles, permutations, all read from the index's ``settings``), so ``simdb_sketch`` is a PL/Python
(``plpython3u``) function that imports simdb in the server's backend and runs the path of
:meth:`simdb.Index.fingerprint`: the stored settings, the canaries checked, :func:`check_text`, the
method's sketch in its stored form. ``simdb_near_text`` and ``simdb_similar_text`` hand that sketch to
the index's own lookups (``simdb_near``, ``simdb_similar``).

Every index has the three functions from its creation (migration 0013 gives them to older ones), but
``simdb_sketch`` starts as a placeholder that raises one line saying how to enable it: PL/Python is an
untrusted language, which only a superuser can install (``CREATE EXTENSION plpython3u``) or write functions
in, which many servers lack (the embedded server, managed services), and whose code depends on where simdb
is installed on the server's machine, not on the schema. So a migration cannot write it; ``simdb
sql-functions`` (:func:`install`) does, as a superuser, with the paths of the environment it runs in, after
checking that the server's Python imports that simdb and sketches as it does.
"""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path
from typing import TYPE_CHECKING

from psycopg import errors as pg_errors
from psycopg import sql

from ..errors import PermissionDenied, SimdbError

if TYPE_CHECKING:
    import sqlalchemy as sa

    from ..methods import Method

ENABLE = ("as a superuser, install PL/Python (Debian: apt-get install postgresql-plpython3-<server major version>), "
          "run CREATE EXTENSION plpython3u in the database, then `simdb sql-functions`")
INSTEAD = "until then `simdb query TEXT` and `simdb fingerprint --index TEXT` answer from the shell"
#: What simdb_sketch raises until ``simdb sql-functions`` has installed it (the same words as migration 0013's).
NOT_ENABLED = f"simdb_sketch cannot run simdb's Python in this database yet: {ENABLE}; {INSTEAD}"


def sketch_type(method: Method | str) -> str:
    """The SQL type of a sketch as the documents table stores it."""
    from .methods import MethodSQL

    return MethodSQL.named(method if isinstance(method, str) else method.name).sketch_type


def placeholder_functions(schema: str, method: Method | str) -> list[tuple[str, str, str]]:
    """``(signature, CREATE statement, comment)`` of ``simdb_sketch`` as a placeholder that raises
    :data:`NOT_ENABLED`, and of the two lookups of a text; migration 0013 writes the same."""
    returns = sketch_type(method)
    message = NOT_ENABLED.replace("'", "''")
    lookups = []
    for name, lookup, parameter, parameter_type, column, column_type in (
            ("simdb_near_text", "simdb_near", "max_distance", "integer", "distance", "integer"),
            ("simdb_similar_text", "simdb_similar", "min_similarity", "double precision", "similarity", "double precision")):
        lookups.append((
            f"{name}(text, {parameter_type})",
            f"""CREATE OR REPLACE FUNCTION {schema}.{name}(content text, {parameter} {parameter_type} DEFAULT NULL)
            RETURNS TABLE (document_id bigint, {column} {column_type})
            LANGUAGE plpgsql STABLE AS $$
            BEGIN
                IF {parameter} IS NULL THEN
                    RETURN QUERY SELECT l.document_id, l.{column}::{column_type}
                                 FROM {schema}.{lookup}({schema}.simdb_sketch(content)) l;
                ELSE
                    RETURN QUERY SELECT l.document_id, l.{column}::{column_type}
                                 FROM {schema}.{lookup}({schema}.simdb_sketch(content), {parameter}) l;
                END IF;
            END $$""",
            f"{lookup} of a text: the stored documents {lookup} finds for simdb_sketch(content) ({parameter}: "
            f"{lookup}'s default when NULL)."))
    return [
        ("simdb_sketch(text)",
         f"""CREATE OR REPLACE FUNCTION {schema}.simdb_sketch(content text) RETURNS {returns}
            LANGUAGE plpgsql STABLE STRICT AS $$
            BEGIN
                RAISE EXCEPTION '{message}' USING ERRCODE = 'feature_not_supported';
            END $$""",
         "The index's sketch of a text, as ingest stores it (SimHash: the fingerprint; MinHash: the signature). "
         "PL/Python, installed by `simdb sql-functions`; until then it says how to enable it."),
        *lookups,
    ]


def create_placeholders(connection: sa.Connection, schema: str, method: Method) -> None:
    """The text functions of a new index, ``simdb_sketch`` a placeholder (see the module's docstring)."""
    raw = connection.connection.dbapi_connection
    for signature, statement, comment in placeholder_functions(schema, method):
        raw.execute(statement)
        raw.execute(f"COMMENT ON FUNCTION {schema}.{signature} IS " + sql.Literal(comment).as_string())


def environment_paths() -> list[str]:
    """Where this process finds simdb and its dependencies: simdb's parent folder and this environment's
    site-packages (whose ``.pth`` files the server's Python reads too, as an editable install needs)."""
    found = [str(Path(__file__).resolve().parent.parent.parent)]  # simdb/pg/plpython.py: the folder above simdb
    for name in ("purelib", "platlib"):
        path = sysconfig.get_paths()[name]
        if path not in found and Path(path).is_dir():
            found.append(path)
    return found


_BODY = '''
import sys
if "simdb_paths" not in SD:
    import site
    before = list(sys.path)
    for path in {paths!r}:
        site.addsitedir(path)
    # this environment first: the server's own site-packages may hold other versions of the same packages
    sys.path[:] = dict.fromkeys([*{paths!r}, *(p for p in sys.path if p not in before), *before])
    SD["simdb_paths"] = True
try:
    from simdb.pg import plpython
except Exception as error:
    plpy.error("simdb_sketch cannot import simdb from " + {shown!r} + " in the server's Python "
               + sys.version.split()[0] + ": " + " ".join(f"{{type(error).__name__}}: {{error}}".split())
               + "; run `simdb sql-functions` from an environment the server can read, with its Python version")
return plpython.sketch_in_server(plpy, SD, {schema!r}, content, {version!r})
'''


def function_body(schema: str, paths: list[str], version: str) -> str:
    """The Python of ``simdb_sketch``: find simdb where ``paths`` say, then :func:`sketch_in_server`."""
    return _BODY.format(paths=paths, shown=", ".join(paths), schema=schema, version=version)


def install(connection: sa.Connection, schema: str, method: Method, *, paths: list[str] | None = None,
            version: str | None = None) -> list[str]:
    """Replace the placeholder ``simdb_sketch`` with the PL/Python one, finding simdb in ``paths`` (default:
    this environment's, :func:`environment_paths`) and expecting simdb ``version`` (default: this one's);
    then check that the server sketches the canary texts as this process does. The paths it used.

    Raises :class:`PermissionDenied` or :class:`SimdbError`, each one line saying what to do, when the server
    lacks PL/Python, the role may not install it, or the server's Python cannot import this simdb."""
    from ..version import __version__
    from ..settings import CANARY_TEXTS

    paths = environment_paths() if paths is None else paths
    raw = connection.connection.dbapi_connection
    enabled = connection.exec_driver_sql("SELECT 1 FROM pg_extension WHERE extname = 'plpython3u'").first()
    for statement, failure in (
            *([] if enabled else [("CREATE EXTENSION plpython3u", "cannot enable PL/Python in this database")]),
            (f"CREATE OR REPLACE FUNCTION {schema}.simdb_sketch(content text) RETURNS {sketch_type(method)} "
             "LANGUAGE plpython3u STABLE STRICT AS " + sql.Literal(function_body(
                 schema, paths, version or __version__)).as_string(),
             "cannot write simdb_sketch in PL/Python")):
        try:
            with raw.transaction():  # a savepoint in the caller's transaction, which an error leaves usable
                raw.execute(statement)
        except pg_errors.UniqueViolation:  # another session enabled PL/Python between the check and here: its
            if not statement.startswith("CREATE EXTENSION"):  # pg_extension row is the one this one waited on
                raise
        except (pg_errors.InsufficientPrivilege, pg_errors.ReadOnlySqlTransaction):  # e.g. `simdb grant-reader`'s
            raise PermissionDenied(f"{failure}: PL/Python is an untrusted language, which only a superuser may "
                                   f"install or write functions in; {ENABLE}; {INSTEAD}") from None
        except (pg_errors.UndefinedFile, pg_errors.FeatureNotSupported, pg_errors.UndefinedObject) as error:
            reason = " ".join(str(error).split())
            raise SimdbError(f"{failure} ({reason}): {ENABLE}; {INSTEAD}") from None
    for text in CANARY_TEXTS:  # the same sketches in the server as here, or nothing is installed
        try:
            with raw.transaction():
                in_server = raw.execute(f"SELECT {schema}.simdb_sketch(%s)", [text]).fetchone()[0]
        except pg_errors.Error as error:  # the server's one line, without PL/Python's traceback
            raise SimdbError(" ".join((error.diag.message_primary or str(error)).removeprefix("plpy.Error: ")
                                      .split())) from None
        here = method.stored([method.sketch(text)])[0]
        if (bytes(in_server) if isinstance(here, bytes) else in_server) != here:
            raise SimdbError(f"the server's Python sketches {text[:30]!r} differently from this process "
                             f"(simdb found in {', '.join(paths)}): install simdb there as it is here")
    return paths


# -- in the server ---------------------------------------------------------------------------------------------


def sketch_in_server(plpy, cache: dict, schema: str, content: str, installed: str):
    """The body of ``simdb_sketch`` in the server's Python (``plpy`` and its session dictionary ``cache``): the
    index's method read from its settings (once per session until they change), checked against the canaries,
    then :meth:`simdb.Index.fingerprint`'s path."""
    from ..version import __version__
    from ..errors import SimdbError as Error
    from ..inputs import check_text
    from ..settings import IndexSettings

    if __version__ != installed:
        plpy.error(f"simdb_sketch was installed by simdb {installed}, and the server's Python imports simdb "
                   f"{__version__} from {Path(__file__).parent.parent}: run `simdb sql-functions` again")
    rows = {row["name"]: row["value"] for row in plpy.execute(
        f"SELECT name, value::text AS value FROM {schema}.settings ORDER BY name")}
    key = (schema, tuple(rows.items()))
    try:
        method = cache.get("simdb_method", {}).get(key)
        if method is None:
            settings = {name: json.loads(value) for name, value in rows.items()}
            side_tables = {}
            for table in IndexSettings.side_table_names(settings):
                result = plpy.execute(f"SELECT * FROM {schema}.{table}")
                name, value = result.colnames()[:2]
                side_tables[table] = {row[name]: row[value] for row in result}
            stored = IndexSettings.from_rows(settings, side_tables)
            stored.check_canaries()
            method = stored.method
            cache["simdb_method"] = {key: method}
        check_text(content, None, None)
        return method.stored([method.sketch(content)])[0]
    except Error as error:
        plpy.error(f"simdb_sketch: {' '.join(str(error).split())}")
