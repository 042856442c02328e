"""The public entry points: compile a model, call it, save it and load it back.

A saved model is a directory that runs without the compiler:

    manifest.json         format and version, and every other file with its sha256
    program.json          tensor slots, the step list and the lowered IR of every kernel,
                          as plain data (``runtime.saved``)
    constants.npz         the constant tensors, by slot
    kernels_<hash>.so     the shared objects, copied from the kernel cache (a model
                          compiled for CUDA has kernels_<hash>.cubin instead, and its
                          manifest names the GPU architecture rather than CPU features)

Shared objects are named by content hash because the dynamic loader reuses a library
already loaded from the same path, so a path must never name two different binaries.
Loading checks every file's hash, then reads the program as data, checking every field,
and loads the shared objects: they are the only code a saved model holds, and they run,
so load only saved models you trust, as with any shared object.
Every file that is loaded must be listed with its hash, since opening a damaged shared
object can kill the process (``backend.elf``); the constants must have the dtypes and
shapes the program gives their tensors, and cover every tensor no step writes.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import threading
import zipfile
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

import numpy as np

from treadle.backend.build import sha256_of
from treadle.compiler import compile_graph
from treadle.config import override, runner_name
from treadle.deploy import export as export_folder
from treadle.errors import IRError, ModelError, NeedsValueError
from treadle.graph.graph import Graph
from treadle.graph.passes.infer_shapes import infer_shapes
from treadle.runtime import pool
from treadle.runtime.cuda_executor import CudaExecutable, CudaLaunches
from treadle.runtime.executor import Executable, Step
from treadle.runtime.module import load as load_library
from treadle.runtime.saved import (Program, SavedKernel, SavedLibrary, SavedStep, from_data,
                                   to_data)
from treadle.specialise import SpecialisingModel, value_inputs
from treadle.target.cpu import host
from treadle.tune.dynamic import size_ranges
from treadle.tune.choice import LEVELS

if TYPE_CHECKING:
    import onnx
    import torch

FORMAT = "treadle-saved-model"
VERSION = 2  # 1 held the program as a pickle
MANIFEST = "manifest.json"
PROGRAM = "program.json"
CONSTANTS = "constants.npz"
RUNNER = "step_runner.so"  # the step runner (runtime.step_runner); older saves have none
POOL = "thread_pool.so"  # the thread pool (runtime.pool); older saves have none
FILE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")  # what a manifest may list


class CompiledModel:
    """A compiled model: ``model(*arrays)`` or ``model(**named)`` returns its outputs as a
    list of numpy arrays. Inputs may be numpy arrays or torch tensors. Calls from several
    threads at once are safe."""

    def __init__(self, executable: Executable, name: str):
        self.executable = executable
        self.name = name

    @property
    def input_names(self) -> list[str]:
        return self.executable.input_names

    @property
    def output_names(self) -> list[str]:
        return self.executable.output_names

    def __call__(self, *args, **named) -> list[np.ndarray]:
        return self.executable(*args, **named)

    def save(self, directory: str | os.PathLike) -> None:
        """Writes everything needed to run the model into ``directory``, which must be
        missing, empty or a previous save (which is replaced)."""
        _save(self, Path(directory))

    def export(self, directory: str | os.PathLike) -> Path:
        """Writes a folder that runs the model from C, without Python: one shared
        library, its header, the constants and an example program (``treadle.deploy``;
        docs/deployment.md). ``directory`` must be missing, empty or an earlier export."""
        return export_folder(self.executable, self.name, directory)

    def __repr__(self) -> str:
        return f"CompiledModel({self.name!r}, inputs={self.input_names}, " \
               f"outputs={self.output_names})"


class CompiledModule(CompiledModel):
    """A compiled ``torch.nn.Module``, called as the module is: it returns what the module
    returns (a tensor, a tuple, a dict, nested), as torch tensors where it is called with
    tensors. Its kernels hold the parameters and buffers as constants, so a call after
    one changed (written in place, ``load_state_dict``, given new memory) compiles the
    module again first. Saved and loaded, it returns the list of a ``CompiledModel``."""

    def __init__(self, module: torch.nn.Module, compile_module: Callable[[], tuple]):
        from treadle.frontend.torch import Weights
        self.weights = Weights(module)
        self.stamp = self.weights.stamp()  # before compiling reads them
        self.compile_module = compile_module
        self.lock = threading.Lock()
        model, self.returns = compile_module()
        super().__init__(model.executable, model.name)

    def __call__(self, *args, **named):
        with self.lock:
            stamp = self.weights.stamp()
            if stamp != self.stamp:
                model, self.returns = self.compile_module()
                self.executable, self.stamp = model.executable, stamp
            executable, returns = self.executable, self.returns
        from treadle.frontend.torch import host_values
        outputs = executable(*host_values(args), **dict(zip(named, host_values(named.values()))))
        return returns.arrange(outputs, (*args, *named.values()))


def compile(model: str | os.PathLike | bytes | onnx.ModelProto | Graph | torch.nn.Module,
            example_inputs=None, *, name: str | None = None, tune: int | str = 0,
            shapes: Mapping[str, Sequence] | None = None,
            dynamic: Mapping[str, object] | None = None,
            dims: Mapping[str | int, Mapping[int, object]] | None = None,
            orchestrate: bool = False, target: str = "cpu", runner: str | None = None
            ) -> CompiledModel | SpecialisingModel:
    """Compiles an ONNX model (a file path, its serialized bytes or an ``onnx.ModelProto``),
    a treadle graph, or a ``torch.nn.Module`` in eval mode called on ``example_inputs`` (a
    tensor or a tuple of them; traced by ``torch.export``, weights become constants),
    which gives a ``CompiledModule`` returning what the module returns.

    ``tune`` picks how template schedules (matrix multiplications, convolutions) are
    chosen: 0 an analytic default for the target, 1 the fastest of a small measured space,
    2 of the full space, ``"construct"`` one constructed without measuring (Gensor),
    ``"construct+measure"`` the fastest of a few constructed ones; measured results are
    recorded, so compiling the same model again measures nothing. ``shapes`` fixes input
    shapes by name (``{"input_ids": [1, 128]}``), turning symbolic dimensions into numbers.

    ``dynamic`` declares the sizes a symbolic dimension takes, as ``{"seq": (1, 512)}``, a
    list of the sizes expected, or a ``{size: weight}`` histogram: the kernels whose sizes
    depend on it get a few variants tuned over the whole range at once and a dispatcher
    choosing among them at each call (DietCode; ``treadle.tune.dynamic``). Every size
    still runs, in the range or out of it. A torch module's symbolic dimensions are named
    by ``dims``, by argument and axis: ``{"input_ids": {1: "seq"}}`` (a
    ``torch.export.Dim`` may stand for a name).

    ``orchestrate=True`` chooses the kernels as Korch does (``treadle.orchestrate``): the
    cheapest set of candidate kernels over primitives, picked by a binary linear program,
    never worse than the default fusion by measurement.

    ``target`` is ``"cpu"`` (this machine's processor) or ``"cuda"``: CUDA C for this
    machine's GPU, or an sm_80 one where it has none (``"cuda:sm_90"`` names it). It builds
    wherever nvcc is; without a GPU, what measures (``tune=1``) raises
    ``DeviceUnavailableError``, while ``"construct"`` and orchestration work.

    ``runner`` (``TREADLE_RUNNER`` where not given) is where tuning times candidates:
    ``"local"``, or a Ray cluster's nodes with this CPU, ``"ray"`` or ``"ray://host:port"``.

    An ONNX model whose shapes depend on the contents of small inputs (a Reshape's target
    shape given as a graph input) gives a ``SpecialisingModel``, compiled at the first call
    with each distinct content (``treadle.specialise``)."""
    if tune not in LEVELS:
        raise ValueError(f"tune={tune!r}: expected one of {', '.join(map(repr, LEVELS))}")
    strategy, device = "orchestrate" if orchestrate else "greedy", _target(target)
    runner = None if runner is None else runner_name(runner)  # checked before compiling
    ranges = _ranges(dynamic, tune)
    if _is_module(model):
        return CompiledModule(model, lambda: _compile_module(
            model, example_inputs, dims, name, tune, shapes, ranges, strategy, device, runner))
    if example_inputs is not None or dims is not None:
        raise TypeError("example_inputs and dims are for torch modules; an ONNX model or a "
                        "graph declares its inputs and names its dimensions")
    compile_one = functools.partial(_compile, name=name, tune=tune, shapes=shapes,
                                    ranges=ranges, strategy=strategy, target=device,
                                    runner=runner)
    try:
        return compile_one(model)
    except NeedsValueError as err:
        return _specialising(model, err, compile_one, name)


def _specialising(model, err: NeedsValueError, compile_one: Callable, name: str | None
                  ) -> SpecialisingModel:
    """The model compiled per content of the inputs its shapes depend on, where the
    value ``err`` needed is one of them."""
    from treadle.frontend.onnx import load_model
    proto = None if isinstance(model, Graph) else load_model(model)
    inputs = [] if proto is None else value_inputs(proto, err.tensor)
    if not inputs:
        raise err
    return SpecialisingModel(proto, inputs, compile_one, name or proto.graph.name or "model")


def _ranges(dynamic, tune: int | str) -> dict:
    """The size ranges ``dynamic`` declares, by symbol."""
    named = [k for k, v in (dynamic or {}).items() if isinstance(v, Mapping)
             and any(isinstance(d, str) or hasattr(d, "__name__") for d in v.values())]
    if named:
        raise ValueError(f"dynamic[{named[0]!r}] names dimensions: dynamic= gives size ranges "
                         "by symbol ({'seq': (1, 128)}); a module's dimensions are named by "
                         "dims= ({'x': {1: 'seq'}})")
    ranges = size_ranges(dynamic) if dynamic else {}
    if ranges and isinstance(tune, str):
        raise ValueError(f"tune={tune!r} does not combine with dynamic=: dynamic shapes are "
                         "tuned by measurement (tune=0, 1 or 2)")
    return ranges


def _is_module(model) -> bool:
    torch = sys.modules.get("torch")  # a module can only exist once torch is imported
    return torch is not None and isinstance(model, torch.nn.Module)


def _compile_module(module: torch.nn.Module, example_inputs, dims, name: str | None,
                    tune: int | str, shapes, ranges, strategy: str, target,
                    runner: str | None) -> tuple:
    """The module traced by ``torch.export`` and compiled, and how it returns its outputs
    (``frontend.torch.Returns``)."""
    from treadle.frontend.torch import from_module
    graph, returns = from_module(module, example_inputs, dims=dims, name=name)
    return _compile(graph, name, tune, shapes, ranges, strategy, target, runner), returns


def _compile(model, name: str | None, tune: int | str, shapes, ranges, strategy: str,
             target, runner: str | None) -> CompiledModel:
    graph = _as_graph(model, name)
    if shapes:
        graph = infer_shapes(graph, shapes)
    if ranges:
        _check_symbols(graph, ranges)
    # The runner holds while this model compiles (a specialising model's later compiles too).
    with override(runner=runner) if runner else contextlib.nullcontext():
        executable = compile_graph(graph, tune=tune, strategy=strategy, dynamic=ranges,
                                   target=target)
    return CompiledModel(executable, graph.name)


def _target(name: str):
    """The target a ``compile(target=...)`` string names."""
    if name == "cpu":
        return host()
    kind, _, arch = name.partition(":")
    if kind != "cuda":
        raise ValueError(f"target={name!r}: expected 'cpu', 'cuda' or 'cuda:<arch>'")
    from treadle.runtime.cuda import available, device_target
    from treadle.target.cuda import cuda_target
    if arch:
        return cuda_target(arch)
    return device_target() if available() else cuda_target()


def _check_symbols(graph: Graph, ranges: Mapping) -> None:
    symbols = graph.symbols
    unknown = sorted(set(ranges) - symbols)
    if unknown:
        raise ValueError(f"dynamic names {', '.join(map(repr, unknown))}, which no input of "
                         f"{graph.name!r} has as a dimension (its symbols: "
                         f"{', '.join(sorted(symbols)) or 'none'})")


def _as_graph(model, name: str | None) -> Graph:
    if isinstance(model, Graph):
        return replace(model, name=name) if name else model
    if isinstance(model, (str, os.PathLike, bytes, bytearray)) or \
            type(model).__name__ == "ModelProto":
        from treadle.frontend.onnx import from_onnx
        return from_onnx(model, name)
    raise TypeError(f"treadle.compile takes an ONNX file path, an ONNX model's bytes, an "
                    f"onnx.ModelProto or a treadle Graph, not "
                    f"{type(model).__module__}.{type(model).__qualname__}")


# ---- saving --------------------------------------------------------------------------------

def _save(model: CompiledModel, directory: Path) -> None:
    """Writes the model into a fresh folder beside ``directory`` and moves it into place,
    so an interrupted save leaves no half-written model behind."""
    previous = _previous_save(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=directory.parent, prefix=f".{directory.name}.saving."))
    try:
        _write(model, staging)
        if previous is None:
            os.replace(staging, directory)  # also replaces an empty directory
        else:
            _replace_previous(directory, staging, previous)
    finally:
        if staging.exists():
            shutil.rmtree(staging)


def _previous_save(directory: Path) -> list[str] | None:
    """The files of a previous save in ``directory``; None when it is missing or empty;
    an error when it holds anything else, so nothing the user owns is overwritten."""
    if not directory.exists():
        return None
    if not directory.is_dir():
        raise FileExistsError(f"{directory} exists and is not a directory")
    entries = sorted(p.name for p in directory.iterdir())
    if not entries:
        return None
    try:
        files = [MANIFEST, *_read_manifest(directory)["files"]]
    except ModelError:
        files = []
    extra = [e for e in entries if e not in files]
    if not files or extra:
        raise FileExistsError(f"{directory} is not empty and not a saved treadle model "
                              f"(it holds {', '.join(extra[:5])}); choose another directory")
    return entries


def _replace_previous(directory: Path, staging: Path, files: list[str]) -> None:
    old = Path(tempfile.mkdtemp(dir=directory.parent, prefix=f".{directory.name}.old."))
    os.replace(directory, old / "model")
    os.replace(staging, directory)
    for name in files:
        (old / "model" / name).unlink()
    (old / "model").rmdir()
    old.rmdir()


def _write(model: CompiledModel, folder: Path) -> None:
    ex = model.executable
    cuda = isinstance(ex, CudaExecutable)
    libraries = _write_cubins(ex, folder) if cuda else _write_libraries(ex, folder)
    steps = tuple(SavedStep(s.name, None if s.kernel is None else s.kernel.function.name,
                            s.args, s.outputs, s.workspaces) for s in ex.steps)
    data, arrays = to_data(Program(model.name, ex.slots, ex.inputs, ex.outputs, libraries,
                                   steps, ex.constants))
    (folder / PROGRAM).write_text(json.dumps(data, separators=(",", ":"), allow_nan=False))
    np.savez(folder / CONSTANTS, **arrays)
    names = [PROGRAM, CONSTANTS, *(library.file for library in libraries)]
    if ex.runner is not None:
        shutil.copyfile(ex.runner, folder / RUNNER)
        names.append(RUNNER)
    if not cuda:
        shutil.copyfile(pool.library_path(), folder / POOL)
        names.append(POOL)
    files = {name: sha256_of(folder / name) for name in names}
    # The kernels were compiled for this CPU's instruction-set extensions, or a GPU's
    # architecture.
    target = {"cuda_arch": ex.arch} if cuda else {"cpu_features": list(host().features)}
    manifest = {"format": FORMAT, "version": VERSION, "name": model.name, **target,
                "files": files}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1))


def _write_libraries(ex: Executable, folder: Path) -> tuple[SavedLibrary, ...]:
    """The shared objects, each with the functions it defines."""
    libraries: dict[Path, dict] = {}
    for step in ex.steps:
        if step.kernel is not None:
            function = step.kernel.function
            libraries.setdefault(step.kernel.path, {})[function.name] = SavedKernel(function)
    table = []
    for path, kernels in libraries.items():
        file = f"kernels_{sha256_of(path)[:32]}.so"
        shutil.copyfile(path, folder / file)
        table.append(SavedLibrary(file, tuple(kernels.values())))
    return tuple(table)


def _write_cubins(ex: CudaExecutable, folder: Path) -> tuple[SavedLibrary, ...]:
    """The cubins, each with the (fused function, its launches) it holds."""
    cubins: dict[bytes, dict] = {}
    for step in ex.steps:
        if step.kernel is not None:
            kernel = step.kernel
            cubins.setdefault(kernel.cubin, {})[kernel.function.name] = SavedKernel(
                kernel.function, kernel.launches)
    table = []
    for cubin, kernels in cubins.items():
        file = f"kernels_{hashlib.sha256(cubin).hexdigest()[:32]}.cubin"
        (folder / file).write_bytes(cubin)
        table.append(SavedLibrary(file, tuple(kernels.values())))
    return tuple(table)


# ---- loading -------------------------------------------------------------------------------

def load(directory: str | os.PathLike) -> CompiledModel:
    """A model saved by ``CompiledModel.save``, ready to call; never runs the compiler."""
    folder = Path(directory)
    manifest = _read_manifest(folder)
    arch = manifest.get("cuda_arch")
    missing = sorted(set(manifest.get("cpu_features", [])) - set(host().features))
    if missing:
        raise ModelError(f"{folder}: compiled for a CPU with {', '.join(missing)}, which this "
                         "CPU lacks; compile the model again here")
    for file, digest in manifest["files"].items():
        path = folder / file
        if not path.is_file():
            raise ModelError(f"{path}: missing from the saved model")
        if sha256_of(path) != digest:
            raise ModelError(f"{path}: corrupt (its sha256 differs from the manifest's)")
    try:
        if POOL in manifest["files"]:
            pool.library_path(saved=folder / POOL)
        return _load_program(folder, manifest["files"], arch)
    except ModelError:
        raise
    except (OSError, IRError, AttributeError, KeyError, TypeError, ValueError) as err:
        raise ModelError(f"{folder}: cannot load the saved model ({err})") from None


def _load_program(folder: Path, listed: Mapping[str, str], arch: str | None
                  ) -> CompiledModel:
    program = from_data(_read_json(folder / PROGRAM), _read_arrays(folder / CONSTANTS),
                        str(folder / PROGRAM), str(folder / CONSTANTS))
    kernels = {}
    for library in program.libraries:
        path = folder / library.file
        if library.file not in listed:
            raise ModelError(f"{path}: not listed in the manifest, so its integrity cannot be "
                             "checked")
        if arch is None:
            kernels.update(load_library(path, [k.function for k in library.kernels]).functions)
            continue
        cubin = path.read_bytes()
        kernels.update((k.function.name, CudaLaunches(k.function, k.launches, cubin, arch))
                       for k in library.kernels)
    steps = [Step(s.name, None if s.kernel is None else kernels[s.kernel], s.args, s.outputs,
                  s.workspaces) for s in program.steps]
    runner = folder / RUNNER if RUNNER in listed else None
    io = (program.slots, program.inputs, program.outputs, program.constants, steps)
    executable = Executable(*io, runner) if arch is None else CudaExecutable(*io, arch)
    unwritten = sorted({tensor for _, tensor in executable.reads_before_writes()})
    if unwritten:
        raise ModelError(f"{folder / CONSTANTS}: lacks the constants {', '.join(unwritten)}")
    return CompiledModel(executable, program.name)


def _read_json(path: Path):
    try:
        return json.loads(path.read_bytes())
    except (ValueError, RecursionError) as err:  # undecodable bytes are a ValueError too
        raise ModelError(f"{path}: not JSON, so no treadle program ({err})") from None


def _read_arrays(path: Path) -> dict[str, np.ndarray]:
    """The arrays of an .npz archive; with numpy's allow_pickle=False an object array is
    refused, never unpickled."""
    try:
        archive = np.load(path)
        if not isinstance(archive, np.lib.npyio.NpzFile):
            raise ValueError("one array, not an .npz archive of them")
        with archive:
            return {name: archive[name] for name in archive.files}
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as err:
        raise ModelError(f"{path}: not an .npz archive of plain arrays ({err})") from None


def _read_manifest(folder: Path) -> dict:
    path = folder / MANIFEST
    if not path.is_file():
        raise ModelError(f"{folder}: not a saved treadle model (no {MANIFEST})")
    try:
        manifest = json.loads(path.read_text())
        valid = (manifest["format"] == FORMAT and isinstance(manifest["files"], dict)
                 and {PROGRAM, CONSTANTS} <= set(manifest["files"])
                 and all(FILE_NAME.fullmatch(f) and f != MANIFEST for f in manifest["files"]))
    except (ValueError, KeyError, TypeError):
        valid = False
    if not valid:
        raise ModelError(f"{path}: not a treadle manifest, or corrupt")
    if manifest.get("version") != VERSION:
        raise ModelError(f"{path}: saved by format version {manifest.get('version')}; this "
                         f"treadle reads version {VERSION}")
    return manifest
