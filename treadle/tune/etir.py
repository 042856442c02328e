"""The state of schedule construction (Gensor's ETIR) and its actions.

A state holds, for each memory level from the registers outward, a tile size per loop
dimension, the level being scheduled, and the number of independent accumulation chains
(Gensor's virtual threads: K split into parts summed apart). Tiles nest: a level's tile
is a multiple of the tile inside it in every dimension. Actions, at the current level:
``tile(d)`` / ``inverse_tile(d)`` move dimension d one step up or down its step list,
``cache()`` moves to the next level out (whose tile starts equal to this one), ``chain()``
doubles the chains. What a template lets construction tile is a ``TilingProblem``: the
dimensions and extents, which dimensions each tensor reads (from the compute's access
functions), the step lists, and the capacity check of each level (these data types live
in ``schedule.tiling``, where templates build them).

The benefits are Gensor's formulas (section IV-B) with Q, the bytes a level's tiles bring
in from the level below over the whole problem, and F, the bytes one tile holds:

    tiling   Q(T) F(T') / (Q(T') F(T))
    caching  (L_below + S / B_below) / (L_here + S / B_here), S = F of this level's tile,
             times the share of this level's capacity the tile uses (the paper moves on
             "based on the current memory level's utilization": without it, the ratio of
             a CPU's access times, 3-10, outweighs every tiling move and the chain leaves
             the registers with a 1 x 8 tile)
    chain    the load per core, ceil(x / W) / x, before over after: x work items
             (tiles times chains) on W cores

A move that breaks a level's capacity has benefit 0.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Sequence

from treadle.schedule.tiling import State, TilingProblem
from treadle.target.memory import MemoryHierarchy

ELEMENT_BYTES = 4


def initial_state(problem: TilingProblem) -> State:
    """Every level's tile the smallest its step lists allow."""
    inner = tuple(1 for _ in problem.dims)
    tiles = []
    for level in range(len(problem.levels)):
        tile = tuple(_steps(problem, level, d, inner[d])[0] for d in range(len(problem.dims)))
        tiles.append(tile)
        inner = tile
    return State(tuple(tiles))


def _steps(problem: TilingProblem, level: int, dim: int, inner: int) -> list[int]:
    return list(problem.steps(level, dim, inner)) or [inner]


# ---- actions ---------------------------------------------------------------------------

def resize(problem: TilingProblem, state: State, dim: int, direction: int) -> State | None:
    """``tile(dim)`` (direction 1) or ``inverse_tile(dim)`` (-1) at the current level, the
    outer levels' tiles grown to stay multiples; None where the step list ends."""
    level = state.level
    inner = state.tiles[level - 1][dim] if level else 1
    steps = _steps(problem, level, dim, inner)
    current = state.tile()[dim]
    position = next((k for k, s in enumerate(steps) if s >= current), len(steps) - 1)
    if steps[position] != current:  # off the list: the first step up or down is the move
        position -= direction > 0
    target = position + direction
    if not 0 <= target < len(steps) or steps[target] == current:
        return None
    tiles = [list(t) for t in state.tiles]
    tiles[level][dim] = steps[target]
    for outer in range(level + 1, len(tiles)):
        below = tiles[outer - 1][dim]
        tiles[outer][dim] = max(-(-tiles[outer][dim] // below) * below, below)
    return replace(state, tiles=tuple(tuple(t) for t in tiles))


def cache(state: State) -> State | None:
    """Moves to the next level out, whose tile starts equal to this level's."""
    if state.complete:
        return None
    tiles = list(state.tiles)
    tiles[state.level + 1] = state.tile()
    for outer in range(state.level + 2, len(tiles)):
        tiles[outer] = tuple(max(t, s) for t, s in zip(tiles[outer], tiles[outer - 1]))
    return replace(state, tiles=tuple(tiles), level=state.level + 1)


def chain(problem: TilingProblem, state: State) -> State | None:
    if state.chains * 2 > problem.max_chains:
        return None
    return replace(state, chains=state.chains * 2)


def actions(problem: TilingProblem, state: State) -> list[tuple[str, State]]:
    """(label, next state) of every action defined at ``state``."""
    found = []
    for d, name in enumerate(problem.dims):
        for direction, label in ((1, "tile"), (-1, "inverse_tile")):
            moved = resize(problem, state, d, direction)
            if moved is not None:
                found.append((f"{label}({name})", moved))
    for label, moved in (("cache()", cache(state)), ("chain()", chain(problem, state))):
        if moved is not None:
            found.append((label, moved))
    return found


# ---- traffic, footprint and benefits ---------------------------------------------------

def footprint(problem: TilingProblem, tile: Sequence[int]) -> int:
    """F: bytes of every tensor's part that one tile touches."""
    return ELEMENT_BYTES * sum(math.prod(tile[d] for d in t.dims) for t in problem.tensors)


def traffic(problem: TilingProblem, tile: Sequence[int]) -> float:
    """Q: bytes the tiles bring in from the level below over the whole problem: each tile
    of the iteration space loads its part of every input; an output's part stays while
    the dimensions it does not read are walked, so it moves once per tile of its own."""
    counts = [math.ceil(e / t) for e, t in zip(problem.extents, tile)]
    total = 0.0
    for t in problem.tensors:
        part = math.prod(tile[d] for d in t.dims)
        walked = t.dims if t.output else range(len(tile))
        total += part * math.prod(counts[d] for d in walked)
    return ELEMENT_BYTES * total


def tiling_benefit(problem: TilingProblem, before: Sequence[int], after: Sequence[int]) -> float:
    moved = traffic(problem, after) * footprint(problem, before)
    if moved == 0:  # an empty problem (an extent of 0): nothing moves, however tiled
        return 1.0
    return traffic(problem, before) * footprint(problem, after) / moved


def caching_benefit(problem: TilingProblem, state: State, memory: MemoryHierarchy) -> float:
    here = memory.level(problem.levels[state.level])
    below = memory.levels[memory.levels.index(here) + 1]
    size = footprint(problem, state.tile())
    return ((below.latency_ns + size / below.bandwidth)
            / (here.latency_ns + size / here.bandwidth)) * problem.usage(state)


def work_items(problem: TilingProblem, state: State) -> int:
    """Independent pieces of work: the outermost tiles of the dimensions no output
    accumulates over, times the chains."""
    outputs = set().union(*(t.dims for t in problem.tensors if t.output))
    tile = state.tiles[-1]
    return state.chains * math.prod(math.ceil(problem.extents[d] / tile[d]) for d in outputs)


def chain_benefit(problem: TilingProblem, state: State, after: State) -> float:
    def load(s: State) -> float:
        x = work_items(problem, s)
        return math.ceil(x / problem.cores) / x if x else 1.0  # no work: nothing to balance
    return load(state) / load(after)


def benefit(problem: TilingProblem, memory: MemoryHierarchy, state: State, label: str,
            after: State) -> float:
    """The benefit of the move ``state`` -> ``after`` (see the module's docstring)."""
    if not problem.fits(after):
        return 0.0
    if label == "cache()":
        return caching_benefit(problem, state, memory)
    if label == "chain()":
        return chain_benefit(problem, state, after)
    return tiling_benefit(problem, state.tile(), after.tile(state.level))
