"""lower_mapping: the loops it emits visit exactly the tasks of mapping.tasks(w), in order."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from treadle.ir.builder import FunctionBuilder
from treadle.ir.dtypes import int64
from treadle.ir.mapping import column_spatial, custom, repeat, spatial
from treadle.ir.passes.lower_mapping import lower_mapping
from treadle.ir.stmt import ForTask
from treadle.ir.functor import walk
from treadle.ir.verify import verify
from treadle.runtime.interpret import interpret


def recorder(mapping):
    """A program in which worker w writes its k-th task into trace[w, k, :]."""
    n, rank = mapping.num_workers, len(mapping.task_shape)
    per_worker = len(mapping.tasks(0))
    with FunctionBuilder("record") as fb:
        trace = fb.param("trace", int64, [n, per_worker, rank])
        for w in fb.range(n, name="w"):
            slot = fb.scalar("slot", int64, 0)
            for task in mapping.on(w):
                for d, t in enumerate(task):
                    trace[w, slot[()], d] = t
                slot[()] = slot[()] + 1
    return fb.function


def expected_trace(mapping):
    return np.array([mapping.tasks(w) for w in range(mapping.num_workers)], np.int64)


def run_lowered(mapping):
    func = lower_mapping(recorder(mapping))
    verify(func, lowered=True)
    assert not any(isinstance(n, ForTask) for n in walk(func.body))
    trace = np.full_like(expected_trace(mapping), -1)
    interpret(func, trace)
    return trace


def test_figure_8_mapping_lowers_to_expected_order():
    m = repeat(4, 1) * spatial(16, 8)
    np.testing.assert_array_equal(run_lowered(m), expected_trace(m))


def test_custom_and_column_major_mappings_lower():
    skew = custom((4, 4), 4, 2, lambda w, j: (w, (w + 2 * j) % 4), "skew")
    for m in (column_spatial(3, 2) * repeat(2, 1), skew * spatial(1, 2), repeat(2, 1) * skew):
        np.testing.assert_array_equal(run_lowered(m), expected_trace(m))


def _atom(rank):
    dims = st.lists(st.integers(1, 3), min_size=rank, max_size=rank).map(tuple)
    return st.one_of(dims.map(lambda d: spatial(*d)), dims.map(lambda d: repeat(*d)))


@st.composite
def mappings(draw):
    rank = draw(st.integers(1, 3))
    atoms = draw(st.lists(_atom(rank), min_size=1, max_size=3))
    result = atoms[0]
    for a in atoms[1:]:
        result = result * a
    return result


@settings(max_examples=60, deadline=None)
@given(mappings())
def test_random_compositions_lower_to_the_same_task_lists(m):
    np.testing.assert_array_equal(run_lowered(m), expected_trace(m))


def test_symbolic_repeat_extent():
    with FunctionBuilder("sym") as fb:
        n = fb.symbol("n")
        out = fb.param("out", int64, [2, n])
        for w in fb.range(2, name="w"):
            for i, j in (spatial(2, 1) * repeat(1, n)).on(w):
                out[i, j] = i * 100 + j
    out = np.zeros((2, 5), np.int64)
    interpret(lower_mapping(fb.function), out)
    np.testing.assert_array_equal(out, [[0, 1, 2, 3, 4], [100, 101, 102, 103, 104]])
