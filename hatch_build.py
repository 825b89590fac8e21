"""Builds simdb's compiled fast paths (``simdb/csrc/*.c``, one extension module ``simdb._native``) into the wheel, or beside the sources for an
editable install.

The extension is optional: simdb computes the same fingerprints without it, more slowly (simdb/native.py).
``SIMDB_NATIVE`` at build time chooses, as at run time: unset, where it cannot be compiled (no C compiler, no
Python headers) the build says so on standard error (``pip install -v`` shows it) and goes on without it;
``required``, the build fails instead (CI: ``scripts/test``); ``off`` (or ``0``) skips it.
``simdb --version`` tells whether an installation takes the compiled paths.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

#: One file per kernel and the module that puts them together (simdb/csrc/module.c).
SOURCES = ("simdb/csrc/module.c", "simdb/csrc/text.c", "simdb/csrc/simhashes.c", "simdb/csrc/minhashes.c",
           "simdb/csrc/bandkeys.c")
SOURCE = "simdb/csrc"


def compile_native(root: Path, build_dir: Path, openssl: bool = True) -> Path:
    """Compiles the extension with setuptools' ``build_ext`` (the platform's compiler and flags); returns the
    built file. ``openssl``: with the MinHash band keys, linked to OpenSSL's libcrypto (Debian: libssl-dev);
    without, the module lacks ``band_keys`` and their Python twin runs."""
    from setuptools import Distribution, Extension
    from setuptools.command.build_ext import build_ext

    extension = Extension("simdb._native", [str(root / source) for source in SOURCES],
                          depends=[str(root / SOURCE / "native.h")],
                          libraries=["crypto"] if openssl else [],
                          define_macros=[] if openssl else [("SIMDB_WITHOUT_OPENSSL", "1")],
                          extra_compile_args=[] if sys.platform == "win32" else ["-O3", "-std=c99"])
    command = build_ext(Distribution({"name": "simdb", "ext_modules": [extension]}))
    command.build_lib = str(build_dir / "lib")
    command.build_temp = str(build_dir / "temp")
    command.ensure_finalized()
    command.run()
    return Path(command.get_ext_fullpath("simdb._native"))


class NativeBuildHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict) -> None:
        if self.target_name != "wheel":
            return
        asked = os.environ.get("SIMDB_NATIVE", "").strip().lower()
        if asked in ("0", "off"):
            print(f"simdb: SIMDB_NATIVE={asked}: building simdb without its compiled fast paths", file=sys.stderr)
            return
        root = Path(self.root)
        build_dir = Path(tempfile.mkdtemp(prefix="simdb-native-"))
        try:
            try:
                built = compile_native(root, build_dir)
            except Exception as exc:  # noqa: BLE001 -- no OpenSSL headers or library: the rest still helps
                if asked == "required":
                    raise
                print(f"simdb: could not compile {SOURCE} with OpenSSL's libcrypto ({exc}); trying again without "
                      "the compiled MinHash band keys (which need libssl-dev)", file=sys.stderr)
                shutil.rmtree(build_dir, ignore_errors=True)
                build_dir = Path(tempfile.mkdtemp(prefix="simdb-native-"))
                built = compile_native(root, build_dir, openssl=False)
        except Exception as exc:  # noqa: BLE001 -- any failure to compile leaves the pure-Python paths
            shutil.rmtree(build_dir, ignore_errors=True)
            if asked == "required":
                raise RuntimeError(f"simdb: SIMDB_NATIVE=required and {SOURCE} did not compile ({exc}): install a "
                                   "C compiler, Python's and OpenSSL's headers (Debian: apt-get install gcc "
                                   "python3-dev libssl-dev), or "
                                   "unset SIMDB_NATIVE to build without the compiled fast paths") from exc
            # on standard error, where `pip install -v` shows it (hatchling's warnings went unseen)
            print(f"simdb: WARNING: could not compile {SOURCE} ({exc}); building simdb WITHOUT its compiled fast "
                  "paths: the same fingerprints, several times slower (SIMDB_NATIVE=required makes this an "
                  "error)", file=sys.stderr)
            return
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
        if version == "editable":  # the checkout is what gets imported: the module goes beside its source
            # under a new name, then renamed over the old one: a process that has the old one loaded keeps
            # its file (copied over in place, it crashed: a test run beside `scripts/quickstart`'s install)
            target = root / "simdb" / built.name
            staged = target.with_name(f".{built.name}.{os.getpid()}")
            shutil.copy2(built, staged)
            os.replace(staged, target)
            shutil.rmtree(build_dir, ignore_errors=True)
        else:
            build_data["force_include"][str(built)] = f"simdb/{built.name}"
            self._build_dir = build_dir

    def finalize(self, version: str, build_data: dict, artifact_path: str) -> None:
        build_dir = getattr(self, "_build_dir", None)
        if build_dir is not None:
            shutil.rmtree(build_dir, ignore_errors=True)
