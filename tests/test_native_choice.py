"""The compiled fast paths are chosen once, in simdb/native.py, at import (issue 35 item 5): SIMDB_NATIVE=required
fails loudly without them, SIMDB_NATIVE=off gives the Python twins, and no other module of simdb imports the
compiled module or asks whether it is there."""

from __future__ import annotations

import ast
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

from simdb import native

ROOT = pathlib.Path(__file__).resolve().parents[1]

HIDE_COMPILED = textwrap.dedent("""
    import sys

    class Hide:  # as where simdb was built without a C compiler
        def find_spec(self, name, path=None, target=None):
            if name == "simdb._native":
                raise ImportError("hidden by the test")

    sys.meta_path.insert(0, Hide())
""")


def _python(code: str, mode: str | None) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key != native.NATIVE_ENV}
    if mode is not None:
        env[native.NATIVE_ENV] = mode
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)


def test_required_without_the_compiled_module_fails_loudly_saying_how_to_build_it():
    done = _python(HIDE_COMPILED + "import simdb\nfrom simdb import fingerprint\nprint(fingerprint('a text'))",
                   "required")
    assert done.returncode != 0 and done.stdout == ""
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: SIMDB_NATIVE=required") and "pip install -e ." in last, done.stderr
    assert "hidden by the test" in last


def test_without_the_compiled_module_and_not_required_simdb_runs_the_python_twins():
    done = _python(HIDE_COMPILED + "from simdb import native, fingerprint\nprint(native.description())\n"
                   "print(fingerprint('数据库索引的近似重复检测 near duplicate'))", None)
    assert done.returncode == 0, done.stderr
    description, fingerprint = done.stdout.split("\n", 1)
    assert description.startswith("not built")
    assert int(fingerprint) == _fingerprint_here("数据库索引的近似重复检测 near duplicate")


def _fingerprint_here(text: str) -> int:
    from simdb import fingerprint

    return fingerprint(text)


OFF_CHOICES = textwrap.dedent("""
    from simdb import native
    from simdb.methods.minhash import signature
    from simdb.methods.simhash import fingerprint
    chosen = {name: getattr(native, name) for name in native.PYTHON_TWINS}
    assert chosen == native.PYTHON_TWINS, chosen
    assert fingerprint._sums_of_ids is fingerprint._simhashes_of_ids
    assert fingerprint._batch_simhashes is fingerprint._simhashes_in_numpy
    assert signature._minhashes is signature._signatures_in_numpy
    assert signature._band_keys is signature._band_keys_in_python
    assert not native.enabled() and native.module() is None
    print(native.description())
""")


def test_off_gives_the_python_twins():
    """And the tests' ``use_python_twins`` patches exactly these (it is this list, in one process)."""
    done = _python(OFF_CHOICES, "off")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "off, SIMDB_NATIVE=off\n"


def test_an_unknown_value_is_one_clear_error():
    """At the first use of what the choice decides (``import simdb`` itself loads nothing: start-up)."""
    done = _python("from simdb import fingerprint", "fast")
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1] == (
        "ImportError: SIMDB_NATIVE='fast' in the environment: set it to one of auto, required, off (or unset it)")


@pytest.mark.skipif(not native.enabled(), reason="the compiled module is not built here, or SIMDB_NATIVE=off")
def test_on_the_chosen_functions_are_the_compiled_ones():
    from simdb.methods.minhash import signature

    compiled = native.module()
    assert signature._minhashes is compiled.minhashes
    assert signature._band_keys is compiled.band_keys
    native.fold("Ａ")  # the first call sets the tables and puts the compiled function in its place
    assert native.fold is compiled.fold


#: What simdb's modules may use of simdb.native: the functions it chose, and how to choose or describe.
ALLOWED = {"fold", "runs", "has_astral", "any_marked", "auto_runs", "chosen", "description"}


def test_no_module_but_native_imports_the_compiled_module_or_branches_on_it():
    offences = []
    for path in sorted((ROOT / "simdb").rglob("*.py")):
        if path == ROOT / "simdb" / "native.py":
            continue
        tree = ast.parse(path.read_text(), str(path))
        where = path.relative_to(ROOT)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (
                    "_native" in (node.module or "").split(".") or any(a.name == "_native" for a in node.names)):
                offences.append(f"{where}:{node.lineno} imports the compiled module")
            elif isinstance(node, ast.Import) and any("_native" in a.name.split(".") for a in node.names):
                offences.append(f"{where}:{node.lineno} imports the compiled module")
            elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "native"
                  and node.attr not in ALLOWED):
                offences.append(f"{where}:{node.lineno} uses native.{node.attr}")
        for function in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            for call in ast.walk(function):
                if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                        and call.func.attr == "chosen"):
                    offences.append(f"{where}:{call.lineno} chooses inside {function.name}, not once at import")
    assert offences == []


def _hook(monkeypatch, tmp_path):
    sys.path.insert(0, str(ROOT))
    try:
        import hatch_build
    finally:
        sys.path.remove(str(ROOT))

    def no_compiler(root, build_dir, openssl=True):
        raise OSError("no C compiler here (the test)")

    monkeypatch.setattr(hatch_build, "compile_native", no_compiler)
    return hatch_build.NativeBuildHook(str(tmp_path), {}, None, None, str(tmp_path), "wheel")


def test_the_build_fails_when_required_and_says_so_on_stderr_when_not(monkeypatch, tmp_path, capfd):
    hook = _hook(monkeypatch, tmp_path)
    monkeypatch.setenv(native.NATIVE_ENV, "required")
    with pytest.raises(RuntimeError, match="SIMDB_NATIVE=required and simdb/csrc did not compile .no C compiler"):
        hook.initialize("standard", {"force_include": {}})
    monkeypatch.delenv(native.NATIVE_ENV)
    build_data = {"force_include": {}}
    hook.initialize("standard", build_data)
    assert "pure_python" not in build_data  # a pure wheel, and said so:
    assert "building simdb WITHOUT its compiled fast paths" in capfd.readouterr().err


WITHOUT_BAND_KEYS = textwrap.dedent("""
    import sys
    import simdb
    from simdb import _native

    class Without:  # the compiled module as built without OpenSSL: everything but band_keys
        def __getattr__(self, name):
            if name == "band_keys":
                raise AttributeError(name)
            return getattr(_native, name)

    sys.modules["simdb._native"] = simdb._native = Without()
""")


@pytest.mark.skipif(not native.enabled(), reason="the compiled module is not built here, or SIMDB_NATIVE=off")
def test_a_module_built_without_openssl_runs_the_python_band_keys_unless_required():
    code = WITHOUT_BAND_KEYS + ("from simdb.methods.minhash import signature\n"
                                "from simdb import native\n"
                                "print(signature._band_keys is signature._band_keys_in_python, "
                                "signature._minhashes is signature._signatures_in_numpy, native.description())")
    done = _python(code, None)
    assert done.returncode == 0, done.stderr
    # simdb --version says which path the band keys take
    assert done.stdout == "True False on; MinHash band keys in Python (built without libssl-dev)\n"
    done = _python(code, "required")
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: SIMDB_NATIVE=required, and simdb's compiled module lacks band_keys"), last
    assert "libssl-dev" in last


def test_without_openssl_the_build_keeps_the_other_compiled_paths_unless_required(monkeypatch, tmp_path, capfd):
    sys.path.insert(0, str(ROOT))
    try:
        import hatch_build
    finally:
        sys.path.remove(str(ROOT))
    tried = []

    def without_openssl(root, build_dir, openssl=True):
        tried.append(openssl)
        if openssl:
            raise OSError("openssl/md5.h: No such file or directory (the test)")
        built = pathlib.Path(build_dir) / "_native.so"
        built.write_bytes(b"")
        return built

    monkeypatch.setattr(hatch_build, "compile_native", without_openssl)
    hook = hatch_build.NativeBuildHook(str(tmp_path), {}, None, None, str(tmp_path), "wheel")
    monkeypatch.setenv(native.NATIVE_ENV, "required")
    with pytest.raises(RuntimeError, match="libssl-dev"):
        hook.initialize("standard", {"force_include": {}})
    assert tried == [True]
    monkeypatch.delenv(native.NATIVE_ENV)
    build_data = {"force_include": {}}
    hook.initialize("standard", build_data)
    assert tried == [True, True, False]
    assert build_data["pure_python"] is False and list(build_data["force_include"].values()) == ["simdb/_native.so"]
    assert "trying again without the compiled MinHash band keys" in capfd.readouterr().err
