"""Digests of the kernels treadle generates for the papers' five models, to show that a
change meant to keep generated code as it is does so.

    python bench/kernel_digests.py --out before.json        # on the old revision
    python bench/kernel_digests.py --out after.json --compare before.json

(from the repository root with PYTHONPATH=.) Each model (ResNet-50, Inception-V3,
MobileNetV2, BERT-base, GPT-2 small; ``--reduced`` for the CI-sized ones) is exported to
ONNX and compiled at ``--tune`` (0) with TREADLE_DUMP into a fresh folder and a fresh
kernel cache; the digest is the md5 of every generated source file, in the order of
their names. ``--compare`` lists the models whose digests differ and the files that do.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path

import treadle
from treadle.config import override
from treadle.models import export_onnx

MODELS = ("resnet50", "inception_v3", "mobilenet_v2", "bert", "gpt2")
SOURCES = ("*.c", "*.cu")


def sources(folder: Path) -> dict[str, str]:
    """Every generated source under ``folder``: its path there and its md5."""
    found = sorted(p for pattern in SOURCES for p in folder.rglob(pattern))
    return {str(p.relative_to(folder)): hashlib.md5(p.read_bytes()).hexdigest() for p in found}


def digest(model: str, reduced: bool, tune: int) -> dict[str, str]:
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        path = root / f"{model}.onnx"
        export_onnx(model, path, reduced=reduced)
        with override(dump_dir=str(root / "dump"), cache_dir=str(root / "cache")):
            treadle.compile(str(path), tune=tune)
        return sources(root / "dump")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--reduced", action="store_true")
    parser.add_argument("--tune", type=int, default=0)
    parser.add_argument("--out", required=True)
    parser.add_argument("--compare")
    args = parser.parse_args()
    result = {}
    for model in args.models:
        result[model] = digest(model, args.reduced, args.tune)
        print(model, hashlib.md5(json.dumps(result[model]).encode()).hexdigest(), flush=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    if args.compare:
        sys.exit(compare(json.loads(Path(args.compare).read_text()), result))


def compare(before: dict, after: dict) -> int:
    differing = 0
    for model in after:
        old, new = before.get(model, {}), after[model]
        changes = {"only before": sorted(old.keys() - new.keys()),
                   "only after": sorted(new.keys() - old.keys()),
                   "changed": sorted(k for k in old.keys() & new.keys() if old[k] != new[k])}
        if any(changes.values()):
            differing += 1
            print(f"{model}: " + "; ".join(f"{what}: {', '.join(files[:10])}"
                                         for what, files in changes.items() if files))
    print("same kernels" if not differing else f"{differing} models differ")
    return 1 if differing else 0


if __name__ == "__main__":
    main()
