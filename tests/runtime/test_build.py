"""The one build path: scheduled functions become kernels of their target. On the CPU each
function is a callable computing what numpy does, built once through the kernel cache and
grouped into a few shared objects; on CUDA each is the launches that compute it, built by
nvcc and checked against numpy in the GPU simulator. Checked builds fail naming the buffer."""
import numpy as np
import pytest

from tests.harness import assert_close, random_array
from tests.ir.passes.test_split_launches import softmax as row_softmax
from treadle.backend import build as backend_build
from treadle.config import override
from treadle.errors import KernelError
from treadle.ir import dtypes
from treadle.ir.builder import FunctionBuilder
from treadle.ir.compute import compute, reduce
from treadle.ir.expr import Buffer, Var, call
from treadle.ir.functor import evaluate
from treadle.runtime import build as runtime_build
from treadle.runtime.build import build, compile_function, executable, shared_objects
from treadle.runtime.cuda_executor import CudaExecutable, CudaLaunches
from treadle.runtime.executor import Executable, Slot, Step
from treadle.runtime.module import CompiledFunction
from treadle.runtime.simulate import simulate
from treadle.schedule.rules import schedule_computes
from treadle.target.cpu import host
from treadle.target.cuda import cuda_target

f32 = dtypes.float32
SIZES = [0, 1, 7, 61, 2039]


def affine(name: str = "affine", scale: float = 2.0):
    """y[i] = x[i] * scale + 1 over a symbolic n."""
    with FunctionBuilder(name) as fb:
        n = fb.symbol("n")
        x, y = fb.param("x", f32, [n]), fb.param("y", f32, [n])
        for i in fb.range(n):
            y[i] = x[i] * scale + 1.0
    return fb.function


def column_softmax():
    """Softmax down the columns: reductions over the rows, which CUDA splits into
    several launches."""
    n, k = Var("N"), Var("K")
    x = Buffer("x", f32, (n, k))
    high = reduce("max", [1, k], [n], lambda _, j, r: x[r, j], "max")
    total = reduce("sum", [1, k], [n], lambda _, j, r: call("exp", x[r, j] - high[0, j]))
    out = compute("colsoftmax", [n, k],
                  lambda i, j: call("exp", x[i, j] - high[0, j]) / total[0, j])
    return schedule_computes("colsoftmax", [x], [out])


def tanh_add(rows: int = 13, cols: int = 61):
    """tanh(a + b) with b broadcast over the rows, at fixed (prime) sizes."""
    a, b = Buffer("a", f32, (rows, cols)), Buffer("b", f32, (1, cols))
    out = compute("tanh_add", [rows, cols], lambda i, j: call("tanh", a[i, j] + b[0, j]))
    return schedule_computes("tanh_add", [a, b], [out])


def workspaces(kernel, **sizes) -> list[np.ndarray]:
    env = {Var(k): v for k, v in sizes.items()}
    return [np.full([evaluate(d, env) for d in w.shape], np.nan, np.float32)
            for w in kernel.workspaces]


def softmax_reference(x: np.ndarray, axis: int) -> np.ndarray:
    if x.size == 0:  # numpy's max has no identity to reduce an empty axis with
        return x.copy()
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@pytest.fixture
def cache(tmp_path):
    with override(cache_dir=tmp_path):
        yield tmp_path


def entries(cache_dir) -> list:
    return sorted((cache_dir / "kernels").iterdir())


# ---- the CPU ---------------------------------------------------------------------------------

def test_cpu_kernels_compute_what_numpy_does(cache):
    softmax, add = row_softmax(), tanh_add()
    built = build([affine(), softmax.function, add.function],
                  host(), "three")
    assert sorted(built) == sorted(["affine", softmax.function.name, add.function.name])
    assert all(isinstance(f, CompiledFunction) for f in built.values())
    for n in SIZES:
        x = random_array((n,), seed=n)
        y = np.full_like(x, np.nan)
        built["affine"](x, y)
        assert_close(y, x * np.float32(2) + np.float32(1), context=f"n={n}")
    for rows, cols in [(1, 1), (3, 7), (5, 61), (0, 4)]:
        x = random_array((rows, cols), seed=rows + cols)
        y = np.full_like(x, np.nan)
        built[softmax.function.name](x, y, *workspaces(softmax, N=rows, K=cols))
        assert_close(y, softmax_reference(x, 1), reduction=cols, context=f"{rows}x{cols}")
    a, b = random_array((13, 61), seed=1), random_array((1, 61), seed=2)
    out = np.full((13, 61), np.nan, np.float32)
    built[add.function.name](a, b, out)
    assert_close(out, np.tanh(a + b))


def test_identical_source_is_built_once(cache):
    functions = [affine(), row_softmax().function]
    build(functions, host(), "twice")
    first = entries(cache)
    assert first
    again = build(functions, host(), "twice")
    assert entries(cache) == first  # the second build hit the cache
    x = random_array((7,), seed=3)
    y = np.empty_like(x)
    again["affine"](x, y)
    assert_close(y, x * np.float32(2) + np.float32(1))


@pytest.mark.parametrize("count, cores, most, objects", [
    (1, 4, 24, 1),  # one function, one object
    (5, 3, 24, 3),  # an object per core while there are enough functions
    (2, 3, 24, 2),  # never an empty object
    (7, 2, 2, 4),  # at most `most` functions in each
])
def test_shared_objects_spread_functions_over_the_cores(cache, monkeypatch, count, cores,
                                                        most, objects):
    monkeypatch.setattr(backend_build, "usable_cores", lambda: cores)
    monkeypatch.setattr(runtime_build, "FUNCTIONS_PER_OBJECT", most)
    functions = [affine(f"affine{k}", float(k)) for k in range(count)]
    shared = shared_objects(functions, host(), "grouped")
    assert len(shared) == objects
    assert len({path for path, _ in shared}) == objects
    assert all(1 <= len(group) <= most for _, group in shared)
    assert [f.name for _, group in shared for f in group] == [f.name for f in functions]
    assert all(path.exists() for path, _ in shared)


def softmax_executable(target, kernel):
    """A one-step program: the kernel of ``kernel`` built for ``target`` over slots x and y,
    with its workspaces."""
    built = build([kernel.function], target, "exe")
    n, k = Var("N"), Var("K")
    slots = [Slot("x", f32, (n, k)), Slot("y", f32, (n, k))]
    scratch = tuple(Slot(w.name, w.dtype, w.shape) for w in kernel.workspaces)
    args = (0, 1, *(-j - 1 for j in range(len(scratch))))
    step = Step(kernel.function.name, built[kernel.function.name], args, (1,), scratch)
    return executable(target, slots, [0], [1], {}, [step])


def test_executable_for_the_cpu_runs_built_steps(cache):
    exe = softmax_executable(host(), row_softmax())
    assert type(exe) is Executable
    for n, k in [(0, 5), (1, 1), (7, 61)]:
        x = random_array((n, k), seed=n + k)
        (y,) = exe(x)
        assert_close(y, softmax_reference(x, 1), reduction=k, context=f"{n}x{k}")


def test_a_checked_function_names_the_buffer_it_would_read_outside():
    with FunctionBuilder("past_the_end") as fb:
        n = fb.symbol("n")
        x, y = fb.param("x", f32, [n]), fb.param("y", f32, [n])
        for i in fb.range(n):
            y[i] = x[i + 1]
    function = compile_function(fb.function, checked=True)
    with pytest.raises(KernelError, match=r"load from x\[i \+ 1\]: index 5 .* size n"):
        function(np.zeros(5, np.float32), np.zeros(5, np.float32))


# ---- CUDA ------------------------------------------------------------------------------------

def run_launches(launches: CudaLaunches, arrays, **symbols) -> None:
    for launch in launches.launches:
        simulate(launch, *arrays, **symbols)


def test_cuda_kernels_are_launches_that_compute_what_numpy_does(cache):
    target = cuda_target("sm_80")
    rows, columns = row_softmax(), column_softmax()
    built = build([rows.function, columns.function, affine()], target, "gpu")
    assert sorted(built) == sorted([rows.function.name, columns.function.name, "affine"])
    for name, launches in built.items():
        assert isinstance(launches, CudaLaunches)
        assert launches.arch == "sm_80" and launches.cubin
        assert launches.function.name == name
        assert all(launch.params == launches.function.params for launch in launches.launches)
    assert len(built[columns.function.name].launches) > 1  # reductions over rows split
    for n, k in [(1, 1), (3, 7), (7, 5), (0, 3)]:
        x = random_array((n, k), seed=n * k + 1)
        for kernel, axis in ((rows, 1), (columns, 0)):
            y = np.full_like(x, np.nan)
            run_launches(built[kernel.function.name], [x, y, *workspaces(kernel, N=n, K=k)])
            assert_close(y, softmax_reference(x, axis), reduction=[k, n][axis],
                         context=f"{kernel.function.name} {n}x{k}")
    x = random_array((61,), seed=9)
    y = np.full_like(x, np.nan)
    run_launches(built["affine"], [x, y])
    assert_close(y, x * np.float32(2) + np.float32(1))


def test_executable_for_cuda_carries_the_targets_arch(cache):
    exe = softmax_executable(cuda_target("sm_90"), column_softmax())
    assert isinstance(exe, CudaExecutable) and exe.arch == "sm_90"
    for n, k in [(1, 3), (7, 5)]:
        x = random_array((n, k), seed=n * k)
        (y,) = exe.simulate(x)
        assert_close(y, softmax_reference(x, 0), reduction=n, context=f"{n}x{k}")
