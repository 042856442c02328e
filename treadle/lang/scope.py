"""The names a kernel's body sees.

Names assigned in the body are scoped by block, as in C: a loop or ``if`` body opens a
block, and what it assigns is gone after it (a variable set in both branches of an ``if``
is assigned before it). Other names are looked up, once, in the function's closure, then
its module's globals, then a few builtins; their values are compile-time constants.
"""
from __future__ import annotations

import builtins
from dataclasses import dataclass
from typing import Any, Mapping

from treadle.ir.expr import Buffer

# Builtins a kernel may use; the others (print, open ...) would run once, while parsing.
BUILTINS = ("range", "min", "max", "abs", "float", "int", "bool", "len", "tuple", "list",
            "zip", "enumerate", "reversed", "isinstance", "sum", "divmod", "all", "any")


@dataclass(frozen=True)
class Mutable:
    """A variable assigned more than once: a rank-0 local buffer, read as ``buffer[()]``."""
    buffer: Buffer


class Missing(LookupError):
    """A name no block, closure, global or allowed builtin defines."""

    def __init__(self, name: str, assigned_at: int | None):
        super().__init__(name)
        self.name = name
        self.assigned_at = assigned_at  # the line of an assignment whose block has ended


def outer_names(fn) -> dict[str, Any]:
    """The names a function sees outside its own body: closure cells over globals over
    the allowed builtins."""
    names = {n: getattr(builtins, n) for n in BUILTINS}
    names.update(fn.__globals__)
    for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
        try:
            names[name] = cell.cell_contents
        except ValueError:  # a closure variable not yet assigned
            names.pop(name, None)
    return names


class Scope:
    def __init__(self, outer: Mapping[str, Any]):
        self.outer = outer
        self.blocks: list[dict[str, Any]] = []
        self.lines: list[dict[str, int]] = []  # per block: name -> line assigned
        self.ended: dict[str, int] = {}        # names whose block ended -> line assigned

    def push(self, bindings: Mapping[str, Any] | None = None, line: int = 0) -> None:
        self.blocks.append(dict(bindings or {}))
        self.lines.append({name: line for name in bindings or {}})

    def pop(self) -> None:
        self.blocks.pop()
        self.ended.update(self.lines.pop())

    def local(self, name: str) -> tuple[bool, Any]:
        """(found, value) among the blocks, innermost first."""
        for block in reversed(self.blocks):
            if name in block:
                return True, block[name]
        return False, None

    def declare(self, name: str, value: Any, line: int) -> None:
        self.blocks[-1][name] = value
        self.lines[-1][name] = line

    def lookup(self, name: str) -> Any:
        found, value = self.local(name)
        if found:
            return value
        if name in self.ended:
            raise Missing(name, self.ended[name])
        if name not in self.outer:
            raise Missing(name, None)
        return self.outer[name]
