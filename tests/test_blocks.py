"""Block keys: lossless, and the pigeonhole guarantee of Manku et al."""

import math
import random

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from simdb.methods.simhash.blocks import BlockLayout, layouts_for

LAYOUTS = [BlockLayout(max_distance=k, blocks=m) for k in range(1, 6) for m in range(k + 1, k + 4)
           if math.comb(m, m - k) <= 64]
uint64 = st.integers(min_value=0, max_value=2**64 - 1)


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda l: f"k{l.max_distance}-m{l.blocks}")
@given(fingerprint=uint64)
def test_block_keys_are_lossless(layout, fingerprint):
    keys = layout.block_keys(fingerprint)
    assert len(keys) == len(layout.keys)
    assert all(0 <= key < 2**width for key, width in zip(keys, layout.key_widths))
    assert layout.fingerprint_from_keys(keys) == fingerprint


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda l: f"k{l.max_distance}-m{l.blocks}")
@given(fingerprint=uint64, data=st.data())
def test_pigeonhole_every_neighbour_shares_a_key(layout, fingerprint, data):
    flips = data.draw(st.sets(st.integers(0, 63), max_size=layout.max_distance))
    neighbour = fingerprint
    for bit in flips:
        neighbour ^= 1 << bit
    shared = [a == b for a, b in zip(layout.block_keys(fingerprint), layout.block_keys(neighbour))]
    assert any(shared)


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda l: f"k{l.max_distance}-m{l.blocks}")
def test_array_form_matches_scalar_form(layout):
    rng = random.Random(7)
    values = [rng.getrandbits(64) for _ in range(200)] + [0, 2**63, 2**64 - 1]
    array = layout.block_keys_array(np.array(values, dtype=np.uint64))
    assert [tuple(row) for row in array.tolist()] == [layout.block_keys(v) for v in values]


def test_blocks_cover_all_bits_once():
    for layout in LAYOUTS:
        covered = [bit for start, width in layout.block_ranges for bit in range(start, start + width)]
        assert covered == list(range(64))


def test_default_layout_is_four_16_bit_keys():
    layout = BlockLayout()
    assert layout.key_widths == (16, 16, 16, 16)
    assert layout.expected_candidates(1_000_000) == pytest.approx(4 * 1_000_000 / 65536)
    assert BlockLayout(blocks=5).key_widths == (26, 26, 26, 25, 26, 26, 25, 26, 25, 25)


@pytest.mark.parametrize("k, m, message", [(3, 3, "more blocks than the distance"), (3, 17, "at most 16"),
                                           (0, 4, "at least 1")])
def test_impossible_layouts_are_refused(k, m, message):
    with pytest.raises(ValueError, match=message):
        BlockLayout(max_distance=k, blocks=m)


def test_layouts_for_lists_wider_keys_with_fewer_candidates():
    candidates = [c for _, c in layouts_for(3, 10_000_000)]
    assert candidates == sorted(candidates, reverse=True)
