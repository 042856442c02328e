"""Rule-based kernels as CUDA launches: row reductions on a warp per row with shuffles,
wide rows on lanes along the columns, the rest a thread per iteration; each against numpy
through the GPU simulator, and all of them through nvcc."""
import numpy as np
import pytest
from onnx import helper

import treadle
from tests.frontend.onnx_models import make_model, tensor
from tests.harness import assert_close, random_array, run_onnxruntime
from treadle.backend.cuda import build_cuda, launch_shape
from treadle.config import override
from treadle.ir import dtypes
from treadle.ir.builder import FunctionBuilder
from treadle.ir.compute import compute, reduce
from treadle.ir.expr import Buffer, Call, Var, call, cast, ceil_div
from treadle.ir.functor import evaluate, walk
from treadle.ir.lower import lower
from treadle.ir.passes.split_launches import WARP, split_launches
from treadle.runtime import cuda as cuda_runtime
from treadle.runtime.cuda import device_target
from treadle.runtime.simulate import simulate
from treadle.schedule.dispatch import dispatching_kernel
from treadle.schedule.kernel import Kernel
from treadle.schedule.rules import MIN_SPLIT_ELEMENTS, schedule_computes
from treadle.target.cuda import ARCHS, cuda_target
from treadle.tune.dynamic import fit_tree

TARGET = cuda_target("sm_80")
f32 = dtypes.float32
ROWS = [(1, 1), (3, 7), (5, 61), (2, 97)]


def softmax():
    n, k = Var("N"), Var("K")
    x = Buffer("x", f32, (n, k))
    high = reduce("max", [n, 1], [k], lambda i, _, r: x[i, r], "max")
    total = reduce("sum", [n, 1], [k], lambda i, _, r: call("exp", x[i, r] - high[i, 0]))
    out = compute("softmax", [n, k], lambda i, j: call("exp", x[i, j] - high[i, 0]) / total[i, 0])
    return schedule_computes("softmax", [x], [out])


def layer_norm():
    n, k = Var("N"), Var("K")
    x, g = Buffer("x", f32, (n, k)), Buffer("g", f32, (k,))
    count = cast(k, f32)
    total = reduce("total", [n, 1], [k], lambda i, _, r: x[i, r])
    squares = reduce("squares", [n, 1], [k], lambda i, _, r: x[i, r] * x[i, r])

    def normalised(i, j):
        mean = total[i, 0] / count
        variance = squares[i, 0] / count - mean * mean
        return (x[i, j] - mean) / call("sqrt", variance + 1e-5) * g[j]
    return schedule_computes("ln", [x, g], [compute("ln", [n, k], normalised)])


def run(kernel, arrays, **symbols):
    """Simulates every launch of ``kernel`` in order on ``arrays`` (its buffer parameters,
    workspaces included, filled with NaN where not given)."""
    funcs = [lower(f, TARGET) for f in split_launches(kernel.function)]
    for func in funcs:
        launch_shape(func)
        simulate(func, *arrays, **symbols)
    return funcs


def workspaces(kernel, **sizes):
    env = {Var(k): v for k, v in sizes.items()}
    return [np.full([evaluate(d, env) for d in w.shape], np.nan, np.float32)
            for w in kernel.workspaces]


@pytest.mark.parametrize("rows, cols", ROWS)
def test_softmax_on_a_warp_per_row_with_shuffles(rows, cols):
    kernel = softmax()
    x = random_array((rows, cols), seed=rows * cols)
    y = np.full_like(x, np.nan)
    (func,) = run(kernel, [x, y, *workspaces(kernel, N=rows, K=cols)])
    assert launch_shape(func)[1] == WARP
    assert sum(isinstance(n, Call) and n.func == "shfl_xor" for n in walk(func.body)) == 10
    e = np.exp(x - x.max(axis=1, keepdims=True))
    assert_close(y, e / e.sum(axis=1, keepdims=True), reduction=cols)


@pytest.mark.parametrize("rows, cols", ROWS)
def test_layer_norm_on_a_warp_per_row(rows, cols):
    kernel = layer_norm()
    x, g = random_array((rows, cols), seed=cols), random_array((cols,), seed=5)
    y = np.full_like(x, np.nan)
    run(kernel, [x, g, y, *workspaces(kernel, N=rows, K=cols)])
    mean, var = x.mean(axis=1, keepdims=True), x.var(axis=1, keepdims=True)
    expected = ((x - mean) / np.sqrt(var + 1e-5) * g).astype(np.float32)
    np.testing.assert_allclose(y, expected, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("rows, cols, symbolic", [(0, 5, True), (1, 1, True), (13, 61, True),
                                                  (7, 3, False), (3, 97, False)])
def test_element_wise_rows_narrow_and_wide(rows, cols, symbolic):
    """Rows that may be a warp wide (symbolic or at least 32 columns) go on a warp's lanes,
    narrow ones a thread per row."""
    n, k = (Var("N"), Var("K")) if symbolic else (rows, cols)
    a, b = Buffer("a", f32, (n, k)), Buffer("b", f32, (1, k))
    out = compute("add", [n, k], lambda i, j: call("tanh", a[i, j] + b[0, j]))
    kernel = schedule_computes("add", [a, b], [out])
    x, y = random_array((rows, cols), seed=1), random_array((1, cols), seed=2)
    z = np.full((rows, cols), np.nan, np.float32)
    (func,) = run(kernel, [x, y, z])
    assert launch_shape(func)[1] == (WARP if symbolic or cols >= WARP else 256)
    assert_close(z, np.tanh(x + y))


@pytest.mark.parametrize("n, h, w, c", [(1, 1, 1, 1), (2, 7, 5, 3), (1, 3, 3, 61)])
def test_column_reduction_keeps_a_row_in_one_thread(n, h, w, c):
    """A channels-last global average pool: the rules reduce over (h, w) outside the
    channel loop, which therefore stays in one thread."""
    x = Buffer("x", f32, (n, h, w, c))
    pool = reduce("pool", [n, c], [h, w], lambda b, ch, p, q: x[b, p, q, ch])
    kernel = schedule_computes("pool", [x], [pool])
    xv = random_array((n, h, w, c), seed=3)
    out = np.full((n, c), np.nan, np.float32)
    run(kernel, [xv, out])
    assert_close(out, xv.sum(axis=(1, 2)), reduction=h * w)


@pytest.mark.parametrize("size", [1, 7, 97, 1000])
def test_whole_tensor_sum_and_row_sums_without_keepdims(size):
    x = Buffer("x", f32, (3, size))
    rows = reduce("rows", [3], [size], lambda i, r: x[i, r])
    total = reduce("total", [], [3, size], lambda i, r: x[i, r])
    xv = random_array((3, size), seed=size)
    for c, expected in ((rows, xv.sum(axis=1)), (total, np.float32(xv.sum()))):
        kernel = schedule_computes(c.name, [x], [c])
        out = np.full(np.shape(expected), np.nan, np.float32)
        run(kernel, [xv, out])
        assert_close(out, np.asarray(expected, np.float32), reduction=3 * size)


@pytest.mark.parametrize("height", [1, 23, 61])
def test_a_fused_instance_norm_launches_each_parallel_loop_as_a_grid(height, tmp_path):
    """Fusion wraps a body it puts epilogues into (here the ReLU): the normalisation,
    and the statistics where they split over the image's rows, each still launch a grid,
    not one thread for all; the model in the simulator matches ONNX Runtime."""
    c, w = 16, 37
    nodes = [helper.make_node("Conv", ["x", "k"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("InstanceNormalization", ["c", "s", "b"], ["n"]),
             helper.make_node("Relu", ["n"], ["y"])]
    model = make_model(nodes, [tensor("x", [1, c, height, w])], [tensor("y", [1, c, height, w])],
                       {"k": random_array((c, c, 3, 3), seed=1) * 0.3,
                        "s": random_array((c,), seed=2), "b": random_array((c,), seed=3)})
    with override(cache_dir=tmp_path):
        compiled = treadle.compile(model, target="cuda:sm_80")
    (step,) = [s for s in compiled.executable.steps if s.kernel is not None
               and "InstanceNormalization" in s.kernel.function.name]
    shapes = [tuple(map(str, launch_shape(f))) for f in step.kernel.launches]
    grids = [s for s in shapes if s != ("1", "1")]  # not a single thread
    assert len(grids) == (3 if c * height * w >= MIN_SPLIT_ELEMENTS else 1)
    x = random_array((1, c, height, w), seed=height)
    (expected,) = run_onnxruntime(model, {"x": x})
    assert_close(compiled.executable.simulate(x)[0], expected, reduction=9 * c)


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_every_launch_compiles_with_nvcc(arch, tmp_path):
    target = cuda_target(arch)
    kernels = [softmax(), layer_norm()]
    funcs = [lower(f, target) for k in kernels for f in split_launches(k.function)]
    with override(cache_dir=tmp_path):
        binary = build_cuda(funcs, target, "rules")
    assert len(binary.resources) == len(funcs)


@pytest.mark.skipif(not cuda_runtime.available(), reason="needs a GPU and its driver")
@pytest.mark.parametrize("rows, cols", ROWS + [(300, 1000)])
def test_on_the_gpu_softmax_and_layer_norm_match_numpy(rows, cols, tmp_path):
    target = device_target()
    x, g = random_array((rows, cols), seed=cols), random_array((cols,), seed=5)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    mean, var = x.mean(axis=1, keepdims=True), x.var(axis=1, keepdims=True)
    cases = [(softmax(), [x], e / e.sum(axis=1, keepdims=True)),
             (layer_norm(), [x, g], ((x - mean) / np.sqrt(var + 1e-5) * g).astype(np.float32))]
    for kernel, inputs, expected in cases:
        funcs = [lower(f, target) for f in split_launches(kernel.function)]
        with override(cache_dir=tmp_path):
            binary = build_cuda(funcs, target, kernel.function.name)
        y = np.full_like(x, np.nan)
        arrays = [*inputs, y, *workspaces(kernel, N=rows, K=cols)]
        for func in funcs:
            cuda_runtime.CudaKernel(func, binary.cubin)(*arrays)
        np.testing.assert_allclose(y, expected, rtol=1e-3, atol=1e-4)


def _grid_writing(value: int) -> Kernel:
    """A one-launch kernel writing ``value`` over ``y``: a variant of a dispatcher."""
    with FunctionBuilder(f"variant{value}") as fb:
        n = fb.symbol("seq")
        out = fb.param("y", "int32", [n])
        for blk in fb.range(ceil_div(n, 32), kind="blocks", name="blk"):
            for t in fb.range(32, kind="threads", name="t"):
                with fb.if_(blk * 32 + t < n):
                    out[blk * 32 + t] = value
    return Kernel(fb.function, (), ())


@pytest.mark.parametrize("seq", [0, 1, 5, 6, 37, 61, 64, 65, 97, 1000])
def test_dispatch_between_grids_launches_only_the_chosen_variant(seq):
    """DietCode's dispatcher branches between whole grids: each variant becomes a launch
    of its own whose grid is empty unless the tree chooses it."""
    values = np.arange(1, 101)[:, None]
    labels = np.select([values[:, 0] <= 5, values[:, 0] <= 37, values[:, 0] <= 64], [2, 0, 1], 3)
    tree = fit_tree(["seq"], values, labels, np.full(100, 0.01))
    kernel = dispatching_kernel([_grid_writing(v) for v in range(4)], tree.nodes,
                                tree.symbols, "dispatch")
    out = np.full(seq, -1, np.int32)
    funcs = run(kernel, [out], seq=seq)
    assert len(funcs) == 4
    blocks = [evaluate(launch_shape(f)[0], {Var("seq"): seq}) for f in funcs]
    chosen = tree.predict({"seq": min(max(seq, 1), 100)})
    assert [b > 0 for b in blocks] == [v == chosen and seq > 0 for v in range(4)]
    assert (out == chosen).all()
