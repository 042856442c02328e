"""CumSum (against ONNX Runtime) and CumProd (against numpy: ONNX Runtime lacks it) on every
axis, both directions, exclusive and not, at odd, prime, empty and symbolic lengths; the
kernel's work is linear in the length; the CUDA kernel in the simulator."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import treadle
from tests.frontend.onnx_models import make_model, tensor
from tests.graph.ops.work import iterations
from tests.harness import assert_close, rng, run_onnxruntime
from treadle.graph.operator import apply
from treadle.graph.ops import scan
from treadle.graph.tensor import Tensor, constant

pytest.importorskip("onnxruntime")

ELEM = {np.float32: TensorProto.FLOAT, np.int32: TensorProto.INT32,
        np.int64: TensorProto.INT64, np.float64: TensorProto.DOUBLE}


def scan_model(op, shape, axis, dtype=np.float32, **attrs):
    elem = ELEM[dtype]
    node = helper.make_node(op, ["x", "axis"], ["y"], name="running", **attrs)
    return make_model([node], [tensor("x", list(shape), elem)], [tensor("y", None, elem)],
                      {"axis": np.array(axis, np.int64)}, opset=26 if op == "CumProd" else 18)


def numpy_running(x, axis, product, exclusive, reverse):
    """ONNX's definition, from numpy's cumulative sum or product."""
    x = np.flip(x, axis) if reverse else x
    running = (np.cumprod if product else np.cumsum)(x, axis=axis, dtype=x.dtype)
    if exclusive:
        first = np.ones_like(np.take(x, [0], axis)) if product else \
            np.zeros_like(np.take(x, [0], axis))
        running = np.concatenate([first, np.delete(running, -1, axis)], axis) \
            if x.shape[axis] else running
    return np.flip(running, axis) if reverse else running


def small(shape, dtype, seed):
    """Values whose products stay exact and finite over long lines: mostly 1 and -1."""
    gen = rng(seed)
    return gen.choice(np.array([1, -1, 1, 2, 1, -1], dtype), shape)


CASES = [((13, 7), 0), ((13, 7), 1), ((3, 11, 5), 1), ((3, 11, 5), -1), ((2039,), 0),
         ((4, 0, 3), 1), ((0, 5), 1), ((1, 1), 0), ((2, 257, 61), 1)]


@pytest.mark.parametrize("exclusive, reverse", [
    (0, 0), pytest.param(1, 0, marks=pytest.mark.slow),
    pytest.param(0, 1, marks=pytest.mark.slow), (1, 1)])
@pytest.mark.parametrize("shape, axis", CASES)
def test_cumsum_matches_onnxruntime(shape, axis, exclusive, reverse):
    model = scan_model("CumSum", shape, axis, exclusive=exclusive, reverse=reverse)
    x = rng(len(shape)).standard_normal(shape).astype(np.float32)
    got = treadle.compile(model)(x=x)[0]
    assert_close(got, run_onnxruntime(model, {"x": x})[0], reduction=shape[axis])


@pytest.mark.parametrize("exclusive, reverse", [(0, 0), (1, 1)])
@pytest.mark.parametrize("dtype", [pytest.param(np.int32, marks=pytest.mark.slow), np.int64,
                                   pytest.param(np.float64, marks=pytest.mark.slow)])
@pytest.mark.parametrize("shape, axis", CASES[:5])
def test_cumprod_matches_numpy(shape, axis, dtype, exclusive, reverse):
    model = scan_model("CumProd", shape, axis, dtype, exclusive=exclusive, reverse=reverse)
    x = small(shape, dtype, len(shape))
    got = treadle.compile(model)(x=x)[0]
    np.testing.assert_array_equal(got, numpy_running(x, axis % len(shape), True,
                                                     exclusive, reverse))


def test_symbolic_lengths_compile_once():
    model = scan_model("CumSum", ["n", "m"], 1, np.int64, exclusive=1)
    compiled = treadle.compile(model)
    for n, m in ((1, 0), (3, 1), (7, 2039), (0, 4)):
        x = small((n, m), np.int64, m)
        np.testing.assert_array_equal(compiled(x=x)[0], run_onnxruntime(model, {"x": x})[0])


@pytest.mark.parametrize("op_type", ["CumSum", "CumProd"])
def test_the_work_is_linear(op_type):
    shape = (3, 4096, 5)
    op = apply(op_type, [Tensor("x", "float32", shape), constant(np.array(1, np.int64))],
               {"reverse": 1})[0].producer
    # One pass along each line: 61k elements, where the reduction it replaces took 4096
    # steps for each of them.
    assert iterations(scan._kernel(op, "running").function.body) <= 1.3 * np.prod(shape)


def test_the_cuda_kernel_in_the_simulator():
    model = scan_model("CumSum", (5, 9, 3), 1, reverse=1)
    x = rng(0).standard_normal((5, 9, 3)).astype(np.float32)
    got = treadle.compile(model, target="cuda:sm_90").executable.simulate(x)
    assert_close(got[0], run_onnxruntime(model, {"x": x})[0], reduction=9)
