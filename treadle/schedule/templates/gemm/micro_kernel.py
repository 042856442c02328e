"""The register tile shared by the GEMM and Winograd templates: a fully unrolled
micro_m x micro_n block of vector accumulators fed by fused multiply-adds (rows of 16
floats in 512-bit registers where the CPU has AVX-512F, 256-bit ones otherwise), or for
integer products, int32 accumulators fed by a word product (see gemm/words.py).
"""
from __future__ import annotations

from dataclasses import dataclass

from treadle.ir.builder import FunctionBuilder
from treadle.ir.dtypes import DataType, float32, int32, vector
from treadle.ir.expr import Buffer, Expr, as_expr, broadcast, call
from treadle.ir.mapping import repeat


@dataclass(frozen=True)
class RegisterTile:
    """``rows`` x ``cols`` accumulators in vectors of ``lanes`` floats, or with
    ``multiply_add`` a word product (a primitive taking acc, a, b), int32 ones."""
    rows: int
    cols: int
    lanes: int
    multiply_add: str = "fma"

    @property
    def vectors(self) -> int:
        """Vectors per row."""
        return self.cols // self.lanes

    @property
    def dtype(self) -> DataType:
        return float32 if self.multiply_add == "fma" else int32


def register_tile(fb: FunctionBuilder, tile: RegisterTile, acc: Buffer, origin: tuple, first,
                  depth, step, last: tuple | None = None, walk=None) -> None:
    """acc[origin + (r, c)] (+)= the sum over kk < depth of a(r) * b(c), in a fully unrolled
    micro_m x micro_n tile of vector registers; ``step(kk)`` gives the operand readers
    ``a_of(r)`` (a scalar) and ``b_of(v)`` (the v-th vector of the row of B). With
    ``last`` = (condition, finish), where the condition holds the registers go to
    ``finish(regs)`` instead of acc. ``walk``, when given, yields the K positions instead
    of one loop over depth, as (kk, coordinates) pairs that ``step`` takes whole (rows
    of K in loops of their own: packing.k_walk), summed in one chain."""
    lanes, mr, vectors = tile.lanes, tile.rows, tile.vectors
    registers = repeat(mr, vectors, kind="unroll")
    *slot, row, col = origin
    dtype = tile.dtype
    zero = as_expr(0.0 if dtype.is_float else 0, dtype)
    regs = fb.buffer("regs", vector(dtype, lanes), [mr, vectors])
    with fb.if_(first):
        for r, v in registers.on(0):
            regs[r, v] = broadcast(zero, lanes)
    with fb.else_():
        for r, v in registers.on(0):
            regs[r, v] = acc.vload((*slot, row + r, col + v * lanes), lanes)
    chains = _chains(mr * vectors * lanes)
    if chains == 1 or walk is not None:
        _multiply_add(fb, tile, regs, step,
                      fb.range(depth, name="kk") if walk is None else walk)
    else:
        # Too few accumulators to cover the FMA latency (one row: GEMV, decoding): every
        # chain sums every chains-th K position, and the chains add up at the end.
        extra = fb.buffer("chains", vector(dtype, lanes), [chains - 1, mr, vectors])
        for c, r, v in repeat(chains - 1, mr, vectors, kind="unroll").on(0):
            extra[c, r, v] = broadcast(zero, lanes)
        for kk in fb.range(depth // chains, name="kk"):
            for c in range(chains):
                into = regs if c == 0 else Slice(extra, c - 1)
                _multiply_add(fb, tile, into, step, [kk * chains + c])
        _multiply_add(fb, tile, regs, step,
                      (depth // chains * chains + kk for kk in
                       fb.range(depth % chains, name="kk")))
        for c, r, v in repeat(chains - 1, mr, vectors, kind="unroll").on(0):
            regs[r, v] = regs[r, v] + extra[c, r, v]
    if last is None:
        spill(tile, regs, acc, origin)
        return
    done, finish = last
    with fb.if_(done):
        finish(regs)
    with fb.else_():
        spill(tile, regs, acc, origin)


# Multiply-adds a register tile keeps in flight, in float lanes: an FMA's latency (4
# cycles) times the lanes the FMA units retire per cycle (2 x 8 on AVX2 and on AMD's
# AVX-512, which runs a 512-bit FMA as two 256-bit halves).
LANES_IN_FLIGHT = 64


def _chains(lanes: int) -> int:
    """How many independent sums a tile of ``lanes`` accumulator lanes splits K into."""
    return -(-LANES_IN_FLIGHT // lanes)


def _multiply_add(fb: FunctionBuilder, tile: RegisterTile, regs, step, positions) -> None:
    """regs[r, v] += a(r) * b(v) at each K position of ``positions``."""
    registers = repeat(tile.rows, tile.vectors, kind="unroll")
    for kk in positions:
        a_of, b_of = step(kk)
        for r, v in registers.on(0):
            a = broadcast(a_of(r), tile.lanes)
            regs[r, v] = (call("fma", a, b_of(v), regs[r, v]) if tile.multiply_add == "fma"
                          else call(tile.multiply_add, regs[r, v], a, b_of(v)))


def spill(tile: RegisterTile, regs: Buffer, into: Buffer, origin: tuple) -> None:
    """into[origin + (r, c)] = the register tile's vectors."""
    *slot, row, col = origin
    lanes = tile.lanes
    for r, v in repeat(tile.rows, tile.vectors, kind="unroll").on(0):
        into[(*slot, row + r, col + v * lanes)] = regs[r, v]


@dataclass(frozen=True)
class Slice:
    """The part of ``buffer`` at one first index, indexed as a buffer of its own (the
    panels of one K block among every block's, one set of a register tile's
    accumulators)."""
    buffer: Buffer
    first: Expr | int

    def __getitem__(self, index: tuple) -> Expr:
        return self.buffer[(self.first, *index)]

    def __setitem__(self, index: tuple, value) -> None:
        self.buffer[(self.first, *index)] = value
