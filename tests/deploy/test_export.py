"""The exported C artifact: the example program built with make, run as a subprocess on
inputs written here, against ONNX Runtime, for a reduced ResNet-50 and a reduced BERT
whose sequence length is symbolic (7 and 61 from one export); bad input driven through
the example program (each a status code and a message naming the input or file, never a
crash); concurrent runs of one model; what cannot be exported; the CLI command.

Outputs are compared with ONNX Runtime's by their largest error over the output's
largest magnitude (at least 1), within TOLERANCE: values near zero make elementwise
relative errors meaningless.
"""
from __future__ import annotations

import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

import treadle
from tests.frontend.onnx_models import make_model, tensor
from tests.frontend.test_loop_runtime import dense_loop
from tests.harness import rng
from treadle.cli import main as cli
from treadle.errors import ExportError
from treadle.deploy.loaded import ExportedModel
from treadle.errors import ShapeError

ort = pytest.importorskip("onnxruntime")

TOLERANCE = 1e-4
# treadle_status codes (treadle_model.h)
ARGUMENT, SHAPE, FILE, VERSION, KERNEL = 1, 2, 3, 4, 6
HEADER_VERSION = slice(16, 48)  # the treadle version's bytes in constants.bin's header


def reference(path, inputs: dict) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return session.run(None, inputs)


def assert_matches(actual, expected, context: str) -> None:
    assert len(actual) == len(expected), context
    for k, (got, want) in enumerate(zip(actual, expected)):
        assert got.shape == want.shape and got.dtype == want.dtype, \
            f"{context}, output {k}: {got.dtype}{got.shape} != {want.dtype}{want.shape}"
        largest = max(1.0, float(np.abs(want).max(initial=0.0)))
        error = float(np.abs(got - want).max(initial=0.0)) / largest
        assert error <= TOLERANCE, f"{context}, output {k}: relative error {error:.2e}"


def export_and_build(model, folder: Path) -> Path:
    model.export(folder)
    subprocess.run(["make", "-s", "-C", str(folder)], check=True, capture_output=True)
    return folder


def run_main(folder: Path, work: Path, arrays, *options: str, model_folder: Path | None = None):
    """The example program on ``arrays``: its result and the outputs it wrote."""
    args = []
    for k, array in enumerate(arrays):
        path = work / f"input{k}.bin"
        array.tofile(path)
        args.append(f"{path}:" + "x".join(map(str, array.shape)))
    result = subprocess.run([str(folder / "main"), *options, str(model_folder or folder),
                             str(work / "out"), *args], capture_output=True, text=True,
                            timeout=300)
    outputs = []
    for line in result.stdout.splitlines():
        if line.startswith("output "):
            _, _, _, dtype, rest = line.split(" ", 4)
            dims, path = rest.rsplit(" ", 1)
            shape = [int(d) for d in dims.strip("[]").split(",") if d.strip()]
            outputs.append(np.fromfile(path, dtype).reshape(shape))
    return result, outputs


def assert_refused(result, status: int, *names: str) -> None:
    """An error status with a message naming ``names``; a crash would be a signal."""
    assert result.returncode == status, (result.returncode, result.stderr)
    message = result.stderr.strip()
    assert message.startswith("error: ") and all(n in message for n in names), message


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    pytest.importorskip("torch", reason="the zoo models are built with torch")
    pytest.importorskip("transformers", reason="BERT is built from a transformers config")
    return tmp_path_factory.mktemp("zoo")


@pytest.fixture(scope="module")
def resnet(zoo):
    from treadle.models import export_onnx
    spec = export_onnx("resnet50", zoo / "resnet50.onnx", reduced=True)
    return spec, export_and_build(treadle.compile(spec.path), zoo / "resnet50_c")


@pytest.fixture(scope="module")
def bert(zoo):
    from treadle.models import export_onnx
    spec = export_onnx("bert", zoo / "bert.onnx", reduced=True, dynamic_seq=True)
    return spec, export_and_build(treadle.compile(spec.path), zoo / "bert_c")


def test_resnet_from_c_matches_onnxruntime(resnet, tmp_path):
    spec, folder = resnet
    inputs = spec.random_inputs()
    result, outputs = run_main(folder, tmp_path, list(inputs.values()))
    assert result.returncode == 0, result.stderr
    assert_matches(outputs, reference(spec.path, inputs), "resnet50 from C")


@pytest.mark.parametrize("seq", [7, 61])
def test_bert_runs_every_sequence_length_from_one_export(bert, tmp_path, seq):
    spec, folder = bert
    inputs = spec.random_inputs(seed=seq, seq=seq)
    result, outputs = run_main(folder, tmp_path, list(inputs.values()))
    assert result.returncode == 0, result.stderr
    assert [o.shape for o in outputs] == [(1, seq, 64), (1, 64)]
    assert_matches(outputs, reference(spec.path, inputs), f"bert from C, seq={seq}")


def test_the_api_describes_inputs_and_outputs_with_their_symbolic_sizes(bert):
    model = ExportedModel(bert[1])
    assert [(i.name, i.dtype, i.dims) for i in model.inputs] == [
        (name, np.dtype(np.int64), ["1", "seq"])
        for name in ("input_ids", "attention_mask", "token_type_ids")]
    assert [(o.name, o.dims) for o in model.outputs] == [
        ("last_hidden_state", ["1", "seq", "64"]), ("pooler_output", ["1", "64"])]


def test_concurrent_runs_of_one_model_at_different_sizes(bert):
    spec, folder = bert
    model = ExportedModel(folder)
    cases = [spec.random_inputs(seed=seq, seq=seq) for seq in (7, 61, 16, 33)]

    def run(inputs):
        return [model(*inputs.values()) for _ in range(4)]
    with ThreadPoolExecutor(max_workers=len(cases)) as pool:
        results = list(pool.map(run, cases))
    for inputs, runs in zip(cases, results):
        seq = inputs["input_ids"].shape[1]
        for outputs in runs:
            assert_matches(outputs, reference(spec.path, inputs), f"seq={seq} in a thread")


# ---- bad input, through the example program ----------------------------------------------

def test_a_wrong_number_of_inputs(bert, tmp_path):
    spec, folder = bert
    arrays = list(spec.random_inputs(seq=7).values())[:2]
    result, _ = run_main(folder, tmp_path, arrays)
    assert_refused(result, ARGUMENT, "takes 3 inputs",
                   "input_ids, attention_mask, token_type_ids", "got 2")


def test_a_null_buffer(bert, tmp_path):
    spec, folder = bert
    result, _ = run_main(folder, tmp_path, list(spec.random_inputs(seq=7).values()),
                         "--null", "1")
    assert_refused(result, ARGUMENT, "input 1 'attention_mask'", "NULL")


def test_a_size_that_contradicts_a_symbol_bound_by_another_input(bert, tmp_path):
    spec, folder = bert
    ids, mask, types = spec.random_inputs(seq=7).values()
    longer = np.ones((1, 8), np.int64)
    result, _ = run_main(folder, tmp_path, [ids, longer, types])
    assert_refused(result, SHAPE, "input 1 'attention_mask'", "is 8, expected 7",
                   "seq is dimension 1 of input 'input_ids'")


def test_a_check_inside_a_kernel_names_its_step(bert, tmp_path):
    spec, folder = bert
    ids, mask, types = spec.random_inputs(seq=7).values()
    ids[0, 3] = 5000  # the vocabulary has 1000 tokens
    result, _ = run_main(folder, tmp_path, [ids, mask, types])
    assert_refused(result, KERNEL, "step /model/embeddings/word_embeddings/Gather", "5000")


def copied(folder: Path, tmp_path: Path) -> Path:
    """The folder's data files alone: the example program loads its library beside it."""
    copy = tmp_path / "copy"
    copy.mkdir()
    shutil.copyfile(folder / "constants.bin", copy / "constants.bin")
    return copy


def test_a_folder_from_another_treadle_version(bert, tmp_path):
    spec, folder = bert
    copy = copied(folder, tmp_path)
    data = bytearray((copy / "constants.bin").read_bytes())
    data[HEADER_VERSION] = b"0.0.1".ljust(32, b"\0")
    (copy / "constants.bin").write_bytes(data)
    result, _ = run_main(folder, tmp_path, list(spec.random_inputs(seq=7).values()),
                         model_folder=copy)
    assert_refused(result, VERSION, f"{copy}/constants.bin", "treadle 0.0.1",
                   f"treadle {treadle.__version__}")


def test_the_constants_of_another_model(bert, resnet, tmp_path):
    spec, folder = bert
    copy = copied(resnet[1], tmp_path)
    result, _ = run_main(folder, tmp_path, list(spec.random_inputs(seq=7).values()),
                         model_folder=copy)
    assert_refused(result, VERSION, f"{copy}/constants.bin", "another model")


def _flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x40
    path.write_bytes(data)


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-3])


@pytest.mark.parametrize("damage, message", [
    (_flip_last_byte, "its checksum differs"), (_truncate, "shorter than"),
    (lambda path: path.write_bytes(path.read_bytes()[:50]), "shorter than its header"),
    (lambda path: path.write_bytes(path.read_bytes() + b"\0"), "longer than"),
    (Path.unlink, "cannot open")])
def test_a_damaged_constants_file(bert, tmp_path, damage, message):
    spec, folder = bert
    copy = copied(folder, tmp_path)
    damage(copy / "constants.bin")
    result, _ = run_main(folder, tmp_path, list(spec.random_inputs(seq=7).values()),
                         model_folder=copy)
    assert_refused(result, FILE, f"{copy}/constants.bin", message)


# ---- small models: sizes, outputs that are inputs, saved models --------------------------

def affine_relu(tmp_path: Path) -> Path:
    """y = relu(x @ w + b) for x: float32[n, 5], and the input itself as a second output."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["xw"]),
             helper.make_node("Add", ["xw", "b"], ["pre"]),
             helper.make_node("Relu", ["pre"], ["y"]),
             helper.make_node("Identity", ["x"], ["x_again"])]
    constants = {"w": rng(1).standard_normal((5, 3)).astype(np.float32),
                 "b": rng(2).standard_normal(3).astype(np.float32)}
    model = make_model(nodes, [tensor("x", ["n", 5])],
                       [tensor("y", ["n", 3]), tensor("x_again", ["n", 5])], constants)
    path = tmp_path / "affine.onnx"
    path.write_bytes(model.SerializeToString())
    return path


@pytest.mark.parametrize("n", [0, 1, 7, 2039])
def test_a_symbolic_batch_at_odd_prime_and_zero_sizes(tmp_path, n):
    path = affine_relu(tmp_path)
    treadle.compile(path).export(tmp_path / "c")
    x = rng(n).standard_normal((n, 5)).astype(np.float32)
    assert_matches(ExportedModel(tmp_path / "c")(x), reference(path, {"x": x}), f"n={n}")


def test_a_loaded_model_exports_as_the_compiled_one(tmp_path):
    path = affine_relu(tmp_path)
    treadle.compile(path).save(tmp_path / "saved")
    treadle.load(tmp_path / "saved").export(tmp_path / "c")
    x = rng(3).standard_normal((3, 5)).astype(np.float32)
    assert_matches(ExportedModel(tmp_path / "c")(x), reference(path, {"x": x}), "loaded")


def test_an_export_replaces_an_earlier_one_and_nothing_else(tmp_path):
    model = treadle.compile(affine_relu(tmp_path))
    model.export(tmp_path / "c")
    model.export(tmp_path / "c")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    with pytest.raises(FileExistsError, match="not an exported treadle model"):
        model.export(tmp_path / "mine")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep"


def test_an_input_shape_that_contradicts_the_model_is_a_shape_error(tmp_path):
    treadle.compile(affine_relu(tmp_path)).export(tmp_path / "c")
    with pytest.raises(ShapeError, match=r"input 0 'x': dimension 1 is 4, expected 5"):
        ExportedModel(tmp_path / "c")(np.zeros((2, 4), np.float32))


# ---- what cannot be exported -------------------------------------------------------------

def test_a_loop_run_on_the_host_is_refused(tmp_path):
    with pytest.raises(ExportError, match="step 'dense_loop' runs on the host"):
        treadle.compile(dense_loop()).export(tmp_path / "c")
    assert not (tmp_path / "c").exists()


def test_sizes_found_in_the_data_are_refused(tmp_path):
    model = make_model([helper.make_node("NonZero", ["x"], ["where"])],
                       [tensor("x", [6])], [tensor("where", [1, None], TensorProto.INT64)])
    with pytest.raises(ExportError, match="found in the data"):
        treadle.compile(model).export(tmp_path / "c")


def test_a_cuda_model_is_refused(tmp_path):
    if shutil.which("nvcc") is None:
        pytest.skip("building CUDA kernels needs nvcc")
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [tensor("x", [4])],
                       [tensor("y", [4])])
    with pytest.raises(ExportError, match="compiled for CUDA"):
        treadle.compile(model, target="cuda").export(tmp_path / "c")


# ---- the command ---------------------------------------------------------------------------

def test_the_export_command_fixes_a_dimension(tmp_path, capsys):
    path = affine_relu(tmp_path)
    assert cli(["export", str(path), "-o", str(tmp_path / "c"), "--dim", "n=3"]) == 0
    assert "exported 'test'" in capsys.readouterr().out
    model = ExportedModel(tmp_path / "c")
    assert model.inputs[0].dims == ["3", "5"]
    x = rng(4).standard_normal((3, 5)).astype(np.float32)
    assert_matches(model(x), reference(path, {"x": x}), "--dim n=3")


def test_the_export_command_names_an_unknown_dimension(tmp_path, capsys):
    path = affine_relu(tmp_path)
    assert cli(["export", str(path), "-o", str(tmp_path / "c"), "--dim", "m=3"]) == 2
    assert "--dim m: not a symbolic dimension of the model's inputs (n)" in \
        capsys.readouterr().err
