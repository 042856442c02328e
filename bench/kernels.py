"""Kernel by kernel: where treadle loses time against ONNX Runtime on one model.

    python bench/kernels.py resnext50 --repeat 20
    python bench/kernels.py mixnet_s --reduced --repeat 5
    python bench/kernels.py model.onnx --dim batch=1 --threads 2 --top 20
    python bench/kernels.py regnet_y_800mf --grouped --repeat 30

(from the repository root with PYTHONPATH=., or with treadle installed)

The model is a zoo name (exported at batch 1 and cached in bench/out/, as bench/common.py
does) or an ONNX file (random float inputs, zero integer ones; ``--dim`` sizes its symbolic
dimensions). treadle compiles it at ``--tune`` into a fresh kernel cache (``--warm-cache``
uses the user's), ONNX Runtime runs it with all graph optimizations, both on ``--threads``
threads. After a warm-up each runs ``--repeat`` times: treadle's kernels timed one by one
by ``executable.profile()``, ONNX Runtime's nodes by its profiler.

Both fuse nodes into kernels, and differently, so time is compared over groups of the ONNX
file's nodes. A treadle kernel covers the operators of its plan (``graph/partition.txt``
under ``TREADLE_DUMP``), each from the node it is named after (a pass names what it adds
``<node>/<what>``: ``/to_nhwc``, ``/pad``). An ONNX Runtime node covers the nodes between its
inputs and its outputs in the model it optimized; its NCHWc nodes write renamed tensors and
are named after the tensor they compute (``<tensor>_nchwc``) or the node they replace, and
a node that only changes layout (ReorderInput, ReorderOutput) counts with the node whose
output it converts. Nodes that share a kernel on either side form one group (where the two
fuse differently, a group can span a whole block); a group's time is the sum of its
kernels' in a run, median over runs. The ``--top`` groups where treadle's time exceeds ONNX
Runtime's the most are printed with both times. treadle's kernel times include a Python
call each (microseconds) that its ordinary runs do not pay.

``--grouped`` prints a row per grouped convolution (1 < group < input channels) instead:
treadle's kernel named after the node and ONNX Runtime's nodes that cover it, with their
fused neighbours (activations), median time per run, and how many other nodes each takes
in: a row compares like with like where those counts agree.
"""
from __future__ import annotations

import argparse
import bisect
import contextlib
import json
import os
import re
import statistics
import sys
import tempfile
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

import treadle
from common import enter_treadle_settings, exported
from treadle.config import override
from treadle.frontend.onnx import node_name
from treadle.models import MODELS, InputSpec
from treadle.timing import load_note, onnxruntime_session

WARMUP = 2  # untimed runs per system
LAYOUT_OPS = ("ReorderInput", "ReorderOutput")  # ONNX Runtime's NCHWc layout changes
ANCHOR = re.compile(r"^\d+: \w+\[(.*?)\]\(")  # a plan's line in partition.txt
FUSED = re.compile(r"^\s+(?:prologues|epilogues): (.*)$")


@dataclass(frozen=True)
class Node:
    """A node of the model file, named as treadle's importer names it."""
    name: str
    op_type: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


def model_nodes(model: onnx.ModelProto) -> list[Node]:
    """The nodes that depend on a graph input, in file order: the others are constants,
    which both systems fold."""
    graph = model.graph
    live = {i.name for i in graph.input} - {t.name for t in graph.initializer}
    nodes = []
    for index, proto in enumerate(graph.node):
        if live.intersection(proto.input):
            nodes.append(Node(node_name(proto, index), proto.op_type, tuple(proto.input),
                              tuple(proto.output)))
            live.update(proto.output)
    return nodes


# ---- what each kernel covers ---------------------------------------------------------------

def node_of(name: str, nodes: set[str]) -> str | None:
    """The node an operator or ONNX Runtime node comes from: the one named ``name``, or the
    longest whose name and a slash begin ``name``."""
    while name:
        if name in nodes:
            return name
        name = name.rpartition("/")[0]
    return None


def plan_ops(partition: str) -> dict[str, list[str]]:
    """Each plan's operators by its anchor's name (a step's name), from partition.txt."""
    plans: dict[str, list[str]] = defaultdict(list)
    anchor = None
    for line in partition.splitlines():
        if match := ANCHOR.match(line):
            anchor = match[1]
            plans[anchor].append(anchor)
        elif (match := FUSED.match(line)) and anchor is not None:
            plans[anchor] += match[1].split(", ")
    return plans


def treadle_cover(partition: str, nodes: list[Node]) -> dict[str, set[str]]:
    names = {n.name for n in nodes}
    return {step: {node for op in ops if (node := node_of(op, names))}
            for step, ops in plan_ops(partition).items()}


class _Tensors:
    """The model's tensor that each tensor of ONNX Runtime's optimized graph stands for."""

    def __init__(self, nodes: list[Node], optimized: onnx.GraphProto):
        self.producer = {t: n for n in nodes for t in n.outputs}
        self.by_name = {n.name: n for n in nodes}
        # A ReorderOutput gives the tensor its input holds the model's name back.
        self.renamed = {n.input[0]: n.output[0] for n in optimized.node
                        if n.op_type == "ReorderOutput" and n.output[0] in self.producer}
        self.made: dict[str, str] = {}  # by renamed tensor, in graph order
        for node in optimized.node:
            ends = [self.of(node.input[0])] if node.op_type in LAYOUT_OPS else self.ends(node)
            for k, tensor in enumerate(node.output):
                if ends and (stands := ends[min(k, len(ends) - 1)]) is not None:
                    self.made[tensor] = stands

    def of(self, tensor: str) -> str | None:
        return tensor if tensor in self.producer else self.made.get(tensor)

    def ends(self, node: onnx.NodeProto) -> list[str]:
        """The model's tensors an optimized node computes: its outputs where they keep
        their names (or get them back), else the tensor or node its own name begins with."""
        kept = [t for t in (self.renamed.get(t, t) for t in node.output) if t in self.producer]
        if kept:
            return kept
        for cut in range(len(node.name), 0, -1):
            prefix = node.name[:cut]
            if prefix in self.producer:
                return [prefix]
            if prefix in self.by_name:
                return list(self.by_name[prefix].outputs)
        return []


def ort_cover(nodes: list[Node], optimized: onnx.GraphProto) -> dict[str, set[str]]:
    """Each optimized node's model nodes: those met walking back from the tensors it
    computes, up to its inputs and whatever another optimized node computes."""
    tensors = _Tensors(nodes, optimized)
    computed = set(tensors.made.values()) | {t for n in optimized.node for t in n.output
                                             if t in tensors.producer}
    cover = {}
    for node in optimized.node:
        stops = {tensors.of(t) for t in node.input} | computed
        if node.op_type in LAYOUT_OPS:
            converted = tensors.of(node.input[0])
            cover[node.name] = {tensors.producer[converted].name} if converted else set()
            continue
        found: set[str] = set()
        pending = tensors.ends(node)
        while pending:
            source = tensors.producer.get(pending.pop())
            if source is not None and source.name not in found:
                found.add(source.name)
                pending += [t for t in source.inputs if t not in stops]
        cover[node.name] = found
    return cover


# ---- groups of nodes -----------------------------------------------------------------------

class Groups:
    """Nodes (or a kernel's own name, where it covers none) joined when a kernel covers
    several of them."""

    def __init__(self):
        self.parent: dict[str, str] = {}

    def find(self, key: str) -> str:
        path = [key]
        while (up := self.parent.setdefault(path[-1], path[-1])) != path[-1]:
            path.append(up)
        for k in path:  # the next find of any of them takes one step
            self.parent[k] = path[-1]
        return path[-1]

    def join(self, keys: list[str]) -> None:
        roots = [self.find(k) for k in keys]
        for root in roots[1:]:
            self.parent[root] = roots[0]


def kernel_keys(cover: dict[str, set[str]], tag: str) -> dict[str, list[str]]:
    """The keys each kernel joins: its nodes, or its name under ``tag`` when it has none."""
    return {kernel: sorted(nodes) or [f"{tag}:{kernel}"] for kernel, nodes in cover.items()}


def group_times(runs: list[dict[str, float]], keys: dict[str, list[str]],
                groups: Groups) -> dict[str, float]:
    """Seconds per group: the sum of its kernels' per run, median over runs."""
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0] * len(runs))
    for r, run in enumerate(runs):
        for kernel, seconds in run.items():
            totals[groups.find(keys.get(kernel, [kernel])[0])][r] += seconds
    return {group: statistics.median(t) for group, t in totals.items()}


# ---- the two systems' runs -----------------------------------------------------------------

def treadle_runs(path: Path, inputs: dict, tune: int, repeat: int
                 ) -> tuple[list[dict[str, float]], str]:
    """Per run, seconds by step name, and the kernel plan (partition.txt)."""
    with tempfile.TemporaryDirectory(prefix="treadle-dump-") as dump:
        with override(dump_dir=Path(dump)):
            executable = treadle.compile(path, tune=tune).executable
        partition = next(Path(dump).glob("*/graph/partition.txt")).read_text()
    for _ in range(WARMUP):
        executable(**inputs)
    runs = []
    for _ in range(repeat):
        run: dict[str, float] = defaultdict(float)
        for step, seconds in executable.profile(**inputs):
            run[step] += seconds
        runs.append(run)
    return runs, partition


def ort_runs(path: Path, inputs: dict, threads: int, repeat: int
             ) -> tuple[list[dict[str, float]], onnx.GraphProto]:
    """Per run, seconds by optimized node name, and the optimized graph."""
    with tempfile.TemporaryDirectory(prefix="ort-profile-") as folder:
        optimized = Path(folder) / "optimized.onnx"
        session = onnxruntime_session(
            path, threads, enable_profiling=True, profile_file_prefix=f"{folder}/ort",
            optimized_model_filepath=str(optimized), log_severity_level=3)
        for _ in range(WARMUP + repeat):
            session.run(None, inputs)
        trace = json.loads(Path(session.end_profiling()).read_text())
        graph = onnx.load(str(optimized)).graph
    return _runs_of_trace(trace, WARMUP), graph


def _runs_of_trace(trace: list[dict], skip: int) -> list[dict[str, float]]:
    """Node times of each ``model_run`` of a profiler trace after the first ``skip``."""
    windows = sorted(e["ts"] for e in trace if e["name"] == "model_run")
    runs: list[dict[str, float]] = [defaultdict(float) for _ in windows]
    suffix = "_kernel_time"
    for event in trace:
        if event.get("cat") == "Node" and event["name"].endswith(suffix):
            run = bisect.bisect_right(windows, event["ts"]) - 1
            runs[run][event["name"][:-len(suffix)]] += event["dur"] * 1e-6
    return runs[skip:]


# ---- the report ----------------------------------------------------------------------------

@dataclass
class Row:
    label: str
    treadle_s: float
    ort_s: float

    @property
    def lost_s(self) -> float:
        return self.treadle_s - self.ort_s


def compare(nodes: list[Node], treadle: tuple[list, str], ort: tuple[list, onnx.GraphProto]
            ) -> list[Row]:
    """A row per group of nodes, the groups where treadle loses most first."""
    ours = kernel_keys(treadle_cover(treadle[1], nodes), "treadle")
    theirs = kernel_keys(ort_cover(nodes, ort[1]), "ORT")
    groups = Groups()
    for keys in [*ours.values(), *theirs.values()]:
        groups.join(keys)
    ours_s, theirs_s = group_times(treadle[0], ours, groups), group_times(ort[0], theirs, groups)
    members: dict[str, list[Node]] = defaultdict(list)
    for node in nodes:
        members[groups.find(node.name)].append(node)
    rows = [Row(_label(root, members[root]), ours_s.get(root, 0.0), theirs_s.get(root, 0.0))
            for root in ours_s.keys() | theirs_s.keys()]
    return sorted(rows, key=lambda r: r.lost_s, reverse=True)


def node_times(node: str, runs: list[dict[str, float]], cover: dict[str, set[str]],
               anchored: bool) -> tuple[float, set[str]]:
    """Median seconds per run of the kernels that cover ``node`` (``anchored``: of those
    named after it, not of those that merely take in a part of it, as a previous kernel
    does the node's padding), and the nodes they cover."""
    kernels = [k for k, nodes in cover.items()
               if (node_of(k, {node}) == node if anchored else node in nodes)]
    covered = set().union(*(cover[k] for k in kernels))
    return statistics.median(sum(run.get(k, 0.0) for k in kernels) for run in runs), covered


def grouped_convolutions(model: onnx.ModelProto, nodes: list[Node]) -> list[Node]:
    """The model's convolutions of 1 < group < input channels."""
    weights = {t.name: t.dims for t in model.graph.initializer}
    grouped = []
    by_name = {n.name: n for n in nodes}
    for index, proto in enumerate(model.graph.node):
        node = by_name.get(node_name(proto, index))
        group = next((a.i for a in proto.attribute if a.name == "group"), 1)
        if node and proto.op_type == "Conv" and proto.input[1] in weights and group > 1 \
                and weights[proto.input[1]][1] > 1:  # more than one input channel per group
            grouped.append(node)
    return grouped


def print_layers(layers: list[Node], treadle: tuple[list, str],
                 ort: tuple[list, onnx.GraphProto], nodes: list[Node]) -> None:
    ours_cover = treadle_cover(treadle[1], nodes)
    theirs_cover = ort_cover(nodes, ort[1])
    header = f"{'treadle ms':>10} {'ORT ms':>8} {'ORT/treadle':>11}  node (other nodes covered)"
    print(header)
    print("-" * len(header))
    ratios = []
    for layer in layers:
        ours_s, ours_nodes = node_times(layer.name, treadle[0], ours_cover, True)
        theirs_s, theirs_nodes = node_times(layer.name, ort[0], theirs_cover, False)
        if not (ours_s and theirs_s):  # fused into another node's kernel on one side
            print(f"{ours_s * 1e3:>10.3f} {theirs_s * 1e3:>8.3f} {'-':>11}  {layer.name}")
            continue
        ratios.append(theirs_s / ours_s)
        extra = f"treadle +{len(ours_nodes) - 1}, ORT +{len(theirs_nodes) - 1}"
        print(f"{ours_s * 1e3:>10.3f} {theirs_s * 1e3:>8.3f} {ratios[-1]:>10.2f}x  "
              f"{layer.name} ({extra})")
    if ratios:
        print(f"lowest {min(ratios):.2f}x, geometric mean "
              f"{statistics.geometric_mean(ratios):.2f}x over {len(ratios)} grouped convolutions")


def _label(root: str, members: list[Node]) -> str:
    if not members:  # a kernel that covers none of the file's nodes
        return root
    ops = "+".join(dict.fromkeys(n.op_type for n in members))
    more = f" (+{len(members) - 1} more)" if len(members) > 1 else ""
    return f"{ops}: {members[0].name}{more}"


def print_report(rows: list[Row], top: int) -> None:
    ours, theirs = sum(r.treadle_s for r in rows), sum(r.ort_s for r in rows)
    print(f"kernel time: treadle {ours * 1e3:.3f} ms, ONNX Runtime {theirs * 1e3:.3f} ms, "
          f"over {len(rows)} groups of nodes; the {top} where treadle loses most:")
    header = f"{'treadle ms':>10} {'ORT ms':>8} {'lost ms':>8}  nodes"
    print(header)
    print("-" * len(header))
    for r in rows[:top]:
        print(f"{r.treadle_s * 1e3:>10.3f} {r.ort_s * 1e3:>8.3f} {r.lost_s * 1e3:>8.3f}  "
              f"{r.label}")


# ---- main ----------------------------------------------------------------------------------

def model_inputs(args) -> tuple[Path, dict[str, np.ndarray]]:
    """The model's file and random inputs: a zoo model's own, or drawn for a file's."""
    if args.model in MODELS:
        spec = exported(args.model, args.reduced)
        return spec.path, spec.random_inputs()
    path = Path(args.model)
    graph = onnx.load(str(path), load_external_data=False).graph
    constants = {t.name for t in graph.initializer}
    specs = [InputSpec(i.name, tuple(d.dim_param or d.dim_value
                                     for d in i.type.tensor_type.shape.dim),
                       onnx.helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type).name)
             for i in graph.input if i.name not in constants]
    gen = np.random.default_rng(0)
    return path, {s.name: s.random(gen, args.dim) for s in specs}


def _dim(text: str) -> tuple[str, int]:
    name, _, size = text.partition("=")
    return name, int(size)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help=f"a zoo model ({', '.join(MODELS)}) or an ONNX file")
    parser.add_argument("--reduced", action="store_true", help="the zoo's CI-sized model")
    parser.add_argument("--repeat", type=int, default=20, help="profiled runs per system")
    parser.add_argument("--threads", type=int, default=2, help="threads of both systems")
    parser.add_argument("--tune", type=int, default=0, choices=(0, 1, 2),
                        help="treadle's tuning level")
    parser.add_argument("--top", type=int, default=10, help="groups printed")
    parser.add_argument("--dim", type=_dim, action="append", default=[],
                        metavar="NAME=SIZE", help="the size of a symbolic dimension")
    parser.add_argument("--grouped", action="store_true",
                        help="a row per grouped convolution instead of the top groups")
    parser.add_argument("--warm-cache", action="store_true",
                        help="compile into the user's kernel cache instead of a fresh one")
    args = parser.parse_args(argv)
    args.dim = dict(args.dim)

    print(load_note(len(os.sched_getaffinity(0))), file=sys.stderr)
    try:
        path, inputs = model_inputs(args)
    except ValueError as error:  # a symbolic dimension that --dim does not size
        parser.error(str(error))
    model = onnx.load(str(path))
    nodes = model_nodes(model)
    with contextlib.ExitStack() as stack:
        enter_treadle_settings(stack, args.threads, args.warm_cache)
        ours = treadle_runs(path, inputs, args.tune, args.repeat)
    theirs = ort_runs(path, inputs, args.threads, args.repeat)
    if args.grouped:
        print_layers(grouped_convolutions(model, nodes), ours, theirs, nodes)
    else:
        print_report(compare(nodes, ours, theirs), args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
