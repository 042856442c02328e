"""Scalar and vector data types: sizes, numpy storage, parsing, promotion and bfloat16's
bit conversions, checked against numpy and ml_dtypes."""
import numpy as np
import pytest

from treadle.ir.dtypes import (BY_NAME, DataType, bfloat16, bfloat16_bits, bfloat16_values,
                               boolean, dtype_of, float16, float32, float32x4, float32x8,
                               float64, index_type, int8, int32, int64, promote, uint8, uint16,
                               vector)


@pytest.mark.parametrize("name", ["float32", "float16", "float64", "int8", "int16", "int32",
                                  "int64", "uint8", "uint16", "uint32", "uint64", "bool"])
def test_scalar_types_match_numpy(name):
    t = dtype_of(name)
    assert t.numpy == np.dtype(name)
    assert t.nbytes == np.dtype(name).itemsize and t.bits == 8 * t.nbytes
    assert t.is_float == (np.dtype(name).kind == "f")
    assert t.is_integer == (np.dtype(name).kind in "iu")
    assert t.is_bool == (name == "bool")
    assert not t.is_vector and t.scalar is t


def test_bfloat16_is_stored_as_its_bits():
    assert bfloat16.is_float and bfloat16.nbytes == 2
    assert bfloat16.numpy == np.uint16


@pytest.mark.parametrize("scalar, lanes", [(float32, 4), (float32, 8), (int32, 8), (float16, 3),
                                           (int8, 16)])
def test_vector_types(scalar, lanes):
    v = vector(scalar, lanes)
    assert v.is_vector and v.lanes == lanes and v.name == f"{scalar.name}x{lanes}"
    assert v.scalar is scalar and v.kind == scalar.kind
    assert v.nbytes == scalar.nbytes * lanes
    assert v.numpy == scalar.numpy  # a vector is stored as consecutive scalars
    assert vector(scalar, lanes) is v and dtype_of(v.name) is v  # made once, then known
    assert v.with_lanes(1) is scalar and scalar.with_lanes(lanes) is v


def test_one_lane_is_the_scalar_type():
    assert vector(float32, 1) is float32
    assert float32x8.with_lanes(4) is float32x4


def test_index_type_is_64_bit():
    assert index_type == int64


@pytest.mark.parametrize("spelling", ["int8", np.int8, np.dtype("int8"), int8])
def test_dtype_of_accepts_names_numpy_dtypes_and_types(spelling):
    assert dtype_of(spelling) is int8


@pytest.mark.parametrize("spelling", ["float33", "complex64", np.complex64])
def test_dtype_of_an_unknown_type_names_it_and_the_known_ones(spelling):
    with pytest.raises(TypeError, match="unknown dtype") as info:
        dtype_of(spelling)
    assert "float32" in str(info.value) and "bool" in str(info.value)


@pytest.mark.parametrize("a, b, expected", [
    (float32, float32, float32),
    (int32, float16, float16),        # any float beats any integer, whatever its width
    (float16, int64, float16),
    (float16, float32, float32),
    (float64, float32, float64),
    (int8, int64, int64),
    (uint8, int32, int32),
    (int32, uint16, int32),
    (boolean, int32, int32),
    (float32x8, float32, float32x8),  # a scalar combines with every lane
    (int32, float32x4, float32x4),
])
def test_promotion_takes_the_wider_float_else_the_wider_integer(a, b, expected):
    assert promote(a, b) == expected
    assert promote(b, a) == expected


def test_promotion_matches_numpy_where_numpy_keeps_the_width():
    for a, b in [("int8", "int32"), ("float16", "float64"), ("uint8", "int16"),
                 ("float32", "float64"), ("int16", "int64")]:
        assert promote(dtype_of(a), dtype_of(b)).numpy == np.promote_types(a, b)


def test_vectors_of_different_widths_do_not_combine():
    with pytest.raises(TypeError, match="cannot combine vector types float32x4 and float32x8"):
        promote(float32x4, float32x8)


def test_known_names_are_their_types():
    assert all(isinstance(t, DataType) and t.name == name for name, t in BY_NAME.items())
    assert str(float32x8) == repr(float32x8) == "float32x8"


def test_bfloat16_bits_by_hand():
    """1 is 0x3F80; 1 + 2^-8 lies halfway between 0x3F80 and 0x3F81 and rounds to the even
    one, 1 + 3·2^-8 (halfway between 0x3F81 and 0x3F82) to 0x3F82 = 1 + 2^-6; a NaN stays
    a NaN."""
    bits = bfloat16_bits([1.0, -2.0, 1 + 2 ** -8, 1 + 3 * 2 ** -8, 0.0, np.inf])
    np.testing.assert_array_equal(bits, [0x3F80, 0xC000, 0x3F80, 0x3F82, 0, 0x7F80])
    assert bits.dtype == np.uint16
    assert np.isnan(bfloat16_values(bfloat16_bits([np.nan]))[0])
    np.testing.assert_array_equal(bfloat16_values([0x3F80, 0xC000, 0x3F82]),
                                  [1.0, -2.0, 1 + 2 ** -6])


def test_bfloat16_bits_round_to_nearest_even_as_ml_dtypes():
    """bfloat16 is held as its bits, converted to and from float32 as ml_dtypes does:
    rounded to nearest even, NaN and infinities kept, subnormals included."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    values = np.array([0.5, -3.25, 1e-3, 1.5e38, np.inf, -np.inf, 1 + 2 ** -8,
                       1 + 3 * 2 ** -8, -7.1e-39, np.nan], np.float32)
    bits = bfloat16_bits(values)
    np.testing.assert_array_equal(bits, values.astype(ml_dtypes.bfloat16).view(np.uint16))
    np.testing.assert_array_equal(bfloat16_values(bits),
                                  bits.view(ml_dtypes.bfloat16).astype(np.float32))
