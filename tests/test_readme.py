"""The Python examples of README.md and of every page under docs/ run as written."""
import re
from pathlib import Path

import onnx
import pytest
from onnx import helper

from tests.frontend.onnx_models import make_model, tensor

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
MAX_README_LINES = 200  # a front door read in minutes; the rest lives in docs/


def snippets(page: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", page.read_text(), re.M | re.S)


CASES = [(page, k, code) for page in PAGES for k, code in enumerate(snippets(page))]


def test_the_examples_are_found():
    readme = snippets(README)
    assert any('treadle.compile("model.onnx")' in code for code in readme)
    assert any('backend="treadle"' in code for code in readme)
    assert any("@lang.kernel" in code for code in readme)
    docs = [code for page in PAGES[1:] for code in snippets(page)]
    assert any("ops.conv2d" in code for code in docs)
    assert any("treadle.load(" in code for code in docs)


def test_the_readme_is_short():
    assert len(README.read_text().splitlines()) <= MAX_README_LINES


@pytest.mark.parametrize("page, index, code", CASES,
                         ids=[f"{page.stem}-{k}" for page, k, _ in CASES])
def test_snippet_runs(page, index, code, tmp_path, monkeypatch):
    # "model.onnx" in the examples: an image model, as the calls there expect.
    model = make_model([helper.make_node("Relu", ["x"], ["y"], name="relu")],
                       [tensor("x", ["batch", 3, 224, 224])], [tensor("y", ["batch", 3, 224, 224])])
    onnx.save(model, tmp_path / "model.onnx")
    monkeypatch.chdir(tmp_path)
    # A file of its own, since treadle.lang reads the source of the kernels it defines.
    snippet = tmp_path / f"{page.stem}_snippet{index}.py"
    snippet.write_text(code)
    exec(compile(code, str(snippet), "exec"), {})
