"""Recurrences an exporter unrolled, against ONNX Runtime: time and compile time by length.

    python bench/unrolled.py --repeat 30 --threads 2
    python bench/unrolled.py --steps 16 --ssm-steps 8 --repeat 3     # a quick look

(from the repository root with PYTHONPATH=., or with treadle installed)

Two models at several lengths: ``h[t+1] = a[t] * h[t] + b[t]`` over 4096 floats with each
step's coefficients gathered from a table and every state concatenated at the end, as an
exporter writes a loop; and a 4-layer Mamba-style state-space model (a selective scan
written as a Python loop over the steps) exported by torch's TorchScript exporter. Were a
step's value recomputed wherever it is read, run and compile time would grow with the
square of the length; the table gives compile seconds per step so that growth shows.
Each model is compiled into a fresh kernel cache (cold compile times; ``--warm-cache``
keeps the user's), checked against ONNX Runtime on the same threads, and timed by medians
of interleaved calls.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import time
import warnings

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

import treadle
from bench.common import RELATIVE_TOLERANCE, cpu_note, enter_treadle_settings, relative_error
from treadle.timing import interleaved_medians, load_note, onnxruntime_session

WIDTH = 4096  # floats of the recurrence's state


def recurrence(steps: int, width: int = WIDTH, stacked: bool = True):
    """``h[t+1] = a[t] * h[t] + b[t]`` as an exporter unrolls it: a Gather of each step's
    coefficients, every state returned, concatenated at the end (through Unsqueeze when
    ``stacked``). Returns the ONNX model and a numpy function of x."""
    rng = np.random.default_rng(steps)
    a = (rng.standard_normal((steps, width)) * 0.5).astype(np.float32)
    b = rng.standard_normal((steps, width)).astype(np.float32)
    nodes, outs, prev = [], [], "x"
    inits = [numpy_helper.from_array(a, "A"), numpy_helper.from_array(b, "B"),
             numpy_helper.from_array(np.array([0], np.int64), "zero")]
    for t in range(steps):
        inits.append(numpy_helper.from_array(np.array(t, np.int64), f"t{t}"))
        nodes += [helper.make_node("Gather", ["A", f"t{t}"], [f"a{t}"], axis=0),
                  helper.make_node("Gather", ["B", f"t{t}"], [f"b{t}"], axis=0),
                  helper.make_node("Mul", [f"a{t}", prev], [f"m{t}"]),
                  helper.make_node("Add", [f"m{t}", f"b{t}"], [f"h{t}"])]
        prev = f"h{t}"
        if stacked:
            nodes.append(helper.make_node("Unsqueeze", [prev, "zero"], [f"u{t}"]))
        outs.append(f"u{t}" if stacked else prev)
    nodes.append(helper.make_node("Concat", outs, ["y"], axis=0))
    shape = [steps, width] if stacked else [steps * width]
    graph = helper.make_graph(nodes, "recurrence",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])

    def reference(x):
        states = []
        for t in range(steps):
            x = a[t] * x + b[t]
            states.append(x)
        return np.stack(states).reshape(shape)
    return model, reference


class SelectiveScan(torch.nn.Module):
    """One Mamba-style layer on (batch, steps, width): an input projection to the scan's
    input x, its step sizes delta and the per-step state maps B and C; the scan
    ``h = exp(delta_t A) h + delta_t B_t x_t``, ``y_t = C_t . h`` written as a Python loop
    (the exporter unrolls it), a skip term D x and an output projection, plus the residual."""

    def __init__(self, width: int, state: int):
        super().__init__()
        self.pieces = [width, width, state, state]
        self.project = torch.nn.Linear(width, sum(self.pieces))
        # Mamba's real diagonal initialisation: A = -(1, 2, ..., state) for every channel.
        self.log_decay = torch.nn.Parameter(
            torch.log(torch.arange(1, state + 1, dtype=torch.float32)).repeat(width, 1))
        self.skip = torch.nn.Parameter(torch.randn(width))
        self.out = torch.nn.Linear(width, width)

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        x, delta, b, c = self.project(u).split(self.pieces, -1)
        delta = torch.nn.functional.softplus(delta)
        decay = -torch.exp(self.log_decay)
        h = torch.zeros(u.shape[0], u.shape[2], decay.shape[1])
        ys = []
        for t in range(u.shape[1]):
            step = delta[:, t, :, None]
            h = torch.exp(step * decay) * h + step * b[:, t, None, :] * x[:, t, :, None]
            ys.append((h * c[:, t, None, :]).sum(-1))
        return u + self.out(torch.stack(ys, 1) + x * self.skip)


def state_space(layers: int = 4, width: int = 16, state: int = 4) -> torch.nn.Module:
    """``layers`` selective scans in sequence, in eval mode; the weights are drawn from
    torch's global generator (seed it first)."""
    return torch.nn.Sequential(*(SelectiveScan(width, state) for _ in range(layers))).eval()


def exported(module: torch.nn.Module, example: torch.Tensor) -> onnx.ModelProto:
    """``module`` on ``example`` through the TorchScript exporter (opset 17), the loop over
    the steps unrolled into the graph."""
    buffer = io.BytesIO()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's tracer and deprecation chatter
        torch.onnx.export(module, (example,), buffer, dynamo=False, opset_version=17,
                          input_names=["u"], output_names=["y"])
    return onnx.load_from_string(buffer.getvalue())


def cases(steps: list[int], ssm_steps: list[int]) -> dict[str, tuple[int, onnx.ModelProto, dict]]:
    """name -> (steps, model, feeds)."""
    rng = np.random.default_rng(0)
    found = {}
    for n in steps:
        feeds = {"x": rng.standard_normal(WIDTH).astype(np.float32)}
        found[f"recurrence {WIDTH} floats, {n} steps"] = (n, recurrence(n)[0], feeds)
    torch.manual_seed(0)
    module = state_space()
    for n in ssm_steps:
        u = torch.randn(1, n, 16)
        found[f"state-space 4 layers, 16 x 4, {n} steps"] = (n, exported(module, u),
                                                            {"u": u.numpy()})
    return found


def measure(model: onnx.ModelProto, feeds: dict, args) -> tuple[float, float, float]:
    """Seconds to compile ``model`` and the median seconds of a call of treadle's and of
    ONNX Runtime's, after checking the two agree."""
    with contextlib.ExitStack() as stack:
        enter_treadle_settings(stack, args.threads, args.warm_cache)
        start = time.perf_counter()
        compiled = treadle.compile(model)
        compile_s = time.perf_counter() - start
        session = onnxruntime_session(model.SerializeToString(), args.threads)
        for got, want in zip(compiled(**feeds), session.run(None, feeds)):
            error = relative_error(got, want)
            if got.shape != want.shape or error > RELATIVE_TOLERANCE:
                raise AssertionError(f"{model.graph.name}: treadle {got.shape}, ONNX Runtime "
                                     f"{want.shape}, relative error {error:.2e}")
        times = interleaved_medians({"treadle": lambda: compiled(**feeds),
                                     "ort": lambda: session.run(None, feeds)}, args.repeat)
    return compile_s, times["treadle"], times["ort"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[16, 64, 256],
                        help="lengths of the synthetic recurrence")
    parser.add_argument("--ssm-steps", type=int, nargs="*", default=[16, 64],
                        help="lengths of the state-space model")
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--warm-cache", action="store_true",
                        help="compile into the user's kernel cache (warm compile times)")
    args = parser.parse_args()
    print(cpu_note())
    print(load_note(args.threads))
    print("| case | compile s | compile ms / step | treadle ms | ONNX Runtime ms "
          "| treadle / ONNX Runtime |\n|---|---|---|---|---|---|")
    for name, (steps, model, feeds) in cases(args.steps, args.ssm_steps).items():
        compile_s, ours, theirs = measure(model, feeds, args)
        print(f"| {name} | {compile_s:.1f} | {compile_s / steps * 1e3:.0f} | {ours * 1e3:.2f} "
              f"| {theirs * 1e3:.2f} | {ours / theirs:.2f} |", flush=True)


if __name__ == "__main__":
    main()
