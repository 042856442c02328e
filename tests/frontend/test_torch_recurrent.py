"""torch's recurrent layers (nn.LSTM, nn.GRU, nn.RNN) through torch.export and through
torch.compile against eager: stacked, bidirectional, batch first or not, given initial
states, dynamic sizes. Both paths hand treadle the whole layer (``aten.lstm.input``),
which becomes one recurrent node per layer."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import treadle
from tests.harness import assert_close
from treadle.frontend import aten


class Tagger(torch.nn.Module):
    """A recurrent stack and a dense head over its outputs; returns both and the final
    states."""

    def __init__(self, layer: type, batch_first: bool, **kwargs):
        super().__init__()
        self.rnn = layer(5, 7, num_layers=2, batch_first=batch_first, **kwargs)
        self.head = torch.nn.Linear(7 * (2 if kwargs.get("bidirectional") else 1), 3)

    def forward(self, x):
        y, state = self.rnn(x)
        return (self.head(y), y, *(state if isinstance(state, tuple) else (state,)))


class Seeded(torch.nn.Module):
    """An LSTM given its initial states."""

    def __init__(self):
        super().__init__()
        self.rnn = torch.nn.LSTM(5, 7, num_layers=2, bidirectional=True)

    def forward(self, x, h, c):
        y, (h, c) = self.rnn(x, (h, c))
        return y, h, c


LAYERS = {"lstm": (torch.nn.LSTM, dict(bidirectional=True)), "gru": (torch.nn.GRU, {}),
          "rnn_relu": (torch.nn.RNN, dict(nonlinearity="relu", bidirectional=True))}


def model(kind: str, batch_first: bool) -> Tagger:
    torch.manual_seed(0)
    layer, kwargs = LAYERS[kind]
    return Tagger(layer, batch_first, **kwargs).eval()


def sequence(batch_first: bool, seq: int = 13, batch: int = 3) -> torch.Tensor:
    torch.manual_seed(seq)
    return torch.randn(batch, seq, 5) if batch_first else torch.randn(seq, batch, 5)


def assert_eager(got, module, *inputs):
    with torch.no_grad():
        expected = module(*inputs)
    assert len(got) == len(expected)
    for actual, want in zip(got, expected):
        assert_close(np.asarray(actual), want.numpy())


@pytest.fixture
def counted(monkeypatch):
    """How many recurrent layers the ATen converter imported."""
    calls = []

    def convert(call, *args, **kwargs):
        calls.append(call.node.target)
        return aten._recurrent(call, *args, **kwargs)
    for target, converter in list(aten.TABLE.items()):
        if converter is aten._recurrent:
            monkeypatch.setitem(aten.TABLE, target, convert)
    return calls


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


# Each kind and both batch layouts by default, every pairing of them with -m slow.
@pytest.mark.parametrize("kind, batch_first", [
    pytest.param(kind, first, marks=() if first == (kind == "gru") else pytest.mark.slow)
    for kind in LAYERS for first in (True, False)])
def test_export_matches_eager(kind, batch_first, counted):
    module, x = model(kind, batch_first), sequence(batch_first)
    assert_eager(treadle.compile(module, x)(x), module, x)
    assert len(counted) == 1


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_the_backend_matches_eager(kind, batch_first, counted, fresh_dynamo):
    """dynamo traces into recurrent modules only with ``allow_rnn``; the layer then
    reaches treadle whole."""
    module, x = model(kind, batch_first), sequence(batch_first)
    with torch.no_grad(), torch._dynamo.config.patch(allow_rnn=True):
        got = torch.compile(module, backend="treadle")(x)
    assert_eager(got, module, x)
    assert len(counted) == 1


def test_the_backend_without_allow_rnn_matches_eager(fresh_dynamo):
    module, x = model("lstm", True), sequence(True)
    with torch.no_grad():
        assert_eager(torch.compile(module, backend="treadle")(x), module, x)


def test_dynamic_sizes_through_the_backend(fresh_dynamo):
    """torch traces its own decomposition of the layer for the output sizes, which fixes
    the sequence length (a new one compiles again); the batch stays symbolic."""
    module = model("gru", False)
    compiled = torch.compile(module, backend="treadle", dynamic=True)
    with torch.no_grad(), torch._dynamo.config.patch(allow_rnn=True):
        for seq, batch in ((13, 3), (6, 3), (6, 5)):
            x = sequence(False, seq, batch)
            assert_eager(compiled(x), module, x)


def test_given_initial_states():
    torch.manual_seed(1)
    module = Seeded().eval()
    x, h, c = torch.randn(11, 2, 5), torch.randn(4, 2, 7), torch.randn(4, 2, 7)
    assert_eager(treadle.compile(module, (x, h, c))(x, h, c), module, x, h, c)


@pytest.mark.parametrize("kind", [pytest.param("lstm", marks=pytest.mark.slow), "gru"])
def test_float64(kind):
    module = model(kind, False).double()
    x = sequence(False).double()
    assert_eager(treadle.compile(module, x)(x), module, x)
