"""The PyTorch frontend: ``torch.compile(backend="treadle")`` and ``treadle.compile`` on
modules, against eager PyTorch."""
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import treadle  # noqa: E402
from treadle.config import override  # noqa: E402
from treadle.errors import ModelError, UnsupportedOpError  # noqa: E402
from treadle.integrations import dynamo  # noqa: E402
from treadle.models import MODELS, build, export_onnx  # noqa: E402

TOLERANCE = 1e-4  # relative to the output's largest magnitude


def _close(actual, expected, tolerance=TOLERANCE):
    actual = actual if isinstance(actual, (tuple, list)) else (actual,)
    expected = expected if isinstance(expected, (tuple, list)) else (expected,)
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        a = a.numpy() if isinstance(a, torch.Tensor) else a
        e = e.numpy()
        assert a.shape == e.shape and a.dtype == e.dtype
        scale = max(float(np.abs(e).max(initial=0)), 1e-6)
        assert float(np.abs(a - e).max(initial=0)) <= tolerance * scale


def _zoo_inputs(name, tmp_path):
    spec = export_onnx(name, tmp_path / f"{name}.onnx", reduced=True)
    return tuple(torch.from_numpy(a) for a in spec.random_inputs().values())


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


# The default run takes one model per kind of layer the importer converts (residual CNN,
# grouped convolutions with squeeze-and-excitation, mixed depthwise splits, instance
# normalisation, attention, a vision-transformer block); ``-m slow`` the rest of the zoo.
BACKEND_DEFAULT = {"resnet50", "regnet_y_800mf", "mixnet_s", "candy", "gpt2",
                   "efficientvit_block"}


@pytest.mark.parametrize("name", [n if n in BACKEND_DEFAULT else
                                  pytest.param(n, marks=pytest.mark.slow)
                                  for n in sorted(MODELS)])
def test_zoo_through_the_backend_matches_eager(name, tmp_path, fresh_dynamo):
    model = build(name, reduced=True)
    inputs = _zoo_inputs(name, tmp_path)
    compiled = torch.compile(model, backend="treadle")
    with torch.no_grad():
        _close(compiled(*inputs), model(*inputs))


@pytest.mark.parametrize("name", ["resnet50", "gpt2", "candy"])
def test_zoo_through_compile_matches_eager_and_saves(name, tmp_path):
    model = build(name, reduced=True)
    inputs = _zoo_inputs(name, tmp_path)
    compiled = treadle.compile(model, inputs)
    with torch.no_grad():
        expected = model(*inputs)
    _close(compiled(*inputs), expected)
    compiled.save(tmp_path / "saved")
    _close(treadle.load(tmp_path / "saved")(*inputs), expected)


class Block(torch.nn.Module):
    """Convolution, normalisations, pooling, attention-like products and indexing."""

    def __init__(self, channels=5, classes=7):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, channels, 3, padding=1, groups=1)
        self.norm = torch.nn.GroupNorm(1, channels)
        self.linear = torch.nn.Linear(channels, classes)

    def forward(self, x):
        y = torch.nn.functional.silu(self.norm(self.conv(x)))
        y = torch.nn.functional.max_pool2d(y, 2, ceil_mode=True)
        tokens = y.flatten(2).transpose(1, 2)  # [n, hw, c]
        weights = torch.softmax(tokens @ tokens.transpose(1, 2) / 3.0, dim=-1)
        mixed = (weights @ tokens).mean(dim=1)
        return self.linear(mixed).clamp(min=-0.5), tokens[:, 1:, :].sum(-1)


@pytest.mark.parametrize("size", [3, 7, 13])
def test_odd_sizes_through_the_backend(size, fresh_dynamo):
    model = Block().eval()
    x = torch.randn(2, 3, size, size + 2)
    with torch.no_grad():
        _close(torch.compile(model, backend="treadle")(x), model(x))


def test_module_with_symbolic_batch_runs_any_batch(tmp_path):
    model = Block().eval()
    compiled = treadle.compile(model, torch.randn(2, 3, 11, 9), dims={"x": {0: "batch"}})
    assert compiled.executable.input_names == ["x"]
    for batch in (1, 3, 5):
        x = torch.randn(batch, 3, 11, 9)
        with torch.no_grad():
            _close(compiled(x), model(x))


def test_a_module_takes_size_ranges_by_symbol_as_any_model_does(tmp_path):
    """dims= names the module's dimensions, dynamic= gives their ranges (tuned over, as
    for an ONNX model); naming dimensions through dynamic= is refused with the way."""
    model = torch.nn.Linear(24, 40).eval()
    with override(cache_dir=tmp_path):
        compiled = treadle.compile(model, torch.randn(5, 24), dims={"input": {0: "rows"}},
                                   dynamic={"rows": (1, 16)})
    for rows in (1, 7, 16, 23):
        x = torch.randn(rows, 24)
        with torch.no_grad():
            _close(compiled(x), model(x))
    with pytest.raises(ValueError, match=r"dynamic\['x'\] names dimensions.*dims="):
        treadle.compile(model, torch.randn(5, 24), dynamic={"x": {0: "rows"}})
    with pytest.raises(ValueError, match="'cols', which no input"):
        treadle.compile(model, torch.randn(5, 24), dims={"input": {0: "rows"}},
                        dynamic={"cols": (1, 4)})


class RepeatBySize(torch.nn.Module):
    def forward(self, x):
        # DeBERTa-v2 repeats its relative positions as many times as the sequence is long.
        return x.unsqueeze(0).repeat(x.shape[1], 1, 1) * 2.0


def test_a_repeat_count_that_is_a_symbolic_size():
    model = RepeatBySize().eval()
    seq = torch.export.Dim("seq", min=2, max=64)
    compiled = treadle.compile(model, torch.randn(3, 5), dims={"x": {1: seq}})
    for length in (2, 7, 13):
        x = torch.randn(3, length)
        _close(compiled(x), model(x))


class Decoder(torch.nn.Module):
    """Transposed convolutions as a U-Net's or a GAN's decoder has them: a stride-2
    upsampling, a grouped one with output padding, a stride-1 one to three channels."""

    def __init__(self):
        super().__init__()
        self.up = torch.nn.ConvTranspose2d(6, 8, 4, stride=2, padding=1)
        self.grouped = torch.nn.ConvTranspose2d(8, 4, 3, stride=2, padding=1,
                                                output_padding=1, groups=2, bias=False)
        self.out = torch.nn.ConvTranspose2d(4, 3, 3, padding=1, dilation=1)
        self.line = torch.nn.ConvTranspose1d(3, 2, 5, stride=3)

    def forward(self, x):
        y = torch.tanh(self.out(torch.relu(self.grouped(torch.relu(self.up(x))))))
        return y, self.line(y.flatten(2))


@pytest.mark.parametrize("size", [(1, 1), (5, 7), (13, 6)])
def test_transposed_convolutions_match_eager(size, fresh_dynamo):
    model = Decoder().eval()
    x = torch.randn(2, 6, *size)
    with torch.no_grad():
        _close(torch.compile(model, backend="treadle")(x), model(x))
        _close(treadle.compile(model, x)(x), model(x))


class Sdpa(torch.nn.Module):
    """scaled_dot_product_attention as transformers' "sdpa" layers call it."""

    def __init__(self, **options):
        super().__init__()
        self.options = options

    def forward(self, q, k, v, mask=None):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                                                **self.options)


@pytest.mark.parametrize("options,mask", [
    ({}, None), ({"is_causal": True}, None), ({"scale": 0.3}, "float"), ({}, "bool"),
    ({"enable_gqa": True}, None)])
def test_scaled_dot_product_attention_runs_as_two_products(options, mask, tmp_path):
    """The attention node becomes MatMul / Softmax / MatMul (the element-wise kernel of
    the node itself ran BERT's attention 20x slower)."""
    heads_kv = 1 if options.get("enable_gqa") else 3
    args = (torch.randn(2, 3, 7, 5), torch.randn(2, heads_kv, 11, 5),
            torch.randn(2, heads_kv, 11, 5))
    if mask == "float":
        args += (torch.randn(2, 1, 7, 11),)
    elif mask == "bool":
        args += (torch.rand(2, 1, 7, 11) < 0.7,)
    model = Sdpa(**options).eval()
    with override(dump_dir=tmp_path):
        compiled = treadle.compile(model, args)
    with torch.no_grad():
        _close(compiled(*args), model(*args))
    optimized = next(tmp_path.rglob("01_canonicalize.txt")).read_text()
    assert "Attention[" not in optimized and optimized.count("MatMul[") == 2


class WithLogCumSumExp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(6, 6)

    def forward(self, x):
        return torch.relu(torch.logcumsumexp(self.linear(x), dim=1)) * 2.0 + 1.0


def test_unsupported_op_splits_the_graph_with_one_warning(fresh_dynamo):
    model = WithLogCumSumExp().eval()
    x = torch.randn(3, 6)
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        result = torch.compile(model, backend="treadle")(x)
        expected = model(x)
    _close(result, expected)
    messages = [str(w.message) for w in caught if "treadle runs" in str(w.message)]
    assert len(messages) == 1 and "aten.logcumsumexp" in messages[0]


class Decomposable(torch.nn.Module):
    def forward(self, x):
        # Ops without converters that torch decomposes into ops with converters.
        return (torch.roll(x, 2, 1) + torch.diag_embed(x[:, 0]).sum(-1)[:, None, :]
                + torch.trace(x[0, :3, :3]))


def test_the_backend_decomposes_ops_it_has_no_converter_for(fresh_dynamo):
    model = Decomposable().eval()
    x = torch.randn(3, 7, 5)
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        result = torch.compile(model, backend="treadle")(x)
        expected = model(x)
    _close(result, expected)
    assert not [w for w in caught if "treadle runs" in str(w.message)]


def test_unsupported_op_through_compile_names_the_node():
    with pytest.raises(UnsupportedOpError, match="logcumsumexp"):
        treadle.compile(WithLogCumSumExp().eval(), torch.randn(3, 6))


def test_training_mode_module_is_refused():
    with pytest.raises(ModelError, match="eval"):
        treadle.compile(WithLogCumSumExp(), torch.randn(3, 6))


def test_new_sizes_recompile_at_most_once(monkeypatch, fresh_dynamo):
    compiles = []
    original = dynamo.split_and_compile
    monkeypatch.setattr(dynamo, "split_and_compile",
                        lambda *a, **k: compiles.append(1) or original(*a, **k))
    model = Block().eval()
    compiled = torch.compile(model, backend="treadle")
    with torch.no_grad():
        for batch in (2, 3, 5, 7, 11):
            x = torch.randn(batch, 3, 9, 9)
            _close(compiled(x), model(x))
    assert len(compiles) <= 2  # the first size, then one symbolic graph for all others


def test_graph_needing_gradients_runs_in_eager(fresh_dynamo):
    model = WithLogCumSumExp().eval()
    x = torch.randn(3, 6)
    with pytest.warns(UserWarning, match="inference only"):
        result = torch.compile(model, backend="treadle")(x)
    assert result.requires_grad
    result.sum().backward()
    assert model.linear.weight.grad is not None


def test_backend_options(fresh_dynamo):
    model = Block().eval()
    x = torch.randn(1, 3, 8, 8)
    compiled = torch.compile(model, backend="treadle", options={"tune": 0,
                                                                 "orchestrate": False})
    with torch.no_grad():
        _close(compiled(x), model(x))
    torch._dynamo.reset()
    bad = torch.compile(model, backend="treadle", options={"speed": "max"})
    with pytest.raises(Exception, match="unknown treadle backend options"), torch.no_grad():
        bad(x)
    torch._dynamo.reset()
    one_range = torch.compile(model, backend="treadle", options={"dynamic": (1, 8)})
    with pytest.raises(Exception, match=r"size ranges by symbol.*x.shape\[1\]"), \
            torch.no_grad():
        one_range(x)


def test_integer_and_boolean_tensors(fresh_dynamo):
    def f(ids, mask, table):
        picked = table[ids]  # embedding-style gather with an int64 index
        return torch.where(mask.unsqueeze(-1), picked, -picked).sum(1), ids // 3, ids % 5

    ids = torch.tensor([[3, 0, 12], [7, 7, 1]])
    mask = torch.tensor([[True, False, True], [False, False, True]])
    table = torch.randn(13, 4)
    with torch.no_grad():
        expected = f(ids, mask, table)
        result = torch.compile(f, backend="treadle")(ids, mask, table)
    for r, e in zip(result, expected):
        assert r.dtype == e.dtype
        np.testing.assert_allclose(r.numpy(), e.numpy(), rtol=1e-6, atol=1e-6)


class Remainders(torch.nn.Module):
    def forward(self, x, y):
        return torch.remainder(x, y), torch.fmod(x, y), torch.remainder(x, 7.0), torch.sign(x)


def test_remainders_and_sign_follow_eager():
    """Exact remainders however large the quotient, infinite divisors, and PyTorch's sign
    of NaN (0, where ONNX Sign gives NaN)."""
    x = torch.tensor([5.536e7, 8.858e8, 1.417e10, -1.417e10, 3.4e38, 5.0, -5.0, 0.0, 7.5,
                      float("inf"), float("nan"), -2.5, 1e-40])
    y = torch.tensor([7.0, -7.0, 7.0, 7.0, 100.0, float("inf"), float("inf"), float("-inf"),
                      -2.0, 3.0, 3.0, float("nan"), 0.0])
    got = treadle.compile(Remainders().eval(), (x, y))(x, y)
    for actual, expected in zip(got, Remainders()(x, y)):
        np.testing.assert_array_equal(np.asarray(actual), expected.numpy())


class Clamps(torch.nn.Module):
    def forward(self, x):
        return (torch.clamp(x, min=0.0), torch.clamp(x, max=1.0), torch.clamp(x, -1.0, 1.0),
                torch.nn.functional.relu6(x))


def test_clamps_with_one_bound_keep_infinities():
    """PyTorch's clamp without a bound leaves that side alone, where ONNX's Clip clips an
    infinity to the largest float; NaN stays NaN."""
    x = torch.tensor([float("nan"), float("inf"), float("-inf"), 2.0, -3.0, 0.5, 7.0])
    got = treadle.compile(Clamps().eval(), (x,))(x)
    for actual, expected in zip(got, Clamps()(x)):
        np.testing.assert_array_equal(np.asarray(actual), expected.numpy())


def test_weights_are_constants_not_inputs(monkeypatch, fresh_dynamo):
    pieces = []
    original = dynamo._compile_piece
    monkeypatch.setattr(dynamo, "_compile_piece",
                        lambda *a, **k: pieces.append(original(*a, **k)) or pieces[-1])
    model = Block().eval()
    x = torch.randn(1, 3, 7, 7)
    with torch.no_grad():
        torch.compile(model, backend="treadle")(x)
    (piece,) = pieces
    assert isinstance(piece, dynamo._Piece)
    assert len(piece.positions) == 1  # x alone: the weights are baked in


def test_bfloat16_through_the_backend(fresh_dynamo):
    def f(x, y):
        return torch.relu(x * y + 1.0)

    x, y = (torch.randn(5, 7).to(torch.bfloat16) for _ in range(2))
    with torch.no_grad():
        result = torch.compile(f, backend="treadle")(x, y)
    assert result.dtype == torch.bfloat16
    torch.testing.assert_close(result, f(x, y), atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("shape", [(5, 6), (3, 6, 7)])
def test_group_norm_of_rows_and_of_sequences(shape):
    """PyTorch normalises [N, C] inputs by groups too, which ONNX's operator takes from
    rank 3 only."""
    model = torch.nn.GroupNorm(3, 6).eval()
    torch.nn.init.uniform_(model.weight)
    x = torch.randn(*shape)
    with torch.no_grad():
        got, expected = treadle.compile(model, x)(x), model(x)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
