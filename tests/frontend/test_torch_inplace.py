"""``treadle.compile`` on modules that write in place: through views of a tensor, into a
whole tensor, into the caller's inputs and into buffers, against eager PyTorch."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import treadle  # noqa: E402
from treadle.errors import UnsupportedOpError  # noqa: E402

F = torch.nn.functional
SIZES = [3, 7, 13]


@pytest.fixture(autouse=True)
def seeded():
    torch.manual_seed(0)


class Writes(torch.nn.Module):
    """Returns a copy of ``x`` after ``write(copy, x)`` changed it in place."""

    def __init__(self, write):
        super().__init__()
        self.write = write

    def forward(self, x):
        y = x * 1.0
        self.write(y, x)
        return y


def _matches(model: torch.nn.Module, *args):
    """The compiled model's outputs equal eager's, each called on its own copy of ``args``
    (eager may write into them)."""
    compiled = treadle.compile(model.eval(), tuple(a.clone() for a in args))
    got = compiled(*(a.clone() for a in args))
    with torch.no_grad():
        expected = model(*(a.clone() for a in args))
    got, expected = (v if isinstance(v, tuple) else (v,) for v in (got, expected))
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        g = np.asarray(g)
        assert g.shape == tuple(e.shape) and g.dtype == e.numpy().dtype
        np.testing.assert_allclose(g, e.numpy(), rtol=1e-5, atol=1e-6)


THROUGH_VIEWS = {
    "clamp_columns": lambda y, x: y[:, :2].clamp_(min=0.0),
    "relu_row": lambda y, x: torch.relu_(y[0]),
    "leaky_relu_narrow": lambda y, x: F.leaky_relu_(y.narrow(1, 1, 3), 0.5),
    "silu_last_row": lambda y, x: F.silu(y[-1], inplace=True),
    "clamp_transposed": lambda y, x: y.t().clamp_(max=0.5),
    "masked_fill_columns": lambda y, x: y[:, :3].masked_fill_(y[:, :3] > 0, 1.0),
    "hardtanh_columns": lambda y, x: F.hardtanh_(y[:, 1:]),
    "elu_rows": lambda y, x: F.elu_(y[1:]),
    "clamp_flattened": lambda y, x: y.view(-1)[:5].clamp_(min=0.0),
    "clamp_unsqueezed": lambda y, x: y.unsqueeze(0).clamp_(min=-0.1),
    "clamp_nested_views": lambda y, x: y[1:][:, 2:].t()[0].clamp_(max=0.0),
    "mul_strided_columns": lambda y, x: y[:, 1::3].mul_(10.0),
    "zero_last_rows_strided": lambda y, x: y[-5::2].zero_(),
}


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("name", sorted(THROUGH_VIEWS))
def test_write_through_a_view_reaches_the_base(name, size):
    _matches(Writes(THROUGH_VIEWS[name]), torch.randn(size, size + 4))


class ViewBeforeWrite(torch.nn.Module):
    """A view taken before its base is written sees the write."""

    def forward(self, x):
        y = x * 1.0
        view = y[:, :3]
        y.clamp_(min=0.0)
        return view * 1.0


@pytest.mark.parametrize("size", SIZES)
def test_view_taken_before_a_write_reads_the_written_values(size):
    _matches(ViewBeforeWrite(), torch.randn(size, size + 4))


def _assign(index, value):
    def write(y, x):
        y[index] = value(x) if callable(value) else value
    return write


WHOLE_AND_SLICES = {
    "add_": lambda y, x: y.add_(x, alpha=2.0),
    "iadd": lambda y, x: y.__iadd__(x),
    "mul_": lambda y, x: y.mul_(x),
    "sub_then_div_": lambda y, x: y.sub_(1.0).div_(3.0),
    "zero_": lambda y, x: y.zero_(),
    "zero_rows": lambda y, x: y[1:].zero_(),
    "fill_columns": lambda y, x: y[:, -2:].fill_(3.0),
    "fill_with_an_element": lambda y, x: y[1:3].fill_(x[0, 0]),
    "assign_columns": _assign((slice(None), slice(0, 2)), 0.0),
    "assign_last_columns": _assign((slice(None), slice(-3, None)), 0.5),
    "assign_column": _assign((slice(None), 0), lambda x: x[:, 1]),
    "assign_last_column": _assign((slice(None), -1), lambda x: x[:, 0] * 2.0),
    "assign_strided_rows": _assign(slice(0, None, 2), lambda x: x[1::2][:1]),
}


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("name", sorted(WHOLE_AND_SLICES))
def test_in_place_arithmetic_and_assignment(name, size):
    _matches(Writes(WHOLE_AND_SLICES[name]), torch.randn(size, size + 4))


class Residual(torch.nn.Module):
    """torchvision's BasicBlock ending: ``out += identity``, then ``ReLU(inplace=True)``."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 3, 3, padding=1)
        self.relu = torch.nn.ReLU(inplace=True)

    def forward(self, x):
        out = self.conv(x)
        out += x
        return self.relu(out)


@pytest.mark.parametrize("size", SIZES)
def test_residual_block_adds_in_place(size):
    _matches(Residual(), torch.randn(2, 3, size, size + 2))


class IntegerAndBoolean(torch.nn.Module):
    def forward(self, x):
        counts, signs = (x * 10).to(torch.int32), x > 0
        counts[:, :2] += 5
        signs[:, 1:].logical_not_()
        return counts, signs


def test_writes_into_integer_and_boolean_slices():
    _matches(IntegerAndBoolean(), torch.randn(7, 13))


class Literals(torch.nn.Module):
    """Tensors built from Python lists in forward: export lifts them as constants."""

    def forward(self, x):
        y = x.index_fill(1, torch.tensor([0, 2]), -1.0)
        return y[:, :3] + torch.tensor([1.0, -2.0, 3.0]), y


@pytest.mark.parametrize("size", SIZES)
def test_tensor_literals(size):
    _matches(Literals(), torch.randn(size, size + 4))


class Slices(torch.nn.Module):
    def forward(self, x):
        y = x * 1.0
        y[:, :2].clamp_(min=0.0)
        y[-2:] = 0.25
        torch.relu_(y[:, -1])
        y[:, 1:].mul_(2.0)
        return y


def test_writes_through_views_with_symbolic_sizes():
    rows, columns = torch.export.Dim("rows", min=3), torch.export.Dim("columns", min=3)
    model = Slices().eval()
    compiled = treadle.compile(model, torch.randn(7, 13), dims={"x": {0: rows, 1: columns}})
    for shape in [(3, 3), (7, 13), (13, 7), (3, 40)]:
        x = torch.randn(*shape)
        with torch.no_grad():
            expected = model(x.clone())
        np.testing.assert_allclose(np.asarray(compiled(x)), expected.numpy())


class StridedColumns(torch.nn.Module):
    def forward(self, x):
        y = x * 1.0
        y[:, ::2] = 0.0
        return y


def test_strided_write_along_a_symbolic_dimension_names_the_node():
    columns = torch.export.Dim("columns", min=3)
    with pytest.raises(UnsupportedOpError, match="slice_scatter.*strided.*columns"):
        treadle.compile(StridedColumns().eval(), torch.randn(7, 13),
                        dims={"x": {1: columns}})


class IncrementsItsInput(torch.nn.Module):
    def forward(self, x):
        x += 1.0
        return x * 2.0


def test_write_into_an_input_warns_and_returns_eager_outputs():
    x = torch.randn(7, 13)
    with pytest.warns(UserWarning, match="writes into its inputs 'x'"):
        compiled = treadle.compile(IncrementsItsInput().eval(), x.clone())
    np.testing.assert_allclose(np.asarray(compiled(x)), ((x + 1.0) * 2.0).numpy())


class Counter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(13))

    def forward(self, x):
        self.count.add_(1.0)
        return x + self.count


def test_write_into_a_buffer_is_refused_naming_the_node():
    with pytest.raises(UnsupportedOpError, match="node 'add' writes 'count' in place"):
        treadle.compile(Counter().eval(), torch.randn(7, 13))


class Linear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(13, 7)

    def forward(self, x):
        return torch.relu(self.linear(x))


def test_program_without_writes_is_imported_as_exported(monkeypatch):
    """Making a program functional retraces it; one that writes nothing skips that."""
    def refuse(*args, **kwargs):
        raise AssertionError("retraced a program that writes nothing")
    monkeypatch.setattr(torch.export.ExportedProgram, "run_decompositions", refuse)
    _matches(Linear(), torch.randn(7, 13))
