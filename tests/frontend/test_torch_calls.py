"""What a PyTorch user expects of the compiled callables, against eager PyTorch: results
in eager's memory layout, the module's own return structure, size errors that name the
user's dimensions, and weights changed after compiling taking effect."""
import re

import pytest

torch = pytest.importorskip("torch")

import treadle  # noqa: E402
from tests.harness import assert_close  # noqa: E402
from treadle.integrations import dynamo  # noqa: E402

CHANNELS_LAST = torch.channels_last


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def compiles(monkeypatch):
    """Counts the backend's compilations of a traced graph."""
    counted = []
    original = dynamo.split_and_compile
    monkeypatch.setattr(dynamo, "split_and_compile",
                        lambda *a, **k: counted.append(1) or original(*a, **k))
    return counted


def _same(actual, expected, reduction=1):
    """Values within float32's tolerance, and eager's dtype, shape and strides."""
    assert isinstance(actual, torch.Tensor) and actual.dtype == expected.dtype
    assert actual.shape == expected.shape and actual.stride() == expected.stride()
    assert_close(actual.numpy(), expected.numpy(), reduction=reduction)


class ConvNet(torch.nn.Module):
    """Convolutions keep channels_last in eager; the pooled head is row-major."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.mix = torch.nn.Conv2d(8, 4, 1)
        self.head = torch.nn.Linear(4, 5)

    def forward(self, x):
        y = self.mix(torch.relu(self.conv(x)))
        return y, self.head(y.mean((2, 3)))


@pytest.mark.parametrize("memory_format", [CHANNELS_LAST, torch.contiguous_format])
def test_backend_results_keep_eager_memory_format(memory_format, fresh_dynamo):
    model = ConvNet().eval()
    compiled = torch.compile(model, backend="treadle")
    # The third size runs the graph with symbolic sizes, whose strides are symbolic.
    for shape in [(2, 3, 5, 7), (1, 3, 13, 6), (3, 3, 2, 11)]:
        x = torch.randn(shape).to(memory_format=memory_format)
        with torch.no_grad():
            (y, logits), (y_eager, logits_eager) = compiled(x), model(x)
        _same(y, y_eager, reduction=27 * 8)
        _same(logits, logits_eager, reduction=27 * 8)
        assert y.is_contiguous(memory_format=memory_format)


@pytest.mark.parametrize("memory_format", [CHANNELS_LAST, torch.contiguous_format])
def test_compiled_module_results_keep_eager_memory_format(memory_format):
    model = ConvNet().eval()
    x = torch.randn(2, 3, 5, 7).to(memory_format=memory_format)
    compiled = treadle.compile(model, x)
    with torch.no_grad():
        (y, logits), (y_eager, logits_eager) = compiled(x), model(x)
    _same(y, y_eager, reduction=27 * 8)
    _same(logits, logits_eager, reduction=27 * 8)


class Views(torch.nn.Module):
    """Results that are views: of an input, and permuted or transposed convolutions."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        y = self.conv(x)
        return x[:, :1], y.permute(0, 2, 3, 1), torch.relu(y).transpose(2, 3)


def test_backend_views_keep_eager_strides(fresh_dynamo):
    model = Views().eval()
    compiled = torch.compile(model, backend="treadle")
    for shape in [(2, 3, 5, 7), (1, 3, 6, 4), (3, 3, 2, 9)]:
        x = torch.randn(shape).to(memory_format=CHANNELS_LAST)
        with torch.no_grad():
            for actual, expected in zip(compiled(x), model(x)):
                _same(actual, expected, reduction=27)


def test_backend_size_errors_name_the_input_dimension(fresh_dynamo):
    model = ConvNet().eval()
    x = torch.randn(2, 3, 5, 7)
    torch._dynamo.mark_dynamic(x, 2)
    compiled = torch.compile(model, backend="treadle", options={"dynamic": {"x.shape[2]": (64, 1)}})
    with pytest.raises(Exception, match=re.escape("dynamic['x.shape[2]'] = (64, 1)")) as caught, \
            torch.no_grad():
        compiled(x)
    assert not re.search(r"\bs\d+\b", str(caught.value))


def test_backend_symbols_named_by_dimension_compile_and_run(fresh_dynamo):
    model = ConvNet().eval()
    compiled = torch.compile(model, backend="treadle", options={"dynamic": {"x.shape[2]": (1, 32)}})
    for height in (5, 2, 13):
        x = torch.randn(2, 3, height, 7)
        torch._dynamo.mark_dynamic(x, 2)
        with torch.no_grad():
            for actual, expected in zip(compiled(x), model(x)):
                _same(actual, expected, reduction=27 * 8)


def _rewrites(model):
    """Ways a user changes a weight after compiling: in place under no_grad, by
    load_state_dict, by giving a parameter new memory, by setting a new parameter."""
    def scale():
        with torch.no_grad():
            model.conv.weight.mul_(-2.0)

    def load():
        state = {k: v * (torch.rand_like(v) + 0.5) if v.is_floating_point() else v
                 for k, v in model.state_dict().items()}  # variances stay positive
        model.load_state_dict(state)

    def rebind():
        model.head.bias.data = torch.randn(5)

    def replace():
        model.head.weight = torch.nn.Parameter(torch.randn(5, 4))

    return [scale, load, rebind, replace]


def test_backend_sees_weights_changed_after_compiling(fresh_dynamo, compiles):
    model = ConvNet().eval()
    compiled = torch.compile(model, backend="treadle")
    x = torch.randn(2, 3, 5, 7)
    for rewrite in [lambda: None, *_rewrites(model)]:
        rewrite()
        with torch.no_grad():
            for _ in range(2):
                for actual, expected in zip(compiled(x), model(x)):
                    _same(actual, expected, reduction=27 * 8)
    assert len(compiles) == 5  # once, then once per change, never on a call alone


class Nested(torch.nn.Module):
    """Returns a dict holding a tensor, and a tuple holding a list, and a None."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(7, 3)

    def forward(self, x):
        y = self.linear(x)
        return {"logits": y, "parts": (torch.relu(y), [y.sum(-1), x * 2.0]), "none": None}


def _leaves(value):
    """The tensors or arrays of a return value, and its structure."""
    leaves, spec = torch.utils._pytree.tree_flatten(value)
    return [leaf for leaf in leaves if leaf is not None], spec


@pytest.mark.parametrize("rows", [1, 5, 13])
def test_compile_returns_the_module_structure(rows):
    model = Nested().eval()
    compiled = treadle.compile(model, torch.randn(4, 7), dims={"x": {0: "rows"}})
    x = torch.randn(rows, 7)
    got, expected = compiled(x), model(x)
    (got_leaves, got_spec), (want_leaves, want_spec) = _leaves(got), _leaves(expected)
    assert got_spec == want_spec and got["none"] is None and len(got_leaves) == 4
    for actual, wanted in zip(got_leaves, want_leaves):
        _same(actual, wanted.detach(), reduction=7)
    arrays, _ = _leaves(compiled(x.numpy()))  # numpy in, numpy out, in the same places
    for actual, wanted in zip(arrays, want_leaves):
        assert_close(actual, wanted.detach().numpy(), reduction=7)


def test_compile_of_a_module_returning_one_tensor_returns_a_tensor():
    model = torch.nn.Sequential(torch.nn.Linear(5, 2), torch.nn.GELU()).eval()
    x = torch.randn(3, 5)
    _same(treadle.compile(model, x)(x), model(x).detach(), reduction=5)


class HalvesItsOutput(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(6, 4)

    def forward(self, x):
        return torch.relu(self.linear(x)).to(torch.bfloat16)


def test_compile_returns_bfloat16_tensors():
    """treadle returns bfloat16 as its raw bits, which become a bfloat16 tensor again."""
    model = HalvesItsOutput().eval()
    x = torch.randn(3, 6)
    got, expected = treadle.compile(model, x)(x), model(x).detach()
    assert got.dtype == torch.bfloat16 and got.shape == expected.shape
    torch.testing.assert_close(got, expected, atol=2e-2, rtol=2e-2)


def test_compiled_module_takes_bfloat16_tensors():
    """bfloat16 arguments reach the kernels as their raw bits."""
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU()).eval()
    model = model.to(torch.bfloat16)
    x = torch.randn(1, 3, 9, 11).to(torch.bfloat16)
    with torch.no_grad():
        got, expected = treadle.compile(model, x)(x), model(x)
    assert got.dtype == torch.bfloat16 and got.shape == expected.shape
    torch.testing.assert_close(got, expected, atol=3e-2, rtol=3e-2)


class Normed(ConvNet):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.BatchNorm2d(4)

    def forward(self, x):
        y, logits = super().forward(x)
        return self.norm(y), logits


def test_compile_sees_weights_changed_after_compiling():
    model = Normed().eval()
    x = torch.randn(2, 3, 5, 7)
    compiled = treadle.compile(model, x)
    executables = []
    for rewrite in [lambda: None, *_rewrites(model), lambda: model.norm.running_mean.add_(1.0)]:
        rewrite()
        for _ in range(2):
            with torch.no_grad():
                for actual, expected in zip(compiled(x), model(x)):
                    _same(actual, expected, reduction=27 * 8)
            executables.append(compiled.executable)
    # Compiled again once per change, never on a call alone.
    assert len({id(e) for e in executables}) == 6 and executables[0] is executables[1]
