"""The Python graph API: small networks with symbolic batch, against numpy."""
import math

import numpy as np

import treadle
from tests.harness import assert_close, random_array
from tests.schedule.templates.gemm.test_program import conv_reference
from treadle import ops


def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_mlp_with_symbolic_batch():
    w1, b1 = random_array((32, 20), seed=1), random_array((32,), seed=2)
    w2 = random_array((10, 32), seed=3)
    x = ops.input("x", "float32", ["batch", 20])
    h = ops.gelu(ops.linear(x, ops.constant(w1), ops.constant(b1)))
    y = ops.softmax(ops.linear(h, ops.constant(w2)))
    model = treadle.compile(ops.graph([x], [y]))
    erf = np.vectorize(math.erf)
    for batch in (1, 7):
        v = random_array((batch, 20), seed=batch)
        hidden = v @ w1.T + b1
        hidden = 0.5 * hidden * (1 + erf(hidden / math.sqrt(2)))
        assert_close(model(v)[0], softmax(hidden @ w2.T).astype(np.float32), reduction=32)


def test_small_cnn():
    w = random_array((8, 3, 3, 3), seed=4)
    x = ops.input("image", "float32", [2, 3, 13, 13])
    y = ops.global_avg_pool(ops.max_pool2d(ops.relu(ops.conv2d(x, ops.constant(w), padding=1)), 2))
    model = treadle.compile(ops.graph([x], [y]))
    v = random_array((2, 3, 13, 13), seed=5)
    conv = np.maximum(conv_reference(v, w, 1, 1), 0)[:, :, :12, :12]
    pooled = conv.reshape(2, 8, 6, 2, 6, 2).max(axis=(3, 5))
    assert_close(model(v)[0], pooled.mean(axis=(2, 3), keepdims=True), reduction=27)
