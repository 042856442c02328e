"""The sliding-window template: which computes it takes, the structure of its kernels,
and depthwise convolution and pooling against PyTorch over a sweep of odd and prime
sizes, strides and paddings, with a symbolic batch."""
from __future__ import annotations

import numpy as np
import pytest

from tests.harness import assert_close, random_array
from treadle.compiler import compile_graph
from treadle.graph.graph import Graph
from treadle.graph.operator import apply
from treadle.graph.tensor import Tensor, constant
from treadle.ir.expr import Load, Select
from treadle.ir.functor import walk
from treadle.ir.stmt import For, If, Store
from treadle.ir.verify import verify
from treadle.schedule.select import schedule_operator, select_template
from treadle.schedule.templates.gemm import GEMM
from treadle.schedule.templates.window_cpu import MAX_UNROLLED, match_window
from treadle.target.cpu import host

torch = pytest.importorskip("torch")


def _conv_op(channels, size, kernel=(3, 3), stride=1, pad=1, bias=True, batch="n"):
    x = Tensor("x", "float32", [batch, channels, *size])
    w = constant(random_array((channels, 1, *kernel), seed=1))
    inputs = [x, w] + ([constant(random_array((channels,), seed=2))] if bias else [])
    attrs = {"group": channels, "strides": [stride] * 2, "pads": [pad] * 4}
    y = apply("Conv", inputs, attrs)[0]
    return x, inputs, attrs, y


def _operator(graph: Graph):
    (op,) = graph.nodes
    return op


def test_depthwise_conv_kernel_vectorises_rows_with_scalar_input_and_output_access():
    x, _, _, y = _conv_op(8, (13, 11), stride=2)
    op = _operator(Graph.from_outputs([x], [y]))
    assert match_window(op.definition[0]) is not None
    func = schedule_operator(op, "dw", host()).function
    verify(func)
    loops = [n for n in walk(func.body) if isinstance(n, For)]
    assert [n.kind for n in loops].count("parallel") == 1
    assert any(n.kind == "vectorize" for n in loops)
    output = func.buffers[-1]
    stores = [n for n in walk(func.body) if isinstance(n, Store)]
    assert all(s.lanes == 1 for s in stores)
    assert sum(s.buffer == output for s in stores) == 1
    assert not any(isinstance(n, Load) and (n.lanes > 1 or n.buffer == output)
                   for n in walk(func.body))


def test_large_reductions_are_not_windows():
    x = Tensor("x", "float32", [2, 5, 100])
    y = apply("ReduceSum", [x, constant(np.array([2], np.int64))], {"keepdims": 0})[0]
    assert match_window(_operator(Graph.from_outputs([x], [y])).definition[0]) is None


CONVS = [  # channels, (height, width), kernel, stride, padding
    (1, (1, 1), (3, 3), 1, 1),
    (3, (7, 7), (3, 3), 1, 1),
    (7, (13, 17), (3, 3), 2, 1),
    (13, (8, 31), (3, 3), 2, 0),
    (5, (17, 5), (5, 5), 1, 2),
    (2, (11, 23), (3, 1), 2, 1),
    (4, (61, 9), (3, 3), 1, 0),
]


@pytest.mark.parametrize("channels, size, kernel, stride, pad", CONVS)
@pytest.mark.parametrize("bias", [True, False])
def test_depthwise_conv_matches_torch(channels, size, kernel, stride, pad, bias):
    x, inputs, attrs, y = _conv_op(channels, size, kernel, stride, pad, bias)
    program = compile_graph(Graph.from_outputs([x], [y]))
    for batch in (1, 2):
        xs = random_array((batch, channels, *size), seed=batch)
        expected = torch.nn.functional.conv2d(
            torch.from_numpy(xs), torch.from_numpy(inputs[1].data),
            torch.from_numpy(inputs[2].data) if bias else None, stride=stride, padding=pad,
            groups=channels).numpy()
        assert_close(program(xs)[0], expected, reduction=kernel[0] * kernel[1])


@pytest.mark.parametrize("size, stride, pad", [((7, 7), 2, 1), ((13, 11), 1, 1), ((5, 17), 2, 0)])
def test_max_pool_matches_torch(size, stride, pad):
    x = Tensor("x", "float32", ["n", 3, *size])
    y = apply("MaxPool", [x], {"kernel_shape": [3, 3], "strides": [stride] * 2,
                               "pads": [pad] * 4})[0]
    assert match_window(_operator(Graph.from_outputs([x], [y])).definition[0]) is not None
    program = compile_graph(Graph.from_outputs([x], [y]))
    xs = random_array((2, 3, *size), seed=3)
    expected = torch.nn.functional.max_pool2d(torch.from_numpy(xs), 3, stride, pad).numpy()
    np.testing.assert_array_equal(program(xs)[0], expected)


@pytest.mark.parametrize("channels, size, kernel, stride, pad", [
    (19, (7, 7), 3, 1, 1), (8, (13, 11), 3, 2, 1), (5, (9, 6), 5, 1, 2), (3, (5, 5), 3, 1, 0)])
def test_channels_last_depthwise_interior_rows_skip_the_padding_checks(channels, size, kernel,
                                                                         stride, pad):
    """A row is one pixel's channels: each padding check holds or fails for the whole row,
    so the kernel branches on the checks and no select is left in a row's pass (windows
    of up to MAX_UNROLLED points)."""
    x = Tensor("x", "float32", ["n", *size, channels])
    w = random_array((kernel, kernel, 1, channels), seed=4)
    b = random_array((channels,), seed=5)
    attrs = {"group": channels, "strides": [stride] * 2, "pads": [pad] * 4}
    y = apply("ChannelsLastConv", [x, constant(w), constant(b)], attrs)[0]
    graph = Graph.from_outputs([x], [y])
    func = schedule_operator(_operator(graph), "dw", host()).function
    verify(func)
    if kernel * kernel <= MAX_UNROLLED:
        assert not any(isinstance(n, Select) for n in walk(func.body))
        passes = [n for n in walk(func.body) if isinstance(n, For) and n.kind == "vectorize"]
        branches = [n for n in walk(func.body) if isinstance(n, If)]
        assert len(passes) == len(branches) + 1 and (len(passes) > 1) == (pad > 0)
    program = compile_graph(graph)
    for batch in (1, 3):
        xs = random_array((batch, *size, channels), seed=batch)
        expected = torch.nn.functional.conv2d(
            torch.from_numpy(xs).permute(0, 3, 1, 2), torch.from_numpy(w).permute(3, 2, 0, 1),
            torch.from_numpy(b), stride=stride, padding=pad, groups=channels)
        assert_close(program(xs)[0], expected.permute(0, 2, 3, 1).numpy(),
                     reduction=kernel * kernel)


NARROW = [  # input channels, output channels, (height, width), kernel, stride, padding, dilation
    (32, 3, (23, 29), (9, 9), 1, 4, 1),
    (16, 1, (13, 97), (5, 5), 1, 2, 1),
    (7, 2, (61, 17), (3, 3), 2, 1, 1),
    (5, 7, (11, 11), (3, 3), 1, 2, 2),
    (3, 6, (1, 127), (1, 7), 1, 0, 1),
    (24, 3, (8, 9), (3, 3), 2, 0, 1),
    (9, 4, (13, 31), (3, 3), 1, 0, 1),
]


@pytest.mark.parametrize("cin, cout, size, kernel, stride, pad, dilation", NARROW)
def test_convolutions_to_a_few_channels_are_windows_and_match_torch(cin, cout, size, kernel,
                                                                     stride, pad, dilation):
    """A convolution to fewer channels than a GEMM's narrowest columns is left to the
    window template (a GEMM would pack every tap of every pixel for a few channels to
    read), which sums a whole unpadded 3 x 3 window in each pass along the row; the
    numbers stay torch's, with a symbolic batch."""
    x = Tensor("x", "float32", ["n", cin, *size])
    w = random_array((cout, cin, *kernel), seed=6)
    b = random_array((cout,), seed=7)
    attrs = {"strides": [stride] * 2, "pads": [pad] * 4, "dilations": [dilation] * 2}
    y = apply("Conv", [x, constant(w), constant(b)], attrs)[0]
    graph = Graph.from_outputs([x], [y])
    op = _operator(graph)
    assert GEMM.match(op) is None and select_template(op, host())[0].name == "window"
    func = schedule_operator(op, "narrow", host()).function
    verify(func)
    if kernel == (3, 3):
        # Unpadded, both window axes unrolled: 9 taps a pass, the input channels loop.
        # Padded, a pass takes one kernel row: its taps select, and gcc vectorises a pass
        # of several selecting taps no more.
        passes = [n for n in walk(func.body) if isinstance(n, For) and n.kind == "vectorize"]
        assert passes and all(sum(isinstance(m, Load) and m.buffer.name == "x0"
                                  for m in walk(p)) == (3 if pad else 9) for p in passes)
    program = compile_graph(graph)
    for batch in (1, 2):
        xs = random_array((batch, cin, *size), seed=batch)
        expected = torch.nn.functional.conv2d(
            torch.from_numpy(xs), torch.from_numpy(w), torch.from_numpy(b), stride=stride,
            padding=pad, dilation=dilation).numpy()
        assert_close(program(xs)[0], expected, reduction=cin * kernel[0] * kernel[1])


def test_a_narrow_one_by_one_convolution_stays_a_gemm():
    """A 1 x 1 convolution reads each pixel once as a GEMM too (its swapped product)."""
    x = Tensor("x", "float32", [1, 64, 12, 12])
    op = _operator(Graph.from_outputs(
        [x], [apply("Conv", [x, constant(random_array((3, 64, 1, 1)))], {})[0]]))
    assert GEMM.match(op) is not None
