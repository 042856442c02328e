"""Errors point at the user's source: unsupported Python is a LangError naming this file and
the line at fault (marked below with a comment ``# <- name``), and bad calls name the
parameter."""
import re
from pathlib import Path

import numpy as np
import pytest

from tests.harness import assert_close, random_array
from treadle import lang
from treadle.errors import ArgumentError, DTypeError, LangError, ShapeError
from treadle.lang import boolean, f32, i32

N = lang.symbols("N")
SOURCE = Path(__file__).read_text().splitlines()


def line_of(mark: str) -> int:
    """The line of this file that ends with the comment ``# <- mark``."""
    (line,) = [n for n, text in enumerate(SOURCE, 1) if text.endswith(f"# <- {mark}")]
    return line


def check(info, mark: str, message: str) -> None:
    text = str(info.value)
    assert text.startswith(f"{__file__}:{line_of(mark)}: "), text
    assert re.search(message, text), text


def test_while_loop():
    with pytest.raises(LangError) as info:
        @lang.kernel
        def spin(x: f32[N]):
            while True:  # <- while
                x[0] = 1.0
    check(info, "while", "unsupported syntax.*while loop")


def test_try_statement():
    with pytest.raises(LangError) as info:
        @lang.kernel
        def guarded(x: f32[N]):
            for i in range(N):
                try:  # <- try
                    x[i] = 1.0
                except ValueError:
                    pass
    check(info, "try", "unsupported syntax.*try statement")


def test_lambda():
    with pytest.raises(LangError) as info:
        @lang.kernel
        def anonymous(x: f32[N]):
            for i in range(N):
                x[i] = (lambda v: v * 2)(x[i])  # <- lambda
    check(info, "lambda", "unsupported syntax.*lambda")


def test_list_comprehension():
    with pytest.raises(LangError) as info:
        @lang.kernel
        def listed(x: f32[N]):
            values = [x[i] for i in range(3)]  # <- comprehension
            x[0] = values[0]
    check(info, "comprehension", "list comprehension.*static_range")


def test_return_from_a_kernel():
    with pytest.raises(LangError) as info:
        @lang.kernel
        def returns(x: f32[N]):
            return x[0]  # <- return
    check(info, "return", "unsupported syntax.*return")


def test_unknown_name():
    with pytest.raises(LangError) as info:
        @lang.kernel
        def early(x: f32[N]):
            for i in range(N):
                x[i] = later  # <- unknown
    later = 1.0  # a closure variable assigned after the kernel is parsed
    check(info, "unknown", "unknown name 'later'")


def test_wrong_index_count_in_a_load():
    with pytest.raises(LangError) as info:
        @lang.kernel
        def too_many(x: f32[N], y: f32[N]):
            for i in range(N):
                y[i] = x[i, 0]  # <- load
    check(info, "load", r"x has rank 1 \(shape \[N\]\) but is indexed with 2")


def test_wrong_index_count_in_a_store():
    with pytest.raises(LangError) as info:
        @lang.kernel
        def too_few(x: f32[N, N]):
            for i in range(N):
                x[i] = 0.0  # <- store
    check(info, "store", "x has rank 2 .* indexed with 1")


def test_slice():
    with pytest.raises(LangError) as info:
        @lang.kernel
        def sliced(x: f32[N], y: f32[N]):
            y[0] = x[1:3]  # <- slice
    check(info, "slice", "slice")


def test_variable_used_after_its_block():
    with pytest.raises(LangError) as info:
        @lang.kernel
        def scoped(x: f32[N]):
            if N > 1:
                first = x[0]
            x[1] = first  # <- scope
    check(info, "scope", "'first' is not defined here.*block-scoped")


def test_loop_variable_is_read_only():
    with pytest.raises(LangError) as info:
        @lang.kernel
        def rebinds(x: f32[N]):
            for i in range(N):
                i = i + 1  # <- loop variable
                x[i] = 0.0
    check(info, "loop variable", "cannot assign to 'i'")


def test_storing_a_wider_dtype():
    with pytest.raises(LangError) as info:
        @lang.kernel
        def narrows(x: f32[N]):
            for i in range(N):
                x[i] = lang.f64(x[i]) * 2.0  # <- dtype
    check(info, "dtype", "float64 value into float32")


def test_run_time_if_on_a_number():
    with pytest.raises(LangError) as info:
        @lang.kernel
        def truthy(x: f32[N]):
            for i in range(N):
                if i:  # <- if
                    x[i] = 0.0
    check(info, "if", "if condition must be a bool")


def test_missing_annotation():
    with pytest.raises(LangError) as info:
        @lang.kernel
        def bare(x):  # <- annotation
            pass
    check(info, "annotation", "parameter 'x' needs a type")


def test_symbol_outside_every_shape():
    other = lang.symbols("other")
    with pytest.raises(LangError) as info:
        @lang.kernel
        def stray(x: f32[N]):
            for i in range(other):  # <- symbol
                x[i] = 0.0
    check(info, "symbol", "symbol other, which is not a parameter")


def test_error_inside_an_inline_helper_points_at_the_helper():
    @lang.inline
    def helper(x):
        while True:  # <- helper
            pass

    with pytest.raises(LangError) as info:
        @lang.kernel
        def calls(x: f32[N]):
            helper(x)
    check(info, "helper", "while loop")


@lang.inline
def endless(x, i):
    return endless(x, i) + 1.0  # <- recursion


@lang.inline
def ping(x, i):
    return pong(x, i)


@lang.inline
def pong(x, i):
    return ping(x, i)  # <- mutual


def test_a_recursive_inline_helper_points_at_the_recursive_call():
    with pytest.raises(LangError) as info:
        @lang.kernel
        def recurses(x: f32[N]):
            for i in range(N):
                x[i] = endless(x, i)
    check(info, "recursion", r"helper endless is called 16 helper calls deep.*"
                             "must end on a condition known")


def test_mutually_recursive_inline_helpers_name_both():
    with pytest.raises(LangError) as info:
        @lang.kernel
        def bounces(x: f32[N]):
            for i in range(N):
                x[i] = ping(x, i)
    check(info, "mutual", r"helper ping is called 16 .*inside ping, pong")


@lang.kernel
def scale(x: f32[N], y: f32[N], alpha: f32):
    for i in range(N):
        y[i] = x[i] * alpha


def test_call_with_a_wrong_dtype_names_the_parameter():
    with pytest.raises(DTypeError, match="'y'.*float32.*float64"):
        scale(np.ones(3, np.float32), np.ones(3, np.float64), 2.0)


def test_call_with_a_wrong_shape_names_the_parameter_and_symbol():
    with pytest.raises(ShapeError, match=r"'y'.*\[N\].*N = 3 from argument 'x'"):
        scale(np.ones(3, np.float32), np.ones(4, np.float32), 2.0)


def test_call_with_a_wrong_rank_names_the_parameter():
    with pytest.raises(ShapeError, match="'x'.*rank 1"):
        scale(np.ones((3, 1), np.float32), np.ones(3, np.float32), 2.0)


def test_call_with_a_wrong_argument_count_lists_the_parameters():
    with pytest.raises(ArgumentError, match=r"takes 3 arguments \(x, y, alpha\), got 2"):
        scale(np.ones(3, np.float32), np.ones(3, np.float32))


def test_call_with_a_list_names_the_parameter():
    with pytest.raises(ArgumentError, match="'x'.*numpy array or a torch tensor"):
        scale([1.0, 2.0], np.ones(2, np.float32), 2.0)


def test_a_numpy_function_on_kernel_values_names_treadles():
    with pytest.raises(LangError) as info:
        @lang.kernel
        def exponent(x: f32[N]):
            for i in range(N):
                x[i] = np.exp(x[i])  # <- numpy
    check(info, "numpy", r"numpy's exp computes on arrays .* \(treadle\.lang\.exp\)")


def test_indexing_a_scalar_parameter():
    with pytest.raises(LangError) as info:
        @lang.kernel
        def scaled(x: f32[N], alpha: f32):
            for i in range(N):
                x[i] = alpha[0]  # <- scalar
    check(info, "scalar", "alpha is a scalar, not a tensor")


def test_a_store_the_loops_take_past_a_static_extent():
    with pytest.raises(LangError) as info:
        @lang.kernel
        def overrun(x: f32[3, 4]):
            for i in range(4):
                x[i, 0] = 1.0  # <- overrun
    check(info, "overrun", r"index 0 of x runs over 0\.\.3, outside its extent 3")


def test_a_guarded_or_symbolic_store_is_left_to_the_kernel():
    """The same store under an if that keeps it inside, or over a symbolic size, compiles
    and writes only inside."""
    @lang.kernel
    def guarded(x: f32[3, 4]):
        for i in range(4):
            if i < 3:
                x[i, 0] = 2.0

    @lang.kernel
    def symbolic(y: f32[N]):
        for i in range(N):
            y[i] = 3.0
    x, y = np.zeros((3, 4), np.float32), np.zeros(5, np.float32)
    guarded(x)
    symbolic(y)
    np.testing.assert_array_equal(x[:, 0], 2.0)
    np.testing.assert_array_equal(x[:, 1:], 0.0)
    np.testing.assert_array_equal(y, 3.0)


def test_keyword_arguments_bind_by_parameter_name():
    x, y = random_array(7, seed=1), np.zeros(7, np.float32)
    scale(x, y, alpha=3.0)
    assert_close(y, x * np.float32(3.0))
    scale(alpha=np.float32(-2), y=y, x=x)
    assert_close(y, x * np.float32(-2.0))


@pytest.mark.parametrize("call, message", [
    (lambda x, y: scale(x, y, 2.0, alpha=1.0), "'alpha' is given twice"),
    (lambda x, y: scale(x, y, beta=1.0), "no parameter or size symbol 'beta'.*x, y, alpha"),
    (lambda x, y: scale(x, alpha=1.0), r"takes 3 arguments \(x, y, alpha\), got 2: missing y"),
], ids=["duplicate", "unknown", "missing"])
def test_bad_keyword_arguments_are_named(call, message):
    with pytest.raises(ArgumentError, match=message):
        call(np.ones(3, np.float32), np.ones(3, np.float32))


@lang.kernel
def fill(y: f32[N], value: f32, count: i32, negate: boolean):
    for i in range(N):
        y[i] = f32(count) * (-value if negate else value)


def test_scalars_of_the_right_kind_are_accepted():
    y = np.zeros(5, np.float32)
    for value, count, negate in [(2, 3, True), (np.float64(0.5), np.int64(4), np.bool_(False)),
                                 (np.float32(1.5), np.uint8(2), False)]:
        fill(y, value, count, negate)
        expected = np.float32(count) * np.float32(-value if negate else value)
        np.testing.assert_array_equal(y, np.full(5, expected, np.float32))


@pytest.mark.parametrize("args, message", [
    (("2", 1, False), r"'value' of fill \(float32 scalar\): expected a real number, got str '2'"),
    (("abc", 1, False), "'value'.*got str 'abc'"),
    ((True, 1, False), "'value'.*got bool True"),
    ((1.0, 2.5, False), r"'count' of fill \(int32 scalar\): expected an integer, got float 2.5"),
    ((1.0, np.bool_(True), False), "'count'.*got bool"),
    ((1.0, 1, 1), r"'negate' of fill \(bool scalar\): expected a bool, got int 1"),
    ((1.0, 1, None), "'negate'.*got NoneType None"),
], ids=["numeric-string", "string", "bool-for-float", "float-for-int", "bool-for-int",
        "int-for-bool", "none"])
def test_a_scalar_of_the_wrong_type_names_the_parameter(args, message):
    with pytest.raises(DTypeError, match=message) as info:
        fill(np.zeros(2, np.float32), *args)
    assert isinstance(info.value, TypeError)
