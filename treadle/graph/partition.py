"""The fusion partition: which operators share a kernel (Hidet section 4.2).

Every kernel is a *group*: one anchor operator, scheduled alone by a template or by the
rules, plus the operators fused into it after scheduling:

* epilogues: injective operators downstream of the anchor that read every in-group tensor
  one element per element, each once (at their own index or transposed; never broadcast),
  so each stored element of the anchor's output gives exactly one element of theirs; reshapes between them carry the
  element's index along (a dense layer exported as view -> Gemm -> view keeps its GELU or
  residual add). They are grown first, in graph order, so an element-wise operator between
  two anchors is computed once, as the first one's epilogue.
* prologues: injective groups (every operator computes each output element from its
  inputs without reducing) whose results only one other group reads; they are inlined at
  that group's loads. Padding and resizing are never inlined into a reader
  (``MATERIALISED``); a padding of an anchor's result is its last epilogue instead: the
  kernel stores each element at its padded position and fills the border itself, with
  a constant or, for edge and reflect modes, copies of the elements it wrote
  (``padding_of``; a folded padding only where ``_padding_fits``).

A group may produce several tensors: the last epilogue's result and any in-group tensor
that something outside the group still reads. Groups never form a cycle: an operator joins
only when none of its outside inputs depends on the group. View operators (reshapes),
which cost nothing as they are, and operators run on the host (``ON_HOST``) are never
fused.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

from treadle.graph.graph import Graph
from treadle.graph.ops.transform import PAD_MODES, transpose_perm
from treadle.graph.operator import Operator
from treadle.graph.tensor import Tensor, normalize_dim
from treadle.ir.compute import Compute, reachable
from treadle.ir.expr import Const, Expr, Load, Select, as_expr
from treadle.ir.functor import walk
from treadle.ir.simplify import simplify_expr


@dataclass(eq=False)
class Group:
    anchor: Operator
    prologues: list[Operator] = field(default_factory=list)
    epilogues: list[Operator] = field(default_factory=list)
    # The tensors the group's kernel writes: read outside the group or returned by the
    # graph (all the anchor's outputs when nothing is fused after it).
    outputs: list[Tensor] = field(default_factory=list)

    @property
    def ops(self) -> list[Operator]:
        return [*self.prologues, self.anchor, *self.epilogues]

    @property
    def is_view(self) -> bool:
        return is_view(self.anchor)

    @property
    def name(self) -> str:
        return self.anchor.name


# Injective operators never inlined into a reader: a padded or resized copy costs one
# pass, while inlined padding checks bounds at every read and inlined resizing computes
# source positions and weights (and gathers) at every read, and a convolution reads each
# element as many times as its kernel has taps (canonicalize splits padding off
# convolutions). Segformer's head resized into its 1x1 convolution's packing ran that
# convolution 2.5x slower than resizing first.
MATERIALISED = frozenset({"Pad", "Resize"})

# Operators whose kernel checks every element it copies: fused into another kernel, only
# their definition (an identity) would remain.
CHECKING = frozenset({"CheckIndices"})

# Operators the executor runs as host steps, not kernels (a Loop calls its compiled body
# from Python): nothing is fused into them.
ON_HOST = frozenset({"Loop"})


# The most buffers epilogues grow a kernel to. The C compiler's time on one body grows
# faster than its length: an exporter's recurrence unrolled over 256 steps, each step
# stored, made one kernel of 768 buffers that took gcc 15 s; in kernels of 40 it takes a
# time linear in the steps (and each is one the step runner calls).
MAX_BUFFERS = 40


def is_view(op: Operator) -> bool:
    # A view whose symbolic sizes need a run-time check runs as a copying kernel, since
    # only kernels check conditions.
    return op.opdef.view and not op.checks


def is_injective(op: Operator) -> bool:
    """One output, computed element by element without reductions. An operator bringing
    its own kernel (``OpDef.kernel``) is not: its definition does not say how."""
    if is_view(op) or len(op.definition) != 1 or op.op_type in CHECKING | ON_HOST \
            or op.opdef.kernel is not None:
        return False
    return not any(c.is_reduction for c in reachable(op.definition).values())


@dataclass(frozen=True)
class Padding:
    """An operator whose element at index i is its input's at i - ``before`` inside the
    input's edges and, past them, ``fill``, or where ``fill`` is None the element that
    ``mode`` (edge, reflect) folds the position back to."""
    before: tuple[int, ...]
    fill: Const | None
    mode: str = "constant"


# Pad modes whose border repeats the input's own elements; a kernel writing the interior
# fills such a border by copying after it (see fusion). Wrap stays a kernel of its own.
FOLDED_MODES = ("edge", "reflect")


def padding_of(op: Operator) -> Padding | None:
    """The padding a Pad applies: constant mode with a constant fill, read off its
    definition ``select(inside, x[i - before], fill)``, or edge or reflect mode, whose
    definition reads x at each position folded back; None for any other operator."""
    if op.op_type != "Pad" or len(op.definition) != 1:
        return None
    out = op.definition[0]
    value = out.value
    mode = op.attrs.get("mode", "constant")
    if mode in FOLDED_MODES:
        return _folded_padding(op, mode)
    if not (isinstance(value, Select) and isinstance(value.then, Load)
            and isinstance(value.otherwise, Const)
            and value.then.buffer == op.input_buffers[0]
            and len(value.then.indices) == len(out.axes)):
        return None
    offsets = [simplify_expr(axis - index) for axis, index in zip(out.axes, value.then.indices)]
    if not all(isinstance(o, Const) and o.value >= 0 for o in offsets):
        return None  # a crop
    return Padding(tuple(int(o.value) for o in offsets), value.otherwise)


def _folded_padding(op: Operator, mode: str) -> Padding | None:
    """An edge or reflect padding of dimensions of static sizes (others may be symbolic):
    each padded dimension's offset is the one at which the definition is exactly that
    mode's."""
    out, load = op.definition[0], op.definition[0].value
    if not (isinstance(load, Load) and load.buffer == op.input_buffers[0]):
        return None
    before = []
    for axis, index, size, inner in zip(out.axes, load.indices, out.shape, op.inputs[0].shape):
        index = simplify_expr(index)
        size, inner = normalize_dim(size), normalize_dim(inner)
        if index == axis:
            before.append(0)
            continue
        if not (isinstance(size, int) and isinstance(inner, int)):
            return None
        offsets = [b for b in range(size - inner + 1)
                   if simplify_expr(as_expr(PAD_MODES[mode](axis - b, inner))) == index]
        if not offsets:
            return None
        before.append(offsets[0])
    return Padding(tuple(before), None, mode)


def reads_one_to_one(op: Operator, tensors: set[int]) -> bool:
    """Whether ``op`` (injective) reads some of ``tensors``, each load taking one element
    per output element and every element once (its own index, or a transposition): the
    map from those elements to its own is a bijection."""
    out = op.definition[0]
    buffers = {b for b, t in zip(op.input_buffers, op.inputs)
               if b is not None and t is not None and id(t) in tensors}
    reads = [(c, load) for c in reachable(op.definition).values() for load in c.loads()
             if load.buffer in buffers]
    return bool(reads) and all(c is out and element_map(load, out) is not None
                               for c, load in reads)


def element_map(load: Load, c: Compute) -> tuple[int | None, ...] | None:
    """For each axis of ``c``, the position of ``load``'s index that it is (None for a
    size-1 axis the load does not use), when the load reads its whole buffer one element
    per element of ``c``; otherwise None. A size-1 dimension may be read at 0, as
    broadcasting writes it."""
    one, zero = as_expr(1), as_expr(0)
    position: dict[Expr, int] = {}
    for k, (i, d) in enumerate(zip(load.indices, load.buffer.shape)):
        if i in c.axes and i not in position and d == c.shape[c.axes.index(i)]:
            position[i] = k
        elif not (d == one and i == zero):
            return None
    if any(a not in position and d != one for a, d in zip(c.axes, c.shape)):
        return None
    return tuple(position.get(a) for a in c.axes)


PAGE_BYTES = 4096  # elements this far apart lie in different pages (and TLB entries)


# Inlined into its reader, a group's operators run wherever their results are loaded:
# once per load of each result, and again inside each later operator of the group that
# reads it. Past this factor on the group's work it stays a kernel of its own.
MAX_RECOMPUTATION = 2.0


def recomputation(ops: Sequence[Operator], readers: Sequence[Operator]) -> float:
    """How many times over the work of ``ops`` (injective, in graph order) is done when
    they are inlined into ``readers``: each operator runs once per load of its result in
    the readers, plus once per load in each later operator of ``ops`` for every time
    that one runs; work is counted in expression nodes. An exporter's unrolled
    recurrence whose every step the reader loads runs step t t times over."""
    runs: dict[int, int] = {}
    for op in reversed(ops):
        out = op.outputs[0]
        runs[id(op)] = sum(_loads_of(out, reader) for reader in readers) + sum(
            _loads_of(out, later) * runs[id(later)] for later in ops if id(later) in runs)
    sizes = {id(op): sum(1 for _ in walk(op.definition[0].value)) for op in ops}
    return sum(runs[k] * size for k, size in sizes.items()) / max(1, sum(sizes.values()))


def _loads_of(tensor: Tensor, op: Operator) -> int:
    """How many loads of ``tensor`` ``op``'s definition makes."""
    buffers = {b for b, t in zip(op.input_buffers, op.inputs) if t is tensor and b is not None}
    return sum(1 for c in reachable(op.definition).values() for load in c.loads()
               if load.buffer in buffers) if buffers else 0


class _Partitioner:
    def __init__(self, graph: Graph):
        self.graph = graph
        self.position = {id(op): k for k, op in enumerate(graph.nodes)}
        self.consumers: dict[int, list[Operator]] = {}
        for op in graph.nodes:
            for t in op.inputs:
                if t is not None and op not in self.consumers.setdefault(id(t), []):
                    self.consumers[id(t)].append(op)
        self.graph_outputs = {id(t) for t in graph.outputs}
        self.group_of: dict[int, Group] = {}
        # The first and last graph positions of each group of several operators that
        # kept its members since (see _floor).
        self.spans: dict[int, tuple[int, int]] = {}
        # The groups of several operators, by id: those whose spans can hold a floor.
        self.fused: dict[int, Group] = {}
        # Dequantisations left to their reader to compute (see _drop_leaving_dequantized).
        self.recomputed: set[int] = set()

    def run(self) -> list[Group]:
        groups = []
        for op in self.graph.nodes:
            if id(op) not in self.group_of:
                group = Group(op)
                self._join(op, group)
                if not group.is_view and id(op) not in self.recomputed:
                    self._grow_epilogues(group)
                groups.append(group)
        for group in reversed(groups):
            self._absorb_into_consumer(group)
        groups = [g for g in groups if self.group_of[id(g.anchor)] is g]
        for group in groups:
            group.outputs = (self._escaping(group) if group.epilogues
                             else list(group.anchor.outputs))
        return self._execution_order(groups)

    def _join(self, op: Operator, group: Group) -> None:
        """``op`` moves to ``group``, whose lists hold it already."""
        self._leave(op)
        self.group_of[id(op)] = group
        self.spans.pop(id(group), None)
        if group.prologues or group.epilogues:
            self.fused[id(group)] = group

    def _leave(self, op: Operator) -> None:
        left = self.group_of.pop(id(op), None)
        if left is not None:
            self.spans.pop(id(left), None)
            if not (left.prologues or left.epilogues) or \
                    self.group_of.get(id(left.anchor)) is not left:
                self.fused.pop(id(left), None)

    # ---- epilogues -----------------------------------------------------------------------
    def _grow_epilogues(self, group: Group) -> None:
        if len(group.anchor.outputs) != 1 or group.anchor.op_type in ON_HOST:
            return
        produced = {id(group.anchor.outputs[0])}
        read = {id(t) for t in group.anchor.inputs if t is not None}
        frontier = [group.anchor.outputs[0]]
        while frontier:
            tensor = frontier.pop(0)
            for op in self.consumers.get(id(tensor), []):
                if self._can_be_epilogue(op, group, produced) and \
                        self._within_buffers(op, group, produced, read):
                    group.epilogues.append(op)
                    self._join(op, group)
                    if padding_of(op) is None:  # the border is no element of the anchor's
                        produced.add(id(op.outputs[0]))
                        frontier.append(op.outputs[0])
        self._drop_trailing_views(group)
        self._drop_leaving_dequantized(group)

    @staticmethod
    def _within_buffers(op: Operator, group: Group, produced: set[int], read: set[int]
                        ) -> bool:
        """Whether the group's kernel, with ``op`` as one more epilogue, takes at most
        MAX_BUFFERS buffers (counting each epilogue's result as one it may write); if so,
        ``read`` takes ``op``'s inputs from outside the group."""
        outside = {id(t) for t in op.inputs if t is not None and id(t) not in produced}
        if len(read | outside) + len(group.epilogues) + 2 > MAX_BUFFERS:
            return False
        read |= outside
        return True

    def _drop_trailing_views(self, group: Group) -> None:
        """A reshape no epilogue reads after it stays a free view, not a copy."""
        while True:
            members = {id(op) for op in group.ops}
            trailing = [op for op in group.epilogues if is_view(op) and not any(
                id(c) in members for c in self.consumers.get(id(op.outputs[0]), []))]
            if not trailing:
                return
            for op in trailing:
                group.epilogues.remove(op)
                self._leave(op)

    def _drop_leaving_dequantized(self, group: Group) -> None:
        """A DequantizeLinear of the group's 8-bit result whose float32 result only one
        operator outside the group reads is left to that reader's kernel, as a prologue:
        the group stores the bytes, not four times as many (a quantised ResNet's block
        outputs, which the next block's residual sum reads)."""
        members = {id(op) for op in group.ops}
        for op in list(group.epilogues):
            readers = self.consumers.get(id(op.outputs[0]), [])
            if (op.op_type == "DequantizeLinear" and op.inputs[0].dtype.bits == 8
                    and len(readers) == 1 and id(readers[0]) not in members
                    and id(op.outputs[0]) not in self.graph_outputs):
                group.epilogues.remove(op)
                self._leave(op)
                self.recomputed.add(id(op))

    def _padding_fits(self, op: Operator, padding: Padding) -> bool:
        """Whether a padding joins its producer's kernel. A folded one (edge, reflect) only
        as the kernel's sole result read by anchors alone: an injective reader would take
        the padded tensor into its own kernel through a prologue (Candy's last 9x9
        convolution, NCHW, read its input's transposition so and ran 4.5x slower), and
        Candy's residual sums written twice, plain and padded, ran three times slower than
        a kernel each."""
        if padding.fill is not None:
            return True
        source = op.inputs[0]
        return (self.consumers.get(id(source), []) == [op] and id(source) not in self.graph_outputs
                and all(not (is_injective(r) or is_view(r))
                        for r in self.consumers.get(id(op.outputs[0]), [])))

    def _can_be_epilogue(self, op: Operator, group: Group, produced: set[int]) -> bool:
        if id(op) in self.group_of or not self._reads_as_epilogue(op, produced):
            return False
        # A view's target shape counts too: one computed from a Shape of a tensor the
        # group writes (dynamo's exports of grouped-query attention) needs the group.
        outside = [t for t in op.inputs if t is not None and id(t) not in produced]
        return not any(self._depends_on(t, group) for t in outside)

    def _reads_as_epilogue(self, op: Operator, produced: set[int]) -> bool:
        """Whether ``op`` reads the group's results as an epilogue may: a view or padding
        of one, or an injective operator reading them one to one."""
        if is_view(op):
            return id(op.inputs[0]) in produced
        padding = padding_of(op)
        if padding is not None:
            return id(op.inputs[0]) in produced and self._padding_fits(op, padding)
        return (is_injective(op) and not self._scatters_output(op)
                and reads_one_to_one(op, produced))

    def _scatters_output(self, op: Operator) -> bool:
        """Whether ``op`` is a transposition of the graph's output that moves its innermost
        axis to elements a page or more apart: as an epilogue it would store each element
        in another page than the last (a channels-last classifier returned N x C x H x W,
        Segformer's 128 x 128 x 150, ran at half ONNX Runtime's speed), where a kernel of
        its own reads and writes whole lines. A symbolic extent counts as that far: an
        image whose size is symbolic is as likely to be large."""
        if op.op_type != "Transpose" or id(op.outputs[0]) not in self.graph_outputs:
            return False
        rank, out = op.inputs[0].rank, op.outputs[0]
        perm = transpose_perm(op.attrs, rank)
        if rank < 2 or perm[-1] == rank - 1:
            return False
        apart = [normalize_dim(d) for d in out.shape[perm.index(rank - 1) + 1:]]
        return not all(isinstance(d, int) for d in apart) or \
            math.prod(apart) * out.dtype.nbytes >= PAGE_BYTES

    # ---- prologues -----------------------------------------------------------------------
    def _absorb_into_consumer(self, group: Group) -> None:
        """Merges an injective group into the one group that reads all its results."""
        if group.is_view or not all(is_injective(op) and op.op_type not in MATERIALISED
                                    for op in group.ops):
            return
        escaping = self._escaping(group)
        if any(id(t) in self.graph_outputs for t in escaping):
            return
        readers = {self.group_of[id(op)] for t in escaping for op in self.consumers[id(t)]}
        if len(readers) != 1:
            return
        target = readers.pop()
        if target.is_view or target.anchor.op_type in ON_HOST or any(
                self._depends_on(t, target) for op in group.ops for t in op.inputs
                if t is not None) or recomputation(group.ops, target.ops) > MAX_RECOMPUTATION:
            return
        target.prologues[:0] = group.ops
        for op in group.ops:
            self._join(op, target)

    def _escaping(self, group: Group) -> list[Tensor]:
        """The group's results that an operator outside it reads or the graph returns."""
        members = {id(op) for op in group.ops}
        return [t for op in group.ops for t in op.outputs
                if id(t) in self.graph_outputs
                or any(id(c) not in members for c in self.consumers.get(id(t), []))]

    # ---- order ---------------------------------------------------------------------------
    def _depends_on(self, tensor: Tensor, group: Group) -> bool:
        """Whether computing ``tensor`` needs any operator of ``group``. A group's kernel
        runs as one, so reaching any of its operators needs the inputs of all of them:
        two groups that each read what the other computes would wait for each other."""
        members = {id(op) for op in group.ops}
        floor = self._floor(min(self.position[m] for m in members), group)
        stack, seen = [tensor.producer], set()
        while stack:
            op = stack.pop()
            if op is None or id(op) in seen or self.position[id(op)] < floor:
                continue
            if id(op) in members:
                return True
            owner = self.group_of.get(id(op))
            for other in (owner.ops if owner is not None else [op]):
                seen.add(id(other))
                stack.extend(t.producer for t in other.inputs if t is not None)
        return False

    def _floor(self, first: int, group: Group) -> int:
        """A graph position below which no operator's kernel needs ``group`` (whose first
        operator is at ``first``). Producers precede their readers in graph order, so a
        walk up the inputs only climbs back above a position through a group spanning
        it; lowered past every such span, nothing below can reach the group."""
        groups = {key: g for key, g in self.fused.items() if g is not group}
        for key, g in groups.items():
            if key not in self.spans:
                where = [self.position[id(op)] for op in g.ops]
                self.spans[key] = (min(where), max(where))
        floor, lowered = first, True
        while lowered:
            lowered = False
            for low, high in (self.spans[key] for key in groups):
                if low < floor <= high:
                    floor, lowered = low, True
        return floor

    def _execution_order(self, groups: list[Group]) -> list[Group]:
        """Groups after every group they read from; otherwise in graph order."""
        order: list[Group] = []
        done: set[int] = set()

        started: set[int] = set()

        def visit(group: Group) -> None:
            if id(group) in done:
                return
            if id(group) in started:  # fusion let two groups read each other's results
                raise AssertionError(f"fusion groups depend on each other at {group.name!r}")
            started.add(id(group))
            members = {id(op) for op in group.ops}
            for op in group.ops:
                for t in op.inputs:
                    if t is not None and t.producer is not None and id(t.producer) not in members:
                        visit(self.group_of[id(t.producer)])
            done.add(id(group))
            order.append(group)
        for group in groups:
            visit(group)
        return order


def partition(graph: Graph) -> list[Group]:
    """The graph's operators as fused groups, in an order that runs producers first."""
    return _Partitioner(graph).run()


def format_partition(groups: Sequence) -> str:
    """One line per group (or kernel plan): the anchor, then what is fused before and
    after it."""
    lines = []
    for k, g in enumerate(groups):
        line = f"{k}: {g.anchor!r}"
        if g.prologues:
            line += "\n    prologues: " + ", ".join(op.name for op in g.prologues)
        if g.epilogues:
            line += "\n    epilogues: " + ", ".join(op.name for op in g.epilogues)
        lines.append(line)
    return "\n".join(lines)
