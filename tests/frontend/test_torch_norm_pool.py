"""``torch.compile(backend="treadle")`` against eager PyTorch, with nothing left to eager,
on normalisation in training mode (batch statistics, the running statistics' update,
save_mean and save_invstd), adaptive pooling to sizes that do not divide the input (max
pooling's indices too), average pooling by a divisor in ceil mode, the Bessel function
i0 and matrix inverses, at odd, prime and empty sizes."""
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

F = torch.nn.functional


@pytest.fixture(autouse=True)
def seeded():
    torch.manual_seed(0)


def _in_treadle(function, *args):
    """The function compiled by the backend, run on ``args``: none of it in eager."""
    torch._dynamo.reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = torch.compile(function, backend="treadle", dynamic=False)(*args)
    fallbacks = [str(w.message) for w in caught if "eager" in str(w.message)]
    assert not fallbacks, fallbacks
    return got


def _backend_matches(function, *args, rtol=1e-5, atol=1e-5):
    """The compiled function gives eager's results, and leaves its argument tensors as
    eager does (batch norm's running statistics)."""
    compiled_args, eager_args = [a.clone() for a in args], [a.clone() for a in args]
    got = _in_treadle(function, *compiled_args)
    with torch.no_grad():
        expected = function(*eager_args)
    got = torch.utils._pytree.tree_leaves((got, compiled_args))
    expected = torch.utils._pytree.tree_leaves((expected, eager_args))
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.dtype == e.dtype and g.shape == e.shape
        np.testing.assert_allclose(g.double().numpy(), e.double().numpy(), rtol=rtol,
                                   atol=atol)


# ---- normalisation in training mode --------------------------------------------------

NORM_SHAPES = [(3, 5), (2, 7, 13), (1, 3, 4, 5), (2, 3, 2, 3, 5), (5, 1, 1)]


def _stats(channels):
    return torch.randn(channels), torch.rand(channels) + 0.5


@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("shape", NORM_SHAPES)
def test_batch_norm_training_updates_running_statistics(shape, affine):
    mean, var = _stats(shape[1])
    weight, bias = (torch.randn(shape[1]) for _ in range(2))

    def function(x, mean, var, weight, bias):
        return F.batch_norm(x, mean, var, weight if affine else None,
                            bias if affine else None, training=True, momentum=0.3, eps=1e-3)
    _backend_matches(function, torch.randn(shape) * 2 + 1, mean, var, weight, bias)


@pytest.mark.parametrize("shape", [(3, 5), (2, 7, 13), (0, 3, 4)])
def test_batch_norm_training_without_running_statistics(shape):
    _backend_matches(lambda x: F.batch_norm(x, None, None, training=True), torch.randn(shape))


@pytest.mark.parametrize("shape", [(3, 5), (2, 3, 7, 2)])
def test_native_batch_norm_gives_save_mean_and_invstd(shape):
    mean, var = _stats(shape[1])

    def function(x, mean, var, weight):
        return torch.native_batch_norm(x, weight, None, mean, var, True, 0.1, 1e-5)
    _backend_matches(function, torch.randn(shape), mean, var, torch.randn(shape[1]))


@pytest.mark.parametrize("shape", [(2, 3, 7), (1, 5, 3, 4), (3, 2, 2, 3, 5)])
def test_instance_norm_updates_running_statistics(shape):
    mean, var = _stats(shape[1])

    def function(x, mean, var):
        return F.instance_norm(x, mean, var, use_input_stats=True, momentum=0.2)
    _backend_matches(function, torch.randn(shape) * 3, mean, var)


# ---- adaptive pooling ----------------------------------------------------------------

ADAPTIVE_AVERAGE = [((2, 3, 7, 5, 11), (3, 2, 4)), ((5, 13, 1, 7), (4, 1, 3)),
                    ((1, 2, 6, 4, 8), (3, 2, 4)), ((0, 2, 5, 3, 7), (2, 2, 3))]


@pytest.mark.parametrize("shape, out", ADAPTIVE_AVERAGE)
def test_adaptive_average_pooling_3d(shape, out):
    _backend_matches(lambda x: F.adaptive_avg_pool3d(x, out), torch.randn(shape))


ADAPTIVE_MAX = [(F.adaptive_max_pool1d, (2, 3, 13), 5),
                (F.adaptive_max_pool1d, (3, 11), 4),
                (F.adaptive_max_pool2d, (2, 3, 7, 11), (3, 4)),
                (F.adaptive_max_pool2d, (3, 7, 11), (5, 2)),
                (F.adaptive_max_pool2d, (2, 3, 4, 4), (2, 2)),
                (F.adaptive_max_pool2d, (2, 3, 5, 7), (1, 1)),
                (F.adaptive_max_pool2d, (0, 3, 7, 5), (3, 2)),
                (F.adaptive_max_pool3d, (2, 2, 5, 7, 6), (2, 3, 4)),
                (F.adaptive_max_pool3d, (3, 4, 13, 2), (3, 5, 1))]


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("pool, shape, out", ADAPTIVE_MAX)
def test_adaptive_max_pooling_and_indices(pool, shape, out, ties):
    """Indices are positions in each channel's plane; among equal maxima, the first."""
    x = torch.randint(0, 3, shape).float() if ties else torch.randn(shape)
    _backend_matches(lambda x: pool(x, out, return_indices=True), x, rtol=0, atol=0)
    _backend_matches(lambda x: pool(x, out), x, rtol=0, atol=0)


# ---- average pooling by a divisor ----------------------------------------------------

DIVIDED = [(F.avg_pool2d, (2, 3, 7, 8), 3, 2, 1, True, 5),
           (F.avg_pool2d, (3, 11, 13), 4, 3, 0, True, 3),
           (F.avg_pool2d, (1, 2, 5, 5), (2, 3), (2, 2), (1, 1), False, 2),
           (F.avg_pool3d, (1, 2, 5, 6, 7), (2, 3, 2), (2, 2, 3), (1, 0, 1), True, 7),
           (F.avg_pool3d, (0, 2, 4, 5, 3), 2, 2, 0, True, 3)]


@pytest.mark.parametrize("count_include_pad", [True, False])
@pytest.mark.parametrize("pool, shape, kernel, stride, padding, ceil_mode, divisor", DIVIDED)
def test_average_pooling_by_a_divisor(pool, shape, kernel, stride, padding, ceil_mode,
                                      divisor, count_include_pad):
    """The windows' sums over the divisor, a last window past the padding's edge too."""
    def function(x):
        return pool(x, kernel, stride, padding, ceil_mode=ceil_mode,
                    count_include_pad=count_include_pad, divisor_override=divisor)
    _backend_matches(function, torch.randn(shape))


# ---- i0 ------------------------------------------------------------------------------

def test_i0_over_the_float32_range():
    """Within 2e-6 relative from 0 to where e^x overflows, and inf or NaN where eager's
    float32 gives them."""
    x = torch.cat([torch.linspace(-95, 95, 2039),
                   torch.tensor([0.0, -0.0, 3.75, 1e-30, float("inf"), float("nan")])])
    _backend_matches(torch.i0, x, rtol=2e-6, atol=0)
    _backend_matches(torch.special.i0, x[:2037].reshape(3, -1), rtol=2e-6, atol=0)


@pytest.mark.parametrize("dtype", [torch.int64, torch.float16, torch.bfloat16])
def test_i0_of_other_types(dtype):
    _backend_matches(torch.i0, torch.arange(-13, 14).to(dtype), rtol=1e-2, atol=0)


def test_kaiser_window():
    _backend_matches(lambda x: x * torch.signal.windows.kaiser(13, beta=8.0), torch.ones(13),
                     rtol=2e-6, atol=1e-7)


# ---- matrix inverse ------------------------------------------------------------------

def _well_conditioned(shape):
    """Random matrices with a strong diagonal, whose inverses float32 holds to 1e-5."""
    n = shape[-1]
    return torch.randn(shape) + n * torch.eye(n)


@pytest.mark.parametrize("shape", [(5, 5), (2, 3, 7, 7), (1, 1), (0, 4, 4), (3, 0, 0),
                                   (13, 13)])
def test_inverse(shape):
    _backend_matches(torch.linalg.inv, _well_conditioned(shape), rtol=1e-4, atol=1e-6)


def test_inverse_ex_reports_singular_matrices():
    a = torch.stack([_well_conditioned((3, 3)), torch.tensor(
        [[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [0.0, 0.0, 1.0]]), torch.zeros(3, 3)])
    inverse, info = _in_treadle(torch.linalg.inv_ex, a)
    expected, expected_info = torch.linalg.inv_ex(a)
    assert info.dtype == torch.int32 and info.tolist() == expected_info.tolist() == [0, 2, 1]
    np.testing.assert_allclose(inverse[0].numpy(), expected[0].numpy(), rtol=1e-4, atol=1e-6)
    assert not torch.isfinite(inverse[1:]).all()


@pytest.mark.parametrize("power", [-1, -2, -3])
def test_negative_matrix_power(power):
    _backend_matches(lambda a: torch.linalg.matrix_power(a, power),
                     _well_conditioned((2, 5, 5)), rtol=1e-4, atol=1e-6)
