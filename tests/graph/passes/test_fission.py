"""fission: composite operators become primitives (Korch). Each rule is checked twice: the
structure (the op type is gone, these primitive op types replace it) and the numbers (the
fissioned graph, compiled, against ONNX Runtime running the original model)."""
import numpy as np
import pytest

from tests.harness import assert_close, random_array, run_onnxruntime
from treadle.compiler import compile_graph
from treadle.graph.graph import Graph
from treadle.graph.operator import apply
from treadle.graph.passes.channels_last import channels_last
from treadle.graph.passes.fission import fission
from treadle.graph.tensor import Tensor, constant

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402

from tests.frontend.onnx_models import make_model, tensor  # noqa: E402
from treadle.frontend.onnx import from_onnx  # noqa: E402

SHAPE = (3, 7, 61)          # odd and prime sizes: no vector width divides them
IMAGE = (3, 5, 7, 11)       # N x C x H x W


def op_types(graph):
    return [n.op_type for n in graph.nodes]


def one_op_model(op, shape, attrs=None, initializers=None, extra_inputs=(), outputs=("y",),
                 opset=17, elem_type=TensorProto.FLOAT):
    """One ``op`` node over graph input x (and ``extra_inputs``: name -> shape, then the
    initializers, in the order given)."""
    names = ["x", *dict(extra_inputs), *(initializers or {})]
    node = helper.make_node(op, names, list(outputs), name=op.lower(), **(attrs or {}))
    inputs = [tensor("x", shape, elem_type)] + [tensor(n, s, elem_type)
                                                for n, s in dict(extra_inputs).items()]
    return make_model([node], inputs, [tensor(o, None, elem_type) for o in outputs],
                      initializers, opset)


def check(model, feeds, gone, primitives, reduction=1):
    """Fissions the model's graph: ``gone`` no longer appears, exactly the op types
    ``primitives`` make it up, the outputs keep their names, and the compiled graph gives
    ONNX Runtime's numbers for the original model."""
    graph = from_onnx(model)
    split = fission(graph)
    assert gone not in op_types(split)
    assert set(op_types(split)) == set(primitives), op_types(split)
    assert [t.name for t in split.outputs] == [t.name for t in graph.outputs]
    actual = compile_graph(split)(*feeds.values())
    for out, a, e in zip(split.outputs, actual, run_onnxruntime(model, feeds)):
        assert_close(a, e, reduction=reduction, context=f"{gone}, output {out.name}")
    return split


# ---- softmax ------------------------------------------------------------------------------

@pytest.mark.parametrize("op,last", [("Softmax", "Div"), ("LogSoftmax", "Log")])
def test_softmax_family_is_max_exp_sum_and_a_map(op, last):
    """Every axis, negative ones too, on inputs large enough that exp would overflow
    without the max subtracted."""
    axes = (0, 1, 2, -1, -2)
    nodes = [helper.make_node(op, ["x"], [f"y{a}"], name=f"s{a}", axis=a) for a in axes]
    model = make_model(nodes, [tensor("x", SHAPE)], [tensor(f"y{a}", None) for a in axes])
    x = random_array(SHAPE, seed=1, low=-100.0, high=100.0)
    split = check(model, {"x": x}, op, {"ReduceMax", "Sub", "Exp", "ReduceSum", last},
                  reduction=61)
    reduced = [n.attrs["axes"] for n in split.nodes if n.op_type == "ReduceMax"]
    assert reduced == [[a % 3] for a in axes]


# ---- normalisations -----------------------------------------------------------------------

MOMENTS = {"ReduceMean", "Sub", "Mul", "Add", "Sqrt", "Div"}


def near_one(shape, dtype="float32"):
    """Values with a small spread about a large mean: epsilon matters against the
    variance, and the variance must come from deviations, not from E[x²] - E[x]²."""
    return random_array(shape, dtype, seed=1, low=0.9, high=1.1)


@pytest.mark.parametrize("axis,bias", [(-1, True), (1, False), (0, True)])
def test_layer_normalization(axis, bias):
    params = SHAPE[axis:]
    inits = {"scale": random_array(params, seed=2),
             **({"bias": random_array(params, seed=3)} if bias else {})}
    model = one_op_model("LayerNormalization", SHAPE, {"axis": axis, "epsilon": 1e-3}, inits)
    check(model, {"x": near_one(SHAPE)}, "LayerNormalization",
          MOMENTS, reduction=int(np.prod(params)))


def test_layer_normalization_mean_and_inv_std_dev_outputs():
    inits = {"scale": random_array((7, 61), seed=2), "bias": random_array((7, 61), seed=3)}
    model = one_op_model("LayerNormalization", SHAPE, {"axis": 1}, inits,
                         outputs=("y", "mean", "inv_std_dev"))
    graph = from_onnx(model)
    split = fission(graph)
    assert [t.name for t in split.outputs] == ["y", "mean", "inv_std_dev"]
    assert [t.shape for t in split.outputs] == [SHAPE, (3, 1, 1), (3, 1, 1)]
    assert "Reciprocal" in op_types(split)
    x = near_one(SHAPE)
    for actual, expected in zip(compile_graph(split)(x), run_onnxruntime(model, {"x": x})):
        assert_close(actual, expected, reduction=7 * 61)


def test_half_precision_layer_normalization_works_in_the_stash_type():
    half = TensorProto.FLOAT16
    inits = {"scale": random_array((61,), "float16", seed=2),
             "bias": random_array((61,), "float16", seed=3)}
    model = one_op_model("LayerNormalization", SHAPE, {}, inits, elem_type=half)
    split = check(model, {"x": random_array(SHAPE, "float16", seed=1)}, "LayerNormalization",
                  MOMENTS | {"Cast"}, reduction=61)
    mean = next(n for n in split.nodes if n.op_type == "ReduceMean")
    assert str(mean.outputs[0].dtype) == "float32"
    assert str(split.outputs[0].dtype) == "float16"


@pytest.mark.parametrize("axis", [-1, 1])
def test_rms_normalization(axis):
    params = SHAPE[axis:]
    model = one_op_model("RMSNormalization", SHAPE, {"axis": axis, "epsilon": 1e-2},
                         {"scale": random_array(params, seed=2)}, opset=23)
    check(model, {"x": near_one(SHAPE)}, "RMSNormalization",
          {"Mul", "ReduceMean", "Add", "Sqrt", "Div"}, reduction=int(np.prod(params)))


def test_instance_normalization_is_per_sample_and_channel():
    inits = {"scale": random_array((5,), seed=2), "bias": random_array((5,), seed=3)}
    model = one_op_model("InstanceNormalization", IMAGE, {"epsilon": 1e-3}, inits)
    split = check(model, {"x": near_one(IMAGE)}, "InstanceNormalization", MOMENTS | {"Reshape"},
                  reduction=7 * 11)
    assert {tuple(n.attrs["axes"]) for n in split.nodes if n.op_type == "ReduceMean"} == {(2, 3)}


@pytest.mark.parametrize("groups", [1, 3, 15])
def test_group_normalization_is_per_sample_and_group(groups):
    image = (2, 15, 7, 5)
    inits = {"scale": random_array((15,), seed=2), "bias": random_array((15,), seed=3)}
    model = one_op_model("GroupNormalization", image, {"epsilon": 1e-3, "num_groups": groups},
                         inits, opset=21)
    check(model, {"x": near_one(image)}, "GroupNormalization", MOMENTS | {"Reshape"},
          reduction=15 // groups * 7 * 5)


@pytest.mark.parametrize("groups", [None, 5])
def test_channels_last_normalizations_split_alike(groups):
    """The layout pass's channels-last twins (Candy's instance norms) split too: moments
    over the pixels (and a group's channels), parameters along the last axis."""
    x = Tensor("x", "float32", [2, 7, 5, 15])
    scale, bias = random_array((15,), seed=2), random_array((15,), seed=3)
    op, attrs = (("ChannelsLastInstanceNormalization", {}) if groups is None else
                 ("ChannelsLastGroupNormalization", {"num_groups": groups}))
    y = apply(op, [x, constant(scale, "scale"), constant(bias, "bias")],
              {"epsilon": 1e-3, **attrs})[0]
    split = fission(Graph.from_outputs([x], [y]))
    assert set(op_types(split)) == MOMENTS | (set() if groups is None else {"Reshape"})
    value = near_one((2, 7, 5, 15))
    grouped = value.reshape(2, 35, groups or 15, -1).astype(np.float64)
    mean = grouped.mean(axis=(1, 3), keepdims=True)
    std = np.sqrt(((grouped - mean) ** 2).mean(axis=(1, 3), keepdims=True) + 1e-3)
    expected = ((grouped - mean) / std).reshape(value.shape) * scale + bias
    assert_close(compile_graph(split)(value)[0], expected.astype(np.float32),
                 reduction=35 * 3, context=op)


def test_a_group_normalization_of_a_symbolic_image_stays():
    x = Tensor("x", "float32", [1, 6, "h", "w"])
    scale, bias = (constant(np.ones(6, np.float32), n) for n in ("scale", "bias"))
    y = apply("GroupNormalization", [x, scale, bias], {"num_groups": 2})[0]
    assert op_types(fission(Graph.from_outputs([x], [y]))) == ["GroupNormalization"]


def batch_norm_parameters():
    return {"scale": random_array((5,), seed=2), "bias": random_array((5,), seed=3),
            "mean": random_array((5,), seed=4),
            "var": random_array((5,), seed=5, low=0.5, high=1.5)}


def test_batch_normalization_with_constant_statistics_folds_them():
    model = one_op_model("BatchNormalization", IMAGE, {"epsilon": 1e-3},
                         batch_norm_parameters())
    split = check(model, {"x": random_array(IMAGE, seed=1)}, "BatchNormalization",
                  {"Mul", "Add"})
    assert [t.shape for n in split.nodes for t in n.inputs if t.is_constant] == [(5, 1, 1)] * 2


def test_batch_normalization_with_statistics_at_run_time():
    params = batch_norm_parameters()
    model = one_op_model("BatchNormalization", IMAGE, {"epsilon": 1e-3},
                         extra_inputs={name: (5,) for name in params})
    check(model, {"x": random_array(IMAGE, seed=1), **params}, "BatchNormalization",
          {"Add", "Sqrt", "Div", "Sub", "Mul", "Reshape"})


# ---- activations --------------------------------------------------------------------------

@pytest.mark.parametrize("approximate,curve", [("none", "Erf"), ("tanh", "Tanh")])
def test_gelu(approximate, curve):
    model = one_op_model("Gelu", SHAPE, {"approximate": approximate}, opset=20)
    check(model, {"x": random_array(SHAPE, seed=1, low=-5.0, high=5.0)}, "Gelu",
          {"Mul", "Add", curve})


def test_half_precision_gelu_makes_half_precision_constants():
    model = one_op_model("Gelu", SHAPE, opset=20, elem_type=TensorProto.FLOAT16)
    split = check(model, {"x": random_array(SHAPE, "float16", seed=1, low=-5.0, high=5.0)},
                  "Gelu", {"Mul", "Add", "Erf"})
    constants = [t for n in split.nodes for t in n.inputs if t.is_constant]
    assert constants and all(str(t.dtype) == "float16" for t in constants)


@pytest.mark.parametrize("op,attrs", [("HardSigmoid", {"alpha": 0.3, "beta": 0.4}),
                                      ("HardSigmoid", {}), ("HardSwish", {})])
def test_hard_sigmoid_and_hard_swish_clamp_a_line(op, attrs):
    model = one_op_model(op, SHAPE, attrs)
    check(model, {"x": random_array(SHAPE, seed=1, low=-6.0, high=6.0)}, op,
          {"Mul", "Add", "Min", "Max"})


# ---- pooling ------------------------------------------------------------------------------

@pytest.mark.parametrize("op,attrs", [("GlobalAveragePool", {}),
                                      ("AveragePool", {"kernel_shape": [7, 11]}),
                                      ("AveragePool", {"kernel_shape": [7, 11], "strides": [2, 3],
                                                       "auto_pad": "VALID"})])
def test_a_pool_over_the_whole_input_is_a_mean(op, attrs):
    model = one_op_model(op, IMAGE, attrs)
    split = check(model, {"x": random_array(IMAGE, seed=1)}, op, {"ReduceMean"},
                  reduction=7 * 11)
    assert split.nodes[0].attrs == {"axes": [2, 3], "keepdims": 1}


@pytest.mark.parametrize("attrs", [{"kernel_shape": [3, 3]},
                                   {"kernel_shape": [7, 11], "pads": [1, 1, 1, 1]}])
def test_an_average_pool_with_a_window_stays(attrs):
    graph = from_onnx(one_op_model("AveragePool", IMAGE, attrs))
    assert op_types(fission(graph)) == ["AveragePool"]


# ---- graphs as a whole --------------------------------------------------------------------

def test_symbolic_dimensions():
    """LayerNorm, then Softmax over the symbolic sequence axis, and a global pool: no rule
    needs a concrete size; compiled once, run at two sizes."""
    nodes = [helper.make_node("LayerNormalization", ["x", "scale", "bias"], ["h"], axis=-1),
             helper.make_node("Softmax", ["h"], ["y"], axis=1),
             helper.make_node("GlobalAveragePool", ["x"], ["pooled"])]
    model = make_model(nodes, [tensor("x", ["batch", "seq", 61])],
                       [tensor("y", None), tensor("pooled", None)],
                       {"scale": random_array((61,), seed=2), "bias": random_array((61,), seed=3)})
    split = fission(from_onnx(model))
    assert not {"LayerNormalization", "Softmax", "GlobalAveragePool"} & set(op_types(split))
    program = compile_graph(split)
    for shape in ((1, 7, 61), (3, 13, 61)):
        x = random_array(shape, seed=shape[1])
        for actual, expected in zip(program(x), run_onnxruntime(model, {"x": x})):
            assert_close(actual, expected, reduction=61, context=f"x of shape {shape}")


def test_a_graph_of_primitives_is_left_as_it_is():
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("Add", ["h", "b"], ["a"]),
             helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("ReduceSum", ["r", "axes"], ["y"], keepdims=1)]
    inits = {"w": random_array((61, 13), seed=2), "b": random_array((13,), seed=3),
             "axes": np.array([-1], np.int64)}
    graph = from_onnx(make_model(nodes, [tensor("x", ["seq", 61])], [tensor("y", None)], inits))
    split = fission(graph)
    assert op_types(split) == op_types(graph) == ["MatMul", "Add", "Relu", "ReduceSum"]
    assert split.outputs[0] is graph.outputs[0]


# ---- products of row-scaled factors -------------------------------------------------------

def test_softmax_then_product_divides_after_the_product():
    """softmax(x) @ v is (exp(x - max) @ v) / sum: the division follows the product."""
    nodes = [helper.make_node("Softmax", ["x"], ["p"], name="softmax", axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["y"], name="product")]
    model = make_model(nodes, [tensor("x", SHAPE), tensor("v", (3, 61, 5))], [tensor("y", None)])
    feeds = {"x": random_array(SHAPE, seed=1, low=-30.0, high=30.0),
             "v": random_array((3, 61, 5), seed=2)}
    split = check(model, feeds, "Softmax", {"ReduceMax", "Sub", "Exp", "ReduceSum", "MatMul",
                                            "Div"}, reduction=61)
    last = split.outputs[0].producer
    assert last.op_type == "Div" and last.inputs[0].producer.op_type == "MatMul"


def test_a_division_that_is_not_by_rows_stays_before_the_product():
    nodes = [helper.make_node("Div", ["x", "d"], ["p"], name="divide"),
             helper.make_node("MatMul", ["p", "v"], ["y"], name="product")]
    model = make_model(nodes, [tensor("x", (7, 61)), tensor("d", (1, 61)), tensor("v", (61, 5))],
                       [tensor("y", None)])
    graph = fission(from_onnx(model))
    assert op_types(graph) == ["Div", "MatMul"]


def test_an_integer_division_stays_before_the_product():
    nodes = [helper.make_node("Div", ["x", "d"], ["p"], name="divide"),
             helper.make_node("MatMul", ["p", "v"], ["y"], name="product")]
    int32 = TensorProto.INT32
    model = make_model(nodes, [tensor("x", (7, 61), int32), tensor("d", (7, 1), int32),
                               tensor("v", (61, 5), int32)], [tensor("y", None, int32)])
    assert op_types(fission(from_onnx(model))) == ["Div", "MatMul"]
