"""The compiler driver: every paper's capability on every target, and folding through the
driver.

Without a GPU, CUDA models are built by nvcc and run in the GPU simulator; what needs
measuring on a device that is not there raises ``DeviceUnavailableError`` naming it.
"""
import numpy as np
import pytest

from tests.harness import assert_close, random_array
from tests.models.test_models import PAPER_MODELS, assert_matches, reference
import treadle
from treadle import ops
from treadle.compiler import compile_graph
from treadle.errors import DeviceUnavailableError
from treadle.models import export_onnx
from treadle.runtime import cuda as cuda_runtime
from treadle.target.cuda import cuda_target

# What each capability is asked for; dynamic shapes over the symbol the export declares.
CAPABILITIES = {
    "construct": dict(tune="construct"),
    "orchestrate": dict(orchestrate=True),
    "dynamic": dict(dynamic={"seq": (1, 16)}),
}
# A model takes 8-35 s in the simulator: by default each capability runs once on a
# transformer and orchestration (whose candidates are the CNNs' concern) and dynamic
# batches once on a CNN; `-m slow` runs every pair.
DEFAULT_RUNS = {("bert", "construct"), ("bert", "dynamic"), ("bert", "orchestrate"),
                ("mobilenet_v2", "orchestrate"), ("resnet50", "dynamic")}
RUNS = [pytest.param(name, capability,
                     marks=() if (name, capability) in DEFAULT_RUNS else pytest.mark.slow)
        for name in PAPER_MODELS for capability in sorted(CAPABILITIES)]


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    return tmp_path_factory.mktemp("zoo")


def _exported(zoo, name: str, capability: str):
    dynamic = capability == "dynamic"
    symbolic = dict(dynamic_seq=True) if name in ("bert", "gpt2") else dict(dynamic_batch=True)
    path = zoo / f"{name}_{capability}.onnx"
    return export_onnx(name, path, reduced=True, **(symbolic if dynamic else {}))


@pytest.mark.parametrize("name, capability", RUNS)
def test_each_capability_builds_for_cuda_and_matches_onnxruntime(zoo, name, capability):
    spec = _exported(zoo, name, capability)
    options = dict(CAPABILITIES[capability])
    if capability == "dynamic" and name not in ("bert", "gpt2"):
        options["dynamic"] = {"batch": (1, 4)}
    compiled = treadle.compile(spec.path, target="cuda:sm_80", **options)
    assert compiled.executable.arch == "sm_80"
    assert_matches(compiled, reference(spec.path), spec.random_inputs(),
                   f"{name} ({capability}) in the GPU simulator",
                   run=compiled.executable.simulate)


@pytest.mark.skipif(cuda_runtime.available(), reason="this machine has a GPU to measure on")
def test_measuring_for_cuda_without_a_device_says_which_device_is_missing():
    x = ops.input("x", "float32", [33, 64])
    y = ops.matmul(x, ops.constant(random_array((64, 48), seed=1)))
    with pytest.raises(DeviceUnavailableError, match="measuring CUDA kernels for sm_80 "
                                                     "needs a CUDA device"):
        compile_graph(ops.graph([x], [y], "mm"), tune=1, target=cuda_target("sm_80"))


def test_large_constant_work_is_folded_by_the_compiler_itself():
    """Folding asks the driver to run what the evaluator will not take on: the exponential
    of a large constant is one constant in the compiled model."""
    table = random_array((300, 257), seed=2)
    x = ops.input("x", "float32", [300, 257])
    y = ops.add(x, ops.op("Exp", ops.constant(table)))
    model = compile_graph(ops.graph([x], [y], "folded"))
    assert len(model.steps) == 1
    xv = random_array((300, 257), seed=3)
    assert_close(model(xv)[0], xv + np.exp(table))
