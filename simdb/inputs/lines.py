"""A file -> numbered raw lines, through gzip for ``.gz`` and zstd for ``.zst``, with a stream that ends badly
reported.

A compressed file that is not one, or that ends in the middle of its stream (a truncated copy), or
whose stream is damaged, is an :class:`InputError` at the line where reading stopped, never a
traceback. A UTF-8 byte order mark at the start of the file is dropped.
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Callable, Iterator
from typing import BinaryIO

from ..errors import InputError
from .zstd import NotZstd, ZstdError, open_zstd

BOM = b"\xef\xbb\xbf"
COMPRESSIONS = {".gz": "gzip", ".zst": "zstd"}
_NOT_COMPRESSED = (gzip.BadGzipFile, NotZstd)
_DAMAGED = (EOFError, zlib.error, ZstdError)


class StreamError(InputError):
    """The file cannot be read past this line: nothing after it is a record."""


def raw_lines(path: str, progress: Callable[[int], None] | None = None) -> Iterator[tuple[int, bytes]]:
    """(line number, raw line with its terminator); ``progress`` gets the bytes on disk consumed so far."""
    with open(path, "rb") as disk:
        stream = _decompressed(disk, path)
        last = 0
        number = 0
        lines = iter(stream)
        while True:
            try:
                raw = next(lines)
            except StopIteration:
                return
            except (*_NOT_COMPRESSED, *_DAMAGED) as exc:
                raise _stream_error(exc, path, number) from None
            number += 1
            if number == 1 and raw.startswith(BOM):
                raw = raw[len(BOM):]
            yield number, raw
            if progress is not None:
                position = disk.tell()
                progress(position - last)
                last = position


def decode(raw: bytes, path: str, line: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"invalid UTF-8 (byte {raw[exc.start]:#04x} at offset {exc.start} of the line)",
                         path=path, line=line, hint="re-encode the file as UTF-8") from None


def read_whole(path: str) -> bytes:
    """The whole file (decompressed for ``.gz`` and ``.zst``), without a leading byte order mark."""
    try:
        with open(path, "rb") as disk:
            data = _decompressed(disk, path).read()
    except (*_NOT_COMPRESSED, *_DAMAGED) as exc:
        raise _stream_error(exc, path, None) from None
    return data[len(BOM):] if data.startswith(BOM) else data


def compression(path: str) -> str | None:
    """``gzip`` or ``zstd`` for a file whose name ends in ``.gz`` or ``.zst``, else None."""
    return next((name for suffix, name in COMPRESSIONS.items() if path.endswith(suffix)), None)


def _decompressed(disk: BinaryIO, path: str) -> BinaryIO:
    kind = compression(path)
    if kind == "gzip":
        return gzip.GzipFile(fileobj=disk)
    return open_zstd(disk) if kind == "zstd" else disk


def _stream_error(exc: Exception, path: str, lines_read: int | None) -> StreamError:
    """What a compressed stream that failed after ``lines_read`` lines (None: a whole file) says."""
    kind = compression(path)
    where = {} if lines_read is None else {"line": lines_read + 1}
    if isinstance(exc, NotZstd) or (isinstance(exc, gzip.BadGzipFile) and not lines_read  # not a CRC failure
                                    and str(exc).startswith("Not a gzipped file")):
        suffix = next(suffix for suffix, name in COMPRESSIONS.items() if name == kind)
        return StreamError(f"not a {kind} file, though its name ends in {suffix}", path=path, **where,
                           hint=f"decompress it first, or rename it without {suffix}")
    reason = f"ends in the middle of its {kind} stream" if isinstance(exc, EOFError) else \
        f"has a corrupt {kind} stream ({exc})"
    if lines_read is not None:
        reason += f"; line {lines_read} was the last one read"
    return StreamError(f"the file {reason}", path=path, **where, hint="the file is truncated or damaged: copy it again")
