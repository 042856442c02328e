"""What a template lets schedule construction (``tune.construct``) tile: the data of
Gensor's ETIR, free of the search (``tune.etir`` holds the actions and benefits).

A ``TilingProblem`` names the loop dimensions and their extents, which dimensions each
tensor reads (from the compute's access functions), the memory levels scheduled, the
sizes a dimension's tile may take at each level, and the capacity of each level. A
``State`` holds, per level from the registers outward, a tile size per dimension, the
level being scheduled and the number of independent accumulation chains. Templates build
problems and read configs off states (``schedule.template.Constructible``), so these types
live on the schedule side of the tuner.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from treadle.ir.expr import Var, as_expr
from treadle.ir.functor import evaluate

# The size a symbolic extent stands for when construction needs a number (the size
# tune.measure measures symbolic kernels at).
SYMBOL_SIZE = 128


@dataclass(frozen=True)
class TensorAccess:
    dims: frozenset[int]  # the dimensions the tensor's index reads
    output: bool = False  # accumulated across the other dimensions, written once per tile


@dataclass(frozen=True)
class TilingProblem:
    dims: tuple[str, ...]
    extents: tuple[int, ...]
    tensors: tuple[TensorAccess, ...]
    levels: tuple[str, ...]  # memory levels scheduled, registers outward
    # steps(level, dim, inner) -> the sizes the dim's tile may take at ``level`` given
    # the tile inside it, ascending; one size (or none) fixes the dimension there.
    steps: Callable[[int, int, int], Sequence[int]]
    fits: Callable[["State"], bool]  # every level's tile within its capacity
    # The fraction of the current level's capacity its tile uses (0 to 1).
    usage: Callable[["State"], float]
    cores: int
    max_chains: int = 1


@dataclass(frozen=True)
class State:
    tiles: tuple[tuple[int, ...], ...]  # per level, per dimension
    level: int = 0
    chains: int = 1

    def tile(self, level: int | None = None) -> tuple[int, ...]:
        return self.tiles[self.level if level is None else level]

    @property
    def complete(self) -> bool:
        return self.level == len(self.tiles) - 1


def known(size, env: Mapping[Var, int] | None):
    """``size`` as an int where ``env`` gives every symbol it holds, else as it is."""
    if isinstance(size, int) or not env:
        return size
    try:
        return int(evaluate(as_expr(size), env))
    except KeyError:  # a symbol env does not give
        return size


def concrete(extent, env: Mapping[Var, int] | None = None) -> int:
    """An extent as construction counts it: its value where ``env`` gives every symbol
    it holds (DietCode's analytic costs, at each size of a range), else SYMBOL_SIZE."""
    value = known(extent, env)
    return value if isinstance(value, int) else SYMBOL_SIZE
