"""TREADLE_DUMP writes every IR step and the generated source, under safe names."""
from treadle.config import override
from treadle.ir.builder import FunctionBuilder
from treadle.ir.dtypes import float32
from treadle.ir.mapping import repeat, spatial
from treadle.runtime.module import compile_function


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
                  "03_simplify.txt"]
    assert "spatial(1, 4)" in (tmp_path / "scale" / "ir" / "00_input.txt").read_text()
    assert "for" in (tmp_path / "scale" / "ir" / "03_simplify.txt").read_text()
    assert "treadle_parallel_for(" in (tmp_path / "scale" / "kernel.c").read_text()


def test_hostile_names_stay_inside_the_dump_folder(tmp_path):
    with override(dump_dir=tmp_path / "d"):
        compile_function(program("../../escape"))
    assert not (tmp_path / "escape").exists()
    assert all(tmp_path / "d" in p.parents for p in (tmp_path / "d").rglob("*"))
