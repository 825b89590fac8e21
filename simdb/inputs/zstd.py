"""zstd-compressed input (``.zst``) as a stream that tells a file cut short from a whole one.

python-zstandard's ``stream_reader`` ends at the end of its input even inside a frame, so half of
a truncated file would read as all of it. Here the frames are decompressed one after another
(``zstd -c a b``, pzstd and the seekable format write several; skippable frames hold no data),
and input that ends inside a frame raises :class:`EOFError`, as :mod:`gzip` does. Damaged data is
a :class:`zstandard.ZstdError` (with a checksum, as the ``zstd`` tool writes by default, any
damage is found; without one, only damage that breaks the format).
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import BinaryIO

import zstandard

ZstdError = zstandard.ZstdError
_FRAME = b"\x28\xb5\x2f\xfd"
_READ_SIZE = 1 << 16  # compressed bytes per step: one step's output stays small unless the data is very redundant


class NotZstd(OSError):
    """The file does not begin with a zstd frame."""


def _is_frame_start(head: bytes) -> bool:
    return head == _FRAME or (len(head) == 4 and head[0] & 0xF0 == 0x50 and head[1:] == b"\x2a\x4d\x18")


def _decompressed(disk: BinaryIO) -> Iterator[bytes]:
    context = zstandard.ZstdDecompressor()
    frame = None  # the frame being decompressed, from its first byte read to its end
    data = disk.read(_READ_SIZE)
    if data and not _is_frame_start(data[:4]):
        raise NotZstd("not a zstd frame")
    while data:
        if frame is None:
            frame = context.decompressobj()
        out = frame.decompress(data)
        if out:
            yield out
        if frame.eof:
            data, frame = frame.unused_data, None
        else:
            data = disk.read(_READ_SIZE)
    if frame is not None:
        raise EOFError("the input ends inside a zstd frame")


class _Reader(io.RawIOBase):
    def __init__(self, disk: BinaryIO) -> None:
        self._chunks = _decompressed(disk)
        self._left = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not self._left:
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._left = memoryview(chunk)
        size = min(len(buffer), len(self._left))
        buffer[:size] = self._left[:size]
        self._left = self._left[size:]
        return size


def open_zstd(disk: BinaryIO) -> io.BufferedReader:
    """The decompressed content of the ``.zst`` file open in ``disk``, read and iterated like a binary file."""
    return io.BufferedReader(_Reader(disk), buffer_size=_READ_SIZE)
