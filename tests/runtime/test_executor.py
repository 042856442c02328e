"""The executor: memory plan, views, argument checks and concurrent calls."""
import threading

import numpy as np
import pytest

from tests.harness import assert_close, random_array
from treadle.compiler import compile_graph
from treadle.config import override
from treadle.errors import ArgumentError, DTypeError, KernelError, ShapeError
from treadle.graph.graph import Graph
from treadle.graph.operator import apply
from treadle.graph.tensor import Tensor, constant
from treadle.runtime.executor import _first_fit, data_address


def chain(length: int):
    """Softmax and Add alternately: each Softmax starts a kernel, each Add fuses into it."""
    x = Tensor("x", "float32", ["n", 64])
    t = x
    for k in range(length):
        t = apply("Add", [t, x], name=f"op{k}")[0] if k % 2 else \
            apply("Softmax", [t], name=f"op{k}")[0]
    return compile_graph(Graph.from_outputs([x], [t]), optimize_graph=False)


def reference_chain(value, length):
    t = value
    for k in range(length):
        if k % 2:
            t = t + value
        else:
            e = np.exp(t - t.max(-1, keepdims=True))
            t = e / e.sum(-1, keepdims=True)
    return t


def test_chain_reuses_arena_memory():
    model = chain(8)
    value = random_array((5, 64), seed=1)
    assert_close(model(value)[0], reference_chain(value, 8))
    plan = next(iter(model._plans.values()))
    one_tensor = 5 * 64 * 4
    # Three intermediates between four kernels live one step each, as does each kernel's
    # workspace of exponentials (and its row maxima and sums, a line each): three tensors'
    # worth suffice, where eight would without reuse.
    assert len(model.steps) == 4
    assert plan.arena_bytes <= 3 * (one_tensor + 64)


def test_profile_times_every_kernel():
    model = chain(6)
    times = model.profile(random_array((5, 64), seed=1))
    assert [name for name, _ in times] == ["op0", "op2", "op4"]
    assert all(isinstance(t, float) and t > 0 for _, t in times)


def test_step_runner_and_python_loop_agree():
    """One C call runs the kernels (views resolved, workspaces and symbols passed, a view
    returned as an output copied); the same model stepped from Python gives the same
    arrays, and both match numpy."""
    x = Tensor("x", "float32", ["n", 64])
    rows = Tensor("rows", "float32", [13, 64])
    w = random_array((64, 300), seed=2)
    soft = apply("Softmax", [x], name="soft")[0]
    flat = apply("Reshape", [soft, constant(np.array([-1], np.int64))], name="flat")[0]
    dense = apply("MatMul", [rows, constant(w)], name="dense")[0]  # a packing workspace
    model = compile_graph(Graph.from_outputs([x, rows], [flat, dense]))
    assert model._table is not None
    assert any(step.workspaces for step in model.steps)
    r = random_array((13, 64), seed=3)
    for n in (1, 7, 31):
        value = random_array((n, 64), seed=n)
        by_runner = model(value, r)
        table, model._table = model._table, None
        by_python = model(value, r)
        model._table = table
        for a, b in zip(by_runner, by_python):
            np.testing.assert_array_equal(a, b)
        e = np.exp(value - value.max(-1, keepdims=True))
        assert_close(by_runner[0], (e / e.sum(-1, keepdims=True)).reshape(-1))
        assert_close(by_runner[1], r @ w, reduction=64)


def test_first_fit_never_overlaps_live_tensors():
    rng = np.random.default_rng(0)
    intervals = []
    for k in range(60):
        start = int(rng.integers(0, 20))
        intervals.append((k, start, start + int(rng.integers(0, 5)), int(rng.integers(1, 5000))))
    offsets, total = _first_fit(intervals)
    for a in intervals:
        for b in intervals:
            if a[0] < b[0] and not (a[2] < b[1] or b[2] < a[1]):
                a0, b0 = offsets[a[0]], offsets[b[0]]
                assert a0 + a[3] <= b0 or b0 + b[3] <= a0
    assert total >= max(i[3] for i in intervals)


def test_symbolic_sizes_get_their_own_plans():
    model = chain(3)
    for n in (1, 7, 61):
        value = random_array((n, 64), seed=n)
        assert_close(model(value)[0], reference_chain(value, 3))
    assert len(model._plans) == 3


def test_plans_are_kept_for_the_most_recently_used_sizes_only():
    model = chain(3)
    with override(plan_cache=4):
        hot = random_array((5, 64), seed=5)
        model(hot)
        kept = model._plans[(5,)]
        for n in range(6, 30):  # a size called between every new one stays cached
            value = random_array((n, 64), seed=n)
            assert_close(model(value)[0], reference_chain(value, 3))
            model(hot)
            assert len(model._plans) <= 4
        assert model._plans[(5,)] is kept
        assert list(model._plans)[-2:] == [(29,), (5,)]
        assert_close(model(random_array((6, 64), seed=6))[0],  # evicted, planned again
                     reference_chain(random_array((6, 64), seed=6), 3))


def test_checked_shapes_are_kept_and_a_mismatch_still_raises():
    """Shapes seen before bind their symbols from a table; a mismatch between inputs is
    checked whatever the table holds, and the table keeps plan_cache entries at most."""
    x, y = Tensor("x", "float32", ["n", 64]), Tensor("y", "float32", ["n", 64])
    model = compile_graph(Graph.from_outputs([x, y], [apply("Add", [x, y])[0]]))
    with override(plan_cache=3):
        for n in (5, 7, 5, 0, 11, 13, 5):
            a, b = random_array((n, 64), seed=n), random_array((n, 64), seed=n + 1)
            assert_close(model(a, b)[0], a + b)
            with pytest.raises(ShapeError, match="'y'"):
                model(a, random_array((n + 1, 64), seed=n))
            assert len(model._bound) <= 3


def test_outputs_are_owned_by_the_caller():
    model = chain(2)
    a = model(np.ones((2, 64), np.float32))[0]
    b = model(np.full((2, 64), 2, np.float32))[0]
    assert not np.shares_memory(a, b)
    assert_close(a, np.full((2, 64), 1 + 1 / 64, np.float32))  # softmax(1) + 1


def test_input_returned_as_output_is_copied():
    x = Tensor("x", "float32", [3])
    model = compile_graph(Graph.from_outputs([x], [x]))
    value = np.arange(3, dtype=np.float32)
    out = model(value)[0]
    assert not np.shares_memory(out, value)


def test_concurrent_calls_from_threads():
    model = chain(6)
    errors = []

    def work(seed):
        value = random_array((seed + 1, 64), seed=seed)
        for _ in range(20):
            if not np.allclose(model(value)[0], reference_chain(value, 6), rtol=1e-5):
                errors.append(seed)
    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_bad_inputs_name_the_tensor():
    model = chain(2)
    with pytest.raises(DTypeError, match="'x'"):
        model(np.ones((2, 64), np.float64))
    with pytest.raises(ShapeError, match="'x'"):
        model(np.ones((2, 63), np.float32))
    with pytest.raises(ShapeError, match="'x'"):
        model(np.ones(64, np.float32))
    with pytest.raises(ArgumentError, match="1 inputs"):
        model()
    with pytest.raises(ArgumentError, match="numpy array"):
        model([[1.0] * 64])


def test_inputs_by_name():
    model = chain(2)
    value = random_array((3, 64), seed=9)
    assert_close(model(x=value)[0], reference_chain(value, 2))
    with pytest.raises(ArgumentError, match="unknown"):
        model(y=value)


def test_data_address_matches_numpys():
    base = np.arange(60, dtype=np.float32).reshape(6, 10)
    arrays = [base, base[2:], base[:, 3:], base.T, base[1:2, 4:5], np.empty(0, np.int8),
              np.full((), 3.0), np.frombuffer(bytearray(16), np.int32)]
    for array in arrays:
        assert data_address(array) == array.ctypes.data


def test_steps_that_read_before_a_write_are_found():
    from treadle.runtime.executor import Executable
    x = Tensor("x", "float32", [4, 8])
    w = constant(random_array((8, 8), seed=1), "w")
    hidden = apply("Relu", [apply("MatMul", [x, w])[0]])[0]
    y = apply("MatMul", [hidden, w])[0]  # two kernels
    good = compile_graph(Graph.from_outputs([x], [y]), optimize_graph=False)
    assert good.reads_before_writes() == []
    steps = list(reversed(good.steps))
    bad = Executable(good.slots, good.inputs, good.outputs, good.constants, steps, good.runner)
    assert bad.reads_before_writes() and all(
        step == steps[0].name for step, _ in bad.reads_before_writes())
    # Per-step trace: every kernel's written tensors, as they were after it ran.
    value = random_array((4, 8), seed=2)
    trace = good.trace(value)
    assert [step.name for step, _ in trace] == [s.name for s in good.steps if s.kernel]
    final = trace[-1][1][good.outputs[0]]
    assert_close(final, np.maximum(value @ w.data, 0) @ w.data, reduction=64)


def test_bfloat16_input_as_raw_bits_or_ml_dtypes():
    """treadle's bfloat16 arrays are raw uint16 bits; ml_dtypes' bfloat16 arrays (what
    ONNX's tools make) are taken as the same bits, and anything else is refused."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = Tensor("x", "bfloat16", [5])
    model = compile_graph(Graph.from_outputs([x], apply("Add", [x, x])))
    values = np.array([1.5, -2.0, 0.0, 3.25, 7.0], ml_dtypes.bfloat16)
    for given in (values, values.view(np.uint16)):
        assert np.array_equal(model(given)[0].view(ml_dtypes.bfloat16), values * 2)
    with pytest.raises(DTypeError, match="'x'"):
        model(values.astype(np.float32))


def test_a_failed_check_over_symbolic_sizes_gives_their_values():
    """A kernel's check states its condition in the sizes' names; the error adds what they
    are in this call, by both the step runner and the step-by-step loop (profile)."""
    a, b = Tensor("a", "float32", ["A", 4]), Tensor("b", "float32", ["B", 4])
    program = compile_graph(Graph.from_outputs([a, b], [apply("Add", [a, b], name="add")[0]]))
    assert program(random_array((3, 4)), random_array((1, 4)))[0].shape == (3, 4)
    for run in (program, program.profile):
        with pytest.raises(KernelError, match=r"node 'add'.*\(B vs A\); in this call A = 3, "
                                              r"B = 2$"):
            run(np.ones((3, 4), np.float32), np.ones((2, 4), np.float32))
