"""What the benchmarks share: the cached ONNX exports of the zoo, the error measure, the
machine's CPU and the comparison of single ONNX nodes with ONNX Runtime.

An exported model is kept in bench/out/ and redone when treadle/models changes.
"""
from __future__ import annotations

import argparse
import contextlib
import pickle
import platform
import tempfile
from pathlib import Path
from typing import Mapping

import numpy as np

import treadle
from treadle.config import override
from treadle.models import ModelSpec, export_onnx
from treadle.timing import interleaved_medians, load_note, onnxruntime_session

OUT = Path(__file__).resolve().parent / "out"
MODELS_SOURCE = Path(treadle.__file__).resolve().parent / "models"
RELATIVE_TOLERANCE = 1e-3  # of relative_error, for an output to pass
# The x86 instruction sets that decide which float and int8 kernels a runtime can use.
ISA_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_int8",
             "amx_bf16")


def exported(name: str, reduced: bool, dynamic_seq: bool = False, batch: int = 1,
             dynamic_batch: bool = False, attention: str | None = None) -> ModelSpec:
    """The model's ONNX file and spec, from the cache when it is newer than the zoo code."""
    stem = (name + ("-reduced" if reduced else "") + ("-seq" if dynamic_seq else "")
            + ("-batch" if dynamic_batch else "") + (f"-b{batch}" if batch != 1 else "")
            + (f"-{attention}" if attention else ""))
    path, meta = OUT / f"{stem}.onnx", OUT / f"{stem}.spec.pkl"
    newest_source = max(p.stat().st_mtime for p in MODELS_SOURCE.glob("*.py"))
    if path.exists() and meta.exists() and meta.stat().st_mtime > newest_source:
        return pickle.loads(meta.read_bytes())
    spec = export_onnx(name, path, reduced=reduced, batch=batch, dynamic_seq=dynamic_seq,
                       dynamic_batch=dynamic_batch, attention=attention)
    meta.write_bytes(pickle.dumps(spec))
    return spec


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    """Max abs error over the output's max abs value: values near zero (logits, normalized
    activations) make elementwise relative errors meaningless."""
    error = float(np.abs(got.astype(np.float64) - want).max())
    return error / (float(np.abs(want).max()) or 1.0)


def cpu_note() -> str:
    """The CPU's model name and which of ISA_FLAGS it has, from /proc/cpuinfo."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return f"CPU: {platform.processor() or platform.machine()} (no /proc/cpuinfo)"
    fields = dict(line.split(":", 1) for line in lines if ":" in line)
    fields = {key.strip(): value.strip() for key, value in fields.items()}
    flags = set(fields.get("flags", "").split())
    has = [flag for flag in ISA_FLAGS if flag in flags]
    lacks = [flag for flag in ISA_FLAGS if flag not in flags]
    return (f"CPU: {fields.get('model name', platform.machine())}; "
            f"ISA: {' '.join(has) or '-'}; without: {' '.join(lacks) or '-'}")


def enter_treadle_settings(stack: contextlib.ExitStack, threads: int, warm_cache: bool) -> None:
    """treadle on ``threads`` threads, compiling into a fresh kernel and tuning cache (so
    compile times are cold ones) unless ``warm_cache`` keeps the user's."""
    settings: dict = {"num_threads": threads}
    if not warm_cache:
        settings["cache_dir"] = Path(stack.enter_context(
            tempfile.TemporaryDirectory(prefix="treadle-cache-")))
    stack.enter_context(override(**settings))


def compare_nodes(cases: Mapping[str, tuple], description: str, atol: float = 1e-4) -> None:
    """The command line of a benchmark of single ONNX nodes (``cases``: name -> (model,
    feeds)): each compiled by treadle (tune 0) and run by ONNX Runtime in the same
    process, checked to agree, then timed by interleaved calls; a markdown table of
    medians and ratios."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    print(load_note(args.threads))
    print("| case | treadle ms | ONNX Runtime ms | treadle / ONNX Runtime |\n|---|---|---|---|")
    with override(num_threads=args.threads):
        for name, (model, feeds) in cases.items():
            compiled = treadle.compile(model)
            session = onnxruntime_session(model.SerializeToString(), args.threads)
            for got, want in zip(compiled(**feeds), session.run(None, feeds)):
                np.testing.assert_allclose(got, want, rtol=1e-4, atol=atol)
            times = interleaved_medians({"treadle": lambda: compiled(**feeds),
                                         "ort": lambda: session.run(None, feeds)}, args.repeat)
            print(f"| {name} | {times['treadle'] * 1e3:.2f} | {times['ort'] * 1e3:.2f} | "
                  f"{times['treadle'] / times['ort']:.2f} |")
