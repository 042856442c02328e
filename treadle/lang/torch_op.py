"""A registered kernel as a torch custom op, ``torch.ops.treadle_lang.<name>``.

The op is functional, as torch's graph capture wants: it takes the kernel's parameters
except the outputs, allocates the outputs (shapes from their annotations, sizes from the
inputs) and returns them, one tensor or a tuple. Its eager implementation runs the
compiled kernel on CPU tensors (copying an input only when it is not contiguous); its fake
implementation gives the outputs' shapes and dtypes, so the op traces and exports.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from treadle.ir.dtypes import DataType

if TYPE_CHECKING:
    from treadle.lang.registry import OpSpec


def _schema_type(dtype: DataType) -> str:
    return "float" if dtype.is_float else "bool" if dtype.is_bool else "int"


def schema(spec: OpSpec) -> str:
    """The torch schema, e.g. ``(Tensor a, Tensor b, float alpha) -> Tensor``."""
    args = ", ".join(f"Tensor {n}" if spec.param(n).is_tensor
                     else f"{_schema_type(spec.param(n).type.dtype)} {n}"
                     for n in spec.arguments)
    results = "Tensor" if len(spec.outputs) == 1 else \
        f"({', '.join('Tensor' for _ in spec.outputs)})"
    return f"({args}) -> {results}"


def register_torch_op(spec: OpSpec, namespace: str) -> Any | None:
    """The custom op, or None where torch is not installed."""
    try:
        import torch
    except ImportError:
        return None

    def outputs(args, allocate) -> list:
        given = dict(zip(spec.arguments, args))
        shapes = spec.output_shapes([tuple(given[n].shape) for n in spec.inputs])
        return [allocate(shape, getattr(torch, spec.param(n).type.dtype.name))
                for n, shape in zip(spec.outputs, shapes)]

    def results(values: list):
        return values[0] if len(values) == 1 else tuple(values)

    def run(*args):
        given = dict(zip(spec.arguments, args))
        made = dict(zip(spec.outputs, outputs(args, lambda s, t: torch.empty(s, dtype=t))))
        spec.kernel(*[made[p.name] if p.name in made else
                      given[p.name].contiguous() if p.is_tensor else given[p.name]
                      for p in spec.kernel.params])
        return results([made[n] for n in spec.outputs])

    def fake(*args):
        like = next(a for a in args if isinstance(a, torch.Tensor))
        return results(outputs(args, lambda s, t: like.new_empty(s, dtype=t)))

    op = torch.library.custom_op(f"{namespace}::{spec.name}", run, mutates_args=(),
                                 schema=schema(spec))
    op.register_fake(fake)
    return op
