"""What a symbolic dimension costs: a model compiled once with symbolic sizes, no ranges
declared and nothing tuned, against the same model compiled for each size alone and ONNX
Runtime on the symbolic file.

    python bench/symbolic.py                       # ResNet-50's batch, U-Net's image side
    python bench/symbolic.py --models unet --repeat 30 --json bench/out/symbolic.json

(from the repository root with PYTHONPATH=., or with treadle installed)

Both treadle models compile at ``tune=0`` into a fresh kernel cache, on ``--threads``
threads, as does ONNX Runtime (all graph optimizations). ``resnet50`` has a symbolic
batch (the zoo's export); ``unet`` symbolic height and width (exported here from the
zoo's module). Latencies are medians of at least ``--repeat`` interleaved calls
(``treadle.timing``); a ratio is the other system's time over the symbolic model's.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
import warnings
from pathlib import Path

import treadle
from common import OUT, enter_treadle_settings, exported, relative_error
from treadle.timing import interleaved_medians, load_note, onnxruntime_session

SIZES = {"resnet50": (1, 3, 8), "unet": (96, 144, 256)}  # U-Net: multiples of 16


def _symbolic_file(name: str):
    """The model's ONNX file with its symbolic dimensions, and inputs for one size."""
    if name == "resnet50":
        spec = exported(name, False, dynamic_batch=True)
        return spec.path, lambda size: spec.random_inputs(batch=size)
    import torch
    from treadle.models.export import build
    path = OUT / f"{name}-image.onnx"
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(build(name), (torch.randn(1, 3, 64, 64),), str(path),
                          input_names=["x"], dynamic_axes={"x": {2: "height", 3: "width"}},
                          dynamo=False, opset_version=17)
    return path, lambda size: {"x": torch.randn(1, 3, size, size).numpy()}


def bench_model(name: str, args) -> dict:
    path, inputs_of = _symbolic_file(name)
    rows = []
    with contextlib.ExitStack() as stack:
        enter_treadle_settings(stack, args.threads, warm_cache=False)
        start = time.perf_counter()
        symbolic = treadle.compile(str(path))
        compile_s = time.perf_counter() - start
        session = onnxruntime_session(path, args.threads)
        for size in SIZES[name]:
            inputs = inputs_of(size)
            static = treadle.compile(str(path), shapes={k: v.shape for k, v in inputs.items()})
            error = relative_error(symbolic(**inputs)[0], session.run(None, inputs)[0])
            seconds = interleaved_medians({
                "symbolic": lambda: symbolic(**inputs), "static": lambda: static(**inputs),
                "onnxruntime": lambda: session.run(None, inputs)}, args.repeat)
            rows.append({"size": size, "error": error,
                         "ms": {k: v * 1e3 for k, v in seconds.items()}})
            ms = rows[-1]["ms"]
            print(f"{name} {size}: symbolic {ms['symbolic']:.2f} ms, static "
                  f"{ms['static'] / ms['symbolic']:.2f}x, onnxruntime "
                  f"{ms['onnxruntime'] / ms['symbolic']:.2f}x (error {error:.1e})",
                  file=sys.stderr, flush=True)
    return {"name": name, "rows": rows, "compile_s": compile_s}


def table(result: dict) -> str:
    lines = [f"| {result['name']} size | symbolic ms | static ms | onnxruntime ms "
             "| vs static | vs onnxruntime |", "|---|---|---|---|---|---|"]
    for row in result["rows"]:
        ms = row["ms"]
        lines.append(f"| {row['size']} | {ms['symbolic']:.2f} | {ms['static']:.2f} | "
                     f"{ms['onnxruntime']:.2f} | {ms['static'] / ms['symbolic']:.2f}x | "
                     f"{ms['onnxruntime'] / ms['symbolic']:.2f}x |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    print(load_note(args.threads), file=sys.stderr)
    results = [bench_model(name, args) for name in args.models]
    for result in results:
        print(table(result) + "\n")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
