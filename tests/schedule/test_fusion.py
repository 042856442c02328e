"""Post-scheduling fusion end to end: how many kernels a graph becomes, and that the fused
kernels still compute what numpy computes (Python's math.erf for GELU), on odd, prime and
symbolic sizes."""
from __future__ import annotations

import math

import numpy as np
import pytest

from tests.harness import assert_close, random_array
from treadle import ops
from treadle.compiler import compile_graph
from treadle.graph.tensor import symbol

erf = np.vectorize(math.erf)


def kernels(executable) -> list[str]:
    return [s.name for s in executable.steps if s.kernel is not None]


def conv_bn_relu(channels: int, size: int, padding: int):
    x = ops.input("x", "float32", [1, 3, size, size])
    w = ops.constant(random_array([channels, 3, 3, 3], seed=1))
    scale, shift = random_array([channels], seed=2), random_array([channels], seed=3)
    mean, var = random_array([channels], seed=4), random_array([channels], seed=5, low=0.5)
    y = ops.conv2d(x, w, padding=padding, name="conv")
    y = ops.op("BatchNormalization", y, ops.constant(scale), ops.constant(shift),
               ops.constant(mean), ops.constant(var), name="bn", epsilon=1e-5)
    y = ops.relu(y)
    return ops.graph([x], [y]), (w.data, scale, shift, mean, var)


def reference_conv_bn_relu(x, padding, w, scale, shift, mean, var):
    torch = pytest.importorskip("torch")
    y = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w),
                                   padding=padding).numpy()
    inv = (scale / np.sqrt(var + 1e-5))[None, :, None, None]
    y = (y - mean[None, :, None, None]) * inv + shift[None, :, None, None]
    return np.maximum(y, 0)


@pytest.mark.parametrize("channels,size,padding", [(8, 7, 0), (13, 11, 1)])
def test_conv_bn_relu_is_one_kernel(channels, size, padding):
    graph, params = conv_bn_relu(channels, size, padding)
    exe = compile_graph(graph)
    # A padded convolution reads a padded copy of its input (see canonicalize), made
    # channels-last: the transposition pads as it stores.
    assert kernels(exe) == ["conv/to_nhwc"] * (padding > 0) + ["conv"]
    x = random_array([1, 3, size, size], seed=6)
    assert_close(exe(x)[0], reference_conv_bn_relu(x, padding, *params), reduction=27)


@pytest.mark.parametrize("batch,size,padding", [(1, 7, 1), (2, 13, 2), (symbol("n"), 11, 1)])
@pytest.mark.parametrize("escapes", [False, True])
def test_padding_is_the_producers_epilogue(batch, size, padding, escapes):
    """A 1x1 convolution + ReLU feeding a padded 3x3 one: the first kernel stores into the
    padded tensor and fills its border, so no padding kernel runs; where the unpadded
    result is also a graph output, the kernel writes both."""
    x = ops.input("x", "float32", [batch, 5, size, size])
    w1, w2 = random_array([11, 5, 1, 1], seed=1), random_array([7, 11, 3, 3], seed=2)
    y = ops.relu(ops.conv2d(x, ops.constant(w1), name="conv1"))
    z = ops.conv2d(y, ops.constant(w2), padding=padding, name="conv2")
    exe = compile_graph(ops.graph([x], [z, y] if escapes else [z]))
    assert kernels(exe) == ["conv1", "conv2"]
    torch = pytest.importorskip("torch")
    for n in ([1, 3] if not isinstance(batch, int) else [batch]):
        xv = random_array([n, 5, size, size], seed=n)
        yv = torch.relu(torch.nn.functional.conv2d(torch.from_numpy(xv), torch.from_numpy(w1)))
        zv = torch.nn.functional.conv2d(yv, torch.from_numpy(w2), padding=padding)
        results = exe(xv)
        assert_close(results[0], zv.numpy(), reduction=99, context=f"batch={n}")
        if escapes:
            assert_close(results[1], yv.numpy(), reduction=5, context=f"batch={n}")


def dense_gelu(rows, hidden: int, width: int):
    """A BERT feed-forward dense layer with GELU written as ONNX exports it: the biased
    product feeds both the erf branch and the final multiply."""
    x = ops.input("x", "float32", [rows, hidden])
    w, b = random_array([hidden, width], seed=1), random_array([width], seed=2)
    y = ops.add(ops.matmul(x, ops.constant(w)), ops.constant(b))
    g = ops.mul(ops.mul(y, ops.add(ops.op("Erf", ops.div(y, np.float32(np.sqrt(2)))),
                                   np.float32(1))), np.float32(0.5))
    return ops.graph([x], [g]), w, b


@pytest.mark.parametrize("rows", [1, 7, 61, symbol("rows")])
def test_dense_bias_gelu_is_one_kernel(rows):
    graph, w, b = dense_gelu(rows, 37, 29)
    exe = compile_graph(graph)
    assert len(kernels(exe)) == 1, kernels(exe)
    for m in ([7, 61] if not isinstance(rows, int) else [rows]):
        x = random_array([m, 37], seed=m)
        y = x @ w + b
        expected = (0.5 * y * (1 + erf(y / np.sqrt(2)))).astype(np.float32)
        assert_close(exe(x)[0], expected, reduction=37,
                     context=f"rows={m}")


def test_residual_add_fuses_into_the_dense_epilogue():
    x = ops.input("x", "float32", [13, 24])
    w, b = random_array([24, 24], seed=1), random_array([24], seed=2)
    y = ops.add(ops.add(ops.matmul(x, ops.constant(w)), ops.constant(b)), x)
    out = ops.layer_norm(y, ops.constant(np.ones(24, np.float32)))
    exe = compile_graph(ops.graph([x], [out]))
    assert len(kernels(exe)) == 2, kernels(exe)  # the dense layer, then the layer norm
    xv = random_array([13, 24], seed=3)
    r = xv @ w + b + xv
    r = (r - r.mean(-1, keepdims=True)) / np.sqrt(r.var(-1, keepdims=True) + 1e-5)
    assert_close(exe(xv)[0], r.astype(np.float32), reduction=24)


def test_transpose_prologue_runs_inside_the_matmul():
    # 29 rows: more than one register tile, so both factors are packed (a factor read in
    # place is loaded as vectors, which a prologue cannot replace).
    a = ops.input("a", "float32", [5, 7, 29])
    b = ops.input("b", "float32", [5, 11, 7])
    graph = ops.graph([a, b], [ops.matmul(ops.transpose(a, [0, 2, 1]),
                                          ops.transpose(b, [0, 2, 1]))])
    exe = compile_graph(graph)
    assert len(kernels(exe)) == 1, kernels(exe)
    av, bv = random_array([5, 7, 29], seed=1), random_array([5, 11, 7], seed=2)
    expected = av.transpose(0, 2, 1) @ bv.transpose(0, 2, 1)
    assert_close(exe(av, bv)[0], expected, reduction=7)


def test_softmax_takes_scale_and_mask_as_prologues_and_an_epilogue():
    s = ops.input("s", "float32", [2, 7, symbol("n")])
    mask = ops.input("mask", "float32", [1, 1, symbol("n")])
    p = ops.mul(ops.softmax(ops.add(ops.mul(s, np.float32(0.125)), mask)), np.float32(3))
    exe = compile_graph(ops.graph([s, mask], [p]))
    assert len(kernels(exe)) == 1, kernels(exe)
    for n in (1, 13):
        sv, mv = random_array([2, 7, n], seed=n), random_array([1, 1, n], seed=n + 1)
        z = sv * 0.125 + mv
        e = np.exp(z - z.max(-1, keepdims=True))
        assert_close(exe(sv, mv)[0], 3 * e / e.sum(-1, keepdims=True), context=f"n={n}")


def test_broadcasting_consumer_is_not_an_epilogue():
    x, z = ops.input("x", "float32", [9, 16]), ops.input("z", "float32", [9, 10])
    w = random_array([16, 1], seed=1)
    y = ops.matmul(x, ops.constant(w))  # [9, 1], read broadcast over z's columns
    exe = compile_graph(ops.graph([x, z], [ops.add(y, z)]))
    assert len(kernels(exe)) == 2, kernels(exe)
    xv, zv = random_array([9, 16], seed=2), random_array([9, 10], seed=3)
    assert_close(exe(xv, zv)[0], xv @ w + zv, reduction=16)


def test_intermediate_read_elsewhere_is_written_too():
    x = ops.input("x", "float32", [7, 12])
    w = random_array([12, 12], seed=1)
    y = ops.matmul(x, ops.constant(w))
    r = ops.relu(y)
    exe = compile_graph(ops.graph([x], [r, y]))
    assert len(kernels(exe)) == 1, kernels(exe)
    xv = random_array([7, 12], seed=2)
    relu, product = exe(xv)
    assert_close(product, xv @ w, reduction=12)
    assert_close(relu, np.maximum(xv @ w, 0), reduction=12)


def test_epilogue_that_would_form_a_cycle_goes_to_the_later_anchor():
    x = ops.input("x", "float32", [6, 8])
    w1, w2 = random_array([8, 8], seed=1), random_array([8, 8], seed=2)
    y = ops.matmul(x, ops.constant(w1))
    a = ops.matmul(y, ops.constant(w2))
    z = ops.add(y, a)  # reads y, and a, which needs y
    exe = compile_graph(ops.graph([x], [z]))
    assert len(kernels(exe)) == 2, kernels(exe)
    xv = random_array([6, 8], seed=3)
    yv = xv @ w1
    assert_close(exe(xv)[0], yv + yv @ w2, reduction=64)


def test_vector_loads_of_a_prologue_fall_back_to_separate_kernels():
    # With one row, the matmul template reads its right factor in place as vectors, which
    # a prologue's expression cannot replace: the transpose gets its own kernel.
    x = ops.input("x", "float32", [1, 40])
    b = ops.input("b", "float32", [48, 40])
    graph = ops.graph([x, b], [ops.matmul(x, ops.transpose(b, [1, 0]))])
    exe = compile_graph(graph)
    assert len(kernels(exe)) == 2, kernels(exe)
    xv, bv = random_array([1, 40], seed=1), random_array([48, 40], seed=2)
    assert_close(exe(xv, bv)[0], xv @ bv.T, reduction=40)


def test_reshape_between_dense_and_gelu_keeps_one_kernel():
    # GPT-2's exporter writes a dense layer as view -> Gemm -> view: the activation and the
    # residual add come after a reshape, which carries the element's index along.
    x = ops.input("x", "float32", [1, 13, 24])
    w, b = random_array([24, 40], seed=1), random_array([40], seed=2)
    flat = ops.reshape(x, [13, 24])
    y = ops.reshape(ops.add(ops.matmul(flat, ops.constant(w)), ops.constant(b)), [1, 13, 40])
    r = ops.input("r", "float32", [1, 13, 40])
    out = ops.add(ops.tanh(y), r)
    exe = compile_graph(ops.graph([x, r], [out]))
    assert len(kernels(exe)) == 1, kernels(exe)
    xv, rv = random_array([1, 13, 24], seed=3), random_array([1, 13, 40], seed=4)
    expected = np.tanh(xv.reshape(13, 24) @ w + b).reshape(1, 13, 40) + rv
    assert_close(exe(xv, rv)[0], expected.astype(np.float32), reduction=24)


def test_reshape_read_by_no_epilogue_stays_a_view():
    x = ops.input("x", "float32", [6, 8])
    y = ops.reshape(ops.relu(ops.matmul(x, ops.constant(random_array([8, 8], seed=1)))), [48])
    exe = compile_graph(ops.graph([x], [ops.softmax(y)]))
    assert len(kernels(exe)) == 2, kernels(exe)
    assert sum(s.kernel is None for s in exe.steps) == 1


def test_transpose_after_attention_is_stored_transposed():
    # BERT's context layer: batched product [heads, seq, dim] -> [seq, heads, dim].
    p = ops.input("p", "float32", [3, 7, 5])
    v = ops.input("v", "float32", [3, 5, 4])
    out = ops.add(ops.transpose(ops.matmul(p, v), [1, 0, 2]), np.float32(1))
    exe = compile_graph(ops.graph([p, v], [out]))
    assert len(kernels(exe)) == 1, kernels(exe)
    pv, vv = random_array([3, 7, 5], seed=1), random_array([3, 5, 4], seed=2)
    assert_close(exe(pv, vv)[0], (pv @ vv).transpose(1, 0, 2) + 1, reduction=5)


def test_slice_reads_part_of_the_product_so_is_not_an_epilogue():
    x = ops.input("x", "float32", [9, 16])
    w = random_array([16, 12], seed=1)
    y = ops.op("Slice", ops.matmul(x, ops.constant(w)), ops.constant(np.array([2], np.int64)),
               ops.constant(np.array([7], np.int64)), ops.constant(np.array([1], np.int64)))
    exe = compile_graph(ops.graph([x], [y]))
    assert len(kernels(exe)) == 2, kernels(exe)
    xv = random_array([9, 16], seed=2)
    assert_close(exe(xv)[0], (xv @ w)[:, 2:7], reduction=16)


def test_dense_layers_read_their_own_weights_in_panel_order():
    """Forty dense layers of one shape: each reads its own weights, laid out at compile time
    (a layout made for one layer must never reach another), and the model keeps those
    layouts instead of the original weights."""
    x = ops.input("x", "float32", [7, 24])
    weights = [random_array([24, 24], seed=k, low=-0.3, high=0.3) for k in range(40)]
    y = x
    for w in weights:
        y = ops.relu(ops.matmul(y, ops.constant(w)))
    exe = compile_graph(ops.graph([x], [y]))
    assert len(kernels(exe)) == 40
    assert sorted(a.shape for a in exe.constants.values()) == [(2, 24, 16)] * 40
    xv = random_array([7, 24], seed=99)
    expected = xv
    for w in weights:
        expected = np.maximum(expected @ w, 0)
    assert_close(exe(xv)[0], expected, reduction=24 * 40)
