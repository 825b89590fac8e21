"""Fingerprint -> block keys (Manku, Jain & Das Sarma, WWW 2007).

The 64 bits are cut into ``blocks`` contiguous blocks of near-equal width. A
*key* is the concatenation of ``blocks - max_distance`` of them, and there is
one key for every such choice of blocks. Two fingerprints that differ in at
most ``max_distance`` bits leave at least ``blocks - max_distance`` blocks
untouched, so they agree exactly on the key made of those blocks: looking up
each key by equality finds every neighbour, with no false negatives. Wider
keys (more blocks) mean fewer candidates per lookup but more keys to store.

The default, ``max_distance=4``, takes six blocks and fifteen keys of 20-22
bits up to about 10 million documents, seven blocks and 35 keys of 27-28 bits
beyond. ``max_distance=3`` takes four 16-bit keys, or ten of 25-26 bits for
archives of many millions of documents.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ...bits import BITS

MAX_KEY_BITS = 62  # keys are stored as non-negative BIGINT
#: The largest distance any layout can guarantee (16 blocks, keys of one block).
MAX_DISTANCE = 15
#: The default k (measured on the devset: see docs/quality.md).
DEFAULT_MAX_DISTANCE = 4
#: Documents a new index is expected to grow to unless told: what the default layout is chosen for.
DEFAULT_EXPECTED_SIZE = 1_000_000


@dataclass(frozen=True)
class BlockLayout:
    max_distance: int = 3
    blocks: int = 4
    bits: int = BITS
    #: Key columns are ``key_<first_key>`` onwards. ``simdb relayout`` numbers the new
    #: layout's columns after the old ones, so a process still holding the old layout
    #: fails on a missing column instead of reading or writing the wrong keys.
    first_key: int = 0

    def __post_init__(self) -> None:
        if self.bits != BITS:
            raise ValueError(f"only {BITS}-bit fingerprints are supported, not {self.bits}")
        if self.max_distance < 1:
            raise ValueError(f"the maximum distance must be at least 1, not {self.max_distance} "
                             "(exact duplicates are found by the content hash)")
        if self.max_distance >= self.blocks:
            raise ValueError(
                f"{self.blocks} blocks cannot guarantee a maximum distance of {self.max_distance}: "
                f"use more blocks than the distance (at least {self.max_distance + 1})")
        if self.blocks > 16:
            raise ValueError(f"at most 16 blocks are supported, not {self.blocks}")
        if len(self.keys) > 64:
            raise ValueError(f"{self.blocks} blocks at distance {self.max_distance} make {len(self.keys)} keys; "
                             "choose fewer blocks")
        if max(self.key_widths) > MAX_KEY_BITS:
            raise ValueError(f"keys of {max(self.key_widths)} bits do not fit a BIGINT column: use more blocks")

    @classmethod
    def for_size(cls, max_distance: int, documents: int, target: float = 64.0) -> "BlockLayout":
        """The fewest blocks whose expected candidates per lookup at ``documents`` stay under ``target``.

        Fewer blocks mean fewer key columns (less storage, faster ingest); the
        target keeps a lookup to well under a millisecond of index reads.
        """
        choices = layouts_for(max_distance, documents, choices=8)
        if not choices:
            raise ValueError(f"no block layout reaches a maximum distance of {max_distance} with at most 16 blocks "
                             f"and 64 keys: the maximum distance must be between 1 and {MAX_DISTANCE}")
        for layout, candidates in choices:
            if candidates <= target:
                return layout
        return choices[-1][0]

    @cached_property
    def block_ranges(self) -> tuple[tuple[int, int], ...]:
        """(first bit, width) of each block; the wider blocks come first."""
        base, extra = divmod(self.bits, self.blocks)
        ranges, start = [], 0
        for index in range(self.blocks):
            width = base + (1 if index < extra else 0)
            ranges.append((start, width))
            start += width
        return tuple(ranges)

    @cached_property
    def keys(self) -> tuple[tuple[int, ...], ...]:
        """For each key, the blocks it is made of."""
        return tuple(itertools.combinations(range(self.blocks), self.blocks - self.max_distance))

    @cached_property
    def key_widths(self) -> tuple[int, ...]:
        return tuple(sum(self.block_ranges[b][1] for b in key) for key in self.keys)

    @property
    def key_columns(self) -> list[str]:
        return [f"key_{self.first_key + i}" for i in range(len(self.keys))]

    def block_keys(self, fingerprint: int) -> tuple[int, ...]:
        """The key values of one unsigned fingerprint."""
        blocks = [(fingerprint >> start) & ((1 << width) - 1) for start, width in self.block_ranges]
        values = []
        for key in self.keys:
            value, shift = 0, 0
            for b in key:
                value |= blocks[b] << shift
                shift += self.block_ranges[b][1]
            values.append(value)
        return tuple(values)

    def block_keys_array(self, fingerprints: np.ndarray) -> np.ndarray:
        """Key values of many fingerprints: uint64 array (n,) -> int64 array (n, keys)."""
        fps = np.asarray(fingerprints, dtype=np.uint64)
        blocks = [(fps >> np.uint64(start)) & np.uint64((1 << width) - 1) for start, width in self.block_ranges]
        out = np.empty((fps.shape[0], len(self.keys)), dtype=np.int64)
        for column, key in enumerate(self.keys):
            value, shift = np.zeros_like(fps), 0
            for b in key:
                value |= blocks[b] << np.uint64(shift)
                shift += self.block_ranges[b][1]
            out[:, column] = value.astype(np.int64)
        return out

    def fingerprint_from_keys(self, key_values: tuple[int, ...]) -> int:
        """Rebuild the fingerprint from its keys: the keys lose nothing."""
        blocks: dict[int, int] = {}
        for key, value in zip(self.keys, key_values):
            for b in key:
                width = self.block_ranges[b][1]
                blocks[b] = value & ((1 << width) - 1)
                value >>= width
        return sum(blocks[b] << self.block_ranges[b][0] for b in range(self.blocks))

    def expected_candidates(self, documents: int) -> float:
        """Stored fingerprints expected to share a key with a query, for uniformly random fingerprints.

        Real SimHash values are skewed, so real buckets run larger; ``simdb
        stats`` measures them.
        """
        return sum(documents / 2.0**w for w in self.key_widths)

    def describe(self) -> str:
        widths = sorted(set(self.key_widths))
        width_text = "/".join(str(w) for w in widths)
        return (f"{self.blocks} blocks of {'/'.join(str(w) for w in sorted({w for _, w in self.block_ranges}))} bits, "
                f"{len(self.keys)} keys of {self.blocks - self.max_distance} blocks ({width_text} bits), "
                f"max distance {self.max_distance}")


def layouts_for(max_distance: int, documents: int, choices: int = 4) -> list[tuple[BlockLayout, float]]:
    """The valid layouts from ``max_distance + 1`` blocks up, with their expected candidates."""
    result = []
    for blocks in range(max_distance + 1, max_distance + 1 + choices):
        try:
            layout = BlockLayout(max_distance=max_distance, blocks=blocks)
        except ValueError:
            continue
        result.append((layout, layout.expected_candidates(documents)))
    return result

