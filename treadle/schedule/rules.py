"""Rule-based scheduling (Hidet 5.1.3): a tensor program from compute definitions alone.

Rules, applied to the computes an operator defines:
* an injective compute used by another is inlined into it (its expression substituted at
  each load), so element-wise chains become one expression — except one holding a costly
  call (exp, erf ...) that several materialised tensors read (softmax's exponentials,
  read by the sum and by the output), which is materialised once instead;
* every output and every reduction another compute reads is materialised, reductions
  first: outputs in the operator's buffers, intermediate reductions in workspaces;
* a materialised tensor is a loop nest whose outer dimensions are flattened into one
  parallel loop (threads) over rows, with the last dimension innermost and contiguous, so
  the C compiler can vectorise it; a reduction keeps a scalar accumulator per element;
* consecutive tensors with the same rows, each reading the others only within its own
  row (softmax's maximum, sum and output), share one loop over rows;
* a costly part of an element that varies along the row but not down the columns (an
  instance norm's per-channel reciprocal square root) is computed once per column, into
  a workspace, before the loop over rows;
* a reduction over the rows of one image keeping its contiguous axis (an instance norm's
  statistics, a global pooling at batch 1) splits into parallel parts, combined after;
* the innermost reduce loop of a float reduction is a vectorize loop accumulating in any
  order (``Accumulate``), unless it is too short to fill a vector: C compilers keep a
  float sum sequential otherwise, since reassociating it changes rounding.
"""
from __future__ import annotations

import itertools

from dataclasses import replace
from typing import Collection, Sequence

from treadle.ir.compute import Compute, combine, identity_of, producer_of, reachable
from treadle.ir.expr import (Binary, Buffer, Call, Const, Expr, Load, Var, as_expr,
                             ceil_div, minimum)
from treadle.ir.functor import (bound_vars, free_vars, rewrite, rewrite_outermost,
                                substitute, walk)
from treadle.ir.mapping import unravel
from treadle.ir.simplify import simplify_expr
from treadle.ir.stmt import (Accumulate, Assert, DeclBuffer, For, Function, Let, Seq,
                             Stmt, Store)
from treadle.ir.builder import seq
from treadle.schedule.kernel import Kernel

# A reduce loop shorter than this (when known) stays serial: one AVX2 vector of float32.
MIN_VECTOR_REDUCE = 8
# A column reduction of a single row splits into this many parallel parts (see
# _split_columns) where it reads at least MIN_SPLIT_ELEMENTS: below, dispatching the
# threads costs about what they save.
SPLIT_PARTS, MIN_SPLIT_ELEMENTS = 16, 1 << 15


def schedule_computes(name: str, inputs: Sequence[Buffer | None], outputs: Sequence[Compute],
                      checks: Sequence[tuple[Expr, str]] = ()) -> Kernel:
    computes = reachable(outputs)
    shared = _shared_costly(outputs, computes)
    inline = Inliner(computes, shared)
    materialised = _materialise_order(outputs, computes, shared)
    groups = _row_groups(materialised, inline)
    nests = [_loop_nest(group, inline) for group in groups]
    body = [Assert(cond, message) for cond, message in checks]
    body += [stmt for stmts, _ in nests for stmt in stmts]
    body_stmt = seq(body) if body else Seq(())
    workspaces = [c.buffer for c in materialised if c not in outputs]
    workspaces += [b for _, columns in nests for b in columns]
    kernel = _kernel(name, inputs, outputs, workspaces, body_stmt)
    into_output = _written_in_place(groups, outputs, inline)
    if not into_output:
        return kernel
    fewer = [b for b in workspaces if b not in into_output]
    return replace(_kernel(name, inputs, outputs, fewer, _renamed(body_stmt, into_output)),
                   apart=kernel)


def _kernel(name: str, inputs: Sequence[Buffer | None], outputs: Sequence[Compute],
            workspaces: Sequence[Buffer], body: Stmt) -> Kernel:
    used = {n.buffer for n in walk(body) if isinstance(n, (Load, Store))}
    params: list = [b for b in inputs if b is not None and b in used]
    params += [c.buffer for c in outputs] + list(workspaces)
    symbols = sorted({v for p in params for d in p.shape for v in free_vars(d)} |
                     (free_vars(body) - bound_vars(body)), key=lambda v: v.name)
    return canonical_kernel(Function(name, tuple(params) + tuple(symbols), body),
                            inputs, len(outputs))


def canonical_kernel(func: Function, inputs: Sequence[Buffer | None], num_outputs: int,
                     derived: Sequence[Compute] = ()) -> Kernel:
    """A kernel from a function whose parameters are: the operator inputs it reads (in
    order), its ``num_outputs`` outputs, the buffers of ``derived``, workspaces, then
    symbols."""
    params = set(func.buffers)
    input_ids = tuple(k for k, b in enumerate(inputs) if b is not None and b in params)
    function = canonical_names(func, len(input_ids), num_outputs)
    count = len(input_ids) + num_outputs
    renamed = function.buffers[count:count + len(derived)]
    derived = tuple(Compute(b, c.axes, c.value) for b, c in zip(renamed, derived))
    return Kernel(function, input_ids, function.buffers[count + len(derived):], derived)


def canonical_names(func: Function, num_inputs: int, num_outputs: int) -> Function:
    """Names by role and order of appearance (x0.., y0.., w0.. for parameters, i0.. for
    loop variables), so operators with the same schedule give identical functions, which
    are compiled once."""
    names = [f"x{k}" for k in range(num_inputs)] + [f"y{k}" for k in range(num_outputs)]
    names += [f"w{k}" for k in range(len(func.buffers) - len(names))]
    buffers = {b: replace(b, name=n) for b, n in zip(func.buffers, names)}
    symbols = set(func.symbols)
    # A variable is its name, so a loop variable must not take a symbol's (a model's
    # dimension may well be called i0).
    taken = {v.name for v in symbols}
    fresh = (f"i{k}" for k in itertools.count() if f"i{k}" not in taken)
    variables: dict[Var, Var] = {}
    for node in walk(func.body):
        if isinstance(node, Var) and node not in symbols and node not in variables:
            variables[node] = Var(next(fresh), node.dtype)
        if isinstance(node, DeclBuffer) and node.buffer not in buffers:  # a buffer that
            # several branches declare alike (variants of a dispatching kernel) keeps one name
            buffers[node.buffer] = replace(node.buffer, name=f"acc{len(buffers)}")

    def rename(node):
        if isinstance(node, Var):
            return variables.get(node)
        if isinstance(node, (Load, Store, Accumulate, DeclBuffer)) and node.buffer in buffers:
            return replace(node, buffer=buffers[node.buffer])
        return None
    params = tuple(buffers.get(p, p) for p in func.params)
    return Function(func.name, params, rewrite(func.body, rename), func.attrs)


# Calls that cost more than storing and reloading their result in cache.
COSTLY_CALLS = frozenset({"exp", "log", "erf", "tanh", "sin", "cos"})


def _written_in_place(groups: list[list[Compute]], outputs: Sequence[Compute],
                      inline: Inliner) -> dict[Buffer, Buffer]:
    """Workspaces that can live in an output: a row's shared tensor (softmax's
    exponentials) of the output's shape that the output, last in the row, reads only at
    its own element, and nothing else reads after. Each element is read just before it is
    overwritten, and the kernel writes one tensor of the output's size instead of two."""
    found: dict[Buffer, Buffer] = {}
    read_after = [set() for _ in groups]  # buffers the groups after each one read
    for k in range(len(groups) - 2, -1, -1):
        read_after[k] = read_after[k + 1] | {n.buffer for c in groups[k + 1]
                                             for n in walk(inline(c.value))
                                             if isinstance(n, Load)}
    for group, later in zip(groups, read_after):
        last = group[-1]
        for c in group[:-1]:
            if (last not in outputs or c in outputs or c.is_reduction
                    or c.shape != last.shape or c.dtype != last.dtype
                    or c.buffer in later):
                continue
            loads = [n for n in walk(inline(last.value))
                     if isinstance(n, Load) and n.buffer == c.buffer]
            if loads and all(n.indices == last.axes for n in loads):
                found[c.buffer] = last.buffer
                break
    return found


def _renamed(stmt: Stmt, buffers: dict[Buffer, Buffer]) -> Stmt:
    """``stmt`` with the loads and stores of each key of ``buffers`` on its value."""
    def visit(n):
        if isinstance(n, (Load, Store)) and n.buffer in buffers:
            return replace(n, buffer=buffers[n.buffer])
        return None
    return rewrite(stmt, visit)


def _shared_costly(outputs: Sequence[Compute], computes: dict[Buffer, Compute]) -> set[Buffer]:
    """Injective computes with a costly call that two or more of the tensors materialised
    anyway (reductions, outputs) would each inline: computed once, into a workspace."""
    readers: dict[Buffer, set[Buffer]] = {}

    def inlined_into(c: Compute, root: Buffer) -> None:
        for load in c.loads():
            d = computes.get(load.buffer)
            if d is not None and not d.is_reduction and d not in outputs \
                    and root not in readers.get(d.buffer, ()):  # each compute once per root
                readers.setdefault(d.buffer, set()).add(root)
                inlined_into(d, root)
    for c in computes.values():
        if c.is_reduction or c in outputs:
            inlined_into(c, c.buffer)
    return {b for b, roots in readers.items() if len(roots) > 1 and any(
        isinstance(n, Call) and n.func in COSTLY_CALLS for n in walk(computes[b].value))}


def _materialise_order(outputs: Sequence[Compute], computes: dict[Buffer, Compute],
                       shared: set[Buffer]) -> list[Compute]:
    """Reductions read by others, ``shared`` computes, then outputs, each after everything
    it depends on."""
    order: list[Compute] = []

    def needs(c: Compute) -> list[Compute]:
        deps = []
        for load in c.loads():
            d = computes.get(load.buffer)
            if d is None:
                continue
            deps += [d] if d.is_reduction or d in outputs or d.buffer in shared else needs(d)
        return deps

    def visit(c: Compute) -> None:
        if c in order:
            return
        for d in needs(c):
            visit(d)
        order.append(c)
    for c in outputs:
        visit(c)
    return order


class Inliner:
    """Substitutes every injective compute at its loads, recursively; reductions and the
    computes in ``keep`` (materialised) stay loads."""

    def __init__(self, computes: dict[Buffer, Compute], keep: Collection[Buffer] = ()):
        self.computes = computes
        self.keep = frozenset(keep)

    def __call__(self, expr: Expr) -> Expr:
        def visit(node):
            if not isinstance(node, Load):
                return None
            c = self.computes.get(node.buffer)
            if c is None or c.is_reduction or node.buffer in self.keep:
                return None
            return self(substitute(c.value, dict(zip(c.axes, node.indices))))
        return rewrite(expr, visit)


def _row_groups(materialised: Sequence[Compute], inline: Inliner) -> list[list[Compute]]:
    """Consecutive computes with the same rows (all dimensions but the last) where each
    reads the earlier ones only in its own row: they share one parallel loop over rows,
    so a row's reductions are computed just before their users, while it is in cache."""
    groups: list[list[Compute]] = []
    for c in materialised:
        if groups and _row_local(groups[-1], c, inline):
            groups[-1].append(c)
        else:
            groups.append([c])
    return groups


def _row_local(group: list[Compute], c: Compute, inline: Inliner) -> bool:
    rows = c.shape[:-1]
    if not rows or any(g.shape[:-1] != rows for g in group):
        return False
    earlier = {g.buffer for g in group}
    one, zero = as_expr(1), as_expr(0)
    # A size-1 dimension of the rows may be read at 0, as broadcasting reads it.
    return all(i == a or (d == one and i == zero)
               for load in walk(inline(c.value))
               if isinstance(load, Load) and load.buffer in earlier
               for i, a, d in zip(load.indices[:-1], c.axes[:-1], rows))


def _loop_nest(group: list[Compute], inline: Inliner) -> tuple[list[Stmt], list[Buffer]]:
    """A parallel loop over the group's rows, each compute's last dimension innermost,
    after the loops filling the column workspaces it reads (``_column_values``); and the
    workspaces it adds."""
    c = group[0]
    if not c.shape:
        return [_element(c, (), inline)], []
    outer_shape, inner = c.shape[:-1], c.shape[-1]
    if not outer_shape:
        j = Var(f"{c.name}_j")
        return [For(j, inner, _element(c, (j,), inline), "parallel")], []
    row = Var(f"{c.name}_row")
    outer_count = as_expr(1)
    for d in outer_shape:
        outer_count = outer_count * d
    order = _row_order(group, inline)
    unravelled = unravel(row, [outer_shape[a] for a in order])
    coords = [unravelled[order.index(a)] for a in range(len(outer_shape))]
    rows: list[Stmt] = []
    columns: list[tuple[Buffer, Stmt]] = []
    workspaces: list[Buffer] = []  # the split column reductions' partial results
    one_row = all(isinstance(d, Const) and d.value == 1 for d in outer_shape)
    for k, member in enumerate(group):
        j = Var(f"{member.name}_j")
        if _column_reduction(member, inline):
            split = _split_axis(member) if one_row else None
            if split is not None:
                partial, stmts = _split_columns(member, split, coords, j, inline)
                workspaces.append(partial)
                rows += stmts
            else:
                rows += _columns(member, coords, j, inline)
            continue
        element = _element(member, (*coords, j), inline)
        if not member.is_reduction and not one_row:
            found, element = _column_values(element, member, (row, j),
                                            {g.buffer for g in group})
            columns += found
        lets, element = _hoist_row_values(element, {g.buffer for g in group[:k]}, j)
        rows += [*lets, For(j, member.shape[-1], element)]
    # One row runs once: its split column reductions hold the parallel loops.
    nest = rows if one_row else [For(row, outer_count, seq(rows), "parallel")]
    return [fill for _, fill in columns] + nest, workspaces + [b for b, _ in columns]


def _column_values(store: Store, c: Compute, loops: tuple[Var, Var], local: set[Buffer]
                   ) -> tuple[list[tuple[Buffer, Stmt]], Store]:
    """Each costly part (a division, a call) of the value ``store`` writes into ``c`` that
    varies along the column ``j`` but not along the ``row`` (``loops``: the loops over
    both), computed once per column into a workspace before the loop over rows, with the
    loop that fills it. An instance norm over a channels-last image divides by the square
    root of each channel's variance: in every element, 3136 pixels x 128 channels, that
    was half of the kernel's time. ``local`` are the tensors computed inside the loop
    over rows."""
    row, j = loops
    found: dict[Expr, tuple[Buffer, Stmt]] = {}

    def visit(node):
        if isinstance(node, Load):
            return node  # its indices are addresses, not values worth a workspace
        if not _column_invariant_cost(node, loops, local):
            return None
        if node not in found:
            buffer = Buffer(f"{c.name}_column{len(found)}", node.dtype, (c.shape[-1],))
            column = Var(f"{buffer.name}_j")
            found[node] = (buffer, For(column, c.shape[-1], Store(
                buffer, (column,), substitute(node, {j: column}))))
        return found[node][0][j]

    value = rewrite_outermost(store.value, visit)
    return list(found.values()), replace(store, value=value)


def _column_invariant_cost(node, loops: tuple[Var, Var], local: set[Buffer]) -> bool:
    """Whether ``node`` is a float value that holds a division or a call and reads
    ``j`` or a tensor, but neither the ``row`` nor a tensor in ``local``. Half-precision
    values stay: the element computes them wider and rounds once, at its store."""
    row, j = loops
    if not (isinstance(node, Expr) and node.dtype.is_float and node.dtype.bits >= 32):
        return False
    nodes = list(walk(node))
    variables = {n for n in nodes if isinstance(n, Var)}
    loads = [n for n in nodes if isinstance(n, Load)]
    if row in variables or not (loads or j in variables) \
            or any(n.buffer in local for n in loads):
        return False
    return any(isinstance(n, Call) or (isinstance(n, Binary) and n.op == "/") for n in nodes)


def _row_order(group: list[Compute], inline: Inliner) -> list[int]:
    """The order of the row axes, outermost first: as the computes' own, but where a
    load's last index is a row axis (a transposition: a channels-last result returned N x
    C x H x W), that axis varies fastest, so consecutive rows read the same cache lines.
    In the computes' order, the rows of one channel walked a whole image of lines
    before the next channel came back to them (a 150 x 128 x 128 transposition: 1.09 ms,
    0.72 ms this way). A load constant along the row (a per-channel bias) keeps the
    order."""
    count = len(group[0].axes) - 1
    for member in group:
        for n in walk(inline(member.value)):
            if isinstance(n, Load) and n.indices and n.indices[-1] in member.axes[:-1] \
                    and _strided_along(n, member.axes[-1]):
                fastest = member.axes.index(n.indices[-1])
                return [a for a in range(count) if a != fastest] + [fastest]
    return list(range(count))


def _strided_along(load: Load, inner: Var) -> bool:
    """Whether ``load`` moves along the row (``inner``) by more than one element: the
    row's axis is in an index before its last."""
    return any(inner in free_vars(i) for i in load.indices[:-1]) \
        and inner not in free_vars(load.indices[-1])


def _column_reduction(c: Compute, inline: Inliner) -> bool:
    """A reduction over axes outside the rows it reads, each load's last index its own
    last axis (a global pooling of a channels-last image): the channels it keeps are
    contiguous in every element it combines."""
    if not c.is_reduction:
        return False
    j = c.axes[-1]
    loads = [n for n in walk(inline(c.value)) if isinstance(n, Load)]
    return bool(loads) and all(n.indices and n.indices[-1] == j for n in loads)


def _columns(c: Compute, coords: Sequence[Expr], j: Var, inline: Inliner) -> list[Stmt]:
    """A column reduction accumulating a whole row of results at once, the reduce loops
    outside and the row's contiguous axis innermost, where it vectorises; a loop per
    element would read one strided value per step."""
    value = inline(substitute(c.value, dict(zip(c.axes, (*coords, j)))))
    return _accumulated(c, c.buffer, coords, j, value, zip(c.reduce_axes, c.reduce_extents))


def _accumulated(c: Compute, into: Buffer, coords: Sequence[Expr], j: Var, value: Expr,
                 loops) -> list[Stmt]:
    """``into``'s row at ``coords`` set to the identity of ``c``'s reduction, then
    combined with ``value`` at each column ``j`` over ``loops`` (variable, extent),
    outermost first, with ``j`` innermost."""
    index = (*coords, j)
    update: Stmt = For(j, c.shape[-1], Store(into, index,
                                             combine(c.reduce_op, into[index], value)))
    for var, extent in reversed(list(loops)):
        update = For(var, extent, update)
    first = Var(f"{into.name}_first")
    start = For(first, c.shape[-1], Store(into, (*coords, first),
                                          identity_of(c.reduce_op, c.dtype)))
    return [start, update]


def _split_axis(c: Compute) -> int | None:
    """The reduce axis along which a column reduction of a single row splits among
    threads: its first longer than one, where the reduction reads at least
    MIN_SPLIT_ELEMENTS (or an unknown number of) elements."""
    extents = c.reduce_extents
    axes = [k for k, e in enumerate(extents) if not (isinstance(e, Const) and e.value == 1)]
    if not axes:
        return None
    count = c.shape[-1]
    for e in extents:
        count = count * e
    count = simplify_expr(count)
    return axes[0] if not isinstance(count, Const) or count.value >= MIN_SPLIT_ELEMENTS \
        else None


def _split_columns(c: Compute, k: int, coords: Sequence[Expr], j: Var, inline: Inliner
                   ) -> tuple[Buffer, list[Stmt]]:
    """A column reduction of a single row (an instance norm's statistics of one image, a
    global pooling at batch 1) in SPLIT_PARTS parallel parts along its reduce axis ``k``,
    each into a row of partial results, then those rows combined: as one loop it ran on
    one thread. Returns the workspace of partial results and the statements."""
    axis, extent = c.reduce_axes[k], c.reduce_extents[k]
    if isinstance(extent, Const):
        step = ceil_div(extent.value, SPLIT_PARTS)
        parts = ceil_div(extent.value, step)
    else:
        parts, step = SPLIT_PARTS, ceil_div(extent, SPLIT_PARTS)
    partial = Buffer(f"{c.name}_parts", c.dtype, (parts, c.shape[-1]))
    part, offset, which = (Var(f"{c.name}_{n}") for n in ("part", "offset", "which"))
    value = inline(substitute(c.value, {**dict(zip(c.axes, (*coords, j))),
                                        axis: part * step + offset}))
    # Each part takes its own stretch of the split axis.
    loops = [(offset, minimum(step, extent - part * step)) if var == axis else (var, size)
             for var, size in zip(c.reduce_axes, c.reduce_extents)]
    split = For(part, parts, seq(_accumulated(c, partial, (part,), j, value, loops)),
                "parallel")
    column = Var(f"{c.name}_column")  # a loop of its own: each loop binds its variable once
    total = _accumulated(c, c.buffer, coords, column, partial[which, column], [(which, parts)])
    return partial, [split, *total]


def _hoist_row_values(stmt: Stmt, earlier: set[Buffer], j: Var) -> tuple[list[Let], Stmt]:
    """Binds the loads of ``earlier`` computes that vary neither along ``j`` nor along an
    axis bound inside ``stmt`` (a row's maximum, its sum) before the loop: inside a
    parallel region gcc no longer knows the buffers do not alias, and would reload them
    each iteration and not vectorise."""
    lets: dict[Load, Let] = {}
    inner = bound_vars(stmt) | {j}  # a reduction's own axes vary inside the row too
    for n in walk(stmt):
        if isinstance(n, Load) and n.buffer in earlier and n not in lets and not any(
                free_vars(i) & inner for i in n.indices):
            lets[n] = Let(Var(f"{n.buffer.name}_at_{j.name}", n.dtype), n)
    hoisted = rewrite(stmt, lambda n: lets[n].var if isinstance(n, Load) and n in lets else None)
    return list(lets.values()), hoisted


def _element(c: Compute, index: Sequence[Expr], inline: Inliner) -> Stmt:
    value = inline(substitute(c.value, dict(zip(c.axes, index))))
    if not c.is_reduction:
        return Store(c.buffer, tuple(index), value)
    acc = Buffer(f"{c.name}_acc", c.dtype, (), "local")
    update: Stmt = Accumulate(acc, c.reduce_op, value)
    for k, (var, extent) in reversed(list(enumerate(zip(c.reduce_axes, c.reduce_extents)))):
        innermost = k == len(c.reduce_axes) - 1
        update = For(var, extent, update, "vectorize" if innermost and _vector_reduce(c)
                     else "serial")
    return Seq((DeclBuffer(acc), Store(acc, (), identity_of(c.reduce_op, c.dtype)), update,
                Store(c.buffer, tuple(index), acc[()])))


def _vector_reduce(c: Compute) -> bool:
    """Whether the innermost reduce loop of ``c`` should be a vector reduction: a float
    accumulator (integer sums are associative, so compilers vectorise them anyway) and a
    loop not known to be shorter than a vector."""
    extent = c.reduce_extents[-1]
    short = isinstance(extent, Const) and extent.value < MIN_VECTOR_REDUCE
    return c.dtype.is_float and not short


def split_epilogue(out: Compute) -> tuple[Compute, Expr] | None:
    """The one reduction ``out`` is an element-wise map of, and that map over the
    reduction's axes; ``out`` itself with the identity map if it is the reduction."""
    if out.is_reduction:
        return out, out[out.axes]
    value = Inliner(reachable([out]))(out.value)
    loads = [n for n in walk(value) if isinstance(n, Load) and producer_of(n.buffer) is not None]
    reductions = {n.buffer for n in loads}
    if len(reductions) != 1:
        return None
    red = producer_of(reductions.pop())
    if red.shape != out.shape or any(n.indices != out.axes for n in loads):
        return None
    return red, substitute(value, dict(zip(out.axes, red.axes)))
