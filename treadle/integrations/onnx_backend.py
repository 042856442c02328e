"""treadle as an ONNX backend (``onnx.backend.base``), the interface of the ONNX test runner.

    rep = TreadleBackend.prepare(model)      # compiles
    outputs = rep.run([x, y])                # or a dict by name

treadle keeps bfloat16 tensors as their raw uint16 bits; this adapter converts from and to
the ``ml_dtypes.bfloat16`` arrays that ONNX's own tools use.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep, namedtupledict

from treadle import api
from treadle.specialise import SpecialisingModel


class TreadleRep(BackendRep):
    def __init__(self, model: api.CompiledModel | SpecialisingModel, proto: onnx.ModelProto):
        self.model = model
        self.bfloat16 = [o.type.tensor_type.elem_type == onnx.TensorProto.BFLOAT16
                         for o in proto.graph.output]

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        if isinstance(inputs, dict):
            outputs = self.model(**{k: _to_treadle(v) for k, v in inputs.items()})
        else:
            if isinstance(inputs, np.ndarray):
                inputs = [inputs]
            outputs = self.model(*(_to_treadle(v) for v in inputs))
        outputs = [_from_treadle(value) if bf16 else value
                   for value, bf16 in zip(outputs, self.bfloat16)]
        return namedtupledict("Outputs", self.model.output_names)(*outputs)


class TreadleBackend(Backend):
    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> TreadleRep:
        if not cls.supports_device(device):
            raise ValueError(f"treadle runs ONNX models on the CPU, not on {device!r}")
        return TreadleRep(api.compile(model), model)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device.split(":")[0] == "CPU"


def _to_treadle(value) -> np.ndarray:
    value = np.asarray(value)
    return value.view(np.uint16) if value.dtype.name == "bfloat16" else value


def _from_treadle(value: np.ndarray) -> np.ndarray:
    import ml_dtypes
    return value.view(ml_dtypes.bfloat16)


prepare = TreadleBackend.prepare
run_model = TreadleBackend.run_model
supports_device = TreadleBackend.supports_device
