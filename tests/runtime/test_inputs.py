"""Random model inputs: the dtype and shape asked for (zero-size included), floats from a
standard normal, integers in [0, INT_HIGH), booleans of both values, and the same values
again from a generator seeded alike."""
import numpy as np
import pytest

from treadle.runtime.inputs import INT_HIGH, random_input

SHAPES = [(), (1,), (7,), (3, 61), (2039,), (0,), (4, 0, 3)]
DTYPES = ["float32", "float16", "float64", "int64", "int32", "int8", "uint8", "bool"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_dtype_and_shape_are_the_ones_asked_for(dtype, shape):
    value = random_input(np.random.default_rng(0), np.dtype(dtype), shape)
    assert isinstance(value, np.ndarray)
    assert value.dtype == np.dtype(dtype) and value.shape == shape


@pytest.mark.parametrize("dtype", ["int64", "int32", "int8", "uint8"])
def test_integers_stay_small_enough_to_index_with(dtype):
    value = random_input(np.random.default_rng(1), np.dtype(dtype), (4099,))
    assert value.min() >= 0 and value.max() < INT_HIGH
    assert set(np.unique(value).tolist()) == set(range(INT_HIGH))  # every value drawn


def test_booleans_take_both_values():
    value = random_input(np.random.default_rng(2), np.dtype(np.bool_), (1031,))
    assert value.dtype == np.bool_ and value.any() and not value.all()


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_floats_come_from_a_standard_normal(dtype):
    value = random_input(np.random.default_rng(3), np.dtype(dtype), (20011,))
    # Of 20011 draws the sample mean is within 4 standard errors (4/sqrt(n)) of 0.
    assert abs(value.mean()) < 4 / np.sqrt(value.size)
    assert value.std() == pytest.approx(1.0, abs=0.05)
    assert (value < 0).any() and (value > 1).any()
    assert np.isfinite(value).all()


@pytest.mark.parametrize("dtype", ["float32", "int64", "bool"])
def test_a_seeded_generator_gives_the_same_values(dtype):
    first = random_input(np.random.default_rng(42), np.dtype(dtype), (3, 61))
    again = random_input(np.random.default_rng(42), np.dtype(dtype), (3, 61))
    np.testing.assert_array_equal(first, again)
    rng = np.random.default_rng(42)
    one, two = (random_input(rng, np.dtype(dtype), (3, 61)) for _ in range(2))
    assert not np.array_equal(one, two)  # the generator advances between draws
    np.testing.assert_array_equal(one, first)
