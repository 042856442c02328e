"""``torch.compile(backend="treadle")`` on functions that return views, and on pieces
that read numbers the host graph computes, against eager PyTorch."""
import warnings

import pytest

torch = pytest.importorskip("torch")

EXACT = dict(rtol=0, atol=0)  # views, slices and products by small integers are exact
CLOSE = dict(rtol=1e-5, atol=1e-6)  # float32 arithmetic, in either order

# Rows by columns, with odd, prime and empty sizes; a column count of 0 or 1 is
# specialised by dynamo, so those recompile.
SHAPES = [(3, 5), (4, 7), (1, 13), (11, 2), (0, 3), (5, 1), (2, 0)]


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _transposed_head(x):
    return x.t()[:x.shape[1] - 1]


def _column_head(x):
    return x[:, :x.shape[1] - 1]


def _head_of_intermediate(x):
    return (x * 2 + 1).t()[:x.shape[1] - 1]


def _base_and_its_head(x):
    """A view of an intermediate that the graph also returns."""
    y = x * 2 + 1
    return y, y.t()[:x.shape[1] - 1]


def _view_also_computed_on(x):
    """A view of an intermediate that the graph both returns and reads."""
    v = x.exp()[:, 1:x.shape[1]]
    return v, v * 3 + 1


def _narrowed(x):
    return x.narrow(1, 0, x.shape[1] // 2), (x - 1).unsqueeze(0).transpose(1, 2)


VIEWS = [_transposed_head, _column_head, _head_of_intermediate, _base_and_its_head,
         _view_also_computed_on, _narrowed]
CASES = [pytest.param(f, dynamic, id=f"{f.__name__.strip('_')}-{dynamic}")
         for f in VIEWS for dynamic in (True, False)]


def _as_tuple(value):
    return value if isinstance(value, tuple) else (value,)


@pytest.mark.parametrize("f, dynamic", CASES)
def test_returned_views_match_eager(f, dynamic):
    """AOTAutograd rebuilds a returned view of an input from the returned tensor's
    strides and offset where the view's arguments are symbolic, so those must be eager's:
    the numbers are eager's, and so are the strides of views of an input, which share
    its memory. (Under no_grad it takes a view of an intermediate for a tensor of its
    own, which treadle computes, laid out in eager's order.)"""
    compiled = torch.compile(f, backend="treadle", dynamic=dynamic)
    for shape in SHAPES:
        x = torch.randn(shape)
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            actual, expected = _as_tuple(compiled(x)), _as_tuple(f(x))
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            torch.testing.assert_close(a, e, **CLOSE)
            if e._base is x and e.numel():
                assert a.stride() == e.stride() and a.storage_offset() == e.storage_offset()
                assert a.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()


def _head_and_product(x):
    return x.t()[:x.shape[1] - 1], x * 2


def test_a_returned_view_adds_no_eager_warning():
    """Returned views run in eager by design, not for want of a converter."""
    compiled = torch.compile(_head_and_product, backend="treadle", dynamic=True)
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        compiled(torch.randn(4, 7))
    assert not [w for w in caught if "eager" in str(w.message)]


def _tail_and_window(x, n):
    k = n.item()
    return x[k:] * 3, x[-k:-1] * 1


@pytest.mark.parametrize("rows", [11, 2])
def test_sizes_computed_in_eager_reach_the_piece(rows):
    """``n.item()`` runs in eager (a negation of it reads it, which no converter takes):
    the pieces after it take its value, and its negation, as scalar inputs."""
    compiled = torch.compile(_tail_and_window, backend="treadle")
    x = torch.randn(rows, 3)
    with torch._dynamo.config.patch(capture_scalar_outputs=True), \
            warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        for n in sorted({0, 1, rows // 2, rows - 1, rows}):
            for a, e in zip(compiled(x, torch.tensor(n)), _tail_and_window(x, torch.tensor(n))):
                torch.testing.assert_close(a, e, **EXACT)
    assert not [w for w in caught if "part of the graph" in str(w.message)]


def _scaled_and_summed(x, n):
    k = n.item()
    return torch.relu(x) * k + x[:k].sum()


@pytest.mark.parametrize("n", [0, 2, 5, -3])
def test_an_integer_computed_in_eager_is_a_number_and_a_bound(n):
    """``n.item()`` that a product reads as a number, not only a slice as a bound."""
    compiled = torch.compile(_scaled_and_summed, backend="treadle")
    x = torch.randn(5, 7)
    with torch._dynamo.config.patch(capture_scalar_outputs=True), \
            warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        torch.testing.assert_close(compiled(x, torch.tensor(n)),
                                   _scaled_and_summed(x, torch.tensor(n)), **CLOSE)
    assert not [w for w in caught if "part of the graph" in str(w.message)]
