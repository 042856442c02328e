"""treadle.compile / CompiledModel / save / load: inputs of every kind, calls from several
threads, and saved models that load without a compiler and refuse to be corrupted."""
from __future__ import annotations

import hashlib
import io
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
from onnx import helper

import treadle
from tests.frontend.onnx_models import affine_model, make_model, tensor
from tests.harness import assert_close, random_array, run_onnxruntime
from treadle.config import override
from treadle.errors import ArgumentError, CompileError, ModelError, ShapeError
from treadle.graph.graph import Graph
from treadle.graph.operator import apply
from treadle.graph.tensor import Tensor
from treadle.runtime.saved import from_data

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
    (lambda folder: (folder / "program.json").write_bytes(b"{}"), "program.json: corrupt"),
    (lambda folder: (folder / "program.json").unlink(), "program.json: missing"),
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
    return from_data(json.loads((folder / "program.json").read_text()), {}).slots[int(slot)].name


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


def dense_softmax_model() -> onnx.ModelProto:
    """softmax(reshape(relu(x @ w + b), [-1, 2, 2])) with x: float32[batch, 6]: a matrix
    product with weights, a view and a row reduction, over a symbolic batch."""
    rng = np.random.default_rng(7)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["xw"], name="dense"),
             helper.make_node("Add", ["xw", "b"], ["biased"], name="bias"),
             helper.make_node("Relu", ["biased"], ["active"], name="relu"),
             helper.make_node("Reshape", ["active", "pairs"], ["paired"], name="pair"),
             helper.make_node("Softmax", ["paired"], ["y"], name="softmax", axis=-1)]
    return make_model(nodes, [tensor("x", ["batch", 6])], [tensor("y", ["batch", 2, 2])],
                      {"w": rng.standard_normal((6, 4)).astype(np.float32),
                       "b": rng.standard_normal(4).astype(np.float32),
                       "pairs": np.array([-1, 2, 2], np.int64)})


def test_a_loaded_model_computes_what_it_did_before_saving(tmp_path):
    model = treadle.compile(dense_softmax_model())
    model.save(tmp_path / "saved")
    loaded = treadle.load(tmp_path / "saved")
    assert (loaded.input_names, loaded.output_names) == (["x"], ["y"])
    assert loaded.executable.slots == model.executable.slots  # names, dtypes, symbolic dims
    for batch in (4, 2039):
        x = random_array((batch, 6), seed=batch)
        np.testing.assert_array_equal(loaded(x)[0], model(x)[0])
        assert_close(loaded(x)[0], run_onnxruntime(dense_softmax_model(), {"x": x})[0])
    with pytest.raises(ShapeError, match="input 'x': expected shape"):  # checks kept too
        loaded(random_array((3, 7)))


class Payload:
    """Unpickling one creates the file ``marker``: the proof that a load ran its code."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return open, (str(self.marker), "w")


def _arrays(**arrays) -> bytes:
    """An .npz archive of ``arrays``; numpy pickles an object array into it."""
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


@pytest.mark.parametrize("file, pack", [
    ("program.json", pickle.dumps),
    ("constants.npz", lambda payload: _arrays(**{"0": np.array([payload], dtype=object)}))])
def test_a_pickle_in_a_saved_model_is_refused_and_never_run(compiled, tmp_path, file, pack):
    """The manifest agrees with the doctored file, as it would with a crafted folder."""
    live = tmp_path / "live"
    pickle.loads(pickle.dumps(Payload(live))).close()
    assert live.exists()  # the payload does run when unpickled
    compiled.save(tmp_path / "saved")
    marker = tmp_path / "ran"
    _rewrite(tmp_path / "saved", file, pack(Payload(marker)))
    with pytest.raises(ModelError, match=re.escape(str(tmp_path / "saved" / file)) + ": not"):
        treadle.load(tmp_path / "saved")
    assert not marker.exists()


def _edit_program(edit):
    """Damage made by ``edit(data)`` on the program's JSON, which the manifest agrees with."""
    def damage(folder):
        data = json.loads((folder / "program.json").read_text())
        edit(data)
        _rewrite(folder, "program.json", json.dumps(data).encode())
    return damage


def _node(data: dict, kind: str) -> list:
    return next(node for node in data["nodes"] if node[0] == kind)


def _set_version(folder, version):
    manifest = json.loads((folder / "manifest.json").read_text())
    (folder / "manifest.json").write_text(json.dumps({**manifest, "version": version}))


@pytest.mark.parametrize("damage, file, message", [
    (lambda f: _rewrite(f, "program.json", b"{not json"), "program.json", "not JSON"),
    (lambda f: _rewrite(f, "program.json", b"\xff\xfe"), "program.json", "not JSON"),
    (lambda f: _rewrite(f, "program.json", b"[1, 2]"), "program.json",
     "not a treadle program"),
    (_edit_program(lambda d: d.update(version=99)), "program.json",
     "program format version 99; this treadle reads version 1"),
    (lambda f: _set_version(f, 1), "manifest.json", "saved by format version 1"),
    (_edit_program(lambda d: d.pop("steps")), "program.json", "lacks steps"),
    (_edit_program(lambda d: d.update(name=["x"])), "program.json",
     "program: field 'name' is tuple, expected str"),
    (_edit_program(lambda d: d["nodes"].append(["os.system", "touch ran"])), "program.json",
     r"node \d+: .*os.system.* is no node of a treadle program"),
    (_edit_program(lambda d: _node(d, "Var").__setitem__(1, 3)), "program.json",
     r"node \d+ \(Var\): field 'name' is int, expected str"),
    (_edit_program(lambda d: _node(d, "DataType").__setitem__(1, "float33")), "program.json",
     "unknown dtype 'float33'"),
    (_edit_program(lambda d: _node(d, "Binary").__setitem__(1, "??")), "program.json",
     r"\(Binary\): unknown binary op"),
    (_edit_program(lambda d: _node(d, "Binary").__setitem__(2, {"#": 10 ** 6})),
     "program.json", "refers to no earlier node"),
    (_edit_program(lambda d: _node(d, "SavedStep").__setitem__(2, "elsewhere")),
     "program.json", "calls 'elsewhere', which no library holds"),
    (_edit_program(lambda d: _node(d, "SavedStep").__setitem__(3, [99])), "program.json",
     "names slots the program lacks"),
    (_edit_program(lambda d: d.update(inputs=[-1])), "program.json",
     r"inputs \[-1\] name slots the program lacks"),
    (lambda f: _rewrite(f, "constants.npz", b"junk"), "constants.npz",
     "not an .npz archive"),
    (lambda f: _rewrite(f, "constants.npz", _arrays(weights=np.zeros(5, np.float32))),
     "constants.npz", "array 'weights' is named by no tensor slot"),
])
def test_a_damaged_program_is_a_model_error_naming_its_file(compiled, tmp_path, damage, file,
                                                            message):
    compiled.save(tmp_path / "saved")
    damage(tmp_path / "saved")
    with pytest.raises(ModelError) as raised:
        treadle.load(tmp_path / "saved")
    assert str(raised.value).startswith(str(tmp_path / "saved" / file) + ":"), raised.value
    assert re.search(message, str(raised.value)), raised.value


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
