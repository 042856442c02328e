"""The Mamba language model's parts against their definitions: the selective scan against
the recurrence stepped in numpy, and the whole model's causality."""
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the zoo models are built with torch "
                            "(pip install 'treadle[test]')")

from treadle.models import build  # noqa: E402
from treadle.models.ssm import selective_scan  # noqa: E402


def scan_reference(x, dt, a, b, c):
    """h_t = exp(dt_t a) h_{t-1} + dt_t b_t x_t from h = 0, y_t = c_t . h_t, per batch
    and channel, in float64."""
    batch, length, channels = x.shape
    y = np.zeros((batch, length, channels))
    for n in range(batch):
        h = np.zeros(a.shape)
        for t in range(length):
            h = np.exp(dt[n, t][:, None] * a) * h + (dt[n, t] * x[n, t])[:, None] * b[n, t]
            y[n, t] = h @ c[n, t]
    return y


@pytest.mark.parametrize("length", [1, 2, 7])
def test_selective_scan_matches_the_recurrence(length):
    gen = np.random.default_rng(length)
    batch, channels, state = 2, 5, 3
    x, b, c = (gen.standard_normal(s) for s in ((batch, length, channels),
                                                 (batch, length, state),
                                                 (batch, length, state)))
    dt = gen.uniform(0.1, 1.0, (batch, length, channels))
    a = -gen.uniform(0.5, 4.0, (channels, state))
    got = selective_scan(*(torch.from_numpy(v) for v in (x, dt, a, b, c))).numpy()
    np.testing.assert_allclose(got, scan_reference(x, dt, a, b, c), rtol=1e-10, atol=1e-12)


def test_a_token_changes_no_earlier_logits():
    model = build("mamba_small", reduced=True)
    ids = torch.arange(11).reshape(1, 11)
    changed = ids.clone()
    changed[0, 6] = 50
    with torch.no_grad():
        before, after = model(ids), model(changed)
    assert torch.allclose(before[:, :6], after[:, :6], rtol=0, atol=1e-6)
    assert not torch.allclose(before[:, 6:], after[:, 6:])
