"""What running from C costs: an exported model's library (``treadle export``) against the
same model saved and loaded in Python (``treadle.load``), on the same inputs.

    python bench/export.py                          # ResNet-50, BERT-base at seq 128
    python bench/export.py --models bert --repeat 50 --json bench/out/export.json
    python bench/export.py --reduced --repeat 3     # the CI-sized models: a smoke check

(from the repository root with PYTHONPATH=., or with treadle installed)

Both run the same kernels on ``--threads`` threads (the library reads
TREADLE_NUM_THREADS, set here). The library is called through its C API with ctypes
(``treadle.deploy.loaded``), whose call costs a few microseconds that a C program would
not pay. BERT is exported with a symbolic sequence length and run at one. Latencies are
medians of at least ``--repeat`` interleaved calls (``treadle.timing``); the ratio is
the library's time over the Python model's, and the error the largest difference of the
first output over its largest magnitude.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
from pathlib import Path

import treadle
from common import enter_treadle_settings, exported, relative_error
from treadle.deploy.loaded import ExportedModel
from treadle.timing import interleaved_medians, load_note

SEQUENCE = {False: 128, True: 16}  # BERT's sequence length, full and reduced


def bench_model(name: str, args, work: Path) -> dict:
    transformer = name == "bert"
    spec = exported(name, args.reduced, dynamic_seq=transformer)
    inputs = spec.random_inputs(**({"seq": SEQUENCE[args.reduced]} if transformer else {}))
    compiled = treadle.compile(spec.path)
    compiled.save(work / name)
    loaded = treadle.load(work / name)
    library = ExportedModel(compiled.export(work / f"{name}-c"))
    arrays = list(inputs.values())
    error = relative_error(library(*arrays)[0], loaded(**inputs)[0])
    seconds = interleaved_medians({"python": lambda: loaded(**inputs),
                                   "c": lambda: library(*arrays)}, args.repeat)
    ms = {k: v * 1e3 for k, v in seconds.items()}
    print(f"{name}: python {ms['python']:.3f} ms, C library {ms['c']:.3f} ms "
          f"({ms['c'] / ms['python']:.3f}x, error {error:.1e})", file=sys.stderr, flush=True)
    return {"name": name, "shapes": {k: list(v.shape) for k, v in inputs.items()},
            "ms": ms, "error": error}


def table(results: list[dict]) -> str:
    lines = ["| model | inputs | Python (treadle.load) ms | C library ms | C / Python | error |",
             "|---|---|---|---|---|---|"]
    for r in results:
        shapes = ", ".join(f"{k} {v}" for k, v in r["shapes"].items())
        lines.append(f"| {r['name']} | {shapes} | {r['ms']['python']:.3f} | "
                     f"{r['ms']['c']:.3f} | {r['ms']['c'] / r['ms']['python']:.3f} | "
                     f"{r['error']:.1e} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["resnet50", "bert"],
                        choices=["resnet50", "bert"])
    parser.add_argument("--reduced", action="store_true", help="the CI-sized models")
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    os.environ["TREADLE_NUM_THREADS"] = str(args.threads)  # read by the library's create
    print(load_note(args.threads), file=sys.stderr)
    with contextlib.ExitStack() as stack:
        enter_treadle_settings(stack, args.threads, warm_cache=True)
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="export-")))
        results = [bench_model(name, args, work) for name in args.models]
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
