"""Input files -> documents, with every problem reported by file and line.

Formats: ``jsonl`` (one JSON object per line), ``csv`` and ``tsv`` (a header row, then one
document per record; the rule for quotes is in :mod:`simdb.inputs.delimited`), ``txt`` (the
whole file is one document whose id is the path as given). A ``.gz`` suffix is read through
gzip and ``.zst`` through zstd; a UTF-8 byte order mark at the start of a file is dropped. The
format is told from the file name unless given.

Fields other than the id and the text are kept as the document's metadata. With
``skip_errors`` a bad record is yielded as an :class:`~simdb.errors.InputError` in its place
(the ingest rejects it) and reading goes on; a problem with a whole file (a missing header
field) is raised in any case.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from ..errors import InputError
from .checks import check_text
from .delimited import read_delimited
from .jsonl import json_records, read_jsonl
from .lines import compression
from .model import Document
from .text import read_txt

FORMATS = ("jsonl", "csv", "tsv", "txt")
_SUFFIXES = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".csv": "csv", ".tsv": "tsv",
             ".tab": "tsv", ".txt": "txt", ".text": "txt"}
DEFAULT_MAX_CHARS = 5_000_000

__all__ = ["FORMATS", "Document", "check_paths", "check_text", "detect_format", "json_records", "read_documents",
           "total_bytes"]


def detect_format(path: str) -> str:
    kind = compression(path)
    name = path.rsplit(".", 1)[0] if kind else path
    fmt = _SUFFIXES.get(Path(name).suffix.lower())
    if fmt is None:
        raise InputError("cannot tell the format from the file name", path=path,
                         hint=f"pass «format» with one of {', '.join(FORMATS)}")
    return fmt


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
    paths = list(paths)
    check_paths(paths)
    if format is not None and format not in FORMATS:
        raise InputError(f"unknown format {format!r}", hint=f"choose one of {', '.join(FORMATS)}")
    formats = [format or detect_format(path) for path in paths]
    for path, fmt in zip(paths, formats):
        if fmt == "jsonl":
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


def total_bytes(paths: Iterable[str]) -> int:
    return sum(os.path.getsize(path) for path in paths)
