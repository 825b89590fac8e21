"""The shape maintainers rely on: layers that point one way, frozen migrations, one place per method.

* No module of simdb imports, directly or through others, a module that imports it back.
* The layers point one way: ``text`` knows no method, ``methods`` know no surface (and of the
  PostgreSQL layer only the COPY path), ``pg`` knows no surface; nothing outside ``methods``
  tests which method it holds.
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


def imports_of(path: Path) -> set[str]:
    """The simdb modules a file imports, anywhere in it (lazy imports count: they are layering too)."""
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
            if target.startswith("simdb"):
                found.add(target)
                found |= {f"{target}.{alias.name}" for alias in node.names}
    return found


def graph() -> dict[str, set[str]]:
    modules = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    return {name: {m for m in imports_of(path) if m in modules and m != name} for name, path in modules.items()}


def test_no_module_imports_in_a_cycle():
    edges = graph()
    for package in [m for m in edges if (PACKAGE / Path(*m.split(".")[1:]) / "__init__.py").exists()]:
        edges[package] = {m for m in edges[package] if not m.startswith(package + ".")}  # a package's own parts
        for m in edges:  # importing a module runs its package's __init__: not a dependency of ours on it
            if m.startswith(package + "."):
                edges[m].discard(package)
    cycles = []

    def visit(node, stack, on_stack, done):
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges[node]):
            if nxt in on_stack:
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in done:
                visit(nxt, stack, on_stack, done)
        on_stack.discard(node)
        stack.pop()
        done.add(node)

    done: set[str] = set()
    for node in sorted(edges):
        if node not in done:
            visit(node, [], set(), done)
    assert cycles == []


@pytest.mark.parametrize("layer, forbidden", [
    ("simdb.text", ("simdb.methods", "simdb.pg", "simdb.ingest", "simdb.index", "simdb.cli", "simdb.report")),
    ("simdb.methods", ("simdb.ingest", "simdb.index", "simdb.cli", "simdb.report", "simdb.pg.chunks",
                       "simdb.pg.reads", "simdb.pg.catalog", "simdb.settings")),
    ("simdb.pg", ("simdb.ingest", "simdb.index", "simdb.cli", "simdb.report", "simdb.calibrate")),
    ("simdb.inputs", ("simdb.methods", "simdb.pg", "simdb.ingest", "simdb.index", "simdb.cli")),
])
def test_layers_point_one_way(layer, forbidden):
    edges = graph()
    leaks = {(module, target) for module, targets in edges.items() if module.startswith(layer)
             for target in targets if target.startswith(forbidden)}
    assert leaks == set()


def test_only_the_methods_know_which_method_they_are():
    """No isinstance on a method's classes, no comparison with a method's name, outside simdb/methods."""
    pattern = re.compile(r"isinstance\([^)]*(SimHash|MinHash|BlockLayout|MinHashSettings|FingerprintSettings)"
                         r"|(method|\.name) *[!=]= *[\"'](simhash|minhash)[\"']")
    found = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
             for path in PACKAGE.rglob("*.py") if "methods" not in path.parts
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if pattern.search(line)]
    assert found == []


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
            create_functions(connection, schema, index.settings.method)
            create_views(connection, schema, index.settings.method)
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


def test_only_the_postgresql_layer_and_the_methods_speak_sql():
    pattern = re.compile(r"sa\.text\(|exec_driver_sql\(|\.copy\(f?\"COPY")
    found = [f"{path.relative_to(ROOT)}:{number}" for path in PACKAGE.rglob("*.py")
             if not {"pg", "methods"} & set(path.relative_to(PACKAGE).parts)
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if pattern.search(line)]
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
