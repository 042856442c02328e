"""Scatters and running sums at the sizes of the models that use them, against ONNX Runtime.

    python bench/scatter.py --repeat 30 --threads 2

(from the repository root with PYTHONPATH=., or with treadle installed)

Each case is one ONNX node with its indices given at run time, compiled by treadle (tune
0) and run by ONNX Runtime in the same process; medians of interleaved calls. MViTv2-Tiny's
relative-position table (614k elements scattered into 614k) is the case that ran for
minutes when every output element searched the updates.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from bench.common import compare_nodes

MVIT = (1, 1, 3136, 196)


def _model(op: str, inputs: dict[str, np.ndarray], opset: int = 18, **attrs):
    types = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.int64): TensorProto.INT64}
    node = helper.make_node(op, list(inputs), ["y"], **attrs)
    graph = helper.make_graph(
        [node], op, [helper.make_tensor_value_info(k, types[v.dtype], v.shape)
                     for k, v in inputs.items()],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=10)


def cases(gen: np.random.Generator) -> dict[str, tuple]:
    """name -> (model, feeds)."""
    size = int(np.prod(MVIT))
    flat = gen.permutation(size)
    mvit = {"data": np.zeros(MVIT, np.float32),
            "indices": np.stack(np.unravel_index(flat, MVIT), -1).astype(np.int64),
            "updates": gen.standard_normal(size).astype(np.float32)}
    rows = {"data": gen.standard_normal((30000, 256)).astype(np.float32),
            "indices": gen.integers(0, 30000, (4096, 1)).astype(np.int64),
            "updates": gen.standard_normal((4096, 256)).astype(np.float32)}
    elements = {"data": np.zeros(MVIT, np.float32),
                "indices": gen.integers(0, 196, MVIT).astype(np.int64),
                "updates": gen.standard_normal(MVIT).astype(np.float32)}
    running = {"x": gen.standard_normal((64, 4096)).astype(np.float32),
               "axis": np.array(1, np.int64)}
    return {
        "ScatterND mvit2 table (614k into 614k)": (_model("ScatterND", mvit), mvit),
        "ScatterND rows add (4096 x 256 into 30000)": (
            _model("ScatterND", rows, reduction="add"), rows),
        "ScatterElements axis 3 add (614k)": (
            _model("ScatterElements", elements, axis=3, reduction="add"), elements),
        "CumSum 64 x 4096 along 4096": (_model("CumSum", running), running),
    }


def main() -> None:
    compare_nodes(cases(np.random.default_rng(0)), __doc__.splitlines()[0])


if __name__ == "__main__":
    main()
