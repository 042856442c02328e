"""The CUDA target of the C backend: the C-family printer (``backend.c``) with CUDA's
workers, shared memory and barriers, compiled by nvcc into a cubin.

A lowered CUDA kernel has one ``blocks`` loop and, inside it, one ``threads`` loop of a
constant extent (see ``launch_shape``): their variables become ``blockIdx.x`` and
``threadIdx.x``, so the grid has the blocks loop's extent (evaluated from the symbols at
launch) and a block the threads loop's. Statements before the threads loop run in every
thread, as CUDA has it. ``shared`` buffers are ``__shared__`` arrays (static, so at most
48 KB per block), ``local`` ones are a thread's arrays (registers where every index is a
constant after unrolling), and a ``Barrier`` is ``__syncthreads()``.

ABI. Each ``Function`` becomes ``extern "C" __global__ void kernel_<name>(<params>)``:
buffers are device pointers, scalars their C type. A failed ``Assert`` leaves its number
(1-based, in program order) in ``__device__ int32_t kernel_<name>__status`` and its value
in ``kernel_<name>__fault`` (the first failing thread's both), and ends that thread; the runtime
reads both after the launch (``runtime.cuda``). Vector dtypes and float16 are not
generated for CUDA yet.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from treadle.backend.build import Toolchain, build_with, compiler_version
from treadle.backend.c import (CALL_PRINTERS, LOOP_PRINTERS, PRIMARY, STMT_PRINTERS,
                               CPrinter, c_name, fault_symbol, generate, print_loop)
from treadle.backend.c_prelude import Prelude
from treadle.config import config
from treadle.dump import dump_text
from treadle.errors import CompileError, IRError
from treadle.ir import dtypes
from treadle.ir.dtypes import DataType
from treadle.ir.expr import Buffer, Const, Expr, Load
from treadle.ir.functor import free_vars, walk
from treadle.ir.stmt import Assert, Barrier, DeclBuffer, For, Function
from treadle.target.cuda import CudaTarget

# Names a local must not take in CUDA C++: C++ keywords beyond C's, CUDA's built-in
# variables and the qualifiers nvcc defines as macros.
CXX_RESERVED = frozenset("""
    alignas alignof and and_eq bitand bitor catch char16_t char32_t class compl concept
    consteval constexpr constinit const_cast co_await co_return co_yield decltype delete
    dynamic_cast explicit export false friend mutable namespace new noexcept not not_eq
    nullptr operator or or_eq private protected public reinterpret_cast requires
    static_assert static_cast template this thread_local throw true try typeid typename
    using virtual wchar_t xor xor_eq threadIdx blockIdx blockDim gridDim warpSize
    isnan isinf isfinite signbit min max
""".split())

STATUS_SUFFIX = "__status"
MAX_THREADS = 1024
NVCC_FLAGS = ("-cubin", "-O3", "-std=c++17", "-Xptxas=-v")


class CudaPrelude(Prelude):
    """The C prelude's helpers as device functions; CUDA's own float math (``expf`` ...)
    instead of the CPU's vectorisable versions."""

    def type(self, dtype: DataType) -> str:
        if dtype.is_vector or dtype.scalar == dtypes.float16:
            raise IRError(f"dtype {dtype} is not generated for CUDA yet (scalar float32, "
                          "float64, bfloat16 storage and integers are)")
        return super().type(dtype)

    def f32_math(self, primitive: str) -> None:
        return None

    def text(self) -> str:
        parts = "\n\n".join(self.parts.values())
        parts = parts.replace("static inline ", "static __device__ __forceinline__ ")
        parts = parts.replace("__builtin_isnan(", "isnan(")
        return "#include <stdint.h>\n#include <math.h>\n\n" + parts


def _worker_loop(index: str):
    def print_worker(p: CudaPrinter, s: For) -> None:
        p.emit("{")
        p.depth += 1
        p.names.push()
        var = p.names.declare(s.var, s.var.name)
        p.emit(f"const {p.type(s.var.dtype)} {var} = ({p.type(s.var.dtype)}){index};")
        p.stmt(s.body)
        p.names.pop()
        p.depth -= 1
        p.emit("}")
    return print_worker


def _unrolled(p: CudaPrinter, s: For) -> None:
    print_loop(p, s, "#pragma unroll" if isinstance(s.extent, Const) else None)


def _decl_buffer(p: CudaPrinter, s: DeclBuffer) -> None:
    b = s.buffer
    if not all(isinstance(d, Const) for d in b.shape):
        raise IRError(f"{b.scope} buffer {b.name} has symbolic shape "
                      f"{list(map(str, b.shape))}; CUDA arrays need constant sizes")
    count = math.prod(d.value for d in b.shape)
    ctype, name = p.type(b.dtype), p.names.declare(b, b.name)
    qualifier = "__shared__ __align__(16) " if b.scope == "shared" else ""
    p.emit(f"{qualifier}{ctype} {name}" + (f"[{count}];" if b.rank or b.scope == "shared"
                                         else ";"))


def _assert(p: CudaPrinter, s: Assert) -> None:
    """The first failing thread's number and value win; the thread then ends."""
    p.messages.append(s.message)
    p.emit(f"if (!{p.wrap(s.cond, PRIMARY)}) {{")
    status = f"atomicCAS(&{c_name(p.func)}{STATUS_SUFFIX}, 0, {len(p.messages)}) == 0"
    if s.value is not None:
        p.emit(f"    if ({status}) {fault_symbol(p.func)} = (int64_t)({p.text(s.value)});")
    else:
        p.emit(f"    (void)({status});")
    p.emit("    return;")
    p.emit("}")


class CudaPrinter(CPrinter):
    PRELUDE = CudaPrelude
    LOOP_PRINTERS = {**LOOP_PRINTERS, "unroll": _unrolled,
                     "blocks": _worker_loop("blockIdx.x"),
                     "threads": _worker_loop("threadIdx.x")}
    STMT_PRINTERS = {**STMT_PRINTERS, DeclBuffer: _decl_buffer, Assert: _assert,
                     Barrier: lambda p, s: p.emit("__syncthreads();")}
    CALL_PRINTERS = {**CALL_PRINTERS, "prefetch": lambda p, e: ("0", PRIMARY),
                     "shfl_xor": lambda p, e: p.call("__shfl_xor_sync", "0xffffffffu",
                                                     p.text(e.args[0]), p.text(e.args[1]))}

    def __init__(self, func: Function, prelude: Prelude):
        super().__init__(func, prelude)
        self.names.reserved |= CXX_RESERVED
        self.loaded = {n.buffer for n in walk(func.body) if isinstance(n, Load)}

    def print(self) -> str:
        _, threads = launch_shape(self.func)
        try:
            params = [self.param(p) for p in self.func.params]
            self.stmt(self.func.body)
        except IRError as err:
            raise IRError(f"CUDA backend, function {self.func.name!r}: {err}") from None
        symbol = c_name(self.func)
        return "\n".join([
            f"__device__ int32_t {symbol}{STATUS_SUFFIX};",
            f"__device__ int64_t {fault_symbol(self.func)};",
            f'extern "C" __global__ void __launch_bounds__({threads}) {symbol}(',
            "    " + ",\n    ".join(params or ["void"]) + ") {",
            *self.lines, "}"])

    def param(self, p) -> str:
        """A buffer the kernel both writes and reads is not ``__restrict__``: its threads
        may pass values through it across a barrier, and nvcc moves a restrict load of
        another thread's result above the __syncthreads() that orders it."""
        text = super().param(p)
        if isinstance(p, Buffer) and p in self.stored and p in self.loaded:
            return text.replace("*restrict ", "*")
        return text.replace("*restrict ", "*__restrict__ ")



def launch_shape(func: Function) -> tuple[Expr, int]:
    """(blocks, threads per block) of a CUDA kernel: the extent of its one ``blocks`` loop,
    an expression of the function's symbols, and of the one ``threads`` loop inside it."""
    loops = [s for s in walk(func.body) if isinstance(s, For) and s.kind in ("blocks", "threads")]
    blocks = [s for s in loops if s.kind == "blocks"]
    threads = [s for s in loops if s.kind == "threads"]
    if len(blocks) != 1 or len(threads) != 1:
        raise IRError(f"CUDA kernel {func.name!r} needs one blocks loop and one threads loop "
                      f"inside it, has {len(blocks)} and {len(threads)}")
    if not any(s is threads[0] for s in walk(blocks[0].body)):
        raise IRError(f"CUDA kernel {func.name!r}: the threads loop is not inside the blocks loop")
    extent = threads[0].extent
    if not isinstance(extent, Const) or not 0 < extent.value <= MAX_THREADS:
        raise IRError(f"CUDA kernel {func.name!r}: threads per block must be a constant in "
                      f"1..{MAX_THREADS}, got {extent}")
    unknown = free_vars(blocks[0].extent) - set(func.symbols)
    if unknown:
        raise IRError(f"CUDA kernel {func.name!r}: the grid size {blocks[0].extent} uses "
                      f"{', '.join(sorted(v.name for v in unknown))}, not parameters")
    return blocks[0].extent, extent.value


# ---- nvcc -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Resources:
    """What ptxas reports for one kernel."""
    registers: int
    shared_bytes: int
    stack_bytes: int
    spill_bytes: int


@dataclass(frozen=True)
class CudaBinary:
    source: str
    cubin: bytes
    resources: dict[str, Resources]  # by kernel symbol
    arch: str


def generate_cuda(functions: Sequence[Function]) -> str:
    """One CUDA C++ source defining every function of ``functions`` (already lowered)."""
    return generate(functions, CudaPrinter)


def build_cuda(functions: Sequence[Function], target: CudaTarget, name: str) -> CudaBinary:
    """The cubin of ``functions`` for ``target``, from the cache when a valid entry exists;
    every kernel is checked against the target's register and shared-memory limits."""
    source = generate_cuda(functions)
    dump_text((name, "kernel.cu"), source)
    built = build_with(cuda_toolchain(target), source, name)
    binary = CudaBinary(source, built.path.read_bytes(), parse_resources(built.log),
                        target.arch)
    dump_text((name, "resources.txt"), "\n".join(
        f"{symbol}: {r}" for symbol, r in binary.resources.items()))
    for func in functions:
        check_resources(func, binary.resources[c_name(func)], target)
    return binary


def check_resources(func: Function, used: Resources, target: CudaTarget) -> None:
    """Raises CompileError where ``func`` as built cannot launch on ``target``."""
    _, threads = launch_shape(func)
    problems = []
    if used.registers * threads > target.registers_per_block:
        problems.append(f"{used.registers} registers x {threads} threads exceed the "
                        f"{target.registers_per_block} of a block")
    if used.shared_bytes > target.shared_bytes_per_block:
        problems.append(f"{used.shared_bytes} bytes of shared memory exceed the "
                        f"{target.shared_bytes_per_block} of a block")
    if problems:
        raise CompileError(f"CUDA kernel {func.name!r} for {target.arch}: {'; '.join(problems)}")


def cuda_toolchain(target: CudaTarget) -> Toolchain:
    """nvcc (TREADLE_NVCC) for ``target``'s architecture: cubins, with ptxas's report of
    each kernel's resources in the build log."""
    version = compiler_version(config.nvcc, "nvcc", "install the CUDA toolkit or set TREADLE_NVCC")
    return Toolchain((config.nvcc, *NVCC_FLAGS, *target.compiler_flags), version,
                     "kernel.cu", "kernel.cubin", _nonempty)


def _nonempty(path: Path, symbols) -> None:
    if path.stat().st_size == 0:
        raise ValueError(f"{path} is empty")


_ENTRY = re.compile(r"Compiling entry function '(\w+)'")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers(?:.*?(\d+) bytes smem)?")


def parse_resources(log: str) -> dict[str, Resources]:
    """Registers, shared memory, stack and spills of each entry function in ptxas's
    verbose report."""
    found: dict[str, Resources] = {}
    current, frame = None, (0, 0, 0)
    for line in log.splitlines():
        if (m := _ENTRY.search(line)):
            current, frame = m.group(1), (0, 0, 0)
        elif current and (m := _FRAME.search(line)):
            frame = tuple(int(g) for g in m.groups())
        elif current and (m := _USED.search(line)):
            found[current] = Resources(int(m.group(1)), int(m.group(2) or 0), frame[0],
                                       frame[1] + frame[2])
    return found
