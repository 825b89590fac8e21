"""Signed/unsigned storage and fingerprint formatting, through a real PostgreSQL."""

import numpy as np
import pytest
import sqlalchemy as sa
from hypothesis import example, given, settings
from hypothesis import strategies as st

from simdb.bits import (format_fingerprint, hamming, hamming_array, parse_fingerprint, to_signed,
                        to_signed_array, to_unsigned, to_unsigned_array)
from tests.conftest import examples

uint64 = st.integers(min_value=0, max_value=2**64 - 1)
EDGES = [0, 1, 2**63 - 1, 2**63, 2**63 + 1, 2**64 - 1]


@given(uint64)
@example(2**63)
@example(2**64 - 1)
def test_signed_round_trip(value):
    stored = to_signed(value)
    assert -(2**63) <= stored < 2**63
    assert to_unsigned(stored) == value
    assert to_unsigned_array(to_signed_array(np.array([value], dtype=np.uint64)))[0] == value
    assert to_signed_array(np.array([value], dtype=np.uint64))[0] == stored


@settings(max_examples=examples(30), deadline=None)
@given(st.lists(uint64, min_size=1, max_size=200))
def test_round_trip_through_postgresql(server_engine, values):
    values = values + EDGES
    with server_engine.connect() as connection:
        back = connection.execute(sa.text("SELECT unnest(CAST(:values AS bigint[]))"),
                                  {"values": [to_signed(v) for v in values]}).scalars().all()
        distances = connection.execute(
            sa.text("SELECT bit_count((a # b)::bit(64)) FROM unnest(CAST(:a AS bigint[]), CAST(:b AS bigint[])) AS t(a, b)"),
            {"a": [to_signed(v) for v in values], "b": [to_signed(values[0])] * len(values)}).scalars().all()
    assert [to_unsigned(v) for v in back] == values
    assert distances == [hamming(v, values[0]) for v in values]


def test_out_of_range_values_are_refused():
    with pytest.raises(ValueError):
        to_signed(2**64)
    with pytest.raises(ValueError):
        to_signed(-1)
    with pytest.raises(ValueError):
        to_unsigned(2**63)


@given(uint64)
def test_hex_round_trip(value):
    text = format_fingerprint(value)
    assert len(text) == 16 and text == text.lower()
    assert parse_fingerprint(text) == value
    assert parse_fingerprint("0x" + text.upper()) == value


@pytest.mark.parametrize("text", ["", "xyz", "1" * 17, "-12"])
def test_bad_hex_is_refused(text):
    with pytest.raises(ValueError, match="not a fingerprint"):
        parse_fingerprint(text)


@given(st.lists(uint64, min_size=1, max_size=50), uint64)
def test_hamming_array_matches_scalar(values, other):
    distances = hamming_array(np.array(values, dtype=np.uint64), other)
    assert distances.tolist() == [hamming(v, other) for v in values]
