"""The reduction family against numpy: every ReduceXxx op over several axes at once, axes
as attribute and as input, keepdims and noop_with_empty_axes, half precision, symbolic
sizes, ArgMax/ArgMin with ties, and bad axes. Many cases share one compiled graph."""
import numpy as np
import pytest

from tests.harness import assert_close, random_array, run_graph
from treadle.compiler import compile_graph
from treadle.errors import ShapeError, UnsupportedOpError
from treadle.graph.graph import Graph
from treadle.graph.operator import apply
from treadle.graph.tensor import Tensor, constant


def _lse(x, axis, keepdims):
    m = np.max(x, axis=axis, keepdims=True)
    s = np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True)) + m
    return s if keepdims else np.squeeze(s, axis=axis)


# ONNX op -> numpy reference taking (x, axis tuple, keepdims), computed in float64.
REFERENCES = {
    "ReduceSum": lambda x, a, k: np.sum(x, axis=a, keepdims=k),
    "ReduceMean": lambda x, a, k: np.mean(x, axis=a, keepdims=k),
    "ReduceMax": lambda x, a, k: np.max(x, axis=a, keepdims=k),
    "ReduceMin": lambda x, a, k: np.min(x, axis=a, keepdims=k),
    "ReduceProd": lambda x, a, k: np.prod(x, axis=a, keepdims=k),
    "ReduceL1": lambda x, a, k: np.sum(np.abs(x), axis=a, keepdims=k),
    "ReduceL2": lambda x, a, k: np.sqrt(np.sum(x * x, axis=a, keepdims=k)),
    "ReduceSumSquare": lambda x, a, k: np.sum(x * x, axis=a, keepdims=k),
    "ReduceLogSum": lambda x, a, k: np.log(np.sum(x, axis=a, keepdims=k)),
    "ReduceLogSumExp": _lse,
}

# (shape, axes, keepdims): sizes 1, odd and prime; first, last, middle, several and all axes.
CASES = [
    ((7, 61), [1], 1),
    ((7, 61), [0], 0),
    ((1, 257), [-1], 0),
    ((97, 3, 1), [0, 2], 1),
    ((3, 5, 7), [-1, 0], 0),
    ((13,), [0], 1),
]


def _input(op, shape, seed):
    # Prod and LogSum want positive values near 1 (no overflow, defined logarithm).
    low, high = (0.5, 1.5) if op in ("ReduceProd", "ReduceLogSum") else (-3.0, 3.0)
    return random_array(shape, seed=seed, low=low, high=high)


@pytest.mark.parametrize("axes_as_input", [False, True])
def test_reduce_family(axes_as_input):
    pairs, outputs, expected = [], [], []
    for op, reference in REFERENCES.items():
        for k, (shape, axes, keepdims) in enumerate(CASES):
            x = _input(op, shape, seed=k)
            t = Tensor(f"x_{op}_{k}", "float32", shape)
            if axes_as_input:
                y, = apply(op, [t, constant(np.array(axes, np.int64))], {"keepdims": keepdims})
            else:
                y, = apply(op, [t], {"axes": axes, "keepdims": keepdims})
            pairs.append((t, x))
            outputs.append(y)
            ref = reference(x.astype(np.float64), tuple(axes), bool(keepdims))
            expected.append((f"{op} {shape} axes={axes} keepdims={keepdims}", ref, shape))
    for actual, (context, ref, shape) in zip(run_graph(pairs, outputs), expected):
        assert_close(actual, ref.astype(np.float32), reduction=max(shape), context=context)


def test_default_and_empty_axes():
    """No axes reduces everything; empty axes with noop_with_empty_axes reduces nothing,
    which still applies the op's element map (ReduceSumSquare squares)."""
    x = random_array((3, 7), seed=1)
    t = Tensor("x", "float32", (3, 7))
    empty = constant(np.zeros(0, np.int64))
    outs = [apply("ReduceSum", [t], {"keepdims": 0})[0],
            apply("ReduceMax", [t], {})[0],
            apply("ReduceSum", [t, empty], {"noop_with_empty_axes": 1})[0],
            apply("ReduceSumSquare", [t, empty], {"noop_with_empty_axes": 1})[0],
            apply("ReduceMean", [t, empty], {"keepdims": 0})[0]]
    total, high, same, squares, mean = run_graph([(t, x)], outs)
    assert_close(total, np.float32(x.astype(np.float64).sum()), reduction=21)
    assert_close(high, x.max(keepdims=True))
    assert_close(same, x)
    assert_close(squares, x * x)
    assert_close(mean, np.float32(x.astype(np.float64).mean()), reduction=21)


def test_log_sum_exp_is_stable():
    x = random_array((5, 61), seed=2, low=500.0, high=1000.0)
    x[1] = -np.inf  # a row with an infinite maximum must not become NaN
    x[1, 3] = 700.0
    t = Tensor("x", "float32", x.shape)
    y, = run_graph([(t, x)], apply("ReduceLogSumExp", [t], {"axes": [1], "keepdims": 0}))
    assert_close(y, _lse(x.astype(np.float64), 1, False).astype(np.float32))


def test_half_precision_accumulates_in_float32():
    # 257 float16 values summed in float16 would lose about two decimal digits.
    x = random_array((3, 257), "float16", seed=3, low=0.0, high=1.0)
    t = Tensor("x", "float16", x.shape)
    outs = [apply(op, [t], {"axes": [1]})[0] for op in ("ReduceSum", "ReduceMean", "ReduceL2")]
    wide = x.astype(np.float64)
    refs = [wide.sum(1, keepdims=True), wide.mean(1, keepdims=True),
            np.sqrt((wide * wide).sum(1, keepdims=True))]
    for actual, ref in zip(run_graph([(t, x)], outs), refs):
        assert_close(actual, ref.astype(np.float16))


def test_integer_reductions():
    x = random_array((7, 13), "int32", seed=4)
    small = (x % 3).astype(np.int32)
    t, s = Tensor("x", "int32", x.shape), Tensor("s", "int32", x.shape)
    outs = [apply("ReduceSum", [t], {"axes": [0]})[0],
            apply("ReduceMax", [t], {"axes": [1], "keepdims": 0})[0],
            apply("ReduceMin", [t], {"axes": [1], "keepdims": 0})[0],
            apply("ReduceProd", [s], {"axes": [1], "keepdims": 0})[0],
            apply("ReduceL1", [t], {"axes": [0, 1], "keepdims": 0})[0]]
    got = run_graph([(t, x), (s, small)], outs)
    refs = [x.sum(0, keepdims=True), x.max(1), x.min(1), small.prod(1), np.abs(x).sum()]
    for actual, ref in zip(got, refs):
        np.testing.assert_array_equal(actual, np.asarray(ref, np.int32))


@pytest.mark.parametrize("shape", [(7, 13), ("n", 5)])
def test_bool_max_and_min_are_any_and_all(shape):
    """Over every axis, one, or none; an empty maximum is false, an empty minimum true."""
    t = Tensor("x", "bool", shape)
    cases = [(op, attrs) for op in ("ReduceMax", "ReduceMin")
             for attrs in ({}, {"axes": [1], "keepdims": 0}, {"axes": [0]})]
    outs = [apply(op, [t], attrs)[0] for op, attrs in cases]
    program = compile_graph(Graph.from_outputs([t], outs))
    sizes = [shape] if isinstance(shape[0], int) else [(0, 5), (1, 5), (7, 5)]
    for size in sizes:
        x = np.random.default_rng(size[0]).random(size) < 0.8
        for (op, attrs), actual in zip(cases, program(x)):
            fn = np.any if op == "ReduceMax" else np.all
            axes = tuple(attrs.get("axes", range(2)))
            ref = fn(x, axis=axes, keepdims=bool(attrs.get("keepdims", 1)))
            assert actual.dtype == np.bool_ and actual.shape == ref.shape
            np.testing.assert_array_equal(actual, ref, err_msg=f"{op} {attrs} at {size}")


def test_symbolic_sizes_compile_once():
    t = Tensor("x", "float32", ["n", 7])
    outs = [apply("ReduceSum", [t], {"axes": [0], "keepdims": 0})[0],
            apply("ReduceMean", [t], {"axes": [1]})[0],
            apply("ReduceLogSumExp", [t], {"axes": [0]})[0],
            apply("ArgMax", [t], {"axis": 0, "keepdims": 0})[0]]
    program = compile_graph(Graph.from_outputs([t], outs))
    for n in (1, 61):
        x = random_array((n, 7), seed=n)
        total, mean, lse, arg = program(x)
        wide = x.astype(np.float64)
        assert_close(total, wide.sum(0).astype(np.float32), reduction=n)
        assert_close(mean, wide.mean(1, keepdims=True).astype(np.float32))
        assert_close(lse, _lse(wide, 0, True).astype(np.float32), reduction=n)
        np.testing.assert_array_equal(arg, x.argmax(0))


def _arg_reference(x, axis, keepdims, largest, last):
    """numpy's argmax/argmin give the first occurrence; the last is found on the flip."""
    fn = np.argmax if largest else np.argmin
    if last:
        index = x.shape[axis] - 1 - fn(np.flip(x, axis), axis=axis)
    else:
        index = fn(x, axis=axis)
    return np.expand_dims(index, axis) if keepdims else index


def test_arg_max_min_with_ties():
    # Small integers in float make ties common, so first versus last index matters.
    x = np.floor(random_array((7, 5, 13), seed=5, low=0.0, high=3.0)).astype(np.float32)
    xi = random_array((61, 3), "int32", seed=6)
    t, ti = Tensor("x", "float32", x.shape), Tensor("xi", "int32", xi.shape)
    outs, refs = [], []
    for op, largest in (("ArgMax", True), ("ArgMin", False)):
        for axis in (0, 1, -1):
            for keepdims in (0, 1):
                for last in (0, 1):
                    attrs = {"axis": axis, "keepdims": keepdims, "select_last_index": last}
                    outs.append(apply(op, [t], attrs)[0])
                    refs.append(_arg_reference(x, axis, keepdims, largest, last))
        outs.append(apply(op, [ti], {})[0])
        refs.append(_arg_reference(xi, 0, True, largest, False))
    for k, (actual, ref) in enumerate(zip(run_graph([(t, x), (ti, xi)], outs), refs)):
        assert actual.dtype == np.int64, k
        np.testing.assert_array_equal(actual, ref, err_msg=f"case {k}")


@pytest.mark.parametrize("op, inputs, attrs, error", [
    ("ReduceSum", [], {"axes": [2]}, ShapeError),
    ("ReduceMax", [], {"axes": [0, -2]}, ShapeError),
    ("ReduceMean", ["runtime_axes"], {}, UnsupportedOpError),
    ("ArgMax", [], {"axis": -3}, ShapeError),
])
def test_bad_axes_name_the_node(op, inputs, attrs, error):
    x = Tensor("x", "float32", (3, 4))
    extra = [Tensor("axes", "int64", (1,))] if inputs else []
    with pytest.raises(error, match="bad_node"):
        apply(op, [x, *extra], attrs, name="bad_node")


def _nan_rows(n, seed):
    """Rows of length ``n`` with NaN first, in the middle and last, all NaN, NaN beside
    +-inf, +-inf alone, and none: at prime lengths some land in the vector loop and some
    in its scalar tail."""
    x = random_array((7, n), seed=seed, low=-3.0, high=3.0)
    x[0, 0] = x[1, n // 2] = x[2, -1] = np.nan
    x[3] = np.nan
    x[4, 0], x[4, n // 2], x[4, -1] = np.inf, np.nan, -np.inf
    x[5, 0], x[5, -1] = -np.inf, np.inf
    return x


def test_max_min_and_arg_max_min_propagate_nan():
    """A NaN anywhere makes ReduceMax/ReduceMin NaN and is where ArgMax/ArgMin point (the
    first NaN, as numpy's argmax; the last with select_last_index), along the innermost
    axis (vectorised) and an outer one, with the reduced length symbolic."""
    t = Tensor("x", "float32", [7, "n"])
    outs, refs = [], []
    for op, fn in (("ReduceMax", np.max), ("ReduceMin", np.min)):
        for axis in (1, 0):
            outs.append(apply(op, [t], {"axes": [axis], "keepdims": 0})[0])
            refs.append(lambda x, fn=fn, axis=axis: fn(x, axis=axis))
    for op, largest in (("ArgMax", True), ("ArgMin", False)):
        for last in (0, 1):
            outs.append(apply(op, [t], {"axis": 1, "select_last_index": last})[0])
            refs.append(lambda x, largest=largest, last=last:
                        _arg_reference(x, 1, True, largest, last))
    program = compile_graph(Graph.from_outputs([t], outs))
    for n in (1, 7, 61, 2039):
        x = _nan_rows(n, seed=n)
        for k, (actual, ref) in enumerate(zip(program(x), refs)):
            np.testing.assert_array_equal(actual, ref(x), err_msg=f"n={n} output {k}")
