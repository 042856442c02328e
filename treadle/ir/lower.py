"""The lowering pipeline from a hand-written or scheduled program to one ready for code
generation, chosen per target (``PIPELINES``, by the target's kind).

On the CPU, order matters: task mappings become loops first, so that barrier splitting sees plain
worker loops; simplification runs over the index arithmetic both passes introduce; divisions by run-time
sizes then leave the loops they do not vary in (``hoist``);
half-precision arithmetic is widened last, so that no simplification folds its rounding casts away.
"""
from __future__ import annotations

from treadle.config import config
from treadle.dump import dump_text
from treadle.ir.passes.hoist import hoist
from treadle.ir.passes.lower_mapping import lower_mapping
from treadle.ir.passes.simplify import simplify
from treadle.ir.passes.split_barriers import split_barriers
from treadle.ir.passes.widen_half import widen_half
from treadle.ir.stmt import Function
from treadle.ir.verify import verify
from treadle.target.cpu import host

# Target kind -> its passes. A CPU worker loop runs its barriers' phases in turn
# (split_barriers); a target with hardware barriers keeps them.
# On CUDA a block's threads meet at __syncthreads(), so barriers stay.
PIPELINES = {"cpu": (lower_mapping, split_barriers, simplify, hoist, widen_half),
             "cuda": (lower_mapping, simplify)}


def lower(func: Function, target=None) -> Function:
    """Runs the pipeline of ``target`` (a CpuTarget or CudaTarget; the host CPU's by default), verifying the input and the
    result (and every step when ``TREADLE_VERIFY=1``), dumping each step under
    ``TREADLE_DUMP``."""
    pipeline = PIPELINES[(target or host()).kind]
    verify(func)
    dump_text((func.name, "ir", "00_input.txt"), str(func))
    for step, ir_pass in enumerate(pipeline, start=1):
        func = ir_pass(func)
        if config.verify:
            verify(func)
        dump_text((func.name, "ir", f"{step:02d}_{ir_pass.__name__}.txt"), str(func))
    verify(func, lowered=True)
    return func
