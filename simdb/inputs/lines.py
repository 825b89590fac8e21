"""A file -> numbered raw lines, through gzip for ``.gz``, with a stream that ends badly reported.

A gzip file that is not one, or that ends in the middle of its stream (a truncated copy), is an
:class:`InputError` at the line where reading stopped, never a traceback. A UTF-8 byte order
mark at the start of the file is dropped.
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Callable, Iterator

from ..errors import InputError

BOM = b"\xef\xbb\xbf"


class StreamError(InputError):
    """The file cannot be read past this line: nothing after it is a record."""


def raw_lines(path: str, progress: Callable[[int], None] | None = None) -> Iterator[tuple[int, bytes]]:
    """(line number, raw line with its terminator); ``progress`` gets the bytes on disk consumed so far."""
    with open(path, "rb") as disk:
        stream = gzip.GzipFile(fileobj=disk) if path.endswith(".gz") else disk
        last = 0
        number = 0
        lines = iter(stream)
        while True:
            try:
                raw = next(lines)
            except StopIteration:
                return
            except gzip.BadGzipFile:
                raise StreamError("not a gzip file, though its name ends in .gz", path=path, line=number + 1,
                                  hint="decompress it first, or rename it without .gz") from None
            except (EOFError, zlib.error) as exc:
                reason = "ends in the middle of its gzip stream" if isinstance(exc, EOFError) else \
                    f"has a corrupt gzip stream ({exc})"
                raise StreamError(f"the file {reason}; line {number} was the last one read", path=path,
                                  line=number + 1, hint="the file is truncated or damaged: copy it again") from None
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
    """The whole file (decompressed for ``.gz``), without a leading byte order mark."""
    try:
        with (gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")) as stream:
            data = stream.read()
    except gzip.BadGzipFile:
        raise StreamError("not a gzip file, though its name ends in .gz", path=path,
                          hint="decompress it first, or rename it without .gz") from None
    except (EOFError, zlib.error):
        raise StreamError("the file ends in the middle of its gzip stream", path=path,
                          hint="the file is truncated or damaged: copy it again") from None
    return data[len(BOM):] if data.startswith(BOM) else data
