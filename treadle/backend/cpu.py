"""The CPU target of the C backend: the C-family printer (``backend.c``) with OpenMP simd
loops, AVX/AVX-512 intrinsics and a thread pool.

A parallel loop's body becomes a static function of an iteration range, with the values
it uses from outside in a context struct; the kernel hands both to the thread pool
(``runtime.pool``) through ``treadle_parallel_for``, on ``treadle_num_threads`` threads.
The library exports ``treadle_set_num_threads`` and ``treadle_set_parallel`` (the pool's
entry point; without it loops run serially). A vectorize loop is an ``omp simd`` loop
whose accumulators are reductions; fused multiply-adds on vectors are the AVX intrinsics
of their width, and a prefetch is ``__builtin_prefetch``. Tiles (local buffers of
``TILE`` vectors) live in AMX's tile registers, numbered in the order they are declared;
stores to and from them are tile loads, stores, zeroings and products (``_store``).
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterable, Sequence

from treadle.backend.build import build_with, c_toolchain
from treadle.backend.c import (CALL_PRINTERS, EXPR_PRINTERS, LOOP_PRINTERS, PRIMARY,
                               STMT_PRINTERS, UNARY, CPrinter,
                               c_name, print_let, print_loop, print_store, scalar_float_call)
from treadle.backend.c import generate as generate_c
from treadle.backend.c_prelude import INTRINSICS
from treadle.config import usable_cores
from treadle.errors import IRError
from treadle.ir import dtypes
from treadle.ir.expr import (Binary, Broadcast, Buffer, Call, Cast, Const, Expr, Load, Select,
                             Var)
from treadle.ir.functor import walk
from treadle.ir.primitives import TILE, TILE_WORDS
from treadle.ir.simplify import simplify_expr
from treadle.ir.stmt import Accumulate, DeclBuffer, For, Function, Let, Store
from treadle.target.cpu import host


# AMX's register file of tiles (a tile as the IR holds it: ir.primitives.TILE).
TILE_REGISTERS = 8
TILE_ROW_BYTES = 4 * TILE_WORDS  # tiles are stored row after row: the stride of every load


# Vector dtype -> fused multiply-add intrinsic; the 512-bit ones only where the CPU has them.
FMA_INTRINSICS = {dtypes.vector(scalar, bits // scalar.bits): f"_mm{width}_fmadd_{suffix}"
                  for scalar, suffix in ((dtypes.float32, "ps"), (dtypes.float64, "pd"))
                  for bits, width in ((128, ""), (256, "256"), (512, "512"))}


THREADS = """\
static int treadle_num_threads = 1;

void treadle_set_num_threads(int n) {
    treadle_num_threads = n > 0 ? n : 1;
}

typedef void (*treadle_loop_body)(void *ctx, int64_t begin, int64_t end);
typedef void (*treadle_parallel_fn)(int64_t n, treadle_loop_body body, void *ctx,
                                    int32_t threads);
static treadle_parallel_fn treadle_parallel = 0;

void treadle_set_parallel(treadle_parallel_fn run) {
    treadle_parallel = run;
}

static void treadle_parallel_for(int64_t n, treadle_loop_body body, void *ctx) {
    if (treadle_parallel != 0 && treadle_num_threads > 1 && n > 1)
        treadle_parallel(n, body, ctx, treadle_num_threads);
    else
        body(ctx, 0, n);
}"""


def _fma(p: CpuPrinter, e: Call):
    if not e.dtype.is_vector:
        return scalar_float_call(p, e, "fma")
    have = [d for d in FMA_INTRINSICS if d.nbytes <= host().widest_simd_bytes]
    if e.dtype not in have:
        raise IRError(f"{e}: fma is not supported for vector dtype {e.dtype} on this CPU "
                      f"(it has {', '.join(d.name for d in have)})")
    intrinsic = FMA_INTRINSICS[e.dtype]
    p.prelude.include(INTRINSICS)
    return p.call(intrinsic, *(p.text_as(a, e.dtype) for a in e.args))


def _dot_u8s8(p: CpuPrinter, e: Call):
    """VNNI's byte dot product: vpdpbusd on vectors of 16 or 8 int32 lanes."""
    target = host()
    if not (e.dtype.scalar == dtypes.int32 and e.dtype.lanes in (8, 16)
            and target.int8_dot(e.dtype.lanes)):
        raise IRError(f"{e}: dot_u8s8 of {e.dtype} needs AVX-512 VNNI (or AVX-VNNI for 8 "
                      f"lanes); this CPU has {', '.join(target.features)}")
    if e.dtype.lanes == 16:
        intrinsic = "_mm512_dpbusd_epi32"
    else:
        intrinsic = "_mm256_dpbusd_epi32" if "avx512_vnni" in target.features \
            else "_mm256_dpbusd_avx_epi32"
    return _integer_vector_call(p, e, intrinsic)


def _dot_s16(p: CpuPrinter, e: Call):
    """Products of 16-bit pairs summed into int32 lanes: vpmaddwd, then an add."""
    bits = e.dtype.lanes * 32
    if not (e.dtype.scalar == dtypes.int32 and bits in (256, 512)) \
            or (bits == 512 and "avx512bw" not in host().features):
        raise IRError(f"{e}: dot_s16 of {e.dtype} needs 256-bit vectors, or AVX-512BW for "
                      "512-bit ones")
    width = "512" if bits == 512 else "256"
    acc, a, b = (_as_integer_vector(p, x, width) for x in e.args)
    p.prelude.include(INTRINSICS)
    text = f"_mm{width}_add_epi32({acc}, _mm{width}_madd_epi16({a}, {b}))"
    return f"(({p.type(e.dtype)}){text})", PRIMARY


def _integer_vector_call(p: CpuPrinter, e: Call, intrinsic: str):
    """An integer intrinsic of __m256i / __m512i operands, its result as e's vector type
    (GCC's vector types of int32 and the intrinsics' of long long convert only by cast)."""
    width = "512" if e.dtype.nbytes == 64 else "256"
    p.prelude.include(INTRINSICS)
    args = [_as_integer_vector(p, x, width) for x in e.args]
    return f"(({p.type(e.dtype)}){intrinsic}({', '.join(args)}))", PRIMARY


def _as_integer_vector(p: CpuPrinter, e: Expr, width: str) -> str:
    return f"(__m{width}i)({p.text_as(e, e.dtype)})"


def _prefetch(p: CpuPrinter, e: Call):
    """Fetches the cache line of a load's element into L2 (prefetcht1): the schedules
    prefetch a step or a panel ahead, and a line brought into L1 that early evicts the
    micro-panels being read (a 128 x 768 x 3072 GEMM: 4% faster than into L1). Where
    fusion replaced the load with a computed value there is no single address to fetch,
    and the hint is dropped."""
    (arg,) = e.args
    if not isinstance(arg, Load):
        return "0", PRIMARY
    return p.call("__builtin_prefetch", "&" + p.text(arg), "0", "2")


def _tile_begin(p: CpuPrinter, e: Call):
    return p.call(p.prelude.tile_begin(), p.text(e.args[0]))


def _tile_end(p: CpuPrinter, e: Call):
    p.prelude.include(INTRINSICS)
    return "(_tile_release(), 0)", PRIMARY


def _tile_value(p: CpuPrinter, e: Call):
    raise IRError(f"{e}: a tile product is stored into a tile (tile registers hold it), "
                  "not used as a value")


def _is_tile(buffer: Buffer) -> bool:
    return buffer.dtype == TILE and buffer.scope == "local"


def _tile_number(p: CpuPrinter, load: Load) -> int:
    (index,) = load.indices
    if not (load.buffer in p.tiles and isinstance(index, Const)):
        raise IRError(f"tile {load.buffer.name}[{index}]: tiles are indexed by constants, "
                      "inside the scope that declares them")
    return p.tiles[load.buffer] + index.value


def _decl_buffer(p: CpuPrinter, s: DeclBuffer) -> None:
    """A tile buffer takes the next free tile registers (no C declaration)."""
    if not _is_tile(s.buffer):
        STMT_PRINTERS[DeclBuffer](p, s)
        return
    (count,) = s.buffer.shape
    first = sum(int(b.shape[0].value) for b in p.tiles)
    if first + count.value > TILE_REGISTERS:
        raise IRError(f"tile buffer {s.buffer.name} needs {count.value} tile registers past "
                      f"the {first} taken; the CPU has {TILE_REGISTERS}")
    p.tiles[s.buffer] = first


def _address(p: CpuPrinter, load: Load) -> str:
    return "&" + p.element(load.buffer, load.indices, 1, store=False)[0]


def _store(p: CpuPrinter, s: Store) -> None:
    """Stores into a tile: a zero, a tile loaded from memory, a tile product of tiles;
    a tile stored to memory. Every other store is C's."""
    if isinstance(s.value, Load) and _is_tile(s.value.buffer) and not _is_tile(s.buffer):
        number = _tile_number(p, s.value)
        p.emit(f"_tile_stored({number}, {_address(p, Load(s.buffer, s.indices))}, "
               f"{TILE_ROW_BYTES});")
        return
    if not _is_tile(s.buffer):
        STMT_PRINTERS[Store](p, s)
        return
    number, value = _tile_number(p, Load(s.buffer, s.indices)), s.value
    p.prelude.include(INTRINSICS)
    if isinstance(value, Broadcast) and isinstance(value.value, Const) and value.value.value == 0:
        p.emit(f"_tile_zero({number});")
    elif isinstance(value, Load) and not _is_tile(value.buffer):
        p.emit(f"_tile_loadd({number}, {_address(p, value)}, {TILE_ROW_BYTES});")
    elif isinstance(value, Call) and value.func == "tile_dot_u8s8" \
            and all(isinstance(a, Load) and _is_tile(a.buffer) for a in value.args) \
            and _tile_number(p, value.args[0]) == number:
        a, b = (_tile_number(p, x) for x in value.args[1:])
        p.emit(f"_tile_dpbusd({number}, {a}, {b});")
    else:
        raise IRError(f"store into tile {s.buffer.name}: the value must be zero, a load from "
                      f"memory or tile_dot_u8s8 of that tile and two others, got {value}")


def _cast(p: CpuPrinter, e: Cast):
    """A word of four consecutive bytes (how gemm.words packs a factor: byte j shifted by
    8 j) as one unaligned 32-bit load, which gcc vectorises as a copy: assembled byte by
    byte it took four loads and a shuffle per byte, a quarter of a 1024^3 int8 product's
    time. Every other cast is C's."""
    first = _byte_word(e.value) if e.dtype in (dtypes.int32, dtypes.uint32) else None
    if first is None:
        return EXPR_PRINTERS[Cast](p, e)
    helper = p.prelude.word_load()
    return p.call(helper, _address(p, first)) if e.dtype == dtypes.uint32 \
        else (f"(int32_t){helper}({_address(p, first)})", UNARY)


def _byte_word(e: Expr) -> Load | None:
    """The load of byte 0 where ``e`` is bytes j of one buffer at consecutive addresses,
    each zero-extended to uint32 and shifted by 8 j, or-ed together; else None."""
    terms, loads = [e], {}
    while terms:
        term = terms.pop()
        if isinstance(term, Binary) and term.op == "|":
            terms += [term.a, term.b]
            continue
        shift = 0
        if isinstance(term, Binary) and term.op == "<<" and isinstance(term.b, Const):
            term, shift = term.a, term.b.value
        masked = isinstance(term, Binary) and term.op == "&" and isinstance(term.b, Const) \
            and term.b.value == 255
        term = term.a if masked else term
        if not (isinstance(term, Cast) and term.dtype == dtypes.uint32
                and isinstance(term.value, Load) and term.value.lanes == 1
                and term.value.dtype in (dtypes.uint8, dtypes.int8) and shift not in loads
                and (masked or term.value.dtype == dtypes.uint8)):  # int8 sign-extends
            return None
        loads[shift] = term.value
    if sorted(loads) != [0, 8, 16, 24]:
        return None
    first = loads[0]
    for shift, load in loads.items():
        step = simplify_expr(load.indices[-1] - first.indices[-1])
        if not (load.buffer is first.buffer and load.indices[:-1] == first.indices[:-1]
                and isinstance(step, Const) and step.value == shift // 8):
            return None
    return first


# Reduction -> OpenMP reduction-identifier, for the Accumulates of a vectorize loop.
OMP_REDUCTIONS = {"sum": "+", "prod": "*", "max": "max", "min": "min"}


# A float max or min step that keeps the accumulator when either side is NaN:
# acc = value > acc ? value : acc, one max instruction.
ORDERED = {"max": ">", "min": "<"}


def _reductions(s: For) -> list[Accumulate]:
    """The Accumulates of the loop ``s`` into accumulators declared outside it."""
    declared = {n.buffer for n in walk(s.body) if isinstance(n, DeclBuffer)}
    return [n for n in walk(s.body) if isinstance(n, Accumulate) and n.buffer not in declared]


def _simd(p: CpuPrinter, s: For) -> str:
    """``omp simd``, with a reduction clause for each accumulator the loop updates but
    does not declare: each lane then keeps a partial result, combined after the loop."""
    clauses = {}
    for n in _reductions(s):
        op = p.table(OMP_REDUCTIONS, n.op, "OMP_REDUCTIONS")
        clauses[f"reduction({op}:{p.name_of(n.buffer)})"] = None
    clauses.update({f"reduction(|:{flag})": None for flag in p.nan_flags.values()})
    return " ".join(["#pragma omp simd", *clauses])


def _nan_flags(p: CpuPrinter, s: For) -> dict[Buffer, str]:
    """Declares a NaN flag for each float max or min the vectorize loop ``s`` reduces.

    The NaN-propagating helper would carry the accumulator through a compare, an or of
    masks and a blend per vector, three times slower than a max instruction on a row in
    cache. Instead each step is one max, which keeps the accumulator where the value is
    NaN, and a NaN value sets the flag, an int reduced with | off that chain; after the
    loop a set flag makes the result NaN (_close_nan_flags). The flag starts set where
    the accumulator is already NaN: OpenMP's max may drop it when combining the lanes."""
    flags = {}
    for n in _reductions(s):
        if n.op in ORDERED and n.buffer.dtype.is_float and n.buffer not in flags:
            acc = p.name_of(n.buffer)
            flags[n.buffer] = p.names.declare((n.buffer, "nan"), f"{acc}_nan")
            p.emit(f"int32_t {flags[n.buffer]} = {acc} != {acc};")
    return flags


def _close_nan_flags(p: CpuPrinter, flags: dict[Buffer, str]) -> None:
    for buffer, flag in flags.items():
        p.emit(f"if ({flag}) {p.name_of(buffer)} = NAN;")


def _nan_flags_needed(s: For) -> bool:
    return any(n.op in ORDERED and n.buffer.dtype.is_float for n in _reductions(s))


def _parallel_for(p: CpuPrinter, s: For) -> None:
    """The loop's body as a static function of an iteration range, called by the thread
    pool; what the body uses from outside (scalars by value, buffers by address) travels
    in a context struct. A value computed without memory (``let i = 128 - i0``) is
    computed again in the body instead, so the C compiler still sees constants there."""
    extent = p.text(s.extent)
    captures = []
    for key, name in _captured(p, s):
        value = _recomputable(p, key)
        if value is not None:
            captures.append((None, f"const {p.type(key.dtype)} {name} = {p.text(value)};", None))
        else:
            captures.append(_capture(p, key, name))
    symbol = f"{c_name(p.func)}__loop{len(p.outlined)}"
    outer = p.lines, p.depth, p.status_address
    p.lines, p.depth, p.status_address = [], 1, "treadle_status"
    p.names.push()
    var = p.names.declare(s.var, s.var.name)
    if not any(isinstance(n, For) for n in walk(s.body)):
        # Iterations of a parallel loop are independent. gcc, left to prove it, gives
        # up past a few dozen buffers (an unrolled recurrence's kernel storing its 64
        # steps ran scalar), so it is told; its cost model still decides.
        p.emit("#pragma GCC ivdep")
    p.emit(f"for ({p.type(s.var.dtype)} {var} = treadle_begin; {var} < treadle_end; ++{var}) {{")
    label = p.special_loop(s.body, "parallel")
    p.emit("}")
    p.names.pop()
    body = p.lines
    p.lines, p.depth, p.status_address = outer
    if label in p.used_labels:
        captures.append(("int32_t *treadle_status",
                         "int32_t *treadle_status = treadle_c->treadle_status;",
                         "&treadle_status"))
    fields = [field for field, _, _ in captures if field] or ["char unused"]
    values = ", ".join(value for _, _, value in captures if value) or "0"
    p.outlined.append("\n".join([
        f"struct {symbol}_ctx {{", *(f"    {field};" for field in fields), "};", "",
        f"static void {symbol}(void *treadle_ctx, int64_t treadle_begin, int64_t treadle_end) {{",
        f"    const struct {symbol}_ctx *treadle_c = treadle_ctx;",
        *(f"    {local}" for _, local, _ in captures), *body, "}"]))
    p.emit(f"struct {symbol}_ctx {symbol}_ctx = {{{values}}};")
    p.emit(f"treadle_parallel_for({extent}, {symbol}, &{symbol}_ctx);")
    p.pass_failure_outward(label)


def _recomputable(p: CpuPrinter, key) -> Expr | None:
    """The value of a ``let`` that reads no memory (a parallel body computes it again)."""
    value = p.let_values.get(key)
    if value is None or any(isinstance(n, (Load, Call)) for n in walk(value)):
        return None
    return value


def _captured(p: CpuPrinter, s: For) -> list[tuple[Var | Buffer, str]]:
    """The variables and buffers the loop's body uses that are declared outside it, with
    their C names, each after those its value is computed from where it is computed again
    (see _parallel_for); the symbols in buffer shapes count as used (the flattened
    indices multiply by them)."""
    used: dict = {}
    for node in walk(s.body):
        if isinstance(node, Var):
            used[node] = None
        buffer = getattr(node, "buffer", None)
        if isinstance(buffer, Buffer):
            used.update((v, None) for d in buffer.shape for v in walk(d) if isinstance(v, Var))
            used[buffer] = None
    captured: dict = {}

    def visit(key) -> None:
        name = p.names.lookup(key)
        if name is None or key in captured:
            return
        if isinstance(key, Buffer) and key.rank == 0 and key.scope != "global":
            raise IRError(f"parallel loop over {s.var.name} uses the scalar {key.name} "
                          "declared outside it; its iterations would race on it")
        value = _recomputable(p, key)
        if value is not None:
            for node in walk(value):
                if isinstance(node, Var):
                    visit(node)
        captured[key] = name
    for key in used:
        visit(key)
    return list(captured.items())



def _capture(p: CpuPrinter, key: Var | Buffer, name: str) -> tuple[str, str, str]:
    """(context field, the outlined body's local, value at the call) for ``key``."""
    if isinstance(key, Var):
        ctype = p.type(key.dtype)
        return (f"{ctype} {name}", f"const {ctype} {name} = treadle_c->{name};", name)
    const = "" if key in p.stored else "const "
    pointer = f"{const}{p.type(key.dtype)} *"
    value = f"treadle_c->{name}"
    if key.scope != "global":  # a stack array of the kernel
        value = f"__builtin_assume_aligned({value}, {p.STACK_ALIGNMENT})"
    return f"{pointer}{name}", f"{pointer}restrict {name} = {value};", name


def _accumulate(p: CpuPrinter, s: Accumulate) -> None:
    flag = p.nan_flags.get(s.buffer)
    if flag is None:
        STMT_PRINTERS[Accumulate](p, s)
        return
    # See _nan_flags: an ordered compare keeps the accumulator where the value is NaN.
    value = Var(f"{s.buffer.name}_value", s.buffer.dtype)
    acc = s.buffer[()]
    print_let(p, Let(value, s.value))
    name = p.name_of(value)
    p.emit(f"{flag} |= -({name} != {name});")
    print_store(p, Store(s.buffer, (), Select(Binary(ORDERED[s.op], value, acc), value, acc)))


def _vectorize(p: CpuPrinter, s: For) -> None:
    if not _nan_flags_needed(s):
        print_loop(p, s, _simd(p, s), special="vectorize")
        return
    p.emit("{")
    p.depth += 1
    p.names.push()
    p.nan_flags = _nan_flags(p, s)
    print_loop(p, s, _simd(p, s), special="vectorize")
    _close_nan_flags(p, p.nan_flags)
    p.nan_flags = {}
    p.names.pop()
    p.depth -= 1
    p.emit("}")


class CpuPrinter(CPrinter):
    CALL_PRINTERS = {**CALL_PRINTERS, "fma": _fma, "prefetch": _prefetch,
                     "dot_u8s8": _dot_u8s8, "dot_s16": _dot_s16, "tile_begin": _tile_begin,
                     "tile_end": _tile_end, "tile_dot_u8s8": _tile_value}
    STMT_PRINTERS = {**STMT_PRINTERS, Accumulate: _accumulate, DeclBuffer: _decl_buffer,
                     Store: _store}
    EXPR_PRINTERS = {**EXPR_PRINTERS, Cast: _cast}
    LOOP_PRINTERS = {**LOOP_PRINTERS, "vectorize": _vectorize, "parallel": _parallel_for}
    PREAMBLE = THREADS
    STACK_ALIGNMENT = 64  # bytes of one AVX-512 register, a cache line

    def __init__(self, func: Function, prelude):
        super().__init__(func, prelude)
        self.nan_flags: dict[Buffer, str] = {}  # of the enclosing simd loop (_nan_flags)
        self.tiles: dict[Buffer, int] = {}  # tile buffer -> its first tile register

    def block(self, s) -> None:
        """A block's tile buffers free their registers at its end."""
        tiles = dict(self.tiles)
        super().block(s)
        self.tiles = tiles


def generate(functions: Sequence[Function]) -> str:
    """One C source file for the CPU defining every function of ``functions`` (lowered)."""
    return generate_c(functions, CpuPrinter)


def build(source: str, name: str, symbols: Iterable[str] = ()) -> Path:
    """The path of a shared object compiled from C ``source`` for the host CPU, through
    the kernel cache (``backend.build``); ``name`` only labels messages."""
    return build_with(c_toolchain(host()), source, name, symbols).path


def build_many(items: Iterable[tuple]) -> list[Path]:
    """``build(*item)`` for each ``(source, name)`` or ``(source, name, symbols)``, running
    compilers in parallel. Each item starts compiling as soon as ``items`` yields it, so a
    generator that lowers and prints the next group overlaps with the compilers running
    (Inception-V3 spends 9 s lowering and 11 s compiling)."""
    with ThreadPoolExecutor(max_workers=usable_cores()) as pool:
        futures = [pool.submit(build, *item) for item in items]
        return [future.result() for future in futures]
