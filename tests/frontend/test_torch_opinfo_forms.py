"""Argument forms of PyTorch's OpInfo samples through ``torch.compile(backend="treadle")``,
against eager PyTorch: replicate padding that crops, ``tensor_split`` at indices held in
a tensor, scalar ``index_fill`` and scatters, gathers of empty or smaller indices,
``repeat_interleave`` with tensor repeats, embeddings with ``max_norm`` and the chunked
``F.linear_cross_entropy``. Each compiles whole (no part in eager) unless a test says
otherwise."""
import warnings

import pytest

torch = pytest.importorskip("torch")

import treadle  # noqa: E402,F401  (registers the backend's converters)
from treadle.errors import KernelError  # noqa: E402

F = torch.nn.functional
EXACT = {"rtol": 0, "atol": 0}  # copies, gathers and scatters of one value
FLOAT32 = {"rtol": 1e-5, "atol": 1e-5}  # short sums of float32 products


@pytest.fixture(autouse=True)
def fresh():
    torch.manual_seed(0)
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _through_backend(function, *args) -> tuple[list, list[str]]:
    """The compiled function's results (flattened), each argument as it is after the call,
    and the backend's warnings that it ran something in eager."""
    compiled = torch.compile(function, backend="treadle", fullgraph=True, dynamic=False)
    args = [a.clone() for a in args]
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        results = compiled(*args)
    eager = [str(w.message) for w in caught if str(w.message).startswith("treadle runs")]
    return torch.utils._pytree.tree_leaves(results) + args, eager


def _matches(function, *args, tol=EXACT, eager: tuple[str, ...] = ()) -> None:
    """The backend's results and written arguments equal eager's; it runs nothing in
    eager but what its warnings say, one each holding a substring of ``eager``."""
    got, warned = _through_backend(function, *args)
    expected = [a.clone() for a in args]
    with torch.no_grad():
        expected = torch.utils._pytree.tree_leaves(function(*expected)) + expected
    assert len(warned) == len(eager) and all(e in w for e, w in zip(eager, warned)), warned
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, equal_nan=True, **tol)


# ---- replicate padding with negative pads ------------------------------------------------

@pytest.mark.parametrize("shape,pad", [
    ((5, 3, 4, 4), (-4, 5, 0, 0)),
    ((6, 2, 4, 4), (0, 0, 2, -4)),
    ((5, 6, 4, 4), (5, -4, -4, 3)),
    ((2, 3, 7, 13), (-1, -2, 1, -3)),
    ((3, 11), (-2, 3)),
    ((1, 2, 3, 5, 7), (1, -1, -2, 0, 0, 2)),
])
def test_replicate_padding_crops_where_negative(shape, pad):
    _matches(lambda x: F.pad(x, pad, mode="replicate"), torch.randn(shape))


# ---- tensor_split at indices held in a tensor --------------------------------------------

@pytest.mark.parametrize("indices", [[1, 3, 4], [0, 9], [-2, 2], [5, 3], [7], []])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_tensor_split_at_run_time_indices(indices, dim):
    """Each part's length is found in the data: a gather of the positions a mask over
    the dimension selects."""
    def parts(x, at):
        return [p * 2 for p in torch.tensor_split(x, at, dim=dim)]
    _matches(parts, torch.randn(5, 7, 3), torch.tensor(indices, dtype=torch.int64))


def test_returned_parts_at_run_time_indices_are_eager_views():
    """Parts the graph returns are views of its input, which AOTAutograd rebuilds from
    the returned tensors' strides: those slices are made in eager, as views, and their
    sizes read there for the graph's checks, without a warning; the index reads are
    not."""
    _matches(lambda x, at: torch.tensor_split(x, at, dim=1), torch.randn(5, 7, 3),
             torch.tensor([2, 5]))


def test_returned_slice_of_symbolic_bounds_is_an_eager_view():
    """``x[:, :n - 1]`` returned, n a symbolic size: the same rebuilding would read a
    treadle result's row-major strides into ``x``, so the slice stays in eager."""
    def cropped(x):
        return x[:, : x.shape[1] - 1]
    compiled = torch.compile(cropped, backend="treadle", dynamic=True)
    for size in (5, 7, 13):
        x = torch.randn(3, size)
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            torch.testing.assert_close(compiled(x), cropped(x), **EXACT)


@pytest.mark.parametrize("value", [3, -2, 0, 9])
def test_slices_at_an_index_read_from_a_tensor(value):
    """``x[n.item():]``, strided too, past either end or negative."""
    def parts(x, n):
        k = n.item()
        return (x * 2)[:, :k] + 1, x[k:] * 3, x[k::2] - 1
    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        _matches(parts, torch.randn(7, 6), torch.tensor(value))


def test_tensor_split_at_known_indices():
    _matches(lambda x: [p + 1 for p in torch.tensor_split(x, [2, 2, 11], dim=1)],
             torch.randn(3, 13))


# ---- scalar index_fill, scatters and gathers ---------------------------------------------

@pytest.mark.parametrize("index", [torch.tensor([0]), torch.tensor(0), torch.tensor([0, 0])])
def test_index_fill_of_a_scalar(index):
    _matches(lambda x, i: x.index_fill(0, i, -8.5), torch.randn(()), index)
    _matches(lambda x, i, v: x.index_fill(0, i, v), torch.randn(()), index, torch.randn(()))


SCALAR_SCATTERS = {
    "scatter": lambda x, i, s: x.scatter(0, i, s),
    "scatter_value": lambda x, i, s: x.scatter(0, i, 2.5),
    "scatter_add": lambda x, i, s: x.scatter_add(0, i, s),
    "scatter_reduce_add": lambda x, i, s: x.scatter(0, i, s, reduce="add"),
    "scatter_value_multiply": lambda x, i, s: x.scatter(0, i, 2.5, reduce="multiply"),
    **{f"scatter_reduce_{r}_{self}": (lambda r, self: lambda x, i, s: x.scatter_reduce(
        0, i, s, r, include_self=self))(r, self)
       for r in ("sum", "prod", "mean", "amax", "amin") for self in (True, False)},
}


@pytest.mark.parametrize("name", sorted(SCALAR_SCATTERS))
def test_scatter_into_a_scalar(name):
    _matches(SCALAR_SCATTERS[name], torch.randn(()), torch.tensor(0), torch.randn(()))


def test_scatter_of_a_scalar_index_into_a_vector():
    _matches(lambda x, i, s: x.scatter_add(0, i, s), torch.randn(7), torch.tensor(3),
             torch.randn(()))


@pytest.mark.parametrize("dim", [0, 1])
def test_scatter_add_of_an_index_smaller_than_input_and_source(dim):
    """torch reads only the part of ``src`` that ``index`` covers, and ``index`` may be
    shorter than the input in the dimensions not scattered along."""
    index = torch.randint(0, 5 if dim else 7, (3, 2))
    _matches(lambda x, i, s: x.scatter_add(dim, i, s), torch.randn(7, 5), index,
             torch.randn(4, 3), tol=FLOAT32)


def test_scatter_of_an_empty_index_writes_nothing():
    _matches(lambda x, i, s: x.scatter(1, i, s), torch.randn(7, 5),
             torch.zeros(7, 0, dtype=torch.int64), torch.randn(7, 3))


@pytest.mark.parametrize("x_shape,index_shape", [((5,), (2, 0)), ((7, 3), (0, 3)), ((), (0,))])
def test_gather_of_an_empty_index(x_shape, index_shape):
    """An index without elements gathers nothing, whatever its rank."""
    _matches(lambda x, i: torch.gather(x, 0, i), torch.randn(x_shape),
             torch.zeros(index_shape, dtype=torch.int64))


@pytest.mark.parametrize("dim", [0, 1])
def test_gather_of_an_index_smaller_than_input(dim):
    index = torch.randint(0, 5 if dim else 7, (3, 2))
    _matches(lambda x, i: torch.gather(x, dim, i), torch.randn(7, 5), index)


# ---- repeat_interleave with tensor repeats -----------------------------------------------

@pytest.mark.parametrize("repeats", [[0, 1, 2, 3], [3, 0, 0, 1], [0, 0, 0, 0], [1, 1, 1, 13]])
def test_repeat_interleave_of_known_output_size(repeats):
    repeats = torch.tensor(repeats)
    total = int(repeats.sum())
    _matches(lambda x, r: x.repeat_interleave(r, dim=0, output_size=total),
             torch.randn(4, 3), repeats)
    _matches(lambda r: torch.repeat_interleave(r, output_size=total), repeats)


@pytest.mark.parametrize("repeats", [[0, 1, 2], [3, 0, 0, 1, 5], [0, 0, 0], [7], []])
def test_repeat_interleave_of_a_size_found_in_the_data(repeats):
    """Without ``output_size`` the output's size is the sum of the repeats, which no
    input's size bounds: the graph finds it when it runs (FoundSum) and allocates what it
    sizes then, compiling the whole function, the shapes that follow from it included."""
    x = torch.randn(2, len(repeats), 5)
    repeats = torch.tensor(repeats, dtype=torch.int64)
    _matches(lambda x, r: x.repeat_interleave(r, dim=1) * 2, x, repeats)
    _matches(lambda r: torch.repeat_interleave(r), repeats)


def test_repeat_interleave_of_negative_repeats_is_an_error_naming_the_node():
    compiled = torch.compile(lambda r: torch.repeat_interleave(r), backend="treadle",
                             fullgraph=True, dynamic=False)
    torch.testing.assert_close(compiled(torch.tensor([2, 0, 1])), torch.tensor([0, 0, 2]))
    for repeats in ([-1, 2, 0], [-2, -1]):
        with pytest.raises(KernelError, match="repeat_interleave.*negative count"):
            compiled(torch.tensor(repeats))


def test_repeat_interleave_of_a_found_size_at_each_call():
    """One compiled function over repeats of different sums: each call its own size."""
    compiled = torch.compile(lambda x, r: x.repeat_interleave(r, dim=0).sum(1),
                             backend="treadle", fullgraph=True, dynamic=False)
    x = torch.randn(3, 4)
    for repeats in ([1, 2, 3], [0, 0, 9], [4, 0, 1]):
        r = torch.tensor(repeats)
        torch.testing.assert_close(compiled(x, r), x.repeat_interleave(r, dim=0).sum(1),
                                   **FLOAT32)


# ---- embeddings with max_norm ------------------------------------------------------------

@pytest.mark.parametrize("norm_type", [1.0, 2.0, 3.0, float("inf")])
@pytest.mark.parametrize("indices", [[[0, 1], [1, 12]], [[4, 4, 4], [4, 2, 2]], [[]]])
def test_embedding_with_max_norm_renormalises_the_rows_looked_up(norm_type, indices):
    """Rows looked up whose norm exceeds max_norm shrink to it, in the output and in the
    weight, which eager writes in place; the others keep theirs."""
    weight = torch.randn(13, 7) * 2
    _matches(lambda w, i: F.embedding(i, w, max_norm=1.5, norm_type=norm_type), weight,
             torch.tensor(indices, dtype=torch.int64).reshape(len(indices), -1), tol=FLOAT32)


# ---- chunked linear_cross_entropy --------------------------------------------------------

def _chunked(reduction, weighted, ignore_index, biased):
    options = torch.nn.LinearCrossEntropyOptions(batch_chunk_size=2, allow_retain_graph=True)

    def loss(x, linear_weight, target, bias, weight):
        return F.linear_cross_entropy(
            x, linear_weight, target, linear_bias=bias if biased else None,
            weight=weight if weighted else None, reduction=reduction,
            ignore_index=ignore_index, options=options)
    return loss


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted,ignore_index,biased", [
    (False, None, False), (True, None, True), (True, 3, False), (False, 0, True)])
@pytest.mark.parametrize("batch", [0, 1, 7])
def test_chunked_linear_cross_entropy(reduction, weighted, ignore_index, biased, batch):
    """Linear then cross entropy over class indices, the ignored ones not counted (an
    empty or wholly ignored mean is NaN, as in eager)."""
    classes, features = 13, 5
    target = torch.randint(0, classes, (batch,))
    target[::3] = 3
    _matches(_chunked(reduction, weighted, ignore_index, biased), torch.randn(batch, features),
             torch.randn(classes, features), target, torch.randn(classes),
             torch.rand(classes), tol=FLOAT32)


def test_chunked_linear_cross_entropy_of_one_sample():
    _matches(_chunked("mean", True, None, True), torch.randn(5), torch.randn(13, 5),
             torch.tensor(4), torch.randn(13), torch.rand(13), tol=FLOAT32)
