"""Fingerprint bits: the one place that converts between Python and PostgreSQL.

Fingerprints are unsigned 64-bit integers in Python (``0 <= fp < 2**64``) and
signed ``BIGINT`` in PostgreSQL. :func:`to_signed` and :func:`to_unsigned` (and
their array forms) are the only conversions; nothing else does bit tricks on
stored values.
"""

from __future__ import annotations

import numpy as np

BITS = 64
_MASK = (1 << BITS) - 1
_SIGN = 1 << (BITS - 1)


def to_signed(fingerprint: int) -> int:
    """Unsigned 64-bit fingerprint -> the signed BIGINT PostgreSQL stores."""
    if not 0 <= fingerprint <= _MASK:
        raise ValueError(f"fingerprint {fingerprint} is not an unsigned 64-bit integer")
    return fingerprint - (1 << BITS) if fingerprint & _SIGN else fingerprint


def to_unsigned(stored: int) -> int:
    """Signed BIGINT read from PostgreSQL -> the unsigned fingerprint."""
    if not -_SIGN <= stored < _SIGN:
        raise ValueError(f"{stored} is not a signed 64-bit integer")
    return stored & _MASK


def to_signed_array(fingerprints: np.ndarray) -> np.ndarray:
    """Array form of :func:`to_signed` (uint64 -> int64, same bits)."""
    return np.asarray(fingerprints, dtype=np.uint64).view(np.int64)


def to_unsigned_array(stored: np.ndarray) -> np.ndarray:
    """Array form of :func:`to_unsigned` (int64 -> uint64, same bits)."""
    return np.asarray(stored, dtype=np.int64).view(np.uint64)


def hamming(a: int, b: int) -> int:
    """Number of differing bits between two unsigned fingerprints."""
    return (a ^ b).bit_count()


def hamming_array(a: np.ndarray, b: np.ndarray | int) -> np.ndarray:
    """Element-wise Hamming distance of uint64 arrays (or an array and one value)."""
    return np.bitwise_count(np.bitwise_xor(np.asarray(a, dtype=np.uint64), np.uint64(b) if isinstance(b, int) else b))


def format_fingerprint(fingerprint: int) -> str:
    """16 lowercase hex digits, the form the CLI prints and accepts."""
    return f"{fingerprint:016x}"


def parse_fingerprint(text: str) -> int:
    """Inverse of :func:`format_fingerprint`; accepts an optional ``0x`` prefix."""
    digits = text.strip().lower().removeprefix("0x")
    if not digits or len(digits) > 16 or any(c not in "0123456789abcdef" for c in digits):
        raise ValueError(f"{text!r} is not a fingerprint: expected up to 16 hex digits, like 3f2a09c1e4b7d805")
    return int(digits, 16)
