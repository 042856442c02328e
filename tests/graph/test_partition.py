"""The fusion partition's structure: which operators share a group, without compiling."""
from __future__ import annotations

import numpy as np

from tests.harness import assert_close, random_array, run_graph
from treadle import ops
from treadle.graph.graph import Graph
from treadle.graph.operator import apply
from treadle.graph.optimize import optimize
from treadle.graph.partition import format_partition, partition


def groups_of(outputs, inputs) -> list[tuple[str, list[str], list[str]]]:
    graph = optimize(Graph.from_outputs(inputs, outputs))
    return [(g.anchor.op_type, [op.op_type for op in g.prologues],
             [op.op_type for op in g.epilogues]) for g in partition(graph)]


def test_elementwise_chain_after_a_matmul_is_its_epilogue():
    x = ops.input("x", "float32", [4, 8])
    y = ops.relu(ops.add(ops.matmul(x, ops.constant(random_array([8, 8]))),
                         ops.constant(random_array([8]))))
    assert groups_of([y], [x]) == [("MatMul", [], ["Add", "Relu"])]


def test_elementwise_op_between_two_anchors_goes_to_the_first():
    x = ops.input("x", "float32", [4, 8])
    w = ops.constant(random_array([8, 8]))
    y = ops.matmul(ops.relu(ops.matmul(x, w)), w)
    assert groups_of([y], [x]) == [("MatMul", [], ["Relu"]), ("MatMul", [], [])]


def test_injective_ops_before_a_reduction_are_its_prologues():
    x = ops.input("x", "float32", [4, 8])
    y = ops.softmax(ops.transpose(ops.mul(x, np.float32(2)), [1, 0]))
    assert groups_of([y], [x]) == [("Softmax", ["Mul", "Transpose"], [])]


def test_a_prologue_read_by_two_groups_stays_a_kernel():
    x = ops.input("x", "float32", [4, 8])
    t = ops.transpose(x, [1, 0])
    y, z = ops.softmax(t), ops.reduce_mean(t, [1])
    assert groups_of([y, z], [x])[0] == ("Transpose", [], [])


def test_graph_outputs_are_never_inlined():
    x = ops.input("x", "float32", [4, 8])
    t = ops.transpose(x, [1, 0])
    assert groups_of([ops.softmax(t), t], [x])[0] == ("Transpose", [], [])


def test_dump_names_every_group():
    x = ops.input("x", "float32", [4, 8])
    y = ops.relu(ops.matmul(x, ops.constant(random_array([8, 8]))))
    text = format_partition(partition(optimize(Graph.from_outputs([x], [y]))))
    assert text.startswith("0: MatMul[") and "epilogues: relu" in text


def test_groups_never_wait_for_each_other():
    # s0 = a + c(b) and s1 = b + d(a): fusing s0 after a's matmul and s1 after b's would
    # make each kernel need the other's result (the cause of wrong numbers on an
    # HRNet-style stage, whose branches exchange their outputs the same way).
    x0, x1 = ops.input("x0", "float32", [5, 8]), ops.input("x1", "float32", [5, 8])
    w = [ops.constant(random_array([8, 8], seed=k)) for k in range(4)]
    a, b = ops.matmul(x0, w[0]), ops.matmul(x1, w[1])
    s0 = ops.add(a, ops.matmul(b, w[2]))
    s1 = ops.add(b, ops.matmul(a, w[3]))
    groups = partition(optimize(Graph.from_outputs([x0, x1], [s0, s1])))
    written: set[int] = set()
    for group in groups:
        members = {id(op) for op in group.ops}
        for op in group.ops:
            for t in op.inputs:
                if t is not None and t.producer is not None and id(t.producer) not in members:
                    assert id(t) in written, f"{group.name} reads {t.name} before it is written"
        written.update(id(t) for op in group.ops for t in op.outputs)
    assert sum(len(g.epilogues) for g in groups) == 2  # both sums still fuse


def test_resizing_is_its_own_kernel_not_a_prologue():
    """A resize inlined into a reader computes source positions and weights at every
    read; the product reads a resized copy instead."""
    x = ops.input("x", "float32", [6, 5, 8])
    scales = ops.constant(np.array([1, 2, 2], np.float32))
    up = ops.op("Resize", x, None, scales, mode="linear")
    y = ops.matmul(up, ops.constant(random_array((16, 3), seed=1)))
    assert groups_of([y], [x]) == [("Resize", [], []), ("MatMul", [], [])]


def test_a_transposed_graph_output_moving_the_innermost_axis_is_its_own_kernel():
    """A channels-last convolution returned N x C x H x W with planes of 4 KiB or more
    stores contiguous rows and a kernel of its own transposes them; with smaller planes,
    or a transposition that keeps the innermost axis (attention's heads), the
    transposition stays the product's epilogue."""
    for side, apart in ((37, True), (31, False)):  # 37 x 29 floats: 4292 bytes a plane
        x = ops.input("x", "float32", [1, 16, side, 29])
        image = ops.conv2d(x, ops.constant(random_array([24, 16, 1, 1])))
        expected = ([("ChannelsLastConv", ["Transpose"], []), ("Transpose", [], [])] if apart
                    else [("ChannelsLastConv", ["Transpose"], ["Transpose"])])
        assert groups_of([image], [x]) == expected, side
    tokens = ops.input("t", "float32", [2, 5, 3, 8])
    heads = ops.transpose(ops.matmul(tokens, ops.constant(random_array([8, 8]))), [0, 2, 1, 3])
    assert groups_of([heads], [tokens]) == [("MatMul", [], ["Transpose"])]


def test_a_reshape_whose_target_shape_reads_the_group_is_no_epilogue():
    """Dynamo's exports of grouped-query attention reshape a tensor to a shape computed
    from ``Shape`` of that same tensor: fused after the tensor's kernel, the reshape would
    make the kernel wait for the Shape kernel, which waits for it."""
    x = ops.input("x", "float32", ["n", 6])
    r = ops.relu(x)
    size = apply("Shape", [r], {"end": 1})[0]
    target = ops.concat([size, ops.constant(np.array([2, 3], np.int64))], axis=0)
    y = ops.op("Neg", ops.op("Reshape", r, target))
    groups = groups_of([y], [x])
    assert ("Relu", [], ["Reshape", "Neg"]) not in groups
    data = random_array([5, 6])
    (out,) = run_graph([(x, data)], [y])
    assert_close(out, -np.maximum(data, 0).reshape(5, 2, 3))


def test_a_dequantisation_read_by_another_kernel_is_its_prologue():
    """A quantised result dequantised for a later group's sum is stored as bytes, and the
    reader dequantises it as it loads (a quantised ResNet's block outputs); numbers as
    the graph defines them."""
    x = ops.input("x", "float32", [5, 8])
    scale, zero = ops.constant(np.float32(0.05)), ops.constant(np.int8(3))
    first = ops.matmul(x, ops.constant(random_array([8, 8], seed=1)))
    quantised = ops.op("QuantizeLinear", first, scale, zero)
    later = ops.matmul(x, ops.constant(random_array([8, 8], seed=2)))
    y = ops.add(later, ops.op("DequantizeLinear", quantised, scale, zero))
    assert groups_of([y], [x]) == [("MatMul", [], ["QuantizeLinear"]),
                                   ("MatMul", ["DequantizeLinear"], ["Add"])]
    values = random_array([5, 8], seed=3)
    w1, w2 = random_array([8, 8], seed=1), random_array([8, 8], seed=2)
    q = np.clip(np.rint(values @ w1 / np.float32(0.05)) + 3, -128, 127)
    expected = values @ w2 + (q - 3) * np.float32(0.05)
    assert_close(run_graph([(x, values)], [y])[0], expected, reduction=8)
