"""The ``treadle`` command.

    treadle run model.onnx [--input name=file.npy ...] [--dim seq=128 ...] [--repeat N]
                           [--target cpu|cuda|cuda:sm_90 [--simulate]]
    treadle check model.onnx [--input name=file.npy ...] [--dim seq=128 ...]
    treadle show model.onnx

``run`` compiles the model, feeds it the given inputs (random ones otherwise: floats from
a standard normal, integers 0 or 1, so that indices stay valid), prints each output's
shape and a summary of its values, and the median latency over ``--repeat`` calls.
``check`` compares the model's outputs with ONNX Runtime's on the same inputs and, when one
differs, names the first node whose output differs (``treadle.check``); it exits 1 then.
``show`` summarises the model without compiling it. Errors print one line and exit 2.
``python -m treadle`` is the same command.
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections import Counter
from typing import Sequence

import numpy as np

from treadle import __version__
from treadle.checker import ATOL, RTOL, TOLERANCES
from treadle.errors import TreadleError
from treadle.specialise import SpecialisingModel
from treadle.runtime.inputs import random_input
from treadle.target.cpu import host
from treadle.target.memory import memory_hierarchy
from treadle.tune.choice import LEVELS

EXIT_ERROR = 2
EXIT_DIFFERS = 1  # `check` found an output that differs from the reference


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        status = args.command(args)
    except (TreadleError, OSError, ValueError) as err:
        message = " ".join(str(err).split()) or type(err).__name__
        print(f"treadle: error: {message}", file=sys.stderr)
        return EXIT_ERROR
    return status or 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="treadle", description="A deep-learning compiler.")
    parser.add_argument("--version", action="version", version=f"treadle {__version__}")
    commands = parser.add_subparsers(required=True, metavar="command")
    run = commands.add_parser("run", help="compile a model and run it")
    run.add_argument("model", help="an ONNX file")
    run.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy",
                     help="an input's value (default: random)")
    run.add_argument("--dim", action="append", default=[], metavar="SYMBOL=SIZE",
                     help="the size of a symbolic dimension of random inputs")
    run.add_argument("--repeat", type=int, default=10, metavar="N",
                     help="timed calls after one warm-up call (default 10)")
    run.add_argument("--tune", default="0", metavar="LEVEL",
                     help="how template schedules are chosen: 0 (default), 1, 2 (measured "
                          "spaces), construct, construct+measure")
    run.add_argument("--dynamic", action="append", default=[], metavar="SYMBOL=LO:HI",
                     help="tune the kernels that depend on a symbolic dimension over the "
                          "sizes LO..HI at once, with a dispatcher choosing per call")
    run.add_argument("--orchestrate", action="store_true",
                     help="choose the kernels by measuring candidates over the model's "
                          "primitives and solving for the cheapest set (Korch)")
    run.add_argument("--target", default="cpu", metavar="TARGET",
                     help="cpu (default), cuda (this machine's GPU) or cuda:<arch> "
                          "(sm_80, sm_89, sm_90)")
    run.add_argument("--simulate", action="store_true",
                     help="with a CUDA target, run the kernels in the GPU simulator on "
                          "the CPU (slow: small models and sizes)")
    run.set_defaults(command=run_command)
    check = commands.add_parser("check", help="compare a model's outputs with ONNX Runtime's "
                                "and find the first node that differs")
    check.add_argument("model", help="an ONNX file")
    check.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy",
                       help="an input's value (default: random)")
    check.add_argument("--dim", action="append", default=[], metavar="SYMBOL=SIZE",
                       help="the size of a symbolic dimension of random inputs (default 1)")
    check.add_argument("--rtol", type=_tolerance, default=None,
                       help=f"error allowed relative to the largest reference value "
                            f"(default by type: {RTOL:g}, float16 "
                            f"{TOLERANCES['float16'][0]:g}, bfloat16 "
                            f"{TOLERANCES['bfloat16'][0]:g})")
    check.add_argument("--atol", type=_tolerance, default=None,
                       help=f"absolute error allowed (default by type: {ATOL:g}, float16 "
                            f"{TOLERANCES['float16'][1]:g}, bfloat16 "
                            f"{TOLERANCES['bfloat16'][1]:g})")
    check.set_defaults(command=check_command)
    show = commands.add_parser("show", help="summarise a model without compiling it")
    show.add_argument("model", help="an ONNX file")
    show.set_defaults(command=show_command)
    info = commands.add_parser("info", help="the CPU target and its memory hierarchy (probed "
                               "once, then cached), and the GPU if there is one")
    info.set_defaults(command=info_command)
    return parser


def _tolerance(text: str) -> float:
    """A tolerance flag's value: argparse names the flag when this refuses one."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value < math.inf:
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite non-negative number")
    return value


def _tune_level(text: str) -> int | str:
    level = int(text) if text.isdigit() else text
    if level not in LEVELS:
        raise ValueError(f"--tune {text}: expected one of {', '.join(map(str, LEVELS))}")
    return level


def info_command(args) -> None:
    target = host()
    print(f"target: {', '.join(target.features) or 'no SIMD extensions'}; "
          f"{target.vector_registers} vector registers; {target.cores} threads")
    print(memory_hierarchy().format())
    from treadle.runtime import cuda
    if not cuda.available():
        print("gpu: none (no CUDA driver or device; CUDA kernels build but do not run here)")
        return
    gpu = cuda.device_target()
    print(f"gpu: {cuda.device_properties()['name']} ({gpu.arch}, {gpu.sms} SMs, "
          f"{gpu.l2_bytes >> 20} MB L2)")


# ---- run -------------------------------------------------------------------------------------

def run_command(args) -> None:
    import treadle
    if args.repeat < 1:
        raise ValueError(f"--repeat {args.repeat}: expected a positive number")
    if args.simulate and not args.target.startswith("cuda"):
        raise ValueError(f"--simulate runs CUDA kernels; the target is {args.target}")
    dynamic = {k: _size_range(k, v) for k, v in _pairs(args.dynamic, "--dynamic").items()}
    model = treadle.compile(args.model, tune=_tune_level(args.tune), dynamic=dynamic or None,
                            orchestrate=args.orchestrate, target=args.target)
    files = _pairs(args.input, "--input")
    if isinstance(model, SpecialisingModel):  # compiled for the contents given
        given = {n: _load(n, files.pop(n)) for n in model.value_inputs if n in files}
        model = model.specialise(given)
    inputs = _inputs(model, files, {k: _size(k, v) for k, v in _pairs(args.dim, "--dim").items()})
    call = model.executable.simulate if args.simulate else model
    outputs = call(**inputs)
    times = []
    for _ in range(args.repeat):
        start = time.perf_counter()
        call(**inputs)
        times.append(time.perf_counter() - start)
    for name, value in zip(model.output_names, outputs):
        print(f"{name}: {value.dtype}{list(value.shape)} {_summary(value)}")
    print(f"median latency: {statistics.median(times) * 1e3:.3f} ms over {args.repeat} calls")


# ---- check -----------------------------------------------------------------------------------

def check_command(args) -> int:
    from treadle.checker import check
    inputs = {name: _load(name, path) for name, path in _pairs(args.input, "--input").items()}
    dims = {k: _size(k, v) for k, v in _pairs(args.dim, "--dim").items()}
    report = check(args.model, inputs, dims=dims, rtol=args.rtol, atol=args.atol)
    print(report)
    return 0 if report.agrees else EXIT_DIFFERS


def _pairs(items: Sequence[str], flag: str) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            raise ValueError(f"{flag} {item!r}: expected NAME=VALUE")
        if pairs.setdefault(key, value) != value:  # which one was meant is anyone's guess
            raise ValueError(f"{flag} {key} is given twice, as {pairs[key]} and {value}")
    return pairs


def _load(name: str, path: str) -> np.ndarray:
    """Input ``name``'s value, read from the .npy file at ``path``."""
    where = f"--input {name}={path}"
    magic = np.lib.format.MAGIC_PREFIX
    try:
        with open(path, "rb") as file:
            npy = file.read(len(magic)) == magic
            file.seek(0)
            value = np.lib.format.read_array(file, allow_pickle=False) if npy else None
    except OSError as err:
        raise ValueError(f"{where}: cannot read the file: {err.strerror or err}") from None
    except (ValueError, EOFError) as err:  # a damaged header, missing data, Python objects
        raise ValueError(f"{where}: not a readable .npy file: {err}") from None
    if value is None:
        raise ValueError(f"{where}: not a .npy file (numpy.save writes one)")
    return value


def _size(symbol: str, text: str) -> int:
    if not text.isdigit():
        raise ValueError(f"--dim {symbol}={text}: expected a non-negative integer size")
    return int(text)


def _size_range(symbol: str, text: str) -> tuple[int, int]:
    lo, sep, hi = text.partition(":")
    if not (sep and lo.isdigit() and hi.isdigit()):
        raise ValueError(f"--dynamic {symbol}={text}: expected LO:HI, two non-negative sizes")
    return int(lo), int(hi)


def _inputs(model, files: dict[str, str], dims: dict[str, int]) -> dict[str, np.ndarray]:
    executable = model.executable
    unknown = set(files) - set(model.input_names)
    if unknown:
        raise ValueError(f"--input names {sorted(unknown)} are not inputs of the model; its "
                         f"inputs are {model.input_names}")
    values = {name: _load(name, path) for name, path in files.items()}
    slots = [executable.slots[i] for i in executable.inputs]
    symbols = sorted({str(d) for s in slots for d in s.shape if not isinstance(d, int)})
    unknown = sorted(set(dims) - set(symbols))
    if unknown:  # a typo would otherwise be ignored in silence
        raise ValueError(f"--dim {', '.join(unknown)}: not a symbolic dimension of the "
                         f"model's inputs ({', '.join(symbols) or 'it has none'})")
    for slot in slots:  # symbols given by input files need no --dim
        if slot.name in values:
            for dim, size in zip(slot.shape, values[slot.name].shape):
                if not isinstance(dim, int) and dims.setdefault(str(dim), size) != size:
                    raise ValueError(f"--dim {dim}={dims[str(dim)]} conflicts with input "
                                     f"{slot.name!r} of shape {list(values[slot.name].shape)}")
    rng = np.random.default_rng(0)
    for slot in slots:
        if slot.name not in values:
            shape = [_concrete(d, slot.name, dims) for d in slot.shape]
            values[slot.name] = random_input(rng, slot.dtype.numpy, shape)
    return values


def _concrete(dim, input_name: str, dims: dict[str, int]) -> int:
    if isinstance(dim, int):
        return dim
    if str(dim) not in dims:
        raise ValueError(f"input {input_name!r} has the symbolic dimension {dim}; give its "
                         f"size with --dim {dim}=N or pass the input with --input")
    return dims[str(dim)]


def _summary(value: np.ndarray) -> str:
    if value.size == 0:
        return "(empty)"
    data = value.astype(np.float64)
    return (f"mean {data.mean():.6g} std {data.std():.6g} min {data.min():.6g} "
            f"max {data.max():.6g}")


# ---- show ------------------------------------------------------------------------------------

def show_command(args) -> None:
    from treadle.frontend import onnx as frontend
    proto = frontend.load_model(args.model)
    graph = proto.graph
    opset = frontend.opset_version(proto)
    print(f"model {args.model}: graph {graph.name!r}, opset {opset}, {len(graph.node)} nodes")
    constants = {t.name for t in graph.initializer}
    print("inputs:")
    for info in graph.input:
        if info.name not in constants:
            print(f"  {_format_info(info)}")
    print("outputs:")
    for info in graph.output:
        print(f"  {_format_info(info)}")
    tensors = [*graph.initializer, *(a.t for n in graph.node if n.op_type == "Constant"
                                     for a in n.attribute if a.name == "value")]
    size = sum(_tensor_bytes(t) for t in tensors)
    print(f"constants: {_plural(len(tensors), 'tensor')}, {_format_bytes(size)}")
    print("ops:")
    for op, count in sorted(Counter(n.op_type for n in graph.node).items(),
                            key=lambda item: (-item[1], item[0])):
        print(f"  {op:<24} {count}")
    unsupported = [f"{op} ({_plural(len(nodes), 'node')})"
                   for op, nodes in sorted(frontend.unsupported_nodes(graph).items())]
    print("unsupported ops: " + (", ".join(unsupported) or "none"))
    if opset not in frontend.OPSETS:
        print(f"unsupported opset: {opset} (treadle reads opsets {frontend.OPSETS.start} to "
              f"{frontend.OPSETS.stop - 1})")


def _format_info(info) -> str:
    from onnx import TensorProto

    from treadle.graph.ops.common import ONNX_DTYPES
    tensor = info.type.tensor_type
    if info.type.WhichOneof("value") != "tensor_type":
        return f"{info.name}: {info.type.WhichOneof('value')}"
    code = tensor.elem_type
    dtype = ONNX_DTYPES[code].name if code in ONNX_DTYPES else TensorProto.DataType.Name(code)
    if not tensor.HasField("shape"):
        return f"{info.name}: {dtype}[unknown rank]"
    dims = [str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?")
            for d in tensor.shape.dim]
    return f"{info.name}: {dtype}[{', '.join(dims)}]"


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def _tensor_bytes(tensor) -> int:
    from onnx.helper import tensor_dtype_to_np_dtype
    try:
        itemsize = tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    except (KeyError, TypeError, ValueError):
        itemsize = 0  # strings and other types of no fixed size
    return math.prod(tensor.dims) * itemsize


def _format_bytes(size: int) -> str:
    for unit in ("B", "KiB", "MiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


if __name__ == "__main__":
    sys.exit(main())
