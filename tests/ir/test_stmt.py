"""Statements, functions and modules: each node checks its own fields on construction and
names the loop, buffer or variable at fault."""
import dataclasses

import pytest

from treadle.ir.dtypes import boolean, float16, float32, float32x8, index_type, int32
from treadle.ir.expr import Buffer, Const, Var, broadcast
from treadle.ir.mapping import repeat, spatial
from treadle.ir.stmt import (GPU_LOOP_KINDS, LOOP_KINDS, Accumulate, Assert, DeclBuffer,
                             Evaluate, For, ForTask, Function, If, Let, Module, Seq, Store,
                             fault_message)

N = Var("n")
A = Buffer("a", float32, (N, 7))
I = Var("i")


@pytest.mark.parametrize("kind", LOOP_KINDS)
def test_every_loop_kind_is_accepted(kind):
    loop = For(I, 13, Store(A, (I, 0), 0.0), kind)
    assert loop.kind == kind and loop.extent == Const(13, index_type)


def test_gpu_loop_kinds_are_loop_kinds():
    assert set(GPU_LOOP_KINDS) <= set(LOOP_KINDS)


def test_an_unknown_loop_kind_names_the_loop_and_the_known_kinds():
    with pytest.raises(ValueError, match=r"loop over i: unknown kind 'simd'; expected one of "
                                         r"\('serial', 'parallel'"):
        For(I, 8, Store(A, (I, 0), 0.0), "simd")


def test_a_loop_extent_may_be_symbolic():
    assert For(I, N * 2, Seq(())).extent == N * 2


def test_task_loop_needs_one_variable_per_task_dimension():
    mapping = spatial(3, 5)
    task = ForTask(mapping, 0, (I, Var("j")), Seq(()))
    assert task.worker == Const(0, index_type)
    with pytest.raises(ValueError, match=r"task mapping spatial\(3, 5\) has 2 dimensions but "
                                         r"1 loop variables were given"):
        ForTask(mapping, 0, (I,), Seq(()))
    with pytest.raises(ValueError, match="has 1 dimensions but 2"):
        ForTask(repeat(4), Var("w"), (I, Var("j")), Seq(()))


def test_if_needs_a_bool_condition():
    body = Store(A, (0, 0), 1.0)
    assert If(I < N, body).otherwise is None
    with pytest.raises(TypeError, match="if condition n is int64, not bool"):
        If(N, body)


def test_store_converts_python_numbers_to_the_buffers_dtype():
    h = Buffer("h", float16, (4,))
    store = Store(h, (2,), 1.5)
    assert store.value == Const(1.5, float16) and store.indices == (Const(2, index_type),)
    assert Store(Buffer("k", int32, (4,)), (0,), 3).value == Const(3, int32)


def test_store_of_another_dtype_must_be_cast():
    with pytest.raises(TypeError, match="store of float16 value into float32 buffer a; "
                                        "cast it explicitly"):
        Store(A, (0, 0), Var("h", float16))


def test_store_lanes():
    assert Store(A, (0, 0), 1.0).lanes == 1
    assert Store(A, (0, 0), broadcast(1.0, 4)).lanes == 4  # four consecutive elements
    regs = Buffer("regs", float32x8, (2,), "local")
    assert Store(regs, (1,), broadcast(0.0, 8)).lanes == 1  # one register of the array
    with pytest.raises(TypeError, match="store of int32x8 value into float32x8 buffer regs"):
        Store(regs, (0,), Var("q", int32.with_lanes(8)))


def test_accumulate_needs_exactly_the_accumulators_dtype():
    acc = Buffer("acc", float32, (), "local")
    assert Accumulate(acc, "sum", 2).value == Const(2.0, float32)
    with pytest.raises(TypeError, match="accumulate of float16 value into float32 "
                                        "accumulator acc; cast it explicitly"):
        Accumulate(acc, "max", Var("h", float16))


def test_let_binds_a_value_of_its_variables_dtype():
    x = Var("x", float32)
    assert Let(x, A[0, 0] * 2.0).var is x
    with pytest.raises(TypeError, match="let x: float32 bound to int64 value n"):
        Let(x, N)


def test_only_shared_and_local_buffers_are_declared():
    assert DeclBuffer(Buffer("s", float32, (7,), "shared")).buffer.scope == "shared"
    with pytest.raises(ValueError, match="buffer a: global buffers are function parameters"):
        DeclBuffer(A)


def test_fault_message_puts_the_reported_value_in_place():
    assert fault_message("index {value} past the end", 13) == "index 13 past the end"
    assert fault_message("no value {value}", None) == "no value {value}"
    check = Assert(I < N, "index {value} past the end", I)
    assert check.value is I and check.cond.dtype == boolean


def test_function_params_split_into_buffers_and_symbols():
    b = Buffer("b", float32, (N,))
    func = Function("f", (N, A, b), Evaluate(A[0, 0]), {"tag": 1})
    assert func.buffers == (A, b) and func.symbols == (N,)


def test_with_body_keeps_name_params_and_a_copy_of_the_attributes():
    func = Function("f", (N, A), Seq(()), {"tag": 1})
    body = Store(A, (0, 0), 2.0)
    changed = func.with_body(body)
    assert changed.name == "f" and changed.params == func.params and changed.body is body
    assert changed.attrs == {"tag": 1} and changed.attrs is not func.attrs
    assert Function("f", (N, A), body, {"other": 2}) == changed  # attrs are not identity


def test_nodes_are_immutable():
    loop = For(I, 8, Seq(()))
    with pytest.raises(dataclasses.FrozenInstanceError):
        loop.kind = "parallel"


def test_module_prints_its_functions_in_order():
    f = Function("first", (A,), Store(A, (0, 0), 1.0))
    g = Function("second", (A,), Store(A, (1, 0), 2.0))
    text = str(Module("m", (f, g)))
    assert text.index("def first(") < text.index("def second(")
    assert text == f"{f}\n\n{g}"
