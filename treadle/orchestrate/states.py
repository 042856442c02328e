"""Execution states and the candidate kernels between them (Korch section 4.1).

Primitives are numbered in a topological order and a set of them is a bitmask. An
*execution state* is a set closed under producers: everything a member reads from
another primitive is in it. A candidate kernel is the difference of two states ``D2 - D1``
with ``D1`` inside ``D2``, which is exactly a convex set of primitives (Korch's Theorem 3):
no path leaves it and comes back, so it can run as one kernel between others.

States are enumerated depth-first from the empty one, one more available primitive at a
time, up to ``max_states``; from each state, the kernels that can run next are grown the
same way up to ``max_size`` primitives. A kernel is kept when it is connected through the
graph's real edges (two unrelated pieces gain nothing from sharing a kernel).
"""
from __future__ import annotations

import heapq
from typing import Iterator, Sequence

MAX_STATES = 4000
MAX_SIZE = 12


def bits(mask: int) -> Iterator[int]:
    """The members of a set, in increasing order."""
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


def execution_states(producers: Sequence[int], max_states: int = MAX_STATES) -> list[int]:
    """States reachable from the empty one, depth first, at most ``max_states``;
    ``producers[p]`` is the set of primitives ``p`` reads from."""
    everything = (1 << len(producers)) - 1
    found: dict[int, None] = {0: None}
    stack = [0]
    while stack and len(found) < max_states:
        state = stack.pop()
        for p in bits(everything & ~state):
            if producers[p] & ~state == 0 and (state | 1 << p) not in found:
                found[state | 1 << p] = None
                stack.append(state | 1 << p)
                if len(found) >= max_states:
                    break
    return list(found)


def candidate_kernels(producers: Sequence[int], states: Sequence[int],
                      max_size: int = MAX_SIZE) -> list[int]:
    """Every connected ``D2 - D1`` of at most ``max_size`` primitives with ``D1`` one of
    ``states`` and ``D2`` a state grown from it, each once."""
    consumers = [0] * len(producers)
    for p, mask in enumerate(producers):
        for q in bits(mask):
            consumers[q] |= 1 << p
    everything = (1 << len(producers)) - 1
    found: dict[int, None] = {}
    for start in states:
        seen = {0}
        stack = [0]
        while stack:
            kernel = stack.pop()
            done = start | kernel
            for p in bits(everything & ~done):
                grown = kernel | 1 << p
                if producers[p] & ~done or grown in seen:
                    continue
                seen.add(grown)
                if _connected(grown, producers, consumers):
                    found.setdefault(grown, None)
                if grown.bit_count() < max_size:
                    stack.append(grown)
    return list(found)


def _connected(kernel: int, producers: Sequence[int], consumers: Sequence[int]) -> bool:
    first = kernel & -kernel
    reached, frontier = first, first
    while frontier:
        grown = 0
        for p in bits(frontier):
            grown |= (producers[p] | consumers[p]) & kernel
        frontier = grown & ~reached
        reached |= frontier
    return reached == kernel


def cheapest_path(kernels: Sequence[tuple[int, int]], costs: Sequence[float], goal: int
                  ) -> tuple[list[int], float] | None:
    """The cheapest sequence of ``kernels`` (each its primitives and the primitives
    outside it that it reads from) leading from the empty state to ``goal``, each kernel
    running from a state holding what it reads and sharing no primitive with it: the
    best plan that computes every primitive once, by a shortest path over the states
    reached. None when ``goal`` is not reached."""
    best: dict[int, tuple[float, int, int]] = {0: (0.0, -1, -1)}  # cost, kernel, previous
    # States only grow, so one is final once every smaller one is done.
    frontier, queued = [(0, 0)], {0}
    while frontier:
        _, state = heapq.heappop(frontier)
        here = best[state][0]
        for k, (members, needs) in enumerate(kernels):
            if members & state or needs & ~state:
                continue
            grown, total = state | members, here + costs[k]
            if grown not in best or total < best[grown][0]:
                best[grown] = (total, k, state)
            if grown not in queued:
                queued.add(grown)
                heapq.heappush(frontier, (grown.bit_count(), grown))
    if goal not in best:
        return None
    path, state = [], goal
    while state:
        _, k, state = best[state]
        path.append(k)
    return path[::-1], best[goal][0]
