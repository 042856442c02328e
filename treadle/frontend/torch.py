"""Importing PyTorch programs: an FX graph of ATen operators becomes a treadle graph.

The graph comes from ``torch.export`` (``from_exported``: parameters, buffers and lifted
constants are named by the export signature) or from dynamo and AOTAutograd
(``from_aten``: the caller says which placeholders hold constants). Both dialects appear:
export keeps composite ops (``aten.linear``, ``aten.conv2d``, ``aten.layer_norm``) while
AOTAutograd decomposes them (``aten.addmm``, ``aten.convolution``,
``aten.native_layer_norm``); the table in ``treadle.frontend.aten`` covers both.

An exported program is made functional before it is imported: ``torch.export`` keeps
in-place ops (``y[:, :2].clamp_()``, ``out += x``), whose writes into the tensors they
alias are left implied, where a converter computes each value once, from its arguments.
Writes into the caller's inputs are left out (the returned outputs are computed from the
written values, with a warning); writes into buffers, which the compiled model freezes,
are refused.

Sizes are read from each node's fake tensor (``meta["val"]``), so symbolic sizes
(``SymInt``) arrive as sympy expressions over the shape environment's symbols, which become
treadle symbols of the same names (or the names a caller gives them).

A compiled module is called as the module is: ``Returns`` puts the graph's outputs back
into the structure the module returns, and ``Weights`` stamps the parameters and buffers,
so that a change since compiling, which the kernels holding them as constants would not
see, is noticed.
"""
from __future__ import annotations

import operator
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

import numpy as np
import torch
import torch.fx
import torch.utils._pytree

from treadle.errors import ModelError, UnsupportedOpError
from treadle.graph.graph import Graph
from treadle.graph.tensor import Dim, Tensor, constant
from treadle.ir import dtypes
from treadle.ir.dtypes import DataType, index_type
from treadle.ir.expr import Expr, Var, as_expr, maximum, minimum

# Nodes that only check or annotate: they produce nothing a computation reads.
CHECKS = {"_assert_tensor_metadata", "_assert_scalar", "sym_constrain_range_for_size",
          "_assert_async", "sym_constrain_range"}


def torch_dtype(dtype: torch.dtype) -> DataType:
    """The treadle dtype of a torch dtype; complex and quantized ones are unsupported."""
    name = str(dtype).removeprefix("torch.")
    if name not in dtypes.BY_NAME:
        raise UnsupportedOpError(f"dtype {dtype} is not supported")
    return dtypes.BY_NAME[name]


def numpy_of(tensor: torch.Tensor) -> np.ndarray:
    """A detached CPU copy of a tensor's contents as numpy (bfloat16 as its raw bits)."""
    tensor = tensor.detach().to("cpu").contiguous()
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(np.uint16).copy()
    return tensor.numpy().copy()


# ---- calling a compiled module --------------------------------------------------------

def versions(tensors: Sequence[torch.Tensor]) -> tuple[list[int], list[int]]:
    """The tensors' version counters and addresses, which a compiled model holding the
    tensors as constants compares at each call: a counter moves with every write in
    place (``load_state_dict``, ``mul_`` under ``no_grad``; not a write through
    ``.data``), an address when the tensor is given new memory (``weight.data = w``)."""
    # Two maps over the C getters take a third less time than one list of pairs.
    return list(map(_VERSION, tensors)), list(map(torch.Tensor.data_ptr, tensors))


_VERSION = operator.attrgetter("_version")


def tensor_of(array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """A tensor sharing ``array``'s memory, of ``dtype`` (bfloat16 arrives as raw bits)."""
    tensor = torch.from_numpy(array)
    return tensor.view(dtype) if dtype == torch.bfloat16 else tensor


def array_of(tensor: torch.Tensor) -> np.ndarray:
    """The tensor's memory as numpy, copied only when not contiguous or not in host
    memory (bfloat16, which numpy lacks, as its raw bits)."""
    tensor = tensor.detach().cpu().contiguous()
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view("uint16")
    return tensor.numpy()


def host_values(values: Iterable) -> list:
    """``values`` with each tensor as its host memory (``array_of``)."""
    return [array_of(v) if isinstance(v, torch.Tensor) else v for v in values]


# (position, order, inverse) of an output that eager lays out other than row-major.
Layout = tuple[int, tuple[int, ...], tuple[int, ...]]


def layouts_of(values: Sequence) -> list[Layout]:
    """The layout of each of the traced output ``values`` (fake tensors, or None) that is
    not row-major: its dimensions ``order``ed from the outermost in memory to the
    innermost, and the inverse permutation."""
    layouts = []
    for k, value in enumerate(values):
        order = _order(value) if isinstance(value, torch.Tensor) else None
        if order is not None and order != tuple(range(len(order))):
            inverse = tuple(sorted(range(len(order)), key=order.__getitem__))
            layouts.append((k, order, inverse))
    return layouts


def _order(value: torch.Tensor) -> Optional[tuple[int, ...]]:
    """The dimensions by decreasing stride (channels_last: N, H, W, C), equal strides of
    size-1 dimensions in logical order; None where a stride has no hint."""
    strides = [s if isinstance(s, int) else s.node.hint for s in value.stride()]
    if any(s is None for s in strides):
        return None
    return tuple(sorted(range(value.dim()), key=lambda d: (-strides[d], d)))


def restrided(outputs, layouts: Sequence[Layout]) -> Any:
    """``outputs`` (a tensor, a tuple or a list) with each one that ``layouts`` names
    copied into that memory order (none is copied that already has it)."""
    single = not isinstance(outputs, (tuple, list))
    laid = [outputs] if single else list(outputs)
    for k, order, inverse in layouts:
        if isinstance(laid[k], torch.Tensor):
            laid[k] = laid[k].permute(order).contiguous().permute(inverse)
    return laid[0] if single else type(outputs)(laid)


class Weights:
    """A module's parameters and buffers: ``stamp()`` is their ``versions``, which differ
    from an earlier stamp once any was written or replaced. It reads each tensor through
    its module's tables, so an attribute given a new tensor is seen too."""

    def __init__(self, module: torch.nn.Module):
        held = [(table, name) for m in module.modules()
                for table in (m._parameters, m._buffers)
                for name, tensor in table.items() if tensor is not None]
        self.tables, self.names = [t for t, _ in held], [n for _, n in held]

    def stamp(self) -> tuple[list[int], list[int]]:
        return versions(list(map(dict.__getitem__, self.tables, self.names)))


@dataclass(frozen=True)
class Returns:
    """How a module returns the graph's outputs: the pytree of its return value (a tensor,
    a tuple, a dict, nested), each output's dtype, and the leaves that are no tensor (a
    ``None``, a number) by position."""
    spec: Any  # torch.utils._pytree.TreeSpec
    dtypes: tuple[torch.dtype, ...]
    constants: Mapping[int, Any]
    layouts: tuple[Layout, ...] = ()  # of the computed outputs, as eager lays them out

    def arrange(self, outputs: Sequence, arguments: Iterable) -> Any:
        """``outputs`` as the module returns them: as tensors in eager's memory layout
        (channels_last stays channels_last) when any of the call's ``arguments`` is one,
        else as the arrays they are."""
        if any(isinstance(a, torch.Tensor) for a in arguments):
            outputs = restrided([tensor_of(o, d) if isinstance(o, np.ndarray) else o
                                 for o, d in zip(outputs, self.dtypes)], self.layouts)
        computed = iter(outputs)
        leaves = [self.constants[k] if k in self.constants else next(computed)
                  for k in range(self.spec.num_leaves)]
        return torch.utils._pytree.tree_unflatten(leaves, self.spec)


# ---- symbolic sizes --------------------------------------------------------------------

def _sympy_converters() -> dict[str, Callable[[list], Dim]]:
    def product(args):
        out = args[0]
        for a in args[1:]:
            out = out * a
        return out

    def total(args):
        out = args[0]
        for a in args[1:]:
            out = out + a
        return out

    def power(args):
        base, exponent = args
        if not isinstance(exponent, int) or exponent < 0:
            raise UnsupportedOpError(f"size expression with power {exponent}")
        return product([base] * exponent) if exponent else 1

    def extreme(fold):
        def convert(args):
            out = args[0]
            for a in args[1:]:
                out = fold(as_expr(out), as_expr(a))
            return out
        return convert

    return {"Add": total, "Mul": product, "Pow": power,
            "FloorDiv": lambda a: a[0] // a[1], "CleanDiv": lambda a: a[0] // a[1],
            "IntTrueDiv": lambda a: a[0] // a[1], "Mod": lambda a: a[0] % a[1],
            "PythonMod": lambda a: a[0] % a[1],
            "CeilDiv": lambda a: (a[0] + a[1] - 1) // a[1],
            "Max": extreme(maximum), "Min": extreme(minimum)}


SYMPY = _sympy_converters()


def size_expr(expr, names: Mapping[str, str]) -> Dim:
    """A sympy size expression as a treadle dimension; ``names`` renames symbols."""
    import sympy
    if isinstance(expr, sympy.Integer) or isinstance(expr, int):
        return int(expr)
    if isinstance(expr, sympy.Symbol):
        return Var(names.get(expr.name, expr.name), index_type)
    kind = type(expr).__name__
    if kind not in SYMPY:
        raise UnsupportedOpError(f"size expression {expr} ({kind}) is not supported")
    return SYMPY[kind]([size_expr(a, names) for a in expr.args])


def as_dim(value, names: Mapping[str, str]) -> Dim:
    """An int or SymInt as a treadle dimension (which a size another node computed is
    already)."""
    if isinstance(value, Expr):
        return value
    if isinstance(value, torch.SymInt):
        from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
        constant_value = value.node.maybe_as_int()
        if constant_value is not None:
            return constant_value
        # No input's shape gives an unbacked size at run time: only a kernel that finds
        # it in the data (nonzero) does, whose symbol ``names`` then holds.
        if any(s.name not in names for s in free_unbacked_symbols(value)):
            raise UnsupportedOpError(f"size {value} is computed from a tensor's contents")
        return size_expr(value.node.expr, names)
    if isinstance(value, (bool, torch.SymBool, torch.SymFloat)):
        raise UnsupportedOpError(f"symbolic value {value} is not a size")
    return int(value)


# ---- the importer ----------------------------------------------------------------------

@dataclass
class Importer:
    """Walks an FX graph, mapping each node's value: tensors to treadle tensors, sizes to
    dimensions, lists and tuples element by element."""
    gm: torch.fx.GraphModule
    constants: Mapping[str, torch.Tensor]  # placeholder name -> contents
    input_names: Mapping[str, str] = field(default_factory=dict)  # placeholder -> graph input
    symbols: Mapping[str, str] = field(default_factory=dict)  # shape-env symbol -> name
    outputs: Optional[Sequence[int]] = None  # the FX outputs the graph returns (None: all)
    values: dict = field(default_factory=dict)
    inputs: list[Tensor] = field(default_factory=list)
    # Sizes a kernel finds in the data, by symbol: the int64 scalar holding each, which
    # the graph returns where the FX graph returns the size.
    counts: dict[Var, Tensor] = field(default_factory=dict)
    given: Optional[set] = None  # the symbols the input tensors' dimensions give

    def bind_found(self, size, op) -> None:
        """The tracer's unbacked ``size`` is the size ``op``'s kernel finds in the data."""
        found = op.data_sizes[0]
        if isinstance(size, torch.SymInt):  # the tracer may know it (none of no elements)
            self.symbols[str(size.node.expr)] = found.symbol.name
        self.counts[Var(found.symbol.name, index_type)] = op.outputs[found.output]

    def run(self, name: str) -> Graph:
        from treadle.frontend.aten import convert_node
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                self.values[node] = self._placeholder(node)
            elif node.op == "get_attr":
                self.values[node] = self._attribute(node)
            elif node.op == "call_function":
                self.values[node] = convert_node(self, node)
            elif node.op == "output":
                return self._graph(node, name)
            else:
                raise UnsupportedOpError(f"FX node {node.name!r} ({node.op}) is not supported")
        raise ModelError("the FX graph has no output node")

    def _placeholder(self, node: torch.fx.Node):
        if node.name in self.constants:
            return self.constant(self.constants[node.name], node.name)
        value = node.meta.get("val")
        if isinstance(value, torch.SymInt) and self._shaped(value):
            return self.dim(value)
        if isinstance(value, torch.SymInt):
            # An integer no input's shape gives (``n.item()`` run in eager, or the size of
            # a tensor the graph does not take) is an input of its own: an int64 scalar.
            return self._input(node, dtypes.int64, ())
        if isinstance(value, torch.SymBool):
            return None  # a guard's condition, which only checks read (and treadle skips)
        if not isinstance(value, torch.Tensor):
            raise UnsupportedOpError(f"input {node.name!r} is a {type(value).__name__}, not a "
                                     "tensor or a size")
        return self._input(node, torch_dtype(value.dtype), self.shape(value))

    def _input(self, node: torch.fx.Node, dtype: DataType, shape: tuple) -> Tensor:
        tensor = Tensor(self.input_names.get(node.name, node.name), dtype, shape)
        self.inputs.append(tensor)
        return tensor

    def _shaped(self, value: torch.SymInt) -> bool:
        """Whether the input tensors' shapes give the size's value at each call: each of
        its symbols is one of their dimensions."""
        if self.given is None:
            self.given = {d.node.expr for node in self.gm.graph.nodes
                          if node.op == "placeholder" and node.name not in self.constants
                          and isinstance(node.meta.get("val"), torch.Tensor)
                          for d in node.meta["val"].shape
                          if isinstance(d, torch.SymInt) and d.node.expr.is_Symbol}
        return value.node.expr.free_symbols <= self.given

    def _attribute(self, node: torch.fx.Node):
        value = self.gm
        for part in node.target.split("."):
            value = getattr(value, part)
        if not isinstance(value, torch.Tensor):
            raise UnsupportedOpError(f"attribute {node.target!r} is a {type(value).__name__}")
        return self.constant(value, node.name)

    def _graph(self, node: torch.fx.Node, name: str) -> Graph:
        results = torch.fx.node.map_arg(node.args[0], lambda n: self.values[n])
        results = list(results) if isinstance(results, (list, tuple)) else [results]
        if self.outputs is not None:
            results = [results[k] for k in self.outputs]
        results = [self.counts.get(r, r) if isinstance(r, Var) else r for r in results]
        for k, r in enumerate(results):
            if not isinstance(r, Tensor):
                raise UnsupportedOpError(f"output {k} is a {type(r).__name__}, not a tensor")
        return Graph.from_outputs(self.inputs, results, name)

    def constant(self, value: torch.Tensor, name: str) -> Tensor:
        return constant(numpy_of(value), name, torch_dtype(value.dtype))

    def dim(self, value) -> Dim:
        return as_dim(value, self.symbols)

    def shape(self, value: torch.Tensor) -> tuple[Dim, ...]:
        return tuple(self.dim(d) for d in value.shape)

    def arg(self, value) -> Any:
        """A node argument with FX nodes replaced by their imported values."""
        return torch.fx.node.map_arg(value, lambda n: self.values[n])


def from_aten(gm: torch.fx.GraphModule, constants: Mapping[str, torch.Tensor], *,
              name: str = "module", input_names: Optional[Mapping[str, str]] = None,
              symbols: Optional[Mapping[str, str]] = None,
              outputs: Optional[Sequence[int]] = None) -> Graph:
    """The graph of an FX graph module of ATen operators whose placeholders named in
    ``constants`` hold those tensors; the other tensor placeholders become graph inputs
    (renamed by ``input_names``), size placeholders their symbolic sizes where the input
    tensors' shapes give them, else int64 scalar inputs. ``outputs`` picks the FX
    outputs, by position, that the graph returns."""
    importer = Importer(gm, constants, dict(input_names or {}), dict(symbols or {}), outputs)
    return importer.run(name)


def from_exported(program: "torch.export.ExportedProgram", name: str = "module",
                  symbols: Optional[Mapping[str, str]] = None) -> Graph:
    """The graph of a ``torch.export`` program: parameters, buffers and constants become
    constant tensors, user inputs graph inputs named as the module's arguments."""
    from torch.export.graph_signature import InputKind
    program = _functional(program)
    constants, names = {}, {}
    state = {**program.state_dict, **program.constants}
    for spec in program.graph_signature.input_specs:
        placeholder = spec.arg.name
        if spec.kind == InputKind.USER_INPUT:
            names[placeholder] = placeholder
        elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            constants[placeholder] = state[spec.target]
        else:
            raise UnsupportedOpError(f"exported input {placeholder!r} of kind {spec.kind.name}")
    return from_aten(program.graph_module, constants, name=name, input_names=names,
                     symbols=symbols, outputs=_returned(program))


def _functional(program: "torch.export.ExportedProgram") -> "torch.export.ExportedProgram":
    """``program`` without in-place ops: a write through a view becomes a scatter of the
    written values into a new copy of its base (``slice_scatter``), which later reads of
    the base and of its views take. Ops without a converter are decomposed by torch's own
    table (``einsum``, ``roll``, ``trace``) until none is left that the table has; the
    others stay, so composite ops (``linear``, ``layer_norm``, attention) reach their
    converters whole. A program that writes nothing and has a converter for every op is
    imported as exported (retracing takes a second for GPT-2)."""
    writes = any(_writes(node) for node in program.graph.nodes)
    decomposed: set = set()
    table = _decompositions(program, decomposed)
    while writes or table:
        program, writes = program.run_decompositions(table), False
        decomposed |= set(table)
        table = _decompositions(program, decomposed)
    return program


def _decompositions(program: "torch.export.ExportedProgram", decomposed: set) -> dict:
    """torch.export's decompositions of the program's ops that have no converter, but
    none again that ``decomposed`` holds (a rule may give back the op it decomposes)."""
    from treadle.frontend.aten import decompositions, is_supported
    missing = {node.target for node in program.graph.nodes
               if node.op == "call_function" and not is_supported(node)} - decomposed
    return decompositions(missing) if missing else {}


def _writes(node: torch.fx.Node) -> bool:
    """Whether a node's operator writes into one of its arguments (``relu_``, ``copy_``)."""
    schema = getattr(node.target, "_schema", None)
    return node.op == "call_function" and schema is not None and schema.is_mutable


def _returned(program: "torch.export.ExportedProgram") -> list[int]:
    """The positions of a functional program's outputs that the module returns. The others
    write into its inputs, left out with a warning, or into its buffers or parameters,
    refused: the compiled model holds them as constants, so later calls would not see the
    write."""
    from torch.export.graph_signature import ConstantArgument, OutputKind
    returned, written = [], []
    for k, spec in enumerate(program.graph_signature.output_specs):
        if spec.kind == OutputKind.USER_OUTPUT:
            if not isinstance(spec.arg, ConstantArgument):  # no tensor: Returns has it
                returned.append(k)
        elif spec.kind == OutputKind.USER_INPUT_MUTATION:
            written.append(f"{spec.target!r} (node {spec.arg.name!r})")
        elif spec.kind in (OutputKind.BUFFER_MUTATION, OutputKind.PARAMETER_MUTATION):
            raise UnsupportedOpError(f"node {spec.arg.name!r} writes {spec.target!r} in place: "
                                     "treadle holds buffers and parameters as constants")
        else:
            raise UnsupportedOpError(f"exported output {spec.arg.name!r} of kind "
                                     f"{spec.kind.name}")
    if written:
        warnings.warn(f"the module writes into its inputs {', '.join(written)} in place; "
                      "the compiled model returns the outputs computed from the written "
                      "values but leaves its arguments unchanged", stacklevel=5)
    return returned


def from_module(module: torch.nn.Module, example_inputs: Sequence, *,
                dims: Optional[Mapping[str, Mapping[int, object]]] = None,
                name: Optional[str] = None) -> tuple[Graph, Returns]:
    """The graph of ``module`` called on ``example_inputs`` (a tensor or a tuple), traced by
    ``torch.export`` in inference mode, and how the module returns its outputs.
    ``dims`` makes dimensions symbolic, by argument name and axis: ``{"x": {1: "seq"}}``;
    a value may also be a ``torch.export.Dim``, whose bounds export checks. The graph's
    symbols take those names."""
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"expected a torch.nn.Module, got {type(module).__name__}")
    if module.training:
        raise ModelError(f"{type(module).__name__} is in training mode; treadle compiles "
                         "for inference: call .eval() first")
    args = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) \
        else (example_inputs,)
    shapes, names = _dynamic_shapes(module, args, dims or {})
    with torch.no_grad():
        program = torch.export.export(module, args, dynamic_shapes=shapes)
    graph = from_exported(program, name or type(module).__name__,
                          _symbol_names(program, names))
    dtypes = tuple(getattr(torch, t.dtype.name) for t in graph.outputs)
    return graph, Returns(program.call_spec.out_spec, dtypes, _constant_outputs(program),
                          tuple(layouts_of(_computed_outputs(program))))


def _computed_outputs(program: "torch.export.ExportedProgram") -> list:
    """The traced values of the module's returned tensors, in order."""
    from torch.export.graph_signature import OutputKind, TensorArgument
    values = {node.name: node.meta.get("val") for node in program.graph.nodes}
    return [values.get(spec.arg.name) for spec in program.graph_signature.output_specs
            if spec.kind == OutputKind.USER_OUTPUT and isinstance(spec.arg, TensorArgument)]


def _constant_outputs(program: "torch.export.ExportedProgram") -> dict[int, Any]:
    """The module's returned values that are no tensor, by position among those it
    returns."""
    from torch.export.graph_signature import ConstantArgument, OutputKind
    returned = [spec.arg for spec in program.graph_signature.output_specs
                if spec.kind == OutputKind.USER_OUTPUT]
    return {k: arg.value for k, arg in enumerate(returned) if isinstance(arg, ConstantArgument)}


def _dynamic_shapes(module: torch.nn.Module, args: tuple, dims: Mapping):
    """torch.export's ``dynamic_shapes`` for ``dims`` (keyed by argument name or by
    position among the tensors passed), and the names it asks for by (position, axis)."""
    if not dims:
        return None, {}
    import inspect
    signature = inspect.signature(module.forward)
    bound = signature.bind(*args)
    made: dict[str, object] = {}  # a torch.export.Dim per name
    names: dict[tuple[int, int], str] = {}
    used: set = set()

    def axes_of(position: int, param: Optional[str]):
        axes = {}
        for key in (position, param):
            for axis, dim in dims.get(key, {}).items() if key in dims else ():
                label = dim if isinstance(dim, str) else dim.__name__
                axes[axis] = made.setdefault(label, torch.export.Dim(label)
                                             if isinstance(dim, str) else dim)
                names[(position, axis)] = label
                used.add(key)
        return axes or None

    shapes, position = {}, 0
    for param, value in bound.arguments.items():
        if signature.parameters[param].kind is inspect.Parameter.VAR_POSITIONAL:
            shapes[param] = tuple(axes_of(position + k, None) for k in range(len(value)))
            position += len(value)
        else:
            shapes[param] = axes_of(position, param)
            position += 1
    unknown = sorted(map(str, set(dims) - used))
    if unknown:
        raise ValueError(f"dims names arguments {unknown}; {type(module).__name__}."
                         f"forward takes {list(bound.arguments)} ({position} tensors)")
    return shapes, names


def _symbol_names(program, names: Mapping[tuple[int, int], str]) -> dict[str, str]:
    """Shape-environment symbol -> the name the user gave its dimension."""
    from torch.export.graph_signature import InputKind
    users = [s.arg.name for s in program.graph_signature.input_specs
             if s.kind == InputKind.USER_INPUT]
    nodes = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    symbols = {}
    for (position, axis), label in names.items():
        size = nodes[users[position]].meta["val"].shape[axis]
        if isinstance(size, torch.SymInt) and size.node.expr.is_Symbol:
            symbols[size.node.expr.name] = label
    return symbols
