"""Random inputs of a model, as the checker, the CLI and the compiler's timing in the
model make them."""
from __future__ import annotations

import numpy as np

INT_HIGH = 2  # random integers are 0 or 1: a valid token type, mask value or index


def random_input(rng: np.random.Generator, dtype: np.dtype, shape) -> np.ndarray:
    """A random value for an input: floats from a standard normal, integers from
    [0, INT_HIGH) so that indices stay small, booleans either way."""
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(dtype)
    if np.issubdtype(dtype, np.integer):
        return rng.integers(0, INT_HIGH, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)
