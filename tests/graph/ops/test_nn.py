"""Neural-network operators against independent references: numpy for softmax, the
normalisations, matmul and the global pools; ONNX Runtime (one-node models) for Gemm,
Conv, the pools and LRN. Cases of one op share a compiled graph; each family also runs
with a symbolic dimension, compiled once and called at two sizes."""
import numpy as np
import pytest

from tests.harness import assert_close, random_array, run_graph, run_onnxruntime
from treadle.compiler import compile_graph
from treadle.errors import DTypeError, KernelError, ShapeError, UnsupportedOpError
from treadle.graph.graph import Graph
from treadle.graph.operator import apply
from treadle.graph.passes.fission import fission
from treadle.graph.passes.fold_constants import fold_constants
from treadle.graph.tensor import Tensor, constant
from treadle.target.cuda import cuda_target

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import helper  # noqa: E402


def ort_outputs(op, arrays, attrs, count=1, opset=17):
    """Runs a one-node ONNX model of ``op`` on ``arrays`` in ONNX Runtime; its ``count``
    outputs."""
    names = [f"in{k}" for k in range(len(arrays))]
    values = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
              for n, a in zip(names, arrays)]
    outs = [f"y{k}" for k in range(count)]
    graph = helper.make_graph([helper.make_node(op, names, outs, **attrs)], "g", values,
                              [helper.make_empty_tensor_value_info(n) for n in outs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              ir_version=9)
    return run_onnxruntime(model, dict(zip(names, arrays)))


def ort_run(op, arrays, attrs, opset=17):
    return ort_outputs(op, arrays, attrs, 1, opset)[0]


def check_against_ort(op, cases, dtype="float32", opset=17):
    """Each case (input shapes, attributes) as one node of a single graph, compared with
    ONNX Runtime."""
    pairs, outputs, refs = [], [], []
    for k, (shapes, attrs) in enumerate(cases):
        arrays = [random_array(s, dtype, seed=10 * k + j) for j, s in enumerate(shapes)]
        tensors = [Tensor(f"x{k}_{j}", dtype, s) for j, s in enumerate(shapes)]
        pairs += zip(tensors, arrays)
        outputs.append(apply(op, tensors, attrs)[0])
        refs.append(ort_run(op, arrays, attrs, opset))
    for (shapes, attrs), actual, ref in zip(cases, run_graph(pairs, outputs), refs):
        assert_close(actual, ref, reduction=int(np.prod(shapes[-1][1:])),
                     context=f"{op} {shapes} {attrs}")


# ---- softmax, normalisations --------------------------------------------------------------

def _softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _log_softmax(x, axis):
    s = x - x.max(axis=axis, keepdims=True)
    return s - np.log(np.exp(s).sum(axis=axis, keepdims=True))


def test_softmax_family():
    # Large inputs: exp would overflow without the max subtraction.
    cases = [((7, 61), -1), ((7, 61), 0), ((1, 257), 1), ((3, 1, 13), 1), ((2, 5, 97), -2)]
    pairs, outputs, refs = [], [], []
    for k, (shape, axis) in enumerate(cases):
        x = random_array(shape, seed=k, low=-100.0, high=100.0)
        t = Tensor(f"x{k}", "float32", shape)
        pairs.append((t, x))
        for op, ref in (("Softmax", _softmax), ("LogSoftmax", _log_softmax)):
            outputs.append(apply(op, [t], {"axis": axis})[0])
            refs.append((ref(x.astype(np.float64), axis), f"{op} {shape} axis={axis}"))
    for actual, (ref, context) in zip(run_graph(pairs, outputs), refs):
        assert_close(actual, ref.astype(np.float32), context=context)


def test_softmax_half_and_symbolic():
    t = Tensor("x", "float32", ["batch", "seq", 16])
    h = Tensor("h", "float16", [3, "n"])
    program = compile_graph(Graph.from_outputs([t, h], [
        apply("Softmax", [t], {"axis": -1})[0], apply("LogSoftmax", [t], {"axis": 1})[0],
        apply("Softmax", [h], {})[0]]))
    for batch, seq in ((1, 7), (2, 61)):
        x = random_array((batch, seq, 16), seed=seq)
        xh = random_array((3, seq), "float16", seed=seq, low=-8.0, high=8.0)
        soft, log, half = program(x, xh)
        assert_close(soft, _softmax(x.astype(np.float64), -1).astype(np.float32))
        assert_close(log, _log_softmax(x.astype(np.float64), 1).astype(np.float32))
        assert_close(half, _softmax(xh.astype(np.float64), -1).astype(np.float16))


def _layer_norm(x, scale, bias, axis, eps):
    axes = tuple(range(axis % x.ndim, x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    inv = 1.0 / np.sqrt(((x - mean) ** 2).mean(axis=axes, keepdims=True) + eps)
    y = (x - mean) * inv * scale
    return (y if bias is None else y + bias), mean, inv


def test_layer_normalization():
    cases = [((7, 61), -1, True), ((2, 3, 13), 1, False), ((1, 257), 0, True),
             ((5, 1, 97), -1, True)]
    pairs, outputs, refs = [], [], []
    for k, (shape, axis, with_bias) in enumerate(cases):
        x = random_array(shape, seed=k, low=3.0, high=5.0)  # a large mean
        scale = random_array(shape[axis:], seed=k + 10)
        bias = random_array(shape[axis:], seed=k + 20) if with_bias else None
        ts = [Tensor(f"{n}{k}", "float32", a.shape) for n, a in (("x", x), ("s", scale))]
        tb = Tensor(f"b{k}", "float32", bias.shape) if with_bias else None
        pairs += [(ts[0], x), (ts[1], scale)] + ([(tb, bias)] if with_bias else [])
        outputs += apply("LayerNormalization", [*ts, tb], {"axis": axis, "epsilon": 1e-3},
                         output_names=["y", "mean", "inv"])
        y, mean, inv = _layer_norm(x.astype(np.float64), scale, bias, axis, 1e-3)
        refs += [y, mean, inv]
    for actual, ref in zip(run_graph(pairs, outputs), refs):
        assert_close(actual, ref.astype(np.float32))


def test_layer_normalization_symbolic_and_half():
    t, s = Tensor("x", "float16", ["n", 33]), Tensor("s", "float16", [33])
    y, = apply("LayerNormalization", [t, s], {})
    program = compile_graph(Graph.from_outputs([t, s], [y]))
    scale = random_array((33,), "float16", seed=1)
    for n in (1, 13):
        x = random_array((n, 33), "float16", seed=n, low=100.0, high=104.0)
        ref, _, _ = _layer_norm(x.astype(np.float64), scale, None, -1, 1e-5)
        assert_close(program(x, scale)[0], ref.astype(np.float16))



def test_layer_normalization_over_a_symbolic_axis_with_constant_scale():
    t = Tensor("x", "float32", ["n", "d"])
    scale, bias = random_array((61,), seed=2), random_array((61,), seed=3)
    y, = apply("LayerNormalization", [t, constant(scale, "s"), constant(bias, "b")],
               {"axis": -1}, name="norm")
    program = compile_graph(Graph.from_outputs([t], [y]))
    for n in (1, 7):
        x = random_array((n, 61), seed=n)
        ref, _, _ = _layer_norm(x.astype(np.float64), scale, bias, -1, 1e-5)
        assert_close(program(x)[0], ref.astype(np.float32), context=f"n={n}")
    with pytest.raises(KernelError, match="'norm'"):
        program(random_array((3, 60), seed=4))

def test_batch_and_instance_normalization():
    x = random_array((2, 5, 7, 3), seed=1, low=-4.0, high=6.0)
    scale, bias, mean = (random_array((5,), seed=k) for k in (2, 3, 4))
    var = random_array((5,), seed=5, low=0.1, high=2.0)
    t = Tensor("x", "float32", ["n", 5, 7, "w"])
    params = [Tensor(n, "float32", (5,)) for n in ("scale", "bias", "mean", "var")]
    batch, = apply("BatchNormalization", [t, *params], {"epsilon": 1e-3})
    instance, = apply("InstanceNormalization", [t, *params[:2]], {"epsilon": 1e-3})
    program = compile_graph(Graph.from_outputs([t, *params], [batch, instance]))
    channel = (slice(None), None, None)
    for xs in (x, x[:1, :, :, :1]):
        got_batch, got_instance = program(xs, scale, bias, mean, var)
        wide = xs.astype(np.float64)
        ref = (wide - mean[channel]) / np.sqrt(var[channel] + 1e-3) * scale[channel] + bias[channel]
        assert_close(got_batch, ref.astype(np.float32))
        mu = wide.mean(axis=(2, 3), keepdims=True)
        sd = np.sqrt(wide.var(axis=(2, 3), keepdims=True) + 1e-3)
        ref = (wide - mu) / sd * scale[channel] + bias[channel]
        assert_close(got_instance, ref.astype(np.float32))


@pytest.mark.parametrize("shape, symbolic, sizes", [
    ((3, 5, 7, 11), ("n", 5, 7, "w"), [(3, 5, 7, 11), (1, 5, 7, 1), (0, 5, 7, 2)]),
    ((13, 2), ("n", 2), [(13, 2), (1, 2)]),
    ((2, 3, 61), (2, 3, "l"), [(2, 3, 61), (2, 3, 1)]),
])
def test_batch_normalization_training(shape, symbolic, sizes):
    """The batch's own statistics, and the running ones with momentum, as ONNX Runtime
    computes them, at concrete and at symbolic sizes (an empty batch gives NaN statistics)."""
    channels = shape[1]
    attrs = {"epsilon": 1e-3, "momentum": 0.8}
    params = [random_array((channels,), seed=k) for k in (2, 3, 4)]
    params.append(random_array((channels,), seed=5, low=0.1, high=2.0))
    tensors = [Tensor(n, "float32", (channels,)) for n in ("scale", "bias", "mean", "var")]
    for dims in (shape, symbolic):
        t = Tensor("x", "float32", dims)
        outs = apply("BatchNormalization", [t, *tensors], {**attrs, "training_mode": 1},
                     output_names=["y", "rm", "rv"])
        program = compile_graph(Graph.from_outputs([t, *tensors], outs))
        for size in (sizes if dims is symbolic else [shape]):
            x = random_array(size, seed=1, low=-4.0, high=6.0)
            expected = ort_outputs("BatchNormalization", [x, *params],
                                   {**attrs, "training_mode": 1}, 3, opset=15)
            reduction = max(1, int(np.prod(size)) // channels)
            for k, (got, ref) in enumerate(zip(program(x, *params), expected)):
                assert_close(got, ref, reduction=reduction, context=f"output {k} at {size}")


def test_batch_normalization_training_folds_on_constants():
    """Weight standardisation (NF-ResNets): a training-mode BatchNormalization of a
    constant weight is computed when compiling, and only the convolution remains."""
    w = random_array((4, 3, 3, 3), seed=1)
    ones, zeros = np.ones(4, np.float32), np.zeros(4, np.float32)
    flat = constant(w.reshape(1, 4, 27), "w")
    standardised, = apply("BatchNormalization",
                          [flat, *(constant(a) for a in (ones, zeros, zeros, ones))],
                          {"training_mode": 1, "epsilon": 1e-4})
    weight, = apply("Reshape", [standardised, constant(np.array([4, 3, 3, 3], np.int64))])
    x = Tensor("x", "float32", ["n", 3, 7, 5])
    y, = apply("Conv", [x, weight], {"pads": [1, 1, 1, 1]})
    graph = fold_constants(Graph.from_outputs([x], [y]))
    assert [n.op_type for n in graph.nodes] == ["Conv"]
    mean = w.reshape(4, -1).mean(1)[:, None, None, None]
    reference = (w - mean) / np.sqrt(w.reshape(4, -1).var(1)[:, None, None, None] + 1e-4)
    assert_close(graph.nodes[0].inputs[1].data, reference.astype(np.float32), reduction=27)
    xs = random_array((2, 3, 7, 5), seed=2)
    assert_close(compile_graph(graph)(xs)[0],
                 ort_run("Conv", [xs, reference.astype(np.float32)], {"pads": [1, 1, 1, 1]}),
                 reduction=27)


def test_fission_keeps_training_batch_normalization_whole():
    t = Tensor("x", "float32", ["n", 3, 5])
    params = [Tensor(n, "float32", (3,)) for n in ("scale", "bias", "mean", "var")]
    y, = apply("BatchNormalization", [t, *params], {"training_mode": 1})
    graph = fission(Graph.from_outputs([t, *params], [y]))
    assert [n.op_type for n in graph.nodes] == ["BatchNormalization"]


def test_lp_normalization_hardmax_dropout():
    x = random_array((7, 13), seed=1)
    ties = np.floor(random_array((5, 4), seed=2, low=0.0, high=2.0))
    t, tt = Tensor("x", "float32", x.shape), Tensor("t", "float32", ties.shape)
    outs = [apply("LpNormalization", [t], {"axis": 0, "p": 1})[0],
            apply("LpNormalization", [t], {})[0],
            apply("Hardmax", [tt], {})[0],
            apply("Hardmax", [tt], {"axis": 0})[0],
            *apply("Dropout", [t, constant(np.float32(0.5))], {}, output_names=["y", "mask"])]
    l1, l2, hard_last, hard_first, dropped, mask = run_graph([(t, x), (tt, ties)], outs)
    wide = x.astype(np.float64)
    assert_close(l1, (wide / np.abs(wide).sum(0, keepdims=True)).astype(np.float32))
    assert_close(l2, (wide / np.sqrt((wide ** 2).sum(1, keepdims=True))).astype(np.float32))
    for actual, axis in ((hard_last, 1), (hard_first, 0)):
        ref = np.zeros_like(ties)
        np.put_along_axis(ref, np.expand_dims(ties.argmax(axis), axis), 1.0, axis)
        np.testing.assert_array_equal(actual, ref)
    np.testing.assert_array_equal(dropped, x)
    assert mask.dtype == np.bool_ and mask.all() and mask.shape == x.shape


def test_lrn():
    check_against_ort("LRN", [([(2, 7, 3, 3)], {"size": 3, "alpha": 0.1, "beta": 0.7,
                                                 "bias": 2.0}),
                              ([(1, 5, 4, 1)], {"size": 5})])
    # ONNX Runtime takes odd sizes only; an even window reaches one more channel above.
    x = random_array((1, 6, 2), seed=3)
    t = Tensor("x", "float32", x.shape)
    y, = run_graph([(t, x)], apply("LRN", [t], {"size": 4, "alpha": 0.5}))
    padded = np.pad(x.astype(np.float64) ** 2, ((0, 0), (1, 2), (0, 0)))
    squares = sum(padded[:, k:k + 6] for k in range(4))
    assert_close(y, (x / (1.0 + 0.5 / 4 * squares) ** 0.75).astype(np.float32))


# ---- matrix products ----------------------------------------------------------------------

def test_matmul():
    cases = [((7,), (7,)), ((61,), (61, 3)), ((2, 3, 13), (13,)), ((1, 97), (97, 1)),
             ((2, 1, 3, 4), (5, 4, 6)), ((3, 5, 7), (1, 7, 2)), ((128, 7), (7, 257))]
    pairs, outputs, refs = [], [], []
    for k, (sa, sb) in enumerate(cases):
        a, b = random_array(sa, seed=k), random_array(sb, seed=k + 50)
        ta, tb = Tensor(f"a{k}", "float32", sa), Tensor(f"b{k}", "float32", sb)
        pairs += [(ta, a), (tb, b)]
        outputs.append(apply("MatMul", [ta, tb])[0])
        refs.append((np.matmul(a.astype(np.float64), b), sa[-1], f"{sa} @ {sb}"))
    ai, bi = random_array((3, 5), "int32", seed=1), random_array((5, 4), "int32", seed=2)
    ah, bh = random_array((3, 257), "float16", seed=3), random_array((257, 2), "float16", seed=4)
    for name, a, b in (("int", ai, bi), ("half", ah, bh)):
        ta, tb = Tensor(f"a_{name}", a.dtype, a.shape), Tensor(f"b_{name}", b.dtype, b.shape)
        pairs += [(ta, a), (tb, b)]
        outputs.append(apply("MatMul", [ta, tb])[0])
        refs.append((np.matmul(a.astype(np.float64), b), 1, name))
    for actual, (ref, k, context) in zip(run_graph(pairs, outputs), refs):
        assert_close(actual, ref.astype(actual.dtype), reduction=k, context=context)


def test_matmul_symbolic():
    ta, tb = Tensor("a", "float32", ["batch", "m", 7]), Tensor("b", "float32", [7, "n"])
    program = compile_graph(Graph.from_outputs([ta, tb], apply("MatMul", [ta, tb])))
    for batch, m, n in ((1, 1, 1), (2, 13, 61)):
        a, b = random_array((batch, m, 7), seed=m), random_array((7, n), seed=n)
        assert_close(program(a, b)[0], np.matmul(a.astype(np.float64), b).astype(np.float32))


def test_gemm():
    check_against_ort("Gemm", [
        ([(7, 13), (13, 5)], {}),
        ([(13, 7), (5, 13), (5,)], {"transA": 1, "transB": 1, "alpha": 0.5, "beta": 2.0}),
        ([(1, 61), (61, 3), (1, 1)], {"beta": -1.0}),
        ([(3, 4), (4, 97), (3, 1)], {"alpha": 3.0}),
        ([(3, 4), (97, 4), (3, 97)], {"transB": 1}),
    ])


def test_gemm_symbolic():
    ta, tb = Tensor("a", "float32", ["m", 5]), Tensor("b", "float32", [5, 3])
    c = constant(random_array((3,), seed=9))
    y, = apply("Gemm", [ta, tb, c], {"alpha": 2.0})
    program = compile_graph(Graph.from_outputs([ta, tb], [y]))
    b = random_array((5, 3), seed=1)
    for m in (1, 61):
        a = random_array((m, 5), seed=m)
        ref = 2.0 * (a.astype(np.float64) @ b) + c.data
        assert_close(program(a, b)[0], ref.astype(np.float32))


# ---- convolution and pooling --------------------------------------------------------------

def test_conv():
    check_against_ort("Conv", [
        ([(1, 3, 7, 7), (4, 3, 3, 3), (4,)], {"pads": [1, 1, 1, 1]}),
        ([(2, 2, 11, 13), (3, 2, 3, 2)], {"strides": [2, 1], "dilations": [2, 2],
                                          "pads": [0, 1, 2, 0]}),
        ([(1, 4, 5, 6), (6, 2, 3, 3)], {"group": 2, "auto_pad": "SAME_UPPER", "strides": [2, 2]}),
        ([(1, 5, 9, 8), (5, 1, 4, 3), (5,)], {"group": 5, "auto_pad": "SAME_LOWER",
                                              "strides": [2, 3]}),
        ([(1, 3, 10, 9), (2, 3, 3, 4)], {"auto_pad": "VALID", "strides": [3, 2]}),
        ([(2, 3, 17), (4, 3, 5)], {"strides": [3], "pads": [2, 1]}),
        ([(1, 7, 1, 1), (1, 7, 1, 1)], {}),
        ([(1, 2, 4, 5, 3), (2, 2, 2, 3, 2)], {"pads": [1, 0, 1, 0, 1, 1]}),
    ])


def test_conv_symbolic():
    x = Tensor("x", "float32", ["n", 3, "h", "w"])
    w = constant(random_array((4, 3, 3, 3), seed=1))
    b = constant(random_array((4,), seed=2))
    attrs = [{"pads": [1, 0, 2, 1], "strides": [2, 1]}, {"auto_pad": "SAME_UPPER", "strides": [2, 2]}]
    outs = [apply("Conv", [x, w, b], a)[0] for a in attrs]
    program = compile_graph(Graph.from_outputs([x], outs))
    for shape in ((1, 3, 5, 7), (2, 3, 12, 9)):
        xs = random_array(shape, seed=shape[2])
        for actual, a in zip(program(xs), attrs):
            assert_close(actual, ort_run("Conv", [xs, w.data, b.data], a), reduction=27)


POOLS = [
    ({"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1}, (1, 2, 7, 7)),
    ({"kernel_shape": [2, 3], "strides": [3, 2], "ceil_mode": 1}, (1, 2, 8, 9)),
    ({"kernel_shape": [3, 2], "strides": [2, 2], "auto_pad": "SAME_UPPER"}, (2, 3, 6, 5)),
    ({"kernel_shape": [3, 3], "auto_pad": "SAME_LOWER"}, (1, 1, 4, 4)),
    ({"kernel_shape": [4], "pads": [1, 2], "strides": [3]}, (1, 3, 13)),
    # ceil_mode drops a last window that would start in the end padding.
    ({"kernel_shape": [3], "strides": [3], "pads": [0, 2], "ceil_mode": 1}, (1, 1, 5)),
]


def test_max_pool():
    cases = [([shape], attrs) for attrs, shape in POOLS]
    cases.append(([(1, 2, 8, 9)], {"kernel_shape": [2, 2], "dilations": [2, 3], "pads": [1, 1, 1, 1]}))
    check_against_ort("MaxPool", cases)
    check_against_ort("MaxPool", [([(1, 2, 7, 5)], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]})],
                      dtype="int8")


def test_average_pool():
    cases = [([shape], {**attrs, "count_include_pad": include})
             for attrs, shape in POOLS for include in (0, 1)]
    check_against_ort("AveragePool", cases)
    check_against_ort("AveragePool", [([(1, 2, 9, 8)], {"kernel_shape": [2, 3], "dilations": [2, 2],
                                                         "pads": [1, 0, 1, 2]})], opset=19)


def test_max_pool_indices():
    """Both outputs, with ties (small integers) whose first in the window counts, for
    both storage orders, in 1, 2 and 3 spatial dimensions."""
    shapes = {1: (2, 3, 13), 2: (2, 3, 7, 11), 3: (1, 2, 5, 4, 3)}
    cases = [(shape, {**attrs, "storage_order": order}) for attrs, shape in POOLS
             for order in (0, 1)]
    cases += [((1, 2, 8, 9), {"kernel_shape": [2, 2], "dilations": [2, 3], "pads": [1, 1, 1, 1],
                              "storage_order": 1}),
              (shapes[3], {"kernel_shape": [2, 3, 2], "strides": [2, 1, 1], "storage_order": 1}),
              (shapes[3], {"kernel_shape": [3, 2, 2], "pads": [1, 0, 1, 1, 1, 0]})]
    pairs, outputs, refs = [], [], []
    for k, (shape, attrs) in enumerate(cases):
        x = np.floor(random_array(shape, seed=k, low=-3.0, high=3.0))
        t = Tensor(f"x{k}", "float32", shape)
        pairs.append((t, x))
        outputs += apply("MaxPool", [t], attrs, output_names=["y", "indices"])
        refs += [(r, f"{shape} {attrs}") for r in ort_outputs("MaxPool", [x], attrs, 2)]
    for actual, (ref, context) in zip(run_graph(pairs, outputs), refs):
        assert_close(actual, ref, context=context)


def test_max_pool_indices_symbolic():
    x = Tensor("x", "float32", ["n", 3, "h", 7])
    attrs = {"kernel_shape": [3, 2], "strides": [2, 1], "pads": [1, 0, 1, 1], "storage_order": 1}
    program = compile_graph(Graph.from_outputs([x], apply(
        "MaxPool", [x], attrs, output_names=["y", "indices"])))
    for n, h in ((0, 5), (1, 2), (2, 13)):
        xs = np.floor(random_array((n, 3, h, 7), seed=h, low=-3.0, high=3.0))
        for actual, ref in zip(program(xs), ort_outputs("MaxPool", [xs], attrs, 2)):
            assert_close(actual, ref, context=f"n={n} h={h}")


def test_lp_pool():
    """p = 1, 2 and 3 over the pool geometries (padding adds nothing to the norm),
    dilations, and the global pool."""
    cases = [([shape], {**attrs, "p": p}) for attrs, shape in POOLS for p in (1, 2, 3)]
    cases.append(([(1, 2, 8, 9)], {"kernel_shape": [2, 2], "dilations": [2, 3],
                                   "pads": [1, 1, 1, 1], "p": 3}))
    cases.append(([(2, 3, 5, 4, 3)], {"kernel_shape": [2, 3, 2], "strides": [1, 2, 1]}))
    check_against_ort("LpPool", cases, opset=18)
    check_against_ort("GlobalLpPool", [([(2, 3, 7, 5)], {"p": p}) for p in (1, 2, 3)]
                      + [([(1, 2, 13)], {})])


def test_lp_pool_symbolic():
    x = Tensor("x", "float32", ["n", 2, "h", 11])
    cases = [{"kernel_shape": [3, 2], "strides": [2, 3], "pads": [1, 0, 1, 1], "p": 2},
             {"kernel_shape": [2, 3], "auto_pad": "SAME_UPPER", "p": 3}]
    outs = [apply("LpPool", [x], attrs)[0] for attrs in cases] + [apply("GlobalLpPool", [x])[0]]
    program = compile_graph(Graph.from_outputs([x], outs))
    for n, h in ((0, 5), (1, 3), (2, 13)):
        xs = random_array((n, 2, h, 11), seed=h)
        got = program(xs)
        for attrs, actual in zip(cases, got):
            assert_close(actual, ort_run("LpPool", [xs], attrs, opset=18), context=f"{attrs}")
        assert_close(got[-1], ort_run("GlobalLpPool", [xs], {}), reduction=h * 11)


def test_new_pool_outputs_and_training_statistics_in_the_gpu_simulator():
    """LpPool, MaxPool's Indices and training-mode BatchNormalization as CUDA kernels."""
    x = Tensor("x", "float32", ("n", 3, 5, 7))
    params = [Tensor(n, "float32", (3,)) for n in ("scale", "bias", "mean", "var")]
    pool = {"kernel_shape": [3, 2], "pads": [1, 0, 0, 1], "storage_order": 1}
    outs = [apply("LpPool", [x], {"kernel_shape": [2, 3], "p": 3})[0],
            *apply("MaxPool", [x], pool, output_names=["y", "indices"]),
            *apply("BatchNormalization", [x, *params], {"training_mode": 1},
                   output_names=["y", "mean", "var"])]
    program = compile_graph(Graph.from_outputs([x, *params], outs), target=cuda_target("sm_90"))
    xs = np.floor(random_array((2, 3, 5, 7), seed=1, low=-3.0, high=3.0))
    values = [random_array((3,), seed=k, low=0.5, high=1.5) for k in range(4)]
    expected = [ort_run("LpPool", [xs], {"kernel_shape": [2, 3], "p": 3}, opset=18),
                *ort_outputs("MaxPool", [xs], pool, 2),
                *ort_outputs("BatchNormalization", [xs, *values], {"training_mode": 1}, 3, 15)]
    for k, (actual, ref) in enumerate(zip(program.simulate(xs, *values), expected)):
        assert_close(actual, ref, reduction=35, context=f"output {k}")


def test_pools_symbolic():
    x = Tensor("x", "float32", [1, 2, "h", "w"])
    attrs = {"kernel_shape": [3, 2], "strides": [2, 1], "pads": [1, 1, 0, 1]}
    outs = [apply("MaxPool", [x], attrs)[0], apply("AveragePool", [x], attrs)[0],
            apply("GlobalAveragePool", [x])[0], apply("GlobalMaxPool", [x])[0]]
    program = compile_graph(Graph.from_outputs([x], outs))
    for h, w in ((3, 1), (11, 6)):
        xs = random_array((1, 2, h, w), seed=h)
        top, mean, global_mean, global_top = program(xs)
        assert_close(top, ort_run("MaxPool", [xs], attrs))
        assert_close(mean, ort_run("AveragePool", [xs], attrs))
        assert_close(global_mean, xs.astype(np.float64).mean((2, 3), keepdims=True)
                     .astype(np.float32), reduction=h * w)
        assert_close(global_top, xs.max((2, 3), keepdims=True))


# ---- bad input ----------------------------------------------------------------------------

X = ("x", "float32", (1, 2, 5, 5))
W = ("w", "float32", (4, 2, 3, 3))


@pytest.mark.parametrize("op, inputs, attrs, outputs, error", [
    ("Conv", [X, W], {"auto_pad": "MIDDLE"}, 1, ShapeError),
    ("Conv", [X, W], {"group": 3}, 1, ShapeError),
    ("Conv", [X, ("w", "float32", (4, 3, 3, 3))], {}, 1, ShapeError),
    ("Conv", [X, W], {"strides": [1]}, 1, ShapeError),
    ("Conv", [X, W], {"kernel_shape": [2, 2]}, 1, ShapeError),
    ("Conv", [X, ("w", "float32", (4, 2, 7, 7))], {}, 1, ShapeError),
    ("MaxPool", [X], {"kernel_shape": [2, 2], "storage_order": 2}, 2, ShapeError),
    ("MaxPool", [X], {}, 1, ShapeError),
    ("AveragePool", [X], {"kernel_shape": [2, 2], "pads": [-1, 0, 0, 0]}, 1, ShapeError),
    ("BatchNormalization", [X] + [("p", "float32", (2,))] * 4, {}, 3, UnsupportedOpError),
    ("BatchNormalization", [X] + [("p", "float32", (3,))] * 4, {}, 1, ShapeError),
    ("Softmax", [X], {"axis": 4}, 1, ShapeError),
    ("Softmax", [X], {}, 2, UnsupportedOpError),  # it has no second output
    ("Softmax", [("i", "int32", (3,))], {}, 1, DTypeError),
    ("LpNormalization", [X], {"p": 3}, 1, ShapeError),
    ("MatMul", [("a", "float32", (3, 4)), ("b", "float32", (5, 2))], {}, 1, ShapeError),
    ("Gemm", [("a", "float32", (3, 4, 1)), ("b", "float32", (4, 2))], {}, 1, ShapeError),
    ("Gemm", [("a", "float32", (3, 4)), ("b", "float32", (4, 2)), ("c", "float32", (4,))], {},
     1, ShapeError),
    ("LRN", [X], {}, 1, ShapeError),
    ("LayerNormalization", [X, ("s", "float32", (3, 1, 2, 5, 5))], {}, 1, ShapeError),
])
def test_bad_input_names_the_node(op, inputs, attrs, outputs, error):
    tensors = [Tensor(*spec) for spec in inputs]
    names = [f"out{k}" for k in range(outputs)]
    with pytest.raises(error, match="bad_node"):
        apply(op, tensors, attrs, name="bad_node", output_names=names)


def _max_pool_reference(x, kernel, stride, pad):
    """numpy's max over each window of the input padded with -inf: NaN propagates."""
    padded = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)), constant_values=-np.inf)
    windows = np.lib.stride_tricks.sliding_window_view(padded, (kernel, kernel), axis=(2, 3))
    return windows[:, :, ::stride, ::stride].max(axis=(-2, -1))


@pytest.mark.parametrize("batch", [2, "n"])  # channels-last, and the NCHW window template
def test_max_pools_propagate_nan(batch):
    """A NaN in a window makes MaxPool's output NaN, and in a plane GlobalMaxPool's, with
    NaN first, in the middle or last of a window and planes all NaN or holding +-inf.
    (ONNX Runtime keeps or drops a NaN depending on where it stands.)"""
    x = random_array((2, 3, 13, 11), seed=9, low=-3.0, high=3.0)
    x[0, 0, 0, 0] = x[0, 1, 6, 5] = x[0, 2, 12, 10] = x[1, 0, 4, 9] = np.nan
    x[1, 1] = np.nan
    x[1, 2, 0, 0], x[1, 2, 7, 3], x[1, 2, 12, 10] = np.inf, np.nan, -np.inf
    t = Tensor("x", "float32", [batch, 3, 13, 11])
    outs = [apply("MaxPool", [t], {"kernel_shape": [3, 3], "strides": [s, s], "pads": [1] * 4})[0]
            for s in (1, 2)] + [apply("GlobalMaxPool", [t])[0]]
    refs = [_max_pool_reference(x, 3, s, 1) for s in (1, 2)] + [x.max(axis=(2, 3), keepdims=True)]
    for k, (actual, ref) in enumerate(zip(run_graph([(t, x)], outs), refs)):
        np.testing.assert_array_equal(actual, ref, err_msg=f"output {k}")
