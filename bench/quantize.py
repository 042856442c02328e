"""Int8 copies of the zoo's ONNX exports, made with ONNX Runtime's quantisation tools.

The image models are quantised statically to the QDQ form (QuantizeLinear-DequantizeLinear
pairs around the float operators; int8 activations, int8 weights with a scale per output
channel), with activation ranges calibrated on CALIBRATION_BATCHES seeded random input
batches. The transformers are quantised dynamically: int8 weights, and activations
quantised at run time by DynamicQuantizeLinear for MatMulInteger.

Calibration uses random data because the zoo's weights are random too: no data set matches
these networks' statistics better, and the quantised models are measured for speed and
for agreement between runtimes, not for accuracy.

A quantised file lies beside its float export in bench/out/ and is redone when the float
file is newer.
"""
from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper
from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                      quantize_dynamic, quantize_static)
from onnxruntime.quantization.shape_inference import quant_pre_process

from treadle.models import MODELS, ModelSpec

CALIBRATION_BATCHES = 4
# Model families quantised dynamically; every other family is quantised statically.
DYNAMIC_FAMILIES = ("transformer", "ssm")


class RandomBatches(CalibrationDataReader):
    """``count`` batches of random inputs drawn as ``spec.random_inputs`` draws them, with
    seeds 1..count (seed 0 is the input the benchmarks time and compare on)."""

    def __init__(self, spec: ModelSpec, count: int = CALIBRATION_BATCHES):
        self.batches = iter([spec.random_inputs(seed=seed) for seed in range(1, count + 1)])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self.batches, None)


def quantized(spec: ModelSpec) -> Path:
    """The int8 copy of ``spec``'s ONNX file, ``<stem>-int8.onnx`` beside it: statically
    quantised to QDQ with per-channel weights, or dynamically for DYNAMIC_FAMILIES."""
    path = spec.path.with_name(f"{spec.path.stem}-int8.onnx")
    if path.exists() and path.stat().st_mtime > spec.path.stat().st_mtime:
        return path
    with tempfile.TemporaryDirectory(prefix="treadle-quantize-") as folder:
        source = _pre_processed(spec.path, Path(folder) / "prepared.onnx")
        target = Path(folder) / "int8.onnx"  # moved into place whole, never half-written
        if MODELS[spec.name].family in DYNAMIC_FAMILIES:
            quantize_dynamic(source, target, weight_type=QuantType.QInt8)
        else:
            quantize_static(source, target, RandomBatches(spec), quant_format=QuantFormat.QDQ,
                            per_channel=True)
        shutil.move(target, path)
    return path


def _pre_processed(source: Path, target: Path) -> Path:
    """``source`` after ONNX Runtime's pre-processing (shape inference), or ``source``
    itself where that fails. Its graph optimisation is skipped: it fuses MatMul and Add
    into Gemm, which dynamic quantisation leaves in float, and the quantised graph should
    differ from the float one only by quantisation."""
    try:
        quant_pre_process(source, target, skip_optimization=True)
    except Exception as error:  # pre-processing is advice only: quantise the file as it is
        print(f"note: quantisation pre-processing of {source.name} failed "
              f"({type(error).__name__}: {error}); quantising it as it is", file=sys.stderr)
        return source
    return target


def output_steps(path: Path) -> dict[str, float]:
    """The quantisation step of each graph output that a DequantizeLinear with one scalar
    constant scale produces (a QDQ model's outputs); other outputs are left out."""
    graph = onnx.load(path, load_external_data=False).graph
    constants = {t.name: t for t in graph.initializer}
    producers = {out: node for node in graph.node for out in node.output}
    steps = {}
    for output in graph.output:
        node = producers.get(output.name)
        if node is None or node.op_type != "DequantizeLinear":
            continue
        scale = constants.get(node.input[1])
        if scale is not None and not scale.dims:
            steps[output.name] = float(numpy_helper.to_array(scale))
    return steps
