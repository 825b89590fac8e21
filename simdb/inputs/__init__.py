"""Input files -> documents, with every problem reported by file and line.

Formats: ``jsonl`` (one JSON object per line), ``csv`` and ``tsv`` (a header row, then one
document per record; the rule for quotes is in :mod:`simdb.inputs.delimited`), ``txt`` (the
whole file is one document whose id is the path as given), ``parquet`` (one document per row,
read through pyarrow: :mod:`simdb.inputs.parquet`). A ``.gz`` suffix is read through gzip and
``.zst`` through zstd; a UTF-8 byte order mark at the start of a file is dropped. The format is
told from the file name unless given. A folder stands for the input files below it, a pattern
(``data/*.parquet``) for the files it matches (:func:`input_files`).

Fields other than the id and the text are kept as the document's metadata. With
``skip_errors`` a bad record is yielded as an :class:`~simdb.errors.InputError` in its place
(the ingest rejects it) and reading goes on; a problem with a whole file (a missing header
field, a Parquet file cut short) is raised in any case.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from ..errors import InputError
from .checks import check_text
from .delimited import read_delimited
from .jsonl import json_records, read_jsonl
from .lines import compression
from .model import Document
from .parquet import check_parquet, parquet_records, read_parquet
from .text import read_txt

FORMATS = ("jsonl", "csv", "tsv", "txt", "parquet")
_SUFFIXES = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".csv": "csv", ".tsv": "tsv",
             ".tab": "tsv", ".txt": "txt", ".text": "txt", ".parquet": "parquet", ".parq": "parquet",
             ".pq": "parquet"}
DEFAULT_MAX_CHARS = 5_000_000
_PATTERN = re.compile(r"[*?[]")

__all__ = ["FORMATS", "Document", "check_paths", "check_text", "detect_format", "input_files", "json_records",
           "read_documents", "records", "total_bytes"]


def detect_format(path: str) -> str:
    kind = compression(path)
    name = path.rsplit(".", 1)[0] if kind else path
    fmt = _SUFFIXES.get(Path(name).suffix.lower())
    if fmt is None:
        raise InputError("cannot tell the format from the file name", path=path,
                         hint=f"pass «format» with one of {', '.join(FORMATS)}")
    return fmt


def input_files(paths: Iterable[str], format: str | None = None) -> list[str]:
    """The files ``paths`` name, in order: a folder stands for the files below it, in path order, whose names
    tell their format (every file, with ``format``), leaving out hidden ones and those whose names begin with
    ``_`` (Spark's ``_SUCCESS``, Arrow's ``_metadata``); a path that does not exist and holds ``*``, ``?`` or
    ``[`` is a pattern (``**`` spans folders) standing for what it matches, in path order."""
    files = []
    for path in paths:
        if os.path.isdir(path):
            files += _folder(path, format)
        elif not os.path.lexists(path) and _PATTERN.search(path):
            matched = []
            for match in sorted(glob.glob(path, recursive=True)):  # a folder it matches may hold no input
                matched += _folder(match, format, required=False) if os.path.isdir(match) else [match]
            if not matched:
                raise InputError("no file matches this pattern", path=path, hint="check the pattern")
            files += dict.fromkeys(matched)  # once each: corpus/** matches a folder and the files in it
        else:
            files.append(path)
    return files


def _folder(folder: str, format: str | None, required: bool = True) -> list[str]:
    found = []
    for root, folders, names in os.walk(folder):
        folders[:] = [name for name in folders if not name.startswith((".", "_"))]
        found += [os.path.join(root, name) for name in names if not name.startswith((".", "_"))]
    found = sorted(path for path in found if format is not None or _has_format(path))
    if not found and required:
        raise InputError("the folder holds no input files", path=folder,
                         hint=f"give files named for their format ({', '.join(_SUFFIXES)}), or «format»")
    return found


def _has_format(path: str) -> bool:
    try:
        detect_format(path)
    except InputError:
        return False
    return True


def check_paths(paths: Iterable[str]) -> None:
    """Fail before reading anything if an input file is missing or unreadable."""
    for path in paths:
        p = Path(path)
        if not p.exists():
            raise InputError("no such file", path=path, hint="check the path")
        if not p.is_file():
            raise InputError("not a regular file", path=path, hint="give files, not directories")
        if not os.access(p, os.R_OK):
            raise InputError("the file is not readable", path=path, hint="check its permissions")


def read_documents(paths: Iterable[str], *, format: str | None = None, id_field: str = "id",
                   text_field: str = "text", skip_errors: bool = False, max_chars: int = DEFAULT_MAX_CHARS,
                   progress: Callable[[int], None] | None = None) -> Iterator[Document | InputError]:
    """Documents from ``paths`` in order (see the module docstring).

    ``max_chars`` bounds a quoted CSV field, so that a quote left open cannot swallow the rest
    of a file; ``progress`` is called with the bytes of input consumed, for a progress bar.
    """
    if format is not None and format not in FORMATS:
        raise InputError(f"unknown format {format!r}", hint=f"choose one of {', '.join(FORMATS)}")
    paths = input_files(paths, format)
    check_paths(paths)
    formats = [format or detect_format(path) for path in paths]
    for path, fmt in zip(paths, formats):  # what is wrong with a whole file, before anything is read
        if fmt == "parquet":
            check_parquet(path, id_field, text_field)
    for path, fmt in zip(paths, formats):
        if fmt == "parquet":
            yield from read_parquet(path, id_field, text_field, skip_errors, progress)
        elif fmt == "jsonl":
            yield from read_jsonl(path, id_field, text_field, skip_errors, progress)
        elif fmt == "txt":
            try:
                yield from read_txt(path, progress)
            except InputError as error:
                if not skip_errors:
                    raise
                yield error
        else:
            yield from read_delimited(path, id_field, text_field, "," if fmt == "csv" else "\t", skip_errors,
                                      max_chars, progress)


def records(path: str) -> Iterator[tuple[int, dict]]:
    """(line or :class:`~simdb.errors.Row`, record) for every record of a JSON-lines or Parquet file."""
    return parquet_records(path) if _has_format(path) and detect_format(path) == "parquet" else json_records(path)


def total_bytes(paths: Iterable[str]) -> int:
    return sum(os.path.getsize(path) for path in paths)
