"""The construction state and its actions: tiles stay nested and within every level's
capacity along any walk (hypothesis), and the benefit formulas on hand-computed cases."""
import math

from hypothesis import given, settings, strategies as st

from treadle.schedule.tiling import State, TensorAccess, TilingProblem
from treadle.target.memory import Level, MemoryHierarchy
from treadle.tune.etir import (actions, benefit, cache, caching_benefit, chain, chain_benefit,
                               footprint, initial_state, resize, tiling_benefit, traffic)

# A 2-D problem, C[i] += A[i, j] * x[j]: two levels, tiles in powers of two, a level's
# capacity in elements.
CAPACITY = (64, 4096)


def toy(extents=(64, 32), cores=2) -> TilingProblem:
    def steps(level, dim, inner):
        return [s for s in (1, 2, 4, 8, 16, 32, 64) if s % inner == 0 and s <= extents[dim]]

    def usages(state):
        return [footprint(problem, t) / 4 / c for t, c in zip(state.tiles, CAPACITY)]
    problem = TilingProblem(
        ("i", "j"), extents,
        (TensorAccess(frozenset({0, 1})), TensorAccess(frozenset({1})),
         TensorAccess(frozenset({0}), output=True)),
        ("registers", "L1"), steps, lambda s: max(usages(s)) <= 1,
        lambda s: usages(s)[s.level], cores, max_chains=4)
    return problem


MEMORY = MemoryHierarchy((Level("registers", 256, 0.5, 400.0), Level("L1", 32768, 1.0, 100.0),
                          Level("L2", 1 << 20, 4.0, 50.0)), 100.0, "defaults")


def test_traffic_and_footprint_by_hand():
    problem = toy()
    # A 4 x 8 tile holds 32 of A, 8 of x and 4 of C: 44 floats.
    assert footprint(problem, (4, 8)) == 4 * 44
    # 16 x 4 tiles: A and x move once per tile (each tile its part), C once per i-tile.
    assert traffic(problem, (4, 8)) == 4 * (32 * 64 + 8 * 64 + 4 * 16)
    before, after = (4, 8), (8, 8)
    expected = (traffic(problem, before) * footprint(problem, after)
                / (traffic(problem, after) * footprint(problem, before)))
    assert math.isclose(tiling_benefit(problem, before, after), expected)
    # Doubling i halves the x traffic and keeps A's and C's: (2048 + 512 + 64) /
    # (2048 + 256 + 64) less traffic, times F(T') / F(T) = (64 + 8 + 8) / 44 as the
    # paper's formula 1 is written (the capacity check is what bounds the growth).
    assert math.isclose(expected, (2048 + 512 + 64) / (2048 + 256 + 64) * 80 / 44)


def test_caching_and_chain_benefits_by_hand():
    problem = toy()
    state = State(((4, 8), (4, 8)))
    size = footprint(problem, (4, 8))
    usage = size / 4 / CAPACITY[0]
    assert math.isclose(caching_benefit(problem, state, MEMORY),
                        (1.0 + size / 100.0) / (0.5 + size / 400.0) * usage)
    # 16 i-tiles of 4 on 2 cores: balanced already, so chains gain nothing; one tile of 64
    # on 2 cores gains twice.
    assert chain_benefit(problem, state, chain(problem, state)) == 1.0
    whole = State(((64, 8), (64, 8)))
    assert chain_benefit(problem, whole, chain(problem, whole)) == 2.0


def test_a_move_past_a_capacity_has_no_benefit():
    problem = toy()
    state = State(((8, 8), (8, 8)))  # 64 + 8 + 8 elements: over the first level's 64
    grown = resize(problem, State(((4, 8), (4, 8))), 0, 1)
    assert grown.tile(0) == (8, 8)
    assert benefit(problem, MEMORY, State(((4, 8), (4, 8))), "tile(i)", grown) == 0.0
    assert not problem.fits(state)


def nested(state: State) -> bool:
    return all(outer % inner == 0 for lo, hi in zip(state.tiles, state.tiles[1:])
               for inner, outer in zip(lo, hi))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 1000), max_size=40), st.integers(1, 128), st.integers(1, 64))
def test_walks_keep_tiles_nested_and_within_capacity(choices, rows, cols):
    problem = toy((rows, cols))
    state = initial_state(problem)
    assert nested(state)
    for choice in choices:
        moves = [(label, after) for label, after in actions(problem, state)
                 if benefit(problem, MEMORY, state, label, after) > 0]
        if not moves:
            break
        state = moves[choice % len(moves)][1]
        assert nested(state) and problem.fits(state)
        assert all(t <= max(e, 1) for tile in state.tiles for t, e in zip(tile, (rows, cols)))
        assert 1 <= state.chains <= problem.max_chains


def test_cache_moves_outward_and_starts_from_the_inner_tile():
    problem = toy()
    state = resize(problem, initial_state(problem), 1, 1)
    moved = cache(state)
    assert moved.level == 1 and moved.tile() == state.tile(0)
    assert cache(moved) is None  # the last level
