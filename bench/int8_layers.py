"""Layer by layer agreement of a quantised (QDQ) model with ONNX Runtime.

    python bench/int8_layers.py bench/out/resnet50-int8.onnx

A whole quantised network cannot agree with ONNX Runtime element for element: a value
that lands on the other side of a rounding midpoint in one layer (float32 sums in another
order, a scale product rounded otherwise) moves every value that depends on it, and over
fifty layers most outputs move by a step or more. ONNX Runtime's own optimised and
unoptimised runs of the same file differ so. This script checks what can agree: each
convolution and matrix product from its quantised input to its quantised output, cut out
of the model (onnx.utils.extract_model) and fed the values ONNX Runtime computed for that
input, run by treadle and by ONNX Runtime without graph optimisations (the QDQ graph as
ONNX defines it). It prints, per layer and in all, the share of output bytes that are
equal and that are within one quantisation step.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import utils

import treadle

PRODUCTS = ("Conv", "MatMul", "Gemm")


def layers(model: onnx.ModelProto) -> list[tuple[str, str, str]]:
    """(name, quantised input, quantised output) of each product whose input is a
    DequantizeLinear and whose result reaches a QuantizeLinear through one reader each."""
    producer = {o: n for n in model.graph.node for o in n.output}
    readers: dict[str, list] = {}
    for node in model.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    found = []
    for node in model.graph.node:
        source = producer.get(node.input[0]) if node.op_type in PRODUCTS else None
        if source is None or source.op_type != "DequantizeLinear":
            continue
        tensor = node.output[0]
        while len(readers.get(tensor, [])) == 1 and readers[tensor][0].op_type != \
                "QuantizeLinear":
            tensor = readers[tensor][0].output[0]
        after = readers.get(tensor, [])
        if len(after) == 1 and after[0].op_type == "QuantizeLinear":
            found.append((node.name, source.input[0], after[0].output[0]))
    return found


def reference_values(path: Path, names: list[str], feeds: dict) -> dict[str, np.ndarray]:
    """ONNX Runtime's values of the named tensors, unoptimised, from the model's inputs."""
    model = onnx.load(str(path))
    known = {o.name for o in model.graph.output}
    model.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names if n not in known)
    session = _session(model.SerializeToString())
    outputs = [o.name for o in session.get_outputs()]
    return dict(zip(outputs, session.run(None, feeds)))


def _session(model) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def compare_layer(path: Path, layer: tuple[str, str, str], value: np.ndarray,
                  folder: Path) -> tuple[float, float, int]:
    """(share equal, share within one step, elements) of one layer's quantised output."""
    name, source, target = layer
    cut = folder / "layer.onnx"
    utils.extract_model(str(path), str(cut), [source], [target])
    want = _session(str(cut)).run(None, {source: value})[0].astype(np.int64)
    got = treadle.compile(str(cut))(value)[0].astype(np.int64)
    difference = np.abs(got - want)
    return float(np.mean(difference == 0)), float(np.mean(difference <= 1)), difference.size


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path, help="a QDQ model (bench/quantize.py makes them)")
    args = parser.parse_args(argv)
    model = onnx.load(str(args.model))
    found = layers(model)
    rng = np.random.default_rng(0)
    feeds = {i.name: rng.standard_normal([d.dim_value or 1 for d in
                                          i.type.tensor_type.shape.dim]).astype(np.float32)
             for i in model.graph.input}
    values = reference_values(args.model, [source for _, source, _ in found], feeds)
    totals = np.zeros(3)
    print(f"{'layer':<50}{'equal':>10}{'<= 1 step':>11}")
    with tempfile.TemporaryDirectory() as folder:
        for layer in found:
            equal, close, size = compare_layer(args.model, layer, values[layer[1]], Path(folder))
            totals += (equal * size, close * size, size)
            print(f"{layer[0][-50:]:<50}{equal:>10.4f}{close:>11.4f}", flush=True)
    print(f"{len(found)} layers, {int(totals[2])} output bytes: {totals[0] / totals[2]:.4f} "
          f"equal, {totals[1] / totals[2]:.5f} within one step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
