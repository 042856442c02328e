"""`make demo`: compile a built-in program and time it next to ONNX Runtime and numpy.

The built-in program is the task-mapped, tiled float32 matmul of treadle/examples; ONNX
Runtime runs the same product as a MatMul node whose B is an initializer, as in a dense
layer. Each system is timed in turn with idle gaps, since ONNX Runtime's and BLAS's worker
threads keep spinning for a while after each run.
"""
from __future__ import annotations

import statistics
import time

import numpy as np

from treadle.config import config
from treadle.examples.matmul import tiled_matmul
from treadle.runtime.module import compile_function

SIZE = 1024
REPEATS = 30
IDLE_S = 0.1


def median_ms(fn, repeats: int = REPEATS) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    time.sleep(IDLE_S)
    return statistics.median(times) * 1e3


def onnxruntime_matmul(b: np.ndarray):
    try:
        import onnx
        import onnxruntime as ort
    except ImportError:
        return None
    from onnx import TensorProto, helper, numpy_helper
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["A", "B"], ["C"])], "matmul",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, [SIZE, SIZE])],
        [helper.make_tensor_value_info("C", TensorProto.FLOAT, [SIZE, SIZE])],
        [numpy_helper.from_array(b, "B")])
    # ONNX Runtime reads models up to a given IR version; 9 covers opset 17.
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    options = ort.SessionOptions()
    options.intra_op_num_threads = config.num_threads
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    onnx.checker.check_model(model)
    return session


def main() -> None:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((SIZE, SIZE), dtype=np.float32)
    b = rng.standard_normal((SIZE, SIZE), dtype=np.float32)
    c = np.empty((SIZE, SIZE), np.float32)

    start = time.perf_counter()
    kernel = compile_function(tiled_matmul(SIZE, SIZE, SIZE, threads=config.num_threads))
    print(f"compiled tiled_matmul {SIZE}^3 in {time.perf_counter() - start:.2f} s "
          f"({config.num_threads} threads)")
    kernel(a, b, c)
    error = float(np.abs(c - a @ b).max())

    flops = 2.0 * SIZE ** 3
    rows = [("treadle", median_ms(lambda: kernel(a, b, c)))]
    session = onnxruntime_matmul(b)
    if session is not None:
        rows.append(("onnxruntime", median_ms(lambda: session.run(None, {"A": a}))))
    rows.append(("numpy", median_ms(lambda: a @ b)))

    print(f"max abs error vs numpy: {error:.2e}")
    print(f"{'system':<12} {'median ms':>10} {'GFLOP/s':>9} {'treadle speed-up':>17}")
    ours = rows[0][1]
    for name, ms in rows:
        print(f"{name:<12} {ms:>10.2f} {flops / ms / 1e6:>9.1f} {ms / ours:>16.2f}x")


if __name__ == "__main__":
    main()
