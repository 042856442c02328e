"""Turn barriers into loop boundaries so GPU-style worker programs run on a CPU.

A ``Barrier`` synchronises the iterations (workers) of the nearest enclosing parallel loop:
no worker passes it before every worker reaches it. On a CPU the same meaning comes from
fission: the worker loop ends at the barrier and a new worker loop starts after it.

    for w in range(n) parallel:        for w in range(n) parallel: A
      A; barrier(); B           ==>    for w in range(n) parallel: B

A serial loop or an if that contains a barrier is hoisted out of the worker loop (its
extent or condition must not depend on the worker) and the worker loop is distributed
inside it. Local buffers declared at the top of the worker body become one shared array
with a slice per worker. Other declarations cannot cross a split, with one exception: a
``let`` whose value reads no memory is recomputed in every later phase that uses it.
"""
from __future__ import annotations

from dataclasses import replace

from treadle.errors import IRError
from treadle.ir.builder import seq
from treadle.ir.expr import Buffer, Load, Var
from treadle.ir.functor import free_vars, rewrite, walk
from treadle.ir.stmt import Barrier, DeclBuffer, For, Function, If, Let, Seq, Stmt, Store


def split_barriers(func: Function) -> Function:
    def visit(node):
        if isinstance(node, For) and node.kind == "parallel" and _has_barrier(node.body):
            decls, loop = _expand_locals(node)
            return seq(decls + [_distribute(loop, [])])
        return None
    return func.with_body(rewrite(func.body, visit))


def _expand_locals(loop: For) -> tuple[list[Stmt], For]:
    """Gives each worker its own slice of a shared array for every local buffer declared
    at the top of the worker body, since such buffers live across barriers (registers of a
    GPU thread) and fission would otherwise end their lifetime at the first barrier."""
    local = [s.buffer for s in _items(loop.body)
             if isinstance(s, DeclBuffer) and s.buffer.scope == "local"]
    if not local:
        return [], loop
    expanded = {b: Buffer(b.name, b.dtype, (loop.extent, *b.shape), "shared") for b in local}

    def visit(node):
        if isinstance(node, DeclBuffer) and node.buffer in expanded:
            return Seq(())
        if isinstance(node, (Load, Store)) and node.buffer in expanded:
            return replace(node, buffer=expanded[node.buffer], indices=(loop.var, *node.indices))
        return None
    body = rewrite(loop.body, visit)
    return [DeclBuffer(b) for b in expanded.values()], replace(loop, body=body)


def _has_barrier(stmt: Stmt) -> bool:
    return any(isinstance(n, Barrier) for n in walk(stmt))


def _items(stmt: Stmt) -> list[Stmt]:
    if isinstance(stmt, Seq):
        return [i for s in stmt.stmts for i in _items(s)]
    return [stmt]


def _distribute(loop: For, inherited: list[Let]) -> Stmt:
    """The worker loop ``loop`` as a sequence of barrier-free worker loops."""
    phases: list[Stmt] = []
    current: list[Stmt] = []
    pure_lets = list(inherited)

    def close_phase():
        if current:
            phases.append(For(loop.var, loop.extent,
                              seq(_needed(pure_lets, current) + current), loop.kind))
            current.clear()

    for item in _items(loop.body):
        if isinstance(item, Barrier):
            close_phase()
        elif not _has_barrier(item):
            current.append(item)
            if isinstance(item, Let) and not _reads_memory(item):
                pure_lets.append(item)
        else:
            close_phase()
            phases.append(_hoist(item, loop, pure_lets))
    close_phase()
    _check_no_crossing(phases, loop)
    return seq(phases)


def _hoist(item: Stmt, loop: For, lets: list[Let]) -> Stmt:
    if isinstance(item, For):
        _require_uniform(item.extent, loop, f"the extent of loop {item.var.name}")
        inner = _distribute(For(loop.var, loop.extent, item.body, loop.kind), lets)
        return For(item.var, item.extent, inner, "serial")
    if isinstance(item, If):
        _require_uniform(item.cond, loop, "an if condition")
        branches = [None if b is None else _distribute(For(loop.var, loop.extent, b, loop.kind), lets)
                    for b in (item.then, item.otherwise)]
        return If(item.cond, *branches)
    raise IRError(f"a barrier inside {type(item).__name__} cannot be split out of worker "
                  f"loop {loop.var.name}:\n{item}")


def _require_uniform(expr, loop: For, what: str) -> None:
    if loop.var in free_vars(expr):
        raise IRError(f"{what} ({expr}) depends on worker {loop.var.name}, so workers "
                      f"would disagree about reaching the barrier inside it")


def _reads_memory(let: Let) -> bool:
    return any(isinstance(n, Load) for n in walk(let.value))


def _needed(lets: list[Let], stmts: list[Stmt]) -> list[Stmt]:
    """The pure lets (in declaration order) that ``stmts`` use, directly or through others."""
    declared_here = {s.var for s in stmts if isinstance(s, Let)}
    used = set().union(*(free_vars(s) for s in stmts)) - declared_here
    needed = []
    for let in reversed(lets):
        if let.var in used and let not in stmts:
            needed.append(let)
            used |= free_vars(let.value)
    return needed[::-1]


def _check_no_crossing(phases: list[Stmt], loop: For) -> None:
    declared: dict[object, int] = {}
    for index, phase in enumerate(phases):
        for node in walk(phase):
            name = _declared_name(node)
            if name is not None and name not in declared:
                declared[name] = index
            for used in _used_names(node):
                origin = declared.get(used)
                if origin is not None and origin < index and not _is_pure_let(phases[origin], used):
                    raise IRError(f"'{used}' is declared inside worker loop {loop.var.name} "
                                  "before a barrier and used after it; declare shared data "
                                  "outside the worker loop")


def _declared_name(node) -> str | None:
    if isinstance(node, Let):
        return node.var.name
    if isinstance(node, DeclBuffer):
        return node.buffer.name
    return None


def _used_names(node) -> list[str]:
    if isinstance(node, Var):
        return [node.name]
    buffer = getattr(node, "buffer", None)
    return [buffer.name] if buffer is not None and not isinstance(node, DeclBuffer) else []


def _is_pure_let(phase: Stmt, name: str) -> bool:
    return any(isinstance(n, Let) and n.var.name == name and not _reads_memory(n)
               for n in walk(phase))
