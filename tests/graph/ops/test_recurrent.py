"""LSTM, GRU and RNN against ONNX Runtime: every direction, both layouts, the optional
inputs (sequence lengths, initial states, peepholes), clip, GRU's linear_before_reset,
activations other than the defaults, odd and prime sizes, a symbolic sequence length, and
with and without the hoisted input projection."""
from __future__ import annotations

import copy

import numpy as np
import pytest
from onnx import TensorProto, helper

import treadle
from tests.frontend.onnx_models import make_model, tensor
from tests.harness import assert_close, random_array, rng, run_onnxruntime
from treadle.compiler import compile_graph
from treadle.config import override
from treadle.errors import KernelError, TreadleError
from treadle.frontend.onnx import from_onnx
from treadle.graph.ops.recurrent import CELLS
from treadle.ir.functor import evaluate
from treadle.runtime.interpret import interpret

pytest.importorskip("onnxruntime")

OUTPUTS = {"LSTM": ("Y", "Y_h", "Y_c"), "GRU": ("Y", "Y_h"), "RNN": ("Y", "Y_h")}
OPTIONAL = ("sequence_lens", "initial_h", "initial_c", "P")


def recurrent_case(op, seq=13, batch=3, features=5, hidden=7, direction="forward", layout=0,
                   given=(), seq_dim=None, seed=0, **attrs):
    """A model of one ``op`` node over x, with its weights as initializers and the inputs
    named in ``given`` (of OPTIONAL) as graph inputs; and feeds for it."""
    cell = CELLS[op]
    dirs = 2 if direction == "bidirectional" else 1
    rows = cell.gates * hidden
    gen = rng(seed)
    weights = {"W": gen.uniform(-0.5, 0.5, (dirs, rows, features)).astype(np.float32),
               "R": gen.uniform(-0.5, 0.5, (dirs, rows, hidden)).astype(np.float32),
               "B": gen.uniform(-0.5, 0.5, (dirs, 2 * rows)).astype(np.float32)}
    x_shape = [batch, seq, features] if layout else [seq, batch, features]
    state = [batch, dirs, hidden] if layout else [dirs, batch, hidden]
    feeds = {"x": random_array(x_shape, seed=seed + 1)}
    shapes = {"initial_h": state, "initial_c": state, "P": [dirs, 3 * hidden]}
    for k, name in enumerate(n for n in given if n != "sequence_lens"):
        feeds[name] = random_array(shapes[name], seed=seed + 2 + k)
    if "sequence_lens" in given:
        feeds["sequence_lens"] = gen.integers(1, seq + 1, batch).astype(np.int32)
        feeds["sequence_lens"][0] = seq
    names = ["x", "W", "R", "B"] + [n if n in given else "" for n in OPTIONAL]
    names = names[:cell.inputs]
    while not names[-1]:
        names.pop()
    node = helper.make_node(op, names, list(OUTPUTS[op]), name="layer", hidden_size=hidden,
                            direction=direction, layout=layout, **attrs)
    x_dims = list(x_shape)
    if seq_dim is not None:
        x_dims[1 if layout else 0] = seq_dim
    inputs = [tensor("x", x_dims)] + [
        tensor(n, list(feeds[n].shape), TensorProto.INT32 if n == "sequence_lens"
               else TensorProto.FLOAT) for n in given]
    model = make_model([node], inputs, [tensor(n, None) for n in OUTPUTS[op]], weights)
    return model, feeds


def reference(model, feeds):
    """ONNX Runtime's outputs; it runs layout 1 (batch first) as the same node in layout 0
    on transposed inputs, whose outputs are transposed back."""
    node = model.graph.node[0]
    layout = next((a.i for a in node.attribute if a.name == "layout"), 0)
    if not layout:
        return run_onnxruntime(model, feeds)
    first = copy.deepcopy(model)
    next(a for a in first.graph.node[0].attribute if a.name == "layout").i = 0
    swapped = {"x": (1, 0, 2), "initial_h": (1, 0, 2), "initial_c": (1, 0, 2)}
    feeds = {k: v.transpose(swapped[k]) if k in swapped else v for k, v in feeds.items()}
    for info in first.graph.input:
        if info.name in swapped:
            dims = info.type.tensor_type.shape.dim
            batch, seq = copy.deepcopy(dims[0]), copy.deepcopy(dims[1])
            dims[0].CopyFrom(seq)
            dims[1].CopyFrom(batch)
    outputs = run_onnxruntime(first, feeds)
    back = {4: (2, 0, 1, 3), 3: (1, 0, 2)}
    return [y.transpose(back[y.ndim]) for y in outputs]


def assert_matches_onnxruntime(compiled, model, feeds, context=""):
    got = compiled(**feeds)
    names = [n for n in model.graph.node[0].output if n]
    for name, actual, expected in zip(names, got, reference(model, feeds)):
        assert_close(actual, expected, context=f"{name} {context}")


# Each direction and each layout by default, every pairing of them with -m slow.
DEFAULT = {("forward", 0), ("reverse", 1), ("bidirectional", 0)}
CASES = [pytest.param(op, direction, layout,
                      marks=() if (direction, layout) in DEFAULT else pytest.mark.slow)
         for op in CELLS for direction in ("forward", "reverse", "bidirectional")
         for layout in (0, 1)]


@pytest.mark.parametrize("op, direction, layout", CASES)
def test_matches_onnxruntime(op, direction, layout):
    model, feeds = recurrent_case(op, direction=direction, layout=layout)
    assert_matches_onnxruntime(treadle.compile(model), model, feeds)


@pytest.mark.parametrize("op, direction, layout", CASES)
def test_given_states_and_lengths(op, direction, layout):
    given = ("sequence_lens", "initial_h") + (("initial_c", "P") if op == "LSTM" else ())
    model, feeds = recurrent_case(op, direction=direction, layout=layout, given=given, seed=3)
    assert_matches_onnxruntime(treadle.compile(model), model, feeds)


@pytest.mark.parametrize("op", list(CELLS))
@pytest.mark.parametrize("seq, batch, features, hidden", [
    (1, 1, 1, 1), pytest.param(1, 3, 5, 7, marks=pytest.mark.slow), (5, 2, 17, 11),
    pytest.param(2, 4, 3, 32, marks=pytest.mark.slow)])
def test_sizes(op, seq, batch, features, hidden):
    model, feeds = recurrent_case(op, seq, batch, features, hidden, "bidirectional", seed=5)
    assert_matches_onnxruntime(treadle.compile(model), model, feeds)


@pytest.mark.parametrize("op", list(CELLS))
@pytest.mark.parametrize("threads, direction", [(2, "forward"), (4, "bidirectional")])
def test_fewer_lines_than_threads_share_each_step(op, threads, direction):
    """One utterance: each step's products go to the threads by blocks of gate rows (here
    several blocks and a partial one), the lines one after the other."""
    with override(num_threads=threads):
        model, feeds = recurrent_case(op, seq=6, batch=1, features=9, hidden=70,
                                      direction=direction, given=("initial_h",), seed=11)
        assert_matches_onnxruntime(treadle.compile(model), model, feeds)


@pytest.mark.parametrize("op", list(CELLS))
def test_clip(op):
    model, feeds = recurrent_case(op, direction="bidirectional", clip=0.4,
                                  given=("initial_h",), seed=7)
    assert_matches_onnxruntime(treadle.compile(model), model, feeds)


@pytest.mark.parametrize("linear_before_reset", [0, 1])
@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_gru_linear_before_reset(linear_before_reset, direction):
    model, feeds = recurrent_case("GRU", direction=direction, given=("initial_h",), seed=9,
                                  linear_before_reset=linear_before_reset)
    assert_matches_onnxruntime(treadle.compile(model), model, feeds)


ACTIVATIONS = {
    "LSTM": dict(activations=["HardSigmoid", "LeakyRelu", "Softsign"] * 2,
                 activation_alpha=[0.3, 0.1, 0.25, 0.05], activation_beta=[0.4, 0.6]),
    "GRU": dict(activations=["Sigmoid", "Relu", "HardSigmoid", "Tanh"],
                activation_alpha=[0.15], activation_beta=[0.55]),
    "RNN": dict(activations=["Relu", "Softplus"]),
}


@pytest.mark.parametrize("op", list(CELLS))
def test_other_activations(op):
    model, feeds = recurrent_case(op, direction="bidirectional", seed=11, **ACTIVATIONS[op])
    assert_matches_onnxruntime(treadle.compile(model), model, feeds)


@pytest.mark.parametrize("op", list(CELLS))
@pytest.mark.parametrize("layout", [0, 1])
def test_symbolic_sequence_compiles_once(op, layout):
    given = ("sequence_lens", "initial_h")
    model, _ = recurrent_case(op, direction="bidirectional", layout=layout, given=given,
                              seq_dim="seq")
    compiled = treadle.compile(model)
    for seq in (13, 4):
        _, feeds = recurrent_case(op, seq=seq, direction="bidirectional", layout=layout,
                                  given=given, seed=seq)
        assert_matches_onnxruntime(compiled, model, feeds, f"seq {seq}")


@pytest.mark.parametrize("op", list(CELLS))
def test_without_the_hoisted_projection(op):
    """The ONNX operator's own kernel, which computes X·Wᵀ in its steps (as constant
    folding runs it)."""
    given = ("sequence_lens", "initial_h") + (("initial_c", "P") if op == "LSTM" else ())
    model, feeds = recurrent_case(op, direction="bidirectional", given=given, seed=13)
    run = compile_graph(from_onnx(model), optimize_graph=False)
    got = run(*[feeds[i.name] for i in model.graph.input])
    for actual, expected in zip(got, run_onnxruntime(model, feeds)):
        assert_close(actual, expected)


@pytest.mark.parametrize("op", list(CELLS))
def test_only_some_outputs(op):
    model, feeds = recurrent_case(op, direction="reverse", seed=17)
    node = model.graph.node[0]
    node.output[0] = ""
    del model.graph.output[0]
    assert_matches_onnxruntime(treadle.compile(model), model, feeds)


@pytest.mark.parametrize("op", list(CELLS))
def test_empty_sequences(op):
    """A batch row of length 0 has zero final states, as ONNX Runtime gives them; so does
    a sequence of length 0 (where ONNX Runtime returns uninitialised memory)."""
    given = ("sequence_lens", "initial_h") + (("initial_c",) if op == "LSTM" else ())
    model, feeds = recurrent_case(op, seq=5, direction="bidirectional", given=given, seed=25)
    feeds["sequence_lens"][1] = 0
    assert_matches_onnxruntime(treadle.compile(model), model, feeds)
    model, feeds = recurrent_case(op, seq=0, direction="bidirectional", given=given[1:])
    y, *states = treadle.compile(model)(**feeds)
    assert y.shape == (0, 2, 3, 7)
    for state in states:
        np.testing.assert_array_equal(state, np.zeros((2, 3, 7), np.float32))


def test_a_length_past_the_sequence_fails_in_the_call():
    model, feeds = recurrent_case("GRU", given=("sequence_lens",))
    compiled = treadle.compile(model)
    feeds["sequence_lens"][1] = 14
    with pytest.raises(KernelError, match="layer.*sequence_lens holds 14"):
        compiled(**feeds)


@pytest.mark.parametrize("attrs, message", [
    (dict(direction="sideways"), "direction must be one of"),
    (dict(activations=["Sigmoid"]), "activations must list 2 function"),
    (dict(activations=["Sigmoid", "Cube"]), "activation 'Cube' is not supported"),
])
def test_bad_attributes_name_the_node(attrs, message):
    model, _ = recurrent_case("GRU", **attrs)
    with pytest.raises(TreadleError, match=f"layer.*{message}"):
        treadle.compile(model)


@pytest.mark.parametrize("op", list(CELLS))
def test_the_cuda_kernel_in_the_simulator(op):
    model, feeds = recurrent_case(op, seq=4, batch=2, features=3, hidden=5,
                                  direction="bidirectional",
                                  given=("sequence_lens", "initial_h"), seed=19)
    executable = treadle.compile(model, target="cuda:sm_90").executable
    got = executable.simulate(*[feeds[i.name] for i in model.graph.input])
    for actual, expected in zip(got, reference(model, feeds)):
        assert_close(actual, expected)


@pytest.mark.parametrize("op", list(CELLS))
def test_the_kernel_in_the_interpreter(op):
    """The ONNX form's kernel, run by the numpy interpreter of the IR (which follows its
    meaning, not the C backend's lowering)."""
    model, feeds = recurrent_case(op, seq=4, batch=2, features=3, hidden=5,
                                  direction="bidirectional",
                                  given=("sequence_lens", "initial_h"), seed=23)
    node = from_onnx(model).nodes[-1]
    kernel = node.opdef.kernel(node, "layer")
    inputs = [node.inputs[k].data if node.inputs[k].is_constant else feeds[node.inputs[k].name]
              for k in kernel.inputs]
    outputs = [np.zeros(t.shape, np.float32) for t in node.outputs]
    workspaces = [np.zeros([evaluate(d, {}) for d in w.shape], np.float32)
                  for w in kernel.workspaces]
    interpret(kernel.function, *inputs, *outputs, *workspaces)
    for actual, expected in zip(outputs, reference(model, feeds)):
        assert_close(actual, expected)
