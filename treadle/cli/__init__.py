"""The ``treadle`` command.

    treadle run model.onnx [--input name=file.npy ...] [--dim seq=128 ...] [--repeat N]
                           [--target cpu|cuda|cuda:sm_90 [--simulate]]
    treadle check model.onnx [--input name=file.npy ...] [--dim seq=128 ...]
    treadle show model.onnx
    treadle bench model.onnx [--input name=file.npy ...] [--dim seq=128 ...] [--repeat N]
                             [--tune LEVEL]
    treadle info
    treadle export model.onnx -o DIR [--dim seq=128 ...] [--tune LEVEL] [--dynamic seq=1:512]
    treadle tune [model.onnx [--level N] [--cluster ADDRESS]] [--import FILE] [--export FILE]

``run`` compiles the model, feeds it the given inputs (random ones otherwise: floats from
a standard normal, integers 0 or 1, so that indices stay valid), prints each output's
shape and a summary of its values, and the median latency over ``--repeat`` calls.
``check`` compares the model's outputs with ONNX Runtime's on the same inputs and, when one
differs, names the first node whose output differs (``treadle.check``); it exits 1 then.
``show`` summarises the model without compiling it. ``bench`` times the model against
ONNX Runtime (``treadle.cli.bench``). ``info`` describes the machine
(``treadle.cli.info``). ``tune`` tunes a model's kernels into the record store, here or
on a Ray cluster, and moves records between machines (``treadle.cli.tune``). Errors print
one line and exit 2; so do usage errors (argparse's).
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

from treadle.version import __version__
from treadle.checker import ATOL, RTOL, TOLERANCES
from treadle.errors import TreadleError
from treadle.specialise import SpecialisingModel
from treadle.runtime.inputs import random_input
from treadle.tune.choice import LEVELS
from treadle.cli.tune import tune

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
    parser = argparse.ArgumentParser(prog="treadle", description="A deep-learning compiler.",
                                     **_examples("treadle show model.onnx",
                                                 "treadle run model.onnx --dim batch=8",
                                                 "treadle bench --help   # each command's "
                                                 "options and examples"))
    parser.add_argument("--version", action="version", version=f"treadle {__version__}")
    commands = parser.add_subparsers(required=True, metavar="command")
    for add in (_run_parser, _check_parser, _show_parser, _info_parser, _bench_parser,
                _export_parser, _tune_parser):
        add(commands)
    return parser


def _model_options(command: argparse.ArgumentParser, inputs: bool = True,
                   dim_help: str = "the size of a symbolic dimension of random inputs") -> None:
    """The model file, its inputs' values (where ``inputs``) and symbolic sizes."""
    command.add_argument("model", help="an ONNX file")
    if inputs:
        command.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy",
                             help="an input's value (default: random)")
    command.add_argument("--dim", action="append", default=[], metavar="SYMBOL=SIZE",
                         help=dim_help)


def _tuning_options(command: argparse.ArgumentParser, help_suffix: str = "as for run") -> None:
    command.add_argument("--tune", default="0", metavar="LEVEL",
                         help=f"how template schedules are chosen, {help_suffix}")


def _dynamic_option(command: argparse.ArgumentParser) -> None:
    command.add_argument("--dynamic", action="append", default=[], metavar="SYMBOL=LO:HI",
                         help="tune the kernels that depend on a symbolic dimension over the "
                              "sizes LO..HI at once, with a dispatcher choosing per call")


def _run_parser(commands) -> None:
    run = commands.add_parser("run", help="compile a model and run it", **_examples(
        "treadle run model.onnx --dim batch=8 --repeat 20",
        "treadle run model.onnx --input x=x.npy --tune construct"))
    _model_options(run)
    run.add_argument("--repeat", type=int, default=10, metavar="N",
                     help="timed calls after one warm-up call (default 10)")
    _tuning_options(run, "0 (default), 1, 2 (measured spaces), construct, construct+measure")
    _dynamic_option(run)
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


def _check_parser(commands) -> None:
    check = commands.add_parser("check", help="compare a model's outputs with ONNX Runtime's "
                                "and find the first node that differs", **_examples(
                                    "treadle check model.onnx --dim batch=2 --rtol 1e-3"))
    _model_options(check, dim_help="the size of a symbolic dimension of random inputs "
                                   "(default 1)")
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


def _show_parser(commands) -> None:
    show = commands.add_parser("show", help="summarise a model without compiling it",
                               **_examples("treadle show model.onnx"))
    show.add_argument("model", help="an ONNX file")
    show.set_defaults(command=show_command)


def _info_parser(commands) -> None:
    info = commands.add_parser("info", help="the CPU, its ISA extensions and memory "
                               "hierarchy (probed once, then cached), the GPU if there is one "
                               "and the size of treadle's cache", **_examples("treadle info"))
    info.set_defaults(command=info_command)


def _bench_parser(commands) -> None:
    bench = commands.add_parser("bench", help="a model's latency, with ONNX Runtime's beside "
                                "it when installed", **_examples(
                                    "treadle bench model.onnx --dim batch=8",
                                    "treadle bench model.onnx --dim batch=1 --tune 1 --repeat 100"))
    _model_options(bench)
    bench.add_argument("--repeat", type=int, default=30, metavar="N",
                       help="timed calls of each system, at least (default 30)")
    _tuning_options(bench)
    bench.set_defaults(command=bench_command)


def _export_parser(commands) -> None:
    export = commands.add_parser("export", help="compile a model into a folder that runs it "
                                 "from C: one shared library, a header, the constants and "
                                 "an example program", **_examples(
                                     "treadle export model.onnx -o model_c",
                                     "treadle export model.onnx -o model_c --dim batch=1 "
                                     "--tune 1"))
    _model_options(export, inputs=False,
                   dim_help="fix a symbolic dimension to a size (the others stay symbolic, "
                            "bound from the input shapes at each run)")
    export.add_argument("-o", "--output", required=True, metavar="DIR",
                        help="the folder to write (missing, empty or an earlier export)")
    _tuning_options(export)
    _dynamic_option(export)
    export.set_defaults(command=export_command)


def _tune_parser(commands) -> None:
    tune = commands.add_parser("tune", help="tune a model's kernels into the record store, "
                               "here or on a Ray cluster; move records between machines",
                               **_examples("treadle tune model.onnx --level 1",
                                           "treadle tune model.onnx --level 1 --cluster "
                                           "ray://head:10001 --export records.jsonl",
                                           "treadle tune --import records.jsonl"))
    tune.add_argument("model", nargs="?", help="an ONNX file (none: only --import/--export)")
    tune.add_argument("--level", default="1", metavar="LEVEL",
                      help="the tuning level: 1 (default), 2, construct+measure")
    tune.add_argument("--cluster", metavar="ADDRESS",
                      help="measure on a Ray cluster: ray://host:port (its head's client "
                           "port) or auto (default: TREADLE_RUNNER, else this machine)")
    tune.add_argument("--import", dest="imported", metavar="FILE",
                      help="first add the records of an export to the store")
    tune.add_argument("--export", metavar="FILE",
                      help="last write every record of the store to FILE (JSON lines)")
    tune.set_defaults(command=tune_command)


def _examples(*lines: str) -> dict:
    """A parser's arguments for a --help that ends with these example command lines, kept
    as written (argparse would otherwise run them together into one paragraph)."""
    return {"epilog": "examples:\n" + "\n".join(f"  {line}" for line in lines),
            "formatter_class": argparse.RawDescriptionHelpFormatter}


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
    from treadle.cli.info import describe
    print(describe())


def export_command(args) -> None:
    from treadle.cli.export import export_model
    dims = {k: _size(k, v) for k, v in _pairs(args.dim, "--dim").items()}
    dynamic = {k: _size_range(k, v) for k, v in _pairs(args.dynamic, "--dynamic").items()}
    print(export_model(args.model, args.output, tune=_tune_level(args.tune), dims=dims,
                       dynamic=dynamic))


def bench_command(args) -> None:
    import treadle
    from treadle.cli.bench import bench
    if args.repeat < 1:
        raise ValueError(f"--repeat {args.repeat}: expected a positive number")
    print(f"compiling {args.model} (--tune {args.tune})", file=sys.stderr, flush=True)
    model = treadle.compile(args.model, tune=_tune_level(args.tune))
    model, inputs, given = _prepared(model, args)
    print(bench(model, inputs, {**given, **inputs}, args.model, args.repeat))


def tune_command(args) -> None:
    tune(args.model, _tune_level(args.level), args.cluster, args.export, args.imported)


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
    model, inputs, _ = _prepared(model, args)
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


def _prepared(model, args) -> tuple[object, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The model to call, specialised for the contents of any shape inputs given
    (``--input``), the inputs to call it with, and those contents, which a run of the
    original ONNX model needs besides the inputs."""
    files = _pairs(args.input, "--input")
    given = {}
    if isinstance(model, SpecialisingModel):  # compiled for the contents given
        given = {n: _load(n, files.pop(n)) for n in model.value_inputs if n in files}
        model = model.specialise(given)
    dims = {k: _size(k, v) for k, v in _pairs(args.dim, "--dim").items()}
    return model, _inputs(model, files, dims), given


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

