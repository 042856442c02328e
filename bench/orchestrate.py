"""Kernel orchestration (Korch) against greedy fusion and ONNX Runtime, on sub-graphs and
whole models.

    python bench/orchestrate.py                           # every sub-graph and model
    python bench/orchestrate.py --cases softmax layernorm bert_attention_128
    python bench/orchestrate.py --cases candy --repeat 40 --json bench/out/orchestrate.json

(from the repository root with PYTHONPATH=., or with treadle installed)

Per case, on ``--threads`` threads (2) and a fresh kernel and cost cache:

    orchestrated  treadle.compile(file, orchestrate=True): operators split into
                  primitives, candidate kernels measured, the cheapest set chosen by the
                  binary linear program (treadle.orchestrate)
    greedy        treadle.compile(file): one anchor per kernel, neighbours fused into it
    onnxruntime   the same file, all graph optimizations

Orchestration is timed twice: with an empty cost cache ("cold") and again from the cache
("warm"); the counts (primitives, execution states, candidates, measured ones) and the
solver's time are the cold run's. Latencies are medians of at least ``--repeat``
interleaved calls (``treadle.timing``); a speed-up is the other system's time over the
orchestrated model's.

Sub-graphs are small ``torch.nn`` modules exported to ONNX: a BERT-base attention block
(projections, softmax attention, output projection, residual and LayerNorm) at sequence
128 and 512, softmax and LayerNorm at BERT-base's sizes, Segformer-B0's first-stage
efficient self-attention and Mix-FFN (128x128 tokens of 32 channels), the EfficientViT
block of the model zoo, and Candy's InstanceNorm + ReLU + reflection pad + convolution
chain (128 channels at 56x56). Models are the zoo's Candy, Segformer-B0, BERT-base and
GPT-2 at full size.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import time
import warnings
from pathlib import Path
from typing import Callable

import numpy as np

import treadle
from common import OUT, enter_treadle_settings, exported, relative_error
from treadle.frontend.onnx import from_onnx
from treadle.graph.optimize import optimize
from treadle.orchestrate import orchestrate
from treadle.target.cpu import host
from treadle.timing import interleaved_medians, load_note, onnxruntime_session
from treadle.tune.kernel import KernelMaker

SYSTEMS = ("orchestrated", "greedy", "onnxruntime")
MODELS = ("candy", "segformer_b0", "bert", "gpt2")


def _torch():
    import torch
    return torch


def _bert_attention(seq: int):
    torch = _torch()

    class Attention(torch.nn.Module):
        def __init__(self, hidden=768, heads=12):
            super().__init__()
            self.heads = heads
            self.qkv = torch.nn.Linear(hidden, 3 * hidden)
            self.out = torch.nn.Linear(hidden, hidden)
            self.norm = torch.nn.LayerNorm(hidden)

        def forward(self, x):
            b, s, h = x.shape
            q, k, v = (t.reshape(b, s, self.heads, -1).transpose(1, 2)
                       for t in self.qkv(x).chunk(3, -1))
            scores = q @ k.transpose(-1, -2) / math.sqrt(h // self.heads)
            context = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, s, h)
            return self.norm(x + self.out(context))
    return Attention(), (1, seq, 768)


def _softmax():
    torch = _torch()
    return torch.nn.Softmax(-1), (12, 128, 128)


def _layernorm():
    return _torch().nn.LayerNorm(768), (1, 128, 768)


def _segformer_block(part: str):
    from transformers import SegformerConfig
    from transformers.models.segformer import modeling_segformer as seg
    torch = _torch()
    config = SegformerConfig(attn_implementation="eager")
    size = 128  # the first stage of a 512x512 image: a quarter of its side

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            hidden = config.hidden_sizes[0]
            if part == "attention":
                self.inner = seg.SegformerAttention(
                    config, hidden, config.num_attention_heads[0], config.sr_ratios[0])
            else:
                self.inner = seg.SegformerMixMLP(config, hidden, hidden * config.mlp_ratios[0])

        def forward(self, x):
            out = self.inner(x, size, size)
            return out[0] if isinstance(out, tuple) else out
    return Block(), (1, size * size, config.hidden_sizes[0])


def _efficientvit():
    from treadle.models.dense import efficientvit_block
    return efficientvit_block(), (1, 64, 32, 32)


def _candy_chain():
    torch = _torch()
    nn = torch.nn
    return nn.Sequential(nn.InstanceNorm2d(128, affine=True), nn.ReLU(),
                         nn.ReflectionPad2d(1), nn.Conv2d(128, 128, 3)), (1, 128, 56, 56)


SUBGRAPHS: dict[str, Callable] = {
    "bert_attention_128": lambda: _bert_attention(128),
    "bert_attention_512": lambda: _bert_attention(512),
    "softmax": _softmax,
    "layernorm": _layernorm,
    "segformer_attention": lambda: _segformer_block("attention"),
    "segformer_mixffn": lambda: _segformer_block("mixffn"),
    "efficientvit_block": _efficientvit,
    "candy_chain": _candy_chain,
}


def subgraph_file(name: str) -> tuple[Path, dict[str, np.ndarray]]:
    """The sub-graph's ONNX file (exported once into bench/out) and random inputs."""
    torch = _torch()
    torch.manual_seed(0)
    module, shape = SUBGRAPHS[name]()
    path = OUT / f"orchestrate-{name}.onnx"
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    if not path.exists():
        OUT.mkdir(parents=True, exist_ok=True)
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(module.eval(), (torch.from_numpy(x),), str(path),
                              input_names=["x"], output_names=["y"], dynamo=False,
                              opset_version=17)
    return path, {"x": x}


def case_file(name: str) -> tuple[Path, dict[str, np.ndarray]]:
    if name in SUBGRAPHS:
        return subgraph_file(name)
    spec = exported(name, False)
    return spec.path, spec.random_inputs()


def bench_case(name: str, args) -> dict:
    path, inputs = case_file(name)
    with contextlib.ExitStack() as stack:
        enter_treadle_settings(stack, args.threads, warm_cache=False)
        graph = optimize(from_onnx(path))
        summary = orchestrate(graph, KernelMaker(host())).summary
        start = time.perf_counter()
        orchestrate(graph, KernelMaker(host()))
        warm = time.perf_counter() - start
        systems = {"orchestrated": treadle.compile(path, orchestrate=True),
                   "greedy": treadle.compile(path)}
        session = onnxruntime_session(path, args.threads)
        expected = session.run(None, inputs)[0]
        errors = {k: relative_error(np.asarray(m(**inputs)[0]), expected)
                  for k, m in systems.items()}
        runs = {k: (lambda m=m: m(**inputs)) for k, m in systems.items()}
        runs["onnxruntime"] = lambda: session.run(None, inputs)
        times = interleaved_medians(runs, args.repeat)
    return {"case": name, "ms": {k: v * 1e3 for k, v in times.items()}, "errors": errors,
            "primitives": summary.primitives, "parts": summary.parts,
            "states": summary.states, "candidates": summary.candidates,
            "measured": summary.measured, "solve_s": summary.solving,
            "orchestrate_s": summary.seconds, "warm_s": warm,
            "orchestrated": summary.orchestrated,
            "predicted_gain": (summary.greedy / summary.objective if summary.orchestrated
                               else 1.0)}


def table(results: list[dict]) -> str:
    head = (f"{'case':20s} {'orch ms':>8s} {'greedy':>7s} {'vs ORT':>7s} {'pred':>5s} {'prims':>5s} "
            f"{'states':>6s} {'cands':>5s} {'meas':>5s} {'solve s':>7s} {'cold s':>7s} "
            f"{'warm s':>6s} {'max err':>8s}")
    lines = [head, "-" * len(head)]
    for r in results:
        ms = r["ms"]
        lines.append(
            f"{r['case']:20s} {ms['orchestrated']:8.3f} "
            f"{ms['greedy'] / ms['orchestrated']:6.2f}x {ms['onnxruntime'] / ms['orchestrated']:6.2f}x "
            f"{r['predicted_gain']:5.2f} "
            f"{r['primitives']:5d} {r['states']:6d} {r['candidates']:5d} {r['measured']:5d} "
            f"{r['solve_s']:7.1f} {r['orchestrate_s']:7.1f} {r['warm_s']:6.1f} "
            f"{max(r['errors'].values()):8.1e}")
    if results:
        for other in ("greedy", "onnxruntime"):
            mean = math.exp(np.mean([math.log(r["ms"][other] / r["ms"]["orchestrated"])
                                     for r in results]))
            lines.append(f"geometric mean speed-up over {other}: {mean:.2f}x")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="+", default=[*SUBGRAPHS, *MODELS],
                        choices=[*SUBGRAPHS, *MODELS])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    results = []
    for name in args.cases:
        print(f"{name} ...", file=sys.stderr, flush=True)
        results.append(bench_case(name, args))
        print(table(results[-1:]).splitlines()[-3], file=sys.stderr, flush=True)
    print(table(results))
    print(load_note(args.threads))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
