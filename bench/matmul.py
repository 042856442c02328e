"""Matrix multiplication: treadle (tuned) against torch, ONNX Runtime and numpy.

    python bench/matmul.py                  # level-1 tuning, the standard shapes
    python bench/matmul.py --level 2        # the full space
    python bench/matmul.py --sweep          # also M=N=K for every size 2030..2048 (long),
                                            # plotted to bench/out/matmul_sweep.png

(from the repository root with PYTHONPATH=., or with treadle installed)

Every system runs on the same number of threads (2 by default). Each shape is compiled by
``treadle.compile(model, tune=level)`` in a fresh kernel and record cache (``--warm-cache``
uses the user's), so the "tune s" column is a cold compile including the tuning. ONNX
Runtime runs a MatMul node whose B is an initializer, as a converted model would. Times
are medians of ``--repeat`` calls after warm-up, taken in rounds that visit the systems in
turn (a busy spell slows all of them alike), with an idle gap after each system's turn,
since ONNX Runtime's and the BLAS's worker threads spin for tens of milliseconds after a
call and would steal cores from whichever system ran next.

A single-row product (GEMV, every product of token-by-token decoding) reads each weight
once for two flops, so its bound is the bandwidth at which B's bytes can be read: its
row also gives treadle's GB/s of B and their fraction of a read bandwidth measured in the
same rounds, the faster of two sums over an array of B's size (a treadle ReduceSum on the
benchmark's threads and numpy's column sum), which read each byte once as the product
does.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

THREADS = int(os.environ.get("BENCH_THREADS", "2"))
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, str(THREADS))  # before numpy and torch load their BLAS

import numpy as np  # noqa: E402

from treadle.timing import interleaved_medians, load_note, onnxruntime_session  # noqa: E402

OUT = Path(__file__).resolve().parent / "out"
IDLE_GAP_S = 0.25
SWEEP = range(2030, 2049)


@dataclass(frozen=True)
class Shape:
    label: str
    batch: int
    m: int
    k: int
    n: int

    @property
    def flops(self) -> int:
        return 2 * self.batch * self.m * self.n * self.k

    def a_shape(self):
        return (self.batch, self.m, self.k) if self.batch > 1 else (self.m, self.k)

    def b_shape(self):
        return (self.batch, self.k, self.n) if self.batch > 1 else (self.k, self.n)

    @property
    def gemv(self) -> bool:
        return self.batch == 1 and self.m == 1


SHAPES = [
    Shape("1024^3", 1, 1024, 1024, 1024),
    Shape("2048^3", 1, 2048, 2048, 2048),
    Shape("bert qkv/out 128x768x768", 1, 128, 768, 768),
    Shape("bert ffn1 128x768x3072", 1, 128, 768, 3072),
    Shape("bert ffn2 128x3072x768", 1, 128, 3072, 768),
    Shape("attn scores 12x128x64@64x128", 12, 128, 64, 128),
    Shape("attn context 12x128x128@128x64", 12, 128, 128, 64),
    Shape("gemv 1x768x3072", 1, 1, 768, 3072),
    Shape("gemv 1x3072x768", 1, 1, 3072, 768),
    Shape("gemv 1x4096x4096", 1, 1, 4096, 4096),
    Shape("tall 16384x4x1024", 1, 16384, 4, 1024),
    Shape("tall 16384x1024x4", 1, 16384, 1024, 4),
]


def onnx_matmul(shape: Shape, b: np.ndarray, op_type: str = "MatMul", a_type: str = "FLOAT",
                y_type: str = "FLOAT"):
    """A model of one product of input a by the constant b (types: TensorProto names)."""
    from onnx import TensorProto, helper, numpy_helper
    a = helper.make_tensor_value_info("a", getattr(TensorProto, a_type), list(shape.a_shape()))
    out_shape = [*shape.a_shape()[:-1], shape.n]
    y = helper.make_tensor_value_info("y", getattr(TensorProto, y_type), out_shape)
    node = helper.make_node(op_type, ["a", "b"], ["y"], name="matmul")
    graph = helper.make_graph([node], "matmul", [a], [y], [numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def systems(shape: Shape, a: np.ndarray, b: np.ndarray, level: int):
    """(name, callable) per system, and treadle's compile-and-tune seconds."""
    import torch
    import treadle
    torch.set_num_threads(THREADS)
    model = onnx_matmul(shape, b)
    start = time.perf_counter()
    compiled = treadle.compile(model, tune=level)
    tune_s = time.perf_counter() - start
    session = onnxruntime_session(model.SerializeToString(), THREADS)
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    runs = [("treadle", lambda: compiled(a)),
            ("torch", lambda: torch.matmul(ta, tb)),
            ("onnxruntime", lambda: session.run(None, {"a": a})),
            ("numpy", lambda: np.matmul(a, b))]
    expected = a.astype(np.float64) @ b.astype(np.float64)
    error = np.abs(compiled(a)[0] - expected).max() / max(np.abs(expected).max(), 1e-30)
    if error > 1e-4:
        print(f"warning: treadle's result for {shape.label} is off by {error:.2e} (relative)",
              file=sys.stderr)
    return runs, tune_s


def read_probes(b: np.ndarray) -> dict[str, object]:
    """Callables that read an array of ``b``'s size once each (see the module's note):
    treadle's row sums and numpy's column sums of a copy of ``b``."""
    import treadle
    from onnx import TensorProto, helper, numpy_helper
    copy = b.reshape(-1, b.shape[-1]).copy()
    rows, columns = copy.shape
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, columns])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows])
    node = helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    model = helper.make_model(helper.make_graph([node], "read", [x], [y], [axes]),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    summed = treadle.compile(model)
    return {"read: treadle": lambda: summed(copy),
            "read: numpy": lambda: np.add.reduce(copy, axis=0)}


def bench_shape(shape: Shape, level: int, repeat: int
                ) -> tuple[dict[str, float], float, tuple[float, float] | None]:
    """GFLOP/s per system, the tune seconds, and for a GEMV, treadle's GB/s of B and the
    read bandwidth measured beside it."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal(shape.a_shape(), dtype=np.float32)
    b = rng.standard_normal(shape.b_shape(), dtype=np.float32)
    runs, tune_s = systems(shape, a, b, level)
    probes = read_probes(b) if shape.gemv else {}
    seconds = interleaved_medians({**dict(runs), **probes}, repeat, IDLE_GAP_S)
    gflops = {name: shape.flops / seconds[name] / 1e9 for name, _ in runs}
    if not probes:
        return gflops, tune_s, None
    read_s = min(seconds[name] for name in probes)
    return gflops, tune_s, (b.nbytes / seconds["treadle"] / 1e9, b.nbytes / read_s / 1e9)


def report(shape: Shape, gflops: dict[str, float], tune_s: float,
           bandwidth: tuple[float, float] | None = None) -> None:
    best = max(v for k, v in gflops.items() if k != "treadle")
    cells = "".join(f"{gflops[k]:>12.1f}" for k in ("treadle", "torch", "onnxruntime", "numpy"))
    line = f"{shape.label:<34}{cells}{gflops['treadle'] / best:>8.2f}{tune_s:>9.1f}"
    if bandwidth is not None:
        achieved, read = bandwidth
        line += f"   B at {achieved:.1f} GB/s, {achieved / read:.0%} of read {read:.1f} GB/s"
    print(line, flush=True)


def warn_if_busy() -> None:
    print(f"{load_note(len(os.sched_getaffinity(0)))}, {THREADS} threads per system")


def plot_sweep(rows: list[tuple[int, dict[str, float]]], level: int) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator
    fig, ax = plt.subplots(figsize=(8, 4.5))
    sizes = [size for size, _ in rows]
    for name in rows[0][1]:
        ax.plot(sizes, [g[name] for _, g in rows], marker="o", label=name)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("M = N = K")
    ax.set_ylabel("GFLOP/s")
    ax.set_title(f"float32 matmul, {THREADS} threads (treadle tune={level})")
    ax.grid(alpha=0.3)
    ax.legend()
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / "matmul_sweep.png"
    fig.savefig(path, dpi=120, bbox_inches="tight")
    return path


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--level", type=int, default=1, choices=(0, 1, 2))
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--sweep", action="store_true", help="also M=N=K for 2030..2048")
    parser.add_argument("--only", help="run only shapes whose label contains this text")
    parser.add_argument("--warm-cache", action="store_true",
                        help="use the user's kernel and tuning cache instead of a fresh one")
    args = parser.parse_args(argv)
    if args.repeat < 30:
        print("note: fewer than 30 repeats per system", file=sys.stderr)
    from treadle.config import override
    warn_if_busy()
    cache = None if args.warm_cache else tempfile.mkdtemp(prefix="treadle-bench-")
    header = "".join(f"{k:>12}" for k in ("treadle", "torch", "onnxruntime", "numpy"))
    print(f"{'GFLOP/s':<34}{header}{'ratio':>8}{'tune s':>9}")
    settings = {"num_threads": THREADS, **({"cache_dir": cache} if cache else {})}
    with override(**settings):
        shapes = [s for s in SHAPES if not args.only or args.only in s.label]
        for shape in shapes:
            report(shape, *bench_shape(shape, args.level, args.repeat))
        if args.sweep:
            rows = []
            for size in SWEEP:
                shape = Shape(f"{size}^3", 1, size, size, size)
                gflops, tune_s, _ = bench_shape(shape, args.level, args.repeat)
                report(shape, gflops, tune_s)
                rows.append((size, gflops))
            print(f"plot: {plot_sweep(rows, args.level)}")
    print("ratio: treadle / best of the other systems; tune s: treadle's cold compile "
          "including tuning; B at: treadle's bytes of B per second, against the faster "
          "of two sums over as many bytes")
    warn_if_busy()


if __name__ == "__main__":
    main()
