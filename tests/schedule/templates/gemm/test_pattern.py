"""What the GEMM template matches: the roles of the axes, epilogues, constant right
factors, and the operators it leaves to other templates."""
import numpy as np

from tests.harness import random_array
from treadle.graph.operator import apply
from treadle.graph.tensor import Tensor, constant
from treadle.ir.compute import compute, reduce
from treadle.ir.dtypes import float32
from treadle.ir.expr import Buffer
from treadle.schedule.templates.gemm import GEMM, match_gemm


def test_roles_of_axes():
    a, b = Buffer("a", float32, (4, 5)), Buffer("b", float32, (5, 6))
    c = reduce("c", [4, 6], [5], lambda i, j, k: a[i, k] * b[k, j])
    p = match_gemm(c)
    assert p.m_axes == (c.axes[0],) and p.n_axes == (c.axes[1],) and p.batch_axes == ()
    assert p.axes("k") == c.reduce_axes
    relu = compute("r", [4], lambda i: a[i, 0])
    assert match_gemm(relu) is None


def test_batch_axes_are_read_by_both_factors():
    a, b = Buffer("a", float32, (3, 4, 5)), Buffer("b", float32, (3, 5, 6))
    c = reduce("c", [3, 4, 6], [5], lambda n, i, j, k: a[n, i, k] * b[n, k, j])
    p = match_gemm(c)
    assert p.batch_axes == (c.axes[0],) and p.m_axes == (c.axes[1],)


def test_operator_match_carries_inputs_checks_and_constant_weights():
    x = Tensor("x", "float32", ["batch", 24])
    w = constant(random_array((24, 32)))
    op = apply("MatMul", [x, w])[0].producer
    pattern = GEMM.match(op)
    assert pattern.inputs == tuple(op.input_buffers)
    assert pattern.constant_right  # the weights are laid out at compile time


def test_bias_becomes_an_epilogue():
    x = Tensor("x", "float32", [1, 3, 9, 9])
    w, b = constant(np.ones((16, 3, 3, 3), np.float32)), constant(np.ones(16, np.float32))
    op = apply("Conv", [x, w, b], {})[0].producer
    pattern = GEMM.match(op)
    assert pattern.epilogue is not None and pattern.output is pattern.epilogue


def test_narrow_products_are_left_to_other_templates():
    """Fewer than MIN_GEMM_COLUMNS output columns (a matrix-vector product) is mostly
    padding in a GEMM tile; non-float32 products are not the template's either."""
    x = Tensor("x", "float32", [7, 24])
    assert GEMM.match(apply("MatMul", [x, constant(random_array((24, 3)))])[0].producer) is None
    assert GEMM.match(apply("MatMul", [x, constant(random_array((24, 8)))])[0].producer)
    xi = Tensor("xi", "int32", [7, 24])
    wi = constant(np.ones((24, 16), np.int32))
    assert GEMM.match(apply("MatMul", [xi, wi])[0].producer) is None


def test_a_product_few_columns_wide_but_many_rows_long_swaps_its_factors():
    """A convolution to 3 channels is 3 columns by 61 pixels, and 3 rows by 61 columns the
    other way round: the weights become the left factor, and the numbers stay numpy's. A
    matrix times 3 columns is not swapped: its results are dot products of contiguous rows,
    which the rule-based loops compute without packing the matrix."""
    from tests.harness import assert_close
    from treadle import ops
    from treadle.compiler import compile_graph
    x = Tensor("x", "float32", [1, 24, 61, 1])
    w = random_array((3, 24, 3, 1), seed=1)
    op = apply("Conv", [x, constant(w)], {"pads": [1, 0, 1, 0]})[0].producer
    pattern = GEMM.match(op)
    out = op.definition[0]
    assert set(pattern.m_axes) == {out.axes[1]} and out.axes[2] in pattern.n_axes
    assert not pattern.constant_right
    a = ops.input("a", "float32", [1, 24, 61, 1])
    model = compile_graph(ops.graph([a], [ops.conv2d(a, ops.constant(w), padding=(1, 0))]))
    xv = random_array((1, 24, 61, 1), seed=2)
    padded = np.pad(xv[0, :, :, 0], ((0, 0), (1, 1)))
    expected = np.stack([sum(w[:, :, t, 0] @ padded[:, t:t + 61] for t in range(3))])
    assert_close(model(xv)[0][:, :, :, 0], expected, reduction=72)
    rows = Tensor("rows", "float32", [61, 24])
    assert GEMM.match(apply("MatMul", [rows, constant(w[:, :, 0, 0].T)])[0].producer) is None