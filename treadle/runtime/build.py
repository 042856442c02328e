"""The one build path: from scheduled functions to kernels that run on a target.

Every function is lowered for the target (``ir.lower.lower_kernels``: on CUDA, into the
launches that compute it), printed by the target's backend, compiled through the one
kernel cache (``backend.build``) and loaded. The compiler, the tuner's timers and
``compile_function`` all build here. Kernels are built in a few binaries at once: one
source per kernel would pay the compiler's start-up hundreds of times and one source for
all would use a single core; each group is lowered while the groups before it compile.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from treadle.backend.build import object_groups
from treadle.backend.cpu import build as build_c
from treadle.backend.cpu import build_many, generate
from treadle.backend.cuda import build_cuda
from treadle.config import config, usable_cores
from treadle.dump import dump_text
from treadle.ir.lower import lower_kernels
from treadle.ir.passes.check_bounds import check_bounds
from treadle.ir.stmt import Function, Module
from treadle.runtime.cuda_executor import CudaExecutable, CudaLaunches
from treadle.runtime.executor import Executable, Slot, Step
from treadle.runtime.module import CompiledFunction, CompiledModule, exported_symbols, load
from treadle.runtime.step_runner import library_path
from treadle.target import Target
from treadle.target.cpu import host

FUNCTIONS_PER_OBJECT = 24


def build(functions: Sequence[Function], target: Target, name: str) -> dict[str, Any]:
    """Each of ``functions`` as a kernel of ``target``, by function name: a
    ``CompiledFunction`` on the CPU, a ``CudaLaunches`` on CUDA. ``name`` names the
    binaries (and the dumped sources)."""
    return _BUILDERS[target.kind](functions, target, name)


def executable(target: Target, slots: Sequence[Slot], inputs: Sequence[int],
               outputs: Sequence[int], constants: Mapping[int, np.ndarray],
               steps: Sequence[Step]) -> Executable:
    """The executable that runs ``steps`` (with kernels from ``build``) on ``target``."""
    return _EXECUTABLES[target.kind](target, slots, inputs, outputs, constants, steps)


def shared_objects(functions: Sequence[Function], target: Target, name: str
                   ) -> list[tuple[Path, list[Function]]]:
    """CPU kernels in a few shared objects: each object's path and the lowered functions
    it defines."""
    groups = object_groups(functions, FUNCTIONS_PER_OBJECT)
    lowered: list[list[Function]] = []

    def items():
        for k, group in enumerate(groups):
            lowered.append([kernel for f in group for kernel in lower_kernels(f, target)])
            source = generate(lowered[-1])
            dump_text((f"kernels_{k}.c",), source)
            yield source, f"{name}_{k}", exported_symbols(lowered[-1])
    return list(zip(build_many(items()), lowered))


def _build_cpu(functions: Sequence[Function], target: Target, name: str
               ) -> dict[str, CompiledFunction]:
    compiled: dict[str, CompiledFunction] = {}
    for path, group in shared_objects(functions, target, name):
        compiled.update(load(path, group).functions)
    return compiled


def _build_cuda(functions: Sequence[Function], target: Target, name: str
                ) -> dict[str, CudaLaunches]:
    launched = {f.name: lower_kernels(f, target) for f in functions}
    groups = object_groups(list(launched), FUNCTIONS_PER_OBJECT)
    with ThreadPoolExecutor(max_workers=usable_cores()) as pool:
        binaries = list(pool.map(
            lambda item: build_cuda([k for n in item[1] for k in launched[n]], target,
                                    f"{name}_{item[0]}"), enumerate(groups)))
    by_function = {f.name: f for f in functions}
    return {n: CudaLaunches(by_function[n], tuple(launched[n]), binary.cubin, target.arch)
            for group, binary in zip(groups, binaries) for n in group}


def compile_module(module: Module) -> CompiledModule:
    """Lowers, generates C for, builds and loads every function of ``module`` for the
    host CPU, in one shared object."""
    lowered = [kernel for f in module.functions for kernel in lower_kernels(f, host())]
    source = generate(lowered)
    dump_text((module.name, "kernel.c"), source)
    return load(build_c(source, module.name, exported_symbols(lowered)), lowered)


def compile_function(func: Function, checked: bool | None = None) -> CompiledFunction:
    """Compiles one kernel and returns it as a callable; ``checked`` (by default
    TREADLE_CHECK_BOUNDS) checks every access to its buffer parameters (``check_bounds``)."""
    if config.check_bounds if checked is None else checked:
        func = check_bounds(func)
    return compile_module(Module(func.name, (func,)))[func.name]


_BUILDERS = {"cpu": _build_cpu, "cuda": _build_cuda}
_EXECUTABLES = {
    "cpu": lambda target, *io: Executable(*io, library_path()),
    "cuda": lambda target, *io: CudaExecutable(*io, target.arch),
}
