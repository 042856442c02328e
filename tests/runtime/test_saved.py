"""A saved program as plain data: it comes back equal, floats JSON cannot spell included,
and data of any other shape is a ModelError naming the file, never another exception."""
import json
import math

import numpy as np
import pytest

import treadle
from treadle import ops
from treadle.errors import ModelError
from treadle.ir.dtypes import float16, float32, int64
from treadle.ir.expr import Broadcast, Buffer, Const, Load, Select, Var
from treadle.ir.mapping import custom
from treadle.ir.stmt import For, ForTask, Function, Seq, Store
from treadle.runtime.executor import Slot
from treadle.runtime.saved import (Program, SavedKernel, SavedLibrary, SavedStep, from_data,
                                   to_data)


def kernel() -> Function:
    """y[i] = x[i] < inf ? -0.0 : nan, and a float16x8 vector store: values JSON has no
    words for, a zero whose sign matters, and a vector dtype made on first use."""
    n, i = Var("n"), Var("i")
    x, y = Buffer("x", float32, (n,)), Buffer("y", float32, (n,))
    h = Buffer("h", float16, (8,))
    select = Select(Load(x, (i,)) < Const(math.inf, float32), Const(-0.0, float32),
                    Const(math.nan, float32))
    body = Seq((For(i, n, Store(y, (i,), select)),
                Store(h, (Const(0, int64),), Broadcast(Const(1.5, float16), 8))))
    return Function("odd_values", (x, y, h, n), body, {"origin": "test"})


def program(function: Function) -> Program:
    n = Var("n")  # equal to the kernel's, another object
    slots = (Slot("x", float32, (n,)), Slot("y", float32, (n,)), Slot("h", float16, (8,)),
             Slot("w", float32, (2, 3)))
    step = SavedStep("odd", function.name, (0, 1, 2), (1, 2), (Slot("scratch", int64, (n,)),))
    return Program("odd", slots, (0,), (1, 2), (SavedLibrary("k.so", (SavedKernel(function),)),),
                   (step,), {3: np.arange(6, dtype=np.float32).reshape(2, 3)})


def test_a_program_comes_back_equal_through_standard_json():
    original = program(kernel())
    data, arrays = to_data(original)
    text = json.dumps(data, allow_nan=False)  # no NaN or Infinity tokens
    loaded = from_data(json.loads(text), arrays)
    fields = ("name", "slots", "inputs", "outputs", "steps")
    assert [getattr(loaded, f) for f in fields] == [getattr(original, f) for f in fields]
    function = loaded.libraries[0].kernels[0].function
    # Const(nan) is unequal to itself, so the body is compared as text
    assert str(function) == str(kernel()) and function.attrs == {"origin": "test"}
    zero = function.body.stmts[0].body.value.then.value
    assert zero == 0 and math.copysign(1, zero) == -1
    assert str(function.body.stmts[1].value.dtype) == "float16x8"
    np.testing.assert_array_equal(loaded.constants[3], original.constants[3])


def test_equal_nodes_are_stored_once():
    data, _ = to_data(program(kernel()))
    entries = [json.dumps(node) for node in data["nodes"]]
    assert len(entries) == len(set(entries))
    assert sum(node[:2] == ["Var", "n"] for node in data["nodes"]) == 1


def test_a_custom_task_mapping_cannot_be_saved():
    i = Var("i")
    y = Buffer("y", float32, (4,))
    mapping = custom((4,), 1, 4, lambda w, j: (j,))
    function = Function("mapped", (y,), ForTask(mapping, 0, (i,), Store(y, (i,), 1.0)))
    with pytest.raises(ModelError, match="mapping.Custom cannot be saved"):
        to_data(program(function))


WRONG_VALUES = ("x", 3, -1.5, True, None, [], [3], {"#": 0}, {"dict": []})


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """The data of a saved matrix product, view and row reduction over a symbolic batch."""
    x = ops.input("x", "float32", ["batch", 6])
    w = ops.constant(np.random.default_rng(7).standard_normal((6, 4)).astype(np.float32), "w")
    y = ops.softmax(ops.reshape(ops.relu(ops.matmul(x, w)), [-1, 2, 2]))
    folder = tmp_path_factory.mktemp("saved") / "model"
    treadle.compile(ops.graph([x], [y], "dense_softmax")).save(folder)
    with np.load(folder / "constants.npz") as npz:
        return json.loads((folder / "program.json").read_text()), {k: npz[k] for k in npz.files}


def test_any_wrong_field_is_a_model_error_or_still_a_program(saved):
    """Every field of one node of each class, and every field of the program, replaced by
    values of every JSON kind."""
    data, arrays = saved
    first = {}
    for index, node in enumerate(data["nodes"]):
        first.setdefault(node[0], index)
    cases = [(("nodes", index, field), value) for index in first.values()
             for field in range(len(data["nodes"][index])) for value in WRONG_VALUES]
    cases += [((name,), value) for name in data for value in WRONG_VALUES]
    for path, value in cases:
        damaged = json.loads(json.dumps(data))
        *parents, last = path
        target = damaged
        for key in parents:
            target = target[key]
        target[last] = value
        try:
            from_data(damaged, arrays, "program.json", "constants.npz")
        except ModelError as err:
            assert str(err).startswith(("program.json: ", "constants.npz: ")), (path, err)


def test_arrays_of_the_wrong_dtype_or_shape_name_the_arrays_file(saved):
    data, arrays = saved
    key = next(iter(arrays))
    with pytest.raises(ModelError, match="^constants.npz: constant .* is float64"):
        from_data(data, {**arrays, key: arrays[key].astype(np.float64)}, "program.json",
                  "constants.npz")
