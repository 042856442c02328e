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
from treadle.ir import dtypes


class TreadleRep(BackendRep):
    def __init__(self, model: api.CompiledModel):
        self.model = model

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        if isinstance(inputs, dict):
            outputs = self.model(**{k: _to_treadle(v) for k, v in inputs.items()})
        else:
            if isinstance(inputs, np.ndarray):
                inputs = [inputs]
            outputs = self.model(*(_to_treadle(v) for v in inputs))
        ex = self.model.executable
        outputs = [_from_treadle(value, ex.slots[slot].dtype)
                   for value, slot in zip(outputs, ex.outputs)]
        return namedtupledict("Outputs", self.model.output_names)(*outputs)


class TreadleBackend(Backend):
    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> TreadleRep:
        if not cls.supports_device(device):
            raise ValueError(f"treadle runs ONNX models on the CPU, not on {device!r}")
        return TreadleRep(api.compile(model))

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device.split(":")[0] == "CPU"


def _to_treadle(value) -> np.ndarray:
    value = np.asarray(value)
    return value.view(np.uint16) if value.dtype.name == "bfloat16" else value


def _from_treadle(value: np.ndarray, dtype: dtypes.DataType) -> np.ndarray:
    if dtype == dtypes.bfloat16:
        import ml_dtypes
        return value.view(ml_dtypes.bfloat16)
    return value


prepare = TreadleBackend.prepare
run_model = TreadleBackend.run_model
supports_device = TreadleBackend.supports_device
