"""The gemv template: which products it takes (constant weights, a few rows or a short K,
at least a GEMM tile's narrowest width), and those products against numpy, with and
without a fused bias and activation, over odd, prime and one-element sizes, zero rows and
a symbolic row count, on this machine's vectors and AVX2's."""
from __future__ import annotations

import numpy as np
import pytest

from tests.harness import assert_close, random_array
from treadle.compiler import compile_graph
from treadle.config import override
from treadle.graph.graph import Graph
from treadle.graph.operator import apply
from treadle.graph.tensor import Tensor, constant
from treadle.schedule.select import select_template
from treadle.schedule.templates.gemv_cpu import GEMV, plan
from treadle.schedule.templates.thresholds import MAX_GEMV_ROWS, MAX_OUTER_K
from treadle.target.cpu import CpuTarget, host

AVX2 = CpuTarget(("avx2", "fma"), 32 * 1024, 512 * 1024, 8 * 1024 * 1024)
TARGETS = pytest.mark.parametrize("target", [None, AVX2], ids=["host", "avx2"])


def _product(rows, k: int, n: int, epilogue: bool):
    """x @ w, or relu(x @ w + b) with ``epilogue``; w and b constants."""
    w, b = random_array((k, n), seed=k + n), random_array((n,), seed=n)
    x = Tensor("x", "float32", [rows, k])
    y = apply("MatMul", [x, constant(w)])[0]
    if epilogue:
        y = apply("Relu", [apply("Add", [y, constant(b)])[0]])[0]
    return Graph.from_outputs([x], [y]), w, b if epilogue else None


def _expected(x: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    y = x.astype(np.float64) @ w.astype(np.float64)
    return (y if b is None else np.maximum(y + b, 0)).astype(np.float32)


def _template(graph: Graph) -> str:
    (anchor,) = [op for op in graph.nodes if op.op_type == "MatMul"]
    return select_template(anchor, host())[0].name


@pytest.mark.parametrize("rows, k, n, taken", [
    (1, 768, 3072, True), (1, 3072, 768, True), (1, 4096, 4096, True),  # decoding
    (16384, 4, 1024, True), ("m", 4, 1024, True),  # a short K, rows static or not
    ("m", MAX_OUTER_K + 1, 1024, False),
    (MAX_GEMV_ROWS, 1021, 17, True),
    (MAX_GEMV_ROWS + 1, 768, 3072, False), ("m", 768, 3072, False),  # a GEMM's rows
    (1, 768, 5, False), (16384, 1024, 4, False),  # fewer columns than a GEMM tile
])
def test_takes_products_bound_by_the_weights(rows, k, n, taken):
    graph = _product(rows, k, n, epilogue=False)[0]
    assert (_template(graph) == GEMV.name) == taken


def test_leaves_products_with_strided_output_rows():
    """A channels-first 1 x 1 convolution from 4 channels: its output columns (channels)
    lie a whole image apart."""
    x = Tensor("x", "float32", [1, 4, 9, 9])
    op = apply("Conv", [x, constant(random_array((16, 4, 1, 1)))], {})[0].producer
    assert select_template(op, host())[0].name != GEMV.name


@TARGETS
@pytest.mark.parametrize("rows", [1, 2, 3])
@pytest.mark.parametrize("k, n", [(1, 17), (7, 3073), (768, 3072), (1021, 17), (768, 3073)])
def test_few_rows_match_numpy(target, rows, k, n):
    for epilogue in (False, True):
        graph, w, b = _product(rows, k, n, epilogue)
        x = random_array((rows, k), seed=rows + k)
        got = compile_graph(graph, target=target)(x)[0]
        assert_close(got, _expected(x, w, b), reduction=k, context=f"epilogue {epilogue}")


@TARGETS
@pytest.mark.parametrize("k, n", [(1, 8), (4, 1024), (7, 17), (8, 3073)])
def test_symbolic_rows_with_a_short_k_match_numpy(target, k, n):
    graph, w, b = _product("m", k, n, epilogue=True)
    program = compile_graph(graph, target=target)
    for rows in (0, 1, 3, 5, 97):
        x = random_array((rows, k), seed=rows)
        assert_close(program(x)[0], _expected(x, w, b), reduction=k, context=f"{rows} rows")


@pytest.mark.parametrize("k, n", [(768, 1), (7, 5)])
def test_narrow_products_left_to_other_templates_match_numpy(k, n):
    graph, w, b = _product(1, k, n, epilogue=True)
    assert _template(graph) != GEMV.name
    x = random_array((1, k), seed=k)
    assert_close(compile_graph(graph)(x)[0], _expected(x, w, b), reduction=k)


@TARGETS
@pytest.mark.parametrize("rows", [1, MAX_GEMV_ROWS, "m"])
def test_register_tile_fits_the_registers(target, rows):
    """Accumulators, a panel row of weights and each row's broadcast element."""
    target = target or host()
    graph = _product(rows, 4, 1024, epilogue=False)[0]
    (anchor,) = [op for op in graph.nodes if op.op_type == "MatMul"]
    p = plan(GEMV.match(anchor), target)
    assert p.chains * p.rows * p.vectors + p.vectors + p.rows <= target.vector_registers
    assert p.lanes * 4 == target.widest_simd_bytes


@pytest.mark.parametrize("threads", [2, 8])
def test_panels_are_shared_evenly_between_threads(threads):
    """768 columns: 12 panels of 64 floats would leave 8 threads a third idle, so the
    panels narrow until every thread has as many; the result still matches numpy."""
    graph, w, b = _product(1, 768, 768, epilogue=True)
    (anchor,) = [op for op in graph.nodes if op.op_type == "MatMul"]
    with override(num_threads=threads):
        p = plan(GEMV.match(anchor), host())
        assert -(-768 // p.width) % threads == 0
        x = random_array((1, 768), seed=threads)
        assert_close(compile_graph(graph)(x)[0], _expected(x, w, b), reduction=768)
