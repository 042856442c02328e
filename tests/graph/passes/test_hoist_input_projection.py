"""hoist_input_projection: a recurrent layer's products with W become one MatMul of the
whole sequence before its loop, with the weights (and R) transposed once by folding; with
weights computed at run time the rewrite still holds, and the numbers match ONNX
Runtime."""
import pytest
from onnx import TensorProto, numpy_helper

from tests.frontend.onnx_models import tensor
from tests.graph.ops.test_recurrent import assert_matches_onnxruntime, recurrent_case
from treadle.compiler import compile_graph
from treadle.frontend.onnx import from_onnx
from treadle.graph.optimize import optimize
from treadle.graph.ops.recurrent import CELLS
from treadle.graph.passes.hoist_input_projection import hoist_input_projection

pytest.importorskip("onnxruntime")


@pytest.mark.parametrize("op", list(CELLS))
def test_the_projection_leaves_the_loop(op):
    model, _ = recurrent_case(op, direction="bidirectional")
    hoisted = hoist_input_projection(from_onnx(model))
    ops = [node.op_type for node in hoisted.nodes]
    assert ops.count("MatMul") == 1 and ops.count(f"{op}Steps") == 1 and op not in ops


def test_constant_weights_fold_into_the_matmul_operand():
    model, _ = recurrent_case("LSTM", direction="bidirectional")
    nodes = optimize(from_onnx(model)).nodes
    assert [node.op_type for node in nodes] == ["MatMul", "LSTMSteps"]
    matmul, steps = nodes
    assert matmul.inputs[1].is_constant and matmul.inputs[1].shape == (5, 2 * 4 * 7)
    assert steps.inputs[2].is_constant and steps.inputs[2].shape == (2, 7, 4 * 7)


@pytest.mark.parametrize("op", list(CELLS))
def test_weights_computed_at_run_time(op):
    """W and R as graph inputs: transposed by kernels of their own, every call."""
    model, feeds = recurrent_case(op, direction="bidirectional", given=("initial_h",), seed=21)
    graph = model.graph
    for name in ("W", "R"):
        init = next(i for i in graph.initializer if i.name == name)
        feeds[name] = numpy_helper.to_array(init)
        graph.initializer.remove(init)
        graph.input.append(tensor(name, list(feeds[name].shape), TensorProto.FLOAT))
    assert f"{op}Steps" in [n.op_type for n in optimize(from_onnx(model)).nodes]
    run = compile_graph(from_onnx(model))
    assert_matches_onnxruntime(lambda **f: run(*[f[i.name] for i in graph.input]), model,
                               feeds)
