"""An exported folder's library called from Python through its C API (ctypes), for tests
and benchmarks of the artifact itself: ``ExportedModel(folder)(*arrays)`` returns the
outputs as numpy arrays. ctypes releases the GIL during a run, so threads calling one
model run it concurrently, as C threads would.
"""
from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Sequence

import numpy as np

from treadle.deploy.build import LIBRARY
from treadle.deploy.header import DTYPES
from treadle.errors import ArgumentError, KernelError, ModelError, ShapeError

MESSAGE_SIZE = 512
# treadle_status -> the exception it raises; others raise ModelError.
ERRORS = {1: ArgumentError, 2: ShapeError, 6: KernelError}


class _Error(ctypes.Structure):
    _fields_ = [("message", ctypes.c_char * MESSAGE_SIZE)]


class _Info(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("dtype", ctypes.c_int), ("rank", ctypes.c_int32),
                ("dims", ctypes.POINTER(ctypes.c_int64)),
                ("dim_names", ctypes.POINTER(ctypes.c_char_p))]


_P = ctypes.c_void_p
_SIGNATURES = {
    "treadle_model_create": ([ctypes.c_char_p, ctypes.POINTER(_P), ctypes.POINTER(_Error)],
                             ctypes.c_int),
    "treadle_model_destroy": ([_P], None),
    "treadle_model_input_count": ([_P], ctypes.c_int32),
    "treadle_model_output_count": ([_P], ctypes.c_int32),
    "treadle_model_input": ([_P, ctypes.c_int32], ctypes.POINTER(_Info)),
    "treadle_model_output": ([_P, ctypes.c_int32], ctypes.POINTER(_Info)),
    "treadle_model_output_shapes": ([_P, ctypes.c_int32, _P, _P, ctypes.POINTER(_Error)],
                                    ctypes.c_int),
    "treadle_model_run": ([_P, ctypes.c_int32, _P, _P, ctypes.c_int32, _P, _P, _P,
                           ctypes.POINTER(_Error)], ctypes.c_int),
}


class TensorInfo:
    def __init__(self, info: _Info):
        self.name = info.name.decode()
        self.dtype = np.dtype(DTYPES[info.dtype].replace("bfloat16", "uint16"))
        self.dims = [info.dim_names[a].decode() for a in range(info.rank)]


class ExportedModel:
    handle = _P()  # until a model is created: nothing to destroy

    def __init__(self, folder: str | Path):
        self.library = ctypes.CDLL(str(Path(folder) / LIBRARY))
        for name, (args, result) in _SIGNATURES.items():
            getattr(self.library, name).argtypes = args
            getattr(self.library, name).restype = result
        self.handle = _P()
        error = _Error()
        status = self.library.treadle_model_create(str(folder).encode(),
                                                   ctypes.byref(self.handle), error)
        if status != 0:
            raise ModelError(error.message.decode())
        lib = self.library
        self.inputs = [TensorInfo(lib.treadle_model_input(self.handle, k).contents)
                       for k in range(lib.treadle_model_input_count(self.handle))]
        self.outputs = [TensorInfo(lib.treadle_model_output(self.handle, k).contents)
                        for k in range(lib.treadle_model_output_count(self.handle))]

    def __call__(self, *arrays: np.ndarray) -> list[np.ndarray]:
        arrays = [np.ascontiguousarray(a) for a in arrays]
        shapes = [np.array(a.shape, np.int64) for a in arrays]
        shape_pointers = _pointers(shapes)
        ranks = [len(o.dims) for o in self.outputs]
        out_shapes = [np.zeros(max(r, 1), np.int64) for r in ranks]
        out_pointers = _pointers(out_shapes)
        error = _Error()
        _check(self.library.treadle_model_output_shapes(
            self.handle, len(arrays), shape_pointers, out_pointers, error), error)
        outputs = [np.empty(tuple(s[:r]), o.dtype)
                   for s, r, o in zip(out_shapes, ranks, self.outputs)]
        sizes = (ctypes.c_size_t * max(len(outputs), 1))(*(o.nbytes for o in outputs))
        _check(self.library.treadle_model_run(
            self.handle, len(arrays), _pointers(arrays), shape_pointers, len(outputs),
            _pointers(outputs), sizes, out_pointers, error), error)
        return outputs

    def close(self) -> None:
        if self.handle:
            self.library.treadle_model_destroy(self.handle)
            self.handle = _P()

    def __del__(self):
        self.close()


def _pointers(arrays: Sequence[np.ndarray]):
    return (ctypes.c_void_p * max(len(arrays), 1))(*(a.ctypes.data for a in arrays))


def _check(status: int, error: _Error) -> None:
    if status != 0:
        raise ERRORS.get(status, ModelError)(error.message.decode())

