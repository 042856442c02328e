"""Quantised models on AMX's tiles end to end: ONNX Runtime's quantisation tools write
them, treadle's outputs match ONNX Runtime's on the same file and the VNNI path's."""
import numpy as np
import onnx
import pytest

import treadle
from tests.harness import rng, run_onnxruntime
from tests.schedule.templates.gemm.test_tiles import VNNI, needs_amx
from treadle.compiler import compile_graph
from treadle.config import override
from treadle.frontend.onnx import from_onnx

quantization = pytest.importorskip("onnxruntime.quantization")
from tests.graph.passes.test_integer_products import (QUANTISE, _Images,  # noqa: E402
                                                      float_cnn, float_mlp)
from tests.graph.passes.test_integer_products import K as MLP_K  # noqa: E402


def _sources(folder) -> str:
    return "".join(p.read_text() for p in folder.rglob("*.c"))


@needs_amx
@pytest.mark.parametrize("scheme", ["static_per_channel", "dynamic"])
def test_quantised_mlp_matches_onnxruntime(scheme, tmp_path):
    """Within one step of the output's quantisation (the float32 scale products may round
    a value across a step's midpoint), as the VNNI path; and equal to the VNNI path's."""
    path = str(tmp_path / "q.onnx")
    QUANTISE[scheme](float_mlp(tmp_path / "f.onnx"), path)
    with override(dump_dir=tmp_path / "dump"):
        compiled = treadle.compile(path)
    assert "_tile_dpbusd" in _sources(tmp_path / "dump")
    vnni = compile_graph(from_onnx(onnx.load(path)), target=VNNI)
    for rows in (1, 7, 61, 0):
        x = rng(rows).normal(size=(rows, MLP_K)).astype(np.float32)
        got, want = compiled(x)[0], run_onnxruntime(onnx.load(path), {"x": x})[0]
        assert got.shape == want.shape
        if rows:
            step = np.abs(np.diff(np.unique(want))).min(initial=np.inf)
            assert np.abs(got - want).max() <= max(step, 1e-5) * 1.01
            np.testing.assert_array_equal(got, vnni(x)[0])


@needs_amx
def test_quantised_convolutions_match_onnxruntime(tmp_path):
    """Per-channel int8 convolutions (K over window positions and channels: A packed row
    by row of the window, then zero-padded to a whole K step)."""
    path = str(tmp_path / "q.onnx")
    quantization.quantize_static(float_cnn(tmp_path / "f.onnx"), path, _Images(),
                                 quant_format=quantization.QuantFormat.QDQ, per_channel=True,
                                 op_types_to_quantize=["Conv"])
    with override(dump_dir=tmp_path / "dump"):
        compiled = treadle.compile(path)
    assert "_tile_dpbusd" in _sources(tmp_path / "dump")
    for shape in ((1, 3, 16, 16), (2, 3, 13, 7)):
        x = rng(shape[2]).normal(size=shape).astype(np.float32)
        got, want = compiled(x)[0], run_onnxruntime(onnx.load(path), {"x": x})[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@needs_amx
@pytest.mark.parametrize("options", [{"tune": 1}, {"tune": "construct"},
                                     {"dynamic": {"M": (1, 64)}}], ids=str)
def test_tuning_construction_and_dynamic_shapes_keep_the_tiles(options, tmp_path):
    """Every producer of configs (the tuner's measured space, schedule construction,
    dynamic-shape variants) yields tile programs with the same, exact sums."""
    path = str(tmp_path / "q.onnx")
    QUANTISE["static_per_channel"](float_mlp(tmp_path / "f.onnx"), path)
    with override(dump_dir=tmp_path / "dump"):
        compiled = treadle.compile(path, **options)
    assert "_tile_dpbusd" in _sources(tmp_path / "dump")
    reference = treadle.compile(path)
    for rows in (1, 7, 61):
        x = rng(rows).normal(size=(rows, MLP_K)).astype(np.float32)
        np.testing.assert_array_equal(compiled(x)[0], reference(x)[0])
