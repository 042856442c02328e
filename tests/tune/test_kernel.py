"""The kernel layer: an operator on a target gets its template, the config of the tuning
level asked for, and the program that config emits; the dump says which. DietCode's
variants are chosen once per compile and kept, so making the kernel afterwards measures
nothing more. Measurements are faked: this is about which choice lands where."""
import numpy as np
import pytest

from tests.harness import assert_close, random_array
from treadle import ops
from treadle.config import override
from treadle.runtime.build import compile_function
from treadle.schedule.select import select_template
from treadle.schedule.template import default_point
from treadle.schedule.templates.gemm import GEMM
from treadle.schedule.templates.matmul_cuda import MATMUL_CUDA
from treadle.target.cpu import host
from treadle.target.cuda import cuda_target
from treadle.tune import dynamic
from treadle.tune.choice import Choice
from treadle.tune.dynamic import DynamicChoice, Tree, size_ranges
from treadle.tune.kernel import KernelMaker, format_choice, format_variants


def matmul(rows="n", inner=24, cols=16):
    """The MatMul operator of ``a @ b`` with both operands inputs (no weight panels)."""
    a = ops.input("a", "float32", [rows, inner])
    b = ops.input("b", "float32", [inner, cols])
    (op,) = ops.graph([a, b], [ops.matmul(a, b)], "mm").nodes
    assert op.op_type == "MatMul"
    return op


def dense(rows="n"):
    """A matmul by a constant: the right factor laid out once (the GEMM's derived panels)."""
    a = ops.input("a", "float32", [rows, 24])
    w = ops.constant(random_array((24, 16), seed=1), "w")
    (op,) = ops.graph([a], [ops.matmul(a, w)], "dense").nodes
    return op


@pytest.fixture
def cache(tmp_path):
    """A fresh cache (no stored records) and dump folder for each test."""
    with override(cache_dir=tmp_path / "cache", dump_dir=tmp_path / "dump"):
        yield tmp_path / "dump"


def test_level_zero_is_the_gemm_templates_default_point(cache):
    op = matmul()
    kernel = KernelMaker(host())(op, "mm0")
    template, pattern = select_template(op, host())
    assert template is GEMM
    expected = GEMM.emit(default_point(GEMM, pattern, host())[1], "mm0")
    assert str(kernel.function) == str(expected.function)
    schedule = (cache / "mm0" / "schedule.txt").read_text()
    assert "template: gemm" in schedule and "source: default" in schedule
    assert f"operator: {op.name} (MatMul)" in schedule


@pytest.mark.parametrize("n", [0, 1, 7, 61])
def test_the_level_zero_kernel_computes_a_matmul(cache, n):
    kernel = KernelMaker(host())(matmul(), "mm0")
    assert not kernel.derived and not kernel.workspaces
    function = compile_function(kernel.function)
    a, b = random_array((n, 24), seed=n), random_array((24, 16), seed=n + 1)
    out = np.full((n, 16), np.nan, np.float32)
    function(a, b, out)
    assert_close(out, a @ b, reduction=24, context=f"n={n}")


def test_construct_is_named_in_the_dump(cache):
    KernelMaker(host(), tune="construct")(matmul(rows=61), "built")
    schedule = (cache / "built" / "schedule.txt").read_text()
    assert "template: gemm" in schedule and "source: constructed" in schedule


def test_cuda_takes_its_matmul_template_and_constructs_without_a_gpu(cache):
    op = matmul(rows=61)
    assert select_template(op, cuda_target())[0] is MATMUL_CUDA
    for tune, source in ((0, "default"), ("construct", "constructed")):
        kernel = KernelMaker(cuda_target(), tune=tune)(op, f"gpu_{tune}")
        assert kernel.function.name == f"gpu_{tune}"
        schedule = (cache / f"gpu_{tune}" / "schedule.txt").read_text()
        assert "template: matmul_cuda" in schedule and f"source: {source}" in schedule


@pytest.fixture
def measured(monkeypatch):
    """Fake timings for dynamic tuning, and the size of each call asking for them: every
    other run takes twice as long, and each grows with n."""
    calls: list[int] = []

    def fake(functions, **kwargs):
        calls.append(len(functions))
        return [1e-5 * (1 + k % 2) * (1 + sizes.get("n", 1) / 64)
                for k, sizes in enumerate(kwargs["sizes"])]
    monkeypatch.setattr(dynamic, "measure_functions", fake)
    return calls


def test_dynamic_variants_are_chosen_once_and_kept(cache, measured):
    op = dense()
    maker = KernelMaker(host(), dynamic=size_ranges({"n": (1, 64)}))
    maker.tune_dynamic([(op, "dense")])
    assert measured, "dynamic tuning measured nothing"
    assert list(maker.variants) == [op]
    choice = maker.variants[op]
    assert isinstance(choice, DynamicChoice) and choice.template is GEMM
    assert len(choice.configs) == len(choice.resolved) >= 1
    rounds = len(measured)
    kernel = maker(op, "dense")
    assert len(measured) == rounds  # the kept choice is used, not tuned again
    assert kernel.function.name == "dense"
    schedule = (cache / "dense" / "schedule.txt").read_text()
    assert schedule.rstrip("\n") == format_variants(op, choice)
    assert "template: gemm" in schedule and "dispatch:" in schedule


def test_a_maker_without_ranges_tunes_nothing_dynamically(cache, measured):
    maker = KernelMaker(host())
    maker.tune_dynamic([(dense(), "dense")])
    assert not maker.variants and not measured
    # A symbol that is not declared leaves the kernel to the static choice.
    KernelMaker(host(), dynamic=size_ranges({"m": (1, 8)}))(dense(), "static")
    assert "source: default" in (cache / "static" / "schedule.txt").read_text()
    assert not measured


def test_format_choice_lists_the_config_only_where_there_is_one():
    op = matmul()
    template, pattern = select_template(op, host())
    config, resolved = default_point(template, pattern, host())
    text = format_choice(op, Choice(template, config, resolved, "record"))
    assert text.splitlines() == [f"operator: {op.name} (MatMul)", "template: gemm",
                                 f"config: {config}", f"resolved: {resolved.config}",
                                 "source: record"]
    bare = format_choice(op, Choice(template, None, resolved, "default"))
    assert bare.splitlines() == [f"operator: {op.name} (MatMul)", "template: gemm",
                                 "source: default"]


def test_format_variants_prints_the_dispatch_tree():
    op = matmul()
    template, pattern = select_template(op, host())
    config, resolved = default_point(template, pattern, host())
    tree = Tree(("n",), ((0, 16, 1, 2), (-1, 0, -1, -1), (-1, 1, -1, -1)))
    choice = DynamicChoice(template, (config, config), (resolved, resolved), tree, "measured")
    assert format_variants(op, choice).splitlines() == [
        f"operator: {op.name} (MatMul)", "template: gemm", "source: measured",
        f"variant 0: {config} -> {resolved.config}",
        f"variant 1: {config} -> {resolved.config}",
        "dispatch:",
        "  if n <= 16:",
        "    variant 0",
        "  else:  # n > 16",
        "    variant 1"]
