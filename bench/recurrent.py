"""Recurrent layers (ONNX LSTM, GRU, RNN) at the sizes of speech and time-series models,
against ONNX Runtime.

    python bench/recurrent.py --repeat 30 --threads 2

(from the repository root with PYTHONPATH=., or with treadle installed)

Each case is one ONNX node with its weights as initializers and the sequence given at run
time, compiled by treadle (tune 0) and run by ONNX Runtime in the same process; medians
of interleaved calls.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from bench.common import compare_nodes

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
# name -> (op, sequence, batch, input size, hidden size, direction)
CASES = {
    "LSTM 64 x 8, 128 -> 256": ("LSTM", 64, 8, 128, 256, "forward"),
    "LSTM bidirectional 32 x 4, 64 -> 128": ("LSTM", 32, 4, 64, 128, "bidirectional"),
    "LSTM 100 x 1, 40 -> 512 (one utterance)": ("LSTM", 100, 1, 40, 512, "forward"),
    "GRU 64 x 8, 128 -> 256": ("GRU", 64, 8, 128, 256, "forward"),
    "RNN 64 x 8, 128 -> 256": ("RNN", 64, 8, 128, 256, "forward"),
}


def layer(op: str, seq: int, batch: int, inputs: int, hidden: int, direction: str,
          gen: np.random.Generator):
    """The node's model and its feeds."""
    directions = 2 if direction == "bidirectional" else 1
    rows = GATES[op] * hidden
    scale = 1 / np.sqrt(hidden)
    weights = {"W": gen.uniform(-scale, scale, (directions, rows, inputs)),
               "R": gen.uniform(-scale, scale, (directions, rows, hidden)),
               "B": gen.uniform(-scale, scale, (directions, 2 * rows))}
    node = helper.make_node(op, ["X", "W", "R", "B"], ["Y", "Y_h"], hidden_size=hidden,
                            direction=direction)
    graph = helper.make_graph(
        [node], op, [helper.make_tensor_value_info("X", TensorProto.FLOAT, [seq, batch, inputs])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("Y", "Y_h")],
        [numpy_helper.from_array(w.astype(np.float32), k) for k, w in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    return model, {"X": gen.standard_normal((seq, batch, inputs)).astype(np.float32)}


def main() -> None:
    gen = np.random.default_rng(0)
    compare_nodes({name: layer(*spec, gen) for name, spec in CASES.items()},
                  __doc__.splitlines()[0], atol=1e-5)


if __name__ == "__main__":
    main()
