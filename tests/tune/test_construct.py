"""Construction without measuring: the constructed config of the GEMM template computes
the right product on odd, prime and symbolic sizes; the same seed gives the same result;
it never ranks below the level-0 point; templates take part through Constructible;
``tune="construct"`` compiles a model, for CUDA too without a GPU. (The CUDA matmul's
construction is tested beside its template.)"""
from dataclasses import replace

import numpy as np
import pytest

import treadle
from tests.harness import assert_close, random_array
from tests.schedule.templates.gemm.test_program import runner
from treadle import ops
from treadle.config import override
from treadle.ir.compute import reduce
from treadle.ir.dtypes import float32
from treadle.ir.expr import Buffer, Var
from treadle.schedule.select import RulesTemplate, select_template
from treadle.schedule.template import Constructible, default_point
from treadle.schedule.templates.gemm import GEMM, match_gemm
from treadle.schedule.templates.gemm.construction import gemm_problem, gemm_seconds
from treadle.schedule.templates.matmul_cuda import MATMUL_CUDA
from treadle.target.cpu import host
from treadle.tune.construct import construct
from treadle.tune.etir import footprint, traffic


def matmul(m, n, k):
    a, b = Buffer("a", float32, (m, k)), Buffer("b", float32, (k, n))
    return replace(match_gemm(reduce("c", [m, n], [k], lambda i, j, r: a[i, r] * b[r, j])),
                   inputs=(a, b))


SHAPES = [(61, 37, 97), (1, 257, 131), (2039, 5, 17), (128, 768, 768)]


@pytest.mark.parametrize("method", ["gensor", "greedy"])
@pytest.mark.parametrize("shape", SHAPES + [(0, 64, 64), (37, 64, 0), ("M", "N", "K")],
                         ids=str)
def test_constructed_configs_compute_the_product(method, shape):
    sizes = tuple(Var(s) if isinstance(s, str) else s for s in shape)
    pattern = matmul(*sizes)
    points = construct(GEMM, pattern, host(), method)
    config, resolved = points[0]
    run = runner(GEMM.emit(resolved, "constructed"))
    for m, n, k in ([shape] if isinstance(shape[0], int) else [(7, 61, 13), (0, 3, 5), (97, 16, 2)]):
        a, b = random_array((m, k), seed=1), random_array((k, n), seed=2)
        out = np.full((m, n), np.nan, np.float32)
        run(a, b, out, **({} if isinstance(shape[0], int) else {"M": m, "N": n, "K": k}))
        assert_close(out, a @ b, reduction=k, context=f"{config} at {m}x{n}x{k}")


def test_same_seed_same_result():
    pattern = matmul(128, 3072, 768)
    first = [c for c, _ in construct(GEMM, pattern, host(), seed=3)]
    assert first == [c for c, _ in construct(GEMM, matmul(128, 3072, 768), host(), seed=3)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_ranked_by_the_model_and_never_below_the_level_zero_point(shape):
    from treadle.target.memory import memory_hierarchy
    pattern = matmul(*shape)
    points = construct(GEMM, pattern, host())
    seconds = [gemm_seconds(r, memory_hierarchy()) for _, r in points]
    assert seconds == sorted(seconds)
    default = default_point(GEMM, pattern, host())[1]
    assert seconds[0] <= gemm_seconds(default, memory_hierarchy())
    assert len({r for _, r in points}) == len(points)


def test_the_gemm_problem_reads_its_roles_from_the_compute():
    problem = gemm_problem(matmul(64, 32, 16), host())
    assert problem.extents == (1, 64, 32, 16)
    left, right, out = problem.tensors
    assert (left.dims, right.dims, out.dims) == ({1, 3}, {2, 3}, {0, 1, 2}) and out.output
    # One tile of the whole problem moves everything once.
    assert traffic(problem, problem.extents) == footprint(problem, problem.extents)


def test_the_matmul_templates_are_constructible_and_the_rules_are_not():
    assert isinstance(GEMM, Constructible) and isinstance(MATMUL_CUDA, Constructible)
    assert not isinstance(RulesTemplate(), Constructible)


def test_templates_without_a_construction_keep_their_default():
    x = ops.input("x", "float32", [1, 8, 9, 9])
    op = ops.max_pool2d(x, 3, 2, 1).producer
    template, pattern = select_template(op, host())
    assert not isinstance(template, Constructible)
    assert construct(template, pattern, host()) == [default_point(template, pattern, host())]


def test_compile_with_construction(tmp_path):
    x = ops.input("x", "float32", ["n", 96])
    w1, w2 = random_array((96, 80), seed=1), random_array((80, 24), seed=2)
    y = ops.matmul(ops.relu(ops.matmul(x, ops.constant(w1))), ops.constant(w2))
    graph = ops.graph([x], [y], name="mlp")
    with override(dump_dir=tmp_path):
        model = treadle.compile(graph, tune="construct")
    xv = random_array((13, 96), seed=3)
    assert_close(model(xv)[0], np.maximum(xv @ w1, 0) @ w2, reduction=96)
    sources = {p.read_text().splitlines()[-1] for p in tmp_path.rglob("schedule.txt")
               if "template: gemm" in p.read_text()}
    assert sources == {"source: constructed"}
    with pytest.raises(ValueError, match="tune='constructed'"):
        treadle.compile(graph, tune="constructed")


def test_compile_for_cuda_with_construction_needs_no_gpu(tmp_path):
    """The CUDA matmul's configs are constructed from the sm_90 target's limits and memory
    hierarchy; building needs nvcc, not a GPU."""
    x = ops.input("x", "float32", [61, 96])
    y = ops.relu(ops.matmul(x, ops.constant(random_array((96, 2039), seed=1))))
    with override(dump_dir=tmp_path):
        treadle.compile(ops.graph([x], [y], name="wide"), target="cuda:sm_90", tune="construct")
    texts = [p.read_text() for p in tmp_path.rglob("schedule.txt")]
    assert [t.splitlines()[-1] for t in texts if "template: matmul_cuda" in t] \
        == ["source: constructed"]
