"""TREADLE_DUMP writes every IR step and the generated source, under safe names."""
import numpy as np

import treadle
from treadle.config import override
from treadle.ir.builder import FunctionBuilder
from treadle.ir.dtypes import float32
from treadle.ir.mapping import repeat, spatial
from treadle.runtime.build import compile_function


def program(name):
    with FunctionBuilder(name) as fb:
        a = fb.param("a", float32, [8, 4])
        for w in fb.range(4, kind="parallel", name="w"):
            for i, j in (repeat(8, 1) * spatial(1, 4)).on(w):
                a[i, j] = a[i, j] + 1.0
    return fb.function


def test_dump_writes_numbered_ir_and_source(tmp_path):
    with override(dump_dir=tmp_path):
        compile_function(program("scale"))
    ir = sorted(p.name for p in (tmp_path / "scale" / "ir").iterdir())
    assert ir == ["00_input.txt", "01_lower_mapping.txt", "02_split_barriers.txt",
                  "03_simplify.txt", "04_hoist.txt", "05_unswitch.txt",
                  "06_widen_half.txt"]
    assert "spatial(1, 4)" in (tmp_path / "scale" / "ir" / "00_input.txt").read_text()
    assert "for" in (tmp_path / "scale" / "ir" / "03_simplify.txt").read_text()
    assert "treadle_parallel_for(" in (tmp_path / "scale" / "kernel.c").read_text()


def test_hostile_names_stay_inside_the_dump_folder(tmp_path):
    with override(dump_dir=tmp_path / "d"):
        compile_function(program("../../escape"))
    assert not (tmp_path / "escape").exists()
    assert all(tmp_path / "d" in p.parents for p in (tmp_path / "d").rglob("*"))


def test_each_compiled_model_dumps_into_a_folder_of_its_own(tmp_path):
    """The layout the README describes; a second compile of the same name, or a model
    compiled inside another's compile (constant folding), overwrites nothing."""
    from treadle import ops
    x = ops.input("x", "float32", ["n", 8])
    graph = ops.graph([x], [ops.relu(ops.add(x, ops.constant(np.ones(8, np.float32))))],
                      name="tiny")
    with override(dump_dir=tmp_path):
        treadle.compile(graph)
        treadle.compile(graph)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny", "tiny-2"]
    for folder in (tmp_path / "tiny", tmp_path / "tiny-2"):
        passes = sorted(p.name for p in (folder / "graph").iterdir())
        assert passes[0] == "00_input.txt" and "01_canonicalize.txt" in passes
        assert "partition.txt" in passes
        kernel = next(p for p in folder.iterdir() if (p / "ir").is_dir())
        assert (kernel / "ir" / "00_input.txt").is_file()
        assert "treadle_set_num_threads" in (folder / "kernels_0.c").read_text()


def test_each_kernel_says_which_schedule_it_got(tmp_path):
    """``<kernel>/schedule.txt``: the template, the config and what it resolved to, and
    where the config came from; the resolved config is the one the program was built
    from."""
    from treadle import ops
    from treadle.schedule.templates.gemm import GemmConfig
    x = ops.input("x", "float32", [5, 24])
    w = ops.constant(np.ones((24, 40), np.float32))
    graph = ops.graph([x], [ops.softmax(ops.matmul(x, w, name="dense"))], name="tiny")
    with override(dump_dir=tmp_path):
        treadle.compile(graph, tune=0)
    texts = {p.parent.name: p.read_text() for p in (tmp_path / "tiny").glob("*/schedule.txt")}
    dense = next(t for t in texts.values() if "template: gemm" in t)
    fields = dict(line.split(": ", 1) for line in dense.splitlines())
    assert fields["source"] == "default"
    resolved = eval(fields["resolved"], {"GemmConfig": GemmConfig})
    assert resolved.block_m <= 5 + resolved.micro_m and resolved.block_k == 24
    assert any("template: rules" in t and "config:" not in t for t in texts.values())
