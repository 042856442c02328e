"""Einsum against numpy.einsum: contractions, diagonals, traces, transpositions, implicit
outputs, three operands, broadcast '...' axes, symbolic sizes, and the errors."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import treadle
from tests.frontend.onnx_models import make_model, tensor
from tests.harness import assert_close, random_array
from treadle.errors import ShapeError


def einsum_model(equation: str, shapes):
    names = [f"x{k}" for k in range(len(shapes))]
    node = helper.make_node("Einsum", names, ["y"], name="ein", equation=equation)
    return make_model([node], [tensor(n, s) for n, s in zip(names, shapes)],
                      [tensor("y", None)], opset=12)


CASES = [("ij,jk->ik", [(7, 13), (13, 5)]), ("bij,bjk->bik", [(3, 1, 97), (3, 97, 2)]),
         ("ii->i", [(5, 5)]), ("ii", [(6, 6)]), ("ij->ji", [(3, 7)]), ("ij,jk", [(2, 3), (3, 4)]),
         ("ij,jk,kl->il", [(2, 3), (3, 5), (5, 7)]), ("i,j->ij", [(5,), (3,)]),
         ("...ij,...jk->...ik", [(2, 1, 3, 4), (5, 4, 6)]),
         ("bhqd,bhkd->bhqk", [(1, 2, 7, 8), (1, 2, 9, 8)]),
         ("i,i->", [(0,), (0,)]), ("ij->", [(4, 3)]), ("bii->bi", [(2, 3, 3)])]


@pytest.mark.parametrize("equation, shapes", CASES)
def test_matches_numpy(equation, shapes):
    arrays = [random_array(s, seed=k) for k, s in enumerate(shapes)]
    got = treadle.compile(einsum_model(equation, shapes))(*arrays)[0]
    assert_close(got, np.einsum(equation, *arrays).astype(np.float32), reduction=max(
        [d for s in shapes for d in s] + [1]))


def test_symbolic_sizes_compile_once():
    model = einsum_model("bij,jk->bik", [["b", "n", 13], [13, "m"]])
    compiled = treadle.compile(model)
    for b, n, m in [(1, 1, 1), (2, 7, 3), (3, 0, 5)]:
        a, w = random_array((b, n, 13), seed=n), random_array((13, m), seed=m)
        assert_close(compiled(a, w)[0], np.einsum("bij,jk->bik", a, w), reduction=13)


@pytest.mark.parametrize("equation, shapes, message", [
    ("ij,jk->ik", [(2, 3), (4, 5)], "label 'j' has sizes 3 and 4"),
    ("ij->k", [(2, 3)], "output labels"), ("ij,jk->ik", [(2, 3)], "2 operands"),
    ("ijk->i", [(2, 3)], "rank 2")])
def test_bad_equations_name_the_node(equation, shapes, message):
    with pytest.raises(ShapeError, match=f"ein.*{message}"):
        treadle.compile(einsum_model(equation, shapes))
