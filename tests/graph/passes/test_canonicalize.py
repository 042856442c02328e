"""canonicalize: identities vanish, Gemm splits, BatchNorm folds into convolution."""
import numpy as np
import pytest

from tests.harness import assert_close, random_array
from treadle.compiler import compile_graph
from treadle.graph.graph import Graph
from treadle.graph.operator import apply
from treadle.graph.passes.canonicalize import canonicalize
from treadle.graph.tensor import Tensor, constant


def op_types(graph):
    return [n.op_type for n in graph.nodes]


def same_outputs(before: Graph, after: Graph, *inputs):
    expected = compile_graph(before, optimize_graph=False)(*inputs)
    actual = compile_graph(after, optimize_graph=False)(*inputs)
    for e, a in zip(expected, actual):
        assert_close(a, e, reduction=64)


def test_identities_are_dropped_and_output_names_kept():
    x = Tensor("x", "float32", [2, 3])
    y = apply("Identity", [x])[0]
    z = apply("Relu", [y])[0]
    w = apply("Reshape", [z, constant(np.array([2, 3]))], output_names=["result"])[0]
    v = apply("Cast", [w], {"to": 1})[0]
    graph = Graph.from_outputs([x], [v])
    out = canonicalize(graph)
    assert op_types(out) == ["Relu"]
    assert out.outputs[0].name == v.name
    same_outputs(graph, out, random_array((2, 3)))


def test_output_that_becomes_an_input_is_copied_not_renamed():
    x = Tensor("x", "float32", [4])
    y = apply("Identity", [x], output_names=["y"])[0]
    out = canonicalize(Graph.from_outputs([x], [y]))
    assert out.inputs[0].name == "x" and out.outputs[0].name == "y"


def test_gemm_becomes_matmul_and_element_wise_ops():
    a = Tensor("a", "float32", [5, 7])
    b = constant(random_array((3, 7), seed=1), "b")
    c = constant(random_array((3,), seed=2), "c")
    y = apply("Gemm", [a, b, c], {"transB": 1, "alpha": 0.5, "beta": 2.0}, "dense")[0]
    graph = Graph.from_outputs([a], [y])
    out = canonicalize(graph)
    assert "Gemm" not in op_types(out) and "MatMul" in op_types(out)
    same_outputs(graph, out, random_array((5, 7), seed=3))


def conv_bn(shared: bool):
    x = Tensor("x", "float32", [1, 3, 9, 9])
    w = constant(random_array((4, 3, 3, 3), seed=4), "w")
    conv = apply("Conv", [x, w], {"pads": [1, 1, 1, 1]}, "conv")[0]
    stats = [constant(random_array((4,), seed=s, low=0.5, high=1.5)) for s in range(5, 9)]
    bn = apply("BatchNormalization", [conv, *stats], {"epsilon": 1e-3}, "bn")[0]
    outputs = [apply("Relu", [bn])[0]] + ([conv] if shared else [])
    return Graph.from_outputs([x], outputs)


def test_batch_norm_folds_into_convolution():
    graph = conv_bn(shared=False)
    out = canonicalize(graph)
    assert op_types(out) == ["Pad", "Conv", "Relu"]
    same_outputs(graph, out, random_array((1, 3, 9, 9), seed=9))


def test_batch_norm_does_not_fold_into_a_shared_convolution():
    graph = conv_bn(shared=True)
    out = canonicalize(graph)
    assert op_types(out) == ["Pad", "Conv", "Mul", "Add", "Relu"]
    same_outputs(graph, out, random_array((1, 3, 9, 9), seed=9))


@pytest.mark.parametrize("pads,group,split", [([1, 2, 0, 1], 1, True), ([0, 0, 0, 0], 1, False),
                                              ([1, 1, 1, 1], 3, False)])
def test_padded_convolution_reads_a_padded_copy(pads, group, split):
    x = Tensor("x", "float32", [1, 3, 8, 11])
    w = constant(random_array((6, 3 // group, 3, 3), seed=4), "w")
    y = apply("Conv", [x, w], {"pads": pads, "group": group, "strides": [2, 1]}, "conv")[0]
    graph = Graph.from_outputs([x], [y])
    out = canonicalize(graph)
    assert op_types(out) == (["Pad", "Conv"] if split else ["Conv"])
    same_outputs(graph, out, random_array((1, 3, 8, 11), seed=9))


@pytest.mark.parametrize("tanh_first", [False, True])
def test_softplus_tanh_product_becomes_mish(tanh_first):
    x = Tensor("x", "float32", (3, 257))
    t = apply("Tanh", [apply("Softplus", [x])[0]])[0]
    y = apply("Mul", [t, x] if tanh_first else [x, t])[0]
    graph = Graph.from_outputs([x], [y])
    after = canonicalize(graph)
    assert op_types(after) == ["Mish"]
    # Against the float64 definition over the range where each branch matters.
    data = np.linspace(-40, 40, 3 * 257, dtype=np.float32).reshape(3, 257)
    (got,) = compile_graph(after)(data)
    wide = data.astype(np.float64)
    expected = wide * np.tanh(np.log1p(np.exp(wide)))
    np.testing.assert_allclose(got, expected, rtol=4e-7, atol=1e-30)


def test_softplus_tanh_of_another_tensor_stays():
    x, z = Tensor("x", "float32", (4,)), Tensor("z", "float32", (4,))
    t = apply("Tanh", [apply("Softplus", [z])[0]])[0]
    graph = Graph.from_outputs([x, z], [apply("Mul", [x, t])[0]])
    assert "Mish" not in op_types(canonicalize(graph))


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_a_resize_to_the_same_size_is_dropped_unless_its_scales_move_positions(mode):
    """Sizes equal to the input's, or scales of 1, map each position to itself; scales of
    1.2 on a side of 2 round back to 2 and blend its pixels (checked by numbers)."""
    x = Tensor("x", "float32", [1, 3, 2, 5])
    empty = constant(np.zeros(0, np.float32), "empty")
    by_sizes = apply("Resize", [x, None, empty, constant(np.array([1, 3, 2, 5]))],
                     {"mode": mode})[0]
    by_ones = apply("Resize", [x, None, constant(np.ones(4, np.float32))], {"mode": mode})[0]
    moving = apply("Resize", [x, None, constant(np.array([1, 1, 1.2, 1], np.float32))],
                   {"mode": mode})[0]
    assert moving.shape == x.shape
    before = Graph.from_outputs([x], [apply("Add", [by_sizes, by_ones])[0], moving])
    after = canonicalize(before)
    assert op_types(after) == ["Add", "Resize"]
    same_outputs(before, after, random_array((1, 3, 2, 5), seed=1))


def test_a_crop_to_the_same_size_is_kept():
    """A crop moves positions, and may read outside the input."""
    x = Tensor("x", "float32", [1, 3, 7, 5])
    sizes = constant(np.array([1, 3, 7, 5]))
    roi = constant(np.array([0, 0, -0.2, 0.1, 1, 1, 0.9, 1.3], np.float32))
    crop = apply("Resize", [x, roi, None, sizes],
                 {"mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize"})[0]
    before = Graph.from_outputs([x], [crop])
    after = canonicalize(before)
    assert op_types(after) == ["Resize"]
    same_outputs(before, after, random_array((1, 3, 7, 5), seed=1))


@pytest.mark.parametrize("shape, checked", [([4, 5], []), ([4, "n"], ["CheckIndices"])])
def test_known_indices_are_checked_at_run_time_only_against_a_symbolic_size(shape, checked):
    """Against a known size a known index is checked here; against a symbol, only the
    run-time check can decide."""
    x = Tensor("x", "float32", shape)
    y = apply("Gather", [x, constant(np.array([3, -1]))], {"axis": 1})[0]
    assert op_types(canonicalize(Graph.from_outputs([x], [y]))) == [*checked, "Gather"]
