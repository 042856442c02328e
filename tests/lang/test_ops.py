"""treadle.lang kernels registered as operators: in treadle graphs compiled by
treadle.compile (fused with their neighbours), as torch custom ops, and the OPS table a
torch importer reads."""
import numpy as np
import pytest

import treadle
from tests.harness import assert_close, random_array
from treadle import lang, ops
from treadle.errors import ArgumentError, DTypeError, KernelError, ShapeError
from treadle.examples.lang_matmul import tiled_matmul
from treadle.graph.operator import REGISTRY
from treadle.lang import f32

R, C = lang.symbols("R C")


@lang.kernel
def scale_and_sum(x: f32[R, C], alpha: f32, y: f32[R, C], sums: f32[R]):
    for r in lang.parallel(R):
        total = 0.0
        for c in range(C):
            v = x[r, c] * alpha
            y[r, c] = v
            total += v
        sums[r] = total


# Registration is global (the graph registry, torch's op table): once per test run.
SCALE = scale_and_sum.register_op("test_scale_and_sum", outputs=["y", "sums"])
MATMUL = tiled_matmul().register_op("test_tiled_matmul", outputs="c")


def kernel_steps(model) -> int:
    return sum(step.kernel is not None for step in model.executable.steps)


def test_ops_table_tells_the_importer_the_graph_op():
    spec = lang.OPS["test_scale_and_sum"]
    assert spec is SCALE
    assert spec.op_type == "treadle_lang.test_scale_and_sum" and spec.op_type in REGISTRY
    assert spec.arguments == ("x", "alpha")
    assert (spec.inputs, spec.attributes, spec.outputs) == (("x",), ("alpha",), ("y", "sums"))
    assert lang.OPS["test_tiled_matmul"].arguments == ("a", "b")


def test_graph_op_with_attribute_and_two_outputs(tmp_path):
    # The graph's symbol is named as the kernel's loop variable, r.
    x = ops.input("x", "float32", ["r", 13])
    y, sums = SCALE.apply([x, 0.5], name="scale")
    assert [t.shape for t in (y, sums)] == [(x.shape[0], 13), (x.shape[0],)]
    model = treadle.compile(ops.graph([x], [ops.relu(y), sums], name="scale_and_sum"))
    model.save(tmp_path / "saved")
    for run in (model, treadle.load(tmp_path / "saved")):
        for batch in (1, 7, 0):
            data = random_array((batch, 13), seed=batch)
            relu, total = run(data)
            assert_close(relu, np.maximum(data * 0.5, 0))
            assert_close(total, (data * 0.5).sum(axis=1), reduction=13)


def test_neighbours_fuse_into_the_hand_written_kernel():
    weights = random_array((37, 13), seed=1)
    bias = random_array((13,), seed=2)
    x = ops.input("x", "float32", ["batch", 37])
    (product,) = MATMUL.apply([ops.relu(x), ops.constant(weights)])
    out = ops.op("Add", product, ops.constant(bias))
    model = treadle.compile(ops.graph([x], [out], name="relu_matmul_bias"))
    assert kernel_steps(model) == 1  # the ReLU as a prologue, the Add as an epilogue
    for batch in (1, 7, 61, 0):
        data = random_array((batch, 37), seed=batch)
        (result,) = model(data)
        assert_close(result, np.maximum(data, 0) @ weights + bias, reduction=37)


def test_constant_inputs_fold_by_running_the_kernel():
    a, b = random_array((5, 7), seed=3), random_array((7, 3), seed=4)
    (product,) = MATMUL.apply([ops.constant(a), ops.constant(b)])
    x = ops.input("x", "float32", [5, 3])
    model = treadle.compile(ops.graph([x], [ops.op("Add", x, product)], name="folded"))
    data = random_array((5, 3), seed=5)
    assert_close(model(data)[0], data + a @ b, reduction=7)


def test_symbolic_sizes_that_must_agree_are_checked_at_run_time():
    # The graph's symbols take the kernel's names (M, N, K) for other dimensions.
    a = ops.input("a", "float32", ["N", "K"])
    b = ops.input("b", "float32", ["M", "k"])
    (product,) = MATMUL.apply([a, b], name="mm")
    model = treadle.compile(ops.graph([a, b], [product], name="unchecked"))
    left, right = random_array((3, 4), seed=6), random_array((4, 2), seed=7)
    assert_close(model(left, right)[0], left @ right, reduction=4)
    with pytest.raises(KernelError, match=r"'mm'.*input 1 \('b'\) dimension 0"):
        model(left, random_array((5, 2), seed=8))


def test_static_size_mismatch_names_the_input_and_the_symbol():
    a, b = ops.input("a", "float32", [3, 4]), ops.input("b", "float32", [5, 2])
    with pytest.raises(ShapeError, match=r"input 1 \('b'\) dimension 0 is 5, but the kernel's K "
                                         r"is 4 there \(K from input 0 \('a'\) dimension 1\)"):
        MATMUL.apply([a, b], name="mm")


def test_dtype_mismatch_names_the_input():
    a, b = ops.input("a", "float32", [3, 4]), ops.input("b", "float64", [4, 2])
    with pytest.raises(DTypeError, match=r"input 1 \('b'\) is float64"):
        MATMUL.apply([a, b])


def test_wrong_argument_count():
    with pytest.raises(ArgumentError, match=r"takes 2 arguments \(x, alpha\)"):
        SCALE.apply([ops.input("x", "float32", [2, 2])])


def test_registration_errors():
    with pytest.raises(ArgumentError, match="registered already"):
        scale_and_sum.register_op("test_scale_and_sum", outputs="y")
    with pytest.raises(ArgumentError, match="outputs must name distinct tensor parameters"):
        scale_and_sum.register_op("test_bad_outputs", outputs="alpha")

    @lang.kernel
    def broadcast_rows(x: f32[C], y: f32[R, C]):
        for r in range(R):
            for c in range(C):
                y[r, c] = x[c]
    with pytest.raises(ArgumentError, match="symbols R are no whole dimension of any input"):
        broadcast_rows.register_op("test_unsized", outputs="y")


def test_torch_custom_op_runs_the_kernel_eagerly():
    torch = pytest.importorskip("torch")
    x = torch.rand(13, 7).T  # not contiguous: the op copies it
    y, sums = torch.ops.treadle_lang.test_scale_and_sum(x, 2.0)
    assert_close(y.numpy(), (x * 2).numpy())
    assert_close(sums.numpy(), (x * 2).sum(dim=1).numpy(), reduction=13)
    a, b = torch.rand(7, 37), torch.rand(37, 13)
    product = torch.ops.treadle_lang.test_tiled_matmul(a, b)
    assert_close(product.numpy(), (a @ b).numpy(), reduction=37)


def test_torch_custom_op_has_a_schema_and_fake_shapes():
    torch = pytest.importorskip("torch")
    op = torch.ops.treadle_lang.test_scale_and_sum.default
    assert str(op._schema).endswith("(Tensor x, float alpha) -> (Tensor, Tensor)")
    torch.library.opcheck(op, (torch.rand(4, 3), 0.5), test_utils=("test_schema",
                                                                    "test_faketensor"))


def test_torch_custom_op_compiles_inside_the_treadle_backend(monkeypatch):
    torch = pytest.importorskip("torch")
    from treadle.integrations import dynamo
    pieces = []
    original = dynamo._compile_piece
    monkeypatch.setattr(dynamo, "_compile_piece",
                        lambda *a, **k: pieces.append(original(*a, **k)) or pieces[-1])

    def f(x):
        y, sums = torch.ops.treadle_lang.test_scale_and_sum(torch.relu(x), 3.0)
        return y + 1.0, sums

    x = torch.randn(11, 5)
    torch._dynamo.reset()
    with torch.no_grad():
        y, sums = torch.compile(f, backend="treadle")(x)
    torch._dynamo.reset()
    assert all(isinstance(p, dynamo._Piece) for p in pieces) and pieces  # not eager
    assert_close(y.numpy(), (torch.relu(x) * 3 + 1).numpy())
    assert_close(sums.numpy(), (torch.relu(x) * 3).sum(dim=1).numpy(), reduction=5)
