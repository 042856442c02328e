"""Dynamic shapes: one model compiled for a range of sizes against models compiled for
each size alone, ONNX Runtime, and the same symbolic model without a dispatcher.

    python bench/dynamic.py                                   # BERT-base, ResNet-50, operators
    python bench/dynamic.py --models bert --json bench/out/dynamic.json \\
        --plot bench/out/dynamic.png
    python bench/dynamic.py --models ops --repeat 30

(from the repository root with PYTHONPATH=., or with treadle installed)

Per model, every system runs on ``--threads`` threads (2), compiled into a fresh tuning
cache:

    dynamic     treadle.compile(file, dynamic={symbol: (lo, hi)}): kernels tuned over the
                whole range at once, variants and a dispatcher (tune.dynamic)
    one-config  treadle.compile(file, tune=1): the same symbolic model with one config per
                kernel, tuned at the measuring stand-in size (the dispatcher's baseline)
    static      treadle.compile(file, tune=1, shapes=...) for each timed size alone
    onnxruntime the same dynamic ONNX file, all graph optimizations

The timed sizes are not the stand-in sizes tuning measured at (BERT: 1, 3, 17, 50, 77,
100, 128 for seq 1..128; ResNet-50: 1, 3, 5, 7, 11, 16 for batch 1..16). Latencies are
medians of at least ``--repeat`` interleaved calls (``treadle.timing``); a speed-up is the
other system's time over the dynamic model's. Tuning time compares the dynamic compile
with the static compiles of all timed sizes (each a cold compile at tune=1), and the
compile times at tune=0, which measure nothing, say how much of each is compiling.

``ops`` times DietCode's operator set as kernels of their own: BERT-base's dense layers
on 16 sequences (M = 16 T) and its attention products with T on both sides, for T in
1..128.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

import treadle
from common import enter_treadle_settings, exported, relative_error
from treadle import ops
from treadle.timing import interleaved_medians, load_note, onnxruntime_session

MODELS = {
    "bert": dict(symbol="seq", range=(1, 128), sizes=(1, 3, 17, 50, 77, 100, 128)),
    "resnet50": dict(symbol="batch", range=(1, 16), sizes=(1, 3, 5, 7, 11, 16)),
}
OP_SIZES = (1, 3, 17, 50, 77, 100, 128)
SYSTEMS = ("dynamic", "one-config", "static", "onnxruntime")


def _compiled(path, **kwargs):
    start = time.perf_counter()
    model = treadle.compile(path, **kwargs)
    return model, time.perf_counter() - start


def bench_model(name: str, args) -> dict:
    setup = MODELS[name]
    symbol, (lo, hi) = setup["symbol"], setup["range"]
    spec = exported(name, False, dynamic_seq=symbol == "seq", dynamic_batch=symbol == "batch")
    with contextlib.ExitStack() as stack:
        enter_treadle_settings(stack, args.threads, warm_cache=False)
        _, plain_s = _compiled(spec.path, tune=0)
        dynamic, dynamic_s = _compiled(spec.path, dynamic={symbol: (lo, hi)})
        one, one_s = _compiled(spec.path, tune=1)
        session = onnxruntime_session(spec.path, args.threads)
        rows, static_s, static_plain_s = [], [], []
        for size in setup["sizes"]:
            inputs = spec.random_inputs(**{symbol: size})
            shapes = {k: v.shape for k, v in inputs.items()}
            static, seconds = _compiled(spec.path, tune=1, shapes=shapes)
            static_s.append(seconds)
            static_plain_s.append(_compiled(spec.path, tune=0, shapes=shapes)[1])
            expected = session.run(None, inputs)[0]
            error = relative_error(dynamic(**inputs)[0], expected)
            seconds = interleaved_medians({
                "dynamic": lambda: dynamic(**inputs), "one-config": lambda: one(**inputs),
                "static": lambda: static(**inputs),
                "onnxruntime": lambda: session.run(None, inputs)}, args.repeat)
            rows.append({"size": size, "error": error,
                         "ms": {k: v * 1e3 for k, v in seconds.items()}})
            print(_row(rows[-1]), file=sys.stderr, flush=True)
    return {"name": name, "symbol": symbol, "range": [lo, hi], "rows": rows,
            "compile_s": {"dynamic": dynamic_s, "tune0 (symbolic)": plain_s,
                          "one-config": one_s, "static (all sizes)": sum(static_s),
                          "static (mean size)": float(np.mean(static_s)),
                          "static tune0 (mean size)": float(np.mean(static_plain_s))}}


def _dense(tokens_per_sequence: int, k: int, n: int, batch: int = 16):
    """A BERT-base dense layer on ``batch`` sequences of length T (M = batch T)."""
    x = ops.input("x", "float32", [batch, tokens_per_sequence, k])
    w = ops.constant(np.random.default_rng(0).standard_normal((k, n)).astype("float32"))
    return ops.graph([x], [ops.matmul(x, w)], name=f"dense_{k}x{n}")


def _attention(tokens, product: str, batch: int = 16, heads: int = 12, width: int = 64):
    """Attention's batched products with T on both sides: Q K^T and P V."""
    q = ops.input("q", "float32", [batch, heads, tokens, width])
    if product == "qk":
        k = ops.input("k", "float32", [batch, heads, width, tokens])
    else:
        q = ops.input("q", "float32", [batch, heads, tokens, tokens])
        k = ops.input("k", "float32", [batch, heads, tokens, width])
    return ops.graph([q, k], [ops.matmul(q, k)], name=f"attention_{product}")


OPERATORS = {
    "dense 768x768": lambda t: _dense(t, 768, 768),
    "dense 768x3072": lambda t: _dense(t, 768, 3072),
    "dense 3072x768": lambda t: _dense(t, 3072, 768),
    "attention QK^T": lambda t: _attention(t, "qk"),
    "attention PV": lambda t: _attention(t, "pv"),
}


def bench_operators(args) -> list[dict]:
    """Each operator compiled once over T in 1..128 against one compile per T (tune=1)."""
    results = []
    rng = np.random.default_rng(0)
    for label, build in OPERATORS.items():
        with contextlib.ExitStack() as stack:
            enter_treadle_settings(stack, args.threads, warm_cache=False)
            dynamic, dynamic_s = _compiled(build("T"), dynamic={"T": (1, 128)})
            one, _ = _compiled(build("T"), tune=1)
            rows, static_s = [], []
            for t in OP_SIZES:
                static, seconds = _compiled(build(t), tune=1)
                static_s.append(seconds)
                graph = build(t)
                inputs = [rng.standard_normal([int(d) for d in x.shape]).astype("float32")
                          for x in graph.inputs]
                seconds = interleaved_medians({
                    "dynamic": lambda: dynamic(*inputs), "one-config": lambda: one(*inputs),
                    "static": lambda: static(*inputs)}, args.repeat)
                rows.append({"size": t, "ms": {k: v * 1e3 for k, v in seconds.items()}})
            results.append({"name": label, "symbol": "T", "range": [1, 128], "rows": rows,
                            "compile_s": {"dynamic": dynamic_s,
                                          "static (all sizes)": sum(static_s),
                                          "static (mean size)": float(np.mean(static_s))}})
            print(table(results[-1]), file=sys.stderr, flush=True)
    return results


def _row(row: dict) -> str:
    ms = row["ms"]
    ratios = "  ".join(f"{s} {ms[s] / ms['dynamic']:.2f}x" for s in SYSTEMS[1:] if s in ms)
    return f"  {row['size']:>4}: dynamic {ms['dynamic']:8.3f} ms  ({ratios})"


def geomean(values) -> float:
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def table(result: dict) -> str:
    """A markdown table: latency per system and size, speed-ups of dynamic over each."""
    systems = [s for s in SYSTEMS if s in result["rows"][0]["ms"]]
    head = f"| {result['symbol']} | " + " | ".join(f"{s} ms" for s in systems)
    head += " | " + " | ".join(f"vs {s}" for s in systems[1:]) + " |"
    lines = [f"### {result['name']} ({result['symbol']} in "
             f"{result['range'][0]}..{result['range'][1]})", "", head,
             "|" + "---|" * (1 + 2 * len(systems) - 1)]
    for row in result["rows"]:
        ms = row["ms"]
        lines.append(f"| {row['size']} | " + " | ".join(f"{ms[s]:.3f}" for s in systems)
                     + " | " + " | ".join(f"{ms[s] / ms['dynamic']:.2f}x" for s in systems[1:])
                     + " |")
    means = [geomean(r["ms"][s] / r["ms"]["dynamic"] for r in result["rows"])
             for s in systems[1:]]
    lines.append("| geomean | " + " | ".join("" for _ in systems) + " | "
                 + " | ".join(f"{m:.2f}x" for m in means) + " |")
    lines.append("")
    lines.append("compile seconds: " + ", ".join(f"{k} {v:.1f}"
                                                 for k, v in result["compile_s"].items()))
    return "\n".join(lines)


def plot(results: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 4), squeeze=False)
    for ax, result in zip(axes[0], results):
        sizes = [r["size"] for r in result["rows"]]
        for system in SYSTEMS:
            if system in result["rows"][0]["ms"]:
                ax.plot(sizes, [r["ms"][system] for r in result["rows"]], marker="o",
                        label=system)
        ax.set_title(result["name"])
        ax.set_xlabel(result["symbol"])
        ax.set_ylabel("latency (ms)")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=[*MODELS, "ops"],
                        choices=[*MODELS, "ops"])
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--plot", type=Path)
    args = parser.parse_args(argv)
    print(load_note(args.threads), file=sys.stderr)
    results = [bench_model(name, args) for name in args.models if name in MODELS]
    if "ops" in args.models:
        results += bench_operators(args)
    for result in results:
        print(table(result) + "\n")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1))
    if args.plot:
        plot([r for r in results if r["name"] in MODELS], args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
