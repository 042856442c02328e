"""The binary linear program against brute force over every set of kernels, and the
choices it must make: recomputing a value, avoiding kernels that wait on each other, never
worse than the known plan."""
import itertools
import random

import pytest

from treadle.orchestrate.blp import Option, solve


def runs(options, chosen, required) -> bool:
    """Whether the kernels in ``chosen`` can run one after another, each after kernels
    writing everything it reads, and together write ``required``."""
    written, left = set(), set(chosen)
    while left:
        ready = {k for k in left if options[k].reads <= written}
        if not ready:
            return False
        for k in ready:
            written |= options[k].writes
        left -= ready
    return required <= written


def brute_force(options, required) -> float:
    return min((sum(options[k].cost for k in subset)
                for size in range(len(options) + 1)
                for subset in itertools.combinations(range(len(options)), size)
                if runs(options, subset, required)), default=float("inf"))


def option(writes: str, reads: str, cost: float) -> Option:
    return Option(frozenset(writes), frozenset(reads), cost)


def test_a_value_is_recomputed_where_writing_it_costs_more():
    # p feeds q and r; computing p inside each of their kernels beats writing it.
    options = [option("p", "", 5), option("q", "p", 5), option("r", "p", 5),
               option("q", "", 6), option("r", "", 6)]
    solution = solve(options, frozenset("qr"), [0, 1, 2])
    assert sorted(solution.chosen) == [3, 4] and solution.objective == 12
    assert solution.optimal


def test_kernels_that_wait_on_each_other_are_never_chosen():
    # The two cheap kernels each read what the other writes: no order runs them.
    options = [option("a", "b", 1), option("b", "a", 1), option("a", "", 10),
               option("b", "", 10)]
    solution = solve(options, frozenset("ab"), [2, 3])
    assert runs(options, solution.chosen, frozenset("ab"))
    assert solution.objective == brute_force(options, frozenset("ab")) == 11
    written = set()
    for k in solution.chosen:  # in the order given, each kernel's inputs are written
        assert options[k].reads <= written
        written |= options[k].writes


def random_problem(seed: int):
    """Values 0..5 in a chain-with-branches; each option computes some of them from
    others; singletons guarantee a feasible plan."""
    rand = random.Random(seed)
    deps = {v: {u for u in range(v) if rand.random() < 0.4} for v in range(6)}
    options = [Option(frozenset({v}), frozenset(deps[v]), rand.uniform(1, 10)) for v in range(6)]
    for _ in range(10):
        members = set(rand.sample(range(6), rand.randint(2, 4)))
        reads = set().union(*(deps[v] for v in members)) - members
        writes = set(rand.sample(sorted(members), rand.randint(1, len(members))))
        options.append(Option(frozenset(writes), frozenset(reads), rand.uniform(1, 15)))
    required = frozenset({5, rand.randrange(5)})
    return options, required


@pytest.mark.parametrize("seed", range(12))
def test_the_program_finds_the_brute_force_optimum(seed):
    options, required = random_problem(seed)
    greedy = list(range(6))
    solution = solve(options, required, greedy)
    assert runs(options, solution.chosen, required)
    assert solution.objective == pytest.approx(sum(options[k].cost for k in solution.chosen))
    assert solution.objective == pytest.approx(brute_force(options, required))
    assert solution.objective <= sum(o.cost for o in options[:6]) + 1e-12


def test_out_of_time_the_known_plan_stands():
    options, required = random_problem(3)
    solution = solve(options, required, list(range(6)), time_limit=0)
    assert not solution.optimal and sorted(solution.chosen) == list(range(6))
    assert solution.objective == pytest.approx(sum(o.cost for o in options[:6]))


def test_a_plan_that_does_not_run_is_refused_as_the_known_one():
    options = [option("a", "b", 1), option("b", "a", 1)]
    with pytest.raises(ValueError, match="not feasible"):
        solve(options, frozenset("a"), [0, 1])
    with pytest.raises(ValueError, match="no set of the candidate kernels"):
        solve(options, frozenset("a"), [])


def test_no_candidates_choose_nothing_or_are_infeasible():
    solution = solve([], frozenset(), [])
    assert solution.chosen == () and solution.objective == 0.0 and solution.optimal
    with pytest.raises(ValueError, match="no candidate kernel"):
        solve([], frozenset("a"), [])
