"""treadle.check and `treadle check`: outputs against ONNX Runtime, and the first node
whose output differs when they part."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from onnx import TensorProto, helper

import treadle
from tests.frontend.onnx_models import make_model, tensor
from tests.models.test_multi_branch import multi_branch_stage
from treadle.checker import ATOL, RTOL
from treadle.cli import main
from treadle.errors import ModelError
from treadle.graph.operator import REGISTRY, lookup


def chain_model():
    """x -> Exp -> MatMul -> Sigmoid -> Add(x) -> Relu, over a symbolic batch."""
    nodes = [helper.make_node("Exp", ["x"], ["e"], name="exp"),
             helper.make_node("MatMul", ["e", "w"], ["m"], name="matmul"),
             helper.make_node("Sigmoid", ["m"], ["s"], name="squash"),
             helper.make_node("Add", ["s", "x"], ["a"], name="residual"),
             helper.make_node("Relu", ["a"], ["y"], name="relu")]
    w = np.random.default_rng(0).standard_normal((7, 7)).astype(np.float32)
    return make_model(nodes, [tensor("x", ["n", 7])], [tensor("y", ["n", 7])], {"w": w})


@pytest.fixture
def sigmoid_computes_tanh(monkeypatch):
    """A fault planted in one operator's definition, as a wrong kernel would be."""
    lookup("Sigmoid")  # registers every op family first
    monkeypatch.setitem(REGISTRY, "Sigmoid", replace(REGISTRY["Tanh"], name="Sigmoid"))


def test_agreeing_model_reports_every_output():
    report = treadle.check(chain_model(), dims={"n": 5})
    assert report.agrees and report.divergence is None
    assert [d.name for d in report.outputs] == ["y"] and report.outputs[0].shape == (5, 7)
    assert report.outputs[0].max_rel < 1e-5
    assert report.inputs["x"].shape == (5, 7)
    assert "all outputs agree" in str(report)


def test_a_planted_fault_is_found_at_its_node(sigmoid_computes_tanh):
    x = np.random.default_rng(1).standard_normal((3, 7)).astype(np.float32)
    report = treadle.check(chain_model(), {"x": x})
    assert not report.agrees
    found = report.divergence
    assert found is not None and found.node == "squash" and found.op_type == "Sigmoid"
    assert found.input_shapes == {"m": (3, 7)}
    assert not found.difference.agrees and found.difference.max_abs > 0.1
    # The kernel that computed it: the matmul, with the sigmoid fused after it.
    assert found.kernel.startswith("MatMul[matmul]") and "squash" in found.kernel
    text = str(report)
    assert "DIFFERS" in text and "first differing node: 'squash' (Sigmoid)" in text


def half_model():
    """x -> MatMul -> Softmax -> MatMul in float16, 13 x 29 x 17: each product's sum rounds
    differently from ONNX Runtime's, by an ulp or two."""
    rng = np.random.default_rng(5)
    w0, w1 = (rng.standard_normal(s).astype(np.float16) for s in ((29, 17), (17, 11)))
    nodes = [helper.make_node("MatMul", ["x", "w0"], ["m"], name="first"),
             helper.make_node("Softmax", ["m"], ["s"], name="softmax"),
             helper.make_node("MatMul", ["s", "w1"], ["y"], name="second")]
    return make_model(nodes, [tensor("x", [13, 29], TensorProto.FLOAT16)],
                      [tensor("y", [13, 11], TensorProto.FLOAT16)], {"w0": w0, "w1": w1})


def test_half_precision_is_held_to_its_own_tolerance():
    """float16 outputs that differ from ONNX Runtime's by float16's rounding agree by
    default, and differ against float32's tolerance given explicitly."""
    report = treadle.check(half_model())
    assert report.agrees, str(report)
    assert report.outputs[0].max_rel > RTOL  # the default tolerance mattered
    assert not treadle.check(half_model(), rtol=RTOL, atol=ATOL).agrees


def test_a_model_onnxruntime_cannot_run_is_a_model_error(tmp_path, capsys):
    """bfloat16 Conv, which treadle runs and ONNX Runtime's CPU provider refuses: a one-line
    error naming the reference, exit status 2 (1 means an output differs)."""
    w = np.ones((2, 3, 1, 1), np.float32)
    node = helper.make_node("Conv", ["x", "w"], ["y"])
    model = make_model([node], [tensor("x", [1, 3, 4, 4], TensorProto.BFLOAT16)],
                       [tensor("y", None, TensorProto.BFLOAT16)],
                       {"w": w.astype(pytest.importorskip("ml_dtypes").bfloat16)})
    with pytest.raises(ModelError, match="ONNX Runtime, the reference, cannot run the model"):
        treadle.check(model)
    path = tmp_path / "bf16.onnx"
    path.write_bytes(model.SerializeToString())
    assert main(["check", str(path)]) == 2
    assert capsys.readouterr().err.startswith("treadle: error: ONNX Runtime")


def test_nan_in_different_places_is_a_difference():
    from treadle.checker import _difference
    a = np.array([1.0, np.nan, np.inf], np.float32)
    assert _difference("t", a, a.copy(), 1e-4, 1e-5).agrees
    moved = _difference("t", a, np.array([np.nan, 1.0, np.inf], np.float32), 1e-4, 1e-5)
    assert not moved.agrees and moved.mismatched_nans == 2
    assert not _difference("t", a, np.array([1.0, np.nan, -np.inf], np.float32), 1, 1).agrees
    assert not _difference("t", a[:2], a, 1e-4, 1e-5).agrees  # shapes differ


def test_multi_branch_stage_agrees(tmp_path):
    model, shapes = multi_branch_stage(0, [8, 16, 32], 20, 1, [0, 1, 2])
    report = treadle.check(model)
    assert report.agrees, str(report)
    assert [d.name for d in report.outputs] == [o.name for o in model.graph.output]


def test_command_prints_the_report_and_exits_1_on_a_difference(tmp_path, capsys,
                                                                 sigmoid_computes_tanh):
    path = tmp_path / "chain.onnx"
    path.write_bytes(chain_model().SerializeToString())
    x = np.random.default_rng(2).standard_normal((4, 7)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    assert main(["check", str(path), "--input", f"x={tmp_path / 'x.npy'}"]) == 1
    out = capsys.readouterr().out
    assert "y [4, 7]: DIFFERS" in out and "first differing node: 'squash'" in out


def test_command_exits_0_when_outputs_agree(tmp_path, capsys):
    path = tmp_path / "chain.onnx"
    path.write_bytes(chain_model().SerializeToString())
    assert main(["check", str(path), "--dim", "n=2", "--rtol", "1e-4"]) == 0
    assert "y [2, 7]: agrees" in capsys.readouterr().out


def test_inputs_that_decide_shapes_are_bound_from_the_given_values():
    from onnx import TensorProto, helper
    from treadle.errors import ArgumentError
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape")], "m",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6]),
         helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    report = treadle.check(model, {"shape": np.array([3, -1], np.int64)})
    assert report.agrees and report.outputs[0].name == "y"
    with pytest.raises(ArgumentError, match=r"inputs \['shape'\] decide it"):
        treadle.check(model)
