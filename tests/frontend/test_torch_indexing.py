"""``treadle.compile`` on modules that index, scatter, sort and resample: index
assignment (``x[idx] = v``, ``x[mask] = v``, ``index_put_(..., accumulate=True)``),
diagonals, the scatter family, sorting and ops torch.export leaves for torch's own
decompositions (``einsum``, ``roll``), against eager PyTorch."""
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import treadle  # noqa: E402
from treadle.errors import UnsupportedOpError  # noqa: E402

F = torch.nn.functional
SIZES = [1, 7, 13]


@pytest.fixture(autouse=True)
def seeded():
    torch.manual_seed(0)


class Function(torch.nn.Module):
    def __init__(self, function):
        super().__init__()
        self.function = function

    def forward(self, *args):
        return self.function(*args)


def _matches(function, *args, rtol=1e-5, atol=1e-6, dims=None):
    """The compiled function's outputs equal eager's in shape, dtype and value."""
    model = Function(function).eval()
    compiled = treadle.compile(model, tuple(a.clone() for a in args), dims=dims)
    got = torch.utils._pytree.tree_leaves(compiled(*(a.clone() for a in args)))
    with torch.no_grad():
        expected = model(*(a.clone() for a in args))
    expected = torch.utils._pytree.tree_leaves(expected)  # sort's (values, indices) too
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        g = np.asarray(g)
        assert g.shape == tuple(e.shape) and g.dtype == e.numpy().dtype
        np.testing.assert_allclose(g, e.numpy(), rtol=rtol, atol=atol)


def _put(index, value):
    def write(x):
        y = x * 1
        y[index(x) if callable(index) else index] = value(x) if callable(value) else value
        return y
    return write


ASSIGNMENTS = {
    "rows": _put(lambda x: torch.tensor([0, -1, 0]) % x.shape[0], 1.5),
    "negative_rows": _put(lambda x: torch.tensor([-1]), lambda x: x[0] * 2),
    "columns": _put(lambda x: (slice(None), torch.tensor([0, 2])), lambda x: x[:, :1]),
    "rows_and_columns": _put(lambda x: (torch.tensor([[0], [-1]]), torch.tensor([1, 2, 0])),
                             lambda x: torch.arange(6.0).reshape(2, 3)),
    "mask": _put(lambda x: x > 0, 0.0),
    "mask_of_rows": _put(lambda x: x[:, 0] > 0, lambda x: x[-1]),
    "mask_of_columns": _put(lambda x: (slice(None), x[0] > 0), -1.0),
    "no_rows": _put(lambda x: torch.zeros(0, dtype=torch.long), 3.0),
}


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("name", sorted(ASSIGNMENTS))
def test_index_assignment(name, size):
    _matches(ASSIGNMENTS[name], torch.randn(size, 5))


SPACED = {  # on [a, b, c]: indexed dimensions adjacent and not first, or apart
    "inner_pair": _put(lambda x: (slice(None), torch.tensor([0, 2, 2]), torch.tensor([1, 0, 3])),
                       lambda x: x[:1, :3, 0] + 1.0),
    "outer_pair": _put(lambda x: (torch.tensor([0, -1]), slice(None), torch.tensor([3, 1])),
                       lambda x: torch.arange(2.0)[:, None]),
    "middle": _put(lambda x: (slice(None), torch.tensor([[1], [0]])), 7.0),
}


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("name", sorted(SPACED))
def test_index_assignment_between_slices(name, size):
    _matches(SPACED[name], torch.randn(size, 3, 4))


@pytest.mark.parametrize("size", SIZES)
def test_index_put_accumulates_repeated_positions(size):
    rows, columns = torch.tensor([0, 0, -1, 0]), torch.tensor([1, 1, 4, -2])
    _matches(lambda x, v: x.clone().index_put_((rows % x.shape[0], columns), v,
                                               accumulate=True),
             torch.randn(size, 5), torch.randn(4))
    _matches(lambda x: x.clone().index_put_((x > 0,), torch.tensor(2.0), accumulate=True),
             torch.randn(size, 5))


def test_integer_index_assignment():
    _matches(_put(lambda x: torch.tensor([2, 0]), lambda x: x[1] * 3), torch.randint(-9, 9, (7, 5)))


def test_mask_assignment_with_values_per_position_names_the_node():
    with pytest.raises(UnsupportedOpError, match="index_put.*different values"):
        treadle.compile(Function(_put(lambda x: x > 0, lambda x: x[:3] * 2)).eval(),
                        torch.tensor([1.0, -1.0, 2.0, -2.0, 3.0]))


DIAGONALS = [(0, 0, 1), (2, 0, 1), (-3, 0, 1), (1, 2, 0), (-1, -1, -2), (9, 0, 2)]


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("offset,dim1,dim2", DIAGONALS)
def test_diagonal(offset, dim1, dim2, size):
    _matches(lambda x: torch.diagonal(x, offset, dim1, dim2) * 1.0, torch.randn(size, 6, 4))


@pytest.mark.parametrize("offset", [0, 2, -3])
def test_write_through_a_diagonal(offset):
    def write(x):
        y = x * 1.0
        y.diagonal(offset).mul_(10.0)
        return y
    _matches(write, torch.randn(7, 5))


def test_diagonal_of_symbolic_size():
    side = torch.export.Dim("side", min=3)
    model = Function(lambda x: x.diagonal(-1) + 1.0).eval()
    compiled = treadle.compile(model, torch.randn(7, 7), dims={0: {0: side, 1: side}})
    for n in [3, 7, 13]:
        x = torch.randn(n, n)
        np.testing.assert_allclose(np.asarray(compiled(x)), model(x).numpy())


SCATTERS = {
    "scatter": lambda x, i, s: x.scatter(1, i, s),
    "scatter_value": lambda x, i, s: x.scatter(-1, i, 2.5),
    "scatter_add": lambda x, i, s: x.scatter_add(1, i, s),
    "scatter_reduce_add": lambda x, i, s: x.scatter(1, i, s, reduce="add"),
    "scatter_reduce_multiply": lambda x, i, s: x.scatter(1, i, s, reduce="multiply"),
    "scatter_larger_source": lambda x, i, s: x.scatter_add(1, i[:, :2], s),
}


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("name", sorted(SCATTERS))
def test_scatter(name, size):
    _matches(SCATTERS[name], torch.randn(size, 5), torch.randint(0, 5, (size, 3)),
             torch.randn(size, 3))


@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
def test_scatter_reduce(reduce, include_self):
    _matches(lambda x, i, s: x.scatter_reduce(0, i, s, reduce, include_self=include_self),
             torch.randn(7, 5), torch.randint(0, 7, (11, 5)), torch.randn(11, 5), rtol=1e-5)


@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("reduce", ["mean", "amax", "amin"])
def test_integer_scatter_reduce(reduce, include_self):
    _matches(lambda x, i, s: x.scatter_reduce(1, i, s, reduce, include_self=include_self),
             torch.randint(-9, 9, (5, 7)), torch.randint(0, 7, (5, 13)),
             torch.randint(-9, 9, (5, 13)))


@pytest.mark.parametrize("size", SIZES)
def test_index_add_and_copy(size):
    index = torch.tensor([0, 2, 0])
    _matches(lambda x, s: (x.index_add(1, index, s, alpha=2.0), x.index_copy(1, index[:2],
                                                                             s[:, :2])),
             torch.randn(size, 5), torch.randn(size, 3))


def test_index_add_and_copy_into_a_scalar():
    _matches(lambda x, s: (x.index_add(0, torch.tensor([0]), s[1], alpha=3.0),
                           x.index_copy(0, torch.tensor([0]), s[0])),
             torch.tensor(1.5), torch.randn(3))


@pytest.mark.parametrize("size", SIZES)
def test_masked_scatter(size):
    _matches(lambda x, s: (x.masked_scatter(x > 0, s), x.masked_scatter(x[:1] < 0, s)),
             torch.randn(size, 5), torch.randn(5 * size + 3))


@pytest.mark.parametrize("size", SIZES)
def test_take_along_dim_and_gather(size):
    _matches(lambda x, i, j, k: (torch.take_along_dim(x, i, 1), torch.take_along_dim(x, j),
                                 torch.gather(x[:, :, 0], -1, k)),
             torch.randn(size, 5, 1), torch.randint(-5, 5, (1, 3, 4)),
             torch.randint(0, 5 * size, (2, 3)), torch.randint(0, 5, (size, 4)))


TIES = torch.tensor([[3.0, 1.0, 3.0, float("nan"), -2.0, 1.0, 3.0, float("nan"), -np.inf],
                     [0.0] * 9, [5.0, 4.0, 3.0, 2.0, 1.0, 0.0, -1.0, -2.0, -3.0]])


@pytest.mark.parametrize("descending", [False, True])
def test_stable_sort_with_ties_and_nan(descending):
    _matches(lambda x: (torch.sort(x, dim=-1, descending=descending, stable=True),
                        torch.sort(x.t(), dim=0, descending=descending, stable=True),
                        torch.argsort(x, dim=1, descending=descending, stable=True)), TIES)


@pytest.mark.parametrize("size", [1, 7, 13])
def test_topk_and_sort(size):
    _matches(lambda x: (torch.topk(x, min(size, 3), 0), torch.topk(x, 2, -1, largest=False),
                        torch.sort(x, -1), torch.topk(x, 0, -1)),
             torch.randn(size, 11))
    _matches(lambda x: torch.sort(x, 0, descending=True).values, torch.randint(-3, 3, (size, 5)))


def test_a_sort_of_symbolic_length():
    """Long lines take TopK's merge sort, a symbolic length a sort whose k is symbolic."""
    length = torch.export.Dim("length", min=2)
    model = Function(lambda x: (torch.sort(x, dim=-1, stable=True), torch.topk(x, 2, -1))).eval()
    compiled = treadle.compile(model, torch.randn(3, 7), dims={0: {1: length}})
    for n in [2, 97, 301]:
        x = torch.randint(-20, 20, (3, n)).float()  # ties: a stable sort's order is defined
        got = [np.asarray(t) for t in torch.utils._pytree.tree_leaves(compiled(x))]
        want = [t.numpy() for t in torch.utils._pytree.tree_leaves(model(x))]
        for k in range(3):
            np.testing.assert_array_equal(got[k], want[k])
        # topk orders ties as it likes: its indices must point at its values.
        np.testing.assert_array_equal(np.take_along_axis(x.numpy(), got[3], -1), got[2])


@pytest.mark.parametrize("size", SIZES)
def test_cumprod_flip_and_roll(size):
    _matches(lambda x: (torch.cumprod(x, -1), torch.cumprod(x, 0), torch.flip(x, (0, -1)),
                        torch.roll(x, (2, -3), (0, 1)), torch.roll(x, 4)),
             torch.randn(size, 7), rtol=1e-5)
    _matches(lambda x: torch.cumprod(x, 0), torch.randint(-3, 4, (size, 3)))
    _matches(lambda x: torch.flip(x, (1,)), torch.randn(size, 0, 2))


def test_any_and_all():
    _matches(lambda x, b: (x.any(), x.all(-1), torch.all(x, 0, keepdim=True), b.any(1),
                           b.all()),
             torch.tensor([[0.0, 1.0, float("nan")], [0.0, 0.0, 0.0]]), torch.rand(7, 13) > 0.3)


@pytest.mark.parametrize("size", SIZES)
def test_einsum_and_diagonal_helpers(size):
    _matches(lambda x, y: (torch.einsum("bii->bi", x), torch.einsum("...ij,...jk->...ik", x, y),
                           torch.einsum("bij->", x), torch.trace(x[0]), torch.diag(x[0], 1),
                           torch.diag_embed(x[:, 0], -1)),
             torch.randn(3, size, size), torch.randn(size, 4), rtol=1e-4, atol=1e-5)


def test_attention_over_three_dimensions():
    _matches(lambda q, k, v, m: (F.scaled_dot_product_attention(q, k, v, attn_mask=m),
                                 F.scaled_dot_product_attention(q, k, v, is_causal=True)),
             torch.randn(3, 7, 5), torch.randn(3, 7, 5), torch.randn(3, 7, 5),
             torch.randn(7, 7), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
def test_grid_sample(mode, padding, align_corners):
    # Points up to 2.5 lengths past the edges, so that padding (and reflecting twice) shows.
    _matches(lambda x, g: F.grid_sample(x, g, mode=mode, padding_mode=padding,
                                        align_corners=align_corners),
             torch.randn(2, 3, 5, 7), torch.rand(2, 4, 11, 2) * 7.0 - 3.5, rtol=1e-4,
             atol=1e-5)


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
def test_grid_sample_of_a_volume(mode):
    _matches(lambda x, g: F.grid_sample(x, g, mode=mode, padding_mode="reflection",
                                        align_corners=False),
             torch.randn(2, 3, 5, 4, 7), torch.rand(2, 3, 4, 2, 3) * 3.0 - 1.5, rtol=1e-4,
             atol=1e-5)


@pytest.mark.parametrize("pool, shape", [
    (lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True), (2, 3, 13, 7)),
    (lambda x: F.max_pool2d(x, 2, ceil_mode=True, return_indices=True), (3, 7, 5)),
    (lambda x: F.max_pool1d(x, 3, 1, dilation=2, return_indices=True), (1, 4, 61)),
    (lambda x: F.max_pool3d(x, 2, return_indices=True), (1, 2, 5, 6, 7))])
def test_max_pool_indices(pool, shape):
    """Positions within each plane, as PyTorch counts them (ONNX counts over the tensor)."""
    _matches(pool, torch.randn(shape))


SELECTIONS = {
    "nonzero": lambda x: torch.nonzero(x > 0),
    "nonzero_of_a_vector": lambda x: torch.nonzero(x[0] < 0),
    "mask": lambda x: x[x > 0] * 2,
    "mask_of_rows": lambda x: x[x[:, 0] > 0] + 1,
    "mask_of_columns": lambda x: x[:, x[0] > 0],
    "masked_select_broadcast": lambda x: torch.masked_select(x, x[:1] < 0).sum(),
    "nothing_selected": lambda x: torch.nonzero(x > 100),
    "single_argument_where": lambda x: torch.where(x > 0),
}


@pytest.mark.parametrize("name", sorted(SELECTIONS))
@pytest.mark.parametrize("size", [2, 7, 13])  # torch.export fixes a symbolic size traced at 1
def test_selections_whose_size_comes_from_the_data(name, size):
    """Sizes found when the model runs: one compile serves every count, here a second
    call with other values and sizes included."""
    function = SELECTIONS[name]
    model = Function(function).eval()
    x = torch.randn(size, 5)
    compiled = treadle.compile(model, (x,), dims={0: {0: "n"}})
    for n in (size, size + 2):
        x = torch.randn(n, 5)
        got = torch.utils._pytree.tree_leaves(compiled(x))
        expected = torch.utils._pytree.tree_leaves(function(x))
        for g, e in zip(got, expected, strict=True):
            np.testing.assert_allclose(np.asarray(g), e.numpy(), rtol=1e-5, atol=1e-6)
            assert np.asarray(g).shape == tuple(e.shape)


@pytest.mark.parametrize("name", ["nonzero", "mask", "masked_select_broadcast",
                                  "single_argument_where"])
def test_selections_through_the_backend_run_in_treadle(name):
    """With dynamo capturing sizes found in the data, treadle runs the whole graph and
    returns those sizes to dynamo itself (no part falls back to eager)."""
    torch._dynamo.reset()
    function = SELECTIONS[name]
    compiled = torch.compile(function, backend="treadle", fullgraph=True)
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True), \
            warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in (6, 11):
            x = torch.randn(n, 5)
            got = torch.utils._pytree.tree_leaves(compiled(x))
            expected = torch.utils._pytree.tree_leaves(function(x))
            for g, e in zip(got, expected, strict=True):
                torch.testing.assert_close(g, e)
    assert not [w for w in caught if "treadle runs" in str(w.message)]
    torch._dynamo.reset()
