"""Task-mapping algebra against the definitions of Hidet section 5.1 (Figures 8, 11, 12)."""
import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from treadle.ir.dtypes import index_type
from treadle.ir.expr import Binary, Const, Var
from treadle.ir.functor import walk
from treadle.ir.mapping import column_spatial, custom, ravel, repeat, spatial, unravel


def ref_spatial(*shape):
    """The paper's spatial(d): worker w does the single task unravel(w, d)."""
    def f(w):
        return [tuple(int(x) for x in _unravel(w, shape))]
    return shape, math.prod(shape), f


def ref_repeat(*shape):
    def f(w):
        assert w == 0
        return [tuple(t) for t in itertools.product(*(range(d) for d in shape))]
    return shape, 1, f


def ref_compose(a, b):
    """f3(w) = [t1 ⊙ d2 + t2 | t1 ∈ f1(w // n2), t2 ∈ f2(w % n2)], literally."""
    (d1, n1, f1), (d2, n2, f2) = a, b
    d3 = tuple(x * y for x, y in zip(d1, d2))

    def f3(w):
        return [tuple(x * d + y for x, d, y in zip(t1, d2, t2))
                for t1 in f1(w // n2) for t2 in f2(w % n2)]
    return d3, n1 * n2, f3


def _unravel(w, shape):
    out = []
    for d in reversed(shape):
        out.append(w % d)
        w //= d
    return reversed(out)


def all_tasks(mapping):
    return {w: mapping.tasks(w) for w in range(mapping.num_workers)}


def test_figure_11_basic_mappings():
    assert all_tasks(repeat(2, 2)) == {0: [(0, 0), (0, 1), (1, 0), (1, 1)]}
    assert all_tasks(spatial(2, 2)) == {0: [(0, 0)], 1: [(0, 1)], 2: [(1, 0)], 3: [(1, 1)]}


def test_figure_8_cooperative_load_mapping():
    m = repeat(4, 1) * spatial(16, 8)
    assert m.task_shape == (64, 8) and m.num_workers == 128
    for w in range(128):
        assert m.tasks(w) == [(w // 8 + 16 * r, w % 8) for r in range(4)]


def test_figure_12_compositions_are_not_commutative():
    a = repeat(1, 3) * spatial(2, 2)
    b = spatial(2, 2) * repeat(1, 3)
    assert a.task_shape == b.task_shape == (2, 6)
    assert a.num_workers == b.num_workers == 4
    assert a.tasks(1) == [(0, 1), (0, 3), (0, 5)]  # (a): strided columns
    assert b.tasks(1) == [(0, 3), (0, 4), (0, 5)]  # (b): a contiguous block of columns
    assert all_tasks(a) != all_tasks(b)


def test_figure_12_three_way_and_column_major():
    c = spatial(2) * repeat(2) * spatial(2)
    assert c.task_shape == (8,) and c.num_workers == 4
    assert c.tasks(0) == [(0,), (2,)] and c.tasks(3) == [(5,), (7,)]
    d = repeat(1, 2) * repeat(2, 1)
    assert d.tasks(0) == [(0, 0), (1, 0), (0, 1), (1, 1)]  # column-major order


def test_column_spatial_custom_mapping():
    m = column_spatial(3, 2)
    assert m.num_workers == 6
    assert [m.tasks(w)[0] for w in range(6)] == [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1)]


def test_custom_mapping_composes():
    diagonal = custom((4, 4), 4, 1, lambda w, j: (w, (w + 1) % 4), "skew")
    m = diagonal * repeat(2, 1)
    assert m.task_shape == (8, 4) and m.num_workers == 4
    assert m.tasks(3) == [(6, 0), (7, 0)]


def test_composing_different_ranks_fails():
    with pytest.raises(ValueError, match="compose"):
        spatial(2, 2) * repeat(3)


def test_worker_out_of_range_fails():
    with pytest.raises(ValueError, match="outside"):
        spatial(4).tasks(4)


# ---- property tests over random compositions --------------------------------------------

rank = st.integers(1, 3)


def atoms(r):
    dims = st.lists(st.integers(1, 3), min_size=r, max_size=r)
    return st.one_of(dims.map(lambda d: ("spatial", tuple(d))), dims.map(lambda d: ("repeat", tuple(d))))


def chains(min_size=1, max_size=4):
    return rank.flatmap(lambda r: st.lists(atoms(r), min_size=min_size, max_size=max_size))


def build(chain):
    ours = {"spatial": spatial, "repeat": repeat}
    refs = {"spatial": ref_spatial, "repeat": ref_repeat}
    mapping, ref = None, None
    for kind, dims in chain:
        m, r = ours[kind](*dims), refs[kind](*dims)
        mapping = m if mapping is None else mapping * m
        ref = r if ref is None else ref_compose(ref, r)
    return mapping, ref


@settings(max_examples=150, deadline=None)
@given(chains())
def test_matches_paper_definition(chain):
    mapping, (shape, n, f) = build(chain)
    assert mapping.task_shape == shape
    assert mapping.num_workers == n
    for w in range(n):
        assert mapping.tasks(w) == f(w)


@settings(max_examples=150, deadline=None)
@given(chains())
def test_every_task_assigned_exactly_once(chain):
    mapping, _ = build(chain)
    assigned = [t for w in range(mapping.num_workers) for t in mapping.tasks(w)]
    domain = set(itertools.product(*(range(d) for d in mapping.task_shape)))
    assert len(assigned) == len(domain) and set(assigned) == domain


@settings(max_examples=100, deadline=None)
@given(chains(3, 3))
def test_composition_is_associative(chain):
    (a, b, c) = [build([x])[1] for x in chain]
    left, right = ref_compose(ref_compose(a, b), c), ref_compose(a, ref_compose(b, c))
    assert left[:2] == right[:2]
    assert all(left[2](w) == right[2](w) for w in range(left[1]))
    ma, mb, mc = [build([x])[0] for x in chain]
    assert all_tasks((ma * mb) * mc) == all_tasks(ma * (mb * mc))


@settings(max_examples=100, deadline=None)
@given(chains(2, 2))
def test_tasks_of_each_worker_follow_composition_order(chain):
    """Within a worker, tasks of the outer mapping vary slowest."""
    mapping, _ = build(chain)
    inner = build(chain[1:])[0]
    for w in range(mapping.num_workers):
        tasks = mapping.tasks(w)
        per_outer = len(inner.tasks(w % inner.num_workers))
        blocks = [tasks[i:i + per_outer] for i in range(0, len(tasks), per_outer)]
        outer_ids = [tuple(x // d for x, d in zip(block[0], inner.task_shape)) for block in blocks]
        assert all(tuple(x // d for x, d in zip(t, inner.task_shape)) == oid
                   for block, oid in zip(blocks, outer_ids) for t in block)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 5), min_size=1, max_size=4), st.data())
def test_unravel_inverts_ravel_with_unit_axes_free(shape, data):
    flat = data.draw(st.integers(0, math.prod(shape) - 1))
    coords = unravel(flat, shape)
    assert coords == tuple(int(x) for x in _unravel(flat, shape))
    assert ravel(coords, shape) == flat


def test_unravel_divides_by_no_unit_axis():
    """Beside an axis of extent 1, a symbolic extent takes the index as it is: a modulo by
    a run-time size would stay in every generated loop (attention's [1, seq] columns)."""
    index, seq = Var("i", index_type), Var("seq", index_type)
    coords = unravel(index, [1, seq, 1])
    assert coords[1] is index and all(isinstance(c, Const) and c.value == 0
                                      for c in (coords[0], coords[2]))
    _, rows, cols = unravel(index, [1, seq, 4])
    assert not any(isinstance(n, Binary) and n.op == "%" for n in walk(rows))
    assert cols == index % 4
    # a unit extent written as an expression (a static axis beside a symbolic one)
    batch, rows = unravel(index, [Const(1, index_type), seq])
    assert rows is index and isinstance(batch, Const) and batch.value == 0
