"""A generated family of HRNet-style multi-branch stages against ONNX Runtime.

Branches at several resolutions run residual blocks of 3x3 convolutions, then exchange
their results: output i sums every branch, brought to its resolution by stride-2 3x3
convolutions (from finer branches) or a 1x1 convolution and nearest upsampling (from
coarser ones). Each branch's result has several readers in several kernels, and every
output's sum can fuse after any branch's last convolution, so these graphs exercise the
partition's cycle checks, padded epilogue stores and buffer lifetimes together (fusing
two branches' sums into each other's kernels once gave relative errors of 0.4-0.7).
"""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import treadle
from tests.frontend.onnx_models import make_model, tensor
from tests.harness import rng, run_onnxruntime


class _Stage:
    def __init__(self, seed: int):
        self.gen = rng(seed)
        self.nodes, self.weights = [], {}

    def _name(self, prefix: str) -> str:
        return f"{prefix}{len(self.nodes)}"

    def conv(self, x: str, cin: int, cout: int, kernel: int, stride: int = 1) -> str:
        w = self._name("w")
        self.weights[w] = (self.gen.standard_normal([cout, cin, kernel, kernel])
                           / np.sqrt(cin * kernel * kernel)).astype(np.float32)
        b = self._name("b")
        self.weights[b] = self.gen.uniform(-0.5, 0.5, cout).astype(np.float32)
        return self._node("Conv", [x, w, b], kernel_shape=[kernel, kernel],
                          strides=[stride, stride], pads=[kernel // 2] * 4)

    def _node(self, op: str, inputs: list[str], **attrs) -> str:
        out = self._name(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], name=f"{op}_{len(self.nodes)}",
                                           **attrs))
        return out

    def relu(self, x: str) -> str:
        return self._node("Relu", [x])

    def add(self, a: str, b: str) -> str:
        return self._node("Add", [a, b])

    def block(self, x: str, c: int) -> str:
        y = self.relu(self.conv(x, c, c, 3))
        return self.relu(self.add(self.conv(y, c, c, 3), x))

    def upsample(self, x: str, factor: int) -> str:
        scales = self._name("scales")
        self.weights[scales] = np.array([1, 1, factor, factor], np.float32)
        return self._node("Resize", [x, "", scales], mode="nearest")


def multi_branch_stage(seed: int, channels: list[int], size: int, blocks: int,
                       outputs: list[int]):
    """The stage's ONNX model: branch k has ``channels[k]`` channels at ``size / 2**k``;
    only the fused results listed in ``outputs`` are graph outputs."""
    s = _Stage(seed)
    n = len(channels)
    xs = []
    for k, c in enumerate(channels):
        x = f"x{k}"
        for _ in range(blocks):
            x = s.block(x, c)
        xs.append(x)
    fused = []
    for i in outputs:
        terms = []
        for j in s.gen.permutation(n):  # the order of the sum decides what fuses where
            x = xs[j]
            if j > i:
                x = s.upsample(s.conv(x, channels[j], channels[i], 1), 2 ** (j - i))
            for step in range(i - j):
                last = step == i - j - 1
                x = s.conv(x, channels[j], channels[i] if last else channels[j], 3, stride=2)
                x = x if last else s.relu(x)
            terms.append(x)
        total = terms[0]
        for t in terms[1:]:
            total = s.add(total, t)
        fused.append(s.relu(total))
    inputs = [tensor(f"x{k}", [1, c, size >> k, size >> k]) for k, c in enumerate(channels)]
    shapes = {f"x{k}": [1, c, size >> k, size >> k] for k, c in enumerate(channels)}
    graph_outputs = [tensor(name, [1, channels[i], size >> i, size >> i])
                     for name, i in zip(fused, outputs)]
    return make_model(s.nodes, inputs, graph_outputs, s.weights), shapes


# (channels per branch, full resolution, residual blocks per branch, outputs kept). The
# resolutions halve exactly; the coarsest ones are odd (3, 5, 7) and the channel counts
# include odd ones, so no size is a multiple of the vector width by accident.
STAGES = [
    ([8, 16, 32], 20, 1, [0, 1, 2]),
    ([8, 16, 32], 20, 2, [0, 2]),
    ([5, 12], 14, 1, [0, 1]),
    ([4, 8, 16, 24], 24, 1, [0, 1, 2, 3]),
    ([6, 10, 14], 12, 1, [1, 2]),
    ([16, 7, 9], 28, 1, [2, 0]),
]


@pytest.mark.parametrize("seed,stage", list(enumerate(STAGES)))
def test_multi_branch_stage_matches_onnxruntime(seed, stage):
    model, shapes = multi_branch_stage(seed, *stage)
    gen = rng(100 + seed)
    # Non-negative inputs, as the ReLUs before a stage leave them.
    feeds = {name: np.maximum(gen.standard_normal(shape), 0).astype(np.float32)
             for name, shape in shapes.items()}
    expected = run_onnxruntime(model, feeds)
    actual = treadle.compile(model)(**feeds)
    for name, got, want in zip([o.name for o in model.graph.output], actual, expected):
        scale = float(np.abs(want).max()) or 1.0
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * scale,
                                   err_msg=f"output {name}")
