"""Dynamic-shape tuning (DietCode): declared ranges, the cost model's fit, the choice of
variants, the decision tree and its C dispatcher, and whole compiles over a symbolic
dimension checked against numpy at odd and prime sizes, inside the range and out of it."""
import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import treadle
from tests.harness import assert_close, random_array
from treadle import ops
from treadle.compiler import compile_graph
from treadle.config import override
from treadle.ir.builder import FunctionBuilder
from treadle.ir.dtypes import index_type
from treadle.ir.expr import Var
from treadle.runtime import cuda as cuda_runtime
from treadle.runtime.build import compile_function
from treadle.schedule.dispatch import dispatching_kernel
from treadle.schedule.kernel import Kernel
from treadle.target.cuda import cuda_target
from treadle.schedule.templates.gemm.cost import Work
from treadle.tune import dynamic
from treadle.tune import kernel as kernel_layer
from treadle.tune.dynamic import (CostModel, Sample, SizeRange, Tree, fit_cost_model, fit_tree,
                                  select_variants, size_ranges)
from treadle.tune.records import records_dir

SIZES = (1, 7, 61, 97, 127)


# ---- declared ranges -------------------------------------------------------------------------

def test_size_ranges_take_a_range_a_list_or_a_histogram():
    ranges = size_ranges({"seq": (1, 512), "batch": [1, 4, 4, 16], "t": {3: 2.0, 9: 1.0}})
    assert ranges["seq"] == SizeRange(1, 512)
    assert ranges["seq"].weight(300) == 1.0
    assert (ranges["batch"].lo, ranges["batch"].hi) == (1, 16)
    assert ranges["batch"].weight(4) == 2.0 and ranges["batch"].weight(5) == 0.0
    assert ranges["t"].weights == ((3, 2.0), (9, 1.0))
    assert ranges["seq"].sizes(4) == [1, 171, 342, 512]
    assert ranges["batch"].sizes(100) == list(range(1, 17))


@pytest.mark.parametrize("spec", [(5, 1), (-1, 4), (True, 4), [], {}, {3: -1.0}, "1..4",
                                  (1.5, 4), {2: 0.0}])
def test_a_malformed_range_names_the_symbol(spec):
    with pytest.raises(ValueError, match="dynamic\\['seq'\\]"):
        size_ranges({"seq": spec})


def test_compile_rejects_a_symbol_the_model_lacks():
    x = ops.input("x", "float32", ["seq", 8])
    with pytest.raises(ValueError, match="'sq'.*its symbols: seq"):
        treadle.compile(ops.graph([x], [ops.relu(x)]), dynamic={"sq": (1, 4)})


def test_construction_does_not_combine_with_dynamic():
    x = ops.input("x", "float32", ["seq", 8])
    with pytest.raises(ValueError, match="does not combine"):
        treadle.compile(ops.graph([x], [ops.relu(x)]), tune="construct",
                        dynamic={"seq": (1, 4)})


# ---- the cost model --------------------------------------------------------------------------

def _work(rows: int, tiles: int, threads: int = 2) -> Work:
    macs = rows * 768 * 768
    once = 4 * 768 * 768
    return Work(macs, macs, once * -(-rows // 8), once, tiles, threads)


def test_the_occupancy_coefficient_is_fitted_to_known_data():
    truth = CostModel(occupancy=0.85, overhead=3e-6, cold=5e-11, stream=2e-11)
    per_mac = [4e-12, 7e-12, 1.1e-11]
    samples = []
    for k, pm in enumerate(per_mac):
        full = _work(256, 8)
        for j, probe in enumerate((_work(8, 1), _work(24, 3), _work(1, 1), _work(40, 5))):
            noise = 1 + 0.005 * (-1) ** (j + k)  # measurements are never exact
            samples.append(Sample(full, truth.seconds(pm, full), probe,
                                  truth.seconds(pm, probe) * noise))
    fitted = fit_cost_model(samples)
    assert fitted.occupancy == pytest.approx(0.85, abs=0.05)
    assert fitted.occupancy != dynamic.PRIOR[0]
    for sample in samples:  # and the fitted model carries each full time to its probe
        carried = fitted.seconds(fitted.per_mac(sample.full_seconds, sample.full), sample.probe)
        assert carried == pytest.approx(sample.probe_seconds, rel=0.02)
    assert fit_cost_model([]) == CostModel(*dynamic.PRIOR)


def test_the_model_carries_a_measurement_to_other_sizes():
    model = CostModel(occupancy=1.0, overhead=1e-6, cold=0.0, stream=0.0)
    full, half = _work(64, 4), _work(8, 1)
    per_mac = model.per_mac(model.seconds(5e-12, full), full)
    assert per_mac == pytest.approx(5e-12)
    # One tile on two threads runs at the speed of one thread.
    assert model.seconds(per_mac, half) == pytest.approx(1e-6 + 5e-12 * half.macs)
    # The right factor's first read costs `cold` per byte, its re-reads `stream`.
    model = CostModel(occupancy=1.0, overhead=0.0, cold=2e-11, stream=1e-11)
    assert model.seconds(0.0, full) == pytest.approx(2e-11 * full.right_once
                                                     + 1e-11 * 7 * full.right_once)
    assert half.occupancy == 0.5 and Work(0, 0, 0, 0, 0, 2).occupancy == 1.0


def test_predictions_pass_through_a_candidates_own_measurements():
    """The model's curve is bent through each timed size and keeps its shape between
    them: off by x1.2 at 8 and x0.9 at 64, it is corrected by those at those sizes and
    by a ratio between them at 24."""
    model = CostModel(occupancy=1.0, overhead=1e-6, cold=0.0, stream=0.0)
    sizes = [1, 8, 24, 64, 128]
    works = [[_work(n, max(1, n // 8)) for n in sizes]]
    predicted = np.array([model.seconds(5e-12, w) for w in works[0]])
    tuning = dynamic._Tuning(None, None, "k", ["seq"], [], np.ones(5) / 5, [], works, 1,
                             None, [1, 3], {}, [], seconds={(0, 1): predicted[1] * 1.2,
                                                        (0, 3): predicted[3] * 0.9,
                                                        (1, 2): 1.0},
                             model=model, measured={0: dynamic.Measured(5e-12)})
    bent = tuning.anchored(0, np.array(sizes)[:, None]) / predicted
    assert bent[1] == pytest.approx(1.2) and bent[3] == pytest.approx(0.9)
    assert 0.9 < bent[2] < 1.2 and bent[0] == pytest.approx(1.2, rel=0.05)
    assert bent[4] == pytest.approx(0.9, rel=0.05)


def _grid(lo: int, hi: int) -> list[dict]:
    return [{Var("seq", index_type): n} for n in range(lo, hi + 1)]


@pytest.mark.parametrize("hi", [16, 128, 509])
def test_stand_in_sizes_grow_by_half_up_to_the_median_and_double_after(hi):
    """Below the median, sizes between powers of two stand in too (their register tiles
    pad differently); above it each stand-in at least doubles the last. The range's
    ends and median are always among them."""
    grid = _grid(1, hi)
    sizes = [next(iter(grid[g].values())) for g in dynamic._stand_ins(grid, np.ones(hi) / hi)]
    median = (hi + 1) // 2
    assert sizes[0] == 1 and sizes[-1] == hi and median in sizes
    below, above = [n for n in sizes if n <= median], [n for n in sizes if n >= median]
    assert all(b < 1.5 * a + 1 for a, b in zip(below, below[1:]))
    assert all(b >= 2 * a for a, b in zip(above, above[1:-1]))
    assert {3, 5} <= set(below)  # not powers of two alone


def test_a_config_made_for_one_size_is_timed_near_it_and_at_the_ends():
    """A stand-in's own config runs at its size, the stand-ins either side, the range's
    ends and where its tiles fit best; a point of the space at every stand-in."""
    grid = _grid(1, 128)
    works = [[_work(n, max(1, n // 8)) for n in range(1, 129)]] * 2
    stand_ins = dynamic._stand_ins(grid, np.ones(128) / 128)
    made_for = stand_ins[4]
    tuning = dynamic._Tuning(None, None, "k", ["seq"], grid, np.ones(128) / 128, [], works,
                             1, None, stand_ins, {0: made_for}, [])
    timed = {g for _, g in tuning.runs_of(0)}
    near = set(stand_ins[3:6]) | {0, 127}
    assert timed == near | {dynamic._full_size(works[0])}
    assert len(timed) < len(stand_ins)
    assert set(stand_ins) <= {g for _, g in tuning.runs_of(1)}


def test_variants_are_chosen_for_the_sizes_they_serve():
    # Candidate 0 is best on average, 1 only on the first sizes, 2 is never much better.
    times = np.array([[2.0, 2.0, 1.0, 1.0, 1.0, 1.0],
                      [1.0, 1.0, 3.0, 3.0, 3.0, 3.0],
                      [2.0, 1.99, 1.01, 1.0, 1.0, 1.0]])
    weights = np.full(6, 1 / 6)
    assert select_variants(times, weights) == [0, 1]
    assert select_variants(times[[0]], weights) == [0]
    # Sizes of weight 0 (a histogram's gaps) count for nothing.
    assert select_variants(times, np.array([0, 0, 0.25, 0.25, 0.25, 0.25])) == [0]


def test_a_size_left_slow_is_served_before_totals(monkeypatch):
    """Room for one variant beside the first: candidate 1 gains 6% on five sizes (the
    larger total), candidate 2 30% on the first size alone; the first size, left 30%
    over its fastest, is served."""
    monkeypatch.setattr(dynamic, "MAX_VARIANTS", 2)
    times = np.array([[1.3, 1.0, 1.0, 1.0, 1.0, 1.0],
                      [2.0, 0.94, 0.94, 0.94, 0.94, 0.94],
                      [1.0, 1.2, 1.2, 1.2, 1.2, 1.2]])
    weights = np.full(6, 1 / 6)
    assert select_variants(times, weights) == [0, 2]
    # A size of no weight is not served: candidate 1, fastest at the others, runs alone.
    assert select_variants(times, np.array([0, 0.2, 0.2, 0.2, 0.2, 0.2])) == [1]


# ---- the decision tree and its dispatcher ----------------------------------------------------

def _step_tree() -> Tree:
    values = np.arange(1, 101)[:, None]
    labels = np.select([values[:, 0] <= 5, values[:, 0] <= 37, values[:, 0] <= 64], [2, 0, 1], 3)
    return fit_tree(["seq"], values, labels, np.full(100, 0.01)), values, labels


def test_the_tree_learns_the_choices_and_drops_useless_splits():
    tree, values, labels = _step_tree()
    assert [tree.predict({"seq": int(v)}) for v in values[:, 0]] == labels.tolist()
    assert sum(1 for n in tree.nodes if n[0] < 0) == 4
    single = fit_tree(["seq"], values, np.zeros(100, int), np.full(100, 0.01))
    assert single.nodes == ((-1, 0, -1, -1),)


def _constant_kernel(value: int) -> Kernel:
    with FunctionBuilder(f"variant{value}") as fb:
        fb.symbol("seq")
        out = fb.param("y0", "int32", [1])
        fb.store(out, [0], value)
    return Kernel(fb.function, (), ())


def test_the_dispatcher_in_c_agrees_with_the_tree_and_clamps_outside_the_range():
    tree, values, _ = _step_tree()
    kernel = dispatching_kernel([_constant_kernel(v) for v in range(4)], tree.nodes,
                                tree.symbols, "dispatch")
    function = compile_function(kernel.function)
    out = np.zeros(1, np.int32)
    for seq in [0, *values[:, 0].tolist(), 101, 10**6]:
        function(out, seq=seq)
        expected = tree.predict({"seq": min(max(seq, 1), 100)})
        assert out[0] == expected, seq


# ---- whole compiles --------------------------------------------------------------------------

def _dense_and_attention():
    """A dense layer with a bias and ReLU as epilogue (a constant right factor) and an
    attention-like product with seq on both sides."""
    x = ops.input("x", "float32", [1, "seq", 48])
    w = ops.constant(random_array((48, 40), seed=1))
    b = ops.constant(random_array((40,), seed=2))
    h = ops.relu(ops.add(ops.matmul(x, w), b))
    scores = ops.matmul(h, ops.transpose(h, [0, 2, 1]))
    return ops.graph([x], [h, scores], name="dynamic")


def _reference(a: np.ndarray) -> list[np.ndarray]:
    w, b = random_array((48, 40), seed=1), random_array((40,), seed=2)
    h = np.maximum(a @ w + b, 0)
    return [h, h @ h.transpose(0, 2, 1)]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    with override(cache_dir=tmp_path_factory.mktemp("dynamic-cache")):
        yield


# (label, timed cold) of each run, per call measuring the fixture's model
MEASURING_CALLS: list[list[tuple[str, bool]]] = []


@pytest.fixture(scope="module")
def dynamic_model(cache):
    real = dynamic.measure_functions

    def counted(functions, **kwargs):
        MEASURING_CALLS.append(list(zip(kwargs["labels"], kwargs["cold"], strict=True)))
        return real(functions, **kwargs)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(dynamic, "measure_functions", counted)
        return treadle.compile(_dense_and_attention(), dynamic={"seq": (1, 127)})


def test_a_model_measures_its_dynamic_kernels_together(dynamic_model):
    """Each round of measuring takes the candidates of both kernels at once, so a model
    starts the compiler and the measuring child twice, not twice per kernel."""
    assert 1 <= len(MEASURING_CALLS) <= 2
    kernels = {_kernel_of(label) for label, _ in MEASURING_CALLS[0]}
    assert len(kernels) == 2, kernels


def test_weights_are_timed_cold_and_activations_in_cache(dynamic_model):
    """The dense layer's laid-out weights come from memory in a model's call; the
    attention product reads only what the layer before has just written."""
    cold = {}
    for label, flag in (run for call in MEASURING_CALLS for run in call):
        cold.setdefault(_kernel_of(label), set()).add(flag)
    dense, attention = sorted(cold)  # k0 is the dense layer, then the product
    assert cold[dense] == {True} and cold[attention] == {False}, cold


def _kernel_of(label: str) -> str:
    return label.removeprefix("of ").split(" (")[0]


@pytest.mark.parametrize("seq", [0, *SIZES, 128, 300])
def test_a_dynamic_model_matches_numpy_in_and_out_of_its_range(dynamic_model, seq):
    a = random_array((1, seq, 48), seed=seq)
    for got, want in zip(dynamic_model(a), _reference(a)):
        assert_close(got, want, reduction=48, context=f"seq={seq}")


def test_every_variant_matches_numpy(cache, dynamic_model, monkeypatch):
    """Each variant in turn is made the dispatcher's only choice."""
    real = kernel_layer.choose_dynamic_many
    counts = []

    def only_one(choice):
        counts.append(len(choice.configs))
        only = min(variant, len(choice.configs) - 1)  # kernels may have fewer variants
        leaf = Tree(choice.tree.symbols, ((-1, only, -1, -1),))
        return dynamic.DynamicChoice(choice.template, choice.configs, choice.resolved, leaf,
                                     choice.source)

    def forced(*args, **kwargs):
        return [only_one(choice) for choice in real(*args, **kwargs)]
    monkeypatch.setattr(kernel_layer, "choose_dynamic_many", forced)
    variant, seen = 0, 1
    while variant < seen:
        counts.clear()
        model = treadle.compile(_dense_and_attention(), dynamic={"seq": (1, 127)})
        seen = max(counts)
        for seq in SIZES:
            a = random_array((1, seq, 48), seed=seq)
            for got, want in zip(model(a), _reference(a)):
                assert_close(got, want, reduction=48, context=f"variant {variant}, seq={seq}")
        variant += 1
    assert seen >= 1


def test_a_histogram_of_sizes_tunes_for_those_sizes(cache):
    model = treadle.compile(_dense_and_attention(), dynamic={"seq": {3: 1.0, 40: 2.0}})
    for seq in (1, 3, 20, 40, 41):
        a = random_array((1, seq, 48), seed=seq)
        for got, want in zip(model(a), _reference(a)):
            assert_close(got, want, reduction=48, context=f"seq={seq}")


def test_a_second_compile_measures_nothing(cache, dynamic_model, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("measured again")
    monkeypatch.setattr(dynamic, "measure_functions", refuse)
    model = treadle.compile(_dense_and_attention(), dynamic={"seq": (1, 127)})
    a = random_array((1, 61, 48))
    assert_close(model(a)[0], _reference(a)[0], reduction=48)


def test_a_damaged_record_is_tuned_again(cache, dynamic_model, caplog, tmp_path):
    with override(cache_dir=tmp_path):
        treadle.compile(_dense_and_attention(), dynamic={"seq": (1, 16)})
        records = [p for p in records_dir().glob("*.json")
                   if json.loads(p.read_text())["format"] == dynamic.FORMAT]
        assert records
        for path in records:
            data = json.loads(path.read_text())
            data["tree"]["nodes"] = [[0, 3, 0, 0]]  # a loop back to the root
            path.write_text(json.dumps(data))
        with caplog.at_level(logging.WARNING, logger="treadle.tune.dynamic"):
            model = treadle.compile(_dense_and_attention(), dynamic={"seq": (1, 16)})
        assert "ignoring unusable tuning record" in caplog.text
        a = random_array((1, 7, 48))
        assert_close(model(a)[1], _reference(a)[1], reduction=48)


def test_a_saved_dynamic_model_dispatches_without_scikit_learn(dynamic_model, tmp_path):
    dynamic_model.save(tmp_path / "model")
    script = textwrap.dedent(f"""
        import sys
        sys.modules["sklearn"] = None  # any import of scikit-learn fails
        import numpy as np
        import treadle
        model = treadle.load({str(tmp_path / "model")!r})
        for seq in {SIZES}:
            a = np.random.default_rng(seq).uniform(-1, 1, (1, seq, 48)).astype("float32")
            np.save({str(tmp_path)!r} + f"/in{{seq}}.npy", a)
            np.save({str(tmp_path)!r} + f"/out{{seq}}.npy", model(a)[1])
        print("sklearn" in sys.modules and sys.modules["sklearn"] is not None)
    """)
    env = {**os.environ, "PYTHONPATH": str(Path(treadle.__file__).resolve().parents[1])}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"
    for seq in SIZES:
        a = np.load(tmp_path / f"in{seq}.npy")
        assert_close(np.load(tmp_path / f"out{seq}.npy"), _reference(a)[1], reduction=48)


# ---- CUDA: measured on a GPU, else from the template's analytic latency ----------------------

@pytest.fixture(scope="module")
def cuda_dense(cache):
    """A dense layer compiled for CUDA over seq 1..512, with the choices it was given."""
    chosen = []
    real = kernel_layer.choose_dynamic_many

    def kept(*args, **kwargs):
        found = real(*args, **kwargs)
        chosen.extend(found)
        return found
    x = ops.input("x", "float32", ["seq", 128])
    y = ops.matmul(x, ops.constant(random_array((128, 768), seed=4)))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(kernel_layer, "choose_dynamic_many", kept)
        model = compile_graph(ops.graph([x], [y], "dense"), dynamic=size_ranges({"seq": (1, 512)}),
                              target=cuda_target("sm_80"))
    return model, chosen


@pytest.mark.skipif(cuda_runtime.available(), reason="this machine has a GPU to measure on")
def test_without_a_gpu_cuda_variants_come_from_the_analytic_model(cuda_dense):
    """No device to time on: every candidate is ranked by Gensor's latency model at every
    size, and short sequences get smaller blocks than long ones (more blocks for the SMs)."""
    _, (choice,) = cuda_dense
    assert choice.source == "analytic"
    assert len(choice.configs) >= 2
    blocks = {seq: choice.resolved[choice.tree.predict({"seq": seq})].config for seq in (1, 512)}
    assert blocks[1].block_m * blocks[1].block_n < blocks[512].block_m * blocks[512].block_n


@pytest.mark.parametrize("seq", [0, 1, 97, 416, 417, 600])
def test_cuda_variants_match_numpy_on_each_side_of_the_dispatch(cuda_dense, seq):
    model, _ = cuda_dense
    a = random_array((seq, 128), seed=seq)
    got = model.simulate(a)[0]
    assert_close(got, a @ random_array((128, 768), seed=4), reduction=128, context=f"seq={seq}")
