"""The C-family printer as a base for targets: plain C from the base tables, and a second
target made by overriding table entries, leaving the CPU's untouched."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from tests.harness import assert_close, random_array
from treadle.backend.cpu import build
from treadle.backend.c import CPrinter, c_name, generate, print_loop
from treadle.backend.cpu import CpuPrinter
from treadle.errors import IRError
from treadle.ir.builder import FunctionBuilder
from treadle.ir.lower import lower
from treadle.target.cpu import host


def scale(kind: str):
    """B[i, k] = 2 * A[i, k] + 1, rows in a loop of ``kind``, 4 columns unrolled."""
    with FunctionBuilder(f"scale_{kind}") as fb:
        rows = fb.symbol("rows")
        a = fb.param("A", "float32", [rows, 4])
        b = fb.param("B", "float32", [rows, 4])
        for i in fb.range(rows, kind=kind, name="i"):
            for k in fb.range(4, kind="unroll", name="k"):
                b[i, k] = a[i, k] * 2.0 + 1.0
    return lower(fb.function, host())


def run(source: str, function, a: np.ndarray) -> np.ndarray:
    symbol = c_name(function)
    library = ctypes.CDLL(str(build(source, function.name, [symbol])))
    out = np.zeros_like(a)
    entry = getattr(library, symbol)
    entry.restype = ctypes.c_int32
    status = entry(ctypes.c_int64(a.shape[0]), a.ctypes.data_as(ctypes.c_void_p),
                   out.ctypes.data_as(ctypes.c_void_p))  # symbols come first
    assert status == 0
    return out


@pytest.mark.parametrize("rows", [0, 1, 7, 61])
def test_plain_c_from_the_base_tables(rows):
    function = scale("serial")
    source = generate([function])
    assert "omp" not in source and "treadle_parallel_for" not in source
    a = random_array((rows, 4))
    assert_close(run(source, function, a), a * 2 + 1)


def test_a_loop_kind_the_target_lacks_is_named():
    with pytest.raises(IRError, match="no entry for 'parallel' in table LOOP_PRINTERS"):
        generate([scale("parallel")])


class OpenMPPrinter(CPrinter):
    """A target that differs from plain C in one table entry: parallel loops."""
    LOOP_PRINTERS = {**CPrinter.LOOP_PRINTERS,
                     "parallel": lambda p, s: print_loop(p, s, "#pragma omp parallel for",
                                                    special="parallel")}


def test_a_second_target_overrides_table_entries():
    cpu_loops = dict(CpuPrinter.LOOP_PRINTERS)
    function = scale("parallel")
    source = generate([function], OpenMPPrinter)
    assert "#pragma omp parallel for" in source
    assert CpuPrinter.LOOP_PRINTERS == cpu_loops  # the CPU's tables are untouched
    a = random_array((13, 4), seed=1)
    assert_close(run(source, function, a), a * 2 + 1)
