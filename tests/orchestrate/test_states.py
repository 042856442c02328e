"""Execution states and candidate kernels against brute force over every subset, with
networkx deciding convexity and connectivity."""
import itertools
import random

import networkx as nx
import pytest

from treadle.orchestrate.states import (bits, candidate_kernels, cheapest_path,
                                        execution_states)


def random_dag(nodes: int, seed: int) -> list[int]:
    """Producers of each node as bitmasks; node p reads only from nodes before it."""
    rand = random.Random(seed)
    return [sum(1 << q for q in range(p) if rand.random() < 0.4) for p in range(nodes)]


def as_networkx(producers: list[int]) -> nx.DiGraph:
    graph = nx.DiGraph()
    graph.add_nodes_from(range(len(producers)))
    graph.add_edges_from((q, p) for p, mask in enumerate(producers) for q in bits(mask))
    return graph


def subsets(n: int):
    return (sum(1 << p for p in chosen) for size in range(n + 1)
            for chosen in itertools.combinations(range(n), size))


def is_state(members: set[int], graph: nx.DiGraph) -> bool:
    return all(q in members for p in members for q in graph.predecessors(p))


def is_convex(members: set[int], graph: nx.DiGraph) -> bool:
    below = set().union(*(nx.ancestors(graph, p) for p in members))
    above = set().union(*(nx.descendants(graph, p) for p in members))
    return not (below & above) - members


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("nodes", [1, 5, 8])
def test_states_and_kernels_are_every_closed_and_every_convex_connected_set(nodes, seed):
    producers = random_dag(nodes, seed)
    graph = as_networkx(producers)
    want_states = {m for m in subsets(nodes) if is_state(set(bits(m)), graph)}
    states = execution_states(producers, max_states=10 ** 6)
    assert len(states) == len(set(states)) and set(states) == want_states
    want = {m for m in subsets(nodes) if m and is_convex(set(bits(m)), graph)
            and nx.is_weakly_connected(graph.subgraph(bits(m)))}
    kernels = candidate_kernels(producers, states, max_size=nodes)
    assert len(kernels) == len(set(kernels)) and set(kernels) == want


def test_a_wide_graph_keeps_to_the_caps():
    producers = [0] * 12 + [(1 << 12) - 1]  # twelve independent nodes and one joining them
    states = execution_states(producers, max_states=100)
    assert len(states) == 100
    graph = as_networkx(producers)
    assert all(is_state(set(bits(s)), graph) for s in states)
    kernels = candidate_kernels(producers, states, max_size=3)
    assert kernels and all(k.bit_count() <= 3 for k in kernels)
    assert all(is_convex(set(bits(k)), graph) for k in kernels)


def partitions(items: list[int]):
    """Every way of splitting ``items`` into nonempty blocks."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for split in partitions(rest):
        yield [[first]] + split
        for k in range(len(split)):
            yield split[:k] + [[first] + split[k]] + split[k + 1:]


def runs_in_order(blocks: list[int], producers: list[int]) -> bool:
    """Whether the blocks (bitmasks) can run one after another, each reading only from
    earlier blocks and itself."""
    done, left = 0, list(blocks)
    while left:
        ready = [b for b in left if all(producers[p] & ~(done | b) == 0 for p in bits(b))]
        if not ready:
            return False
        done |= ready[0]
        left.remove(ready[0])
    return True


@pytest.mark.parametrize("seed", range(6))
def test_the_cheapest_path_is_the_cheapest_partition_into_kernels(seed):
    producers = random_dag(6, seed)
    kernels = candidate_kernels(producers, execution_states(producers), max_size=6)
    rand = random.Random(seed)
    cost = {k: rand.uniform(1, 10) for k in kernels}
    steps = [(k, _outside(k, producers)) for k in kernels]
    path, total = cheapest_path(steps, [cost[k] for k, _ in steps], (1 << 6) - 1)
    assert runs_in_order([steps[k][0] for k in path], producers)
    assert total == pytest.approx(sum(cost[steps[k][0]] for k in path))
    best = float("inf")
    for split in partitions(list(range(6))):
        blocks = [sum(1 << p for p in block) for block in split]
        if all(b in cost for b in blocks) and runs_in_order(blocks, producers):
            best = min(best, sum(cost[b] for b in blocks))
    assert total == pytest.approx(best)


def _outside(kernel: int, producers: list[int]) -> int:
    found = 0
    for p in bits(kernel):
        found |= producers[p]
    return found & ~kernel
