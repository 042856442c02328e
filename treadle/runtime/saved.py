"""A saved model's program as plain data: JSON values and named arrays.

Loading a saved model must run nothing but its listed shared objects, so its program (the
tensor slots, the steps, the IR of every kernel) is written as data, and read back through
one table of the classes it may hold (``NODES``). Each field is checked against the type
its class declares before the node is built, so a damaged or doctored file is a
``ModelError`` naming the node, never an object of some other class.

The IR is a flat list of nodes, children before parents, each ``[class, field, ...]``.
In a field, ``{"#": k}`` is node k (always an earlier one, so there are no cycles), a list
is a tuple, ``{"float": "inf"}`` a float JSON cannot spell and ``{"dict": [[key, value],
...]}`` a dict. Equal nodes are stored once: a kernel names each buffer, with its shape, at
every load and store.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
import types
import typing
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Union

import numpy as np

from treadle.errors import ModelError, UnsupportedOpError
from treadle.ir import dtypes
from treadle.ir.dtypes import DataType
from treadle.ir.expr import (Binary, Broadcast, Buffer, Call, Cast, Const, Load, Select, Unary,
                             Var)
from treadle.ir.mapping import Composed, Repeat, Spatial
from treadle.ir.stmt import (Accumulate, Assert, Barrier, DeclBuffer, Evaluate, For, ForTask,
                             Function, If, Let, Seq, Store)
from treadle.runtime.executor import Slot

FORMAT = "treadle-program"
VERSION = 1


@dataclass(frozen=True)
class SavedKernel:
    """A kernel of a library: on the CPU ``function`` itself; on CUDA the ``launches``
    (lowered CUDA kernels of the library's cubin) that compute ``function``."""
    function: Function
    launches: tuple[Function, ...] = ()


@dataclass(frozen=True)
class SavedLibrary:
    file: str  # a file of the saved model: a shared object, or a cubin
    kernels: tuple[SavedKernel, ...]


@dataclass(frozen=True)
class SavedStep:
    """An executor ``Step`` with its kernel named (None for a view)."""
    name: str
    kernel: Optional[str]
    args: tuple[int, ...]
    outputs: tuple[int, ...]
    workspaces: tuple[Slot, ...]


@dataclass(frozen=True)
class Program:
    """What an executable is made of, its kernels given by the library files that hold them."""
    name: str
    slots: tuple[Slot, ...]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    libraries: tuple[SavedLibrary, ...]
    steps: tuple[SavedStep, ...]
    constants: dict[int, np.ndarray]  # by slot; stored as arrays, not in the data


# Every class a saved program may hold, by the name its nodes carry. A task mapping of
# ``mapping.custom`` holds a Python function, so a program with one cannot be saved.
NODES: dict[str, type] = {cls.__name__: cls for cls in (
    DataType, Var, Const, Binary, Unary, Select, Cast, Broadcast, Load, Call, Buffer,
    Seq, For, ForTask, If, Store, Accumulate, Let, DeclBuffer, Barrier, Assert, Evaluate,
    Function, Spatial, Repeat, Composed, Slot, SavedKernel, SavedLibrary, SavedStep)}
DATA_FIELDS = ("name", "slots", "inputs", "outputs", "libraries", "steps")  # of Program
VECTOR_NAME = re.compile(r"(\w+?)x(\d+)")  # a vector dtype's name: float32x8


def to_data(program: Program) -> tuple[dict, dict[str, np.ndarray]]:
    """``program`` as JSON-ready data and its constants as arrays named by slot."""
    _check_no_host_steps(program)
    encoder = _Encoder()
    fields = {name: encoder.value(getattr(program, name)) for name in DATA_FIELDS}
    data = {"format": FORMAT, "version": VERSION, "nodes": encoder.nodes, **fields}
    return data, {str(slot): array for slot, array in program.constants.items()}


def from_data(data, arrays: Mapping[str, np.ndarray], data_file: str = "the program",
              arrays_file: str = "the constants") -> Program:
    """The program ``to_data`` gave ``data`` and ``arrays`` for; a ModelError naming
    ``data_file`` or ``arrays_file`` where they are not such data."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ModelError(f"{data_file}: not a treadle program")
    if data.get("version") != VERSION:
        raise ModelError(f"{data_file}: program format version {data.get('version')!r}; "
                         f"this treadle reads version {VERSION}")
    missing = [name for name in ("nodes", *DATA_FIELDS) if name not in data]
    if missing or not isinstance(data["nodes"], list):
        raise ModelError(f"{data_file}: lacks {', '.join(missing) or 'a list of nodes'}")
    try:
        program = _decode(data, data_file, _constants(arrays, arrays_file))
    except RecursionError:
        raise ModelError(f"{data_file}: nested too deeply to be a treadle program") from None
    _check_indices(program, data_file)
    _check_constants(program, arrays_file)
    return program


def _check_no_host_steps(program: Program) -> None:
    """A size found in the data that no bound limits is how many times a Loop ran: the
    Loop's step calls its compiled body from Python, which a saved program, data and
    shared objects alone, cannot hold."""
    for k, slot in enumerate(program.slots):
        if slot.holds is not None and slot.bound is None:
            node = next((s.name for s in program.steps if k in s.outputs), slot.name)
            raise UnsupportedOpError(f"node {node!r} (Loop) runs its body, compiled as a model "
                                     "of its own, once per iteration from Python, which a "
                                     "saved model cannot hold yet; compile the model where "
                                     "it runs")


class _Encoder:
    """Numbers each node once: by identity for speed, by its entry for equal copies."""

    def __init__(self):
        self.nodes: list[list] = []
        self._by_entry: dict[str, int] = {}
        self._by_id: dict[int, int] = {}  # every object is held by the program meanwhile

    def value(self, value):
        if value is None or isinstance(value, (bool, str)):
            return value
        if isinstance(value, (int, np.integer)):
            return int(value)
        if isinstance(value, (float, np.floating)):
            return float(value) if math.isfinite(value) else {"float": repr(float(value))}
        if isinstance(value, (tuple, list)):
            return [self.value(v) for v in value]
        if isinstance(value, dict):
            return {"dict": [[self._key(k), self.value(v)] for k, v in value.items()]}
        return {"#": self.node(value)}

    def node(self, node) -> int:
        index = self._by_id.get(id(node))
        if index is None:
            index = self._by_id[id(node)] = self._number(self._entry(node))
        return index

    def _entry(self, node) -> list:
        kind = type(node).__name__
        if NODES.get(kind) is not type(node):
            raise ModelError(f"a {type(node).__module__}.{type(node).__qualname__} cannot be "
                             "saved: it is no data of a treadle program")
        if isinstance(node, DataType):
            return [kind, node.name]
        return [kind, *(self.value(getattr(node, name)) for name, _ in _init_fields(type(node)))]

    def _number(self, entry: list) -> int:
        # JSON text tells apart what Python equates: 0.0 and -0.0, 1 and True.
        index = self._by_entry.setdefault(json.dumps(entry, allow_nan=False), len(self.nodes))
        if index == len(self.nodes):
            self.nodes.append(entry)
        return index

    @staticmethod
    def _key(key) -> str:
        if not isinstance(key, str):
            raise ModelError(f"a dict key {key!r} cannot be saved: keys must be strings")
        return key


def _decode(data: dict, where: str, constants: dict[int, np.ndarray]) -> Program:
    nodes: list = []
    for index, entry in enumerate(data["nodes"]):
        nodes.append(_node(entry, nodes, f"{where}: node {index}"))
    fields = {name: _value(data[name], nodes, f"{where}: {name}") for name in DATA_FIELDS}
    return _built(Program, {**fields, "constants": constants}, f"{where}: program")


def _node(entry, nodes: list, where: str):
    if not (isinstance(entry, list) and entry and isinstance(entry[0], str)
            and entry[0] in NODES):
        raise ModelError(f"{where}: {_shown(entry)} is no node of a treadle program")
    kind, raw = NODES[entry[0]], entry[1:]
    where = f"{where} ({entry[0]})"
    if kind is DataType:
        if len(raw) != 1 or not isinstance(raw[0], str):
            raise ModelError(f"{where}: expected a dtype's name, got {_shown(raw)}")
        return _dtype(raw[0], where)
    names = [name for name, _ in _init_fields(kind)]
    if len(raw) != len(names):
        raise ModelError(f"{where}: {len(raw)} fields; {entry[0]} has {len(names)} "
                         f"({', '.join(names)})")
    values = {name: _value(item, nodes, f"{where}.{name}") for name, item in zip(names, raw)}
    return _built(kind, values, where)


def _value(raw, nodes: list, where: str):
    """A field's value; a node reference only to one already built."""
    if raw is None or isinstance(raw, (bool, int, float, str)):
        return raw
    if isinstance(raw, list):
        return tuple(_value(item, nodes, where) for item in raw)
    if isinstance(raw, dict) and len(raw) == 1:
        (tag, item), = raw.items()
        if tag == "#" and type(item) is int:
            if 0 <= item < len(nodes):
                return nodes[item]
            raise ModelError(f"{where}: {_shown(raw)} refers to no earlier node")
        if tag == "float" and item in ("inf", "-inf", "nan"):
            return float(item)
        if tag == "dict" and isinstance(item, list) and all(
                isinstance(p, list) and len(p) == 2 and isinstance(p[0], str) for p in item):
            return {key: _value(value, nodes, where) for key, value in item}
    raise ModelError(f"{where}: {_shown(raw)} is no value of a treadle program")


def _built(kind: type, values: dict, where: str):
    """``kind(**values)`` once every value has its field's declared type."""
    for name, hint in _init_fields(kind):
        if not _conforms(values[name], hint):
            raise ModelError(f"{where}: field {name!r} is {_kind_of(values[name])}, expected "
                             f"{_hint_text(hint)}")
    try:
        return kind(**values)
    except (TypeError, ValueError, AttributeError, KeyError, IndexError) as err:
        raise ModelError(f"{where}: {err}") from None  # a node's own checks refused it


@functools.lru_cache(maxsize=None)
def _init_fields(kind: type) -> tuple[tuple[str, Any], ...]:
    """(name, declared type) of each field ``kind`` is constructed from."""
    hints = typing.get_type_hints(kind)
    return tuple((f.name, hints[f.name]) for f in dataclasses.fields(kind) if f.init)


def _conforms(value, hint) -> bool:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return True
    if origin in (Union, types.UnionType):
        return any(_conforms(value, h) for h in args)
    if origin is tuple:
        if not isinstance(value, tuple):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(_conforms(v, args[0]) for v in value)
        return len(args) == len(value) and all(map(_conforms, value, args))
    kind = origin or hint
    # bool is an int to Python, but no field that declares int takes one
    return isinstance(value, kind) and (kind is bool or not isinstance(value, bool))


def _dtype(name: str, where: str) -> DataType:
    if name in dtypes.BY_NAME:
        return dtypes.BY_NAME[name]
    vector = VECTOR_NAME.fullmatch(name)
    scalar = dtypes.BY_NAME.get(vector[1]) if vector else None
    if scalar is None or scalar.is_vector or not 2 <= int(vector[2]) <= 64:
        raise ModelError(f"{where}: unknown dtype {_shown(name)}")
    return dtypes.vector(scalar, int(vector[2]))


def _constants(arrays: Mapping[str, np.ndarray], where: str) -> dict[int, np.ndarray]:
    constants = {}
    for key, array in arrays.items():
        if not key.isdecimal():
            raise ModelError(f"{where}: array {_shown(key)} is named by no tensor slot")
        constants[int(key)] = array
    return constants


def _check_indices(program: Program, where: str) -> None:
    """Every slot a step or the model's signature names exists, and every kernel a step
    calls is in a library, taking the step's arguments as its buffer parameters."""
    count = len(program.slots)
    for role, slots in (("inputs", program.inputs), ("outputs", program.outputs)):
        if not all(0 <= s < count for s in slots):
            raise ModelError(f"{where}: {role} {list(slots)} name slots the program lacks "
                             f"(it has {count})")
    kernels = {k.function.name: k.function for lib in program.libraries for k in lib.kernels}
    for step in program.steps:
        if not (all(-len(step.workspaces) <= a < count for a in step.args) and
                all(0 <= s < count for s in step.outputs)):
            raise ModelError(f"{where}: step {step.name!r} names slots the program lacks")
        if step.kernel is None:
            if len(step.args) != 1 or len(step.outputs) != 1 or step.args[0] < 0:
                raise ModelError(f"{where}: view {step.name!r} must have one source and "
                                 "one output")
            continue
        function = kernels.get(step.kernel)
        if function is None:
            raise ModelError(f"{where}: step {step.name!r} calls {step.kernel!r}, which no "
                             "library holds")
        arity = len(step.args)
        if not (all(isinstance(p, Buffer) for p in function.params[:arity]) and
                all(isinstance(p, Var) for p in function.params[arity:])):
            raise ModelError(f"{where}: step {step.name!r} passes {arity} arrays to "
                             f"{step.kernel!r}, which takes {len(function.buffers)}")


def _check_constants(program: Program, where: str) -> None:
    """Each constant must be what the kernels were compiled to read: they take addresses,
    so a wrong dtype or shape would be read as garbage or past the end."""
    for slot, array in program.constants.items():
        if not 0 <= slot < len(program.slots):
            raise ModelError(f"{where}: constant {slot} is no tensor of the program")
        tensor = program.slots[slot]
        if array.dtype != tensor.dtype.numpy or array.shape != tuple(tensor.shape):
            raise ModelError(f"{where}: constant {tensor.name!r} is {array.dtype}"
                             f"{list(array.shape)}; the program expects {tensor.dtype}"
                             f"{list(tensor.shape)}")


def _kind_of(value) -> str:
    return "None" if value is None else type(value).__name__


def _hint_text(hint) -> str:
    return hint.__name__ if isinstance(hint, type) else re.sub(r"\b\w+\.", "", str(hint))


def _shown(value) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
