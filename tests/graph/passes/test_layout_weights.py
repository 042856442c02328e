"""Constant convolution weights are stored channels-last and read back through a
Transpose that fuses into the convolution."""
import pytest

from tests.harness import assert_close, random_array
from treadle.compiler import compile_graph
from treadle.graph.graph import Graph
from treadle.graph.operator import apply
from treadle.graph.passes.layout_weights import layout_weights
from treadle.graph.tensor import Tensor, constant

torch = pytest.importorskip("torch")


def conv_graph(group: int, constant_weight: bool = True):
    x = Tensor("x", "float32", ["n", 6, 9, 11])
    w = (constant(random_array((4 * group, 6 // group, 3, 2), seed=1), "w") if constant_weight
         else Tensor("w", "float32", [4 * group, 6 // group, 3, 2]))
    y = apply("Conv", [x, w], {"group": group, "strides": [2, 1]}, "conv")[0]
    return Graph.from_outputs([x] + ([] if constant_weight else [w]), [y]), w


def test_dense_convolution_weight_is_stored_channels_last():
    graph, w = conv_graph(group=1)
    out = layout_weights(graph)
    transpose = out.nodes[0]
    assert [op.op_type for op in out.nodes] == ["Transpose", "Conv"]
    assert transpose.inputs[0].shape == (6, 3, 2, 4)
    exe = compile_graph(out, optimize_graph=False)
    assert sum(s.kernel is not None for s in exe.steps) == 1  # the transpose is inlined
    for n in (1, 3):
        x = random_array((n, 6, 9, 11), seed=n)
        expected = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w.data),
                                              stride=(2, 1)).numpy()
        assert_close(exe(x)[0], expected, reduction=36, context=f"n={n}")


@pytest.mark.parametrize("group,constant_weight", [(2, True), (1, False)])
def test_grouped_or_computed_weights_keep_their_layout(group, constant_weight):
    graph, _ = conv_graph(group, constant_weight)
    assert [op.op_type for op in layout_weights(graph).nodes] == ["Conv"]
