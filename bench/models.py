"""Whole-model latency: treadle against ONNX Runtime, PyTorch eager and torch.compile.

    python bench/models.py                      # the papers' seven benchmarks, tune 1 (long)
    python bench/models.py --models wider --tune 0   # the zoo beyond the papers' models
    python bench/models.py --models mobilenet_v2 --repeat 5 --tune 0
    python bench/models.py --reduced --repeat 3 # the CI-sized models, to check the script
    python bench/models.py --models bert gpt2 --no-compile --json bench/out/models.json
    python bench/models.py --subgraphs          # ResNet-50's Conv-BN-ReLU layers one by one

(from the repository root with PYTHONPATH=., or with treadle installed)

The papers' benchmarks are ResNet-50, Inception-V3, MobileNetV2, BERT-base and GPT-2 small
(seq 128) at batch 1, and ResNet-50 at batch 4 and 8; ``wider`` adds the rest of the zoo at
batch 1 (ResNeXt, RegNet, Res2Net, CSPDarknet, EfficientNet, MixNet, Candy, Segformer), all
float32 with the zoo's random weights (treadle.models). Every system runs on ``--threads`` threads (2): treadle compiles the
exported ONNX file with ``treadle.compile(path, tune=LEVEL)`` into a fresh kernel and
tuning cache (``--warm-cache`` uses the user's), then compiles it again, which must be
served from that cache; ONNX Runtime runs the same file with all graph optimizations (its
default); PyTorch eager and torch.compile (inductor) run the torch module with the same
weights under ``torch.inference_mode``.

Latencies are medians of at least ``--repeat`` timed calls after warm-up. The systems are
interleaved in rounds (one untimed call, then a few timed ones per system) so that a
change in the machine's load hits all of them alike, with an idle gap between systems,
since ONNX Runtime's and OpenMP's worker threads spin for ~40 ms after a run. A speed-up
is a baseline's time over treadle's (above 1: treadle is faster); the error is treadle's
largest relative error against ONNX Runtime over all outputs (bench/common.py).

``--subgraphs`` times instead each distinct convolution of ResNet-50 (as in the Hidet
paper's Figure 21) as a Conv2d-BatchNorm2d-ReLU model of its own, treadle against ONNX
Runtime, with the same rounds.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

import treadle
from common import RELATIVE_TOLERANCE, enter_treadle_settings, exported, relative_error
from treadle.config import config
from treadle.models import MODELS, build
from treadle.models.export import OPSET
from treadle.timing import interleaved_medians, load_note, onnxruntime_session


@dataclass(frozen=True)
class Benchmark:
    model: str  # a zoo name
    batch: int


BENCHMARKS = {
    "resnet50": Benchmark("resnet50", 1),
    "inception_v3": Benchmark("inception_v3", 1),
    "mobilenet_v2": Benchmark("mobilenet_v2", 1),
    "bert": Benchmark("bert", 1),
    "gpt2": Benchmark("gpt2", 1),
    "resnet50_b4": Benchmark("resnet50", 4),
    "resnet50_b8": Benchmark("resnet50", 8),
}
# Architectures outside the papers' five, whose layers the templates were not tuned for.
WIDER = ("resnext50", "regnet_y_800mf", "res2net50", "cspdarknet53", "efficientnet_b0",
         "mixnet_s", "candy", "segformer_b0", "unet")
BENCHMARKS.update({name: Benchmark(name, 1) for name in WIDER})
PAPER = ("resnet50", "inception_v3", "mobilenet_v2", "bert", "gpt2", "resnet50_b4",
         "resnet50_b8")
BASELINES = ("onnxruntime", "eager", "torch.compile")


@dataclass
class Result:
    label: str
    batch: int
    ms: dict[str, Optional[float]]  # by system; None when the system could not run
    rel_error: float
    compile_s: float
    recompile_s: float
    notes: list[str] = field(default_factory=list)

    def speedup(self, baseline: str) -> Optional[float]:
        theirs = self.ms.get(baseline)
        return None if theirs is None else theirs / self.ms["treadle"]


# ---- the systems ---------------------------------------------------------------------------

def compile_treadle(path: Path, tune: int):
    """The compiled model, its cold compile seconds, its second compile's seconds, and a
    note when that second compile added anything to the kernel or tuning cache."""
    start = time.perf_counter()
    compiled = treadle.compile(path, tune=tune)
    compile_s = time.perf_counter() - start
    before = _cache_files()
    start = time.perf_counter()
    treadle.compile(path, tune=tune)
    recompile_s = time.perf_counter() - start
    added = _cache_files() - before
    note = (f"warning: the second compile was not served from the caches alone: it added "
            f"{len(added)} files in {', '.join(sorted({p.parts[0] + '/' for p in added}))}"
            if added else None)
    return compiled, compile_s, recompile_s, note


def _cache_files() -> set[Path]:
    root = Path(config.cache_dir)
    return {p.relative_to(root) for p in root.rglob("*") if p.is_file()}


def torch_runs(module, inputs: dict[str, np.ndarray], use_compile: bool):
    """(name, callable) of PyTorch eager and, when it compiles, torch.compile; and a note
    saying why torch.compile is missing."""
    import torch
    tensors = [torch.from_numpy(a) for a in inputs.values()]

    def call(fn):
        def run():
            with torch.inference_mode():
                return fn(*tensors)
        return run
    runs = {"eager": call(module)}
    if not use_compile:
        return runs, "torch.compile: skipped (--no-compile)"
    compiled = call(torch.compile(module))
    try:
        compiled()  # compiles
    except Exception as error:  # any failure of the compiler: report it and go on
        reason = str(error).strip().splitlines()[0] if str(error).strip() else ""
        note = f"torch.compile: n/a ({type(error).__name__}: {reason[:200]})"
        print(note, file=sys.stderr)
        return runs, note
    runs["torch.compile"] = compiled
    return runs, None


def first_outputs(outputs) -> np.ndarray:
    """A torch module's first output as an array (the transformers return tuples)."""
    return (outputs[0] if isinstance(outputs, (tuple, list)) else outputs).numpy()


# ---- whole models --------------------------------------------------------------------------

def bench_model(label: str, bench: Benchmark, args) -> Result:
    spec = exported(bench.model, args.reduced, batch=bench.batch)
    inputs = spec.random_inputs()
    compiled, compile_s, recompile_s, cache_note = compile_treadle(spec.path, args.tune)
    session = onnxruntime_session(spec.path, args.threads)
    expected = session.run(None, inputs)
    actual = dict(zip(compiled.output_names, compiled(**inputs)))
    rel_error = max(relative_error(actual[o.name], want)
                    for o, want in zip(session.get_outputs(), expected))
    module = build(bench.model, reduced=args.reduced)
    torch_calls, compile_note = torch_runs(module, inputs, not args.no_compile)
    eager_error = relative_error(first_outputs(torch_calls["eager"]()), expected[0])
    if eager_error > RELATIVE_TOLERANCE:  # the torch module should have the file's weights
        print(f"warning: {label}: PyTorch eager differs from ONNX Runtime by {eager_error:.1e}",
              file=sys.stderr)
    runs = {"treadle": lambda: compiled(**inputs),
            "onnxruntime": lambda: session.run(None, inputs), **torch_calls}
    seconds = interleaved_medians(runs, args.repeat)
    ms = {name: seconds[name] * 1e3 if name in seconds else None
          for name in ("treadle", *BASELINES)}
    return Result(label, bench.batch, ms, rel_error, compile_s, recompile_s,
                  [n for n in (cache_note, compile_note) if n])


def _cell(value: Optional[float], form: str) -> str:
    return "n/a" if value is None else format(value, form)


def _ratio(value: Optional[float]) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def model_table(results: list[Result]) -> str:
    header = ["model", "batch", "treadle ms", "ORT ms", "eager ms", "torch.compile ms",
              "vs ORT", "vs eager", "vs torch.compile", "max rel err", "compile+tune s",
              "2nd compile s"]
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join(["---"] * 2 + ["---:"] * (len(header) - 2)) + "|"]
    for r in results:
        cells = [r.label, str(r.batch), *(_cell(r.ms[s], ".2f") for s in ("treadle", *BASELINES)),
                 *(_ratio(r.speedup(s)) for s in BASELINES),
                 f"{r.rel_error:.1e}", f"{r.compile_s:.1f}", f"{r.recompile_s:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def run_models(args) -> list[Result]:
    import torch
    torch.set_num_threads(args.threads)
    results = []
    for label in args.models:
        print(f"benchmarking {label} ...", file=sys.stderr, flush=True)
        result = bench_model(label, BENCHMARKS[label], args)
        results.append(result)
        print(f"\n### {label}\n\n{model_table([result])}")
        for note in result.notes:
            print(f"\n{note}")
        print(flush=True)
    if len(results) > 1:
        print(f"### all models\n\n{model_table(results)}\n")
    batch_one = [r.speedup("onnxruntime") for r in results if r.batch == 1]
    if batch_one:
        print(f"geometric mean of treadle's speed-up over ONNX Runtime, {len(batch_one)} "
              f"batch-1 model(s): {geomean(batch_one):.2f}x")
    return results


# ---- ResNet-50's Conv-BN-ReLU sub-graphs ---------------------------------------------------

@dataclass(frozen=True)
class Conv:
    channels: int
    side: int  # of the square input
    filters: int
    kernel: int
    stride: int
    padding: int

    @property
    def label(self) -> str:
        return (f"{self.channels}x{self.side}x{self.side} -> {self.filters} "
                f"k{self.kernel} s{self.stride}")


def resnet50_convs(reduced: bool) -> list[Conv]:
    """The distinct convolutions of (the reduced or full) ResNet-50 on its standard image,
    in the order the network runs them."""
    import torch
    recipe = MODELS["resnet50"]
    side = recipe.reduced_size if reduced else recipe.size
    model = build("resnet50", reduced=reduced)
    seen: dict[Conv, None] = {}

    def record(module, inputs, _output):
        seen[Conv(module.in_channels, inputs[0].shape[-1], module.out_channels,
                  module.kernel_size[0], module.stride[0], module.padding[0])] = None
    hooks = [m.register_forward_hook(record) for m in model.modules()
             if isinstance(m, torch.nn.Conv2d)]
    with torch.inference_mode():
        model(torch.zeros(1, 3, side, side))
    for hook in hooks:
        hook.remove()
    return list(seen)


def export_conv(conv: Conv, path: Path) -> None:
    """Conv2d-BatchNorm2d-ReLU with random weights and batch-norm statistics, as ONNX."""
    import torch
    nn = torch.nn
    with torch.random.fork_rng(devices=[]), torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's deprecation chatter
        torch.manual_seed(0)
        norm = nn.BatchNorm2d(conv.filters)
        norm.running_mean.uniform_(-0.5, 0.5)
        norm.running_var.uniform_(0.5, 1.5)
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.uniform_(-0.2, 0.2)
        model = nn.Sequential(nn.Conv2d(conv.channels, conv.filters, conv.kernel,
                                        conv.stride, conv.padding, bias=False),
                              norm, nn.ReLU()).eval()
        example = torch.randn(1, conv.channels, conv.side, conv.side)
        torch.onnx.export(model, (example,), str(path), dynamo=False, opset_version=OPSET,
                          input_names=["x"], output_names=["y"])


def bench_conv(conv: Conv, path: Path, args) -> dict:
    export_conv(conv, path)
    x = np.random.default_rng(0).standard_normal(
        (1, conv.channels, conv.side, conv.side)).astype(np.float32)
    start = time.perf_counter()
    compiled = treadle.compile(path, tune=args.tune)
    compile_s = time.perf_counter() - start
    session = onnxruntime_session(path, args.threads)
    rel_error = relative_error(compiled(x)[0], session.run(None, {"x": x})[0])
    seconds = interleaved_medians({"treadle": lambda: compiled(x),
                                   "onnxruntime": lambda: session.run(None, {"x": x})},
                                  args.repeat)
    return {"conv": conv.label, "treadle_ms": seconds["treadle"] * 1e3,
            "onnxruntime_ms": seconds["onnxruntime"] * 1e3, "rel_error": rel_error,
            "compile_s": compile_s}


def run_subgraphs(args) -> list[dict]:
    convs = resnet50_convs(args.reduced)
    print(f"\n### ResNet-50 Conv-BN-ReLU sub-graphs ({len(convs)} distinct convolutions, "
          "batch 1)\n")
    print("| conv (C x H x W -> K, kernel, stride) | treadle ms | ORT ms | vs ORT "
          "| max rel err | compile+tune s |")
    print("|---|---:|---:|---:|---:|---:|", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="treadle-convs-") as folder:
        for k, conv in enumerate(convs):
            row = bench_conv(conv, Path(folder) / f"conv{k}.onnx", args)
            rows.append(row)
            print(f"| {row['conv']} | {row['treadle_ms']:.3f} | {row['onnxruntime_ms']:.3f} "
                  f"| {_ratio(row['onnxruntime_ms'] / row['treadle_ms'])} "
                  f"| {row['rel_error']:.1e} | {row['compile_s']:.1f} |", flush=True)
    ratios = [r["onnxruntime_ms"] / r["treadle_ms"] for r in rows]
    print(f"\ngeometric mean of treadle's speed-up over ONNX Runtime, {len(rows)} "
          f"sub-graphs: {geomean(ratios):.2f}x")
    return rows


# ---- main ----------------------------------------------------------------------------------

def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", choices=[*BENCHMARKS, "wider"],
                        default=list(PAPER),
                        help="benchmarks to run; 'wider' stands for the zoo outside the "
                             "papers' models")
    parser.add_argument("--reduced", action="store_true", help="the CI-sized models")
    parser.add_argument("--repeat", type=int, default=30, help="timed calls per system")
    parser.add_argument("--tune", type=int, default=1, choices=(0, 1, 2),
                        help="treadle's tuning level")
    parser.add_argument("--threads", type=int, default=2, help="threads of every system")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    parser.add_argument("--subgraphs", action="store_true",
                        help="time ResNet-50's Conv-BN-ReLU sub-graphs instead of the models")
    parser.add_argument("--warm-cache", action="store_true",
                        help="compile into the user's kernel cache instead of a fresh one")
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    args = parser.parse_args(argv)
    args.models = [m for name in args.models for m in (WIDER if name == "wider" else [name])]
    if args.repeat < 30:
        print(f"note: {args.repeat} timed calls per system (fewer than 30)", file=sys.stderr)

    cores = len(os.sched_getaffinity(0))
    print(load_note(cores), file=sys.stderr)
    with contextlib.ExitStack() as stack:
        enter_treadle_settings(stack, args.threads, args.warm_cache)
        if args.subgraphs:
            results = {"subgraphs": run_subgraphs(args)}
        else:
            results = {"models": [asdict(r) for r in run_models(args)]}
    print(f"\n{load_note(cores)}; {args.threads} threads per system, treadle tune={args.tune}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"tune": args.tune, "threads": args.threads,
                                         "reduced": args.reduced, **results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
