"""If, Scan and Loop against ONNX Runtime: conditions known when compiling and computed at
run time, scans in both directions along any axis, loops with scanned outputs, with a
condition that stops them early (with scanned outputs too, and without a trip count) and
with a trip count given as an input; the errors."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import treadle
from tests.frontend.onnx_models import make_model, tensor
from tests.harness import assert_close, rng, run_onnxruntime
from treadle.errors import ModelError

pytest.importorskip("onnxruntime")
FLOAT, BOOL, INT64 = TensorProto.FLOAT, TensorProto.BOOL, TensorProto.INT64


def graph(nodes, inputs, outputs, name="body"):
    return helper.make_graph(nodes, name, inputs, outputs)


def branch(op, name):
    """A branch computing ``op`` of the outer x, into one output."""
    return graph([helper.make_node(op, ["x"], [f"{name}_y"])], [],
                 [tensor(f"{name}_y", None)], name)


def if_model(cond_input: bool):
    nodes = [helper.make_node("If", ["cond"], ["y"], name="choice",
                              then_branch=branch("Exp", "then"),
                              else_branch=branch("Neg", "else"))]
    inputs = [tensor("x", ["n", 5])]
    constants = {}
    if cond_input:
        nodes[:0] = [helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
                     helper.make_node("Greater", ["total", "zero"], ["cond"])]
        constants["zero"] = np.array(0.0, np.float32)
    else:
        constants["cond"] = np.array(True)
    return make_model(nodes, inputs, [tensor("y", None)], constants, opset=17)


@pytest.mark.parametrize("cond_input", [False, True])
def test_if(cond_input):
    model = if_model(cond_input)
    compiled = treadle.compile(model)
    for n, sign in ((3, 1), (7, -1), (1, 1)):
        x = (sign * np.abs(rng(n).standard_normal((n, 5)))).astype(np.float32)
        assert_close(compiled(x=x)[0], run_onnxruntime(model, {"x": x})[0])


def scan_model(reverse_in, reverse_out, axis_in, axis_out):
    """A running sum (the state) and each step's state times the slice, scanned out."""
    body = graph([helper.make_node("Add", ["s", "xt"], ["s2"]),
                  helper.make_node("Mul", ["s2", "xt"], ["out"])],
                 [tensor("s", [3]), tensor("xt", [3])], [tensor("s2", [3]), tensor("out", [3])])
    node = helper.make_node("Scan", ["s0", "x"], ["total", "ys"], name="scan", body=body,
                            num_scan_inputs=1, scan_input_directions=[reverse_in],
                            scan_output_directions=[reverse_out], scan_input_axes=[axis_in],
                            scan_output_axes=[axis_out])
    shape = [7, 3] if axis_in == 0 else [3, 7]
    return make_model([node], [tensor("s0", [3]), tensor("x", shape)],
                      [tensor("total", None), tensor("ys", None)], opset=17)


@pytest.mark.parametrize("reverse_in, reverse_out, axis_in, axis_out",
                         [(0, 0, 0, 0), (1, 0, 0, 1), (0, 1, 1, -1), (1, 1, -1, 0)])
def test_scan(reverse_in, reverse_out, axis_in, axis_out):
    model = scan_model(reverse_in, reverse_out, axis_in, axis_out)
    feeds = {"s0": rng(0).standard_normal(3).astype(np.float32),
             "x": rng(1).standard_normal((7, 3) if axis_in == 0 else (3, 7)).astype(np.float32)}
    for got, want in zip(treadle.compile(model)(**feeds), run_onnxruntime(model, feeds)):
        assert_close(got, want)


def loop_model(trips, stop_at=None, scanned=True):
    """v <- v * 2 + i for i < trips; with ``stop_at``, the condition becomes false once the
    sum of v reaches it. Scanned out: each step's v."""
    nodes = [helper.make_node("Cast", ["i"], ["fi"], to=FLOAT),
             helper.make_node("Mul", ["v", "two"], ["v2"]),
             helper.make_node("Add", ["v2", "fi"], ["v_next"])]
    if stop_at is None:
        nodes.append(helper.make_node("Identity", ["cond"], ["cond_next"]))
    else:
        nodes += [helper.make_node("ReduceSum", ["v_next"], ["total"], keepdims=0),
                  helper.make_node("Less", ["total", "limit"], ["cond_next"])]
    outputs = [tensor("cond_next", [], BOOL), tensor("v_next", ["n"])]
    if scanned:
        nodes.append(helper.make_node("Identity", ["v_next"], ["v_out"]))
        outputs.append(tensor("v_out", ["n"]))
    body = graph(nodes, [tensor("i", [], INT64), tensor("cond", [], BOOL), tensor("v", ["n"])],
                 outputs)
    node = helper.make_node("Loop", ["trips", "go", "v0"],
                            ["v_final", "vs"] if scanned else ["v_final"], name="loop",
                            body=body)
    constants = {"two": np.array(2.0, np.float32), "go": np.array(True),
                 "limit": np.array(stop_at or 0.0, np.float32)}
    inputs = [tensor("v0", ["n"])]
    if trips is None:
        inputs.append(tensor("trips", [], INT64))
    else:
        constants["trips"] = np.array(trips, np.int64)
    return make_model([node], inputs, [tensor(o, None) for o in node.output], constants,
                      opset=17)


@pytest.mark.parametrize("trips", [0, 1, 5])
def test_loop_with_scanned_outputs(trips):
    model = loop_model(trips, scanned=trips > 0)
    v0 = rng(trips).standard_normal(4).astype(np.float32)
    for got, want in zip(treadle.compile(model)(v0=v0), run_onnxruntime(model, {"v0": v0})):
        assert_close(got, want)


def test_a_loop_that_stops_on_its_condition():
    model = loop_model(9, stop_at=40.0, scanned=False)
    compiled = treadle.compile(model)
    for v0 in (np.ones(3, np.float32), np.full(3, 20.0, np.float32), np.zeros(3, np.float32)):
        assert_close(compiled(v0=v0)[0], run_onnxruntime(model, {"v0": v0})[0])


def test_a_trip_count_given_in_the_call():
    model = loop_model(None)
    compiled = treadle.compile(model)
    v0 = np.arange(3, dtype=np.float32)
    for trips in (2, 6):
        feeds = {"v0": v0, "trips": np.array(trips, np.int64)}
        for got, want in zip(compiled(**feeds), run_onnxruntime(model, feeds)):
            assert_close(got, want)


@pytest.mark.parametrize("trips", [4, None])
def test_scanned_outputs_of_a_loop_stopped_at_run_time(trips):
    """A condition computed at run time with scanned outputs, with and without a trip
    count: a Loop operator runs the body (tests/frontend/test_loop_runtime.py)."""
    model = loop_model(trips or 3, stop_at=10.0)
    if trips is None:
        model.graph.node[0].input[0] = ""
    compiled = treadle.compile(model)
    for v0 in (np.ones(3, np.float32), np.full(3, 0.5, np.float32)):
        for got, want in zip(compiled(v0=v0), run_onnxruntime(model, {"v0": v0})):
            assert_close(got, want)


def test_a_body_reading_an_undefined_tensor_names_it():
    model = if_model(False)
    model.graph.node[0].attribute[0].g.node[0].input[0] = "nowhere"
    with pytest.raises(ModelError, match="nowhere"):
        treadle.compile(model)
