"""What a command loads before it does anything (issue 38: every command should feel instant).

Timings are measured by ``scripts/bench_cli.py``; these tests hold the structure that keeps them short."""

from __future__ import annotations

import json
import subprocess
import sys


def loaded_after(code: str) -> list[str]:
    """The modules a fresh interpreter holds after running ``code``."""
    result = subprocess.run([sys.executable, "-c", f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def test_import_simdb_loads_none_of_its_modules():
    """``import simdb`` loaded numpy and the methods (0.17 s) for names a command may not use: each public name is
    imported on first use (PEP 562)."""
    assert [name for name in loaded_after("import simdb") if name.startswith("simdb")] == ["simdb"]
    assert "numpy" not in loaded_after("import simdb")


def test_every_public_name_is_there_on_first_use():
    import simdb
    from simdb.errors import SimdbError
    from simdb.index import Index
    from simdb.methods.simhash.fingerprint import fingerprint

    assert simdb.Index is Index and simdb.SimdbError is SimdbError and simdb.fingerprint is fingerprint
    assert all(hasattr(simdb, name) for name in simdb.__all__)
    assert set(simdb.__all__) <= set(dir(simdb))
    names = loaded_after("from simdb import *")
    assert {"simdb.index", "simdb.ingest", "simdb.verdicts"} <= set(names)


def test_a_submodule_is_an_attribute_of_the_package_as_before():
    """``import simdb; simdb.errors.SimdbError`` worked while the package imported its modules; it still does, each
    on first use, and a name that is neither a public name nor a module is still an AttributeError."""
    code = ("import simdb\nassert simdb.errors.SimdbError.__name__ == 'SimdbError'\n"
            "assert simdb.bits.hamming(0, 3) == 2\n"
            "try:\n    simdb.no_such_thing\nexcept AttributeError as error:\n    print('refused:', error)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "refused: module 'simdb' has no attribute 'no_such_thing'"
