"""treadle's CUDA matmul template against cuBLAS (``torch.matmul`` in float32, TF32 off),
and whole models compiled for CUDA against PyTorch eager on the same GPU.

    python bench/cuda.py                                  # 1024, 2048, 4096, 2039 cubed
    python bench/cuda.py --sizes 4096 --level 0 --json bench/out/cuda.json
    python bench/cuda.py --sizes --models resnet50 bert   # models only

(from the repository root with PYTHONPATH=., or with treadle installed; needs a GPU and a
CUDA build of torch)

For each size the template's space at ``--level`` is built (nvcc runs in parallel), every
point timed a few times on the GPU, and the fastest point then timed against cuBLAS,
interleaved, ``--repeat`` times each, with CUDA events (device time of one product). The
table gives medians, TFLOP/s and the ratio cuBLAS time / treadle time (above 1: treadle
faster); every chosen kernel's result is first checked against cuBLAS's.

Models are the zoo's (``treadle.models``, random weights, batch 1), exported to ONNX and
compiled with ``target="cuda"`` (level-0 configs); a call is timed whole, from numpy
inputs to numpy outputs (copies included), against the torch module on the GPU called
on a GPU tensor and synchronised, interleaved, ``--repeat`` times each; medians.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import torch

from treadle.backend.cuda import build_cuda
from treadle.ir.compute import reduce
from treadle.ir.dtypes import float32
from treadle.ir.expr import Buffer
from treadle.ir.lower import lower
from treadle.runtime.cuda import CudaKernel, device_properties
from treadle.schedule.template import valid_points
from treadle.schedule.templates.gemm import match_gemm
from treadle.schedule.templates.matmul_cuda import MATMUL_CUDA
from treadle.runtime.cuda import device_target

TUNING_RUNS = 5


def matmul_pattern(size: int):
    a, b = Buffer("a", float32, (size, size)), Buffer("b", float32, (size, size))
    c = reduce("c", [size, size], [size], lambda i, j, r: a[i, r] * b[r, j])
    return replace(match_gemm(c), inputs=(a, b))


def build_points(pattern, level: int, target) -> list[tuple]:
    """(config, CudaKernel) for every valid point of the space, built in parallel."""
    points = valid_points(MATMUL_CUDA, pattern, MATMUL_CUDA.space(pattern, level, target),
                          target)

    def build(item):
        index, (cfg, resolved) = item
        func = lower(MATMUL_CUDA.emit(resolved, f"mm{index}").function, target)
        return cfg, CudaKernel(func, build_cuda([func], target, f"mm{index}").cubin)
    with ThreadPoolExecutor(max_workers=16) as pool:
        return list(pool.map(build, enumerate(points)))


def cublas_time(a, b, c) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.matmul(a, b, out=c)
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def bench_size(size: int, level: int, repeat: int, target) -> dict:
    a, b = (torch.rand(size, size, device="cuda") - 0.5 for _ in range(2))
    c = torch.empty(size, size, device="cuda")
    started = time.perf_counter()
    points = build_points(matmul_pattern(size), level, target)
    built = time.perf_counter() - started
    timed = [(statistics.median(k.time(a, b, c, repeat=TUNING_RUNS, warmup=1)), cfg, k)
             for cfg, k in points]
    _, cfg, kernel = min(timed, key=lambda t: t[0])
    tuned = time.perf_counter() - started
    kernel(a, b, c)
    expected = torch.matmul(a.double(), b.double()).float()
    error = float((c - expected).abs().max() / expected.abs().max())
    ours, theirs = [], []
    for _ in range(repeat):
        ours += kernel.time(a, b, c, repeat=1, warmup=0)
        theirs.append(cublas_time(a, b, c))
    ours_ms, theirs_ms = statistics.median(ours), statistics.median(theirs)
    return {"size": size, "config": str(cfg), "points": len(points), "build_s": built,
            "tune_s": tuned, "treadle_ms": ours_ms, "cublas_ms": theirs_ms,
            "treadle_tflops": 2 * size ** 3 / ours_ms / 1e9,
            "cublas_tflops": 2 * size ** 3 / theirs_ms / 1e9,
            "ratio": theirs_ms / ours_ms, "max_rel_error": error}


def bench_model(name: str, repeat: int, folder) -> dict:
    import treadle
    from treadle.models import build, export_onnx
    spec = export_onnx(name, f"{folder}/{name}.onnx")
    started = time.perf_counter()
    compiled = treadle.compile(spec.path, target="cuda")
    compile_s = time.perf_counter() - started
    inputs = spec.random_inputs()
    module = build(name).cuda()
    args = [torch.from_numpy(a).cuda() for a in inputs.values()]
    with torch.no_grad():
        expected = module(*args)
        expected = (expected[0] if isinstance(expected, tuple) else expected).cpu().numpy()
        actual = compiled(**inputs)[0]
        error = float(abs(actual - expected).max() / abs(expected).max())
        ours, theirs = [], []
        for _ in range(repeat):
            begin = time.perf_counter()
            compiled(**inputs)
            ours.append(time.perf_counter() - begin)
            begin = time.perf_counter()
            module(*args)
            torch.cuda.synchronize()
            theirs.append(time.perf_counter() - begin)
    ours_ms, theirs_ms = 1e3 * statistics.median(ours), 1e3 * statistics.median(theirs)
    return {"model": name, "compile_s": compile_s, "treadle_ms": ours_ms,
            "torch_ms": theirs_ms, "ratio": theirs_ms / ours_ms, "max_rel_error": error,
            "steps": len(compiled.executable.steps)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[1024, 2048, 4096, 2039])
    parser.add_argument("--models", nargs="*", default=[])
    parser.add_argument("--level", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--json")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False  # float32 convolutions, as treadle computes
    target = device_target()
    props = device_properties()
    print(f"device: {props['name']} ({target.arch}, {target.sms} SMs), torch {torch.__version__}")
    rows = []
    for size in args.sizes:
        row = bench_size(size, args.level, args.repeat, target)
        rows.append(row)
        print(f"{size:>5}^3  treadle {row['treadle_ms']:8.3f} ms {row['treadle_tflops']:6.1f} "
              f"TFLOP/s  cuBLAS {row['cublas_ms']:8.3f} ms {row['cublas_tflops']:6.1f} TFLOP/s"
              f"  ratio {row['ratio']:.2f}x  ({row['points']} points, tuned in "
              f"{row['tune_s']:.0f} s; {row['config']}; max rel. error "
              f"{row['max_rel_error']:.1e})", flush=True)
    models = []
    with tempfile.TemporaryDirectory() as folder:
        for name in args.models:
            row = bench_model(name, args.repeat, folder)
            models.append(row)
            print(f"{name:>14}  treadle {row['treadle_ms']:8.2f} ms  torch eager "
                  f"{row['torch_ms']:8.2f} ms  ratio {row['ratio']:.2f}x  ({row['steps']} "
                  f"steps, compiled in {row['compile_s']:.0f} s, max rel. error "
                  f"{row['max_rel_error']:.1e})", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": props["name"], "arch": target.arch, "rows": rows,
                       "models": models}, f, indent=1)


if __name__ == "__main__":
    main()
