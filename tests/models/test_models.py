"""The model zoo end to end, at CI size: export each reduced model to ONNX, compile it with
``treadle.compile`` and compare every output with ONNX Runtime's on the same random inputs.

The reduced models keep every kind of layer of the full ones (bench/check_models.py runs
those; the slow tests here run the full image models). Errors are measured
against each output's largest magnitude, since values near zero (logits, normalized
activations) make elementwise relative errors meaningless.
"""
import sys

import numpy as np
import pytest

pytest.importorskip("torch", reason="the zoo models are built and exported with torch "
                    "(pip install 'treadle[test]')")
pytest.importorskip("transformers", reason="BERT, GPT-2 and Segformer are built from "
                    "transformers configs (pip install 'treadle[test]')")
ort = pytest.importorskip("onnxruntime")

import treadle  # noqa: E402
from treadle.models import MODELS, build, export_onnx, require  # noqa: E402
from treadle.runtime import cuda as cuda_runtime  # noqa: E402

RELATIVE_TOLERANCE = 1e-3  # max abs error / max abs value of the output
SEQUENCE_LENGTHS = (1, 7, 16)  # the reduced BERT is exported at 16, its maximum is 64


def reference(path) -> "ort.InferenceSession":
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def assert_matches(compiled, session, inputs, context: str, run=None) -> None:
    """``run`` (``compiled`` itself by default) computes the outputs from named inputs."""
    expected = dict(zip([o.name for o in session.get_outputs()], session.run(None, inputs)))
    actual = dict(zip(compiled.output_names, (run or compiled)(**inputs)))
    assert sorted(actual) == sorted(expected), f"output names differ ({context})"
    for name, want in expected.items():
        got = actual[name]
        where = f"{context}, output {name!r}"
        assert got.shape == want.shape, f"shape {got.shape} != {want.shape} ({where})"
        assert got.dtype == want.dtype, f"dtype {got.dtype} != {want.dtype} ({where})"
        error = float(np.abs(got - want).max()) / float(np.abs(want).max())
        assert error <= RELATIVE_TOLERANCE, f"relative error {error:.2e} ({where})"


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    return tmp_path_factory.mktemp("zoo")


_REDUCED = {}


def reduced(zoo, name: str):
    """The CI-sized model ``name``, exported once per test session."""
    if name not in _REDUCED:
        _REDUCED[name] = export_onnx(name, zoo / f"{name}.onnx", reduced=True)
    return _REDUCED[name]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_reduced_model_matches_onnxruntime(zoo, name):
    spec = reduced(zoo, name)
    compiled = treadle.compile(spec.path)
    assert compiled.input_names == spec.input_names
    assert_matches(compiled, reference(spec.path), spec.random_inputs(), name)


PAPER_MODELS = ("bert", "gpt2", "inception_v3", "mobilenet_v2", "resnet50")
# The CNNs take 10-20 s each in the GPU simulator.
SIMULATED = [*PAPER_MODELS[:2], *(pytest.param(n, marks=pytest.mark.slow)
                                  for n in PAPER_MODELS[2:])]


_FOR_CUDA = {}


def for_cuda(spec):
    """The model compiled for an sm_80 GPU, once per test session."""
    if spec.name not in _FOR_CUDA:
        _FOR_CUDA[spec.name] = treadle.compile(spec.path, target="cuda:sm_80")
    return _FOR_CUDA[spec.name]


@pytest.mark.parametrize("name", PAPER_MODELS)
def test_paper_model_builds_for_cuda(zoo, name):
    """Every kernel of the model in CUDA C, built by nvcc within the limits of an sm_80
    GPU; on a machine with a GPU, run there too."""
    spec = reduced(zoo, name)
    assert for_cuda(spec).executable.arch == "sm_80"
    if cuda_runtime.available():
        gpu = treadle.compile(spec.path, target="cuda")
        assert_matches(gpu, reference(spec.path), spec.random_inputs(), f"{name} on the GPU")


@pytest.mark.parametrize("name", SIMULATED)
def test_paper_model_in_the_gpu_simulator_matches_onnxruntime(zoo, name):
    spec = reduced(zoo, name)
    compiled = for_cuda(spec)
    assert_matches(compiled, reference(spec.path), spec.random_inputs(),
                   f"{name} in the GPU simulator", run=compiled.executable.simulate)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(n for n, r in MODELS.items()
                                        if r.family in ("dense", "vision", "resnet_variants",
                                                        "deeplab", "video")))
def test_full_model_matches_onnxruntime(zoo, name):
    spec = export_onnx(name, zoo / f"{name}_full.onnx")
    compiled = treadle.compile(spec.path)
    assert_matches(compiled, reference(spec.path), spec.random_inputs(), f"{name} (full)")


@pytest.mark.parametrize("name", ["resnet50", "bert", "efficientvit_block", "r3d_18",
                                  "mamba_small"])
def test_built_module_has_the_exported_weights(zoo, name):
    # At batch 2, so that the exported batch is not the calibration batch or 1.
    torch = require("torch")
    spec = export_onnx(name, zoo / f"{name}_b2.onnx", reduced=True, batch=2)
    inputs = spec.random_inputs()
    assert next(iter(inputs.values())).shape[0] == 2
    with torch.inference_mode():
        outputs = build(name, reduced=True)(*(torch.from_numpy(a) for a in inputs.values()))
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    expected = reference(spec.path).run(None, inputs)
    for got, want in zip(outputs, expected, strict=True):
        error = float(np.abs(got.numpy() - want).max()) / float(np.abs(want).max())
        assert error <= RELATIVE_TOLERANCE, f"{name}: relative error {error:.2e}"


def test_instance_norm_scales_are_random():
    torch = require("torch")
    norms = [m for m in build("candy", reduced=True).modules()
             if isinstance(m, torch.nn.InstanceNorm2d)]
    assert norms and all(not torch.all(m.weight == 1) for m in norms)


def test_bert_with_symbolic_sequence_compiles_once(zoo):
    spec = export_onnx("bert", zoo / "bert_seq.onnx", reduced=True, dynamic_seq=True)
    compiled = treadle.compile(spec.path)
    session = reference(spec.path)
    for seq in SEQUENCE_LENGTHS:
        assert_matches(compiled, session, spec.random_inputs(seed=seq, seq=seq),
                       f"bert, seq={seq}")


def test_dynamic_export_names_the_sequence_axis(zoo):
    onnx = pytest.importorskip("onnx")
    spec = export_onnx("gpt2", zoo / "gpt2_seq.onnx", reduced=True, dynamic_seq=True)
    graph = onnx.load(str(spec.path)).graph
    for value in [*graph.input, *graph.output]:
        dims = [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]
        assert dims[:2] == [1, "seq"], f"{value.name}: {dims}"
    assert {i.name: i.shape for i in spec.inputs} == {"input_ids": (1, "seq"),
                                                     "attention_mask": (1, "seq")}
    assert spec.random_inputs(seq=5)["input_ids"].shape == (1, 5)


def test_cnn_with_symbolic_batch_compiles_once(zoo):
    onnx = pytest.importorskip("onnx")
    spec = export_onnx("mobilenet_v2", zoo / "mobilenet_batch.onnx", reduced=True,
                       dynamic_batch=True)
    graph = onnx.load(str(spec.path)).graph
    for value in [*graph.input, *graph.output]:
        assert value.type.tensor_type.shape.dim[0].dim_param == "batch", value.name
    compiled = treadle.compile(spec.path)
    session = reference(spec.path)
    for batch in (1, 3):
        assert_matches(compiled, session, spec.random_inputs(seed=batch, batch=batch),
                       f"mobilenet_v2, batch={batch}")


def test_export_rejects_what_it_cannot_build(zoo):
    with pytest.raises(ValueError, match="unknown model 'vgg'"):
        export_onnx("vgg", zoo / "vgg.onnx")
    with pytest.raises(ValueError, match="dynamic_seq applies to the transformer"):
        export_onnx("resnet50", zoo / "r.onnx", reduced=True, dynamic_seq=True)
    with pytest.raises(ValueError, match="dynamic_seq applies to the transformer"):
        export_onnx("mamba_small", zoo / "m.onnx", reduced=True, dynamic_seq=True)
    with pytest.raises(ValueError, match="dynamic_batch applies to the CNN"):
        export_onnx("bert", zoo / "b.onnx", reduced=True, dynamic_batch=True)
    with pytest.raises(ValueError, match="attention applies to the transformer"):
        export_onnx("resnet50", zoo / "r.onnx", reduced=True, attention="sdpa")
    with pytest.raises(ValueError, match="fixed shapes"):
        export_onnx("bert", zoo / "b.onnx", reduced=True, dynamic_seq=True, attention="sdpa")


def test_missing_torch_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(ImportError, match=r"pip install 'treadle\[torch\]'"):
        require("torch")
