"""The one numerical test harness: seeded inputs, shape lists, per-dtype tolerances.

References are always independent of treadle (numpy, ONNX Runtime, PyTorch); comparisons
check shape and dtype before values so a mismatch reports the real problem first.
"""
from __future__ import annotations

import numpy as np

# Sizes every sweep draws from: empty, 1, small odd, primes, a power of two, just past
# it, and a large prime (no block or vector width divides it).
SIZES = (0, 1, 7, 61, 97, 128, 257, 2039)
SMALL_SIZES = (1, 3, 7, 13)

# (rtol, atol) per dtype; float32 accumulations over K terms scale atol by sqrt(K) at call.
TOLERANCE = {
    "float64": (1e-10, 1e-12),
    "float32": (1e-5, 1e-5),
    "float16": (1e-2, 1e-2),
    "bfloat16": (2e-2, 2e-2),
}


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def random_array(shape, dtype="float32", seed: int = 0, low: float = -1.0, high: float = 1.0):
    gen = rng(seed)
    if np.issubdtype(np.dtype(dtype), np.integer):
        return gen.integers(-50, 50, size=shape).astype(dtype)
    return gen.uniform(low, high, size=shape).astype(dtype)


def assert_close(actual, expected, *, reduction: int = 1, context: str = "") -> None:
    """Checks shape, dtype, then values with the dtype's tolerance (widened for sums of
    ``reduction`` terms, whose rounding error grows with the square root of the count)."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    where = f" ({context})" if context else ""
    assert actual.shape == expected.shape, f"shape {actual.shape} != {expected.shape}{where}"
    assert actual.dtype == expected.dtype, f"dtype {actual.dtype} != {expected.dtype}{where}"
    rtol, atol = TOLERANCE.get(actual.dtype.name, (0, 0))
    scale = max(1.0, float(np.sqrt(reduction)))
    np.testing.assert_allclose(actual, expected, rtol=rtol * scale, atol=atol * scale,
                               err_msg=f"values differ{where}")


def run_graph(pairs, outputs) -> list[np.ndarray]:
    """Compiles the graph of ``outputs`` over the input tensors of ``pairs`` (tensor,
    array) and runs it on their arrays."""
    from treadle.compiler import compile_graph
    from treadle.graph.graph import Graph
    graph = Graph.from_outputs([t for t, _ in pairs], list(outputs))
    return compile_graph(graph)(*[a for _, a in pairs])


def run_onnxruntime(model, feeds: dict) -> list[np.ndarray]:
    """``model`` (an onnx.ModelProto) run by ONNX Runtime on ``feeds``, on one thread and
    without its warnings (ceil-mode pool shapes differ from ONNX's own inference)."""
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return session.run(None, feeds)
