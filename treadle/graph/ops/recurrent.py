"""Recurrent layers: ONNX's LSTM, GRU and RNN, every direction a serial loop over time.

A step reads the hidden state the previous step wrote, so no compute definition expresses
the outputs: the operators bring their own kernel. Its lines, one per direction and batch
row, are independent and run in parallel; each walks the sequence (backwards for a
reverse direction) and keeps its state in a workspace of two halves, the previous step's
and the one being written, so every hidden unit of a step reads the whole previous state.
A step first multiplies that state by R, a vector of gate rows at a time (the state's
elements one by one, each times its column of R, so no sum runs across vector lanes),
into a workspace; the gates' activations then run a vector of hidden units at a time.

Each cell comes in two forms that share that kernel:
* the ONNX operator (``LSTM``) multiplies each step's input by W the same way;
* the internal ``LSTMSteps`` reads X·Wᵀ precomputed in its input 0, [seq, batch,
  directions * gates * hidden] (or batch first, as ``layout`` 1 has X), has no input 1
  (W) and takes R transposed, [directions, hidden, gates * hidden], each column of the
  product contiguous: ``passes.hoist_input_projection`` computes X·Wᵀ before the loop as
  one MatMul of the whole sequence by every direction's weights, on the GEMM template.
The biases, the peepholes, ``clip``, ``sequence_lens`` and the initial states are read in
the steps, as ONNX defines them.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Iterator, Optional, Sequence

from treadle.config import config
from treadle.graph.operator import OpContext, Operator, register
from treadle.graph.ops.common import same_dtype, static_dim
from treadle.graph.ops.elementwise import UNARY
from treadle.graph.tensor import Dim, normalize_dim
from treadle.ir import dtypes
from treadle.ir.builder import FunctionBuilder
from treadle.ir.compute import Compute, compute
from treadle.ir.expr import (Buffer, Const, Expr, Load, Var, as_expr, call, cast, eq,
                             maximum, minimum, select)
from treadle.schedule.kernel import Kernel
from treadle.schedule.rules import canonical_kernel

Activation = Callable[[Expr], Expr]
# Rows of a product with W or R summed together in registers: four AVX-512 vectors (eight
# AVX2 ones) of sums, with the state's element and R's row besides.
ROW_BLOCK = 64


@dataclass(frozen=True)
class Cell:
    """What tells an LSTM, a GRU and an RNN apart."""
    gates: int                   # rows of W and R per direction, in hidden sizes
    activations: tuple[str, ...]  # a direction's default activation functions
    states: int                  # state outputs after Y: Y_h, and Y_c for the LSTM
    inputs: int                  # the ONNX operator's inputs, optional ones included
    resets: bool                 # a GRU: may need the reset hidden state of every unit
    step: Callable[["Step"], None]


# Activations ONNX names for recurrent layers besides the element-wise ops', and which of
# those take (alpha, beta): their defaults, as ONNX Runtime fills in missing ones.
EXTRA_ACTIVATIONS = {
    "Affine": lambda x, a: _c(a["alpha"], x) * x + _c(a["beta"], x),
    "ScaledTanh": lambda x, a: _c(a["alpha"], x) * call("tanh", _c(a["beta"], x) * x),
}
PARAMETERS = {"LeakyRelu": (0.01, None), "ThresholdedRelu": (1.0, None), "Elu": (1.0, None),
              "HardSigmoid": (0.2, 0.5), "Affine": (1.0, 0.0), "ScaledTanh": (1.0, 1.0)}
ACTIVATIONS = {name.lower(): (name, f) for name, f in {
    **{n: UNARY[n] for n in ("Relu", "Tanh", "Sigmoid", "LeakyRelu", "ThresholdedRelu",
                             "HardSigmoid", "Elu", "Softsign", "Softplus")},
    **EXTRA_ACTIVATIONS}.items()}
DIRECTIONS = {"forward": 1, "reverse": 1, "bidirectional": 2}


def _c(value: float, like: Expr) -> Const:
    return Const(value, like.dtype)


@dataclass(frozen=True)
class Layer:
    """A recurrent node's sizes and attributes, as its definition and kernel read them."""
    cell: Cell
    direction: str
    hidden: int
    seq: Dim
    batch: Dim
    layout: int
    clip: Optional[float]
    activations: tuple[tuple[Activation, ...], ...]  # per direction
    linear_before_reset: bool

    @property
    def directions(self) -> int:
        return DIRECTIONS[self.direction]

    def reverse(self, d: int) -> bool:
        return self.direction == "reverse" or d == 1

    def at_time(self, t, b) -> tuple:
        """X's (and the projected input's) leading index of time ``t``, batch row ``b``."""
        return (b, t) if self.layout else (t, b)

    def y_index(self, t, d, b, j) -> tuple:
        return (b, t, d, j) if self.layout else (t, d, b, j)

    def state_index(self, d, b, j) -> tuple:
        return (b, d, j) if self.layout else (d, b, j)

    def clipped(self, x: Expr) -> Expr:
        if self.clip is None:
            return x
        return minimum(maximum(x, _c(-self.clip, x)), _c(self.clip, x))


def _layer(ctx: OpContext, cell: Cell, projected: bool) -> Layer:
    """The node's layer, its attributes checked (sizes are checked by ``_check_shapes``);
    ``projected``: the internal form, which reads R transposed."""
    direction = ctx.attr("direction", "forward")
    if direction not in DIRECTIONS:
        raise ctx.error(f"direction must be one of {sorted(DIRECTIONS)}, got {direction!r}")
    layout = ctx.attr("layout", 0)
    if layout not in (0, 1):
        raise ctx.error(f"layout must be 0 or 1, got {layout}")
    x, r = ctx.tensors[0].shape, ctx.tensors[2].shape
    if len(x) != 3 or len(r) != 3:
        raise ctx.error(f"X and R must have rank 3, got shapes {list(x)} and {list(r)}")
    hidden = static_dim(ctx, r[1 if projected else 2], "hidden_size (R's width)")
    seq, batch = (x[1], x[0]) if layout else (x[0], x[1])
    clip = ctx.attr("clip")
    if clip is not None and clip <= 0:
        raise ctx.error(f"clip must be positive, got {clip}")
    return Layer(cell, direction, hidden, seq, batch, layout,
                 None if clip is None else float(clip),
                 _activations(ctx, cell, DIRECTIONS[direction]),
                 bool(ctx.attr("linear_before_reset", 0)))


def _activations(ctx: OpContext, cell: Cell, directions: int
                 ) -> tuple[tuple[Activation, ...], ...]:
    """Each direction's activation functions, taking ``activation_alpha`` and ``_beta`` in
    order among the functions that have such a parameter."""
    names = ctx.attr("activations") or list(cell.activations) * directions
    if len(names) != len(cell.activations) * directions:
        raise ctx.error(f"activations must list {len(cell.activations)} function(s) per "
                        f"direction, got {names}")
    alphas = list(ctx.attr("activation_alpha", []))
    betas = list(ctx.attr("activation_beta", []))
    functions = []
    for name in names:
        if name.lower() not in ACTIVATIONS:
            raise ctx.unsupported(f"activation {name!r} is not supported; supported: "
                                  f"{sorted(n for n, _ in ACTIVATIONS.values())}")
        known, f = ACTIVATIONS[name.lower()]
        alpha, beta = PARAMETERS.get(known, (None, None))
        params = {"alpha": alphas.pop(0) if alpha is not None and alphas else alpha,
                  "beta": betas.pop(0) if beta is not None and betas else beta}
        functions.append(_bound(f, {k: v for k, v in params.items() if v is not None}))
    per = len(cell.activations)
    return tuple(tuple(functions[d * per:(d + 1) * per]) for d in range(directions))


def _bound(f: Callable, params: dict) -> Activation:
    return lambda x: f(x, params)


def _check_shapes(ctx: OpContext, layer: Layer, projected: bool) -> None:
    """The weights', biases', lengths' and initial states' sizes against the layer's."""
    dirs, rows, h = layer.directions, layer.cell.gates * layer.hidden, layer.hidden
    features = ctx.tensors[0].shape[2]
    expected = {2: ("R", (dirs, rows, h)) if not projected else ("Rᵀ", (dirs, h, rows)),
                3: ("B", (dirs, 2 * rows)),
                4: ("sequence_lens", (layer.batch,)),
                5: ("initial_h", layer.state_index(dirs, layer.batch, h)),
                6: ("initial_c", layer.state_index(dirs, layer.batch, h)),
                7: ("P", (dirs, 3 * h))}
    if projected:
        expected[0] = ("the projected input", (*layer.at_time(layer.seq, layer.batch),
                                                dirs * rows))
    else:
        expected[1] = ("W", (dirs, rows, features))
    for i, (what, shape) in sorted(expected.items()):
        if i >= layer.cell.inputs or not ctx.has_input(i):
            continue
        got, want = ([normalize_dim(d) for d in dims] for dims in (ctx.tensors[i].shape, shape))
        if len(got) != len(want) or any(isinstance(a, int) and isinstance(b, int) and a != b
                                        for a, b in zip(got, want)):
            raise ctx.error(f"{what} (input {i}) must have shape {[str(d) for d in want]}, "
                            f"got {[str(d) for d in got]}")
    if ctx.has_input(4) and ctx.tensors[4].dtype != dtypes.int32:
        raise ctx.error(f"sequence_lens must be int32, got {ctx.tensors[4].dtype}")
    if ctx.has_input(1) == projected:
        raise ctx.error("W (input 1) is required" if not projected else
                        "takes no W (input 1): its input 0 is projected already")


def _define(ctx: OpContext, cell: Cell, projected: bool) -> list[Compute]:
    if ctx.num_inputs > cell.inputs:
        raise ctx.error(f"takes at most {cell.inputs} inputs, got {ctx.num_inputs}")
    for required in (0, 2):  # X and R
        ctx.input(required)
    layer = _layer(ctx, cell, projected)
    _check_shapes(ctx, layer, projected)
    present = [ctx.buffers[i] for i in range(ctx.num_inputs)
               if ctx.has_input(i) and i != 4]
    dtype = same_dtype(ctx, *present)
    if dtype not in (dtypes.float32, dtypes.float64):
        raise ctx.unsupported(f"{dtype} inputs; float32 and float64 are supported")
    dirs, batch, h = layer.directions, layer.batch, layer.hidden
    shapes = [layer.y_index(layer.seq, dirs, batch, h)]
    shapes += [layer.state_index(dirs, batch, h)] * cell.states
    results = [Buffer(f"{ctx.op_type}:{k}", dtype, s) for k, s in enumerate(shapes)]
    return [compute(n, s, lambda *i, b=b: Load(b, i))
            for n, s, b in zip(("Y", "Y_h", "Y_c"), shapes, results)]


# ---- the kernel --------------------------------------------------------------------------

@dataclass(frozen=True)
class Buffers:
    """A kernel's buffers: the operator's inputs by ONNX position (None where absent), its
    outputs, and its workspaces, a row of each per line: the hidden state in two halves,
    the gates' shares of the state and (ONNX form) of the input, the cell state (LSTM),
    the reset hidden state (GRU, reset before the product with R)."""
    layer: Layer
    inputs: tuple[Optional[Buffer], ...]
    outputs: tuple[Buffer, ...]
    state: Buffer
    recurrent: Buffer
    input_products: Optional[Buffer]
    cell: Optional[Buffer]
    reset: Optional[Buffer]
    where: str
    # Fewer lines than threads (one utterance): the lines run one after the other and
    # each step's products are shared out among the threads by blocks of rows instead.
    split_steps: bool = False

    def input(self, i: int) -> Optional[Buffer]:
        return self.inputs[i] if i < len(self.inputs) else None

    @property
    def zero(self) -> Const:
        return Const(0.0, self.state.dtype)


@dataclass(frozen=True)
class Step:
    """One step of one line (direction ``d``, batch row ``b``) at time ``t``: it reads the
    state's half ``prev`` and writes the other. Products with W and R go row by row of the
    gates, a vector of them at a time (each element of the state times its column of R),
    into workspaces; the activations then run a vector of hidden units at a time."""
    fb: FunctionBuilder
    io: Buffers
    d: int
    b: Expr
    line: Expr
    t: Expr
    prev: Expr

    @property
    def hidden(self) -> int:
        return self.io.layer.hidden

    def activation(self, k: int, x: Expr) -> Expr:
        """Activation function ``k`` of this direction of the clipped ``x``."""
        return self.io.layer.activations[self.d][k](self.io.layer.clipped(x))

    def h_prev(self, k) -> Expr:
        return self.io.state[self.line, self.prev, k]

    def bias(self, row, recurrent: bool) -> Expr:
        """The input's (or the recurrence's) bias of a gate row, zero without B."""
        b = self.io.input(3)
        if b is None:
            return self.io.zero
        return b[self.d, row + self.io.layer.cell.gates * self.hidden if recurrent else row]

    def pre(self, gate: int, j) -> Expr:
        """A gate's pre-activation at unit ``j`` from the products with W and R (those of
        the gate's rows ``project_state`` last computed), before peepholes and clipping."""
        return self.input_part(gate, j) + self.recurrent_part(gate, j)

    def input_part(self, gate: int, j) -> Expr:
        """X_t·Wᵀ with the input's bias, of a gate at unit ``j``."""
        layer, row = self.io.layer, gate * self.hidden + j
        if self.io.input_products is not None:
            return self.io.input_products[self.line, row]
        offset = self.d * layer.cell.gates * self.hidden  # all directions side by side
        x = self.io.inputs[0]
        return x[(*layer.at_time(self.t, self.b), offset + row)] + self.bias(row, False)

    def recurrent_part(self, gate: int, j) -> Expr:
        """H·Rᵀ with the recurrence's bias, of a gate at unit ``j``."""
        return self.io.recurrent[self.line, gate * self.hidden + j]

    def project_input(self) -> None:
        """X_t·Wᵀ and the input's biases, for every gate (ONNX form)."""
        x, w = self.io.inputs[0], self.io.inputs[1]
        at = self.io.layer.at_time(self.t, self.b)
        self._products(self.io.input_products, range(self.io.layer.cell.gates),
                       lambda k: x[(*at, k)], x.shape[2],
                       lambda row, k: w[self.d, row, k], lambda row: self.bias(row, False))

    def project_state(self, gates: Sequence[int], vector: Optional[Callable] = None) -> None:
        """``vector``·Rᵀ (by default the previous hidden state's) and the recurrence's
        biases, for ``gates``. The internal form reads R transposed, each column of the
        product contiguous."""
        r, transposed = self.io.inputs[2], self.io.input_products is None
        self._products(self.io.recurrent, gates, vector or self.h_prev, self.hidden,
                       (lambda row, k: r[self.d, k, row]) if transposed
                       else (lambda row, k: r[self.d, row, k]),
                       lambda row: self.bias(row, True))

    def _products(self, into: Buffer, gates: Sequence[int], vector: Callable, extent,
                  weight: Callable, bias: Callable) -> None:
        """``into``'s rows of ``gates`` = bias + sum over k of vector(k) * weight(row, k),
        in blocks of ROW_BLOCK rows whose sums stay in registers over the whole of k:
        summed in ``into`` itself, each multiply-add also loaded and stored a row, and the
        stores bound the step (an LSTM of 256 units ran at a quarter of its speed)."""
        first = min(gates) * self.hidden
        blocks, rest = divmod((max(gates) + 1) * self.hidden - first, ROW_BLOCK)
        kind = "parallel" if self.io.split_steps else "serial"
        for block in self.fb.range(blocks, kind=kind, name="block"):
            self._block(into, first + block * ROW_BLOCK, ROW_BLOCK, vector, extent, weight,
                        bias)
        if rest:
            self._block(into, first + blocks * ROW_BLOCK, rest, vector, extent, weight, bias)

    def _block(self, into: Buffer, start: int, width: int, vector: Callable, extent,
               weight: Callable, bias: Callable) -> None:
        fb = self.fb
        sums = fb.buffer("sums", into.dtype, [width])
        for row in fb.range(width, kind="vectorize", name="row"):
            fb.store(sums, (row,), bias(row + start))
        for k in fb.range(extent, name="k"):
            v = fb.let("v", vector(k))
            for row in fb.range(width, kind="vectorize", name="row"):
                fb.store(sums, (row,), sums[row] + v * weight(row + start, k))
        for row in fb.range(width, kind="vectorize", name="row"):
            fb.store(into, (self.line, row + start), sums[row])

    def units(self) -> Iterator[Var]:
        """A loop over the hidden units, a vector at a time."""
        return self.fb.range(self.hidden, kind="vectorize", name="j")

    def set_hidden(self, j, value: Expr) -> None:
        self.fb.store(self.io.state, (self.line, 1 - self.prev, j), value)


def _lstm_step(st: Step) -> None:
    """Gates in ONNX's order i, o, f, c (peepholes i, o, f); activations f, g, h."""
    fb, io = st.fb, st.io
    p = io.input(7)

    def peephole(x: Expr, gate: int, j, c: Expr) -> Expr:
        return x if p is None else x + p[st.d, gate * st.hidden + j] * c

    st.project_state(range(4))
    for j in st.units():
        c_prev = fb.let("c_prev", io.cell[st.line, j])
        i = fb.let("i", st.activation(0, peephole(st.pre(0, j), 0, j, c_prev)))
        f = fb.let("f", st.activation(0, peephole(st.pre(2, j), 2, j, c_prev)))
        c = fb.let("c", f * c_prev + i * st.activation(1, st.pre(3, j)))
        o = fb.let("o", st.activation(0, peephole(st.pre(1, j), 1, j, c)))
        fb.store(io.cell, (st.line, j), c)
        st.set_hidden(j, o * io.layer.activations[st.d][2](c))  # h: not clipped


def _gru_step(st: Step) -> None:
    """Gates in ONNX's order z, r, h; activations f, g. The hidden gate multiplies R by
    the reset state (r * H, all units of it first) or, with ``linear_before_reset``, the
    reset by R's product."""
    fb, io = st.fb, st.io
    if io.reset is not None:
        st.project_state((0, 1))
        for j in st.units():
            fb.store(io.reset, (st.line, j), st.activation(0, st.pre(1, j)) * st.h_prev(j))
        st.project_state((2,), lambda k: io.reset[st.line, k])
    else:
        st.project_state((0, 1, 2))
    for j in st.units():
        z = fb.let("z", st.activation(0, st.pre(0, j)))
        if io.reset is not None:
            hidden = st.pre(2, j)
        else:
            r = fb.let("r", st.activation(0, st.pre(1, j)))
            hidden = st.input_part(2, j) + r * st.recurrent_part(2, j)
        h = fb.let("h", st.activation(1, hidden))
        st.set_hidden(j, (_c(1.0, z) - z) * h + z * st.h_prev(j))


def _rnn_step(st: Step) -> None:
    st.project_state((0,))
    for j in st.units():
        st.set_hidden(j, st.activation(0, st.pre(0, j)))


def _direction(fb: FunctionBuilder, io: Buffers, d: int, b: Expr, line: Expr) -> None:
    """One line: its initial state, its steps, its final state. Rows of Y past a batch
    row's length are zeros (a reverse direction starts at its last valid row), and so
    are the final states of a row of length 0, as ONNX Runtime has them."""
    layer, y = io.layer, io.outputs[0]
    length = _length(fb, io, b)
    _initial_state(fb, io, d, b, line)
    current = fb.scalar("current", dtypes.index_type, 0)
    for s in fb.range(layer.seq, name="s"):
        with fb.if_(s < length):
            t = fb.let("t", length - 1 - s if layer.reverse(d) else s)
            prev = fb.let("prev", current[()])
            step = Step(fb, io, d, b, line, t, prev)
            if io.input_products is not None:
                step.project_input()
            layer.cell.step(step)
            for j in fb.range(layer.hidden, name="j"):
                fb.store(y, layer.y_index(t, d, b, j), io.state[line, 1 - prev, j])
            fb.store(current, (), 1 - prev)
        with fb.else_():
            for j in fb.range(layer.hidden, name="j"):
                fb.store(y, layer.y_index(s, d, b, j), io.zero)
    stepped = fb.let("stepped", length > 0)
    for j in fb.range(layer.hidden, name="j"):
        at = layer.state_index(d, b, j)
        fb.store(io.outputs[1], at, select(stepped, io.state[line, current[()], j], io.zero))
        if io.cell is not None:
            fb.store(io.outputs[2], at, select(stepped, io.cell[line, j], io.zero))


def _length(fb: FunctionBuilder, io: Buffers, b: Expr) -> Expr:
    """The batch row's sequence length, checked to lie within the sequence."""
    lengths, seq = io.input(4), as_expr(io.layer.seq)
    if lengths is None:
        return seq
    length = fb.let("length", cast(lengths[b], dtypes.index_type))
    fb.assert_((length >= 0) & (length <= seq),
               f"{io.where}: sequence_lens holds {{value}}, outside the sequence's length",
               length)
    return length


def _initial_state(fb: FunctionBuilder, io: Buffers, d: int, b: Expr, line: Expr) -> None:
    """Half 0 of the hidden state, and the cell state, from initial_h and initial_c or
    zero."""
    h0, c0 = io.input(5), io.input(6)
    for j in fb.range(io.layer.hidden, name="j"):
        at = io.layer.state_index(d, b, j)
        fb.store(io.state, (line, 0, j), io.zero if h0 is None else h0[at])
        if io.cell is not None:
            fb.store(io.cell, (line, j), io.zero if c0 is None else c0[at])


def _kernel(op: Operator, name: str, cell: Cell, projected: bool) -> Kernel:
    """``projected``: the internal form, whose input 0 is X·Wᵀ and input 2 Rᵀ."""
    inputs = tuple(op.input_buffers)
    outputs = tuple(c.buffer for c in op.definition)
    layer = _layer(OpContext(op.op_type, op.name, op.inputs, op.attrs), cell, projected)
    batch, hidden, dtype = as_expr(layer.batch), layer.hidden, outputs[0].dtype
    lines = batch * layer.directions
    with FunctionBuilder(name) as fb:
        for b in (*inputs, *outputs):
            if b is not None:
                fb.add_param(b)
        resets = cell.resets and not layer.linear_before_reset
        rows = cell.gates * hidden

        def workspace(what: str, shape: list, wanted: bool = True) -> Optional[Buffer]:
            return fb.param(what, dtype, [lines, *shape]) if wanted else None
        split = (isinstance(layer.batch, int)
                 and layer.batch * layer.directions < config.num_threads)
        io = Buffers(layer, inputs, outputs, workspace("state", [2, hidden]),
                     workspace("recurrent", [rows]),
                     workspace("input_products", [rows], not projected),
                     workspace("cell", [hidden], cell.states > 1),
                     workspace("reset", [hidden], resets), f"node {op.name!r} ({op.op_type})",
                     split)
        for line in fb.range(lines, kind="serial" if split else "parallel", name="line"):
            for d in range(layer.directions):
                with fb.if_(eq(line // batch, d)):
                    _direction(fb, io, d, line % batch, line)
        fb.add_size_symbols([d for b in (*inputs, *outputs) if b is not None for d in b.shape])
    return canonical_kernel(fb.function, inputs, len(outputs))


CELLS = {"LSTM": Cell(4, ("Sigmoid", "Tanh", "Tanh"), 2, 8, False, _lstm_step),
         "GRU": Cell(3, ("Sigmoid", "Tanh"), 1, 6, True, _gru_step),
         "RNN": Cell(1, ("Tanh",), 1, 6, False, _rnn_step)}
for _name, _cell in CELLS.items():
    register(_name, kernel=functools.partial(_kernel, cell=_cell, projected=False))(
        functools.partial(_define, cell=_cell, projected=False))
    register(f"{_name}Steps", internal=True,
             kernel=functools.partial(_kernel, cell=_cell, projected=True))(
        functools.partial(_define, cell=_cell, projected=True))
