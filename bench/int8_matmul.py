"""Integer matrix multiplication: treadle's MatMulInteger (uint8 activations times constant
int8 weights, int32 results) against ONNX Runtime's on the same node, treadle's float32
MatMul of the same shape, and the machine's int8 peak.

    python bench/int8_matmul.py                 # level-0 schedules, the standard shapes
    python bench/int8_matmul.py --level 1 --only bert

(from the repository root with PYTHONPATH=., or with treadle installed)

The peak is measured, not looked up: a kernel of independent chains of the instruction
treadle's integer products use (VNNI's vpdpbusd: lanes x 4 multiply-adds; on CPUs without
VNNI, vpmaddwd and an add: lanes x 2), one chain set per thread, on the same threads as
every system. "of peak" is treadle's int8 rate over it. Times are medians of interleaved
rounds (bench/matmul.py's shapes, timing and idle gaps).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time

from matmul import IDLE_GAP_S, SHAPES, THREADS, Shape, warn_if_busy

import numpy as np  # noqa: E402  (after matmul sets the BLAS threads)

from treadle.timing import interleaved_medians, onnxruntime_session  # noqa: E402

CHAINS = 12  # independent accumulators: more than latency x throughput
PROBE_STEPS = 1 << 22


def int8_peak() -> tuple[float, str]:
    """Measured int8 multiply-adds x 2 per second on THREADS threads, and the instruction."""
    from treadle.ir.builder import FunctionBuilder
    from treadle.ir.dtypes import int32, vector
    from treadle.ir.expr import call
    from treadle.runtime.build import compile_function
    from treadle.target.cpu import host
    target = host()
    lanes = 16 if target.widest_simd_bytes == 64 else 8
    name = "dot_u8s8" if target.int8_dot(lanes) else "dot_s16"
    with FunctionBuilder("int8_probe") as fb:
        words = fb.param("words", "int32", [2 * lanes])
        out = fb.param("out", "int32", [THREADS, CHAINS, lanes])
        for worker in fb.range(THREADS, kind="parallel", name="worker"):
            acc = fb.buffer("acc", vector(int32, lanes), [CHAINS])
            for c in range(CHAINS):
                acc[c] = words.vload(0, lanes)
            for _ in fb.range(PROBE_STEPS, name="step"):
                for c in range(CHAINS):
                    acc[c] = call(name, acc[c], words.vload(0, lanes), words.vload(lanes, lanes))
            for c in range(CHAINS):
                out[worker, c, 0] = acc[c]
    probe = compile_function(fb.function)
    args = (np.arange(2 * lanes, dtype=np.int32), np.zeros((THREADS, CHAINS, lanes), np.int32))
    probe(*args)
    start = time.perf_counter()
    probe(*args)
    seconds = time.perf_counter() - start
    per_instruction = lanes * (4 if name == "dot_u8s8" else 2)
    return 2 * per_instruction * CHAINS * PROBE_STEPS * THREADS / seconds, name


def bench_shape(shape: Shape, level: int, repeat: int) -> dict[str, float]:
    """GOP/s of each system on ``shape``."""
    import treadle
    from matmul import onnx_matmul
    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, shape.a_shape()).astype(np.uint8)
    b = rng.integers(-128, 128, shape.b_shape()).astype(np.int8)
    model = onnx_matmul(shape, b, "MatMulInteger", "UINT8", "INT32")
    compiled = treadle.compile(model, tune=level)
    session = onnxruntime_session(model.SerializeToString(), THREADS)
    expected = session.run(None, {"a": a})[0]
    if not np.array_equal(compiled(a)[0], expected):
        print(f"warning: treadle's int8 result for {shape.label} differs from ONNX Runtime's",
              file=sys.stderr)
    af, bf = a.astype(np.float32), b.astype(np.float32)
    floats = treadle.compile(onnx_matmul(shape, bf), tune=level)
    runs = {"treadle int8": lambda: compiled(a),
            "onnxruntime int8": lambda: session.run(None, {"a": a}),
            "treadle fp32": lambda: floats(af)}
    seconds = interleaved_medians(runs, repeat, IDLE_GAP_S)
    return {k: shape.flops / s / 1e9 for k, s in seconds.items()}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--level", type=int, default=0, choices=(0, 1, 2))
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--only", help="run only shapes whose label contains this text")
    args = parser.parse_args(argv)
    from treadle.config import override
    warn_if_busy()
    with override(num_threads=THREADS, cache_dir=tempfile.mkdtemp(prefix="treadle-bench-")):
        peak, instruction = int8_peak()
        print(f"int8 peak ({instruction} probe, {THREADS} threads): {peak / 1e9:.0f} GOP/s")
        names = ("treadle int8", "onnxruntime int8", "treadle fp32")
        print(f"{'GOP/s':<34}" + "".join(f"{k:>18}" for k in names)
              + f"{'vs ORT':>8}{'vs fp32':>8}{'of peak':>8}")
        for shape in (s for s in SHAPES if not args.only or args.only in s.label):
            rates = bench_shape(shape, args.level, args.repeat)
            mine = rates["treadle int8"]
            print(f"{shape.label:<34}" + "".join(f"{rates[k]:>18.1f}" for k in names)
                  + f"{mine / rates['onnxruntime int8']:>8.2f}"
                  + f"{mine / rates['treadle fp32']:>8.2f}{mine / peak * 1e9:>8.2f}",
                  flush=True)
    warn_if_busy()


if __name__ == "__main__":
    main()
