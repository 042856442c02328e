"""The wheel: pure Python, holding every file of the package, and, installed into a fresh
virtual environment with ONNX Runtime and nothing of this checkout, it runs the README's
ONNX example and answers ``--version`` as ``treadle`` and as ``python -m treadle``.

Both pip runs (the build's isolated environment and the installation) take packages from
wherever this machine's pip configuration points, so where that is a local index or a
directory of wheels the test needs no network.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import onnx
import pytest
from onnx import helper

import treadle

from tests.frontend.onnx_models import make_model, tensor
from tests.test_readme import README, snippets

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "README.md", "treadle")  # what pyproject.toml builds from
BUILT = shutil.ignore_patterns("__pycache__", "*.so")  # artifacts, ignored by git too
TIMEOUT_S = 600  # per command: pip may wait on an index that does not answer


def _run(argv: list, cwd: Path, **variables: str) -> str:
    # Without PYTHONPATH, and away from the checkout, only the installed package imports.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | variables
    result = subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True,
                            text=True, timeout=TIMEOUT_S)
    assert result.returncode == 0, f"{argv}:\n{result.stdout}\n{result.stderr}"
    return result.stdout


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """A copy of the sources: setuptools writes build/ into the tree it builds, and a
    build/ left there from before keeps modules deleted since, which then enter the wheel."""
    copy = tmp_path_factory.mktemp("source")
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, copy / name, ignore=BUILT)
        else:
            shutil.copy(ROOT / name, copy / name)
    return copy


@pytest.fixture(scope="module")
def wheel(source, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", out,
          source], cwd=out)
    (built,) = out.glob("treadle-*.whl")
    return built


@pytest.fixture(scope="module")
def environment(wheel, tmp_path_factory) -> Path:
    """A fresh virtual environment with the wheel, its dependencies and ONNX Runtime."""
    venv = tmp_path_factory.mktemp("venv")
    _run([sys.executable, "-m", "venv", venv], cwd=venv)
    _run([venv / "bin" / "python", "-m", "pip", "install", "--quiet", wheel, "onnxruntime"],
         cwd=venv)
    return venv


def test_the_wheel_is_pure_python_and_holds_every_file_of_the_package(source, wheel):
    assert wheel.name == f"treadle-{treadle.__version__}-py3-none-any.whl"
    packaged = {name for name in zipfile.ZipFile(wheel).namelist()
                if name.startswith("treadle/")}
    files = {path.relative_to(source).as_posix() for path in (source / "treadle").rglob("*")
             if path.is_file()}
    assert files - packaged == set(), "files of the package missing from the wheel (give " \
                                      "their patterns as package data in pyproject.toml)"
    assert packaged == files


def test_the_installed_command_answers_its_version(environment, tmp_path):
    expected = f"treadle {treadle.__version__}"
    assert _run([environment / "bin" / "treadle", "--version"], tmp_path).strip() == expected
    assert _run([environment / "bin" / "python", "-m", "treadle", "--version"],
                tmp_path).strip() == expected


def test_the_installed_package_runs_the_readme_onnx_example(environment, tmp_path):
    (code,) = [c for c in snippets(README) if 'treadle.compile("model.onnx")' in c]
    model = make_model([helper.make_node("Relu", ["x"], ["y"], name="relu")],
                       [tensor("x", ["batch", 3, 224, 224])],
                       [tensor("y", ["batch", 3, 224, 224])])
    onnx.save(model, tmp_path / "model.onnx")
    # The example, then which treadle ran it: the environment's, not this checkout's.
    (tmp_path / "example.py").write_text(f"{code}\nprint(treadle.__file__)\n")
    out = _run([environment / "bin" / "python", "example.py"], tmp_path,
               TREADLE_CACHE_DIR=str(tmp_path / "cache"))  # compiles as a new user would
    assert Path(out.splitlines()[-1]).is_relative_to(environment), out
    assert (tmp_path / "model.treadle").is_dir()
