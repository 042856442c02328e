"""Generic traversal of IR trees: walk, rewrite, substitute, evaluate.

Children are found from dataclass fields, so a new node type needs no traversal code.
Buffers are leaves: their shapes are part of their identity and are never rewritten here.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Iterator, Mapping, Union

from treadle.ir.expr import Binary, Cast, Const, Expr, Select, Unary, Var
from treadle.ir.stmt import For, ForTask, Let, Stmt

Node = Union[Expr, Stmt]


def _is_node(value) -> bool:
    return isinstance(value, (Expr, Stmt))


@functools.lru_cache(maxsize=None)
def _fields(kind: type) -> tuple[str, ...]:
    """The names of a node type's init fields (``dataclasses.fields`` is slow per call)."""
    return tuple(f.name for f in dataclasses.fields(kind) if f.init)


def children(node: Node) -> Iterator[Node]:
    for name in _fields(type(node)):
        value = getattr(node, name)
        if _is_node(value):
            yield value
        elif isinstance(value, tuple):
            yield from (v for v in value if _is_node(v))


def walk(node: Node) -> Iterator[Node]:
    """Every node of the tree, parents before children."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(reversed(list(children(current))))


def rewrite(node: Node, fn: Callable[[Node], Node | None]) -> Node:
    """Rebuilds the tree bottom-up; ``fn`` sees each rebuilt node and returns a replacement
    or None to keep it. Unchanged subtrees are shared, not copied."""
    rebuilt = _rebuilt(node, lambda child: rewrite(child, fn))
    result = fn(rebuilt)
    return rebuilt if result is None else result


def rewrite_outermost(node: Node, fn: Callable[[Node], Node | None]) -> Node:
    """Rebuilds the tree top-down: ``fn`` sees each node before its children and returns
    a replacement, which ends the descent there, or None to go on into the children."""
    result = fn(node)
    if result is not None:
        return result
    return _rebuilt(node, lambda child: rewrite_outermost(child, fn))


def _rebuilt(node: Node, recurse: Callable[[Node], Node]) -> Node:
    """``node`` with ``recurse`` applied to each child; the same object if none changed."""
    changes = {}
    for name in _fields(type(node)):
        value = getattr(node, name)
        if _is_node(value):
            new = recurse(value)
        elif isinstance(value, tuple) and any(_is_node(v) for v in value):
            new = tuple(recurse(v) if _is_node(v) else v for v in value)
            if all(a is b for a, b in zip(new, value)):
                continue
        else:
            continue
        # Unchanged subtrees come back as the same object; comparing a rebuilt one with
        # the old would walk both (quadratic on deep trees).
        if new is not value:
            changes[name] = new
    return dataclasses.replace(node, **changes) if changes else node


def substitute(node: Node, mapping: Mapping[Var, Expr]) -> Node:
    if not mapping:
        return node
    return rewrite(node, lambda n: mapping.get(n) if isinstance(n, Var) else None)


def free_vars(node: Node) -> set[Var]:
    return {n for n in walk(node) if isinstance(n, Var)}


def bound_vars(stmt: Stmt) -> set[Var]:
    """Variables the statement binds itself: loop, task and let variables."""
    bound = set()
    for n in walk(stmt):
        if isinstance(n, (For, Let)):
            bound.add(n.var)
        elif isinstance(n, ForTask):
            bound.update(n.vars)
    return bound


def _c_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _c_mod(a: int, b: int) -> int:
    return a - _c_div(a, b) * b


def _div(a, b):
    if isinstance(a, float) or isinstance(b, float):
        return a / b
    return _c_div(a, b)


# Python meaning of each binary op on scalars, with the IR's (C's) integer division and
# numpy's min and max, where a NaN operand wins (Python's keep `a` if `b` is NaN).
SCALAR_BINARY = {
    "+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
    "/": lambda a, b: a / b, "//": _div, "%": _c_mod,
    "min": lambda a, b: b if b < a or b != b else a,
    "max": lambda a, b: b if b > a or b != b else a,
    "<": lambda a, b: a < b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b, "==": lambda a, b: a == b, "!=": lambda a, b: a != b,
    "and": lambda a, b: a and b, "or": lambda a, b: a or b,
    "&": lambda a, b: a & b, "|": lambda a, b: a | b, "^": lambda a, b: a ^ b,
    "<<": lambda a, b: a << b, ">>": lambda a, b: a >> b,
}
SCALAR_UNARY = {"neg": lambda a: -a, "not": lambda a: not a, "~": lambda a: ~a}


def evaluate(expr: Expr, env: Mapping[Var, int | float | bool] = {}) -> int | float | bool:
    """The value of a scalar expression over constants and bound variables, in Python.

    Used for shape checks and constant folding; loads and calls are not evaluable here."""
    if isinstance(expr, Const):
        return expr.value
    if isinstance(expr, Var):
        if expr not in env:
            raise KeyError(f"variable {expr.name} has no value")
        return env[expr]
    if isinstance(expr, Binary):
        return SCALAR_BINARY[expr.op](evaluate(expr.a, env), evaluate(expr.b, env))
    if isinstance(expr, Unary):
        return SCALAR_UNARY[expr.op](evaluate(expr.a, env))
    if isinstance(expr, Select):
        return evaluate(expr.then if evaluate(expr.cond, env) else expr.otherwise, env)
    if isinstance(expr, Cast):
        return Const(evaluate(expr.value, env), expr.dtype).value
    raise TypeError(f"cannot evaluate {type(expr).__name__} {expr} at compile time")
