"""The treadle command: run, check, show, bench and info, --help with examples, and errors
as one line (usage errors after the usage) with exit status 2."""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

import treadle

from tests.frontend.onnx_models import affine_model, make_model, tensor
from treadle.cli import _parser, main

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def affine(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cli") / "affine.onnx"
    onnx.save(affine_model(), path)
    return path


@pytest.fixture(scope="module")
def unsupported(tmp_path_factory) -> Path:
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu"),
             helper.make_node("Wobble", ["a"], ["b"], name="wobble_1"),
             helper.make_node("Wobble", ["b"], ["y"], name="wobble_2")]
    path = tmp_path_factory.mktemp("cli") / "wobble.onnx"
    onnx.save(make_model(nodes, [tensor("x", [3])], [tensor("y", [3])]), path)
    return path


def test_run_with_random_inputs_prints_outputs_and_latency(affine, capsys):
    assert main(["run", str(affine), "--dim", "batch=6", "--repeat", "3"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^y: float32\[6, 5\] mean \S+ std \S+ min \S+ max \S+$", out, re.M)
    assert re.search(r"^median latency: \d+\.\d+ ms over 3 calls$", out, re.M)


def test_run_with_an_input_file_needs_no_dim(affine, tmp_path, capsys):
    x = np.zeros((2, 5), np.float32)
    np.save(tmp_path / "x.npy", x)
    assert main(["run", str(affine), "--input", f"x={tmp_path / 'x.npy'}", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "y: float32[2, 5]" in out
    # sigmoid((0 + b) * 2) at b = -1 is the minimum
    assert f"min {1 / (1 + np.exp(2.0)):.6g}" in out



def test_run_compiles_for_the_contents_of_a_shape_input(tmp_path, capsys):
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape")]
    path = tmp_path / "reshape.onnx"
    onnx.save(make_model(nodes, [tensor("x", [6]), tensor("shape", [2], onnx.TensorProto.INT64)],
                         [tensor("y", [None, None])]), path)
    np.save(tmp_path / "shape.npy", np.array([3, 2], np.int64))
    assert main(["run", str(path), "--input", f"shape={tmp_path / 'shape.npy'}",
                 "--repeat", "1"]) == 0
    assert "y: float32[3, 2]" in capsys.readouterr().out
    assert main(["run", str(path)]) == 2
    assert "'shape' is missing" in capsys.readouterr().err

def test_show_summarises_the_model(affine, capsys):
    assert main(["show", str(affine)]) == 0
    out = capsys.readouterr().out
    assert "opset 17, 4 nodes" in out
    assert "x: float32[batch, 5]" in out and "y: float32[batch, 5]" in out
    assert "constants: 1 tensor, 20 B" in out
    assert re.search(r"^  Add +1$", out, re.M) and re.search(r"^  Sigmoid +1$", out, re.M)
    assert "unsupported ops: none" in out


def test_show_lists_unsupported_ops(unsupported, capsys):
    assert main(["show", str(unsupported)]) == 0
    assert "unsupported ops: Wobble (2 nodes)" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["run", "{affine}"], "--dim batch=N"),
    (["run", "{affine}", "--dim", "batch=many"], "expected a non-negative integer"),
    (["run", "{affine}", "--input", "nope=x.npy"], "not inputs of the model"),
    (["run", "{affine}", "--dim", "bacth=2"], "--dim bacth: not a symbolic dimension of the "
                                             "model's inputs (batch)"),
    (["run", "{affine}", "--dim", "batch=2", "--dim", "batch=3"],
     "--dim batch is given twice, as 2 and 3"),
    (["run", "{affine}", "--dim", "batch"], "--dim 'batch': expected NAME=VALUE"),
    (["run", "{affine}", "--dim", "batch=-1"], "expected a non-negative integer"),
    (["run", "{affine}", "--dim", "batch=2", "--input", "x={x}"],
     "--dim batch=2 conflicts with input 'x' of shape [3, 5]"),
    (["run", "{unsupported}"], "Wobble (nodes 'wobble_1', 'wobble_2')"),
    (["run", "{affine}", "--tune", "3"], "--tune 3: expected one of 0, 1, 2, construct"),
    (["run", "{missing}"], "No such file"),
    (["run", "{affine}", "--dynamic", "batch=1-8"], "--dynamic batch=1-8: expected LO:HI"),
    (["run", "{affine}", "--dynamic", "bach=1:8"], "dynamic names 'bach', which no input"),
    (["run", "{affine}", "--dynamic", "batch=8:1"], "lo is greater than hi"),
    (["show", "{garbage}"], "not a readable ONNX model"),
    (["show", "{empty}"], "no ONNX model"),
    (["run", "{affine}", "--dim", "batch=2", "--simulate"], "--simulate runs CUDA kernels"),
    (["run", "{affine}", "--target", "tpu"], "expected 'cpu', 'cuda' or 'cuda:<arch>'"),
])
def test_errors_print_one_line_and_exit_2(affine, unsupported, tmp_path, capsys, argv, message):
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"\x07junk")
    (tmp_path / "empty.onnx").write_bytes(b"")
    np.save(tmp_path / "x.npy", np.zeros((3, 5), np.float32))
    paths = {"affine": affine, "unsupported": unsupported, "missing": tmp_path / "missing.onnx",
             "garbage": garbage, "empty": tmp_path / "empty.onnx", "x": tmp_path / "x.npy"}
    assert main([a.format(**paths) for a in argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("treadle: error: ") and captured.err.count("\n") == 1
    assert message in captured.err


@pytest.mark.parametrize("command", ["run", "check"])
@pytest.mark.parametrize("content, message", [
    (b"garbage bytes", r"not a \.npy file \(numpy\.save writes one\)"),
    (b"", r"not a \.npy file"),
    (np.lib.format.MAGIC_PREFIX + b"\x01\x00", "not a readable .npy file: EOF"),
    ("npz", r"not a \.npy file"),
    ("objects", "not a readable .npy file: Object arrays"),
    ("truncated", "not a readable .npy file: Failed to read all data"),
    (None, "cannot read the file: No such file or directory"),
], ids=["garbage", "empty", "bad-header", "npz", "objects", "truncated", "missing"])
def test_an_unreadable_input_file_is_named(affine, tmp_path, capsys, command, content, message):
    path = tmp_path / "x.bin"
    if content == "npz":
        np.savez(path, x=np.zeros((2, 5), np.float32))
        path = tmp_path / "x.bin.npz"
    elif content == "objects":
        with open(path, "wb") as file:
            np.save(file, np.array([{}, None], dtype=object), allow_pickle=True)
    elif content == "truncated":
        with open(path, "wb") as file:
            np.save(file, np.zeros((2, 5), np.float32))
        path.write_bytes(path.read_bytes()[:-8])
    elif content is not None:
        path.write_bytes(content)
    assert main([command, str(affine), "--input", f"x={path}"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert captured.err.startswith(f"treadle: error: --input x={path}: ")
    assert re.search(message, captured.err), captured.err


@pytest.mark.parametrize("flag", ["--rtol", "--atol"])
@pytest.mark.parametrize("value", ["-1", "-1e-9", "nan", "inf", "tight"])
def test_check_refuses_a_negative_or_nan_tolerance(affine, capsys, flag, value):
    with pytest.raises(SystemExit) as info:
        main(["check", str(affine), "--dim", "batch=3", f"{flag}={value}"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}: '{value}' is not a finite non-negative number" in err
    assert "Traceback" not in err


def test_check_takes_a_zero_tolerance(affine, capsys):
    assert main(["check", str(affine), "--dim", "batch=3", "--rtol", "0", "--atol", "1"]) == 0
    assert "Traceback" not in capsys.readouterr().err


def test_run_with_constructed_schedules(affine, capsys):
    assert main(["run", str(affine), "--dim", "batch=3", "--tune", "construct", "--repeat", "1"]) == 0
    assert "median latency" in capsys.readouterr().out


def test_run_with_a_dynamic_range(affine, capsys):
    assert main(["run", str(affine), "--dim", "batch=3", "--dynamic", "batch=1:16",
                 "--repeat", "1"]) == 0
    assert "median latency" in capsys.readouterr().out


def test_run_with_orchestrated_kernels(affine, capsys):
    assert main(["run", str(affine), "--dim", "batch=3", "--orchestrate", "--repeat", "1"]) == 0
    assert "median latency" in capsys.readouterr().out


def test_run_on_a_cuda_target_in_the_gpu_simulator(affine, capsys):
    assert main(["run", str(affine), "--dim", "batch=3", "--target", "cuda:sm_80",
                 "--simulate", "--repeat", "1"]) == 0
    assert re.search(r"^y: float32\[3, 5\] mean ", capsys.readouterr().out, re.M)


def test_run_on_a_cuda_target_without_a_gpu_says_so(affine, capsys, monkeypatch):
    from treadle.runtime import cuda
    if cuda.available():
        pytest.skip("this machine has a GPU")
    assert main(["run", str(affine), "--dim", "batch=3", "--target", "cuda"]) == 2
    assert "no CUDA driver" in capsys.readouterr().err


def test_info_prints_the_memory_hierarchy(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "vector registers" in out
    assert all(level in out for level in ("registers", "L1", "L2", "L3", "DRAM", "GB/s"))
    assert re.search(r"^gpu: ", out, re.M)


def test_the_module_runs_as_a_command(affine):
    result = subprocess.run([sys.executable, "-m", "treadle", "show", str(affine)],
                            capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert "Sigmoid" in result.stdout
    result = subprocess.run([sys.executable, "-m", "treadle", "run", str(affine)],
                            capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 2 and "Traceback" not in result.stderr


def test_python_dash_m_treadle_is_the_command(affine):
    result = subprocess.run([sys.executable, "-m", "treadle", "show", str(affine)],
                            capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert "Sigmoid" in result.stdout
    result = subprocess.run([sys.executable, "-m", "treadle", "check", str(affine),
                             "--rtol", "-1"], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 2 and "usage: treadle check" in result.stderr
    assert "Traceback" not in result.stderr


def test_version_is_the_package_version():
    result = subprocess.run([sys.executable, "-m", "treadle", "--version"],
                            capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0 and result.stdout.strip() == f"treadle {treadle.__version__}"


# ---- help, usage errors, bench and info ------------------------------------------------------

def _commands() -> list[str]:
    (commands,) = [action for action in _parser()._actions
                   if isinstance(action, argparse._SubParsersAction)]
    return list(commands.choices)


@pytest.mark.parametrize("command", [None, *_commands()])
def test_help_ends_with_examples(capsys, command):
    with pytest.raises(SystemExit) as info:
        main([command, "--help"] if command else ["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: treadle {command or ''}".rstrip())
    examples = out.split("\nexamples:\n", 1)[1].splitlines()
    assert examples and all(line.startswith(f"  treadle {command or ''}".rstrip())
                            for line in examples), out


@pytest.mark.parametrize("argv, message", [
    ([], "the following arguments are required: command"),
    (["compile", "model.onnx"], "argument command: invalid choice: 'compile'"),
    (["--verbose", "show", "model.onnx"], "unrecognized arguments: --verbose"),
    *[([command, "--no-such-flag"], "") for command in _commands()],  # each one refuses it
    *[([command, "model.onnx", "--no-such-flag"], "unrecognized arguments: --no-such-flag")
      for command in ("run", "check", "show", "bench")],
    (["info", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    *[([command], "the following arguments are required: model")
      for command in ("run", "check", "show", "bench")],
    (["bench", "model.onnx", "--repeat", "many"], "argument --repeat: invalid int value: 'many'"),
    (["run", "model.onnx", "--repeat", "1.5"], "argument --repeat: invalid int value: '1.5'"),
])
def test_usage_errors_exit_2_with_a_message(capsys, argv, message):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err
    assert captured.err.startswith("usage: treadle")
    assert f"error: {message}" in captured.err, captured.err


def test_bench_prints_treadle_and_onnxruntime_latencies(affine, capsys):
    from treadle.cli.bench import calls_per_system
    assert main(["bench", str(affine), "--dim", "batch=3", "--repeat", "3"]) == 0
    captured = capsys.readouterr()
    assert re.search(r"^medians of at least 3 interleaved calls each on \d+ threads; ",
                     captured.out, re.M)
    treadle_ms, = re.findall(r"^treadle +(\d+\.\d{3}) ms$", captured.out, re.M)
    reference_ms, = re.findall(r"^ONNX Runtime +(\d+\.\d{3}) ms$", captured.out, re.M)
    ratio, = re.findall(r"^speed-up over ONNX Runtime: (\d+\.\d\d)x", captured.out, re.M)
    assert float(treadle_ms) > 0 and float(reference_ms) > 0
    assert float(ratio) == pytest.approx(float(reference_ms) / float(treadle_ms), rel=0.05,
                                         abs=0.01)
    # Off a terminal, progress is plain lines on stderr, the last one at the end.
    calls = 2 * calls_per_system(3)
    assert captured.err.startswith(f"compiling {affine} (--tune 0)\n")
    assert captured.err.endswith(f"timing: {calls}/{calls} calls (100%)\n")


def test_bench_without_onnxruntime_times_treadle_alone(affine, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import onnxruntime fails
    assert main(["bench", str(affine), "--dim", "batch=3", "--repeat", "3"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^treadle +\d+\.\d{3} ms$", out, re.M)
    assert "ONNX Runtime: not installed (pip install onnxruntime to compare)" in out
    assert "speed-up" not in out


def test_bench_says_why_onnxruntime_cannot_run_the_model(affine, capsys, monkeypatch):
    def refuse(path, threads):
        raise RuntimeError("[ONNXRuntimeError] : 10 : INVALID_GRAPH : no kernel\nat node 3")
    monkeypatch.setattr("treadle.cli.bench.onnxruntime_session", refuse)
    assert main(["bench", str(affine), "--dim", "batch=3", "--repeat", "3"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^treadle +\d+\.\d{3} ms$", out, re.M)
    assert out.rstrip().endswith("ONNX Runtime: cannot run the model ([ONNXRuntimeError] : "
                                 "10 : INVALID_GRAPH : no kernel)")


def test_bench_draws_a_bar_on_a_terminal(affine):
    import io

    from treadle.cli.bench import bench

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    pytest.importorskip("tqdm")
    model = treadle.compile(str(affine))
    x = np.ones((3, 5), np.float32)
    terminal = Terminal()
    table = bench(model, {"x": x}, {"x": x}, str(affine), 3, progress=terminal)
    assert "ONNX Runtime" in table
    assert re.search(r"timing: +\d+%\|", terminal.getvalue())  # tqdm's bar
    assert "calls (" not in terminal.getvalue()  # and no plain lines


@pytest.mark.parametrize("argv, message", [
    (["bench", "{affine}", "--repeat", "0"], "--repeat 0: expected a positive number"),
    (["bench", "{affine}"], "--dim batch=N"),
    (["bench", "{affine}", "--dim", "batch=2", "--tune", "9"], "--tune 9: expected one of"),
])
def test_bench_errors_print_one_line_and_exit_2(affine, capsys, argv, message):
    assert main([a.format(affine=affine) for a in argv]) == 2
    err = capsys.readouterr().err.splitlines()[-1]
    assert err.startswith("treadle: error: ") and message in err


def test_info_describes_the_cpu_and_the_cache(capsys, tmp_path):
    from treadle.config import override
    cpuinfo = Path("/proc/cpuinfo").read_text()
    model = re.search(r"^model name\s*:\s*(.*)$", cpuinfo, re.M)
    flags = re.search(r"^flags\s*:\s*(.*)$", cpuinfo, re.M).group(1).split()
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "a.so").write_bytes(bytes(3 << 20))
    (tmp_path / "record.json").write_bytes(bytes(1 << 19))
    with override(cache_dir=tmp_path):
        assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert re.search(rf"^cpu: {re.escape(model.group(1).strip() if model else 'unknown CPU')}; "
                     rf"\d+ of \d+ cores usable, kernels run \d+ threads$", out, re.M)
    isa = re.search(r"^isa: (.*); (16|32) vector registers$", out, re.M).group(1)
    assert all(f in flags for f in isa.split(", ")) and ("avx2" in isa) == ("avx2" in flags)
    # Probing the memory hierarchy may have added its own small files to the cache.
    files = [f for f in tmp_path.rglob("*") if f.is_file()]
    size = sum(f.stat().st_size for f in files) / 2**20
    assert size < 3.55 and f"cache: {tmp_path}, {size:.1f} MiB in {len(files)} files " in out
