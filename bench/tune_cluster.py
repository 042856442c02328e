"""Tuning on a Ray cluster against tuning on this machine: ResNet-50 at level 1 tuned with
the local runner, then with a Ray cluster of two single-core worker nodes started on this
machine (on the loopback); the wall time of each and the config each chose per kernel,
side by side.

    python bench/tune_cluster.py             # ResNet-50 (exported once into bench/out/)
    python bench/tune_cluster.py --reduced   # the CI-sized ResNet-50
    python bench/tune_cluster.py --quick     # two small products: checks the script

(from the repository root with PYTHONPATH=., Ray installed: ``pip install treadle[cluster]``)

Each run tunes into a fresh kernel cache and a record store of its own, on one thread per
trial; the cluster's head runs no trials (0 CPUs), each worker node one at a time. On a
two-core machine expect no speed-up (the caller's builds and both workers share the two
cores): the point is that the cluster runs and that its choices agree. Both runners time
real kernels, so a kernel whose best configs are within noise of each other may go either
way; the table gives each runner's best time beside its choice, and the count of kernels
that agree. For a real multi-node cluster see docs/tuning.md.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

import treadle
from common import cpu_note, exported
from treadle.config import override
from treadle.tune.records import record_store

LOOPBACK = "127.0.0.2"  # Ray swaps 127.0.0.1 for the machine's own address, not this one


def quick_model(path: Path) -> Path:
    """relu(x @ w1) @ w2 at 131 x 512 x 384 x 97: two products, nine candidates."""
    rng = np.random.default_rng(0)
    weights = {"w1": rng.standard_normal((512, 384)).astype(np.float32),
               "w2": rng.standard_normal((384, 97)).astype(np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2")]
    graph = helper.make_graph(
        nodes, "two_products",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [131, 512])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [131, 97])],
        [numpy_helper.from_array(v, k) for k, v in weights.items()])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def tuned(path: Path, level: int, runner: str, folder: Path) -> tuple[float, dict]:
    """Wall seconds of a cold tuning compile on ``runner``, and the records it wrote."""
    with override(cache_dir=folder / "cache", records=folder / "records", num_threads=1,
                  runner=runner):
        start = time.perf_counter()
        treadle.compile(path, tune=level)
        seconds = time.perf_counter() - start
        store = record_store()
        return seconds, {key: json.loads(store.read(key)) for key in store.keys()}


@contextlib.contextmanager
def two_worker_cluster(workers: int):
    """A Ray cluster on this machine: a head of no CPUs and ``workers`` nodes of one."""
    import ray
    from ray.cluster_utils import Cluster
    node = {"node_ip_address": LOOPBACK, "include_dashboard": False}
    cluster = Cluster(initialize_head=True, head_node_args={**node, "num_cpus": 0})
    for _ in range(workers):
        cluster.add_node(**node, num_cpus=1)
    ray.init(address=cluster.address, log_to_driver=False, logging_level=logging.WARNING)
    try:
        yield
    finally:
        ray.shutdown()
        cluster.shutdown()


def kernel_table(local: dict, remote: dict) -> tuple[str, int]:
    """Markdown rows, one per kernel, and the count whose choices agree."""
    rows = ["| kernel | local config | local best ms | cluster config | cluster best ms | "
            "agree |", "|---|---|---|---|---|---|"]
    agree = 0
    for key in sorted(set(local) | set(remote)):
        mine, theirs = local.get(key), remote.get(key)
        same = mine is not None and theirs is not None and mine["config"] == theirs["config"]
        agree += same
        name = (mine or theirs)["workload"].splitlines()[0].removeprefix("inputs: ")
        rows.append(f"| {name} | {_config(mine)} | {_best(mine)} | {_config(theirs)} | "
                    f"{_best(theirs)} | {'yes' if same else 'no'} |")
    return "\n".join(rows), agree


def _config(record: dict | None) -> str:
    if record is None:
        return "(no record)"
    return " ".join(f"{k}={v}" for k, v in record["config"].items())


def _best(record: dict | None) -> str:
    times = [t for _, t in (record or {}).get("timings", []) if t is not None]
    return f"{min(times) * 1e3:.3f}" if times else "-"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reduced", action="store_true", help="the CI-sized ResNet-50")
    parser.add_argument("--quick", action="store_true",
                        help="two small products instead of ResNet-50")
    parser.add_argument("--level", type=int, default=1, choices=(1, 2))
    parser.add_argument("--workers", type=int, default=2, help="single-core worker nodes")
    args = parser.parse_args(argv)
    print(cpu_note())
    with tempfile.TemporaryDirectory(prefix="treadle-tune-cluster-") as tmp:
        folder = Path(tmp)
        path = quick_model(folder / "two_products.onnx") if args.quick else \
            exported("resnet50", args.reduced).path
        local_s, local = tuned(path, args.level, "local", folder / "local")
        with two_worker_cluster(args.workers):
            remote_s, remote = tuned(path, args.level, "ray", folder / "ray")
    table, agree = kernel_table(local, remote)
    print(f"model: {path.name}, level {args.level}, one thread per trial")
    print(f"wall time: local {local_s:.1f} s, Ray cluster of {args.workers} single-core "
          f"workers {remote_s:.1f} s")
    print(table)
    print(f"configs agree on {agree} of {len(set(local) | set(remote))} kernels")
    return 0


if __name__ == "__main__":
    sys.exit(main())
