"""Models whose shapes depend on the contents of some of their inputs.

An ONNX graph may take a Reshape's target shape, a reduction's axes, a Pad's widths or a
Resize's sizes as graph inputs. treadle plans memory and schedules kernels for known
shapes (or symbols), so such contents must be known when compiling: ``compile`` returns a
``SpecialisingModel``, which compiles the graph again for each distinct set of those
contents with them as constants, at the first call that brings it, and keeps the most
recently used ``MAX_SPECIALISATIONS``. Only small inputs (``MAX_VALUE_ELEMENTS``) with
static shapes qualify: specialising on data would compile at every call.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Callable, Mapping, Sequence, TypeVar

import numpy as np

from treadle.errors import ArgumentError, DTypeError, ModelError, NeedsValueError, ShapeError

if TYPE_CHECKING:
    import onnx

    from treadle.api import CompiledModel

MAX_VALUE_ELEMENTS = 64
MAX_SPECIALISATIONS = 16

T = TypeVar("T")


def value_inputs(proto: onnx.ModelProto, tensor: str) -> list[str]:
    """The small, static-shaped graph inputs the tensor named ``tensor`` is computed from."""
    producers = {out: node for node in proto.graph.node for out in node.output}
    candidates = {i.name: i for i in _runtime_inputs(proto) if _small(i)}
    found, seen, stack = [], set(), [tensor]
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in candidates:
            found.append(name)
        elif name in producers:
            stack.extend(n for n in producers[name].input if n)
    return sorted(found)


def bind_needed(proto: onnx.ModelProto, names: Sequence[str], given: Mapping,
                build: Callable[[onnx.ModelProto], T],
                read: Callable[[str], np.ndarray] | None = None) -> tuple[T, list[str]]:
    """``build`` of ``proto`` with the inputs ``names`` bound to their contents in ``given``
    (through ``read``, by default as arrays), and those names. Where that still needs the
    contents of other inputs, they join the names and ``build`` runs again; one that
    ``given`` lacks is an ArgumentError naming it."""
    read = read or (lambda n: np.asarray(given[n]))
    names = list(names)
    while True:
        try:
            bound = bind_inputs(proto, {n: read(n) for n in names}) if names else proto
            return build(bound), names
        except NeedsValueError as err:
            more = [n for n in value_inputs(proto, err.tensor) if n not in names]
            missing = [n for n in more if n not in given]
            if missing:
                raise ArgumentError(f"{err}; the contents of inputs {missing} decide it: give "
                                    "them by name") from None
            if not more:
                raise
            names += more


def _runtime_inputs(proto: onnx.ModelProto) -> list:
    constants = {t.name for t in proto.graph.initializer}
    return [i for i in proto.graph.input if i.name not in constants]


def _static_shape(info) -> tuple[int, ...] | None:
    dims = info.type.tensor_type.shape.dim
    if not info.type.tensor_type.HasField("shape") or any(not d.HasField("dim_value")
                                                          for d in dims):
        return None
    return tuple(d.dim_value for d in dims)


def _small(info) -> bool:
    shape = _static_shape(info)
    return shape is not None and int(np.prod(shape)) <= MAX_VALUE_ELEMENTS


class SpecialisingModel:
    """A compiled model (same calling convention as ``CompiledModel``) that compiles its
    graph for the contents of ``value_inputs`` at the first call bringing them."""

    def __init__(self, proto: onnx.ModelProto, inputs: Sequence[str],
                 compile_bound: Callable[[onnx.ModelProto], CompiledModel], name: str):
        self.proto = proto
        self.name = name
        self.value_inputs = list(inputs)
        self._compile = compile_bound
        self._models: OrderedDict[tuple, CompiledModel] = OrderedDict()
        self._lock = threading.Lock()
        self._declared = {i.name: i for i in _runtime_inputs(proto)}

    @property
    def input_names(self) -> list[str]:
        return list(self._declared)

    @property
    def output_names(self) -> list[str]:
        return [o.name for o in self.proto.graph.output]

    def __call__(self, *args, **named) -> list[np.ndarray]:
        arrays = self._by_name(args, named)
        model = self.specialise(arrays)
        return model(**{k: v for k, v in arrays.items() if k not in self.value_inputs})

    def specialise(self, arrays: dict) -> CompiledModel:
        """The model compiled for the contents of the value inputs among ``arrays`` (by
        name), whose other inputs it takes."""
        with self._lock:
            return self._specialised(arrays)

    @property
    def specialisations(self) -> int:
        """How many compiled versions are kept."""
        return len(self._models)

    def save(self, directory) -> None:
        raise ModelError(f"model {self.name!r}: its shapes depend on the contents of inputs "
                         f"{self.value_inputs}, so it is compiled per call and cannot be "
                         "saved; give them as initializers to compile it once")

    def __repr__(self) -> str:
        return (f"SpecialisingModel({self.name!r}, inputs={self.input_names}, "
                f"outputs={self.output_names}, on the contents of {self.value_inputs})")

    def _by_name(self, args: Sequence, named: dict) -> dict[str, object]:
        names = self.input_names
        if len(args) > len(names):
            raise ArgumentError(f"model {self.name!r} takes {len(names)} inputs "
                                f"({', '.join(names)}), got {len(args)}")
        arrays = dict(zip(names, args))
        for key, value in named.items():
            if key not in self._declared:
                raise ArgumentError(f"model {self.name!r} has no input {key!r}; its inputs "
                                    f"are {names}")
            if key in arrays:
                raise ArgumentError(f"input {key!r} is given twice")
            arrays[key] = value
        return arrays

    def _specialised(self, arrays: dict) -> CompiledModel:
        """The model compiled for these contents of the value inputs (the lock is held)."""
        key = self._key(arrays)
        if key in self._models:
            self._models.move_to_end(key)
            return self._models[key]
        model, names = bind_needed(self.proto, self.value_inputs, arrays, self._compile,
                                   lambda n: self._value(n, arrays))
        if names != self.value_inputs:  # found once the others were given: asked for from now
            self.value_inputs = names
            self._models.clear()
            key = self._key(arrays)
        self._models[key] = model
        if len(self._models) > MAX_SPECIALISATIONS:
            self._models.popitem(last=False)
        return model

    def _key(self, arrays: dict) -> tuple:
        values = ((n, self._value(n, arrays)) for n in self.value_inputs)
        return tuple((n, v.dtype.str, v.shape, v.tobytes()) for n, v in values)

    def _value(self, name: str, arrays: dict) -> np.ndarray:
        import onnx
        from onnx import helper
        if name not in arrays:
            raise ArgumentError(f"model {self.name!r}: input {name!r} is missing (its "
                                "contents decide the model's shapes)")
        value = np.asarray(arrays[name])
        info = self._declared[name]
        elem_type = info.type.tensor_type.elem_type
        expected = (np.dtype(np.uint16) if elem_type == onnx.TensorProto.BFLOAT16
                    else helper.tensor_dtype_to_np_dtype(elem_type))
        if value.dtype != expected:
            raise DTypeError(f"input {name!r}: expected {expected}, got {value.dtype}")
        if value.shape != _static_shape(info):
            raise ShapeError(f"input {name!r}: expected shape {list(_static_shape(info))}, "
                             f"got {list(value.shape)}")
        return value


def bind_inputs(proto: onnx.ModelProto, values: dict[str, np.ndarray]) -> onnx.ModelProto:
    """A copy of ``proto`` in which the named graph inputs are initializers of ``values``."""
    from onnx import helper
    declared = {i.name: i.type.tensor_type.elem_type for i in proto.graph.input}
    bound = type(proto)()
    bound.CopyFrom(proto)
    kept = [i for i in bound.graph.input if i.name not in values]
    del bound.graph.input[:]
    bound.graph.input.extend(kept)
    # Raw bytes in the declared type: treadle holds bfloat16 as its uint16 bits.
    bound.graph.initializer.extend(helper.make_tensor(n, declared[n], v.shape, v.tobytes(),
                                                      raw=True) for n, v in values.items())
    return bound
