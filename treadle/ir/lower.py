"""The lowering pipeline from a hand-written or scheduled program to the kernels ready for
code generation, chosen per target (``SPLITS`` and ``PIPELINES``, by the target's kind).

On the CPU, order matters: task mappings become loops first, so that barrier splitting sees plain
worker loops; simplification runs over the index arithmetic both passes introduce; divisions by run-time
sizes then leave the loops they do not vary in (``hoist``), as do selects whose conditions
do not vary in the loop storing them (``unswitch``);
half-precision arithmetic is widened last, so that no simplification folds its rounding casts away.
"""
from __future__ import annotations

from treadle.config import config
from treadle.dump import dump_text
from treadle.ir.passes.hoist import hoist
from treadle.ir.passes.lower_mapping import lower_mapping
from treadle.ir.passes.simplify import simplify
from treadle.ir.passes.split_launches import split_launches
from treadle.ir.passes.split_barriers import split_barriers
from treadle.ir.passes.unswitch import unswitch
from treadle.ir.passes.widen_half import widen_half
from treadle.ir.stmt import Function
from treadle.ir.verify import verify
from treadle.target import Target

# Target kind -> how one scheduled function becomes the kernels that launch separately:
# a CUDA grid has no barrier across blocks, so each parallel step is a launch of its own.
SPLITS = {"cpu": lambda func: [func], "cuda": split_launches}

# Target kind -> its passes. A CPU worker loop runs its barriers' phases in turn
# (split_barriers); a target with hardware barriers keeps them.
# On CUDA a block's threads meet at __syncthreads(), so barriers stay.
PIPELINES = {"cpu": (lower_mapping, split_barriers, simplify, hoist, unswitch, widen_half),
             "cuda": (lower_mapping, simplify)}


def lower_kernels(func: Function, target: Target) -> list[Function]:
    """``func`` as the lowered kernels that compute it on ``target``, in launch order."""
    return [lower(kernel, target) for kernel in SPLITS[target.kind](func)]


def lower(func: Function, target: Target) -> Function:
    """Runs the pipeline of ``target``, verifying the input and the result (and every step
    when ``TREADLE_VERIFY=1``), dumping each step under ``TREADLE_DUMP``."""
    pipeline = PIPELINES[target.kind]
    verify(func)
    dump_text((func.name, "ir", "00_input.txt"), str(func))
    for step, ir_pass in enumerate(pipeline, start=1):
        func = ir_pass(func)
        if config.verify:
            verify(func)
        dump_text((func.name, "ir", f"{step:02d}_{ir_pass.__name__}.txt"), str(func))
    verify(func, lowered=True)
    return func
