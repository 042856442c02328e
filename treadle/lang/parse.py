"""Python syntax to tensor programs: the parser behind ``@treadle.lang.kernel``.

A kernel's body never runs. Its syntax tree is walked with a ``FunctionBuilder`` active,
and every expression evaluates either to a compile-time Python value (an int, a float, a
tuple, a task mapping, a buffer, a function) or to a run-time IR expression. Operators
apply to both as Python applies them (IR expressions overload them), so arithmetic on
closure constants folds while parsing and arithmetic on loop variables becomes IR. Where
Python would need a run-time truth value (``if``, ``and``, ``x if c else y``, ``min``), a
compile-time operand keeps Python's meaning and a run-time one takes the IR's: an ``if``
on a constant keeps one branch, on a run-time condition becomes an If.

Statements and what they become:

    x = e            a name not assigned again in the rest of its block: a compile-time e
                     (or a constant or a variable) is bound as it is, a run-time one becomes a
                     let; a name assigned again (``x = ...``, ``x += ...``) or annotated
                     (``x: f32 = e``): a mutable scalar (a rank-0 local buffer)
    b = buffer(...)  a local or shared buffer named b
    t[i, j] = e      a store; ``t[i, j] += e`` a load and a store
    for ...          range / parallel / unroll / vectorize: a loop; static_range: a copy of
                     the body per value; ``mapping.on(w)``: a task-mapping loop
    if / else        an If (with else) on a run-time condition
    assert c, "m"    a run-time check failing the kernel with a KernelError, or a
                     compile-time one failing the parse
    f(...)           any call runs while parsing: ``barrier()`` emits a barrier, an
                     ``@inline`` helper is parsed into the kernel in its place

Anything else (``while``, ``try``, ``lambda``, comprehensions ...) is a LangError naming
the file and line.
"""
from __future__ import annotations

import ast
import functools
import inspect
import operator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from treadle import lang
from treadle.errors import LangError, TreadleError
from treadle.ir import dtypes
from treadle.ir.builder import FunctionBuilder
from treadle.ir.expr import (Binary, Buffer, Const, Expr, Load, Unary, Var, as_expr, call, eq,
                             ne, select)
from treadle.ir.interval import Interval, bound
from treadle.ir.mapping import TaskMapping
from treadle.ir.stmt import Function
from treadle.lang.intrinsics import BUILTIN_CALLS, BufferDecl, LoopRange, StaticRange, cast
from treadle.lang.scope import Missing, Mutable, Scope, outer_names
from treadle.lang.source import Source
from treadle.lang.types import Param, ScalarType, TensorType, as_dtype


@dataclass(frozen=True)
class _TaskLoop:
    mapping: TaskMapping
    worker: Expr


class InlineFunction:
    """``@lang.inline``: a helper whose body is parsed into each kernel that calls it,
    its parameters bound to the values passed (a buffer passed in is stored through). It
    may end with ``return value``; it cannot be called outside a kernel."""

    def __init__(self, fn):
        self.fn = fn
        self.source = Source.of(fn)
        self.signature = inspect.signature(fn)
        functools.update_wrapper(self, fn)

    def __call__(self, *args, **kwargs):
        raise LangError(f"{self.fn.__qualname__} is an @inline helper: call it from inside a "
                        "@lang.kernel function")

    def expand(self, caller: Parser, args: Sequence, kwargs: Mapping) -> Any:
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        parser = Parser(caller.fb, self.source, outer_names(self.fn), caller.symbols,
                        caller.inlining + (self,))
        return parser.run(bound.arguments, returns=True)


def parse_kernel(fn) -> tuple[Function, tuple[Param, ...]]:
    """The tensor program of ``fn``'s source and its parameters."""
    source = Source.of(fn)
    outer = outer_names(fn)
    with FunctionBuilder(fn.__name__) as fb:
        params = _params(fb, Parser(fb, source, outer, None), fn.__annotations__)
        symbols = frozenset(p for p in fb.params if isinstance(p, Var))
        Parser(fb, source, outer, symbols).run({p.name: p.ir for p in params})
    return fb.function, params


def _params(fb: FunctionBuilder, annotations: Parser, evaluated: Mapping[str, Any]
            ) -> tuple[Param, ...]:
    """Declares the parameters: buffers and scalars in order, then the size symbols. An
    annotation Python has evaluated is taken as it is (a name used only there is no
    closure variable); one kept as a string (``from __future__ import annotations``) is
    evaluated here."""
    tree = annotations.source.tree
    args = tree.args
    if args.vararg or args.kwarg or args.kwonlyargs or args.posonlyargs or args.defaults:
        raise annotations.source.error(tree, "kernel parameters are plain annotated names: "
                                       "no *args, **kwargs, keyword-only parameters or "
                                       "defaults")
    params = []
    for arg in args.args:
        if arg.annotation is None:
            raise annotations.source.error(arg, f"parameter {arg.arg!r} needs a type: a dtype "
                                           "such as f32 for a scalar, f32[M, N] for a tensor")
        kind = evaluated.get(arg.arg)
        if kind is None or isinstance(kind, str):
            kind = annotations.expr(arg.annotation)
        with annotations.at(arg):
            if isinstance(kind, TensorType):
                ir = fb.param(arg.arg, kind.dtype, kind.shape)
            elif isinstance(kind, ScalarType) and not kind.dtype.is_vector:
                ir = fb.symbol(arg.arg, kind.dtype)
            else:
                raise TypeError(f"parameter {arg.arg!r} is annotated with {kind!r}, which is not "
                                "a treadle.lang parameter type (f32, f32[M, N] ...)")
        params.append(Param(arg.arg, kind, ir))
    with annotations.at(tree):
        for p in params:
            for symbol in (p.type.symbols if p.is_tensor else ()):
                if symbol not in fb.params:
                    fb.add_param(symbol)
    return tuple(params)


def _assigned_names(target: ast.AST) -> Iterator[str]:
    if isinstance(target, ast.Name):
        yield target.id
    elif isinstance(target, (ast.Tuple, ast.List)):
        for t in target.elts:
            yield from _assigned_names(t)


def _assigns(stmts: Sequence[ast.stmt], name: str) -> bool:
    """Whether any of the statements, or any nested in them, assigns ``name``."""
    for node in (n for s in stmts for n in ast.walk(s)):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        if any(name in _assigned_names(t) for t in targets):
            return True
    return False


def _is_integer(value) -> bool:
    if isinstance(value, Expr):
        return value.dtype.is_integer and not value.dtype.is_vector
    return isinstance(value, int) and not isinstance(value, bool)


# How deep @inline helpers may call one another: each expansion takes a few dozen Python
# frames, and a recursion that no compile-time condition ends must stop with a LangError
# well before Python's own limit.
MAX_INLINE_DEPTH = 16


class Parser:
    """Parses one function's body (a kernel's, or an inline helper's where it is called)
    into the active builder. ``symbols``: the parameters a name may refer to from outside
    the body (size symbols, scalars); None while evaluating annotations, which declare them.
    ``inlining``: the helpers being expanded around this body, outermost first."""

    def __init__(self, fb: FunctionBuilder, source: Source, outer: Mapping[str, Any],
                 symbols: frozenset[Var] | None, inlining: tuple[InlineFunction, ...] = ()):
        self.fb = fb
        self.source = source
        self.scope = Scope(outer)
        self.symbols = symbols
        self.inlining = inlining
        # The statement being parsed in each enclosing block, and that block's statements.
        self.current: list[tuple[Sequence[ast.stmt], int]] = []
        # What the enclosing range loops' indices run over, and how many run-time ifs
        # enclose the statement: a store outside any if must stay inside its tensor.
        self.ranges: dict[Var, Interval] = {}
        self.guards = 0

    def run(self, bindings: Mapping[str, Any], returns: bool = False) -> Any:
        """Parses the body with ``bindings`` for its parameters; with ``returns``, a final
        ``return value`` gives the result."""
        body = self.source.tree.body
        final = body[-1] if returns and body and isinstance(body[-1], ast.Return) else None
        self.scope.push(bindings, self.source.line_of(self.source.tree))
        self.statements(body[:-1] if final else body)
        result = None if final is None or final.value is None else self.expr(final.value)
        self.scope.pop()
        return result

    # ---- errors ----------------------------------------------------------------------------
    @contextmanager
    def at(self, node: ast.AST) -> Iterator[None]:
        """Errors raised inside become LangErrors at ``node``'s line."""
        try:
            yield
        except LangError:
            raise
        except (TypeError, ValueError, ArithmeticError, LookupError, AttributeError,
                TreadleError) as err:
            plain = isinstance(err, (TypeError, ValueError, TreadleError))
            message = str(err) if plain else f"{type(err).__name__}: {err}"
            raise self.source.error(node, message) from err

    def error(self, node: ast.AST, message: str) -> LangError:
        return self.source.error(node, message)

    def unsupported(self, node: ast.AST) -> LangError:
        what = UNSUPPORTED.get(type(node), type(node).__name__)
        return self.error(node, f"unsupported syntax in a treadle.lang kernel: {what}")

    # ---- statements ------------------------------------------------------------------------
    def stmt(self, node: ast.stmt) -> None:
        handler = STATEMENTS.get(type(node))
        if handler is None:
            raise self.unsupported(node)
        with self.at(node):
            handler(self, node)

    def block(self, stmts: Sequence[ast.stmt], bindings: Mapping[str, Any], node: ast.AST
              ) -> None:
        self.scope.push(bindings, self.source.line_of(node))
        self.statements(stmts)
        self.scope.pop()

    def statements(self, stmts: Sequence[ast.stmt]) -> None:
        for k, s in enumerate(stmts):
            self.current.append((stmts, k))
            self.stmt(s)
            self.current.pop()

    def assigned_later(self, name: str) -> bool:
        """Whether the statements after the current one in its block assign ``name``: then
        a name assigned now is a variable, else a constant or a let."""
        stmts, k = self.current[-1]
        return _assigns(stmts[k + 1:], name)

    def _assign(self, node: ast.Assign) -> None:
        value = self.expr(node.value)
        for target in node.targets:
            self.assign(target, value)

    def assign(self, target: ast.AST, value: Any) -> None:
        if isinstance(target, ast.Name):
            self.assign_name(target, value)
        elif isinstance(target, ast.Subscript):
            buffer, indices = self.element(target)
            if not self.guards:
                self.check_inside(target, buffer, indices)
            self.fb.store(buffer, indices, value)
        elif isinstance(target, (ast.Tuple, ast.List)):
            if not isinstance(value, (tuple, list)) or len(value) != len(target.elts):
                raise self.error(target, f"cannot unpack {value!r} into {len(target.elts)} "
                                 "names: only tuples known when compiling unpack")
            for t, v in zip(target.elts, value):
                self.assign(t, v)
        else:
            raise self.unsupported(target)

    def assign_name(self, target: ast.Name, value: Any) -> None:
        name, line = target.id, self.source.line_of(target)
        found, current = self.scope.local(name)
        if isinstance(current, Mutable):
            self.fb.store(current.buffer, (), value)
            return
        if found:
            raise self.error(target, f"cannot assign to {name!r}: parameters and loop "
                             "variables are read-only")
        if isinstance(value, BufferDecl):
            if self.assigned_later(name):
                raise self.error(target, f"buffer {name!r} is assigned again later")
            value = self.fb.buffer(name, value.dtype, value.shape, value.scope)
        elif self.assigned_later(name):
            value = self.declare_mutable(target, value)
        elif isinstance(value, Expr) and not isinstance(value, (Const, Var)):
            value = self.fb.let(name, value)  # a constant or a variable needs no copy
        self.scope.declare(name, value, line)

    def declare_mutable(self, target: ast.Name, value: Any, dtype=None) -> Mutable:
        if not isinstance(value, (int, float, Expr)):
            raise self.error(target, f"{target.id!r} is assigned again later, so it is a "
                             f"run-time variable, which cannot hold {value!r}")
        if dtype is not None:
            value = cast(value, dtype)
        dtype = as_expr(value).dtype if dtype is None else dtype
        return Mutable(self.fb.scalar(target.id, dtype, value))

    def _annotated(self, node: ast.AnnAssign) -> None:
        if not isinstance(node.target, ast.Name):
            raise self.unsupported(node)
        if self.scope.local(node.target.id)[0]:
            raise self.error(node, f"{node.target.id!r} is already defined")
        dtype = as_dtype(self.expr(node.annotation))
        init = None if node.value is None else self.expr(node.value)
        variable = (self.declare_mutable(node.target, init, dtype) if init is not None
                    else Mutable(self.fb.scalar(node.target.id, dtype)))
        self.scope.declare(node.target.id, variable, self.source.line_of(node))

    def _augmented(self, node: ast.AugAssign) -> None:
        op = BINARY.get(type(node.op))
        if op is None:
            raise self.unsupported(node.op)
        value = self.expr(node.value)
        target = node.target
        if isinstance(target, ast.Subscript):
            buffer, indices = self.element(target)
            self.fb.store(buffer, indices, op(buffer[indices], value))
        elif isinstance(target, ast.Name):
            found, current = self.scope.local(target.id)
            if not found:
                raise self.name_error(target, self.missing(target.id))
            if not isinstance(current, Mutable):
                raise self.error(target, f"cannot assign to {target.id!r}: parameters and "
                                 "loop variables are read-only")
            self.fb.store(current.buffer, (), op(current.buffer[()], value))
        else:
            raise self.unsupported(target)

    def _for(self, node: ast.For) -> None:
        if node.orelse:
            raise self.error(node, "unsupported syntax in a treadle.lang kernel: for ... else")
        loop = self.iteration(node.iter)
        if isinstance(loop, LoopRange):
            self.range_loop(node, loop)
        elif isinstance(loop, StaticRange):
            for value in loop.values:
                self.block(node.body, self.targets(node.target, value), node)
        elif isinstance(loop, _TaskLoop):
            self.task_loop(node, loop)
        else:
            raise self.error(node.iter, f"cannot loop over {loop!r}: loop over range(...), "
                             "parallel(...), unroll(...), vectorize(...), static_range(...) "
                             "or mapping.on(worker)")

    def iteration(self, node: ast.expr) -> Any:
        """What a for loop iterates: ``mapping.on(w)`` is caught before the builder's own
        ``on`` runs, so the task variables can take the loop's names."""
        if isinstance(node, ast.Call):
            func = self.expr(node.func)
            if getattr(func, "__func__", None) is TaskMapping.on:
                args, kwargs = self.arguments(node)
                with self.at(node):
                    worker = inspect.signature(TaskMapping.on).bind(func.__self__, *args,
                                                                   **kwargs).arguments["worker"]
                    return _TaskLoop(func.__self__, as_expr(worker))
            with self.at(node):
                return self.call(node, func)
        return self.expr(node)

    def range_loop(self, node: ast.For, loop: LoopRange) -> None:
        if not isinstance(node.target, ast.Name):
            raise self.error(node.target, "a range loop binds one name")
        name = node.target.id
        extent = loop.extent
        if not _is_integer(extent) or not _is_integer(loop.start):
            raise self.error(node.iter, f"loop bounds must be integers, got "
                             f"{loop.start} to {loop.stop}")
        steps = self.fb.range(extent, loop.kind, name)
        var = next(steps)
        offset = var if loop.step == 1 else var * loop.step
        plain = isinstance(loop.start, int) and loop.start == 0
        index = offset if plain and loop.step == 1 else self.fb.let(name, loop.start + offset)
        self.ranges[var] = Interval(0, extent - 1 if isinstance(extent, int) else None)
        if index is not offset:
            self.ranges[index] = bound(loop.start + offset, self.ranges)
        self.block(node.body, {name: index}, node)
        next(steps, None)

    def task_loop(self, node: ast.For, loop: _TaskLoop) -> None:
        rank = len(loop.mapping.task_shape)
        target = node.target
        elements = target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]
        if len(elements) != rank or not all(isinstance(e, ast.Name) for e in elements):
            raise self.error(target, f"task mapping {loop.mapping} has {rank} task "
                             f"dimension(s): loop over it with {rank} name(s)")
        names = [e.id for e in elements]
        steps = self.fb.for_task(loop.mapping, loop.worker, names)
        task = next(steps)
        self.block(node.body, dict(zip(names, task)), node)
        next(steps, None)

    def targets(self, target: ast.AST, value: Any) -> dict[str, Any]:
        """A static loop's names bound to one compile-time value."""
        if isinstance(target, ast.Name):
            return {target.id: value}
        if isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (tuple, list)) \
                and len(value) == len(target.elts):
            return {k: v for t, item in zip(target.elts, value)
                    for k, v in self.targets(t, item).items()}
        raise self.error(target, f"cannot unpack {value!r} into this loop's names")

    def _if(self, node: ast.If) -> None:
        cond = self.expr(node.test)
        if not isinstance(cond, Expr):
            chosen = node.body if cond else node.orelse
            if chosen:
                self.block(chosen, {}, node)
            return
        if cond.dtype != dtypes.boolean:
            raise self.error(node.test, f"an if condition must be a bool (a comparison), got "
                             f"the {cond.dtype} expression {cond}")
        self.guards += 1
        with self.fb.if_(cond):
            self.block(node.body, {}, node)
        if node.orelse:
            with self.fb.else_():
                self.block(node.orelse, {}, node)
        self.guards -= 1

    def _expression(self, node: ast.Expr) -> None:
        if isinstance(self.expr(node.value), Expr):
            raise self.error(node, "the value of this expression is not used: store it or "
                             "assign it to a name")

    def _assert(self, node: ast.Assert) -> None:
        cond = self.expr(node.test)
        message = ast.unparse(node.test) if node.msg is None else self.expr(node.msg)
        if not isinstance(cond, Expr):
            if not cond:
                raise self.error(node, f"assertion failed: {message}")
            return
        where = f"{self.source.path}:{self.source.line_of(node)}"
        self.fb.assert_(cond, f"{where}: assertion failed: {message}")

    # ---- expressions -----------------------------------------------------------------------
    def expr(self, node: ast.expr) -> Any:
        handler = EXPRESSIONS.get(type(node))
        if handler is None:
            raise self.unsupported(node)
        with self.at(node):
            value = handler(self, node)
        if isinstance(value, Load) and len(value.indices) != value.buffer.rank:
            raise self.error(node, self.rank_message(value.buffer, len(value.indices)))
        return value

    def elements(self, nodes: Sequence[ast.expr]) -> list:
        values = []
        for n in nodes:
            if isinstance(n, ast.Starred):
                values.extend(self.expr(n.value))
            else:
                values.append(self.expr(n))
        return values

    def missing(self, name: str) -> Missing:
        try:
            self.scope.lookup(name)
        except Missing as err:
            return err
        return Missing(name, None)

    def name_error(self, node: ast.AST, err: Missing) -> LangError:
        if err.assigned_at is not None:
            return self.error(node, f"{err.name!r} is not defined here: it was assigned in a "
                              f"block that has ended (line {err.assigned_at}); kernel variables "
                              "are block-scoped as in C, so assign it before that block")
        return self.error(node, f"unknown name {err.name!r}")

    def _name(self, node: ast.Name) -> Any:
        try:
            value = self.scope.lookup(node.id)
        except Missing as err:
            raise self.name_error(node, err) from None
        if isinstance(value, Mutable):
            return value.buffer[()]
        if isinstance(value, Var) and self.symbols is not None and value not in self.symbols \
                and not self.scope.local(node.id)[0]:
            raise self.error(node, f"{node.id!r} is the symbol {value.name}, which is not a "
                             "parameter: size symbols must appear in a parameter's shape")
        return value

    def element(self, node: ast.Subscript) -> tuple[Buffer, tuple]:
        buffer = self.expr(node.value)
        if not isinstance(buffer, Buffer):
            raise self.error(node, f"only tensors and buffers have elements to assign, not "
                             f"{buffer!r}")
        return buffer, self.indices(buffer, node)

    def indices(self, buffer: Buffer, node: ast.Subscript) -> tuple:
        index = self.expr(node.slice)
        items = index if isinstance(index, tuple) else (index,)
        if len(items) != buffer.rank:
            raise self.error(node, self.rank_message(buffer, len(items)))
        for item in items:
            if not _is_integer(item):
                raise self.error(node, f"index {item!r} of {buffer.name} is not an integer")
        return items

    def check_inside(self, node: ast.Subscript, buffer: Buffer, indices: tuple) -> None:
        """Refuses a store that some iteration of the enclosing loops would make outside a
        static dimension of its tensor (in C, a write past the array)."""
        for axis, (index, extent) in enumerate(zip(indices, buffer.shape)):
            if not isinstance(extent, Const) or not isinstance(index, Expr | int):
                continue
            reach = bound(as_expr(index), self.ranges)
            if (reach.hi is not None and reach.hi >= extent.value) or \
                    (reach.lo is not None and reach.lo < 0):
                raise self.error(node, f"index {axis} of {buffer.name} runs over "
                                       f"{reach.lo}..{reach.hi}, outside its extent "
                                       f"{extent.value}")

    @staticmethod
    def rank_message(buffer: Buffer, count: int) -> str:
        shape = ", ".join(map(str, buffer.shape))
        return (f"{buffer.name} has rank {buffer.rank} (shape [{shape}]) but is indexed with "
                f"{count} index(es)")

    def _subscript(self, node: ast.Subscript) -> Any:
        value = self.expr(node.value)
        if isinstance(value, Buffer):
            return value[self.indices(value, node)]
        if isinstance(value, Expr):
            raise self.error(node, f"{ast.unparse(node.value)} is a scalar, not a tensor: it "
                                   "has no elements to index")
        index = self.expr(node.slice)
        if isinstance(value, (tuple, list)) and isinstance(index, Expr):
            raise self.error(node, f"a {type(value).__name__} known when compiling cannot be "
                             "indexed with a run-time value")
        return value[index]

    def arguments(self, node: ast.Call) -> tuple[list, dict]:
        kwargs: dict = {}
        for kw in node.keywords:
            if kw.arg is None:
                kwargs.update(self.expr(kw.value))
            else:
                kwargs[kw.arg] = self.expr(kw.value)
        return self.elements(node.args), kwargs

    def _call(self, node: ast.Call) -> Any:
        return self.call(node, self.expr(node.func))

    def call(self, node: ast.Call, func: Any) -> Any:
        args, kwargs = self.arguments(node)
        if isinstance(func, InlineFunction):
            if len(self.inlining) >= MAX_INLINE_DEPTH:
                raise self.error(node, self.recursion_message(func))
            return func.expand(self, args, kwargs)
        try:
            func = BUILTIN_CALLS.get(func, func)
        except TypeError:  # unhashable: not one of them
            pass
        if isinstance(func, np.ufunc) and any(isinstance(a, Expr) for a in args):
            own = f" (treadle.lang.{func.__name__})" if hasattr(lang, func.__name__) else ""
            raise self.error(node, f"numpy's {func.__name__} computes on arrays when the "
                                   f"kernel is compiled, not on its values; call treadle.lang's "
                                   f"function{own}")
        return func(*args, **kwargs)

    def recursion_message(self, func: InlineFunction) -> str:
        names = ", ".join(dict.fromkeys(f.fn.__qualname__ for f in self.inlining))
        return (f"@inline helper {func.fn.__qualname__} is called {MAX_INLINE_DEPTH} helper "
                f"calls deep (inside {names}): helpers are expanded in place while "
                "compiling, so a recursion must end on a condition known then")

    def _binary(self, node: ast.BinOp) -> Any:
        op = BINARY.get(type(node.op))
        if op is None:
            raise self.unsupported(node.op)
        return op(self.expr(node.left), self.expr(node.right))

    def _unary(self, node: ast.UnaryOp) -> Any:
        return UNARY[type(node.op)](self.expr(node.operand))

    def _boolean(self, node: ast.BoolOp) -> Any:
        conjunction = isinstance(node.op, ast.And)
        result = self.expr(node.values[0])
        for value in node.values[1:]:
            # A compile-time operand decides as in Python: `and` stops at a false one.
            if not isinstance(result, Expr) and bool(result) != conjunction:
                return result
            right = self.expr(value)
            result = right if not isinstance(result, Expr) else _logic(
                "and" if conjunction else "or", result, right)
        return result

    def _compare(self, node: ast.Compare) -> Any:
        left, result = self.expr(node.left), True
        for op, right_node in zip(node.ops, node.comparators):
            if result is False:
                return False
            right = self.expr(right_node)
            part = COMPARE[type(op)](left, right)
            result = part if result is True else _logic("and", result, part)
            left = right
        return result

    def _conditional(self, node: ast.IfExp) -> Any:
        cond = self.expr(node.test)
        if not isinstance(cond, Expr):
            return self.expr(node.body if cond else node.orelse)
        return select(cond, self.expr(node.body), self.expr(node.orelse))


def _logic(op: str, a: Any, b: Any) -> Any:
    """``a op b`` where a run-time condition meets a compile-time one or another run-time
    one; a compile-time operand decides where it can (``x and False`` is False)."""
    if not isinstance(b, Expr):
        if bool(b) == (op == "and"):
            return a
        return b
    if not isinstance(a, Expr):
        return _logic(op, b, a)
    return Binary(op, a, b)


def _power(a, b):
    if isinstance(a, Expr) or isinstance(b, Expr):
        return call("pow", a, b)
    return a ** b


def _not(x):
    return Unary("not", x) if isinstance(x, Expr) else not x


def _equal(negate: bool):
    def compare(a, b):
        if isinstance(a, Expr) or isinstance(b, Expr):
            build = ne if negate else eq
            return build(a, b) if isinstance(a, Expr) else build(b, a)
        return (a != b) if negate else (a == b)
    return compare


def _compile_time(op):
    def compare(a, b):
        if isinstance(a, Expr) or isinstance(b, Expr):
            raise TypeError("`is` and `in` compare values known when compiling, not run-time "
                            "expressions")
        return op(a, b)
    return compare


BINARY = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
    ast.Pow: _power, ast.BitAnd: operator.and_, ast.BitOr: operator.or_,
    ast.BitXor: operator.xor, ast.LShift: operator.lshift, ast.RShift: operator.rshift,
}

UNARY = {
    ast.USub: operator.neg, ast.Invert: operator.invert, ast.Not: _not,
    ast.UAdd: lambda x: x if isinstance(x, Expr) else +x,
}

COMPARE = {
    ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge,
    ast.Eq: _equal(False), ast.NotEq: _equal(True),
    ast.Is: _compile_time(operator.is_), ast.IsNot: _compile_time(operator.is_not),
    ast.In: _compile_time(lambda a, b: a in b),
    ast.NotIn: _compile_time(lambda a, b: a not in b),
}

STATEMENTS = {
    ast.Assign: Parser._assign, ast.AugAssign: Parser._augmented,
    ast.AnnAssign: Parser._annotated, ast.For: Parser._for, ast.If: Parser._if,
    ast.Expr: Parser._expression, ast.Assert: Parser._assert, ast.Pass: lambda p, n: None,
}

EXPRESSIONS = {
    ast.Constant: lambda p, n: n.value, ast.Name: Parser._name,
    ast.Attribute: lambda p, n: getattr(p.expr(n.value), n.attr),
    ast.Subscript: Parser._subscript, ast.Call: Parser._call, ast.BinOp: Parser._binary,
    ast.UnaryOp: Parser._unary, ast.BoolOp: Parser._boolean, ast.Compare: Parser._compare,
    ast.IfExp: Parser._conditional,
    ast.Tuple: lambda p, n: tuple(p.elements(n.elts)),
    ast.List: lambda p, n: p.elements(n.elts),
}

# What to call the constructs a kernel cannot hold, with a hint where one helps.
UNSUPPORTED = {
    ast.While: "a while loop (loop with for ... in range(n))",
    ast.Try: "a try statement", ast.Raise: "raise", ast.With: "a with statement",
    ast.Return: "return (a kernel writes its results into its output parameters; an "
                "@inline helper may end with a return)",
    ast.Break: "break", ast.Continue: "continue", ast.Delete: "del",
    ast.Global: "global", ast.Nonlocal: "nonlocal",
    ast.Import: "import", ast.ImportFrom: "import", ast.ClassDef: "a class definition",
    ast.FunctionDef: "a nested function (define helpers outside the kernel with @lang.inline)",
    ast.AsyncFunctionDef: "an async function", ast.Match: "a match statement",
    ast.Lambda: "lambda (define helpers outside the kernel with @lang.inline)",
    ast.ListComp: "a list comprehension (use static_range for a loop unrolled when "
                  "compiling)",
    ast.SetComp: "a set comprehension", ast.DictComp: "a dict comprehension",
    ast.GeneratorExp: "a generator expression", ast.Dict: "a dict display",
    ast.Set: "a set display", ast.Slice: "a slice (index tensors element by element)",
    ast.JoinedStr: "an f-string", ast.NamedExpr: "an assignment expression (:=)",
    ast.Yield: "yield", ast.YieldFrom: "yield", ast.Await: "await",
    ast.Starred: "a starred expression outside a call or a tuple",
    ast.MatMult: "the @ operator",
}
