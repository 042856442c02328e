"""Kernel orchestration as a binary linear program (Korch section 4.2).

One 0/1 variable per candidate kernel; minimise the summed cost of the chosen ones so that
every required value (a graph output) is written by a chosen kernel, and every value a
chosen kernel reads is written by another chosen kernel. A primitive may be computed by
several chosen kernels: recomputing a cheap value can beat writing and reading it.

Korch's constraints allow chosen kernels to need each other in a circle, which no order
can run; such a choice is cut off (if all of the circle's kernels are chosen, some other
writer of a value they need must be too) and the program solved again. HiGHS (through
scipy) solves it under a time limit; a known feasible choice (the greedy plan) bounds the
objective, so the answer is never worse than it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Hashable, Sequence

import numpy as np

TIME_LIMIT_S = 5.0
MAX_CUTS = 200


class Infeasible(ValueError):
    """No set of the candidate kernels computes the required values."""


@dataclass(frozen=True)
class Option:
    """A candidate kernel as the program sees it: the values it writes and those it
    reads that some kernel must write, and what running it costs."""
    writes: frozenset[Hashable]
    reads: frozenset[Hashable]
    cost: float


@dataclass(frozen=True)
class Solution:
    chosen: tuple[int, ...]  # indices of options, in an order that runs writers first
    objective: float
    optimal: bool  # proven optimal, rather than the bound or the solver's best in time
    seconds: float


def solve(options: Sequence[Option], required: frozenset, incumbent: Sequence[int],
          time_limit: float = TIME_LIMIT_S) -> Solution:
    """The cheapest feasible set of ``options`` covering ``required``; ``incumbent`` is a
    feasible set the answer is never worse than (or empty, when none is known)."""
    from scipy.optimize import Bounds, LinearConstraint, milp
    start = time.perf_counter()
    if not options:  # the solver refuses a program without variables
        if required:
            raise Infeasible("no candidate kernel computes the outputs")
        return Solution((), 0.0, True, time.perf_counter() - start)
    bound = _total(options, incumbent) if incumbent else np.inf
    if incumbent and run_order(options, incumbent, required) is None:
        raise ValueError("the incumbent kernel set is not feasible")
    rows, lower = _constraints(options, required)
    # In units of the bound: the solver's tolerances are absolute, and costs in seconds
    # are all below them.
    unit = bound if 0 < bound < np.inf else max(max((o.cost for o in options), default=1.0),
                                                1e-30)
    cost = np.array([o.cost for o in options]) / unit
    for _ in range(MAX_CUTS):
        left = time_limit - (time.perf_counter() - start)
        if left <= 0:
            break
        a = np.array(rows + [cost]) if rows else cost[None, :]
        result = milp(cost, integrality=np.ones(len(options)), bounds=Bounds(0, 1),
                      constraints=LinearConstraint(a, lower + [-np.inf], [np.inf] * len(rows)
                                                   + [bound / unit * (1 + 1e-9)]),
                      options={"time_limit": left})
        if result.x is None:
            break
        chosen = needed(options, [k for k, x in enumerate(result.x) if x > 0.5], required)
        order = run_order(options, chosen, required)
        if order is None:
            row, low = _cycle_cut(options, chosen)
            rows.append(row)
            lower.append(low)
            continue
        if _total(options, order) <= bound:
            return Solution(tuple(order), _total(options, order), result.status == 0,
                            time.perf_counter() - start)
        break
    if not incumbent:
        raise Infeasible("no set of the candidate kernels computes the outputs")
    order = run_order(options, incumbent, required)
    return Solution(tuple(order), bound, False, time.perf_counter() - start)


def _total(options: Sequence[Option], chosen: Sequence[int]) -> float:
    return float(sum(options[k].cost for k in chosen))


def _constraints(options: Sequence[Option], required: frozenset
                 ) -> tuple[list[np.ndarray], list[float]]:
    writers: dict[Hashable, np.ndarray] = {}
    for k, o in enumerate(options):
        for value in o.writes:
            writers.setdefault(value, np.zeros(len(options)))[k] = 1
    rows, lower = [], []
    for value in required:  # every output is written
        rows.append(writers.get(value, np.zeros(len(options))))
        lower.append(1.0)
    for k, o in enumerate(options):  # a chosen kernel's inputs are written
        for value in o.reads:
            row = writers.get(value, np.zeros(len(options))).copy()
            row[k] -= 1
            rows.append(row)
            lower.append(0.0)
    return rows, lower


def _cycle_cut(options: Sequence[Option], chosen: Sequence[int]
               ) -> tuple[np.ndarray, float]:
    """The constraint ruling out kernels that wait on each other, found when ordering
    ``chosen`` got stuck: a smallest set C of stuck kernels whose unwritten inputs only
    kernels of C write. Whichever of C ran first would read them from outside C, so if
    all of C is chosen, some kernel outside it writing one of them must be too."""
    placed = run_prefix(options, chosen)
    written = {v for k in placed for v in options[k].writes}
    stuck = [k for k in chosen if k not in set(placed)]
    waits = {k: options[k].reads - written for k in stuck}
    after = {k: {j for j in stuck if options[j].writes & waits[k]} for k in stuck}
    reach = {}
    for k in stuck:
        seen, frontier = {k}, [k]
        while frontier:
            frontier = [j for i in frontier for j in after[i] if j not in seen]
            seen.update(frontier)
        reach[k] = seen
    circle = min(reach.values(), key=len)  # everything it reaches reaches back
    values = set().union(*(waits[k] for k in circle))
    row = np.zeros(len(options))
    row[sorted(circle)] = -1
    for j, o in enumerate(options):
        if j not in circle and o.writes & values:
            row[j] = 1
    return row, 1.0 - len(circle)


def run_prefix(options: Sequence[Option], chosen: Sequence[int]) -> list[int]:
    """Chosen kernels in an order where each runs after the writers of what it reads,
    as far as one exists."""
    written: set = set()
    left = list(chosen)
    order: list[int] = []
    progress = True
    while left and progress:
        progress = False
        for k in list(left):
            if options[k].reads <= written:
                order.append(k)
                written |= options[k].writes
                left.remove(k)
                progress = True
    return order


def run_order(options: Sequence[Option], chosen: Sequence[int], required: frozenset
              ) -> list[int] | None:
    """``chosen`` in an order that runs, or None when no order does or an output is
    never written."""
    order = run_prefix(options, chosen)
    if len(order) < len(set(chosen)):
        return None
    written = {v for k in order for v in options[k].writes}
    return order if required <= written else None


def needed(options: Sequence[Option], chosen: Sequence[int], required: frozenset) -> list[int]:
    """The chosen kernels whose writes lead to an output (a zero-cost one may be chosen
    for nothing)."""
    wanted, keep = set(required), set()
    changed = True
    while changed:
        changed = False
        for k in chosen:
            if k not in keep and options[k].writes & wanted:
                keep.add(k)
                wanted |= options[k].reads
                changed = True
    return [k for k in chosen if k in keep]
