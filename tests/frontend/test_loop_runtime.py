"""ONNX Loops that only run time can count, run as one Loop operator whose body is a
model of its own, against ONNX Runtime: trip counts given in the call and read from a
symbolic dimension, while loops stopped by a condition computed at run time with scanned
outputs, bodies of matrix products reading tensors of the graph around them, a loop in a
loop's body, the tensors computed after a loop from its scanned outputs, ``treadle
check``; the unrolling kept for short loops known when compiling; the errors (a state
changing shape, saving, the CUDA target)."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import treadle
from tests.frontend.onnx_models import make_model, tensor
from tests.harness import assert_close, rng, run_onnxruntime
from treadle.checker import check
from treadle.errors import ShapeError, UnsupportedOpError
from treadle.frontend.control_flow import UNROLLED_TRIPS
from treadle.frontend.onnx import from_onnx

pytest.importorskip("onnxruntime")
FLOAT, BOOL, INT64 = TensorProto.FLOAT, TensorProto.BOOL, TensorProto.INT64


def body(nodes, inputs, outputs):
    return helper.make_graph(nodes, "body", inputs, outputs)


def dense_loop(trips=None):
    """h <- tanh(h @ W + b) and k <- k + i for ``trips`` iterations (a graph input where
    None), with b = relu(bias) computed outside the loop; each iteration's h scanned out,
    and after the loop the scanned h plus one, flattened."""
    nodes = [helper.make_node("MatMul", ["h", "w"], ["hw"]),
             helper.make_node("Add", ["hw", "b"], ["pre"]),
             helper.make_node("Tanh", ["pre"], ["h_next"]),
             helper.make_node("Add", ["k", "i"], ["k_next"]),
             helper.make_node("Identity", ["cond"], ["cond_next"]),
             helper.make_node("Identity", ["h_next"], ["h_scan"])]
    loop_body = body(nodes, [tensor("i", [], INT64), tensor("cond", [], BOOL),
                             tensor("h", ["n", 4]), tensor("k", [], INT64)],
                     [tensor("cond_next", [], BOOL), tensor("h_next", ["n", 4]),
                      tensor("k_next", [], INT64), tensor("h_scan", ["n", 4])])
    outer = [helper.make_node("Relu", ["bias"], ["b"]),
             helper.make_node("Loop", ["trips", "go", "h0", "k0"], ["h_last", "k_last", "hs"],
                              name="dense_loop", body=loop_body),
             helper.make_node("Add", ["hs", "one"], ["hs_plus"]),
             helper.make_node("Reshape", ["hs", "flat"], ["hs_flat"])]
    weights = (rng(7).standard_normal((4, 4)) * 0.6).astype(np.float32)
    constants = {"w": weights, "go": np.array(True), "k0": np.array(3, np.int64),
                 "one": np.array(1.0, np.float32), "flat": np.array([-1], np.int64)}
    inputs = [tensor("h0", ["n", 4]), tensor("bias", [4])]
    if trips is None:
        inputs.append(tensor("trips", [], INT64))
    else:
        constants["trips"] = np.array(trips, np.int64)
    outputs = [tensor(o, None, INT64 if o == "k_last" else FLOAT)
               for o in ("h_last", "k_last", "hs", "hs_plus", "hs_flat")]
    return make_model(outer, inputs, outputs, constants, opset=17)


def sum_rows_loop():
    """s <- s + x[i] for every row i of x, the trip count Shape(x)[0]: a symbolic size;
    each running sum scanned out."""
    nodes = [helper.make_node("Gather", ["x", "i"], ["row"], axis=0),
             helper.make_node("Add", ["s", "row"], ["s_next"]),
             helper.make_node("Identity", ["cond"], ["cond_next"]),
             helper.make_node("Identity", ["s_next"], ["s_scan"])]
    loop_body = body(nodes, [tensor("i", [], INT64), tensor("cond", [], BOOL),
                             tensor("s", [3], INT64)],
                     [tensor("cond_next", [], BOOL), tensor("s_next", [3], INT64),
                      tensor("s_scan", [3], INT64)])
    outer = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Gather", ["shape", "zero"], ["rows"], axis=0),
             helper.make_node("Loop", ["rows", "", "s0"], ["total", "sums"], name="rows_loop",
                              body=loop_body)]
    constants = {"zero": np.array(0, np.int64), "s0": np.zeros(3, np.int64)}
    return make_model(outer, [tensor("x", ["n", 3], INT64)],
                      [tensor("total", None, INT64), tensor("sums", None, INT64)], constants,
                      opset=17)


def while_loop(trips=None):
    """A while loop: s <- s + x while sum(s) < limit (checked before each iteration),
    at most ``trips`` times if given; each s scanned out."""
    nodes = [helper.make_node("Add", ["s", "x"], ["s_next"]),
             helper.make_node("ReduceSum", ["s_next"], ["total"], keepdims=0),
             helper.make_node("Less", ["total", "limit"], ["cond_next"]),
             helper.make_node("Identity", ["s_next"], ["s_scan"])]
    loop_body = body(nodes, [tensor("i", [], INT64), tensor("cond", [], BOOL),
                             tensor("s", ["m"])],
                     [tensor("cond_next", [], BOOL), tensor("s_next", ["m"]),
                      tensor("s_scan", ["m"])])
    outer = [helper.make_node("ReduceSum", ["s0"], ["start"], keepdims=0),
             helper.make_node("Less", ["start", "limit"], ["go"]),
             helper.make_node("Loop", ["" if trips is None else "trips", "go", "s0"],
                              ["s_last", "steps"], name="while_loop", body=loop_body)]
    constants = {} if trips is None else {"trips": np.array(trips, np.int64)}
    inputs = [tensor("s0", ["m"]), tensor("x", ["m"]), tensor("limit", [])]
    return make_model(outer, inputs, [tensor("s_last", None), tensor("steps", None)],
                      constants, opset=17)


def nested_loops():
    """An outer loop (trip count M) whose body runs an inner loop (trip count K, a graph
    input the body reads from outside): t <- t + x K times, scanned; the outer state
    gets the inner result plus the iteration number, and scans the sum of the inner
    scan."""
    inner_nodes = [helper.make_node("Add", ["t", "x"], ["t_next"]),
                   helper.make_node("Identity", ["c"], ["c_next"]),
                   helper.make_node("Identity", ["t_next"], ["t_scan"])]
    inner = body(inner_nodes, [tensor("j", [], INT64), tensor("c", [], BOOL), tensor("t", [2])],
                 [tensor("c_next", [], BOOL), tensor("t_next", [2]), tensor("t_scan", [2])])
    outer_nodes = [helper.make_node("Loop", ["K", "", "s"], ["s_inner", "ts"], name="inner",
                                    body=inner),
                   helper.make_node("Cast", ["i"], ["fi"], to=FLOAT),
                   helper.make_node("Add", ["s_inner", "fi"], ["s_next"]),
                   helper.make_node("Identity", ["cond"], ["cond_next"]),
                   helper.make_node("ReduceSum", ["ts"], ["total"], keepdims=0)]
    outer = body(outer_nodes, [tensor("i", [], INT64), tensor("cond", [], BOOL),
                               tensor("s", [2])],
                 [tensor("cond_next", [], BOOL), tensor("s_next", [2]), tensor("total", [])])
    node = helper.make_node("Loop", ["M", "", "s0"], ["s_last", "totals"], name="outer",
                            body=outer)
    inputs = [tensor("x", [2]), tensor("M", [], INT64), tensor("K", [], INT64),
              tensor("s0", [2])]
    return make_model([node], inputs, [tensor("s_last", None), tensor("totals", None)],
                      opset=17)


def assert_like_onnxruntime(model, feeds, scanned=()):
    """Every output against ONNX Runtime. ONNX Runtime gives the scanned outputs of zero
    iterations no slice shape (0 x 0); treadle's keep the body's, so those are compared
    in size alone."""
    got, want = treadle.compile(model)(**feeds), run_onnxruntime(model, feeds)
    for k, (actual, expected) in enumerate(zip(got, want)):
        if expected.size == 0 and k in scanned:
            assert actual.size == 0 and actual.dtype == expected.dtype
            continue
        assert_close(actual, expected, context=model.graph.output[k].name)


def loop_nodes(model):
    return [op for op in from_onnx(model).nodes if op.op_type == "Loop"]


@pytest.mark.parametrize("trips", [0, 1, 7, 13])
def test_a_trip_count_given_in_the_call(trips):
    model = dense_loop()
    feeds = {"h0": rng(trips).standard_normal((5, 4)).astype(np.float32),
             "bias": rng(1).standard_normal(4).astype(np.float32),
             "trips": np.array(trips, np.int64)}
    assert_like_onnxruntime(model, feeds, scanned=(2, 3, 4))


def test_one_compiled_model_runs_every_trip_count_and_size():
    model = dense_loop()
    compiled = treadle.compile(model)
    for trips, n in ((13, 1), (2, 7), (0, 3), (5, 0)):
        feeds = {"h0": rng(n).standard_normal((n, 4)).astype(np.float32),
                 "bias": rng(2).standard_normal(4).astype(np.float32),
                 "trips": np.array(trips, np.int64)}
        want = run_onnxruntime(model, feeds)
        got = compiled(**feeds)
        assert_close(got[0], want[0])
        assert got[2].shape == (trips, n, 4)
        if want[2].size:
            assert_close(got[2], want[2])


@pytest.mark.parametrize("n", [0, 1, 6, 13])
def test_a_trip_count_from_a_symbolic_dimension(n):
    model = sum_rows_loop()
    x = rng(n).integers(-50, 50, (n, 3)).astype(np.int64)
    assert_like_onnxruntime(model, {"x": x}, scanned=(1,))
    assert len(loop_nodes(model)) == 1


@pytest.mark.parametrize("limit, m", [(20.0, 3), (7.5, 1), (-1.0, 5), (1000.0, 2)])
def test_a_while_loop_stopped_at_run_time_scans_its_outputs(limit, m):
    model = while_loop()
    feeds = {"s0": np.full(m, 0.5, np.float32), "x": np.linspace(1, 2, m).astype(np.float32),
             "limit": np.array(limit, np.float32)}
    assert_like_onnxruntime(model, feeds, scanned=(1,))


def test_a_condition_computed_at_run_time_stops_a_counted_loop_with_scanned_outputs():
    model = while_loop(trips=4)
    for limit in (3.0, 100.0):
        feeds = {"s0": np.zeros(3, np.float32), "x": np.ones(3, np.float32),
                 "limit": np.array(limit, np.float32)}
        assert_like_onnxruntime(model, feeds, scanned=(1,))


@pytest.mark.parametrize("outer, inner", [(3, 2), (0, 4), (4, 0), (5, 7)])
def test_a_loop_inside_a_loop_body(outer, inner):
    feeds = {"x": np.array([1.0, 2.5], np.float32), "M": np.array(outer, np.int64),
             "K": np.array(inner, np.int64), "s0": np.array([0.5, -1.0], np.float32)}
    assert_like_onnxruntime(nested_loops(), feeds, scanned=(1,))


def test_treadle_check_compares_a_loop_counted_at_run_time():
    report = check(dense_loop(), {"trips": np.array(5, np.int64)}, dims={"n": 3})
    assert report.agrees, str(report)


def test_a_body_reshaping_by_a_shape_computed_outside_the_loop():
    """The shape is no constant of the model, but known when compiling: the body
    reads it as a constant, as the Reshape needs."""
    nodes = [helper.make_node("Reshape", ["s", "grid"], ["m"]),
             helper.make_node("ReduceSum", ["m", "last"], ["rows"], keepdims=1),
             helper.make_node("Add", ["m", "rows"], ["m_next"]),
             helper.make_node("Reshape", ["m_next", "flat"], ["s_next"]),
             helper.make_node("Identity", ["cond"], ["cond_next"])]
    loop_body = body(nodes, [tensor("i", [], INT64), tensor("cond", [], BOOL),
                             tensor("s", [6])],
                     [tensor("cond_next", [], BOOL), tensor("s_next", [6])])
    outer = [helper.make_node("Shape", ["g"], ["grid"]),
             helper.make_node("Loop", ["trips", "", "s0"], ["s_last"], name="grid_loop",
                              body=loop_body)]
    constants = {"last": np.array([1], np.int64), "flat": np.array([-1], np.int64)}
    model = make_model(outer, [tensor("g", [2, 3]), tensor("s0", [6]),
                               tensor("trips", [], INT64)],
                       [tensor("s_last", None)], constants, opset=17)
    feeds = {"g": np.zeros((2, 3), np.float32),
             "s0": np.linspace(-1, 1, 6).astype(np.float32), "trips": np.array(3, np.int64)}
    assert_like_onnxruntime(model, feeds)


def test_a_body_slicing_at_its_iteration_number_is_unrolled_per_trip_count():
    """Slice's bounds must be known when compiling: such a body is unrolled, and a trip
    count given in the call specialises the model (compiled per count)."""
    nodes = [helper.make_node("Add", ["i", "one"], ["end"]),
             helper.make_node("Unsqueeze", ["i", "axes"], ["start1"]),
             helper.make_node("Unsqueeze", ["end", "axes"], ["end1"]),
             helper.make_node("Slice", ["x", "start1", "end1"], ["piece"]),
             helper.make_node("Add", ["y", "piece"], ["y_next"]),
             helper.make_node("Identity", ["cond"], ["cond_next"]),
             helper.make_node("Identity", ["y_next"], ["y_scan"])]
    loop_body = body(nodes, [tensor("i", [], INT64), tensor("cond", [], BOOL),
                             tensor("y", [1])],
                     [tensor("cond_next", [], BOOL), tensor("y_next", [1]),
                      tensor("y_scan", [1])])
    node = helper.make_node("Loop", ["trips", "", "y0"], ["y_last", "ys"], name="slices",
                            body=loop_body)
    constants = {"one": np.array(1, np.int64), "axes": np.array([0], np.int64),
                 "x": np.arange(1, 6, dtype=np.float32)}
    model = make_model([node], [tensor("y0", [1]), tensor("trips", [], INT64)],
                       [tensor("y_last", None), tensor("ys", None)], constants, opset=17)
    for trips in (1, 4):
        feeds = {"y0": np.array([0.5], np.float32), "trips": np.array(trips, np.int64)}
        assert_like_onnxruntime(model, feeds)


def test_a_short_loop_known_when_compiling_is_unrolled_and_a_long_one_is_not():
    assert not loop_nodes(dense_loop(trips=3))
    long = dense_loop(trips=UNROLLED_TRIPS + 5)
    assert len(loop_nodes(long)) == 1
    feeds = {"h0": rng(3).standard_normal((2, 4)).astype(np.float32),
             "bias": rng(4).standard_normal(4).astype(np.float32)}
    assert_like_onnxruntime(long, feeds)


def test_the_loop_is_a_step_of_its_own():
    compiled = treadle.compile(dense_loop())
    hosted = [s for s in compiled.executable.steps if s.host is not None]
    assert [s.name for s in hosted] == ["dense_loop"]
    assert hosted[0].kernel is None


def test_a_state_changing_shape_names_the_node():
    nodes = [helper.make_node("Concat", ["s", "s"], ["s_next"], axis=0),
             helper.make_node("Identity", ["cond"], ["cond_next"])]
    loop_body = body(nodes, [tensor("i", [], INT64), tensor("cond", [], BOOL),
                             tensor("s", [None])],
                     [tensor("cond_next", [], BOOL), tensor("s_next", [None])])
    node = helper.make_node("Loop", ["trips", "", "s0"], ["s_last"], name="doubling",
                            body=loop_body)
    model = make_model([node], [tensor("s0", [2]), tensor("trips", [], INT64)],
                       [tensor("s_last", None)], opset=17)
    with pytest.raises(ShapeError, match=r"doubling.*state 0.*float32\[2\].*float32\[4\]"):
        treadle.compile(model)


def test_slices_whose_size_the_body_finds_in_the_data_are_refused():
    nodes = [helper.make_node("NonZero", ["s"], ["where"]),
             helper.make_node("Identity", ["s"], ["s_next"]),
             helper.make_node("Identity", ["cond"], ["cond_next"])]
    loop_body = body(nodes, [tensor("i", [], INT64), tensor("cond", [], BOOL),
                             tensor("s", [3])],
                     [tensor("cond_next", [], BOOL), tensor("s_next", [3]),
                      tensor("where", None, INT64)])
    node = helper.make_node("Loop", ["trips", "", "s0"], ["s_last", "wheres"],
                            name="ragged", body=loop_body)
    model = make_model([node], [tensor("s0", [3]), tensor("trips", [], INT64)],
                       [tensor("s_last", None), tensor("wheres", None, INT64)], opset=17)
    with pytest.raises(UnsupportedOpError, match="ragged.*scanned output 0.*in the data"):
        treadle.compile(model)


def test_orchestration_keeps_greedy_fusion_around_a_loop():
    model = dense_loop()
    feeds = {"h0": rng(5).standard_normal((3, 4)).astype(np.float32),
             "bias": rng(6).standard_normal(4).astype(np.float32),
             "trips": np.array(4, np.int64)}
    compiled = treadle.compile(model, orchestrate=True)
    for actual, expected in zip(compiled(**feeds), run_onnxruntime(model, feeds)):
        assert_close(actual, expected)


def test_saving_a_model_with_a_loop_counted_at_run_time_names_the_node(tmp_path):
    compiled = treadle.compile(while_loop())
    with pytest.raises(UnsupportedOpError, match="'while_loop' \\(Loop\\).*saved"):
        compiled.save(tmp_path / "model")
    assert not (tmp_path / "model").exists()


def test_the_cuda_target_refuses_a_loop_counted_at_run_time():
    with pytest.raises(UnsupportedOpError, match="'rows_loop'.*CUDA"):
        treadle.compile(sum_rows_loop(), target="cuda:sm_80")
