"""Schedule construction (Gensor) against the analytic default, the greedy (Roller-style)
constructor and exhaustive level-2 tuning, operator by operator.

    python bench/construct.py                   # the whole operator table
    python bench/construct.py --ops gemm_1024 conv3x3_56 --level 1
    python bench/construct.py --json bench/out/construct.json --plot bench/out/construct.png
    python bench/construct.py --models bert gpt2      # whole models, tune=0 vs construct

(from the repository root with PYTHONPATH=., or with treadle installed)

Each workload is a one-operator graph compiled as a model would be (graph passes, then the
anchor of its heaviest kernel and that anchor's template). For it, the level-0 point, the
greedy state, the model's pick of the space ("space"), Gensor's best-ranked state and
every distinct point of the level-``--level``
space are generated and measured together by the tuner's measuring process (random data,
symbolic sizes at 128, arguments rotated to stay cold; medians); "exhaustive" is the
fastest point measured (the space's, or another method's where that was faster: what
exhaustive tuning over their union would keep). The fastest of many noisy timings is
biased low (a memory-bound GEMV's points all lie within the noise: one config measured
183 us in one pass and 380 us in the next), so the methods' points and exhaustive's pick
are then timed again together, CONFIRM_ROUNDS times. The table's GFLOP/s are the medians
of those rounds; its ratios (above 1: faster than exhaustive) are the medians of the
ratios *within* each round, since the machine's state drifts between rounds (one 1x1
convolution's points measured 100-311 us across five rounds, while their order within a
round held). Construction times are wall time of ``construct`` alone. The geometric
means close the table. An operator without a construction (a template with no
space: pooling, depthwise) scores the level-0 point for every method.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from treadle import ops
from treadle.config import override
from treadle.graph.kernel_plan import greedy
from treadle.graph.optimize import optimize
from treadle.schedule.select import select_template
from treadle.schedule.template import default_point
from treadle.schedule.templates.gemm import GEMM
from treadle.schedule.templates.gemm.construction import WEIGHTS, gemm_terms
from treadle.target.cpu import host
from treadle.target.memory import memory_hierarchy
from treadle.timing import load_note
from treadle.tune.construct import construct
from treadle.tune.choice import distinct_points
from treadle.tune.measure import measure_functions

OUT = Path(__file__).resolve().parent / "out"
METHODS = ("default", "greedy", "space", "gensor", "exhaustive")
CONFIRM_ROUNDS = 7


@dataclass(frozen=True)
class Workload:
    label: str
    flops: float
    build: Callable[[], object]  # -> Graph


def _weights(*shape) -> object:
    return ops.constant(np.random.default_rng(0).standard_normal(shape).astype(np.float32))


def gemm(m: int, n: int, k: int, batch: int = 1, constant: bool = True) -> Workload:
    def build():
        a = ops.input("a", "float32", [batch, m, k] if batch > 1 else [m, k])
        b = (_weights(k, n) if constant and batch == 1 else
             ops.input("b", "float32", [batch, k, n] if batch > 1 else [k, n]))
        inputs = [a] if constant and batch == 1 else [a, b]
        return ops.graph(inputs, [ops.matmul(a, b)], name="op")
    label = f"gemm_{'b%d_' % batch if batch > 1 else ''}{m}x{n}x{k}"
    return Workload(label, 2.0 * batch * m * n * k, build)


def conv(c_in: int, c_out: int, size: int, kernel: int, stride: int = 1,
         groups: int = 1) -> Workload:
    pad = kernel // 2

    def build():
        x = ops.input("x", "float32", [1, c_in, size, size])
        w = _weights(c_out, c_in // groups, kernel, kernel)
        y = ops.conv2d(x, w, stride=stride, padding=pad, groups=groups)
        return ops.graph([x], [y], name="op")
    out = (size + 2 * pad - kernel) // stride + 1
    flops = 2.0 * out * out * c_out * (c_in // groups) * kernel * kernel
    kind = "dw" if groups > 1 else f"conv{kernel}x{kernel}"
    return Workload(f"{kind}_{c_in}to{c_out}_{size}_s{stride}", flops, build)


def pool(channels: int, size: int) -> Workload:
    def build():
        x = ops.input("x", "float32", [1, channels, size, size])
        return ops.graph([x], [ops.max_pool2d(x, 3, 2, 1)], name="op")
    out = (size - 1) // 2 + 1
    return Workload(f"maxpool_{channels}_{size}", 9.0 * channels * out * out, build)


WORKLOADS = [
    gemm(1024, 1024, 1024), gemm(512, 512, 512), gemm(2048, 2048, 512),
    gemm(128, 768, 768), gemm(128, 3072, 768), gemm(128, 768, 3072), gemm(128, 2304, 768),
    gemm(128, 128, 64, batch=12, constant=False), gemm(128, 64, 128, batch=12, constant=False),
    gemm(16384, 4, 1024, constant=False), gemm(16384, 1024, 4, constant=False),
    gemm(1, 4096, 4096), gemm(1, 3072, 768), gemm(1, 768, 3072),
    conv(3, 64, 224, 7, 2), conv(64, 64, 56, 1), conv(64, 64, 56, 3), conv(64, 256, 56, 1),
    conv(256, 64, 56, 1), conv(256, 128, 56, 1), conv(128, 128, 28, 3), conv(128, 128, 56, 3, 2),
    conv(128, 512, 28, 1), conv(512, 128, 28, 1), conv(256, 256, 14, 3),
    conv(1024, 256, 14, 1), conv(512, 512, 7, 3), conv(2048, 512, 7, 1),
    conv(32, 16, 112, 1), conv(96, 24, 56, 1), conv(144, 24, 56, 1), conv(960, 320, 7, 1),
    conv(32, 32, 112, 3, 1, groups=32), conv(144, 144, 56, 3, 2, groups=144),
    pool(64, 112),
]


def anchor_pattern(workload: Workload):
    """The template and pattern of the workload's heaviest kernel, as compiled."""
    graph = optimize(workload.build())
    plans = [p for p in greedy(graph) if not p.is_view]
    heaviest = max(plans, key=lambda p: sum(math.prod(
        d if isinstance(d, int) else 1 for d in t.shape) for t in p.anchor.inputs if t))
    return select_template(heaviest.anchor, host())


def bench_workload(workload: Workload, level: int) -> dict:
    target = host()
    template, pattern = anchor_pattern(workload)
    start = time.perf_counter()
    points = {"default": default_point(template, pattern, target)}
    seconds = {"default": time.perf_counter() - start}
    for method in ("greedy", "space", "gensor"):
        start = time.perf_counter()
        points[method] = construct(template, pattern, target, method)[0]
        seconds[method] = time.perf_counter() - start
    space = distinct_points(template, pattern, level, target, first=None)
    candidates = list(dict.fromkeys([p[1] for p in points.values()] + [r for _, r in space]))
    start = time.perf_counter()  # exhaustive tuning's time: emit, build, measure the space
    functions = [template.emit(r, f"w{k}").function for k, r in enumerate(candidates)]
    times = measure_functions(functions, target=target,
                              labels=[str(getattr(r, "config", r)) for r in candidates])
    seconds["exhaustive"] = time.perf_counter() - start
    time_of = dict(zip(candidates, times))
    in_space = {r for _, r in space} | {p[1] for p in points.values()}
    best = min((r for r in in_space if time_of[r] is not None), key=time_of.get)
    points["exhaustive"] = (None, best)
    confirmed = _confirmed(template, [p[1] for p in points.values()])
    rounds = {m: confirmed.get(points[m][1]) for m in points}
    result = {m: statistics.median(rounds[m]) if rounds[m] else time_of[points[m][1]]
              for m in points}
    measured = [] if template is not GEMM else [
        {"config": str(r.config), "seconds": t, "terms": gemm_terms(r, memory_hierarchy())}
        for r, t in time_of.items() if t is not None]
    return {"label": workload.label, "template": template.name, "flops": workload.flops,
            "seconds": result, "rounds": rounds, "construct_s": seconds, "points": len(space),
            "configs": {m: str(points[m][1].config) for m in points}, "measured": measured}


def _confirmed(template, resolved: list) -> dict:
    """Seconds of each distinct point of ``resolved`` in each of CONFIRM_ROUNDS rounds
    (points that fail to run are left out)."""
    distinct = list(dict.fromkeys(resolved))
    functions = [template.emit(r, f"c{k}").function for k, r in enumerate(distinct)]
    labels = [str(getattr(r, "config", r)) for r in distinct]
    rounds = [measure_functions(functions, labels=labels, target=host())
              for _ in range(CONFIRM_ROUNDS)]
    return {r: ts for r, *ts in zip(distinct, *rounds) if None not in ts}


def speedup(row: dict, a: str, b: str) -> float | None:
    """How much faster method ``a`` ran than ``b`` (b's time over a's): the median of the
    ratios within each confirmation round, or of the medians for rows without rounds."""
    rounds = row.get("rounds", {})
    if rounds.get(a) and rounds.get(b):
        return statistics.median(tb / ta for ta, tb in zip(rounds[a], rounds[b]))
    s = row["seconds"]
    return s[b] / s[a] if s[a] and s[b] else None


def fit(rows: list[dict]) -> dict[str, float]:
    """The model's weights that best predict every measured point, by non-negative least
    squares on relative error (each point's terms divided by its measured time)."""
    from scipy.optimize import nnls
    names = list(WEIGHTS)
    points = [p for r in rows for p in r["measured"]]
    a = np.array([[p["terms"][n] / p["seconds"] for n in names] for p in points])
    weights, _ = nnls(a, np.ones(len(points)))
    return dict(zip(names, (round(float(w), 3) for w in weights)))


def table(rows: list[dict]) -> str:
    head = ["operator", "template", "points", *(f"{m} GFLOP/s" for m in METHODS),
            "default/exh", "greedy/exh", "space/exh", "gensor/exh", "gensor/greedy",
            "construct ms"]
    lines = ["| " + " | ".join(head) + " |",
             "|" + "|".join(["---"] * 2 + ["---:"] * (len(head) - 2)) + "|"]
    for r in rows:
        s = r["seconds"]
        gflops = [f"{r['flops'] / s[m] / 1e9:.1f}" if s[m] else "n/a" for m in METHODS]
        ratio = lambda a, b: f"{speedup(r, a, b):.2f}" if speedup(r, a, b) else "n/a"  # noqa: E731
        lines.append("| " + " | ".join([r["label"], r["template"], str(r["points"]), *gflops,
                     ratio("default", "exhaustive"), ratio("greedy", "exhaustive"),
                     ratio("space", "exhaustive"), ratio("gensor", "exhaustive"),
                     ratio("gensor", "greedy"),
                     f"{1e3 * r['construct_s']['gensor']:.0f}"]) + " |")
    for a, b in (("default", "exhaustive"), ("greedy", "exhaustive"), ("space", "exhaustive"),
                 ("gensor", "exhaustive"), ("gensor", "greedy"), ("gensor", "default")):
        values = [v for v in (speedup(r, a, b) for r in rows) if v]
        geo = math.exp(sum(map(math.log, values)) / len(values)) if values else float("nan")
        lines.append(f"\ngeometric mean {a} vs {b}: {geo:.3f} (min {min(values):.2f})")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    for method in ("default", "greedy", "space", "gensor", "exhaustive"):
        measured = [r for r in rows if method in r["construct_s"]
                    and speedup(r, method, "exhaustive")]
        quality = [speedup(r, method, "exhaustive") for r in measured]
        spent = [r["construct_s"][method] for r in measured]
        ax.scatter(spent, quality, label=method, s=14)
    ax.set_xscale("log")
    ax.set_xlabel("time to choose a config per operator (s; exhaustive: build and measure)")
    ax.set_ylabel("speed relative to exhaustive tuning")
    ax.axhline(1.0, color="grey", lw=0.5)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


MODEL_LEVELS = (0, "construct")


def bench_models(names: list[str], levels, repeat: int, threads: int) -> str:
    """Whole models: each compiled at each tuning level into a fresh cache (compile
    seconds), then timed interleaved with ONNX Runtime (medians of ``repeat``)."""
    import tempfile
    import treadle
    from common import exported
    from treadle.timing import interleaved_medians, onnxruntime_session
    lines = ["| model | " + " | ".join(f"tune={lv} compile s | tune={lv} ms" for lv in levels)
             + " | ORT ms | " + " | ".join(f"ORT / tune={lv}" for lv in levels) + " |",
             "|---|" + "---:|" * (3 * len(levels) + 1)]
    for name in names:
        spec = exported(name, False)
        inputs = spec.random_inputs()
        compiled, compile_s = {}, {}
        for level in levels:
            with tempfile.TemporaryDirectory() as cache, override(cache_dir=cache):
                start = time.perf_counter()
                compiled[level] = treadle.compile(spec.path, tune=level)
                compile_s[level] = time.perf_counter() - start
        session = onnxruntime_session(spec.path, threads)
        runs = {str(lv): (lambda m=compiled[lv]: m(**inputs)) for lv in levels}
        runs["onnxruntime"] = lambda: session.run(None, inputs)
        ms = {k: v * 1e3 for k, v in interleaved_medians(runs, repeat).items()}
        lines.append(f"| {name} | " + " | ".join(
            f"{compile_s[lv]:.1f} | {ms[str(lv)]:.2f}" for lv in levels)
            + f" | {ms['onnxruntime']:.2f} | "
            + " | ".join(f"{ms['onnxruntime'] / ms[str(lv)]:.2f}x" for lv in levels) + " |")
        print(lines[-1], file=sys.stderr, flush=True)
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", nargs="*", help="workload labels (default: all)")
    parser.add_argument("--level", type=int, default=2, choices=(1, 2))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--plot", type=Path)
    parser.add_argument("--fit", action="store_true",
                        help="print the latency model's weights fitted to the measurements")
    parser.add_argument("--load", type=Path, help="a --json file to report (and fit) again")
    parser.add_argument("--models", nargs="*", metavar="MODEL",
                        help="instead of operators, whole zoo models at tune=0 and "
                             "tune='construct' (and --model-levels)")
    parser.add_argument("--model-levels", nargs="*", default=[str(v) for v in MODEL_LEVELS])
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args(argv)
    if args.models is not None:
        levels = [int(v) if v.isdigit() else v for v in args.model_levels]
        with override(num_threads=args.threads):
            print(bench_models(args.models or ["resnet50", "inception_v3", "mobilenet_v2",
                                               "bert", "gpt2"], levels, args.repeat,
                               args.threads))
        print(load_note(args.threads))
        return 0
    chosen = [w for w in WORKLOADS if not args.ops or w.label in args.ops]
    rows = json.loads(args.load.read_text()) if args.load else []
    with override(num_threads=args.threads):
        print(memory_hierarchy().format(), file=sys.stderr)
        for workload in [] if args.load else chosen:
            rows.append(bench_workload(workload, args.level))
            print(f"{workload.label}: {rows[-1]['seconds']}", file=sys.stderr, flush=True)
    if args.json and not args.load:
        args.json.write_text(json.dumps(rows, indent=1))
    if args.fit:
        print(f"fitted weights: {fit(rows)}")
    print(table(rows))
    print(load_note(args.threads))
    if args.plot:
        plot(rows, args.plot)
        print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
