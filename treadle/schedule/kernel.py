"""What a schedule produces: a tensor program and how its parameters map onto the
operator it computes."""
from __future__ import annotations

from dataclasses import dataclass

from treadle.ir.compute import Compute
from treadle.ir.expr import Buffer
from treadle.ir.stmt import Function


@dataclass(frozen=True)
class Kernel:
    """A scheduled tensor program and how its buffer parameters relate to the operator:
    the operator inputs at indices ``inputs``, then every operator output in order, then
    the buffers of ``derived``, then ``workspaces``, scratch buffers the caller allocates.

    ``derived`` are constants the schedule reads in a layout of its own (the GEMM
    template's weight panels): computes over operator inputs that are constants, which
    the compiler tabulates once (``ir.tabulate``).

    ``apart`` is the same schedule with every workspace its own buffer, where this one
    keeps one in an output (``_written_in_place``): epilogues, which fusion applies at
    each store of an output, take that one."""
    function: Function
    inputs: tuple[int, ...]
    workspaces: tuple[Buffer, ...]
    derived: tuple[Compute, ...] = ()
    apart: "Kernel | None" = None

    @property
    def for_epilogues(self) -> "Kernel":
        return self.apart or self
