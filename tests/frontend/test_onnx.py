"""Importing ONNX models: constants, symbolic dimensions, attributes, and the errors for
unsupported and malformed models, checked against ONNX Runtime."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import treadle
from tests.frontend.onnx_models import affine_model, make_model, tensor
from tests.harness import SIZES, assert_close, random_array, run_onnxruntime
from treadle.errors import ModelError, ShapeError, UnsupportedOpError
from treadle.frontend.onnx import from_onnx
from treadle.graph.tensor import symbol
from treadle.ir import dtypes

pytest.importorskip("onnxruntime")


def relu_model(opset: int = 17) -> onnx.ModelProto:
    return make_model([helper.make_node("Relu", ["x"], ["y"], name="relu")],
                      [tensor("x", [3])], [tensor("y", [3])], opset=opset)


def test_elementwise_model_matches_onnxruntime(tmp_path):
    model = affine_model()
    onnx.save(model, tmp_path / "affine.onnx")
    compiled = treadle.compile(tmp_path / "affine.onnx")
    x = random_array((7, 5), seed=1)
    assert_close(compiled(x)[0], run_onnxruntime(model, {"x": x})[0])


def test_constants_inputs_and_names_are_kept():
    graph = from_onnx(affine_model())
    assert [t.name for t in graph.inputs] == ["x"]
    assert [t.name for t in graph.outputs] == ["y"]
    assert [n.name for n in graph.nodes] == ["add_bias", "scale", "squash"]
    add, scale, _ = graph.nodes
    assert add.inputs[1].is_constant and add.inputs[1].name == "b"
    assert scale.inputs[1].is_constant and scale.inputs[1].data.dtype == np.float32
    assert graph.name == "test" and from_onnx(affine_model(), name="mine").name == "mine"


def test_graph_input_that_is_an_initializer_is_a_constant():
    model = affine_model()
    model.graph.input.append(tensor("b", [5]))
    graph = from_onnx(model)
    assert [t.name for t in graph.inputs] == ["x"]
    assert graph.nodes[0].inputs[1].is_constant


def test_symbolic_model_compiles_once_and_runs_at_every_size():
    model = affine_model()
    compiled = treadle.compile(model)
    assert compiled.executable.inputs and compiled.executable.symbols == [symbol("batch")]
    for size in SIZES + (0,):
        x = random_array((size, 5), seed=size)
        assert_close(compiled(x)[0], run_onnxruntime(model, {"x": x})[0],
                     context=f"batch={size}")


def test_dims_shared_by_name_and_fresh_symbols_for_unknown_dims():
    nodes = [helper.make_node("Add", ["a", "b"], ["y"], name="add")]
    model = make_model(nodes, [tensor("a", ["n", None]), tensor("b", ["n", None])],
                       [tensor("y", ["n", None])])
    graph = from_onnx(model)
    a, b = graph.inputs
    assert a.shape[0] == b.shape[0] == symbol("n")
    assert a.shape[1] == symbol("a_dim1") and b.shape[1] == symbol("b_dim1")
    compiled = treadle.compile(model)
    x = random_array((3, 4), seed=2)
    assert_close(compiled(x, x)[0], x + x)
    with pytest.raises(ShapeError, match="'b'"):
        compiled(x, random_array((4, 4)))


def test_unsupported_ops_are_all_listed_with_their_nodes_before_building():
    # A subgraph's nodes are imported in place, so they are listed too.
    then = helper.make_graph([helper.make_node("FancyOp", ["x"], ["t"], name="in_branch")],
                             "then", [], [tensor("t", [3])])
    nodes = [helper.make_node("FancyOp", ["x"], ["a"], name="fancy_1"),
             helper.make_node("FancyOp", ["a"], ["b"], name="fancy_2"),
             helper.make_node("Custom", ["b"], ["c"], name="custom", domain="com.example"),
             helper.make_node("If", ["cond"], ["d"], name="branch", then_branch=then,
                              else_branch=then),
             # treadle's own layout operators are not ONNX operators.
             helper.make_node("ChannelsLastConv", ["x", "x"], ["e"], name="internal"),
             # Would fail shape inference, were the graph built: it must not be.
             helper.make_node("Add", ["x", "wrong"], ["y"], name="bad_add")]
    model = make_model(nodes, [tensor("x", [3]), tensor("cond", [], TensorProto.BOOL),
                               tensor("wrong", [4])], [tensor("y", [3])])
    with pytest.raises(UnsupportedOpError) as info:
        from_onnx(model)
    message = str(info.value)
    for text in ("FancyOp", "'fancy_1'", "'fancy_2'", "com.example.Custom", "'custom'",
                 "'in_branch'", "ChannelsLastConv", "'internal'"):
        assert text in message
    assert "bad_add" not in message


@pytest.mark.parametrize("opset", [10, 29])
def test_opsets_outside_11_to_28_are_rejected_by_version(opset):
    with pytest.raises(UnsupportedOpError, match=f"opset {opset}.*11 to 28"):
        from_onnx(relu_model(opset))


def _opset_11_model() -> onnx.ModelProto:
    """Ops whose form changed at 13: Softmax over the input viewed as a matrix from axis
    1 on, and Split, Squeeze, Unsqueeze and ReduceSum taking attributes, not inputs."""
    nodes = [helper.make_node("Softmax", ["x"], ["soft"], name="soft"),
             helper.make_node("LogSoftmax", ["x"], ["logsoft"], axis=2, name="logsoft"),
             helper.make_node("Split", ["x"], ["a", "b"], axis=2, split=[2, 5], name="split"),
             helper.make_node("Unsqueeze", ["a"], ["a4"], axes=[0], name="unsqueeze"),
             helper.make_node("Squeeze", ["a4"], ["a3"], axes=[0], name="squeeze"),
             helper.make_node("ReduceSum", ["b"], ["y"], axes=[1, -1], keepdims=0, name="sum")]
    outputs = [tensor("soft", ["n", 3, 7]), tensor("logsoft", ["n", 3, 7]),
               tensor("a3", ["n", 3, 2]), tensor("y", ["n"])]
    return make_model(nodes, [tensor("x", ["n", 3, 7])], outputs, opset=11)


def test_opset_11_model_follows_its_versions_semantics():
    model = _opset_11_model()
    for n in (1, 5):
        x = random_array((n, 3, 7), seed=n, low=-3, high=3)
        for got, want in zip(treadle.compile(model)(x), run_onnxruntime(model, {"x": x})):
            assert_close(got, want)
    # The same Softmax node at opset 13 normalises along the last axis alone.
    newer = make_model([helper.make_node("Softmax", ["x"], ["y"])], [tensor("x", [2, 3, 7])],
                       [tensor("y", [2, 3, 7])], opset=13)
    x = random_array((2, 3, 7), seed=2)
    assert_close(treadle.compile(newer)(x)[0], np.exp(x) / np.exp(x).sum(-1, keepdims=True))


def test_opset_28_model_follows_its_versions_semantics():
    """Mod with an infinite divisor and SpaceToDepth's mode are opset 28's (newer than
    ONNX Runtime reads): numpy is the reference."""
    nodes = [helper.make_node("Mod", ["a", "b"], ["r"], name="mod"),
             helper.make_node("SpaceToDepth", ["x"], ["s"], blocksize=2, mode="CRD")]
    model = make_model(nodes, [tensor("a", [6]), tensor("b", [6]), tensor("x", [1, 3, 4, 6])],
                       [tensor("r", [6]), tensor("s", [1, 12, 2, 3])], opset=28)
    a = np.array([1.5, -1.5, 0.0, 7.0, -7.0, 5.0], np.float32)
    b = np.array([np.inf, np.inf, -np.inf, -np.inf, 3.0, -3.0], np.float32)
    x = random_array((1, 3, 4, 6), seed=5)
    r, s = treadle.compile(model)(a, b, x)
    np.testing.assert_array_equal(r, np.mod(a, b))
    blocks = x.reshape(1, 3, 2, 2, 3, 2).transpose(0, 1, 3, 5, 2, 4).reshape(1, 12, 2, 3)
    np.testing.assert_array_equal(s, blocks)


@pytest.mark.parametrize("op", ["IsNaN", "IsInf"])
def test_is_nan_and_is_inf_over_odd_and_symbolic_sizes(op):
    specials = np.array([np.nan, np.inf, -np.inf, 0.0, -1.5, 3e38], np.float32)
    model = make_model([helper.make_node(op, ["x"], ["y"])], [tensor("x", ["n", 3])],
                       [tensor("y", ["n", 3], TensorProto.BOOL)], opset=20)
    compiled = treadle.compile(model)
    for n in (1, 7, 2039):
        x = np.random.default_rng(n).choice(specials, (n, 3)).astype(np.float32)
        (y,) = compiled(x)
        np.testing.assert_array_equal(y, np.isnan(x) if op == "IsNaN" else np.isinf(x))
    negative_only = make_model([helper.make_node("IsInf", ["x"], ["y"], detect_positive=0)],
                               [tensor("x", [6])], [tensor("y", [6], TensorProto.BOOL)],
                               opset=20)
    np.testing.assert_array_equal(treadle.compile(negative_only)(specials)[0],
                                  np.isneginf(specials))


def test_graph_outputs_without_shapes_take_the_inferred_ones():
    nodes = [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Shape", ["y"], ["s"])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
               helper.make_tensor_value_info("s", TensorProto.INT64, None)]
    model = make_model(nodes, [tensor("x", ["n", 5])], outputs)
    x = random_array((3, 5), seed=4)
    got, want = treadle.compile(model)(x), run_onnxruntime(model, {"x": x})
    assert_close(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


def test_a_node_reading_an_undefined_tensor_names_both():
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="first"),
             helper.make_node("Add", ["r", "ghost"], ["y"], name="second")]
    model = make_model(nodes, [tensor("x", [3])], [tensor("y", [3])])
    with pytest.raises(ModelError, match="node 'second' \\(Add\\) reads tensor 'ghost'"):
        from_onnx(model)


def test_tensors_defined_twice_and_missing_outputs_are_malformed():
    twice = [helper.make_node("Relu", ["x"], ["y"], name="one"),
             helper.make_node("Neg", ["x"], ["y"], name="two")]
    with pytest.raises(ModelError, match="node 'two' \\(Neg\\) defines tensor 'y'"):
        from_onnx(make_model(twice, [tensor("x", [3])], [tensor("y", [3])]))
    with pytest.raises(ModelError, match="graph output 'z'"):
        from_onnx(make_model(twice[:1], [tensor("x", [3])], [tensor("z", [3])]))



def test_large_weights_are_checked_by_treadle_not_serialised_for_the_checker():
    """ONNX's checker sees a large initializer as a graph input of its type (it serialises
    what it checks); its data is read, and found short, by treadle."""
    weight = numpy_helper.from_array(np.ones((64, 64), np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")]
    model = make_model(nodes, [tensor("x", [2, 64])], [tensor("y", [2, 64])])
    model.graph.initializer.append(weight)
    x = np.ones((2, 64), np.float32)
    np.testing.assert_allclose(treadle.compile(model)(x)[0], x @ np.ones((64, 64)))
    model.graph.node[0].attribute.append(helper.make_attribute("alpha", 0.5))
    with pytest.raises(ModelError, match="not valid ONNX"):
        from_onnx(model)
    del model.graph.node[0].attribute[:]
    model.graph.initializer[0].raw_data = weight.raw_data[:100]
    with pytest.raises(ModelError, match="tensor 'w' cannot be read"):
        from_onnx(model)

def test_checker_failures_and_unreadable_files_are_model_errors(tmp_path):
    model = relu_model()
    model.graph.node[0].attribute.append(helper.make_attribute("alpha", 0.5))
    with pytest.raises(ModelError, match="not valid ONNX"):
        from_onnx(model)
    path = tmp_path / "garbage.onnx"
    path.write_bytes(b"\x07not a model")
    with pytest.raises(ModelError, match="garbage.onnx"):
        from_onnx(path)
    with pytest.raises(FileNotFoundError):
        from_onnx(tmp_path / "missing.onnx")


def test_inputs_without_rank_or_of_unsupported_types_are_named():
    model = relu_model()
    model.graph.input[0].type.tensor_type.ClearField("shape")
    with pytest.raises(ModelError, match="graph input 'x' has no shape"):
        from_onnx(model)
    nodes = [helper.make_node("Identity", ["s"], ["y"], name="same")]
    strings = make_model(nodes, [tensor("s", [2], TensorProto.STRING)],
                         [tensor("y", [2], TensorProto.STRING)])
    with pytest.raises(UnsupportedOpError, match="'s'.*STRING"):
        from_onnx(strings)


def test_attributes_decode_to_python_values():
    nodes = [helper.make_node("LeakyRelu", ["x"], ["a"], name="leaky", alpha=0.25),
             helper.make_node("Cast", ["a"], ["b"], name="cast", to=TensorProto.FLOAT),
             helper.make_node("Gelu", ["b"], ["y"], name="gelu", approximate="tanh")]
    model = make_model(nodes, [tensor("x", [2, 9])], [tensor("y", [2, 9])], opset=20)
    graph = from_onnx(model)
    assert [n.attrs for n in graph.nodes] == [{"alpha": 0.25}, {"to": 1},
                                              {"approximate": "tanh"}]
    x = random_array((2, 9), seed=3, low=-3, high=3)
    assert_close(treadle.compile(model)(x)[0], run_onnxruntime(model, {"x": x})[0])


def test_constant_nodes_of_every_value_kind_are_folded():
    values = {  # attribute -> (value, output type, output shape)
        "value": (numpy_helper.from_array(np.arange(6, dtype=np.int32).reshape(2, 3)),
                  TensorProto.INT32, [2, 3]),
        "value_float": (1.5, TensorProto.FLOAT, []),
        "value_floats": ([1.0, 2.0], TensorProto.FLOAT, [2]),
        "value_int": (7, TensorProto.INT64, []),
        "value_ints": ([1, 2, 3], TensorProto.INT64, [3]),
    }
    nodes = [helper.make_node("Constant", [], [f"c_{k}"], **{k: v[0]})
             for k, v in values.items()]
    nodes += [helper.make_node("Identity", [f"c_{k}"], [f"y_{k}"]) for k in values]
    outputs = [tensor(f"y_{k}", shape, kind) for k, (_, kind, shape) in values.items()]
    graph = from_onnx(make_model(nodes, [], outputs))
    constants = {n.inputs[0].name: n.inputs[0] for n in graph.nodes}
    assert all(c.is_constant and c.producer is None for c in constants.values())
    assert constants["c_value"].dtype == dtypes.int32
    assert constants["c_value"].data.tolist() == [[0, 1, 2], [3, 4, 5]]
    assert constants["c_value_float"].dtype == dtypes.float32
    assert constants["c_value_float"].shape == ()
    assert constants["c_value_floats"].data.tolist() == [1.0, 2.0]
    assert constants["c_value_int"].dtype == dtypes.int64
    assert constants["c_value_ints"].data.tolist() == [1, 2, 3]


def test_empty_optional_inputs_become_none():
    nodes = [helper.make_node("Clip", ["x", "", "high"], ["y"], name="clip")]
    model = make_model(nodes, [tensor("x", [4, 6])], [tensor("y", [4, 6])],
                       {"high": np.float32(0.5)})
    graph = from_onnx(model)
    assert graph.nodes[0].inputs[1] is None
    x = random_array((4, 6), seed=4)
    assert_close(treadle.compile(model)(x)[0], run_onnxruntime(model, {"x": x})[0])


def test_bfloat16_initializers_keep_their_bits():
    values = np.array([1.0, -2.5, 3.140625], np.float32)
    init = helper.make_tensor("w", TensorProto.BFLOAT16, [3], values.tolist())
    nodes = [helper.make_node("Identity", ["w"], ["y"], name="same")]
    graph = helper.make_graph(nodes, "bf16", [], [tensor("y", [3], TensorProto.BFLOAT16)],
                              [init])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              ir_version=9)
    weight = from_onnx(model).nodes[0].inputs[0]
    assert weight.dtype == dtypes.bfloat16
    expected_bits = (values.view(np.uint32) >> 16).astype(np.uint16)
    assert weight.data.tolist() == expected_bits.tolist()


@pytest.mark.parametrize("op", ["MatMul", "Conv"])
def test_bfloat16_constant_weights_are_laid_out_as_values(op):
    """A constant bfloat16 weight, laid out at compile time for the GEMM template (its bits
    once read as integers: results around 6e5 for 5), against float32 arithmetic on the
    same bfloat16 values, the inputs' 13 and 27 odd sizes included."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(3)
    shapes = {"MatMul": ([13, 27], [27, 9]), "Conv": ([1, 3, 13, 11], [9, 3, 3, 3])}[op]
    x = (rng.standard_normal(shapes[0]) * 0.5).astype(ml_dtypes.bfloat16)
    w = (rng.standard_normal(shapes[1]) * 0.5).astype(ml_dtypes.bfloat16)
    node = helper.make_node(op, ["x", "w"], ["y"])
    model = make_model([node], [tensor("x", shapes[0], TensorProto.BFLOAT16)],
                       [tensor("y", None, TensorProto.BFLOAT16)],
                       initializers={"w": w})
    (y,) = treadle.compile(model)(x.view(np.uint16))
    xs, ws = (a.astype(np.float32) for a in (x, w))
    if op == "MatMul":
        expected = xs @ ws
    else:
        import torch
        expected = torch.nn.functional.conv2d(torch.from_numpy(xs), torch.from_numpy(ws)).numpy()
    actual = np.asarray(y, np.uint16).view(ml_dtypes.bfloat16).astype(np.float32)
    np.testing.assert_allclose(actual, expected, rtol=2 ** -7, atol=2 ** -7 * 4)


def test_model_names_that_are_not_identifiers_still_compile():
    odd = 'a b;system("x")'
    nodes = [helper.make_node("Neg", [odd], ["out/1"], name="node:0 */")]
    model = make_model(nodes, [tensor(odd, ["n*2", 3])], [tensor("out/1", ["n*2", 3])])
    compiled = treadle.compile(model)
    assert compiled.input_names == [odd] and compiled.output_names == ["out/1"]
    x = random_array((4, 3), seed=5)
    assert_close(compiled(**{odd: x})[0], -x)


@pytest.mark.parametrize("name", ["i0", "i2", "i3", "t0", "x0", "y0", "b0", "b1"])
def test_dimension_names_never_collide_with_generated_names(name):
    # Relu -> Pad -> Softmax: loop variables, the padded border's loops and the fused
    # store's temporaries all take generated names.
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Pad", ["r", "p"], ["z"]),
             helper.make_node("Softmax", ["z"], ["y"])]
    model = make_model(nodes, [tensor("x", [name, "i1", 5])], [tensor("y", [name, "i1", 7])],
                       {"p": np.array([0, 0, 1, 0, 0, 1], np.int64)})
    x = random_array((3, 2, 5), seed=1)
    assert_close(treadle.compile(model)(x=x)[0], run_onnxruntime(model, {"x": x})[0])


def test_a_reshape_target_mixing_a_float_computed_constant_and_a_symbolic_size():
    """Dinov2's TorchScript export: the patch grid's side, int(49 ** 0.5) computed in
    float from constants, concatenated with a size read from the input's shape. Each part
    is known at compile time, the one by folding, the other symbolically."""
    nodes = [helper.make_node("Pow", ["positions", "half"], ["side_f"]),
             helper.make_node("Cast", ["side_f"], ["side"], to=TensorProto.INT64),
             helper.make_node("Unsqueeze", ["side", "zero"], ["side1"]),
             helper.make_node("Shape", ["x"], ["dims"]),
             helper.make_node("Gather", ["dims", "zero"], ["batch"]),
             helper.make_node("Concat", ["batch", "side1", "side1"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["y"])]
    model = make_model(nodes, [tensor("x", ["n", 49])], [tensor("y", ["n", 7, 7])],
                       {"positions": np.float32(49), "half": np.float32(0.5),
                        "zero": np.array([0], np.int64)})
    x = random_array((3, 49))
    assert_close(treadle.compile(model)(x)[0], run_onnxruntime(model, {"x": x})[0])


def test_a_reshape_target_computed_in_float_from_a_static_size():
    """MobileViT's TorchScript export: ceil(h / 2) in float, h a static size read through
    Shape of an input whose batch is symbolic; folded from h's known value."""
    nodes = [helper.make_node("Shape", ["x"], ["dims"]),
             helper.make_node("Gather", ["dims", "two"], ["h"]),
             helper.make_node("Cast", ["h"], ["h_f"], to=TensorProto.FLOAT),
             helper.make_node("Div", ["h_f", "f2"], ["half"]),
             helper.make_node("Ceil", ["half"], ["up"]),
             helper.make_node("Cast", ["up"], ["patches"], to=TensorProto.INT64),
             helper.make_node("Concat", ["minus1", "patches"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["y"])]
    model = make_model(nodes, [tensor("x", ["n", 3, 7, 8])], [tensor("y", None)],
                       {"two": np.array([2], np.int64), "f2": np.float32(2),
                        "minus1": np.array([-1], np.int64)})
    compiled = treadle.compile(model)
    for n in (1, 3):
        x = random_array((n, 3, 7, 8), seed=n)
        assert_close(compiled(x)[0], run_onnxruntime(model, {"x": x})[0])


def test_a_bicubic_resize_to_the_same_size_copies_its_input():
    """Dinov2 resizes its position embeddings bicubically to the grid they were trained
    at, which copies them; to another grid, they are interpolated."""
    def resize(out: int) -> onnx.ModelProto:
        node = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], name="grid",
                                mode="cubic")
        return make_model([node], [tensor("x", [1, 4, 7, 7])], [tensor("y", [1, 4, out, out])],
                          {"sizes": np.array([1, 4, out, out], np.int64)})
    x = random_array((1, 4, 7, 7))
    model = resize(7)
    assert_close(treadle.compile(model)(x)[0], run_onnxruntime(model, {"x": x})[0])
    np.testing.assert_array_equal(treadle.compile(model)(x)[0], x)
    model = resize(9)
    assert_close(treadle.compile(model)(x)[0], run_onnxruntime(model, {"x": x})[0])
