"""ConvTranspose: its definition (a gather over the taps) and the rewrite into a Conv of
the stride phases and a pixel shuffle (``passes.conv_transpose``), against PyTorch over
strides, kernels smaller and larger than the stride, pads, output padding, dilation and
groups in 1-D, 2-D and 3-D with odd and prime sizes and a symbolic batch; ONNX's
output_shape, auto_pad and uneven pads against ONNX Runtime (onnx's reference evaluator
drops the pads an output_shape implies)."""
from __future__ import annotations

import numpy as np
import pytest

from tests.harness import assert_close, random_array, run_onnxruntime
from treadle.compiler import compile_graph
from treadle.errors import ShapeError
from treadle.graph.graph import Graph
from treadle.graph.operator import apply
from treadle.graph.passes.canonicalize import canonicalize
from treadle.graph.tensor import Tensor, constant

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import helper  # noqa: E402

CASES = [  # in channels, out channels per group, sizes, kernel, stride, pad, output pad,
    #         dilation, group
    (16, 3, (7, 9), (4, 4), 2, 1, 0, 1, 1),
    (6, 2, (5, 11), (3, 3), 2, 1, 1, 1, 2),
    (5, 7, (13, 2), (3, 1), (3, 1), 0, 0, 1, 1),
    (4, 1, (6, 6), (2, 2), 2, 0, 0, 1, 4),
    (3, 2, (7, 5), (3, 3), 2, 2, 1, 2, 1),
    (8, 8, (1, 1), (5, 5), 3, 0, 2, 1, 1),
    (3, 5, (4, 3), (1, 1), 2, 0, 1, 1, 1),
    (32, 1, (17, 13), (3, 3), 1, 1, 0, 1, 1),
    (7, 5, (61,), (5,), 3, 2, 0, 1, 1),
    (4, 3, (3, 5, 4), (3, 3, 2), (2, 1, 2), 1, 0, 1, 1),
    (6, 9, (7, 13), (3, 3), 2, 1, 1, 1, 1),  # phases of their own taps, channels last
]


def _torch(xs, w, b, stride, pad, out_pad, dilation, group):
    conv = {3: torch.nn.functional.conv_transpose1d, 4: torch.nn.functional.conv_transpose2d,
            5: torch.nn.functional.conv_transpose3d}[xs.ndim]
    return conv(torch.from_numpy(xs), torch.from_numpy(w),
                None if b is None else torch.from_numpy(b), stride=stride, padding=pad,
                output_padding=out_pad, groups=group, dilation=dilation).numpy()


def _attrs(rank, stride, pad, out_pad, dilation, group):
    def each(v):
        return list(v) if isinstance(v, tuple) else [v] * rank
    return {"strides": each(stride), "pads": each(pad) * 2, "output_padding": each(out_pad),
            "dilations": each(dilation), "group": group}


@pytest.mark.parametrize("cin, per_group, size, kernel, stride, pad, out_pad, dilation, group",
                         CASES)
@pytest.mark.parametrize("weights", ["constant", "input"])
def test_conv_transpose_matches_torch(cin, per_group, size, kernel, stride, pad, out_pad,
                                      dilation, group, weights):
    """Constant weights take the rewrite (no ConvTranspose left), weights given at run
    time the definition; both match torch for batches of 0, 1 and 2."""
    w = random_array((cin, per_group, *kernel), seed=1)
    b = random_array((per_group * group,), seed=2)
    x = Tensor("x", "float32", ["n", cin, *size])
    attrs = _attrs(len(size), stride, pad, out_pad, dilation, group)
    if weights == "constant":
        inputs, args = [x, constant(w), constant(b)], []
    else:
        inputs = [x, Tensor("w", "float32", w.shape), Tensor("b", "float32", b.shape)]
        args = [w, b]
    graph = Graph.from_outputs([t for t in inputs if not t.is_constant],
                               [apply("ConvTranspose", inputs, attrs, "up")[0]])
    kept = [op.op_type for op in canonicalize(graph).nodes].count("ConvTranspose")
    assert kept == (weights == "input")
    program = compile_graph(graph)
    for batch in (0, 1, 2):
        xs = random_array((batch, cin, *size), seed=batch)
        expected = _torch(xs, w, b, stride, pad, out_pad, dilation, group)
        assert_close(program(xs, *args)[0], expected, reduction=cin * np.prod(kernel))


def _onnxruntime(xs, w, b, attrs):
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], **attrs)
    feeds = {"x": xs, "w": w, "b": b}
    values = [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, a.shape)
              for n, a in feeds.items()]
    graph = helper.make_graph([node], "g", values,
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return run_onnxruntime(model, feeds)[0]


@pytest.mark.parametrize("attrs", [
    {"strides": [2, 3], "pads": [1, 0, 2, 1]},
    {"strides": [2, 2], "output_shape": [16, 13]},  # one more row than the pads give
    {"strides": [3, 2], "output_shape": [10, 8]},
    {"strides": [2, 2], "auto_pad": "SAME_UPPER"},
    {"strides": [3, 3], "auto_pad": "SAME_LOWER"},
    {"strides": [2, 1], "auto_pad": "VALID", "dilations": [1, 2]},
])
def test_onnx_padding_attributes_match_onnxruntime(attrs):
    xs, w = random_array((1, 3, 7, 5), seed=3), random_array((3, 2, 3, 4), seed=4)
    b = random_array((2,), seed=5)
    expected = _onnxruntime(xs, w, b, attrs)
    x = Tensor("x", "float32", xs.shape)
    for weights in (constant(w), Tensor("w", "float32", w.shape)):
        inputs = [x, weights, constant(b)]
        graph = Graph.from_outputs([t for t in inputs if not t.is_constant],
                                   [apply("ConvTranspose", inputs, attrs)[0]])
        args = [] if weights.is_constant else [w]
        assert_close(compile_graph(graph)(xs, *args)[0], expected, reduction=36)


@pytest.mark.parametrize("attrs, message", [
    ({"strides": [2, 2], "output_padding": [2, 0]}, "output_padding"),
    ({"group": 2}, "group 2"),
    ({"pads": [4, 4, 4, 4]}, "leave no output"),
])
def test_bad_attributes_name_the_node(attrs, message):
    x = Tensor("x", "float32", [1, 3, 2, 2])
    with pytest.raises(ShapeError, match=f"(?s)bad_up.*{message}"):
        apply("ConvTranspose", [x, constant(random_array((3, 2, 3, 3)))], attrs, "bad_up")


@pytest.mark.parametrize("kernel, stride, group, shapes", [
    (4, 2, 1, [(2, 2)]),                                  # the stride divides the kernel
    (3, 2, 1, [(2, 2), (2, 1), (1, 2), (1, 1)]),          # one Conv per phase, its own taps
    (3, 2, 2, [(2, 2)]),                                  # grouped: one Conv, zero taps
])
def test_phases_share_one_conv_unless_that_pads_many_taps(kernel, stride, group, shapes):
    x = Tensor("x", "float32", ["n", 4, 5, 6])
    w = constant(random_array((4, 3, kernel, kernel), seed=8))
    y = apply("ConvTranspose", [x, w], {"strides": [stride] * 2, "group": group})[0]
    convs = [op for op in canonicalize(Graph.from_outputs([x], [y])).nodes
             if op.op_type == "Conv"]
    assert [tuple(c.inputs[1].shape[2:]) for c in convs] == shapes


@pytest.mark.parametrize("case", [0, 1, 4, 5, 8, 9, 10])
def test_symbolic_spatial_sizes_take_the_rewrite(case):
    """With symbolic spatial sizes the rewrite's pads and crops are still constants (an
    output size is the stride times the input's plus a constant): one compile, no
    ConvTranspose left, and every size (2, odd, prime) matches torch."""
    cin, per_group, size, kernel, stride, pad, out_pad, dilation, group = CASES[case]
    w = random_array((cin, per_group, *kernel), seed=1)
    b = random_array((per_group * group,), seed=2)
    x = Tensor("x", "float32", [1, cin, *(f"s{a}" for a in range(len(size)))])
    attrs = _attrs(len(size), stride, pad, out_pad, dilation, group)
    y = apply("ConvTranspose", [x, constant(w), constant(b)], attrs, "up")[0]
    graph = Graph.from_outputs([x], [y])
    assert "ConvTranspose" not in [op.op_type for op in canonicalize(graph).nodes]
    program = compile_graph(graph)
    for sizes in (size, tuple(s + 6 for s in size), (2,) * len(size)):
        xs = random_array((1, cin, *sizes), seed=sum(sizes))
        expected = _torch(xs, w, b, stride, pad, out_pad, dilation, group)
        assert_close(program(xs)[0], expected, reduction=cin * np.prod(kernel))


@pytest.mark.parametrize("channels, layout", [(9, "channels last"), (5, "channels first")])
def test_phases_read_windows_of_one_padded_copy(channels, layout):
    """A 3 x 3 stride-2 ConvTranspose's four phases read their windows of one padded copy
    of the input, channels last where their convolutions are (each phase checking bounds
    at every read of its own padding ran 2.3x slower); behind a convolution and a ReLU
    (the copy then pads a channels-last tensor) the result matches torch."""
    x = Tensor("x", "float32", [1, 4, "h", 11])
    w0, b0 = random_array((16, 4, 3, 3), seed=11), random_array((16,), seed=12)
    w, b = random_array((16, channels, 3, 3), seed=13), random_array((channels,), seed=14)
    hidden = apply("Conv", [x, constant(w0), constant(b0)], {"pads": [1] * 4})[0]
    hidden = apply("Relu", [hidden])[0]
    y = apply("ConvTranspose", [hidden, constant(w), constant(b)],
              _attrs(2, 2, 1, 1, 1, 1), "up")[0]
    graph = Graph.from_outputs([x], [y])
    ops = [op for op in canonicalize(graph).nodes if op.name.startswith("up/")]
    assert [op.op_type for op in ops].count("Pad") == 1
    phases = [op for op in ops if op.op_type == "Conv"]
    assert len(phases) == 4 and not any(any(op.attrs.get("pads", [0])) for op in phases)
    program = compile_graph(graph)
    for h in (1, 6, 13):
        xs = random_array((1, 4, h, 11), seed=h)
        hs = torch.relu(torch.nn.functional.conv2d(
            torch.from_numpy(xs), torch.from_numpy(w0), torch.from_numpy(b0), padding=1))
        expected = _torch(hs.numpy(), w, b, 2, 1, 1, 1, 1)
        assert_close(program(xs)[0], expected, reduction=16 * 9 * 4, context=layout)
