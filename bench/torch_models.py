"""The paper models as torch modules: torch.compile(backend="treadle") against Inductor,
eager PyTorch and treadle's ONNX path.

    python bench/torch_models.py                        # five models, tune 0, 30 timed calls
    python bench/torch_models.py --models bert --tune 1
    python bench/torch_models.py --models bert gpt2 --attention sdpa --no-dynamic
    python bench/torch_models.py --reduced --repeat 3   # the CI-sized models, to check it

(from the repository root with PYTHONPATH=.:bench, or with treadle installed)

Every system runs on ``--threads`` threads with the zoo's random weights at batch 1 under
``torch.inference_mode`` (treadle's ONNX path on the exported file). Latencies are
interleaved medians (``treadle.timing``); a speed-up is the other system's time over the
backend's. Compile seconds are each system's first call (dynamo, AOTAutograd and the
compiler) into a fresh kernel cache. The dynamic part runs BERT through the backend with
``dynamic=True`` at several sequence lengths and counts how often treadle compiled.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time

import treadle
from common import enter_treadle_settings, exported, relative_error
from models import _ratio, geomean
from treadle.integrations import dynamo
from treadle.models import MODELS as ZOO, build
from treadle.timing import interleaved_medians, load_note

MODELS = ("resnet50", "inception_v3", "mobilenet_v2", "bert", "gpt2")
SYSTEMS = ("backend", "onnx path", "inductor", "eager")
DYNAMIC_LENGTHS = (16, 48, 80, 128)


def _first(outputs):
    return outputs[0] if isinstance(outputs, (tuple, list)) else outputs


def _timed_first_call(fn):
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def bench_model(name: str, args) -> dict:
    import torch
    spec = exported(name, args.reduced)
    arrays = spec.random_inputs()
    tensors = [torch.from_numpy(a) for a in arrays.values()]
    attention = args.attention if ZOO[name].family == "transformer" else None
    module = build(name, reduced=args.reduced, attention=attention)
    compiled = {"backend": torch.compile(module, backend="treadle",
                                         options={"tune": args.tune}),
                "inductor": torch.compile(module), "eager": module}

    def call(fn):
        def run():
            with torch.inference_mode():
                return fn(*tensors)
        return run
    runs = {system: call(fn) for system, fn in compiled.items()}
    compile_s = {}
    expected = _first(runs["eager"]()).numpy()
    for system in ("backend", "inductor"):
        result, compile_s[system] = _timed_first_call(runs[system])
        error = relative_error(_first(result).numpy(), expected)
        print(f"{name}: {system} relative error {error:.1e}", file=sys.stderr)
    start = time.perf_counter()
    onnx_model = treadle.compile(spec.path, tune=args.tune)
    compile_s["onnx path"] = time.perf_counter() - start
    runs["onnx path"] = lambda: onnx_model(**arrays)
    seconds = interleaved_medians(runs, args.repeat)
    return {"model": name, "ms": {s: seconds[s] * 1e3 for s in SYSTEMS},
            "compile_s": compile_s}


def bench_dynamic(args) -> dict:
    """BERT through the backend with a dynamic sequence length."""
    import torch
    module = build("bert", reduced=args.reduced)
    backend = torch.compile(module, backend="treadle", dynamic=True,
                            options={"tune": args.tune})
    compiles = []
    original = dynamo.split_and_compile
    dynamo.split_and_compile = lambda *a, **k: compiles.append(1) or original(*a, **k)
    rows = []
    try:
        for length in DYNAMIC_LENGTHS if not args.reduced else (5, 9, 16):
            spec = exported("bert", args.reduced)
            arrays = spec.random_inputs()
            tensors = [torch.from_numpy(a[:, :length].copy()) for a in arrays.values()]

            def call(fn):
                def run():
                    with torch.inference_mode():
                        return fn(*tensors)
                return run
            seconds = interleaved_medians({"backend": call(backend),
                                           "eager": call(module)}, args.repeat)
            rows.append({"seq": length, "backend_ms": seconds["backend"] * 1e3,
                         "eager_ms": seconds["eager"] * 1e3})
    finally:
        dynamo.split_and_compile = original
    return {"rows": rows, "compiles": len(compiles)}


def print_models(results: list[dict]) -> None:
    print("| model | backend ms | ONNX path ms | Inductor ms | eager ms | vs Inductor "
          "| vs eager | vs ONNX path | compile s (backend / Inductor / ONNX path) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in results:
        ms, mine = r["ms"], r["ms"]["backend"]
        c = r["compile_s"]
        print(f"| {r['model']} | {mine:.2f} | {ms['onnx path']:.2f} | {ms['inductor']:.2f} "
              f"| {ms['eager']:.2f} | {_ratio(ms['inductor'] / mine)} "
              f"| {_ratio(ms['eager'] / mine)} | {_ratio(ms['onnx path'] / mine)} "
              f"| {c['backend']:.1f} / {c['inductor']:.1f} / {c['onnx path']:.1f} |")
    if len(results) > 1:
        for other in ("inductor", "eager", "onnx path"):
            print(f"geometric mean vs {other}: "
                  f"{geomean([r['ms'][other] / r['ms']['backend'] for r in results]):.2f}x")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--reduced", action="store_true", help="the CI-sized models")
    parser.add_argument("--repeat", type=int, default=30, help="timed calls per system")
    parser.add_argument("--tune", type=int, default=0, choices=(0, 1, 2))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--attention", choices=("eager", "sdpa"),
                        help="BERT's and GPT-2's attention in the torch systems (default the "
                             "zoo's eager; the ONNX path keeps the zoo's file)")
    parser.add_argument("--no-dynamic", action="store_true", help="skip the dynamic BERT")
    args = parser.parse_args(argv)
    import torch
    torch.set_num_threads(args.threads)
    cores = len(os.sched_getaffinity(0))
    print(load_note(cores), file=sys.stderr)
    with contextlib.ExitStack() as stack:
        enter_treadle_settings(stack, args.threads, warm_cache=False)
        results = []
        for name in args.models:
            print(f"benchmarking {name} ...", file=sys.stderr, flush=True)
            results.append(bench_model(name, args))
            torch._dynamo.reset()
        print_models(results)
        if not args.no_dynamic:
            dynamic = bench_dynamic(args)
            print(f"\nBERT, dynamic sequence length through the backend "
                  f"({dynamic['compiles']} treadle compiles for {len(dynamic['rows'])} "
                  "lengths)\n\n| seq | backend ms | eager ms | vs eager |\n|---:|---:|---:|---:|")
            for row in dynamic["rows"]:
                print(f"| {row['seq']} | {row['backend_ms']:.2f} | {row['eager_ms']:.2f} "
                      f"| {_ratio(row['eager_ms'] / row['backend_ms'])} |")
    print(f"\n{load_note(cores)}; {args.threads} threads per system, treadle tune={args.tune}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
