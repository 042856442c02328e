"""Task mappings (Hidet, section 5.1).

A task mapping assigns each worker ``w`` in ``[0, num_workers)`` an ordered list of tasks
from a task domain of shape ``task_shape``. Two basic mappings cover most schedules:

* ``spatial(d1, ..., dm)``: ``d1*...*dm`` workers, one task each (row-major);
* ``repeat(d1, ..., dm)``: one worker doing every task in row-major order.

Composition ``f1 * f2`` treats the whole of ``f2`` as one macro-task and one macro-worker
of ``f1``: it has ``n1*n2`` workers, task shape ``d1 ⊙ d2`` and

    (f1 * f2)(w) = [t1 ⊙ d2 + t2 for t1 in f1(w // n2) for t2 in f2(w % n2)]

which is associative but not commutative. A composed mapping is kept as its flat list of
atoms, so ``(a * b) * c`` and ``a * (b * c)`` are the same object. ``mapping.tasks(w)``
evaluates the mapping in Python; ``for i, j in mapping.on(w):`` inside a builder emits a
``ForTask`` that ``lower_mapping`` turns into loops and index arithmetic.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable, Iterator, Sequence, Union

from treadle.ir.expr import Const, Expr, Var, as_expr

Extent = Union[int, Expr]


def _prod(values: Sequence[Extent]) -> Extent:
    result: Extent = 1
    for v in values:
        result = result * v if not (isinstance(v, int) and v == 1) else result
    return result


def ravel(index: Sequence[Extent], shape: Sequence[Extent]) -> Extent:
    """The flat row-major position of coordinates ``index`` inside ``shape``."""
    flat: Extent = 0
    for i, d in zip(index, shape):
        flat = flat * d + i
    return flat


def unravel(index: Extent, shape: Sequence[Extent]) -> tuple:
    """Row-major coordinates of a flat index inside ``shape`` (never past its end: the
    outermost axis longer than 1 takes what is left, unwrapped). Axes of extent 1 are 0
    and cost no division: beside a symbolic size (``[1, seq]``) a modulo would stay in
    the generated code, one per element, which the simplifier cannot prove away."""
    zero = as_expr(0, index.dtype) if isinstance(index, Expr) else 0
    coords: list[Extent] = [zero] * len(shape)
    live = [k for k, d in enumerate(shape) if not _is_one(d)]
    for k in reversed(live[1:]):
        coords[k] = index % shape[k]
        index = index // shape[k]
    if live:
        coords[live[0]] = index
    return tuple(coords)


def _is_one(extent: Extent) -> bool:
    # an extent of 1 may come as an expression (a static axis beside a symbolic one)
    value = extent.value if isinstance(extent, Const) else extent
    return isinstance(value, int) and value == 1


class TaskMapping:
    """The common interface: shape, worker count, the atoms it is composed of."""

    atoms: tuple["Atom", ...]
    task_shape: tuple[Extent, ...]
    num_workers: Extent

    def __mul__(self, other: TaskMapping) -> TaskMapping:
        if not isinstance(other, TaskMapping):
            return NotImplemented
        if len(self.task_shape) != len(other.task_shape):
            raise ValueError(f"cannot compose {self} ({len(self.task_shape)}-d tasks) with "
                             f"{other} ({len(other.task_shape)}-d tasks)")
        return Composed(self.atoms + other.atoms)

    def tasks(self, worker: int) -> list[tuple[int, ...]]:
        """The ordered task list of one worker, evaluated in Python."""
        n = self.num_workers
        if not (isinstance(n, int) and 0 <= worker < n):
            raise ValueError(f"worker {worker} is outside [0, {n}) of {self}")
        result = [tuple(0 for _ in self.task_shape)]
        # Fold left: result is the task list of atoms[:k]; each step composes one more atom.
        inner_workers = n
        for atom in self.atoms:
            inner_workers //= atom.num_workers
            w = (worker // inner_workers) % atom.num_workers
            result = [tuple(a * d + b for a, d, b in zip(t1, atom.task_shape, t2))
                      for t1 in result for t2 in atom.tasks_of(w)]
        return result

    def on(self, worker) -> Iterator[tuple[Var, ...]]:
        """``for i, j in mapping.on(w):`` inside a builder: yields the task variables once
        and records the loop body as a ``ForTask``."""
        from treadle.ir.builder import current_builder
        return current_builder().for_task(self, as_expr(worker))

    def __repr__(self) -> str:
        return " * ".join(repr(a) for a in self.atoms)


class Atom(TaskMapping):
    task_shape: tuple[Extent, ...]
    num_workers: Extent
    tasks_per_worker: Extent

    @property
    def atoms(self) -> tuple[Atom, ...]:
        return (self,)

    def tasks_of(self, worker: int) -> list[tuple[int, ...]]:
        raise NotImplementedError


@dataclass(frozen=True, repr=False)
class Spatial(Atom):
    task_shape: tuple[Extent, ...]

    @property
    def num_workers(self) -> Extent:
        return _prod(self.task_shape)

    tasks_per_worker = 1

    def tasks_of(self, worker):
        return [unravel(worker, self.task_shape)]

    def __repr__(self) -> str:
        return f"spatial({', '.join(map(str, self.task_shape))})"


@dataclass(frozen=True, repr=False)
class Repeat(Atom):
    task_shape: tuple[Extent, ...]
    kind: str = "serial"  # loop kind of the generated loops: serial / unroll / vectorize

    num_workers = 1

    @property
    def tasks_per_worker(self) -> Extent:
        return _prod(self.task_shape)

    def tasks_of(self, worker):
        return [unravel(j, self.task_shape) for j in range(math.prod(self.task_shape))]

    def __repr__(self) -> str:
        suffix = "" if self.kind == "serial" else f", kind={self.kind!r}"
        return f"repeat({', '.join(map(str, self.task_shape))}{suffix})"


@dataclass(frozen=True, repr=False)
class Custom(Atom):
    """A mapping given by a function ``task(worker, j)`` returning the j-th task of a
    worker; it must work on Python ints and on IR expressions alike."""
    task_shape: tuple[Extent, ...]
    num_workers: Extent
    tasks_per_worker: Extent
    task: Callable[[Extent, Extent], tuple]
    name: str = "custom"

    def tasks_of(self, worker):
        return [tuple(self.task(worker, j)) for j in range(self.tasks_per_worker)]

    def __repr__(self) -> str:
        return f"{self.name}({', '.join(map(str, self.task_shape))}; workers={self.num_workers})"


@dataclass(frozen=True, repr=False)
class Composed(TaskMapping):
    atoms: tuple[Atom, ...]

    @property
    def task_shape(self) -> tuple[Extent, ...]:
        shape = self.atoms[0].task_shape
        for atom in self.atoms[1:]:
            shape = tuple(a * b for a, b in zip(shape, atom.task_shape))
        return shape

    @property
    def num_workers(self) -> Extent:
        return _prod([a.num_workers for a in self.atoms])


def instantiate(mapping: TaskMapping, value: Callable[[Extent], int]) -> TaskMapping:
    """The mapping with every (possibly symbolic) extent replaced by ``value(extent)``."""
    atoms = []
    for atom in mapping.atoms:
        shape = tuple(value(d) for d in atom.task_shape)
        if isinstance(atom, Custom):
            atom = replace(atom, task_shape=shape, num_workers=value(atom.num_workers),
                           tasks_per_worker=value(atom.tasks_per_worker))
        else:
            atom = replace(atom, task_shape=shape)
        atoms.append(atom)
    return atoms[0] if len(atoms) == 1 else Composed(tuple(atoms))


def spatial(*shape: Extent) -> Spatial:
    return Spatial(tuple(shape))


def repeat(*shape: Extent, kind: str = "serial") -> Repeat:
    return Repeat(tuple(shape), kind)


def custom(task_shape: Sequence[Extent], num_workers: Extent, tasks_per_worker: Extent,
           task: Callable[[Extent, Extent], tuple], name: str = "custom") -> Custom:
    return Custom(tuple(task_shape), num_workers, tasks_per_worker, task, name)


def column_spatial(*shape: Extent) -> Custom:
    """One task per worker, workers laid out column-major over the task grid."""
    def task(w, j):
        return tuple(reversed(unravel(w, tuple(reversed(shape)))))
    return custom(shape, _prod(shape), 1, task, "column_spatial")
