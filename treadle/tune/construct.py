"""Construction of schedules without measuring: Gensor's Markov chain over ETIR states
(``tune.etir``), and a Roller-style greedy constructor as its baseline.

Gensor (Algorithm 1): from the smallest tiles, each step computes the benefit of every
action, picks one by roulette in proportion (the cache action's weight scaled by
g(t) = 3 / (1 + e^(-ln 5 / 10 (t - 10))), so the chain moves outward as it cools), and
keeps the state it reaches with probability 1 - 1 / (1 + e^(-0.5 (-ln T - 10))); the
temperature halves each step from T0 down to the threshold. Several chains run from
seeds 0, 1, ...; every complete state they kept (an incomplete one completed by caching
outward) is a candidate, and so are the template's level-0 point and the points of its
level-2 hardware-centric space (resolved, never run: ranking 150 points costs
milliseconds, and they hold register tiles, 6 x 32 say, that the chain's formulas, blind
to instruction counts, rarely reach). Candidates are ranked by the template's analytic
latency, evaluated on the *resolved* config (``Template.resolve``: what runs).
The method "space" ranks the space and the level-0 point alone, without the chain.

The paper leaves T0, the threshold and the chain count open; chosen here, not tuned:
T0 = 2^48 and a threshold of 1 (48 steps, enough to grow a register tile, an L1 block and
an L2 block), 8 chains. Deterministic for a given target, memory hierarchy and seed.

The greedy constructor grows, level by level, the tile dimension of highest tiling
benefit while one above 1 fits, then caches outward (and adds chains while they pay):
Roller's aligned construction, judged by the same formulas.

Templates take part by implementing ``schedule.template.Constructible``: their tiling
problem on a target, the config of a state, and the analytic latency of a resolved config
(the CPU GEMM's beside it, ``schedule.templates.gemm.construction``; the CUDA matmul's,
``schedule.templates.matmul_cuda_construction``). A template without it keeps its
level-0 point. The memory hierarchy is the target's (``Target.memory()``) unless given.
"""
from __future__ import annotations

import math
import random
from typing import Any

from treadle.schedule.template import Constructible, Template, default_point, valid_points
from treadle.schedule.tiling import State, TilingProblem
from treadle.target import Target
from treadle.target.memory import MemoryHierarchy
from treadle.tune.etir import actions, benefit, cache, initial_state

T0 = 2.0 ** 48
THRESHOLD = 1.0
CHAINS = 8
METHODS = ("gensor", "greedy", "space")
SPACE_LEVEL = 2  # the hardware-centric space whose points "gensor" also ranks


def construct(template: Template, pattern: Any, target: Target, method: str = "gensor",
              seed: int = 0, memory: MemoryHierarchy | None = None) -> list[tuple[Any, Any]]:
    """(config, resolved) candidates of ``method``, best predicted first; the level-0
    point alone for a template that is not Constructible."""
    default = default_point(template, pattern, target)
    if not isinstance(template, Constructible):
        return [default]
    memory = memory or target.memory()
    problem = template.tiling_problem(pattern, target)
    if method not in METHODS:
        raise ValueError(f"construction method {method!r}: expected one of {METHODS}")
    states = []
    if method == "gensor":
        states = [s for k in range(CHAINS) for s in anneal(problem, memory, seed + k)]
    elif method == "greedy":
        states = [greedy(problem, memory)]
    configs = list(dict.fromkeys(template.constructed_config(s) for s in states))
    if method in ("gensor", "space"):
        configs += template.space(pattern, SPACE_LEVEL, target)
    points = [default, *valid_points(template, pattern, configs, target)]
    unique = {}
    for config, resolved in points:
        unique.setdefault(resolved, config)
    return sorted(((c, r) for r, c in unique.items()),
                  key=lambda point: template.predicted_seconds(point[1], memory))


# ---- the two constructors --------------------------------------------------------------

def cache_weight(step: int) -> float:
    """g(t): the cache action's weight grows as the chain cools (Gensor, IV-C)."""
    return 3 / (1 + math.exp(-math.log(5) / 10 * (step - 10)))


def keep_probability(temperature: float) -> float:
    return 1 - 1 / (1 + math.exp(-0.5 * (-math.log(temperature) - 10)))


def anneal(problem: TilingProblem, memory: MemoryHierarchy, seed: int) -> list[State]:
    """The complete states one seeded chain keeps (Algorithm 1)."""
    rng = random.Random(seed)
    state, kept, temperature, step = initial_state(problem), [], T0, 0
    while temperature > THRESHOLD:
        moves = actions(problem, state)
        weights = [benefit(problem, memory, state, label, after)
                   * (cache_weight(step) if label == "cache()" else 1.0)
                   for label, after in moves]
        if not any(weights):
            break
        state = rng.choices(moves, weights)[0][1]
        if rng.random() < keep_probability(temperature):
            kept.append(state)
        temperature, step = temperature / 2, step + 1
    kept.append(state)
    return [_completed(s) for s in kept]


def greedy(problem: TilingProblem, memory: MemoryHierarchy) -> State:
    """Roller-style: the best tiling move while one pays, then the next level out."""
    state = initial_state(problem)
    while True:
        moves = [(benefit(problem, memory, state, label, after), after)
                 for label, after in actions(problem, state)
                 if label.startswith("tile(") or label == "chain()"]
        best = max(moves, key=lambda m: m[0], default=(0.0, None))
        if best[0] > 1.0 + 1e-9:
            state = best[1]
        elif state.complete:
            return state
        else:
            state = cache(state)


def _completed(state: State) -> State:
    while not state.complete:
        state = cache(state)
    return state
