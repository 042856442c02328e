"""One kernel from several variants of a template's program and a decision tree over the
symbols: the tree as nested selects on the symbol values, giving the variant's number, in
front of the variants' bodies (DietCode's dispatcher, ``tune.dynamic``), so dispatch is a
few integer compares in the kernel's own C, and a saved model dispatches without the
tree's Python or scikit-learn.

The variants are programs of one operator, so they share their parameters: inputs,
output and the constants laid out for them (dynamic tuning keeps one layout). Each
keeps workspaces of its own, renamed apart.
"""
from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Sequence

from treadle.ir.dtypes import index_type
from treadle.ir.expr import Expr, Load, Var, const, eq, select
from treadle.ir.functor import rewrite
from treadle.ir.stmt import Accumulate, DeclBuffer, Function, If, Let, Seq, Stmt, Store
from treadle.schedule.kernel import Kernel


def dispatching_kernel(kernels: Sequence[Kernel], nodes: Sequence[tuple[int, int, int, int]],
                       symbols: Sequence[str], name: str) -> Kernel:
    """The kernel ``name`` running ``kernels[v]`` where the tree (``tune.dynamic.Tree``'s
    ``nodes`` over ``symbols``) chooses v."""
    first = kernels[0]
    shared = _shared_params(first)
    for k in kernels[1:]:
        # Equal laid-out buffers hold equal layouts (the template's layout key is shared).
        if (_shared_params(k), k.inputs, [d.buffer for d in k.derived]) != \
                (shared, first.inputs, [d.buffer for d in first.derived]):
            raise ValueError(f"{name}: the variants differ in their parameters")
    bodies, workspaces = [], []
    for v, kernel in enumerate(kernels):
        renamed = {w: replace(w, name=f"{w.name}_v{v}") for w in kernel.workspaces}
        bodies.append(_with_buffers(kernel.function.body, renamed))
        workspaces += renamed.values()
    tested = {Var(s, index_type) for s in symbols}
    params = {p for k in kernels for p in k.function.symbols} | tested
    # The tree computes the variant's number, then each variant's body appears once: a
    # tree whose leaves held the bodies would repeat a variant at every leaf choosing it.
    taken = {p.name for p in params}
    chosen = Var(next(f"variant{n}" for n in itertools.count() if f"variant{n}" not in taken),
                 index_type)
    body = bodies[-1]
    for v in reversed(range(len(bodies) - 1)):
        body = If(eq(chosen, v), bodies[v], body)
    choice = _choice(nodes, 0, [Var(s, index_type) for s in symbols])
    function = Function(name, (*shared, *workspaces, *sorted(params, key=lambda v: v.name)),
                        Seq((Let(chosen, choice), body)))
    return Kernel(function, first.inputs, tuple(workspaces), first.derived)


def _shared_params(kernel: Kernel) -> tuple:
    return tuple(b for b in kernel.function.buffers if b not in kernel.workspaces)


def _choice(nodes, k: int, symbols: list[Var]) -> Expr:
    """The tree from node ``k`` as an expression: nested selects on the symbols."""
    feature, value, left, right = nodes[k]
    if feature < 0:
        return const(value)
    return select(symbols[feature] <= value, _choice(nodes, left, symbols),
                  _choice(nodes, right, symbols))


def _with_buffers(stmt: Stmt, renamed: dict) -> Stmt:
    def rename(node):
        if isinstance(node, (Load, Store, Accumulate, DeclBuffer)) and node.buffer in renamed:
            return replace(node, buffer=renamed[node.buffer])
        return None
    return rewrite(stmt, rename) if renamed else stmt
