"""Post-scheduling fusion (Hidet section 4.2): a kernel plan's anchor (``graph.kernel_plan``)
is scheduled alone, by a template or by the rules, and its prologues and epilogues are
fused into the scheduled program afterwards. No schedule knows what is fused into it.

* Each load of a tensor a prologue computes becomes the prologue's expression at the
  load's indices (its own inputs inlined in turn), so on the CPU matmul template a
  prologue runs inside the packing of panels, and a convolution's padding or a transpose
  costs index arithmetic only.
* Each store of the anchor's output becomes a let of the stored value followed by one
  store per tensor the plan writes, each computed from that value by the epilogues.
  Epilogues read in-plan tensors at their own index (see ``graph.partition``), so the
  stored element's indices are theirs, up to the reshapes in between, which map them.
  A padding epilogue shifts the index, and the kernel fills the padded tensor's border
  itself, so no padded copy is made: before the body with a constant, after it with
  copies of the elements the body wrote (edge and reflect modes).

A schedule that loads a prologue's tensor or stores the anchor's output as a vector, or
reads its own output back, cannot take the substitution: ``FusionError``, and the caller
gives each operator its own kernel.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from typing import Callable, Iterator, Sequence

from treadle.errors import TreadleError
from treadle.graph.operator import Operator
from treadle.graph.kernel_plan import KernelPlan, single
from treadle.graph.ops.transform import PAD_MODES
from treadle.graph.partition import Padding, element_map, is_view, padding_of
from treadle.graph.tensor import Dim, Tensor, normalize_dim
from treadle.ir.compute import Compute, reachable
from treadle.ir.dtypes import index_type
from treadle.ir.expr import Buffer, Expr, Load, Var, as_expr
from treadle.ir.functor import bound_vars, free_vars, rewrite, substitute, walk
from treadle.ir.mapping import ravel, unravel
from treadle.ir.tabulate import tabulate
from treadle.ir.simplify import simplify_expr
from treadle.ir.stmt import Assert, For, Function, Let, Seq, Stmt, Store
from treadle.schedule.kernel import Kernel
from treadle.schedule.rules import Inliner, canonical_names


class FusionError(TreadleError):
    """The anchor's schedule cannot take a prologue or an epilogue."""


@dataclass(frozen=True)
class FusedKernel:
    """A scheduled plan: its function's buffer parameters are ``inputs``, ``outputs``,
    then ``workspaces`` (scratch buffers the caller allocates), then symbols."""
    function: Function
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    workspaces: tuple[Buffer, ...]


# Schedules one operator alone into the kernel of the given name (a template's program
# with the config tuning chose; see tune.kernel.KernelMaker).
ScheduleOperator = Callable[[Operator, str], Kernel]


def schedule_plan(plan: KernelPlan, name: str, schedule: ScheduleOperator) -> list[FusedKernel]:
    """The kernel of ``plan``, or one kernel per operator where fusing is not legal."""
    try:
        return [fused_kernel(plan, name, schedule)]
    except FusionError:
        return [fused_kernel(single(op), f"{name}_{k}", schedule) for k, op in enumerate(plan.ops)]


def fused_kernel(plan: KernelPlan, name: str, schedule: ScheduleOperator) -> FusedKernel:
    """The one kernel of ``plan``; FusionError where its anchor's schedule cannot take
    what is fused into it."""
    anchor = plan.anchor
    kernel = schedule(anchor, name)
    if plan.epilogues:
        kernel = kernel.for_epilogues
    func = kernel.function
    buffers = _TensorBuffers()
    params = {b: buffers.of(anchor.inputs[i]) for b, i in zip(func.buffers, kernel.inputs)}
    outs = func.buffers[len(kernel.inputs):len(kernel.inputs) + len(anchor.outputs)]
    params.update({b: buffers.of(t) for b, t in zip(outs, anchor.outputs)})
    derived = _derived_constants(anchor, kernel.derived, name)
    params.update({c.buffer: buffers.of(t) for c, t in zip(kernel.derived, derived)})
    body = rewrite(func.body, lambda n: replace(n, buffer=params[n.buffer])
                   if isinstance(n, (Load, Store)) and n.buffer in params else None)
    if plan.epilogues:
        body = _apply_epilogues(body, plan, buffers)
    # After the epilogues, which may read a prologue's tensor too.
    body = _inline_prologues(body, plan.prologues, buffers)
    checks = [Assert(cond, message) for op in (*plan.prologues, *plan.epilogues)
              for cond, message in op.checks]
    body = Seq((*checks, body)) if checks else body
    return _assemble(name, body, plan, buffers, kernel.workspaces, derived)


def _derived_constants(op: Operator, computes: Sequence[Compute], name: str) -> list[Tensor]:
    """The constants a schedule reads in its own layout, tabulated from ``op``'s."""
    tables = [tabulate(c, op.constant_inputs) for c in computes]
    return [Tensor(f"{name}/{c.buffer.name}", c.dtype, table.shape, table)
            for c, table in zip(computes, tables)]


class _TensorBuffers:
    """One buffer per graph tensor in a fused kernel (operators name their inputs alike,
    in0, in1, ..., so their own buffers cannot be mixed)."""

    def __init__(self):
        self.by_tensor: dict[int, Buffer] = {}

    def of(self, tensor: Tensor) -> Buffer:
        if id(tensor) not in self.by_tensor:
            self.by_tensor[id(tensor)] = Buffer(f"g{len(self.by_tensor)}", tensor.dtype,
                                                tensor.shape)
        return self.by_tensor[id(tensor)]

    def value(self, op: Operator, substitutes: dict[int, Expr] | None = None) -> Expr:
        """The expression of ``op``'s single output over its axes, reading plan buffers;
        loads of the tensors in ``substitutes`` (at the output's own index) become those
        expressions."""
        out = op.definition[0]
        local = {b: t for b, t in zip(op.input_buffers, op.inputs)
                 if b is not None and t is not None}
        substitutes = substitutes or {}

        def visit(node):
            if not (isinstance(node, Load) and node.buffer in local):
                return None
            tensor = local[node.buffer]
            if id(tensor) in substitutes:
                return substitutes[id(tensor)]
            return replace(node, buffer=self.of(tensor))
        return rewrite(Inliner(reachable([out]))(out.value), visit)


def _inline_prologues(body: Stmt, prologues: Sequence[Operator], buffers: _TensorBuffers) -> Stmt:
    definitions = {buffers.of(op.outputs[0]): (op.definition[0].axes, buffers.value(op))
                   for op in prologues}

    def expand(node):
        if not (isinstance(node, Load) and node.buffer in definitions):
            return None
        if node.lanes != 1:
            raise FusionError(f"the schedule loads {node.buffer.name} as a vector")
        axes, value = definitions[node.buffer]
        return rewrite(substitute(value, dict(zip(axes, node.indices))), expand)
    return rewrite(body, expand)


def _apply_epilogues(body: Stmt, plan: KernelPlan, buffers: _TensorBuffers) -> Stmt:
    anchor = plan.anchor.outputs[0]
    fresh = _fresh_names(plan)
    stored = Var(next(fresh), anchor.dtype)  # stands for the value the anchor stores
    axes = plan.anchor.definition[0].axes
    # Every in-plan tensor: its element (value and index, over the anchor's axes) that
    # the anchor's element at ``axes`` gives.
    values: dict[int, Expr] = {id(anchor): stored}
    index_of: dict[int, tuple[Expr, ...]] = {id(anchor): axes}
    borders, folded = [], []  # filled before the body, and copied from it after it
    # Each computing epilogue's element, over the anchor's axes, in plan order; its
    # result is the variable it binds, which later values read.
    definitions: list[tuple[Var, Expr]] = []
    for op in plan.epilogues:
        out, padding = op.outputs[0], padding_of(op)
        if is_view(op) or padding is not None:  # the same value, at another index
            source = op.inputs[0]
            values[id(out)] = values[id(source)]
            index = index_of[id(source)]
            if padding is None:
                index_of[id(out)] = _view_index(index, source.shape, out.shape)
            else:
                index_of[id(out)] = tuple(i + b if b else i for i, b in zip(index,
                                                                            padding.before))
                border = _fill_border(buffers.of(out), source.shape, padding, fresh)
                (folded if padding.fill is None else borders).append(border)
            continue
        tensor_of = dict(zip(op.input_buffers, op.inputs))
        indices = {_index_through(load, op.definition[0], index_of[id(tensor_of[load.buffer])])
                   for load in op.definition[0].loads()
                   if id(tensor_of.get(load.buffer)) in values}
        if len(indices) != 1:
            raise FusionError(f"{op.name!r} combines elements of different in-plan indices")
        index = indices.pop()
        value = buffers.value(op, values)
        values[id(out)] = Var(next(fresh), out.dtype)
        definitions.append((values[id(out)],
                            substitute(value, dict(zip(op.definition[0].axes, index)))))
        index_of[id(out)] = index
    target = buffers.of(anchor)
    shared = _read_twice(definitions, [values[id(t)] for t in plan.outputs])

    def visit(node):
        if isinstance(node, Load) and node.buffer == target:
            raise FusionError(f"the schedule of {plan.anchor.name!r} reads its output back")
        if not (isinstance(node, Store) and node.buffer == target):
            return None
        if node.lanes != 1:
            raise FusionError(f"the schedule of {plan.anchor.name!r} stores vectors")
        var = Var(next(fresh), anchor.dtype)
        env = {**dict(zip(axes, node.indices)), stored: var}
        lets = _evaluated(definitions, shared, env, fresh)
        writes = [Store(buffers.of(t), tuple(substitute(i, env) for i in index_of[id(t)]),
                        env[values[id(t)]]) for t in plan.outputs]
        return Seq((Let(var, node.value), *lets, *writes))
    return Seq((*borders, rewrite(body, visit), *folded))


def _evaluated(definitions: Sequence[tuple[Var, Expr]], shared: set[Var],
               env: dict[Var, Expr], fresh: Iterator[str]) -> list[Let]:
    """Puts each epilogue result's value at one stored element into ``env``: a variable
    bound by the let returned for it where it is read twice, its expression otherwise."""
    lets = []
    for result, value in definitions:
        env[result] = substitute(value, env)
        if result in shared:
            lets.append(Let(Var(next(fresh), result.dtype), env[result]))
            env[result] = lets[-1].var
    return lets


def _read_twice(definitions: Sequence[tuple[Var, Expr]], stored: Sequence[Expr]) -> set[Var]:
    """The epilogue results read more than once, by later epilogues or by the stores:
    each is bound to a variable once per element, since inlining it at every read
    computes it again there, and a chain of epilogues whose every step is also stored
    (a recurrence unrolled by an exporter, each state returned) would compute each step
    from the first, work growing with the square of its length."""
    reads: dict[Var, int] = {}
    results = {result for result, _ in definitions}
    for expr in (*(value for _, value in definitions), *stored):
        for node in walk(expr):
            if node in results:
                reads[node] = reads.get(node, 0) + 1
    return {result for result, count in reads.items() if count > 1}


def _view_index(index: Sequence[Expr], source: Sequence[Dim], out: Sequence[Dim]) -> tuple:
    """Where a view (a row-major reinterpretation) puts its source's element at
    ``index``. Dimensions the two shapes share at either end keep their index: only the
    middle is raveled and unraveled, since a whole-index ravel leaves remainders and
    quotients the simplifier cannot always remove (a grouped convolution's G x M/G
    channels viewed as M stored through ``% 240`` and ``// 240`` per element). A rank-0
    middle ravels to the int 0, which must become an expression."""
    head = 0
    while head < min(len(source), len(out)) and _same_dim(source[head], out[head]):
        head += 1
    tail = 0
    while tail < min(len(source), len(out)) - head and \
            _same_dim(source[-1 - tail], out[-1 - tail]):
        tail += 1
    middle = slice(head, len(source) - tail)
    flat = as_expr(ravel(index[middle], source[middle]))
    inner = out[head:len(out) - tail]
    moved = tuple(as_expr(i) for i in unravel(flat, inner)) if inner else ()
    return (*(as_expr(i) for i in index[:head]), *moved,
            *(as_expr(i) for i in index[len(source) - tail:]))


def _same_dim(a: Dim, b: Dim) -> bool:
    return normalize_dim(a) == normalize_dim(b)  # expressions compare structurally


def _fresh_names(plan: KernelPlan) -> Iterator[str]:
    """Names for the kernel's own variables. A variable is its name, so none may be a
    symbol of the plan's shapes (a model's dimension may well be called b0)."""
    taken = {v.name for op in plan.ops for t in (*op.inputs, *op.outputs) if t is not None
             for d in t.shape for v in free_vars(as_expr(d))}
    return (f"t{k}" for k in itertools.count() if f"t{k}" not in taken)


def _fill_border(buffer: Buffer, inner: Sequence[Dim], padding: Padding,
                 fresh: Iterator[str]) -> Stmt:
    """Fills every index of ``buffer`` outside the box of ``inner`` elements from
    ``padding.before``: for each dimension d, the slab before the box and the one after
    it, spanning the box in the dimensions before d and everything in those after
    (disjoint slabs, each a loop nest over contiguous rows). A constant fill is stored; a
    folded mode copies the element its position folds back to along d, which lies in the
    box along d and the dimensions before it: dimensions are filled last to first, so
    the slabs of those after d, which it may lie in, are filled already."""
    shape, before = buffer.shape, padding.before
    nests = []
    dims = range(len(shape)) if padding.fill is not None else reversed(range(len(shape)))
    for d in dims:
        after = simplify_expr(as_expr(shape[d]) - before[d] - inner[d])
        slabs = ((as_expr(0), as_expr(before[d])), (as_expr(before[d] + inner[d]), after))
        for start, extent in slabs:
            if extent == as_expr(0):
                continue
            axes = [Var(next(fresh), index_type) for _ in shape]
            index = ([a + b for a, b in zip(axes[:d], before[:d])] + [axes[d] + start]
                     + axes[d + 1:])
            extents = [*inner[:d], extent, *shape[d + 1:]]
            if padding.fill is not None:
                nest: Stmt = Store(buffer, tuple(index), padding.fill)
            else:
                fold = PAD_MODES[padding.mode](index[d] - before[d], inner[d]) + before[d]
                source = tuple(simplify_expr(fold) if k == d else i for k, i in enumerate(index))
                nest = Store(buffer, tuple(index), Load(buffer, source))
            for axis, e in reversed(list(zip(axes, extents))):
                nest = For(axis, as_expr(e), nest)
            nests.append(nest)
    return Seq(tuple(nests))


def _index_through(load: Load, c: Compute, source: tuple[Expr, ...]) -> tuple[Expr, ...]:
    """The index of ``c``'s element that reads, through ``load``, the element of an
    in-plan tensor at index ``source`` (``graph.partition.element_map``)."""
    return tuple(as_expr(0) if k is None else source[k] for k in element_map(load, c))


def _assemble(name: str, body: Stmt, plan: KernelPlan, buffers: _TensorBuffers,
              workspaces: tuple[Buffer, ...], derived: Sequence[Tensor]) -> FusedKernel:
    """The function with its parameters in kernel order and canonical names."""
    used = {n.buffer for n in walk(body) if isinstance(n, (Load, Store))}
    produced = {id(t) for op in plan.ops for t in op.outputs}
    inputs: dict[int, Tensor] = {}
    for op in plan.ops:
        for t in op.inputs:
            if t is not None and id(t) not in produced and buffers.of(t) in used:
                inputs.setdefault(id(t), t)
    inputs.update((id(t), t) for t in derived)
    params: list = [buffers.of(t) for t in inputs.values()]
    params += [buffers.of(t) for t in plan.outputs] + list(workspaces)
    symbols = {v for p in params for d in p.shape for v in free_vars(d)}
    symbols |= free_vars(body) - bound_vars(body)
    function = Function(name, (*params, *sorted(symbols, key=lambda v: v.name)), body)
    function = canonical_names(function, len(inputs), len(plan.outputs))
    count = len(inputs) + len(plan.outputs)
    return FusedKernel(function, tuple(inputs.values()), tuple(plan.outputs),
                       function.buffers[count:])
