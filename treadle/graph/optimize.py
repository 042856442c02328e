"""The graph pass pipeline, dumped step by step under TREADLE_DUMP (graph/NN_<pass>.txt).

Order: canonical forms first (Gemm becomes MatMul with a constant transposed weight,
BatchNorm folds into convolution weights), quantised products become products of raw
bytes (before folding dequantises their weights) and recurrent layers' input projections
move out of their loops over time, then constant folding computes those new constants;
pointwise convolutions of enlarged images move before the enlarging (on the folded
weights) and those of a dense layer's tokens fold into it, then dead-code
elimination drops what folding and moving made unused; the channels-last layout, so that
it transposes the folded weights, and Winograd convolutions, which need that layout, last.

Folding computes large constants with ``run``, which the driver hands in (this layer never
compiles); without it, only what numpy evaluation of the definitions computes
quickly is folded (see ``fold_constants``).
"""
from __future__ import annotations

from typing import Optional

from treadle.dump import dump_text
from treadle.graph.graph import Graph
from treadle.graph.passes.canonicalize import canonicalize
from treadle.graph.passes.channels_last import channels_last
from treadle.graph.passes.eliminate_dead_code import eliminate_dead_code
from treadle.graph.passes.fold_constants import Run, fold_constants
from treadle.graph.passes.fold_linear import fold_linear
from treadle.graph.passes.hoist_input_projection import hoist_input_projection
from treadle.graph.passes.integer_products import integer_products
from treadle.graph.passes.resize_conv import resize_conv
from treadle.graph.passes.winograd import winograd

PIPELINE = (canonicalize, integer_products, hoist_input_projection, fold_constants, resize_conv, fold_linear,
            eliminate_dead_code, channels_last)
# Target kind -> its pipeline: Winograd convolutions exist on the CPU only (a template of
# its own there).
PIPELINES = {"cpu": PIPELINE + (winograd,), "cuda": PIPELINE}


def optimize(graph: Graph, target_kind: str = "cpu", run: Optional[Run] = None) -> Graph:
    dump_text(("graph", "00_input.txt"), str(graph))
    for step, graph_pass in enumerate(PIPELINES[target_kind], start=1):
        if graph_pass is fold_constants:  # the one pass that takes the runner
            graph = fold_constants(graph, run)
        else:
            graph = graph_pass(graph)
        dump_text(("graph", f"{step:02d}_{graph_pass.__name__}.txt"), str(graph))
    return graph
