"""Data-movement operators against ONNX Runtime (one-node models) and numpy.

Cases are batched: every case of a test becomes one node of a single graph, compiled once
and run at each set of symbol values, and each node's outputs are compared with ONNX
Runtime running the same node on the same arrays.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import pytest

from tests.harness import assert_close, random_array, run_onnxruntime
from treadle.compiler import compile_graph
import treadle
from treadle.errors import KernelError, ModelError, ShapeError, UnsupportedOpError
from treadle.graph.graph import Graph
from treadle.graph.operator import apply
from treadle.graph.tensor import Tensor, constant, symbol
from treadle.target.cuda import cuda_target

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")
from onnx import helper, numpy_helper  # noqa: E402


@dataclass
class In:
    """A run-time input: a shape whose strings are symbols, and a dtype."""
    shape: tuple
    dtype: str = "float32"
    low: int = -50  # integer inputs (and integral ones) are drawn from [low, high)
    high: int = 50
    integral: bool = False


@dataclass
class Case:
    """One node: inputs are In (run time), arrays (constants) or None (missing)."""
    op: str
    inputs: list
    attrs: dict = field(default_factory=dict)
    outputs: int = 1
    opset: int = 17


def _array(spec: In, env: dict, seed: int) -> np.ndarray:
    shape = tuple(env[d] if isinstance(d, str) else d for d in spec.shape)
    if np.issubdtype(np.dtype(spec.dtype), np.integer) or spec.integral:
        return np.random.default_rng(seed).integers(spec.low, spec.high, shape).astype(spec.dtype)
    return random_array(shape, spec.dtype, seed)


def onnx_reference(case: Case, arrays: list[Optional[np.ndarray]]) -> list[np.ndarray]:
    names = ["" if a is None else f"in{k}" for k, a in enumerate(arrays)]
    while names and not names[-1]:
        names.pop()
    runtime = [k for k, spec in enumerate(case.inputs) if isinstance(spec, In)]
    graph = helper.make_graph(
        [helper.make_node(case.op, names, [f"out{k}" for k in range(case.outputs)],
                          **case.attrs)], "case",
        [helper.make_tensor_value_info(f"in{k}", helper.np_dtype_to_tensor_dtype(arrays[k].dtype),
                                       arrays[k].shape) for k in runtime],
        [helper.make_empty_tensor_value_info(f"out{k}") for k in range(case.outputs)],
        [numpy_helper.from_array(np.asarray(a), f"in{k}") for k, a in enumerate(case.inputs)
         if a is not None and not isinstance(a, In)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", case.opset)],
                              ir_version=9)
    return run_onnxruntime(model, {f"in{k}": arrays[k] for k in runtime})


def check(cases: list[Case], envs=({},)) -> None:
    """Compiles all cases as one graph, runs it at each env of symbol values and compares
    every output with ONNX Runtime's."""
    inputs, outputs = [], []
    for n, case in enumerate(cases):
        tensors = []
        for k, spec in enumerate(case.inputs):
            if isinstance(spec, In):
                tensors.append(Tensor(f"c{n}_in{k}", spec.dtype, spec.shape))
                inputs.append(tensors[-1])
            else:
                tensors.append(None if spec is None else constant(spec, f"c{n}_const{k}"))
        outputs += apply(case.op, tensors, case.attrs, name=f"case{n}_{case.op}",
                         output_names=[f"c{n}_out{k}" for k in range(case.outputs)])
    executable = compile_graph(Graph.from_outputs(inputs, outputs))
    for env in envs:
        arrays = [[_array(s, env, 10 * n + k) if isinstance(s, In) else s
                   for k, s in enumerate(case.inputs)] for n, case in enumerate(cases)]
        results = iter(executable(*[a for case, row in zip(cases, arrays)
                                    for s, a in zip(case.inputs, row) if isinstance(s, In)]))
        for n, (case, row) in enumerate(zip(cases, arrays)):
            for k, expected in enumerate(onnx_reference(case, row)):
                assert_close(next(results), expected,
                             context=f"case {n} {case.op} {case.attrs} output {k} at {env}")


def i64(*values) -> np.ndarray:
    return np.array(values, np.int64)


# ---- the exported-BERT shape chain ------------------------------------------------------
def test_shape_gather_unsqueeze_concat_reshape_is_symbolic():
    x = Tensor("x", "float32", ["batch", "seq", 768])
    shape, = apply("Shape", [x])
    parts = []
    for axis in (0, 1):
        dim, = apply("Gather", [shape, constant(np.array(axis, np.int64))], {"axis": 0})
        part, = apply("Unsqueeze", [dim, constant(i64(0))])
        parts.append(part)
    target, = apply("Concat", parts + [constant(i64(12, 64))], {"axis": 0})
    y, = apply("Reshape", [x, target])
    batch, seq = symbol("batch"), symbol("seq")
    assert target.value == (batch, seq, 12, 64)
    assert y.shape == (batch, seq, 12, 64)
    executable = compile_graph(Graph.from_outputs([x], [y, target]))
    for n in (1, 13):
        a = random_array((2, n, 768))
        out, computed = executable(a)
        np.testing.assert_array_equal(out, a.reshape(2, n, 12, 64))
        np.testing.assert_array_equal(computed, [2, n, 12, 64])


def test_reshape_infers_symbolic_minus_one():
    x = Tensor("x", "float32", ["batch", "seq", 768])
    flat, = apply("Reshape", [x, constant(i64(-1, 64))])
    heads, = apply("Reshape", [x, constant(i64(0, 0, 12, -1))])
    back, = apply("Reshape", [heads, constant(i64(-1, 2, 6, 64))])
    batch, seq = symbol("batch"), symbol("seq")
    assert flat.shape == (batch * seq * 12, 64)
    assert heads.shape == (batch, seq, 12, 64)
    assert back.shape == (batch * seq, 2, 6, 64)
    assert not flat.producer.checks and not back.producer.checks
    executable = compile_graph(Graph.from_outputs([x], [flat, back]))
    for n in (1, 7):
        a = random_array((3, n, 768))
        out_flat, out_back = executable(a)
        np.testing.assert_array_equal(out_flat, a.reshape(-1, 64))
        np.testing.assert_array_equal(out_back, a.reshape(-1, 2, 6, 64))


def test_reshape_symbolic_count_is_checked_at_run_time():
    x = Tensor("x", "float32", ["n", 4])
    y, = apply("Reshape", [x, constant(i64(-1, 6))], name="regroup")
    executable = compile_graph(Graph.from_outputs([x], [y]))
    a = random_array((9, 4))
    np.testing.assert_array_equal(executable(a)[0], a.reshape(6, 6))
    with pytest.raises(KernelError, match="regroup"):
        executable(random_array((5, 4)))


# ---- views ------------------------------------------------------------------------------
def test_view_ops():
    check([
        Case("Reshape", [In((2, 3, 5)), i64(5, 0, -1)]),
        Case("Reshape", [In((1, 7)), i64(7)]),
        Case("Reshape", [In((0, 3)), i64(3, 0)], {"allowzero": 1}, opset=14),
        Case("Flatten", [In((2, 3, 5))], {"axis": 0}),
        Case("Flatten", [In((2, 3, 5))], {"axis": -1}),
        Case("Flatten", [In((2, 3, 5))], {"axis": 3}),
        Case("Squeeze", [In((1, 7, 1))]),
        Case("Squeeze", [In((1, 7, 1)), i64(-1)]),
        Case("Unsqueeze", [In((7, 3)), i64(0, -1, 2)]),
        Case("Unsqueeze", [In(()), i64(0)]),
    ])


def test_view_ops_symbolic():
    check([Case("Reshape", [In(("n", 6)), i64(-1, 3)]),
           Case("Reshape", [In(("n", 6)), i64(0, 3, 2)]),
           Case("Flatten", [In((2, "n", 3))], {"axis": 2}),
           Case("Squeeze", [In(("n", 1)), i64(1)]),
           Case("Unsqueeze", [In(("n", 3)), i64(1)])],
          envs=({"n": 1}, {"n": 11}))


# ---- layout, joins, splits, slices ------------------------------------------------------
def test_layout_join_split():
    check([
        Case("Transpose", [In((2, 3, 5))]),
        Case("Transpose", [In((2, 3, 5, 1))], {"perm": [1, 3, 0, 2]}),
        Case("DepthToSpace", [In((1, 8, 3, 5))], {"blocksize": 2}),
        Case("DepthToSpace", [In((2, 18, 1, 2))], {"blocksize": 3, "mode": "CRD"}),
        Case("SpaceToDepth", [In((2, 3, 6, 4))], {"blocksize": 2}),
        Case("Concat", [In((2, 3)), In((5, 3)), In((1, 3))], {"axis": 0}),
        Case("Concat", [In((2, 1, 3)), In((2, 7, 3))], {"axis": -2}),
        Case("Concat", [In((4,), "int64"), i64(12, 64)], {"axis": 0}),
        Case("Split", [In((7, 4)), i64(2, 5)], outputs=2),
        Case("Split", [In((3, 13))], {"axis": 1, "num_outputs": 3}, outputs=3, opset=18),
        Case("Split", [In((6, 1))], outputs=3),
    ])


def test_layout_join_split_symbolic():
    check([
        Case("Transpose", [In(("n", 3, "m"))], {"perm": [2, 0, 1]}),
        Case("Concat", [In(("n", 3)), In(("m", 3)), In((2, 3))], {"axis": 0}),
        Case("Concat", [In((2, "n")), In((2, "n"))], {"axis": 1}),
        Case("Split", [In(("k", 5))], {"axis": 0, "num_outputs": 2}, outputs=2, opset=18),
        Case("Split", [In((4, "m")), i64(2, 2)], {"axis": 0}, outputs=2),
    ], envs=({"n": 1, "m": 2, "k": 3}, {"n": 13, "m": 7, "k": 13}))


BIG = 2 ** 63 - 1

SLICES = [  # starts, ends, axes, steps
    (i64(1), i64(4), None, None),
    (i64(-3, 0), i64(BIG, -1), i64(0, 1), None),
    (i64(-1), i64(-BIG - 1), i64(0), i64(-1)),
    (i64(100, 5), i64(-100, 0), i64(0, -1), i64(-2, -3)),
    (i64(-100), i64(100), i64(1), i64(3)),
    (i64(4), i64(2), i64(0), i64(1)),
    (i64(0, 2), i64(7, 9), i64(1, 0), i64(2, 4)),
]


def _slices(shape):
    return [Case("Slice", [In(shape), s, e] + [v for v in (a, st) if v is not None])
            for s, e, a, st in SLICES]


def test_slice():
    check(_slices((11, 7)) + _slices((1, 1)))


def test_slice_symbolic():
    check(_slices(("n", "m")), envs=({"n": 1, "m": 1}, {"n": 11, "m": 7}, {"n": 0, "m": 3}))


# ---- indexing, broadcasting, padding ----------------------------------------------------
def test_indexing():
    check([
        Case("Gather", [In((5, 7)), In((2, 3), "int64", -5, 5)], {"axis": 0}),
        Case("Gather", [In((5, 7)), In((3,), "int32", -7, 7)], {"axis": -1}),
        Case("Gather", [In((5, 7)), np.array(-2, np.int64)], {"axis": 1}),
        Case("GatherElements", [In((4, 7)), In((4, 3), "int64", -7, 7)], {"axis": 1}),
        Case("GatherElements", [In((5, 2)), In((3, 2), "int32", 0, 5)]),
        Case("OneHot", [In((2, 3), "int64", -4, 5), i64(5), np.array([0, 1], np.float32)]),
        Case("OneHot", [In((3,), "int32", 0, 4), np.array(4, np.int32),
                        np.array([-1, 7], np.float32)], {"axis": 0}),
        Case("OneHot", [In((2, 3), low=-4, high=4, integral=True), np.array(3.0, np.float32),
                        np.array([2, 5], np.float32)], {"axis": 1}),
        Case("OneHot", [In((7,)), np.array(3.0, np.float32), np.array([0, 1], np.float32)]),
        Case("Trilu", [In((2, 4, 5))]),
        Case("Trilu", [In((5, 3)), np.array(-1, np.int64)], {"upper": 0}),
        Case("Trilu", [In((3, 6)), np.array(2, np.int64)], {"upper": 1}),
        Case("CumSum", [In((3, 5)), np.array(1, np.int64)]),
        Case("CumSum", [In((4, 3)), np.array(0, np.int32)], {"exclusive": 1, "reverse": 1}),
        Case("CumSum", [In((7,), "int32"), np.array(-1, np.int64)], {"reverse": 1}),
    ])



def test_gather_nd():
    check([
        Case("GatherND", [In((5, 7)), In((3, 2), "int64", -5, 5)]),
        Case("GatherND", [In((5, 7, 3)), In((2, 4, 1), "int64", 0, 5)]),
        Case("GatherND", [In((2, 5, 3)), In((2, 1), "int64", -3, 3)], {"batch_dims": 1}),
        Case("GatherND", [In((2, 3, 7, 4)), In((2, 3, 5, 2), "int64", -4, 4)],
             {"batch_dims": 2}),
        Case("GatherND", [In((4, 3)), np.array([[3, -1], [0, 2]], np.int64)]),
    ])
    check([
        # Position ids as the dynamo exporter writes them: a symbolic batch of rows.
        Case("GatherND", [In(("n", 11, 5)), In(("n", "m", 1), "int64", 0, 11)],
             {"batch_dims": 1}),
    ], envs=({"n": 1, "m": 1}, {"n": 3, "m": 7}, {"n": 2, "m": 0}))

def test_scatter():
    rows = np.array([[4, 0, -2], [1, 3, 0]], np.int64)  # distinct targets per column
    repeated = np.array([[1, 1, 0], [1, 0, 1]], np.int32)
    check([
        Case("ScatterElements", [In((5, 3)), rows, In((2, 3))], {"axis": 0}),
        Case("ScatterElements", [In((3, 7), "int32"), np.array([[6, -1], [0, 2]]),
                                 In((2, 2), "int32")], {"axis": 1}),
        Case("ScatterElements", [In((2, 3)), repeated, In((2, 3))],
             {"axis": 1, "reduction": "add"}, opset=16),
        Case("ScatterElements", [In((2, 3)), repeated, In((2, 3))],
             {"axis": 1, "reduction": "max"}, opset=18),
        Case("ScatterND", [In((4, 5)), np.array([[2], [0]], np.int64), In((2, 5))]),
        Case("ScatterND", [In((3, 4, 2)), np.array([[[1, 3]], [[-1, 0]]], np.int64),
                           In((2, 1, 2))]),
        Case("ScatterND", [In((5,)), np.array([[1], [1], [4]], np.int64), In((3,))],
             {"reduction": "mul"}, opset=16),
        Case("ScatterND", [In((3, 2)), np.array([2, 1], np.int64), In(())]),
    ])


def test_indexing_symbolic():
    check([
        Case("Gather", [In(("n", 4)), In((3,), "int64", -1, 1)], {"axis": 0}),
        Case("Gather", [In((3, "n")), In(("m",), "int64", -1, 1)], {"axis": 1}),
        Case("CumSum", [In(("n", 2)), np.array(0, np.int64)]),
        Case("Trilu", [In(("n", "m"))], {"upper": 0}),
    ], envs=({"n": 1, "m": 2}, {"n": 13, "m": 5}))


def test_broadcast_and_pad():
    check([
        Case("Expand", [In((3, 1)), i64(2, 1, 5)]),
        Case("Expand", [In((1, 7)), i64(3, 1)]),
        Case("Tile", [In((2, 3)), i64(3, 1)]),
        Case("Tile", [In((1, 5, 1)), i64(2, 2, 7)]),
        Case("Pad", [In((3, 4)), i64(1, 2, 0, 3)]),
        Case("Pad", [In((3, 4)), i64(1, 0, 2, 1), np.array(2.5, np.float32)]),
        Case("Pad", [In((3, 5)), i64(-1, 2, 0, -2)]),
        Case("Pad", [In((4, 5)), i64(3, 1, 2, 4)], {"mode": "reflect"}),
        Case("Pad", [In((4, 5)), i64(3, 1, 2, 6)], {"mode": "edge"}),
        Case("Pad", [In((1, 3)), i64(2, 1, 0, 2)], {"mode": "edge"}),
        Case("Pad", [In((2, 3, 4)), i64(1, 2), None, i64(-2)], {"mode": "reflect"}, opset=18),
        Case("Pad", [In((3, 4), "int32"), i64(0, 5, 7, 1)], {"mode": "wrap"}, opset=19),
    ])


def test_broadcast_and_pad_symbolic():
    check([
        Case("Expand", [In(("n", 1)), i64(1, 6)]),
        Case("Tile", [In(("n", 3)), i64(2, 2)]),
        Case("Pad", [In(("n", 3)), i64(1, 0, 2, 1)]),
        Case("Pad", [In(("n", 3)), i64(2, 1, 1, 0)], {"mode": "edge"}),
        Case("Pad", [In((2, "n")), i64(0, 2, 0, 1)], {"mode": "reflect"}),
    ], envs=({"n": 3}, {"n": 13}))


def test_negative_pads_crop_before_every_mode_pads():
    """ONNX Runtime crops first and pads what is left: wrap repeats, reflect mirrors and
    edge repeats the cropped input's ends, whatever pads the other side."""
    mixed = [i64(-1, 2, 2, -1), i64(2, -1, -1, 2), i64(-2, 7, 3, -3), i64(-1, -2, 1, 3)]
    check([
        *(Case("Pad", [In((5, 7)), pads], {"mode": mode}, opset=19)
          for mode in ("wrap", "edge", "constant") for pads in mixed),
        Case("Pad", [In((5, 7)), i64(-1, 2, 2, -1)], {"mode": "reflect"}),
        Case("Pad", [In((5, 7)), i64(1, -2, -3, 1)], {"mode": "reflect"}),
        Case("Pad", [In((3, 11), "int32"), i64(1, -4, -2, 9)], {"mode": "wrap"}, opset=19),
    ])


def test_negative_pads_crop_before_padding_symbolic():
    check([
        Case("Pad", [In(("n", 5)), i64(-1, 2, 2, -1)], {"mode": "wrap"}, opset=19),
        Case("Pad", [In(("n", 5)), i64(1, -1, -1, 1)], {"mode": "reflect"}),
        Case("Pad", [In(("n", 5)), i64(-2, 1, 1, -3)], {"mode": "edge"}),
    ], envs=({"n": 3}, {"n": 13}))


def test_reflect_pads_are_checked_against_the_cropped_input():
    x = Tensor("x", "float32", [5])
    _raises(ShapeError, "Pad", [x, constant(i64(-3, 2))], {"mode": "reflect"},
            match="exceeds")
    n = Tensor("n", "float32", ["n"])
    model = compile_graph(Graph.from_outputs(
        [n], [apply("Pad", [n, constant(i64(-3, 2))], {"mode": "reflect"}, name="pad")[0]]))
    assert model(np.arange(6, dtype=np.float32))[0].tolist() == [3, 4, 5, 4, 3]
    with pytest.raises(KernelError, match="'pad'"):
        model(np.arange(5, dtype=np.float32))


def test_expand_from_symbolic_shape():
    x = Tensor("x", "float32", [1, 5])
    y = Tensor("y", "float32", ["n", 1])
    shape, = apply("Shape", [y])
    expanded, = apply("Expand", [x, shape])
    assert expanded.shape == (symbol("n"), 5)
    executable = compile_graph(Graph.from_outputs([x, y], [expanded]))
    a = random_array((1, 5))
    for n in (1, 7):
        out, = executable(a, random_array((n, 1)))
        np.testing.assert_array_equal(out, np.broadcast_to(a, (n, 5)))


# ---- Resize -----------------------------------------------------------------------------
TRANSFORMS = ["half_pixel", "pytorch_half_pixel", "asymmetric", "align_corners"]
NEAREST = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]


def test_resize_nearest():
    scales = np.array([1, 1, 2.0, 0.75], np.float32)
    cases = [Case("Resize", [In((1, 2, 3, 8)), None, scales],
                  {"mode": "nearest", "coordinate_transformation_mode": t, "nearest_mode": m})
             for t in TRANSFORMS for m in NEAREST]
    cases.append(Case("Resize", [In((2, 1, 5, 4), "int32"), None, None, i64(2, 1, 7, 1)],
                      {"coordinate_transformation_mode": "asymmetric"}))
    cases.append(Case("Resize", [In((1, 1, 1, 3)), None, None, i64(1, 1, 3, 7)],
                      {"coordinate_transformation_mode": "align_corners"}))
    check(cases)


def test_resize_linear():
    cases = [Case("Resize", [In((2, 3, 4, 5)), None, np.array([1, 1, 1.5, 2.0], np.float32)],
                  {"mode": "linear", "coordinate_transformation_mode": t}) for t in TRANSFORMS]
    cases += [Case("Resize", [In((1, 2, 7, 3)), None, None, i64(1, 2, 3, 1)],
                   {"mode": "linear", "coordinate_transformation_mode": t}) for t in TRANSFORMS]
    check(cases)


# (exclude_outside, cubic_coeff_a) pairs: each transformation mode takes one by default,
# every mode every pair with -m slow.
CUBIC_OPTIONS = [(0, -0.75), (1, -0.5), (1, -0.75), (0, -0.5)]


@pytest.mark.parametrize("pairings", ["rotated", pytest.param("all", marks=pytest.mark.slow)])
def test_resize_cubic(pairings):
    """Up- and down-sampling by scales and by sizes, at prime lengths, in every coordinate
    transformation mode, with and without the weights of outside neighbours."""
    scales = np.array([1, 1, 2.0, 0.6], np.float32)
    options = [(t, e, a) for k, t in enumerate(TRANSFORMS)
               for e, a in (CUBIC_OPTIONS if pairings == "all" else [CUBIC_OPTIONS[k]])]
    cases = [Case("Resize", [In((2, 3, 5, 7)), None, scales],
                  {"mode": "cubic", "coordinate_transformation_mode": t, "exclude_outside": e,
                   "cubic_coeff_a": a}) for t, e, a in options]
    cases += [Case("Resize", [In((1, 2, 7, 13)), None, None, i64(1, 2, 3, 17)],
                   {"mode": "cubic", "coordinate_transformation_mode": t, "exclude_outside": e})
              for t, e, _ in options]
    cases.append(Case("Resize", [In((1, 1, 1, 2)), None, None, i64(1, 1, 3, 1)],
                      {"mode": "cubic"}))
    cases += [Case("Resize", [In((1, 2, 7, 13)), None, np.array([1, 1, 0.55, 1.7], np.float32)],
                   {"mode": mode, "coordinate_transformation_mode": "half_pixel_symmetric"},
                   opset=19) for mode in ("nearest", "linear", "cubic")]
    check(cases)


def test_resize_keeping_the_aspect_ratio():
    """One scale for the resized axes, the largest within the sizes or the smallest
    covering them, over all axes or some."""
    policies = ("not_larger", "not_smaller")
    cases = [Case("Resize", [In((1, 2, 7, 13)), None, None, i64(5, 17)],
                  {"mode": mode, "axes": [2, 3], "keep_aspect_ratio_policy": policy}, opset=18)
             for mode in ("nearest", "linear", "cubic") for policy in policies]
    cases += [Case("Resize", [In((2, 3, 11, 5)), None, None, i64(3, 4)],
                   {"mode": "linear", "axes": [3, 2], "keep_aspect_ratio_policy": policy},
                   opset=18) for policy in policies]
    cases += [Case("Resize", [In((1, 2, 7, 13)), None, None, i64(1, 2, 5, 17)],
                   {"keep_aspect_ratio_policy": policy}, opset=18) for policy in policies]
    check(cases)


@pytest.mark.slow  # 35 s; the default cubic cases resize two axes
def test_resize_cubic_over_four_axes():
    """Sixteen taps a side, 256 terms: the sum must not nest too deep to print. (ONNX
    Runtime resizes two axes at most; the reference is two resizes, which commute.)"""
    x = Tensor("x", "float32", (3, 4, 5, 6))
    y, = apply("Resize", [x, None, None, constant(i64(5, 7, 3, 8))], {"mode": "cubic"})
    xs = random_array((3, 4, 5, 6), seed=3)
    first = Case("Resize", [In((3, 4, 5, 6)), None, None, i64(3, 4, 3, 8)], {"mode": "cubic"})
    outer = onnx_reference(first, [xs, None, None, first.inputs[3]])[0]
    outer = np.ascontiguousarray(outer.transpose(2, 3, 0, 1))
    second = Case("Resize", [In(outer.shape), None, None, i64(3, 8, 5, 7)], {"mode": "cubic"})
    expected = onnx_reference(second, [outer, None, None, second.inputs[3]])[0]
    assert_close(compile_graph(Graph.from_outputs([x], [y]))(xs)[0],
                 expected.transpose(2, 3, 0, 1), reduction=16)


def test_resize_crops():
    """tf_crop_and_resize: a region of interest reaching outside the input, where
    extrapolation_value is read, in each mode, over all axes or some, down to length 1."""
    roi = np.array([0, 0, -0.2, 0.3, 1, 1, 0.9, 1.4], np.float32)
    crop = {"coordinate_transformation_mode": "tf_crop_and_resize"}
    cases = [Case("Resize", [In((2, 3, 7, 11)), roi, None, i64(2, 3, 5, 13)],
                  {**crop, "mode": mode, "extrapolation_value": 2.5}) for mode in
             ("nearest", "linear", "cubic")]
    cases.append(Case("Resize", [In((2, 3, 7, 11)), np.array([0.1, 0.25, 0.8, 0.5], np.float32),
                                 None, i64(4, 1)], {**crop, "mode": "linear", "axes": [3, 2]},
                      opset=18))
    cases.append(Case("Resize", [In((1, 2, 5, 3), "int32"), roi, None, i64(1, 2, 3, 4)],
                      {**crop, "extrapolation_value": -7.0}))
    check(cases)


def test_resize_crops_at_symbolic_sizes():
    check([Case("Resize", [In(("n", 2, "h", 5)), np.array([-0.1, 0.2, 1.3, 0.7], np.float32),
                           None, i64(6, 3)],
                {"coordinate_transformation_mode": "tf_crop_and_resize", "mode": mode,
                 "axes": [2, 3]}, opset=18) for mode in ("nearest", "linear", "cubic")],
          envs=({"n": 0, "h": 3}, {"n": 2, "h": 1}, {"n": 1, "h": 13}))


def test_resize_cubic_symbolic():
    check([Case("Resize", [In(("n", 3, "h", 11)), None, None, i64(5, 2)],
                {"mode": "cubic", "axes": [2, 3], "coordinate_transformation_mode": t,
                 "exclude_outside": 1}, opset=18) for t in ("half_pixel", "align_corners")]
          + [Case("Resize", [In(("n", 2, "h", 5)), None, np.array([1, 1, 1.5, 3], np.float32)],
                  {"mode": "cubic"})],
          envs=({"n": 0, "h": 3}, {"n": 2, "h": 7}, {"n": 1, "h": 1}))


def test_resize_cubic_in_the_gpu_simulator():
    x = Tensor("x", "float32", ("n", 2, 5, 7))
    case = Case("Resize", [In((2, 2, 5, 7)), None, None, i64(3, 11)],
                {"mode": "cubic", "axes": [2, 3], "exclude_outside": 1}, opset=18)
    y, = apply("Resize", [x, None, None, constant(case.inputs[3])], case.attrs)
    program = compile_graph(Graph.from_outputs([x], [y]), target=cuda_target("sm_90"))
    xs = random_array((2, 2, 5, 7), seed=4)
    assert_close(program.simulate(xs)[0], onnx_reference(case, [xs, None, None, case.inputs[3]])[0])


def test_resize_symbolic():
    check([Case("Resize", [In((1, 2, "h", "w")), None, np.array([1, 1, 2, 2], np.float32)],
                {"mode": mode}) for mode in ("nearest", "linear")],
          envs=({"h": 1, "w": 3}, {"h": 7, "w": 5}))


# Antialiased downsampling: (mode, exclude_outside, cubic_coeff_a), and lengths shrunk by
# integer and other factors.
ANTIALIAS = [("linear", 0, -0.75), ("linear", 1, -0.75), ("cubic", 0, -0.75),
             ("cubic", 1, -0.5), ("cubic", 0, -0.5), ("cubic", 1, -0.75)]
SHRINK = [((24, 17), i64(7, 5)), ((10, 24), i64(3, 12)), ((17, 10), i64(5, 3))]


def test_resize_antialias_downsampling():
    """The kernel stretched by 1/scale and its weights normalised, by sizes and by scales,
    over 2-D inputs and two axes of 4-D ones, one of them shrunk and the other grown, and
    over a crop reaching outside the input."""
    cases = [Case("Resize", [In(SHRINK[k % 3][0]), None, None, SHRINK[k % 3][1]],
                  {"mode": m, "antialias": 1, "exclude_outside": e, "cubic_coeff_a": a},
                  opset=18) for k, (m, e, a) in enumerate(ANTIALIAS)]
    cases += [Case("Resize", [In((2, 3, 10, 9)), None, np.array([0.37, 2.5], np.float32)],
                   {"mode": m, "antialias": 1, "axes": [2, 3]}, opset=18)
              for m in ("linear", "cubic")]
    cases.append(Case("Resize", [In((2, 24, 17, 3)), None, np.array([1, 0.5, 0.25, 1],
                                                                     np.float32)],
                      {"mode": "cubic", "antialias": 1, "exclude_outside": 1}, opset=18))
    roi = np.array([-0.2, 0.3, 0.9, 1.4], np.float32)
    cases.append(Case("Resize", [In((1, 2, 24, 17)), roi, None, i64(7, 5)],
                      {"mode": "linear", "antialias": 1, "axes": [2, 3],
                       "coordinate_transformation_mode": "tf_crop_and_resize",
                       "extrapolation_value": 2.5}, opset=18))
    check(cases)


def test_resize_antialias_upsampling_changes_nothing():
    """Grown (or kept) axes take the plain taps: the same values as without antialias."""
    x = Tensor("x", "float32", (2, 3, 5, 4))
    pairs = []
    for mode, exclude in (("linear", 0), ("linear", 1), ("cubic", 0), ("cubic", 1)):
        # Without antialias linear mode takes no exclude_outside (ONNX Runtime refuses
        # it); its taps never leave the input.
        plain = exclude if mode == "cubic" else 0
        pairs += [apply("Resize", [x, None, None, constant(i64(13, 4))],
                        {"mode": mode, "axes": [2, 3], "antialias": flag,
                         "exclude_outside": e})[0] for flag, e in ((0, plain), (1, exclude))]
    xs = random_array((2, 3, 5, 4), seed=5)
    values = compile_graph(Graph.from_outputs([x], pairs))(xs)
    for plain, antialiased in zip(values[::2], values[1::2]):
        np.testing.assert_array_equal(antialiased, plain)
    check([Case("Resize", [In((2, 3, 5, 4)), None, None, i64(13, 11)],
                {"mode": m, "antialias": 1, "axes": [2, 3], "exclude_outside": e}, opset=18)
           for m, e, _ in ANTIALIAS[:4]])


def test_resize_antialias_symbolic():
    """A symbolic length resized to a known one shrinks or grows by a ratio known at run
    time only; scales are known, so the taps are too."""
    check([Case("Resize", [In(("n", 2, "h", 17)), None, None, i64(5, 6)],
                {"mode": m, "antialias": 1, "axes": [2, 3], "exclude_outside": e}, opset=18)
           for m, e, _ in ANTIALIAS[1:4]]
          + [Case("Resize", [In(("n", 2, "h", 17)), None, np.array([1, 1, 0.3, 0.45],
                                                                    np.float32)],
                  {"mode": "cubic", "antialias": 1}, opset=18)],
          envs=({"n": 0, "h": 3}, {"n": 2, "h": 24}, {"n": 1, "h": 1}, {"n": 1, "h": 5}))


@pytest.mark.slow
def test_resize_antialias_sweep():
    """Every option, coordinate transformation mode and shrink factor above."""
    transforms = [*TRANSFORMS, "half_pixel_symmetric"]
    cases = [Case("Resize", [In((1, 1, *shape)), None, None, i64(1, 1, *size)],
                  {"mode": m, "antialias": 1, "exclude_outside": e, "cubic_coeff_a": a,
                   "coordinate_transformation_mode": t}, opset=19)
             for m, e, a in ANTIALIAS for t in transforms for shape, size in SHRINK]
    cases += [Case("Resize", [In((1, 1, 10, 24)), None, np.array([1, 1, 0.37, 0.26],
                                                                 np.float32)],
                   {"mode": m, "antialias": 1, "exclude_outside": e, "cubic_coeff_a": a,
                    "coordinate_transformation_mode": t}, opset=19)
              for m, e, a in ANTIALIAS for t in transforms]
    check(cases)


# ---- bad inputs -------------------------------------------------------------------------
def _raises(kind, op, inputs, attrs=None, match=""):
    name = f"bad_{op.lower()}"
    with pytest.raises(kind, match=match) as info:
        apply(op, inputs, attrs, name=name)
    assert name in str(info.value)


def test_bad_inputs_name_the_node():
    x = Tensor("x", "float32", [2, 3, 5])
    runtime_shape = Tensor("shape", "int64", [2])
    _raises(UnsupportedOpError, "Reshape", [x, runtime_shape], match="must be known")
    _raises(ShapeError, "Reshape", [x, constant(i64(4, -1))], match="divide")
    _raises(ShapeError, "Reshape", [x, constant(i64(7, 5))], match="element count")
    _raises(ShapeError, "Reshape", [x, constant(i64(-1, -1))], match="more than one")
    _raises(ShapeError, "Transpose", [x], {"perm": [0, 0, 1]}, match="permutation")
    _raises(ShapeError, "Concat", [x, x], {"axis": 3}, match="out of range")
    _raises(ShapeError, "Concat", [x, Tensor("z", "float32", [2, 4, 5])], {"axis": 0},
            match="dimension 1")
    _raises(ShapeError, "Concat", [x, Tensor("z", "float32", [2, 3])], {"axis": 0}, match="rank")
    _raises(ShapeError, "Squeeze", [x, constant(i64(1))], match="squeezed")
    _raises(ShapeError, "Unsqueeze", [x, constant(i64(4))], match="out of range")
    _raises(ShapeError, "Gather", [x, constant(i64(0))], {"axis": -4}, match="out of range")
    _raises(ShapeError, "Split", [x, constant(i64(1, 3))], match="sum")
    _raises(ShapeError, "Slice", [x, constant(i64(0)), constant(i64(1)), constant(i64(0)),
                                  constant(i64(0))], match="step")
    _raises(ShapeError, "Pad", [x, constant(i64(0, 3, 0, 0, 0, 0))], {"mode": "reflect"},
            match="exceeds")
    _raises(ShapeError, "Expand", [x, constant(i64(4, 1))], match="broadcast")
    _raises(UnsupportedOpError, "Slice", [x, Tensor("s", "int64", [1]), constant(i64(1))],
            match="starts")
    _raises(UnsupportedOpError, "Resize", [Tensor("i", "int32", [2, 3, 5]), None,
                                           constant(np.array([1, 1, 2], np.float32))],
            {"mode": "cubic"}, match="cubic resizing of int32")
    _raises(UnsupportedOpError, "Resize", [x, None, constant(np.array([1, 1, 0.5], np.float32))],
            {"mode": "nearest", "antialias": 1}, match="antialias in nearest mode")
    _raises(ShapeError, "Resize", [x, None, None, constant(i64(2, 3, 9))],
            {"keep_aspect_ratio_policy": "fit"}, match="keep_aspect_ratio_policy")
    _raises(UnsupportedOpError, "Resize", [x, None, constant(np.ones(3, np.float32))],
            {"coordinate_transformation_mode": "tf_crop_and_resize"}, match="tf_crop")
    _raises(UnsupportedOpError, "Squeeze", [Tensor("s", "float32", ["n", 1])], match="symbolic")


def test_symbolic_mismatch_is_checked_at_run_time():
    a, b = Tensor("a", "float32", ["n", 3]), Tensor("b", "float32", ["m", 4])
    y, = apply("Concat", [a, b], {"axis": 1}, name="join")
    executable = compile_graph(Graph.from_outputs([a, b], [y]))
    out, = executable(random_array((2, 3)), random_array((2, 4)))
    assert out.shape == (2, 7)
    with pytest.raises(KernelError, match="join"):
        executable(random_array((2, 3)), random_array((5, 4)))


# ---- indices out of range ---------------------------------------------------------------
def _indexing_model(op: str, data: list, indices, attrs: dict, updates=None):
    """``indices`` is the shape of an input, or an array: the contents of an initializer."""
    names = ["data", "indices"] + (["updates"] if updates else [])
    inputs = [helper.make_tensor_value_info("data", onnx.TensorProto.FLOAT, data)]
    known = isinstance(indices, np.ndarray)
    if not known:
        inputs.append(helper.make_tensor_value_info("indices", onnx.TensorProto.INT64, indices))
    if updates:
        inputs.append(helper.make_tensor_value_info("updates", onnx.TensorProto.FLOAT, updates))
    node = helper.make_node(op, names, ["y"], name="pick", **attrs)
    graph = helper.make_graph([node], "m", inputs,
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(indices, "indices")] if known else [])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize("op, data, indices, attrs, good, bad, updates", [
    ("Gather", [5, 3], ["n"], {"axis": 0}, [0, -5, 4, 2], ([1, 5], 5), None),
    ("Gather", [5, 3], ["n"], {"axis": 0}, [], ([-6], -6), None),
    ("Gather", ["r", 7], [2, "m"], {"axis": 1}, [[6, -7], [0, 3]], ([[0, 1], [7, 2]], 7), None),
    ("Gather", [11], [], {"axis": 0}, 10, (11, 11), None),
    ("GatherElements", [5, 3], [5, 2], {"axis": 1}, [[0, -3]] * 5,
     ([[0, 2]] * 4 + [[3, 0]], 3), None),
    ("GatherND", [5, 3], ["n", 2], {}, [[0, 2], [4, -3]], ([[0, 2], [4, 3]], 3), None),
    ("GatherND", [2, 5, 3], [2, 1], {"batch_dims": 1}, [[4], [-5]], ([[1], [-6]], -6), None),
    ("ScatterElements", [4, 3], [1, 3], {"axis": 0}, [[3, -4, 0]], ([[0, 4, 0]], 4), [1, 3]),
    ("ScatterND", [4, 3], [2, 1], {}, [[3], [-4]], ([[2], [9]], 9), [2, 3]),
])
def test_indices_out_of_range_raise(op, data, indices, attrs, good, bad, updates):
    """In-range indices (negative ones count from the end) match ONNX Runtime; one out of
    range raises a KernelError naming the node and the index, as ONNX Runtime raises."""
    model = _indexing_model(op, data, indices, attrs, updates)
    compiled = treadle.compile(model)
    sizes = {"r": 2, "m": 2}
    shape = [sizes.get(d, d) for d in data]
    feeds = {"data": random_array(tuple(shape))}
    if updates:
        feeds["updates"] = random_array(tuple(updates))
    index = np.array(good, np.int64)
    assert_close(compiled(**feeds, indices=index)[0],
                 run_onnxruntime(model, {**feeds, "indices": index})[0])
    values, offending = bad
    with pytest.raises(KernelError, match=rf"node 'pick' \({op}\): index {offending} is out"):
        compiled(**feeds, indices=np.array(values, np.int64))


def test_known_indices_out_of_range_fail_to_compile():
    data = helper.make_tensor_value_info("data", onnx.TensorProto.FLOAT, [4, 3])
    indices = numpy_helper.from_array(np.array([1, -5], np.int64), "indices")
    node = helper.make_node("Gather", ["data", "indices"], ["y"], name="pick")
    graph = helper.make_graph([node], "m", [data],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
                              [indices])
    with pytest.raises(ModelError, match=r"node 'pick' \(Gather\): index -5 is out of range"):
        treadle.compile(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))


@pytest.mark.parametrize("op, data, indices, attrs, updates, good, bad", [
    ("Gather", ["r", "n"], [[4, -5], [0, 2]], {"axis": 1}, None, [5, 7, 2039],
     {0: 4, 1: 4, 4: 4}),
    ("Gather", ["n", 3], -1, {"axis": 0}, None, [1, 2, 13], {0: -1}),
    ("GatherElements", [2, "n"], [[0, -3], [2, 1]], {"axis": 1}, None, [3, 5, 2039],
     {0: 0, 1: -3, 2: -3}),
    ("GatherND", [3, "n"], [[2, 6], [0, -1]], {}, None, [7, 11], {0: 6, 1: 6, 6: 6}),
    ("GatherND", ["r", "n"], [[0, -1]], {}, None, [1, 3], {0: -1}),
    ("ScatterElements", [2, "n"], [[3], [-1]], {"axis": 1}, [2, 1], [4, 5, 17],
     {0: 3, 1: 3, 3: 3}),
    ("ScatterND", ["n", 3], [[4], [-2]], {}, [2, 3], [5, 7, 2039], {0: 4, 1: 4, 4: 4}),
])
def test_known_indices_over_a_symbolic_axis_are_checked_at_run_time(op, data, indices, attrs,
                                                                     updates, good, bad):
    """Known indices over an axis whose size only run time knows: at each size they fit,
    the result matches ONNX Runtime's; at one they do not (0 and 1 among them), the call
    raises a KernelError naming the node and the first index out of range."""
    model = _indexing_model(op, data, np.array(indices, np.int64), attrs, updates)
    compiled = treadle.compile(model)

    def feeds(n: int) -> dict:
        arrays = {"data": random_array(tuple(n if d == "n" else 3 if d == "r" else d
                                             for d in data))}
        return {**arrays, "updates": random_array(tuple(updates))} if updates else arrays
    for n in good:
        call = feeds(n)
        assert_close(compiled(**call)[0], run_onnxruntime(model, call)[0], context=f"n={n}")
    for n, offending in bad.items():
        with pytest.raises(KernelError, match=rf"node 'pick' \({op}\): index {offending} is out"):
            compiled(**feeds(n))


def test_reverse_sequence():
    """Lengths of every batch entry from 0 to the whole axis, time first or batch first,
    with run-time lengths and a symbolic length of the time axis."""
    check([
        Case("ReverseSequence", [In((7, 4, 3)), i64(7, 0, 1, 5)],
             {"batch_axis": 1, "time_axis": 0}),
        Case("ReverseSequence", [In((4, 13)), i64(13, 2, 1, 12)],
             {"batch_axis": 0, "time_axis": 1}),
        Case("ReverseSequence", [In(("t", 5), "int64"), In((5,), "int64", 0, 2)],
             {"batch_axis": 1, "time_axis": 0}),
    ], envs=({"t": 2}, {"t": 1}, {"t": 11}))
