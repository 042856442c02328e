"""Mixed depthwise blocks (MixNet's MixConv): the channels split into one depthwise
convolution per kernel size, 3x3 to 11x11, concatenated back, batch-normalised, in SiLU,
squeezed by a global pooling. Against ONNX Runtime with a symbolic batch, odd channel
counts and images smaller than the largest kernel; the split, the concatenation and the
pooling stay channels-last, and every kernel size is the window template's."""
import numpy as np
import pytest
from onnx import helper

from tests.frontend.onnx_models import make_model, tensor
from tests.harness import assert_close, random_array, run_onnxruntime
import treadle
from treadle.frontend.onnx import from_onnx
from treadle.graph.optimize import optimize
from treadle.schedule.select import select_template
from treadle.target.cpu import host


def split_channels(channels, parts):
    sizes = [channels // parts] * parts
    sizes[0] += channels - sum(sizes)
    return sizes


def mixed_block(channels, kernels, side, stride=1, pool="GlobalAveragePool"):
    """1x1 expansion (ReLU) -> split -> depthwise per kernel -> concat -> BN -> SiLU, read
    by a global pooling (output ``g``) and a 1x1 projection (output ``y``)."""
    sizes = split_channels(channels, len(kernels))
    inits = {"w0": random_array((channels, 5, 1, 1), seed=1),
             "split": np.array(sizes, np.int64),
             "scale": random_array((channels,), seed=2, low=0.5, high=1.5),
             "bias": random_array((channels,), seed=3),
             "mean": random_array((channels,), seed=4),
             "var": random_array((channels,), seed=5, low=0.5, high=2.0),
             "wp": random_array((6, channels, 1, 1), seed=6)}
    parts = [f"part{k}" for k in range(len(kernels))]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["e"], name="expand"),
             helper.make_node("Relu", ["e"], ["r"], name="relu"),
             helper.make_node("Split", ["r", "split"], parts, name="split", axis=1)]
    for k, (size, kernel) in enumerate(zip(sizes, kernels)):
        inits[f"w{kernel}"] = random_array((size, 1, kernel, kernel), seed=10 + k)
        nodes.append(helper.make_node("Conv", [parts[k], f"w{kernel}"], [f"d{k}"],
                                      name=f"dw{kernel}", group=size,
                                      strides=[stride] * 2, pads=[kernel // 2] * 4))
    nodes += [helper.make_node("Concat", [f"d{k}" for k in range(len(kernels))], ["cat"],
                               name="cat", axis=1),
              helper.make_node("BatchNormalization", ["cat", "scale", "bias", "mean", "var"],
                               ["bn"], name="bn"),
              helper.make_node("Sigmoid", ["bn"], ["sig"], name="sigmoid"),
              helper.make_node("Mul", ["bn", "sig"], ["act"], name="silu"),
              helper.make_node(pool, ["act"], ["g"], name="pool"),
              helper.make_node("Conv", ["act", "wp"], ["y"], name="project")]
    out = (side - 1) // stride + 1
    return make_model(nodes, [tensor("x", ["batch", 5, side, side])],
                      [tensor("g", ["batch", channels, 1, 1]),
                       tensor("y", ["batch", 6, out, out])], initializers=inits)


CASES = [  # channels, kernels, side, stride, pool
    (23, (3, 5, 7, 9, 11), 13, 1, "GlobalAveragePool"),
    (30, (3, 5, 7), 9, 2, "GlobalMaxPool"),
    (17, (3, 5, 7, 9), 6, 1, "GlobalAveragePool"),  # smaller than the 9x9 kernel
    (8, (11,), 29, 1, "GlobalAveragePool"),  # one kernel; the pool over 29 x 29 points
]


@pytest.mark.parametrize("channels,kernels,side,stride,pool", CASES)
def test_mixed_depthwise_block_matches_onnxruntime(channels, kernels, side, stride, pool):
    model = mixed_block(channels, kernels, side, stride, pool)
    compiled = treadle.compile(model)
    for batch in (1, 2):
        x = random_array((batch, 5, side, side), seed=batch)
        expected = run_onnxruntime(model, {"x": x})
        actual = compiled(x)
        for a, e in zip(actual, expected):
            assert_close(a, e, reduction=max(kernels) ** 2 + channels)


def test_mixed_block_stays_channels_last_and_windows_every_kernel():
    graph = optimize(from_onnx(mixed_block(23, (3, 5, 7, 9, 11), 13)))
    types = [n.op_type for n in graph.nodes]
    assert "Split" not in types and "GlobalAveragePool" not in types
    # The input goes channels-last once; the pool's N x 1 x 1 x C result and the
    # projection go back to NCHW at the outputs.
    transposes = [n for n in graph.nodes if n.op_type == "Transpose"]
    assert len(transposes) == 3, types
    depthwise = [n for n in graph.nodes if n.op_type == "ChannelsLastConv" and
                 n.attrs.get("group", 1) > 1]
    assert len(depthwise) == 5
    target = host()
    assert {select_template(n, target)[0].name for n in depthwise} == {"window"}


def test_mixed_block_kernels_fuse_the_slices_and_the_pool_reads_channels_last():
    compiled = treadle.compile(mixed_block(23, (3, 5, 7, 9, 11), 13))
    kernels = [s for s in compiled.executable.steps if s.kernel is not None]
    # expansion, five depthwise convolutions reading their slices, the concatenation with
    # BN and SiLU, the pooling, the projection (its transpose to NCHW an epilogue)
    assert len(kernels) <= 9, [s.name for s in kernels]
