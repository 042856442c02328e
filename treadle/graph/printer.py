"""Readable text for graphs: one line per operator with output shapes."""
from __future__ import annotations

from treadle.graph.tensor import Tensor


def format_tensor(t: Tensor) -> str:
    return f"{t.name}: {t.dtype}[{', '.join(map(str, t.shape))}]"


def format_graph(graph) -> str:
    lines = [f"graph {graph.name}(" + ", ".join(format_tensor(t) for t in graph.inputs) + "):"]
    for node in graph.nodes:
        ins = ", ".join("-" if t is None else (f"const {t.name}" if t.is_constant else t.name)
                        for t in node.inputs)
        outs = ", ".join(format_tensor(t) for t in node.outputs)
        attrs = "".join(f" {k}={v!r}" for k, v in sorted(node.attrs.items()))
        lines.append(f"  {outs} = {node.op_type}[{node.name}]({ins}){attrs}")
    lines.append("  return " + ", ".join(t.name for t in graph.outputs))
    return "\n".join(lines)
