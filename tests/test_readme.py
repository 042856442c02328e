"""The README's Python examples run as written."""
import re
from pathlib import Path

import onnx
import pytest
from onnx import helper

from tests.frontend.onnx_models import make_model, tensor

README = Path(__file__).resolve().parents[1] / "README.md"
SNIPPETS = re.findall(r"^```python\n(.*?)^```", README.read_text(), re.M | re.S)


def test_the_examples_are_found():
    assert any("ops.conv2d" in code for code in SNIPPETS)
    assert any("treadle.load(" in code for code in SNIPPETS)


@pytest.mark.parametrize("code", SNIPPETS, ids=[f"snippet{k}" for k in range(len(SNIPPETS))])
def test_snippet_runs(code, tmp_path, monkeypatch):
    # "model.onnx" in the examples: an image model, as the call there expects.
    model = make_model([helper.make_node("Relu", ["x"], ["y"], name="relu")],
                       [tensor("x", ["batch", 3, 224, 224])], [tensor("y", ["batch", 3, 224, 224])])
    onnx.save(model, tmp_path / "model.onnx")
    monkeypatch.chdir(tmp_path)
    # A file of its own, since treadle.lang reads the source of the kernels it defines.
    snippet = tmp_path / "readme_snippet.py"
    snippet.write_text(code)
    exec(compile(code, str(snippet), "exec"), {})
