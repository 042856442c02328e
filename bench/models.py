"""Whole-model latency: treadle against ONNX Runtime, OpenVINO, PyTorch eager and
torch.compile, in float32 or on int8 quantised models.

    python bench/models.py                      # the papers' seven benchmarks, tune 1 (long)
    python bench/models.py --models wider --tune 0   # the zoo beyond the papers' models
    python bench/models.py --models mobilenet_v2 --repeat 5 --tune 0
    python bench/models.py --reduced --repeat 3 # the CI-sized models, to check the script
    python bench/models.py --models bert gpt2 --no-compile --json bench/out/models.json
    python bench/models.py --precision int8     # the seven benchmarks quantised to int8
    python bench/models.py --precision int8 --models resnet50 bert --reduced --repeat 3
    python bench/models.py --subgraphs          # ResNet-50's Conv-BN-ReLU layers one by one

(from the repository root with PYTHONPATH=., or with treadle installed)

The papers' benchmarks are ResNet-50, Inception-V3, MobileNetV2, BERT-base and GPT-2 small
(seq 128) at batch 1, and ResNet-50 at batch 4 and 8; ``wider`` adds the rest of the zoo at
batch 1 (ResNeXt, RegNetY and RegNetX, Res2Net, CSPDarknet, EfficientNet, MixNet, Candy,
Segformer, U-Net, DeepLabV3 on MobileNetV3, R3D-18, ECA-ResNet-50, DPN-68 and a small
Mamba), all
with the zoo's random weights (treadle.models). Every system runs on ``--threads`` threads
(2): treadle compiles the exported ONNX file with ``treadle.compile(path, tune=LEVEL)``
into a fresh kernel and tuning cache (``--warm-cache`` uses the user's), then compiles it
again, which must be served from that cache; ONNX Runtime runs the same file with all
graph optimizations (its default); OpenVINO, when installed (``pip install openvino``, or
the ``bench`` extra), compiles it for its CPU plugin with the latency hint and float32
inference precision (its default on CPUs with AMX or AVX-512 BF16 is bfloat16, and a QDQ
file keeps its int8 convolutions under the float32 hint); PyTorch eager and torch.compile
(inductor) run the torch module with the same weights under ``torch.inference_mode``. The
run opens with the CPU's model and its SIMD and matrix extensions (AVX-512, VNNI, AMX),
which decide the kernels each system can use.

``--precision int8`` quantises each exported file with ONNX Runtime's tools
(bench/quantize.py: the image models statically to QDQ with per-channel weights, on random
calibration batches; BERT and GPT-2 dynamically) and times treadle, ONNX Runtime and
OpenVINO on the quantised file against treadle on the float file ("treadle fp32"); there is
no quantised torch module, so no PyTorch column. treadle's int8 outputs are compared with
ONNX Runtime's: the largest absolute difference, the share of output elements within one
quantisation step of a QDQ model's output (its DequantizeLinear's scale) or, for an output
without one, within 1e-5 of the output's largest magnitude, and the relative error.

Latencies are medians of at least ``--repeat`` timed calls after warm-up. The systems are
interleaved in rounds (one untimed call, then a few timed ones per system) so that a
change in the machine's load hits all of them alike, with an idle gap between systems,
since ONNX Runtime's and OpenMP's worker threads spin for ~40 ms after a run. A speed-up
is a baseline's time over treadle's (above 1: treadle is faster); the error is treadle's
largest relative error against ONNX Runtime over all outputs (bench/common.py), and a note
gives OpenVINO's.

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
from typing import Callable, Mapping, Optional

import numpy as np

import treadle
from common import (RELATIVE_TOLERANCE, cpu_note, enter_treadle_settings, exported,
                    relative_error)
from quantize import output_steps, quantized
from treadle.config import config
from treadle.models import MODELS, ModelSpec, build
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
         "mixnet_s", "candy", "segformer_b0", "unet", "deeplabv3_mobilenet_v3", "r3d_18",
         "eca_resnet50", "regnetx_200mf", "dpn68", "mamba_small")
BENCHMARKS.update({name: Benchmark(name, 1) for name in WIDER})
PAPER = ("resnet50", "inception_v3", "mobilenet_v2", "bert", "gpt2", "resnet50_b4",
         "resnet50_b8")
# The systems treadle is compared with, by precision, in the tables' column order.
BASELINES = {"fp32": ("onnxruntime", "openvino", "eager", "torch.compile"),
             "int8": ("onnxruntime", "openvino", "treadle fp32")}
SHORT_NAMES = {"treadle": "treadle", "onnxruntime": "ORT", "openvino": "OpenVINO",
               "eager": "eager", "torch.compile": "torch.compile",
               "treadle fp32": "treadle fp32"}
# In an int8 table, the systems that run the quantised file (the others run the float one).
ON_INT8 = ("treadle", "onnxruntime", "openvino")
AGREEMENT_SCALE = 1e-5  # of an output's largest magnitude, where it has no quantisation step
OPENVINO_MISSING = "OpenVINO: n/a (not installed: pip install openvino)"


@dataclass
class Agreement:
    """treadle's int8 outputs against ONNX Runtime's, over all output elements."""
    max_abs_diff: float
    within: float  # share of elements within their output's tolerance
    tolerances: dict[str, float]  # by output: its quantisation step, else AGREEMENT_SCALE


@dataclass
class Result:
    label: str
    batch: int
    precision: str
    ms: dict[str, Optional[float]]  # by system; None when the system could not run
    rel_error: float
    compile_s: float
    recompile_s: float
    agreement: Optional[Agreement] = None  # int8 only
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


def failure_note(system: str, error: Exception) -> str:
    """'<system>: n/a (<error>)', also printed, for a baseline that could not run."""
    reason = str(error).strip().splitlines()[0] if str(error).strip() else ""
    note = f"{system}: n/a ({type(error).__name__}: {reason[:200]})"
    print(note, file=sys.stderr)
    return note


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
        return runs, failure_note("torch.compile", error)
    runs["torch.compile"] = compiled
    return runs, None


def first_outputs(outputs) -> np.ndarray:
    """A torch module's first output as an array (the transformers return tuples)."""
    return (outputs[0] if isinstance(outputs, (tuple, list)) else outputs).numpy()


def openvino_run(path: Path, inputs: dict[str, np.ndarray], threads: int):
    """A callable running ``path`` in OpenVINO's CPU plugin, returning its outputs by name,
    or None and a note saying why OpenVINO is missing. Inference precision is float32 for
    the quantised files too: the default on CPUs with AMX or AVX-512 BF16 is bfloat16,
    under which QDQ files fail to compile, and a QDQ file keeps its int8 convolutions."""
    try:
        import openvino
    except ImportError:
        return None, OPENVINO_MISSING
    try:
        model = openvino.Core().compile_model(path, "CPU", {
            "PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": str(threads),
            "INFERENCE_PRECISION_HINT": "f32"})
    except Exception as error:  # the plugin rejects a file: report it and go on
        return None, failure_note("OpenVINO", error)
    request = model.create_infer_request()

    def run() -> dict[str, np.ndarray]:
        results = request.infer(inputs)
        return {port.get_any_name(): results[port] for port in model.outputs}
    return run, None


def output_error(actual: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray]) -> float:
    """The largest relative_error over the outputs of ``expected`` (ONNX Runtime's)."""
    return max(relative_error(actual[name], want) for name, want in expected.items())


def baseline_runs(path: Path, inputs: dict[str, np.ndarray], threads: int):
    """ONNX Runtime's outputs on ``inputs`` by name (the reference); the callables of ONNX
    Runtime and, when it runs, OpenVINO on ``path``; and a note with OpenVINO's error
    against ONNX Runtime or why it is missing."""
    session = onnxruntime_session(path, threads)
    names = [o.name for o in session.get_outputs()]
    expected = dict(zip(names, session.run(None, inputs)))
    runs: dict[str, Callable[[], object]] = {"onnxruntime": lambda: session.run(None, inputs)}
    openvino, note = openvino_run(path, inputs, threads)
    if openvino is not None:
        runs["openvino"] = openvino
        note = (f"OpenVINO: max rel err {output_error(openvino(), expected):.1e} against "
                f"ONNX Runtime")
    return expected, runs, note


def agreement(actual: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray],
              steps: Mapping[str, float]) -> Agreement:
    """How closely ``actual`` follows ``expected``: each output's elements count as
    agreeing within one quantisation step (``steps``), or within AGREEMENT_SCALE of the
    output's largest magnitude where it has none."""
    tolerances, within, total, max_diff = {}, 0, 0, 0.0
    for name, want in expected.items():
        diff = np.abs(actual[name].astype(np.float64) - want)
        tolerances[name] = steps.get(name, AGREEMENT_SCALE * float(np.abs(want).max()))
        within += int(np.count_nonzero(diff <= tolerances[name]))
        total += diff.size
        max_diff = max(max_diff, float(diff.max(initial=0.0)))
    return Agreement(max_diff, within / (total or 1), tolerances)


# ---- whole models --------------------------------------------------------------------------

def bench_fp32(label: str, bench: Benchmark, spec: ModelSpec, args) -> Result:
    inputs = spec.random_inputs()
    compiled, compile_s, recompile_s, cache_note = compile_treadle(spec.path, args.tune)
    expected, baselines, openvino_note = baseline_runs(spec.path, inputs, args.threads)
    rel_error = output_error(dict(zip(compiled.output_names, compiled(**inputs))), expected)
    module = build(bench.model, reduced=args.reduced)
    torch_calls, compile_note = torch_runs(module, inputs, not args.no_compile)
    eager_error = relative_error(first_outputs(torch_calls["eager"]()),
                                 next(iter(expected.values())))
    if eager_error > RELATIVE_TOLERANCE:  # the torch module should have the file's weights
        print(f"warning: {label}: PyTorch eager differs from ONNX Runtime by {eager_error:.1e}",
              file=sys.stderr)
    runs = {"treadle": lambda: compiled(**inputs), **baselines, **torch_calls}
    return Result(label, bench.batch, "fp32", timed(runs, "fp32", args.repeat), rel_error,
                  compile_s, recompile_s,
                  notes=[n for n in (cache_note, openvino_note, compile_note) if n])


def bench_int8(label: str, bench: Benchmark, spec: ModelSpec, args) -> Result:
    path = quantized(spec)
    inputs = spec.random_inputs()
    compiled, compile_s, recompile_s, cache_note = compile_treadle(path, args.tune)
    float_model = treadle.compile(spec.path, tune=args.tune)
    expected, baselines, openvino_note = baseline_runs(path, inputs, args.threads)
    actual = dict(zip(compiled.output_names, compiled(**inputs)))
    runs = {"treadle": lambda: compiled(**inputs), **baselines,
            "treadle fp32": lambda: float_model(**inputs)}
    return Result(label, bench.batch, "int8", timed(runs, "int8", args.repeat),
                  output_error(actual, expected), compile_s, recompile_s,
                  agreement(actual, expected, output_steps(path)),
                  [n for n in (cache_note, openvino_note) if n])


def timed(runs: dict[str, Callable[[], object]], precision: str,
          repeat: int) -> dict[str, Optional[float]]:
    """Milliseconds of every system of ``precision``'s table; None for those not in
    ``runs``."""
    seconds = interleaved_medians(runs, repeat)
    return {name: seconds[name] * 1e3 if name in seconds else None
            for name in ("treadle", *BASELINES[precision])}


def _cell(value: Optional[float], form: str) -> str:
    return "n/a" if value is None else format(value, form)


def _ratio(value: Optional[float]) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def _system_header(system: str, precision: str) -> str:
    suffix = " int8" if precision == "int8" and system in ON_INT8 else ""
    return f"{SHORT_NAMES[system]}{suffix} ms"


def model_table(results: list[Result], precision: str) -> str:
    baselines = BASELINES[precision]
    checks = (["max abs diff", "share within tol (QDQ: 1 output step; else 1e-5 x max abs ref)",
               "max rel err"] if precision == "int8" else ["max rel err"])
    systems = ("treadle", *baselines)
    header = ["model", "batch", *(_system_header(s, precision) for s in systems),
              *(f"vs {SHORT_NAMES[s]}" for s in baselines), *checks, "compile+tune s",
              "2nd compile s"]
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join(["---"] * 2 + ["---:"] * (len(header) - 2)) + "|"]
    for r in results:
        agree = ([f"{r.agreement.max_abs_diff:.1e}", f"{r.agreement.within:.4f}"]
                 if r.agreement else [])
        cells = [r.label, str(r.batch),
                 *(_cell(r.ms[s], ".2f") for s in systems),
                 *(_ratio(r.speedup(s)) for s in baselines),
                 *agree, f"{r.rel_error:.1e}", f"{r.compile_s:.1f}", f"{r.recompile_s:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def run_models(args) -> list[Result]:
    import torch
    torch.set_num_threads(args.threads)
    bench = bench_int8 if args.precision == "int8" else bench_fp32
    results = []
    for label in args.models:
        print(f"benchmarking {label} ({args.precision}) ...", file=sys.stderr, flush=True)
        benchmark = BENCHMARKS[label]
        spec = exported(benchmark.model, args.reduced, batch=benchmark.batch)
        result = bench(label, benchmark, spec, args)
        results.append(result)
        print(f"\n### {label} ({args.precision})\n\n{model_table([result], args.precision)}")
        for note in result.notes:
            print(f"\n{note}")
        print(flush=True)
    if len(results) > 1:
        print(f"### all models ({args.precision})\n\n{model_table(results, args.precision)}\n")
    batch_one = [r.speedup("onnxruntime") for r in results if r.batch == 1]
    if batch_one:
        print(f"geometric mean of treadle's speed-up over ONNX Runtime ({args.precision}), "
              f"{len(batch_one)} batch-1 model(s): {geomean(batch_one):.2f}x")
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
    parser.add_argument("--precision", choices=("fp32", "int8"), default="fp32",
                        help="the float32 models, or int8 quantised ones (bench/quantize.py)")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    parser.add_argument("--subgraphs", action="store_true",
                        help="time ResNet-50's Conv-BN-ReLU sub-graphs instead of the models")
    parser.add_argument("--warm-cache", action="store_true",
                        help="compile into the user's kernel cache instead of a fresh one")
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    args = parser.parse_args(argv)
    if args.subgraphs and args.precision != "fp32":
        parser.error("--subgraphs times float32 layers only")
    args.models = [m for name in args.models for m in (WIDER if name == "wider" else [name])]
    if args.repeat < 30:
        print(f"note: {args.repeat} timed calls per system (fewer than 30)", file=sys.stderr)

    cores = len(os.sched_getaffinity(0))
    print(load_note(cores), file=sys.stderr)
    cpu = cpu_note()
    print(cpu, flush=True)
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
                                         "reduced": args.reduced, "precision": args.precision,
                                         "cpu": cpu, **results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
