"""The shape maintainers rely on: layers that point one way, frozen migrations, one place per method.

* No module of simdb imports, directly or through others, a module that imports it back (a package's
  ``__init__`` is a module like any other).
* The layers point one way (:data:`LAYERS`: base -> text -> methods -> pg -> surfaces; ``python -m
  tests.test_structure`` prints them): ``text`` knows no method, ``methods`` compute and know neither a
  surface nor the database (no SQLAlchemy, psycopg, alembic or ``simdb.pg``, no SQL), ``pg`` knows no
  surface; nothing outside ``methods`` tests which method it holds.
* Migrations (and env.py) import nothing from simdb, so today's code cannot change what an old
  migration does; and what they create is what today's code would create (no drift).
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from simdb import Index
from simdb.pg.functions import create_functions, create_views, drop_functions_and_views
from simdb.settings import IndexSettings
from tests.conftest import migrated_index

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "simdb"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def bound_names(path: Path) -> set[str]:
    """The names a module binds at its top level (and lists in ``__all__``): ``from package import name`` reads
    such a name from the package's ``__init__``, and any other name is the package's submodule."""
    names = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(alias.asname or alias.name).partition(".")[0] for alias in node.names}
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
                if isinstance(target, ast.Name) and target.id == "__all__":
                    names |= {c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant)}
    return names


def imports_of(path: Path) -> set[str]:
    """The simdb modules a file imports, anywhere in it (lazy imports count: they are layering too).

    ``from package import name`` depends on the package's ``__init__`` when that binds ``name`` (or it is a
    module attribute such as ``__version__``), and on the submodule ``package.name`` otherwise: Python reads
    the attribute first and imports the submodule only when there is none."""
    module = module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("simdb")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("simdb"):
                continue
            init = PACKAGE.parent / Path(*target.split(".")) / "__init__.py"
            bound = bound_names(init) if init.exists() else None
            for alias in node.names:
                if bound is None or alias.name in bound or alias.name.startswith("__"):
                    found.add(target)  # a name defined in a module, or bound by a package's __init__
                else:
                    found.add(f"{target}.{alias.name}")  # a submodule (compiled ones have no node in the graph)
    return found


def graph() -> dict[str, set[str]]:
    modules = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    return {name: {m for m in imports_of(path) if m in modules and m != name} for name, path in modules.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan): each holds at least one cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(edges[node]):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            connect(node)
    return found


def test_no_module_imports_in_a_cycle():
    """Every edge counts, a package's to its parts and a part's to its package's ``__init__`` too: a package
    that imports its parts is a module like any other. A cycle is shown with each of its modules' edges."""
    edges = graph()
    found = {" <-> ".join(component): {module: sorted(edges[module] & set(component)) for module in component}
             for component in cycles(edges)}
    assert found == {}


@pytest.mark.parametrize("layer, forbidden", [
    ("simdb.text", ("simdb.methods", "simdb.pg", "simdb.ingest", "simdb.index", "simdb.cli", "simdb.report")),
    ("simdb.methods", ("simdb.ingest", "simdb.index", "simdb.cli", "simdb.report", "simdb.pg", "simdb.settings")),
    ("simdb.pg", ("simdb.ingest", "simdb.index", "simdb.cli", "simdb.report", "simdb.calibrate")),
    ("simdb.inputs", ("simdb.methods", "simdb.pg", "simdb.ingest", "simdb.index", "simdb.cli")),
])
def test_layers_point_one_way(layer, forbidden):
    edges = graph()
    leaks = {(module, target) for module, targets in edges.items() if module.startswith(layer)
             for target in targets if target.startswith(forbidden)}
    assert leaks == set()


#: The layers, lowest first: a module is in the first whose prefixes name it, and imports only from its own
#: layer and those below.
LAYERS = [
    ("base", ("simdb.errors", "simdb.bits", "simdb.version", "simdb.matches", "simdb.jsonlines", "simdb.outputs",
              "simdb.progress", "simdb.charts", "simdb.diff", "simdb.clock")),
    ("text", ("simdb.text", "simdb.inputs", "simdb.native")),  # native: the compiled kernels of text and sketches
    ("methods", ("simdb.methods", "simdb.settings", "simdb.decisions")),
    ("pg", ("simdb.pg",)),
    ("surfaces", ("simdb",)),  # ingest, index, cli, report, ... and the package's __init__
]


def layer_of(module: str) -> int:
    return next(number for number, (_, prefixes) in enumerate(LAYERS)
                if any(module == prefix or module.startswith(prefix + ".") for prefix in prefixes))


def layer_table() -> str:
    """The layers, lowest first: each with its modules' count and the layers it imports from."""
    edges = graph()
    lines = []
    for number, (name, _) in enumerate(LAYERS):
        modules = sorted(m for m in edges if layer_of(m) == number)
        below = sorted({layer_of(t) for m in modules for t in edges[m]} - {number})
        folders = sorted({m.split(".")[1] if "." in m else "__init__" for m in modules})
        lines.append(f"{name:<9} {len(modules):>3} modules, imports {', '.join(LAYERS[i][0] for i in below) or '-':<22}"
                     f" {' '.join(folders)}")
    return "\n".join(lines)


def test_the_layers_point_down():
    """Printed with ``python -m tests.test_structure`` (or this test with ``-s``)."""
    edges = graph()
    print("\n" + layer_table())
    upward = sorted(f"{module} ({LAYERS[layer_of(module)][0]}) -> {target} ({LAYERS[layer_of(target)][0]})"
                    for module, targets in edges.items() for target in targets if layer_of(target) > layer_of(module))
    assert upward == []


#: What the methods never import: they compute, and the PostgreSQL layer runs their SQL.
DATABASE_MODULES = ("sqlalchemy", "psycopg", "alembic", "simdb.pg")
#: Words that make a string SQL (upper case, as simdb writes its SQL).
SQL_WORDS = re.compile(r"\b(SELECT|INSERT|UPDATE|DELETE|CREATE|ALTER|DROP|JOIN|WHERE|COPY|UNION)\b")
#: Calls that execute SQL on a connection, a cursor or an engine.
EXECUTING = {"execute", "executemany", "exec_driver_sql", "copy", "cursor", "connect", "begin", "scalar", "scalars"}


def test_the_methods_compute_and_run_no_sql():
    """Nothing under simdb/methods imports a database module, calls what executes SQL, or writes SQL."""
    found = []
    for path in sorted((PACKAGE / "methods").rglob("*.py")):
        here = str(path.relative_to(ROOT))
        imported = {name for name in imports_of(path)}
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level:
                imported.add(node.module or "")
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in EXECUTING:
                found.append(f"{here}:{node.lineno}: calls .{node.func.attr}()")
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and SQL_WORDS.search(node.value):
                found.append(f"{here}:{node.lineno}: SQL {node.value.strip()[:60]!r}")
        found += [f"{here}: imports {name}" for name in sorted(imported)
                  if any(name == m or name.startswith(m + ".") for m in DATABASE_MODULES)]
    assert found == []


def test_the_methods_sketch_without_loading_the_database_layer():
    """Both methods turn a text into a sketch, keys and distances with no database module loaded."""
    code = ("import sys; from simdb.methods import MinHash, SimHash\n"
            "for method in (SimHash.new(), MinHash.new()):\n"
            "    sketches = method.sketch_all(['a text to sketch, long enough for its shingles', 'another text'])\n"
            "    method.keys(sketches); method.distances(sketches[0], method.stored(sketches))\n"
            f"print(sorted(m for m in sys.modules if m.split('.')[0] in {DATABASE_MODULES[:3]!r}"
            " or m.startswith('simdb.pg')))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


def test_only_the_methods_know_which_method_they_are():
    """No isinstance on a method's classes, no comparison with a method's name (or its sketch column's), outside
    simdb/methods: the PostgreSQL layer asks the registry of :mod:`simdb.pg.methods` by name, and the CLI asks
    the method (``Method.parse``)."""
    pattern = re.compile(r"isinstance\([^)]*(SimHash|MinHash|BlockLayout|MinHashSettings|FingerprintSettings)"
                         r"|[!=]= *[\"'](simhash|minhash|signature)[\"']|[\"'](simhash|minhash|signature)[\"'] *[!=]=")
    found = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
             for path in PACKAGE.rglob("*.py") if "methods" not in path.relative_to(PACKAGE).parts
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if pattern.search(line)]
    assert found == []


def test_only_a_method_s_own_folders_import_its_modules():
    """A method's modules (``simdb.methods.simhash...``) are imported by the method's own folder, its SQL
    (``simdb.pg.methods.simhash``) and the registry that names every method (:mod:`simdb.methods`); the rest
    asks the :class:`~simdb.methods.Method` it holds (``cli.py`` imported SimHash's largest distance, defaults
    and IDF table, ``parallel.py`` its tokenizer)."""
    from simdb.methods import Method

    found = []
    for module, targets in graph().items():
        for name in Method.names():
            own = (f"simdb.methods.{name}", f"simdb.pg.methods.{name}")
            if module == "simdb.methods" or any(module == m or module.startswith(m + ".") for m in own):
                continue
            found += [f"{module} -> {target}" for target in sorted(targets)
                      if target == own[0] or target.startswith(own[0] + ".")]
    assert found == []


def method_interface() -> list[str]:
    """The public members of :class:`simdb.methods.Method`: its attributes, properties and methods, those the
    registry offers (``named``, ``names``, ``stored_class``) included."""
    from simdb.methods import Method

    return sorted(name for name in {*vars(Method), *Method.__annotations__} if not name.startswith("_"))


def test_a_method_s_storage_is_the_database_layer_s():
    """Where a sketch is stored (its column, and whether a segment is read by its sketches) is said by the
    method's SQL (:class:`simdb.pg.methods.MethodSQL`), not by the method, which computes."""
    from simdb.methods import Method
    from simdb.pg.methods import sql_of

    assert not {"sketch_column", "keys_from_stored"} & set(method_interface())
    for name in Method.names():
        assert sql_of(Method.named(name).new()).sketch_column[0].isidentifier()


def test_no_migration_imports_simdb():
    for path in sorted((ROOT / "migrations").rglob("*.py")):
        assert not any(name.startswith("simdb") for name in imports_of(path)), path


def definitions(connection: sa.Connection, schema: str) -> dict[str, tuple[str, str]]:
    """Every function and view of ``schema`` with its definition (whitespace normalised) and comment."""
    functions = connection.execute(sa.text(
        "SELECT p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ')', pg_get_functiondef(p.oid), "
        "obj_description(p.oid, 'pg_proc') FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
        "WHERE n.nspname = :s"), {"s": schema}).all()
    views = connection.execute(sa.text(
        "SELECT c.relname, pg_get_viewdef(c.oid), obj_description(c.oid, 'pg_class') FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = :s AND c.relkind = 'v'"),
        {"s": schema}).all()
    return {name: (" ".join(body.split()), comment) for name, body, comment in [*functions, *views]}


@pytest.mark.parametrize("settings", [{}, {"blocks": 5}, {"method": "minhash", "threshold": 0.7},
                                      {"method": "minhash", "verify": "exact"}],
                         ids=["simhash", "simhash-5-blocks", "minhash", "minhash-exact"])
def test_the_migrations_create_what_todays_code_creates(settings, database_url, schema):
    migrated_index(database_url, schema, IndexSettings.new(**settings))  # Index.create would make today's
    with Index.open(database_url, schema=schema) as index:
        with index.database.engine.begin() as connection:  # one transaction, rolled back: the index stays as it was
            migrated = definitions(connection, schema)
            drop_functions_and_views(connection, schema)
            assert definitions(connection, schema) == {}
            create_functions(connection, schema, index.settings.method, distributed=index.context.distributed,
                             keyed=index.context.keyed)
            create_views(connection, schema, index.settings.method, distributed=index.context.distributed)
            assert definitions(connection, schema) == migrated and len(migrated) >= 7
            connection.rollback()


@pytest.mark.parametrize("path", sorted((ROOT / "scripts").glob("*.py")), ids=lambda p: p.name)
def test_the_scripts_import_what_exists(path):
    """The benchmarks are not run by the suite; what they import from simdb must still exist."""
    import importlib

    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("simdb"):
            module = importlib.import_module(node.module)
            for alias in node.names:
                assert hasattr(module, alias.name) or importlib.util.find_spec(f"{node.module}.{alias.name}"), \
                    f"{path.name}: from {node.module} import {alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("simdb"):
                    importlib.import_module(alias.name)


def test_only_the_postgresql_layer_speaks_sql():
    pattern = re.compile(r"sa\.text\(|exec_driver_sql\(|\.copy\(f?\"COPY")
    found = [f"{path.relative_to(ROOT)}:{number}" for path in PACKAGE.rglob("*.py")
             if "pg" not in path.relative_to(PACKAGE).parts
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if pattern.search(line)]
    assert found == []


#: SQL as code writes it: a query, a condition, a join, a bound parameter (not SQL's words in a help text).
SQL_TEXT = re.compile(r"\bSELECT\b.+\bFROM\b|\bWHERE\b|\bJOIN\b.+\bON\b|\b(AND|OR)\b|[=(<>] *:[a-z_]+")


def test_only_the_postgresql_layer_writes_sql():
    """No string outside simdb/pg (docstrings aside) is SQL: ``Index.pairs`` built its WHERE clause in index.py,
    the layer that promises to speak none."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if "pg" in path.relative_to(PACKAGE).parts:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                      and node.body and isinstance(node.body[0], ast.Expr)
                      and isinstance(node.body[0].value, ast.Constant)}
        found += [f"{path.relative_to(ROOT)}:{node.lineno}: {node.value.strip()[:60]!r}" for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
                  and SQL_TEXT.search(node.value)]
    assert found == []


def option_name(call: ast.Call) -> str:
    """The parameter name of a ``click.option(...)`` call: its name argument, else its first long flag's."""
    declared = [arg.value for arg in call.args if isinstance(arg, ast.Constant) and isinstance(arg.value, str)]
    names = [d for d in declared if not d.startswith("-")]
    return names[0] if names else declared[0].split("/")[0].lstrip("-").replace("-", "_")


def test_every_default_is_defined_once():
    """The library defines each default once, and the CLI's options and help read it: no option named after a
    library parameter (a method's ``new``, ``IndexSettings.new``, the segment policy, the shards) states its
    default or its help's ``[default: N]`` as a literal, and no method's ``new`` restates its settings' defaults
    (the CLI said --shingle-size 3, --threshold 0.8, --segment-size 1,000,000 ... by hand)."""
    import inspect

    from simdb.methods import Method

    library = {name for function in (IndexSettings.new, *(Method.named(m).new for m in Method.names()))
               for name in inspect.signature(function).parameters} | {"segment_size", "merge_factor", "bulk_chunk",
                                                                      "shards"}
    found = []
    for node in ast.walk(ast.parse((PACKAGE / "cli.py").read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "click.option" and option_name(node) in library:
            for keyword in node.keywords:
                value = keyword.value
                if keyword.arg == "default" and isinstance(value, ast.Constant) and value.value is not None:
                    found.append(f"cli.py:{node.lineno}: {option_name(node)} default={value.value!r}")
                if keyword.arg == "help" and re.search(r"\[default: \d", ast.unparse(value).partition("{")[0]):
                    found.append(f"cli.py:{node.lineno}: {option_name(node)} help states its default")
    for path in sorted((PACKAGE / "methods").glob("*/__init__.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef) and node.name == "new":
                found += [f"{path.relative_to(ROOT)}:{node.lineno}: new() default {ast.unparse(value)}"
                          for value in node.args.kw_defaults
                          if isinstance(value, ast.Constant) and value.value is not None]
    assert found == []
    from simdb.cli import init

    for option in init.params:  # and what the CLI shows is the library's
        for function in (IndexSettings.new, *(Method.named(m).new for m in Method.names())):
            parameter = inspect.signature(function).parameters.get(option.name)
            if parameter is not None and option.default is not None:
                assert option.default == parameter.default, option.name


def test_the_segment_policy_is_the_stored_settings_own():
    """``IndexSettings.segments`` is a :class:`SegmentPolicy` (it was a raw dict beside it), read back from the
    settings rows as it was written, and a row from before bulk chunks takes today's default."""
    from simdb.settings import SegmentPolicy

    settings = IndexSettings.new()
    assert isinstance(settings.segments, SegmentPolicy)
    assert IndexSettings.from_rows(settings.to_rows()).segments == settings.segments == SegmentPolicy()
    older = {**settings.to_rows(), "segments": {"size": 5000, "merge_factor": 3}}
    assert IndexSettings.from_rows(older).segments == SegmentPolicy(size=5000, merge_factor=3)


def test_an_open_index_s_facts_are_passed_not_read_again():
    """Whether an index is distributed is read once, with its settings, when it is opened (or known from the
    settings it is created with): every other code path (reads, check, ingest's chunks and segments, merges,
    views and functions, the reader role) is handed it by the index's context (:class:`simdb.pg.context.
    IndexContext`), not a query of the ``distributed`` settings row per call (``is_distributed()`` made 7)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                    and re.search(r"name\s*=\s*'distributed'", node.value)):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: reads the distributed settings row")
            if isinstance(node, (ast.FunctionDef, ast.Name, ast.Attribute, ast.alias)) and "is_distributed" in (
                    getattr(node, "name", None), getattr(node, "id", None), getattr(node, "attr", None)):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: is_distributed")
    assert found == []


def test_the_unit_lane_needs_no_database():
    """``-m unit`` selects the tests that ask for no database fixture, and then nothing connects to one (nor
    starts an embedded one): here the test database is a closed port, and collecting says so and succeeds."""
    env = {**os.environ, "SIMDB_TEST_DATABASE_URL": "postgresql://postgres@127.0.0.1:1/closed"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-m", "unit", "--collect-only", "-q", "-p",
                           "no:cacheprovider"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "simdb test database: none" in done.stdout
    collected = [line for line in done.stdout.splitlines() if "::" in line]
    assert len(collected) > 150 and any("test_fast_paths.py" in line for line in collected)
    assert not any("test_segments.py::test_segments_merges" in line for line in collected)


if __name__ == "__main__":
    print(layer_table())
    print(f"method interface: {len(method_interface())} members")
