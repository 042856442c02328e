"""treadle.compile / CompiledModel / save / load: inputs of every kind, calls from several
threads, and saved models that load without a compiler and refuse to be corrupted."""
from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnx
import pytest

import treadle
from tests.frontend.onnx_models import affine_model
from tests.harness import assert_close, random_array, run_onnxruntime
from treadle.config import override
from treadle.errors import ArgumentError, CompileError, ModelError, ShapeError
from treadle.graph.graph import Graph
from treadle.graph.operator import apply
from treadle.graph.tensor import Tensor

pytest.importorskip("onnxruntime")

NO_COMPILER = "/nonexistent/treadle-test-cc"


@pytest.fixture(scope="module")
def compiled():
    return treadle.compile(affine_model())


def expected(x: np.ndarray) -> np.ndarray:
    return run_onnxruntime(affine_model(), {"x": x})[0]


def test_compile_takes_paths_protos_and_graphs(tmp_path):
    path = tmp_path / "affine.onnx"
    onnx.save(affine_model(), path)
    x = random_array((3, 5), seed=1)
    for model in (path, str(path), affine_model()):
        assert_close(treadle.compile(model)(x)[0], expected(x))
    t = Tensor("t", "float32", ("n",))
    graph = Graph.from_outputs([t], apply("Neg", [t], name="neg", output_names=["u"]))
    model = treadle.compile(graph, name="negate")
    assert model.name == "negate" and model.input_names == ["t"] and model.output_names == ["u"]
    assert_close(model(np.arange(4, dtype=np.float32))[0], -np.arange(4, dtype=np.float32))


def test_other_model_types_are_a_clear_type_error():
    with pytest.raises(TypeError, match="ONNX file path, an ONNX model's bytes"):
        treadle.compile(object())


def test_serialized_models_compile_as_onnxruntime_takes_them():
    x = random_array((3, 5), seed=4)
    assert_close(treadle.compile(affine_model().SerializeToString())(x)[0], expected(x))
    with pytest.raises(ModelError, match="bytes given are not a serialized ONNX model"):
        treadle.compile(b"\x07junk")


def test_an_empty_file_is_a_model_error_naming_it(tmp_path):
    """protobuf parses zero bytes as a model without a graph (an interrupted download)."""
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    for source, where in ((empty, str(empty)), (b"", "the 0 bytes given")):
        with pytest.raises(ModelError, match=f"{where}: no ONNX model"):
            treadle.compile(source)


def test_a_directory_is_a_model_error_naming_it(tmp_path):
    with pytest.raises(ModelError, match=f"{tmp_path}: a directory, not an ONNX file"):
        treadle.compile(tmp_path)


def test_calls_by_position_and_by_name(compiled):
    assert compiled.input_names == ["x"] and compiled.output_names == ["y"]
    x = random_array((4, 5), seed=2)
    assert_close(compiled(x)[0], expected(x))
    assert_close(compiled(x=x)[0], expected(x))
    with pytest.raises(ArgumentError, match="missing \\['x'\\]"):
        compiled(z=x)


def test_torch_tensors_are_accepted(compiled):
    torch = pytest.importorskip("torch")
    x = random_array((2, 5), seed=3)
    assert_close(compiled(torch.from_numpy(x))[0], expected(x))


def test_calls_from_several_threads(compiled):
    def work(seed: int) -> bool:
        rng = np.random.default_rng(seed)
        for _ in range(20):
            x = random_array((int(rng.integers(0, 50)), 5), seed=int(rng.integers(1 << 30)))
            if not np.allclose(compiled(x)[0], expected(x), rtol=1e-5, atol=1e-6):
                return False
        return True

    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(work, range(8)))


def test_saved_model_loads_without_the_compiler(compiled, tmp_path):
    compiled.save(tmp_path / "saved")
    with override(cc=NO_COMPILER):
        with pytest.raises(CompileError):  # the override really takes the compiler away
            treadle.compile(treadle_graph_that_needs_a_new_kernel())
        loaded = treadle.load(tmp_path / "saved")
        assert loaded.input_names == ["x"] and loaded.output_names == ["y"]
        assert loaded.executable.runner is not None  # the step runner is saved too
        for size in (0, 1, 7, 64):
            x = random_array((size, 5), seed=size)
            np.testing.assert_array_equal(loaded(x)[0], compiled(x)[0])


def test_saved_model_runs_in_a_fresh_process_without_compiler_or_cache(compiled, tmp_path):
    """Nothing compiled in the process beforehand: the kernels, the step runner and the
    thread pool all come from the saved folder."""
    compiled.save(tmp_path / "saved")
    x = random_array((13, 5), seed=5)
    np.save(tmp_path / "x.npy", x)
    script = ("import sys, numpy as np, treadle\n"
              "model = treadle.load(sys.argv[1])\n"
              "np.save(sys.argv[3], model(np.load(sys.argv[2]))[0])\n")
    source = os.path.dirname(os.path.dirname(treadle.__file__))
    env = {**os.environ, "TREADLE_CC": NO_COMPILER, "TREADLE_CACHE_DIR": str(tmp_path / "empty"),
           "TREADLE_NUM_THREADS": "2",
           "PYTHONPATH": os.pathsep.join([source, os.environ.get("PYTHONPATH", "")])}
    subprocess.run([sys.executable, "-c", script, str(tmp_path / "saved"), str(tmp_path / "x.npy"),
                    str(tmp_path / "y.npy")], env=env, check=True, timeout=120)
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), compiled(x)[0])
    assert not (tmp_path / "empty" / "kernels").exists()  # nothing was built


def treadle_graph_that_needs_a_new_kernel() -> Graph:
    t = Tensor("t", "float64", (3, 7, 11))
    return Graph.from_outputs([t], apply("Softsign", [t], name="fresh"))


def test_saving_again_replaces_a_previous_save(compiled, tmp_path):
    target = tmp_path / "saved"
    target.mkdir()  # an empty directory is fine
    compiled.save(target)
    first = sorted(os.listdir(target))
    compiled.save(target)
    assert sorted(os.listdir(target)) == first
    assert sorted(os.listdir(tmp_path)) == ["saved"]  # no staging folders left behind


def test_saving_never_overwrites_what_the_user_owns(compiled, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="not a saved treadle model"):
        compiled.save(mine)
    assert os.listdir(mine) == ["notes.txt"]
    saved = tmp_path / "saved"
    compiled.save(saved)
    (saved / "notes.txt").write_text("keep me too")
    with pytest.raises(FileExistsError, match="notes.txt"):
        compiled.save(saved)
    assert (saved / "notes.txt").read_text() == "keep me too"
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileExistsError):
        compiled.save(tmp_path / "file")


def _corrupt_library(folder):
    library = next(folder.glob("*.so"))
    data = bytearray(library.read_bytes())
    data[len(data) // 2] ^= 0xFF
    library.write_bytes(bytes(data))


@pytest.mark.parametrize("damage, message", [
    (lambda folder: (folder / "manifest.json").unlink(), "not a saved treadle model"),
    (lambda folder: (folder / "manifest.json").write_text("{not json"), "corrupt"),
    (lambda folder: (folder / "constants.npz").unlink(), "constants.npz: missing"),
    (lambda folder: (folder / "program.pkl").write_bytes(b"\x80\x05junk"), "program.pkl: corrupt"),
    (_corrupt_library, r"\.so: corrupt"),
])
def test_damaged_saves_fail_to_load_with_a_clear_error(compiled, tmp_path, damage, message):
    compiled.save(tmp_path / "saved")
    damage(tmp_path / "saved")
    with pytest.raises(ModelError, match=message):
        treadle.load(tmp_path / "saved")


def _rewrite(folder, file, data: bytes, listed=True):
    """Damage that the manifest agrees with: ``file`` holds ``data`` and the manifest
    lists its hash (or, with ``listed`` False, does not list it at all)."""
    (folder / file).write_bytes(data)
    manifest = json.loads((folder / "manifest.json").read_text())
    if listed:
        manifest["files"][file] = hashlib.sha256(data).hexdigest()
    else:
        del manifest["files"][file]
    (folder / "manifest.json").write_text(json.dumps(manifest))


def _truncate(folder, file, listed=True):
    _rewrite(folder, file, (folder / file).read_bytes()[:3000], listed)


def _kernels(folder):
    return next(folder.glob("kernels_*.so")).name


def _retype_constant(folder):
    with np.load(folder / "constants.npz") as npz:
        arrays = {k: npz[k] for k in npz.files}
    slot = next(iter(arrays))
    arrays[slot] = arrays[slot].astype(np.float64)[None]
    np.savez(folder / "constants.npz", **arrays)
    _rewrite(folder, "constants.npz", (folder / "constants.npz").read_bytes())
    return pickle.loads((folder / "program.pkl").read_bytes())["slots"][int(slot)].name


def _drop_constants(folder):
    np.savez(folder / "constants.npz")
    _rewrite(folder, "constants.npz", (folder / "constants.npz").read_bytes())
    return "lacks the constants"


@pytest.mark.parametrize("damage, message", [
    (lambda f: _truncate(f, _kernels(f), listed=False), "kernels_.*so: not listed in the manifest"),
    (lambda f: _truncate(f, _kernels(f)), "kernels_.*so: not a complete shared object"),
    (lambda f: _truncate(f, "step_runner.so"), "step_runner.so: not a complete shared object"),
    (lambda f: _truncate(f, "thread_pool.so"), "thread_pool.so: not a complete shared object"),
    (lambda f: _rewrite(f, "step_runner.so", (f / "thread_pool.so").read_bytes()),
     "step_runner.so: lacks the symbols treadle_run_steps"),
    (_retype_constant, "constants.npz: constant '{}' is float64"),
    (_drop_constants, "constants.npz: lacks the constants"),
], ids=["unlisted_kernels", "truncated_kernels", "truncated_runner", "truncated_pool",
        "runner_without_entry", "constant_of_wrong_type", "constant_missing"])
def test_damage_the_manifest_agrees_with_is_a_model_error_not_a_crash(compiled, tmp_path, damage,
                                                                     message):
    """Opening a truncated shared object kills the process (SIGBUS), so the load runs in a
    child: a regression fails this test instead of ending the test run."""
    compiled.save(tmp_path / "saved")
    message = message.format(damage(tmp_path / "saved"))
    script = ("import sys, treadle\n"
              "try:\n"
              "    treadle.load(sys.argv[1])\n"
              "except treadle.errors.ModelError as err:\n"
              "    print(err)\n"
              "    sys.exit(3)\n")
    result = subprocess.run([sys.executable, "-c", script, str(tmp_path / "saved")],
                            env=_child_environment(tmp_path), capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 3, result.stderr
    assert re.search(message, result.stdout), result.stdout
    assert str(tmp_path / "saved") in result.stdout


def _child_environment(tmp_path) -> dict:
    source = os.path.dirname(os.path.dirname(treadle.__file__))
    return {**os.environ, "TREADLE_CC": NO_COMPILER, "TREADLE_CACHE_DIR": str(tmp_path / "cache"),
            "PYTHONPATH": os.pathsep.join([source, os.environ.get("PYTHONPATH", "")])}


def test_loading_a_missing_directory_is_a_model_error(tmp_path):
    with pytest.raises(ModelError, match="not a saved treadle model"):
        treadle.load(tmp_path / "nowhere")


def test_fixing_input_shapes_makes_the_model_static():
    from treadle import ops
    x = ops.input("x", "float32", ["batch", 4])
    model = treadle.compile(ops.graph([x], [ops.relu(x)]), shapes={"x": [3, 4]})
    assert model.executable.symbols == []
    np.testing.assert_array_equal(model(np.full((3, 4), -1, np.float32))[0], np.zeros((3, 4)))
    with pytest.raises(ShapeError, match="'x'"):
        model(np.zeros((2, 4), np.float32))
