"""What schedules, the tuner and the kernel layer know of the hardware they make code for.

Two kinds of target implement ``Target``: the host CPU (``target.cpu``) and NVIDIA GPUs
(``target.cuda``). Code above this package is written against the protocol; where a kind
needs code of its own (templates, a lowering pipeline, a compiler, a timer), the layer that
owns that code keeps a table keyed by ``kind``, so a new target adds entries instead of
branches. Only the public entry points choose a target (``host()`` by default).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Protocol

if TYPE_CHECKING:
    from treadle.target.memory import MemoryHierarchy


class Target(Protocol):
    kind: ClassVar[str]  # "cpu" or "cuda": the key of every per-target table

    @property
    def compiler_flags(self) -> tuple[str, ...]:
        """Flags of the compiler that builds this target's code (gcc's -m..., nvcc's -arch)."""
        ...

    def memory(self) -> MemoryHierarchy:
        """The memory levels, closest first, with capacity, latency and bandwidth, and the
        peak multiply-add rate of one worker (a core, a streaming multiprocessor)."""
        ...
