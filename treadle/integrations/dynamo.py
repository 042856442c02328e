"""``torch.compile(model, backend="treadle")``: dynamo captures the model, AOTAutograd
lowers it to ATen operators, and treadle compiles every part it supports.

The backend is registered through the ``torch_dynamo_backends`` entry point, so it needs
no import. Compilation waits for the first call: AOTAutograd hands over fake tensors, and
the parameters and buffers (its static inputs) must be real to become constants, which lets
treadle fold and pack them. Each call compares their version counters and addresses with
those compiled, and compiles again when one changed (``load_state_dict``, a write under
``no_grad``, a new tensor); a write through ``.data`` bumps no counter and goes unseen.

Results take the memory layout eager gives them (channels_last stays channels_last): the
traced graph's outputs carry eager's strides, and treadle's row-major results are copied
into that order; a returned view of an input (``x.t()[:n - 1]``), which AOTAutograd
rebuilds from its strides, is made in eager, as the view it is. Dynamo's size symbols are
named by the input dimension they came from (``x.shape[1]``), so errors and dumps speak
of the user's tensors.

ATen nodes without a converter split the graph (``torch.fx``'s capability partitioner):
the supported pieces run in treadle, the rest in eager, and one warning lists the ops. A
piece that treadle then refuses (an argument a converter does not accept) also runs in
eager, with a warning naming the node. Graphs that need gradients run in eager.
"""
from __future__ import annotations

import contextlib
import functools
import operator
import warnings
from collections import Counter
from typing import AbstractSet, Any, Callable, Mapping, Optional, Sequence

import numpy as np
import torch
import torch.fx
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from treadle.errors import TreadleError, UnsupportedOpError
from treadle.frontend.torch import (array_of, from_aten, layouts_of, restrided, tensor_of,
                                    torch_dtype, versions)

OPTIONS = ("tune", "orchestrate", "dynamic", "target")


def treadle_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                    options: Optional[Mapping[str, Any]] = None) -> Callable:
    """The dynamo backend. ``options`` go to ``treadle.compile`` as they are: ``tune``,
    ``orchestrate``, ``target`` (``"cpu"``, ``"cuda"``) and ``dynamic``, size ranges by
    symbol, each symbol named by the input dimension dynamo took it from
    (``{"x.shape[1]": (1, 512)}``); each compiled piece takes those of its own symbols."""
    options = dict(options or {})
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ValueError(f"unknown treadle backend options {unknown}; expected {OPTIONS}")
    if not isinstance(options.get("dynamic", {}), Mapping):
        raise ValueError(f"options['dynamic'] = {options['dynamic']!r}: expected size ranges "
                         "by symbol, named by input dimension: {'x.shape[1]': (1, 512)}")
    if torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad
                                       for x in example_inputs):
        warnings.warn("treadle compiles inference only and this graph needs gradients "
                      "(grad mode is on and an input or parameter requires grad): it runs "
                      "in eager. Call the model under torch.no_grad() or "
                      "torch.inference_mode() to compile it.", stacklevel=2)
        return gm.forward
    from torch._dynamo.backends.common import aot_autograd
    from treadle.frontend.aten import decompositions
    traced: dict = {}
    compile_forward = functools.partial(_forward, options=options, traced=traced)
    with _preserved(PRESERVED):
        # Ops without a converter reach treadle decomposed (roll, trace), not in eager.
        compiled = aot_autograd(fw_compiler=compile_forward,
                                decompositions=decompositions())(gm, example_inputs)
    if _plain(traced.get("metadata"), traced.get("runner"), len(example_inputs)):
        # AOTAutograd's wrapper would only pass the arguments through, with Python work
        # per argument, and dynamo passes every weight (MobileNetV2: 262 of them).
        return traced["runner"].direct
    return compiled


# Composite ops AOTAutograd would decompose into gathers (``_unsafe_index``) that treadle
# imports as one Resize each, which it fuses and vectorises; and recurrent layers, which it
# would unroll over the sequence, node by node (whole, each is one recurrent node).
PRESERVED = ("upsample_nearest2d.vec", "upsample_bilinear2d.vec", "upsample_nearest1d.vec",
             "upsample_linear1d.vec", "lstm.input", "gru.input", "rnn_tanh.input",
             "rnn_relu.input")


@contextlib.contextmanager
def _preserved(names: Sequence[str]):
    """Keeps the named composite ATen ops whole while AOTAutograd traces (torch.export's
    mechanism, private to torch: without it the ops are decomposed, correctly)."""
    try:
        from torch._export.utils import _special_op_to_preserve_cia
        from torch.export.exported_program import _override_composite_implicit_decomp
    except ImportError:
        yield
        return
    ops = {}
    for name in names:
        packet, _, overload = name.partition(".")
        op = getattr(getattr(torch.ops.aten, packet, None), overload, None)
        if op is not None:
            ops[op] = _special_op_to_preserve_cia
    with _override_composite_implicit_decomp(ops):
        yield


def _forward(gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
             options: Mapping[str, Any], traced: dict) -> Callable:
    from torch._guards import TracingContext
    context = TracingContext.try_get()
    metadata = context.fw_metadata if context is not None else None
    static = set(metadata.static_input_indices) if metadata is not None else set()
    runner = _LazyRunner(gm, static, options, _rebuilt(metadata, gm))
    runner._boxed_call = True  # AOTAutograd calls it with one list of arguments
    traced.update(metadata=metadata, runner=runner)
    return runner


def _rebuilt(metadata, gm: torch.fx.GraphModule) -> set[int]:
    """The positions of the traced graph's outputs that AOTAutograd rebuilds as views of
    their base (an input, or an intermediate it adds to the outputs); without its
    metadata, those of every returned view."""
    if metadata is None:
        return {k for k, node in enumerate(_outputs(gm))
                if isinstance(node, torch.fx.Node) and _is_view(node)}
    first = metadata.num_mutated_inp_runtime_indices  # the written inputs come first
    return {first + k for k, info in enumerate(metadata.output_info)
            if info.output_type.name in REBUILT}


def _plain(metadata, runner: Optional["_LazyRunner"], arguments: int) -> bool:
    """Whether the traced forward takes dynamo's arguments as they are and returns its
    outputs as they are: nothing mutated, no output aliasing an input or another output
    (which AOTAutograd's wrapper regenerates), no effect tokens."""
    if metadata is None or runner is None:
        return False
    from torch._functorch._aot_autograd.schemas import OutputType
    placeholders = sum(1 for n in runner.gm.graph.nodes if n.op == "placeholder")
    return (placeholders == arguments and not metadata.mutated_inp_runtime_indices
            and not metadata.num_intermediate_bases and not metadata.tokens
            and all(o.output_type == OutputType.non_alias for o in metadata.output_info))


class _LazyRunner:
    """Compiles at the first call, when the static inputs (weights) hold real values, and
    again at a call where one of them changed since."""

    def __init__(self, gm: torch.fx.GraphModule, static: set[int], options: Mapping,
                 rebuilt: set[int]):
        self.gm, self.static, self.options, self.rebuilt = gm, static, options, rebuilt
        self.positions = sorted(static)
        # A rebuilt view takes its layout from its base.
        self.layouts = layouts_of([None if k in rebuilt else value
                                   for k, value in enumerate(_output_values(gm))])
        self.run: Optional[Callable] = None
        self.stamp: Optional[tuple] = None

    def __call__(self, args: list) -> Any:
        result = self.direct(*args)
        args.clear()  # the boxed convention: the callee releases its arguments
        return result

    def direct(self, *args) -> Any:
        stamp = versions([args[k] for k in self.positions])
        if stamp != self.stamp:
            self.run = split_and_compile(self.gm, self.static, args, self.options,
                                         self.rebuilt)
            self.stamp = stamp
        outputs = self.run(*args)
        return restrided(outputs, self.layouts) if self.layouts else outputs


def _output_values(gm: torch.fx.GraphModule) -> list:
    return [node.meta.get("val") if isinstance(node, torch.fx.Node) else None
            for node in _outputs(gm)]


def _outputs(gm: torch.fx.GraphModule) -> list:
    out = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _is_view(node: torch.fx.Node) -> bool:
    """Whether the node's value is a view of its first argument (``t``, ``slice``, an
    item of ``split``)."""
    if node.op != "call_function":
        return False
    if node.target is operator.getitem:
        return _is_view(node.args[0])
    schema = getattr(node.target, "_schema", None)
    return schema is not None and not schema.is_mutable and any(
        r.alias_info is not None for r in schema.returns)


class _Supported(OperatorSupportBase):
    def is_node_supported(self, submodules, node: torch.fx.Node) -> bool:
        from treadle.frontend.aten import is_supported
        if node.op != "call_function" or node.meta.get(EAGER_VIEW):
            return False
        if node.target is operator.getitem:
            return self.is_node_supported(submodules, node.args[0])
        if not isinstance(node.target, torch._ops.OpOverload):
            return False  # size arithmetic stays in the host graph, its results are inputs
        if node.target in SIZE_READS:
            # The size of a tensor the host graph holds is read there: a piece reading
            # it would return nothing but its input's size, which is no tensor.
            return self.is_node_supported(submodules, node.args[0])
        return is_supported(node) and _tensors_supported(node)


# Marks the copies of returned views that run in eager (see _views_in_eager).
EAGER_VIEW = "treadle_eager_view"

# Outputs that AOTAutograd rebuilds as views of their base.
REBUILT = {"alias_of_input", "alias_of_intermediate", "alias_of_intermediate_save_as_output",
           "alias_of_intermediate_base_is_user_output"}

# Operators that read a tensor's sizes, strides or offset, not its values.
SIZE_READS = {torch.ops.aten.sym_size.int, torch.ops.aten.sym_stride.int,
              torch.ops.aten.sym_storage_offset.default, torch.ops.aten.sym_numel.default}


def _tensors_supported(node: torch.fx.Node) -> bool:
    values = [node.meta.get("val")] + [a.meta.get("val") for a in node.all_input_nodes]
    for value in values:
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(v, torch.Tensor):
                try:
                    torch_dtype(v.dtype)
                except TreadleError:
                    return False
    return True


def split_and_compile(gm: torch.fx.GraphModule, static: set[int], args: Sequence,
                      options: Mapping, rebuilt: AbstractSet[int] = frozenset()
                      ) -> Callable:
    """The graph with its supported parts compiled by treadle; ``args`` are the
    arguments of the call that compiles it, those at ``static`` positions constants;
    the outputs at ``rebuilt`` are views that AOTAutograd rebuilds from their base."""
    gm = _copy(gm)  # the partitioner rewrites the graph it splits
    _views_in_eager(gm.graph, rebuilt)
    frozen = {p.name: args[k] for k, p in enumerate(_placeholders(gm)) if k in static}
    partitioner = CapabilityBasedPartitioner(gm, _Supported(), allows_single_node_partition=True)
    partitions = partitioner.propose_partitions()
    _warn_unsupported(gm, {n for p in partitions for n in p.nodes})
    split = partitioner.fuse_partitions(partitions, prefix="treadle_")
    for node in split.graph.nodes:
        if node.op == "call_module" and node.target.startswith("treadle_"):
            piece = getattr(split, node.target)
            constants = {sub.name: frozen[arg.name] for sub, arg in
                         zip(_placeholders(piece), node.args)
                         if isinstance(arg, torch.fx.Node) and arg.op == "placeholder"
                         and arg.name in frozen}
            setattr(split, node.target, _compile_piece(piece, constants, node.target, options))
    return split


def _views_in_eager(graph: torch.fx.Graph, rebuilt: AbstractSet[int]) -> None:
    """Makes the outputs at ``rebuilt`` (``x.t()[:n - 1]``) in eager, as views of their
    base. AOTAutograd rebuilds an output that aliases an input or an intermediate from
    that base; where the view's arguments are symbolic, it does so with the returned
    tensor's sizes, strides and storage offset, which only a real view of the base has (a
    treadle result is a row-major tensor of its own). Views cost no computation; the
    chain of them is copied, so that other readers keep theirs in the treadle piece
    around it."""
    output = next(n for n in graph.nodes if n.op == "output")
    results = output.args[0]
    single = not isinstance(results, (tuple, list))
    results = [results] if single else list(results)
    copies: dict[torch.fx.Node, torch.fx.Node] = {}
    for k in sorted(rebuilt):
        results[k] = _eager_view(results[k], graph, copies)
    output.args = (results[0] if single else type(output.args[0])(results),)
    for node, copy in copies.items():  # the sizes of a view are its copy's
        node.replace_all_uses_with(copy, delete_user_cb=lambda user: user.target in SIZE_READS)
    for node in reversed(list(copies)):
        if not node.users:
            graph.erase_node(node)


def _eager_view(node: torch.fx.Node, graph: torch.fx.Graph, copies: dict) -> torch.fx.Node:
    """A copy of the chain of views that ends at ``node``, marked to run in eager."""
    if not _is_view(node):
        return node
    if node not in copies:
        source = _eager_view(node.args[0], graph, copies)
        with graph.inserting_after(node):  # before the size reads that move to it
            copy = graph.node_copy(node, lambda a: source if a is node.args[0] else a)
        copy.meta[EAGER_VIEW] = True
        copies[node] = copy
    return copies[node]


def _copy(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    graph = torch.fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    return torch.fx.GraphModule(gm, graph)


def _placeholders(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "placeholder"]


def _warn_unsupported(gm: torch.fx.GraphModule, covered: set) -> None:
    missing = Counter(str(n.target) for n in gm.graph.nodes
                      if n.op == "call_function" and n not in covered
                      and not n.meta.get(EAGER_VIEW) and n.target not in SIZE_READS
                      and isinstance(n.target, torch._ops.OpOverload))
    if missing:
        listed = ", ".join(f"{op} ({count} node{'s' if count > 1 else ''})"
                           for op, count in sorted(missing.items()))
        warnings.warn(f"treadle runs these ATen operators in eager: {listed}", stacklevel=3)


def _compile_piece(piece: torch.fx.GraphModule, constants: Mapping[str, torch.Tensor],
                   name: str, options: Mapping) -> torch.nn.Module:
    """A treadle-compiled piece, or the piece itself (run in eager) when treadle refuses
    it, with a warning saying why."""
    import treadle
    try:
        graph = from_aten(piece, constants, name=name, symbols=_symbol_names(piece))
        dynamic = _ranges(graph, options.get("dynamic"))
        model = treadle.compile(graph, tune=options.get("tune", 0),
                                orchestrate=options.get("orchestrate", False),
                                dynamic=dynamic, target=options.get("target", "cpu"))
    except UnsupportedOpError as err:
        warnings.warn(f"treadle runs part of the graph in eager: {err}", stacklevel=4)
        return piece
    except TreadleError as err:  # a fault of treadle's, not of the model: say so
        warnings.warn(f"treadle runs part of the graph in eager after an internal error, "
                      f"which is a treadle bug worth reporting: {type(err).__name__}: {err}",
                      stacklevel=4)
        return piece
    return _Piece(model, piece, [t.name for t in graph.inputs])


def _symbol_names(piece: torch.fx.GraphModule) -> dict[str, str]:
    """Each size symbol of the piece's inputs named by the first input dimension dynamo
    took it from (``x.shape[1]``), or by dynamo's description of its source; one with no
    source (a size an earlier part found in the data) keeps its own name, since the
    input that holds it gives its value."""
    names = {}
    for node in _placeholders(piece):
        value = node.meta.get("val")
        for size in value.shape if isinstance(value, torch.Tensor) else []:
            if isinstance(size, torch.SymInt) and size.node.expr.is_Symbol:
                sources = size.node.shape_env.var_to_sources.get(size.node.expr)
                name = size.node.expr.name
                names[name] = _source_name(sources[0]) if sources else name
    return names


def _source_name(source) -> str:
    """``x.shape[1]`` for the size of a local tensor, dynamo's own name otherwise."""
    from torch._dynamo.source import LocalSource, TensorProperty, TensorPropertySource
    if isinstance(source, TensorPropertySource) and source.prop is TensorProperty.SIZE \
            and isinstance(source.base, LocalSource):
        return f"{source.base.local_name}.shape[{source.idx}]"
    return source.name


def _ranges(graph, dynamic) -> Optional[dict]:
    """The ranges of the backend's ``dynamic`` option that name the piece's symbols."""
    if dynamic is None:
        return None
    return {s: r for s, r in dynamic.items() if s in graph.symbols} or None


class _Piece(torch.nn.Module):
    """Runs a compiled piece on the host graph's values: constants are baked in, sizes
    are read from the tensors, integers no tensor's shape gives are passed as scalars,
    and results come back as tensors sharing treadle's output memory."""

    def __init__(self, model, piece: torch.fx.GraphModule, inputs: Sequence[str]):
        super().__init__()
        self.model = model
        position = {node.name: k for k, node in enumerate(_placeholders(piece))}
        self.positions = [position[name] for name in inputs]  # the graph's inputs, in order
        out = next(n for n in piece.graph.nodes if n.op == "output").args[0]
        self.returns_tuple = isinstance(out, (tuple, list))
        results = out if self.returns_tuple else [out]
        # A size found in the data comes back as the int64 scalar holding it (None).
        self.output_dtypes = [None if isinstance(r.meta["val"], torch.SymInt)
                              else r.meta["val"].dtype for r in results]

    def forward(self, *args):
        values = [args[k] for k in self.positions]
        tensors = [v for v in values if isinstance(v, torch.Tensor)]
        inputs = [array_of(v) if isinstance(v, torch.Tensor) else np.asarray(v, np.int64)
                  for v in values]
        # The executable takes and gives host arrays: results go back where the inputs
        # live (a GPU model's inputs are copied to the device by its executable).
        device = next((t.device for t in tensors if t.device.type != "cpu"), None)
        outputs = [int(o) if dtype is None else tensor_of(o, dtype)
                   for o, dtype in zip(self.model(*inputs), self.output_dtypes)]
        if device is not None:
            outputs = [o if isinstance(o, int) else o.to(device) for o in outputs]
        return tuple(outputs) if self.returns_tuple else outputs[0]

