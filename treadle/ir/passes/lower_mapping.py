"""Lower ``for t in mapping.on(w)`` into loops and index arithmetic.

For a mapping composed of atoms ``a_1 * ... * a_k`` with worker counts ``n_i`` and task
shapes ``d_i``, worker ``w`` is split mixed-radix into ``w_i = w // (n_{i+1}...n_k) % n_i``
and the task is ``sum_i t_i ⊙ (d_{i+1} ⊙ ... ⊙ d_k)``, where ``t_i`` is atom ``i``'s task:

* spatial: ``t_i = unravel(w_i, d_i)``, no loop;
* repeat:  one loop per dimension of ``d_i`` (outer atoms' loops enclose inner ones);
* custom:  one loop ``j`` over its tasks per worker, ``t_i = task(w_i, j)``.

The loop order reproduces the ordered task lists of the composition; the simplifier later
removes the divisions and remainders that ranges make redundant.
"""
from __future__ import annotations

from treadle.ir.expr import Var, as_expr
from treadle.ir.functor import rewrite, substitute, walk
from treadle.ir.mapping import Atom, Custom, Repeat, Spatial, unravel
from treadle.ir.stmt import For, ForTask, Function, Stmt


def lower_mapping(func: Function) -> Function:
    names = _NameSource(func)
    return func.with_body(rewrite(func.body, lambda n: _lower(n, names)
                                  if isinstance(n, ForTask) else None))


class _NameSource:
    """Fresh variable names that clash with nothing already in the function."""

    def __init__(self, func: Function):
        self.used = {p.name for p in func.params}
        self.used |= {n.name for n in walk(func.body) if isinstance(n, Var)}

    def __call__(self, base: str) -> Var:
        name, k = base, 0
        while name in self.used:
            k += 1
            name = f"{base}_{k}"
        self.used.add(name)
        return Var(name)


def _lower(node: ForTask, names: _NameSource) -> Stmt:
    atoms = node.mapping.atoms
    task = None
    loops: list[tuple[Var, object, str]] = []  # (var, extent, kind), outermost first
    inner_workers = node.mapping.num_workers
    for atom in atoms:
        inner_workers = inner_workers // atom.num_workers
        worker = _worker_part(node.worker, inner_workers, atom.num_workers)
        atom_task, atom_loops = _atom_task(atom, worker, node.vars, names)
        loops += atom_loops
        # Horner form of sum_i t_i ⊙ d_{>i}: scale what came before by this atom's shape.
        task = (list(atom_task) if task is None else
                [t * d + a for t, d, a in zip(task, atom.task_shape, atom_task)])
    body = substitute(node.body, dict(zip(node.vars, task)))
    for var, extent, kind in reversed(loops):
        body = For(var, as_expr(extent), body, kind)
    return body


def _worker_part(worker, inner_workers, count):
    if isinstance(count, int) and count == 1:
        return as_expr(0)
    if not (isinstance(inner_workers, int) and inner_workers == 1):
        worker = worker // inner_workers
    return worker % count


def _spatial_task(atom: Spatial, worker, task_vars, names: _NameSource):
    return unravel(worker, atom.task_shape), []


def _repeat_task(atom: Repeat, worker, task_vars, names: _NameSource):
    loop_vars = [names(f"{v.name}_r") for v in task_vars]
    return loop_vars, [(v, d, atom.kind) for v, d in zip(loop_vars, atom.task_shape)]


def _custom_task(atom: Custom, worker, task_vars, names: _NameSource):
    j = names(f"{atom.name}_j")
    return [as_expr(t) for t in atom.task(worker, j)], [(j, atom.tasks_per_worker, "serial")]


# Each atom kind yields (its task as index expressions, the loops that enumerate it).
ATOM_RULES = {Spatial: _spatial_task, Repeat: _repeat_task, Custom: _custom_task}


def _atom_task(atom: Atom, worker, task_vars, names: _NameSource):
    rule = ATOM_RULES.get(type(atom))
    if rule is None:
        raise TypeError(f"lower_mapping: no entry in ATOM_RULES for {type(atom).__name__}")
    return rule(atom, worker, task_vars, names)
