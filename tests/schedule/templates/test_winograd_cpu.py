"""Winograd F(2x2, 3x3) and F(4x4, 3x3): the transforms, the pass that chooses them, and
the template's kernels against ONNX Runtime and a float64 numpy convolution, over odd, even
and prime sizes (sizes that are not a multiple of the tile leave partial tiles), static
and symbolic."""
import numpy as np
import pytest
from onnx import helper

from tests.frontend.onnx_models import make_model, tensor
from tests.harness import assert_close, random_array, run_onnxruntime
from treadle.compiler import compile_graph
from treadle.frontend.onnx import from_onnx
from treadle.graph.graph import Graph
from treadle.graph.operator import apply
from treadle.graph.ops.winograd import TRANSFORMS, transform_weights
from treadle.graph.optimize import optimize
from treadle.graph.tensor import Tensor, constant


def conv_nhwc(x, w):
    """Float64 reference: x [N, H, W, C], w [3, 3, C, K], no padding."""
    n, h, width, _ = x.shape
    out = np.zeros((n, h - 2, width - 2, w.shape[3]))
    for i in range(3):
        for j in range(3):
            out += np.einsum("nhwc,ck->nhwk", x[:, i:i + h - 2, j:j + width - 2].astype(np.float64),
                             w[i, j].astype(np.float64))
    return out


@pytest.mark.parametrize("tile", sorted(TRANSFORMS))
def test_transform_tables_compute_a_correlation(tile):
    f = TRANSFORMS[tile]
    d = random_array((f.window, f.window), seed=1).astype(np.float64)
    g = random_array((3, 3), seed=2).astype(np.float64)
    y = f.at @ ((f.g @ g @ f.g.T) * (f.bt @ d @ f.bt.T)) @ f.at.T
    expected = [[(d[a:a + 3, b:b + 3] * g).sum() for b in range(tile)] for a in range(tile)]
    np.testing.assert_allclose(y, expected, rtol=1e-12, atol=1e-12)


def test_transform_rejects_filters_it_cannot_hold():
    with pytest.raises(ValueError, match="multiple of 16"):
        transform_weights(np.zeros((3, 3, 4, 24), np.float32), 2)


@pytest.mark.parametrize("tile", sorted(TRANSFORMS))
@pytest.mark.parametrize("batch,height,width,channels,filters", [
    (1, 10, 10, 16, 16),     # whole tiles of 2
    (1, 13, 11, 7, 32),      # odd output sizes: partial tiles in both directions
    (2, 9, 16, 5, 16),       # a batch, odd channel count
    (1, 19, 19, 40, 48),     # prime-sized output, more tiles than one block
    (1, 18, 14, 64, 16),     # whole tiles of 4
])
def test_kernel_matches_direct_convolution(tile, batch, height, width, channels, filters):
    x = Tensor("x", "float32", (batch, height, width, channels))
    w = random_array((3, 3, channels, filters), seed=channels)
    bias = random_array((filters,), seed=3)
    u = constant(transform_weights(w, tile), "u")
    y = apply("WinogradConv", [x, u, constant(bias, "bias")], {"tile": tile}, "wino")[0]
    y = apply("Relu", [y], {}, "relu")[0]
    xs = random_array(x.shape, seed=height)
    actual = compile_graph(Graph.from_outputs([x], [y]), optimize_graph=False)(xs)[0]
    expected = np.maximum(conv_nhwc(xs, w) + bias, 0).astype(np.float32)
    # F(4x4, 3x3) rounds more: its transforms scale values by up to 8 and back.
    assert_close(actual, expected, reduction=9 * channels * (1 if tile == 2 else 16))


def conv_model(side, channels, filters, stride=1, batch="n"):
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1],
                              strides=[stride, stride]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Add", ["r", "x"] if stride == 1 and channels == filters
                              else ["r", "r"], ["y"], name="residual")]
    out = -(-side // stride)
    return make_model(nodes, [tensor("x", [batch, channels, side, side])],
                      [tensor("y", [batch, filters, out, out])],
                      {"w": random_array((filters, channels, 3, 3), seed=side),
                       "b": random_array((filters,), seed=1)})


@pytest.mark.parametrize("batch,side,channels,filters,tile", [
    (1, 16, 16, 16, 2), (2, 11, 24, 32, 2), (1, 17, 32, 32, 2), (1, 28, 64, 64, 4),
    (1, 29, 64, 64, 2)])  # 29 = 7 tiles of 4 and a partial one: 2x2 tiles instead
def test_model_convolution_runs_winograd_and_matches_onnxruntime(batch, side, channels,
                                                                 filters, tile):
    model = conv_model(side, channels, filters, batch=batch)
    graph = optimize(from_onnx(model))
    chosen = [n.attrs["tile"] for n in graph.nodes if n.op_type == "WinogradConv"]
    assert chosen == [tile]
    x = random_array((batch, channels, side, side), seed=batch)
    assert_close(compile_graph(from_onnx(model))(x)[0], run_onnxruntime(model, {"x": x})[0],
                 reduction=9 * channels * tile * tile)


@pytest.mark.parametrize("side,channels,filters,stride,batch", [
    (32, 16, 24, 1, 1),    # output channels not a multiple of 16
    (32, 16, 16, 2, 1),    # strided
    (6, 16, 16, 1, 1),     # too few tiles to pay off
    (6, 16, 16, 1, "n"),   # nor with a symbolic batch, which counts as 1
])
def test_other_convolutions_stay_direct(side, channels, filters, stride, batch):
    graph = optimize(from_onnx(conv_model(side, channels, filters, stride, batch)))
    types = [n.op_type for n in graph.nodes]
    assert "WinogradConv" not in types and "ChannelsLastConv" in types


@pytest.mark.parametrize("tile", sorted(TRANSFORMS))
def test_kernel_of_symbolic_sizes_matches_direct_convolution(tile):
    """One kernel for every batch and image size: tiles on an edge, which a symbolic size
    may leave anywhere, read zeros past it and store only inside."""
    x = Tensor("x", "float32", ("n", "h", "w", 24))
    w = random_array((3, 3, 24, 32), seed=4)
    u = constant(transform_weights(w, tile), "u")
    y = apply("WinogradConv", [x, u], {"tile": tile}, "wino")[0]
    program = compile_graph(Graph.from_outputs([x], [y]), optimize_graph=False)
    for shape in [(1, 10, 10), (2, 13, 11), (1, 3, 3), (1, 61, 5), (3, 7, 19), (0, 9, 9)]:
        xs = random_array((*shape, 24), seed=sum(shape))
        assert_close(program(xs)[0], conv_nhwc(xs, w).astype(np.float32),
                     reduction=9 * 24 * (1 if tile == 2 else 16))


@pytest.mark.parametrize("batch,side,channels,tile", [
    ("n", 28, 64, 4), ("n", "s", 64, 4), ("n", "s", 32, 2), ("n", "s", 144, 2)])
def test_symbolic_model_runs_winograd_at_every_size(batch, side, channels, tile):
    """A symbolic batch chooses the tile a batch of 1 would; a symbolic image side takes
    4x4 tiles from 64 to 128 input channels, 2x2 ones otherwise. Each compiles once and
    matches ONNX Runtime at odd, prime and even sizes."""
    model = conv_model(28, channels, channels, batch=batch)
    if side == "s":
        for value in (*model.graph.input, *model.graph.output):
            for d in value.type.tensor_type.shape.dim[2:]:
                d.dim_param = "s"
    graph = optimize(from_onnx(model))
    assert [n.attrs["tile"] for n in graph.nodes if n.op_type == "WinogradConv"] == [tile]
    program = compile_graph(from_onnx(model))
    for n, size in [(1, 28), (3, 28)] + ([(1, 17), (2, 31), (1, 3)] if side == "s" else []):
        x = random_array((n, channels, size, size), seed=n + size)
        assert_close(program(x)[0], run_onnxruntime(model, {"x": x})[0],
                     reduction=9 * channels * tile * tile)
