"""Text -> normalized text -> tokens: the first steps of every sketch, whatever the method."""

from __future__ import annotations

import xxhash


def content_hash(text: str) -> bytes:
    """128-bit hash of the exact text, for telling exact from near duplicates."""
    return xxhash.xxh3_128_digest(text.encode("utf-8"))
