"""What a candidate kernel costs: an analytic roofline to rank and drop candidates, and
measurements of the rest, cached on disk.

The roofline is the larger of the kernel's arithmetic at the target's peak and its
traffic (every input read once, every output written once) at its memory bandwidth, plus
a launch cost (``ROOFLINES``, by the target's kind). On the CPU it only orders candidates:
a kernel it puts at or above its primitives run one by one gains nothing from fusing (it
recomputes more than it saves) and is dropped. Where the target has no device to measure
on, it is the cost itself.

Candidates are measured with their inputs in cache, as a kernel finds what the kernel
before it has just written: read cold, every kernel of a memory-bound chain looks slower
alone than it runs in the model, and a kernel that reads its input several times (a
layer norm's passes over a row) most of all. Measured costs are keyed by the kernel's
program text and the machine, so identical layers, and a second compile, measure
nothing; the kernels chosen for a part are kept beside them, keyed by the part's
primitives, so a second compile builds no candidate either. A candidate that fails to
build, crashes or times out costs nothing to skip: it is left out of the program.
"""
from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from treadle.atomic import write_json
from treadle.config import config
from treadle.graph.kernel_plan import KernelPlan
from treadle.graph.tensor import Tensor
from treadle.ir.compute import reachable
from treadle.ir.expr import as_expr
from treadle.ir.functor import evaluate, free_vars
from treadle.ir.printer import format_function
from treadle.ir.stmt import Function
from treadle.target import Target
from treadle.tune.measure import SYMBOL_SIZE, measure_functions

log = logging.getLogger(__name__)

PEAK_FLOPS = 30e9     # per core, float32 FMA-heavy code as treadle generates it
BANDWIDTH = 20e9      # bytes per second from memory, all cores
LAUNCH_S = 2e-6       # a kernel call: argument set-up and the parallel region
CUDA_LAUNCH_S = 4e-6  # a launch on a stream, back to back with the one before
FORMAT = "treadle-orchestrate-cache-3"


@dataclass(frozen=True)
class Roofline:
    flops: float  # per second, the whole target
    bandwidth: float  # bytes per second from memory
    launch_s: float


def _gpu_roofline(target: Target) -> Roofline:
    """From the datasheet hierarchy: every multiprocessor at its peak, DRAM's bandwidth."""
    memory = target.memory()
    workers = target.sms
    dram = memory.level("DRAM")
    return Roofline(memory.peak_gflops * 1e9 * workers, dram.bandwidth * 1e9 * workers,
                    CUDA_LAUNCH_S)


# Target kind -> its roofline. The CPU's numbers are what treadle's kernels reach, not the
# probed peak: they rank fused candidates against their parts.
ROOFLINES = {
    "cpu": lambda target: Roofline(PEAK_FLOPS * config.num_threads, BANDWIDTH, LAUNCH_S),
    "cuda": _gpu_roofline,
}


def estimate(plan: KernelPlan, target: Target) -> float:
    """Roofline seconds of ``plan``'s kernel on ``target`` (a view costs nothing)."""
    if plan.is_view:
        return 0.0
    flops = sum(_elements(c.shape) * _elements(c.reduce_extents)
                for op in plan.ops for c in reachable(op.definition).values())
    traffic = sum(_bytes(t) for t in (*plan.inputs, *plan.outputs))
    roof = ROOFLINES[target.kind](target)
    return roof.launch_s + max(flops / roof.flops, traffic / roof.bandwidth)


def _elements(shape: Sequence) -> float:
    total = 1.0
    for d in shape:
        d = as_expr(d)
        total *= float(evaluate(d, {v: SYMBOL_SIZE for v in free_vars(d)}))
    return total


def _bytes(t: Tensor) -> float:
    return _elements(t.shape) * t.dtype.bits / 8


class OrchestrationCache:
    """Measured seconds by kernel text, and chosen kernels by part, for this machine, in
    one file under the cache folder."""

    def __init__(self, target: Target):
        self.target = target
        self.path = Path(config.cache_dir) / "orchestrate" / "costs.json"
        self.machine = f"{target} threads={config.num_threads} size={SYMBOL_SIZE}"
        self.costs, self.parts = self._read()

    def _read(self) -> tuple[dict[str, float | None], dict[str, dict]]:
        try:
            data = json.loads(self.path.read_text())
            if data.get("format") != FORMAT or not isinstance(data.get("costs"), dict) \
                    or not isinstance(data.get("parts"), dict):
                raise ValueError("not a cache file of this version")
            costs = {k: v for k, v in data["costs"].items()
                     if v is None or isinstance(v, (int, float))}
            return costs, {k: v for k, v in data["parts"].items() if isinstance(v, dict)}
        except FileNotFoundError:
            return {}, {}
        except (OSError, ValueError) as err:
            log.warning("orchestration cache %s is unreadable (%s); measuring again",
                        self.path, err)
            return {}, {}

    def _write(self) -> None:
        write_json(self.path, {"format": FORMAT, "costs": self.costs, "parts": self.parts})

    def key(self, text: str) -> str:
        return hashlib.sha256(f"{self.machine}\n{text}".encode()).hexdigest()[:32]

    def part(self, text: str) -> dict | None:
        """The kernels stored for the part described by ``text``."""
        return self.parts.get(self.key(text))

    def store_part(self, text: str, chosen: dict) -> None:
        self.parts[self.key(text)] = chosen
        self._write()

    def measure(self, functions: Sequence[Function], labels: Sequence[str],
                progress: Callable[[int], object]) -> list[float | None]:
        """Seconds per call of each function, measuring only those not cached."""
        keys = [self.key(format_function(f)) for f in functions]
        todo = {k: f for k, f in zip(keys, functions) if k not in self.costs}
        progress(len(functions) - len(todo))
        if todo:
            label_of = dict(zip(keys, labels))
            seconds = measure_functions(list(todo.values()), target=self.target,
                                        progress=progress,
                                        labels=[label_of[k] for k in todo], cold=False)
            self.costs.update(zip(todo, seconds))
            self._write()
        return [self.costs[k] for k in keys]
